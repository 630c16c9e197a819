"""The item side of one ALS iteration over a user block: clipped user rows, targets, sums; the EM of the item
biases' prior (:func:`grid_em`).

:func:`training_residuals` forms a block's training ratings and residuals (the user
solves' input) in one pass.

After each user of a block has solved their own row ``[u_i, c_i]`` (factor and
intercept) against the released item factors
(:func:`streamdp.kernels.linalg.solve_users_huber`, the same kernel a user's device
runs), :func:`als_accumulate` forms what the item solve needs, for the block's
bounded ratings only (weight ``w_p = 0`` drops a rating from the item side; the user
side always sees all of them):

* ``x_i = u_i min(1, clip / ||u_i||)`` (followed by ``beta`` when the item biases are
  fitted jointly, ``B.shape[1] == k + 1``);
* ``y_p = clip(target_p - c_i, -R, R)``, the rating's residual after the user's own
  intercept, clipped so that one user's contribution is bounded;
* ``B[j] += w_p y_p x_i`` (right-hand sides of the item solves);
* with ``A`` non-empty, ``A[j] += w_p x_i x_i^T`` (per-item Gramians, upper triangle
  packed row by row: entry ``(a, b), a <= b`` at ``a d - a (a - 1) / 2 + b - a``);
* with ``S`` non-empty, ``S += x_i x_i^T`` once per user (the users' shared Gramian;
  upper triangle only, :func:`symmetrize_upper` completes it).

One user's contribution to ``B`` has L2 norm ``<= R ||x|| ||w_i||_2`` and L1 norm
``<= R ||x||_1 ||w_i||_1``; to ``A`` (packed) ``<= ||x||^2 ||w_i||_2`` in L2; to ``S``
``<= ||x||^2``. :mod:`streamdp.methods.als` turns these into the released
sensitivities. Raw arrays in, preallocated outputs accumulated into; float64. The rows
are clipped without ``fastmath``; the sums' kernels (shared with ials) let multiply-adds
fuse (``contract``: FMA only, no reassociation), which changes the rounding of the sums,
never a clipped value (the residual's clip is a subtraction, a ``max`` and a ``min``).
"""

from __future__ import annotations

import numpy as np
from streamdp.kernels.jit import njit

from streamdp.kernels.lanes import vfma, vfma1, vload, vsplat, vstore


@njit(cache=True, nogil=True)
def training_residuals(indptr, items, ratings, v, start, lo, hi, mu, bias, with_target, tr_indptr, tr_items, resid,
                       target):
    """A block's training ratings and their residuals in one pass; returns their number.

    User ``u``'s ratings at offsets ``(start[u] + j (n // v[u])) % n``, ``j < v[u]``, are held
    out (:func:`streamdp.kernels.csr.holdout_strided`'s rule; ``v`` empty: none); the rest
    are written in order: ``tr_indptr`` (``n_users + 1``), their items ``tr_items`` and
    ``resid = clip(r, lo, hi) - mu - bias[j]`` (``lo``, ``hi`` float32: the rating is
    clipped in float32, then widened, as ``np.clip`` and
    :func:`streamdp.kernels.linalg.residuals` in turn), and with ``with_target``
    ``target = resid + bias[j]``. The same bits as that copy, clip, residual and sum, with
    one read of the block and no array of its own. The copy loops index by unsigned integers (a signed index is
    checked for wrapping around at each access): a 1M-rating block 2.17 -> 1.23 ms, one core.
    """
    hold = len(v) > 0
    cap = 1
    if hold:
        for u in range(len(indptr) - 1):
            cap = max(cap, v[u])
    held = np.empty(cap + 1, dtype=np.int64)
    a = 0
    tr_indptr[0] = 0
    for u in range(len(indptr) - 1):
        s = indptr[u]
        n = indptr[u + 1] - s
        k = v[u] if hold else 0
        if k > 0:  # distinct offsets (j (n // k) < n), sorted here: the kept runs between them are copied
            step = n // k
            for j in range(k):
                h = s + (start[u] + j * step) % n
                i = j
                while i > 0 and held[i - 1] > h:
                    held[i] = held[i - 1]
                    i -= 1
                held[i] = h
        held[k] = s + n
        p = s
        for j in range(k + 1):
            q = held[j]
            src, dst = np.uint64(p), np.uint64(a)  # unsigned: no check of each index for wrapping around
            if with_target:
                for i in range(np.uint64(q - p)):
                    it = items[src + i]
                    b = bias[np.uint64(it)]
                    x = min(max(ratings[src + i], lo), hi) - mu - b
                    tr_items[dst + i] = it
                    resid[dst + i] = x
                    target[dst + i] = x + b
            else:
                for i in range(np.uint64(q - p)):
                    it = items[src + i]
                    tr_items[dst + i] = it
                    resid[dst + i] = min(max(ratings[src + i], lo), hi) - mu - bias[np.uint64(it)]
            a += q - p
            p = q + 1
        tr_indptr[u + 1] = a
    return a


