"""Block linear-algebra kernels against NumPy/SciPy references."""

import numpy as np
import pytest
import scipy.sparse as sp

from streamdp.kernels.lanes import LANES
from streamdp.kernels.linalg import (LANE_D, LANE_TILE, chol_solve_lanes, gram_apply, gram_apply_range,
                                     gram_apply_reference, predict_rows, residuals, selection_losses, solve_users,
                                     solve_users_huber)


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


@pytest.mark.parametrize("d", [1, 9, 17])
def test_chol_solve_lanes_solves_each_lane_and_a_lanes_bits_are_its_own(d):
    """Eight systems: each lane the NumPy solve; the same system in lane 0 beside other systems, or beside the
    identity (the free lanes of a last group), gives the same bits; a non-positive pivot is taken as 1e-300."""
    rng = np.random.default_rng(d)
    A = rng.normal(size=(LANES, d, 3 * d))
    G = np.einsum("gai,gbi->abg", A, A) + 0.3 * np.eye(d)[:, :, None]
    x = rng.normal(size=(d, LANES))
    want = np.linalg.solve(G.transpose(2, 0, 1), x.T[..., None])[..., 0].T
    L, got = G.copy(), x.copy()
    chol_solve_lanes(L, got, d)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12 * np.abs(want).max())
    np.testing.assert_allclose(np.tril(L[:, :, 2]) @ np.tril(L[:, :, 2]).T, G[:, :, 2], rtol=1e-12, atol=1e-12)
    for others in (np.roll(G, 3, axis=2), np.broadcast_to(np.eye(d)[:, :, None], G.shape)):
        G2 = np.ascontiguousarray(others)
        G2[:, :, 0] = G[:, :, 0]
        x2 = rng.normal(size=(d, LANES))
        x2[:, 0] = x[:, 0]
        chol_solve_lanes(G2, x2, d)
        assert np.array_equal(x2[:, 0], got[:, 0])
    Z = np.zeros((d, d, LANES))
    chol_solve_lanes(Z, np.ones((d, LANES)), d)
    assert np.all(np.diagonal(Z) == 1e-300)


def _huber_users(k, iters):
    """21 users' residuals over 50 items (two without ratings, one longer than LANE_TILE), ``Q`` with an intercept
    column, and every user's row from one :func:`solve_users_huber` call."""
    rng = np.random.default_rng(k + iters)
    cnt = rng.integers(0, 30, 21)
    cnt[[2, 9]] = 0
    cnt[12] = LANE_TILE + 5
    ip = np.r_[0, np.cumsum(cnt)].astype(np.int64)
    it = rng.integers(0, 50, ip[-1]).astype(np.int32)
    v = rng.normal(0, 1.0, ip[-1])
    v[::7] *= 5.0
    Q = np.hstack([rng.normal(0, 0.5, (50, k - 1)), np.ones((50, 1))])
    U = np.full((len(cnt), k), np.nan)
    solve_users_huber(ip, it, v, Q, 0.4, iters, 0.8, U)
    return ip, it, v, Q, U


@pytest.mark.parametrize("k", [3, 9, LANE_D])
@pytest.mark.parametrize("iters", [0, 2])
def test_a_users_row_is_hers_alone_bit_for_bit(k, iters):
    """Users are solved in lanes of eight: each row is the one a user's own local solve (her ratings alone) gets,
    bit for bit, whatever her neighbours; a user longer than LANE_TILE with reweighting (solved in lanes of her
    own) and users without ratings among them. At k = 9 the Gramian from Q's rows."""
    ip, it, v, Q, U = _huber_users(k, iters)
    for u in range(len(ip) - 1):
        one = np.full((1, k), np.nan)
        s, e = ip[u], ip[u + 1]
        solve_users_huber(np.array([0, e - s], np.int64), it[s:e], v[s:e], Q, 0.4, iters, 0.8, one)
        assert np.array_equal(U[u], one[0]), u
    assert not U[[2, 9]].any()


