"""``streamdp tune``: private choice of a configuration, one ledger within epsilon, charged to the budget.

The runs that train (several private fits each) are marked slow; grid parsing and its errors are not.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from streamdp.cli import main
from streamdp.errors import ParameterError
from streamdp.errors import BudgetExceededError
from streamdp.methods import get_method
from streamdp.privacy import compose, epsilon_of, gaussian_event
from streamdp.privacy.budget import StoreBudget
from streamdp.privacy.ledger import Ledger
from streamdp.workflows.training import train
from streamdp.workflows.tune import SAMPLE_RATE, _configs, _leaner, _Sampled, gaussian_equivalent, parse_grid, sampled_users, tune

#: Users' own rating levels differ by N(0, 1) here: the users' intercepts (``user_intercept``) are clearly
#: better than the item means alone, so ``means``' default (no intercept) is the obviously bad candidate.
BIASED = dict(n_users=3000, n_items=80, ratings_per_user=10, rank=2, seed=5, test_fraction=0.2,
              user_bias_std=1.0, show_progress=False)
GRID = {"user_intercept": [False, True]}


def _store(path, **kw):
    from streamdp.storage.generate import generate_store

    return generate_store(str(path), **kw)


@pytest.fixture(scope="module")
def biased(tmp_path_factory):
    d = tmp_path_factory.mktemp("tune")
    st = _store(d / "s.zarr", **BIASED)
    summary = tune(st, epsilon=2.0, method="means", out=str(d / "m"), grid=GRID, seed=1)
    return st, d, summary


@pytest.mark.slow
def test_ledger_is_what_the_budget_charged_and_within_epsilon(biased):
    st, d, summary = biased
    led = Ledger.read(d / "m")
    total = epsilon_of(led.event(), led.delta).epsilon
    assert total <= 2.0
    assert total == pytest.approx(summary["epsilon_spent"], rel=1e-9)
    assert total > 1.95  # the final release was calibrated to use what the rest left
    # the candidates are cheap: the released model keeps more than 97% of the epsilon (0.89 before sampling)
    assert summary["tuning"]["final_epsilon"] > 0.97 * 2.0
    whats = [e["release"] for e in led.bounds["releases"]]
    # one subsampled Gaussian event per candidate (its releases composed), the losses, the released model's
    cands = [i for i, w in enumerate(whats) if w.startswith("tune candidate ")]
    assert [whats[i][:len("tune candidate 1")] for i in cands] == ["tune candidate 1", "tune candidate 2"]
    for i in cands:
        ev = led.events[i]
        assert ev["name"] == "PoissonSampledDpEvent" and ev["sampling_probability"] == SAMPLE_RATE
        assert ev["event"]["name"] == "GaussianDpEvent"
        assert len(led.bounds["releases"][i]["releases"]) >= 2  # the candidate's own releases, listed
    assert sum(w.startswith("tune: validation losses of the 2 candidate") for w in whats) == 1
    final = [i for i, w in enumerate(whats) if w.startswith("released model: ")]
    assert final and final == list(range(final[0], len(whats)))
    # the ledger composes (and the budget reserved, before the candidates ran) the same events: the prefix, and
    # the released model as the one Gaussian that dominates its releases (the adaptive choice's envelope)
    shown = StoreBudget(st.path).show()
    assert [e["status"] for e in shown["entries"]] == ["complete"]
    assert shown["entries"][0]["events"] == led.events and len(led.events) == final[0] + 1
    z_env = led.events[-1]["noise_multiplier"]
    released = [gaussian_event(e["noise_multiplier"], e["count"]) for e in led.bounds["releases"][final[0]:]]
    assert gaussian_equivalent(compose(released)) >= z_env
    # the store composes its releases on its own PLD grid (never coarser: streamdp/privacy/spend.py, ledger_grid),
    # so its figure may be a hair tighter than the model's own (grids of GRID_REL = 1e-3 of the answer: about 1e-5)
    assert shown["spent"]["epsilon"] == pytest.approx(total, rel=2e-5) and shown["spent"]["epsilon"] <= total
    assert any("envelope" in n for n in led.notes)


@pytest.mark.slow
def test_picks_the_clearly_better_configuration(biased):
    _, d, summary = biased
    t = summary["tuning"]
    assert t["default"] == {"user_intercept": False}
    assert t["chosen"] == {"user_intercept": True}
    losses = {c["config"]["user_intercept"]: c["noisy_loss"] for c in t["candidates"]}
    # fixed seed; the gap is many times the margin of 3 noise stds (stated tolerance of the choice)
    assert losses[False] - losses[True] > 10 * t["selection_noise_std"]
    info = json.loads((d / "m" / "model.json").read_text())
    assert info["local_user_bias"] is True and info["tuning"]["chosen"] == {"user_intercept": True}


@pytest.mark.slow
def test_tuned_is_not_worse_than_the_default_at_the_same_epsilon(biased, tmp_path):
    """On the biased store the tuned model beats the default; on an unbiased one it is within 0.01 RMSE of it
    (the default is then the right configuration and the tuned one is it, at 0.98 of the epsilon)."""
    st, d, summary = biased
    dflt = train(st, method="means", out=str(tmp_path / "d"), epsilon=2.0, delta=summary["delta"], seed=1)
    assert summary["test_rmse"] < dflt["test_rmse"] - 0.05
    flat = _store(tmp_path / "flat.zarr", **{**BIASED, "user_bias_std": 0.0})
    t = tune(flat, epsilon=2.0, method="means", out=str(tmp_path / "t2"), grid=GRID, seed=2)
    d2 = train(flat, method="means", out=str(tmp_path / "d2"), epsilon=2.0, delta=t["delta"], seed=2)
    assert t["epsilon_spent"] <= 2.0
    assert t["test_rmse"] <= d2["test_rmse"] + 0.01


@pytest.mark.slow
def test_too_few_users_trains_the_default_at_the_whole_epsilon(tmp_path):
    st = _store(tmp_path / "s.zarr", **{**BIASED, "n_users": 300})
    s = tune(st, epsilon=1.0, method="means", out=str(tmp_path / "m"), grid=GRID, seed=0)
    assert s["tuning"]["skipped"] and s["tuning"]["chosen"] == {"user_intercept": False}
    led = Ledger.read(tmp_path / "m")
    assert not any(e["release"].startswith("tune") for e in led.bounds["releases"])
    assert 0.99 < s["epsilon_spent"] <= 1.0


def test_parse_grid_and_configs():
    als = get_method("als")
    g = parse_grid(["rank=4,8", "iters=0,5"], als)
    assert g == {"rank": [4, 8], "iters": [0, 5]}
    assert _configs(g, als) == [{"iters": 0}, {"iters": 5, "rank": 4}, {"iters": 5, "rank": 8}]
    assert parse_grid(["user-intercept=false,true"], get_method("means")) == {"user_intercept": [False, True]}


@pytest.mark.parametrize("spec, words", [
    ("rank", "expected KEY=V1,V2"),
    ("rnak=4,8", "'rnak' is not an option of --method als"),
    ("rank=4,x", "'x': --rank must be a positive integer"),
    ("rank=0", "--rank must be a positive integer"),
    ("iters=-1", "--iters must be >= 0"),
    ("rank=4,4", "'4' is given twice"),
    ("mechanism=laplace", "mechanism cannot be tuned"),
    ("select=off", "select cannot be tuned"),
])
def test_bad_grid_is_a_one_line_error(tmp_path, spec, words):
    with pytest.raises(ParameterError, match="--grid"):
        parse_grid([spec], get_method("als"))
    st = _store(tmp_path / "s.zarr", n_users=200, n_items=20, ratings_per_user=5, rank=2, seed=0,
                show_progress=False)
    r = CliRunner().invoke(main, ["tune", str(st.path), "--epsilon", "1", "--out", str(tmp_path / "m"),
                                  "--grid", spec])
    assert r.exit_code != 0
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("streamdp: error: --grid") and words in lines[0], r.output
    assert "Traceback" not in r.output
    assert not os.path.exists(tmp_path / "m")
    assert StoreBudget(st.path).show()["entries"] == []


def test_unsupported_method_names_the_supported_ones(tmp_path):
    st = _store(tmp_path / "s.zarr", n_users=200, n_items=20, ratings_per_user=5, rank=2, seed=0,
                show_progress=False)
    r = CliRunner().invoke(main, ["tune", str(st.path), "--epsilon", "1", "--method", "oja", "--out",
                                  str(tmp_path / "m")])
    assert r.exit_code != 0
    assert r.output.strip() == ("streamdp: error: --method oja: tune supports als, ials, irls, means (their releases are "
                                "Gaussian and planned in full)")


@pytest.mark.slow
def test_cli_prints_every_candidate_and_the_total(biased, tmp_path):
    st, _, _ = biased
    r = CliRunner().invoke(main, ["tune", str(st.path), "--epsilon", "2", "--method", "means", "--grid",
                                  "user_intercept=false,true", "--seed", "3", "--out", str(tmp_path / "m"), "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert len(s["tuning"]["candidates"]) == 2 and all("noisy_loss" in c for c in s["tuning"]["candidates"])
    assert s["tuning"]["chosen"] == {"user_intercept": True} and s["epsilon_spent"] <= 2.0


@pytest.mark.slow
def test_als_without_iters_releases_one_histogram_for_every_configuration(biased, tmp_path):
    """Without ``iters`` an als plan releases a histogram read from the data while planning: every candidate
    (and every calibration attempt of the released model) would draw its own. tune releases one and pins
    every configuration's iterations from it. ``rank=auto`` (the default rank) is pinned as the default's."""
    st, _, _ = biased
    s = tune(st, epsilon=2.0, method="als", out=str(tmp_path / "m"), grid=["rank=auto,4"], seed=0)
    t = s["tuning"]
    assert not t["skipped"] and all("iters" in c["config"] for c in t["candidates"])
    assert t["default"]["rank"] is None and {c["config"].get("rank") for c in t["candidates"]} <= {None, 4}
    led = Ledger.read(tmp_path / "m")
    from streamdp.methods._profile import WHAT

    assert sum(WHAT in e["release"] for e in led.bounds["releases"]) == 1  # (the global mean's name says histogram)
    assert s["epsilon_spent"] <= 2.0
    assert "user_profile" in json.loads((tmp_path / "m" / "model.json").read_text())


def test_leaner_candidates_never_replace_the_default():
    """At the candidates' fraction of epsilon leaner models score better than they will when released."""
    d = {"rank": 8, "iters": 7}
    assert _leaner({"rank": 4, "iters": 7}, d) and _leaner({"iters": 0}, d) and _leaner({"rank": 8, "iters": 3}, d)
    assert not _leaner({"rank": 16, "iters": 7}, d) and not _leaner({"rank": 8, "iters": 9}, d)
    assert not _leaner({"user_intercept": True}, {"user_intercept": False})


