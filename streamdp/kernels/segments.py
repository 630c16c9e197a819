"""Merging a user block's rows across the segments of a store (:mod:`streamdp.storage.segments`): :func:`merge_rows`,
:func:`append_delta`.

A user with rows in several parts gets them in ascending item (ingest sorts each user's items). Where at most
:data:`SMALL_MAX` of her rows lie outside her longest source (the base and a few appended rows: the common case),
those are sorted by (item, source) by insertion and each is placed in the longest source's run by counting the
run's items below it, the rows between copied as runs; otherwise, or where the longest source's run is out of item
order, all her rows are sorted (:func:`_merge_sorting`). An item in several sources is taken in ascending source
(the order its values are summed in). Elements are read inline: a call that passes arrays counts references to
each (measured: 20x the read), and slicing does too, so the loop over the users is one function
(:func:`_merge_users`) and its helpers are inlined (``inline="always"``), their loops indexed by unsigned integers,
which LLVM vectorizes (Numba checks a signed index for wrapping around, which keeps it from doing so: a copy loop
2x slower than a slice, 2x faster unsigned).

Measured on a block of the 11-part 91M store (``bench/append.py``: 21,183 users, 13,359 of them with rows in
several parts, 1 to 4 outside the base; 980,488 ratings), the minimum of 30 interleaved calls: the walk of every
source's cursor this replaced 3.60 ms, the placement 2.59 ms; the block's base alone (every segment empty) 1.24 ms
with slices, 0.70 ms copied by unsigned loops. With many rows in many parts (20,000 users, 6 parts of up to 12
rows each, 0.72M ratings: most users 20-60 rows outside their longest source) the walk 27.6 ms, the placement
24.4 ms with :data:`SMALL_MAX` at 64 (28.8 at 32). The walk is gone (beyond :data:`SMALL_MAX`, the sort): its code
cost 1.4 s of a cold compile (9.0 s against 7.6 s).
"""

from __future__ import annotations

import numpy as np
from streamdp.kernels.jit import njit

#: The most rows a user may hold outside her longest source for the merge to find each in that source's run
#: (:func:`merge_rows`); beyond it, her rows are sorted (:func:`_merge_sorting`).
SMALL_MAX = 64


@njit(cache=True, nogil=True, inline="always")
def _copy(out_items, out_ratings, pos, src_items, src_ratings, s, c):
    """``c`` rows from ``s`` to ``pos``: unsigned indices, so that the loops are plain copies (a signed index is
    checked for wrapping around, which keeps LLVM from vectorizing them)."""
    p, q = np.uint64(pos), np.uint64(s)
    for j in range(np.uint64(c)):
        out_items[p + j] = src_items[q + j]
    for j in range(np.uint64(c)):
        out_ratings[p + j] = src_ratings[q + j]


@njit(cache=True, nogil=True, inline="always")
def _ascending(a, s, e):
    """Whether ``a[s:e]`` strictly ascends (one pass without early exit, unsigned indices: vectorized)."""
    bad = np.uint8(0)
    for i in range(np.uint64(s + 1), np.uint64(e)):
        bad |= np.uint8(a[i] <= a[i - np.uint64(1)])
    return bad == 0


@njit(cache=True, nogil=True, inline="always")
def _below(a, s, e, x):
    """How many of ``a[s:e]`` are below ``x`` (no branch per element: vectorized)."""
    n = np.int64(0)
    for i in range(np.uint64(s), np.uint64(e)):
        n += np.int64(a[i] < x)
    return n


