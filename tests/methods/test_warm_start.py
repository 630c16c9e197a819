"""``train --warm-start MODEL`` (issue 43, part 3): als/irls start their item factors from a released model."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from streamdp.cli import main
from streamdp.errors import ParameterError
from streamdp.methods import get_method
from streamdp.methods._warm import initial_factors, warm_iters, warm_start_from
from streamdp.serving.model import Model, load_model
from streamdp.workflows.training import train

#: A run small enough to be quick: factors (iterations given, no choice), one worker.
FAST = dict(epsilon=1.0, delta=1e-6, seed=1, iters=2, select="off", workers=1, evaluate_test=False)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from streamdp.storage.generate import generate_store

    p = tmp_path_factory.mktemp("warm") / "s.zarr"
    return generate_store(str(p), n_users=1500, n_items=60, ratings_per_user=10, rank=2, seed=3,
                          test_fraction=0.2, show_progress=False)


@pytest.fixture(scope="module")
def earlier(store, tmp_path_factory):
    """A model released earlier from the store (rank 2)."""
    out = tmp_path_factory.mktemp("earlier") / "m"
    train(store.path, method="als", out=str(out), rank=2, **FAST)
    return out


def _run(store, out, **kw):
    train(store.path, method=kw.pop("method", "als"), out=str(out), **{**FAST, "rank": 2, **kw})
    return load_model(str(out))


def _shifted(model: Model, offset: int) -> Model:
    """``model`` with every item id moved by ``offset`` (items the store does not have)."""
    return Model(path=model.path, item_factors=model.item_factors, item_bias=model.item_bias,
                 item_ids=np.asarray(model.item_ids) + offset, global_mean=model.global_mean, info=model.info,
                 ledger=model.ledger, extras={})


def test_a_warm_start_changes_the_initial_factors_and_a_seeded_one_repeats(store, earlier, tmp_path):
    cold = _run(store, tmp_path / "cold", seed=2)
    warm1 = _run(store, tmp_path / "w1", seed=2, warm_start=str(earlier))
    warm2 = _run(store, tmp_path / "w2", seed=2, warm_start=load_model(str(earlier)))  # a path or a Model
    assert not np.allclose(warm1.item_factors, cold.item_factors)
    np.testing.assert_array_equal(warm1.item_factors, warm2.item_factors)
    np.testing.assert_array_equal(warm1.item_bias, cold.item_bias)  # private: the biases are the fresh statistics'
    ws = warm1.info["warm_start"]
    assert ws["model"] == str(earlier) and ws["method"] == "als"
    assert (ws["items_matched"], ws["items_new"], ws["items_dropped"]) == (60, 0, 0)
    assert any(n.startswith(f"warm start from the model {earlier}") and "free in privacy" in n
               for n in warm1.ledger.notes)


def test_the_ledger_epsilon_is_the_cold_runs(store, earlier, tmp_path):
    _run(store, tmp_path / "cold", seed=2)
    _run(store, tmp_path / "warm", seed=2, warm_start=str(earlier))
    c, w = (json.loads((tmp_path / d / "privacy.json").read_text()) for d in ("cold", "warm"))
    assert w["epsilon"] == c["epsilon"] and w["delta"] == c["delta"]
    assert w["accounting"] == c["accounting"]
    assert w["events"] == c["events"]


def test_new_items_start_cold_and_the_models_other_items_are_dropped(store, earlier):
    m = load_model(str(earlier))
    ids = np.asarray(store.item_ids())
    keep = np.arange(len(ids)) % 3 != 0  # the model lacks every third item of the store ...
    extra = np.array([10_000, 10_001])  # ... and holds two the store lacks
    part = Model(path=m.path, item_factors=np.vstack([m.item_factors[keep], np.ones((2, 2), np.float32)]),
                 item_bias=np.concatenate([m.item_bias[keep], [1.0, 1.0]]).astype(np.float32),
                 item_ids=np.concatenate([ids[keep], extra]), global_mean=m.global_mean, info=m.info,
                 ledger=m.ledger, extras={})
    w = warm_start_from(part, ids, method="als", families=("als", "irls"), rank=2, private=True)
    np.testing.assert_array_equal(w.matched, keep & np.any(m.item_factors != 0, axis=1))
    assert w.dropped == 2
    cold = np.random.default_rng(0).standard_normal((len(ids), 2))
    v0 = initial_factors(cold, w)
    np.testing.assert_array_equal(v0[~w.matched], cold[~w.matched])  # a new item: the cold run's row
    np.testing.assert_allclose(v0[w.matched], m.item_factors[w.matched])


def test_a_model_sharing_no_item_starts_every_item_cold(store, earlier, tmp_path):
    """Every item new: the run is the cold run (its initial factors, its iterations), so a seeded release is the same
    and records no warm start; train's summary says why."""
    cold = _run(store, tmp_path / "cold", seed=4)
    shifted = _shifted(load_model(str(earlier)), 100_000)
    summary = train(store.path, method="als", out=str(tmp_path / "warm"), **{**FAST, "rank": 2, "seed": 4,
                                                                              "warm_start": shifted})
    warm = load_model(str(tmp_path / "warm"))
    np.testing.assert_array_equal(warm.item_factors, cold.item_factors)
    assert "warm_start" not in warm.info
    assert warm.info["run_id"].split("-")[0] == cold.info["run_id"].split("-")[0]  # the cold run's fingerprint
    assert summary["warm_start"]["started_cold"] == "none of the store's items has a released factor row in it"


