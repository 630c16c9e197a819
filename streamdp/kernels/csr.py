"""CSR helpers: held-out split, per-user sort, synthetic rows (building stores); users' mean residuals."""

from __future__ import annotations

import numpy as np
from streamdp.kernels.jit import njit

from streamdp.kernels.hashing import splitmix64


@njit(cache=True, nogil=True)
def split_holdout(indptr, items, ratings, fraction, seed, tr_indptr, tr_items, tr_ratings,
                  te_indptr, te_items, te_ratings):
    """Hold out ``floor(fraction * n + 1/2)`` random ratings of each user (at most ``n - 1``).

    Writes the two CSR parts into the preallocated outputs (each as long as the
    input) and returns ``(n_train, n_test)``. Order within each user is kept.
    Deterministic for a given ``seed`` (numba's thread-local generator is seeded
    here, so the result does not depend on which thread runs the block).
    """
    np.random.seed(seed)
    n_users = len(indptr) - 1
    held = np.zeros(len(items), np.uint8)
    for u in range(n_users):
        s = indptr[u]
        n = indptr[u + 1] - s
        k = _n_held(n, fraction, 0)
        # choose k of n positions: partial Fisher-Yates on a mask
        perm = np.arange(n)
        for i in range(k):
            j = i + np.random.randint(0, n - i)
            tmp = perm[i]
            perm[i] = perm[j]
            perm[j] = tmp
        for i in range(k):
            held[s + perm[i]] = 1
    return split_masked(indptr, items, ratings, held, tr_indptr, tr_items, tr_ratings, te_indptr, te_items,
                        te_ratings)


@njit(cache=True, nogil=True)
def _n_held(n, fraction, last_n):
    """How many of a user's ``n`` ratings are held out: ``last_n`` if positive, else ``floor(fraction n + 1/2)``;
    at most ``n - 1`` (every user keeps a training rating)."""
    k = last_n if last_n > 0 else int(np.floor(fraction * n + 0.5))
    if k > n - 1:
        k = n - 1
    if k < 0:
        k = 0
    return k


@njit(cache=True, nogil=True)
def hold_out_latest(indptr, ts, fraction, last_n, held):
    """Mark in ``held`` (uint8, zeroed by the caller) each user's latest ratings by timestamp.

    A user with ``n`` ratings holds out ``last_n`` of them when ``last_n > 0``, else
    ``floor(fraction * n + 1/2)`` (as :func:`split_holdout`); at most ``n - 1`` either way,
    so every user keeps a training rating. Ties in time go to the rating that comes later
    in the user's row (a stable sort), so the split is deterministic.
    """
    n_users = len(indptr) - 1
    for u in range(n_users):
        s = indptr[u]
        e = indptr[u + 1]
        n = e - s
        k = _n_held(n, fraction, last_n)
        if k == 0:
            continue
        order = np.argsort(ts[s:e], kind="mergesort")
        for j in range(n - k, n):
            held[s + order[j]] = 1


@njit(cache=True, nogil=True)
def split_masked(indptr, items, ratings, held, tr_indptr, tr_items, tr_ratings, te_indptr, te_items, te_ratings):
    """Split a CSR part by ``held`` (nonzero: test) into train and test parts (order within a user kept).

    Outputs as for :func:`split_holdout`; returns ``(n_train, n_test)``.
    """
    n_users = len(indptr) - 1
    a = 0
    t = 0
    tr_indptr[0] = 0
    te_indptr[0] = 0
    for u in range(n_users):
        for k in range(indptr[u], indptr[u + 1]):
            if held[k]:
                te_items[t] = items[k]
                te_ratings[t] = ratings[k]
                t += 1
            else:
                tr_items[a] = items[k]
                tr_ratings[a] = ratings[k]
                a += 1
        tr_indptr[u + 1] = a
        te_indptr[u + 1] = t
    return a, t


@njit(cache=True, nogil=True)
def holdout_counts(indptr, first_user, key_mix, mix_c, min_count, fraction, cap, sampled, salt, threshold, v, start):
    """Each user's number of validation ratings ``v[u]`` and the keyed offset of the first, ``start[u]`` (0 where
    ``v[u]`` is 0): :func:`streamdp.methods._selection.holdout_strides` in one loop over the users, the same numbers
    as its NumPy form (``_counts`` and ``_starts``, which a test holds it to), where that form's dozen array
    operations on every block of every pass held the interpreter's lock (0.19 ms a 21,000-user block, alone).

    ``key_mix`` is ``key * mix_c`` (wrapped); with ``sampled`` a user validates only where her hash (``salt``)
    is below ``threshold``. ``v[u] = min(max(floor(fraction n + 1/2), 1), n - 1, n, cap)``, 0 below ``min_count``
    ratings or outside the sample."""
    for u in range(len(indptr) - 1):
        n = indptr[u + 1] - indptr[u]
        g = np.uint64(first_user) + np.uint64(u)
        k = max(np.int64(np.floor(fraction * n + 0.5)), np.int64(1))
        k = min(min(k, n - 1), min(n, cap))
        if n < min_count:
            k = 0
        elif sampled and not splitmix64(key_mix ^ salt ^ (g * mix_c)) < threshold:
            k = 0
        v[u] = k
        start[u] = 0
        if k > 0:
            start[u] = np.int64(splitmix64(key_mix ^ (g * mix_c)) % np.uint64(n))


