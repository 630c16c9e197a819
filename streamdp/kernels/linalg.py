"""Block linear algebra on CSR user blocks: ``A_b^T (A_b V)``, residuals, local ridge solves.

All kernels take raw arrays (a block's local ``indptr``, ``items``, per-rating
``values``) and write into preallocated outputs; they release the GIL so the stream
engine runs blocks on all cores. Each has a NumPy/SciPy reference in the tests.
"""

from __future__ import annotations

import llvmlite.binding as _llvm
import numpy as np
from numba import types
from numba.core.extending import get_cython_function_address

from streamdp.kernels.jit import njit
from streamdp.kernels.lanes import (LANES, ROWS_AHEAD, prefetch_row, vdiv, vfma, vfma1, vfnma, vload, vmul, vpivot,
                                   vsplat, vstore, vsub)

# BLAS ?syrk (SciPy's Fortran-ABI pointers) under fixed symbol names, registered before any cached kernel that calls
# them is loaded (importing this module does it): the cached code links by name, as Numba's own BLAS calls do.
for _kind in ("s", "d"):
    _llvm.add_symbol(f"streamdp_{_kind}syrk", get_cython_function_address("scipy.linalg.cython_blas", f"{_kind}syrk"))
_SYRK_SIG = types.void(*[types.intp] * 10)  # ten pointers (uplo, trans, n, k, alpha, a, lda, beta, c, ldc)
_ssyrk = types.ExternalFunction("streamdp_ssyrk", _SYRK_SIG)
_dsyrk = types.ExternalFunction("streamdp_dsyrk", _SYRK_SIG)


#: Scratch budget of :func:`gram_apply_range`'s ``A_c V`` buffer, in bytes (per call):
#: 64k users at k=16, 16k at k=64, 4k at k=256.
GRAM_SCRATCH_BYTES = 8 << 20


@njit(cache=True, nogil=True)
def gram_apply(indptr, items, values, V, out):
    """``out += A^T (A V)`` for the CSR rows ``(indptr, items, values)``.

    ``V`` is ``(n_items, k)`` float64, ``out`` the same shape (accumulated into).
    Cost ``2 nnz k`` multiply-adds; see :func:`gram_apply_range` for the loop order.
    """
    gram_apply_range(indptr, items, values, V, ZERO, len(indptr) - 1, out)