@pytest.mark.parametrize("iters", [0, 2])
def test_the_solve_from_rows_is_the_lanes_solve_bit_for_bit(iters):
    """At k = 9, :func:`solve_users_huber` runs its own loop (``_solve_users_rows``: no call per user, a call per
    group of eight for the reweighting): the same rows bit for bit as the general lanes' loop it replaced there,
    users without ratings and a last group of fewer than eight lanes included."""
    from streamdp.kernels.linalg import _solve_users_lanes, padded

    for seed, n_users in ((0, 61), (1, 8), (2, 3)):
        rng = np.random.default_rng(seed)
        cnt = rng.integers(0, 90, n_users)
        cnt[::5] = 0
        ip = np.concatenate([[0], np.cumsum(cnt)]).astype(np.int64)
        it = rng.integers(0, 200, ip[-1]).astype(np.int32)
        v = rng.normal(0, 1.0, ip[-1])
        Q = np.ascontiguousarray(np.hstack([rng.normal(0, 0.5, (200, 8)), np.ones((200, 1))]))
        fast, lanes = np.full((n_users, 9), np.nan), np.full((n_users, 9), np.nan)
        v[::9] *= 6.0  # residuals past delta: reweighted
        solve_users_huber(ip, it, v, Q, 0.7, iters, 1.0, fast)
        _solve_users_lanes(ip, it, v, Q, 0.7, iters, 1.0, lanes, padded(max(int(cnt.max()), 1)))
        assert np.array_equal(fast, lanes) and not fast[cnt == 0].any()


@pytest.mark.slow  # a layout no caller passes: its own compile of the lanes' chain (~20 s)
@pytest.mark.parametrize("k", [3, 9, LANE_D])
@pytest.mark.parametrize("iters", [0, 2])
def test_rows_not_contiguous_give_the_same_users_within_rounding(k, iters):
    """``Q`` in Fortran order (at k = 9 the Gramian then comes from a tile, not from Q's rows): the same users'
    rows within rounding."""
    ip, it, v, Q, U = _huber_users(k, iters)
    F = np.full_like(U, np.nan)
    solve_users_huber(ip, it, v, np.asfortranarray(Q), 0.4, iters, 0.8, F)
    np.testing.assert_allclose(F, U, rtol=1e-12, atol=1e-12 * np.abs(U).max())


def _selection_reference(ip, it, r, first_user, key, Q, biases, cands, mu, lo, hi, h, irls_iters, delta):
    """The NumPy form ``_AlsBase._select`` ran per block before :func:`selection_losses` (summed per candidate)."""
    import math

    from streamdp.methods._selection import holdout

    k = Q.shape[1] - 1
    (tip, tit, tr), (vu, vi, vr) = holdout(ip, it, r, first_user, key)
    tit = np.ascontiguousarray(tit, dtype=np.int32)
    tr = np.clip(tr, np.float32(lo), np.float32(hi))
    vr = np.clip(vr.astype(np.float64), lo, hi)
    ones = np.ones((Q.shape[0], 1))
    wv = 1.0 / np.bincount(vu, minlength=len(ip) - 1)[vu]
    out = np.zeros(len(cands))
    for c, (kind, lam) in enumerate(cands):
        bv = biases[kind]
        pred = mu + bv[vi]
        if not math.isinf(lam):
            res = np.empty(len(tit))
            residuals(tit, tr, float(mu), bv, res)
            design = Q if kind == 0 else ones
            U = np.zeros((len(ip) - 1, design.shape[1]))
            solve_users_huber(tip, tit, res, design, float(lam), irls_iters, delta, U)
            pred = pred + U[vu, -1]
            if kind == 0:  # summed coordinate by coordinate, as the kernel does (einsum's order is NumPy's choice)
                dot = np.zeros(len(vu))
                for a in range(k):
                    dot = dot + U[vu, a] * Q[vi, a]
                pred = pred + dot
        e = np.clip(pred, lo, hi) - vr
        out[c] = float(np.sum(np.minimum(e * e, h * h) * wv))
    return out


