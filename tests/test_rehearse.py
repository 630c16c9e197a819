"""Choosing epsilon without spending it (issue 31 item 2): ``generate --like``, ``sweep --rehearse``,
``sweep --replot``, the confirmation before an infinite spend, the baselines beside each sweep point."""

import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

from streamdp.cli import main


def _run(*args, input=None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


def _budget_bytes(store) -> bytes | None:
    p = os.path.join(str(store), "privacy_budget.json")
    return open(p, "rb").read() if os.path.exists(p) else None


@pytest.fixture()
def store(tmp_path):
    from streamdp.storage.generate import generate_store

    return generate_store(str(tmp_path / "s.zarr"), n_users=800, n_items=60, ratings_per_user=12, rank=3, seed=4,
                          test_fraction=0.2)


@pytest.fixture()
def one_pilot(monkeypatch):
    """The spread calibration in one pilot round: the tests that take it check what is released, charged, recorded and
    said, not how closely the spread is matched (the acceptance measures that: the cheap guard below, and -m slow)."""
    import streamdp.workflows.rehearse

    monkeypatch.setattr(streamdp.workflows.rehearse, "PILOT_ROUNDS", 1)


@pytest.fixture()
def no_plot(monkeypatch):
    """The sweep's figure left out where no assertion reads it (matplotlib's import and drawing cost seconds)."""
    import streamdp.workflows.sweep

    monkeypatch.setattr(streamdp.workflows.sweep, "plot", lambda result, path: None)


@pytest.fixture(scope="module")
def _released_once(tmp_path_factory):
    """The ``store`` fixture's store after one released means model, made once for the module: ``released`` copies it
    (its budget entry points at this model, which no test changes)."""
    import streamdp
    from streamdp.storage.generate import generate_store

    d = tmp_path_factory.mktemp("released")
    s = generate_store(str(d / "s.zarr"), n_users=800, n_items=60, ratings_per_user=12, rank=3, seed=4,
                       test_fraction=0.2, show_progress=False)
    streamdp.train(s.path, method="means", epsilon=2.0, out=str(d / "m"), seed=1, evaluate=False)
    return s.path, str(d / "m")


@pytest.fixture()
def released(_released_once, tmp_path):
    """A store after one released means model (its ledger holds the released user count and histogram), a fresh
    copy per test; ``released.model_dir`` is the model."""
    import shutil

    from streamdp.storage.store import open_store

    shutil.copytree(_released_once[0], tmp_path / "s.zarr")
    st = open_store(str(tmp_path / "s.zarr"))
    st.model_dir = _released_once[1]
    return st


def test_shape_from_histogram_fits_the_generators_activity_law():
    """The mean ratings per user is that of the generator's law whose histogram fits the released one: exact on the
    law's own histogram, within 3% under Laplace noise of std 10 on 400 users; noise in a bin no user can be in is left
    out of the user count."""
    from streamdp.workflows.rehearse import activity_histogram, generator_mean, shape_from_histogram

    h = 400 * activity_histogram(9.0, 60, 0.2)
    h[-1] = 30.0  # noise in a bin no user can be in (4096+ ratings on 60 items): ignored
    s = shape_from_histogram(h, 0.0, 60, 0.2)
    assert s["n_users"] == 400 and generator_mean(s["ratings_per_user"], 60) == pytest.approx(9.0, abs=0.01)
    rng = np.random.default_rng(3)
    got = [generator_mean(shape_from_histogram(h + rng.laplace(0, 10 / 2 ** 0.5, len(h)), 10.0, 60, 0.2)
                          ["ratings_per_user"], 60) for _ in range(5)]
    assert np.allclose(got, 9.0, rtol=0.03), got


def test_drawing_weights_undo_the_flattening_of_realized_counts(tmp_path):
    """A store's realized item counts are flatter than the power law that drew them (a heavy user rates the top item
    once); :func:`drawing_weights` recovers the law's top shares from the counts and the activity law."""
    from streamdp.storage.generate import generate_store
    from streamdp.workflows.rehearse import _activity, drawing_weights

    g = generate_store(str(tmp_path / "z.zarr"), n_users=2000, n_items=80, ratings_per_user=15, seed=5)
    counts = g.array("item_counts")[:].astype(np.float64)
    law = np.arange(1, 81) ** -0.9
    law /= law.sum()
    n = _activity(15.0, 80, 2.0)
    p = drawing_weights(counts, n, np.ones(len(n)))
    top = lambda x: float(np.sort(x)[::-1][:8].sum() / x.sum())  # noqa: E731
    assert abs(top(p) - top(law)) < 0.03 < abs(top(counts) - top(law))


@pytest.mark.parametrize("groups", [256, pytest.param(None, marks=pytest.mark.slow)])  # None: the module's GROUPS
def test_drawing_weights_stay_bounded_on_a_large_catalogue_and_unreachable_totals(monkeypatch, groups):
    """Past GROUPS items the tail is solved in groups; a total no user of the generator's activity can reach (the top
    item's share above one rating per user) moves its weight at most MAX_CORRECTION (renormalised), never to 1. The
    default run solves with 256 unknowns (the same grouping, an eighth of the work); -m slow with the module's 2,048."""
    import streamdp.workflows.rehearse
    from streamdp.workflows.rehearse import MAX_CORRECTION, _activity, drawing_weights

    if groups is not None:
        monkeypatch.setattr(streamdp.workflows.rehearse, "GROUPS", groups)
    n_items = streamdp.workflows.rehearse.GROUPS + 952
    tot = np.arange(1, n_items + 1) ** -0.9
    n = _activity(50.0, n_items, 2.0)
    p = drawing_weights(tot, n, np.ones(len(n)))
    ratio = p / (tot / tot.sum())
    assert p.sum() == pytest.approx(1.0) and np.all(np.diff(p) <= 1e-15)
    assert ratio.max() <= 1.1 * MAX_CORRECTION and ratio.min() >= 1 / (1.1 * MAX_CORRECTION)


def test_the_item_means_draw_is_scaled_as_the_released_models_posterior():
    """:func:`item_mean_draw`: over 20,000 items each, the draw's std is the prior's t = 0.4 for unrated items and
    ``sqrt(1 / (1 / t^2 + C / s^2))`` for items of C ratings (within 3%), more with noise on the sums; seeded."""
    from streamdp.workflows.rehearse import item_mean_draw

    n = 20_000
    for C, sigma, want in ((0.0, 0.0, 0.4), (25.0, 0.0, (1 / (1 / 0.16 + 25.0)) ** 0.5),
                           (25.0, 10.0, (1 / (1 / 0.16 + 625.0 / (25.0 + 100.0))) ** 0.5)):
        prior = {"counts": np.full(n, C), "t2": 0.16, "s2": 1.0, "sigma_S": sigma}
        d = item_mean_draw(prior, n, seed=3)
        assert d.std() == pytest.approx(want, rel=0.03)
        assert np.array_equal(d, item_mean_draw(prior, n, seed=3))
    assert item_mean_draw(None, n, seed=3) is None


def test_a_models_validation_losses_are_a_source_of_the_split():
    """An als model's ``--select auto`` losses (exact at inf, noisy otherwise) give the factors-over-biases ratio;
    a selection without a factors or a biases candidate gives nothing."""
    from streamdp.workflows.rehearse import _selection_source

    names = ["factors, ridge 10", "factors, ridge 30", "bias, ridge 3", "bias, no intercept", "mean, no intercept"]
    exact = {"method": "als", "epsilon": "inf", "selection": {"candidates": names, "validation_losses":
                                                              [1995.6, 2052.4, 1920.5, 2201.0, 2257.6]}}
    s = _selection_source("m", exact)
    assert s["std"] == 0.0 and s["value"]["ratio"] == pytest.approx(1995.6 / 1920.5, abs=1e-4)
    noisy = {"method": "als", "epsilon": 10.0, "selection": {"candidates": names, "noisy_validation_losses":
                                                             [1800.0, 2052.4, 1920.5, 2201.0, 2257.6]}}
    assert _selection_source("m", noisy)["std"] == pytest.approx(0.1) and _selection_source("m", noisy)["value"][
        "ratio"] < 1
    only_biases = {"method": "als", "epsilon": 5.0, "selection": {"candidates": names[2:], "noisy_validation_losses":
                                                                  [1906.8, 2214.2, 2185.4]}}
    assert _selection_source("m", only_biases) is None and _selection_source("m", {"method": "means"}) is None


def test_the_split_search_steps_towards_the_released_ratio_and_converges():
    """:func:`_next_split` on a ratio that rises with the noise (as the factors' held-out loss does): more noise when
    the pilot's factors do better than the released ones, less when worse; the secant reaches the target."""
    from streamdp.workflows.rehearse import SPLIT_RANGE, _next_split

    def ratio(split):  # saturates as the interaction vanishes, as measured on the noisy store
        return 1.04 - 0.1 / (1.0 + split ** 2)

    assert _next_split(0.5, ratio(0.5), 1.03, None) > 0.5 and _next_split(2.0, ratio(2.0), 0.98, None) < 2.0
    split, last = 0.5, None
    for _ in range(8):
        r = ratio(split)
        split, last = _next_split(split, r, 1.03, last), (split, r)
    assert ratio(split) == pytest.approx(1.03, abs=2e-3) and SPLIT_RANGE[0] <= split <= SPLIT_RANGE[1]
    assert _next_split(15.0, ratio(15.0), 1.5, (10.0, ratio(10.0))) == SPLIT_RANGE[1]  # out of reach: at the bound


@pytest.mark.usefixtures("one_pilot")
def test_generate_like_uses_what_was_released_and_leaves_the_budget_byte_for_byte(released, tmp_path):
    # the released model has no spread statistics: they are released once, charged and said ...
    r = _run("generate", "--like", released.path, "--out", tmp_path / "first.zarr")
    assert r.exit_code == 0, r.output
    assert "charged to" in r.output and "for how its ratings spread around the released item means" in r.output
    assert "its ratings read once for the rating spread" in r.output
    entries = json.loads(_run("budget", released.path, "--json").stdout)["entries"]
    assert [(e["method"], e["epsilon"]) for e in entries][-1] == ("shape", 0.1)
    # ... and reused afterwards, free: the budget byte for byte
    before = _budget_bytes(released.path)
    r = _run("generate", "--like", released.path, "--out", tmp_path / "syn.zarr")
    assert r.exit_code == 0, r.output
    assert _budget_bytes(released.path) == before
    ledger = json.load(open(os.path.join(released.model_dir, "privacy.json")))
    n = ledger["public_parameters"]["n_users"]["value"]
    assert f"{n:,} users: released: budget entry" in r.output and "charged" not in r.output
    assert "none of its ratings read" in r.output and "rating spread: interaction scale" in r.output
    from streamdp.storage.store import open_store

    syn = open_store(str(tmp_path / "syn.zarr"))
    assert syn.n_users == n and syn.n_items == released.n_items
    like = syn.attrs["params"]["like"]
    assert like["store"] == released.path and like["public"]["test_fraction"] == 0.2
    # the released histogram puts the mean ratings per user near the store's (12 in all: noise at epsilon 2 aside)
    assert 6 <= like["shape"]["ratings_per_user"]["value"] <= 20
    # the item side is the model's: its noisy item weight totals (floored) for popularity, its global mean and item
    # biases for the items' mean ratings once the generator's spread, rounding and clipping are added
    from streamdp.serving.model import load_model
    from streamdp.workflows.rehearse import clipped_mean, item_side

    assert "item popularity: noisy item weight totals" in r.output and "item means: global mean" in r.output
    m = load_model(released.model_dir)
    rel = [x for x in ledger["bounds"]["releases"] if x["release"].startswith("item weight totals C_j")][0]
    w, b = item_side(m.extras["noisy_item_weight"], rel["scale"], m.item_bias)
    p = syn.array("truth/item_weight")[:]
    # drawing weights steeper than the totals (a heavy user rates an item once), in the same order
    assert p[0] / p.sum() > w[0] / w.sum() and np.corrcoef(p, w)[0, 1] > 0.95
    assert syn.attrs["params"]["global_mean"] == pytest.approx(m.global_mean)
    sp = like["spread"]  # the calibrated spread: no factors released by means, so one for every item
    assert "released: budget entry" in sp["source"] and sp["factors"].startswith("the generator's")
    spread = np.sqrt(sp["interaction_scale"] ** 2 + sp["noise"] ** 2 + sp["user_bias_std"] ** 2)
    got = clipped_mean(m.global_mean + syn.array("truth/item_bias")[:].astype(np.float64), spread, 1.0, 5.0, 1.0)
    want = np.sort(np.clip(m.global_mean + b, 1.004, 4.996))
    if sp["item_draw"] == 0:  # the pilot's released means spread as the store's: the released means are the truth's
        np.testing.assert_allclose(np.sort(got), want, atol=1e-4)
    else:  # a draw of the means model's posterior spread added to them (rehearse.item_mean_draw): wider, same centre
        assert sp["item_draw"] > 0 and np.std(got) > np.std(want) and abs(np.median(got) - np.median(want)) < 0.1
    assert like["items"]["popularity"].startswith("noisy item weight totals") and "budget entry" in like["items"][
        "means"]


def test_a_missing_statistic_is_released_charged_and_said_then_reused(store, tmp_path):
    assert _budget_bytes(store.path) is None
    r = _run("generate", "--like", store.path, "--out", tmp_path / "a.zarr", "--shape-epsilon", "0.5")
    assert r.exit_code == 0, r.output
    assert "charged to" in r.output and "epsilon 0.5" in r.output and "released now" in r.output
    entries = json.loads(_run("budget", store.path, "--json").stdout)["entries"]
    assert [(e["method"], e["status"], e["epsilon"]) for e in entries] == [("shape", "complete", 0.5)]
    assert entries[0]["model"] == os.path.abspath(tmp_path / "a.zarr")
    before = _budget_bytes(store.path)
    r = _run("generate", "--like", store.path, "--out", tmp_path / "b.zarr")  # the histogram a.zarr keeps: free
    assert r.exit_code == 0, r.output
    assert "charged" not in r.output and f"budget entry {entries[0]['id']}" in r.output
    assert _budget_bytes(store.path) == before


@pytest.mark.usefixtures("one_pilot")
@pytest.mark.parametrize("shape_epsilon", [0.1, 200.0])
def test_the_spread_weighs_users_by_their_test_ratings_as_far_as_its_noise_allows(released, tmp_path, shape_epsilon,
                                                                                   monkeypatch):
    """The spread's users are weighted by their test ratings up to the cap that :func:`spread_weight_cap` predicts
    from the released shape and the shape epsilon: at the default 0.1 on 800 users every user alike (cap 1: the noise
    is already more than the weighting would remove), at 200 heavily; the record keeps it, the output says it, and
    the released totals are the store's weighted ones, within four of the noise std the record states (at 200 the
    cap, 256, leaves about 0.012: a bound of 0.02 failed about one run in ten); the noise from a fixed seed."""
    import zarr

    import streamdp.workflows.rehearse

    monkeypatch.setattr(streamdp.workflows.rehearse, "_release_rng", lambda: np.random.default_rng(0))

    from streamdp.storage.schema import ATTRS_KEY
    from streamdp.workflows.rehearse import _spread_model, spread_bounds, spread_sums, spread_targets, spread_weight_cap

    r = _run("generate", "--like", released.path, "--out", tmp_path / "a.zarr", "--shape-epsilon", shape_epsilon)
    assert r.exit_code == 0, r.output
    like = zarr.open_group(str(tmp_path / "a.zarr"), mode="r").attrs[ATTRS_KEY]["params"]["like"]
    rec = like["spread_release"]
    shape = like["shape"]
    pub = like["public"]
    bounds = spread_bounds(pub["rating_min"], pub["rating_max"], rec["factors"])
    cap = spread_weight_cap(shape["n_users"]["value"], shape["ratings_per_user"]["value"], pub, shape_epsilon,
                            bounds, rec["factors"])
    assert rec["weight_cap"] == cap and (cap == 1 if shape_epsilon < 1 else cap >= 16)
    assert ("users weighted by their test ratings up to" in r.output) == (cap > 1)
    if cap > 1:
        m = _spread_model(rec["model"], released)
        exact = spread_targets({**rec, "values": spread_sums(released, m["mean"][m["pos"]], None, bounds, cap).tolist(),
                                "noise_std": 0.0})
        got = spread_targets(rec)  # within 4 of its stated noise std (0.012 here) of the store's weighted total
        assert got["total"] == pytest.approx(exact["total"], abs=4 * got["std"]) and got["std"] < 0.02


def test_given_numbers_cost_nothing_and_fixed_parameters_are_refused(store, tmp_path, cli):
    r = _run("generate", "--like", store.path, "--out", tmp_path / "g.zarr", "--users", "500",
             "--ratings-per-user", "9", "--rank", "2")
    assert r.exit_code == 0, r.output
    assert "given (--users): no cost" in r.output and _budget_bytes(store.path) is None
    from streamdp.storage.store import open_store

    g = open_store(str(tmp_path / "g.zarr"))
    assert g.n_users == 500
    # no model released an item side: the generator's power law and biases, said
    assert "item popularity: the generator's power law, exponent 0.9 (no model of an item release)" in r.output
    assert "item_weights" not in g.attrs["params"] and "item_bias" not in g.attrs["params"]
    cli.error(cli.run("generate", "--like", store.path, "--out", tmp_path / "h.zarr", "--items", "5"),
              "--items", "public parameters")
    cli.error(cli.run("generate", "--out", tmp_path / "h.zarr", "--shape-epsilon", "1"), "--shape-epsilon",
              "only with --like")
    assert not (tmp_path / "h.zarr").exists()


@pytest.mark.usefixtures("one_pilot", "no_plot")
def test_rehearsal_sweep_never_charges_the_store_and_says_it_is_synthetic(released, tmp_path):
    r = _run("sweep", released.path, "--rehearse", "--methods", "means", "--epsilons", "1", "--out", tmp_path / "r0")
    assert r.exit_code == 0, r.output  # the first rehearsal releases the rating spread, charged and said
    assert "charged to" in r.output and "rating spread" in r.output
    before = _budget_bytes(released.path)
    out = tmp_path / "reh"
    r = _run("sweep", released.path, "--rehearse", "--methods", "means", "--epsilons", "inf", "--out", out)
    assert r.exit_code == 0, r.output  # its inf point spends the synthetic store's budget: no --yes needed
    assert _budget_bytes(released.path) == before
    lines = r.output.splitlines()
    assert lines[0].startswith("REHEARSAL on synthetic data shaped like " + released.path)
    assert any(line.startswith("REHEARSAL: the curve above is on synthetic data") for line in lines)
    res = json.load(open(out / "results.json"))
    assert res["rehearsal"]["like"] == released.path and res["store"] == str(out / "synthetic.zarr")
    syn_entries = json.loads(_run("budget", out / "synthetic.zarr", "--json").stdout)["entries"]
    assert len(syn_entries) == 1  # the sweep's point went to the synthetic store's own budget


def test_a_rehearsal_of_a_store_without_a_test_split_is_refused_before_anything_is_written(tmp_path, cli):
    from streamdp.storage.generate import generate_store

    s = generate_store(str(tmp_path / "n.zarr"), n_users=200, n_items=30, ratings_per_user=5, seed=1)
    cli.error(cli.run("sweep", s.path, "--rehearse", "--methods", "means", "--epsilons", "1", "--out",
                      tmp_path / "reh"), "needs a test split", "--test-fraction")
    assert not (tmp_path / "reh").exists() and _budget_bytes(s.path) is None


@pytest.mark.usefixtures("no_plot")
def test_sweep_prints_the_baselines_beside_each_point_and_a_table(store, tmp_path):
    r = _run("sweep", store.path, "--methods", "means", "--epsilons", "2", "--out", tmp_path / "sw", "--seed", "1")
    assert r.exit_code == 0, r.output
    point = [line for line in r.output.splitlines() if line.startswith("[1/1] means epsilon 2")][0]
    assert "(damped item mean " in point and "(most popular " in point and "Recall@10" in point
    res = json.load(open(tmp_path / "sw" / "results.json"))
    assert f"(damped item mean {res['baselines']['damped_item_mean']['rmse']:.4f})" in point
    assert "non-private baselines: damped item mean RMSE" in r.output


def test_replot_redraws_without_training_or_touching_a_budget(store, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "sw"
    assert _run("sweep", store.path, "--methods", "means", "--epsilons", "2", "--out", out, "--seed", "1"
                ).exit_code == 0
    png = out / "rmse_vs_epsilon.png"
    os.remove(png)
    before = _budget_bytes(store.path)
    models = sorted(os.listdir(out / "models"))
    r = _run("sweep", "--replot", out / "results.json")
    assert r.exit_code == 0, r.output
    assert png.stat().st_size > 1000 and _budget_bytes(store.path) == before
    assert sorted(os.listdir(out / "models")) == models
    assert "means" in r.output and "non-private baselines" in r.output and f"wrote {png}" in r.output


def test_replot_bad_input_is_one_line(tmp_path, cli):
    (tmp_path / "x.json").write_text("{}")
    cli.error(cli.run("sweep", "--replot", tmp_path / "x.json"), "not the results.json of a finished sweep")
    cli.error(cli.run("sweep", "--replot", tmp_path / "nope.json"), "cannot read it")
    cli.error(cli.run("sweep", "s.zarr", "--replot", tmp_path / "x.json"), "give no STORE")


def test_an_infinite_spend_is_refused_without_a_terminal_unless_yes(store, tmp_path, cli):
    for args in (("train", store.path, "--method", "means", "--epsilon", "inf", "--out", tmp_path / "m"),
                 ("sweep", store.path, "--methods", "means", "--epsilons", "1,inf", "--out", tmp_path / "sw"),
                 ("tune", store.path, "--method", "means", "--epsilon", "inf", "--out", tmp_path / "t")):
        cli.error(cli.run(*args), "makes", "spend infinite for good", "--yes")
    assert _budget_bytes(store.path) is None and not (tmp_path / "m").exists() and not (tmp_path / "sw").exists()
    code, _, err, _ = cli.run("train", store.path, "--method", "means", "--epsilon", "inf", "--out", tmp_path / "m",
                              "--yes")
    assert code == 0, err
    # the spend is infinite already: nothing more to ask
    code, _, err, _ = cli.run("train", store.path, "--method", "means", "--epsilon", "inf", "--out", tmp_path / "m2")
    assert code == 0, err


def test_on_a_terminal_the_run_asks_first(store, tmp_path, monkeypatch):
    import streamdp.cli as cli_module

    monkeypatch.setattr(cli_module, "_stdin_is_tty", lambda: True)
    args = ("train", store.path, "--method", "means", "--epsilon", "inf", "--out", tmp_path / "m")
    r = _run(*args, input="n\n")
    assert r.exit_code == 2 and "this makes the store's spend infinite for good; continue? [y/N]" in r.output
    assert "not confirmed; nothing was released" in r.output and not (tmp_path / "m").exists()
    assert _budget_bytes(store.path) is None
    r = _run(*args, input="y\n")
    assert r.exit_code == 0, r.output and (tmp_path / "m" / "privacy.json").exists()


def _curve(res):
    return {s["epsilon"]: s for s in res["summary"]}


#: The generated stores of the acceptance (2,000 users x 400 items, 15 ratings per user, 20% test, generator seed 11;
#: the rehearsal's synthetic store has seed 0): the generator's defaults, and stores unlike them.
STORES = {"defaults": {}, "strong": {"interaction_scale": 1.5, "noise": 0.3},
          "noisy": {"interaction_scale": 0.6, "noise": 0.9, "user_bias_std": 0.5},
          "tastes": {"taste_clusters": 8, "user_bias_std": 0.3, "interaction_scale": 0.8, "noise": 0.6}}
#: The rehearsal's spread is released at this shape epsilon in the acceptance (its users weighted by up to 32 test
#: ratings; its noise: a standard deviation of 0.006-0.009, 0.01-0.015 with factors, on a mean squared residual of
#: 0.6-1.4, 0.004-0.007 in RMSE; at the default 0.1 every user weighs alike, the noise is 0.05-0.1, and no release at
#: 0.1 from 2,000 users pins the curve to the real sweep's spread).
ACCEPTANCE_SHAPE_EPSILON = 10.0


#: Synthetic seeds over which the acceptance measures the data draw's spread (:func:`rehearsal_gaps`).
DRAW_SEEDS = 4


def rehearsal_gaps(store, tmp_path, method: str, epsilons: str, repeats: int, draws: int = DRAW_SEEDS,
                   reuse: bool = True) -> dict:
    """Issue 31's acceptance: how far the rehearsal's curve lies outside the run-to-run spread of the real sweep.

    The real sweep: ``method`` trained at each epsilon with ``repeats`` training seeds (100, 101, ...; at ``inf``
    too, so that the non-private point has a spread) gives a band ``[min, max]`` per epsilon; those models are the
    store's releases the rehearsal reads (user count, histogram, item side, item factors of the least noisy model
    that has them). The rehearsal: ``sweep --rehearse`` with the same repeats and seeds (its own mean per epsilon;
    one run at ``inf``, as every sweep), its rating spread released at :data:`ACCEPTANCE_SHAPE_EPSILON`.

    The band is widened by twice the standard error of the difference, ``2 sqrt(s^2 / repeats + d^2 + r^2)``:

    * ``s`` the real repeats' standard deviation: the rehearsal's mean is itself a mean of ``repeats`` runs, and the
      min-max of a few runs is a loose estimate of where such a mean lies (with 3 runs the band covers the middle
      half of the runs' law on average);
    * ``d`` the data draw's: the standard deviation of the rehearsal's non-private point over :data:`DRAW_SEEDS`
      synthetic stores drawn from the same released statistics (synthetic seeds 0, 1, ...; the released ones reused,
      free). The real store is one draw too; since the spread is weighted by test ratings (up to 32 a user) the
      synthetic store's non-private point is pinned to the released total and ``d`` is 0.001-0.006 (0.002-0.008
      before, when the heaviest users' part of the test error was left to each draw). At ``inf`` the training seed
      adds nothing, so ``d`` is the draw's alone; the same draw underlies every epsilon's point. ``draws=0``:
      ``d = 0`` (the cheap case: its own stated bound);
    * ``r`` the spread release's own noise, as the rehearsal says it (``about ... in the curve's RMSE``: the noise
      std of the released mean squared residual over twice the root of it): the whole curve moves with that draw,
      and a rehearsal run again on the same store draws it anew (0.004-0.007 here at epsilon 10, by design of
      :func:`streamdp.workflows.rehearse.spread_weight_cap`; 0.0004-0.001 when the spread was a per-user mean, whose bias on a
      store where heavy users spread more was 0.02).

    Returns ``{epsilon: gap}``, ``gap`` the distance outside the widened band (0 inside), and checks that the
    rehearsal charged only its spread, once, and (``reuse``) that a second one charges nothing (a second calibration:
    the cheap guard leaves it to ``test_generate_like_uses_what_was_released_and_leaves_the_budget_byte_for_byte``)."""
    import statistics

    import streamdp
    from streamdp.workflows.rehearse import release_noise_rmse, generate_like
    from streamdp.workflows.sweep import parse_epsilons, rehearse

    eps = parse_epsilons(epsilons)
    real = {}
    for e in eps:
        real[e] = [streamdp.train(store.path, method=method, epsilon=e, allow_nonprivate=True,
                                  out=str(tmp_path / f"r-{e}-{r}"),
                                  seed=100 + r, evaluate=True).summary["test_rmse"] for r in range(repeats)]
    before = _budget_bytes(store.path)
    res = rehearse(store, methods=method, epsilons=epsilons, repeats=repeats, seed=100,
                   shape_epsilon=ACCEPTANCE_SHAPE_EPSILON, out=str(tmp_path / "h"))
    r_noise = release_noise_rmse(res["rehearsal"]["spread"]["targets"])
    assert res["rehearsal"]["spread"]["source"].startswith("released now: Laplace at epsilon 10")
    assert _budget_bytes(store.path) != before  # the spread, released once ...
    reh = _curve(res)
    before = _budget_bytes(store.path)
    if reuse:
        generate_like(store, str(tmp_path / "again.zarr"), show_progress=False)
    d = synthetic_draw_spread(store, tmp_path, method, draws) if draws else 0.0
    assert _budget_bytes(store.path) == before  # ... and reused
    gaps = {}
    for e in eps:
        v = real[e]
        widen = 2.0 * ((statistics.stdev(v) ** 2 / repeats if len(v) > 1 else 0.0) + d ** 2 + r_noise ** 2) ** 0.5
        m = reh["inf" if e == float("inf") else f"{e:g}"]["rmse_mean"]
        gaps[e] = max(min(v) - widen - m, m - max(v) - widen, 0.0)
    return gaps


def synthetic_draw_spread(store, tmp_path, method: str, draws: int = DRAW_SEEDS) -> float:
    """The standard deviation of ``method``'s non-private test RMSE (training seed 100) over :data:`DRAW_SEEDS`
    (``draws``) synthetic stores shaped like ``store`` (synthetic seeds 0, 1, ...; what ``store`` released is reused, free)."""
    import statistics

    import streamdp
    from streamdp.workflows.rehearse import generate_like

    got = []
    for s in range(draws):
        syn = generate_like(store, str(tmp_path / f"draw{s}.zarr"), seed=s, show_progress=False)
        got.append(streamdp.train(syn.path, method=method, epsilon=float("inf"), allow_nonprivate=True,
                                  out=str(tmp_path / f"draw{s}-m"),
                                  seed=100, evaluate=True).summary["test_rmse"])
    return statistics.stdev(got)


def _acceptance(tmp_path, store_name, method, epsilons, repeats, n_users=2000, n_items=400, tolerance=0.0,
                draws=DRAW_SEEDS, reuse=True):
    from streamdp.storage.generate import generate_store

    g = generate_store(str(tmp_path / "g.zarr"), n_users=n_users, n_items=n_items, ratings_per_user=15,
                       test_fraction=0.2, seed=11, show_progress=False, **STORES[store_name])
    gaps = rehearsal_gaps(g, tmp_path, method, epsilons, repeats, draws, reuse)
    assert max(gaps.values()) <= tolerance, gaps


#: The default sweep's epsilons.
DEFAULT_EPSILONS = "0.1,0.5,1,2,5,10,inf"
#: The cheap case's bound on the gap (measured 0-0.010 over 17 runs of 18, each with its own release noise, before the
#: band took the count's noise in; the spread weighted by test ratings is released with a noise of about 0.007 in RMSE
#: here; before the calibration the gap was 0.17).
CHEAP_TOLERANCE = 0.015


@pytest.mark.usefixtures("no_plot")
@pytest.mark.parametrize("release_seed", [1, pytest.param(2, marks=pytest.mark.slow)])  # the second seed: -m slow
def test_rehearsal_curve_lies_near_the_spread_of_the_real_sweep_cheap(tmp_path, monkeypatch, release_seed):
    """The cheap case of the acceptance (:func:`rehearsal_gaps`), a regression guard: ``means`` at epsilon 1, two
    repeats, 600 users x 50 items of strong interactions and little noise; the gap within :data:`CHEAP_TOLERANCE`.
    The release's noise is drawn from a fixed seed (two of them), so that the guard checks the modelling, not one
    draw of OS entropy (over 18 such draws the gap was 0-0.010, once above 0.015: Laplace noise has long tails).
    """
    import streamdp.workflows.rehearse

    monkeypatch.setattr(streamdp.workflows.rehearse, "_release_rng", lambda: np.random.default_rng(release_seed))
    _acceptance(tmp_path, "strong", "means", "1", 2, n_users=600, n_items=50, tolerance=CHEAP_TOLERANCE, draws=0,
                reuse=release_seed != 1)


#: The cases of the acceptance the rehearsal does not meet, with the gaps measured outside the band widened as
#: :func:`rehearsal_gaps` does (docs/choosing-epsilon.md, "How close it comes"). None since the spread is weighted by
#: test ratings and a ``means`` item side's means get their posterior spread back: all eight cases measured inside
#: (one run each; ``tastes`` with ``means``, 0.011-0.020 below before, now 0.004 below to 0.0003 above the real mean).
#: The band is two standard errors wide: a release draw beyond two of its standard deviations can still put one case
#: outside in a run.
OUTSIDE: dict = {}


@pytest.mark.slow
@pytest.mark.parametrize("store_name,method", [
    pytest.param(s, m, marks=[pytest.mark.xfail(reason=OUTSIDE[(s, m)])] if (s, m) in OUTSIDE else [])
    for s in STORES for m in ("means", "als")])
def test_rehearsal_curve_lies_within_the_spread_of_the_real_sweep(tmp_path, monkeypatch, store_name, method):
    """The acceptance at the default sweep's epsilons, three repeats (:func:`rehearsal_gaps`); the cases measured
    outside are expected to fail, not strictly. The spread's release noise is drawn from a fixed seed (it moves a
    gap by up to about 0.01 at inf, and the band is two standard errors wide: with fresh OS entropy in every run,
    one case of the 56 gaps landed outside by 0.0022 in one run of several, ``noisy`` with ``means``)."""
    import streamdp.workflows.rehearse

    monkeypatch.setattr(streamdp.workflows.rehearse, "_release_rng", lambda: np.random.default_rng(1))
    _acceptance(tmp_path, store_name, method, DEFAULT_EPSILONS, 3)


@pytest.mark.usefixtures("one_pilot")
@pytest.mark.parametrize("stale", ["four values", pytest.param("no weight cap", marks=pytest.mark.slow)])
def test_a_spread_record_of_another_shape_is_no_source(released, tmp_path, stale):
    """A synthetic store whose spread record is not this version's (4 values; or no ``weight_cap``: a record of the
    version whose first two sums were over users, not ratings) is skipped: the spread is released anew, charged and
    said, rather than read (or a stack trace)."""
    import zarr

    from streamdp.storage.schema import ATTRS_KEY

    assert _run("generate", "--like", released.path, "--out", tmp_path / "a.zarr").exit_code == 0
    g = zarr.open_group(str(tmp_path / "a.zarr"), mode="r+")
    attrs = dict(g.attrs[ATTRS_KEY])
    like = attrs["params"]["like"]
    rec = like["spread_release"]
    like["spread_release"] = ({**rec, "values": [1.0, 2.0, 3.0, 4.0]} if stale == "four values" else
                              {k: v for k, v in rec.items() if k != "weight_cap"})
    g.attrs[ATTRS_KEY] = attrs
    r = _run("generate", "--like", released.path, "--out", tmp_path / "b.zarr")
    assert r.exit_code == 0, r.output
    assert "charged to" in r.output and "released now: Laplace at epsilon 0.1" in r.output


def test_a_spread_no_pilot_user_can_measure_is_one_line(tmp_path):
    """A thin store (300 users, a private catalogue of a few items at epsilon 2): the pilot's spread sums counted no
    user and their 0 / 0 became ``--noise nan``; now one line naming the options that give the spread."""
    import pandas as pd
    from click.testing import CliRunner

    import streamdp
    from streamdp.cli import main

    rng = np.random.default_rng(0)
    p = 1.0 / np.arange(1, 31) ** 0.7
    rows = [(u, int(i), float(rng.integers(1, 6))) for u in range(300)
            for i in rng.choice(30, size=8, replace=False, p=p / p.sum())]
    st = streamdp.ingest(pd.DataFrame(rows, columns=["user", "item", "rating"]), str(tmp_path / "s.zarr"),
                         rating_range="1,5", test_fraction=0.2, seed=1)
    r = CliRunner().invoke(main, ["train", st.path, "--method", "means", "--epsilon", "2", "--seed", "1", "--out",
                                  str(tmp_path / "m")])
    assert r.exit_code == 0, r.output
    n_items = streamdp.load_model(str(tmp_path / "m")).n_items
    r = CliRunner().invoke(main, ["sweep", st.path, "--rehearse", "--methods", "means", "--epsilons", "2", "--out",
                                  str(tmp_path / "r"), "--users", "200", "--ratings-per-user", "8"])
    assert n_items < 10  # seeded: the selection keeps the few most rated items (6 when measured)
    assert r.exit_code == 2 and "nan" not in r.output, r.output
    assert "cannot match the rating spread" in r.output and "--noise" in r.output


def test_an_implicit_store_rehearses_as_counts_shaped_by_a_released_ials_model(tmp_path):
    """``generate --like`` an implicit store (interaction logs): an implicit synthetic store (counts, no rating range
    nor spread to match), its users, activity and popularity from what a released ials model carries (its user count,
    noisy item counts: post-processing; the activity given, as a default ials run releases no histogram of pairs per
    user), the store's budget left byte for byte."""
    import streamdp
    from streamdp.storage.generate import generate_store
    from streamdp.workflows.rehearse import generate_like

    st = generate_store(str(tmp_path / "i.zarr"), n_users=600, n_items=60, ratings_per_user=12, rank=3, seed=4,
                        test_fraction=0.2, implicit=True, taste_clusters=4, show_progress=False)
    streamdp.train(st.path, method="ials", epsilon=2.0, out=str(tmp_path / "m"), seed=1, evaluate=False)
    before, said = _budget_bytes(st.path), []
    syn = generate_like(st, str(tmp_path / "syn.zarr"), ratings_per_user=12, echo=said.append, show_progress=False)
    like = syn.attrs["params"]["like"]
    assert syn.implicit and syn.n_items == 60 and _budget_bytes(st.path) == before
    assert like["shape"]["n_users"]["source"].startswith("released: budget entry")
    assert like["items"]["popularity"].startswith("noisy item counts") and "ials model" in like["items"]["popularity"]
    assert like["spread"]["source"].startswith("none: an implicit store") and "counts (an implicit store)" in said[0]
