"""The rehearsal's spread kernel against its NumPy reference, and what its statistics measure."""

import numpy as np
import scipy.sparse as sp

from streamdp.kernels.spread import residual_spread, residual_spread_reference


def _block(seed=0, n_users=80, n_items=30, density=0.25):
    rng = np.random.default_rng(seed)
    A = sp.random(n_users, n_items, density=density, random_state=rng, format="csr")
    A.data = rng.integers(1, 6, A.nnz).astype(np.float32)
    A.sort_indices()
    return A.indptr.astype(np.int64), A.indices.astype(np.int32), A.data.astype(np.float32)


def test_residual_spread_matches_the_reference_with_and_without_factors():
    ip, it, r = _block()
    rng = np.random.default_rng(1)
    mean = rng.uniform(2.5, 4.0, 30)
    bounds = np.array([4.0, 2.0, 4.0])
    counts = np.diff(ip)
    for V in (rng.normal(size=(30, 3)), np.zeros((30, 0))):
        for cap in (0.0, 5.0):
            out = np.zeros(4)
            n = residual_spread(ip, it, r, mean, V, 1.0, bounds, cap, out)
            ref, n_ref = residual_spread_reference(ip, it, r, mean, V, 1.0, bounds, cap)
            assert n == n_ref == int((counts >= 2).sum())
            np.testing.assert_allclose(out, ref, rtol=1e-10, atol=1e-10)
            # the weights: 1 a user without a cap, min(n, cap) / cap with one
            w = np.ones(n) if cap == 0 else np.minimum(counts[counts >= 2], cap) / cap
            assert abs(out[3] - w.sum()) < 1e-9
    # a tight bound clips every user's term: one user moves a sum by at most its bound
    out = np.zeros(4)
    n = residual_spread(ip, it, r, mean, np.zeros((30, 0)), 1.0, np.array([0.1, 0.01, 0.0]), 5.0, out)
    assert out[0] <= 0.1 * n + 1e-12 and abs(out[1]) <= 0.01 * n + 1e-12 and out[2] == 0.0


def test_the_residual_product_sees_user_offsets_not_noise_and_the_loo_residual_sees_noise_not_factors():
    """Ratings ``offset_i + u_i . v_j + N(0, s^2)`` around item means 0: the mean residual product estimates the
    offsets' variance (the noise adds nothing), the leave-one-out residual after the true factors the noise's."""
    rng = np.random.default_rng(5)
    n_users, n_items, per, k = 3000, 60, 20, 2
    V = rng.normal(size=(n_items, k))
    V -= V.mean(axis=0)  # items drawn uniformly: the mean product of two users' interactions is then 0
    items = np.concatenate([rng.choice(n_items, per, replace=False) for _ in range(n_users)]).astype(np.int32)
    user = np.repeat(np.arange(n_users), per)
    U, off = rng.normal(size=(n_users, k)), rng.normal(0, 0.5, n_users)
    r = (off[user] + (U[user] * V[items]).sum(axis=1) + rng.normal(0, 0.7, len(items))).astype(np.float32)
    ip = np.arange(0, n_users * per + 1, per, dtype=np.int64)
    out = np.zeros(4)
    n = residual_spread(ip, items, r, np.zeros(n_items), V, 1e-6, np.array([100.0, 100.0, 100.0]), 0.0, out)
    total, product, loo, users = out / n
    assert users == 1.0
    assert abs(product - 0.25) < 0.03
    assert abs(total - (0.25 + (V ** 2).sum(axis=1).mean() + 0.49)) < 0.05
    # the LOO residual after the user's mean and the factors: the noise, a little inflated by the fit
    assert 0.49 < loo < 0.49 * (1 + 2 * (k + 1) / per)
