"""Every example in README.md and docs/*.md runs.

Each page's ``sh`` blocks are joined, in order, into one ``bash -euo pipefail`` script
run in a fresh directory with this interpreter's ``streamdp`` first on ``PATH``
(progress bars off); every command must exit 0. A page is therefore self-contained:
it makes the data its examples use. Each ``python`` block runs on its own in a fresh
directory. A new ``docs/*.md`` page is picked up without editing this file; a block
that must not run is written as an indented block or with another language tag.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
#: Pages whose examples take more than a few seconds: run with ``-m slow`` (the README's own run by default, in
#: ``tests/test_readme.py``).
#: ``docs/store.md``: about 20 processes (15 s of CPU) since its append and compact example; their commands run in process
#: in tests/storage/test_append.py and tests/storage/test_ingest*.py. ``docs/privacy-user-budget.md``: three trains
#: and an append as processes (30 s on a busy machine); tests/privacy/test_filter.py runs the same scenario in process.
#: ``docs/stream.md``: three weeks of appends, trains and evaluations as processes (35 s); in process in
#: tests/privacy/test_filter_window.py and tests/test_cli_time.py.
SLOW_PAGES = {"docs/guide.md", "docs/choosing-epsilon.md", "docs/python-api.md", "docs/store.md",
              "docs/privacy-user-budget.md", "docs/stream.md"}


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def blocks(page: Path, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", page.read_text(), re.S | re.M)


def _env():
    env = dict(os.environ, STREAMDP_PROGRESS="0")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")  # this checkout's streamdp
    return env


def _marks(page: Path):
    return [pytest.mark.slow] if _name(page) in SLOW_PAGES else []


#: The README's worked example is run once, by ``tests/test_readme.py``, which also checks its shown output.
SH_PAGES = [pytest.param(p, id=_name(p), marks=_marks(p)) for p in PAGES if blocks(p, "sh") and p != ROOT / "README.md"]
PY_BLOCKS = [pytest.param(p, i, id=f"{_name(p)}-{i}", marks=_marks(p)) for p in PAGES
             for i in range(len(blocks(p, "python")))]


def test_examples_cover_the_commands():
    joined = "\n".join(b for p in PAGES for b in blocks(p, "sh"))
    for command in ("ingest", "info", "verify", "train", "evaluate", "recommend", "sweep", "budget",
                    "privacy epsilon", "privacy calibrate", "lowrank", "generate"):
        assert f"streamdp {command} " in joined, f"no example of streamdp {command} in README.md or docs/"
    assert blocks(ROOT / "README.md", "sh"), "README.md has no worked example"
    assert any(blocks(p, "python") for p in PAGES), "no Python API example"


#: What a page's run must print or write, beyond exiting 0.
EXPECT = {
    "docs/guide.md": lambda out, d: ("verdict:" in out and "item_id\tpredicted_rating" in out
                                     and (d / "sweep" / "results.csv").exists()
                                     and (d / "sweep" / "rmse_vs_epsilon.png").exists()
                                     and (d / "als-model" / "privacy.json").exists()),
    "docs/choosing-epsilon.md": lambda out, d: (d / "choose" / "results.csv").exists(),
}


@pytest.mark.parametrize("page", SH_PAGES)
def test_shell_examples_run(tmp_path, page):
    script = "set -euo pipefail\n" + "\n".join(blocks(page, "sh"))
    r = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, (f"{_name(page)}: example failed (exit {r.returncode}):\n{r.stdout[-3000:]}\n"
                               f"{r.stderr[-3000:]}")
    check = EXPECT.get(_name(page))
    assert check is None or check(r.stdout, tmp_path), f"{_name(page)}: the output is not what the page says"


@pytest.mark.parametrize("page,i", PY_BLOCKS)
def test_python_examples_run(tmp_path, page, i):
    r = subprocess.run([sys.executable, "-c", blocks(page, "python")[i]], cwd=tmp_path, env=_env(),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{_name(page)} python block {i} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
