"""A lean process: what a command imports (docs/scale.md, "Process footprint").

Each of these modules costs RSS that a run under ``--memory-limit`` pays before its first block
(measured: pyarrow 42 MB, Dask distributed 45 MB, matplotlib 53 MB, pandas 91 MB): they load only in
the commands that use them (lists written to Parquet, ``ingest``, ``--scheduler``, ``sweep --plot``).
"""

import json
import subprocess
import sys

import pytest

NOT_FOR_TRAINING = ("dask", "distributed", "matplotlib", "pyarrow", "pandas")


@pytest.mark.parametrize("module", ["streamdp.training", "streamdp.api", "streamdp.cli"])
def test_training_modules_do_not_import_schedulers_plots_or_arrow(module):
    code = f"import json, sys, {module}; print(json.dumps(sorted(set(sys.modules) & set({NOT_FOR_TRAINING!r}))))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout) == [], f"import {module} loads {p.stdout.strip()}"
