"""SIGTERM settles like Ctrl-C, and a burst of signals settles once.

Before: SIGTERM (a supervisor's stop, ``timeout``, a batch system) killed ``streamdp
train`` on the spot, like ``kill -9``: the budget reservation stayed ``reserved`` and the
temporary model directory stayed behind, also in the middle of the model write. A second
Ctrl-C while the first was being settled left the entry ``reserved`` under the line
"nothing was released", and a burst of Ctrl-C outlasting a quick settlement killed the
process after its line (exit -2 instead of 130).

Now SIGTERM is the same interrupt, taken at safe points and held while the model is
written, and exits 143; once one is taken, later SIGINT/SIGTERM are ignored until the
process exits. Every run below ends with exactly one line on stderr, nothing on stdout,
no traceback, and the invariant "recorded spend >= what reached disk": a model in place
has its entry ``complete``; an entry ``failed`` has no model and no temporary directory.

Windows are widened by a small wrapper (``HOOKS``) that pauses at a named step and
says so in a marker file; the pauses change no behaviour.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from streamdp.privacy.budget import StoreBudget
from streamdp.serving.model import load_model
from tests import test_cli_interrupt as interrupt_tests
from tests.privacy.test_budget_settle import run_dirs, training, wait_for

HOOKS = textwrap.dedent("""
    import os, sys, time
    mark, hook = os.environ["STREAMDP_TEST_MARK"], os.environ["STREAMDP_TEST_HOOK"]

    def pause(tag):
        with open(mark, "a") as f:
            f.write(tag + "\\n")
        time.sleep(1.0)

    import streamdp.serving.model
    from streamdp.privacy.budget import StoreBudget
    real_fail, real_writing, real_install = StoreBudget.fail, StoreBudget.writing, streamdp.serving.model.install_dir

    def fail(self, *a, **k):  # every call is counted; with hook=settle it pauses first
        with open(mark, "a") as f:
            f.write("fail\\n")
        if hook == "settle":
            pause("settling")
        return real_fail(self, *a, **k)

    def writing(self, *a, **k):  # the entry says 'writing', the model write has not begun
        out = real_writing(self, *a, **k)
        if hook == "writing":
            pause("writing")
        return out

    def install_dir(*a, **k):  # inside the model write (Zarr arrays and model.json done), before the rename
        if hook == "install":
            pause("installing")
        return real_install(*a, **k)

    StoreBudget.fail, StoreBudget.writing, streamdp.serving.model.install_dir = fail, writing, install_dir
    sys.argv[0] = "streamdp"
    from streamdp.cli import main
    main()
