"""Throughput of one streamed DP-ALS iteration beside one streamed ``--method oja`` pass, same store, same run.

    python bench/als.py [--ratings 100000000] [--ranks 8,16] [--workers 1,2] [--repeats 3] [--store PATH]

Generates (or reuses with ``--store``) a power-law store with about ``--ratings``
training ratings (``--items`` items, 50 ratings per user on average), then for each
k in ``--ranks`` and each worker count, round-robin over ``--repeats``:

* **als iteration**: what one ``--method als`` iteration streams (read and decode
  each block, every user's ridge solve against ``[V, 1]``, contribution weights,
  clipping, the item right-hand sides and the shared Gramian, in-order reduction),
  :meth:`streamdp.methods.als._AlsBase._iteration_sums` on the engine;
* **oja pass**: one pass of noisy subspace iteration (``bench/oja.py``'s streamed
  pass: residuals, row clipping, ``A_b^T (A_b V)``, reduction);
* **als in memory**: the same two kernels on the whole matrix in memory, one thread
  (what the streaming costs on top).

It prints ratings/s (medians) and the ratios als / oja (per pass: an ALS iteration
solves a ``(k+1) x (k+1)`` system per user and accumulates ``k`` numbers per rating,
an oja pass does ``2k`` multiply-adds per rating) and 2 workers / 1 worker.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time

import numpy as np


def _als_setup(st, k):
    """The als method at rank ``k`` planned on ``st``, its settings and a random item side."""
    import numpy as np

    from streamdp.methods import get_method

    m = get_method("als")(epsilon=1.0, delta=1e-7, rank=k, seed=0, iters=1)
    return m, m.plan(st).settings, np.random.default_rng(0).standard_normal((st.n_items, k))


def passes(st, k, memory_limit="4GB"):
    """``(als_pass, oja_pass)``: callables ``f(workers)`` that stream one als iteration / one oja pass over ``st``.

    The als iteration is :meth:`streamdp.methods.als._AlsBase._iteration_sums` (every user's
    solve, weights, clipping, item right-hand sides and the shared Gramian); the oja pass is
    ``bench/oja.py``'s streamed pass (residuals, row clipping, ``A_b^T (A_b V)``).
    """
    import numpy as np

    from streamdp.methods._subspace import power_pass, residual_values
    from streamdp.stream.driver import Run
    from streamdp.stream.engine import Engine

    m, s, V = _als_setup(st, k)
    n, lo, hi = st.n_items, st.rating_min, st.rating_max
    mid, bias = (lo + hi) / 2, np.zeros(n)
    C = np.asarray(st.item_counts(), np.float64)  # stand-in counts: the cost does not depend on them

    def als_pass(workers):
        with Engine(st, workers=workers, memory_limit=memory_limit, state_bytes=m.state_bytes(st)) as eng, \
                Run(st, method="bench", fingerprint="bench", seed=0, rng_key=1) as run:
            m._iteration_sums(st, eng, run, s, mid, bias, V, C, k)

    Vq = np.linalg.qr(V)[0]
    values_of = residual_values(mid, bias, (hi - lo) / 2 * 5 ** 0.5, lo, hi)

    def oja_pass(workers):
        with Engine(st, workers=workers, memory_limit=memory_limit, state_bytes=8 * n * k * 4) as eng:
            power_pass(eng, Vq, values_of, None, None)

    return als_pass, oja_pass


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ratings", type=float, default=100e6, help="training ratings of the generated store")
    ap.add_argument("--items", type=int, default=20_000)
    ap.add_argument("--ranks", default="8,16")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--store", default=None, help="reuse this store instead of generating one")
    ap.add_argument("--memory-limit", default="4GB")
    args = ap.parse_args(argv)

    from streamdp.kernels.als import als_accumulate
    from streamdp.kernels.linalg import residuals, solve_users_huber
    from streamdp.privacy.bounding import contribution_weights
    from streamdp.storage.generate import generate_store
    from streamdp.storage.store import open_store

    tmp = None
    if args.store:
        st = open_store(args.store)
    else:
        tmp = tempfile.mkdtemp(prefix="bench-als-")  # removed at the end
        t = time.perf_counter()
        st = generate_store(f"{tmp}/s.zarr", n_users=int(args.ratings / 50), n_items=args.items,
                            ratings_per_user=50, rank=8, seed=0, show_progress=False)
        print(f"generated {st.n_ratings:,} ratings in {time.perf_counter() - t:.0f}s", flush=True)
    try:
        nnz, n = st.n_ratings, st.n_items
        mid = (st.rating_min + st.rating_max) / 2
        rows = []
        for k in [int(x) for x in args.ranks.split(",")]:
            m, s, V = _als_setup(st, k)
            bias = np.zeros(n)
            als_pass, oja_pass = passes(st, k, args.memory_limit)
            times: dict = {}

            for rep in range(args.repeats):
                for w in [int(x) for x in args.workers.split(",")]:
                    for name, fn in (("als", als_pass), ("oja", oja_pass)):
                        t = time.perf_counter()
                        fn(w)
                        times.setdefault((name, w), []).append(time.perf_counter() - t)
                        print(f"  k={k} {name} workers={w} rep {rep}: {nnz / times[(name, w)][-1] / 1e6:.1f}M/s",
                              flush=True)

            # in memory, one thread: the same kernels on the whole matrix (only when it fits comfortably)
            mem = None
            if nnz <= 120e6:
                blocks = [st.read_block(b) for b in range(st.n_blocks)]
                ip = np.concatenate([[0]] + [bl.indptr[1:] + off for bl, off in
                                             zip(blocks, np.cumsum([0] + [bl.nnz for bl in blocks[:-1]]))])
                it = np.concatenate([bl.items for bl in blocks]).astype(np.int32)
                r = np.concatenate([bl.ratings for bl in blocks])
                del blocks
                Q = np.ascontiguousarray(np.hstack([V, np.ones((n, 1))]))
                ts = []
                for _ in range(args.repeats):
                    t = time.perf_counter()
                    res = np.empty(len(it))
                    residuals(it, r, float(mid), bias, res)
                    U = np.zeros((len(ip) - 1, k + 1))
                    solve_users_huber(ip, it, res, Q, float(s["ridge"]), 0, np.inf, U)
                    w_ = contribution_weights(ip, it, rule="adaptive", tau=s["tau"])
                    B, G = np.zeros((n, k)), np.zeros((k, k))
                    als_accumulate(ip, it, res, w_, U, s["clip"], s["residual_clip"], 1.0, B, np.zeros((0, 1)), G)
                    ts.append(time.perf_counter() - t)
                mem = statistics.median(ts)
                del ip, it, r, res, U, w_
            med = {key: statistics.median(v) for key, v in times.items()}
            ws = sorted({w for _, w in med})
            for w in ws:
                rows.append((k, w, nnz / med[("als", w)], nnz / med[("oja", w)], med[("oja", w)] / med[("als", w)],
                             med[("als", ws[0])] / med[("als", w)], nnz / mem if mem else float("nan")))
        print(f"\nstore: {st.n_users:,} users, {n:,} items, {nnz:,} ratings; medians of {args.repeats} round-robin "
              f"repeats\n")
        print("| k | workers | als iteration | oja pass | als / oja | als speed-up vs 1 worker | als in memory, "
              "1 thread |")
        print("|---|---|---|---|---|---|---|")
        for k, w, a, o, ratio, sp, mm in rows:
            print(f"| {k} | {w} | {a / 1e6:.1f}M/s | {o / 1e6:.1f}M/s | {ratio:.2f} | {sp:.2f} | {mm / 1e6:.1f}M/s |")
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
