"""Kernels of ``--method public-private`` (Xin & Jaakkola 2014): the EM over public users, PMD, PMC, the sketch.

The item model is a mean ``mu`` and a low-rank ``Sigma = W W^T`` (``W``: ``n_items x k``).
A user with centred ratings ``x`` (``x_p = r_p - mu_j``) on items ``phi`` completes her
rating vector with eq. 4 of the paper: in factor form (push-through identity)

    x_hat = Sigma_{., phi} (lambda' I + Sigma_{phi, phi})^-1 x_phi = W u,
    u = (lambda' I_k + W_phi^T W_phi)^-1 W_phi^T x_phi,

which :func:`streamdp.kernels.linalg.solve_users` computes (``O(|phi| k^2 + k^3)`` per
user). The EM's completed vector keeps the observed entries (``x_phi``) and fills the
others with ``W u``; centred it is ``x_i = W u_i + s_i`` with ``s_i`` the residuals on
``phi`` (sparse), so the second-moment matrix ``C = sum_i x_i x_i^T`` applied to a basis
``Q`` (``n_items x k``) is, with ``H = Q^T W`` and ``c_i = H u_i + Q^T s_i``,

    C Q = W (sum_i u_i c_i^T) + sum_i s_i c_i^T,

a ``k x k`` sum and an item-side sum over the ratings only (:func:`em_accumulate`).

A private user answers once with a vector over **all** items (the paper's mechanisms
release a full vector, so a response costs ``O(n_items (k + s))`` for a sketch of ``s``
columns): :func:`private_sketch` completes her vector densely (one row of
``n_items`` floats of scratch), applies the mechanism (:func:`pmd_candidates` for
PMD, ``+-sign(r') h`` for PMC, Laplace noise, or the exact ``+-r'``) and adds
``w d (d^T Omega)`` to the server's sketch ``Y`` of ``sum w d d^T``.

Raw arrays in, preallocated outputs accumulated into, float64, no ``fastmath``; each
kernel has a NumPy reference below, checked in ``tests/kernels/test_public_private_kernels.py``.
"""

from __future__ import annotations

import numpy as np
from streamdp.kernels.jit import njit

from streamdp.kernels.hashing import GOLDEN, splitmix64, unit_float

#: Mechanism codes of :func:`private_sketch`.
MECH_EXACT, MECH_PMC, MECH_PMD, MECH_LAPLACE = 0, 1, 2, 3

_MASK64 = 0xFFFFFFFFFFFFFFFF


@njit(cache=True, nogil=True)
def em_accumulate(indptr, items, x, U, W, Q, H, G, MC, T):
    """One block's E-step sums of the EM (see the module docstring); returns ``sum_i ||x_i||^2``.

    ``x`` are the users' centred ratings, ``U`` their eq.-4 coefficients
    (``n_users x k``), ``H = Q^T W`` and ``G = W^T W`` (``k x k``). Accumulates
    ``MC += u_i c_i^T`` (``k x k``) and ``T[j] += s_ij c_i`` (``n_items x k``) with
    ``s_ij = x_ij - W_j . u_i`` and ``c_i = H u_i + sum_j s_ij Q_j``. The returned total
    is that of the completed vectors' squared norms,
    ``||x_i||^2 = sum_phi x_ij^2 + u^T G u - sum_phi (W_j . u)^2``.
    """
    k = W.shape[1]
    c = np.empty(k, dtype=np.float64)
    longest = 0
    for u in range(len(indptr) - 1):
        longest = max(longest, indptr[u + 1] - indptr[u])
    resid = np.empty(longest, dtype=np.float64)
    total = 0.0
    for u in range(len(indptr) - 1):
        a0 = indptr[u]
        a1 = indptr[u + 1]
        quad = 0.0
        for a in range(k):
            ca = 0.0
            ga = 0.0
            for b in range(k):
                ca += H[a, b] * U[u, b]
                ga += G[a, b] * U[u, b]
            c[a] = ca
            quad += U[u, a] * ga
        total += quad
        for p in range(a0, a1):
            j = items[p]
            pred = 0.0
            for a in range(k):
                pred += W[j, a] * U[u, a]
            sp = x[p] - pred
            resid[p - a0] = sp
            total += x[p] * x[p] - pred * pred
            for a in range(k):
                c[a] += sp * Q[j, a]
        for a in range(k):
            for b in range(k):
                MC[a, b] += U[u, a] * c[b]
        for p in range(a0, a1):
            j = items[p]
            sp = resid[p - a0]
            for a in range(k):
                T[j, a] += sp * c[a]
    return total