def test_a_budget_that_cannot_take_epsilon_is_refused_before_any_pass(tmp_path, monkeypatch):
    """Not even als' histogram of ratings per user (a pass over the ratings, before the candidates) is computed."""
    from streamdp.methods import _profile, als

    st = _store(tmp_path / "s.zarr", **{**BIASED, "n_users": 600})
    StoreBudget(st.path).set(1.0, 1e-5)
    passes = []
    monkeypatch.setattr(als._AlsBase, "fit", lambda self, *a, **k: passes.append("fit"))
    monkeypatch.setattr(_profile, "user_profile", lambda *a, **k: passes.append("histogram"))
    monkeypatch.setattr(als, "user_profile", lambda *a, **k: passes.append("histogram"))
    tune_module = sys.modules["streamdp.workflows.tune"]  # the attribute streamdp.tune is the API function
    monkeypatch.setattr(tune_module, "user_profile", lambda *a, **k: passes.append("histogram"))
    monkeypatch.setattr(tune_module, "_losses", lambda *a, **k: passes.append("losses"))
    with pytest.raises(BudgetExceededError, match="past its budget epsilon=1"):
        tune(st, epsilon=2.0, method="als", out=str(tmp_path / "m"), seed=0)
    assert passes == [] and not os.path.exists(tmp_path / "m")
    assert StoreBudget(st.path).show()["entries"] == []


