"""``ials``'s chart on thin stores: a private top-K selection (:mod:`streamdp.privacy.topk`) lists first."""

from __future__ import annotations

import math

import numpy as np
import pytest

import streamdp
from streamdp.privacy.accountant import epsilon_of
from streamdp.privacy.events import event_from_dict
from streamdp.privacy.topk import K
from streamdp.storage.catalogue import catalogue_view
from tests.methods.test_als import _fit


def _counts(st) -> np.ndarray:
    c = np.zeros(st.n_items)
    for b in range(st.n_blocks):
        c += np.bincount(st.read_block(b, "train").items, minlength=st.n_items)
    return c


def _chart(f) -> np.ndarray:
    """The chart's top 10 by the released scores (``noisy_item_weight``; ties by position, as evaluate's)."""
    return np.argsort(-f.extras["noisy_item_weight"], kind="stable")[:10]


@pytest.fixture(scope="module")
def thin(tmp_path_factory):
    """300 users x 3,000 items, ~130 training ratings a user: a thin store."""
    return streamdp.generate(str(tmp_path_factory.mktemp("topk") / "thin.zarr"), users=300, items=3000,
                             ratings_per_user=165, test_fraction=0.2, seed=0)


def test_the_private_chart_finds_most_of_the_exact_top_10(thin):
    """At epsilon 1 the chart's top 10 hold at least 5 of the exact chart's top 10 on average over seeds 1-3
    (measured 6.7 over seeds 1-3 and 6.75 over 1-8; the released counts' Gaussian chart before: 2.7 and 2.9)."""
    exact = set(np.argsort(-_counts(thin), kind="stable")[:10].tolist())
    found = []
    for seed in (1, 2, 3):
        _, f = _fit(thin, method="ials", epsilon=1.0, iters=1, rank=4, seed=seed)
        assert f.model_info["chart"]["kind"] == "top-k selection" and f.model_info["chart"]["k"] == K
        found.append(len(exact & set(_chart(f).tolist())))
    assert np.mean(found) >= 5, found


def test_the_ledger_lists_the_selections_and_keeps_the_target(thin):
    _, f = _fit(thin, method="ials", epsilon=1.0, iters=1, rank=4, seed=1)
    led = f.ledger.to_dict()
    (entry,) = [e for e in led["bounds"]["releases"] if e["release"].startswith("the chart: its top")]
    assert entry["count"] == K and entry["sensitivity_norm"] == "linf" and entry["pure_epsilon_each"] > 0
    picks = [e for e in led["events"] if e.get("event", {}).get("name") == "PureDpEvent"]
    assert len(picks) == 1 and picks[0]["count"] == K
    assert picks[0]["event"]["epsilon"] == pytest.approx(entry["pure_epsilon_each"])
    assert led["delta"] == 1e-6 and 0.999 <= led["accounting"]["epsilon"] <= 1.0
    from streamdp.privacy.events import compose

    assert epsilon_of(compose([event_from_dict(e) for e in led["events"]]), 1e-6).epsilon <= 1.0


def test_a_never_rated_item_is_never_in_the_chart(tmp_path):
    """400 users of ~400 training ratings over 2,000 items, and 4,000 declared items nobody rated: the chart's top 10
    hold none of them in seeds 1-6 (the released counts' Gaussian chart before: in 3 of the 6). A never-rated item is
    picked only when its Gumbel noise beats the 10th item's count plus noise: about 4,000 exp(-320 / 23.5), 0.5%, a
    seed."""
    st = streamdp.generate(str(tmp_path / "heavy.zarr"), users=400, items=2000, ratings_per_user=500,
                           test_fraction=0.2, seed=0)
    ids = st.item_ids()
    st = catalogue_view(st, np.concatenate([ids, ids.max() + 1 + np.arange(4000)]))
    never = _counts(st) == 0
    assert never.sum() == 4000
    for seed in range(1, 7):
        _, f = _fit(st, method="ials", epsilon=1.0, iters=1, rank=4, seed=seed)
        assert "chart" in f.model_info
        assert not never[_chart(f)].any(), seed


def test_plentiful_stores_keep_the_released_counts(small_store):
    _, f = _fit(small_store, method="ials", epsilon=10.0, iters=1, rank=3, seed=1)
    assert "chart" not in f.model_info
    assert not [e for e in f.ledger.to_dict()["bounds"]["releases"] if e["release"].startswith("the chart")]


def test_tune_keeps_gaussian_releases_only(thin):
    """``tune`` needs every candidate's releases Gaussian (its envelope): its ials runs keep the released counts."""
    from streamdp.methods import get_method
    from streamdp.workflows.tune import _gaussian_only, gaussian_equivalent
    from streamdp.privacy.events import compose

    m = get_method("ials")(epsilon=1.0, delta=1e-6, seed=1)
    assert "topk" in m.plan(thin).releases
    g = _gaussian_only(get_method("ials")(epsilon=1.0, delta=1e-6, seed=1))
    plan = g.plan(thin)
    assert "topk" not in plan.releases and gaussian_equivalent(compose([r.event() for r in plan.releases.values()])) > 0


def test_a_resumed_run_keeps_its_chart(thin, tmp_path, interrupted_after_checkpoint):
    """The selection is made once, before the iterations: a run resumed from its checkpoint lists the same chart."""
    opts = dict(method="ials", epsilon=1.0, iters=2, rank=4, seed=3)
    _, full = _fit(thin, checkpoint=str(tmp_path / "full"), **opts)
    with interrupted_after_checkpoint(1):
        _fit(thin, checkpoint=str(tmp_path / "ck"), **opts)
    _, res = _fit(thin, checkpoint=str(tmp_path / "ck"), **opts)
    assert res.model_info["resumed_from_iteration"] == 1 and "chart" in res.model_info
    np.testing.assert_array_equal(res.extras["noisy_item_weight"], full.extras["noisy_item_weight"])
    np.testing.assert_array_equal(res.item_factors, full.item_factors)


def test_the_preference_counts_every_rating_where_the_chart_is_a_top_k_selection(thin, small_store):
    """Private runs on a rating store take ``--preference above`` (only liked ratings are pairs), except where the
    chart is a top-K selection: there every rating counts (``binary``), as in non-private runs; a given one stands
    (:func:`streamdp.methods.ials.default_preference`)."""
    from streamdp.methods import get_method

    def pref(st, epsilon, **kw):
        m = get_method("ials")(epsilon=epsilon, delta=1e-6, seed=1, **kw)
        return m.plan(st).settings.preference, "topk" in m.plan(st).releases

    assert pref(thin, 1.0) == ("binary", True)
    assert pref(thin, 10.0) == ("above", False)
    assert pref(small_store, 1.0) == ("above", False)
    assert pref(small_store, math.inf)[0] == "binary"
    assert pref(small_store, 1.0, preference="binary")[0] == "binary"
    assert pref(thin, 1.0, preference="above") == ("above", True)
