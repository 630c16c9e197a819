"""The stream engine: in-order reduction, worker counts, cluster, memory sizing, per-user state."""

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from streamdp.errors import ParameterError
from streamdp.kernels.linalg import gram_apply
from streamdp.stream.engine import Engine, UserState
from streamdp.stream.threads import thread_budget


def _gram_fn(V, n):
    def fn(block, b):
        out = np.zeros((n, V.shape[1]))
        gram_apply(block.indptr, block.items, block.ratings.astype(np.float64), V, out)
        return out
    return fn


def _add(a, x):
    a += x
    return a


def _in_memory_gram(store, V):
    n = store.n_items
    out = np.zeros((n, V.shape[1]))
    for b in range(store.n_blocks):
        blk = store.read_block(b)
        part = np.zeros_like(out)
        gram_apply(blk.indptr, blk.items, blk.ratings.astype(np.float64), V, part)
        out += part
    return out


def test_map_reduce_order_and_equality_across_workers(small_store):
    V = np.random.default_rng(0).normal(size=(small_store.n_items, 3))
    ref = _in_memory_gram(small_store, V)
    res = {}
    for w in (1, 2, 3):
        with Engine(small_store, workers=w, memory_limit="4GB") as eng:
            res[w] = eng.map_reduce(_gram_fn(V, small_store.n_items), _add, np.zeros_like(ref))
            order = eng.map_reduce(lambda blk, b: [b], lambda a, x: a + x, [])
        assert order == list(range(small_store.n_blocks))
    assert np.array_equal(res[1], ref)  # bit-for-bit: same per-block partials, same order of sums
    assert np.array_equal(res[2], ref) and np.array_equal(res[3], ref)


def test_foreach_one_worker_is_strictly_sequential(small_store):
    seen, active, peak = [], [0], [0]
    lock = threading.Lock()

    def fn(block, b):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        seen.append(b)
        with lock:
            active[0] -= 1
        return block.nnz

    with Engine(small_store, workers=1, memory_limit="4GB") as eng:
        order = [3, 1, 4, 0, 2]
        out = eng.foreach(fn, order=order)
    assert seen == order and peak[0] == 1
    assert out == [small_store.read_block(b).nnz for b in order]


def test_local_passes_run_as_one_dask_graph_each(small_store, monkeypatch):
    import dask.threaded

    calls, orig = [], dask.threaded.get
    monkeypatch.setattr(dask.threaded, "get", lambda *a, **k: (calls.append(1), orig(*a, **k))[1])
    n = small_store.n_blocks
    with Engine(small_store, workers=2, memory_limit="4GB") as eng:
        assert eng.map_reduce(lambda blk, b: blk.nnz, lambda a, x: a + x, 0) == small_store.n_ratings
        assert eng.foreach(lambda blk, b: b) == list(range(n))
        assert [b for b, _ in eng.imap(lambda blk, b: b)] == list(range(n))
    assert len(calls) == 3


def test_local_window_bounds_blocks_started_but_not_combined(small_store):
    order = list(range(small_store.n_blocks)) * 5
    lock = threading.Lock()
    started, combined, peak = [0], [0], [0]

    def fn(_, b):
        with lock:
            started[0] += 1
            peak[0] = max(peak[0], started[0] - combined[0])
        return b

    def combine(acc, b):
        time.sleep(0.01)  # a slow caller: the workers wait for it instead of reading ahead without bound
        with lock:
            combined[0] += 1
        return acc + [b]

    with Engine(small_store, workers=2, memory_limit="4GB") as eng:
        assert eng.map_reduce(fn, combine, [], split=None, blocks=order) == order
        window = eng.in_flight
    assert window < len(order) and peak[0] <= window


def test_closing_a_pass_early_stops_it_after_its_running_blocks(small_store):
    done = []

    def fn(_, b):
        time.sleep(0.01)
        done.append(b)
        return b

    with Engine(small_store, workers=2, memory_limit="4GB") as eng:
        it = eng.imap(fn, blocks=list(range(small_store.n_blocks)) * 20)
        assert [next(it)[1] for _ in range(3)] == [0, 1, 2]
        it.close()
        n = len(done)
        time.sleep(0.1)
        assert len(done) == n <= 3 + eng.in_flight  # nothing runs after close() returned


