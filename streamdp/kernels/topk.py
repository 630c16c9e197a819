"""Top-N lists of a user block and their ranking metrics, on raw arrays.

Every list excludes the items the user rated in training (``items[indptr[u]:indptr[u+1]]``)
and orders the rest by score, best first, ties broken by the lower ``tiekey`` (the
item's position in the released model, i.e. ascending original id), so a list does
not depend on the store's item order. Lists are ``(n_users, n)`` ``int32`` rows of
dense item indices, padded with ``-1`` when a user has fewer than ``n`` candidates.
Each kernel has a NumPy reference here (``*_reference``) that the tests compare with.
"""

from __future__ import annotations

import numpy as np
from streamdp.kernels.jit import njit


@njit(cache=True, nogil=True)
def _better(s1, t1, s2, t2):
    return s1 > s2 or (s1 == s2 and t1 < t2)


@njit(cache=True, nogil=True)
def _insert(j, s, tiekey, c, n, best, bscore):
    """Insert item ``j`` with score ``s`` into the sorted top list (``c`` entries); return the new count."""
    if c == n:
        if not _better(s, tiekey[j], bscore[n - 1], tiekey[best[n - 1]]):
            return c
        p = n - 1
    else:
        p = c
        c += 1
    while p > 0 and _better(s, tiekey[j], bscore[p - 1], tiekey[best[p - 1]]):
        best[p] = best[p - 1]
        bscore[p] = bscore[p - 1]
        p -= 1
    best[p] = j
    bscore[p] = s
    return c


@njit(cache=True, nogil=True)
def topn_scores(indptr, items, want, U, Q, item_bias, global_mean, tiekey, out_items, out_scores):
    """Each wanted user's top ``n`` unseen items by ``global_mean + item_bias[j] + U[u] . Q[j]`` (unclipped).

    ``want[u] == 0`` skips user ``u`` (its row stays ``-1``). ``out_items`` is
    ``(n_users, n)`` int32, ``out_scores`` the same shape float64 (written only where
    ``out_items >= 0``). Cost ``n_items k`` per wanted user; a score computed for a
    seen item is never looked at.
    """
    n_items, k = Q.shape
    n = out_items.shape[1]
    QT = np.ascontiguousarray(Q.T)  # item-contiguous rows: the score loop runs over items, in SIMD lanes
    base = global_mean + item_bias
    score = np.empty(n_items, np.float64)
    seen = np.full(n_items, -1, np.int64)
    best = np.empty(n, np.int64)
    bscore = np.empty(n, np.float64)
    for u in range(len(indptr) - 1):
        for a in range(n):
            out_items[u, a] = -1
        if want[u] == 0:
            continue
        for p in range(indptr[u], indptr[u + 1]):
            seen[items[p]] = u
        score[:] = base
        for d in range(k):
            x = U[u, d]
            row = QT[d]
            for j in range(n_items):
                score[j] += x * row[j]
        c = 0
        for j in range(n_items):
            if seen[j] != u:
                c = _insert(j, score[j], tiekey, c, n, best, bscore)
        for a in range(c):
            out_items[u, a] = best[a]
            out_scores[u, a] = bscore[a]


#: Items per chunk of :func:`topn_rescore`'s scans (a constant: each chunk's count is one vectorized loop).
SCAN_CHUNK = 64


@njit(cache=True, nogil=True)
def _chunk_reaches(row, j, thr):
    """Whether any of ``row[j:j + SCAN_CHUNK]`` is at least ``thr`` (a count over a slice of constant length, which
    LLVM vectorizes: 3 us for 20,000 float32 scores, where a loop over a range from ``j`` ran item by item, 26 us)."""
    chunk = row[j:j + SCAN_CHUNK]
    hits = 0
    for q in range(SCAN_CHUNK):
        if chunk[q] >= thr:
            hits += 1
    return hits > 0