@njit(cache=True, nogil=True)
def merge_rows(n_users, indptrs, starts, items, ratings, part_of, split_of, want, implicit, cap,
               out_indptr, out_items, out_ratings, out_src, items0, ratings0):
    """One split of a block merged from ``K`` sources (each a part's split of the block).

    Source ``k``'s user ``u`` holds ``items[starts[k] + indptrs[k, u]: starts[k] + indptrs[k, u + 1]]``
    (and the ratings beside them); sources come by part (0 the base, then the segments in commit order),
    ``part_of[k]`` is source ``k``'s part and ``split_of[k]`` its split (0 train, 1 test). A (user, item) pair
    rated in several parts is one rating: of the latest part, in that part's split (explicit ratings: its value,
    "last seen wins"); with ``implicit``, the sum of all its values, capped at ``cap`` when ``cap > 0``. Only
    pairs whose kept split is ``want`` are written. A user with rows in one part only keeps their order (as the
    part stores them; a part holds a pair in one split only); one with rows in several gets them sorted by item.

    ``items0``, ``ratings0`` (optional): source 0's rows in arrays of their own (``starts[0] == 0``; ``items``
    then holds the other sources from position ``len(items0)`` on): the base's block read in place. They may lie
    at the end of ``out_items``, ``out_ratings`` themselves, after a gap of the other sources' rows plus source 0's
    longest row: no write for a user then reaches a row of source 0 of hers or after (the rows written before hers
    are at most the sources' rows before hers), so her rows stay whole if they must be sorted. ``out_src``
    (as long as ``out_items``, or empty): the position (sources laid end to end) each written rating was taken
    from (what a rating's timestamp is read by). The outputs need room for the rows of the sources of ``want``.

    Returns the number of ratings written (``out_indptr`` is filled, ``n_users + 1`` long).
    """
    K = indptrs.shape[0]
    cur, stop, act = np.empty(K, np.int64), np.empty(K, np.int64), np.empty(K, np.int64)
    s_item, s_pos, s_k = np.empty(SMALL_MAX, np.int64), np.empty(SMALL_MAX, np.int64), np.empty(SMALL_MAX, np.int64)
    return _merge_users(n_users, indptrs, starts, items, ratings, part_of, split_of, want, implicit, cap, out_indptr,
                        out_items, out_ratings, out_src, items0, ratings0, cur, stop, act, s_item, s_pos, s_k)


