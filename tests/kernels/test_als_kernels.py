"""ALS kernels against NumPy references: the Huber-IRLS user solve and the item-side accumulation."""

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from streamdp.kernels.als import (als_accumulate, als_accumulate_reference, packed_index, statistic_sums,
                                  symmetrize_upper, unpack_upper)
from streamdp.kernels.linalg import solve_users, solve_users_huber


def _csr(seed=0, n_users=40, n_items=15, density=0.3):
    rng = np.random.default_rng(seed)
    A = sp.random(n_users, n_items, density=density, random_state=rng, format="csr")
    A.data = rng.normal(size=A.nnz)
    A.sort_indices()
    return A.indptr.astype(np.int64), A.indices.astype(np.int32), A.data.astype(np.float64)


def _irls_reference(Q, y, ridge, iters, delta):
    """Dense IRLS of one user: plain ridge, then ``iters`` reweighted solves, w = min(1, delta / |e|)."""
    w = np.ones(len(y))
    for _ in range(iters + 1):
        x = np.linalg.solve((Q * w[:, None]).T @ Q + ridge * np.eye(Q.shape[1]), (Q * w[:, None]).T @ y)
        e = np.abs(y - Q @ x)
        w = np.where(e <= delta, 1.0, delta / np.maximum(e, 1e-300))
    return x


@pytest.mark.parametrize("iters,delta", [(0, np.inf), (1, 0.5), (3, 0.2)])
def test_solve_users_huber_matches_dense_irls(iters, delta):
    ip, it, v = _csr(1)
    v[::7] *= 8.0  # outliers, where the Huber loss differs from the squared loss
    Q = np.random.default_rng(2).normal(size=(15, 4))
    U = np.zeros((40, 4))
    solve_users_huber(ip, it, v, Q, 0.8, iters, delta, U)
    for u in range(40):
        s, e = ip[u], ip[u + 1]
        ref = _irls_reference(Q[it[s:e]], v[s:e], 0.8, iters, delta) if e > s else np.zeros(4)
        np.testing.assert_allclose(U[u], ref, rtol=1e-9, atol=1e-10)


def test_solve_users_is_huber_without_reweighting():
    ip, it, v = _csr(3)
    Q = np.random.default_rng(4).normal(size=(15, 3))
    U1, U2 = np.zeros((40, 3)), np.zeros((40, 3))
    solve_users(ip, it, v, Q, 1.0, U1)
    solve_users_huber(ip, it, v, Q, 1.0, 5, np.inf, U2)  # infinite transition: every weight stays 1
    np.testing.assert_allclose(U1, U2, rtol=1e-12)


