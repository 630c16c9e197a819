"""What forming a block's pairs costs: the per-rating kernels of every pass against the NumPy forms they replaced.

Usage::

    python bench/pairs.py                         # a block of 21,000 users, about 0.95M ratings (the 90M store's)
    python bench/pairs.py --users 2000 --repeats 3

Before its iterations touch a block, a private ``ials`` on a rating store forms the block's pairs (the ratings above
the middle of the range, their confidences: :func:`streamdp.serving.local.implicit_pairs`) and, with the item floor,
the offsets of each user's pairs of the items kept (:func:`streamdp.kernels.csr.masked_indptr`); a gated ``als``
whose factors lost sums each user's clipped residuals for the offset moments
(:func:`streamdp.kernels.als.clipped_user_sums`). Where a store's pairs do not fit beside its blocks within the
memory limit (the 90M-rating store of ``bench/append.py`` at 512 MB) every pass forms them again. Each row times,
round-robin in the same run, the kernel and the NumPy form it replaced (``*_reference``, the form the tests hold it
to, bit for bit) on one generated block (lognormal users' lengths around ``--per-user``, 20,000 items, ratings 0.5-5
by halves): milliseconds per block (median of ``--repeats`` rounds, each the best of ``--inner`` calls) and the
speed-up, the median of the per-round ratios. Exit code 1 when a kernel's output differs from its reference.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

if __package__ in (None, ""):  # run as a file
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def block(n_users: int, per_user: float, seed: int = 0):
    """``(indptr, items, ratings, residuals)``: one generated block."""
    rng = np.random.default_rng(seed)
    counts = np.maximum(rng.lognormal(np.log(per_user) - 0.5, 1.0, n_users).astype(np.int64), 1)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    n = int(indptr[-1])
    items = rng.integers(0, 20_000, n).astype(np.int32)
    ratings = (rng.integers(1, 11, n) / 2.0).astype(np.float32)
    return indptr, items, ratings, rng.standard_normal(n) * 1.5


def cases(indptr, items, ratings, resid):
    """``(name, kernel, reference)``: each a function of no argument returning comparable arrays."""
    from streamdp.kernels.als import clipped_user_sums_reference
    from streamdp.kernels.csr import masked_indptr
    from streamdp.kernels.ials import rating_confidences_reference
    from streamdp.serving.local import implicit_pairs

    lo, hi, alpha, cmax = 0.5, 5.0, 3.0, 4.0
    keep = np.random.default_rng(1).random(20_000) < 0.3  # an item floor keeping 30% of the items
    mask = keep[items]

    def params(pref):
        return {"implicit": False, "preference": pref, "alpha": alpha, "max_confidence": cmax, "rating_min": lo,
                "rating_max": hi}

    def kept_offsets():
        out = np.empty(len(indptr), np.int64)
        masked_indptr(indptr, mask, out)
        return (out,)

    def moments_reference():
        sx, sxx = clipped_user_sums_reference(indptr, resid, 2.25)
        return (sx, sxx)

    def moments_kernel():
        from streamdp.kernels.als import clipped_user_sums

        sx, sxx = np.empty(len(indptr) - 1), np.empty(len(indptr) - 1)
        clipped_user_sums(indptr, resid, 2.25, sx, sxx)
        return (sx, sxx)

    return [
        ("ials pairs, ratings above the middle (implicit_pairs)",
         lambda: implicit_pairs(indptr, items, ratings, params("above")),
         lambda: rating_confidences_reference(indptr, items, ratings, True, False, lo, hi, alpha, cmax)),
        ("ials pairs, graded confidences (implicit_pairs)",
         lambda: implicit_pairs(indptr, items, ratings, params("graded")),
         lambda: rating_confidences_reference(indptr, items, ratings, False, True, lo, hi, alpha, cmax)),
        ("offsets of the pairs of kept items (masked_indptr)", kept_offsets,
         lambda: (np.concatenate([[0], np.cumsum(mask)])[indptr],)),
        ("users' clipped residual sums (clipped_user_sums)", moments_kernel, moments_reference),
    ]


def _best(fn, inner: int) -> float:
    best = float("inf")
    for _ in range(inner):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--users", type=int, default=21_000, help="users in the block (default 21,000)")
    ap.add_argument("--per-user", type=float, default=45.0, help="their mean ratings (default 45)")
    ap.add_argument("--repeats", type=int, default=7, help="rounds (default 7)")
    ap.add_argument("--inner", type=int, default=5, help="calls per timing, the best kept (default 5)")
    a = ap.parse_args(argv)
    if a.users < 1 or a.per_user <= 0 or a.repeats < 1 or a.inner < 1:
        ap.error("--users, --per-user, --repeats and --inner must be positive")
    data = block(a.users, a.per_user)
    print(f"block: {a.users:,} users, {len(data[1]):,} ratings; medians of {a.repeats} rounds, each the best of "
          f"{a.inner} calls (the first call of each compiled or loaded first)")
    rows, same = [], True
    for name, kernel, ref in cases(*data):
        got, want = kernel(), ref()
        ok = len(got) == len(want) and all(np.array_equal(g, w) and g.dtype == w.dtype for g, w in zip(got, want))
        same &= ok
        tk, tr = [], []
        for _ in range(a.repeats):
            tk.append(_best(kernel, a.inner))
            tr.append(_best(ref, a.inner))
        ratio = statistics.median(r / k for r, k in zip(tr, tk))
        rows.append((name, statistics.median(tr) * 1e3, statistics.median(tk) * 1e3, ratio, ok))
    print("\n| pass | NumPy form, ms | kernel, ms | speed-up | same bits |\n|---|---|---|---|---|")
    for name, r, k, ratio, ok in rows:
        print(f"| {name} | {r:.2f} | {k:.2f} | {ratio:.1f}x | {'yes' if ok else 'NO'} |")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