@njit(cache=True, nogil=True)
def _next(state):
    """splitmix64: the next state and a uniform float in [0, 1) (53 bits)."""
    state = state + GOLDEN
    return state, unit_float(splitmix64(state))


@njit(cache=True, nogil=True)
def id_keys(ids, seed, out):
    """``out[i]`` uniform in [0, 1): splitmix64 of ``seed`` and integer id ``ids[i]`` (a user's own key).

    A user's key depends on her id and the run's seed only, not on which other users
    exist or how the store numbers them.
    """
    for i in range(ids.shape[0]):
        z = (np.uint64(seed) ^ (np.uint64(ids[i]) * np.uint64(0xC2B2AE3D27D4EB4F))) & np.uint64(_MASK64)
        _, out[i] = _next(z)


@njit(cache=True, nogil=True)
def mean_abs_completed(indptr, items, x, U, W, out):
    """``out[u] = mean_j |r_j|`` of each user's completed centred vector (``W u`` with the observed ``x`` kept)."""
    m = W.shape[0]
    k = W.shape[1]
    seen = np.zeros(m, dtype=np.bool_)
    for u in range(len(indptr) - 1):
        tot = 0.0
        for p in range(indptr[u], indptr[u + 1]):
            seen[items[p]] = True
            tot += abs(x[p])
        for j in range(m):
            if seen[j]:
                continue
            acc = 0.0
            for a in range(k):
                acc += W[j, a] * U[u, a]
            tot += abs(acc)
        for p in range(indptr[u], indptr[u + 1]):
            seen[items[p]] = False
        out[u] = tot / m


@njit(cache=True, nogil=True)
def pmd_candidates(r, mu, levels, order, seed, sweeps, swaps, X):
    """PMD's ``K`` candidate vectors for one user (Xin & Jaakkola, Sec. 4, discrete values); returns the objective.

    ``r`` is the user's completed, centred rating vector ``r - mu`` (``n_items``),
    ``levels`` the ``K`` rating values ``S``, ``X`` (``K x n_items``, int8) receives the
    candidates as level indices. Every column of ``X`` is a permutation of
    ``0..K-1`` from the start (a random one per coordinate) and swaps keep it one, so
    choosing a candidate uniformly at random gives every coordinate the uniform
    marginal on ``S`` whatever ``r`` is. The greedy coordinate descent of the paper
    lowers ``F = sum_p ||d_p d_p^T - r r^T||_F^2`` (``d_p = S[X_p] - mu``; ``K`` times
    objective (8)): for each coordinate, in ``order``, ``swaps`` random pairs
    ``(p, q)`` are tried and swapped when that lowers ``F``; ``sweeps`` passes. With
    ``a_p = ||d_p||^2`` and ``b_p = d_p . r`` kept up to date,
    ``F = sum_p (a_p^2 - 2 b_p^2) + K ||r||^4`` and a swap is judged in ``O(1)``.
    The randomness (initial permutations, pairs) comes from splitmix64 of ``seed``:
    it shapes the candidates only; which candidate is released is drawn by the
    caller from a ``numpy.random.Generator``.
    """
    K = levels.shape[0]
    m = r.shape[0]
    a = np.zeros(K, dtype=np.float64)
    b = np.zeros(K, dtype=np.float64)
    state = np.uint64(seed)
    for i in range(m):
        for p in range(K):
            X[p, i] = p
        for p in range(K - 1, 0, -1):
            state, f = _next(state)
            q = int(f * (p + 1))
            t = X[p, i]
            X[p, i] = X[q, i]
            X[q, i] = t
        for p in range(K):
            d = levels[X[p, i]] - mu[i]
            a[p] += d * d
            b[p] += d * r[i]
    if K < 2:
        return _pmd_objective(a, b, r)
    for _ in range(sweeps):
        for t in range(m):
            i = order[t]
            ri = r[i]
            for _ in range(swaps):
                state, f = _next(state)
                p = int(f * K)
                state, f = _next(state)
                q = int(f * (K - 1))
                if q >= p:
                    q += 1
                dp = levels[X[p, i]] - mu[i]
                dq = levels[X[q, i]] - mu[i]
                ap = a[p] - dp * dp + dq * dq
                bp = b[p] + (dq - dp) * ri
                aq = a[q] - dq * dq + dp * dp
                bq = b[q] + (dp - dq) * ri
                change = (ap * ap - 2.0 * bp * bp + aq * aq - 2.0 * bq * bq) - \
                    (a[p] * a[p] - 2.0 * b[p] * b[p] + a[q] * a[q] - 2.0 * b[q] * b[q])
                if change < 0.0:
                    t8 = X[p, i]
                    X[p, i] = X[q, i]
                    X[q, i] = t8
                    a[p] = ap
                    b[p] = bp
                    a[q] = aq
                    b[q] = bq
    return _pmd_objective(a, b, r)


