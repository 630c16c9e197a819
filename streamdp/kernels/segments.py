"""Merging a user block's rows across the segments of a store (:mod:`streamdp.storage.segments`)."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def merge_rows(n_users, indptrs, starts, items, ratings, part_of, split_of, want, implicit, cap,
               out_indptr, out_items, out_ratings, out_src=np.empty(0, np.int64)):
    """One split of a block merged from ``K`` sources (each a part's split of the block).

    Source ``k``'s user ``u`` holds ``items[starts[k] + indptrs[k, u]: starts[k] + indptrs[k, u + 1]]``
    (and the ratings beside them); sources come by part (0 the base, then the segments in commit order),
    each part's splits in turn: ``part_of[k]`` is source ``k``'s part and ``split_of[k]`` its split (0 train,
    1 test). For each user, a (user, item) pair rated in
    several parts is one rating: of the latest part, in that part's split (explicit ratings: its value,
    the store's "last seen wins"); with ``implicit``, the sum of all its values, capped at ``cap`` when
    ``cap > 0`` (the store's "repeated pairs are summed"). Only pairs whose kept split is ``want`` are
    written. A user with rows in one part only keeps their order (as the part stores them; a part holds a
    pair in one split only); a user with rows in several gets them sorted by item (the order ingest writes).

    ``out_src`` (as long as ``out_items``, or empty): the position in ``items`` each written rating was taken
    from (the latest part's; what a rating's timestamp is read by).

    Returns the number of ratings written (``out_indptr`` is filled, ``n_users + 1`` long).
    """
    want_src = len(out_src) > 0
    K = indptrs.shape[0]
    pos = 0
    out_indptr[0] = 0
    for u in range(n_users):
        n = 0
        only = -1  # the one part with rows of the user, -2 several
        for k in range(K):
            c = indptrs[k, u + 1] - indptrs[k, u]
            if c > 0:
                if only == -1:
                    only = part_of[k]
                elif only != part_of[k]:
                    only = -2
                n += c
        if only >= 0:
            for k in range(K):
                if part_of[k] == only and split_of[k] == want:
                    s = starts[k] + indptrs[k, u]
                    c = indptrs[k, u + 1] - indptrs[k, u]
                    for j in range(c):
                        out_items[pos + j] = items[s + j]
                        out_ratings[pos + j] = ratings[s + j]
                        if want_src:
                            out_src[pos + j] = s + j
                    pos += c
        elif n > 0:
            keys = np.empty(n, np.int64)
            src = np.empty(n, np.int64)
            m = 0
            for k in range(K):
                s = starts[k] + indptrs[k, u]
                for j in range(indptrs[k, u + 1] - indptrs[k, u]):
                    keys[m] = np.int64(items[s + j]) * K + k
                    src[m] = s + j
                    m += 1
            order = np.argsort(keys)
            j = 0
            while j < n:
                item = keys[order[j]] // K
                total = np.float32(0.0)
                e = j
                while e < n and keys[order[e]] // K == item:
                    total += ratings[src[order[e]]]
                    e += 1
                last = order[e - 1]  # the largest k: the latest part (a part holds a pair in one split only)
                k = keys[last] % K
                if split_of[k] == want:
                    out_items[pos] = items[src[last]]
                    if want_src:
                        out_src[pos] = src[last]
                    if implicit:
                        out_ratings[pos] = min(total, np.float32(cap)) if cap > 0 else total
                    else:
                        out_ratings[pos] = ratings[src[last]]
                    pos += 1
                j = e
        out_indptr[u + 1] = pos
    return pos


def merge_rows_reference(n_users, indptrs, starts, items, ratings, part_of, split_of, want, implicit, cap):
    """:func:`merge_rows` in plain Python (dicts per user), for the tests: ``(indptr, items, ratings)``."""
    K = indptrs.shape[0]
    ip, out_i, out_r = [0], [], []
    for u in range(n_users):
        kept: dict = {}
        for k in range(K):
            s = starts[k]
            for j in range(s + indptrs[k, u], s + indptrs[k, u + 1]):
                i = int(items[j])
                total = kept[i][2] if i in kept else np.float32(0.0)
                kept[i] = (k, ratings[j], np.float32(total + ratings[j]))
        srcs = [k for k in range(K) if indptrs[k, u + 1] > indptrs[k, u]]
        several = len({int(part_of[k]) for k in srcs}) > 1
        row = kept.items() if several else [(int(items[j]), kept[int(items[j])]) for k in srcs
                                            for j in range(starts[k] + indptrs[k, u], starts[k] + indptrs[k, u + 1])]
        for i, (k, r, total) in (sorted(row) if several else row):
            if split_of[k] == want:
                out_i.append(i)
                out_r.append((min(total, np.float32(cap)) if cap > 0 else total) if implicit else r)
        ip.append(len(out_i))
    return np.array(ip, np.int64), np.array(out_i, np.int32), np.array(out_r, np.float32)
