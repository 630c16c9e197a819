"""The ratings of a time window, kept from a block on read (:class:`streamdp.storage.timeline.TimeWindowView`)."""

from __future__ import annotations

import numpy as np
from streamdp.kernels.jit import njit


@njit(cache=True, nogil=True)
def keep_window(indptr, items, ratings, times, lo, hi, out_indptr, out_items, out_ratings, out_times):
    """Keep the ratings with ``lo <= times < hi`` of a CSR block (order within a user kept).

    Writes the kept ratings into the preallocated outputs (as long as the input; ``out_indptr`` as long as
    ``indptr``) and returns their number.
    """
    n_users = len(indptr) - 1
    w = 0
    out_indptr[0] = 0
    for u in range(n_users):
        for k in range(indptr[u], indptr[u + 1]):
            t = times[k]
            if t >= lo and t < hi:
                out_items[w] = items[k]
                out_ratings[w] = ratings[k]
                out_times[w] = t
                w += 1
        out_indptr[u + 1] = w
    return w


def keep_window_reference(indptr, items, ratings, times, lo, hi):
    """:func:`keep_window` in NumPy (a mask and a cumulative sum), for the tests."""
    keep = (times >= lo) & (times < hi)
    cs = np.concatenate([[0], np.cumsum(keep)]).astype(np.int64)
    return cs[indptr], items[keep], ratings[keep], times[keep]
