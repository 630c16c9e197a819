"""The ALS-family kernels as they were before issue 44 (commit d658e6d): ``bench/roofline.py``'s "before" rows.

Verbatim copies of :func:`streamdp.kernels.linalg.solve_users_huber`,
:func:`streamdp.kernels.als.als_accumulate` and :func:`streamdp.kernels.ials.ials_solve_users`
of that commit (names ending in ``_before``), with the helpers only they used (``ridge_solve``,
``add_packed_outer``; ``chol_factor``, ``chol_apply`` and ``_prepared_rows``, which the whitened user solve
dropped later; those unchanged since are imported), kept here so that one run measures the old and the new
kernel side by side. Not part of the package.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from streamdp.kernels.als import clip_row


@njit(cache=True, nogil=True, fastmath={"contract"})
def chol_factor(M, k):
    """Overwrite the upper triangle of ``M[:k, :k]`` (symmetric positive definite) with ``R``, ``R^T R = M``.

    Row-oriented (right-looking) Cholesky: every inner loop is a contiguous ``axpy`` on a
    row of the upper triangle, where the row-by-row dot-product form is a chain of dependent
    multiply-adds (:func:`streamdp.kernels.linalg.cholesky_lower` takes the dot products a
    column at a time instead). A non-positive pivot is taken as ``1e-300``. Multiply-adds
    may fuse (``contract``: FMA only, no reassociation); no clipping or noise is computed here.
    """
    for i in range(k):
        piv = M[i, i]
        r = np.sqrt(piv) if piv > 0 else 1e-300
        M[i, i] = r
        for b in range(i + 1, k):
            M[i, b] /= r
        for a in range(i + 1, k):
            f = M[i, a]
            for b in range(a, k):
                M[a, b] -= f * M[i, b]


@njit(cache=True, nogil=True, fastmath={"contract"})
def chol_apply(R, x, k):
    """``x[:k] = (R^T R)^-1 x[:k]`` in place, ``R`` the upper triangle :func:`chol_factor` wrote."""
    for i in range(k):  # R^T y = x
        x[i] /= R[i, i]
        xi = x[i]
        for b in range(i + 1, k):
            x[b] -= xi * R[i, b]
    for i in range(k - 1, -1, -1):  # R z = y
        acc = x[i]
        for b in range(i + 1, k):
            acc -= R[i, b] * x[b]
        x[i] = acc / R[i, i]


@njit(cache=True, nogil=True)
def _prepared_rows(indptr, items, Y, YtY, ridge):
    """``(pos, Z)``: ``Z[pos[j]] = (YtY + ridge I)^-1 y_j`` for the items of users with fewer pairs than ``d``."""
    n_items, d = Y.shape
    pos = np.full(n_items, -1, dtype=np.int64)
    m = 0
    for u in range(len(indptr) - 1):
        if indptr[u + 1] - indptr[u] < d:
            for p in range(indptr[u], indptr[u + 1]):
                if pos[items[p]] < 0:
                    pos[items[p]] = m
                    m += 1
    Z = np.empty((m, d), dtype=np.float64)
    if m == 0:
        return pos, Z
    R = np.empty((d, d), dtype=np.float64)
    for a in range(d):
        for b in range(a, d):
            R[a, b] = YtY[a, b]
        R[a, a] += ridge
    chol_factor(R, d)
    for j in range(n_items):
        q = pos[j]
        if q >= 0:
            for a in range(d):
                Z[q, a] = Y[j, a]
            chol_apply(R, Z[q], d)
    return pos, Z


@njit(cache=True, nogil=True)
def ridge_solve(G, rhs, k):
    """Solve ``G x = rhs`` in place for a symmetric positive definite ``G`` (Cholesky)."""
    for i in range(k):
        for j in range(i + 1):
            acc = G[i, j]
            for m in range(j):
                acc -= G[i, m] * G[j, m]
            if i == j:
                G[i, i] = np.sqrt(acc) if acc > 0 else 1e-300
            else:
                G[i, j] = acc / G[j, j]
    for i in range(k):
        acc = rhs[i]
        for m in range(i):
            acc -= G[i, m] * rhs[m]
        rhs[i] = acc / G[i, i]
    for i in range(k - 1, -1, -1):
        acc = rhs[i]
        for m in range(i + 1, k):
            acc -= G[m, i] * rhs[m]
        rhs[i] = acc / G[i, i]


@njit(cache=True, nogil=True)
def add_packed_outer(A, j, w, x, d):
    """``A[j] += w x x^T`` on the packed upper triangle (layout of :func:`packed_index`)."""
    q = 0
    for a in range(d):
        wa = w * x[a]
        for b in range(a, d):
            A[j, q] += wa * x[b]
            q += 1


@njit(cache=True, nogil=True)
def solve_users_huber_before(indptr, items, resid, Q, ridge, irls_iters, delta, U):
    """Per-user ridge regression with a Huber data loss, by iteratively reweighted least squares.

    ``U[u] = argmin_x sum_{p in I_u} H_delta(resid_p - Q_{items_p} . x) + ridge ||x||^2 / 2`` approximately:
    ``irls_iters`` reweighting steps after the plain ridge solve, each with weights
    ``w_p = min(1, delta / |e_p|)`` of the previous solve's residuals ``e_p`` (the
    Huber influence function over the residual, Holland & Welsch 1977; the R-IRLS of
    the Huber-mechanism paper, seed 001, Alg. 3). ``irls_iters = 0`` is the plain
    ridge solve (the squared loss). ``Q`` is ``(n_items, k)`` float64 (the released
    item factors, with a column of ones for a user intercept), ``U`` is written.
    """
    k = Q.shape[1]
    G = np.empty((k, k), dtype=np.float64)
    x = np.empty(k, dtype=np.float64)
    longest = 0
    for u in range(len(indptr) - 1):
        longest = max(longest, indptr[u + 1] - indptr[u])
    w = np.ones(longest, dtype=np.float64)
    for u in range(len(indptr) - 1):
        s = indptr[u]
        e = indptr[u + 1]
        for t in range(e - s):
            w[t] = 1.0
        for it in range(irls_iters + 1):
            for a in range(k):
                x[a] = 0.0
                for b in range(k):
                    G[a, b] = 0.0
                G[a, a] = ridge
            for p in range(s, e):
                j = items[p]
                wr = w[p - s]
                r = resid[p] * wr
                for a in range(k):
                    qa = Q[j, a]
                    x[a] += qa * r
                    qw = qa * wr
                    for b in range(a + 1):
                        G[a, b] += qw * Q[j, b]
            for a in range(k):
                for b in range(a + 1, k):
                    G[a, b] = G[b, a]
            if e > s:
                ridge_solve(G, x, k)
            if it < irls_iters:
                for p in range(s, e):
                    j = items[p]
                    r = resid[p]
                    for a in range(k):
                        r -= Q[j, a] * x[a]
                    r = abs(r)
                    w[p - s] = 1.0 if r <= delta else delta / r
        for a in range(k):
            U[u, a] = x[a]


@njit(cache=True, nogil=True)
def als_accumulate_before(indptr, items, target, weights, U, clip, R, beta, B, A, S):
    """Accumulate one block's item-side sums (see the module docstring); returns the number of clipped users.

    ``U`` is ``(n_users, k + 1)`` (factor, intercept), ``target`` the ratings minus
    the global mean and the item bias (minus the global mean only when the item bias is
    refitted as ``x``'s last coordinate), ``weights`` one per rating (0: not on the item
    side).
    ``B`` is ``(n_items, d)`` with ``d = k`` or ``k + 1`` (then ``x`` ends with ``beta``),
    ``A`` ``(n_items, d (d + 1) / 2)`` or empty, ``S`` ``(d, d)`` or empty.
    """
    k = U.shape[1] - 1
    d = B.shape[1]
    do_a = A.shape[0] > 0
    do_s = S.shape[0] > 0
    x = np.empty(d, dtype=np.float64)
    clipped = 0
    for u in range(len(indptr) - 1):
        s = indptr[u]
        e = indptr[u + 1]
        if e == s:
            continue
        clipped += clip_row(U, u, k, clip, x)
        if d > k:
            x[k] = beta
        c = U[u, k]
        if do_s:
            for a in range(d):
                for b in range(a, d):
                    S[a, b] += x[a] * x[b]
        for p in range(s, e):
            w = weights[p]
            if w == 0.0:
                continue
            j = items[p]
            y = target[p] - c
            if y > R:
                y = R
            elif y < -R:
                y = -R
            wy = w * y
            for a in range(d):
                B[j, a] += wy * x[a]
            if do_a:
                add_packed_outer(A, j, w, x, d)
    return clipped


@njit(cache=True, nogil=True)
def chol_solve_before(M, x, k):
    """Solve ``M[:k, :k] z = x[:k]`` in place (``z`` into ``x``); ``M``'s upper triangle is overwritten."""
    chol_factor(M, k)
    chol_apply(M, x, k)


