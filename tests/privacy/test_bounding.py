"""Contribution-bounding kernels against slow NumPy references."""

from __future__ import annotations

import numpy as np
import pytest

from streamdp.errors import ParameterError
from streamdp.privacy import spawn_rngs
from streamdp.privacy.bounding import (
    center_ratings,
    clip_rows,
    personalized_weights,
    row_norms,
    trim_block,
    weight_rows,
)


def _block(seed=0, n_users=300, max_count=60):
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, max_count, n_users)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    items = np.concatenate([np.sort(rng.choice(1000, c, replace=False)) for c in counts]).astype(np.int32)
    ratings = rng.integers(1, 6, indptr[-1]).astype(np.float32)
    return indptr, items, ratings


def test_trim_block_caps_keeps_order_and_is_a_subset():
    indptr, items, ratings = _block()
    tau = 20
    ip, it, r = trim_block(indptr, items, ratings, tau, seed=1)
    assert ip.dtype == np.int64 and it.dtype == np.int32 and r.dtype == np.float32
    counts, new = np.diff(indptr), np.diff(ip)
    assert np.array_equal(new, np.minimum(counts, tau))
    for u in range(len(counts)):
        a, b, c, d = indptr[u], indptr[u + 1], ip[u], ip[u + 1]
        orig = dict(zip(items[a:b].tolist(), ratings[a:b].tolist()))
        kept = it[c:d]
        assert np.all(np.diff(kept) > 0)  # original (sorted) order kept
        assert all(orig[i] == v for i, v in zip(kept.tolist(), r[c:d].tolist()))
        if counts[u] <= tau:
            assert np.array_equal(kept, items[a:b])


def test_trim_block_deterministic_per_seed_and_uniform():
    indptr, items, ratings = _block(2)
    a = trim_block(indptr, items, ratings, 10, seed=5)
    b = trim_block(indptr, items, ratings, 10, seed=5)
    c = trim_block(indptr, items, ratings, 10, seed=6)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[1], c[1])
    g = spawn_rngs(0, 1)[0]  # a block's own generator works too
    assert trim_block(indptr, items, ratings, 10, seed=g)[0].tolist() == a[0].tolist()
    # uniformity: one user with 50 ratings, tau 10 -> each rating kept w.p. 1/5
    ip1, it1, r1 = np.array([0, 50]), np.arange(50, dtype=np.int32), np.ones(50, np.float32)
    hits = np.zeros(50)
    for s in range(2000):
        hits[trim_block(ip1, it1, r1, 10, seed=s)[1]] += 1
    p = hits / 2000
    assert np.abs(p - 0.2).max() < 5 * np.sqrt(0.2 * 0.8 / 2000)


def test_trim_block_no_trimming_needed_returns_copies():
    indptr, items, ratings = _block(3, max_count=5)
    ip, it, r = trim_block(indptr, items, ratings, 5, seed=0)
    assert np.array_equal(it, items) and it is not items


def _clip_ref(indptr, v, L):
    out = v.astype(np.float64).copy()
    for u in range(len(indptr) - 1):
        s = slice(indptr[u], indptr[u + 1])
        n = np.linalg.norm(out[s])
        if n > L:
            out[s] *= L / n
    return out


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_clip_rows_matches_reference_and_bounds_norms(dtype):
    indptr, _, ratings = _block(4)
    v = center_ratings(ratings, 3.0).astype(dtype)
    L = 2.5
    out = clip_rows(indptr, v, L)
    assert out.dtype == dtype and out is not v
    np.testing.assert_allclose(out, _clip_ref(indptr, v, L), rtol=1e-5 if dtype == np.float32 else 1e-12)
    assert row_norms(indptr, out).max() <= L
    w = v.copy()
    assert clip_rows(indptr, w, L, inplace=True) is w
    np.testing.assert_array_equal(w, out)
    assert np.array_equal(clip_rows(indptr, v, np.inf), v)


def test_weights_and_centering():
    indptr, _, ratings = _block(5)
    wts = np.linspace(0, 1, len(indptr) - 1)
    out = weight_rows(indptr, ratings.astype(np.float64), wts)
    ref = ratings.astype(np.float64) * np.repeat(wts, np.diff(indptr))
    np.testing.assert_allclose(out, ref)
    # personalized weights (Liu et al. Thm 2): min(tau, m_i) w_i = f_i tau
    counts = np.diff(indptr)
    f = np.full(len(counts), 0.5)
    pw = personalized_weights(counts, 20, f)
    has = counts > 0
    np.testing.assert_allclose(np.minimum(counts, 20)[has] * pw[has], 0.5 * 20)
    assert np.all(pw[~has] == 0)
    c = center_ratings(np.array([1, 3, 5], np.int8), 3.0)
    assert c.dtype == np.float64 and c.tolist() == [-2.0, 0.0, 2.0]