""")


store = interrupt_tests.store  # the fixture: a small store with a test split
hidden = interrupt_tests.hidden


def marks(path):
    return path.read_text().split() if path.exists() else []


def start_hooked(store, out, mark, hook, *extra):
    env = {**os.environ, "STREAMDP_TEST_MARK": str(mark), "STREAMDP_TEST_HOOK": hook}
    return subprocess.Popen([sys.executable, "-c", HOOKS, "train", str(store), "--epsilon", "1", "--delta", "1e-6",
                             "--workers", "1", "--out", str(out), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def burst(proc, sig, n=5, within=0.05):
    for _ in range(n):
        proc.send_signal(sig)
        time.sleep(within / n)


def finish(proc):
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return proc.returncode, out, err


def released_line(out):
    return f"streamdp: interrupted after the model was written to {out} and its budget recorded"


def failed_line(store, entry_id):
    return (f"streamdp: interrupted before anything was released; the budget reservation {entry_id} in "
            f"{store / 'privacy_budget.json'} was marked failed")


def assert_settled(store, out, tmp_path):
    """One entry; recorded spend >= what reached disk; no run directory or temporary directory left."""
    (e,) = StoreBudget(store).show()["entries"]
    if out.exists():
        assert e["status"] == "complete" and load_model(out).info["budget_entry"] == e["id"], e
    else:
        assert e["status"] == "failed" and e["reason"], e
    assert run_dirs(store) == [] and hidden(tmp_path) == [] and hidden(store.parent) == []
    return e


def test_sigterm_while_training_settles_like_ctrl_c(store, tmp_path):
    out = tmp_path / "model"
    with training(store, out) as (proc, entry):
        proc.send_signal(signal.SIGTERM)
        stdout, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert stdout == "" and err.splitlines() == [failed_line(store, entry["id"])], err
    e = assert_settled(store, out, tmp_path)
    assert e["status"] == "failed" and e["reason"] == "interrupted (SIGTERM)" and not out.exists()


@pytest.mark.parametrize("sig,code", [pytest.param(signal.SIGINT, 130, marks=pytest.mark.slow),
                                      pytest.param(signal.SIGTERM, 143, marks=pytest.mark.slow)],
                         ids=["SIGINT", "SIGTERM"])  # SIGINT's path is the same handler (and tests/test_cli_interrupt.py)
def test_burst_of_five_while_training_settles_once(store, tmp_path, sig, code):
    """Five signals in 50 ms: the first interrupts, the others are ignored, also after the (quick) settlement."""
    out = tmp_path / "model"
    with training(store, out) as (proc, entry):
        burst(proc, sig)
        stdout, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert stdout == "" and err.splitlines() == [failed_line(store, entry["id"])], err
    assert assert_settled(store, out, tmp_path)["status"] == "failed"


@pytest.mark.parametrize("sig,code", [pytest.param(signal.SIGINT, 130, marks=pytest.mark.slow),
                                      pytest.param(signal.SIGTERM, 143, marks=pytest.mark.slow)],
                         ids=["SIGINT", "SIGTERM"])  # SIGINT's path is the same handler (and tests/test_cli_interrupt.py)
def test_burst_during_settling_marks_the_entry_failed_once(store, tmp_path, sig, code):
    """One signal stops training; five more arrive while the reservation is being settled (before
    budget.fail): the entry still ends failed, fail() runs once, and the line says so."""
    out, mark = tmp_path / "model", tmp_path / "mark"
    proc = start_hooked(store, out, mark, "settle", "--method", "sgld", "--epochs", "100000")
    try:
        wait_for(lambda: run_dirs(store) and any((d / "owner.json").exists() for d in run_dirs(store)),
                 "training", proc=proc)
        proc.send_signal(sig)
        wait_for(lambda: "settling" in marks(mark), "the settlement", proc=proc)
        burst(proc, sig)
    finally:
        code_, stdout, err = finish(proc)
    assert code_ == code, err
    (e,) = StoreBudget(store).show()["entries"]
    assert stdout == "" and err.splitlines() == [failed_line(store, e["id"])], err
    assert marks(mark).count("fail") == 1
    assert assert_settled(store, out, tmp_path)["status"] == "failed"


# issue 41: both with -m slow (5 s each); the default run interrupts the model write in process
# (tests/test_cli_interrupt.py::test_interrupt_while_writing_the_model) and SIGTERMs a real train (below)
@pytest.mark.parametrize("hook", [pytest.param("install", marks=pytest.mark.slow),
                                  pytest.param("writing", marks=pytest.mark.slow)])
def test_sigterm_during_the_model_write(store, tmp_path, hook):
    """install: SIGTERM while the model's files are written (held until the rename: the model is in place and
    its entry complete). writing: SIGTERM after the entry says 'writing', before the write: nothing is
    released, the entry is failed, no temporary directory is left."""
    out, mark = tmp_path / "model", tmp_path / "mark"
    proc = start_hooked(store, out, mark, hook, "--method", "als", "--rank", "2")
    try:
        wait_for(lambda: marks(mark)[-1:] == ["installing" if hook == "install" else "writing"], "the write",
                 proc=proc)
        burst(proc, signal.SIGTERM, n=2)
    finally:
        code, stdout, err = finish(proc)
    assert code == 143, err
    e = assert_settled(store, out, tmp_path)
    if hook == "install":
        assert stdout == "" and err.splitlines() == [released_line(out)], err
        assert e["status"] == "complete" and out.exists()
        assert json.loads((out / "model.json").read_text())["budget_entry"] == e["id"]
    else:
        assert stdout == "" and err.splitlines() == [failed_line(store, e["id"])], err
        assert e["status"] == "failed" and e["stage"] == "writing" and not out.exists()
