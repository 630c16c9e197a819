"""The private top-K chart (:mod:`streamdp.privacy.topk`): its mechanism, its accounting, when it is made."""

from __future__ import annotations

import math

import numpy as np
import pytest

from streamdp.privacy.accountant import epsilon_of
from streamdp.privacy.events import PureDpEvent, compose
from streamdp.privacy.release import Share, calibrate_releases
from streamdp.privacy.topk import K, TopKRelease, TopKShare, chart_noise_ratio, chart_scores, topk_chart


def test_one_shot_gumbel_first_pick_is_the_monotone_exponential_mechanism():
    """The first item chosen is the exponential mechanism's ``P(i) ~ exp(epsilon c_i)`` (monotone scores, sensitivity
    1: scale ``1 / epsilon``), the peeling's first step; 40,000 seeded draws, 5 standard errors."""
    r = TopKRelease("x", 2, 0.5)
    c = np.array([0.0, 1.0, 3.0, 2.0])
    rng = np.random.default_rng(7)
    n = 40_000
    first = np.array([r.select(c, rng)[0] for _ in range(n)])
    p = np.exp(0.5 * c) / np.exp(0.5 * c).sum()
    freq = np.bincount(first, minlength=4) / n
    assert np.all(np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / n))


def test_selection_is_k_distinct_items_best_first_and_exact_without_noise():
    r = TopKRelease("x", 3, 0.0)
    assert not r.private and r.scale == 0.0
    assert r.select(np.array([1.0, 5.0, 5.0, 0.0, 2.0]), np.random.default_rng(0)).tolist() == [1, 2, 4]
    got = TopKRelease("x", 3, 0.1).select(np.zeros(50), np.random.default_rng(1))
    assert len(set(got.tolist())) == 3


def test_share_calibrates_with_gaussian_releases_within_the_target():
    """A top-K share composes with Gaussian shares through the accountant (K pure-DP events of
    ``sqrt(share / K) / z`` each): the total is the target, and a larger share spends more on each selection."""
    shares = [Share("counts", "gaussian", 1.0, 0.3), Share("rhs", "gaussian", 2.0, 0.3, count=3),
              TopKShare("chart", K, 0.4, 100)]
    rels = calibrate_releases(shares, 1.0, 1e-6)
    ev = compose([r.event() for r in rels])
    assert 0.999 <= epsilon_of(ev, 1e-6).epsilon <= 1.0
    top = rels[-1]
    assert isinstance(top.event().event, PureDpEvent) and top.event().count == K
    z = rels[0].noise_multiplier * math.sqrt(0.3)
    assert top.epsilon_each == pytest.approx(math.sqrt(0.4 / K) / z, rel=1e-9)
    e = top.entry()
    assert e["sensitivity_norm"] == "linf" and e["count"] == K and e["candidates"] == 100


def test_the_chart_is_made_only_where_the_counts_noise_swamps_them():
    """Public numbers only: a thin store at epsilon 1 takes the selection; the plentiful shapes of issue 42 and a
    thin store at epsilon 10 keep the released counts."""
    t = math.sqrt(32)
    assert topk_chart(600, 10_000, t, 1.0, 1e-6, 0.3)
    assert chart_noise_ratio(600, 10_000, t, 1.0, 1e-6, 0.3) > 2 * chart_noise_ratio(600, 10_000, t, 2.5, 1e-6, 0.3)
    for users, items, eps in [(600, 10_000, 10.0), (6_040, 3_706, 1.0), (72_000, 2_400, 1.0), (15_000, 2_000, 1.0)]:
        assert not topk_chart(users, items, t, eps, 1e-6, 0.3)
    assert not topk_chart(600, 10_000, t, math.inf, 1e-6, 0.3)


def test_chart_scores_put_the_chosen_items_first_in_order():
    N = np.array([3.0, -2.0, 7.0, 1.0, 0.5])
    s = chart_scores(N, np.array([4, 1]))
    assert np.argsort(-s, kind="stable").tolist()[:3] == [4, 1, 2]
    assert s[0] == 3.0 and s[3] == 1.0