@njit(cache=True, nogil=True)
def _pmd_objective(a, b, r):
    rr = 0.0
    for i in range(r.shape[0]):
        rr += r[i] * r[i]
    F = 0.0
    for p in range(a.shape[0]):
        F += a[p] * a[p] - 2.0 * b[p] * b[p] + rr * rr
    return F / a.shape[0]


@njit(cache=True, nogil=True)
def private_sketch(indptr, items, x, U, W, mu, mech, levels, order, seeds, choice, signs, h_shared, lo, hi, noise,
                   sweeps, swaps, weights, Omega, Y):
    """Each user's response under mechanism ``mech``, added to the sketch: ``Y += w d (d^T Omega)``.

    Per user: the completed centred vector ``r = W u`` with the observed entries
    replaced by ``x`` (eq. 4), then the centred response ``d``:

    * ``MECH_EXACT``: ``d = sign r`` (the paper's "exact 2nd order" reference; no privacy);
    * ``MECH_PMC``: ``d = sign h z``, ``z_j = sign(r_j)`` (``sign(0) = +1``, so every
      coordinate has mean 0 and variance ``h^2``), ``h = mean_j |r_j|`` or ``h_shared``
      when it is ``>= 0`` (Thm 4.2);
    * ``MECH_PMD``: ``d = S[X_J] - mu`` with ``X`` from :func:`pmd_candidates` (seed
      ``seeds[u]``) and ``J = choice[u]``;
    * ``MECH_LAPLACE``: ``d = clip(mu + r, lo, hi) + noise[u] - mu``.

    ``signs`` are +-1, ``weights`` the server's weight of each response, ``Omega``
    (``n_items x s``) the sketch's test matrix and ``Y`` (``n_items x s``) the sketch.
    """
    m = W.shape[0]
    k = W.shape[1]
    s = Omega.shape[1]
    K = levels.shape[0]
    r = np.empty(m, dtype=np.float64)
    d = np.empty(m, dtype=np.float64)
    proj = np.empty(s, dtype=np.float64)
    X = np.empty((K if mech == MECH_PMD else 1, m if mech == MECH_PMD else 1), dtype=np.int8)
    for u in range(len(indptr) - 1):
        for j in range(m):
            acc = 0.0
            for a in range(k):
                acc += W[j, a] * U[u, a]
            r[j] = acc
        for p in range(indptr[u], indptr[u + 1]):
            r[items[p]] = x[p]
        if mech == MECH_EXACT:
            for j in range(m):
                d[j] = signs[u] * r[j]
        elif mech == MECH_PMC:
            h = h_shared
            if h < 0.0:
                h = 0.0
                for j in range(m):
                    h += abs(r[j])
                h /= m
            for j in range(m):
                d[j] = signs[u] * h * (1.0 if r[j] >= 0.0 else -1.0)
        elif mech == MECH_PMD:
            pmd_candidates(r, mu, levels, order, seeds[u], sweeps, swaps, X)
            J = choice[u]
            for j in range(m):
                d[j] = levels[X[J, j]] - mu[j]
        else:
            for j in range(m):
                v = mu[j] + r[j]
                if v < lo:
                    v = lo
                elif v > hi:
                    v = hi
                d[j] = v + noise[u, j] - mu[j]
        w = weights[u]
        for c in range(s):
            proj[c] = 0.0
        for j in range(m):
            dj = d[j]
            for c in range(s):
                proj[c] += dj * Omega[j, c]
        for j in range(m):
            wd = w * d[j]
            for c in range(s):
                Y[j, c] += wd * proj[c]


