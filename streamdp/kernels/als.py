"""The item side of one ALS iteration over a user block: clipped user rows, targets, sums.

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
sensitivities. Raw arrays in, preallocated outputs accumulated into; float64; no
``fastmath`` (clipping is computed here).
"""

from __future__ import annotations

import numpy as np
from numba import njit


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
def add_packed_outer(A, j, w, x, d):
    """``A[j] += w x x^T`` on the packed upper triangle (layout of :func:`packed_index`)."""
    q = 0
    for a in range(d):
        wa = w * x[a]
        for b in range(a, d):
            A[j, q] += wa * x[b]
            q += 1


@njit(cache=True, nogil=True)
def als_accumulate(indptr, items, target, weights, U, clip, R, beta, B, A, S):
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
