"""Implicit-feedback ALS (Hu, Koren & Volinsky 2008) over CSR user blocks: user solves and item-side sums.

Weighted matrix factorization over every user-item pair: an observed pair has
preference ``p = 1`` and confidence ``c >= 1``, an unobserved one preference 0 and
weight 1. With the Gramian trick the unobserved pairs cost ``O(k^2)`` per user:

* user side (:func:`ials_solve_users`, also the user's own local solve):
  ``u = (Y^T Y + sum_{j in I_u} (c_j - 1) y_j y_j^T + lambda I)^-1 sum_{j in I_u} c_j y_j``
  with ``Y^T Y`` the ``k x k`` Gramian of every item row, given;
* item side (:func:`ials_accumulate`), the sums of the same solve for items:
  ``G = sum_u x_u x_u^T`` once per user (the users' Gramian), ``B_j += w c x_u`` and,
  with ``A`` non-empty, ``A_j += w (c - 1) x_u x_u^T`` (packed upper triangle, as
  :mod:`streamdp.kernels.als`), for each of the user's items with weight ``w != 0``
  (``w = 0`` drops a pair from the item side: contribution bounding), where
  ``x_u = u min(1, clip / ||u||)`` over the whole row.

One user's contribution has L2 norm ``<= ||x||^2`` to ``G``, ``<= ||x_B|| ||w c||_2`` to
``B`` (``x_B`` the coordinates ``B`` holds) and ``<= ||x||^2 ||w (c - 1)||_2`` to ``A``: :mod:`streamdp.methods.ials`
turns these into the released sensitivities. Raw arrays in, preallocated outputs
accumulated into; float64; no ``fastmath`` (clipping is computed here).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from streamdp.kernels.als import add_packed_outer, clip_row
from streamdp.kernels.linalg import ridge_solve


@njit(cache=True, nogil=True)
def ials_solve_users(indptr, items, conf, Y, YtY, ridge, U):
    """Each user's row: ``U[u] = (YtY + sum (c - 1) y y^T + ridge I)^-1 sum c y`` over her pairs.

    ``Y`` is ``(n_items, d)`` float64 (item rows), ``YtY`` its ``d x d`` Gramian over
    every item, ``conf`` one confidence per pair (``>= 1``), ``U`` ``(n_users, d)``
    (written). A user without pairs gets 0. ``A``'s packed layout is
    :func:`streamdp.kernels.als.packed_index`'s.
    """
    d = Y.shape[1]
    M = np.empty((d, d), dtype=np.float64)
    x = np.empty(d, dtype=np.float64)
    for u in range(len(indptr) - 1):
        s = indptr[u]
        e = indptr[u + 1]
        if e == s:
            for a in range(d):
                U[u, a] = 0.0
            continue
        for a in range(d):
            x[a] = 0.0
            for b in range(a + 1):
                M[a, b] = YtY[a, b]
            M[a, a] += ridge
        for p in range(s, e):
            j = items[p]
            c = conf[p]
            cm = c - 1.0
            for a in range(d):
                ya = Y[j, a]
                x[a] += c * ya
                w = cm * ya
                for b in range(a + 1):
                    M[a, b] += w * Y[j, b]
        for a in range(d):
            for b in range(a + 1, d):
                M[a, b] = M[b, a]
        ridge_solve(M, x, d)
        for a in range(d):
            U[u, a] = x[a]


@njit(cache=True, nogil=True)
def ials_accumulate(indptr, items, conf, weights, U, clip, clip_last, B, A, G):
    """Accumulate one block's item-side sums (module docstring); returns the number of clipped users.

    ``U`` ``(n_users, d)``; ``G`` ``(d, d)`` (upper triangle accumulated, completed by
    :func:`streamdp.kernels.als.symmetrize_upper`); ``A`` ``(n_items, d (d + 1) / 2)`` or
    empty (packed as :func:`streamdp.kernels.als.packed_index`); ``B`` ``(n_items, k)``
    with ``k = d`` or ``d - 1``. When ``k = d - 1`` the row's last coordinate (a user's
    weight on the popularity column) is clipped on its own to ``[-clip_last, clip_last]``
    and the first ``k`` to norm ``clip``, and ``B`` gets the first ``k`` only; otherwise the
    whole row is clipped to ``clip``. Users without pairs add nothing.
    """
    d = U.shape[1]
    k = B.shape[1]
    do_a = A.shape[0] > 0
    x = np.empty(d, dtype=np.float64)
    clipped = 0
    for u in range(len(indptr) - 1):
        s = indptr[u]
        e = indptr[u + 1]
        if e == s:
            continue
        clipped += clip_row(U, u, k, clip, x)
        if k < d:
            x[k] = min(max(U[u, k], -clip_last), clip_last)
        for a in range(d):
            for b in range(a, d):
                G[a, b] += x[a] * x[b]
        for p in range(s, e):
            w = weights[p]
            if w == 0.0:
                continue
            j = items[p]
            wc = w * conf[p]
            for a in range(k):
                B[j, a] += wc * x[a]
            if do_a:
                add_packed_outer(A, j, w * (conf[p] - 1.0), x, d)
    return clipped


def ials_solve_users_reference(indptr, items, conf, Y, YtY, ridge):
    """NumPy reference of :func:`ials_solve_users`."""
    d = Y.shape[1]
    U = np.zeros((len(indptr) - 1, d))
    for u in range(len(indptr) - 1):
        s, e = indptr[u], indptr[u + 1]
        if e == s:
            continue
        Yu, c = Y[items[s:e]], conf[s:e]
        M = YtY + (Yu * (c - 1.0)[:, None]).T @ Yu + ridge * np.eye(d)
        U[u] = np.linalg.solve(M, Yu.T @ c)
    return U


def ials_accumulate_reference(indptr, items, conf, weights, U, clip, n_items, k=None, clip_last=np.inf):
    """NumPy reference of :func:`ials_accumulate`: ``(B (n, k), A (n, d, d), G)``."""
    n_u, d = U.shape
    k = d if k is None else k
    rows = np.repeat(np.arange(n_u), np.diff(indptr))
    nrm = np.linalg.norm(U[:, :k], axis=1)
    X = U.copy()
    X[:, :k] *= np.where(nrm > clip, clip / np.maximum(nrm, 1e-300) * (1.0 - 2.0 ** -40), 1.0)[:, None]
    if k < d:
        X[:, k] = np.clip(U[:, k], -clip_last, clip_last)
    B = np.zeros((n_items, k))
    np.add.at(B, items, (weights * conf)[:, None] * X[rows, :k])
    A = np.zeros((n_items, d, d))
    np.add.at(A, items, (weights * (conf - 1.0))[:, None, None] * X[rows][:, :, None] * X[rows][:, None, :])
    has = np.diff(indptr) > 0
    return B, A, X[has].T @ X[has]


@njit(cache=True, nogil=True)
def ials_solve_items(B, A, G, scale, lam, Y, k, out):
    """Each item's row: ``out[j, :k] = (scale_j G + A_j + lam_j I)^-1 (B_j - ...)`` (Cholesky), in place.

    ``B`` ``(n, k)``, ``A`` packed ``(n, d (d + 1) / 2)`` or empty (then ``A_j = 0``), ``G``
    ``(d, d)`` symmetric, ``scale`` and ``lam`` per item. With ``d = k + 1`` the last
    coordinate is fixed at ``Y[j, k]`` (the popularity column): its part of the system
    moves to the right-hand side, ``B_j[:k] - Y[j, k] M_j[:k, k]``. ``out`` ``(n, d)`` gets
    the first ``k`` coordinates written.
    """
    n = B.shape[0]
    d = G.shape[0]
    do_a = A.shape[0] > 0
    M = np.empty((d, d), dtype=np.float64)
    x = np.empty(k, dtype=np.float64)
    for j in range(n):
        s = scale[j]
        for a in range(d):
            for b in range(d):
                M[a, b] = s * G[a, b]
        if do_a:
            q = 0
            for a in range(d):
                for b in range(a, d):
                    M[a, b] += A[j, q]
                    if b != a:
                        M[b, a] += A[j, q]
                    q += 1
        for a in range(k):
            x[a] = B[j, a]
            if d > k:
                x[a] -= Y[j, k] * M[a, k]
            M[a, a] += lam[j]
        ridge_solve(M, x, k)
        for a in range(k):
            out[j, a] = x[a]
