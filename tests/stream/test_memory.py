"""Bounded memory: a pass over a >= 50M-rating store with --memory-limit 512MB stays under the limit.

The store is generated into a temporary directory (block by block, ~75 s on two
cores), then ``streamdp train`` (oja: stats pass + 2 subspace passes, k=16; als:
statistics pass + 2 iterations, k=16) runs in a
child process that reports its own peak resident set size (``VmHWM`` of
``/proc/self/status``, exact, not sampled; ``ru_maxrss`` is not used because Linux
carries the forking parent's high-water mark across ``exec``). A first child run on a tiny store compiles the Numba kernels into
their on-disk cache, so the measured run is the steady state (measured: ~340 MB
for 51.7M ratings).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

CHILD = r"""
import json, resource, sys, time
from streamdp.cli import main
from streamdp.stream import engine
baselines = []  # each engine's baseline: the process's own footprint before its blocks (docs/scale.md)
_init = engine.Engine.__init__
def _record(self, *a, **k):
    _init(self, *a, **k)
    baselines.append(self.baseline)
engine.Engine.__init__ = _record
t = time.perf_counter()
try:
    main(sys.argv[1:], standalone_mode=False)
finally:
    # VmHWM: peak RSS of this address space. ru_maxrss would also count the parent's
    # pages resident in the forked child before exec (Linux keeps that high-water mark).
    try:
        with open("/proc/self/status") as f:
            peak = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))
    except (OSError, StopIteration):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"peak_rss": peak, "seconds": time.perf_counter() - t, "baselines": baselines}),
          file=sys.stderr)
"""


def peak_rss_of(*args: str) -> dict:
    """Run ``streamdp ARGS`` in a child process; return its peak RSS, wall time and engines' baselines."""
    p = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stderr.strip().splitlines()[-1])


def peak_rss_of_train(store: str, out: str, memory_limit: str, *extra: str) -> dict:
    """Run ``streamdp train`` in a child process; return its peak RSS and wall time."""
    return peak_rss_of("train", store, "--epsilon", "1", "--delta", "1e-7", "--out", out, "--memory-limit",
                       memory_limit, "--rank", "16", *extra)


@pytest.fixture(scope="module")
def big_store(tmp_path_factory):
    """A >= 50M-rating generated store, and the kernels compiled into their cache by a tiny run of each method."""
    from streamdp.storage.generate import generate_store

    tmp = tmp_path_factory.mktemp("memory")
    # compile (and cache) the Numba kernels first, so the measured runs are the steady state
    # (measured with an empty cache as well: 343 MB, compilation adds little)
    tiny = generate_store(str(tmp / "tiny.zarr"), n_users=500, n_items=50, ratings_per_user=5, rank=2, seed=1)
    peak_rss_of_train(tiny.path, str(tmp / "m0"), "512MB", "--method", "oja", "--passes", "2")
    peak_rss_of_train(tiny.path, str(tmp / "m1"), "512MB", "--method", "als", "--iters", "1")
    st = generate_store(str(tmp / "big.zarr"), n_users=1_000_000, n_items=2_000, ratings_per_user=52, rank=8,
                        seed=3, show_progress=False)
    assert st.n_ratings >= 50_000_000
    return st


@pytest.mark.slow
def test_pass_over_50M_ratings_within_512MB(big_store, tmp_path):
    r = peak_rss_of_train(big_store.path, str(tmp_path / "m"), "512MB", "--method", "oja", "--passes", "2")
    print(f"oja, {big_store.n_ratings:,} ratings, --memory-limit 512MB: peak RSS {r['peak_rss'] / 1e6:.0f} MB")
    assert r["peak_rss"] < 512e6, r


@pytest.mark.slow
def test_als_over_50M_ratings_within_512MB(big_store, tmp_path):
    """DP-ALS: the statistics pass and two iterations (users solved per block, item sums reduced in order)."""
    r = peak_rss_of_train(big_store.path, str(tmp_path / "m"), "512MB", "--method", "als", "--iters", "2")
    print(f"als, {big_store.n_ratings:,} ratings, --memory-limit 512MB: peak RSS {r['peak_rss'] / 1e6:.0f} MB, "
          f"{r['seconds']:.0f}s")
    assert r["peak_rss"] < 512e6, r


