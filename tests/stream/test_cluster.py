"""Every method on Dask: in-process and on a 2-process LocalCluster, bit-identical to local threads.

Also: per-user state at a state URL (``--state``), written on the workers by the task owning the block, and a
worker killed in the middle of a pass (Dask runs its task again; the result does not change).
"""

from __future__ import annotations

import os
import pickle
import signal

import numpy as np
import pytest

from streamdp.stream.driver import Run
from streamdp.stream.engine import Engine
from streamdp.stream.state import UserState

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from streamdp.storage.generate import generate_store

    path = tmp_path_factory.mktemp("cluster") / "s.zarr"
    return generate_store(str(path), n_users=2000, n_items=120, ratings_per_user=20, rank=3, seed=5,
                          test_fraction=0.2, block_users=400, show_progress=False)


@pytest.fixture(scope="session")
def cluster_client(tmp_path_factory):
    """A LocalCluster of 2 single-threaded worker processes for the whole session."""
    import dask

    scratch = tmp_path_factory.mktemp("dask-scratch")
    with dask.config.set({"temporary-directory": str(scratch)}), \
            distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                     memory_limit="1GB") as cluster, \
            distributed.Client(cluster, set_as_default=False) as client:
        yield client


def _sum_fn(block, b):
    return np.bincount(block.items, weights=block.ratings.astype(np.float64), minlength=120)


def _add(a, x):
    a += x
    return a


# -- per-user state at a location workers can reach ---------------------------------------------------------------
def test_state_opened_by_relative_path_is_found_from_another_directory(tmp_path, monkeypatch):
    """A worker has its own working directory: the state pickles as an absolute location and reopens there."""
    monkeypatch.chdir(tmp_path)
    st = UserState("rel-state", "u", n_users=10, k=2, block_users=4)
    st.write(1, np.full((4, 2), 7, np.float32))
    blob = pickle.dumps(st)
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.chdir(other)
    again = pickle.loads(blob)
    assert again.root == str(tmp_path / "rel-state")
    assert np.all(again.read(1) == 7) and np.all(again.read(0) == 0)
    again.write(2, np.ones((2, 2), np.float32))  # the copy writes the same chunk files
    assert np.all(st.read(2) == 1)


def test_run_directory_under_a_state_url_is_removed_with_the_run(store):
    import fsspec

    fs = fsspec.filesystem("memory")
    with Run(store, method="demo", fingerprint="f", seed=1, rng_key=9, state="memory://runs-a") as run:
        assert run.dir.startswith("memory://runs-a/demo-")
        u = run.user_state("coef", 3)[0]
        u.write(0, np.ones((store.block_users, 3), np.float32))
        run.save(1, V=np.zeros(2))
        keys = fs.find("/runs-a")
        assert any(k.endswith("/owner.json") for k in keys)  # a dead run's prefix can be swept
        assert any("/coef_0/" in k for k in keys) and np.all(pickle.loads(pickle.dumps(u)).read(0) == 1)
    assert fs.find("/runs-a") == []
    assert not os.path.exists(store.path + ".state")  # nothing was put beside the store


def test_in_process_dask_equals_threads(store):
    with Engine(store, workers=2, memory_limit="2GB") as eng:
        ref = eng.map_reduce(_sum_fn, _add, np.zeros(120))
    with Engine(store, workers=2, scheduler="dask", memory_limit="2GB") as eng:
        assert eng.describe()["scheduler"] == "dask" and eng.in_process and eng.inner_threads == 1
        order = eng.map_reduce(lambda blk, b: [b], lambda a, x: a + x, [])
        out = eng.map_reduce(_sum_fn, _add, np.zeros(120))
    assert order == list(range(store.n_blocks))
    assert np.array_equal(out, ref)


