"""Throughput of ``--method sgd`` / ``--method sgld``: ratings/s per epoch, side by side with an in-memory peer.

    python bench/sgd.py [--ratings 20000000] [--ranks 16,64,256] [--repeats 3] [--store PATH]
                        [--methods sgd,sgld] [--workers 1,2] [--tiering off|on|both] [--epochs 2] [--profile]

Generates (into a temporary directory, removed at the end; or reuses ``--store``) a
power-law store with ``--ratings`` training ratings, then times every epoch of a
``--epochs``-epoch run (the method's own per-epoch wall time: reading blocks,
trimming, tier partition, the kernel, noise draws, U read/written on disk; epoch 1
initializes U instead of reading it, later epochs are the steady state) for

* k in ``--ranks``; sgd and sgld (exact noise: numpy Generator normals, epsilon 10);
* tiered (hot items first) and untiered; 1 and 2 workers (Hogwild);
* **the in-memory peer**: :func:`sgd_in_memory`, a plain single-thread Numba SGD
  kernel over the whole matrix held in memory (the update rule of
  :func:`streamdp.kernels.sgd.sgd_block`, one tight loop over users, no blocks, no
  user state on disk, the serial dot product one writes first), run in the same
  round robin; the ratio streamed / in-memory is what the streaming costs or gains
  (issue 13's target: >= 0.8 at every k, one worker),

plus kernel-only tiered vs untiered timings on one in-memory block of the store
and on a synthetic Zipf block with ``--large-items`` items (V larger than the
caches, where keeping the hot tier resident can matter), and, in the same run,
scikit-surprise's ``SVD`` for one epoch on a subset of ``--surprise-ratings``
ratings (it holds everything in Python objects; 0 skips it). Prints the median of
``--repeats`` round-robin runs per configuration and the ratios the issues ask for
(medians of per-repeat ratios; the default configuration, untiered): sgd streamed
vs in-memory, sgd vs surprise per core at k=16 (target >= 5x), sgld vs sgd
(target >= 0.5), 2 workers vs 1 (target >= 1.6x). ``--profile`` adds where one
steady-state epoch (one worker) spends its time: block read/decode (on the
reader thread), trimming, the noise draws, U read/written, the kernel, the rest
(per-block Python). The machine's load changes ratios: state it with the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def sgd_in_memory(indptr, items, ratings, U, bu, V, bv, mu, lr, reg, reg_b):
    """One plain SGD epoch over a whole in-memory CSR matrix, users in order (the peer).

    The update of :func:`streamdp.kernels.sgd.sgd_block` with unit weights and no
    tiering, written the obvious way; tested against ``sgd_block_reference``.
    Returns the sum of squared errors before each update.
    """
    n_users = len(indptr) - 1
    k = U.shape[1]
    lr32 = np.float32(lr)
    reg32 = np.float32(reg)
    regb32 = np.float32(reg_b)
    mu32 = np.float32(mu)
    sse = 0.0
    for i in range(n_users):
        for p in range(indptr[i], indptr[i + 1]):
            j = items[p]
            dot = np.float32(0.0)
            for d in range(k):
                dot += U[i, d] * V[j, d]
            err = ratings[p] - (mu32 + bu[i] + bv[j] + dot)
            sse += err * err
            bu[i] += lr32 * (err - regb32 * bu[i])
            bv[j] += lr32 * (err - regb32 * bv[j])
            for d in range(k):
                ud = U[i, d]
                vd = V[j, d]
                U[i, d] = ud + lr32 * (err * vd - reg32 * ud)
                V[j, d] = vd + lr32 * (err * ud - reg32 * vd)
    return sse


def in_memory_matrix(store):
    """The whole training split as one CSR matrix ``(indptr, items, ratings)`` in memory."""
    blocks = list(store.blocks())
    nnz = np.cumsum([0] + [b.nnz for b in blocks])
    indptr = np.concatenate([np.zeros(1, np.int64)] + [b.indptr[1:] + o for b, o in zip(blocks, nnz[:-1])])
    return (indptr.astype(np.int64), np.concatenate([b.items for b in blocks]).astype(np.int32),
            np.concatenate([b.ratings for b in blocks]).astype(np.float32))


def peer_rate(mat, n_items, k, seed):
    """``(wall, cpu)`` ratings/s of one :func:`sgd_in_memory` epoch (state drawn outside the timing)."""
    indptr, items, ratings = mat
    g = np.random.default_rng(seed)
    U = (g.standard_normal((len(indptr) - 1, k)) * 0.1).astype(np.float32)
    V = (g.standard_normal((n_items, k)) * 0.1).astype(np.float32)
    bu, bv = np.zeros(len(U), np.float32), np.zeros(n_items, np.float32)
    mu = float(ratings.mean(dtype=np.float64))
    t, c = time.perf_counter(), time.process_time()
    sgd_in_memory(indptr, items, ratings, U, bu, V, bv, mu, 0.005, 0.02, 0.02)
    t, c = time.perf_counter() - t, time.process_time() - c
    return len(ratings) / t, len(ratings) / max(c, 1e-9)


def _method(method, k, tiering, seed, epochs):
    from streamdp.methods import get_method

    eps = 10.0 if method == "sgld" else float("inf")
    opts = dict(epochs=epochs, tiering="on" if tiering else "off")
    if method == "sgld":
        opts["tau"] = 10**6  # no trimming effect: time the sampler itself on all ratings
    return get_method(method)(epsilon=eps, delta=1e-9, rank=k, seed=seed, **opts)


def _fit(store, m, workers):
    from streamdp.stream.engine import Engine

    with Engine(store, workers=workers, memory_limit="2GB") as eng:
        return m.fit(store, eng)


class _EpochClock:
    """Process CPU seconds of each epoch of the runs inside ``with`` (wraps ``Run.epochs``; includes the
    epoch's checkpoint write, which the method's ``epoch_seconds`` leave out)."""

    def __enter__(self):
        import streamdp.stream.driver as D

        self.cpu, self._real, clock = [], D.Run.epochs, self

        def epochs(run, last, **kw):
            for e in clock._real(run, last, **kw):
                t = time.process_time()
                yield e
                clock.cpu.append(time.process_time() - t)
        D.Run.epochs = epochs
        return self

    def __exit__(self, *exc):
        import streamdp.stream.driver as D

        D.Run.epochs = self._real


def epoch_rates(store, method, k, tiering, workers, seed, epochs=2):
    """``(wall, cpu)``: ratings per second of wall time and per CPU second (all threads) of each epoch of one run."""
    with _EpochClock() as clock:
        f = _fit(store, _method(method, k, tiering, seed, epochs), workers)
    n = f.owner["n_train_used"]
    return [n / t for t in f.owner["epoch_seconds"]], [n / t for t in clock.cpu]


class _TimedDraws:
    """A generator whose ``standard_normal`` calls are timed into ``spent[name]`` (the noise draws)."""

    def __init__(self, gen, spent, name):
        self._gen, self._spent, self._name = gen, spent, name

    def standard_normal(self, *a, **kw):
        t = time.thread_time()
        r = self._gen.standard_normal(*a, **kw)
        self._spent[self._name] = self._spent.get(self._name, 0.0) + time.thread_time() - t
        return r

    def __getattr__(self, name):
        return getattr(self._gen, name)


def profile_epoch(store, method, k, seed=0):
    """Where epoch 2 of a one-worker untiered run spends its time: ``(wall s, CPU s, ratings, {stage: CPU s})``.

    Wraps what the epoch calls with thread-CPU timers: the block read (on the reader
    thread, overlapping the rest), trimming, the noise (counting and drawing), U
    read/written on disk, the kernel; ``other`` is the epoch's process CPU time
    (all threads) minus those stages.
    """
    import threading

    import streamdp.methods.sgld as M
    import streamdp.stream.driver as D
    from streamdp.stream.state import UserState

    spent: dict = {}
    lock = threading.Lock()
    state = {"epoch": 0}

    def timed(name, f):
        def g(*a, **kw):
            t = time.thread_time()
            r = f(*a, **kw)
            if state["epoch"] == 2:
                with lock:
                    spent[name] = spent.get(name, 0.0) + time.thread_time() - t
            return r
        return g

    def epochs(self, last, **kw):
        for e in real["epochs"](self, last, **kw):
            state["epoch"] = e
            t = time.process_time()
            yield e
            state[f"cpu{e}"] = time.process_time() - t
        state["epoch"] = 0

    def group_rng(self, purpose, epoch, group):
        g = real["group_rng"](self, purpose, epoch, group)
        return _TimedDraws(g, spent, "noise draws") if purpose == M._NOISE and state["epoch"] == 2 else g

    kernel = "sgld_block" if method == "sgld" else "sgd_block"
    patches = [(M.K, kernel, "kernel"), (M.K, "group_draws", "noise count"), (M, "_trim_groups", "trim"),
               (UserState, "read", "U read"), (UserState, "write", "U write"),
               (type(store), "read_block", "block read+decode (reader thread)")]
    real = {"epochs": D.Run.epochs, "group_rng": D.Run.group_rng}
    originals = [(o, n, getattr(o, n)) for o, n, _ in patches]
    try:
        for o, n, label in patches:
            setattr(o, n, timed(label, getattr(o, n)))
        D.Run.epochs, D.Run.group_rng = epochs, group_rng
        f = _fit(store, _method(method, k, False, seed, 2), 1)
    finally:
        for o, n, f0 in originals:
            setattr(o, n, f0)
        D.Run.epochs, D.Run.group_rng = real["epochs"], real["group_rng"]
    wall = f.owner["epoch_seconds"][1]
    spent["other CPU (per-block Python, conversions, checkpoint)"] = max(state["cpu2"] - sum(spent.values()), 0.0)
    return wall, state["cpu2"], f.owner["n_train_used"], spent


def kernel_tiering(store, k, repeats):
    """Kernel-only ratings/s of sgd_block on one in-memory block, tiered vs untiered (no I/O)."""
    from streamdp.kernels import sgd as K

    blk = store.read_block(0)
    ip = blk.indptr
    n_u, n_i = blk.n_users, store.n_items
    out = {}
    for tiered in (True, False):
        it, rt = blk.items.copy(), blk.ratings.copy()
        split = ip[1:].copy()
        if tiered:
            K.partition_tiers(ip, it, rt, K.hot_tier_items(k, n_i), split)
        g = np.random.default_rng(0)
        rates = []
        for _ in range(repeats):
            U = (g.standard_normal((n_u, k)) * 0.1).astype(np.float32)
            V = (g.standard_normal((n_i, k)) * 0.1).astype(np.float32)
            bu, bv = np.zeros(n_u, np.float32), np.zeros(n_i, np.float32)
            t = time.perf_counter()
            K.sgd_block(ip, it, rt, np.ones(n_u, np.float32), split, U, bu, V, bv, 3.6, 0.005, 0.02, 0.02, 256)
            rates.append(blk.nnz / (time.perf_counter() - t))
        out["tiered" if tiered else "untiered"] = statistics.median(rates)
    return out


def kernel_tiering_large(n_items, k, repeats, n_users=20000, per_user=50):
    """Kernel-only tiered vs untiered on a synthetic Zipf(0.9) block whose V exceeds the caches."""
    from streamdp.kernels import sgd as K

    rng = np.random.default_rng(0)
    cdf = np.cumsum(np.arange(1, n_items + 1) ** -0.9)
    items = np.minimum(np.searchsorted(cdf / cdf[-1], rng.random(n_users * per_user)), n_items - 1).astype(np.int32)
    ip = np.arange(0, n_users * per_user + 1, per_user, dtype=np.int64)
    items = np.sort(items.reshape(n_users, per_user), axis=1).ravel()  # stores keep items sorted per user
    rt = rng.integers(1, 6, len(items)).astype(np.float32)
    V0 = (rng.standard_normal((n_items, k)) * 0.1).astype(np.float32)
    U0 = (rng.standard_normal((n_users, k)) * 0.1).astype(np.float32)
    hot = K.hot_tier_items(k, n_items)
    out = {True: [], False: []}
    for _ in range(repeats):
        for tiered in (True, False):  # interleaved, so load changes hit both alike
            split = ip[1:].copy()
            if tiered:
                K.partition_tiers(ip, items, rt, hot, split)
            U, V = U0.copy(), V0.copy()
            t = time.perf_counter()
            K.sgd_block(ip, items, rt, np.ones(n_users, np.float32), split, U, np.zeros(n_users, np.float32), V,
                        np.zeros(n_items, np.float32), 3.0, 0.005, 0.02, 0.02, 256)
            out[tiered].append(len(items) / (time.perf_counter() - t))
    return {"tiered": statistics.median(out[True]), "untiered": statistics.median(out[False]), "hot_items": hot,
            "hot_share": float(np.mean(items < hot)), "V_bytes": n_items * k * 4}


def surprise_rate(store, n, k, repeats):
    import pandas as pd
    from surprise import SVD, Dataset, Reader

    rows, got = [], 0
    for blk in store.blocks():
        u = np.repeat(np.arange(blk.n_users) + blk.first_user, np.diff(blk.indptr))
        rows.append(pd.DataFrame({"u": u, "i": blk.items, "r": blk.ratings}))
        got += blk.nnz
        if got >= n:
            break
    df = pd.concat(rows).iloc[:n]
    ts = Dataset.load_from_df(df, Reader(rating_scale=(store.rating_min, store.rating_max))).build_full_trainset()
    rates = []
    for r in range(repeats):
        algo = SVD(n_factors=k, n_epochs=1, random_state=r)
        t = time.perf_counter()
        algo.fit(ts)
        rates.append(len(df) / (time.perf_counter() - t))
    return statistics.median(rates)


def _steady(rates):
    """A run's steady-state rate: the median of its epochs after the first (the first if there is one)."""
    return statistics.median(rates[1:]) if len(rates) > 1 else rates[0]