@njit(cache=True, nogil=True, fastmath={"contract"})
def gram_apply_range(indptr, items, values, V, u0, u1, out):
    """:func:`gram_apply` restricted to the users ``u0 <= u < u1`` of the block.

    Loop order, measured: the users are taken in chunks of at most
    ``GRAM_SCRATCH_BYTES`` of scratch (a whole store block at k <= 64); for a chunk
    ``T = A_c V`` is computed first (random reads of ``V`` only), then
    ``out += A_c^T T`` (random updates of ``out`` only). Fusing the two per user
    (one row's ``t = a_u^T V`` then its scatter) touches ``V`` and ``out`` together,
    twice the random working set: at k=16 and 20k items that is 5 MB against a
    2 MB per-core L2, and it ran 0.85x scipy's two-sweep ``A.T @ (A @ V)`` per core
    where the chunked order runs 1.05-1.1x (paired runs, 20M ratings), without
    scipy's ``n_users x k`` intermediate. Each switch between the sweeps re-warms
    ``V`` in cache, so chunks are as large as the scratch budget allows (8192-user
    chunks lost about 10% to the unchunked two sweeps on a 42M-rating slice). Item indices are read as unsigned, which
    drops Numba's negative-index wraparound from the inner loops; ``T``'s row takes
    two ratings per sweep, and multiply-adds may fuse (``fastmath={"contract"}``:
    FMA only, no reassociation), each worth a few percent.
    """
    k = V.shape[1]
    chunk = max(64, GRAM_SCRATCH_BYTES // (8 * max(k, 1)))
    chunk = max(1, min(chunk, u1 - u0))
    T = np.empty((chunk, k), dtype=np.float64)
    for c0 in range(u0, u1, chunk):
        c1 = min(u1, c0 + chunk)
        for u in range(c0, c1):
            r = u - c0
            for d in range(k):
                T[r, d] = 0.0
            p, e = indptr[u], indptr[u + 1]
            while p + 1 < e:  # two ratings per sweep of T's row: half the loads/stores of T
                j0, j1 = np.uint64(items[p]), np.uint64(items[p + 1])
                x0, x1 = values[p], values[p + 1]
                for d in range(k):
                    T[r, d] += x0 * V[j0, d] + x1 * V[j1, d]
                p += 2
            if p < e:
                j = np.uint64(items[p])
                x = values[p]
                for d in range(k):
                    T[r, d] += x * V[j, d]
        for u in range(c0, c1):
            r = u - c0
            for p in range(indptr[u], indptr[u + 1]):
                j = np.uint64(items[p])
                x = values[p]
                for d in range(k):
                    out[j, d] += x * T[r, d]


@njit(cache=True, nogil=True)
def residuals(items, ratings, global_mean, item_bias, out):
    """``out[p] = ratings[p] - global_mean - item_bias[items[p]]`` (float64)."""
    for p in range(len(items)):
        out[p] = ratings[p] - global_mean - item_bias[items[p]]


@njit(cache=True, nogil=True, fastmath={"contract", "reassoc"})
def cholesky_lower(G, d):
    """Overwrite the lower triangle of ``G[:d, :d]`` (symmetric positive definite) with ``L``, ``L L^T = G``.

    Column by column (Crout): column ``j``'s entries below the diagonal are independent dot
    products of rows of ``L`` (contiguous, four rows per sweep sharing the loads of row ``j``),
    so they overlap in the pipeline where the row-by-row order (the ``ridge_solve`` it
    replaced, ``bench/_before.py``) waits on each entry's division before the next. Measured
    at ``d = 65``: 11 us against 60-100 us (busy machine). A non-positive pivot is taken as
    ``1e-300``. The dot products may be reassociated (``fastmath`` ``reassoc``, so that they
    vectorize): the same bits on one machine, possibly other last bits on a CPU with other
    vector widths. Reads and writes the lower triangle only.
    """
    for j in range(d):
        t = 0.0
        for m in range(j):
            t += G[j, m] * G[j, m]
        acc = G[j, j] - t
        r = np.sqrt(acc) if acc > 0 else 1e-300
        G[j, j] = r
        inv = 1.0 / r
        i = j + 1
        while i + 3 < d:
            t0 = t1 = t2 = t3 = 0.0
            for m in range(j):
                g = G[j, m]
                t0 += G[i, m] * g
                t1 += G[i + 1, m] * g
                t2 += G[i + 2, m] * g
                t3 += G[i + 3, m] * g
            G[i, j] = (G[i, j] - t0) * inv
            G[i + 1, j] = (G[i + 1, j] - t1) * inv
            G[i + 2, j] = (G[i + 2, j] - t2) * inv
            G[i + 3, j] = (G[i + 3, j] - t3) * inv
            i += 4
        while i < d:
            t0 = 0.0
            for m in range(j):
                t0 += G[i, m] * G[j, m]
            G[i, j] = (G[i, j] - t0) * inv
            i += 1


@njit(cache=True, nogil=True)
def syrk_lower(V, n, rows, C, args):
    """The lower triangle of ``C`` (C order, float64 or float32 as ``V``) from one BLAS ``?syrk``: ``C[:n, :n] =
    V[:n] V[:n]^T`` with ``rows``, else ``C[:d, :d] = V[:n]^T V[:n]`` (``V`` C-contiguous ``(m, d)``, ``m >= n``; ``C``
    C-contiguous with at least as many columns as rows written; the upper triangle untouched).

    Half the multiply-adds of the full product ``numpy.dot`` computes, into a preallocated ``C``;
    ``args`` is a scratch ``int32`` array of at least 8 entries (the Fortran ABI's by-reference
    arguments). A user's whitened Gramian (:func:`streamdp.kernels.ials.ials_solve_users`): 1M pairs of
    21,000 users at ``d = 65`` in float32, the Gramians 0.22 CPU s by ``numpy.dot`` with its result's
    copies, about half with this.
    """
    d = V.shape[1]
    args[0] = ord("U")  # Fortran's upper triangle of the column-major C: C order's lower
    args[1] = ord("T") if rows else ord("N")
    args[2] = n if rows else d
    args[3] = d if rows else n
    args[4] = d  # lda: V's rows, Fortran's columns
    args[5] = C.shape[1]
    a = args.ctypes.data
    if V.itemsize == 4:  # float32
        sc = np.array([1.0, 0.0], dtype=np.float32)
        _ssyrk(a, a + 4, a + 8, a + 12, sc.ctypes.data, V.ctypes.data, a + 16, sc.ctypes.data + 4, C.ctypes.data,
               a + 20)
    else:
        sc = np.array([1.0, 0.0], dtype=np.float64)
        _dsyrk(a, a + 4, a + 8, a + 12, sc.ctypes.data, V.ctypes.data, a + 16, sc.ctypes.data + 8, C.ctypes.data,
               a + 20)


@njit(cache=True, nogil=True, fastmath={"contract", "reassoc"})
def cholesky_lower_apply(L, x, d):
    """``x[:d] = (L L^T)^-1 x[:d]`` in place, ``L`` the lower triangle :func:`cholesky_lower` wrote."""
    for i in range(d):  # L y = x: row dot products
        t = 0.0
        for m in range(i):
            t += L[i, m] * x[m]
        x[i] = (x[i] - t) / L[i, i]
    for i in range(d - 1, -1, -1):  # L^T z = y: a contiguous axpy of row i per step
        xi = x[i] / L[i, i]
        x[i] = xi
        for m in range(i):
            x[m] -= xi * L[i, m]


#: Typed constants for the kernels' calls of one another: a literal ``0``, ``1`` or ``False`` passed to a jitted
#: function compiles it again for that literal (Numba types a constant argument as ``Literal[int](0)``), and
#: :func:`_solve_lanes`' chain is ~4 s of compile per copy: these are ``int64`` and ``bool``, the types a call from
#: Python has, so every caller shares one compiled copy (11 copies of :func:`_solve_lanes` were compiled in a run of
#: the test suite, 3 of :func:`solve_users_huber`).
ZERO, ONE, NO, YES = np.int64(0), np.int64(1), np.bool_(False), np.bool_(True)


#: The largest system (``d``, the intercept included) :func:`solve_users_huber` and :func:`solve_users_conf` solve in
#: lanes of :data:`~streamdp.kernels.lanes.LANES` users (:func:`chol_solve_lanes`); above it, one user at a time.
LANE_D = 17


@njit(cache=True, nogil=True)
def chol_solve_lanes(G, x, d):
    """Eight systems at once: for each lane ``g``, ``x[:d, g] = G[:d, :d, g]^-1 x[:d, g]``.

    ``G`` is ``(>= d, >= d, 8)`` C-contiguous, symmetric positive definite per lane (lower
    triangles read, overwritten by ``L``, ``L L^T = G``), ``x`` ``(>= d, 8)``. Each lane does
    :func:`cholesky_lower` then :func:`cholesky_lower_apply`'s operations (a non-positive
    pivot taken as ``1e-300``), in vectors of eight lanes (:mod:`streamdp.kernels.lanes`):
    one user's Cholesky is a chain of dependent square roots and divisions, and eight users'
    chains run side by side. Each sum runs from ``m = 0`` up with fused multiply-adds, no
    reassociation: a lane's bits depend on nothing else, on any CPU. A lane holding the
    identity and a zero right-hand side stays so.
    """
    for j in range(d):
        t = vsplat(0.0)
        for m in range(j):
            a = vload(G, (j, m))
            t = vfma(a, a, t)
        r = vpivot(vsub(vload(G, (j, j)), t))
        vstore(G, (j, j), r)
        inv = vdiv(vsplat(1.0), r)
        for i in range(j + 1, d):
            t = vsplat(0.0)
            for m in range(j):
                t = vfma(vload(G, (i, m)), vload(G, (j, m)), t)
            vstore(G, (i, j), vmul(vsub(vload(G, (i, j)), t), inv))
    for i in range(d):  # L y = x: row dot products
        t = vsplat(0.0)
        for m in range(i):
            t = vfma(vload(G, (i, m)), vload(x, (m,)), t)
        vstore(x, (i,), vdiv(vsub(vload(x, (i,)), t), vload(G, (i, i))))
    for i in range(d - 1, -1, -1):  # L^T z = y: an axpy of row i per step
        xi = vdiv(vload(x, (i,)), vload(G, (i, i)))
        vstore(x, (i,), xi)
        for m in range(i):
            vstore(x, (m,), vfnma(xi, vload(G, (i, m)), vload(x, (m,))))


@njit(cache=True, nogil=True, fastmath={"contract", "reassoc"})
def gram_lower(W, T, n, d, G):
    """``G[a, b] = sum_{i < n} W[a, i] T[b, i]`` for ``b <= a`` (and up to three entries past the diagonal).

    ``W`` and ``T`` are ``(d, >= n)`` tiles of a user's item rows, transposed (one row per
    coordinate, contiguous over the user's ratings): ``T`` the rows, ``W`` the rows times
    each rating's weight (``T`` itself when unweighted), so that ``G`` is the weighted
    Gramian ``sum_i w_i t_i t_i^T``'s lower triangle. Four entries of a row of ``G`` per
    sweep over the ratings (row ``a`` of ``W`` loaded once for four of ``T``); the sums over
    the ratings may be reassociated (``fastmath`` ``reassoc``, so that they vectorize).
    A tile padded with zero columns past ``n`` may be passed with ``n`` rounded up
    (:func:`padded`): the padding adds exact zeros.
    """
    for a in range(d):
        b = 0
        while b <= a and b + 3 < d:
            s0 = s1 = s2 = s3 = 0.0
            for i in range(n):
                t = W[a, i]
                s0 += t * T[b, i]
                s1 += t * T[b + 1, i]
                s2 += t * T[b + 2, i]
                s3 += t * T[b + 3, i]
            G[a, b] = s0
            G[a, b + 1] = s1
            G[a, b + 2] = s2
            G[a, b + 3] = s3
            b += 4
        while b <= a:
            s0 = 0.0
            for i in range(n):
                s0 += W[a, i] * T[b, i]
            G[a, b] = s0
            b += 1


#: A user's tile is padded with zero columns to a multiple of this many ratings (:func:`padded`): measured on 10M
#: ratings, one core, 4 ran a little faster than 8 or 16 at k = 8 and 16 (fewer zeros, the same vector loops).
TILE_PAD = 4


@njit(cache=True, nogil=True)
def padded(n):
    """``n`` rounded up to a multiple of :data:`TILE_PAD` (at least one multiple)."""
    return max((n + TILE_PAD - 1) // TILE_PAD, 1) * TILE_PAD


@njit(cache=True, nogil=True)
def _gather_tile(items, s, e, Q, T, cap):
    """``T[:, :e - s]`` = the rows ``Q[items[s:e]]`` transposed, zero columns up to ``cap`` (:func:`padded`).

    A row of nine (k = 8 and the intercept) is copied through nine scalars: measured on 10M
    ratings, one core, the gather 1.5x and the k = 8 user solve 1.2x the loop over ``a``
    (a row of 17 or 65 as blocks of eight gained 5-10% on the gather, nothing on the solve).
    """
    d = Q.shape[1]
    if d == 9:
        for i in range(e - s):
            j = np.uint64(items[s + i])
            q0, q1, q2, q3, q4 = Q[j, 0], Q[j, 1], Q[j, 2], Q[j, 3], Q[j, 4]
            q5, q6, q7, q8 = Q[j, 5], Q[j, 6], Q[j, 7], Q[j, 8]
            T[0, i] = q0
            T[1, i] = q1
            T[2, i] = q2
            T[3, i] = q3
            T[4, i] = q4
            T[5, i] = q5
            T[6, i] = q6
            T[7, i] = q7
            T[8, i] = q8
    else:
        for i in range(e - s):
            j = np.uint64(items[s + i])
            for a in range(d):
                T[a, i] = Q[j, a]
    for a in range(d):
        for i in range(e - s, cap):
            T[a, i] = 0.0


@njit(cache=True, nogil=True)
def _gather_user(items, resid, s, e, Q, T, y, cap):
    """One user's tile (:func:`_gather_tile`) and her residuals ``y[:e - s]``, both zero-padded up to ``cap``."""
    _gather_tile(items, s, e, Q, T, cap)
    for i in range(e - s):
        y[i] = resid[s + i]
    for i in range(e - s, cap):
        y[i] = 0.0


@njit(cache=True, nogil=True)
def solve_users(indptr, items, resid, Q, ridge, U):
    """Per-user ridge regression: ``U[u] = argmin ||resid_u - Q_{I_u} x||^2 + ridge ||x||^2``.

    ``Q`` is ``(n_items, k)`` float64, ``U`` ``(n_users, k)`` float64 (written).
    A user without ratings gets ``x = 0``. (:func:`solve_users_huber` with no
    reweighting.)
    """
    solve_users_huber(indptr, items, resid, Q, ridge, ZERO, np.inf, U)


@njit(cache=True, nogil=True, fastmath={"contract", "reassoc"})
def solve_users_huber(indptr, items, resid, Q, ridge, irls_iters, delta, U):
    """Per-user ridge regression with a Huber data loss, by iteratively reweighted least squares.

    ``U[u] = argmin_x sum_{p in I_u} H_delta(resid_p - Q_{items_p} . x) + ridge ||x||^2 / 2`` approximately:
    ``irls_iters`` reweighting steps after the plain ridge solve, each with weights
    ``w_p = min(1, delta / |e_p|)`` of the previous solve's residuals ``e_p`` (the
    Huber influence function over the residual, Holland & Welsch 1977; the R-IRLS of
    the Huber-mechanism paper, seed 001, Alg. 3). ``irls_iters = 0`` is the plain
    ridge solve (the squared loss). ``Q`` is ``(n_items, k)`` float64 (the released
    item factors, with a column of ones for a user intercept), ``U`` is written.

    Per user, her rows of ``Q`` are gathered into a dense tile, transposed and padded to
    a multiple of :data:`TILE_PAD` ratings (:func:`_gather_tile`); the Gramian is a small dense product
    on it (:func:`gram_lower`), the ridge added to its diagonal afterwards. At ``k = 9``
    (k = 8 and the intercept) the Gramians come from ``Q``'s rows instead, in vector
    registers, without a tile, in one loop with no call per user (:func:`_solve_users_rows`;
    the reweighting per group of eight, :func:`_rows_group`). Up to
    :data:`LANE_D` columns, eight users' systems are then solved together
    (:func:`chol_solve_lanes`, reweighted together too); above, each by
    :func:`cholesky_lower`. Measured (``bench/roofline.py``, one core) against the
    per-rating kernel it replaced: see docs/benchmarks.md. The tile's sums may be
    reassociated (``fastmath`` ``reassoc``); the lanes' and the rows' run in a fixed order,
    and a user's row does not depend on the users beside her: the training and a user's own
    local solve run this kernel, so they agree bit for bit on one machine; against the old
    kernel (and across CPUs with other vector widths) the rows agree to about ``1e-13`` relative.
    """
    k = Q.shape[1]
    if by_rows(Q):
        _solve_users_rows(indptr, items, resid, Q, ridge, NO, irls_iters, delta, U)
        return
    longest = 0
    for u in range(len(indptr) - 1):
        longest = max(longest, indptr[u + 1] - indptr[u])
    if k <= LANE_D:
        _solve_users_lanes(indptr, items, resid, Q, ridge, irls_iters, delta, U, padded(longest))
        return
    cap = padded(longest)
    T = np.zeros((k, cap), dtype=np.float64)
    W = np.zeros((k, cap), dtype=np.float64)
    y = np.zeros(cap, dtype=np.float64)
    e_ = np.zeros(cap, dtype=np.float64)
    G = np.empty((k, k), dtype=np.float64)
    x = np.empty(k, dtype=np.float64)
    for u in range(len(indptr) - 1):
        s = indptr[u]
        e = indptr[u + 1]
        n = e - s
        if n == 0:
            for a in range(k):
                U[u, a] = 0.0
            continue
        m = padded(n)
        _gather_user(items, resid, s, e, Q, T, y, m)
        _solve_tile_huber(T, W, y, e_, m, k, G, x, ridge, irls_iters, delta)
        for a in range(k):
            U[u, a] = x[a]


#: With reweighting on tiles (``k != 9``), :func:`solve_users_huber`'s lanes keep their users' tiles, each of up to
#: this many ratings (eight tiles of ``LANE_D x LANE_TILE`` doubles, 1.1 MB); a longer user is solved in lanes of
#: her own.
LANE_TILE = 1024


@njit(cache=True, nogil=True)
def _solve_users_lanes(indptr, items, resid, Q, ridge, irls_iters, delta, U, cap):
    """:func:`solve_users_huber` in lanes of eight users (``Q``'s ``k <= LANE_D`` columns, users of up to ``cap``
    padded ratings): each user's Gramian and right-hand side (:func:`_first_system`) copied into a free lane;
    every eighth user, the lanes are solved (:func:`_solve_lanes`) and written to ``U``.

    A user's tile is ``(k, m)``, packed (its rows ``m`` apart, not ``cap``), in a flat buffer: with reweighting the
    eight tiles follow one another."""
    k = Q.shape[1]
    rows = by_rows(Q)
    keep = irls_iters > 0 and not rows  # the reweighting needs each user's tile again
    tiles = keep or not rows  # a user's tile is gathered
    tcap = min(cap, LANE_TILE) if keep else cap
    slots = LANES if keep else 1
    lcap = cap if cap > tcap else 0  # a long user's own tile
    Tb = np.zeros((slots * k * tcap + k * lcap) if tiles else 0, dtype=np.float64)  # the group's tiles, a long one
    yb = np.zeros((slots * tcap + lcap) if tiles else 0, dtype=np.float64)
    W = np.zeros(k * cap if keep else 0, dtype=np.float64)
    e_ = np.zeros(cap if keep else 0, dtype=np.float64)
    G = np.empty((k, k), dtype=np.float64)
    x = np.empty(k, dtype=np.float64)
    Gb = np.empty((2, k, k, LANES), dtype=np.float64)  # [0] the group's lanes, [1] a long user's
    xb = np.empty((2, k, LANES), dtype=np.float64)
    cols = np.zeros((2, LANES + 1), dtype=np.int64)  # [0] the group's tiles' first columns in Tb (and the next)
    cols[1, 0] = slots * tcap  # [1] a long user's tile
    who = np.empty(LANES, dtype=np.int64)
    S = np.empty((10, LANES), dtype=np.float64)
    src = (items, resid, Q, rows, S)
    se = np.empty((2, LANES, 2), dtype=np.int64)  # [0] the group's users' ratings (start, end), [1] a long user's
    nb = ZERO  # int64, not Literal[int](0): see ZERO
    for u in range(len(indptr) - 1):
        s = indptr[u]
        e = indptr[u + 1]
        if e == s:
            for a in range(k):
                U[u, a] = 0.0
            continue
        m = padded(e - s)
        long_ = m > tcap
        c = cols[1, 0] if long_ else (cols[0, nb] if keep else 0)
        if tiles:
            T = Tb[k * c:k * (c + m)].reshape((k, m))
            y = yb[c:c + m]
            _gather_user(items, resid, s, e, Q, T, y, m)
        else:
            T = Tb[:0].reshape((k, 0))
            y = yb[:0]
        _first_system(items, resid, s, e, Q, rows, T, y, m, G, x, S)
        if long_:
            cols[1, 1] = c + m
            _to_lane(G, x, ridge, Gb[1], xb[1], ZERO, k)
            se[1, 0, 0], se[1, 0, 1] = s, e
            _solve_lanes(Tb, yb, cols[1], ONE, k, W, e_, G, x, Gb[1], xb[1], ridge, irls_iters, delta, src, se[1])
            for a in range(k):
                U[u, a] = xb[1, a, 0]
            continue
        _to_lane(G, x, ridge, Gb[0], xb[0], nb, k)
        who[nb] = u
        se[0, nb, 0], se[0, nb, 1] = s, e
        cols[0, nb + 1] = c + m
        nb += 1
        if nb == LANES:
            _solve_lanes(Tb, yb, cols[0], nb, k, W, e_, G, x, Gb[0], xb[0], ridge, irls_iters, delta, src, se[0])
            _lanes_to_rows(xb[0], who, nb, k, U)
            nb = ZERO
    if nb > 0:
        _solve_lanes(Tb, yb, cols[0], nb, k, W, e_, G, x, Gb[0], xb[0], ridge, irls_iters, delta, src, se[0])
        _lanes_to_rows(xb[0], who, nb, k, U)


@njit(cache=True, nogil=True)
def _solve_users_rows(indptr, items, resid, Q, ridge, conf, irls_iters, delta, U):
    """Users' rows where each Gramian comes from ``Q``'s rows in registers (8 or 9 contiguous columns), without
    reweighting: :func:`solve_users_huber`'s plain solve at k = 9 (``conf`` false) and :func:`solve_users_conf`'s
    (``conf``: ``resid`` the confidences, ``w_p = c_p - 1``, ``ridge`` 1). :func:`_gram_rows`, :func:`_rows_out`
    and :func:`_to_lane` written out in the loop over the users, each user's system straight into a free lane,
    eight solved at a time by :func:`chol_solve_lanes`: the same operations in the same order as the calls it
    replaced, so the same bits, without a call per user, each of which passed arrays whose reference counts cost
    more than the Gramian. One 1M-rating block of the 91M store, one core, k = 9: its Gramians by calls 4.9 ms, in
    the loop 2.0 ms; the whole solve 12.6-13.0 ms -> 6.5-6.7 ms. ``Q`` (1.4 MB at 20,000 items) is beyond the
    core's own cache and its rows come in the ratings' order, known ahead: each rating asks for the row of the one
    :data:`~streamdp.kernels.lanes.ROWS_AHEAD` later (a hint, the same bits): 6.0-6.4 -> 5.5-6.0 ms a 0.94M-rating
    block of the 100M store, one core (2,000 items, a ``Q`` in cache: unchanged). A user without ratings gets 0. With
    ``irls_iters`` (k = 9), each full group is solved and reweighted by :func:`_rows_group` (one call per eight
    users, as :func:`_solve_lanes` and :func:`_weighted_rows9` did it)."""
    d = Q.shape[1]
    nine = d == 9
    n_pairs = indptr[len(indptr) - 1]
    Gb = np.empty((d, d, LANES), dtype=np.float64)
    xb = np.empty((d, LANES), dtype=np.float64)
    S = np.empty((10, LANES), dtype=np.float64)
    who = np.empty(LANES, dtype=np.int64)
    se = np.empty((LANES, 2), dtype=np.int64)
    nb = ZERO
    for u in range(len(indptr) - 1):
        s = indptr[u]
        e = indptr[u + 1]
        if e == s:
            for a in range(d):
                U[u, a] = 0.0
            continue
        c0 = c1 = c2 = c3 = c4 = c5 = c6 = c7 = c8 = r = vsplat(0.0)
        g88 = 0.0
        r8 = 0.0
        for p in range(s, e):
            if p + ROWS_AHEAD < n_pairs:  # the row of Q a later rating reads: asked for now
                prefetch_row(Q, np.uint64(items[p + ROWS_AHEAD]))
            j = np.uint64(items[p])
            v = vload(Q, (j,))
            yp = resid[p]
            w = yp - 1.0 if conf else 1.0
            vw = vmul(v, vsplat(w))
            c0 = vfma(vw, vsplat(Q[j, 0]), c0)
            c1 = vfma(vw, vsplat(Q[j, 1]), c1)
            c2 = vfma(vw, vsplat(Q[j, 2]), c2)
            c3 = vfma(vw, vsplat(Q[j, 3]), c3)
            c4 = vfma(vw, vsplat(Q[j, 4]), c4)
            c5 = vfma(vw, vsplat(Q[j, 5]), c5)
            c6 = vfma(vw, vsplat(Q[j, 6]), c6)
            c7 = vfma(vw, vsplat(Q[j, 7]), c7)
            r = vfma(v, vsplat(yp), r)
            if nine:
                q8 = np.float64(Q[j, 8])
                q8w = q8 * w
                c8 = vfma(v, vsplat(q8w), c8)
                g88 = vfma1(q8w, q8, g88)
                r8 = vfma1(q8, yp, r8)
        vstore(S, (0,), c0)
        vstore(S, (1,), c1)
        vstore(S, (2,), c2)
        vstore(S, (3,), c3)
        vstore(S, (4,), c4)
        vstore(S, (5,), c5)
        vstore(S, (6,), c6)
        vstore(S, (7,), c7)
        vstore(S, (8,), c8)
        vstore(S, (9,), r)
        for a in range(8):
            for b in range(a + 1):
                Gb[a, b, nb] = S[b, a]
            Gb[a, a, nb] += ridge
            xb[a, nb] = S[9, a]
        if nine:
            for a in range(8):
                Gb[8, a, nb] = S[8, a]
            Gb[8, 8, nb] = g88
            Gb[8, 8, nb] += ridge
            xb[8, nb] = r8
        who[nb] = u
        se[nb, 0], se[nb, 1] = s, e
        nb += 1
        if nb == LANES:
            _rows_group(Gb, xb, S, who, se, nb, items, resid, Q, ridge, irls_iters, delta, U)
            nb = ZERO
    if nb > 0:
        _rows_group(Gb, xb, S, who, se, nb, items, resid, Q, ridge, irls_iters, delta, U)


@njit(cache=True, nogil=True)
def _rows_group(Gb, xb, S, who, se, nb, items, resid, Q, ridge, irls_iters, delta, U):
    """:func:`_solve_users_rows`' group of ``nb`` users waiting in lanes: solved (free lanes the identity), then
    ``irls_iters`` times each user's system reweighted from ``Q``'s rows (her ratings ``se[g, 0] .. se[g, 1]``:
    :func:`_weighted_rows9`'s arithmetic, written out) and solved again; written to ``U[who[g]]``."""
    d = Q.shape[1]
    _identity_lanes(Gb, xb, nb, d)
    chol_solve_lanes(Gb, xb, d)
    if irls_iters is None:  # solve_users_conf's: pruned when compiled, so that it never compiles the reweighting
        _lanes_to_rows(xb, who, nb, d, U)
        return
    for it in range(irls_iters):
        for g in range(nb):
            x0, x1, x2, x3, x4 = xb[0, g], xb[1, g], xb[2, g], xb[3, g], xb[4, g]
            x5, x6, x7, x8 = xb[5, g], xb[6, g], xb[7, g], xb[8, g]
            c0 = c1 = c2 = c3 = c4 = c5 = c6 = c7 = c8 = r = vsplat(0.0)
            g88 = 0.0
            r8 = 0.0
            for p in range(se[g, 0], se[g, 1]):
                j = np.uint64(items[p])
                yp = resid[p]
                q0, q1, q2, q3, q4 = Q[j, 0], Q[j, 1], Q[j, 2], Q[j, 3], Q[j, 4]
                q5, q6, q7, q8 = Q[j, 5], Q[j, 6], Q[j, 7], Q[j, 8]
                t = vfma1(-x0, q0, yp)
                t = vfma1(-x1, q1, t)
                t = vfma1(-x2, q2, t)
                t = vfma1(-x3, q3, t)
                t = vfma1(-x4, q4, t)
                t = vfma1(-x5, q5, t)
                t = vfma1(-x6, q6, t)
                t = vfma1(-x7, q7, t)
                t = abs(vfma1(-x8, q8, t))
                w = min(1.0, delta / max(t, 1e-300))
                v = vmul(vload(Q, (j,)), vsplat(w))
                c0 = vfma(v, vsplat(q0), c0)
                c1 = vfma(v, vsplat(q1), c1)
                c2 = vfma(v, vsplat(q2), c2)
                c3 = vfma(v, vsplat(q3), c3)
                c4 = vfma(v, vsplat(q4), c4)
                c5 = vfma(v, vsplat(q5), c5)
                c6 = vfma(v, vsplat(q6), c6)
                c7 = vfma(v, vsplat(q7), c7)
                q8w = q8 * w
                c8 = vfma(vload(Q, (j,)), vsplat(q8w), c8)
                r = vfma(v, vsplat(yp), r)
                g88 = vfma1(q8w, q8, g88)
                r8 = vfma1(q8w, yp, r8)
            vstore(S, (0,), c0)
            vstore(S, (1,), c1)
            vstore(S, (2,), c2)
            vstore(S, (3,), c3)
            vstore(S, (4,), c4)
            vstore(S, (5,), c5)
            vstore(S, (6,), c6)
            vstore(S, (7,), c7)
            vstore(S, (8,), c8)
            vstore(S, (9,), r)
            for a in range(8):
                for b in range(a + 1):
                    Gb[a, b, g] = S[b, a]
                Gb[a, a, g] += ridge
                xb[a, g] = S[9, a]
            for a in range(8):
                Gb[8, a, g] = S[8, a]
            Gb[8, 8, g] = g88
            Gb[8, 8, g] += ridge
            xb[8, g] = r8
        chol_solve_lanes(Gb, xb, d)
    _lanes_to_rows(xb, who, nb, d, U)


@njit(cache=True, nogil=True)
def solve_users_conf(indptr, items, conf, Q, U):
    """Each user's ``U[u] = (I + sum_p (c_p - 1) q_p q_p^T)^-1 sum_p c_p q_p`` over her pairs ``p`` (``q_p =
    Q[items[p]]``, ``c_p = conf[p] >= 1``): the implicit-feedback user system in a whitened basis
    (:func:`streamdp.kernels.ials.ials_solve_whitened`).

    ``Q`` has ``d <= LANE_D`` columns, float64 or float32; ``U`` float64, written; a user without pairs gets 0.
    Each Gramian and right-hand side from ``Q``'s rows in vector registers at ``d`` of 8 or 9 (rows contiguous:
    :func:`_solve_users_rows`, read as float64), else from her tile (:func:`gather_conf`, in ``Q``'s type, and
    :func:`gram_lower`); every eighth user the eight systems are solved together (:func:`chol_solve_lanes`). A
    user's row depends on her pairs alone: the same bits whatever the users beside her.
    """
    d = Q.shape[1]
    rows = (d == 8 or d == 9) and Q.strides[1] == Q.itemsize
    if rows:
        _solve_users_rows(indptr, items, conf, Q, 1.0, YES, None, 0.0, U)
        return
    longest = 1
    for u in range(len(indptr) - 1):
        longest = max(longest, indptr[u + 1] - indptr[u])
    T = np.empty((d, padded(longest)), dtype=Q.dtype)  # a user's tile
    G, x = np.empty((d, d)), np.empty(d)  # her system
    Gb, xb, who = np.empty((d, d, LANES)), np.empty((d, LANES)), np.empty(LANES, np.int64)  # the group's lanes
    nb = ZERO  # int64, not Literal[int](0): see ZERO
    for u in range(len(indptr) - 1):
        s, e = indptr[u], indptr[u + 1]
        U[u, :] = 0.0  # a user without pairs; the others' rows are written by their group
        if e == s:
            continue
        gather_conf(Q, items, conf, s, e - s, T, x)
        m = padded(e - s)
        for a in range(d):
            for i in range(e - s, m):
                T[a, i] = 0.0
        gram_lower(T, T, m, d, G)
        _to_lane(G, x, 1.0, Gb, xb, nb, d)
        who[nb] = u
        nb += 1
        if nb == LANES:
            chol_solve_lanes(Gb, xb, d)
            _lanes_to_rows(xb, who, nb, d, U)
            nb = ZERO
    if nb > 0:
        _identity_lanes(Gb, xb, nb, d)
        chol_solve_lanes(Gb, xb, d)
        _lanes_to_rows(xb, who, nb, d, U)


@njit(cache=True, nogil=True, fastmath={"contract", "reassoc"})
def gather_conf(Q, items, conf, s, n, T, x):
    """A user's rows gathered once for her implicit-feedback Gramian: ``T[:, i] = sqrt(c_i - 1) q_i`` (``T`` a
    ``d x`` tile, or the transpose of an ``n x d`` one), ``q_i = Q[items[s + i]]``, ``c_i = conf[s + i]``, and ``x =
    sum_i c_i q_i``."""
    d = Q.shape[1]
    for a in range(d):
        x[a] = 0.0
    for i in range(n):
        j = np.uint64(items[s + i])
        c = conf[s + i]
        si = np.sqrt(c - 1.0)
        for a in range(d):
            ya = Q[j, a]
            x[a] += c * ya
            T[a, i] = si * ya


@njit(cache=True, nogil=True)
def by_rows(Q):
    """Whether :func:`_first_system` forms a user's Gramian from ``Q``'s rows (:func:`_gram_rows`): ``k = 9``
    columns (k = 8 and the intercept), each row contiguous."""
    return Q.shape[1] == 9 and Q.strides[1] == 8


@njit(cache=True, nogil=True)
def _first_system(items, resid, s, e, Q, rows, T, y, m, G, x, S):
    """A user's unweighted Gramian (lower triangle) and right-hand side into ``G``, ``x``: from ``Q``'s rows
    ``items[s:e]`` and ``resid[s:e]`` where ``rows`` (:func:`by_rows`, :func:`_gram_rows`; ``S`` its
    ``(10, LANES)`` scratch), else from her gathered tile ``T`` and ``y`` (``m`` padded columns, :func:`_gram_rhs`).
    Every caller forms it here, so a row is the same bits in the training, the local solve and the selection. A
    one-column design (the biases' intercept) is summed in order (:func:`_column_system`)."""
    if rows:
        _gram_rows(items, resid, s, e, Q, False, S, G, x)
    elif T.shape[0] == 1:
        _column_system(T, y, m, G, x)
    else:
        _gram_rhs(T, T, y, m, T.shape[0], G, x)


@njit(cache=True, nogil=True)
def _column_system(T, y, m, G, x):
    """:func:`_gram_rhs` of a one-column tile ``T`` (``(1, >= m)``): ``G[0, 0] = sum_i t_i^2``, ``x[0] = sum_i t_i
    y_i``, summed in order, neither reassociated nor fused. :func:`_gram_rhs` reassociates its sums so that they
    vectorize, and the order LLVM then picks depends on the code around it where it is inlined, which is not the
    same in the selection's loop and in the solve (and a callee loaded from Numba's cache is not inlined at all):
    on a 1M-rating block the selection's biases' losses came 2e-15 apart between two builds of the same code. In
    order, every caller gets the same bits; at one column there is nothing to vectorize."""
    g = 0.0
    r = 0.0
    for i in range(m):
        t = T[0, i]
        g += t * t
        r += t * y[i]
    G[0, 0] = g
    x[0] = r


@njit(cache=True, nogil=True)
def _gram_rows(items, resid, s, e, Q, conf, S, G, x):
    """``G = sum_p w_p q_p q_p^T`` (lower triangle), ``x = sum_p resid_p q_p`` over ``p in s..e``, ``q_p =
    Q[items[p]]`` of 8 or 9 contiguous columns (float64, or float32 read as float64: exact), ``w_p = 1``, or with
    ``conf`` ``w_p = resid_p - 1`` (``resid`` the confidences: :func:`solve_users_conf`), without a tile: per rating,
    the row's first eight entries as one vector, times ``w_p``, times each of its entries added to eight or nine
    column vectors held in registers (:mod:`streamdp.kernels.lanes`), a ninth row's two sums in scalars. Sums in the
    ratings' order, multiply-adds fused (``w_p = 1`` multiplies exactly). Measured on 2M ratings, one core, the k = 8
    user solve 2.9x the gathered tile's (:func:`_gram_rhs`); ``S`` is ``(10, LANES)`` scratch."""
    nine = Q.shape[1] == 9
    c0 = c1 = c2 = c3 = c4 = c5 = c6 = c7 = c8 = r = vsplat(0.0)
    g88 = 0.0
    r8 = 0.0
    for p in range(s, e):
        j = np.uint64(items[p])
        v = vload(Q, (j,))
        yp = resid[p]
        w = yp - 1.0 if conf else 1.0
        vw = vmul(v, vsplat(w))
        c0 = vfma(vw, vsplat(Q[j, 0]), c0)
        c1 = vfma(vw, vsplat(Q[j, 1]), c1)
        c2 = vfma(vw, vsplat(Q[j, 2]), c2)
        c3 = vfma(vw, vsplat(Q[j, 3]), c3)
        c4 = vfma(vw, vsplat(Q[j, 4]), c4)
        c5 = vfma(vw, vsplat(Q[j, 5]), c5)
        c6 = vfma(vw, vsplat(Q[j, 6]), c6)
        c7 = vfma(vw, vsplat(Q[j, 7]), c7)
        r = vfma(v, vsplat(yp), r)
        if nine:
            q8 = np.float64(Q[j, 8])
            q8w = q8 * w
            c8 = vfma(v, vsplat(q8w), c8)
            g88 = vfma1(q8w, q8, g88)
            r8 = vfma1(q8, yp, r8)
    _rows_out(c0, c1, c2, c3, c4, c5, c6, c7, c8, r, g88, r8, nine, S, G, x)


@njit(cache=True, nogil=True)
def _weighted_rows9(items, resid, s, e, Q, xb, g, delta, S, G, x):
    """:func:`_gram_rows` reweighted: each rating's Huber weight ``w = min(1, delta / |r|)`` of its residual
    ``r = resid_p - q_p . xb[:, g]`` (summed over the columns in order, as the tile's :func:`_solve_lanes` does),
    then ``G = sum_p (w q_p) q_p^T``, ``x = sum_p resid_p (w q_p)`` (``w q_p`` rounded, as :func:`_huber_rows`'s)."""
    x0, x1, x2, x3, x4 = xb[0, g], xb[1, g], xb[2, g], xb[3, g], xb[4, g]
    x5, x6, x7, x8 = xb[5, g], xb[6, g], xb[7, g], xb[8, g]
    c0 = c1 = c2 = c3 = c4 = c5 = c6 = c7 = c8 = r = vsplat(0.0)
    g88 = 0.0
    r8 = 0.0
    for p in range(s, e):
        j = np.uint64(items[p])
        yp = resid[p]
        q0, q1, q2, q3, q4 = Q[j, 0], Q[j, 1], Q[j, 2], Q[j, 3], Q[j, 4]
        q5, q6, q7, q8 = Q[j, 5], Q[j, 6], Q[j, 7], Q[j, 8]
        t = vfma1(-x0, q0, yp)
        t = vfma1(-x1, q1, t)
        t = vfma1(-x2, q2, t)
        t = vfma1(-x3, q3, t)
        t = vfma1(-x4, q4, t)
        t = vfma1(-x5, q5, t)
        t = vfma1(-x6, q6, t)
        t = vfma1(-x7, q7, t)
        t = abs(vfma1(-x8, q8, t))
        w = min(1.0, delta / max(t, 1e-300))  # 1 where t <= delta, else delta / t: the same, without a branch
        v = vmul(vload(Q, (j,)), vsplat(w))
        c0 = vfma(v, vsplat(q0), c0)
        c1 = vfma(v, vsplat(q1), c1)
        c2 = vfma(v, vsplat(q2), c2)
        c3 = vfma(v, vsplat(q3), c3)
        c4 = vfma(v, vsplat(q4), c4)
        c5 = vfma(v, vsplat(q5), c5)
        c6 = vfma(v, vsplat(q6), c6)
        c7 = vfma(v, vsplat(q7), c7)
        q8w = q8 * w
        c8 = vfma(vload(Q, (j,)), vsplat(q8w), c8)
        r = vfma(v, vsplat(yp), r)
        g88 = vfma1(q8w, q8, g88)
        r8 = vfma1(q8w, yp, r8)
    _rows_out(c0, c1, c2, c3, c4, c5, c6, c7, c8, r, g88, r8, YES, S, G, x)


@njit(cache=True, nogil=True)
def _rows_out(c0, c1, c2, c3, c4, c5, c6, c7, c8, r, g88, r8, nine, S, G, x):
    """:func:`_gram_rows`'s column vectors and scalars into ``G``'s lower triangle and ``x`` (through ``S``): the
    ninth row and column where ``nine``."""
    vstore(S, (0,), c0)
    vstore(S, (1,), c1)
    vstore(S, (2,), c2)
    vstore(S, (3,), c3)
    vstore(S, (4,), c4)
    vstore(S, (5,), c5)
    vstore(S, (6,), c6)
    vstore(S, (7,), c7)
    vstore(S, (8,), c8)
    vstore(S, (9,), r)
    for a in range(8):
        for b in range(a + 1):
            G[a, b] = S[b, a]
        x[a] = S[9, a]
    if nine:
        for a in range(8):
            G[8, a] = S[8, a]
        G[8, 8] = g88
        x[8] = r8


@njit(cache=True, nogil=True)
def _lanes_to_rows(xb, who, nb, k, U):
    """``U[who[g]] = xb[:k, g]`` for the lanes ``g < nb``."""
    for g in range(nb):
        for a in range(k):
            U[who[g], a] = xb[a, g]


@njit(cache=True, nogil=True)
def _identity_lanes(Gb, xb, first, k):
    """Lanes ``first`` on of ``Gb``, ``xb`` set to the identity and a zero right-hand side (they solve to zero)."""
    for g in range(first, LANES):
        for a in range(k):
            for b in range(a):
                Gb[a, b, g] = 0.0
            Gb[a, a, g] = 1.0
            xb[a, g] = 0.0


@njit(cache=True, nogil=True)
def _to_lane(G, x, ridge, Gb, xb, g, k):
    """Lane ``g`` of ``Gb``, ``xb``: a user's Gramian (lower triangle) with ``ridge`` added to its diagonal, and her
    right-hand side ``x``."""
    for a in range(k):
        for b in range(a + 1):
            Gb[a, b, g] = G[a, b]
        Gb[a, a, g] += ridge
        xb[a, g] = x[a]


@njit(cache=True, nogil=True, fastmath={"contract", "reassoc"})
def _solve_lanes(Tb, yb, cols, nb, k, W, e_, G, x, Gb, xb, ridge, irls_iters, delta, src, se):
    """Solve the ``nb`` users whose systems are in lanes ``g < nb`` of ``Gb``, ``xb`` (:func:`_to_lane`) into
    ``xb[:k, g]``. With ``irls_iters``, reweight and solve again that many times from their tiles: user ``g``'s
    is ``Tb[k c:k c'].reshape((k, c' - c))`` and her residuals ``yb[c:c']``, ``c, c' = cols[g], cols[g + 1]``
    (``W``, ``e_`` flat scratch of at least a tile's size); or where ``src = (items, resid, Q, rows, S)`` has
    ``rows`` (:func:`by_rows`), from ``Q``'s rows ``items[p]`` and ``resid[p]``, ``p`` in ``se[g, 0] .. se[g, 1]``
    (:func:`_weighted_rows9`). Free lanes get the identity (it solves to zero)."""
    _identity_lanes(Gb, xb, nb, k)
    chol_solve_lanes(Gb, xb, k)
    items, resid, Q, rows, S = src
    for it in range(irls_iters):
        for g in range(nb):
            if rows:
                _weighted_rows9(items, resid, se[g, 0], se[g, 1], Q, xb, g, delta, S, G, x)
                _to_lane(G, x, ridge, Gb, xb, g, k)
                continue
            c = cols[g]
            m = cols[g + 1] - c
            T = Tb[k * c:k * (c + m)].reshape((k, m))
            y = yb[c:c + m]
            Wg = W[:k * m].reshape((k, m))
            for i in range(m):
                e_[i] = y[i]
            for a in range(k):
                xa = xb[a, g]
                for i in range(m):
                    e_[i] -= xa * T[a, i]
            _huber_rows(T, Wg, e_, m, k, delta)
            _gram_rhs(Wg, T, y, m, k, G, x)
            _to_lane(G, x, ridge, Gb, xb, g, k)
        chol_solve_lanes(Gb, xb, k)


@njit(cache=True, nogil=True, fastmath={"contract", "reassoc"})
def _solve_tile_huber(T, W, y, e_, m, k, G, x, ridge, irls_iters, delta):
    """One user's row into ``x[:k]`` (``k > LANE_D``): :func:`solve_users_huber` on her gathered tile ``T`` and
    residuals ``y`` (``m`` padded columns); ``W``, ``e_`` and ``G`` are scratch of the tile's shapes."""
    Wt = T
    for it in range(irls_iters + 1):
        _gram_rhs(Wt, T, y, m, k, G, x)
        for a in range(k):
            G[a, a] += ridge
        cholesky_lower(G, k)
        cholesky_lower_apply(G, x, k)
        if it < irls_iters:
            for i in range(m):
                e_[i] = y[i]
            for a in range(k):
                xa = x[a]
                for i in range(m):
                    e_[i] -= xa * T[a, i]
            _huber_rows(T, W, e_, m, k, delta)
            Wt = W


@njit(cache=True, nogil=True)
def _solve_one(T, W, y, e_, m, k, G0, x0, H, z, ridge, irls_iters, delta, Gb, xb, cols, src, se):
    """One user's row into ``z[:k]`` by :func:`solve_users_huber`'s arithmetic at her ``k`` (in lane 0 up to
    :data:`LANE_D`, so the same bits), from her unweighted system ``G0``, ``x0`` (:func:`_first_system`, kept),
    tile ``T`` (``(k, m)``: ``m`` padded ratings) and residuals ``y[:m]``; ``W``, ``e_`` and ``H`` scratch of at
    least their sizes, ``Gb``, ``xb`` ``(k, k, LANES)``, ``(k, LANES)``, ``cols`` two int64; ``src``, ``se`` as
    :func:`_solve_lanes` takes them (her ratings ``se[0]`` of ``src``'s, where its ``rows``)."""
    if k > LANE_D:
        _solve_tile_huber(T, W, y, e_, m, k, H, z, ridge, irls_iters, delta)
        return
    _to_lane(G0, x0, ridge, Gb, xb, ZERO, k)
    cols[0] = 0
    cols[1] = m
    _solve_lanes(T.reshape(k * m), y, cols, ONE, k, W.reshape(W.shape[0] * W.shape[1]), e_, H, z, Gb, xb,
                 ridge, irls_iters, delta, src, se)
    for a in range(k):
        z[a] = xb[a, 0]


@njit(cache=True, nogil=True)
def _huber_rows(T, W, e_, m, k, delta):
    """``W[a, i] = T[a, i] w_i``, ``w_i = min(1, delta / |e_i|)`` each rating's Huber weight (written into ``e_``):
    one division per rating, not per coordinate. No ``fastmath``: every caller's compiled code the same bits."""
    for i in range(m):
        r = abs(e_[i])
        e_[i] = 1.0 if r <= delta else delta / r
    for a in range(k):
        for i in range(m):
            W[a, i] = T[a, i] * e_[i]


@njit(cache=True, nogil=True)
def _solve_ridge(G, x, ridge, H, z, k, Gb, xb):
    """``z = (G + ridge I)^-1 x`` from a user's Gramian (lower triangle, :func:`_gram_rhs`) and right-hand side,
    through the scratch ``H`` (or lane 0 of ``Gb``, ``xb``: :func:`_solve_one`); ``G`` and ``x`` are kept for the
    next ridge. The same operations as :func:`solve_users_huber`'s plain solve, so the same bits."""
    if k <= LANE_D:
        _to_lane(G, x, ridge, Gb, xb, ZERO, k)
        _identity_lanes(Gb, xb, ONE, k)
        chol_solve_lanes(Gb, xb, k)
        for a in range(k):
            z[a] = xb[a, 0]
        return
    for a in range(k):
        z[a] = x[a]
        for b in range(a + 1):
            H[a, b] = G[a, b]
        H[a, a] += ridge
    cholesky_lower(H, k)
    cholesky_lower_apply(H, z, k)


def selection_losses(indptr, items, ratings, v, start, lo, hi, mu, Q, biases, kinds, lams, irls_iters, delta, h,
                     out):
    """Every candidate release's clipped, capped, weighted loss on each validation rating of a block, in one pass.

    The block's validation ratings are those of :func:`streamdp.methods._selection.holdout`
    (``v[u]`` of user ``u``'s ``n`` ratings, at offsets ``(start[u] + j (n // v[u])) % n``,
    ``indptr[0] == 0``); the rest train her rows. Candidate ``c`` is the release of kind
    ``kinds[c]`` (0: the item factors ``Q[:, :-1]`` with the item biases ``biases[0]``; 1, 2:
    the item biases ``biases[1]``, ``biases[2]`` alone) with her local ridge ``lams[c]``
    (``inf``: no row of hers; else her row is solved on her training ratings' residuals
    ``clip(r, lo, hi) - mu - biases[kind]`` (ratings clipped in float32), against ``Q`` for
    the factors, a column of ones for a biases' intercept, by :func:`solve_users_huber`'s
    arithmetic with ``irls_iters`` and ``delta``; with the squared loss one Gramian per
    user and design serves every ridge, the same bits). Written: ``out[c, q]`` =
    ``min(e^2, h^2) / v[u]`` for validation rating ``q`` (users in order, ``j`` in order)
    of user ``u``, ``e = clip(mu + b_j + x_u . q_j, lo, hi) - clip(r, lo, hi)``, as the
    NumPy form it replaced computed it (``streamdp.methods.als._AlsBase._select``): summed
    per candidate by the caller in the same order, the same losses bit for bit (with reweighting
    within ``1e-12``: the reassociated sums compiled into another caller). Users
    without validation ratings are skipped (they have no loss); no temporaries per
    candidate, and the GIL is released. Two kernels, so that the default (no reweighting) does not compile the
    reweighted solves (a cold compile 20.6 s as one kernel, 14.3-15.4 s without them): without reweighting
    (:func:`_selection_lanes`), the solves of :data:`LANES` users run side by side, one
    :func:`chol_solve_lanes` per candidate (each lane's bits its own: the same as one user at a time, in lane 0
    with seven idle lanes, as before), and a user's Gramian comes from ``Q``'s rows without gathering her tile
    where :func:`by_rows`. Measured on a 1M-rating block of the 100M store (21k users), k = 8, eight
    candidates (the factors at three ridges): 74-107 ms before, 34-44 ms; the 100M fit's selection pass 3.3-3.8 s
    of wall time before, 1.9-2.1 s.
    """
    if irls_iters == 0:
        _selection_lanes(indptr, items, ratings, v, start, lo, hi, mu, Q, biases, kinds, lams, h, out)
    else:
        _selection_reweighted(indptr, items, ratings, v, start, lo, hi, mu, Q, biases, kinds, lams, irls_iters, delta,
                              h, out)


@njit(cache=True, nogil=True)
def _selection_scratch(indptr, v, Q, kinds, lams, reweighted):
    """:func:`selection_losses`' per-block scratch: which designs a candidate solves (``need``), whether the
    Gramians come from ``Q``'s rows and whether a user's tile is gathered, the tiles, residuals and systems (lane
    ``g``: ``GB[kind, g]``, ``XB[kind, g]``), the solves' scratch, the waiting users' validation offsets and
    ``(first rating, validation count, first output column)``."""
    d = Q.shape[1]
    need = np.zeros(3, np.bool_)
    for c in range(len(kinds)):
        if np.isfinite(lams[c]):
            need[kinds[c]] = True
    longest = 1
    for u in range(len(indptr) - 1):
        longest = max(longest, indptr[u + 1] - indptr[u])
    cap = padded(longest)
    rows = by_rows(Q)
    tiles = need[0] and (reweighted or not rows)  # her gathered tile: the Gramian from it, or reweighting
    vmax = max(1, int(v.max()) if len(v) else 1)
    return (need, rows, tiles, np.zeros(d * cap, dtype=np.float64), np.zeros(cap, dtype=np.float64),
            np.zeros((d, cap), dtype=np.float64), np.zeros((3, cap), dtype=np.float64), np.zeros(cap, dtype=np.float64),
            np.empty((3, LANES, d, d), dtype=np.float64), np.empty((3, LANES, d), dtype=np.float64),
            np.empty((d, d), dtype=np.float64), np.empty(d, dtype=np.float64),
            np.empty((d, d, LANES), dtype=np.float64), np.empty((d, LANES), dtype=np.float64),
            np.empty(2, dtype=np.int64), np.empty(cap, dtype=np.int64), np.zeros((1, 2), dtype=np.int64),
            np.empty((10, LANES), dtype=np.float64), np.empty((LANES, vmax), np.int64), np.empty((LANES, 3), np.int64))


@njit(cache=True, nogil=True)
def _user_systems(u, indptr, v, start, q0, items, ratings, held, who, g, Q, biases, need, rows, tiles, lo, hi, mu,
                  Tb, T1b, y, tr, GB, XB, S):
    """Validation user ``u`` into slot ``g``: her tiles (:func:`_holdout_tiles`, her offsets into ``held[g]``), the
    unweighted systems of the designs ``need`` names into ``GB[kind, g]``, ``XB[kind, g]``, and ``who[g]`` (her first
    rating, her validation count, ``q0`` the first output column of her losses); returns ``(m, i)``."""
    d = Q.shape[1]
    s = indptr[u]
    who[g, 0] = s
    who[g, 1] = v[u]
    who[g, 2] = q0
    m, i = _holdout_tiles(items, ratings, s, indptr[u + 1] - s, v[u], start[u], held, g, Q, biases, need, tiles,
                          np.float32(lo), np.float32(hi), mu, Tb, T1b, y, tr)
    T = Tb[:d * m].reshape((d, m))
    T1 = T1b[:m].reshape((1, m))
    for kk in range(3):
        if need[kk]:
            if kk == 0:
                _first_system(tr, y[kk], ZERO, i, Q, rows, T, y[kk], m, GB[kk, g], XB[kk, g], S)
            else:
                _first_system(tr, y[kk], ZERO, i, Q, NO, T1, y[kk], m, GB[kk, g], XB[kk, g], S)
    return m, i


@njit(cache=True, nogil=True)
def _selection_lanes(indptr, items, ratings, v, start, lo, hi, mu, Q, biases, kinds, lams, h, out):
    """:func:`selection_losses` without reweighting: each user's systems wait in a lane; every :data:`LANES`
    users, :func:`_held_out_lanes` solves and scores them.

    Where the factors' Gramians come from ``Q``'s rows (:func:`by_rows`: k = 8), a user's validation offsets, her
    factors' system and her biases' residuals are formed here, in the loop over the users, not by
    :func:`_user_systems`: :func:`_holdout_tiles`' residuals, and :func:`_gram_rows`' sums in her training ratings'
    order, straight into her lane, the same operations in the same order, so the same bits. Each of the calls it
    replaces passed two dozen arrays, whose reference counts cost more than her Gramian (:func:`_solve_users_rows`).
    Her biases' systems go through :func:`_column_system`, as :func:`_first_system` forms every one-column
    system (:func:`solve_users_huber`'s too): summed in order, the same bits whatever the code around it. Her held-out offsets are sorted first (a few,
    by insertion), so that the loop over her ratings compares each with the next one only (each compared with all
    of them was a vectorized loop per rating). Indices into the block unsigned (:mod:`streamdp.kernels.segments`).
    One 1M-rating block of the 91M store (21k users), k = 8, the default five candidates, one core: 28.5-32 ms ->
    18-19 ms (minimum of 61 calls, three rounds); its factors' Gramians now wait on ``Q``'s rows (63% of the
    loop's samples at that load, ``perf``)."""
    (need, rows, tiles, Tb, T1b, W, y, e_, GB, XB, H, z, Gb, xb, cols, tr, se, S, held,
     who) = _selection_scratch(indptr, v, Q, kinds, lams, False)
    q0 = nb = 0
    written = rows and need[0] and not tiles
    T1w = T1b.reshape((1, len(T1b)))  # the biases' tile, a view made once: its first m columns are her tile
    for u in range(len(indptr) - 1):
        if v[u] > 0 and written:
            s = indptr[u]
            n = indptr[u + 1] - s
            vv = v[u]
            who[nb, 0] = s
            who[nb, 1] = vv
            who[nb, 2] = q0
            step = n // vv
            nh = 0  # her distinct held-out offsets, in increasing order in tr[:nh] (a few: insertion)
            for j in range(vv):
                o = (start[u] + j * step) % n
                held[nb, j] = o
                t = nh
                while t > 0 and tr[t - 1] > o:
                    t -= 1
                if t == 0 or tr[t - 1] != o:
                    for t2 in range(nh, t, -1):
                        tr[t2] = tr[t2 - 1]
                    tr[t] = o
                    nh += 1
            lo32 = np.float32(lo)
            hi32 = np.float32(hi)
            c0 = c1 = c2 = c3 = c4 = c5 = c6 = c7 = c8 = r = vsplat(0.0)
            g88 = 0.0
            r8 = 0.0
            i = 0
            hp = 0
            nxt = tr[0]
            for p in range(n):
                if p == nxt:  # held out: the next one
                    hp += 1
                    nxt = tr[hp] if hp < nh else n
                    continue
                q = np.uint64(s + p)
                jj = np.uint64(items[q])
                rr = ratings[q]
                rr = lo32 if rr < lo32 else (hi32 if rr > hi32 else rr)
                yp = rr - mu - biases[0, jj]
                vq = vload(Q, (jj,))
                c0 = vfma(vq, vsplat(Q[jj, 0]), c0)
                c1 = vfma(vq, vsplat(Q[jj, 1]), c1)
                c2 = vfma(vq, vsplat(Q[jj, 2]), c2)
                c3 = vfma(vq, vsplat(Q[jj, 3]), c3)
                c4 = vfma(vq, vsplat(Q[jj, 4]), c4)
                c5 = vfma(vq, vsplat(Q[jj, 5]), c5)
                c6 = vfma(vq, vsplat(Q[jj, 6]), c6)
                c7 = vfma(vq, vsplat(Q[jj, 7]), c7)
                r = vfma(vq, vsplat(yp), r)
                q8 = Q[jj, 8]
                c8 = vfma(vq, vsplat(q8), c8)
                g88 = vfma1(q8, q8, g88)
                r8 = vfma1(q8, yp, r8)
                T1b[i] = 1.0
                for kk in range(1, 3):
                    if need[kk]:
                        y[kk, i] = rr - mu - biases[kk, jj]
                i += 1
            vstore(S, (0,), c0)
            vstore(S, (1,), c1)
            vstore(S, (2,), c2)
            vstore(S, (3,), c3)
            vstore(S, (4,), c4)
            vstore(S, (5,), c5)
            vstore(S, (6,), c6)
            vstore(S, (7,), c7)
            vstore(S, (8,), c8)
            vstore(S, (9,), r)
            for a in range(8):
                for b in range(a + 1):
                    GB[0, nb, a, b] = S[b, a]
                XB[0, nb, a] = S[9, a]
            for a in range(8):
                GB[0, nb, 8, a] = S[8, a]
            GB[0, nb, 8, 8] = g88
            XB[0, nb, 8] = r8
            if need[1] or need[2]:
                m = padded(i)
                for t in range(i, m):
                    T1b[t] = 0.0
                    for kk in range(1, 3):
                        y[kk, t] = 0.0
                for kk in range(1, 3):
                    if need[kk]:
                        _column_system(T1w, y[kk], m, GB[kk, nb], XB[kk, nb])
            q0 += v[u]
            nb += 1
        elif v[u] > 0:
            _user_systems(u, indptr, v, start, q0, items, ratings, held, who, nb, Q, biases, need, rows, tiles, lo, hi,
                          mu, Tb, T1b, y, tr, GB, XB, S)
            q0 += v[u]
            nb += 1
        if nb == LANES or (nb and u == len(indptr) - 2):
            _held_out_lanes(nb, who, held, items, ratings, Q, biases, kinds, lams, GB, XB, H, z, Gb, xb, lo, hi, mu,
                            h * h, out)
            nb = 0


@njit(cache=True, nogil=True)
def _selection_reweighted(indptr, items, ratings, v, start, lo, hi, mu, Q, biases, kinds, lams, irls_iters, delta, h,
                          out):
    """:func:`selection_losses` with ``irls_iters`` reweighting steps: one user at a time, each candidate's row
    by :func:`_solve_one` (lane 0, as :func:`solve_users_huber` solves her), then its losses."""
    d = Q.shape[1]
    (need, rows, tiles, Tb, T1b, W, y, e_, GB, XB, H, z, Gb, xb, cols, tr, se, S, held,
     who) = _selection_scratch(indptr, v, Q, kinds, lams, True)
    q0 = 0
    for u in np.flatnonzero(v):  # the validation users
        m, i = _user_systems(u, indptr, v, start, q0, items, ratings, held, who, 0, Q, biases, need, rows, tiles, lo,
                             hi, mu, Tb, T1b, y, tr, GB, XB, S)
        q0 += v[u]
        T = Tb[:d * m].reshape((d, m))
        T1 = T1b[:m].reshape((1, m))
        se[0, 1] = i
        for c in range(len(kinds)):
            kind = kinds[c]
            dk = d if kind == 0 else 1
            if np.isfinite(lams[c]):
                if kind == 0:
                    _solve_one(T, W, y[kind], e_, m, dk, GB[kind, 0], XB[kind, 0], H, z, lams[c], irls_iters, delta,
                               Gb, xb, cols, (tr, y[kind], Q, rows, S), se)
                else:
                    _solve_one(T1, W, y[kind], e_, m, dk, GB[kind, 0], XB[kind, 0], H, z, lams[c], irls_iters, delta,
                               Gb, xb, cols, (tr, y[kind], Q, False, S), se)
                for a in range(dk):
                    xb[a, 0] = z[a]
            _held_out_losses(items, ratings, who, held, 0, kind, np.isfinite(lams[c]), xb, 0, dk, Q, biases, lo, hi, mu,
                             h * h, out, c)


@njit(cache=True, nogil=True)
def _held_out_lanes(nb, who, held, items, ratings, Q, biases, kinds, lams, GB, XB, H, z, Gb, xb, lo, hi, mu, hh, out):
    """:func:`selection_losses` without reweighting, for the ``nb`` users waiting in lanes ``g < nb`` (``GB``,
    ``XB``, ``who``, ``held``): each candidate's ridge on their systems, solved side by side
    (:func:`chol_solve_lanes`, up to :data:`LANE_D`; beyond, one at a time by :func:`_solve_ridge`), then their
    losses on their validation ratings. Indices, not views, in the loops, and the losses inlined: each view of an
    array, and each array passed to a call, takes and drops a reference count (measured: a block's candidate that
    solves nothing 7.5 ms, 13.5 ms through a call and views per user)."""
    d = Q.shape[1]
    for c in range(len(kinds)):
        kind = kinds[c]
        lam = lams[c]
        dk = d if kind == 0 else 1
        solved = np.isfinite(lam)
        lanes = solved and dk <= LANE_D
        if lanes:  # _to_lane's copies, lane by lane
            for g in range(nb):
                for a in range(dk):
                    for b in range(a + 1):
                        Gb[a, b, g] = GB[kind, g, a, b]
                    Gb[a, a, g] += lam
                    xb[a, g] = XB[kind, g, a]
            _identity_lanes(Gb, xb, nb, dk)
            chol_solve_lanes(Gb, xb, dk)
        for g in range(nb):
            if solved and not lanes:
                _solve_ridge(GB[kind, g], XB[kind, g], lam, H, z, dk, Gb, xb)
                for a in range(dk):
                    xb[a, 0] = z[a]
            _held_out_losses(items, ratings, who, held, g, kind, solved, xb, g if lanes else 0, dk, Q, biases, lo, hi,
                             mu, hh, out, c)


@njit(cache=True, nogil=True, inline="always")
def _held_out_losses(items, ratings, who, held, g, kind, solved, xb, col, dk, Q, biases, lo, hi, mu, hh, out, c):
    """Waiting user ``g``'s losses of candidate ``c`` on her validation ratings (``who[g]``: her first rating, their
    count, the first column of ``out`` they go to; ``held[g]`` their offsets), from her row ``xb[:dk, col]`` where
    ``solved``."""
    k = Q.shape[1] - 1
    s, vv, q0 = who[g, 0], who[g, 1], who[g, 2]
    wv = 1.0 / vv
    for j in range(vv):
        p = s + held[g, j]
        jj = np.uint64(items[p])
        pred = mu + biases[kind, jj]
        if solved:
            pred = pred + xb[dk - 1, col]
            if kind == 0:
                dot = 0.0
                for a in range(k):
                    dot += xb[a, col] * Q[jj, a]
                pred = pred + dot
        pred = lo if pred < lo else (hi if pred > hi else pred)
        rv = np.float64(ratings[p])
        rv = lo if rv < lo else (hi if rv > hi else rv)
        e = pred - rv
        out[c, q0 + j] = min(e * e, hh) * wv


@njit(cache=True, nogil=True)
def _holdout_tiles(items, ratings, s, n, vv, start, held, g, Q, biases, need, tiles, lo32, hi32, mu, Tb, T1b, y,
                   tr):
    """:func:`selection_losses`' tiles of one user (ratings ``s .. s + n``, ``vv`` held out from offset ``start``,
    written into ``held[g]``): her training rows of ``Q`` (where ``tiles``) and a column of ones, packed ``(d, m)``
    and ``(1, m)`` at the start of ``Tb`` and ``T1b``, her training items ``tr[:i]`` and residuals ``y[kind, :m]``
    (where ``need[kind]``), zero-padded to ``m`` (:func:`padded`) columns; returns ``(m, i)``."""
    d = Q.shape[1]
    step = n // vv
    for j in range(vv):
        held[g, j] = (start + j * step) % n
    m = n  # her training ratings (the held-out offsets' distinct values removed), padded: the tiles' widths
    for j in range(vv):
        first = True
        for jj in range(j):
            first = first and held[g, jj] != held[g, j]
        m -= first
    m = padded(m)
    T = Tb[:d * m].reshape((d, m))
    i = 0
    for p in range(n):
        out_ = False
        for j in range(vv):
            if held[g, j] == p:
                out_ = True
        if out_:
            continue
        jj = np.uint64(items[s + p])
        tr[i] = items[s + p]
        if tiles:
            for a in range(d):
                T[a, i] = Q[jj, a]
        T1b[i] = 1.0
        r = ratings[s + p]
        r = lo32 if r < lo32 else (hi32 if r > hi32 else r)
        for kk in range(3):
            if need[kk]:
                y[kk, i] = r - mu - biases[kk, jj]
        i += 1
    if tiles:
        for a in range(d):
            for t in range(i, m):
                T[a, t] = 0.0
    for t in range(i, m):
        T1b[t] = 0.0
        for kk in range(3):
            y[kk, t] = 0.0
    return m, i


@njit(cache=True, nogil=True, fastmath={"contract", "reassoc"})
def _gram_rhs(W, T, y, m, k, G, x):
    """A user's weighted Gramian (lower triangle, :func:`gram_lower`) and right-hand side ``x = W y``."""
    gram_lower(W, T, m, k, G)
    for a in range(k):
        acc = 0.0
        for i in range(m):
            acc += W[a, i] * y[i]
        x[a] = acc


@njit(cache=True, nogil=True)
def predict_rows(indptr, items, U, Q, item_bias, global_mean, lo, hi, out):
    """``out[p] = clip(global_mean + item_bias[j] + U[u] . Q[j], lo, hi)`` for each rating slot."""
    k = Q.shape[1]
    for u in range(len(indptr) - 1):
        for p in range(indptr[u], indptr[u + 1]):
            j = items[p]
            r = global_mean + item_bias[j]
            for d in range(k):
                r += U[u, d] * Q[j, d]
            if r < lo:
                r = lo
            elif r > hi:
                r = hi
            out[p] = r


def gram_apply_reference(indptr, items, values, V, n_items):
    """SciPy reference of :func:`gram_apply`: ``A.T @ (A @ V)``."""
    import scipy.sparse as sp

    A = sp.csr_matrix((np.asarray(values, np.float64), np.asarray(items), np.asarray(indptr)),
                      shape=(len(indptr) - 1, n_items))
    return A.T @ (A @ V)