@pytest.mark.parametrize("call,msg", [
    (lambda: trim_block(np.array([0, 2]), np.zeros(2, np.int32), np.zeros(2), 0), "tau"),
    (lambda: trim_block(np.array([0, 2]), np.zeros(2, np.int32), np.zeros(2), 1.5), "tau"),
    (lambda: clip_rows(np.array([0, 2]), np.zeros(2), -1.0), "L"),
    (lambda: clip_rows(np.array([0, 2]), np.zeros(2), 0.0), "L"),
    (lambda: clip_rows(np.array([0, 3]), np.zeros(2), 1.0), "indptr"),
    (lambda: weight_rows(np.array([0, 2]), np.zeros(2), np.array([-1.0])), "weights"),
    (lambda: personalized_weights(np.array([3]), 2, np.array([1.5])), "fractions"),
    (lambda: center_ratings(np.zeros(2), float("nan")), "mean"),
])
def test_invalid_bounding_parameters(call, msg):
    with pytest.raises(ParameterError, match=msg):
        call()


def test_bounds_summary():
    from streamdp.privacy.bounding import contribution_bounds

    b = contribution_bounds(tau=10, L=1.0, weights=np.array([0.0, 1.0]))
    assert b["weights"]["n_zero"] == 1 and b["tau"] == 10
    with pytest.raises(ParameterError, match="tau"):
        contribution_bounds(tau=0)


def _trim_ref(indptr, items, ratings, tau, seed):
    """Slow reference: per user, the tau ratings with the smallest keys, in original order."""
    from streamdp.privacy import make_rng

    counts = np.diff(indptr)
    keys = make_rng(seed).random(items.size) if counts.max() > tau else None
    ip, it, rt = [0], [], []
    for u in range(len(counts)):
        a, b = indptr[u], indptr[u + 1]
        sel = np.arange(a, b) if b - a <= tau else a + np.sort(np.argsort(keys[a:b])[:tau])
        it.append(items[sel])
        rt.append(ratings[sel])
        ip.append(ip[-1] + len(sel))
    return np.array(ip), np.concatenate(it), np.concatenate(rt)


def test_trim_block_matches_reference():
    indptr, items, ratings = _block(7)
    for tau in (1, 7, 30):
        got, ref = trim_block(indptr, items, ratings, tau, seed=11), _trim_ref(indptr, items, ratings, tau, 11)
        assert all(np.array_equal(g, r) for g, r in zip(got, ref))


# -- contribution weights (als / irls / means) ----------------------------------------------

import math  # noqa: E402

from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.integers(0, 40), min_size=1, max_size=30), tau=st.integers(1, 30),
       rule=st.sampled_from(["uniform", "tail", "adaptive"]), norm=st.sampled_from(["l1", "l2"]),
       exponent=st.sampled_from([0.0, -0.5]), tilted=st.booleans(), seed=st.integers(0, 2**31))
def test_contribution_weights_bound_every_user(counts, tau, rule, norm, exponent, tilted, seed):
    """Every rule keeps each user's norm within the bound; adaptive weights (per-rating scales or not) meet it."""
    from streamdp.privacy.bounding import contribution_weights

    rng = np.random.default_rng(seed)
    ip = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    items = np.concatenate([rng.choice(50, size=c, replace=False) for c in counts] or [np.zeros(0)]).astype(np.int32)
    noisy = rng.normal(20, 15, size=50)
    scales = rng.uniform(0.01, 3.0, size=items.size) if tilted and rule == "adaptive" else None
    w = contribution_weights(ip, items, rule=rule, tau=tau, norm=norm, first_user=7, seed=seed, item_counts=noisy,
                             exponent=exponent, scales=scales)
    assert w.shape == items.shape and np.all(w >= 0)
    for u, c in enumerate(counts):
        wu = w[ip[u]:ip[u + 1]]
        bound = math.sqrt(tau) if norm == "l2" else tau
        size = np.sqrt(np.sum(wu ** 2)) if norm == "l2" else np.sum(wu)
        assert size <= bound, (u, size, bound)
        if rule != "adaptive":
            assert np.count_nonzero(wu) == min(c, tau)
        elif c:
            assert size >= bound * (1 - 1e-9)  # every user spends the whole bound


def test_uniform_weights_do_not_depend_on_blocks():
    """The kept subset is a hash of (seed, global user, item): the same whether users come in one block or two."""
    from streamdp.privacy.bounding import contribution_weights

    rng = np.random.default_rng(1)
    counts = rng.integers(1, 30, size=20)
    ip = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    items = np.concatenate([rng.choice(100, size=c, replace=False) for c in counts]).astype(np.int32)
    whole = contribution_weights(ip, items, rule="uniform", tau=8, seed=5)
    cut = int(ip[9])
    a = contribution_weights(ip[:10], items[:cut], rule="uniform", tau=8, seed=5)
    b = contribution_weights(ip[9:] - ip[9], items[cut:], rule="uniform", tau=8, seed=5, first_user=9)
    assert np.array_equal(whole, np.concatenate([a, b]))
    assert not np.array_equal(whole, contribution_weights(ip, items, rule="uniform", tau=8, seed=6))