def test_fw_with_state_url_in_process_dask_equals_threads(store, tmp_path, monkeypatch):
    """fw refused any Dask scheduler; its coefficients now go to --state and the model is bit-identical."""
    import streamdp.stream.driver as driver
    from streamdp.workflows.api import train

    roots = []

    class Recorded(UserState):
        def __init__(self, root, *a, **k):
            roots.append(str(root))
            super().__init__(root, *a, **k)

    monkeypatch.setattr(driver, "UserState", Recorded)

    kw = dict(method="fw", epsilon=1.0, rank=3, seed=4, over_budget=True, evaluate=True)
    a = train(store, workers=2, **kw)
    b = train(store, workers=2, scheduler="dask", state=str(tmp_path / "st"), **kw)
    assert np.array_equal(a.item_factors, b.item_factors) and np.array_equal(a.item_bias, b.item_bias)
    assert a.summary["test_rmse"] == b.summary["test_rmse"]
    assert b.info["engine"]["scheduler"] == "dask"
    assert roots and all(r.startswith(str(tmp_path / "st") + "/fw-") for r in roots[len(roots) // 2:])
    assert os.listdir(tmp_path / "st") == []  # the run directory under --state went with the run


def test_a_privately_selected_catalogue_on_dask_equals_threads(tmp_path):
    """An ingested store declares no items: a private run selects its catalogue and reads the store through a view.
    The Dask tasks read blocks by the store's path: they failed ("could not broadcast (60,) into (16,)") until the
    engine sent the view along (``RatingStore.remote_view``)."""
    import pandas as pd

    import streamdp

    rng = np.random.default_rng(0)
    df = pd.DataFrame({"user": rng.integers(0, 3000, 20000), "item": rng.zipf(1.3, 20000) % 60,
                       "rating": rng.integers(1, 6, 20000).astype(float)})
    st = streamdp.ingest(df, str(tmp_path / "s.zarr"), block_users=500, test_fraction=0.2)
    kw = dict(epsilon=1.0, seed=1, evaluate=False, workers=2, over_budget=True)
    a = streamdp.train(st, **kw)
    b = streamdp.train(st, scheduler="dask", **kw)
    assert 0 < len(a.item_ids) < 60 and list(a.item_ids) == list(b.item_ids)
    assert np.array_equal(a.item_factors, b.item_factors) and np.array_equal(a.item_bias, b.item_bias)


def test_tunes_views_read_the_same_blocks_on_dask(store):
    """tune's held-out and Poisson-sampled views (and a catalogue under them) are made again on the workers."""
    from streamdp.storage.catalogue import CatalogueView
    from streamdp.workflows.tune import _HeldOut, _Sampled

    cat = CatalogueView(store, store.item_ids()[::2])

    def sums(blk, b):
        return np.bincount(blk.items, weights=blk.ratings.astype(np.float64), minlength=120)

    views = (_HeldOut(store, 7), _Sampled(cat, 7, 0.3, store.n_users), _Sampled(store, 7, 0.3, store.n_users, 0.5))
    for view in views:
        with Engine(view, workers=2, memory_limit="2GB") as eng:
            ref = eng.map_reduce(sums, _add, np.zeros(120))
        with Engine(view, workers=2, scheduler="dask", memory_limit="2GB") as eng:
            assert np.array_equal(eng.map_reduce(sums, _add, np.zeros(120)), ref)
    with Engine(store, workers=2, memory_limit="2GB") as eng:
        assert not np.array_equal(eng.map_reduce(sums, _add, np.zeros(120)), ref)  # the views do change the blocks


def test_a_view_without_a_remote_view_is_refused_on_dask(store):
    from streamdp.storage.store import RatingStore

    class Halved(RatingStore):
        def __init__(self, inner):
            self.__dict__.update(inner.__dict__)
            self._inner = inner

        def read_block(self, b, split="train"):
            return self._inner.read_block(b, split)

    with Engine(Halved(store), workers=2, scheduler="dask", memory_limit="2GB") as eng:
        with pytest.raises(NotImplementedError, match="remote_view"):
            eng.map_reduce(_sum_fn, _add, np.zeros(120))


# -- a 2-process cluster ------------------------------------------------------------------------------------------
def _write_pid(state):
    def fn(block, b):
        rows = np.empty((block.n_users, 2), np.float32)
        rows[:, 0] = b
        rows[:, 1] = os.getpid()
        state.write(b, rows)
        return block.nnz
    return fn


def test_cluster_workers_write_their_blocks_state(store, tmp_path, cluster_client):
    """Each block's rows are written on a worker process (not here), by the task owning the block."""
    st = UserState(str(tmp_path / "state"), "u", n_users=store.n_users, k=2, block_users=store.block_users)
    with Engine(store, scheduler=cluster_client, memory_limit="2GB") as eng:
        assert eng.distributed and not eng.in_process
        total = eng.map_reduce(_write_pid(st), _add, 0)
    assert total == store.n_ratings
    pids = set()
    for b in range(store.n_blocks):
        rows = st.read(b)
        assert np.all(rows[:, 0] == b)
        pids |= set(rows[:, 1].astype(np.int64).tolist())
    assert os.getpid() not in pids and pids <= set(cluster_client.run(os.getpid).values())


def _die_once(marker, fn):
    def run(block, b):
        out = fn(block, b)
        if b == 2:
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return out
            os.close(fd)
            os.kill(os.getpid(), signal.SIGKILL)  # the worker dies mid-pass, after writing its block's state
        return out
    return run


@pytest.mark.slow
def test_killed_worker_mid_pass_result_unchanged(store, tmp_path, cluster_client):
    st = UserState(str(tmp_path / "state"), "u", n_users=store.n_users, k=2, block_users=store.block_users)

    def fn(block, b):
        _write_pid(st)(block, b)
        return _sum_fn(block, b)

    with Engine(store, workers=2, memory_limit="2GB") as eng:
        ref = eng.map_reduce(_sum_fn, _add, np.zeros(120))
    marker = str(tmp_path / "killed")
    with Engine(store, scheduler=cluster_client, memory_limit="2GB") as eng:
        out = eng.map_reduce(_die_once(marker, fn), _add, np.zeros(120))
    assert os.path.exists(marker)  # a worker was killed
    assert np.array_equal(out, ref)
    assert all(np.all(st.read(b)[:, 0] == b) for b in range(store.n_blocks))


METHODS = [
    ("als", {}), ("means", {}), ("oja", {}), ("svd", {}), ("fw", {}), ("public-private", {"public_fraction": 0.3}),
    ("sgld", {"epochs": 2, "epoch_scheme": "blocks"}),
    ("sgd", {"epsilon": float("inf"), "allow_nonprivate": True, "epochs": 2, "epoch_scheme": "blocks"}),
]


@pytest.mark.slow
@pytest.mark.parametrize("method, options", METHODS, ids=[m for m, _ in METHODS])
def test_every_method_on_the_cluster_equals_local(store, tmp_path, cluster_client, method, options):
    """Training and the evaluation after it on the cluster: the same model and RMSE as on local threads.

    sgd/sgld run their epochs on the cluster with --epoch-scheme blocks (Hogwild is refused there,
    tests/methods/test_epoch_scheme.py).
    """
    from streamdp.workflows.api import train

    kw = dict(method=method, epsilon=1.0, rank=3, seed=4, over_budget=True, evaluate=True, workers=1)
    kw.update(options)
    a = train(store, **kw)
    b = train(store, scheduler=cluster_client, state=str(tmp_path / "st"), **kw)
    assert b.info["engine"]["scheduler"] == "distributed"
    assert np.array_equal(a.item_factors, b.item_factors) and np.array_equal(a.item_bias, b.item_bias)
    assert a.summary["test_rmse"] == b.summary["test_rmse"]


@pytest.mark.slow
def test_lowrank_on_the_cluster_equals_local(store, tmp_path, cluster_client):
    from streamdp.serving.model import load_model
    from streamdp.workflows.training import lowrank

    kw = dict(rank=3, epsilon=1.0, delta=1e-6, seed=4, over_budget=True)
    a = lowrank(store, out=str(tmp_path / "a"), workers=2, **kw)
    b = lowrank(store, out=str(tmp_path / "b"), scheduler=cluster_client, state=str(tmp_path / "st"), **kw)
    assert a["singular_values"] == b["singular_values"]
    assert np.array_equal(load_model(str(tmp_path / "a")).item_factors, load_model(str(tmp_path / "b")).item_factors)