@njit(cache=True, nogil=True, fastmath={"contract"})
def _solve_direct_before(Y, items, conf, s, e, YtY, ridge, M, x):
    """One user's ``x = (YtY + ridge I + sum (c - 1) y y^T)^-1 sum c y`` by forming the ``d x d`` system.

    ``sum (c - 1) y y^T`` is accumulated on the upper triangle two pairs per sweep of its
    rows (contiguous ``axpy``: half the loads and stores of ``M`` of one pair per sweep).
    Cost ``n d^2 / 2 + d^3 / 6`` multiply-adds for ``n`` pairs.
    """
    d = Y.shape[1]
    for a in range(d):
        x[a] = 0.0
        for b in range(a, d):
            M[a, b] = YtY[a, b]
        M[a, a] += ridge
    p = s
    while p + 1 < e:
        j0, j1 = np.uint64(items[p]), np.uint64(items[p + 1])
        c0, c1 = conf[p], conf[p + 1]
        m0, m1 = c0 - 1.0, c1 - 1.0
        for a in range(d):
            y0, y1 = Y[j0, a], Y[j1, a]
            x[a] += c0 * y0 + c1 * y1
            w0, w1 = m0 * y0, m1 * y1
            for b in range(a, d):
                M[a, b] += w0 * Y[j0, b] + w1 * Y[j1, b]
        p += 2
    if p < e:
        j = np.uint64(items[p])
        c = conf[p]
        cm = c - 1.0
        for a in range(d):
            ya = Y[j, a]
            x[a] += c * ya
            w = cm * ya
            for b in range(a, d):
                M[a, b] += w * Y[j, b]
    chol_solve_before(M, x, d)