@njit(cache=True, nogil=True)
def holdout_strided(indptr, items, ratings, v, start, tr_indptr, tr_items, tr_ratings, held):
    """Hold out ``v[u]`` of user ``u``'s ``n`` ratings, those at offsets ``(start[u] + j (n // v[u])) % n``,
    ``j < v[u]`` (``indptr[0] == 0``).

    Writes the rest into ``tr_*`` (order within a user kept; ``tr_indptr`` of length ``n_users + 1``) and the
    held-out positions into ``held`` (users in order, ``j`` in order: as long as ``sum(v)``); returns the number of
    training ratings. The one-pass form of :func:`streamdp.methods._selection.holdout`'s NumPy path (which a test
    holds it to): every pass of a run that holds items out calls it, on every block.
    """
    n_users = len(indptr) - 1
    a = 0
    h = 0
    tr_indptr[0] = 0
    for u in range(n_users):
        s = indptr[u]
        n = indptr[u + 1] - s
        k = v[u]
        if k > 0:
            step = n // k
            for j in range(k):
                held[h + j] = s + (start[u] + j * step) % n
        for i in range(s, s + n):
            out = False
            for j in range(k):
                if held[h + j] == i:
                    out = True
            if not out:
                tr_items[a] = items[i]
                tr_ratings[a] = ratings[i]
                a += 1
        h += k
        tr_indptr[u + 1] = a
    return a


@njit(cache=True, nogil=True)
def alias_table(weights, prob, alias):
    """Walker/Vose alias table of ``weights`` (not necessarily normalized), into ``prob``/``alias``.

    Item ``i`` is then drawn with ``x = U * n; j = int(x); i = j if x - j < prob[j] else alias[j]``,
    in O(1) instead of a binary search over a CDF (measured 25M vs 7.6M draws/s per
    core at 20k items).
    """
    n = len(weights)
    total = 0.0
    for i in range(n):
        total += weights[i]
    scaled = np.empty(n, np.float64)
    small = np.empty(n, np.int64)
    large = np.empty(n, np.int64)
    ns = 0
    nl = 0
    for i in range(n):
        scaled[i] = weights[i] * n / total
        if scaled[i] < 1.0:
            small[ns] = i
            ns += 1
        else:
            large[nl] = i
            nl += 1
    while ns > 0 and nl > 0:
        ns -= 1
        sm = small[ns]
        nl -= 1
        lg = large[nl]
        prob[sm] = scaled[sm]
        alias[sm] = lg
        scaled[lg] = (scaled[lg] + scaled[sm]) - 1.0
        if scaled[lg] < 1.0:
            small[ns] = lg
            ns += 1
        else:
            large[nl] = lg
            nl += 1
    while nl > 0:
        nl -= 1
        prob[large[nl]] = 1.0
        alias[large[nl]] = large[nl]
    while ns > 0:  # only round-off leftovers
        ns -= 1
        prob[small[ns]] = 1.0
        alias[small[ns]] = small[ns]


