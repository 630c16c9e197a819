"""``streamdp tune --method ials``: candidates scored by noisy held-out hits, one ledger within epsilon.

One small implicit store and one tuning run (module fixture) serve the end-to-end checks; the grid's errors and the
score's bounds need no training.
"""

from __future__ import annotations

import math

import pytest

from streamdp.errors import ParameterError
from streamdp.methods import get_method
from streamdp.privacy import epsilon_of
from streamdp.privacy.budget import StoreBudget
from streamdp.privacy.ledger import Ledger
from streamdp.workflows.tune import HITS_K, _hits, default_grid, hits_sensitivity, parse_grid, tune

GRID = {"alpha": [3.0, 10.0]}  # two candidates: the accounting of more takes seconds


@pytest.fixture(scope="module")
def implicit_store(tmp_path_factory):
    from streamdp.storage.generate import generate_store

    path = tmp_path_factory.mktemp("tune_ials") / "imp.zarr"
    return generate_store(str(path), n_users=1500, n_items=60, ratings_per_user=12, rank=4, seed=3,
                          test_fraction=0.2, implicit=True, taste_clusters=4, show_progress=False)


@pytest.fixture(scope="module")
def tuned(implicit_store, tmp_path_factory):
    """One tuning run through the public API (``streamdp.tune``), as the CLI's is."""
    import streamdp

    out = tmp_path_factory.mktemp("tune_ials_model") / "m"
    model = streamdp.tune(implicit_store, epsilon=3.0, method="ials", out=str(out), grid=GRID, seed=1, workers=1,
                          evaluate=False)
    return model.summary, out


def test_tune_ials_writes_a_ledger_within_epsilon(tuned):
    s, out = tuned
    t = s["tuning"]
    assert t["skipped"] is None and t["score"] == "held-out hits"
    assert len(t["candidates"]) == 2 and all("noisy_hits" in c for c in t["candidates"])
    assert t["chosen"] in [c["config"] for c in t["candidates"]]
    led = Ledger.read(out)
    total = epsilon_of(led.event(), led.delta).epsilon
    assert total <= 3.0 and total == pytest.approx(s["epsilon_spent"], rel=1e-9)
    assert t["final_epsilon"] > 0.95 * 3.0  # the candidates and the choice are cheap


def test_the_summary_prints_each_candidates_noisy_hits(tuned):
    from streamdp.cli import format_tune_summary

    s, _ = tuned
    text = format_tune_summary(s)
    assert "noisy held-out hits in the top 10 (higher is better" in text and text.count("<- chosen") == 1
    assert "neither leaner (rank, iters) nor favoured by noise" in text


def test_the_hits_release_has_the_stated_sensitivity(tuned):
    _, out = tuned
    led = Ledger.read(out)
    sel = [e for e in led.bounds["releases"] if e["release"].startswith("tune: held-out hits of the 2 candidate")]
    assert len(sel) == 1
    assert sel[0]["sensitivity"] == pytest.approx(math.sqrt(2)) == hits_sensitivity(2)
    assert sel[0]["sensitivity_norm"] == "l2" and sel[0]["mechanism"] == "gaussian"


def test_each_user_adds_at_most_one_per_candidate(implicit_store, tuned):
    """The exact (noiseless) hits of a model: each user's score is in [0, 1] (the sensitivity's premise), so the sum
    is at most the number of users."""
    from streamdp.serving.model import load_model

    _, out = tuned
    m = load_model(str(out))
    fitted = type("F", (), {"item_factors": m.item_factors, "item_bias": m.item_bias, "global_mean": m.global_mean,
                            "model_info": m.info, "extras": m.extras})()
    sums = _hits(implicit_store, [fitted], key=5, workers=1, memory_limit=None)
    assert 0.0 < sums[0] <= implicit_store.n_users
    assert HITS_K == 10


def test_a_grid_key_ials_does_not_have_is_a_one_line_error(cli, tmp_path, implicit_store):
    with pytest.raises(ParameterError, match="'iterations' is not an option of --method ials"):
        parse_grid(["iterations=1,2"], get_method("ials"))
    res = cli.run("tune", implicit_store.path, "--method", "ials", "--epsilon", "1", "--grid", "shrinkage=1,2",
                  "--out", tmp_path / "m")
    cli.error(res, "--grid", "'shrinkage' is not an option of --method ials", "alpha", "count_share", "reg")


