"""Implicit-feedback ALS (Hu, Koren & Volinsky 2008) over CSR user blocks: user solves and item-side sums.

Weighted matrix factorization over every user-item pair: an observed pair has
preference ``p = 1`` and confidence ``c >= 1``, an unobserved one preference 0 and
weight 1. With the Gramian trick the unobserved pairs cost ``O(k^2)`` per user:

* user side (:func:`ials_solve_users`, also the user's own local solve):
  ``u = (Y^T Y + sum_{j in I_u} (c_j - 1) y_j y_j^T + lambda I)^-1 sum_{j in I_u} c_j y_j``
  with ``Y^T Y`` the ``k x k`` Gramian of every item row, given; or a few
  conjugate-gradient steps on it from the previous row (:func:`ials_cg_users`, non-private
  training);
* item side (:func:`ials_accumulate`), the sums of the same solve for items:
  ``G = sum_u x_u x_u^T`` once per user (the users' Gramian), ``B_j += w c x_u`` and,
  with ``A`` non-empty, ``A_j += w (c - 1) x_u x_u^T`` (packed upper triangle, as
  :mod:`streamdp.kernels.als`), for each of the user's items with weight ``w != 0``
  (``w = 0`` drops a pair from the item side: contribution bounding), where
  ``x_u = u min(1, clip / ||u||)`` over the whole row.

One user's contribution has L2 norm ``<= ||x||^2`` to ``G``, ``<= ||x_B|| ||w c||_2`` to
``B`` (``x_B`` the coordinates ``B`` holds) and ``<= ||x||^2 ||w (c - 1)||_2`` to ``A``: :mod:`streamdp.methods.ials`
turns these into the released sensitivities. Raw arrays in, preallocated outputs
accumulated into; float64 but for the non-private training's conjugate gradients and item products and
the private user solve's tiles (float32, each kernel says how). The rows are clipped without ``fastmath``; the item-side sums
(:func:`streamdp.kernels.als.accumulate_by_user` and ``accumulate_by_item``, shared with als) let multiply-adds fuse
(``contract``), the user solves also reassociate their sums (``reassoc``): the rounding of
sums, never a clipped value.
"""

from __future__ import annotations

import numpy as np
from streamdp.kernels.jit import njit

from streamdp.kernels.als import item_side_sums
from streamdp.kernels.lanes import prefetch_row
from streamdp.kernels.linalg import (LANE_D, cholesky_lower, cholesky_lower_apply, gather_conf, solve_users_conf,
                                    syrk_lower)

#: From this ``d`` on a user's whitened Gramian is one BLAS ``?syrk`` and her system is solved alone
#: (:func:`_solve_white_blas`); below it, up to :data:`streamdp.kernels.linalg.LANE_D`, eight users' systems are solved
#: together in vector lanes (:func:`streamdp.kernels.linalg.solve_users_conf`). Numba loops on a tile were 1.06x and
#: 1.10x a BLAS call per user at ``d = 8`` and 16 (whose call weighs there), the lanes about 1.5x it at ``d = 17`` in
#: float64 and as fast in float32; at ``d = 64`` ``?syrk`` took 0.4-0.8x the loops' time and float32 tiles run at
#: twice the rate (issue 44; docs/benchmarks.md).
BLAS_GRAM_D = LANE_D + 1


@njit(cache=True, nogil=True)
def chol_solve(M, x, k):
    """Solve ``M[:k, :k] z = x[:k]`` in place (``z`` into ``x``) from ``M``'s upper triangle; ``M`` is overwritten.

    The upper triangle is mirrored into the lower and factored column by column
    (:func:`streamdp.kernels.linalg.cholesky_lower`: at ``d = 65`` about a tenth of the time of a row-oriented
    factorization, whose row updates do not vectorize).
    """
    for a in range(k):
        for b in range(a + 1, k):
            M[b, a] = M[a, b]
    cholesky_lower(M, k)
    cholesky_lower_apply(M, x, k)


@njit(cache=True, nogil=True, fastmath={"contract", "reassoc"})
def _whitening(YtY, ridge, d):
    """``L^-1`` (lower triangular), ``L`` the Cholesky factor of ``P = YtY + ridge I``: ``P^-1 = L^-T L^-1``."""
    L = YtY + ridge * np.eye(d)
    cholesky_lower(L, d)
    Li = np.zeros((d, d), dtype=np.float64)
    for c in range(d):  # column c of L^-1: forward substitution of L z = e_c
        Li[c, c] = 1.0 / L[c, c]
        for i in range(c + 1, d):
            acc = 0.0
            for m in range(c, i):
                acc += L[i, m] * Li[m, c]
            Li[i, c] = -acc / L[i, i]
    return Li