@njit(cache=True, nogil=True)
def _pairwise_clipped(r, s0, n, lo, hi):
    """``sum(clip(float64(r[s0:s0 + n]), lo, hi))`` added in NumPy's pairwise order (its ``pairwise_sum``: runs of
    eight partial sums up to 128 values, halves above), so that :func:`user_means` gives ``np.add.reduceat``'s bits.

    The eight partial sums are eight scalars (an array of eight, allocated per call, took half the statistics
    pass's time for the users' means: 1.1-1.3 -> 0.6 ms a 0.94M-rating block, one core) and the indices unsigned
    (no check of each for wrapping around); the same additions in the same order."""
    if n < 8:
        acc = -0.0
        for p in range(np.uint64(s0), np.uint64(s0 + n)):
            acc += _clipped(r, p, lo, hi)
        return acc
    if n <= 128:
        q = np.uint64(s0)
        a0, a1, a2, a3 = _clipped(r, q, lo, hi), _clipped(r, q + 1, lo, hi), _clipped(r, q + 2, lo, hi), \
            _clipped(r, q + 3, lo, hi)
        a4, a5, a6, a7 = _clipped(r, q + 4, lo, hi), _clipped(r, q + 5, lo, hi), _clipped(r, q + 6, lo, hi), \
            _clipped(r, q + 7, lo, hi)
        i = 8
        while i < n - n % 8:
            q = np.uint64(s0 + i)
            a0 += _clipped(r, q, lo, hi)
            a1 += _clipped(r, q + 1, lo, hi)
            a2 += _clipped(r, q + 2, lo, hi)
            a3 += _clipped(r, q + 3, lo, hi)
            a4 += _clipped(r, q + 4, lo, hi)
            a5 += _clipped(r, q + 5, lo, hi)
            a6 += _clipped(r, q + 6, lo, hi)
            a7 += _clipped(r, q + 7, lo, hi)
            i += 8
        acc = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
        while i < n:
            acc += _clipped(r, np.uint64(s0 + i), lo, hi)
            i += 1
        return acc
    n2 = n // 2
    n2 -= n2 % 8
    return _pairwise_clipped(r, s0, n2, lo, hi) + _pairwise_clipped(r, s0 + n2, n - n2, lo, hi)


@njit(cache=True, nogil=True, inline="always")
def _clipped(r, p, lo, hi):
    """``r[p]`` widened to float64 and clipped to ``[lo, hi]`` (``p`` unsigned)."""
    return min(max(np.float64(r[p]), lo), hi)


@njit(cache=True, nogil=True)
def user_mean(r, s0, n, lo, hi):
    """The mean of ``clip(float64(r[s0:s0 + n]), lo, hi)`` (``n >= 1``) with the bits of ``np.add.reduceat`` over the
    widened, clipped copy divided by ``n``: the first value, plus the pairwise sum of the rest (how a reduction
    starts from its first element)."""
    first = min(max(np.float64(r[s0]), lo), hi)
    if n == 1:
        return first / n
    return (first + _pairwise_clipped(r, s0 + 1, n - 1, lo, hi)) / n


@njit(cache=True, nogil=True)
def clipped_user_sums(indptr, x, h, sx, sxx):
    """Each user's sum of her values clipped to ``[-h, h]`` and of their squares, in order (the bits of
    ``bincount(users, clip(x, -h, h))`` and of its squares), into ``sx`` and ``sxx``: the per-user sums of
    :func:`streamdp.methods.als.offset_moments` without a user index, a clipped copy and a square per rating."""
    base = indptr[0]
    for u in range(len(indptr) - 1):
        a = 0.0
        aa = 0.0
        for p in range(indptr[u] - base, indptr[u + 1] - base):
            v = min(max(x[p], -h), h)
            a += v
            aa += v * v
        sx[u] = a
        sxx[u] = aa


