"""Contribution-bounding kernels and noise samplers vs vectorized NumPy, side by side.

    python bench/privacy_bounding.py [--ratings 5000000] [--tau 50] [--repeats 5]

Builds one power-law CSR block in memory (mean 60 ratings per user, Pareto tail),
then in the same run times, median of ``--repeats``:

* ``trim_block`` (Numba kernel) vs a vectorized NumPy reference (random keys,
  ``lexsort`` by user then key, keep ranks < tau);
* ``clip_rows`` (Numba kernel) vs NumPy (``add.reduceat`` of squares, ``repeat``);
* ``huber_noise`` (exact mixture sampler) vs ``Generator.laplace`` (one numpy call).

Prints ratings/s (or samples/s) and the ratio kernel / baseline. Kernels are
compiled (and cached) before timing.
"""

from __future__ import annotations

import argparse
import numpy as np

from oja import median_time  # bench/oja.py, on sys.path when run as a script

from streamdp.privacy import huber_noise, make_rng
from streamdp.privacy.bounding import clip_rows, trim_block


def _block(n_ratings: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    counts = np.minimum((rng.pareto(1.5, n_ratings // 30) + 1) * 20, 5000).astype(np.int64)
    counts = counts[np.cumsum(counts) <= n_ratings]
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    items = rng.integers(0, 50_000, indptr[-1]).astype(np.int32)
    ratings = rng.integers(1, 6, indptr[-1]).astype(np.float32)
    return indptr, items, ratings


def trim_numpy(indptr, items, ratings, tau, seed):
    rng = make_rng(seed)
    keys = rng.random(items.size)
    user = np.repeat(np.arange(indptr.size - 1), np.diff(indptr))
    order = np.lexsort((keys, user))
    rank = np.arange(items.size) - indptr[user[order]]
    keep = np.zeros(items.size, bool)
    keep[order[rank < tau]] = True
    new = np.minimum(np.diff(indptr), tau)
    return np.concatenate([[0], np.cumsum(new)]), items[keep], ratings[keep]


def clip_numpy(indptr, values, L):
    counts = np.diff(indptr)
    sq = np.add.reduceat(values.astype(np.float64) ** 2, indptr[:-1]) * (counts > 0)
    norms = np.sqrt(sq)
    f = np.where(norms > L, L / np.maximum(norms, 1e-300), 1.0)
    return values * np.repeat(f, counts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ratings", type=int, default=5_000_000)
    ap.add_argument("--tau", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    indptr, items, ratings = _block(a.ratings)
    n = items.size
    vals = ratings.astype(np.float64) - 3.0
    # compile + correctness check before timing
    k = trim_block(indptr[:101] , items[:indptr[100]], ratings[:indptr[100]], a.tau, seed=1)
    r = trim_numpy(indptr[:101], items[:indptr[100]], ratings[:indptr[100]], a.tau, 1)
    assert np.array_equal(k[0], r[0])
    np.testing.assert_allclose(clip_rows(indptr, vals, 2.0), clip_numpy(indptr, vals, 2.0), rtol=1e-9)

    rows = []
    t_k = median_time(lambda: trim_block(indptr, items, ratings, a.tau, seed=1), a.repeats)
    t_b = median_time(lambda: trim_numpy(indptr, items, ratings, a.tau, 1), a.repeats)
    rows.append(("trim_block", n, t_k, t_b, "numpy lexsort"))
    t_k = median_time(lambda: clip_rows(indptr, vals, 2.0), a.repeats)
    t_b = median_time(lambda: clip_numpy(indptr, vals, 2.0), a.repeats)
    rows.append(("clip_rows", n, t_k, t_b, "numpy reduceat"))
    g = make_rng(0)
    t_k = median_time(lambda: huber_noise(g, n, 1.0, 1.0), a.repeats)
    t_b = median_time(lambda: g.laplace(0.0, 1.0, n), a.repeats)
    rows.append(("huber_noise", n, t_k, t_b, "Generator.laplace"))
    print(f"{n:,} ratings in {indptr.size - 1:,} users, tau={a.tau}, median of {a.repeats}")
    print(f"{'what':<12} {'per s':>14} {'baseline per s':>16} {'speed ratio':>12}  baseline")
    for name, m, tk, tb, base in rows:
        print(f"{name:<12} {m / tk:>14,.0f} {m / tb:>16,.0f} {tb / tk:>11.2f}x  {base}")


if __name__ == "__main__":
    main()
