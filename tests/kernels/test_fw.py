"""Frank-Wolfe and private-SVD kernels against their NumPy/SciPy references."""

import numpy as np
import pytest
import scipy.sparse as sp

from streamdp.kernels.fw import (fw_replay, fw_replay_reference, fw_step, fw_step_reference, gram_upper,
                                 gram_upper_reference, project_rows, project_rows_reference)


def _csr(seed=0, n_users=40, n_items=15, density=0.3):
    rng = np.random.default_rng(seed)
    A = sp.random(n_users, n_items, density=density, random_state=rng, format="csr", dtype=np.float64)
    A.data = rng.uniform(-1, 1, size=A.nnz)
    A.sort_indices()
    return A.indptr.astype(np.int64), A.indices.astype(np.int32), A.data, A


@pytest.mark.parametrize("clip, bound", [(np.inf, np.inf), (0.7, np.inf), (np.inf, 0.3), (0.5, 0.2)])
def test_fw_step_matches_reference(clip, bound):
    ip, it, x, A = _csr()
    rng = np.random.default_rng(1)
    T, s = 5, 3
    V = np.linalg.qr(rng.normal(size=(A.shape[1], T)))[0]
    C_in = rng.normal(size=(A.shape[0], T))
    C_out, resid = np.empty_like(C_in), np.empty(len(it))
    fw_step(ip, it, x, C_in, V, s, 2.5, 0.2, 30.0, clip, bound, C_out, resid)
    C_ref, r_ref = fw_step_reference(ip, it, x, C_in, V, s, 2.5, 0.2, 30.0, clip, bound)
    np.testing.assert_allclose(C_out, C_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(resid, r_ref, rtol=1e-12, atol=1e-12)
    assert np.all(C_out[:, s + 1:] == 0)


def test_fw_step_without_direction_only_shrinks():
    ip, it, x, A = _csr(2)
    V = np.linalg.qr(np.random.default_rng(0).normal(size=(A.shape[1], 3)))[0]
    C_in = np.random.default_rng(1).normal(size=(A.shape[0], 3))
    C_out, resid = np.empty_like(C_in), np.empty(len(it))
    fw_step(ip, it, x, C_in, V, 2, 0.0, 0.25, 10.0, np.inf, np.inf, C_out, resid)
    np.testing.assert_allclose(C_out[:, :2], 0.75 * C_in[:, :2])
    assert np.all(C_out[:, 2] == 0)


@pytest.mark.parametrize("clip, bound", [(np.inf, np.inf), (0.6, 0.25)])
def test_fw_replay_matches_steps(clip, bound):
    """The device's incremental replay = T training steps from zero (the reference)."""
    ip, it, x, A = _csr(3)
    rng = np.random.default_rng(4)
    T = 6
    V = np.linalg.qr(rng.normal(size=(A.shape[1], T)))[0]
    lam = rng.uniform(0.5, 3.0, size=T)
    lam[2] = 0.0  # an iteration without direction
    eta = np.full(T, 1.0 / T)
    C = np.empty((A.shape[0], T))
    fw_replay(ip, it, x, V, lam, eta, 20.0, clip, bound, C)
    np.testing.assert_allclose(C, fw_replay_reference(ip, it, x, V, lam, eta, 20.0, clip, bound),
                               rtol=1e-10, atol=1e-12)
    # the training kernel, step by step, gives the same coefficients
    Cs = np.zeros_like(C)
    for s in range(T):
        out, resid = np.empty_like(Cs), np.empty(len(it))
        fw_step(ip, it, x, Cs, V, s, lam[s], eta[s], 20.0, clip, bound, out, resid)
        Cs = out
    np.testing.assert_allclose(C, Cs, rtol=1e-10, atol=1e-12)


def test_projection_bounds_rows():
    ip, it, x, A = _csr(5)
    V = np.linalg.qr(np.random.default_rng(6).normal(size=(A.shape[1], 4)))[0]
    C = np.empty((A.shape[0], 4))
    fw_replay(ip, it, x, V, np.ones(4), np.full(4, 0.5), 1e3, np.inf, 0.1, C)
    pred = np.einsum("pk,pk->p", C[np.repeat(np.arange(A.shape[0]), np.diff(ip))], V[it])
    sq = np.bincount(np.repeat(np.arange(A.shape[0]), np.diff(ip)), weights=pred * pred, minlength=A.shape[0])
    assert np.all(np.sqrt(sq) <= 0.1 * np.sqrt(np.diff(ip)) * (1 + 1e-9))


def test_project_rows_matches_scipy():
    ip, it, x, A = _csr(7)
    ip = ip.copy()
    V = np.random.default_rng(8).normal(size=(A.shape[1], 3))
    C = np.empty((A.shape[0], 3))
    project_rows(ip, it, x, V, A.shape[1], C)
    np.testing.assert_allclose(C, project_rows_reference(ip, it, x, V, A.shape[1]), rtol=1e-12, atol=1e-12)


def test_gram_upper_matches_scipy():
    ip, it, x, A = _csr(9)
    out = np.zeros((A.shape[1], A.shape[1]))
    gram_upper(ip, it, x, out)
    np.testing.assert_allclose(out, gram_upper_reference(ip, it, x, A.shape[1]), rtol=1e-12, atol=1e-12)
    # unsorted items within a row give the same upper triangle
    it2 = it.copy()
    for u in range(len(ip) - 1):
        it2[ip[u]:ip[u + 1]] = it[ip[u]:ip[u + 1]][::-1]
    x2 = x.copy()
    for u in range(len(ip) - 1):
        x2[ip[u]:ip[u + 1]] = x[ip[u]:ip[u + 1]][::-1]
    out2 = np.zeros_like(out)
    gram_upper(ip, it2, x2, out2)
    np.testing.assert_allclose(out2, out, rtol=1e-12, atol=1e-12)