@njit(cache=True, nogil=True, fastmath={"contract", "reassoc"})
def _solve_white_blas(Yw, items, conf, s, n, V, b, t, C, S, args):
    """One user's ``b = (I + V^T V)^-1 sum_i c_i yw_i`` in the whitened basis (``V`` rows ``sqrt(c_i - 1) yw_i``).

    The user's rows are gathered once; with ``n < d`` pairs by the Woodbury identity
    (``b - V^T (I + V V^T)^-1 V b``: an ``n x n`` system), otherwise by the ``d x d`` system;
    either Gramian is one BLAS ``?syrk`` on the gathered tile into ``C`` (the lower triangle,
    :func:`streamdp.kernels.linalg.syrk_lower`: half the multiply-adds of the full square
    ``numpy.dot`` took, issue 44), copied into the float64 ``S`` and factored there by
    :func:`streamdp.kernels.linalg.cholesky_lower`.
    """
    d = Yw.shape[1]
    gather_conf(Yw, items, conf, s, n, V.T, b)
    m = n if n < d else d
    syrk_lower(V, n, n < d, C, args)
    for i in range(m):  # factored in float64 whatever the tile's type
        for a in range(i + 1):
            S[i, a] = C[i, a]
        S[i, i] += 1.0
    if n < d:
        for i in range(n):
            acc = 0.0
            for a in range(d):
                acc += V[i, a] * b[a]
            t[i] = acc
        cholesky_lower(S, n)
        cholesky_lower_apply(S, t, n)
        for i in range(n):
            f = t[i]
            for a in range(d):
                b[a] -= f * V[i, a]
    else:
        cholesky_lower(S, d)
        cholesky_lower_apply(S, b, d)


@njit(cache=True, nogil=True)
def ials_solve_users(indptr, items, conf, Y, YtY, ridge, U, tiles32):
    """Each user's row: ``U[u] = (YtY + sum (c - 1) y y^T + ridge I)^-1 sum c y`` over her pairs.

    ``Y`` is ``(n_items, d)`` float64 (item rows), ``YtY`` its ``d x d`` Gramian over
    every item, ``conf`` one confidence per pair (``>= 1``), ``U`` ``(n_users, d)``
    (written). A user without pairs gets 0.

    The exact solve: the user's own device runs this same kernel on the released rows
    (:func:`streamdp.serving.local.implicit_rows`) with no previous factor to start from, and a
    cold start needs as many conjugate-gradient steps as the exact solve costs (a
    non-private training, which keeps each user's previous row, takes
    :func:`ials_cg_users`' few warm-started steps instead).

    **Whitened** (issue 44): with ``P = YtY + ridge I = L L^T`` and the item rows
    ``yw_j = L^-1 y_j`` (one ``n_items x d x d`` BLAS product per call), user ``u``'s system
    is ``(I + V^T V) b = sum c_j yw_j`` (``V`` rows ``sqrt(c_j - 1) yw_j``) and ``u = L^-T b``
    (:func:`ials_solve_whitened`); the same solution within rounding (``1e-14`` relative). A
    user's row depends on her pairs alone: the same bits whatever the users beside her, so her
    local solve is her training row bit for bit on one machine (with the same ``tiles32``).

    ``tiles32``: the whitened rows (and, from ``d = 10``, the users' tiles) in float32,
    factored and solved in float64: about ``1e-7`` relative error (``6e-8`` on a 1M-pair
    block at ``d = 65``). For the private training, whose rows are then clipped and whose sums
    get noise many orders above that; the local solve and the non-private runs keep float64.
    From :data:`BLAS_GRAM_D` on the float32 Gramians are a float32 BLAS product (twice the
    rate); below it Numba loops, at about float64's rate (at ``d = 8, 9`` from the rows,
    read as float64).

    A training whitens once per iteration (:func:`ials_whitened`) and solves each block by
    :func:`ials_solve_whitened`, what this kernel does in one call.
    """
    d = Y.shape[1]
    Li = _whitening(YtY, ridge, d)
    Yw = np.dot(Y, Li.T)
    if tiles32:
        ials_solve_whitened(indptr, items, conf, Yw.astype(np.float32), Li, U)
    else:
        ials_solve_whitened(indptr, items, conf, Yw, Li, U)


