"""Temporary directories of killed ``ingest``/``generate``/``train`` runs are removed by the next run, and said so.

A run builds its output in ``.DEST.tmp-<hex>`` (and ingest spills to
``.DEST.ingest-<hex>``) beside the destination; ``kill -9`` leaves it behind. Each
records its owner (``owner.json``), so the next run writing beside the same
destination removes those whose process is gone and prints one note on stderr; a live
run's, another destination's and ownerless ones are left alone. Before this was built
nothing ever removed them. The owner record never reaches the output.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from streamdp.cli import main
from streamdp.owner import OWNER_FILE, current_owner

SMALL = ["--users", "300", "--items", "40", "--ratings-per-user", "8", "--seed", "2"]


def run(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    return r.exit_code, r.stdout, r.stderr, r.exception


@pytest.fixture(scope="module")
def dead_owner() -> dict:
    """The owner record of a process that has exited (what a killed run leaves)."""
    out = subprocess.run([sys.executable, "-c", "import json; from streamdp.owner import current_owner; "
                          "print(json.dumps(current_owner()))"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def leave(directory, name, owner=None, payload=True) -> str:
    """A temporary directory as a killed run leaves it: some content and (optionally) its owner record."""
    d = os.path.join(directory, name)
    os.makedirs(os.path.join(d, "train", "items"))
    if payload:
        with open(os.path.join(d, "train", "items", "0"), "wb") as f:
            f.write(os.urandom(1000))
    if owner is not None:
        with open(os.path.join(d, OWNER_FILE), "w") as f:
            json.dump(owner, f)
    return d


def hidden(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.startswith("."))


@pytest.mark.parametrize("command", ["generate", "ingest"])
def test_store_writers_remove_dead_runs_temp_dirs(tmp_path, dead_owner, command):
    d = str(tmp_path)
    dead = [leave(d, ".s.zarr.tmp-0a1b2c3d4e5f", dead_owner), leave(d, ".s.zarr.ingest-00ff00ff00ff", dead_owner),
            leave(d, ".s.zarr.tmp-0a1b2c3d4e5f.old", dead_owner)]
    kept = [leave(d, ".s.zarr.tmp-aaaaaaaaaaaa", current_owner()),  # a live run's (this process)
            leave(d, ".s.zarr.tmp-bbbbbbbbbbbb"),  # no owner record: cannot be told dead
            leave(d, ".other.zarr.tmp-cccccccccccc", dead_owner),  # another destination's
            leave(d, ".s.zarr.tmp-dddddddddddd", {**dead_owner, "host": "elsewhere.invalid"})]  # another host's
    if command == "generate":
        args = ["generate", "--out", tmp_path / "s.zarr", *SMALL]
    else:
        src = tmp_path / "r.csv"
        src.write_text("user,item,rating\n" + "".join(f"{u},{i},{1 + (u + i) % 5}\n" for u in range(30)
                                                       for i in range(4)))
        args = ["ingest", src, "--out", tmp_path / "s.zarr"]
    code, _, err, exc = run(*args)
    assert code == 0, (err, exc)
    assert all(not os.path.exists(p) for p in dead)
    assert hidden(d) == sorted(os.path.basename(p) for p in kept)
    notes = [ln for ln in err.splitlines() if "temporary director" in ln]
    assert len(notes) == 1 and notes[0].startswith("note: removed 3 temporary directories left by processes "
                                                   "that are gone: "), err
    assert all(p in notes[0] for p in dead)
    assert not os.path.exists(tmp_path / "s.zarr" / OWNER_FILE)


def test_train_removes_dead_runs_model_temp_dirs(tmp_path, dead_owner):
    store = tmp_path / "s.zarr"
    assert run("generate", "--out", store, *SMALL)[0] == 0
    dead = leave(str(tmp_path), ".model.tmp-1234abcd", dead_owner)  # the 8-hex names of earlier versions too
    live = leave(str(tmp_path), ".model.tmp-abcdef012345", current_owner())
    code, _, err, exc = run("train", store, "--epsilon", "1", "--method", "means", "--out", tmp_path / "model",
                            "--seed", "0")
    assert code == 0, (err, exc)
    assert not os.path.exists(dead) and os.path.isdir(live)
    assert f"note: removed 1 temporary directory left by a process that is gone: {dead}" in err
    assert sorted(os.listdir(tmp_path / "model")) == ["factors.zarr", "model.json", "privacy.json"]


def test_nothing_to_remove_says_nothing(tmp_path):
    code, _, err, _ = run("generate", "--out", tmp_path / "s.zarr", *SMALL)
    assert code == 0 and "temporary director" not in err and hidden(tmp_path) == []


def test_a_killed_generate_is_cleaned_up_by_the_next(tmp_path):
    """The real thing: ``kill -9`` a generate while it writes, then generate again."""
    out = tmp_path / "s.zarr"
    env = {**os.environ, "STREAMDP_PROGRESS": "0"}
    p = subprocess.Popen([sys.executable, "-m", "streamdp", "generate", "--out", str(out), "--users", "3000000",
                          "--items", "200", "--ratings-per-user", "10", "--workers", "1"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait until it is writing blocks into its temporary directory
            tmps = [n for n in hidden(tmp_path) if ".tmp-" in n]
            if tmps and os.path.exists(tmp_path / tmps[0] / "train" / "items" / "c"):
                break
            time.sleep(0.05)
        else:
            pytest.fail("generate never started writing")
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert hidden(tmp_path) == tmps and not out.exists()
    code, _, err, exc = run("generate", "--out", out, *SMALL)
    assert code == 0, (err, exc)
    assert hidden(tmp_path) == [] and f"gone: {tmp_path / tmps[0]}" in err