@njit(cache=True, nogil=True)
def _merge_users(n_users, indptrs, starts, items, ratings, part_of, split_of, want, implicit, cap, out_indptr,
                 out_items, out_ratings, out_src, items0, ratings0, cur, stop, act, s_item, s_pos, s_k):
    """:func:`merge_rows`'s loop over the users, with its scratch arrays (a user's cursors, her rows outside her
    longest source): one function, so that no call per user passes arrays (each counts references to them; an
    inlined helper per user took a fifth more time). Returns the number of ratings written."""
    want_src = len(out_src) > 0
    n0 = len(items0)
    K = indptrs.shape[0]
    pos = 0
    out_indptr[0] = 0
    for u in range(n_users):
        m, n, kb, longest = 0, 0, 0, 0
        only = -1  # the one part with rows of the user, -2 several
        for k in range(K):
            if indptrs[k, u + 1] > indptrs[k, u]:
                cur[k], stop[k] = starts[k] + indptrs[k, u], starts[k] + indptrs[k, u + 1]
                act[m] = k
                m += 1
                n += stop[k] - cur[k]
                if stop[k] - cur[k] > longest:
                    kb, longest = k, stop[k] - cur[k]
                if only == -1:
                    only = part_of[k]
                elif only != part_of[k]:
                    only = -2
        if only >= 0:
            for a in range(m):
                k = act[a]
                if split_of[k] == want:
                    s, c = cur[k], stop[k] - cur[k]
                    if s < n0:  # source 0 (a source lies wholly in one of the two arrays)
                        _copy(out_items, out_ratings, pos, items0, ratings0, s, c)
                    else:
                        _copy(out_items, out_ratings, pos, items, ratings, s - n0, c)
                    if want_src:
                        for j in range(c):
                            out_src[pos + j] = s + j
                    pos += c
        elif only == -2 and n - longest <= SMALL_MAX:
            # one long source (kb, the most rows) and a few rows in the others: the others' rows sorted by (item,
            # source) by insertion, each placed in kb's run, kb's rows between them copied in runs
            ns = 0
            for a in range(m):
                k = act[a]
                if k != kb:
                    for c in range(cur[k], stop[k]):
                        x = np.int64(items0[c] if c < n0 else items[c - n0])
                        i = ns
                        while i > 0 and s_item[i - 1] > x:  # stable: the sources come in ascending order
                            s_item[i], s_pos[i], s_k[i] = s_item[i - 1], s_pos[i - 1], s_k[i - 1]
                            i -= 1
                        s_item[i], s_pos[i], s_k[i] = x, c, k
                        ns += 1
            c, e = cur[kb], stop[kb]
            in0 = c < n0
            ok = _ascending(items0, c, e) if in0 else _ascending(items, c - n0, e - n0)
            if not ok:
                pos = _merge_sorting(u, n, K, indptrs, starts, items0, ratings0, items, ratings, n0, split_of, want,
                                     implicit, cap, out_items, out_ratings, out_src, pos)
            else:
                emit_b = split_of[kb] == want
                i = 0
                while True:
                    x = s_item[i] if i < ns else np.int64(1) << 62
                    # p: kb's first row at or after item x (its rows ascend: those below x, counted)
                    p = c + (_below(items0, c, e, x) if in0 else _below(items, c - n0, e - n0, x))
                    if emit_b and p > c:
                        if in0:
                            _copy(out_items, out_ratings, pos, items0, ratings0, c, p - c)
                        else:
                            _copy(out_items, out_ratings, pos, items, ratings, c - n0, p - c)
                        if implicit and cap > 0:
                            for q in range(pos, pos + p - c):
                                out_ratings[q] = min(out_ratings[q], np.float32(cap))
                        if want_src:
                            for q in range(p - c):
                                out_src[pos + q] = c + q
                        pos += p - c
                    c = p
                    if i >= ns:
                        break
                    j = i  # the group of item x: kb's row (if it has x) and the others', summed in ascending source
                    while j < ns and s_item[j] == x:
                        j += 1
                    in_b = c < e and np.int64(items0[c] if in0 else items[c - n0]) == x
                    total, last, lk = np.float32(0.0), np.int64(-1), np.int64(-1)
                    for g in range(i, j):
                        if in_b and lk < kb < s_k[g]:
                            total += ratings0[c] if in0 else ratings[c - n0]
                            last, lk = c, kb
                        q = s_pos[g]
                        total += ratings0[q] if q < n0 else ratings[q - n0]
                        last, lk = q, s_k[g]
                    if in_b and lk < kb:
                        total += ratings0[c] if in0 else ratings[c - n0]
                        last, lk = c, kb
                    if in_b:
                        c += 1
                    if split_of[lk] == want:
                        out_items[pos] = np.int32(x)
                        if want_src:
                            out_src[pos] = last
                        if implicit:
                            out_ratings[pos] = min(total, np.float32(cap)) if cap > 0 else total
                        else:
                            out_ratings[pos] = ratings0[last] if last < n0 else ratings[last - n0]
                        pos += 1
                    i = j
        elif only == -2:
            pos = _merge_sorting(u, n, K, indptrs, starts, items0, ratings0, items, ratings, n0, split_of, want,
                                 implicit, cap, out_items, out_ratings, out_src, pos)
        out_indptr[u + 1] = pos
    return pos