def clipped_user_sums_reference(indptr, x, h):
    """The NumPy form of :func:`clipped_user_sums`: ``(sx, sxx)`` by two weighted bincounts."""
    cnt = np.diff(np.asarray(indptr, np.int64))
    users = np.repeat(np.arange(len(cnt)), cnt)
    c = np.clip(np.asarray(x, np.float64), -h, h)
    return np.bincount(users, c, minlength=len(cnt)), np.bincount(users, c * c, minlength=len(cnt))


@njit(cache=True, nogil=True)
def statistic_sums(indptr, items, r, lo, hi, wu, w, wt, c, centre, centre_ones, carried_on, tilted, n, out, umean):
    """The item statistics of a block's training ratings, added into ``out`` in one pass (the statistics pass of
    :mod:`streamdp.methods.als`; it computed them as NumPy temporaries and ``np.bincount``, the same bits):

    * ``umean[i]``: user ``i``'s mean of her ratings widened to float64 and clipped to ``[lo, hi]``
      (:func:`user_mean`; 0 for a user with none);
    * ``out[j] += w_p e_p``, ``e_p = clip(r_p - umean_i, -c, c)`` the rating's residual against its user's mean
      (``clip(r_p - centre, -c, c)`` for a user with one rating, where ``centre_ones``);
    * ``out[n + j] += w_p a_i``, ``a_i = 1 - 1 / n_i`` where ``carried_on`` (the share of the item's offset a
      residual centred on its user's mean carries), else ``1``;
    * with ``tilted``, ``out[2 n + 2 + j] += wt_p a_i``.

    ``w_p`` is ``w[p]`` (one weight per rating), or where ``w`` is empty ``wu[i]``, one per user (the adaptive
    rule's weights without item counts, :func:`streamdp.privacy.bounding.adaptive_user_weights`: no array of
    per-rating weights). ``r`` is the block's ratings as stored (float32), widened and clipped here. ``n = 0``:
    the users' means only. Each sum runs over the ratings in order, as ``np.bincount`` adds its weights; a
    product is rounded once, as NumPy's elementwise multiply rounds it."""
    per_rating = len(w) > 0
    nu, tu = np.uint64(n), np.uint64(2 * n + 2)
    for u in range(len(indptr) - 1):
        s0 = indptr[u]
        e0 = indptr[u + 1]
        cnt = e0 - s0
        if cnt == 0:
            umean[u] = 0.0
            continue
        mean = user_mean(r, s0, cnt, lo, hi)
        umean[u] = mean
        if n == 0:
            continue
        m = centre if centre_ones and cnt == 1 else mean
        a = 1.0 - 1.0 / max(cnt, 1) if carried_on else 1.0
        wi = 0.0 if per_rating else wu[u]
        for p in range(np.uint64(s0), np.uint64(e0)):  # unsigned: no index checked for wrapping around (-20%)
            e = min(max(np.float64(r[p]), lo), hi) - m
            e = min(max(e, -c), c)
            j = np.uint64(items[p])
            wp = w[p] if per_rating else wi
            out[j] += wp * e
            out[nu + j] += wp * a
            if tilted:
                out[tu + j] += wt[p] * a


@njit(cache=True, nogil=True)
def packed_index(a, b, d):
    """Position of entry ``(a, b)``, ``a <= b``, in a row-by-row packed upper triangle of a ``d x d`` matrix."""
    return a * d - (a * (a - 1)) // 2 + (b - a)


@njit(cache=True, nogil=True)
def clip_row(U, u, k, clip, x):
    """``x[:k] = U[u, :k] min(1, clip / ||U[u, :k]||)``; returns 1 when the row was clipped, else 0."""
    nrm = 0.0
    for a in range(k):
        nrm += U[u, a] * U[u, a]
    nrm = np.sqrt(nrm)
    f = 1.0
    hit = 0
    if nrm > clip:
        f = clip / nrm * (1.0 - 2.0 ** -40)  # rounding cannot take the clipped norm past clip
        hit = 1
    for a in range(k):
        x[a] = U[u, a] * f
    return hit


@njit(cache=True, nogil=True)
def clipped_rows(indptr, U, k, clip, X):
    """``X[u, :k]``: user ``u``'s row clipped to norm ``clip`` (:func:`clip_row`), users with ratings only; returns
    the number of clipped users. ``X``'s other columns are left to the caller."""
    x = np.empty(k, dtype=np.float64)
    clipped = 0
    for u in range(len(indptr) - 1):
        if indptr[u + 1] == indptr[u]:
            continue
        clipped += clip_row(U, u, k, clip, x)
        for a in range(k):
            X[u, a] = x[a]
    return clipped


