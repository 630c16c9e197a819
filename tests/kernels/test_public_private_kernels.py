"""Kernels of ``--method public-private`` against their NumPy references; PMD's and PMC's defining properties."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize

from streamdp.kernels.public_private import (MECH_EXACT, MECH_LAPLACE, MECH_PMC, MECH_PMD, em_accumulate,
                                             em_accumulate_reference, id_keys, mean_abs_completed, pmd_candidates,
                                             pmd_candidates_reference, private_sketch, private_sketch_reference)


def _block(seed=0, n_users=25, n_items=12, density=0.3):
    rng = np.random.default_rng(seed)
    M = rng.random((n_users, n_items)) < density
    M[0] = False  # a user without ratings
    ip = np.concatenate([[0], np.cumsum(M.sum(1))]).astype(np.int64)
    it = np.nonzero(M)[1].astype(np.int32)
    x = rng.normal(size=len(it))
    return ip, it, x, rng


def test_em_accumulate_matches_dense_completion():
    ip, it, x, rng = _block()
    n, k = 12, 3
    W = rng.normal(size=(n, k))
    Q = np.linalg.qr(rng.normal(size=(n, k)))[0]
    U = rng.normal(size=(len(ip) - 1, k))
    MC, T = np.zeros((k, k)), np.zeros((n, k))
    total = em_accumulate(ip, it, x, U, W, Q, Q.T @ W, W.T @ W, MC, T)
    MCr, Tr, totr = em_accumulate_reference(ip, it, x, U, W, Q, n)
    np.testing.assert_allclose(MC, MCr, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(T, Tr, rtol=1e-12, atol=1e-12)
    assert total == pytest.approx(totr, rel=1e-12)
    # and W MC + T is C Q of the completed vectors
    Xc = U @ W.T
    for u in range(len(ip) - 1):
        Xc[u, it[ip[u]:ip[u + 1]]] = x[ip[u]:ip[u + 1]]
    np.testing.assert_allclose(W @ MC + T, Xc.T @ (Xc @ Q), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("mech", [MECH_EXACT, MECH_PMC, MECH_PMD, MECH_LAPLACE])
@pytest.mark.parametrize("h_shared", [-1.0, 0.7])
def test_private_sketch_matches_reference(mech, h_shared):
    ip, it, x, rng = _block(1, n_users=9, n_items=7, density=0.4)
    n_u, n, k, s = len(ip) - 1, 7, 2, 4
    W = rng.normal(size=(n, k))
    U = rng.normal(size=(n_u, k))
    mu = rng.uniform(2, 4, size=n)
    levels = np.arange(1.0, 6.0)
    order = rng.permutation(n).astype(np.int64)
    seeds = rng.integers(0, 2 ** 63, size=n_u).astype(np.uint64)
    choice = rng.integers(0, 5, size=n_u)
    signs = rng.choice([-1.0, 1.0], size=n_u)
    noise = rng.laplace(size=(n_u, n)) if mech == MECH_LAPLACE else np.zeros((0, 0))
    weights = rng.uniform(0.2, 1.0, size=n_u)
    Omega = rng.normal(size=(n, s))
    Y = np.zeros((n, s))
    private_sketch(ip, it, x, U, W, mu, mech, levels, order, seeds, choice, signs, h_shared, 1.0, 5.0, noise, 2, 3,
                   weights, Omega, Y)
    Yr, D = private_sketch_reference(ip, it, x, U, W, mu, mech, levels, order, seeds, choice, signs, h_shared, 1.0,
                                     5.0, noise, 2, 3, weights, Omega)
    np.testing.assert_allclose(Y, Yr, rtol=1e-10, atol=1e-10)
    if mech == MECH_PMC:  # every coordinate is +-h
        assert np.allclose(np.abs(D), np.abs(D[:, :1]))


def test_pmd_candidates_match_reference_and_lower_the_objective():
    rng = np.random.default_rng(2)
    m = 9
    r = rng.normal(size=m)
    mu = rng.uniform(2, 4, size=m)
    levels = np.arange(1.0, 6.0)
    order = np.arange(m, dtype=np.int64)
    X = np.zeros((5, m), np.int8)
    F = pmd_candidates(r, mu, levels, order, np.uint64(77), 2, 3, X)
    Xr, Fr = pmd_candidates_reference(r, mu, levels, order, 77, 2, 3)
    np.testing.assert_array_equal(X, Xr)
    assert F == pytest.approx(Fr, rel=1e-9)
    F0 = pmd_candidates(r, mu, levels, order, np.uint64(77), 0, 3, X)  # the random start alone
    assert F < F0


def test_pmd_marginals_are_uniform_whatever_the_ratings():
    """Every coordinate of a PMD response is uniform on the levels (the mechanism's first-order deniability)."""
    levels = np.arange(1.0, 6.0)
    K, m = len(levels), 40
    rng = np.random.default_rng(3)
    mu = rng.uniform(2.5, 4.0, size=m)
    order = np.arange(m, dtype=np.int64)
    # two very different users: all high ratings, all low ratings
    for r in (np.full(m, 1.5), np.where(np.arange(m) % 2 == 0, -2.0, 0.4)):
        counts = np.zeros((m, K))
        X = np.zeros((K, m), np.int8)
        for t in range(2000):
            pmd_candidates(r, mu, levels, order, np.uint64(1000 + t), 2, 4, X)
            # structurally: every coordinate of the candidate set is a permutation of the levels
            assert (np.sort(X, axis=0) == np.arange(K)[:, None]).all()
            J = rng.integers(K)  # the released candidate, uniform
            counts[np.arange(m), X[J]] += 1
        # chi-square over all (coordinate, level) cells against 1/K: mean 1 per degree of freedom
        expected = 2000 / K
        chi2 = ((counts - expected) ** 2 / expected).sum()
        dof = m * (K - 1)
        assert chi2 < dof + 5 * np.sqrt(2 * dof), chi2


def _pmc_objective(U, p, r):
    """``E ||u u^T - r r^T||_F^2`` for the symmetric distribution with atoms ``+-U[a]`` of mass ``p[a] / 2``."""
    return float(sum(pa * np.sum((np.outer(u, u) - np.outer(r, r)) ** 2) for u, pa in zip(U, p)))


@pytest.mark.parametrize("seed", range(5))
def test_pmc_two_point_distribution_attains_the_minimum(seed):
    """Thm 4.2: ``+-h sign(r)`` (h = mean |r|) minimizes (9) over all distributions with mean 0, equal variances.

    (i) The two-point objective equals the analytic lower bound ``||r||^4 - m^2 h^4`` (any
    feasible P: ``E||u||^4 >= m^2 v^2`` and ``r^T Cov r <= v (sum |r_i|)^2``, minimized at
    ``v = h^2``). (ii) Numerical minimization over symmetric 3-atom distributions with the
    equal-variance constraints, from random starts, never goes below it (tolerance 1e-6
    relative).
    """
    rng = np.random.default_rng(seed)
    m = 4
    r = rng.normal(size=m) * rng.uniform(0.2, 2.0, size=m)
    h = np.mean(np.abs(r))
    z = np.where(r >= 0, 1.0, -1.0)
    two_point = _pmc_objective([h * z], [1.0], r)
    bound = np.sum(r * r) ** 2 - m * m * h ** 4
    assert two_point == pytest.approx(bound, rel=1e-12, abs=1e-12)
    # the kernel's PMC response is that distribution's atom
    ip, it = np.array([0, m], np.int64), np.arange(m, dtype=np.int32)
    Y = np.zeros((m, m))
    private_sketch(ip, it, r, np.zeros((1, 1)), np.zeros((m, 1)), np.zeros(m), MECH_PMC, np.zeros(1),
                   np.arange(m, dtype=np.int64), np.zeros(1, np.uint64), np.zeros(1, np.int64), np.array([-1.0]), -1.0,
                   0.0, 0.0, np.zeros((0, 0)), 0, 1, np.ones(1), np.eye(m), Y)
    np.testing.assert_allclose(Y, h * h * np.outer(z, z), rtol=1e-12)

    A = 3

    def unpack(v):
        U = v[:A * m].reshape(A, m)
        a = np.clip(v[A * m:A * m + A], -30.0, 30.0)
        p = np.exp(a - a.max())
        return U, p / p.sum()

    inside = lambda v: (np.abs(v[A * m:]) < 30.0).astype(float)  # noqa: E731 - the clip's derivative
    r4 = float(np.sum(r * r) ** 2)

    def obj(v):  # _pmc_objective through ||u u^T - r r^T||_F^2 = ||u||^4 - 2 (u.r)^2 + ||r||^4
        U, p = unpack(v)
        return float(p @ (np.sum(U * U, axis=1) ** 2 - 2.0 * (U @ r) ** 2) + r4)

    def obj_jac(v):  # its gradient (SLSQP's finite differences called obj 10x as often)
        U, p = unpack(v)
        n2, ur = np.sum(U * U, axis=1), U @ r
        g = n2 ** 2 - 2.0 * ur ** 2
        dU = p[:, None] * (4.0 * n2[:, None] * U - 4.0 * ur[:, None] * r[None])
        return np.concatenate([dU.ravel(), p * (g - p @ g) * inside(v)])

    def var_gap(v):  # Var[u_i] equal for all i (E[u] = 0 by symmetry)
        U, p = unpack(v)
        var = (p[:, None] * U * U).sum(0)
        return var[1:] - var[0]

    def var_jac(v):
        U, p = unpack(v)
        var = (p[:, None] * U * U).sum(0)
        dU = np.zeros((m, A, m))  # d var_i / d U[a, j] = 2 p_a U_ai [i == j]
        for i in range(m):
            dU[i, :, i] = 2.0 * p * U[:, i]
        da = p[None, :] * (U.T ** 2 - var[:, None]) * inside(v)[None, :]  # d var_i / d a_b
        J = np.concatenate([dU.reshape(m, A * m), da], axis=1)
        return J[1:] - J[0]

    best = np.inf
    for start in range(12):
        v0 = np.concatenate([rng.normal(size=A * m) * h * 2, rng.normal(size=A)])
        res = minimize(obj, v0, jac=obj_jac, method="SLSQP",
                       constraints=[{"type": "eq", "fun": var_gap, "jac": var_jac}],
                       options={"maxiter": 500, "ftol": 1e-12})
        if res.success and np.max(np.abs(var_gap(res.x))) < 1e-6:
            best = min(best, res.fun)
    assert np.isfinite(best)
    assert best >= two_point - 1e-6 * max(1.0, abs(two_point))
    assert best <= two_point + 1e-3 * max(1.0, abs(two_point))  # the optimizer finds the minimum too


def test_mean_abs_completed_and_id_keys():
    ip, it, x, rng = _block(4)
    n, k = 12, 3
    W = rng.normal(size=(n, k))
    U = rng.normal(size=(len(ip) - 1, k))
    out = np.zeros(len(ip) - 1)
    mean_abs_completed(ip, it, x, U, W, out)
    for u in range(len(ip) - 1):
        c = W @ U[u]
        c[it[ip[u]:ip[u + 1]]] = x[ip[u]:ip[u + 1]]
        assert out[u] == pytest.approx(np.mean(np.abs(c)), rel=1e-12)
    keys = np.empty(20000)
    id_keys(np.arange(20000, dtype=np.int64), np.uint64(5), keys)
    again = np.empty(3)
    id_keys(np.array([7, 8, 9], np.int64), np.uint64(5), again)
    assert np.array_equal(again, keys[7:10])  # a user's key depends on her id and the seed only
    assert abs(keys.mean() - 0.5) < 0.01 and keys.min() >= 0 and keys.max() < 1
