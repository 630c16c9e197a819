"""Every example in README.md runs: the Guide's ``sh`` blocks in order in one directory, the ``python`` blocks too.

The shell blocks are joined into one ``bash -euo pipefail`` script and run with this
interpreter's ``streamdp`` first on ``PATH`` (progress bars off); every command must
exit 0. The Python API block runs in a temporary directory with this interpreter.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README.read_text(), re.S | re.M)


def _env():
    env = dict(os.environ, STREAMDP_PROGRESS="0")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def test_readme_has_examples():
    sh, py = _blocks("sh"), _blocks("python")
    assert len(sh) >= 8 and len(py) >= 1
    joined = "\n".join(sh)
    for command in ("ingest", "info", "verify", "train", "evaluate", "recommend", "sweep", "budget",
                    "privacy epsilon", "privacy calibrate", "lowrank", "generate"):
        assert f"streamdp {command} " in joined, f"no example of streamdp {command}"


def test_guide_shell_examples_run(tmp_path):
    script = "set -euo pipefail\n" + "\n".join(_blocks("sh"))
    r = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, f"README example failed (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    # what the guide says the commands produce
    assert "verdict:" in r.stdout and "item_id\tpredicted_rating" in r.stdout
    assert (tmp_path / "sweep" / "results.csv").exists() and (tmp_path / "sweep" / "rmse_vs_epsilon.png").exists()
    assert (tmp_path / "als-model" / "privacy.json").exists()


@pytest.mark.parametrize("i", range(len(_blocks("python"))))
def test_python_examples_run(tmp_path, i):
    r = subprocess.run([sys.executable, "-c", _blocks("python")[i]], cwd=tmp_path, env=_env(),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"README python block {i} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