def test_a_warm_start_takes_a_quarter_of_the_default_iterations(store, earlier):
    assert [warm_iters(t) for t in (0, 5, 7, 9, 15)] == [0, 2, 2, 3, 4]
    cls = get_method("als")
    for eps in (float("inf"), 200.0):  # non-private 15, private from the signal-to-noise proxy
        m = cls(epsilon=eps, delta=1e-6, rank=2, seed=1)
        cold = m.settings(store).iters
        m.warm = warm_start_from(str(earlier), store.item_ids(), method="als", families=cls.WARM_START_FAMILIES,
                                 rank=2, private=m.private)
        assert cold > 0 and m.settings(store).iters == warm_iters(cold) < cold
    m = cls(epsilon=float("inf"), delta=1e-6, rank=2, seed=1, iters=6)
    m.warm = warm_start_from(str(earlier), store.item_ids(), method="als", families=("als", "irls"), rank=2,
                             private=False)
    assert m.settings(store).iters == 6  # a given --iters stands


def test_irls_starts_from_an_als_model(store, earlier, tmp_path):
    w = _run(store, tmp_path / "irls", method="irls", warm_start=str(earlier))
    assert w.info["warm_start"]["method"] == "als" and w.method == "irls"


def test_a_non_private_warm_start_begins_at_the_models_biases(store, tmp_path):
    nonpriv = dict(epsilon=float("inf"), delta=1e-6, iters=1)
    m0 = _run(store, tmp_path / "m0", **nonpriv)
    cold = _run(store, tmp_path / "cold", seed=3, **nonpriv)
    warm = _run(store, tmp_path / "warm", seed=3, warm_start=str(tmp_path / "m0"), **nonpriv)
    assert not np.allclose(warm.item_bias, cold.item_bias)
    assert m0.info["parameters"]["iters"] == 1


def _cli_error(*args):
    r = CliRunner().invoke(main, ["train", *map(str, args)])
    assert r.exit_code == 2, r.output
    (line,) = r.output.splitlines()
    assert line.startswith("streamdp: error: ")
    return line


@pytest.mark.parametrize("extra, words", [
    (["--rank", "3"], "a model of rank 2, this run's rank is 3"),
    (["--method", "means"], "--method means takes no warm start"),
    (["--method", "svd"], "--warm-start works with --method als, ials, irls"),
    (["--checkpoint", "CK"], "--warm-start with --checkpoint: refused"),
])
def test_incompatible_runs_are_one_line(store, earlier, tmp_path, extra, words):
    extra = [str(tmp_path / "ck") if a == "CK" else a for a in extra]
    out = tmp_path / "m"
    line = _cli_error(store.path, "--epsilon", "1", "--out", out, "--warm-start", earlier, *extra)
    assert words in line
    assert not out.exists()


