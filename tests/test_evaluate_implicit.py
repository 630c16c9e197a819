"""``evaluate`` and ``train``'s summary on an implicit store: ranking metrics only (issue 29, item 2)."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

import streamdp
from streamdp.cli import format_train_summary, main
from streamdp.methods import get_method
from streamdp.serving.evaluate import evaluate_model, format_evaluation
from streamdp.serving.ranking import IMPLICIT_RELEVANT
from streamdp.storage.generate import generate_store
from streamdp.storage.ingest import ingest
from streamdp.workflows.training import train

N_ITEMS = 40


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """A rating store and an interaction log over the same items (ids 0..39), and a model of the ratings."""
    d = tmp_path_factory.mktemp("ev_implicit")
    rated = generate_store(str(d / "r.zarr"), n_users=400, n_items=N_ITEMS, ratings_per_user=8, seed=3,
                           test_fraction=0.2)
    model = streamdp.train(rated, method="means", epsilon=float("inf"), allow_nonprivate=True,
                           out=str(d / "m"), seed=0, evaluate=False)
    rng = np.random.default_rng(0)
    items = np.concatenate([np.arange(N_ITEMS), np.minimum(rng.zipf(1.6, 3000) - 1, N_ITEMS - 1)])
    users = np.concatenate([np.arange(N_ITEMS) % 200, rng.integers(0, 200, 3000)])
    p = d / "log.csv"
    p.write_text("user,item\n" + "".join(f"{u},{i}\n" for u, i in zip(users, items)))
    log = ingest([str(p)], str(d / "log.zarr"), test_fraction=0.25, seed=1, notes=False)
    return model, log


def test_evaluate_reports_ranking_only_with_held_out_interactions_relevant(stores):
    model, log = stores
    ev = evaluate_model(model.path, log, allow_other_store=True)
    assert ev["implicit"] and "rmse" not in ev and "baselines" not in ev and "verdict" not in ev
    assert ev["n_interactions"] == log.n_test
    r = ev["ranking"]
    assert r["relevant_threshold"] == 0.0 and r["threshold_source"] == IMPLICIT_RELEVANT
    # every user with a held-out interaction is evaluated (each is relevant, whatever its count)
    with_test = sum(int((np.diff(b.indptr) > 0).sum()) for b in log.blocks("test"))
    assert r["n_users"] == with_test
    assert r["baselines"]["popularity"]["guarantee"] == "non-private" and 0 < r["baselines"]["popularity"]["recall"]
    text = format_evaluation(ev)
    assert "RMSE" not in text and "ranking metrics only" in text and "held-out interaction" in text
    code = CliRunner().invoke(main, ["evaluate", model.path, log.path, "--allow-other-store"])
    assert code.exit_code == 0 and "RMSE" not in code.stdout and "most popular (non-private)" in code.stdout


def test_an_implicit_store_is_evaluated_in_one_pass_with_the_numbers_of_two(stores, tmp_path, monkeypatch):
    """The chart's exact counts come from the log's recorded training statistics; a log ingested before they were
    recorded takes a pass of its own for them and gives the same ranking, to the bit."""
    from tests.test_evaluate_passes import passes, without_item_stats

    model, log = stores
    old = without_item_stats(log.path, str(tmp_path / "old.zarr"))
    seen = passes(monkeypatch)
    one = evaluate_model(model.path, log, allow_other_store=True, ranking_users="all")
    assert seen == ["evaluate"] and one.pop("item_statistics") == "recorded"
    two = evaluate_model(model.path, old, allow_other_store=True, ranking_users="all")
    assert seen[1:] == ["evaluate: baselines", "evaluate"] and two.pop("item_statistics") == "pass"
    assert one == two


def test_train_summary_on_an_implicit_store(stores, tmp_path):
    """A method that accepts implicit stores (here a test double) gets ranking metrics in train's summary."""
    _, log = stores

    class Accepting(get_method("means")):
        ACCEPTS_IMPLICIT = True

    s = train(log, method=Accepting, out=str(tmp_path / "m"), epsilon=float("inf"), seed=0)
    assert "test_rmse" not in s and "verdict" not in s and s["test_interactions"] == log.n_test
    assert s["ranking"]["threshold_source"] == IMPLICIT_RELEVANT
    text = format_train_summary(s)
    assert "RMSE" not in text and "every held-out interaction" in text


def test_an_observed_count_range_is_not_published(stores, tmp_path):
    """The log's observed maximum count is an exact statistic: the ledger's public parameters leave it out (and
    ``release`` does not add it to model.json; a method's own ``model_info`` is the method's to keep clean)."""
    import json

    _, log = stores
    assert log.rating_range_source == "observed"

    class Accepting(get_method("means")):
        ACCEPTS_IMPLICIT = True

    train(log, method=Accepting, out=str(tmp_path / "m"), epsilon=float("inf"), seed=0, evaluate_test=False)
    pub = json.loads((tmp_path / "m" / "privacy.json").read_text())["public_parameters"]
    assert "rating_range" not in pub and pub["data"]["implicit"] is True and pub["data"]["count_cap"] is None