@pytest.mark.slow
@pytest.mark.parametrize("mechanism,extra", [("measurements", ()), ("randomized-response", ("--power-iters", "1"))])
def test_lowrank_over_50M_ratings_within_512MB(big_store, tmp_path, mechanism, extra):
    """``streamdp lowrank``: Gaussian measurements (sketch + projection passes) and randomized response, whose noisy
    matrix (1M users x 2,000 items: 16 GB dense) is regenerated chunk by chunk, never materialized."""
    from streamdp.storage.generate import generate_store

    tiny = generate_store(str(tmp_path / "tiny.zarr"), n_users=500, n_items=50, ratings_per_user=5, rank=2, seed=1)
    args = ("--epsilon", "1", "--delta", "1e-7", "--rank", "16", "--memory-limit", "512MB", "--mechanism", mechanism,
            *extra)
    peak_rss_of("lowrank", tiny.path, "--out", str(tmp_path / "m0"), *args)  # kernels into their cache
    r = peak_rss_of("lowrank", big_store.path, "--out", str(tmp_path / "m"), *args)
    print(f"lowrank {mechanism}, {big_store.n_ratings:,} ratings, --memory-limit 512MB: peak RSS "
          f"{r['peak_rss'] / 1e6:.0f} MB, {r['seconds']:.0f}s")
    assert r["peak_rss"] < 512e6, r


@pytest.mark.slow
@pytest.mark.parametrize("method, extra", [("fw", ("--rank", "3", "--passes", "1")), ("svd", ("--rank", "4"))])
def test_fw_and_svd_over_50M_ratings_within_512MB(big_store, tmp_path, method, extra):
    """Private FW keeps each user's T coefficients on disk beside the store (read and written with the block) and
    only n_items x T in memory; the SVD baseline holds one n_items x n_items covariance (plus a partial per block
    in flight)."""
    from streamdp.storage.generate import generate_store

    tiny = generate_store(str(tmp_path / "tiny.zarr"), n_users=500, n_items=50, ratings_per_user=5, rank=2, seed=1)
    peak_rss_of_train(tiny.path, str(tmp_path / "m0"), "512MB", "--method", method, *extra)  # kernels cached
    r = peak_rss_of_train(big_store.path, str(tmp_path / "m"), "512MB", "--method", method, *extra)
    print(f"{method}, {big_store.n_ratings:,} ratings, --memory-limit 512MB: peak RSS {r['peak_rss'] / 1e6:.0f} MB, "
          f"{r['seconds']:.0f}s")
    assert r["peak_rss"] < 512e6, r


@pytest.mark.slow
@pytest.mark.parametrize("mechanism, epsilon", [("pmc", "inf"), ("laplace", "1")])
def test_public_private_over_50M_ratings_within_512MB(big_store, tmp_path, mechanism, epsilon):
    """Public/private users (Xin & Jaakkola): 1% public users by id key, EM passes over their rows (the private rows are
    skipped block by block), then 1% of the private users respond once (PMC, not DP; or Laplace-noised vectors, DP)
    into the server's n_items x s sketch. Per user only a role (int16) is kept, on disk beside the store."""
    from streamdp.storage.generate import generate_store

    tiny = generate_store(str(tmp_path / "tiny.zarr"), n_users=500, n_items=50, ratings_per_user=5, rank=2, seed=1)
    args = ("--epsilon", epsilon, "--yes", "--delta", "1e-7", "--memory-limit", "512MB", "--rank", "16",
            "--method", "public-private", "--public-fraction", "0.01", "--iters", "2", "--reg", "0.2",
            "--private-mechanism", mechanism, "--private-fraction", "0.01", "--private-rounds", "1",
            "--round-iters", "1", "--private-weight", "0.5")
    peak_rss_of("train", tiny.path, "--out", str(tmp_path / "m0"), *args)  # kernels into their cache
    r = peak_rss_of("train", big_store.path, "--out", str(tmp_path / "m"), *args)
    with open(tmp_path / "m" / "model.json") as f:
        info = json.load(f)
    n_pub = info["public"]["n_public"]
    print(f"public-private {mechanism}, {big_store.n_ratings:,} ratings ({n_pub:,} public users, "
          f"{info['public']['n_public_ratings']:,} public ratings), --memory-limit "
          f"512MB: peak RSS {r['peak_rss'] / 1e6:.0f} MB, {r['seconds']:.0f}s")
    assert 0.008 * big_store.n_users < n_pub < 0.012 * big_store.n_users, n_pub  # the passes did the work
    assert r["peak_rss"] < 512e6, r