def ials_whitened(Y, YtY, ridge, tiles32=False):
    """``(Yw, Li)`` of :func:`ials_solve_users`: the whitened item rows ``L^-1 y_j`` (float32 with ``tiles32``) and
    ``L^-1``, for :func:`ials_solve_whitened` on every block of an iteration (whitened once, not per block)."""
    Li = _whitening(np.ascontiguousarray(YtY, np.float64), float(ridge), Y.shape[1])
    Yw = np.dot(Y, Li.T)
    return (Yw.astype(np.float32) if tiles32 else Yw), Li


@njit(cache=True, nogil=True, fastmath={"contract", "reassoc"})
def ials_solve_whitened(indptr, items, conf, Yw, Li, U):
    """Each user's row from the whitened item rows ``Yw`` (float64 or float32: the tiles' type), ``U[u] = L^-T b``
    (:func:`ials_solve_users`, :func:`ials_whitened`).

    Below :data:`BLAS_GRAM_D` the systems ``(I + V^T V) b = sum c_j yw_j`` are
    :func:`streamdp.kernels.linalg.solve_users_conf`'s (eight users solved together in vector lanes; at ``d`` of 8
    or 9, k = 8 with or without the popularity column, each Gramian from the rows in registers, no tile: 2-3x
    main's rate at k = 8, docs/benchmarks.md); from it on one user at a time, :func:`_solve_white_blas`."""
    d = Yw.shape[1]
    b = np.empty(d, dtype=np.float64)
    if d < BLAS_GRAM_D:
        solve_users_conf(indptr, items, conf, Yw, U)
        for u in range(len(indptr) - 1):
            for a in range(d):
                b[a] = U[u, a]
            _unwhiten(Li, b, U, u)
        return
    longest = 1
    for u in range(len(indptr) - 1):
        longest = max(longest, indptr[u + 1] - indptr[u])
    V = np.empty((longest, d), dtype=Yw.dtype)
    t = np.empty(d, dtype=np.float64)
    C = np.empty((d, d), dtype=Yw.dtype)
    S = np.empty((d, d), dtype=np.float64)
    args = np.empty(8, dtype=np.int32)
    for u in range(len(indptr) - 1):
        s, n = indptr[u], indptr[u + 1] - indptr[u]
        if n == 0:
            for a in range(d):
                U[u, a] = 0.0
            continue
        _solve_white_blas(Yw, items, conf, s, n, V, b, t, C, S, args)
        _unwhiten(Li, b, U, u)


@njit(cache=True, nogil=True, fastmath={"contract", "reassoc"})
def _unwhiten(Li, b, U, u):
    """``U[u] = L^-T b``, by rows of ``L^-1`` (contiguous: a column's sum strides ``d`` apart)."""
    d = len(b)
    for a in range(d):
        U[u, a] = 0.0
    for m in range(d):
        bm = b[m]
        for a in range(m + 1):
            U[u, a] += Li[m, a] * bm


