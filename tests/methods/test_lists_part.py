"""``train --lists``: an ``ials`` lists part trained in the same release as the rating model (issue 42, part 5)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

from streamdp.cli import main
from streamdp.errors import ParameterError
from streamdp.methods import get_method
from streamdp.methods._lists import LISTS_MIN_USERS, LISTS_SHARE, LISTS_SHARE_BIASES, lists_part_for
from streamdp.privacy.users import COUNT_SHARE
from streamdp.serving.local import list_model
from streamdp.serving.model import load_model
from streamdp.workflows.training import train

RUN = dict(epsilon=1.0, delta=1e-6, seed=1, workers=1, evaluate_test=False)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Tastes in which items a user rates (clusters), so that ials' factors beat its chart at a large epsilon."""
    from streamdp.storage.generate import generate_store

    p = tmp_path_factory.mktemp("lists") / "s.zarr"
    return generate_store(str(p), n_users=2000, n_items=120, ratings_per_user=12, rank=2, seed=5,
                          test_fraction=0.2, taste_clusters=6, taste_strength=4.0, show_progress=False)


@pytest.fixture(scope="module")
def strong(store, tmp_path_factory):
    """A release whose lists are its ials part's (epsilon 18 of 30: the part's factors win its choice)."""
    out = tmp_path_factory.mktemp("strong") / "m"
    train(store.path, method="als", out=str(out), lists="ials", lists_share=0.6, **{**RUN, "epsilon": 30.0})
    return load_model(str(out))


def _composed_epsilon(path) -> float:
    """The ledger's events recomposed by dp-accounting's PLD accountant at its delta."""
    from streamdp.privacy import compose, epsilon_of, event_from_dict
    from streamdp.privacy.ledger import Ledger

    led = Ledger.read(str(path))
    events = [event_from_dict(e) if isinstance(e, dict) else e for e in led.events]
    return epsilon_of(compose(events), led.delta).epsilon


def test_the_ledger_composes_both_parts_to_the_target(store, tmp_path):
    out = tmp_path / "m"
    s = train(store.path, method="als", out=str(out), lists="ials", **RUN)
    m = load_model(str(out))
    p = json.loads((out / "privacy.json").read_text())
    whats = [e["release"] for e in p["bounds"]["releases"]]
    assert whats[0].startswith("number of users") and sum(w.startswith("number of users") for w in whats) == 1
    assert any(w.startswith("item counts N_j") for w in whats)  # the ials part's
    assert any(w.startswith("item sums of user-centred residuals") for w in whats)  # the als part's
    eps = _composed_epsilon(out)
    assert 0.98 <= eps <= 1.0 + 1e-9, eps  # calibrated to the target, never above it
    assert p["bounds"]["lists"]["method"] == "ials" and "tau" in p["bounds"]["lists"]
    lists = m.info["lists"]
    assert lists["share"] in (LISTS_SHARE, LISTS_SHARE_BIASES)
    # the count's epsilon (pure) plus the share of what it leaves
    assert lists["epsilon"] == pytest.approx(COUNT_SHARE + lists["share"] * (1 - COUNT_SHARE))
    assert s["lists_part"]["used"] == lists["used"]


def test_a_given_share_is_the_parts_epsilon(store, tmp_path):
    out = tmp_path / "m"
    train(store.path, method="als", out=str(out), lists="ials", lists_share=0.3, **RUN)
    assert load_model(str(out)).info["lists"]["epsilon"] == pytest.approx(COUNT_SHARE + 0.3 * (1 - COUNT_SHARE))
    assert _composed_epsilon(out) <= 1.0 + 1e-9


def test_used_lists_rank_alike_in_every_path(store, strong):
    lists = strong.info["lists"]
    assert lists["used"] and "kept its factors" in lists["why"]
    lm = list_model(strong)
    assert lm is not strong and lm.info["method"] == "ials"
    users = list(store.user_ids(0, 40))
    batch = strong.recommend_all(store.path, 10, users=users, as_arrays=True)
    for i, u in enumerate(users):
        one = strong.recommend_user(store.path, u, 10)
        assert [x[0] for x in one] == [int(x) for x in batch.item_ids[i][:len(one)]]
        np.testing.assert_allclose([x[1] for x in one], batch.scores[i][:len(one)], rtol=1e-5)
        # ranked by the ials part, scored by the rating model's prediction (within the rating range)
        assert all(store.rating_min <= x[1] <= store.rating_max for x in one)