@njit(cache=True, nogil=True)
def _merge_sorting(u, n, K, indptrs, starts, items0, ratings0, items, ratings, n0, split_of, want, implicit, cap,
                   out_items, out_ratings, out_src, pos):
    """User ``u``'s ``n`` rows merged as :func:`merge_rows` does, for runs in any order: sorted by (item, source)
    first. Returns the new ``pos``."""
    keys = np.empty(n, np.int64)
    src = np.empty(n, np.int64)
    m = 0
    for k in range(K):
        s = starts[k] + indptrs[k, u]
        for j in range(indptrs[k, u + 1] - indptrs[k, u]):
            keys[m] = np.int64(items0[s + j] if s + j < n0 else items[s + j - n0]) * K + k
            src[m] = s + j
            m += 1
    order = np.argsort(keys)
    j = 0
    while j < n:
        item = keys[order[j]] // K
        total = np.float32(0.0)
        e = j
        while e < n and keys[order[e]] // K == item:
            p = src[order[e]]
            total += ratings0[p] if p < n0 else ratings[p - n0]
            e += 1
        last = src[order[e - 1]]  # the largest k: the latest part (a part holds a pair in one split only)
        if split_of[keys[order[e - 1]] % K] == want:
            kept = ratings0[last] if last < n0 else ratings[last - n0]
            pos = _emit(out_items, out_ratings, out_src, pos, item, last, total, kept, implicit, cap)
        j = e
    return pos


@njit(cache=True, nogil=True)
def _emit(out_items, out_ratings, out_src, pos, item, last, total, kept, implicit, cap):
    """Write the rating kept of a pair rated in several sources at ``pos`` (``kept``: the latest one's value,
    ``total``: all of them summed; ``last``: its position) and return the next position."""
    out_items[pos] = np.int32(item)
    if len(out_src) > 0:
        out_src[pos] = last
    out_ratings[pos] = (min(total, np.float32(cap)) if cap > 0 else total) if implicit else kept
    return pos + 1


@njit(cache=True, nogil=True)
def append_delta(n_users, indptrs, starts, items, part_of, split_of, last, n_items, out_users, out_items, out_splits,
                 out_replaces, items0):
    """What the last part (sources with ``part_of[k] == last``) changes in a block's merged counts, visiting only
    the users it has rows of (sources as :func:`merge_rows`'s, without ratings).

    A pair of the last part is new (+1 for its user in ``out_users``, its item in ``out_items`` and its split in
    ``out_splits``) or replaces the latest earlier part's rating of it (-1 in that rating's split, +1 in its own:
    the user's and item's counts do not change); ``out_replaces[s] = 1`` when a pair of split ``s`` replaces one of
    the other split (where a read of the other split needs this part's ``s`` rows, ``merge/supersedes``). The
    same counts as merging the block with and without the part, without either merge. ``items0``: source 0's items
    in an array of their own, as :func:`merge_rows` takes them (empty: every source in ``items``).
    """
    n0 = len(items0)
    K = indptrs.shape[0]
    # 2 * u + split of the latest earlier rating of the pair by user u (another user's mark: none); stamped with the
    # user, so nothing is cleared between users (a second pass over the earlier parts' rows cost a third of the time)
    mark = np.full(n_items, -2, np.int32)
    for u in range(n_users):
        touched = False
        for k in range(K):
            if part_of[k] == last and indptrs[k, u + 1] > indptrs[k, u]:
                touched = True
        if not touched:
            continue
        for k in range(K):  # in part order: a later part's rating of a pair overwrites an earlier one's
            if part_of[k] < last:
                m = np.int32(2 * u + split_of[k])
                for p in range(starts[k] + indptrs[k, u], starts[k] + indptrs[k, u + 1]):
                    mark[items0[p] if p < n0 else items[p - n0]] = m
        for k in range(K):
            if part_of[k] == last:
                s = split_of[k]
                for p in range(starts[k] + indptrs[k, u], starts[k] + indptrs[k, u + 1]):
                    i = items0[p] if p < n0 else items[p - n0]
                    out_splits[s] += 1
                    if mark[i] >> 1 != u:
                        out_users[u] += 1
                        out_items[i] += 1
                    else:
                        out_splits[mark[i] & 1] -= 1
                        if mark[i] & 1 != s:
                            out_replaces[s] = 1


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