@njit(cache=True, nogil=True, fastmath={"contract", "reassoc"})
def ials_cg_users(indptr, items, conf, Y, YtY, ridge, steps, X):
    """Each user's row improved in place by ``steps`` conjugate-gradient steps from ``X[u]``: the solve of
    :func:`ials_solve_users` done as ``implicit`` does it (non-private training only).

    User ``u``'s system ``(YtY + ridge I + sum_j (c_j - 1) y_j y_j^T) x = sum_j c_j y_j``
    is never formed: the residual and each step's product cost ``d^2`` (``YtY + ridge I``
    times a vector, as contiguous ``axpy`` rows) plus ``2 d`` per pair, so
    ``(steps + 1) (d^2 + 2 n d)`` multiply-adds for ``n`` pairs against the exact solve's
    ``n^2 d / 2 + n^3 / 6 + 4 n d`` (``n < d``) or ``n d^2 / 2 + d^3 / 6``. Warm-started from
    the previous iteration's row, 3 steps are what ``implicit`` runs (``use_cg``); from a
    cold start ``d`` steps reach the exact solve (finite termination, up to rounding).

    **float32**, as ``implicit``'s (issue 44): the user's rows ``y_j`` (gathered once into a tile), ``YtY + ridge
    I`` and the residual, direction and product vectors are float32 (eight lanes a vector instruction where
    float64 has four), the row ``x`` is accumulated in float64; the scalars ``r . r`` and ``p . A p`` are
    float64 sums. A 1M-pair block of 21,000 users, ``d = 64``, one thread: 0.063 CPU s against 0.090 s in
    float64, ``3e-6`` of the largest entry apart, far inside what three steps leave of the exact solve.
    A step stops a user's iteration when her squared residual norm is at most ``1e-20`` or the curvature
    ``p . A p`` is not positive. ``Y`` ``(n_items, d)`` float32 or float64 (read as float32), ``X`` ``(n_users,
    d)`` float64, read and written; a user without pairs gets 0 (her exact solution). The sums over ``d`` may be
    reassociated (``fastmath`` ``reassoc``: the same bits on one machine, possibly other last bits on a CPU with
    other vector widths); no clipping or noise is computed here.
    """
    d = Y.shape[1]
    M = (YtY + ridge * np.eye(d)).astype(np.float32)
    r = np.empty(d, dtype=np.float32)
    p = np.empty(d, dtype=np.float32)
    Ap = np.empty(d, dtype=np.float32)
    v = np.empty(d, dtype=np.float32)
    longest = 1
    for u in range(len(indptr) - 1):
        longest = max(longest, indptr[u + 1] - indptr[u])
    T = np.empty((longest, d), dtype=np.float32)
    cv = np.empty(longest, dtype=np.float32)
    for u in range(len(indptr) - 1):
        x = X[u]
        s, n = indptr[u], indptr[u + 1] - indptr[u]
        if n == 0:
            x[:] = 0.0
            continue
        for i in range(n):  # the user's rows gathered once: the steps then sweep a tile in cache
            j = np.uint64(items[s + i])
            cv[i] = conf[s + i]
            for a in range(d):
                T[i, a] = Y[j, a]
        for a in range(d):
            v[a] = x[a]
        _tile_product(T, cv, n, M, v, r, True)
        rs = 0.0
        for a in range(d):
            p[a] = r[a]
            rs += r[a] * r[a]
        for _ in range(steps):
            if rs <= 1e-20:
                break
            _tile_product(T, cv, n, M, p, Ap, False)
            pap = 0.0
            for a in range(d):
                pap += p[a] * Ap[a]
            if not pap > 0.0:
                break
            step = rs / pap
            step32 = np.float32(step)
            new = 0.0
            for a in range(d):
                x[a] += step * p[a]
                r[a] -= step32 * Ap[a]
                new += r[a] * r[a]
            beta = np.float32(new / rs)
            for a in range(d):
                p[a] = r[a] + beta * p[a]
            rs = new


@njit(cache=True, nogil=True, fastmath={"contract", "reassoc"})
def _tile_product(T, cv, n, M, v, out, residual):
    """``out = (M + sum_{i < n} (c_i - 1) t_i t_i^T) v`` over a user's gathered rows ``t_i = T[i]`` (confidences
    ``cv``), never forming the matrix: ``M v`` as contiguous ``axpy`` rows, then ``2 d`` per pair; with
    ``residual``, ``sum_i c_i t_i`` minus that (the conjugate-gradient residual at ``v``). All float32."""
    d = len(v)
    for b in range(d):
        out[b] = 0.0
    for a in range(d):
        va = -v[a] if residual else v[a]
        for b in range(d):
            out[b] += va * M[a, b]
    for i in range(n):
        t = np.float32(0.0)
        for a in range(d):
            t += T[i, a] * v[a]
        t *= cv[i] - np.float32(1.0)
        if residual:
            t = cv[i] - t
        for a in range(d):
            out[a] += t * T[i, a]


@njit(cache=True, nogil=True)
def ials_accumulate(indptr, items, conf, weights, U, clip, clip_last, B, A, G):
    """Accumulate one block's item-side sums (module docstring); returns the number of clipped users.

    ``U`` ``(n_users, d)``; ``G`` ``(d, d)`` (upper triangle accumulated, completed by
    :func:`streamdp.kernels.als.symmetrize_upper`); ``A`` ``(n_items, d (d + 1) / 2)`` or
    empty (packed as :func:`streamdp.kernels.als.packed_index`); ``B`` ``(n_items, k)``
    with ``k = d`` or ``d - 1``. When ``k = d - 1`` the row's last coordinate (a user's
    weight on the popularity column) is clipped on its own to ``[-clip_last, clip_last]``
    and the first ``k`` to norm ``clip``, and ``B`` gets the first ``k`` only; otherwise the
    whole row is clipped to ``clip``. Users without pairs add nothing. The rows are
    clipped and the pairs taken by :func:`streamdp.kernels.als.item_side_sums`, shared with als
    (in the users' order, chunks of :data:`streamdp.kernels.als.USER_CHUNK` users, while ``A``
    and ``B`` fit in cache, item by item beyond).
    """
    zero = np.zeros(len(indptr) - 1, dtype=np.float64)
    return item_side_sums(indptr, items, weights, conf, zero, np.inf, conf, False, U, B.shape[1], U.shape[1], clip,
                          False, clip_last, B, A, G)


