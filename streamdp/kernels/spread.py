"""Per-user statistics of how ratings spread around their item's mean (a rehearsal's spread release).

:func:`residual_spread` takes one CSR user block (local ``indptr``, ``items``, ``ratings``), each item's mean rating
and, optionally, item factors, and adds to ``out`` four sums over the block's users with at least two ratings, each
user's term clipped so that one user moves each sum by at most its bound (:mod:`streamdp.workflows.rehearse` releases them).
The first two are weighted: a user of ``n`` ratings counts ``w = min(n, cap) / cap`` (``cap <= 0``: 1 for everyone),
so that the sums over users approach sums over ratings (what a test RMSE weighs) while one user still moves each by
at most its bound:

``out[0]``  ``w`` times the mean squared residual ``e_j = r_j - item_mean[j]`` of the user, clipped to
            ``[0, bounds[0]]``;
``out[1]``  ``w`` times the mean product of two of her residuals on distinct items,
            ``((sum e)^2 - sum e^2) / (n (n - 1))``, clipped to ``[-bounds[1], bounds[1]]`` (her rating level: its
            expectation is the variance of a user offset, the rating noise adds nothing to it);
``out[2]``  mean squared leave-one-out residual of a ridge fit (ridge ``lam``) of her centred residuals on the item
            factors ``V`` (``(n_items, k)``; ``k = 0`` leaves ``out[2]`` alone), clipped to ``[0, bounds[2]]``:
            what those factors do not explain of her ratings, out of sample (unweighted);
``out[3]``  the weights ``w``.

A NumPy reference (:func:`residual_spread_reference`) is tested against it.
"""

from __future__ import annotations

import numpy as np
from streamdp.kernels.jit import njit


@njit(cache=True, nogil=True)
def residual_spread(indptr, items, ratings, item_mean, V, lam, bounds, cap, out):
    """Add the block's four clipped per-user sums to ``out`` (module docstring); returns the users counted."""
    k = V.shape[1]
    counted = 0
    A = np.empty((k, k))
    b = np.empty(k)
    for u in range(len(indptr) - 1):
        lo, hi = indptr[u], indptr[u + 1]
        n = hi - lo
        if n < 2:
            continue
        counted += 1
        s1 = 0.0
        s2 = 0.0
        for p in range(lo, hi):
            e = ratings[p] - item_mean[items[p]]
            s1 += e
            s2 += e * e
        w = min(n, cap) / cap if cap > 0 else 1.0
        out[0] += w * min(s2 / n, bounds[0])
        out[1] += w * min(max((s1 * s1 - s2) / (n * (n - 1.0)), -bounds[1]), bounds[1])
        out[3] += w
        if k == 0:
            continue
        mean = s1 / n
        for a in range(k):
            b[a] = 0.0
            for c in range(k):
                A[a, c] = lam if a == c else 0.0
        for p in range(lo, hi):
            j = items[p]
            d = ratings[p] - item_mean[j] - mean
            for a in range(k):
                b[a] += V[j, a] * d
                for c in range(k):
                    A[a, c] += V[j, a] * V[j, c]
        Ainv = np.linalg.inv(A)
        x = Ainv @ b
        loo = 0.0
        for p in range(lo, hi):
            j = items[p]
            d = ratings[p] - item_mean[j] - mean
            fit = 0.0
            h = 0.0
            for a in range(k):
                fit += V[j, a] * x[a]
                t = 0.0
                for c in range(k):
                    t += Ainv[a, c] * V[j, c]
                h += V[j, a] * t
            r = (d - fit) / max(1.0 - h, 1e-6)
            loo += r * r
        out[2] += min(loo / n, bounds[2])
    return counted


def residual_spread_reference(indptr, items, ratings, item_mean, V, lam, bounds, cap) -> tuple[np.ndarray, int]:
    """:func:`residual_spread` in NumPy, one user at a time (for the tests)."""
    out, counted = np.zeros(4), 0
    for u in range(len(indptr) - 1):
        it, r = items[indptr[u]:indptr[u + 1]], ratings[indptr[u]:indptr[u + 1]].astype(np.float64)
        n = len(r)
        if n < 2:
            continue
        counted += 1
        e = r - item_mean[it]
        w = min(n, cap) / cap if cap > 0 else 1.0
        out[0] += w * min(np.mean(e ** 2), bounds[0])
        out[1] += w * np.clip((e.sum() ** 2 - (e ** 2).sum()) / (n * (n - 1)), -bounds[1], bounds[1])
        out[3] += w
        if V.shape[1]:
            d, X = e - e.mean(), V[it]
            H = X @ np.linalg.solve(X.T @ X + lam * np.eye(V.shape[1]), X.T)
            loo = (d - H @ d) / np.maximum(1.0 - np.diag(H), 1e-6)
            out[2] += min(np.mean(loo ** 2), bounds[2])
    return out, counted