@njit(cache=True, nogil=True)
def synth_block(seed, counts, item_prob, item_alias, item_factors, item_bias, global_mean, rank,
                noise, rmin, rmax, step, uniform, out_indptr, out_items, out_ratings,
                user_cluster, centers, cohesion):
    """Draw the ratings of one block of synthetic users.

    User ``j`` rates ``counts[j]`` distinct items drawn from the popularity
    distribution given by the alias table ``item_prob[c]``/``item_alias[c]`` (see
    :func:`alias_table`; repeats are rejected) of her taste cluster ``c =
    user_cluster[j]`` (``c = 0`` for everyone when ``user_cluster`` is empty: one
    table, no clusters), with rating
    ``global_mean + item_bias[i] + u_j . v_i + N(0, noise^2)``, rounded to ``step``
    (if ``step > 0``) and clipped to ``[rmin, rmax]``; ``u_j ~ N(0, I/sqrt(rank))``
    so that ``u.v`` has unit variance when ``v ~ N(0, I/sqrt(rank))``, or, with
    ``uniform``, ``u_j`` uniform in ``[-1, 1]^rank / sqrt(rank)``. In a taste cluster
    the factor drawn so is mixed with the cluster's center: ``u_j = sqrt(cohesion)
    centers[c] + sqrt(1 - cohesion) u_j`` (the same variance when the centers are drawn
    like ``u``); without clusters the random draws are those of the one-table kernel.
    Items within a user are sorted. Returns the number of ratings written.
    """
    np.random.seed(seed)
    n_items = item_prob.shape[1]
    n_users = len(counts)
    clustered = len(user_cluster) > 0
    mix_c = np.sqrt(cohesion)
    mix_u = np.sqrt(1.0 - cohesion)
    scale = 1.0 / np.sqrt(np.sqrt(rank))
    seen = np.zeros(n_items, dtype=np.int64)
    u = np.empty(rank, dtype=np.float64)
    pos = 0
    out_indptr[0] = 0
    for j in range(n_users):
        stamp = j + 1
        c = counts[j]
        if c > n_items:
            c = n_items
        if uniform:
            for d in range(rank):
                u[d] = (2.0 * np.random.random() - 1.0) / np.sqrt(rank)
        else:
            for d in range(rank):
                u[d] = np.random.normal() * scale
        cl = 0
        if clustered:
            cl = user_cluster[j]
            for d in range(rank):
                u[d] = mix_c * centers[cl, d] + mix_u * u[d]
        prob = item_prob[cl]
        alias = item_alias[cl]
        start = pos
        drawn = 0
        tries = 0
        while drawn < c:
            tries += 1
            if tries > 50 * c + 1000:
                # extremely popular-heavy draws: fill the rest with unseen items in order
                for i in range(n_items):
                    if drawn >= c:
                        break
                    if seen[i] != stamp:
                        seen[i] = stamp
                        out_items[pos] = i
                        pos += 1
                        drawn += 1
                break
            x = np.random.random() * n_items
            i = int(x)
            if i >= n_items:
                i = n_items - 1
            if x - i >= prob[i]:
                i = alias[i]
            if seen[i] == stamp:
                continue
            seen[i] = stamp
            out_items[pos] = i
            pos += 1
            drawn += 1
        out_items[start:pos].sort()
        for p in range(start, pos):
            i = out_items[p]
            r = global_mean + item_bias[i] + np.random.normal() * noise
            for d in range(rank):
                r += u[d] * item_factors[i, d]
            if step > 0:
                r = rmin + np.floor((r - rmin) / step + 0.5) * step
            if r < rmin:
                r = rmin
            if r > rmax:
                r = rmax
            out_ratings[p] = r
        out_indptr[j + 1] = pos
    return pos


@njit(cache=True, nogil=True)
def masked_indptr(indptr, mask, out):
    """CSR offsets, from 0, of the pairs with ``mask`` set (``mask[p - indptr[0]]`` for ``p`` in user ``u``'s
    ``indptr[u]:indptr[u + 1]``) into ``out`` (int64, ``len(indptr)``); returns their number. What
    ``concatenate([[0], cumsum(mask)])[indptr - indptr[0]]`` gives, without an int64 per pair (``ials``' item floor
    and rating pairs, every block of every pass)."""
    n = 0
    base = indptr[0]
    out[0] = 0
    for u in range(len(indptr) - 1):
        for p in range(indptr[u] - base, indptr[u + 1] - base):
            n += mask[p]
        out[u + 1] = n
    return n


@njit(cache=True, nogil=True)
def keep_rows(indptr, items, ratings, keep):
    """The CSR rows of the users with ``keep[u]`` set (the others become empty): ``(indptr, items, ratings)``.

    One pass: a dropped user's ratings are not copied; the kept ones keep their order. Used by the view that
    leaves retired users out of every block (:mod:`streamdp.storage.retired`).
    """
    n_users = len(indptr) - 1
    out_indptr = np.zeros(n_users + 1, indptr.dtype)
    total = 0
    for u in range(n_users):
        if keep[u]:
            total += indptr[u + 1] - indptr[u]
        out_indptr[u + 1] = total
    out_items = np.empty(total, items.dtype)
    out_ratings = np.empty(total, ratings.dtype)
    k = 0
    for u in range(n_users):
        if keep[u]:
            for j in range(indptr[u], indptr[u + 1]):
                out_items[k] = items[j]
                out_ratings[k] = ratings[j]
                k += 1
    return out_indptr, out_items, out_ratings


@njit(cache=True, nogil=True)
def user_residual_means(indptr, items, ratings, item_value, damping, out):
    """``out[u] = sum_p (ratings[p] - item_value[items[p]]) / (n_u + damping)`` over user ``u``'s CSR row.

    Each residual in float64 (a float32 rating widened), summed in the row's order from 0: the
    bits of ``np.bincount(users, weights=residuals) / (n + damping)``, the NumPy form it replaced in
    ``evaluate``'s user+item bias baseline, which took 11 ms a 1M-rating block (a float64 copy, a
    gather, ``np.repeat`` of the users, the weighted bincount; this pass 2 ms) beside the local
    solve's 10.6 ms.
    """
    for u in range(len(indptr) - 1):
        s = 0.0
        for p in range(indptr[u], indptr[u + 1]):
            s += np.float64(ratings[p]) - item_value[items[p]]
        out[u] = s / (indptr[u + 1] - indptr[u] + damping)
