"""Batch recommendations: users per second of ``recommend --store`` against a dense in-memory NumPy top-N.

    python bench/recommend.py [--users 200000] [--items 2000] [--ratings-per-user 5] [--top 10] [--repeats 3]

Generates a store in a temporary directory (``streamdp generate``, rank 8), trains
one private ``als`` model on it (epsilon 1, rank 8) and times, on the same model:

* **streamdp**: :meth:`streamdp.serving.model.Model.recommend_all` writing the Parquet file
  (reading the blocks, each user's local solve, the Numba top-N, the Arrow table and
  the write), 1 and 2 workers;
* **dense NumPy**: every user's training ratings and factor in memory (the same local
  solve, once, *not timed*), then per chunk of 4,096 users ``S = mu + b + U Q^T``
  (BLAS, one thread), the seen items set to ``-inf``, ``np.argpartition`` and a sort of
  the top N: the usual in-memory way, the peer.

Prints users per second (median of ``--repeats`` round-robin repeats) and the ratios
(per-repeat, median). The peer is given its solve for free and never reads the store,
so a ratio near 1 means the streamed path costs about what the scoring itself costs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402


def dense_topn(U, Q, bias, mu, indptr, items, n, chunk=4096):
    """Top-n unseen items of every user by ``mu + b + U Q^T`` in memory (items ``(n_users, n)``)."""
    out = np.empty((U.shape[0], n), np.int64)
    for s in range(0, U.shape[0], chunk):
        e = min(s + chunk, U.shape[0])
        S = mu + bias + U[s:e] @ Q.T
        rows = np.repeat(np.arange(e - s), np.diff(indptr[s:e + 1]))
        S[rows, items[indptr[s]:indptr[e]]] = -np.inf
        top = np.argpartition(-S, n, axis=1)[:, :n]
        order = np.argsort(-np.take_along_axis(S, top, 1), axis=1, kind="stable")
        out[s:e] = np.take_along_axis(top, order, 1)
    return out


def main(argv=None) -> int:
    from threadpoolctl import threadpool_limits

    from streamdp.serving.local import local_design, solve_block
    from streamdp.serving.model import load_model
    from streamdp.storage.generate import generate_store
    from streamdp.workflows.api import train

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=200_000)
    ap.add_argument("--items", type=int, default=2_000)
    ap.add_argument("--ratings-per-user", type=float, default=5.0)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="bench-recommend-")
    try:
        st = generate_store(f"{tmp}/s.zarr", n_users=a.users, n_items=a.items, ratings_per_user=a.ratings_per_user,
                            rank=8, seed=0, show_progress=False)
        train(st, method="als", epsilon=1.0, rank=8, out=f"{tmp}/m", seed=0, evaluate=False)
        m = load_model(f"{tmp}/m")
        # the peer's input, in memory and solved once (untimed)
        blocks = list(st.blocks())
        indptr = np.concatenate([[0], np.cumsum(np.concatenate([np.diff(b.indptr) for b in blocks]))])
        items = np.concatenate([b.items for b in blocks]).astype(np.int64)
        mo = m.in_order_of(st.item_ids())
        U = np.vstack([solve_block(mo, b.indptr, b.items, b.ratings, mo.info["ridge"]) for b in blocks])
        Q, bias = local_design(mo)
        m.recommend_all(st, a.top, f"{tmp}/warm.parquet", workers=1)  # compile, page cache
        t: dict = {}
        for r in range(a.repeats):
            for name, fn in (("dense", lambda: dense_topn(U, Q, bias, mo.global_mean, indptr, items, a.top)),
                             ("batch1", lambda: m.recommend_all(st, a.top, f"{tmp}/r.parquet", workers=1,
                                                                force=True)),
                             ("batch2", lambda: m.recommend_all(st, a.top, f"{tmp}/r.parquet", workers=2,
                                                                force=True))):
                with threadpool_limits(1):
                    t0 = time.perf_counter()
                    fn()
                    t.setdefault(name, []).append(time.perf_counter() - t0)
        rate = {k: st.n_users / statistics.median(v) for k, v in t.items()}

        def ratio(x, y):
            return statistics.median(ty / tx for tx, ty in zip(t[x], t[y]))

        print(f"{st.n_users:,} users x {st.n_items:,} items, {st.n_ratings:,} training ratings, top {a.top}, "
              f"rank {m.rank} (+ intercept); medians of {a.repeats} repeats")
        print("| what | users/s | vs dense NumPy, 1 thread |\n|---|---|---|")
        print(f"| dense NumPy top-N in memory (solve not timed), 1 BLAS thread | {rate['dense']:,.0f} | 1.00 |")
        print(f"| streamdp recommend --store, 1 worker (read, solve, top-N, Parquet) | {rate['batch1']:,.0f} | "
              f"{ratio('batch1', 'dense'):.2f} |")
        print(f"| streamdp recommend --store, 2 workers | {rate['batch2']:,.0f} | {ratio('batch2', 'dense'):.2f} |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