@njit(cache=True, nogil=True)
def topn_rescore(S, rows, indptr, items, U, QT, base, tiekey, margin, out_items, out_scores):
    """Top ``n`` unseen items of each user ``rows[r]`` from her float32 score row ``S[r]``, rescored in float64.

    ``S[r, j]`` approximates ``base[j] + U[u] . QT[:, j]`` (``u = rows[r]``) to within
    ``margin[r] / 2`` (:func:`topn_blocked`). A first scan finds the ``n``-th best
    float32 score ``t`` of the user's unseen items; every unseen item with
    ``S[r, j] >= t - margin[r]`` (a superset of her true top ``n``) is rescored in
    float64 with the arithmetic of :func:`topn_scores` (the same products added in the
    same order) and inserted with its tie-break (``tiekey`` ascending), so the lists and
    scores are those of :func:`topn_scores`, bit for bit. A user's seen items are her
    CSR row ``items[indptr[u]:indptr[u + 1]]`` of the block's training ratings.

    Both scans pass a chunk of :data:`SCAN_CHUNK` items with one vectorized count when no score in it can enter
    (:func:`_chunk_reaches`: the first scan's once its list is full, against just above its last score; the second's
    against the candidates' bound), and test an item's score before looking up whether the user saw it. An item so
    passed is one the item-by-item scans skipped, seen or not, so the items inserted and their order are theirs.
    Measured at 20,000 items, one core, a tile of 2,000 users: 46-50 us a user before (the float32 scan 14 us, the
    candidates' 7 us, their reading of ``S`` from memory the rest), more than the sgemm's 22-43 us at k = 8 and 64.
    """
    n_items = S.shape[1]
    k = QT.shape[0]
    n = out_items.shape[1]
    seen = np.full(n_items, -1, np.int64)
    best = np.empty(n, np.int64)
    bscore = np.empty(n, np.float64)
    top = np.empty(n, np.float32)
    whole = n_items - n_items % SCAN_CHUNK  # the items in whole chunks
    for r in range(len(rows)):
        u = rows[r]
        for p in range(indptr[u], indptr[u + 1]):
            seen[items[p]] = u
        row = S[r]
        c = 0
        for j0 in range(0, n_items, SCAN_CHUNK):  # the n-th best float32 score, ties ignored
            # a full list takes only a score above its last: none in the chunk, nothing to do
            if c == n and j0 < whole and not _chunk_reaches(row, j0, np.nextafter(top[n - 1], np.float32(np.inf))):
                continue
            for j in range(j0, min(j0 + SCAN_CHUNK, n_items)):
                s = row[j]
                if c == n and s <= top[n - 1]:
                    continue
                if seen[j] == u:
                    continue
                if c == n:
                    p = n - 1
                else:
                    p = c
                    c += 1
                while p > 0 and s > top[p - 1]:
                    top[p] = top[p - 1]
                    p -= 1
                top[p] = s
        thr = -np.inf if c < n else np.float64(top[n - 1]) - margin[r]
        c = 0
        for j0 in range(0, n_items, SCAN_CHUNK):
            if j0 < whole and not _chunk_reaches(row, j0, thr):
                continue
            for j in range(j0, min(j0 + SCAN_CHUNK, n_items)):
                if row[j] >= thr and seen[j] != u:
                    sc = base[j]
                    for d in range(k):
                        sc += U[u, d] * QT[d, j]
                    c = _insert(j, sc, tiekey, c, n, best, bscore)
        for a in range(c):
            out_items[u, a] = best[a]
            out_scores[u, a] = bscore[a]


#: Bytes of one float32 score tile of :func:`topn_blocked` (users x items). Each tile's sgemm packs the whole item
#: side ``[Q, mu + b]`` again, so a tile of few users pays that copy more than its products: at 20,000 items and
#: k = 64 (one core, a quarter of a 20k-user block's users), 2 MiB (26 users a tile) 0.94-0.99 s, where OpenBLAS's
#: packing took twice its kernel's time in a profile; 4 MiB 0.71-0.85 s, 8 MiB 0.60-0.65 s, 12 MiB 0.57-0.64 s,
#: 32 MiB 0.73-0.76 s (the tile no longer in the cache).
TILE_BYTES = 8 << 20