@njit(cache=True, nogil=True)
def pairs_by_item(indptr, items, weights, bsrc, shift, R, asrc, a_one, n_items, per_user=False):
    """The block's pairs of nonzero weight grouped by item (counting sort), with what the item side adds per pair:
    ``(start (n_items + 1), user (int32), bw, aw)``, ``bw = w b`` with ``b = clip(bsrc_p - shift_u, -R, R)`` (as
    :func:`accumulate_rhs`), ``aw = w`` (``a_one``) or ``w (asrc_p - 1)``.

    The weights are formed in the users' order (sequential reads of ``weights``, ``bsrc``,
    ``asrc``) and stored beside the user in the item order, so that
    :func:`accumulate_by_item` reads them sequentially, where looking them up by pair
    index from the item order is a random read per pair. ``per_user``: ``weights`` holds one weight per user
    (each of her pairs weighs it), as in :func:`item_side_sums`.
    """
    start = np.zeros(n_items + 1, dtype=np.int64)
    for u in range(len(indptr) - 1):
        for p in range(indptr[u], indptr[u + 1]):
            if (weights[u] if per_user else weights[p]) != 0.0:
                start[items[p] + 1] += 1
    for j in range(n_items):
        start[j + 1] += start[j]
    fill = start[:-1].copy()
    m = start[n_items]
    user = np.empty(m, dtype=np.int32)
    bw = np.empty(m, dtype=np.float64)
    aw = np.empty(m, dtype=np.float64)
    for u in range(len(indptr) - 1):
        c = shift[u]
        for p in range(indptr[u], indptr[u + 1]):
            w = weights[u] if per_user else weights[p]
            if w != 0.0:
                j = items[p]
                q = fill[j]
                user[q] = u
                bw[q] = w * min(max(bsrc[p] - c, -R), R)
                aw[q] = w if a_one else w * (asrc[p] - 1.0)
                fill[j] = q + 1
    return start, user, bw, aw


@njit(cache=True, nogil=True, fastmath={"contract"})
def accumulate_by_item(start, user, bw, aw, X, B, A):
    """``B_j += bw_q x_u[:k]`` and ``A_j += aw_q x_u x_u^T`` (packed) over each item's pairs ``q``, eight per sweep.

    The item side of als (``bw = w y``, the weighted clipped residual, ``aw = w``) and of
    ials (``bw = w c``, ``aw = w (c - 1)``), one implementation. ``(start, user, bw, aw)``
    from :func:`pairs_by_item`; ``X`` the block's clipped user rows (``n_users x d``), ``B``
    ``(n_items, k)``, ``k <= d``, ``A`` ``(n_items, d (d + 1) / 2)`` or empty.
    An item's ``A_j`` row (``d (d + 1) / 2`` doubles, 16 KB at ``d = 64``) stays in cache
    while all of the block's pairs of that item are added to it; per pair in the users'
    order, every pair reaches a different row of an ``A`` far larger than the caches
    (33 MB for 2,000 items). Measured on a 1M-pair block at k=64 (busy machine): per pair
    in the users' order 8.5-9.2 s; item by item two / four / eight pairs per sweep 1.23 /
    0.73 / 0.57 s (each entry of ``A_j`` loaded and stored once per eight multiply-adds).
    Missing pairs of the last sweep are repeats of its first with weight 0 (exact zeros).
    Multiply-adds may fuse (``contract``: FMA only, no reassociation).
    """
    d = X.shape[1]
    k = B.shape[1]
    do_a = A.shape[0] > 0
    us = np.empty(8, dtype=np.int64)
    b8 = np.empty(8, dtype=np.float64)
    a8 = np.empty(8, dtype=np.float64)
    for j in range(len(start) - 1):
        q = start[j]
        e = start[j + 1]
        while q < e:
            for r in range(8):
                if q + r < e:
                    us[r] = user[q + r]
                    b8[r] = bw[q + r]
                    a8[r] = aw[q + r]
                else:
                    us[r] = user[q]
                    b8[r] = 0.0
                    a8[r] = 0.0
            u0, u1, u2, u3, u4, u5, u6, u7 = us[0], us[1], us[2], us[3], us[4], us[5], us[6], us[7]
            for a in range(k):
                B[j, a] += (b8[0] * X[u0, a] + b8[1] * X[u1, a] + b8[2] * X[u2, a] + b8[3] * X[u3, a]
                            + b8[4] * X[u4, a] + b8[5] * X[u5, a] + b8[6] * X[u6, a] + b8[7] * X[u7, a])
            if do_a:
                off = 0
                for a in range(d):
                    f0 = a8[0] * X[u0, a]
                    f1 = a8[1] * X[u1, a]
                    f2 = a8[2] * X[u2, a]
                    f3 = a8[3] * X[u3, a]
                    f4 = a8[4] * X[u4, a]
                    f5 = a8[5] * X[u5, a]
                    f6 = a8[6] * X[u6, a]
                    f7 = a8[7] * X[u7, a]
                    base = off - a
                    for b in range(a, d):
                        A[j, base + b] += (f0 * X[u0, b] + f1 * X[u1, b] + f2 * X[u2, b] + f3 * X[u3, b]
                                           + f4 * X[u4, b] + f5 * X[u5, b] + f6 * X[u6, b] + f7 * X[u7, b])
                    off += d - a
            q += 8