def test_incompatible_models_are_one_line(store, earlier, tmp_path):
    out = tmp_path / "m"
    assert "not a model" in _cli_error(store.path, "--epsilon", "1", "--out", out, "--warm-start", tmp_path)
    m = load_model(str(earlier))
    with pytest.raises(ParameterError, match="its item ids are string ids, the store's are integer ids"):
        warm_start_from(Model(path="x", item_factors=m.item_factors, item_bias=m.item_bias,
                              item_ids=np.array([f"i{j:03d}" for j in range(60)], object), global_mean=3.0,
                              info=m.info, ledger=m.ledger, extras={}),
                        store.item_ids(), method="als", families=("als", "irls"), rank=2, private=True)
    zeros = Model(path="z", item_factors=np.zeros_like(m.item_factors), item_bias=m.item_bias,
                  item_ids=m.item_ids, global_mean=3.0, info=m.info, ledger=m.ledger, extras={})
    for rank in (2, 5):  # no factors: nothing to start (train runs cold), whatever the run's rank
        w = warm_start_from(zeros, store.item_ids(), method="als", families=("als",), rank=rank, private=True)
        assert w.starts_nothing and not w.released and w.factors.shape == (60, rank)
        assert "released no item factors" in w.cold_reason()
    nonpriv = Model(path="n", item_factors=m.item_factors, item_bias=m.item_bias, item_ids=m.item_ids,
                    global_mean=3.0, info={**m.info, "epsilon": "inf"}, ledger=m.ledger, extras={})
    with pytest.raises(ParameterError, match="a non-private model"):
        warm_start_from(nonpriv, store.item_ids(), method="als", families=("als",), rank=2, private=True)
    means = _run(store, tmp_path / "means", method="means", iters=None)
    line = _cli_error(store.path, "--epsilon", "1", "--out", out, "--warm-start", tmp_path / "means")
    assert "a model of --method means, which cannot start --method als" in line
    assert means.method == "means"


def test_ials_starts_from_an_ials_model_only(store, earlier, tmp_path):
    """Non-private with the choice off: the tiny store's private ials releases the chart, no factors to start from."""
    m0 = _run(store, tmp_path / "i0", method="ials", iters=1, select="off", epsilon=float("inf"))
    cold = _run(store, tmp_path / "cold", method="ials", iters=1, select="off", epsilon=float("inf"), seed=2)
    warm = _run(store, tmp_path / "warm", method="ials", iters=1, select="off", epsilon=float("inf"), seed=2, warm_start=str(tmp_path / "i0"))
    again = _run(store, tmp_path / "again", method="ials", iters=1, select="off", epsilon=float("inf"), seed=2,
                 warm_start=str(tmp_path / "i0"))
    assert m0.info["factors_released"] and warm.info["warm_start"]["method"] == "ials"
    assert not np.allclose(warm.item_factors, cold.item_factors)
    np.testing.assert_array_equal(warm.item_factors, again.item_factors)
    out = tmp_path / "x"
    line = _cli_error(store.path, "--epsilon", "1", "--out", out, "--method", "ials", "--warm-start", earlier)
    assert "a model of --method als, which cannot start --method ials (it needs a model of ials)" in line
    cls = get_method("ials")
    from streamdp.methods.ials import PRIVATE_ITERS

    for eps, cold in ((float("inf"), 10), (1.0, PRIVATE_ITERS)):
        m = cls(epsilon=eps, delta=1e-6, rank=2, seed=1)
        m.warm = warm_start_from(str(tmp_path / "i0"), store.item_ids(), method="ials", families=("ials",), rank=2,
                                 private=False)
        assert m.settings(store).iters == warm_iters(cold) < cold


def test_the_python_api_and_the_cli_say_what_started_the_run(store, earlier, tmp_path):
    import streamdp

    m = streamdp.train(store.path, epsilon=1.0, out=str(tmp_path / "api"), rank=2, seed=1, iters=1, select="off",
                       evaluate=False, warm_start=str(earlier))
    assert m.summary["warm_start"]["model"] == str(earlier) and m.info["iterations_run"] == 1
    r = CliRunner().invoke(main, ["train", str(store.path), "--epsilon", "1", "--out", str(tmp_path / "cli"),
                                  "--seed", "1", "--iters", "1", "--warm-start", str(earlier)])
    assert r.exit_code == 0, r.output
    assert f"warm start: from {earlier} (als), 1 iterations; items 60 from it, 0 cold, 0 of its dropped" in r.output


