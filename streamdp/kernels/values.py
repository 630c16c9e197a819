"""Each user's lowest and highest rating in a CSR block (the private rating range's contributions).

:func:`user_extremes` takes one block's local ``indptr`` and ``ratings`` and writes, for each user with at least
one rating, her minimum and maximum rating; :mod:`streamdp.privacy.rating_range` turns them into the per-value
weights that it thresholds. A NumPy reference is tested against it (``tests/privacy/test_rating_range.py``).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def user_extremes(indptr, ratings, lo, hi):  # pragma: no cover - numba
    """``lo[u]``, ``hi[u]``: user ``u``'s lowest and highest rating (left alone for a user with none).

    Returns ``has``: a ``uint8`` per user, 1 when she has ratings.
    """
    n = len(indptr) - 1
    has = np.zeros(n, np.uint8)
    for u in range(n):
        s, e = indptr[u], indptr[u + 1]
        if e <= s:
            continue
        a = ratings[s]
        b = ratings[s]
        for p in range(s + 1, e):
            r = ratings[p]
            if r < a:
                a = r
            elif r > b:
                b = r
        lo[u] = a
        hi[u] = b
        has[u] = 1
    return has