@njit(cache=True, nogil=True, fastmath={"contract"})
def gramian_upper(X, G):
    """``G += X^T X`` on the upper triangle, four rows of ``X`` per sweep of ``G`` (zero rows add exact zeros)."""
    n, d = X.shape
    u = 0
    while u + 3 < n:
        for a in range(d):
            x0, x1, x2, x3 = X[u, a], X[u + 1, a], X[u + 2, a], X[u + 3, a]
            for b in range(a, d):
                G[a, b] += x0 * X[u, b] + x1 * X[u + 1, b] + x2 * X[u + 2, b] + x3 * X[u + 3, b]
        u += 4
    while u < n:
        for a in range(d):
            xa = X[u, a]
            for b in range(a, d):
                G[a, b] += xa * X[u, b]
        u += 1


#: Largest ``A`` + ``B`` (bytes) that :func:`accumulate_by_user` takes in the users' order; larger ones go item by
#: item. Measured at 10M ratings, one core (32 MB L3): 3.1x the item order at k = 8 (7 MB), 1.4x at k = 16 (27 MB),
#: even at k = 8 with 100k items (43 MB), 0.8x at k = 24 (45 MB) and at 400k items.
USER_ORDER_BYTES = 32 * 2 ** 20


@njit(cache=True, nogil=True, fastmath={"contract"})
def accumulate_by_user(indptr, items, weights, bsrc, shift, R, asrc, a_one, X, B, A, per_user=False):
    """``B_j += w_p b_p x_u[:k]`` and ``A_j += aw_p x_u x_u^T`` (packed) in the users' order.

    ``b_p = clip(bsrc_p - shift_u, -R, R)``, ``aw_p = w_p`` (``a_one``) or ``w_p (asrc_p - 1)``,
    as :func:`pairs_by_item`. als: ``bsrc`` the targets, ``shift`` the users' intercepts,
    ``R`` the residual clip; ials: ``bsrc = asrc`` the confidences, ``shift`` zeros,
    ``R = inf`` (then the factor is ``w c`` exactly). Each user's row ``x_u`` and its packed
    outer product are formed once, so a pair costs one scaled add of each into item ``j``'s
    rows: no sort, no gather of a row per pair. Fast while ``B`` and ``A`` stay in cache
    (:data:`USER_ORDER_BYTES`); :func:`accumulate_by_item` otherwise. Pairs of weight 0 are
    skipped (they add exact zeros). ``A_j`` gets ``aw (x_a x_b)`` where the item order adds
    ``(aw x_a) x_b``: the same sum up to rounding. ``per_user``: one weight per user (:func:`item_side_sums`).
    """
    d = X.shape[1]
    k = B.shape[1]
    m = d * (d + 1) // 2
    x = np.empty(d, dtype=np.float64)
    P = np.empty(m, dtype=np.float64)
    for u in range(len(indptr) - 1):
        s = indptr[u]
        e = indptr[u + 1]
        if s == e:
            continue
        for a in range(d):
            x[a] = X[u, a]
        q = 0
        for a in range(d):
            for b in range(a, d):
                P[q] = x[a] * x[b]
                q += 1
        c = shift[u]
        for p in range(s, e):
            w = weights[u] if per_user else weights[p]
            if w == 0.0:
                continue
            j = np.uint64(items[p])
            f = w * min(max(bsrc[p] - c, -R), R)
            for a in range(k):
                B[j, a] += f * x[a]
            g = w if a_one else w * (asrc[p] - 1.0)
            for q in range(m):
                A[j, q] += g * P[q]