def topn_prepare(Q, item_bias, global_mean):
    """The item side of :func:`topn_blocked`, computed once per model: ``(Q32, QT, base, bound_q, bound_b)``.

    ``[Q, mu + b]`` in float32 (the sgemm's right operand), ``Q.T`` in float64 (the
    rescoring's), ``mu + b`` in float64, and the per-column ``max |Q|`` and ``max |mu + b|``
    of the float32 error bound.
    """
    Q = np.asarray(Q, np.float64)
    n_items, k = Q.shape
    base = global_mean + np.asarray(item_bias, np.float64)  # as topn_scores forms it
    Q32 = np.empty((n_items, k + 1), np.float32)
    Q32[:, :k] = Q
    Q32[:, k] = base
    bound_q = np.abs(Q).max(axis=0) if n_items else np.zeros(k)
    bound_b = float(np.abs(base).max()) if n_items else 0.0
    return Q32, np.ascontiguousarray(Q.T), base, bound_q, bound_b


def topn_blocked(indptr, items, want, U, Q, item_bias, global_mean, tiekey, out_items, out_scores,
                 *, tile_bytes: int = TILE_BYTES, prepared=None):
    """:func:`topn_scores`'s lists and scores, bit for bit, scored as float32 matrix products.

    The wanted users are taken in tiles of ``max(1, tile_bytes // (4 n_items))`` rows:
    one BLAS ``sgemm`` scores a tile against every item (``[U, 1] @ [Q, mu + b].T``
    in float32), then :func:`topn_rescore` excludes each user's training items (the
    block's CSR rows), selects the candidates and rescores them in float64.

    **Ties and float32.** The float32 scores only choose candidates: with ``K`` the
    columns of ``[Q, 1]`` and ``A_u = sum_d |U[u, d]| max_j |Q[j, d]| + max_j |mu + b_j|``,
    a float32 score and the float64 one differ by at most ``(K + 4) 2^-24 A_u`` (input
    rounding and any order of summation); the margin is twice that bound on each side,
    so every item of the true top ``n`` is a candidate, whatever the ties. The order is
    then decided in float64, ties by ascending ``tiekey`` (the item's position in the
    released model, i.e. ascending item id), exactly as :func:`topn_scores` decides it.
    ``prepared``: :func:`topn_prepare` of ``(Q, item_bias, global_mean)``, computed once.
    """
    n_users = len(indptr) - 1
    out_items[:] = -1
    rows = np.flatnonzero(np.asarray(want)[:n_users]).astype(np.int64)
    n_items, k = Q.shape
    if not len(rows) or n_items == 0:
        return
    Q32, QT, base, bound_q, bound_b = topn_prepare(Q, item_bias, global_mean) if prepared is None else prepared
    bound = np.abs(U[rows]) @ bound_q + bound_b
    margin = 4.0 * (k + 5) * 2.0 ** -24 * bound
    step = max(1, int(tile_bytes) // (4 * n_items))
    U32 = np.ones((min(step, len(rows)), k + 1), np.float32)
    for s in range(0, len(rows), step):
        r = rows[s:s + step]
        t = U32[:len(r)]
        t[:, :k] = U[r]
        S = t @ Q32.T  # sgemm
        topn_rescore(S, r, indptr, items, U, QT, base, tiekey, margin[s:s + step], out_items, out_scores)


@njit(cache=True, nogil=True)
def topn_by_order(indptr, items, want, order, out_items):
    """Each wanted user's first ``n`` unseen items of the global ranking ``order`` (dense indices, best first).

    The most-popular baselines: ``order`` sorts the items by a count, descending.
    """
    n_items = len(order)
    n = out_items.shape[1]
    seen = np.full(n_items, -1, np.int64)
    for u in range(len(indptr) - 1):
        for a in range(n):
            out_items[u, a] = -1
        if want[u] == 0:
            continue
        for p in range(indptr[u], indptr[u + 1]):
            seen[items[p]] = u
        c = 0
        for q in range(n_items):
            if c == n:
                break
            j = order[q]
            if seen[j] != u:
                out_items[u, c] = j
                c += 1


#: The per-block sums :func:`ranking_sums` accumulates, in order: the users measured, the sums of their
#: per-user metrics, the sums of their squares (the sampling error), and every user with a relevant item.
SUMS = ("users", "precision", "recall", "ndcg", "map", "popularity",
        "precision_sq", "recall_sq", "ndcg_sq", "map_sq", "relevant_users")


@njit(cache=True, nogil=True)
def ranking_sums(lists, test_indptr, test_items, test_ratings, threshold, pop, want, sums, covered):
    """Accumulate the ranking metrics of ``lists`` against each user's relevant held-out items.

    A user's relevant items are her test items rated ``>= threshold``; a user with none
    is skipped; so is a user with ``want[u] == 0`` (outside the sample), who is only
    counted in ``relevant_users`` when she has a relevant item. For the others, with
    ``k = lists.shape[1]``, ``h`` the hits in the list
    and ``R`` the relevant count: precision ``h / k``, recall ``h / R``, NDCG
    ``sum_hits 1/log2(rank + 1) / sum_{i <= min(R, k)} 1/log2(i + 1)``, average
    precision ``sum_hits P@rank / min(R, k)``, popularity the mean ``pop`` of the
    listed items. ``sums`` (float64, :data:`SUMS` order: the sums, then the sums of
    squares of precision, recall, NDCG and AP) and ``covered`` (per item, how many lists
    hold it) are accumulated into.
    """
    k = lists.shape[1]
    rel = np.full(len(pop), -1, np.int64)
    for u in range(len(test_indptr) - 1):
        nrel = 0
        for p in range(test_indptr[u], test_indptr[u + 1]):
            if test_ratings[p] >= threshold:
                rel[test_items[p]] = u
                nrel += 1
        if nrel == 0:
            continue
        sums[10] += 1.0
        if want[u] == 0:
            continue
        hits = 0
        dcg = 0.0
        ap = 0.0
        psum = 0.0
        listed = 0
        for a in range(k):
            j = lists[u, a]
            if j < 0:
                break
            listed += 1
            psum += pop[j]
            covered[j] += 1.0
            if rel[j] == u:
                hits += 1
                dcg += 1.0 / np.log2(a + 2.0)
                ap += hits / (a + 1.0)
        idcg = 0.0
        for a in range(min(nrel, k)):
            idcg += 1.0 / np.log2(a + 2.0)
        prec = hits / k
        rec = hits / nrel
        nd = dcg / idcg
        av = ap / min(nrel, k)
        sums[0] += 1.0
        sums[1] += prec
        sums[2] += rec
        sums[3] += nd
        sums[4] += av
        if listed > 0:
            sums[5] += psum / listed
        sums[6] += prec * prec
        sums[7] += rec * rec
        sums[8] += nd * nd
        sums[9] += av * av


def topn_reference(seen_rows, scores, tiekey, n):
    """NumPy reference of :func:`topn_scores` / :func:`topn_by_order`: per user, unseen items sorted by
    ``(-score, tiekey)``, the first ``n``, padded with ``-1``."""
    out = np.full((len(seen_rows), n), -1, np.int64)
    for u, seen in enumerate(seen_rows):
        cand = np.setdiff1d(np.arange(scores.shape[1]), np.asarray(seen, np.int64))
        order = cand[np.lexsort((tiekey[cand], -scores[u, cand]))][:n]
        out[u, :len(order)] = order
    return out