@pytest.mark.parametrize("irls_iters", [0, 2])
@pytest.mark.parametrize("k", [8, 16, 20])
def test_selection_losses_are_the_numpy_forms_bit_for_bit(irls_iters, k):
    """The selection's fused kernel: every candidate (factors at two ridges and at none, biases with and without an
    intercept, the mean with one) scores each block as its NumPy form did, summed in the same order: the same bits,
    whether eight users' solves run side by side (k = 8 from ``Q``'s rows, k = 16 from tiles) or one at a time
    (k = 20, beyond the lanes). With reweighting the two run the reassociated sums of ``_solve_tile_huber`` compiled
    into different callers, whose vector orders may differ: there within 1e-12 relative."""
    from streamdp.methods._selection import holdout_strides

    rng = np.random.default_rng(5)
    n_users, n_items = 300, 40
    cnt = rng.integers(0, 30, n_users)
    cnt[:5] = [0, 1, 2, 3, 1]
    cnt[5:15] = rng.integers(40, 150, 10)  # long enough for the reassociated sums' vector loops (32 and more)
    n_items = max(n_items, int(cnt.max()))
    ip = np.r_[0, np.cumsum(cnt)].astype(np.int64)
    it = np.concatenate([np.sort(rng.choice(n_items, c, replace=False)) for c in cnt]).astype(np.int32)
    r = rng.integers(0, 7, len(it)).astype(np.float32)  # outside the range [1, 5] on both sides: clipped
    Q = np.hstack([rng.normal(size=(n_items, k)), np.ones((n_items, 1))])
    biases = np.stack([rng.normal(size=n_items), rng.normal(size=n_items), np.zeros(n_items)])
    cands = [(0, 10.0), (0, 30.0), (0, np.inf), (1, 3.0), (1, np.inf), (2, 3.0), (2, np.inf)]
    kinds = np.array([c[0] for c in cands], np.int64)
    lams = np.array([c[1] for c in cands], np.float64)
    for first_user, key in ((0, 7), (1000, 2**63 + 5)):
        want = _selection_reference(ip, it, r, first_user, key, Q, biases, cands, 3.2, 1.0, 5.0, 2.0, irls_iters, 1.0)
        v, start = holdout_strides(ip, first_user, key)
        L = np.empty((len(cands), int(v.sum())))
        selection_losses(ip, it, r, v, start, 1.0, 5.0, 3.2, Q, biases, kinds, lams, irls_iters, 1.0, 2.0, L)
        got = np.array([float(np.sum(L[c])) for c in range(len(cands))])
        if irls_iters == 0:
            assert np.array_equal(got, want), (got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 5, 12, 30])
def test_syrk_lower_is_the_product_on_the_lower_triangle(dtype, n):
    """``V V^T`` (``rows``) or ``V^T V`` of the first ``n`` rows of a taller tile: the NumPy product on the lower
    triangle within the type's rounding; the upper triangle untouched."""
    from streamdp.kernels.linalg import syrk_lower

    rng = np.random.default_rng(n)
    V = rng.standard_normal((40, 12)).astype(dtype)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for rows, want in ((True, V[:n] @ V[:n].T), (False, V[:n].T @ V[:n])):
        m = want.shape[0]
        if m > 12:  # n x n with rows: as the user solve calls it, only for n < d
            continue
        C = np.full((12, 12), 7.0, dtype)
        syrk_lower(V, n, rows, C, np.zeros(8, np.int32))
        low = np.tril_indices(m)
        assert np.abs(C[:m, :m][low] - want[low]).max() <= tol * np.abs(want).max()
        assert (C[np.triu_indices(12, 1)] == 7.0).all() and (C[m:, :] == 7.0).all()