def test_a_model_of_integer_ids_cannot_start_a_store_of_string_ids(earlier, tmp_path):
    from streamdp.storage.generate import generate_store

    s = generate_store(str(tmp_path / "str.zarr"), n_users=300, n_items=60, ratings_per_user=8, rank=2, seed=3,
                       string_ids=True, show_progress=False)
    line = _cli_error(s.path, "--epsilon", "1", "--out", tmp_path / "m", "--warm-start", earlier)
    assert "its item ids are integer ids, the store's are string ids" in line
    assert not (tmp_path / "m").exists()


def _passes(monkeypatch) -> list:
    """The progress labels of every engine pass from now on (``map_reduce``: every pass of an als fit)."""
    from streamdp.stream.engine import Engine

    seen, orig = [], Engine.map_reduce

    def spy(self, *a, desc="pass", **k):
        seen.append(desc)
        return orig(self, *a, desc=desc, **k)

    monkeypatch.setattr(Engine, "map_reduce", spy)
    return seen


def _chose_factors(model: Model, ridge: float = 30.0, losses: list | None = None) -> Model:
    """``model`` as if its ``--select auto`` had released the factors with the local ridge ``ridge`` (and, given,
    the noisy ``losses`` of the candidates ``factors, ridge {ridge}`` and ``bias, ridge 3``)."""
    sel = {"chosen": f"factors, ridge {ridge:g}"}
    if losses is not None:
        sel.update(candidates=[sel["chosen"], "bias, ridge 3"], noisy_validation_losses=list(losses))
    info = {**model.info, "selection": sel}
    return Model(path=model.path, item_factors=model.item_factors, item_bias=model.item_bias,
                 item_ids=model.item_ids, global_mean=model.global_mean, info=info, ledger=model.ledger, extras={})


def test_a_warm_fit_releases_the_global_mean_from_its_statistics_pass(store, earlier, tmp_path, monkeypatch):
    """No pass of its own for the mean: the earlier model's released mean centres the one-rating users' residuals,
    and the new mean is released from the statistics pass's sums, with the cold run's noise and ledger."""
    seen = _passes(monkeypatch)
    cold = _run(store, tmp_path / "cold", seed=2)
    cold_passes = list(seen)
    seen.clear()
    warm = _run(store, tmp_path / "warm", seed=2, warm_start=str(earlier))
    assert cold_passes == ["als global mean", "als statistics + iteration 1/2", "als iteration 2/2"]
    assert seen == ["als statistics", "als iteration 1/2", "als iteration 2/2"]
    assert warm.global_mean == cold.global_mean  # the same sums, the same noise draw
    c, w = (json.loads((tmp_path / d / "privacy.json").read_text()) for d in ("cold", "warm"))
    assert w["events"] == c["events"] and w["accounting"] == c["accounting"]


def test_a_private_warm_fit_reuses_the_models_released_choice(store, earlier, tmp_path, monkeypatch):
    """A model whose --select auto chose its factors: the refresh releases that choice again (post-processing of
    model.json) with no selection pass and no selection release; its ledger is a run's without --select."""
    chose = _chose_factors(load_model(str(earlier)))
    kw = {k: v for k, v in FAST.items() if k != "select"}  # --select not given: auto
    seen = _passes(monkeypatch)
    train(store.path, method="als", out=str(tmp_path / "warm"), rank=2, warm_start=chose, **{**kw, "seed": 2})
    assert seen == ["als statistics", "als iteration 1/2", "als iteration 2/2"]
    warm = load_model(str(tmp_path / "warm"))
    assert warm.info["selection"] == {"chosen": "factors, ridge 30", "reused_from": str(earlier)}
    assert warm.info["ridge"] == 30.0 and warm.info["parameters"]["select"] == "reused"
    assert any("is reused (post-processing of its model.json)" in n for n in warm.ledger.notes)
    _run(store, tmp_path / "off", seed=2)  # --select off: the same releases, the same budget
    w, off = (json.loads((tmp_path / d / "privacy.json").read_text()) for d in ("warm", "off"))
    assert w["events"] == off["events"] and w["accounting"] == off["accounting"]
    assert "validation losses" not in json.dumps(w)
    seen.clear()  # --select auto given: the refresh chooses afresh
    train(store.path, method="als", out=str(tmp_path / "auto"), rank=2, warm_start=chose,
          **{**kw, "seed": 2, "select": "auto"})
    auto = load_model(str(tmp_path / "auto"))
    assert "reused_from" not in auto.info.get("selection", {}) and auto.info["parameters"]["select"] != "reused"
    # factors kept as the default while the biases' noisy loss was lower: not evidence, so chosen afresh
    for losses, reused in (([3280.0, 3518.0], True), ([3518.0, 3280.0], False)):
        out = tmp_path / f"kept{int(reused)}"
        train(store.path, method="als", out=str(out), rank=2, **{**kw, "seed": 2},
              warm_start=_chose_factors(load_model(str(earlier)), losses=losses))
        assert (load_model(str(out)).info["parameters"]["select"] == "reused") == reused