#: How many pairs ahead :func:`ials_item_products` asks for the item rows it will read and add to
#: (:func:`streamdp.kernels.lanes.prefetch_row`).
PRODUCTS_AHEAD = 8


@njit(cache=True, nogil=True, fastmath={"contract", "reassoc"})
def ials_item_products(indptr, items, conf, weights, X, P, out, residual):
    """``out_j += sum_{u in j} w_uj (c_uj - 1) (x_u . p_j) x_u`` over a block's pairs: ``A_j p_j`` without ``A_j``.

    With ``residual``, ``out_j += sum_{u in j} w_uj (c_uj - (c_uj - 1) x_u . p_j) x_u`` instead:
    ``B_j - A_j p_j`` in the same sweep (the per-item part of the initial residual).

    The per-item part of the item system's product with a vector per item, which the
    item side's conjugate-gradient solve (:mod:`streamdp.methods.ials`, non-private runs)
    needs once per step: ``2 d`` multiply-adds per pair where forming ``A_j`` costs
    ``d (d + 1) / 2``. ``X`` ``(n_users, d)`` the block's user rows, ``P`` and ``out``
    ``(n_items, d)``, float64 or (the training's item passes) float32 alike: the sums over ``d``
    are taken in float64 either way, a float32 ``out`` rounds each pair's addition (on the
    non-private training's products, relative error of a block's partial at most ``1e-5`` of
    its largest entry; a 1M-pair block at ``d = 64``: 0.032 against 0.042 CPU s in float64,
    half the bytes of the random rows of ``P`` and ``out``). In the users' order (each row
    read once; ``P`` and ``out``, megabytes, stay in cache): 0.05 CPU s per 1M-pair block at
    ``d = 64`` (float64) against 0.19 s item by item, which gathers a user row per pair. The
    dot products may be reassociated (``fastmath`` ``reassoc``, so that they vectorize): the
    same bits on one machine, possibly other last bits on a CPU with other vector widths;
    non-private runs only (no clipping, no noise). The rows of ``P`` and ``out`` are megabytes of
    random rows beyond the core's own cache: the loop waited on them (a ``perf`` profile,
    ``bench/perfmap.py``: most samples at the first load of each), so each pair asks for the
    rows of the pair :data:`PRODUCTS_AHEAD` later (:func:`streamdp.kernels.lanes.prefetch_row`,
    a hint: the same bits). A 1M-pair block of the 20M-pair bench store, ``d = 64``, float32,
    one core, three alternated runs: 40-51 -> 28-35 ns a pair.
    """
    d = X.shape[1]
    nq = len(items)
    for u in range(len(indptr) - 1):
        for p in range(indptr[u], indptr[u + 1]):
            if p + PRODUCTS_AHEAD < nq:  # the rows of P and out a later pair reads: asked for now
                ahead = np.uint64(items[p + PRODUCTS_AHEAD])
                prefetch_row(P, ahead)
                prefetch_row(out, ahead)
            wp = weights[p]
            if wp == 0.0 or (conf[p] == 1.0 and not residual):
                continue
            j = np.uint64(items[p])
            s = 0.0
            for a in range(d):
                s += X[u, a] * P[j, a]
            s *= wp * (conf[p] - 1.0)
            if residual:
                s = wp * conf[p] - s
            for a in range(d):
                out[j, a] += s * X[u, a]


def ials_item_products_reference(indptr, items, conf, weights, X, P, residual=False):
    """NumPy reference of :func:`ials_item_products` (a new ``out``)."""
    rows = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    f = weights * (conf - 1.0) * np.einsum("pa,pa->p", X[rows], P[items])
    if residual:
        f = weights * conf - f
    out = np.zeros(P.shape)
    np.add.at(out, items, f[:, None] * X[rows])
    return out


def _user_systems(indptr, items, conf, Y, YtY, ridge):
    """``(u, M_u, b_u)`` of each user with pairs: her system ``M_u x = b_u`` formed in NumPy (the references)."""
    d = Y.shape[1]
    for u in range(len(indptr) - 1):
        s, e = indptr[u], indptr[u + 1]
        if e > s:
            Yu, c = Y[items[s:e]], conf[s:e]
            yield u, YtY + (Yu * (c - 1.0)[:, None]).T @ Yu + ridge * np.eye(d), Yu.T @ c