@njit(cache=True, nogil=True, fastmath={"contract"})
def accumulate_rhs(indptr, items, weights, bsrc, shift, R, X, B, per_user=False):
    """``B_j += w_p clip(bsrc_p - shift_u, -R, R) x_u[:k]`` in the users' order, two pairs per step.

    als: ``bsrc`` the targets, ``shift`` the users' intercepts, ``R`` the residual clip;
    ials: ``bsrc`` the confidences, ``shift`` zeros, ``R = inf`` (then the factor is
    ``w c`` exactly). Without per-item Gramians ``B`` (``n_items x k``, megabytes) stays in
    cache and each user's row is read once, where the item order gathers a row per pair.
    The user's row is copied to a scratch vector once, so the inner loops read it without
    Numba's view of ``X`` (measured at k = 8, 10M ratings, one core: 1.9x the per-pair
    loop with the clip and the row read in it). A pair of weight 0 adds exact zeros.
    ``B`` of 8 or 9 columns (k = 8) takes :func:`_rhs_registers`: the same bits. ``per_user``: one weight per user
    (:func:`item_side_sums`).
    """
    k = B.shape[1]
    if k == 8 or k == 9:
        _rhs_registers(indptr, items, weights, bsrc, shift, R, X, B, per_user)
        return
    x = np.empty(k, dtype=np.float64)
    for u in range(len(indptr) - 1):
        c = shift[u]
        wu = weights[u] if per_user else 0.0
        for a in range(k):
            x[a] = X[u, a]
        p = indptr[u]
        e = indptr[u + 1]
        while p + 1 < e:
            f0 = (wu if per_user else weights[p]) * min(max(bsrc[p] - c, -R), R)
            f1 = (wu if per_user else weights[p + 1]) * min(max(bsrc[p + 1] - c, -R), R)
            j0 = np.uint64(items[p])
            j1 = np.uint64(items[p + 1])
            for a in range(k):
                B[j0, a] += f0 * x[a]
            for a in range(k):
                B[j1, a] += f1 * x[a]
            p += 2
        if p < e:
            f0 = (wu if per_user else weights[p]) * min(max(bsrc[p] - c, -R), R)
            j0 = np.uint64(items[p])
            for a in range(k):
                B[j0, a] += f0 * x[a]


@njit(cache=True, nogil=True)
def _rhs_registers(indptr, items, weights, bsrc, shift, R, X, B, per_user):
    """:func:`accumulate_rhs` for ``B`` of 8 or 9 columns: ``B_j[0:8] += f x_u[0:8]`` as one vector multiply-add.

    The user's first eight coordinates are one ``<8 x double>`` (:mod:`streamdp.kernels.lanes`) and each pair
    does one vector load, fused multiply-add and store into ``B_j`` (the ninth column a scalar fused
    multiply-add); the pair index is unsigned, so no negative-index wraparound is computed per access. Scalar
    code (the row in nine scalars) ran a pair at 3.7-4.4 ns, nearly as fast at 2,000 items as at 20,000: Numba
    does not SLP-vectorize, so the nine adds stayed nine loads and stores. Measured on 10.9M pairs, 20,000
    power-law items, one core, CPU time: 4.4 -> 2.8 ns per pair at 9 columns (3.5 ns with signed indices).
    The same sums in the same order, each a fused multiply-add as ``contract`` gave the scalar loop: the same
    bits (tests/kernels/test_als_kernels.py).
    """
    nine = B.shape[1] == 9
    for u in range(len(indptr) - 1):
        c = shift[u]
        wu = weights[u] if per_user else 0.0
        xv = vload(X, (u,))
        x8 = X[u, 8] if nine else 0.0
        for p in range(np.uint64(indptr[u]), np.uint64(indptr[u + 1])):  # unsigned: no negative-index wraparound
            f = (wu if per_user else weights[p]) * min(max(bsrc[p] - c, -R), R)
            j = np.uint64(items[p])
            vstore(B, (j,), vfma(vsplat(f), xv, vload(B, (j,))))
            if nine:
                B[j, 8] = vfma1(f, x8, B[j, 8])


#: Users per chunk of clipped rows in the users' order (:func:`als_accumulate`, ``ials_accumulate``): a multiple
#: of 4 (:func:`gramian_upper`'s grouping, so the same bits as one chunk). The rows of a chunk stay in cache between
#: the Gramian and the pairs, where a block's whole ``n_users x d`` array (27 MB at 200,000 users, k = 16) went
#: to memory and back: measured on 10M ratings, one core, k = 16 shared Gramian 1.24x (docs/benchmarks.md).
USER_CHUNK = 1024


