"""Block linear-algebra kernels against NumPy/SciPy references."""

import numpy as np
import scipy.sparse as sp

from streamdp.kernels.linalg import (gram_apply, gram_apply_range, gram_apply_reference, predict_rows, residuals,
                                     solve_users, solve_users_ridges)


def _csr(seed=0, n_users=60, n_items=25, density=0.2):
    rng = np.random.default_rng(seed)
    A = sp.random(n_users, n_items, density=density, random_state=rng, format="csr", dtype=np.float64)
    A.data = rng.normal(size=A.nnz)
    A.sort_indices()
    return A.indptr.astype(np.int64), A.indices.astype(np.int32), A.data, A


def test_gram_apply_matches_scipy():
    ip, it, v, A = _csr()
    V = np.random.default_rng(1).normal(size=(A.shape[1], 5))
    out = np.zeros_like(V)
    gram_apply(ip, it, v, V, out)
    np.testing.assert_allclose(out, A.T @ (A @ V), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out, gram_apply_reference(ip, it, v, V, A.shape[1]), rtol=1e-12, atol=1e-12)


def test_gram_apply_range_sums_to_whole():
    ip, it, v, A = _csr(2)
    V = np.random.default_rng(3).normal(size=(A.shape[1], 3))
    out = np.zeros_like(V)
    for u0 in range(0, A.shape[0], 7):
        gram_apply_range(ip, it, v, V, u0, min(u0 + 7, A.shape[0]), out)
    np.testing.assert_allclose(out, A.T @ (A @ V), rtol=1e-12, atol=1e-12)


def test_residuals():
    it = np.array([0, 2, 1], np.int32)
    r = np.array([4.0, 3.0, 1.0], np.float32)
    out = np.empty(3)
    residuals(it, r, 3.0, np.array([0.5, -1.0, 0.0]), out)
    assert out.tolist() == [0.5, 0.0, -1.0]


def test_solve_users_and_predict_match_numpy():
    ip, it, v, A = _csr(4, n_users=30, n_items=12, density=0.4)
    rng = np.random.default_rng(5)
    Q = rng.normal(size=(12, 4))
    U = np.zeros((30, 4))
    solve_users(ip, it, v, Q, 0.7, U)
    for u in range(30):
        idx = it[ip[u]:ip[u + 1]]
        y = v[ip[u]:ip[u + 1]]
        Qi = Q[idx]
        ref = np.linalg.solve(Qi.T @ Qi + 0.7 * np.eye(4), Qi.T @ y) if len(idx) else np.zeros(4)
        np.testing.assert_allclose(U[u], ref, rtol=1e-9, atol=1e-10)
    bias = rng.normal(size=12)
    out = np.empty(len(it))
    predict_rows(ip, it, U, Q, bias, 3.0, 1.0, 5.0, out)
    rows = np.repeat(np.arange(30), np.diff(ip))
    ref = np.clip(3.0 + bias[it] + np.einsum("pk,pk->p", U[rows], Q[it]), 1.0, 5.0)
    np.testing.assert_allclose(out, ref, rtol=1e-12)


def test_solve_users_ridges_is_solve_users_per_ridge_bit_for_bit():
    ip, it, v, A = _csr(6, n_users=40, n_items=15, density=0.3)
    ip[5:] = ip[4:-1].copy()  # user 4 rates nothing
    ip[-1] = len(it)
    Q = np.random.default_rng(7).normal(size=(15, 5))
    ridges = np.array([10.0, 30.0, 0.5])
    U = np.full((3, 40, 5), np.nan)
    solve_users_ridges(ip, it, v, Q, ridges, U)
    for r, lam in enumerate(ridges):
        ref = np.zeros((40, 5))
        solve_users(ip, it, v, Q, lam, ref)
        assert np.array_equal(U[r], ref)
    assert not U[:, 4].any()
