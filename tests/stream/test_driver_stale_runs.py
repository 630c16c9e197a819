"""Run directories record their owner; sweep_stale_runs removes only those of dead processes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

from streamdp.owner import OWNER_FILE, current_owner
from streamdp.stream.driver import Run, sweep_stale_runs


def test_sweep_removes_only_dead_owners_runs(tmp_path):
    store = SimpleNamespace(path=str(tmp_path / "s.zarr"), n_users=10, block_users=4, checksum="x")
    state = tmp_path / "s.zarr.state"
    with Run(store, method="demo", fingerprint="f", seed=1, rng_key=1) as run:
        live = run.dir
        assert json.loads(Path(live, OWNER_FILE).read_text())["pid"] == os.getpid()
        me = current_owner()
        dead = state / "sgld-dead"
        dead.mkdir()
        (dead / OWNER_FILE).write_text(json.dumps({**me, "start_ticks": me["start_ticks"] + 1}))
        (dead / "U_0").mkdir()
        unknown = state / "mine"  # no owner recorded: not ours to judge
        unknown.mkdir()
        assert sweep_stale_runs(store) == [str(dead)]
        assert os.path.isdir(live) and unknown.is_dir() and not dead.exists()
    assert not os.path.exists(live) and os.listdir(state) == ["mine"]  # the run removed its own directory
    assert sweep_stale_runs(str(tmp_path / "s.zarr")) == []  # a store's path works too