@njit(cache=True, nogil=True, fastmath={"contract", "reassoc"})
def _solve_woodbury_before(Y, Z, pos, items, conf, s, e, S, V, W, t, x):
    """One user's row by the Woodbury identity, for ``n = e - s`` pairs fewer than ``d``: the same solve.

    With ``P = YtY + ridge I``, ``z_j = P^-1 y_j`` (``Z[pos[j]]``, once per block) and
    ``v_j = sqrt(c_j - 1) y_j``, ``(P + V^T V)^-1 = P^-1 - P^-1 V^T (I + V P^-1 V^T)^-1 V P^-1``:
    ``g = P^-1 b = sum c_j z_j``, then an ``n x n`` system ``(I + V P^-1 V^T) t = V g``
    (eigenvalues >= 1), ``x = g - sum_j sqrt(c_j - 1) t_j z_j``. Cost
    ``n^2 d / 2 + n^3 / 6 + 4 n d`` multiply-adds against :func:`_solve_direct`'s
    ``n d^2 / 2 + d^3 / 6``: 4x fewer at ``n = 20``, ``d = 64``. The user's rows
    ``v_j``, ``sqrt(c_j - 1) z_j`` are gathered first (``V``, ``W``: ``n x d``); the upper
    triangle of ``V W^T`` is taken four entries at a time (four independent sums over
    ``d``: 1.7x faster than one contiguous ``axpy`` per entry row, whose rows are only
    ``n - i`` long). The sums over ``d`` may be reassociated (``fastmath`` ``reassoc``, so
    that they vectorize: the user solves of a 1M-pair block at ``d = 65`` 0.55 -> 0.42-0.49
    CPU s, busy machine); the order is then the compiled code's, the same on one machine for
    the training and the user's local solve, possibly different in the last bits on a CPU
    with other vector widths. No clipping or noise is computed here.
    """
    d = Y.shape[1]
    n = e - s
    for a in range(d):
        x[a] = 0.0
    for i in range(n):
        j = items[s + i]
        zi = pos[j]
        c = conf[s + i]
        si = np.sqrt(c - 1.0)
        for a in range(d):
            za = Z[zi, a]
            x[a] += c * za
            V[i, a] = si * Y[np.uint64(j), a]
            W[i, a] = si * za
    for i in range(n):
        acc = 0.0
        for a in range(d):
            acc += V[i, a] * x[a]
        t[i] = acc
        l = i
        while l + 3 < n:
            s0 = s1 = s2 = s3 = 0.0
            for a in range(d):
                v = V[i, a]
                s0 += v * W[l, a]
                s1 += v * W[l + 1, a]
                s2 += v * W[l + 2, a]
                s3 += v * W[l + 3, a]
            S[i, l] = s0
            S[i, l + 1] = s1
            S[i, l + 2] = s2
            S[i, l + 3] = s3
            l += 4
        while l < n:
            s0 = 0.0
            for a in range(d):
                s0 += V[i, a] * W[l, a]
            S[i, l] = s0
            l += 1
        S[i, i] += 1.0
    chol_solve_before(S, t, n)
    for i in range(n):
        f = t[i]
        for a in range(d):
            x[a] -= f * W[i, a]