@pytest.mark.slow
def test_als_with_20k_items_trains_within_512MB(tmp_path):
    """The default method on a 20k-item store (its item-side state: 106 MB) under ``--memory-limit 512MB``.

    Refused before the engine counted the process's real baseline ("the process already uses 410.7 MB, item-side
    state needs 105.9 MB": the state, resident after the first iteration, was counted twice). The process's own
    footprint before its first block (imports, planning; docs/scale.md "Process footprint") stays <= 200 MB.
    """
    from streamdp.storage.generate import generate_store

    tiny = generate_store(str(tmp_path / "tiny.zarr"), n_users=500, n_items=50, ratings_per_user=5, rank=2, seed=1)
    args = ("--epsilon", "1", "--delta", "1e-7", "--memory-limit", "512MB", "--iters", "2")  # the default rank, 8
    peak_rss_of("train", tiny.path, "--out", str(tmp_path / "m0"), *args)  # kernels into their cache
    st = generate_store(str(tmp_path / "wide.zarr"), n_users=400_000, n_items=20_000, ratings_per_user=50, rank=8,
                        seed=1, show_progress=False)
    r = peak_rss_of("train", st.path, "--out", str(tmp_path / "m"), *args)
    print(f"als, {st.n_ratings:,} ratings x 20k items, --memory-limit 512MB: peak RSS {r['peak_rss'] / 1e6:.0f} MB, "
          f"baseline {r['baselines'][0] / 1e6:.0f} MB, {r['seconds']:.0f}s")
    assert r["peak_rss"] < 512e6, r
    assert r["baselines"][0] <= 200e6, r


def test_buffer_pool_reuses_a_set_per_holder_and_pickles_empty():
    import pickle

    import numpy as np

    from streamdp.memory import BufferPool

    pool = BufferPool()
    with pool.take() as buf:
        a = buf("x", 10, np.float64)
        with pool.take() as other:  # a second holder at the same time gets a set of its own
            assert not np.shares_memory(other("x", 10, np.float64), a)
    with pool.take() as buf:
        assert np.shares_memory(buf("x", 8, np.float64), a) and len(buf("x", 20, np.float64)) == 20
    copy = pickle.loads(pickle.dumps(pool))
    with copy.take() as buf:
        assert len(buf("x", 3, np.int32)) == 3


def test_an_engine_keeps_the_objects_alive_on_entry_out_of_full_collections_and_gives_them_back(tmp_path):
    """``Engine``'s ``with`` (:func:`streamdp.memory.frozen_collector`): the objects alive on entry frozen (a full
    collection does not traverse them), unfrozen on exit; under an outer freeze (the command line's) they stay
    frozen; a cycle of garbage made during the run is collected as usual."""
    import gc
    import weakref

    from streamdp.storage.generate import generate_store
    from streamdp.stream.engine import Engine

    class Cycle:
        pass

    gc.unfreeze()
    st = generate_store(str(tmp_path / "s.zarr"), n_users=60, n_items=10, ratings_per_user=4, rank=2, seed=0,
                        block_users=20)
    try:
        with Engine(st, workers=1) as eng:
            assert gc.get_freeze_count() > 0
            c = Cycle()
            c.self = c
            gone = weakref.ref(c)
            del c
            gc.collect()
            assert gone() is None  # made during the run: not frozen
            assert eng.map_reduce(lambda blk, b: blk.nnz, lambda a, x: a + x, 0) == st.n_ratings
        assert gc.get_freeze_count() == 0
        held = [[] for _ in range(20_000)]  # alive throughout: frozen by the outer freeze, never freed
        gc.freeze()
        with Engine(st, workers=1):
            pass
        # the outer freeze is left as it was (an unfreeze would leave none); the count is not compared with the one
        # before, since frozen objects that die meanwhile (another thread's) leave the permanent generation
        assert gc.get_freeze_count() >= len(held)
    finally:
        gc.unfreeze()
