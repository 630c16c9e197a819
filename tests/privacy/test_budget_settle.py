"""Stale reservations: ``kill -9`` during ``streamdp train``, then ``streamdp budget --settle``.

A killed run leaves its entry ``reserved`` and its run directory in ``STORE.state/``;
``--settle`` counts the entry as spent (``stale``) unless it is proven that nothing
was released, and removes the run directory of the dead process.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from streamdp.cli import main
from streamdp.owner import current_owner
from streamdp.privacy import GUARANTEE_USER_DP, Ledger, calibrate_gaussian, gaussian_event
from streamdp.privacy.budget import BUDGET_FILE, StoreBudget

STREAMDP = [sys.executable, "-m", "streamdp.cli"]


def wait_for(cond, what, timeout=120.0, proc=None):
    t0 = time.monotonic()
    while not cond():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the process ended (rc {proc.returncode}) before {what}: {proc.stderr.read()}")
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def reserved_entry(store):
    p = store / BUDGET_FILE
    if not p.exists():
        return None
    entries = [e for e in json.loads(p.read_text())["entries"] if e["status"] == "reserved"]
    return entries[0] if entries else None


def run_dirs(store):
    state = store.parent / (store.name + ".state")
    return [state / n for n in os.listdir(state)] if state.is_dir() else []


def start_slow_train(store, out):
    """A real `streamdp train` that runs long enough: sgld with many epochs."""
    return subprocess.Popen(STREAMDP + ["train", str(store), "--method", "sgld", "--epsilon", "1", "--delta", "1e-6",
                                        "--epochs", "100000", "--workers", "1", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@contextlib.contextmanager
def training(store, out):
    """Yield ``(proc, entry)`` once a slow `streamdp train` has its reservation and run directory; kill it after."""
    proc = start_slow_train(store, out)
    try:
        wait_for(lambda: reserved_entry(store) is not None and any((d / "owner.json").exists()
                                                                   for d in run_dirs(store)),
                 "the reservation and the run directory", proc=proc)
        yield proc, reserved_entry(store)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()


@pytest.fixture
def store(tmp_path):
    from streamdp.storage.generate import generate_store

    p = tmp_path / "s.zarr"
    generate_store(str(p), n_users=1500, n_items=60, ratings_per_user=8, rank=3, seed=3, show_progress=False)
    StoreBudget(p).set(3.0, 1e-5)
    return p


@pytest.mark.slow  # issue 41: a SIGKILLed train is settled in the default run by test_kill_after_a_checkpoint_is_never_refunded
def test_sigkill_during_train_then_settle(store, tmp_path):
    out = tmp_path / "model"
    with training(store, out) as (proc, entry):
        assert entry["owner"]["pid"] == proc.pid and entry["stage"] == "training"
        assert entry["model"] == str(out)
        proc.kill()  # SIGKILL: nothing can be cleaned up
    assert proc.returncode == -signal.SIGKILL
    (left,) = run_dirs(store)
    spent_before = StoreBudget(store).show()["spent"]
    assert spent_before["n_releases"] == 1  # the orphaned reservation counts

    r = subprocess.run(STREAMDP + ["budget", str(store), "--settle"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == (f"settled {entry['id']}: reserved -> stale: its run (pid {proc.pid} on "
                        f"{entry['owner']['host']}) is gone; counted as spent (it never began writing its model: "
                        f"--refund-unreleased would mark it failed)")
    assert lines[1] == f"removed {left}: run directory of a process that is gone"
    s = StoreBudget(store).show()
    (e,) = s["entries"]
    assert e["status"] == "stale" and e["reason"].startswith("settled: ") and e["finished"]
    assert s["spent"] == spent_before  # still counted as spent
    assert not (store.parent / "s.zarr.state").exists() and not out.exists()
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith(".")) == []

    # settling again changes nothing; the explicit refund of a proven-unreleased entry does
    r = CliRunner().invoke(main, ["budget", str(store), "--settle", "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["settled"] == []
    r = CliRunner().invoke(main, ["budget", str(store), "--settle", "--refund-unreleased", "--json"])
    d = json.loads(r.output)
    assert [(x["before"], x["after"]) for x in d["settled"]] == [("stale", "failed")]
    assert d["entries"][0]["status"] == "failed" and d["spent"]["n_releases"] == 0


def test_next_train_removes_stale_run_directories(store, tmp_path):
    with training(store, tmp_path / "model") as (proc, _):
        proc.kill()
    (left,) = run_dirs(store)
    r = CliRunner().invoke(main, ["train", str(store), "--epsilon", "1", "--delta", "1e-6", "--rank", "2",
                                  "--out", str(tmp_path / "m2")])
    assert r.exit_code == 0, r.output
    assert f"note: removed 1 run directory left by process(es) that are gone: {left}" in r.output
    assert not left.exists() and not (store.parent / "s.zarr.state").exists()


# -- the settle rules, on entries whose owner is made up ------------------------------------------------------


def _ledger(eps=1.0, delta=1e-6):
    return Ledger(method="demo", guarantee=GUARANTEE_USER_DP, epsilon=eps, delta=delta,
                  events=[gaussian_event(calibrate_gaussian(eps, delta))])


def _reserve_owned_by(b, owner, model, monkeypatch):
    """Reserve an entry whose recorded owner is ``owner`` (the ledger is journaled: no hand edits)."""
    import streamdp.privacy.budget as budget_mod

    with monkeypatch.context() as m:
        m.setattr(budget_mod, "current_owner", lambda: owner)
        return b.reserve(_ledger(0.1), model=model)


def _gone():
    """An owner on this host whose pid now belongs to another process (start time differs): gone."""
    me = current_owner()
    assert me["start_ticks"] is not None, "needs /proc"
    return {**me, "start_ticks": me["start_ticks"] + 1}


def test_settle_rules(store, tmp_path, monkeypatch):
    b = StoreBudget(store)
    alive = b.reserve(_ledger(0.1), model=str(tmp_path / "a"))
    other_host = _reserve_owned_by(b, {**current_owner(), "host": "elsewhere.invalid"}, str(tmp_path / "b"),
                                   monkeypatch)
    legacy = _reserve_owned_by(b, None, str(tmp_path / "c"), monkeypatch)
    training, writing, written = (_reserve_owned_by(b, _gone(), str(tmp_path / x), monkeypatch) for x in "def")
    b.writing(writing)
    b.writing(written)
    # the run of `written` got its model into place before it died
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "model.json").write_text(json.dumps({"format": "streamdp-model", "budget_entry": written}))
    # a model at `e`'s path that some other release wrote proves nothing about `e`
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "model.json").write_text(json.dumps({"format": "streamdp-model", "budget_entry": "other"}))

    report = {r["id"]: r for r in b.settle(refund_unreleased=True)}
    assert report[alive]["after"] == "reserved" and "still going" in report[alive]["why"]
    assert report[other_host]["after"] == "reserved" and "elsewhere.invalid" in report[other_host]["why"]
    assert report[legacy]["after"] == "reserved" and "no owner recorded" in report[legacy]["why"]
    assert report[training]["after"] == "failed" and "nothing released" in report[training]["why"]
    assert report[writing]["after"] == "stale" and "counted as spent" in report[writing]["why"]
    assert report[written]["after"] == "complete" and "is in place: released" in report[written]["why"]
    status = {e["id"]: e["status"] for e in b.show()["entries"]}
    assert status == {alive: "reserved", other_host: "reserved", legacy: "reserved", training: "failed",
                      writing: "stale", written: "complete"}
    assert b.show()["spent"]["n_releases"] == 5
    # the live run can still finish its own entry
    b.complete(alive)


def test_refund_needs_settle(store):
    r = CliRunner().invoke(main, ["budget", str(store), "--refund-unreleased"])
    assert r.exit_code == 2 and r.output.strip() == "streamdp: error: --refund-unreleased: only with --settle"


def test_settle_is_idempotent(store, tmp_path, monkeypatch):
    """Issue 28, finding 8: `budget --settle` re-settled stale entries each time ("stale -> stale"). A second settle
    changes nothing, writes nothing and says so."""
    from streamdp.privacy.budget import JOURNAL_FILE

    b = StoreBudget(store)
    writing = _reserve_owned_by(b, _gone(), str(tmp_path / "w"), monkeypatch)
    b.writing(writing)

    def settle(*flags):
        r = CliRunner().invoke(main, ["budget", str(store), "--settle", *flags])
        assert r.exit_code == 0, r.output
        return r.stdout

    out = settle()
    assert f"settled {writing}: reserved -> stale" in out and "nothing changed" not in out
    journal = (store / JOURNAL_FILE).read_bytes()
    for flags in ((), ("--refund-unreleased",)):
        out = settle(*flags)
        assert "->" not in out and "settled: nothing changed" in out, out
        assert (store / JOURNAL_FILE).read_bytes() == journal
    assert f"unchanged {writing}: stale: its run" in out  # looked at again (--refund-unreleased), and left
    (rep,) = b.settle(refund_unreleased=True)
    assert rep["changed"] is False and rep["before"] == rep["after"] == "stale"