@pytest.mark.slow
def test_the_whole_epsilon_is_reserved_before_the_candidates_and_failed_when_they_fail(tmp_path, monkeypatch):
    """A concurrent release cannot take the budget while the candidates run; a failure frees it (nothing left)."""
    from streamdp.methods import als

    st = _store(tmp_path / "s.zarr", **BIASED)
    seen = []

    def fit(self, store, engine):
        seen.append((isinstance(store, _Sampled), [(e["status"], e["epsilon"])
                                                    for e in StoreBudget(st.path).show()["entries"]]))
        raise RuntimeError("disk full")

    monkeypatch.setattr(als._AlsBase, "fit", fit)
    with pytest.raises(RuntimeError, match="disk full"):
        tune(st, epsilon=2.0, method="means", out=str(tmp_path / "m"), grid=GRID, seed=0)
    assert seen == [(True, [("reserved", 2.0)])]
    entries = StoreBudget(st.path).show()["entries"]
    assert [e["status"] for e in entries] == ["failed"] and "disk full" in entries[0]["reason"]
    assert not os.path.exists(tmp_path / "m")


def test_the_candidates_see_a_poisson_sample_of_the_held_out_view(tmp_path):
    st = _store(tmp_path / "s.zarr", n_users=4000, n_items=40, ratings_per_user=6, rank=2, seed=3, test_fraction=0.2,
                show_progress=False)
    keep = sampled_users(0, 20000, key=11, q=0.2)
    assert abs(keep.mean() - 0.2) < 0.015  # Poisson: each user independently with probability q
    assert np.array_equal(keep[5000:6000], sampled_users(5000, 1000, key=11, q=0.2))  # a user's draw, not a block's
    assert not np.array_equal(keep, sampled_users(0, 20000, key=12, q=0.2))  # keyed by the run's secret
    view = _Sampled(st, key=11, q=0.2, n_users=4100)  # the run's released (noisy) count, not the store's
    assert view.expected_users == pytest.approx(0.2 * 4100)
    from streamdp.methods._selection import holdout

    kept = 0
    for b in range(st.n_blocks):
        full, blk = st.read_block(b), view.read_block(b)
        (ip, it, r), _ = holdout(full.indptr, full.items, full.ratings, full.first_user, 11)
        inside = sampled_users(full.first_user, full.n_users, 11, 0.2)
        n = np.diff(blk.indptr)
        assert np.all(n[~inside] == 0) and np.array_equal(n[inside], np.diff(ip)[inside])
        for u in np.flatnonzero(inside):
            assert np.array_equal(blk.items[blk.indptr[u]:blk.indptr[u + 1]], it[ip[u]:ip[u + 1]])
        kept += int(inside.sum())
        assert view.read_block(b, "test").nnz == st.read_block(b, "test").nnz  # the test split is untouched
    assert 0.15 * 4000 < kept < 0.25 * 4000


