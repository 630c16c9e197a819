"""``ials`` on interaction logs (issue 42, part 3): a private run's confidence cap follows ``--alpha``
(:func:`streamdp.methods.ials.private_max_confidence`), so that a log's lists at epsilon 1 are personalised."""

from __future__ import annotations

import math

import numpy as np
import pytest

from streamdp.methods import get_method
from tests.methods.test_als import _fit as _fit_method


def _fit(store, **kw):
    return _fit_method(store, method="ials", **kw)


def _rhs(f) -> dict:
    (e,) = [e for e in f.ledger.bounds["releases"] if e["release"].startswith("item right")]
    return e


def test_a_private_run_on_a_log_caps_confidence_at_one_plus_alpha(small_store, monkeypatch):
    """The cap is what the right-hand sides are noised for: ``1 + alpha`` (4) as on a rating store, not 21, where a
    pair of count 1 has confidence 3.08; the released model's local solve caps alike. ``--max-confidence`` given is
    kept; a non-private run (no noise) keeps 21; a large ``--alpha`` is capped at 21."""
    monkeypatch.setattr(small_store, "implicit", True, raising=False)
    m, f = _fit(small_store, epsilon=2.0, iters=1, tau=32)
    assert m.plan(small_store).settings.conf_cap == 4.0
    assert f.model_info["local_implicit"]["max_confidence"] == 4.0
    assert f.model_info["parameters"]["max_confidence"] == 4.0
    assert _rhs(f)["sensitivity"] == pytest.approx(4.0 * 0.4 * math.sqrt(32))
    ials = get_method("ials")
    assert ials(epsilon=2.0, delta=1e-6, rank=3, alpha=1.5).plan(small_store).settings.conf_cap == 2.5
    assert ials(epsilon=2.0, delta=1e-6, rank=3, alpha=40.0).plan(small_store).settings.conf_cap == 21.0
    assert ials(epsilon=2.0, delta=1e-6, rank=3, max_confidence=21.0).plan(small_store).settings.conf_cap == 21.0
    assert ials(epsilon=math.inf, delta=1e-6, rank=3).plan(small_store).settings.conf_cap == 21.0
    monkeypatch.setattr(small_store, "implicit", False, raising=False)  # ratings: 1 + alpha, as before
    assert ials(epsilon=2.0, delta=1e-6, rank=3).plan(small_store).settings.conf_cap == 4.0


def _log_store(tmp_path):
    """The issue's 6,040 x 3,706 movie shape as an interaction log: a generated rating store (20 taste clusters,
    ~165 ratings per user, 20% test) whose train and test pairs are written as ``user,item`` CSVs and ingested with
    ``--columns user,item`` (every count 1; exact chart Recall@10 0.068, the real log's 0.067)."""
    from streamdp.storage.store import open_store
    from tests.conftest import Cli

    ratings, log = tmp_path / "ratings.zarr", tmp_path / "log.zarr"
    res = Cli.run("generate", "--users", 6040, "--items", 3706, "--ratings-per-user", 165, "--item-exponent", 0.9,
                  "--taste-clusters", 20, "--taste-strength", 2, "--test-fraction", 0.2, "--seed", 1,
                  "--out", str(ratings))
    assert res[0] == 0, res
    st = open_store(str(ratings))
    uids, iids = st.user_ids(), st.item_ids()
    for split in ("train", "test"):
        with open(tmp_path / f"{split}.csv", "w") as fh:
            fh.write("user,item\n")
            for b in st.blocks(split):
                n = np.diff(b.indptr)
                u = np.repeat(np.arange(b.first_user, b.first_user + len(n)), n)
                np.savetxt(fh, np.c_[uids[u], iids[b.items]], fmt="%s", delimiter=",")
    res = Cli.run("ingest", "--out", str(log), "--columns", "user,item", "--train", str(tmp_path / "train.csv"),
                  "--test", str(tmp_path / "test.csv"))
    assert res[0] == 0, res
    out = open_store(str(log))
    assert out.implicit
    return out


@pytest.mark.slow
def test_a_log_lists_above_the_chart_at_epsilon_1(tmp_path):
    """Before the cap followed ``--alpha`` this log released the chart at epsilon 1 (0.0685, seed 1; seeds 2 and 3
    0.0668 and 0.0714, the factors 1.06x the chart when kept), where the same pairs as ratings list at 3x their
    chart. Now: seeds 1-3 0.116 / 0.122 / 0.119 against the exact chart's 0.068 (1.72-1.81x). Asserted on seed 1:
    the issue's target, 1.25x the exact chart, and the released chart's floor."""
    from streamdp.serving.evaluate import evaluate_model

    st = _log_store(tmp_path)
    _, f = _fit(st, epsilon=1.0, rank=None, seed=1)
    assert f.model_info["factors_released"]
    f.save(str(tmp_path / "m"))
    r = evaluate_model(str(tmp_path / "m"), st, baselines=False, ranking_users="all", workers=1)["ranking"]
    exact, released = r["baselines"]["popularity"]["recall"], r["baselines"]["private_popularity"]["recall"]
    assert r["recall"] >= 1.25 * exact and r["recall"] >= released, (r["recall"], exact, released)