@pytest.mark.parametrize("d_extra,item_mode", [(0, True), (1, True), (0, False), (1, False)])
def test_als_accumulate_matches_numpy(d_extra, item_mode):
    ip, it, target = _csr(5, n_users=50, n_items=12)
    rng = np.random.default_rng(6)
    k = 3
    d = k + d_extra
    U = rng.normal(size=(50, k + 1)) * 2.0
    w = rng.random(len(it)) * (rng.random(len(it)) < 0.8)
    B = np.zeros((12, d))
    A = np.zeros((12, d * (d + 1) // 2) if item_mode else (0, 1))
    S = np.zeros((0, 0) if item_mode else (d, d))
    clipped = als_accumulate(ip, it, target, w, U, 1.5, 0.7, 0.9, B, A, S)
    Br, Ar, Sr = als_accumulate_reference(ip, it, target, w, U, 1.5, 0.7, 0.9, d, 12)
    np.testing.assert_allclose(B, Br, rtol=1e-10, atol=1e-12)
    if item_mode:
        np.testing.assert_allclose(unpack_upper(A, d), Ar, rtol=1e-10, atol=1e-12)
    else:
        np.testing.assert_allclose(symmetrize_upper(S), Sr, rtol=1e-10, atol=1e-12)
    has = np.diff(ip) > 0
    assert clipped == int((np.linalg.norm(U[:, :k], axis=1)[has] > 1.5).sum())


def test_als_accumulate_bounds_one_users_contribution():
    """The sensitivities the method releases with: ||B_i||_2 <= R Delta ||w_i||_2, ||S_i|| <= Delta^2."""
    rng = np.random.default_rng(7)
    it = rng.choice(30, size=25, replace=False).astype(np.int32)
    ip = np.array([0, 25])
    U = rng.normal(size=(1, 5)) * 10.0
    w = rng.random(25)
    B, A, S = np.zeros((30, 4)), np.zeros((30, 10)), np.zeros((4, 4))
    als_accumulate(ip, it, rng.normal(size=25) * 10, w, U, 0.3, 2.0, 1.0, B, A, S)
    assert np.linalg.norm(B) <= 2.0 * 0.3 * np.linalg.norm(w) * (1 + 1e-12)
    assert np.linalg.norm(A) <= 0.3 ** 2 * np.linalg.norm(w) * (1 + 1e-12)
    assert np.linalg.norm(S[np.triu_indices(4)]) <= 0.3 ** 2 * (1 + 1e-12)


def test_packed_index_is_row_by_row():
    d = 4
    iu = np.triu_indices(d)
    assert [packed_index(a, b, d) for a, b in zip(*iu)] == list(range(len(iu[0])))


def _ragged(seed, n_users, n_items, longest):
    """A CSR whose users rate 0 .. ``longest`` items (some none, some more than ``k``), with repeats of an item."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, longest + 1, n_users)
    lengths[3] = 0
    ip = np.r_[0, np.cumsum(lengths)].astype(np.int64)
    it = rng.integers(0, n_items, ip[-1]).astype(np.int32)
    return ip, it, rng


@pytest.mark.parametrize("k", [3, 8, 9, 16, 64])
@pytest.mark.parametrize("iters", [0, 2])
def test_user_solve_is_the_old_kernel_within_1e_10(k, iters):
    """The tiled Gramian and the column-wise Cholesky (issue 44) against the per-rating kernel they replaced."""
    from bench._before import solve_users_huber_before

    ip, it, rng = _ragged(k, 70, 90, 3 * k)
    Q = np.hstack([rng.normal(0, 0.5, (90, k - 1)), np.ones((90, 1))])
    v = rng.normal(0, 1.0, len(it))
    v[::5] *= 6.0
    got, want = np.full((70, k), np.nan), np.full((70, k), np.nan)
    solve_users_huber(ip, it, v, Q, 0.3, iters, 0.7, got)
    solve_users_huber_before(ip, it, v, Q, 0.3, iters, 0.7, want)
    assert not got[3].any()
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10 * np.abs(want).max())


@pytest.mark.parametrize("k", [8, 16, 64])
@pytest.mark.parametrize("item_mode", [False, True])
def test_item_side_is_the_old_kernel_within_1e_10(k, item_mode):
    """The item-by-item and two-pairs-per-step sums (issue 44) against the per-rating kernel they replaced; the
    same users clipped, zero weights dropped, the residual clipped."""
    from bench._before import als_accumulate_before

    ip, it, rng = _ragged(k + 1, 60, 40, 30)
    U = rng.normal(0, 0.6, (60, k + 1))
    target = rng.normal(0, 2.0, len(it))
    w = rng.uniform(0.2, 1.0, len(it))
    w[::4] = 0.0
    d = k + 1
    out = []
    for f in (als_accumulate, als_accumulate_before):
        B = np.zeros((40, d))
        A = np.zeros((40, d * (d + 1) // 2) if item_mode else (0, 1))
        S = np.zeros((0, 0) if item_mode else (d, d))
        out.append((f(ip, it, target, w, U, 1.5, 1.0, 0.5, B, A, S), B, A, S))
    assert out[0][0] == out[1][0] > 0
    for got, want in zip(out[0][1:], out[1][1:]):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10 * max(np.abs(want).max(initial=0.0), 1e-300))


@pytest.mark.parametrize("k,d", [(3, 3), (8, 9), (16, 17), (63, 64)])
@pytest.mark.parametrize("a_one", [True, False])
def test_the_users_order_is_the_items_order_within_1e_12(k, d, a_one):
    """The two orders :func:`als_accumulate` and ials pick between by the outputs' size (``USER_ORDER_BYTES``): the
    same sums of the same products, zero weights dropped, residuals clipped (als) or not (ials, ``a_one`` False)."""
    from streamdp.kernels.als import accumulate_by_item, accumulate_by_user, pairs_by_item

    ip, it, rng = _ragged(k, 60, 40, 30)
    X = rng.normal(0, 0.6, (60, d))
    bsrc = rng.normal(0, 2.0, len(it)) if a_one else 1.0 + rng.exponential(3.0, len(it))
    w = rng.uniform(0.2, 1.0, len(it))
    w[::4] = 0.0
    shift, R = (rng.normal(0, 0.5, 60), 1.0) if a_one else (np.zeros(60), np.inf)
    out = []
    for by_user in (True, False):
        B, A = np.zeros((40, k)), np.zeros((40, d * (d + 1) // 2))
        if by_user:
            accumulate_by_user(ip, it, w, bsrc, shift, R, bsrc, a_one, X, B, A)
        else:
            accumulate_by_item(*pairs_by_item(ip, it, w, bsrc, shift, R, bsrc, a_one, 40), X, B, A)
        out.append((B, A))
    for got, want in zip(*out):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())


@pytest.mark.parametrize("k,item_mode", [(3, False), (8, False), (8, True), (16, True)])
def test_one_weight_per_user_is_her_weight_repeated_bit_for_bit(k, item_mode):
    """``per_user`` (the adaptive rule without item counts: the item side reads each user's weight, no per-rating
    array) gives the same bits as the weights repeated over her ratings, in every order the sums can take: the
    users' (with and without per-item Gramians, the vector right-hand side at k = 8 and 9 included, chunks of
    ``USER_CHUNK`` users) and the items' (``pairs_by_item``)."""
    from streamdp.kernels.als import USER_CHUNK, accumulate_by_item, pairs_by_item

    n_users = USER_CHUNK + 300  # two chunks: each chunk reads its own users' weights
    ip, it, rng = _ragged(k, n_users, 50, 12)
    U = rng.normal(0, 0.6, (n_users, k + 1))
    target = rng.normal(0, 2.0, len(it))
    wu = rng.uniform(0.2, 1.0, n_users)
    wu[::7] = 0.0
    w = np.repeat(wu, np.diff(ip))
    d = k + 1
    out = []
    for weights, per_user in ((w, False), (wu, True)):
        B = np.full((50, d), 0.25)
        A = np.zeros((50, d * (d + 1) // 2) if item_mode else (0, 1))
        S = np.zeros((0, 0) if item_mode else (d, d))
        clipped = als_accumulate(ip, it, target, weights, U, 0.8, 1.5, 1.0, B, A, S, per_user)
        out.append((clipped, B, A, S))
    assert out[0][0] == out[1][0]
    for got, want in zip(out[0][1:], out[1][1:]):
        assert got.tobytes() == want.tobytes()
    X = rng.normal(0, 0.6, (n_users, d))
    shift = rng.normal(0, 0.5, n_users)
    pairs = [pairs_by_item(ip, it, weights, target, shift, 1.5, target, True, 50, per_user)
             for weights, per_user in ((w, False), (wu, True))]
    for got, want in zip(*pairs):
        assert got.tobytes() == want.tobytes()
    sums = []
    for p in pairs:
        B, A = np.zeros((50, d)), np.zeros((50, d * (d + 1) // 2))
        accumulate_by_item(*p, X, B, A)
        sums.append((B, A))
    assert all(a.tobytes() == b.tobytes() for a, b in zip(*sums))


@pytest.mark.parametrize("hold,with_target", [(True, False), (True, True), (False, False), (False, True)])
def test_training_residuals_is_the_holdout_clip_and_residual_it_fuses(hold, with_target):
    """The same bits as holdout's copy, ``np.clip`` in float32, ``residuals`` and ``resid + bias[it]`` in turn."""
    from streamdp.kernels.als import training_residuals
    from streamdp.kernels.linalg import residuals
    from streamdp.methods._selection import holdout, holdout_strides

    rng = np.random.default_rng(3)
    cnt = rng.integers(0, 30, size=200)
    ip = np.r_[0, np.cumsum(cnt)].astype(np.int64)
    it = rng.integers(0, 50, size=ip[-1]).astype(np.int32)
    r = rng.uniform(0.0, 6.0, size=ip[-1]).astype(np.float32)
    bias, mu, lo, hi = rng.normal(size=50), 3.1, 0.7, 5.3
    if hold:
        (tip, tit, tr), _ = holdout(ip, it, r, 1000, key=11)
        v, start = holdout_strides(ip, 1000, 11)
    else:
        tip, tit, tr = ip, it, r
        v = start = np.zeros(0, np.int64)
    ref = np.empty(len(tit))
    residuals(tit, np.clip(tr, np.float32(lo), np.float32(hi)), mu, bias, ref)
    oip, oit = np.empty(len(ip), np.int64), np.full(len(it), -1, np.int32)
    resid, target = np.empty(len(it)), np.empty(len(it) if with_target else 0)
    m = training_residuals(ip, it, r, v, start, np.float32(lo), np.float32(hi), mu, bias, with_target, oip, oit,
                           resid, target)
    assert m == len(tit) and np.array_equal(oip, tip) and np.array_equal(oit[:m], tit)
    assert resid[:m].tobytes() == ref.tobytes()
    if with_target:
        assert target[:m].tobytes() == (ref + bias[tit]).tobytes()


@pytest.mark.parametrize("k", [8, 9])
def test_the_vector_right_hand_side_is_the_scalar_loops_bit_for_bit(k):
    """``accumulate_rhs`` at 8 and 9 columns (a vector fused multiply-add per pair, ``_rhs_registers``) adds the
    same fused terms in the same order as its loop for other widths: ``B`` of 10 columns, its first ``k`` bit
    for bit (``X``'s extra columns zero), onto a ``B`` that already holds sums."""
    from streamdp.kernels.als import accumulate_rhs

    ip, it, rng = _ragged(k, 300, 50, 40)
    X = rng.normal(0, 0.6, (300, 10))
    X[:, k:] = 0.0
    bsrc, w = rng.normal(0, 2.0, len(it)), rng.uniform(0.2, 1.0, len(it))
    w[::5] = 0.0
    shift = rng.normal(0, 0.5, 300)
    start = rng.normal(0, 1.0, (50, 10))
    vec, loop = start[:, :k].copy(), start.copy()
    accumulate_rhs(ip, it, w, bsrc, shift, 1.5, np.ascontiguousarray(X[:, :k]), vec)
    accumulate_rhs(ip, it, w, bsrc, shift, 1.5, X, loop)
    assert np.array_equal(vec, loop[:, :k])
    assert not np.array_equal(vec, start[:, :k])


def _statistic_sums_numpy(ip, it, r32, lo, hi, w, wt, c, centre, centred, tilted, n):
    """The NumPy form of the statistics pass before :func:`statistic_sums` (``_AlsBase._statistic_totals``): the
    ratings widened and clipped, the users' means by ``np.add.reduceat``, the sums by ``np.bincount``."""
    r = np.clip(r32.astype(np.float64), lo, hi)
    cnt = np.diff(ip)
    has = cnt > 0
    umean = np.zeros(len(cnt))
    umean[has] = np.add.reduceat(r, ip[:-1][has]) / cnt[has]
    out = np.zeros(3 * n + 2 if tilted else 2 * n + 2)
    e = np.subtract(r, np.repeat(umean, cnt))
    np.clip(e, -c, c, out=e)
    if centre is not None:
        one = np.repeat(cnt == 1, cnt)
        e[one] = np.clip(r[one] - centre, -c, c)
    out[:n] = np.bincount(it, weights=np.multiply(w, e, out=e), minlength=n)
    carried = np.repeat(1.0 - 1.0 / np.maximum(cnt, 1), cnt) if centred else 1.0
    out[n:2 * n] = np.bincount(it, weights=np.multiply(w, carried, out=e), minlength=n)
    if tilted:
        out[2 * n + 2:] = np.bincount(it, weights=wt * carried, minlength=n)
    return out, umean


@pytest.mark.parametrize("centre", [None, 3.1])
@pytest.mark.parametrize("centred", [False, True])
@pytest.mark.parametrize("tilted", [False, True])
@pytest.mark.parametrize("per_user", [False, True])
def test_statistic_sums_are_the_numpy_form_bit_for_bit(centre, centred, tilted, per_user):
    """The statistics pass's users' means and sums: each item's weighted clipped residuals against the user's mean
    (a one-rating user's against the released centre), weight totals (carried shares) and tilted totals, as its
    NumPy form computed them (widened, clipped copy; np.add.reduceat; np.bincount): the same bits. Ratings with
    many significant bits and users of up to 400 of them (NumPy's pairwise sums, halves above 128), some outside
    the range; weights per rating, or one per user repeated (``per_user``)."""
    rng = np.random.default_rng(11)
    n_users, n = 400, 60
    cnt = rng.integers(0, 25, n_users)
    cnt[:9] = [0, 1, 1, 2, 0, 1, 129, 400, 8]
    ip = np.r_[0, np.cumsum(cnt)].astype(np.int64)
    it = np.concatenate([rng.integers(0, n, k) for k in cnt]).astype(np.int32)
    r32 = rng.normal(3.0, 1.5, len(it)).astype(np.float32) * np.float32(1.0 + 1e-3 / 3)
    lo, hi = 1.0, 4.9
    wu = rng.random(n_users)
    w = np.repeat(wu, cnt) if per_user else rng.random(len(it))
    wt = rng.random(len(it))
    want, want_mean = _statistic_sums_numpy(ip, it, r32, lo, hi, w, wt, 0.7, centre, centred, tilted, n)
    got, mean = np.zeros_like(want), np.full(n_users, np.nan)
    statistic_sums(ip, it, r32, lo, hi, wu, np.zeros(0) if per_user else w, wt if tilted else np.zeros(0), 0.7,
                   0.0 if centre is None else centre, centre is not None, centred, tilted, n, got, mean)
    assert np.array_equal(mean, want_mean)
    assert np.array_equal(got, want)
    assert got[:n].any() and got[n:2 * n].any() and (not tilted or got[2 * n + 2:].any())
    # the means' order matters for these ratings: a plain running sum differs from NumPy's in some user
    plain = np.array([sum(np.clip(r32[a:b].astype(np.float64), lo, hi).tolist()) for a, b in zip(ip[:-1], ip[1:])])
    assert (plain[cnt > 0] / cnt[cnt > 0] != want_mean[cnt > 0]).any()
    means_only = np.zeros(2)
    statistic_sums(ip, it, r32, lo, hi, wu, np.zeros(0), np.zeros(0), 0.7, 0.0, False, False, False, 0, means_only,
                   mean)
    assert np.array_equal(mean, want_mean) and not means_only.any()


@pytest.mark.parametrize("heavy", [True, False])
def test_grid_em_is_the_dense_em_over_the_nonzero_runs(heavy):
    """``grid_em`` (the item biases' prior of true totals) against the dense form it replaced where the likelihoods'
    nonzero runs are narrow, two matrix-vector products a step: the same grid, the weights within 1e-12 of the
    largest after 200 steps (only the sums' order differs). ``heavy``: totals that dwarf their noise (a grid
    coarser than it, runs of a few points); else a grid of noise / 4 (the dense form's own case, runs hundreds
    wide), called directly on the kernel. A row with no nonzero entry changes nothing, as in the dense form."""
    import math

    from streamdp.kernels.als import grid_em
    from streamdp.methods._biases import BANDED_SHARE, _total_prior

    rng = np.random.default_rng(4)
    sigma = 300.0
    C = (rng.lognormal(9, 2, 20_000) if heavy else rng.lognormal(5, 1.5, 20_000)) + rng.normal(0, sigma, 20_000)
    top = max(float(C.max()), 0.0) + 4 * sigma
    grid = np.linspace(0.0, top, int(min(512, math.ceil(top / (sigma / 4)) + 1)))
    x = C[:: max(1, len(C) // 4096)][:4096]
    L = np.exp(-0.5 * ((x[:, None] - grid[None]) / sigma) ** 2)
    L[7] = 0.0
    w = np.full(len(grid), 1.0 / len(grid))
    for _ in range(200):
        w = w * (L.T @ (1.0 / (L @ w + 1e-300))) / len(x)
    got = np.full(len(grid), 1.0 / len(grid))
    grid_em(L, 200, got)
    assert np.max(np.abs(got - w)) <= 1e-12 * np.max(w)
    assert (np.count_nonzero(L) <= L.size // BANDED_SHARE) == heavy
    if heavy:
        g2, w2 = _total_prior(C, sigma)
        np.testing.assert_array_equal(g2, grid)
        L[7] = np.exp(-0.5 * ((x[7] - grid) / sigma) ** 2)
        ref = np.full(len(grid), 1.0 / len(grid))
        for _ in range(200):
            ref = ref * (L.T @ (1.0 / (L @ ref + 1e-300))) / len(x)
        assert np.max(np.abs(w2 - ref)) <= 1e-12 * np.max(ref)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), h=st.floats(0.01, 20.0), offset=st.integers(0, 4))
def test_clipped_user_sums_match_bincount_bit_for_bit(seed, h, offset):
    """:func:`clipped_user_sums` (``offset_moments``' per-user sums): the bits of NumPy's ``bincount`` over the
    clipped values and their squares, users without ratings 0, an ``indptr`` that does not start at 0."""
    from streamdp.kernels.als import clipped_user_sums, clipped_user_sums_reference

    rng = np.random.default_rng(seed)
    cnt = rng.integers(0, 9, rng.integers(0, 40))
    ip = offset + np.concatenate([[0], np.cumsum(cnt)]).astype(np.int64)
    x = rng.standard_normal(int(cnt.sum())) * 3.0
    sx, sxx = np.full(len(cnt), np.nan), np.full(len(cnt), np.nan)
    clipped_user_sums(ip, x, h, sx, sxx)
    rx, rxx = clipped_user_sums_reference(ip, x, h)
    np.testing.assert_array_equal(sx, rx)
    np.testing.assert_array_equal(sxx, rxx)