def test_above_the_validation_sample_the_candidates_hold_out_only_the_sampled_users_ratings(tmp_path, monkeypatch):
    """On a store of more users than the validation sample (set to 1,000 here), the candidates' view holds out the
    ratings of the validating users only, as ``--select auto`` does, and whether tune can tell configurations apart
    is judged on those: its message counts the 1,000 expected to validate, not the store's 4,000."""
    import streamdp.methods._selection as sel
    from streamdp.methods._selection import _sampled, holdout

    st = _store(tmp_path / "s.zarr", n_users=4000, n_items=40, ratings_per_user=6, rank=2, seed=3, test_fraction=0.2,
                show_progress=False)
    view = _Sampled(st, key=11, q=0.2, n_users=4000, rate=0.25)
    for b in range(st.n_blocks):
        full, blk = st.read_block(b), view.read_block(b)
        (ip, _, _), _ = holdout(full.indptr, full.items, full.ratings, full.first_user, 11, rate=0.25)
        inside = sampled_users(full.first_user, full.n_users, 11, 0.2)
        validating = _sampled(full.n_users, full.first_user, 11, 0.25)
        n = np.diff(blk.indptr)
        assert np.array_equal(n[inside], np.diff(ip)[inside])
        both = inside & ~validating
        assert np.array_equal(n[both], np.diff(full.indptr)[both])  # sampled, not validating: every rating
    monkeypatch.setattr(sel, "VALIDATION_USERS", 1000)
    s = tune(st, epsilon=1.0, method="means", out=str(tmp_path / "m"), grid=GRID, seed=1)
    assert s["tuning"]["skipped"] and "over 1,000 users" in s["tuning"]["skipped"]


def test_a_composition_of_gaussians_is_the_gaussian_it_is_subsampled():
    ev = compose([gaussian_event(2.0), gaussian_event(3.0, 4), compose([gaussian_event(5.0)])])
    z = gaussian_equivalent(ev)
    assert z == pytest.approx((1 / 4 + 4 / 9 + 1 / 25) ** -0.5)
    assert epsilon_of(ev, 1e-6).epsilon == pytest.approx(epsilon_of(gaussian_event(z), 1e-6).epsilon, rel=1e-3)
    with pytest.raises(ParameterError, match="not Gaussian"):
        from streamdp.privacy.events import huber_event

        gaussian_equivalent(compose([gaussian_event(1.0), huber_event(0.5)]))