def tiering_table(store, ranks, methods, workers, runs, res, cpus=None):
    """The ``--tiering auto`` table: steady-state epochs off/on per (k, method, workers), auto's choice and its cost.

    Rates in M ratings per second of wall time and, in brackets, per CPU second of all
    threads (the steadier figure when the machine is shared). ``auto / best`` is the
    median over repeats of auto's rate over the better of off/on in that repeat (1.00
    when auto picks the faster one); the acceptance is >= 0.95.
    """
    from streamdp.kernels.sgd import tiering_pays

    cpus = cpus or {}
    print("\n--tiering auto: M ratings/s of wall time [per CPU second], steady-state epochs, medians over repeats; "
          "auto/best: median of the per-repeat ratio of auto's pick to the faster of off/on, wall [CPU]")
    print("| k | method | workers | in-memory SGD | off | on | on/off | auto picks | auto/best |")
    print("|---|---|---|---|---|---|---|---|---|")

    def med(xs):
        return statistics.median(xs) / 1e6 if xs else float("nan")

    def rel(src, pick, a_, b_):
        off, on = src.get(a_), src.get(b_)
        if not off or not on:
            return float("nan"), float("nan")
        auto = on if pick else off
        return (statistics.median(x / max(y, z) for x, y, z in zip(auto, off, on)),
                statistics.median(y / x for x, y in zip(off, on)))

    for k in ranks:
        for m in methods:
            for w in workers:
                pick = tiering_pays(k, store.n_items, noisy=m == "sgld", workers=w)
                a_, b_ = f"{m} k={k} untiered w={w}", f"{m} k={k} tiered w={w}"
                if a_ not in runs or b_ not in runs:
                    continue
                rw, ow = rel(runs, pick, a_, b_)
                rc, oc = rel(cpus, pick, a_, b_)
                p_ = f"peer k={k}"
                res.setdefault("tiering_auto", {})[f"{m} k={k} w={w}"] = {
                    "pick": "on" if pick else "off", "auto_vs_best_wall": rw, "auto_vs_best_cpu": rc,
                    "on_vs_off_wall": ow, "on_vs_off_cpu": oc}
                print(f"| {k} | {m} | {w} | {med(runs.get(p_)):.2f} [{med(cpus.get(p_)):.1f}] | "
                      f"{med(runs[a_]):.2f} [{med(cpus.get(a_)):.1f}] | {med(runs[b_]):.2f} [{med(cpus.get(b_)):.1f}] | "
                      f"{ow:.2f} [{oc:.2f}] | {'on' if pick else 'off'} | {rw:.2f} [{rc:.2f}] |", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ratings", type=int, default=20_000_000)
    ap.add_argument("--items", type=int, default=20_000)
    ap.add_argument("--ranks", default="16,64,256")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--methods", default="sgd,sgld")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--tiering", choices=("off", "on", "both"), default="both")
    ap.add_argument("--epochs", type=int, default=2, help="epochs per timed run (epoch 1 initializes U)")
    ap.add_argument("--surprise-ratings", type=int, default=500_000, help="0 skips scikit-surprise")
    ap.add_argument("--store", default=None, help="existing store to reuse (default: generate in a temp dir)")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    ap.add_argument("--large-items", type=int, default=1_000_000,
                    help="items of the synthetic kernel-only tiering check (V beyond the caches); 0 skips it")
    ap.add_argument("--profile", action="store_true", help="also break one steady-state epoch down by stage")
    ap.add_argument("--tiering-from", nargs="+", metavar="JSON", default=None,
                    help="print the --tiering auto table from the --json files of earlier runs on --store, their "
                         "repeats pooled (round-robin repeats stay paired), and time nothing")
    a = ap.parse_args(argv)
    from streamdp.storage.generate import generate_store
    from streamdp.storage.store import open_store

    tmp = None
    try:
        if a.store and os.path.exists(a.store):
            store = open_store(a.store)
        else:
            if not a.store:
                tmp = tempfile.mkdtemp(prefix="bench-sgd-")  # removed at the end, also on failure
            path = a.store or os.path.join(tmp, "s.zarr")
            store = generate_store(path, n_users=a.ratings // 100, n_items=a.items, ratings_per_user=100, rank=16,
                                   seed=0)
        if a.tiering_from:
            pooled_tiering_table(a, store)
        else:
            _run(a, store)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def pooled_tiering_table(a, store):
    """The ``--tiering auto`` table of several saved runs: each configuration's repeats pooled, in run order.

    The machine is shared and a single run's three repeats swing by 10-20%; pooling the
    repeats of runs made the same way gives steadier medians. The auto pick is the
    current rule's (the timed configurations force tiering off or on, so they do not depend on it).
    """
    import json

    runs, cpus = {}, {}
    for path in a.tiering_from:
        with open(path) as f:
            saved = json.load(f)
        for key, xs in saved["runs"].items():
            runs.setdefault(key, []).extend(xs)
        for key, xs in saved.get("cpu", {}).items():
            cpus.setdefault(key, []).extend(xs)
    print(f"pooled from {len(a.tiering_from)} runs: {', '.join(a.tiering_from)}")
    tiering_table(store, [int(k) for k in a.ranks.split(",")], a.methods.split(","),
                  [int(w) for w in a.workers.split(",")], runs, {}, cpus)