def ials_cg_users_reference(indptr, items, conf, Y, YtY, ridge, steps, X):
    """NumPy reference of :func:`ials_cg_users` (a new array; ``X`` the starting rows)."""
    out = np.zeros_like(X)
    for u, M, b in _user_systems(indptr, items, conf, Y, YtY, ridge):
        x = X[u].copy()
        r = b - M @ x
        p, rs = r.copy(), r @ r
        for _ in range(steps):
            if rs <= 1e-20:
                break
            Ap = M @ p
            pap = p @ Ap
            if not pap > 0.0:
                break
            x += rs / pap * p
            r -= rs / pap * Ap
            new = r @ r
            p, rs = r + new / rs * p, new
        out[u] = x
    return out


def ials_solve_users_reference(indptr, items, conf, Y, YtY, ridge):
    """NumPy reference of :func:`ials_solve_users`."""
    U = np.zeros((len(indptr) - 1, Y.shape[1]))
    for u, M, b in _user_systems(indptr, items, conf, Y, YtY, ridge):
        U[u] = np.linalg.solve(M, b)
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
        chol_solve(M, x, k)
        for a in range(k):
            out[j, a] = x[a]


@njit(cache=True, nogil=True)
def rating_confidences(items, values, keep, graded, lo, hi, alpha, cmax, out_items, out_conf):
    """One pass over a rating block for :func:`streamdp.serving.local.implicit_pairs`: each pair's confidence
    ``c = 1 + min(alpha f, cmax - 1)``, ``f = (clip(r, lo, hi) - lo) / (hi - lo)`` (``graded``) or 1, into
    ``out_conf``. ``keep`` empty: every rating is a pair, ``out_items`` untouched (the block's items are theirs);
    else only the ratings with ``keep`` set are (above the middle of the range, not held out), their items into
    ``out_items``; both outputs then hold the pairs' count plus one spare slot, which the rejected ratings after the
    last pair are written to. The same float64 operations as NumPy's form, so the same bits; no temporary per rating
    (the NumPy form made eight: a third of a private ``ials`` run's CPU on a 90M-rating store)."""
    span = max(hi - lo, 1e-300)
    top = cmax - 1.0
    if len(keep) == 0:
        for p in range(len(items)):
            r = np.float64(values[p])
            f = (min(max(r, lo), hi) - lo) / span if graded else 1.0
            out_conf[p] = 1.0 + min(alpha * f, top)
        return len(items)
    n = 0
    last = len(out_items) - 1
    for p in range(len(items)):
        # written whether kept or not, then overwritten by the next pair unless kept: no branch to mispredict (the
        # comparison is a coin flip on real ratings); min() keeps a short array's writes inside it
        r = np.float64(values[p])
        f = (min(max(r, lo), hi) - lo) / span if graded else 1.0
        out_items[min(n, last)] = items[p]
        out_conf[min(n, last)] = 1.0 + min(alpha * f, top)
        n += keep[p]
    return n


def rating_confidences_reference(indptr, items, values, above, graded, lo, hi, alpha, cmax, drop=None):
    """The NumPy form of :func:`rating_confidences` (with :func:`streamdp.kernels.csr.masked_indptr`), what
    :func:`streamdp.serving.local.implicit_pairs` computed before them: ``(indptr, items, confidences)``; ``drop``:
    positions removed first (``np.delete``), as the training's held-out ratings were by a copy of the block."""
    def kept(indptr, keep):  # the offsets of the pairs kept, by a user index and bincount
        users = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
        return np.concatenate([[0], np.cumsum(np.bincount(users[keep], minlength=len(indptr) - 1))])

    if drop is not None and len(drop):
        keep = np.ones(len(items), bool)
        keep[np.asarray(drop, np.int64)] = False
        indptr, items, values = kept(indptr, keep), np.asarray(items)[keep], np.asarray(values)[keep]
    v = np.asarray(values, np.float64)
    f = (np.clip(v, lo, hi) - lo) / max(hi - lo, 1e-300) if graded else np.ones(len(v))
    if above:
        keep = v > (lo + hi) / 2.0
        indptr, items, f = kept(indptr, keep), items[keep], f[keep]
    return np.asarray(indptr, np.int64), np.asarray(items, np.int32), 1.0 + np.minimum(alpha * f, cmax - 1.0)