def test_errors_propagate(small_store):
    def boom(block, b):
        if b == 2:
            raise RuntimeError("block 2 failed")
        return 0

    with Engine(small_store, workers=2, memory_limit="4GB") as eng, pytest.raises(RuntimeError, match="block 2"):
        eng.map_reduce(boom, lambda a, x: a, 0)


def test_memory_budget_sizes_blocks_in_flight(small_store):
    eng = Engine(small_store, workers=2, memory_limit="64GB")
    assert 1 <= eng.in_flight <= 7
    with pytest.raises(ParameterError, match="memory-limit"):
        Engine(small_store, workers=2, memory_limit="1MB")


def test_memory_budget_counts_resident_item_state_once(small_store):
    """The state a caller declares is counted once: before it is allocated (baseline + state) and after (in the RSS
    now), not in both. The old sizing (RSS now minus the declared state again) refused a 512MB ALS run on a 20k-item
    store once its 106 MB of item state was resident."""
    from streamdp.memory import KERNEL_CODE_BYTES, current_rss

    state = 200_000_000
    eng = Engine(small_store, workers=2, memory_limit="64GB", state_bytes=state)
    used, code = eng.memory_used()
    assert used >= eng.baseline + state + code and code in (0, KERNEL_CODE_BYTES)
    held = np.ones(state // 8)  # the declared state, now resident
    per = eng.block_bytes()
    eng.memory_limit = current_rss() + KERNEL_CODE_BYTES + 4 * per + 20_000_000
    assert eng.blocks_in_flight() >= 4  # counted twice, nothing would fit
    assert held.sum() == state // 8
    eng.memory_limit = eng.baseline + state // 2
    with pytest.raises(ParameterError, match="item-side state"):
        eng.blocks_in_flight()


def test_a_refusal_after_compiling_kernels_says_a_second_run_holds_less(small_store, monkeypatch):
    """On a cold Numba cache the compiler's memory stays with the process (about 200 MB after a 2M-rating ALS fit,
    streamdp.memory.kernels_compiled_here): the refusal names it, and only when this run compiled something."""
    import streamdp.stream.engine as engine_module

    eng = Engine(small_store, workers=2, memory_limit="64GB")
    held = np.ones(60_000_000 // 8)  # memory beyond the baseline and the declared state, as a compiler leaves it
    eng.memory_limit = engine_module.current_rss() + eng.block_bytes() // 2
    monkeypatch.setattr(engine_module, "kernel_code_loaded", lambda: True)
    monkeypatch.setattr(engine_module, "kernels_compiled_here", lambda: 0)
    with pytest.raises(ParameterError) as e:
        eng.blocks_in_flight()
    assert "compiler" not in str(e.value)
    monkeypatch.setattr(engine_module, "kernels_compiled_here", lambda: 7)
    with pytest.raises(ParameterError, match=r"the rest, [0-9.]+ MB, mostly Numba's compiler after compiling 7 "
                                             r"kernel\(s\) in this run: they are cached now") as e:
        eng.blocks_in_flight()
    assert str(e.value).count("\n") == 0 and held.sum() == len(held)


def test_a_window_bounded_by_the_limit_unmaps_freed_blocks(small_store, monkeypatch):
    """When --memory-limit, not the cap, bounds the blocks in flight, freed blocks go back to the system
    (glibc's arenas kept them: a 1e9-rating fit under 512MB crept to 565 MB); with room to spare, no cost."""
    import streamdp.stream.engine as engine_module

    calls = []
    monkeypatch.setattr(engine_module, "unmap_large_frees", lambda: calls.append(1))
    eng = Engine(small_store, workers=2, memory_limit="64GB")
    assert eng.in_flight == 7 and not calls
    used, _ = eng.memory_used()
    eng.memory_limit = used + 2 * eng.block_bytes() + eng.block_bytes() // 2
    assert eng.blocks_in_flight() < 7 and calls


def test_a_window_bounded_by_the_limit_holds_one_block_beyond_the_workers(small_store, monkeypatch):
    """Under a limit that bounds the window, blocks in flight beyond the workers' own buy no speed but cost their
    memory: at most one more, however many the limit would allow; with room to spare, the cap."""
    import streamdp.stream.engine as engine_module

    monkeypatch.setattr(engine_module, "unmap_large_frees", lambda: None)
    eng = Engine(small_store, workers=2, memory_limit="64GB")
    assert eng.in_flight == 7
    used, _ = eng.memory_used()
    for fit, want in ((6, 3), (3, 3), (2, 2)):
        eng.memory_limit = used + fit * eng.block_bytes() + eng.block_bytes() // 2
        assert eng.blocks_in_flight() == want, fit


def test_thread_budget():
    assert thread_budget(None, cores=2) == (2, 1)
    assert thread_budget(1, cores=2) == (1, 2)
    with pytest.raises(ParameterError):
        thread_budget(0, cores=2)


def test_user_state_roundtrip(tmp_path, small_store):
    st = UserState(str(tmp_path), "U", n_users=small_store.n_users, k=3, block_users=small_store.block_users)
    assert st.n_blocks == small_store.n_blocks

    def fn(block, b):
        st.write(b, np.full((block.n_users, 3), b, np.float32))
        return 0

    with Engine(small_store, workers=2, memory_limit="4GB") as eng:
        eng.foreach(fn)
    for b in range(st.n_blocks):
        assert np.all(st.read(b) == b)
    again = UserState(str(tmp_path), "U", n_users=small_store.n_users, k=3, block_users=small_store.block_users,
                      mode="a")
    assert np.all(again.read(1) == 1)
    with pytest.raises(ParameterError):
        UserState(str(tmp_path), "U", n_users=small_store.n_users + 1, k=3, block_users=10, mode="a")


@pytest.mark.slow  # issue 41: a process LocalCluster costs ~5 s; the in-process Dask cases (tests/stream/test_cluster*.py) stay in the default run
def test_local_cluster_equals_threads(small_store, tmp_path, monkeypatch, capsys):
    distributed = pytest.importorskip("distributed")
    import dask  # a dependency of distributed
    V = np.random.default_rng(0).normal(size=(small_store.n_items, 3))
    ref = _in_memory_gram(small_store, V)
    monkeypatch.setattr("streamdp.progress.enabled", lambda: True)  # as on a terminal
    with dask.config.set({"temporary-directory": str(tmp_path)}), \
            distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                     memory_limit="1GB") as cluster, distributed.Client(cluster) as client:
        with Engine(small_store, scheduler=client, memory_limit="4GB") as eng:
            assert eng.distributed
            capsys.readouterr()
            out = eng.map_reduce(_gram_fn(V, small_store.n_items), _add, np.zeros_like(ref), desc="cluster pass")
            assert "cluster pass" in capsys.readouterr().err  # the distributed path draws its bar too
        with Engine(small_store, scheduler=cluster.scheduler_address, memory_limit="4GB") as eng:
            out2 = eng.map_reduce(_gram_fn(V, small_store.n_items), _add, np.zeros_like(ref))
    assert np.array_equal(out, ref) and np.array_equal(out2, ref)


def test_passes_draw_a_progress_bar_only_when_enabled(small_store, monkeypatch):
    """Each pass draws a bar of its blocks, labelled by the caller, on stderr; never when stderr is not a
    terminal (as in this test run), under quiet() (the CLI's --json) or with STREAMDP_PROGRESS=0."""
    import io
    import sys

    from streamdp import progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    def run(eng, err):
        monkeypatch.setattr(sys, "stderr", err)
        try:
            eng.map_reduce(lambda blk, b: blk.nnz, _add, 0, desc="als iteration 3/7")
            eng.foreach(lambda blk, b: blk.nnz, desc="sgld epoch 2/20")
        finally:
            monkeypatch.setattr(sys, "stderr", sys.__stderr__)
        return err.getvalue()

    nb = small_store.n_blocks
    with Engine(small_store, workers=2, memory_limit="2GB") as eng:
        assert run(eng, io.StringIO()) == ""  # stderr is no terminal
        with monkeypatch.context() as m:
            m.setattr(progress, "enabled", lambda: True)
            text = run(eng, io.StringIO())
        assert "als iteration 3/7" in text and "sgld epoch 2/20" in text and f"0/{nb} " in text
        assert "sgld epoch 2/20" in run(eng, Terminal())
        with progress.quiet():
            assert run(eng, Terminal()) == ""
        monkeypatch.setenv("STREAMDP_PROGRESS", "0")
        assert run(eng, Terminal()) == ""


_KEEP = """
import sys, threading
from streamdp.serving.model import load_model
m = load_model(sys.argv[1])
G = m.recommend_all(sys.argv[2], 3, workers=2)
print(next(G).num_rows, flush=True)
if sys.argv[3] == "drop":  # dropped: closed by the garbage collector, its pass's threads gone at once
    del G
    print(sum(t.name.startswith(("streamdp-work", "streamdp-pass")) for t in threading.enumerate()), flush=True)
"""


@pytest.mark.parametrize("how", [pytest.param("keep", marks=pytest.mark.slow), "drop"])
def test_a_generator_read_in_part_does_not_hold_the_interpreter(tmp_path, how):
    """Issue 40: a ``recommend_all`` generator read in part and kept in a global held the process forever (a pool
    thread waited to hand over its block). Kept or dropped, the process now exits."""
    import subprocess
    import sys

    import streamdp
    from streamdp.storage.generate import generate_store

    st = generate_store(str(tmp_path / "s.zarr"), n_users=600, n_items=30, ratings_per_user=8, rank=2, seed=1,
                        block_users=50)
    streamdp.train(st, method="means", epsilon=float("inf"), out=str(tmp_path / "m"), evaluate=False,
                   allow_nonprivate=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(streamdp.__file__).parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", _KEEP, str(tmp_path / "m"), st.path, how], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split()
    assert int(lines[0]) > 0 and (how == "keep" or lines[1] == "0"), r.stdout


def test_blocks_read_into_reused_arrays_give_the_same_partials_and_keep_a_kept_view(small_store):
    """``keeps_blocks=False``: the blocks come in reused arrays (fewer than the blocks), the same partials in the same
    order; a pass whose parts hold views of their blocks (breaking the promise) still gets each its own block."""
    from streamdp.stream import engine as E

    V = np.random.default_rng(0).normal(size=(small_store.n_items, 3))
    ref = _in_memory_gram(small_store, V)
    made = []
    orig = E._ReadBuffers.read

    def counted(self, read, b, split):
        made.append(len(self.free) == 0)
        return orig(self, read, b, split)

    E._ReadBuffers.read = counted
    try:
        with Engine(small_store, workers=1, memory_limit="4GB") as eng:
            eng.blocks_in_flight = lambda *a, **k: 1  # one block at a time: each read after the last one's release
            got = eng.map_reduce(_gram_fn(V, small_store.n_items), _add, np.zeros_like(ref), keeps_blocks=False)
            kept = eng.map_reduce(lambda blk, b: [(blk.items[:5], blk.ratings)], lambda a, x: a + x, [],
                                  keeps_blocks=False)
    finally:
        E._ReadBuffers.read = orig
    assert np.array_equal(got, ref)
    assert made[:small_store.n_blocks] == [True] + [False] * (small_store.n_blocks - 1)  # one pair, reused
    for b, (items, ratings) in enumerate(kept):  # a view of a block's arrays, or the block's own array, kept
        blk = small_store.read_block(b)
        assert np.array_equal(items, blk.items[:5]) and np.array_equal(ratings, blk.ratings)