def test_ials_grid_keys_are_its_options():
    g = parse_grid(["rank=16,32", "alpha=1,10", "reg=0.1,1", "count_share=0.2,0.3"], get_method("ials"))
    assert g == {"rank": [16, 32], "alpha": [1.0, 10.0], "reg": [0.1, 1.0], "count_share": [0.2, 0.3]}


def test_ials_default_grid_is_rank_by_alpha_within_the_items(implicit_store):
    g = default_grid("ials", implicit_store, 1.0)
    a = get_method("ials")(epsilon=1.0, delta=1e-6).opts.alpha
    # the default rank is the private rule's (train's without --rank: 16 or 8); 60 items: no 64 factors
    assert g["rank"] == [None, 32] and len(g["alpha"]) == 2 and a in g["alpha"]
    assert min(g["alpha"]) < a or a == 1.0  # a larger alpha could never be chosen (next test)


def test_noise_favoured_ials_candidates_never_replace_the_default():
    """A larger reg or alpha scores better at the candidates' low signal-to-noise ratio than it will when released:
    it may not replace the default; a smaller one, or another count share, may."""
    from streamdp.workflows.tune import _favoured_by_noise

    d = {"alpha": 3.0, "reg": 1.0, "rank": 16}
    assert _favoured_by_noise({**d, "alpha": 10.0}, d) and _favoured_by_noise({**d, "reg": 3.0}, d)
    assert not _favoured_by_noise({**d, "alpha": 1.0}, d) and not _favoured_by_noise({**d, "reg": 0.1}, d)
    assert not _favoured_by_noise({**d, "count_share": 0.5}, {**d, "count_share": 0.3})


def test_an_alpha_above_the_cap_is_refused_before_any_pass(tmp_path):
    from streamdp.storage.generate import generate_store

    st = generate_store(str(tmp_path / "r.zarr"), n_users=200, n_items=20, ratings_per_user=5, rank=2, seed=0,
                        test_fraction=0.2, show_progress=False)
    with pytest.raises(ParameterError, match=r"--grid: alpha=40.0: --alpha 40 .*--max-confidence"):
        tune(st, epsilon=1.0, method="ials", out=str(tmp_path / "m"), grid={"alpha": [3, 40]}, seed=0)
    assert not (tmp_path / "m").exists()
    assert StoreBudget(st.path).show()["entries"] == []


def test_rank_auto_is_trains_rule_and_never_leaner_than_a_number():
    """``rank=auto`` (``None``): the rank ``train`` takes without ``--rank`` (ials' private rule, 16 or 8), the default
    grid's default; a number below the method's default rank is leaner than it, one above is not."""
    from streamdp.workflows.tune import _leaner, config_name

    assert parse_grid(["rank=auto,32"], get_method("ials")) == {"rank": [None, 32]}
    assert config_name({"rank": None, "alpha": 3.0}) == "alpha=3.0 rank=auto"
    d = {"rank": None, "alpha": 3.0}
    assert not _leaner({"rank": 32, "alpha": 3.0}, d, 16) and _leaner({"rank": 8, "alpha": 3.0}, d, 16)
    assert not _leaner({"rank": None, "alpha": 1.0}, d, 16)
    with pytest.raises(ParameterError, match="positive integer or auto"):
        parse_grid(["rank=automatic"], get_method("ials"))


def test_the_default_candidate_trains_with_the_private_rank_rule(implicit_store, tmp_path):
    """The default grid's default candidate, and the released model when it is chosen, take ials' private rank rule
    (:func:`streamdp.methods.ials.private_rank`): on this store at epsilon 0.7 the rule takes 8 factors, where the
    grid's 16 before took 16 (train's default was then no candidate)."""
    import streamdp
    from streamdp.serving.model import load_model

    grid = {"rank": [None, 32], "alpha": [3.0]}
    model = streamdp.tune(implicit_store, epsilon=0.7, method="ials", out=str(tmp_path / "m"), grid=grid, seed=1,
                          workers=1, evaluate=False)
    t = model.summary["tuning"]
    assert t["default"] == {"rank": None, "alpha": 3.0}
    streamdp.train(implicit_store, method="ials", epsilon=0.7, out=str(tmp_path / "t"), seed=1, workers=1,
                   evaluate=False)
    rule = load_model(str(tmp_path / "t")).info["rank"]
    assert t["chosen"] == t["default"] and load_model(str(tmp_path / "m")).info["rank"] == rule == 8 + 1, (t, rule)
