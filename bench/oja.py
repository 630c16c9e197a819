"""Throughput of one streamed ``--method oja`` pass vs scipy.sparse in memory, side by side.

    python bench/oja.py [--ratings 100000000] [--ranks 16,64] [--repeats 3] [--store PATH]

Generates (or reuses with ``--store``) a power-law store with about ``--ratings``
training ratings (``--items`` items, 50 ratings per user on average), then, in the
same run, for each k in ``--ranks``:

* **streamed pass**: one pass of noisy subspace iteration exactly as the method runs
  it (read + decompress each block, residuals, row clipping, ``A_b^T (A_b V)``,
  in-order reduction) through :class:`streamdp.stream.engine.Engine` with 1 and 2
  workers;
* **in memory, our kernel**: :func:`streamdp.kernels.linalg.gram_apply` on the
  whole matrix held in memory (one thread);
* **in memory, scipy**: ``A.T @ (A @ V)`` with ``scipy.sparse`` CSR (one thread).

It prints ratings/s (median of ``--repeats``) and the ratios the issue asks for
(kernel vs scipy as the median of back-to-back pairs, which this noisy shared
machine needs):
our in-memory kernel vs scipy per core (target >= 1) and the streamed pass on 2
workers vs in-memory scipy (target >= 0.5). The issue names a >= 100M-rating store;
on a shared 2-core machine pass a smaller ``--ratings`` that finishes in minutes and
state the size with the numbers.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time

import numpy as np


def median_time(fn, repeats):
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ratings", type=float, default=100e6, help="training ratings of the generated store")
    ap.add_argument("--items", type=int, default=20_000)
    ap.add_argument("--ranks", default="16,64")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--store", default=None, help="reuse this store instead of generating one")
    ap.add_argument("--memory-limit", default="4GB")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    import scipy.sparse as sp
    from threadpoolctl import threadpool_limits

    from streamdp.kernels.linalg import gram_apply
    from streamdp.methods._subspace import power_pass, residual_values
    from streamdp.storage.generate import generate_store
    from streamdp.storage.store import open_store
    from streamdp.stream.engine import Engine

    tmp = None
    if args.store:
        st = open_store(args.store)
    else:
        tmp = tempfile.mkdtemp(prefix="bench-oja-")  # removed at the end
        n_users = int(args.ratings / 50)
        t = time.perf_counter()
        st = generate_store(f"{tmp}/s.zarr", n_users=n_users, n_items=args.items, ratings_per_user=50, rank=8,
                            seed=0, show_progress=False)
        print(f"generated {st.n_ratings:,} ratings in {time.perf_counter() - t:.0f}s", flush=True)
    nnz = st.n_ratings
    lo, hi = st.rating_min, st.rating_max
    mu, bias, L = (lo + hi) / 2, np.zeros(st.n_items), (hi - lo) / 2 * 5 ** 0.5
    values_of = residual_values(mu, bias, L, lo, hi)

    # the same clipped matrix in memory
    t = time.perf_counter()
    ips, its, vals, off = [np.zeros(1, np.int64)], [], [], 0
    for blk in st.blocks():
        ips.append(blk.indptr[1:] + off)
        off += blk.nnz
        its.append(blk.items)
        vals.append(values_of(blk))
    indptr, items, values = np.concatenate(ips), np.concatenate(its), np.concatenate(vals)
    del ips, its, vals
    A = sp.csr_matrix((values, items, indptr), shape=(st.n_users, st.n_items))
    print(f"loaded {nnz:,} ratings into memory in {time.perf_counter() - t:.0f}s", flush=True)

    rows = []
    for k in [int(x) for x in args.ranks.split(",")]:
        V = np.linalg.qr(np.random.default_rng(0).normal(size=(st.n_items, k)))[0]
        res = {"k": k, "ratings": nnz}
        with threadpool_limits(1):

            def ours():
                out = np.zeros((st.n_items, k))
                gram_apply(indptr, items, values, V, out)

            ours()  # compile
            # paired: scipy and our kernel back to back in each repeat, so that drift
            # in this shared machine's speed hits both; the ratio is the median of pairs
            ts, tk = [], []
            for _ in range(args.repeats):
                ts.append(median_time(lambda: A.T @ (A @ V), 1))
                tk.append(median_time(ours, 1))
            res["scipy"] = nnz / statistics.median(ts)
            res["kernel"] = nnz / statistics.median(tk)
            res["kernel_vs_scipy"] = statistics.median(a / b for a, b in zip(ts, tk))
        for w in [int(x) for x in args.workers.split(",")]:
            with Engine(st, workers=w, memory_limit=args.memory_limit) as eng:
                power_pass(eng, V, values_of, None, 0.0)  # warm up: compile, page cache
                res[f"stream_{w}"] = nnz / median_time(lambda: power_pass(eng, V, values_of, None, 0.0),
                                                       args.repeats)
        if "stream_2" in res:
            res["stream2_vs_scipy"] = res["stream_2"] / res["scipy"]
        if "stream_1" in res and "stream_2" in res:
            res["stream2_vs_stream1"] = res["stream_2"] / res["stream_1"]
        rows.append(res)
        print(f"k={k:3d}  scipy {res['scipy'] / 1e6:7.1f} M/s  kernel {res['kernel'] / 1e6:7.1f} M/s  " +
              "  ".join(f"stream {w}w {res[f'stream_{w}'] / 1e6:7.1f} M/s" for w in args.workers.split(",")) +
              f"  | kernel/scipy {res['kernel_vs_scipy']:.2f} (>=1)"
              + (f"  stream2/scipy {res['stream2_vs_scipy']:.2f} (>=0.5)" if "stream2_vs_scipy" in res else ""),
              flush=True)
    if args.json:
        print(json.dumps(rows))
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