def test_evaluate_ranks_by_the_part_as_it_would_alone(store, strong):
    from streamdp.serving.evaluate import evaluate_model

    ev = evaluate_model(strong, store, workers=1, baselines=False, ranking_users="all")
    alone = evaluate_model(list_model(strong), store, workers=1, baselines=False, ranking_users="all",
                           allow_other_store=True)
    assert ev["ranking"]["recall"] == pytest.approx(alone["ranking"]["recall"], abs=1e-12)
    assert ev["ranking"]["recall"] > ev["ranking"]["baselines"]["popularity"]["recall"]
    assert ev["ranking"]["lists_part"]["method"] == "ials" and ev["ranking"]["personalised"]
    assert "rmse" in ev  # the rating model's predictions


def test_lists_own_is_the_rating_model_alone(store, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    train(store.path, method="als", out=str(a), lists="own", **RUN)
    train(store.path, method="als", out=str(b), **RUN)  # auto with a named method: own
    ma, mb = load_model(str(a)), load_model(str(b))
    assert "lists" not in ma.info and "lists" not in mb.info
    np.testing.assert_array_equal(ma.item_bias, mb.item_bias)
    assert not any(k.startswith("lists_") for k in ma.extras)


def test_a_part_that_keeps_its_chart_is_not_listed_by(store, tmp_path):
    out = tmp_path / "m"
    train(store.path, method="als", out=str(out), lists="ials", lists_share=0.05, **RUN)
    m = load_model(str(out))
    assert not m.info["lists"]["used"] and "kept its chart" in m.info["lists"]["why"]
    assert list_model(m) is m and not any(k.startswith("lists_") for k in m.extras)


def test_a_share_too_small_for_the_part_is_one_line(store, tmp_path):
    with pytest.raises(ParameterError, match=r"--lists-share 1e-06: the ials part's epsilon 0.01 does not pay"):
        train(store.path, method="als", out=str(tmp_path / "m"), lists="ials", lists_share=1e-6, **RUN)
    assert not (tmp_path / "m").exists()


def _users(n):
    return SimpleNamespace(n=n)


@pytest.mark.parametrize("kw, expected", [
    (dict(lists="auto", defaulted=True), True),
    (dict(lists="auto", defaulted=False), False),  # a named --method
    (dict(lists="auto", defaulted=True, epsilon=math.inf), False),  # non-private
    (dict(lists="auto", defaulted=True, n=LISTS_MIN_USERS - 1), False),  # too few users (released count)
    (dict(lists="auto", defaulted=True, implicit=True), False),  # an interaction log
    (dict(lists="auto", defaulted=True, checkpoint="ck"), False),
    (dict(lists="own", defaulted=True), False),
    (dict(lists="ials", defaulted=False, n=10), True),
])
def test_when_auto_trains_a_part(kw, expected):
    st = SimpleNamespace(implicit=kw.pop("implicit", False), n_items=50, path="s.zarr")
    part = lists_part_for(get_method("als"), st, share=None, delta=1e-6, seed=1, catalogue=None,
                          users=_users(kw.pop("n", LISTS_MIN_USERS)), epsilon=kw.pop("epsilon", 1.0), **kw)
    assert (part is not None) == expected


@pytest.mark.parametrize("method, kw, words", [
    ("means", {}, "takes no lists part"),
    ("als", {"implicit": True}, "interaction log"),
    ("als", {"checkpoint": "ck"}, "no --checkpoint"),
    ("als", {"share": 1.0}, "--lists-share must be in (0, 1)"),
    ("als", {"share": "x"}, "--lists-share must be a number"),
    ("als", {"lists": "maybe"}, "--lists must be one of"),
])
def test_refusals_name_the_option(method, kw, words):
    st = SimpleNamespace(implicit=kw.pop("implicit", False), n_items=50, path="s.zarr")
    args = dict(lists="ials", share=None, epsilon=1.0, delta=1e-6, seed=1, users=_users(9000), catalogue=None,
                defaulted=False)
    with pytest.raises(ParameterError, match=words.replace("(", r"\(").replace(")", r"\)")):
        lists_part_for(get_method(method), st, **{**args, **kw})


def test_cli_says_where_the_lists_come_from(store, tmp_path):
    out = tmp_path / "m"
    r = CliRunner().invoke(main, ["train", store.path, "--method", "als", "--lists", "ials", "--lists-share", "0.6",
                                  "--epsilon", "30", "--seed", "1", "--workers", "1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "lists: from the ials part trained in the same release" in r.output, r.output
    r = CliRunner().invoke(main, ["train", store.path, "--method", "means", "--lists", "ials", "--epsilon", "1",
                                  "--out", str(tmp_path / "n")])
    assert r.exit_code != 0 and "takes no lists part" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "n").exists()


def test_a_biases_only_model_lists_and_finds_similar_items_by_the_part(store, tmp_path):
    out = tmp_path / "m"
    s = train(store.path, method="als", out=str(out), lists="ials", lists_share=0.6, iters=0,
              **{**RUN, "epsilon": 30.0})
    m = load_model(str(out))
    assert not m.info["factors_released"] and m.info["lists"]["used"]
    assert m.summary["personalised"] and "ials part" in m.summary["lists"]
    sims = m.similar_items(m.item_ids[0], 3)
    assert len(sims) == 3 and sims == list_model(m).similar_items(m.item_ids[0], 3)
    assert s["lists_part"]["share"] == 0.6


def test_a_private_catalogue_and_range_are_spent_once_and_the_part_gets_its_share_of_the_rest(tmp_path):
    """Items and rating range selected privately (spent first, shared by both parts): the part's target is their
    epsilon plus its share of what they leave, so it pays for its releases (a share of epsilon did not)."""
    import pandas as pd

    import streamdp

    rng = np.random.default_rng(2)
    users = np.repeat(np.arange(4000), 6)
    df = pd.DataFrame({"user": users, "item": rng.integers(0, 25, len(users)),
                       "rating": rng.integers(1, 6, len(users)).astype(float)}).drop_duplicates(["user", "item"])
    st = streamdp.ingest(df, str(tmp_path / "s.zarr"), test_fraction=0.2)
    out = tmp_path / "m"
    train(st.path, method="als", out=str(out), lists="ials", **RUN)
    p = json.loads((out / "privacy.json").read_text())
    whats = [e["release"] for e in p["bounds"]["releases"]]
    for first in ("number of users", "item catalogue: each item", "rating range: each rating value"):
        assert sum(w.startswith(first) for w in whats) == 1, first
    lists = load_model(str(out)).info["lists"]
    assert lists["epsilon"] > LISTS_SHARE + 0.05  # the selections' epsilon, then its share of the rest
    assert _composed_epsilon(out) <= 1.0 + 1e-9


def test_a_warm_start_warms_the_part_from_the_earlier_models_part(store, strong, tmp_path):
    """``--warm-start MODEL`` where MODEL lists by its part: this run's part starts from it, at its rank, with a
    quarter of the iterations and its released choice reused; the ledger still composes to the target."""
    out = tmp_path / "w"
    s = train(store.path, method="als", out=str(out), lists="ials", lists_share=0.6, warm_start=strong.path,
              **{**RUN, "epsilon": 30.0, "seed": 2})
    lists = load_model(str(out)).info["lists"]
    assert lists["warm_started"] and s["lists_part"]["warm_started"]
    part = lists["model"]
    assert part["warm_start"]["method"] == "ials" and part["selection"]["reused_from"] == strong.path
    assert part["rank"] == strong.info["lists"]["model"]["rank"]
    assert part["iterations_run"] < strong.info["lists"]["model"]["iterations_run"]
    assert _composed_epsilon(out) <= 30.0 + 1e-9


def test_a_cold_part_when_the_earlier_model_did_not_list_by_one(store, tmp_path):
    first, out = tmp_path / "a", tmp_path / "b"
    train(store.path, method="als", out=str(first), lists="own", **RUN)
    train(store.path, method="als", out=str(out), lists="ials", warm_start=str(first), **RUN)
    assert not load_model(str(out)).info["lists"]["warm_started"]
