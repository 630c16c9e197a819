"""Sketch kernels (``A X``, ``A^T Y`` on CSR blocks and row ranges) against SciPy."""

import numpy as np
import scipy.sparse as sp

from streamdp.kernels.sketch import csr_matmul, csr_matmul_reference, csr_t_matmul, csr_t_matmul_reference


def _csr(seed=0, n_users=70, n_items=30, density=0.2):
    rng = np.random.default_rng(seed)
    A = sp.random(n_users, n_items, density=density, random_state=rng, format="csr", dtype=np.float64)
    A.data = rng.normal(size=A.nnz)
    A.sort_indices()
    return A.indptr.astype(np.int64), A.indices.astype(np.int32), A.data, A


def test_csr_matmul_matches_scipy():
    ip, it, v, A = _csr()
    X = np.random.default_rng(1).normal(size=(A.shape[1], 4))
    out = np.full((A.shape[0], 4), np.nan)  # written, not accumulated
    csr_matmul(ip, it, v, X, out)
    np.testing.assert_allclose(out, A @ X, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out, csr_matmul_reference(ip, it, v, X), rtol=1e-12, atol=1e-12)


def test_csr_t_matmul_accumulates_and_matches_scipy():
    ip, it, v, A = _csr(2)
    Y = np.random.default_rng(3).normal(size=(A.shape[0], 3))
    out = np.ones((A.shape[1], 3))
    csr_t_matmul(ip, it, v, Y, out)
    np.testing.assert_allclose(out - 1.0, A.T @ Y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out - 1.0, csr_t_matmul_reference(ip, it, v, Y, A.shape[1]), rtol=1e-12, atol=1e-12)


def test_row_ranges_are_slices_of_indptr():
    """A chunk of rows u0:u1 is ``indptr[u0:u1 + 1]`` with the same items/values (as randomized response uses it)."""
    ip, it, v, A = _csr(4)
    X = np.random.default_rng(5).normal(size=(A.shape[1], 2))
    Z = np.zeros((A.shape[1], 2))
    for u0 in range(0, A.shape[0], 9):
        u1 = min(u0 + 9, A.shape[0])
        part = np.empty((u1 - u0, 2))
        csr_matmul(ip[u0:u1 + 1], it, v, X, part)
        np.testing.assert_allclose(part, (A @ X)[u0:u1], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(part, csr_matmul_reference(ip[u0:u1 + 1], it, v, X), rtol=1e-12, atol=1e-12)
        csr_t_matmul(ip[u0:u1 + 1], it, v, part, Z)
    np.testing.assert_allclose(Z, A.T @ (A @ X), rtol=1e-12, atol=1e-12)
