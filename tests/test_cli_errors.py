"""Careless input gives one-line errors (exit 2), not tracebacks: scheduler addresses, calibrate at epsilon inf."""

from __future__ import annotations

import json
import os
import sys

import pytest
from click.testing import CliRunner

from streamdp.cli import main
from streamdp.privacy.budget import StoreBudget


@pytest.fixture
def store(tmp_path):
    from streamdp.storage.generate import generate_store

    p = tmp_path / "s.zarr"
    generate_store(str(p), n_users=1500, n_items=60, ratings_per_user=8, rank=3, seed=3, show_progress=False)
    return p


@pytest.mark.parametrize("address, words", [
    ("notaurl", "missing port number"),
    ("tcp://localhost", "missing port number"),
    ("foo://host:1", "unknown address scheme"),
])
def test_bad_scheduler_address(store, tmp_path, address, words):
    pytest.importorskip("distributed")
    out = tmp_path / "m"
    r = CliRunner().invoke(main, ["train", str(store), "--epsilon", "1", "--delta", "1e-6", "--out", str(out),
                                  "--scheduler", address])
    assert r.exit_code == 2, r.output
    (line,) = r.output.splitlines()
    assert line.startswith(f"streamdp: error: --scheduler {address}: not a scheduler address like tcp://host:port (")
    assert words in line
    assert not out.exists()
    assert [e["status"] for e in StoreBudget(store).show()["entries"]] == ["failed"]  # nothing counted


def test_calibrate_epsilon_inf():
    r = CliRunner().invoke(main, ["privacy", "calibrate", "--epsilon", "inf", "--delta", "1e-6"])
    assert r.exit_code == 2
    assert r.output.splitlines() == ["streamdp: error: --epsilon inf: a non-private release needs no noise "
                                     "(multiplier 0), there is nothing to calibrate; give a finite epsilon"]


@pytest.mark.slow  # a second process cluster (35 s busy); test_engine::test_local_cluster_equals_threads keeps one by default
def test_scheduler_with_a_relative_store_path(store, tmp_path, monkeypatch):
    """Cluster workers have their own working directory: the store path sent to them is absolute."""
    distributed = pytest.importorskip("distributed")
    import dask

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the workers start here
    with dask.config.set({"temporary-directory": str(tmp_path)}), \
            distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
                                     memory_limit="1GB") as cluster:
        monkeypatch.chdir(tmp_path)
        r = CliRunner().invoke(main, ["train", "s.zarr", "--epsilon", "1", "--delta", "1e-6", "--rank", "2",
                                      "--out", "m", "--scheduler", cluster.scheduler_address])
    assert r.exit_code == 0, r.output
    assert os.path.isfile(tmp_path / "m" / "model.json")
    assert not (elsewhere / "s.zarr").exists()


def test_a_users_bound_below_the_stores_users_is_one_line(store, tmp_path):
    """``--users-bound`` declares a public number of users: a store with more is refused before anything is reserved;
    one at or above it trains and writes the bound, not the exact count (streamdp.privacy.users)."""
    out = tmp_path / "m"
    for cmd in (["train", str(store)], ["tune", str(store), "--method", "means"]):
        r = CliRunner().invoke(main, [*cmd, "--epsilon", "1", "--out", str(out), "--users-bound", "1000"])
        assert r.exit_code == 2, r.output
        (line,) = r.output.splitlines()
        assert line.startswith("streamdp: error: --users-bound 1000: the store has more users than the declared bound")
        assert not out.exists()
    assert StoreBudget(store).show()["entries"] == []
    r = CliRunner().invoke(main, ["train", str(store), "--epsilon", "1", "--out", str(out), "--users-bound", "1500",
                                  "--method", "means", "--json"])
    assert r.exit_code == 0, r.output
    info = json.loads((out / "model.json").read_text())
    led = json.loads((out / "privacy.json").read_text())
    assert info["n_users"] == 1500 and led["public_parameters"]["n_users"]["source"] == "declared"
    assert not any(e["release"].startswith("number of users") for e in led["bounds"]["releases"])


@pytest.mark.parametrize("code", [0, 2])
def test_the_console_script_freezes_the_collector_around_the_command_and_keeps_its_exit_code(monkeypatch, code):
    """``streamdp.cli.run`` (the console script, ``python -m streamdp``): the command's exit code unchanged, the
    collector frozen before the command (its imports) and once it returned (the interpreter's closing
    collections skipped)."""
    import gc

    import streamdp.cli as cli

    calls = []

    def command():
        calls.append("command")
        raise SystemExit(code)

    def exit_now(c):
        calls.append(f"exit {c}")
        raise SystemExit(c)

    monkeypatch.setattr(cli, "main", command)
    monkeypatch.setattr(cli, "exit_now", exit_now)
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    with pytest.raises(SystemExit) as exc:
        cli.run()
    assert exc.value.code == code and calls == ["freeze", "command", "freeze", f"exit {code}", "freeze"]


def test_the_console_scripts_exit_runs_the_atexit_handlers_flushes_and_keeps_the_status(tmp_path):
    """:func:`streamdp.cli.exit_now` (the console script's exit, past the interpreter's teardown), in a child
    process (the one thing an in-process runner cannot show, since it ends the process): every ``atexit`` handler
    has run, the buffered output reached the pipe, and the exit status is the interpreter's for that ``SystemExit``
    code (a message: printed, status 1)."""
    import subprocess

    mark = tmp_path / "atexit.txt"
    prog = ("import atexit, sys\n"
            "import streamdp.cli as cli\n"
            f"atexit.register(lambda: open({str(mark)!r}, 'w').write('ran'))\n"
            "def command():\n"
            "    sys.stdout.write('x' * 100000)\n"  # buffered, unflushed
            "    raise SystemExit('streamdp: a message')\n"
            "cli.main = command\n"
            "cli.run()\n"
            "print('not reached')\n")
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert r.stdout == "x" * 100000
    assert mark.read_text() == "ran"
    assert r.stderr.strip() == "streamdp: a message"


@pytest.mark.parametrize("code, status", [(None, 0), (3, 3), (256 + 2, 2)])
def test_the_console_scripts_exit_status_is_the_interpreters(monkeypatch, capsys, code, status):
    """:func:`streamdp.cli.exit_now`'s status for ``SystemExit(None)`` and an int (as the interpreter's, modulo 256),
    its ``atexit`` run and flush, in process (``os._exit`` and the ``atexit`` run stood in for)."""
    import atexit

    import streamdp.cli as cli

    calls = []

    class Exited(Exception):
        pass

    def fake_exit(s):
        calls.append(("exit", s))
        raise Exited

    monkeypatch.setattr(atexit, "_run_exitfuncs", lambda: calls.append("atexit"))
    monkeypatch.setattr(os, "_exit", fake_exit)
    with pytest.raises(Exited):
        cli.exit_now(code)
    assert calls == ["atexit", ("exit", status)] and capsys.readouterr().err == ""
