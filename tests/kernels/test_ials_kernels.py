"""``streamdp.kernels.ials``: the implicit-ALS user solve and item-side sums against their NumPy references."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamdp.kernels.als import symmetrize_upper, unpack_upper
from streamdp.kernels.ials import (ials_accumulate, ials_accumulate_reference, ials_cg_users, ials_cg_users_reference,
                                   ials_item_products, ials_item_products_reference, ials_solve_items,
                                   ials_solve_users, ials_solve_users_reference)


def _block(seed, n_users=40, n_items=25, d=5):
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 9, n_users)
    counts[min(3, n_users - 1)] = 0  # a user without pairs
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    items = np.concatenate([rng.choice(n_items, c, replace=False) for c in counts]).astype(np.int32)
    conf = 1.0 + rng.uniform(0, 4, len(items))
    return rng, indptr, items, conf, rng.standard_normal((n_items, d))


@pytest.mark.parametrize("seed", [0, 1])
def test_user_solve_matches_the_reference(seed):
    rng, ip, it, conf, Y = _block(seed)
    YtY = Y.T @ Y
    U = np.full((len(ip) - 1, Y.shape[1]), np.nan)
    ials_solve_users(ip, it, conf, Y, YtY, 0.5, U, False)
    np.testing.assert_allclose(U, ials_solve_users_reference(ip, it, conf, Y, YtY, 0.5), rtol=1e-9, atol=1e-12)
    assert not U[3].any()


@pytest.mark.parametrize("seed", [0, 1])
def test_user_solve_in_float32_tiles_is_the_reference_within_float32_rounding(seed):
    """``tiles32`` (the private training's user solve): float32 tiles, float64 sums and factorization: the reference
    within 1e-5 of the largest entry (float32 rounding: about 1e-7)."""
    rng, ip, it, conf, Y = _block(seed)
    YtY = Y.T @ Y
    U = np.full((len(ip) - 1, Y.shape[1]), np.nan)
    ials_solve_users(ip, it, conf, Y, YtY, 0.5, U, True)
    want = ials_solve_users_reference(ip, it, conf, Y, YtY, 0.5)
    assert np.abs(U - want).max() <= 1e-5 * np.abs(want).max()
    assert not U[3].any()


def test_user_solve_is_the_weighted_least_squares_over_every_item():
    # the Gramian trick: the solve equals the explicit weighted least squares over all items (zeros weight 1)
    rng, ip, it, conf, Y = _block(2, n_users=5)
    U = np.zeros((5, Y.shape[1]))
    ials_solve_users(ip, it, conf, Y, Y.T @ Y, 0.3, U, False)
    for u in range(5):
        c = np.ones(len(Y))
        p = np.zeros(len(Y))
        c[it[ip[u]:ip[u + 1]]] = conf[ip[u]:ip[u + 1]]
        p[it[ip[u]:ip[u + 1]]] = 1.0
        if ip[u + 1] == ip[u]:
            continue
        x = np.linalg.solve((Y * c[:, None]).T @ Y + 0.3 * np.eye(Y.shape[1]), (Y * c[:, None]).T @ p)
        np.testing.assert_allclose(U[u], x, rtol=1e-9)


@pytest.mark.parametrize("clip", [np.inf, 0.7])
@pytest.mark.parametrize("popularity", [False, True])
def test_item_sums_match_the_reference(clip, popularity):
    rng, ip, it, conf, Y = _block(3)
    n, d = Y.shape
    k = d - 1 if popularity else d
    U = rng.standard_normal((len(ip) - 1, d))
    w = (rng.uniform(size=len(it)) < 0.7).astype(np.float64)
    B, A, G = np.zeros((n, k)), np.zeros((n, d * (d + 1) // 2)), np.zeros((d, d))
    clipped = ials_accumulate(ip, it, conf, w, U, clip, 0.5, B, A, G)
    rB, rA, rG = ials_accumulate_reference(ip, it, conf, w, U, clip, n, k=k, clip_last=0.5 if popularity else np.inf)
    np.testing.assert_allclose(B, rB, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(unpack_upper(A, d), rA, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(symmetrize_upper(G), rG, rtol=1e-10, atol=1e-12)
    has = np.diff(ip) > 0
    assert clipped == int(np.sum(np.linalg.norm(U[:, :k], axis=1)[has] > clip))


def test_item_solve_matches_numpy():
    rng, ip, it, conf, Y = _block(5, d=4)
    n, d = Y.shape
    k = d - 1  # the last column fixed (popularity)
    X = rng.standard_normal((30, d))
    G = X.T @ X
    A = rng.standard_normal((n, d * (d + 1) // 2)) * 0.1
    B = rng.standard_normal((n, k))
    lam = rng.uniform(0.5, 2.0, n)
    scale = rng.uniform(1.0, 2.0, n)
    out = Y.copy()
    ials_solve_items(B, A, G, scale, lam, Y, k, out)
    M = scale[:, None, None] * G[None] + unpack_upper(A, d)
    rhs = B - Y[:, k][:, None] * M[:, :k, k]
    want = np.linalg.solve(M[:, :k, :k] + lam[:, None, None] * np.eye(k), rhs[..., None])[..., 0]
    np.testing.assert_allclose(out[:, :k], want, rtol=1e-8, atol=1e-10)
    np.testing.assert_array_equal(out[:, k], Y[:, k])


def test_one_users_contribution_is_within_the_bounds():
    # the sensitivities of streamdp.methods.ials (factor part clipped to D, popularity weight to P):
    # ||dG|| <= D^2 + P^2, ||dB|| <= c_max D sqrt(tau), ||dA|| <= (c_max - 1) (D^2 + P^2) sqrt(tau)
    rng = np.random.default_rng(4)
    d, n, tau, D, P, cmax = 4, 30, 6, 0.8, 0.5, 3.0
    it = rng.choice(n, tau, replace=False).astype(np.int32)
    ip = np.array([0, tau], np.int64)
    conf = np.full(tau, cmax)
    U = rng.standard_normal((1, d)) * 10
    B, A, G = np.zeros((n, d - 1)), np.zeros((n, d * (d + 1) // 2)), np.zeros((d, d))
    ials_accumulate(ip, it, conf, np.ones(tau), U, D, P, B, A, G)
    assert np.linalg.norm(G[np.triu_indices(d)]) <= D * D + P * P + 1e-12
    assert np.linalg.norm(B) <= cmax * D * np.sqrt(tau) + 1e-12
    assert np.linalg.norm(A) <= (cmax - 1) * (D * D + P * P) * np.sqrt(tau) + 1e-12


@pytest.mark.parametrize("ones", [False, True])
def test_user_solve_both_paths_match_the_reference(ones):
    # users with fewer pairs than d (the Woodbury path) and with more (the d x d system), confidences of exactly 1
    # (no term in the Woodbury system) among them
    rng = np.random.default_rng(7)
    n_items, d = 60, 16
    counts = np.array([1, 2, 15, 16, 17, 40, 0, 5])
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    items = np.concatenate([rng.choice(n_items, c, replace=False) for c in counts]).astype(np.int32)
    conf = np.ones(len(items)) if ones else 1.0 + rng.uniform(0, 20, len(items)) * (rng.random(len(items)) < 0.7)
    Y = rng.standard_normal((n_items, d)) * 0.3
    U = np.full((len(counts), d), np.nan)
    ials_solve_users(indptr, items, conf, Y, Y.T @ Y, 0.05, U, False)
    np.testing.assert_allclose(U, ials_solve_users_reference(indptr, items, conf, Y, Y.T @ Y, 0.05), rtol=1e-8,
                               atol=1e-11)


@pytest.mark.parametrize("seed", [0, 1])
def test_item_products_match_the_reference_and_the_gramians(seed):
    """``A_j p_j`` without forming ``A_j``: the NumPy reference, and ``A_j`` (from the item sums) times ``p_j``."""
    rng, ip, it, conf, Y = _block(seed)
    X = rng.standard_normal((len(ip) - 1, Y.shape[1]))
    w = (rng.uniform(size=len(it)) < 0.8).astype(np.float64)  # weight 0: a pair left out of the item side
    P = rng.standard_normal(Y.shape)
    out = np.zeros(P.shape)
    ials_item_products(ip, it, conf, w, X, P, out, False)
    np.testing.assert_allclose(out, ials_item_products_reference(ip, it, conf, w, X, P), rtol=1e-10, atol=1e-12)
    _, A, _ = ials_accumulate_reference(ip, it, conf, w, X, np.inf, len(Y))
    np.testing.assert_allclose(out, np.einsum("jab,jb->ja", A, P), rtol=1e-10, atol=1e-12)


def test_item_products_with_the_residual_are_the_right_hand_sides_minus_the_products():
    """``residual``: ``B_j - A_j p_j`` in one sweep (the item solve's initial residual, without its ``G`` part)."""
    rng, ip, it, conf, Y = _block(3)
    X = rng.standard_normal((len(ip) - 1, Y.shape[1]))
    w = (rng.uniform(size=len(it)) < 0.8).astype(np.float64)
    P = rng.standard_normal(Y.shape)
    out = np.zeros(P.shape)
    ials_item_products(ip, it, conf, w, X, P, out, True)
    np.testing.assert_allclose(out, ials_item_products_reference(ip, it, conf, w, X, P, residual=True), rtol=1e-10,
                               atol=1e-12)
    B, A, _ = ials_accumulate_reference(ip, it, conf, w, X, np.inf, len(Y))
    np.testing.assert_allclose(out, B - np.einsum("jab,jb->ja", A, P), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("residual", [False, True])
def test_item_products_in_float32_are_the_float64_sums_within_float32_rounding(residual):
    """The non-private item passes run the products in float32 (rows, directions, a block's partial): the float64
    reference within float32 rounding of sums of about 30 terms (relative to the largest entry)."""
    rng, ip, it, conf, Y = _block(4)
    X = rng.standard_normal((len(ip) - 1, Y.shape[1]))
    w = (rng.uniform(size=len(it)) < 0.8).astype(np.float64)
    P = rng.standard_normal(Y.shape)
    out = np.zeros(P.shape, np.float32)
    ials_item_products(ip, it, conf, w, X.astype(np.float32), P.astype(np.float32), out, residual)
    want = ials_item_products_reference(ip, it, conf, w, X, P, residual=residual)
    assert np.abs(out - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("seed", [0, 1])
def test_user_conjugate_gradients_match_the_reference(seed):
    """Three warm-started steps, as the non-private training runs them: the float64 NumPy reference within the
    kernel's float32 rounding (1e-5 of the largest entry; measured 1.3e-7 absolute on entries about 0.5)."""
    rng, ip, it, conf, Y = _block(seed, d=8)
    YtY = Y.T @ Y
    exact = ials_solve_users_reference(ip, it, conf, Y, YtY, 0.5)
    X0 = exact + 0.1 * rng.standard_normal(exact.shape)
    X = X0.copy()
    ials_cg_users(ip, it, conf, Y, YtY, 0.5, 3, X)
    want = ials_cg_users_reference(ip, it, conf, Y, YtY, 0.5, 3, X0)
    assert np.abs(X - want).max() <= 1e-5 * np.abs(want).max()
    assert not X[3].any()  # no pairs: 0, her exact row
    # the warm start pays: three steps leave less than half of the starting error (0.24 of it here)
    has = np.diff(ip) > 0
    assert np.linalg.norm(X[has] - exact[has]) < 0.5 * np.linalg.norm(X0[has] - exact[has])


def test_user_conjugate_gradients_reach_the_exact_solve():
    """From zero, ``d`` steps are the exact solve (finite termination) and from the exact rows the rows stay, both
    within the kernel's float32 rounding (1e-5 of the largest entry)."""
    rng, ip, it, conf, Y = _block(4, d=6)
    YtY = Y.T @ Y
    exact = np.zeros((len(ip) - 1, 6))
    ials_solve_users(ip, it, conf, Y, YtY, 0.2, exact, False)
    X = np.zeros_like(exact)
    ials_cg_users(ip, it, conf, Y, YtY, 0.2, 6, X)
    assert np.abs(X - exact).max() <= 1e-5 * np.abs(exact).max()
    X = exact.copy()
    ials_cg_users(ip, it, conf, Y, YtY, 0.2, 3, X)
    assert np.abs(X - exact).max() <= 1e-5 * np.abs(exact).max()


@pytest.mark.parametrize("d", [4, 8, 9, 17, 24])
def test_user_solve_is_the_old_kernel_within_1e_10(d):
    """The tiled Gramian, the column-wise Cholesky and the lanes (issue 44) against the kernel they replaced: users
    with fewer pairs than ``d`` (Woodbury), more (the direct form), none. (On bench/roofline.py's first 2M ratings the
    rows moved against main's lanes-free kernel by at most 7e-16 of their norm in float64, 2e-9 with tiles32 at
    d = 8, 9, where the rows are now read as float64; docs/benchmarks.md.)"""
    from bench._before import ials_solve_users_before

    rng = np.random.default_rng(d)
    lengths = rng.integers(0, 3 * d, 50)
    lengths[7] = 0
    ip = np.r_[0, np.cumsum(lengths)].astype(np.int64)
    it = rng.integers(0, 70, ip[-1]).astype(np.int32)
    conf = 1.0 + rng.uniform(0.0, 20.0, ip[-1])
    Y = rng.normal(0, 0.4, (70, d))
    got, want = np.full((50, d), np.nan), np.full((50, d), np.nan)
    ials_solve_users(ip, it, conf, Y, Y.T @ Y, 0.3, got, False)
    ials_solve_users_before(ip, it, conf, Y, Y.T @ Y, 0.3, want)
    assert not got[7].any()
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10 * np.abs(want).max())


def _conf_users(d, tiles32):
    """21 users' implicit pairs over 50 items (three without pairs, one last), item rows ``Y``, and every user's
    row from one :func:`ials_solve_users` call."""
    rng = np.random.default_rng(d + 100 * tiles32)
    cnt = rng.integers(0, 3 * d, 21)
    cnt[[2, 9, 20]] = 0
    ip = np.r_[0, np.cumsum(cnt)].astype(np.int64)
    it = rng.integers(0, 50, ip[-1]).astype(np.int32)
    conf = 1.0 + rng.uniform(0.0, 20.0, ip[-1]) * (rng.random(ip[-1]) < 0.8)
    Y = rng.normal(0, 0.4, (50, d))
    U = np.full((len(cnt), d), np.nan)
    ials_solve_users(ip, it, conf, Y, Y.T @ Y, 0.3, U, tiles32)
    return ip, it, conf, Y, U


@pytest.mark.parametrize("d", [5, 8, 9, 16, 17])
@pytest.mark.parametrize("tiles32", [False, True])
def test_a_users_row_is_hers_alone_bit_for_bit(d, tiles32):
    """Users are solved in lanes of eight (d <= LANE_D): each row is the one her own local solve (her pairs alone,
    :func:`streamdp.serving.local.implicit_rows`) gets, bit for bit, whatever her neighbours, users without pairs
    among them and last."""
    ip, it, conf, Y, U = _conf_users(d, tiles32)
    for u in range(len(ip) - 1):
        one = np.full((1, d), np.nan)
        s, e = ip[u], ip[u + 1]
        ials_solve_users(np.array([0, e - s], np.int64), it[s:e], conf[s:e], Y, Y.T @ Y, 0.3, one, tiles32)
        assert np.array_equal(U[u], one[0]), u
    assert not U[[2, 9, 20]].any()


@pytest.mark.slow  # a layout no caller passes: its own compile of the lanes' chain (~10 s)
@pytest.mark.parametrize("d", [5, 8, 9, 16, 17])
@pytest.mark.parametrize("tiles32", [False, True])
def test_rows_not_contiguous_give_the_same_users_within_rounding(d, tiles32):
    """Whitened item rows in Fortran order (at d = 8, 9 the Gramian then comes from a tile, not from the rows):
    the same users' rows within rounding."""
    from streamdp.kernels.ials import ials_solve_whitened, ials_whitened

    ip, it, conf, Y, U = _conf_users(d, tiles32)
    Yw, Li = ials_whitened(Y, Y.T @ Y, 0.3, tiles32)
    F = np.full_like(U, np.nan)
    ials_solve_whitened(ip, it, conf, np.asfortranarray(Yw), Li, F)
    np.testing.assert_allclose(F, U, rtol=0, atol=(1e-5 if tiles32 else 1e-12) * np.abs(U).max())


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), preference=st.sampled_from(["above", "graded", "binary"]),
       dtype=st.sampled_from([np.float32, np.float64]), offset=st.integers(0, 5),
       alpha=st.floats(0.0, 50.0), cap=st.floats(1.0, 60.0), dropped=st.floats(0.0, 0.5))
def test_rating_confidences_match_numpy_bit_for_bit(seed, preference, dtype, offset, alpha, cap, dropped):
    """The rating path of ``implicit_pairs`` (:func:`masked_indptr`, :func:`rating_confidences`): the same pairs,
    confidences and dtypes as the NumPy form, bit for bit, on blocks with users of no positive rating, ratings at the
    midpoint and outside the range, an ``indptr`` that does not start at 0 (a slice of a block), and with positions
    dropped first (the training's held-out ratings: ``drop``, on blocks from 0) as the copy of the block did."""
    from streamdp.kernels.ials import rating_confidences_reference
    from streamdp.serving.local import implicit_pairs

    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 7, rng.integers(0, 30))
    drop = None
    if dropped:
        offset = 0
        drop = np.flatnonzero(rng.random(int(counts.sum())) < dropped)
    indptr = offset + np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    items = rng.integers(0, 50, int(counts.sum())).astype(np.int32)
    values = (rng.integers(-1, 12, len(items)) / 2.0).astype(dtype)  # -0.5..5.5 by halves: the midpoint 3, outside 1..5
    lo, hi = 1.0, 5.0
    params = {"implicit": False, "preference": preference, "alpha": alpha, "max_confidence": cap,
              "rating_min": lo, "rating_max": hi}
    got = implicit_pairs(indptr, items, values, params, drop=drop)
    ref = rating_confidences_reference(indptr, items, values, preference == "above", preference == "graded", lo, hi,
                                       alpha, cap, drop=drop)
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype
        np.testing.assert_array_equal(g, r)


def test_implicit_pairs_drop_on_counts_is_the_block_without_them():
    """An interaction log's pairs with ``drop``: those of the block with the dropped positions deleted first."""
    from streamdp.serving.local import implicit_pairs

    rng = np.random.default_rng(3)
    counts = rng.integers(0, 6, 40)
    ip = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    it = rng.integers(0, 30, ip[-1]).astype(np.int32)
    v = rng.integers(1, 9, ip[-1]).astype(np.float32)
    drop = np.flatnonzero(rng.random(ip[-1]) < 0.3)
    p = {"implicit": True, "alpha": 2.0, "max_confidence": 5.0, "count_scale": 1.0}
    keep = np.ones(ip[-1], bool)
    keep[drop] = False
    users = np.repeat(np.arange(len(counts)), counts)
    ip2 = np.concatenate([[0], np.cumsum(np.bincount(users[keep], minlength=len(counts)))])
    for g, r in zip(implicit_pairs(ip, it, v, p, drop=drop), implicit_pairs(ip2, it[keep], v[keep], p)):
        np.testing.assert_array_equal(g, r)
