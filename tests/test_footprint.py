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


@pytest.mark.parametrize("module", ["streamdp.workflows.training", "streamdp.workflows.api", "streamdp.cli"])
def test_training_modules_do_not_import_schedulers_plots_or_arrow(module):
    code = f"import json, sys, {module}; print(json.dumps(sorted(set(sys.modules) & set({NOT_FOR_TRAINING!r}))))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout) == [], f"import {module} loads {p.stdout.strip()}"


#: What ``streamdp ingest`` of a file must not load: its --memory-limit comes on top of a runtime
#: without them (tests/storage/test_ingest_memory.py measures that runtime); dp-accounting and SciPy
#: cost 59 MB, and only a --budget needs the ledger (numba loads the top of scipy, which is light).
NOT_FOR_INGEST = ("dp_accounting", "scipy.sparse", "scipy.stats", "streamdp.privacy", "streamdp.workflows.training", "streamdp.methods")


def test_ingest_of_a_file_does_not_import_the_ledger_or_scipy(tmp_path):
    csv = tmp_path / "r.csv"
    csv.write_text("user,item,rating\n1,1,4\n1,2,3\n2,1,5\n")
    code = ("import json, sys; from streamdp.cli import main\n"
            "try:\n"
            f"    main(['ingest', {str(csv)!r}, '--out', {str(tmp_path / 's.zarr')!r}])\n"
            "except SystemExit as e:\n"
            "    assert not e.code, e.code\n"
            f"print(json.dumps(sorted(set(sys.modules) & set({NOT_FOR_INGEST!r}))))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout.strip().splitlines()[-1]) == [], f"streamdp ingest loads {p.stdout.strip()}"


#: What answering from a released model must not load: the ledger is read as recorded, never recomposed, so
#: dp-accounting and the SciPy it brings (1.5 s and about 60 MB per process) stay out of ``recommend``.
NOT_FOR_SERVING = ("dp_accounting", "scipy.stats", "scipy.signal", "streamdp.privacy.accountant")


def test_recommend_from_a_model_does_not_import_the_accountant(tmp_path, cli):
    from streamdp.storage.generate import generate_store

    st = generate_store(str(tmp_path / "s.zarr"), n_users=300, n_items=40, ratings_per_user=8, rank=2, seed=1)
    assert cli.run("train", st.path, "--method", "means", "--epsilon", "1", "--out", tmp_path / "m")[0] == 0
    mine = tmp_path / "mine.csv"
    mine.write_text("3,5\n4,1\n")
    code = ("import json, sys; from streamdp.cli import main\n"
            "try:\n"
            f"    main(['recommend', {str(tmp_path / 'm')!r}, '--ratings', {str(mine)!r}, '--top', '3'])\n"
            "except SystemExit as e:\n"
            "    assert not e.code, e.code\n"
            f"print(json.dumps(sorted(set(sys.modules) & set({NOT_FOR_SERVING!r}))))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout.strip().splitlines()[-1]) == [], f"streamdp recommend loads {p.stdout.strip()}"