@njit(cache=True, nogil=True)
def user_order_sums(indptr, items, weights, bsrc, shift, R, asrc, a_one, X, B, A, S, per_user=False):
    """A chunk of users' item-side sums in the users' order: ``S += X^T X`` (upper, ``S`` non-empty, by
    :func:`gramian_upper`), then ``B`` and ``A`` by :func:`accumulate_by_user` (``A`` non-empty) or ``B`` alone by
    :func:`accumulate_rhs`; the arguments as theirs (``X``, ``shift`` the chunk's rows)."""
    if S.shape[0] > 0:
        gramian_upper(X, S)
    if A.shape[0] > 0:
        accumulate_by_user(indptr, items, weights, bsrc, shift, R, asrc, a_one, X, B, A, per_user)
    else:
        accumulate_rhs(indptr, items, weights, bsrc, shift, R, X, B, per_user)


@njit(cache=True, nogil=True)
def als_accumulate(indptr, items, target, weights, U, clip, R, beta, B, A, S, per_user=False):
    """Accumulate one block's item-side sums (see the module docstring); returns the number of clipped users.

    ``U`` is ``(n_users, k + 1)`` (factor, intercept), ``target`` the ratings minus
    the global mean and the item bias (minus the global mean only when the item bias is
    refitted as ``x``'s last coordinate), ``weights`` one per rating (0: not on the item
    side), or with ``per_user`` one per user, the weight of each of her ratings (the adaptive rule without item
    counts, :func:`streamdp.privacy.bounding.adaptive_user_weights`: the same products, no per-rating array).
    ``B`` is ``(n_items, d)`` with ``d = k`` or ``k + 1`` (then ``x`` ends with ``beta``),
    ``A`` ``(n_items, d (d + 1) / 2)`` or empty, ``S`` ``(d, d)`` or empty.

    The clipped rows ``x_u`` are formed first (a chunk of :data:`USER_CHUNK` users at a time in
    the users' order, the same bits as all at once; the whole block item by item), then the sums are taken
    by the kernels ials shares (the residuals clipped on the way): ``S`` by :func:`gramian_upper`; ``B``
    and ``A`` in the users' order while they fit in cache (:func:`accumulate_by_user`,
    :data:`USER_ORDER_BYTES`), item by item beyond (:func:`accumulate_by_item`, eight pairs
    per sweep of ``A_j``); without ``A``, ``B`` in the users' order (:func:`accumulate_rhs`).
    Each output entry is the same sum of the same products as in one pass per rating; only
    the rounding differs (multiply-adds fused, ``w (x_a x_b)`` or eight pairs summed before
    they are added): within ``1e-12`` relative of that order.
    """
    k = U.shape[1] - 1
    shift = np.ascontiguousarray(U[:, k])
    return item_side_sums(indptr, items, weights, target, shift, R, target, True, U, k, B.shape[1], clip, True, beta,
                          B, A, S, per_user)


@njit(cache=True, nogil=True)
def item_side_sums(indptr, items, weights, bsrc, shift, R, asrc, a_one, U, k, d, clip, last_is_beta, last, B, A, S,
                   per_user=False):
    """The item side of als and ials, one implementation: rows clipped, then the sums; returns the clipped users.

    Row ``x_u`` (``d`` wide): ``U[u, :k]`` clipped to norm ``clip`` (:func:`clipped_rows`), and with
    ``d > k`` a last coordinate ``last`` (``last_is_beta``: als's ``beta``) or ``U[u, k]`` clipped
    to ``[-last, last]`` (ials's popularity weight). The pairs' arguments as
    :func:`accumulate_by_user`'s. In the users' order the rows are formed :data:`USER_CHUNK`
    users at a time and summed by :func:`user_order_sums` (the same bits as all at once);
    item by item (``A`` past :data:`USER_ORDER_BYTES`) the whole block's rows first. ``per_user``: ``weights``
    holds one weight per user, each of her pairs weighing it (where a per-rating array would repeat it: the same
    products, without writing and reading 8 bytes a rating).
    """
    n_u = len(indptr) - 1
    by_item = A.shape[0] > 0 and (A.size + B.size) * 8 > USER_ORDER_BYTES
    chunk = n_u if by_item else min(n_u, USER_CHUNK)
    X = np.empty((chunk, d), dtype=np.float64)
    clipped = 0
    for c0 in range(0, n_u, max(chunk, 1)):
        c1 = min(n_u, c0 + chunk)
        ipc = indptr[c0:c1 + 1]
        Xc = X[:c1 - c0]
        Xc[:] = 0.0
        clipped += clipped_rows(ipc, U[c0:c1], k, clip, Xc)
        if d > k:
            for u in range(c1 - c0):
                if ipc[u + 1] > ipc[u]:
                    Xc[u, k] = last if last_is_beta else min(max(U[c0 + u, k], -last), last)
        if by_item:
            if S.shape[0] > 0:
                gramian_upper(Xc, S)
            start, user, bw, aw = pairs_by_item(ipc, items, weights, bsrc, shift, R, asrc, a_one, B.shape[0], per_user)
            accumulate_by_item(start, user, bw, aw, Xc, B, A)
        else:
            wc = weights[c0:c1] if per_user else weights
            user_order_sums(ipc, items, wc, bsrc, shift[c0:c1], R, asrc, a_one, Xc, B, A, S, per_user)
    return clipped



