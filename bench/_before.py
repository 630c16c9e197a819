"""The ALS-family kernels as they were before issue 44 (commit d658e6d): ``bench/roofline.py``'s "before" rows.

Verbatim copies of :func:`streamdp.kernels.linalg.solve_users_huber` and
:func:`streamdp.kernels.als.als_accumulate` of that commit, with the helpers only they used
(``ridge_solve``, ``add_packed_outer``; ``clip_row``, unchanged since, is imported), kept
here so that one run measures the old and the new kernel side by side. Not part of the
package.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from streamdp.kernels.als import clip_row


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
