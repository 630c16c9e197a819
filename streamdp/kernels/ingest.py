"""Numba kernels of ``streamdp ingest``: group a partition by user, de-duplicate, re-sort.

All kernels work on raw arrays and write into preallocated outputs. Reference
implementations in NumPy live in ``tests/storage/test_ingest_kernels.py``.
"""

from __future__ import annotations

import numpy as np
from streamdp.kernels.jit import njit


@njit(cache=True, nogil=True)
def group_dedup(users, items, ratings, ts, has_ts, n_users, n_items, out_indptr, out_items, out_ratings,
                aggregate, flags, out_ts, out_flags):
    """Group ratings by user and keep one rating per (user, item), or with ``aggregate`` sum them.

    Parameters
    ----------
    users : int32 array
        Local user index (``0 <= users < n_users``) of each rating, in input order.
    items : int32 array
        Item index (``0 <= items < n_items``) of each rating.
    ratings : float32 array
    ts : int64 array
        Timestamps (ignored unless ``has_ts``).
    out_indptr : int64 array (n_users + 1)
    out_items, out_ratings : arrays as long as the input

    aggregate : bool
        Sum a pair's ratings instead of keeping one (below).
    flags : uint8 array (empty for none)
        The split each rating comes from (0 train, 1 test: ``ingest --train/--test``), or empty.
        A pair with ratings in both keeps the test one only (its training copies are dropped:
        the answer would otherwise be in the training data); among ratings of one flag the
        rule below applies. ``out_flags`` (as long as the input) receives the kept rating's flag.
    out_ts : int64 array (empty for none)
        If not empty (as long as the input), the kept rating's timestamp (``ts`` must then be
        given): with ``aggregate``, the latest of the pair's timestamps.

    Returns
    -------
    (nnz, n_dropped, n_across) : the number of ratings kept, of duplicates dropped (or, with
    ``aggregate``, added into the first occurrence of their pair), and of those that were
    dropped because the pair is also in the other split (``flags``).

    With ``aggregate`` (interaction logs: every row is one interaction, or a count/weight)
    the values of a repeated pair are summed (in float32, exact for integer counts below
    2^24) and timestamps play no part. Otherwise, of duplicated pairs the one with the largest timestamp is kept, ties (and all
    pairs when there are no timestamps) going to the one seen last in input order.
    Within a user, items come in order of first appearance (no sort: a per-item
    stamp finds repeats in O(1)); ``remap_sort`` sorts them later.
    """
    n = len(users)
    counts = np.zeros(n_users + 1, np.int64)
    for k in range(n):
        counts[users[k] + 1] += 1
    for u in range(n_users):
        counts[u + 1] += counts[u]
    # stable counting sort of positions by user
    pos = np.empty(n, np.int64)
    fill = counts[:-1].copy()
    for k in range(n):
        u = users[k]
        pos[fill[u]] = k
        fill[u] += 1
    stamp = np.full(n_items, -1, np.int64)  # last user that rated the item
    slot = np.empty(n_items, np.int64)  # where that user's rating of the item was written
    best = np.empty(n if has_ts else 0, np.int64)  # timestamp of the kept rating
    has_flags = len(flags) > 0
    want_ts = len(out_ts) > 0
    w = 0
    dropped = 0
    across = 0
    out_indptr[0] = 0
    for u in range(n_users):
        for j in range(counts[u], counts[u + 1]):
            k = pos[j]
            it = items[k]
            if stamp[it] != u:  # the pair's first rating
                stamp[it] = u
                slot[it] = w
                out_items[w] = it
                q = w
                w += 1
                replace = True
            else:
                dropped += 1
                q = slot[it]
                replace = False
                if has_flags and flags[k] != out_flags[q]:
                    across += 1
                    replace = flags[k] > out_flags[q]  # the test rating replaces the training copies
                elif aggregate:
                    out_ratings[q] += ratings[k]
                    if want_ts and ts[k] > out_ts[q]:
                        out_ts[q] = ts[k]
                else:
                    replace = not has_ts or ts[k] >= best[q]
            if replace:
                out_ratings[q] = ratings[k]
                if has_flags:
                    out_flags[q] = flags[k]
                if has_ts:
                    best[q] = ts[k]
                if want_ts:
                    out_ts[q] = ts[k]
        out_indptr[u + 1] = w
    return w, dropped, across