def test_tail_keeps_the_rarest_items():
    from streamdp.privacy.bounding import contribution_weights

    ip = np.array([0, 5])
    items = np.array([0, 1, 2, 3, 4], np.int32)
    w = contribution_weights(ip, items, rule="tail", tau=2, item_counts=np.array([50.0, 3.0, 20.0, 1.0, 9.0]))
    assert w.tolist() == [0.0, 1.0, 0.0, 1.0, 0.0]


def test_scales_lean_a_users_weights_and_need_the_adaptive_rule():
    """Per-rating scales set the ratios of a user's adaptive weights (``c_ij`` proportional to the scale) and leave
    her norm at ``sqrt(tau)``; the kept-subset rules refuse them, as they refuse a non-positive scale."""
    from streamdp.privacy.bounding import contribution_weights

    ip, items = np.array([0, 3, 5]), np.array([0, 1, 2, 0, 3], np.int32)
    scales = np.array([1.0, 0.5, 0.25, 1.0, 1.0])
    w = contribution_weights(ip, items, rule="adaptive", tau=9, scales=scales)
    np.testing.assert_allclose(w[:3] / w[0], scales[:3])
    np.testing.assert_allclose(w[3:], math.sqrt(9 / 2) * (1 - 2.0 ** -40))
    np.testing.assert_allclose(np.sum(w[:3] ** 2), 9.0)
    with pytest.raises(ParameterError, match="adaptive"):
        contribution_weights(ip, items, rule="uniform", tau=9, scales=scales)
    with pytest.raises(ParameterError, match="positive"):
        contribution_weights(ip, items, rule="adaptive", tau=9, scales=np.r_[scales[:4], 0.0])


@pytest.mark.parametrize("rule,exponent,norm", [("adaptive", 0.0, "l2"), ("adaptive", 0.0, "l1"),
                                                 ("adaptive", -0.5, "l2"), ("uniform", 0.0, "l2"),
                                                 ("tail", 0.0, "l2")])
def test_contribution_weights_into_a_given_array_are_the_same(rule, exponent, norm):
    rng = np.random.default_rng(5)
    cnt = rng.integers(0, 12, size=60)
    ip = np.r_[0, np.cumsum(cnt)]
    it = rng.integers(0, 30, size=ip[-1]).astype(np.int32)
    kw = dict(rule=rule, tau=4, norm=norm, first_user=7, seed=9, item_counts=rng.uniform(1, 50, 30),
              exponent=exponent)
    from streamdp.privacy.bounding import contribution_weights

    out = np.full(ip[-1] + 3, np.nan)[:ip[-1]]
    got = contribution_weights(ip, it, **kw, out=out)
    assert got is out and got.tobytes() == contribution_weights(ip, it, **kw).tobytes()


@pytest.mark.parametrize("norm", ["l2", "l1"])
@pytest.mark.parametrize("exponent,tilted", [(-0.5, False), (-1.0, True), (0.0, True), (-0.3, False)])
def test_adaptive_weights_are_the_numpy_expression_bit_for_bit(norm, exponent, tilted):
    """The kernel (one power per item, the division per rating) gives the bits of the NumPy formula it replaced."""
    rng = np.random.default_rng(11)
    cnt = rng.integers(0, 300, size=400) * (rng.random(400) < 0.9)
    ip = np.r_[0, np.cumsum(cnt)]
    it = rng.integers(0, 900, size=ip[-1]).astype(np.int32)
    c = rng.normal(40, 90, 900) * 5  # noisy counts, some negative
    scales = rng.uniform(0.2, 1.5, ip[-1]) if tilted else None
    from streamdp.privacy.bounding import _F64_SAFETY, contribution_weights

    nj = np.maximum(c, 1.0)[it] ** exponent if exponent else np.ones(it.size)
    nj = nj * scales if tilted else nj
    starts, kept = ip[:-1][cnt > 0], cnt[cnt > 0]
    if norm == "l2":
        want = math.sqrt(9) * nj / np.sqrt(np.repeat(np.add.reduceat(nj * nj, starts), kept))
    else:
        want = 9 * nj / np.repeat(np.add.reduceat(nj, starts), kept)
    got = contribution_weights(ip, it, rule="adaptive", tau=9, norm=norm, item_counts=c, exponent=exponent,
                               scales=scales)
    assert got.tobytes() == (want * _F64_SAFETY).tobytes()