def _run(a, store):
    print(f"store: {store.n_ratings:,} ratings, {store.n_users:,} users, {store.n_items:,} items, "
          f"{store.n_blocks} blocks; {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} at the start")
    methods = a.methods.split(",")
    workers = [int(w) for w in a.workers.split(",")]
    tierings = {"off": (False,), "on": (True,), "both": (True, False)}[a.tiering]
    ranks = [int(x) for x in a.ranks.split(",")]
    res = {"n_ratings": store.n_ratings, "rates": {}, "runs": {}, "epoch1": {}}
    mat = in_memory_matrix(store)
    for method in methods:  # warm-up: load the compiled kernels before timing
        epoch_rates(store, method, 4, tierings[0], 1, 0, epochs=1)
    peer_rate(tuple(x[:3] if i == 0 else x for i, x in enumerate(mat)), store.n_items, 4, 0)
    sur = {}
    for k in ranks:
        if a.surprise_ratings:
            sur[k] = surprise_rate(store, a.surprise_ratings, k, a.repeats)
            print(f"k={k:4d} surprise SVD (1 core, {a.surprise_ratings:,} ratings): {sur[k] / 1e6:8.3f} M ratings/s")
        if True in tierings:
            kt = kernel_tiering(store, k, a.repeats)
            res.setdefault("kernel_tiering", {})[str(k)] = kt
            print(f"k={k:4d} sgd kernel only, one in-memory block: tiered {kt['tiered'] / 1e6:8.3f}, untiered "
                  f"{kt['untiered'] / 1e6:8.3f} M ratings/s (ratio {kt['tiered'] / kt['untiered']:.2f})", flush=True)
        # round robin: every repeat runs each configuration once, so that this shared machine's
        # drifting speed hits all of them alike; the medians and ratios are over repeats
        configs = ["peer"] + [(m, t, w) for m in methods for t in tierings for w in workers]
        runs = {c: [] for c in configs}   # per repeat: wall rate (steady state for the streamed runs)
        cpus = {c: [] for c in configs}   # per repeat: ratings per CPU second, all threads
        first = {c: [] for c in configs}  # per repeat: wall rate of epoch 1
        for r in range(a.repeats):
            for c in configs:
                if c == "peer":
                    wall, cpu = peer_rate(mat, store.n_items, k, r)
                    runs[c].append(wall)
                    first[c].append(wall)
                    cpus[c].append(cpu)
                else:
                    wall, cpu = epoch_rates(store, c[0], k, c[1], c[2], r, a.epochs)
                    runs[c].append(_steady(wall))
                    first[c].append(wall[0])
                    cpus[c].append(_steady(cpu))
        for c in configs:
            name = f"peer k={k}" if c == "peer" else \
                f"{c[0]} k={k} {'tiered' if c[1] else 'untiered'} w={c[2]}"
            res["rates"][name], res["runs"][name], res["epoch1"][name] = statistics.median(runs[c]), runs[c], first[c]
            res.setdefault("cpu", {})[name] = cpus[c]
            what = "in-memory peer (1 thread)   " if c == "peer" else \
                f"{c[0]:5s} {'tiered  ' if c[1] else 'untiered'} workers={c[2]}"
            tail = "" if c == "peer" or a.epochs < 2 else f" (epoch 1: {statistics.median(first[c]) / 1e6:6.2f})"
            print(f"k={k:4d} {what}: {statistics.median(runs[c]) / 1e6:8.3f} M ratings/s{tail}, "
                  f"{statistics.median(cpus[c]) / 1e6:7.2f} M per CPU second; runs "
                  f"{[round(x / 1e6, 2) for x in runs[c]]}", flush=True)
    if sur:
        res["surprise"] = {str(k): v for k, v in sur.items()}
    if a.large_items and True in tierings:
        for k in ranks:
            if a.large_items * k * 4 > 5e8:  # V and its copy must fit comfortably in RAM
                continue
            kt = kernel_tiering_large(a.large_items, k, a.repeats)
            res.setdefault("kernel_tiering_large", {})[str(k)] = kt
            print(f"k={k:4d} sgd kernel only, {a.large_items:,} Zipf items (V {kt['V_bytes'] / 1e6:.0f} MB, hot tier "
                  f"{kt['hot_items']:,} items = {kt['hot_share']:.0%} of ratings): tiered {kt['tiered'] / 1e6:.3f}, "
                  f"untiered {kt['untiered'] / 1e6:.3f} M ratings/s (ratio {kt['tiered'] / kt['untiered']:.2f})",
                  flush=True)
    R, runs, first, cpus = res["rates"], res["runs"], res["epoch1"], res["cpu"]

    def paired(a_, b_, src=runs):  # median over repeats of the per-repeat ratio, with its range
        r = [x / y for x, y in zip(src[a_], src[b_])]
        return statistics.median(r), min(r), max(r)

    steady = "steady-state epochs (epoch 2 on)" if a.epochs > 1 else "epoch 1"
    print(f"\nratios (medians over {a.repeats} round-robin repeats of the per-repeat ratios [min, max]; "
          f"streamed rates are {steady}; 'cpu' compares ratings per CPU second of all threads):")
    for k in ranks:
        out = res.setdefault("ratios", {}).setdefault(str(k), {})
        # the default configuration (untiered; see the tiering note in streamdp/methods/sgld.py)
        t1 = f"sgd k={k} untiered w=1"
        line = []
        for w in workers:
            t = f"sgd k={k} untiered w={w}"
            if t in runs:
                m_, lo, hi = out[f"sgd_{w}w_vs_in_memory"] = paired(t, f"peer k={k}")
                e1 = out[f"sgd_{w}w_vs_in_memory_epoch1"] = paired(t, f"peer k={k}", first)
                c1 = out[f"sgd_{w}w_vs_in_memory_cpu"] = paired(t, f"peer k={k}", cpus)
                line.append(f"sgd {w}w / in-memory {m_:5.2f} [{lo:.2f}, {hi:.2f}] (epoch 1: {e1[0]:.2f}, "
                            f"cpu: {c1[0]:.2f})")
        if t1 in runs and k in sur:
            out["sgd_vs_surprise_per_core"] = R[t1] / sur[k]
            line.append(f"sgd/surprise per core {out['sgd_vs_surprise_per_core']:6.2f}x (target >= 5 at k=16)")
        g1 = f"sgld k={k} untiered w=1"
        if g1 in runs and t1 in runs:
            out["sgld_vs_sgd"] = paired(g1, t1)
            line.append(f"sgld/sgd {out['sgld_vs_sgd'][0]:5.2f} (>= 0.5)")
        for m in methods:
            if f"{m} k={k} untiered w=2" in runs and f"{m} k={k} untiered w=1" in runs:
                out[f"{m}_2w_vs_1w"] = paired(f"{m} k={k} untiered w=2", f"{m} k={k} untiered w=1")
                line.append(f"{m} 2w/1w {out[f'{m}_2w_vs_1w'][0]:5.2f}" + (" (>= 1.6)" if m == "sgd" else ""))
        if f"sgd k={k} tiered w=1" in runs and t1 in runs:
            out["tiered_vs_untiered"] = paired(f"sgd k={k} tiered w=1", t1)
            line.append(f"tiered/untiered sgd {out['tiered_vs_untiered'][0]:5.2f}")
        print(f"k={k:4d}: " + " | ".join(line))
    if len(tierings) == 2:
        tiering_table(store, ranks, methods, workers, runs, res, cpus)
    if a.profile:
        print("\nwhere one steady-state epoch goes (1 worker, untiered; CPU seconds per stage, the block read on "
              "the reader thread alongside the rest; wall > CPU is time the machine gave to others):")
        for k in ranks:
            for m in methods:
                wall, cpu, n, spent = profile_epoch(store, m, k)
                res.setdefault("profile", {})[f"{m} k={k}"] = {"wall": wall, "cpu": cpu, **spent}
                print(f"k={k:4d} {m:5s} epoch wall {wall:.3f} s, CPU {cpu:.3f} s ({n / cpu / 1e6:.1f} M ratings per "
                      f"CPU s): " + ", ".join(f"{name} {v:.3f} ({v / cpu:.0%})"
                                              for name, v in sorted(spent.items(), key=lambda x: -x[1])))
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