@njit(cache=True, nogil=True)
def ials_solve_users_before(indptr, items, conf, Y, YtY, ridge, U):
    """Each user's row: ``U[u] = (YtY + sum (c - 1) y y^T + ridge I)^-1 sum c y`` over her pairs.

    ``Y`` is ``(n_items, d)`` float64 (item rows), ``YtY`` its ``d x d`` Gramian over
    every item, ``conf`` one confidence per pair (``>= 1``), ``U`` ``(n_users, d)``
    (written). A user without pairs gets 0.

    The exact solve: the user's own device runs this same kernel on the released rows
    (:func:`streamdp.serving.local.implicit_rows`) with no previous factor to start from, and a
    cold start needs as many conjugate-gradient steps as the exact solve costs (a
    non-private training, which keeps each user's previous row, takes
    :func:`ials_cg_users`' few warm-started steps instead). A user with fewer pairs
    than ``d`` is solved through the Woodbury identity (:func:`_solve_woodbury`, an
    ``n x n`` system on rows ``P^-1 y_j`` computed once per call), one with more by
    forming the ``d x d`` system (:func:`_solve_direct`); both with :func:`chol_factor`.
    """
    d = Y.shape[1]
    M = np.empty((d, d), dtype=np.float64)
    x = np.empty(d, dtype=np.float64)
    t = np.empty(d, dtype=np.float64)
    V = np.empty((d, d), dtype=np.float64)
    W = np.empty((d, d), dtype=np.float64)
    pos, Z = _prepared_rows(indptr, items, Y, YtY, ridge)
    for u in range(len(indptr) - 1):
        s = indptr[u]
        e = indptr[u + 1]
        if e == s:
            for a in range(d):
                U[u, a] = 0.0
            continue
        if e - s < d:
            _solve_woodbury_before(Y, Z, pos, items, conf, s, e, M, V, W, t, x)
        else:
            _solve_direct_before(Y, items, conf, s, e, YtY, ridge, M, x)
        for a in range(d):
            U[u, a] = x[a]
