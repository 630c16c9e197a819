"""The rating range of a private run (streamdp.privacy.rating_range): declared, or selected privately, never the
store's observed minimum and maximum."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

import streamdp
from streamdp.errors import ParameterError
from streamdp.methods import get_method
from streamdp.privacy.catalogue import selection_noise
from streamdp.privacy.rating_range import (DELTA_SHARE, SHARE, catalogue_and_range_for, range_for, select_range,
                                           user_extremes, value_weights)
from streamdp.storage.range_view import RangeView
from streamdp.workflows.training import train


def _frame(n_users=3000, n_items=20, per_user=6, seed=0, extra=None) -> pd.DataFrame:
    """Ratings 1..5 of ``n_users`` users on ``n_items`` items; ``extra``: rows appended."""
    rng = np.random.default_rng(seed)
    rows = []
    for u in range(n_users):
        for i in rng.choice(n_items, size=per_user, replace=False):
            rows.append((u, int(i), float(rng.integers(1, 6))))
    df = pd.DataFrame(rows, columns=["user", "item", "rating"])
    if extra is not None:
        df = pd.concat([df, pd.DataFrame(extra, columns=["user", "item", "rating"])], ignore_index=True)
    return df


#: One user alone holds the ratings 0 and 9 (the store's observed range is [0, 9]; every other rating is 1..5).
OUTLIER = [(99999, 0, 0.0), (99999, 1, 0.0), (99999, 2, 9.0), (99999, 3, 9.0), (99999, 4, 3.0)]  # 1 held out


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    d = tmp_path_factory.mktemp("range")
    items = list(range(20))
    plain = streamdp.ingest(_frame(), str(d / "plain.zarr"), items=items, test_fraction=0.2, seed=1)
    outlier = streamdp.ingest(_frame(extra=OUTLIER), str(d / "outlier.zarr"), items=items, test_fraction=0.2,
                              seed=1)
    declared = streamdp.ingest(_frame(), str(d / "declared.zarr"), items=items, rating_range="1,5",
                               test_fraction=0.2, seed=1)
    return plain, outlier, declared


def test_user_extremes_kernel_matches_numpy():
    rng = np.random.default_rng(3)
    lens = rng.integers(0, 6, 200)
    indptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    r = rng.choice(np.array([0.5, 1, 2.5, 4, 5], np.float32), int(indptr[-1]))
    lo, hi = np.full(200, -7, np.float32), np.full(200, -7, np.float32)
    has = user_extremes(indptr, r, lo, hi)
    for u in range(200):
        seg = r[indptr[u]:indptr[u + 1]]
        assert has[u] == (len(seg) > 0)
        if len(seg):
            assert (lo[u], hi[u]) == (seg.min(), seg.max())
        else:
            assert lo[u] == hi[u] == -7


def test_value_weights_give_each_user_norm_one(stores):
    _, outlier, _ = stores
    values, w = value_weights(outlier)
    assert values.tolist() == [0, 1, 2, 3, 4, 5, 9]
    assert w[0] == pytest.approx(1 / math.sqrt(2)) and w[-1] == pytest.approx(1 / math.sqrt(2))  # the lone user
    # each user: weight 1 on one value (min == max) or 1/sqrt(2) on two: L2 norm 1
    n_one = n_two = 0
    for blk in outlier.blocks():
        for u in range(blk.n_users):
            seg = blk.ratings[blk.indptr[u]:blk.indptr[u + 1]]
            if len(seg):
                n_one += seg.min() == seg.max()
                n_two += seg.min() != seg.max()
    assert w.sum() == pytest.approx(n_one + 2 * n_two / math.sqrt(2))


def test_a_value_one_user_holds_is_never_the_range(stores):
    """One user alone rates 0 and 9: over 20 seeds at epsilon 1 neither is ever kept (each with probability at most
    delta_t = 5% of delta); the range is the scale the other 3000 users share."""
    _, outlier, _ = stores
    for seed in range(20):
        sel = select_range(outlier, epsilon=1.0, delta=1e-5, seed=seed)
        assert (sel.lo, sel.hi) == (1.0, 5.0), seed
        assert 0.0 not in sel.values and 9.0 not in sel.values
        assert sel.cut.delta == pytest.approx(DELTA_SHARE * 1e-5)


def test_plentiful_store_range_is_the_true_one(stores):
    plain, _, _ = stores
    sel = select_range(plain, epsilon=1.0, delta=1e-5, seed=1)
    assert (sel.lo, sel.hi) == (1.0, 5.0) and sel.source == "selected"
    z, dt = selection_noise(1.0, 1e-5, SHARE, DELTA_SHARE)
    assert sel.release.noise_multiplier == pytest.approx(z) and sel.cut.delta == pytest.approx(dt)
    assert np.all(sel.counts > sel.threshold)


def test_too_few_values_kept_is_refused_in_one_line(tmp_path, cli):
    st = streamdp.ingest(_frame(n_users=40, n_items=5, per_user=3), str(tmp_path / "small.zarr"), items=list(range(5)))
    with pytest.raises(ParameterError, match="declare the scale with ingest --rating-range LO,HI"):
        select_range(st, epsilon=1.0, delta=1e-3, seed=0)
    cli.error(cli.run("train", st.path, "--method", "means", "--epsilon", "1", "--out", tmp_path / "m"),
              "fewer than two rating values", "--rating-range")
    assert not (tmp_path / "m").exists()


def test_view_clips_training_ratings_only(stores):
    _, outlier, _ = stores
    view = RangeView(outlier, 1.0, 5.0)
    assert (view.rating_min, view.rating_max, view.rating_range_source) == (1.0, 5.0, "selected")
    tr = np.concatenate([b.ratings for b in view.blocks("train")])
    raw = np.concatenate([b.ratings for b in outlier.blocks("train")])
    assert tr.min() >= 1 and tr.max() <= 5 and np.array_equal(tr, np.clip(raw, 1, 5))
    te = np.concatenate([b.ratings for b in view.blocks("test")])
    assert np.array_equal(te, np.concatenate([b.ratings for b in outlier.blocks("test")]))
    spec = view.remote_view()
    again = spec.view(outlier)
    assert np.array_equal(again.read_block(0).ratings, view.read_block(0).ratings)
    assert spec.key == again.remote_view().key


def _model(path):
    return json.load(open(path / "model.json")), json.load(open(path / "privacy.json"))


@pytest.mark.parametrize("factors_win", [False, True])
def test_a_gated_run_keeps_the_selected_range_in_its_ledger_and_on_target(stores, tmp_path, monkeypatch, factors_win):
    """A gated als run whose factors lose (the choice forced here; a noisy choice may make it) spends the rest of its
    budget again: that second calibration composes the releases made before the plan (the rating range's selection)
    and its ledger lists them. It once composed only the user count: the range's two events left out of the ledger
    and out of the search, the total above the target."""
    import streamdp.methods.als as als_mod

    _, outlier, _ = stores
    # "factors, ridge 10" or "bias, ridge 3"
    monkeypatch.setattr(als_mod, "choose", lambda noisy, default, std: 0 if factors_win else 2)
    out = tmp_path / "m"
    train(outlier, method="als", epsilon=1.0, delta=1e-5, out=str(out), evaluate_test=False, seed=0, iters=4)
    model, ledger = _model(out)
    assert model["factors_released"] is factors_win and model["selection"]["chosen_after_iteration"] == 2
    whats = [r["release"] for r in ledger["bounds"]["releases"]]
    assert sum(w.startswith("rating range:") for w in whats) == 2
    assert any(w.startswith("second release of the item sums") for w in whats) is not factors_win
    acc = ledger["accounting"]
    assert acc["epsilon"] <= 1.0 and acc["epsilon"] == pytest.approx(1.0, abs=5e-3)

@pytest.mark.parametrize("method", ["als", "means"])
def test_private_run_publishes_the_selected_range_and_stays_on_target(stores, tmp_path, method):
    """On the outlier store (observed range [0, 9]) the model's range is the selected [1, 5]; the ledger lists the
    selection's two events, and its total (epsilon, delta) is the requested one, not more."""
    _, outlier, _ = stores
    out = tmp_path / method
    s = train(outlier, method=method, epsilon=1.0, delta=1e-5, out=str(out), evaluate_test=False)
    model, ledger = _model(out)
    assert model["rating_range"] == {"min": 1.0, "max": 5.0, "source": "selected"}
    pp = ledger["public_parameters"]["rating_range"]
    assert (pp["min"], pp["max"], pp["source"]) == (1.0, 5.0, "selected") and "partition selection" in pp["release"]
    rel = ledger["bounds"]["releases"]
    whats = [r["release"] for r in rel]
    assert sum(w.startswith("rating range:") for w in whats) == 2
    assert any(r.get("mechanism") == "threshold (partition selection)" and r["release"].startswith("rating range")
               for r in rel)
    assert not any("observed" in n for n in ledger["notes"])
    acc = ledger["accounting"]
    assert acc["epsilon"] <= 1.0 and acc["epsilon"] == pytest.approx(1.0, abs=5e-3)  # calibrated, no overshoot
    assert ledger["delta"] == 1e-5
    assert "selected privately" in s["rating_range"]


def test_declared_range_spends_nothing(stores, tmp_path):
    _, _, declared = stores
    view, cat = catalogue_and_range_for(get_method("als"), declared, epsilon=1.0, delta=1e-5, seed=0)
    assert cat.range is None and cat.spent() == [] and view.rating_range_source == "declared"
    assert range_for(declared, epsilon=1.0, delta=1e-5)[1] is None
    out = tmp_path / "m"
    train(declared, method="als", epsilon=1.0, delta=1e-5, out=str(out), seed=2, evaluate_test=False)
    model, ledger = _model(out)
    assert model["rating_range"] == {"min": 1.0, "max": 5.0, "source": "declared"}
    assert ledger["public_parameters"]["rating_range"]["source"] == "declared"
    assert not any(r["release"].startswith("rating range") for r in ledger["bounds"]["releases"])


def test_non_private_run_keeps_the_observed_range(stores, tmp_path):
    _, outlier, _ = stores
    assert range_for(outlier, epsilon=math.inf, delta=1e-5)[1] is None
    out = tmp_path / "np"
    train(outlier, method="means", epsilon=math.inf, out=str(out), evaluate_test=False)
    model, ledger = _model(out)
    assert model["rating_range"] == {"min": 0.0, "max": 9.0, "source": "observed"}
    assert not any(r["release"].startswith("rating range") for r in ledger["bounds"]["releases"])


def test_tune_selects_the_range_once_for_the_whole_run(stores, tmp_path):
    """tune: the range's two releases are in the run's prefix once (not once per candidate), the model publishes the
    selected range, and the whole ledger stays within epsilon."""
    from streamdp.workflows.tune import tune

    _, outlier, _ = stores
    out = tmp_path / "t"
    s = tune(outlier, epsilon=2.0, delta=1e-5, method="means", out=str(out), grid={"user_intercept": [False, True]},
             seed=3, evaluate_test=False)
    model, ledger = _model(out)
    assert model["rating_range"] == {"min": 1.0, "max": 5.0, "source": "selected"}
    whats = [r["release"] for r in ledger["bounds"]["releases"]]
    assert sum(w.startswith("tune: rating range:") for w in whats) == 2
    assert sum("rating range" in w for w in whats) == 2
    assert ledger["accounting"]["epsilon"] <= 2.0 and s["epsilon_spent"] <= 2.0


def test_lowrank_selects_the_range_and_counts_it_under_replace_one(stores, tmp_path):
    """``streamdp lowrank``: the range is selected (users and items stay exact under its relation), spent in its plan,
    and its replace-one epsilon counts the selection at sensitivity sqrt(2)."""
    from streamdp.workflows.training import lowrank

    _, outlier, _ = stores
    out = tmp_path / "lr"
    s = lowrank(outlier, rank=2, epsilon=2.0, delta=1e-5, out=str(out), seed=1)
    model, ledger = _model(out)
    assert model["rating_range"] == {"min": 1.0, "max": 5.0, "source": "selected"}
    assert sum(r["release"].startswith("rating range:") for r in ledger["bounds"]["releases"]) == 2
    assert ledger["accounting"]["epsilon"] <= 2.0 and s["epsilon_replace_one"] > 2.0


def test_train_prints_the_selected_range(stores, tmp_path, cli):
    _, outlier, _ = stores
    code, out, err, _ = cli.run("train", outlier.path, "--method", "means", "--epsilon", "1", "--delta", "1e-5",
                                "--out", tmp_path / "m")
    assert code == 0, err
    assert "rating range: [1, 5] selected privately" in out
    assert "observed" not in err  # no warning of an observed range


def test_a_rehearsal_knows_a_released_range_never_the_observed_one(tmp_path):
    """``generate --like``/``sweep --rehearse`` on a store without a declared range: refused until a private model
    released one, then that model's range (selected privately), not the store's observed [0, 9]."""
    from streamdp.workflows.rehearse import check_like, rehearsal_range

    st = streamdp.ingest(_frame(extra=OUTLIER), str(tmp_path / "s.zarr"), items=list(range(20)), test_fraction=0.2,
                         seed=1)
    with pytest.raises(ParameterError, match="a rehearsal needs the store's rating range"):
        check_like(st)
    train(st, method="means", epsilon=1.0, delta=1e-5, out=str(tmp_path / "m"), evaluate_test=False)
    assert rehearsal_range(st) == (1.0, 5.0)


@pytest.mark.parametrize("method", ["oja", "fw", "svd", "sgld", "ials", "irls"])
def test_every_private_method_trains_on_the_selected_range(stores, tmp_path, method):
    """Every method that scales its noise to the range: the selected one in model.json, its two releases in the
    ledger, the whole within epsilon, and no observed-range note."""
    _, outlier, _ = stores
    out = tmp_path / method
    train(outlier, method=method, epsilon=2.0, delta=1e-5, out=str(out), seed=1, evaluate_test=False)
    model, ledger = _model(out)
    assert model["rating_range"] == {"min": 1.0, "max": 5.0, "source": "selected"}
    assert sum(r["release"].startswith("rating range:") for r in ledger["bounds"]["releases"]) == 2
    assert 1.9 < ledger["accounting"]["epsilon"] <= 2.0
    assert not any("observed" in n for n in ledger["notes"])


def test_train_evaluates_on_the_store_as_evaluate_does(stores, tmp_path):
    """The evaluation after a run scores the store itself (its raw training ratings for the users' local solves),
    not the run's clipped view: the figures ``streamdp evaluate`` gives."""
    from streamdp.serving.evaluate import evaluate_model

    plain, outlier, _ = stores
    out = tmp_path / "m"
    s = train(outlier, method="als", epsilon=1.0, delta=1e-5, out=str(out), seed=4, ranking_users="all")
    ev = evaluate_model(str(out), outlier.path, ranking_users="all")
    assert s["test_rmse"] == ev["rmse"] and s["test_ratings"] == ev["n_ratings"]