def test_a_choice_of_biases_or_none_is_not_reused():
    from streamdp.methods._warm import released_choice

    assert released_choice({"selection": {"chosen": "factors, ridge 10"}}) == ("factors", 10.0)
    assert released_choice({"selection": {"chosen": "bias, ridge 3"}}) is None
    assert released_choice({"selection": {"chosen": "mean, no intercept"}}) is None
    assert released_choice({}) is None
    kept = {"chosen": "factors, ridge 10", "candidates": ["factors, ridge 10", "factors, ridge 30", "bias, ridge 3",
                                                          "mean, no intercept"]}
    assert released_choice({"selection": {**kept, "noisy_validation_losses": [10.0, 9.0, 11.0, 12.0]}}) == (
        "factors", 10.0)  # the other factors' loss lower: still the factors over every candidate without them
    assert released_choice({"selection": {**kept, "noisy_validation_losses": [10.0, 9.0, 11.0, 9.5]}}) is None
    assert released_choice({"selection": {**kept, "noisy_validation_losses": [10.0, 9.0]}}) == ("factors", 10.0)


@pytest.fixture(scope="module")
def clustered(tmp_path_factory):
    """A store of taste clusters, where a private ials run at epsilon 2 keeps its factors over the chart."""
    from streamdp.storage.generate import generate_store

    p = tmp_path_factory.mktemp("warm-ials") / "c.zarr"
    return generate_store(str(p), n_users=3000, n_items=200, ratings_per_user=20, rank=2, seed=3, taste_clusters=8,
                          test_fraction=0.2, show_progress=False)


#: A private ials run on ``clustered`` (its iterations: 3 cold, 1 warm).
IALS = dict(method="ials", rank=2, epsilon=2.0, delta=1e-6, workers=1, evaluate_test=False)


def _recall(path, store) -> float:
    from streamdp.serving.evaluate import evaluate_model

    return evaluate_model(str(path), store, baselines=False, ranking_users="all", workers=1)["ranking"]["recall"]


def test_a_private_warm_ials_fit_reuses_the_models_released_choice(clustered, tmp_path, monkeypatch):
    """The earlier model's choice of its factors over the chart stands: one pass fewer (no choice pass), no choice
    release, and lists within 0.02 Recall@10 of a refresh that chooses afresh (measured: within 0.002 in seeds
    2-5, both about 0.65 against the chart's 0.39)."""
    train(clustered.path, out=str(tmp_path / "m0"), seed=1, **IALS)
    assert load_model(str(tmp_path / "m0")).info["selection"]["chosen"] == "factors"
    seen = _passes(monkeypatch)
    train(clustered.path, out=str(tmp_path / "warm"), seed=2, warm_start=str(tmp_path / "m0"), **IALS)
    reused = list(seen)
    seen.clear()  # --select auto given: the refresh chooses afresh
    train(clustered.path, out=str(tmp_path / "auto"), seed=2, warm_start=str(tmp_path / "m0"), select="auto", **IALS)
    from streamdp.methods.ials import PRIVATE_ITERS

    n = warm_iters(PRIVATE_ITERS)  # 2 of 5
    assert seen == ["ials counts", *[f"ials iteration {t}/{n}" for t in range(1, n + 1)], "ials choice"]
    assert reused == seen[:-1]
    warm, auto = load_model(str(tmp_path / "warm")), load_model(str(tmp_path / "auto"))
    why = warm.info["selection"].pop("why")
    assert warm.info["selection"] == {"chosen": "factors", "reused_from": str(tmp_path / "m0")}
    assert warm.info["factors_released"] and "reused_from" not in auto.info["selection"]
    assert "is reused (post-processing of its model.json)" in why and why in warm.ledger.notes
    train(clustered.path, out=str(tmp_path / "off"), seed=2, warm_start=str(tmp_path / "m0"), select="off", **IALS)
    w, off = (json.loads((tmp_path / d / "privacy.json").read_text()) for d in ("warm", "off"))
    assert w["events"] == off["events"] and w["accounting"] == off["accounting"]  # --select off's releases
    assert "validation" not in json.dumps(w["events"])
    assert abs(_recall(tmp_path / "warm", clustered) - _recall(tmp_path / "auto", clustered)) < 0.02


