"""``streamdp sweep``: the spend is computed first and charged, results and plot are written."""

import csv
import json

import pytest
from click.testing import CliRunner

from streamdp.cli import main


@pytest.fixture()
def store(tmp_path):
    from streamdp.storage.generate import generate_store

    return generate_store(str(tmp_path / "s.zarr"), n_users=1500, n_items=120, ratings_per_user=15, rank=3, seed=2,
                          test_fraction=0.2, block_users=600)


def test_dry_run_prints_the_spend_and_releases_nothing(store, tmp_path):
    r = CliRunner().invoke(main, ["sweep", store.path, "--methods", "als,oja", "--epsilons", "1,2", "--out",
                                  str(tmp_path / "sw"), "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "the sweep releases 4 private model(s)" in r.output and "basic composition 6" in r.output
    assert not (tmp_path / "sw").exists()
    budget = json.loads(CliRunner().invoke(main, ["budget", store.path, "--json"]).stdout)
    assert budget["entries"] == []


def test_sweep_writes_results_plot_and_charges_every_point(store, tmp_path):
    out = tmp_path / "sw"
    r = CliRunner().invoke(main, ["sweep", store.path, "--methods", "means,als", "--epsilons", "1,inf",
                                  "--repeats", "2", "--out", str(out), "--seed", "3", "--yes", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert len(rows) == 2 * (2 + 1) == len(res["rows"])  # inf runs once: no noise to repeat
    assert {(s["method"], s["epsilon"], s["n"]) for s in res["summary"]} == {
        ("means", "1", 2), ("means", "inf", 1), ("als", "1", 2), ("als", "inf", 1)}
    assert res["baselines"]["item_mean"]["rmse"] > 0 and (out / "rmse_vs_epsilon.png").stat().st_size > 1000
    entries = json.loads(CliRunner().invoke(main, ["budget", store.path, "--json"]).stdout)["entries"]
    assert len(entries) == 6 and all(e["status"] == "complete" for e in entries)
    # the spend printed up front is what the budget now holds for the private points
    assert res["spend"]["sweep"]["n_releases"] == 4
    # a column of the table and a second panel of the plot: NDCG@10 beside the most-popular lists
    assert all(float(row["ndcg_at_k"]) > 0 and float(row["recall_at_k"]) > 0 for row in rows)
    assert all(s["ndcg_mean"] > 0 for s in res["summary"])
    assert set(res["ranking_baselines"]) >= {"popularity", "k"}


def test_sweep_plot_has_an_ndcg_panel(tmp_path):
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    from streamdp.workflows.sweep import plot

    summary = [{"method": "als", "epsilon": "1", "rmse_mean": 1.0, "rmse_std": 0.0},
               {"method": "als", "epsilon": "2", "rmse_mean": 0.9, "rmse_std": 0.0}]
    res = {"methods": ["als"], "summary": summary, "store": "s.zarr", "delta": 1e-6, "repeats": 1,
           "baselines": {"item_mean": {"rmse": 1.0}}}
    one = imread(plot(res, str(tmp_path / "a.png")))
    for s, v in zip(summary, (0.1, 0.2)):
        s.update(ndcg_mean=v, ndcg_std=0.0)
    res["ranking_baselines"] = {"k": 10, "popularity": {"ndcg": 0.15}}
    two = imread(plot(res, str(tmp_path / "b.png")))
    assert two.shape[0] > 1.8 * one.shape[0] and two.shape[1] == one.shape[1]


def test_sweep_refuses_to_exceed_the_budget_before_running(store, tmp_path):
    CliRunner().invoke(main, ["budget", store.path, "--set", "1.5,1e-5"])
    r = CliRunner().invoke(main, ["sweep", store.path, "--methods", "als", "--epsilons", "1,2", "--out",
                                  str(tmp_path / "sw")])
    assert r.exit_code == 3 and "past its budget" in r.output
    assert not (tmp_path / "sw").exists()


def test_bad_sweep_parameters(store, tmp_path):
    for args, msg in ((["--epsilons", "0,1"], "--epsilons"), (["--methods", "nope"], "unknown method"),
                      (["--repeats", "0"], "--repeats")):
        r = CliRunner().invoke(main, ["sweep", store.path, "--out", str(tmp_path / "sw"), *args])
        assert r.exit_code == 2 and msg in r.output, r.output


@pytest.fixture(scope="module")
def implicit_store(tmp_path_factory):
    from streamdp.storage.generate import generate_store

    return generate_store(str(tmp_path_factory.mktemp("sweep_ials") / "imp.zarr"), n_users=1000, n_items=60,
                          ratings_per_user=12, rank=3, seed=4, test_fraction=0.2, implicit=True, taste_clusters=4,
                          show_progress=False)


def test_sweep_of_ials_rows_carry_recall_and_no_rmse(implicit_store, tmp_path):
    """A list method's points are its Recall@10 and NDCG@10 (no test RMSE: left empty, not made up); the plot has
    the Recall and NDCG panels only."""
    out = tmp_path / "sw"
    r = CliRunner().invoke(main, ["sweep", implicit_store.path, "--methods", "ials", "--epsilons", "1,10",
                                  "--out", str(out), "--seed", "1", "--workers", "1", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert [row["epsilon"] for row in rows] == ["1", "10"]
    assert all(row["test_rmse"] == "" and row["test_mae"] == "" for row in rows)
    assert all(0 < float(row["recall_at_k"]) <= 1 and 0 < float(row["ndcg_at_k"]) <= 1 for row in rows)
    assert all("rmse_mean" not in s and s["recall_mean"] > 0 for s in res["summary"])
    assert {"popularity", "private_popularity", "k"} <= set(res["ranking_baselines"])
    assert (out / "rmse_vs_epsilon.png").stat().st_size > 1000
    from streamdp.workflows.sweep import format_table

    assert "- (lists only)" in format_table(res)


def test_sweep_plot_of_list_methods_has_recall_and_ndcg_panels_only(tmp_path):
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    from streamdp.workflows.sweep import plot

    summary = [{"method": "ials", "epsilon": e, "n": 1, "recall_mean": v, "recall_std": 0.0, "ndcg_mean": v,
                "ndcg_std": 0.0} for e, v in (("1", 0.1), ("10", 0.2))]
    res = {"methods": ["ials"], "summary": summary, "store": "s.zarr", "delta": 1e-6, "repeats": 1,
           "ranking_baselines": {"k": 10, "popularity": {"recall": 0.12, "ndcg": 0.1}}}
    two = imread(plot(res, str(tmp_path / "a.png")))
    summary += [{"method": "als", "epsilon": "1", "n": 1, "rmse_mean": 1.0, "rmse_std": 0.0}]
    res["methods"].append("als")
    three = imread(plot(res, str(tmp_path / "b.png")))
    assert three.shape[0] > 1.4 * two.shape[0]


def _budget(path) -> bytes | None:
    import os

    p = os.path.join(str(path), "privacy_budget.json")
    return open(p, "rb").read() if os.path.exists(p) else None


@pytest.mark.parametrize("kind", ["implicit", pytest.param("ratings", marks=pytest.mark.slow)])
def test_a_list_rehearsal_sweeps_recall_and_ndcg_on_a_synthetic_store(implicit_store, tmp_path, monkeypatch, kind):
    """``sweep --rehearse --methods ials``: every epsilon's row carries Recall@10 and NDCG@10 (no RMSE), the results
    and the table say it is a rehearsal, with the synthetic tastes it assumed; an implicit STORE gives an implicit
    synthetic store; STORE's budget is left byte for byte (--users and --ratings-per-user given: nothing released).
    The plot is left out (its drawing is test_sweep_of_ials_rows_carry_recall_and_no_rmse's)."""
    import streamdp.workflows.sweep
    from streamdp.storage.generate import generate_store
    from streamdp.storage.store import open_store
    from streamdp.workflows.sweep import format_table

    monkeypatch.setattr(streamdp.workflows.sweep, "plot", lambda result, path: None)
    st = implicit_store if kind == "implicit" else generate_store(
        str(tmp_path / "s.zarr"), n_users=600, n_items=60, ratings_per_user=12, rank=3, seed=4, test_fraction=0.2,
        show_progress=False)
    before, out = _budget(st.path), tmp_path / "reh"
    r = CliRunner().invoke(main, ["sweep", st.path, "--rehearse", "--methods", "ials", "--epsilons", "1,10",
                                  "--users", "600", "--ratings-per-user", "12", "--out", str(out), "--seed", "1",
                                  "--workers", "1", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert [row["epsilon"] for row in res["rows"]] == ["1", "10"]
    assert all(row["test_rmse"] is None and 0 < row["recall_at_k"] <= 1 and 0 < row["ndcg_at_k"] <= 1
               for row in res["rows"])
    assert res["rehearsal"]["like"] == st.path and res["rehearsal"]["tastes"]["taste_clusters"] > 0
    assert {"popularity", "private_popularity"} <= set(res["ranking_baselines"])
    table = format_table(res)
    assert table.startswith("REHEARSAL on synthetic data shaped like") and "synthetic tastes" in table
    assert open_store(str(out / "synthetic.zarr")).implicit == (kind == "implicit")
    assert _budget(st.path) == before


def test_the_list_rehearsals_refusal_is_gone():
    """Its one-line refusal ("a rehearsal of a list method is not built yet") is neither in the code nor in the
    sweep's help."""
    import inspect

    import streamdp.workflows.sweep

    assert "not built yet" not in inspect.getsource(streamdp.workflows.sweep)
    help_text = " ".join(CliRunner().invoke(main, ["sweep", "--help"]).output.split())
    assert "does not take" not in help_text and "not built" not in help_text
    assert "--rehearse takes them too" in help_text
