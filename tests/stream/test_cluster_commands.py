"""``verify`` and ``sweep`` go through the stream engine: ``--scheduler`` runs their passes on Dask, same results.

Fast: Dask in this process (``dask``); slow: a 2-process ``LocalCluster``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from streamdp.cli import main
from streamdp.errors import StoreError
from streamdp.serving.model import load_model
from streamdp.stream.verify import verify_store

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from streamdp.storage.generate import generate_store

    path = tmp_path_factory.mktemp("cmds") / "s.zarr"
    return generate_store(str(path), n_users=1600, n_items=80, ratings_per_user=12, rank=3, seed=7,
                          test_fraction=0.2, block_users=400, show_progress=False)


def _same_verify(a, b):
    a, b = dict(a), dict(b)
    a.pop("seconds"), b.pop("seconds")
    return a == b


READS: list = []  # (block, split, thread name) of every block verify reads


def test_verify_on_in_process_dask_equals_threads(store, monkeypatch):
    """The blocks are read on the engine's workers (Dask's threads here), the checksum is the same."""
    import threading

    from streamdp.storage.store import RatingStore

    real = RatingStore.read_block_unchecked

    def spy(self, b, split="train"):
        READS.append((b, split, threading.current_thread().name))
        return real(self, b, split)

    monkeypatch.setattr(RatingStore, "read_block_unchecked", spy)
    READS.clear()
    ref = verify_store(store.path, workers=2)
    assert all(t.startswith("streamdp-work") for _, _, t in READS) and len(READS) == 2 * store.n_blocks
    READS.clear()
    got = verify_store(store.path, workers=2, scheduler="dask")
    assert sorted((b, s) for b, s, _ in READS) == [(b, s) for b in range(store.n_blocks) for s in ("test", "train")]
    assert all("Dask-Default-Threads" in t for _, _, t in READS), READS
    assert _same_verify(ref, got) and got["checksum"] == store.checksum


def test_verify_on_dask_names_the_first_damaged_block(tmp_path):
    """A damaged block found on a Dask worker gives the same one-line error as on local threads."""
    from streamdp.storage.generate import generate_store

    st = generate_store(str(tmp_path / "d.zarr"), n_users=1600, n_items=80, ratings_per_user=12, rank=3, seed=7,
                        test_fraction=0.2, block_users=400, show_progress=False)
    import zarr

    dg = zarr.open(st.path, mode="r+")["train/block_digests"]
    d = np.asarray(dg[2]).copy()
    d[0] ^= 0xFF
    dg[2] = d
    msgs = []
    for sched in (None, "dask"):
        with pytest.raises(StoreError) as exc:
            verify_store(st.path, workers=2, scheduler=sched)
        msgs.append(str(exc.value))
    assert msgs[0] == msgs[1] and "train: block 2 " in msgs[0]


def test_cli_verify_and_sweep_take_scheduler(store, tmp_path):
    r = CliRunner().invoke(main, ["verify", store.path, "--scheduler", "dask", "--workers", "2", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["checksum"] == store.checksum
    for cmd in ("verify", "sweep"):
        h = CliRunner().invoke(main, [cmd, "--help"]).output
        assert "--scheduler" in h, cmd
    assert "--state" in CliRunner().invoke(main, ["sweep", "--help"]).output


def _sweep(store, out, methods="means", **kw):
    from streamdp.workflows.sweep import sweep

    return sweep(store, methods=methods, epsilons="1", out=str(out), seed=3, workers=2, over_budget=True,
                 **kw)


@pytest.mark.slow  # issue 41: 3 s; training on Dask equals threads by default (tests/stream/test_cluster.py)
def test_sweep_on_in_process_dask_equals_threads(store, tmp_path):
    a = _sweep(store, tmp_path / "a")
    b = _sweep(store, tmp_path / "b", scheduler="dask", state=str(tmp_path / "st"))
    assert [r["test_rmse"] for r in a["rows"]] == [r["test_rmse"] for r in b["rows"]]
    for ra, rb in zip(a["rows"], b["rows"]):
        ma, mb = load_model(ra["model"]), load_model(rb["model"])
        assert ma.info["engine"]["scheduler"] == "threads" and mb.info["engine"]["scheduler"] == "dask"
        assert np.array_equal(ma.item_factors, mb.item_factors) and np.array_equal(ma.item_bias, mb.item_bias)


@pytest.mark.slow
def test_verify_and_sweep_on_a_process_cluster_equal_threads(store, tmp_path):
    ref = verify_store(store.path, workers=2)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  memory_limit="1GB") as cluster, \
            distributed.Client(cluster, set_as_default=False) as client:
        assert _same_verify(ref, verify_store(store.path, scheduler=client))
        a = _sweep(store, tmp_path / "a", methods="means,als")
        b = _sweep(store, tmp_path / "b", methods="means,als", scheduler=client, state=str(tmp_path / "st"))
    assert [r["test_rmse"] for r in a["rows"]] == [r["test_rmse"] for r in b["rows"]]
    assert all(load_model(r["model"]).info["engine"]["scheduler"] == "distributed" for r in b["rows"])