def test_an_ials_choice_is_reused_with_its_chart_class_and_only_when_it_kept_the_factors(clustered, tmp_path):
    from streamdp.methods._warm import released_chart_choice

    m0 = _run(clustered, tmp_path / "m0", method="ials", iters=1, select="off", epsilon=float("inf"))
    chosen = "factors for users of 5 or more training items, the chart by the released counts for the others"
    info = {**m0.info, "epsilon": 2.0, "selection": {"chosen": chosen, "chart_below": 5}}
    m0 = Model(path=m0.path, item_factors=m0.item_factors, item_bias=m0.item_bias, item_ids=m0.item_ids,
               global_mean=m0.global_mean, info=info, ledger=m0.ledger, extras={})
    cls = get_method("ials")

    def settings(eps=2.0, **opts):
        m = cls(epsilon=eps, delta=1e-6, rank=2, seed=1, **opts)
        m.warm = warm_start_from(m0, clustered.item_ids(), method="ials", families=("ials",), rank=2,
                                 private=m.private)
        return m.settings(clustered)

    s = settings()
    assert (s.select, s.reused_choice, s.reused_chart_below) == (False, chosen, 5)
    assert "reused_choice" in s.as_dict() and "reused_choice" not in settings(select="auto").as_dict()
    assert settings(select="auto").select and not settings(float("inf")).reused_choice
    train(clustered.path, out=str(tmp_path / "warm"), seed=2, warm_start=m0, **IALS)
    sel = load_model(str(tmp_path / "warm")).info["selection"]
    assert sel.pop("why").startswith("--select auto: the choice released by the warm-start model")
    assert sel == {"chosen": chosen, "reused_from": str(m0.path), "chart_below": 5}  # serving lists the chart below 5
    assert released_chart_choice({"selection": {"chosen": "chart by the released counts"}}) is None
    assert released_chart_choice({}) is None


def test_a_model_without_factors_gives_a_cold_run_and_says_so(store, earlier, tmp_path):
    """A biases-only earlier model (a weekly refresh names last week's, whatever it chose): the run is the cold run,
    bit for bit, at a cold run's iterations, and the output says no item started warm."""
    biases = tmp_path / "biases"
    train(store.path, method="als", out=str(biases), **{**FAST, "rank": 2, "iters": 0})
    assert not np.any(load_model(str(biases)).item_factors)
    kw = {"rank": None, "iters": None, "select": "off", "seed": 2, "epsilon": 30.0}  # factors by default at 30
    cold = _run(store, tmp_path / "cold", **kw)
    res = CliRunner().invoke(main, ["train", store.path, "--epsilon", "30", "--delta", "1e-6", "--seed", "2",
                                    "--select", "off", "--workers", "1", "--warm-start", str(biases),
                                    "--out", str(tmp_path / "w")])
    assert res.exit_code == 0, res.output
    assert (f"warm start: none from {biases} (als): it released no item factors (item biases or a chart only), so "
            f"every item started cold, as in a cold run ({cold.info['iterations_run']} iterations)") in res.output
    w = load_model(str(tmp_path / "w"))
    assert "warm_start" not in w.info and w.info["iterations_run"] == cold.info["iterations_run"] > 1
    np.testing.assert_array_equal(w.item_factors, cold.item_factors)
    assert w.info["run_id"].split("-")[0] == cold.info["run_id"].split("-")[0]  # its fingerprint: no warm start
    # items it does not share are the other way to start nothing: also cold
    assert warm_start_from(_shifted(load_model(str(earlier)), 10_000), store.item_ids(), method="als",
                           families=("als",), rank=2, private=True).starts_nothing