@njit(cache=True, nogil=True)
def remap_sort(indptr, items, ratings, new_index, ts):
    """Renumber items by ``new_index`` and sort each user's ratings by the new index (in place).

    Two stable counting sorts (by new item, then by user) instead of one sort per
    user: O(n + n_items) with sequential passes. Items must be distinct within a user.
    ``ts`` (as long as ``items``, or empty): each rating's timestamp, moved with it. It has no default: Numba's
    cache never matches a signature whose omitted argument defaults to an array, so each process compiled it anew.
    """
    n_users = len(indptr) - 1
    n = len(items)
    n_items = len(new_index)
    cnt = np.zeros(n_items + 1, np.int64)
    for k in range(n):
        cnt[new_index[items[k]] + 1] += 1
    for i in range(n_items):
        cnt[i + 1] += cnt[i]
    t_item = np.empty(n, np.int32)
    t_rating = np.empty(n, np.float32)
    t_user = np.empty(n, np.int32)
    has_ts = len(ts) > 0
    t_ts = np.empty(n if has_ts else 0, np.int64)
    for u in range(n_users):
        for k in range(indptr[u], indptr[u + 1]):
            key = new_index[items[k]]
            p = cnt[key]
            cnt[key] += 1
            t_item[p] = key
            t_rating[p] = ratings[k]
            t_user[p] = u
            if has_ts:
                t_ts[p] = ts[k]
    fill = indptr[:-1].copy()
    for p in range(n):
        u = t_user[p]
        q = fill[u]
        fill[u] += 1
        items[q] = t_item[p]
        ratings[q] = t_rating[p]
        if has_ts:
            ts[q] = t_ts[p]


@njit(cache=True, nogil=True)
def bucket_rows(users, block_users, part_of_block, order, starts):
    """Stable counting sort of rows by the partition of their user's block.

    Partition of row ``k`` is ``part_of_block[users[k] // block_users]``; fills
    ``order`` (len(users)) and ``starts`` (n_parts + 1) so that the rows of
    partition ``p`` are ``order[starts[p]:starts[p+1]]``, in input order.
    """
    n_parts = len(starts) - 1
    n = len(users)
    part = np.empty(n, np.int32)
    starts[:] = 0
    for k in range(n):
        p = part_of_block[users[k] // block_users]
        part[k] = p
        starts[p + 1] += 1
    for p in range(n_parts):
        starts[p + 1] += starts[p]
    fill = starts[:-1].copy()
    for k in range(n):
        p = part[k]
        order[fill[p]] = k
        fill[p] += 1


@njit(cache=True, nogil=True)
def count_into(counts, keys, lo):
    """``counts[k - lo] += 1`` for every key (the caller guarantees the range)."""
    for k in range(len(keys)):
        counts[keys[k] - lo] += 1


@njit(cache=True, nogil=True)
def nonzero_counts(counts, lo):
    """``(keys, counts)`` of the entries of ``counts`` that are not zero, entry ``k`` the key ``lo + k``, in key
    order: ``np.flatnonzero`` and its gathers in two passes (6.8M entries, 2M not zero: 11 ms against 17-36 ms)."""
    n = 0
    for k in range(len(counts)):
        if counts[k] != 0:
            n += 1
    keys = np.empty(n, np.int64)
    out = np.empty(n, counts.dtype)
    j = 0
    for k in range(len(counts)):
        if counts[k] != 0:
            keys[j] = lo + k
            out[j] = counts[k]
            j += 1
    return keys, out


@njit(cache=True, nogil=True)
def hash_strings(offsets, data, out):
    """64-bit FNV-1a hash of each string of an Arrow string array: string ``k`` is
    ``data[offsets[k]:offsets[k + 1]]`` (``offsets`` as long as ``out`` plus one, already shifted by
    the array's offset). Equal strings hash equal; :class:`streamdp.storage.ingest._IdMap` checks
    every match against the string itself, so a collision is never a wrong id."""
    for k in range(len(out)):
        h = np.uint64(14695981039346656037)
        for j in range(offsets[k], offsets[k + 1]):
            h = (h ^ np.uint64(data[j])) * np.uint64(1099511628211)
        out[k] = h


@njit(cache=True, nogil=True)
def same_strings(offsets, data, a, b, out):
    """``out[k]``: whether strings ``a[k]`` and ``b[k]`` of one Arrow string array (``offsets`` shifted by
    its offset, ``data`` its bytes) are equal."""
    for k in range(len(a)):
        s, t = offsets[a[k]], offsets[b[k]]
        n = offsets[a[k] + 1] - s
        eq = n == offsets[b[k] + 1] - t
        j = 0
        while eq and j < n:
            eq = data[s + j] == data[t + j]
            j += 1
        out[k] = eq