def symmetrize_upper(S):
    """The symmetric matrix whose upper triangle (diagonal included) is ``S``'s."""
    return np.triu(S) + np.triu(S, 1).T


def unpack_upper(P, d):
    """``(n, d (d + 1) / 2)`` packed upper triangles -> ``(n, d, d)`` symmetric matrices (NumPy)."""
    iu = np.triu_indices(d)
    out = np.zeros(P.shape[:-1] + (d, d))
    out[..., iu[0], iu[1]] = P
    out[..., iu[1], iu[0]] = P
    return out


def als_accumulate_reference(indptr, items, target, weights, U, clip, R, beta, d, n_items):
    """NumPy reference of :func:`als_accumulate`: ``(B, A (n, d, d), S)``."""
    k = U.shape[1] - 1
    n_u = len(indptr) - 1
    rows = np.repeat(np.arange(n_u), np.diff(indptr))
    nrm = np.linalg.norm(U[:, :k], axis=1)
    X = U[:, :k] * np.where(nrm > clip, clip / np.maximum(nrm, 1e-300) * (1.0 - 2.0 ** -40), 1.0)[:, None]
    if d > k:
        X = np.hstack([X, np.full((n_u, 1), beta)])
    y = np.clip(target - U[rows, k], -R, R)
    B = np.zeros((n_items, d))
    np.add.at(B, items, (weights * y)[:, None] * X[rows])
    A = np.zeros((n_items, d, d))
    np.add.at(A, items, weights[:, None, None] * X[rows][:, :, None] * X[rows][:, None, :])
    has = np.diff(indptr) > 0
    S = X[has].T @ X[has]
    return B, A, S


@njit(cache=True, nogil=True)
def grid_em(L, iters, w):
    """``iters`` EM steps of a mixture on a grid, in place on its weights ``w``: ``w_k <- w_k mean_i L_ik / f_i``,
    ``f_i = sum_k L_ik w_k + 1e-300`` (the item biases' prior of true totals,
    :func:`streamdp.methods._biases._total_prior`).

    ``L`` (``(n, m)``, float64) is a likelihood matrix whose nonzero entries in each row form one run (a
    Gaussian's, which underflows to exactly 0 beyond about 38.6 standard deviations): each step visits those runs
    only. On a store whose totals dwarf their noise the grid is coarser than the noise and a run is a few points
    of the 512 (a generated 1M-user x 20k-item store: 13-20), and the prior took 0.03-0.05 s with the matrix's
    own computation, against 0.31-0.36 s as two dense matrix-vector products a step on one core (its fit, which
    computes the prior twice: 3.13-3.29 s -> 2.41-2.68 s, the model the same bit for bit). The same sums as the
    dense form up to their order: a step differs from it in the last bits (the test bounds the weights' relative
    difference after 200 steps by 1e-12).
    """
    n, m = L.shape
    lo = np.zeros(n, np.int64)
    hi = np.zeros(n, np.int64)
    for i in range(n):
        a = 0
        while a < m and L[i, a] == 0.0:
            a += 1
        b = m
        while b > a and L[i, b - 1] == 0.0:
            b -= 1
        lo[i] = a
        hi[i] = b
    g = np.empty(m)
    for _ in range(iters):
        g[:] = 0.0
        for i in range(n):
            f = 0.0
            for k in range(lo[i], hi[i]):
                f += L[i, k] * w[k]
            r = 1.0 / (f + 1e-300)
            for k in range(lo[i], hi[i]):
                g[k] += L[i, k] * r
        for k in range(m):
            w[k] = w[k] * g[k] / n