# -- NumPy references -------------------------------------------------------------------


def em_accumulate_reference(indptr, items, x, U, W, Q, n_items):
    """Dense NumPy reference of :func:`em_accumulate`: ``(C Q split as (MC, T), total)`` from explicit completions.

    Builds every completed vector ``x_i`` (observed entries kept, ``W u_i`` elsewhere)
    and returns ``(MC, T, total)`` such that ``W MC + T = sum_i x_i x_i^T Q``.
    """
    n_u = len(indptr) - 1
    Xc = U @ W.T
    S = np.zeros((n_u, n_items))
    for u in range(n_u):
        sl = slice(indptr[u], indptr[u + 1])
        Xc[u, items[sl]] = x[sl]
        S[u, items[sl]] = x[sl] - W[items[sl]] @ U[u]
    Cvec = Xc @ Q  # c_i
    return U.T @ Cvec, S.T @ Cvec, float(np.sum(Xc * Xc))


def _splitmix_stream(seed):
    """Python twin of :func:`_next` (a generator of uniforms in [0, 1))."""
    state = int(seed) & _MASK64
    while True:
        state = (state + 0x9E3779B97F4A7C15) & _MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        z ^= z >> 31
        yield (z >> 11) / 9007199254740992.0


def pmd_candidates_reference(r, mu, levels, order, seed, sweeps, swaps):
    """NumPy reference of :func:`pmd_candidates` (same random stream): ``(X, objective)``.

    Judges every swap by recomputing the objective ``F`` from the candidates.
    """
    K, m = len(levels), len(r)
    rnd = _splitmix_stream(seed)
    X = np.zeros((K, m), np.int64)
    for i in range(m):
        col = list(range(K))
        for p in range(K - 1, 0, -1):
            q = int(next(rnd) * (p + 1))
            col[p], col[q] = col[q], col[p]
        X[:, i] = col

    def objective(X):
        D = levels[X] - mu
        return float(np.mean([np.sum((np.outer(d, d) - np.outer(r, r)) ** 2) for d in D]))

    if K >= 2:
        for _ in range(sweeps):
            for i in order:
                for _ in range(swaps):
                    p = int(next(rnd) * K)
                    q = int(next(rnd) * (K - 1))
                    q += q >= p
                    Y = X.copy()
                    Y[[p, q], i] = Y[[q, p], i]
                    if objective(Y) < objective(X):
                        X = Y
    return X, objective(X)


def private_sketch_reference(indptr, items, x, U, W, mu, mech, levels, order, seeds, choice, signs, h_shared, lo, hi,
                             noise, sweeps, swaps, weights, Omega):
    """NumPy reference of :func:`private_sketch`: ``(Y, D)`` with ``D`` the responses, one row per user."""
    n_u, m = len(indptr) - 1, W.shape[0]
    D = np.zeros((n_u, m))
    for u in range(n_u):
        r = W @ U[u]
        sl = slice(indptr[u], indptr[u + 1])
        r[items[sl]] = x[sl]
        if mech == MECH_EXACT:
            D[u] = signs[u] * r
        elif mech == MECH_PMC:
            h = h_shared if h_shared >= 0 else np.mean(np.abs(r))
            D[u] = signs[u] * h * np.where(r >= 0, 1.0, -1.0)
        elif mech == MECH_PMD:
            X, _ = pmd_candidates_reference(r, mu, levels, order, seeds[u], sweeps, swaps)
            D[u] = levels[X[choice[u]]] - mu
        else:
            D[u] = np.clip(mu + r, lo, hi) + noise[u] - mu
    return (D * weights[:, None]).T @ (D @ Omega), D
