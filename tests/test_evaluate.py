"""evaluate: metrics against a direct computation, baselines, train --json, budget refusal."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from streamdp.cli import main
from streamdp.serving.evaluate import evaluate_model
from streamdp.serving.local import predict_block, solve_block
from streamdp.serving.model import load_model


def _direct(model, store, ridge):
    se = ae = n = 0.0
    S = np.zeros(store.n_items)
    C = np.zeros(store.n_items)
    for b in range(store.n_blocks):
        tr = store.read_block(b)
        S += np.bincount(tr.items, weights=tr.ratings, minlength=store.n_items)
        C += np.bincount(tr.items, minlength=store.n_items)
    gm = S.sum() / C.sum()
    im = np.where(C > 0, S / np.maximum(C, 1), gm)
    e_gm = e_im = 0.0
    for b in range(store.n_blocks):
        tr, te = store.read_block(b), store.read_block(b, "test")
        p = predict_block(model, solve_block(model, tr.indptr, tr.items, tr.ratings, ridge), te.indptr, te.items)
        se += ((p - te.ratings) ** 2).sum()
        ae += np.abs(p - te.ratings).sum()
        n += te.nnz
        e_gm += ((gm - te.ratings) ** 2).sum()
        e_im += ((im[te.items] - te.ratings) ** 2).sum()
    return math.sqrt(se / n), ae / n, n, math.sqrt(e_gm / n), math.sqrt(e_im / n)


def test_train_json_and_evaluate(small_store, tmp_path):
    runner = CliRunner()
    out = str(tmp_path / "m")
    res = runner.invoke(main, ["train", small_store.path, "--epsilon", "2", "--rank", "4", "--out", out, "--seed",
                               "1", "--json", "--workers", "2"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)  # stderr carries the warnings (seeded run)
    for key in ("method", "epsilon", "delta", "rank", "guarantee", "train_seconds", "test_rmse"):
        assert key in d, key
    assert d["method"] == "als" and d["guarantee"] == "user-level (epsilon, delta)-DP" and d["epsilon_spent"] <= 2
    ev = evaluate_model(out, small_store.path)
    m = load_model(out)
    rmse, mae, n, gm, im = _direct(m, small_store, m.info["ridge"])
    assert ev["n_ratings"] == n == small_store.n_test
    assert math.isclose(ev["rmse"], rmse, rel_tol=1e-9) and math.isclose(ev["mae"], mae, rel_tol=1e-9)
    assert math.isclose(ev["rmse"], d["test_rmse"], rel_tol=1e-9)
    assert math.isclose(ev["baselines"]["global_mean"]["rmse"], gm, rel_tol=1e-9)
    assert math.isclose(ev["baselines"]["item_mean"]["rmse"], im, rel_tol=1e-9)
    res = runner.invoke(main, ["evaluate", out, small_store.path, "--json"])
    assert res.exit_code == 0 and {"rmse", "mae", "n_ratings"} <= set(json.loads(res.output))
    res = runner.invoke(main, ["evaluate", out, small_store.path])
    assert "baseline item-mean (non-private)" in res.output


def test_nonprivate_beats_item_mean(small_store, tmp_path):
    out = str(tmp_path / "np")
    res = CliRunner().invoke(main, ["train", small_store.path, "--epsilon", "inf", "--yes", "--rank", "4", "--out", out])
    assert res.exit_code == 0, res.output
    ev = evaluate_model(out, small_store)
    assert ev["guarantee"] == "non-private"
    assert ev["rmse"] < 0.85 * ev["baselines"]["item_mean"]["rmse"]


def test_budget_refusal_exit_3(tmp_path):
    from streamdp.privacy.budget import StoreBudget
    from streamdp.storage.generate import generate_store

    st = generate_store(str(tmp_path / "b.zarr"), n_users=500, n_items=50, ratings_per_user=10, rank=2, seed=1)
    StoreBudget(st.path).set(1.0, 1e-5)
    runner = CliRunner()
    args = ["train", st.path, "--epsilon", "2", "--rank", "2", "--out", str(tmp_path / "m"), "--delta", "1e-6"]
    res = runner.invoke(main, args)
    assert res.exit_code == 3 and "budget" in res.output and not (tmp_path / "m").exists()
    res = runner.invoke(main, args + ["--over-budget"])
    assert res.exit_code == 0, res.output
    entries = StoreBudget(st.path).show()["entries"]
    assert [e["status"] for e in entries] == ["complete"] and entries[0]["over_budget"]


def test_existing_out_refused(small_store, tmp_path):
    (tmp_path / "m").mkdir()
    res = CliRunner().invoke(main, ["train", small_store.path, "--epsilon", "1", "--out", str(tmp_path / "m")])
    assert res.exit_code == 2 and "already exists" in res.output


def test_released_items_are_in_id_order_not_popularity_order(tmp_path):
    """A store numbers items by exact popularity; the model lists them by id (the ranking is not released),
    and evaluation maps them back by id: the same RMSE as the arrays in the store's order."""
    import csv

    from streamdp.serving.evaluate import evaluate_model
    from streamdp.serving.model import load_model
    from streamdp.storage.ingest import ingest
    from streamdp.workflows.training import train

    rng = np.random.default_rng(0)
    path = tmp_path / "r.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["user", "item", "rating"])
        for u in range(300):
            for i in rng.choice(60, size=12, replace=False, p=np.arange(60, 0, -1) / 1830 if u % 2 else None):
                w.writerow([u, 1000 - 7 * int(i), int(rng.integers(1, 6))])
    st = ingest([str(path)], str(tmp_path / "s.zarr"), test_fraction=0.2, seed=0, rating_range=(1, 5))
    assert not np.all(np.diff(st.item_ids()) > 0)  # the store's order is the popularity order
    out = str(tmp_path / "m")
    train(st, method="als", out=out, epsilon=float("inf"), delta=1e-6, rank=2, seed=0, iters=2)
    m = load_model(out)
    assert np.all(np.diff(m.item_ids) > 0)
    store_order = m.in_order_of(st.item_ids())
    assert np.array_equal(store_order.item_ids, st.item_ids())
    ev = evaluate_model(m, st)
    assert ev["rmse"] == pytest.approx(evaluate_model(store_order, st)["rmse"], rel=1e-12)


def test_train_prints_baselines_and_says_plainly_when_no_better(small_store, tmp_path):
    good = CliRunner().invoke(main, ["train", small_store.path, "--method", "als", "--epsilon", "inf", "--yes", "--rank", "4",
                                     "--out", str(tmp_path / "good")])
    assert good.exit_code == 0, good.output
    assert "non-private baselines: damped item mean" in good.output and "verdict: better than" in good.output
    assert "user+item bias" in good.output
    assert "delta" not in good.output.splitlines()[0]  # a non-private model has no delta
    bad = CliRunner().invoke(main, ["train", small_store.path, "--method", "means", "--epsilon", "0.02", "--seed", "1",
                                    "--out", str(tmp_path / "bad"), "--json"])
    assert bad.exit_code == 0, bad.output
    d = json.loads(bad.stdout.strip().splitlines()[-1])
    assert d["verdict"]["better"] is False and d["verdict"]["baseline"] in ("item_mean", "damped_item_mean")
    assert set(d["baselines"]) == {"global_mean", "item_mean", "damped_item_mean", "user_item_bias"}
    assert "seeded run" in bad.stderr  # the warnings that qualify the guarantee go to stderr
    text = CliRunner().invoke(main, ["evaluate", str(tmp_path / "bad"), small_store.path]).output
    assert "verdict: NO BETTER than the non-private " in text and "item-mean baseline" in text


def test_the_store_is_recognised_through_a_url(tmp_path):
    """A model names its store by a keyed fingerprint whose key stays in the store: read through an fsspec URL
    as well as from the local path, the same store matches (was: refused as another store)."""
    from streamdp.storage.generate import generate_store
    from streamdp.storage.store import open_store

    st = generate_store(str(tmp_path / "s.zarr"), n_users=400, n_items=40, ratings_per_user=15, rank=2, seed=1,
                        test_fraction=0.2)
    r = CliRunner().invoke(main, ["train", st.path, "--epsilon", "1", "--out", str(tmp_path / "m")])
    assert r.exit_code == 0, r.output
    ev = evaluate_model(str(tmp_path / "m"), open_store(f"file://{st.path}"), baselines=False)
    assert ev["store_matches_model"] is True


def test_evaluate_on_another_store_is_an_error_unless_allowed(tmp_path):
    """A store other than the model's (another checksum, e.g. a re-split of the same ratings, whose test
    ratings the model may have been trained on): one line, exit 2, nothing on stdout; with
    --allow-other-store it runs and says store_matches_model: false."""
    from streamdp.errors import StoreError
    from streamdp.storage.generate import generate_store

    a, b = (generate_store(str(tmp_path / f"{n}.zarr"), n_users=400, n_items=40, ratings_per_user=15, rank=2,
                           seed=seed, test_fraction=0.2) for n, seed in (("a", 1), ("b", 2)))
    assert a.n_items == b.n_items and a.checksum != b.checksum
    out = str(tmp_path / "m")
    runner = CliRunner()
    res = runner.invoke(main, ["train", a.path, "--method", "means", "--epsilon", "inf", "--yes", "--out", out])
    assert res.exit_code == 0, res.output
    for extra in ([], ["--json"]):
        res = runner.invoke(main, ["evaluate", out, b.path] + extra)
        assert res.exit_code == 2 and res.stdout == "", res.output
        assert res.stderr.startswith(f"streamdp: error: {b.path}: not the store the model {out} was trained on")
        assert res.stderr.count("\n") == 1 and "--allow-other-store" in res.stderr and "optimistic" in res.stderr
    res = runner.invoke(main, ["evaluate", out, b.path, "--allow-other-store", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["store_matches_model"] is False
    res = runner.invoke(main, ["evaluate", out, b.path, "--allow-other-store"])
    assert res.exit_code == 0 and "store_matches_model: false" in res.stdout
    res = runner.invoke(main, ["evaluate", out, a.path, "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["store_matches_model"] is True
    with pytest.raises(StoreError, match="not the store the model"):
        evaluate_model(out, b)
    assert evaluate_model(out, b, allow_other_store=True)["store_matches_model"] is False


def test_user_biases_are_the_numpy_forms_bits():
    """The compiled per-user mean residual is the weighted bincount it replaced, bit for bit (float32 ratings, users
    without ratings, long rows)."""
    from streamdp.serving.evaluate import USER_DAMPING, user_biases

    rng = np.random.default_rng(7)
    n = rng.integers(0, 400, size=300)
    n[:5] = 0
    indptr = np.r_[0, np.cumsum(n)].astype(np.int64)
    items = rng.integers(0, 50, size=indptr[-1]).astype(np.int32)
    ratings = rng.uniform(-10, 10, size=indptr[-1]).astype(np.float32)
    damped = rng.normal(size=50) * 3
    res = np.asarray(ratings, np.float64) - damped[items]
    want = np.bincount(np.repeat(np.arange(len(n)), n), weights=res, minlength=len(n)) / (n + USER_DAMPING)
    got = user_biases(indptr, items, ratings, 0.0, damped)
    assert got.dtype == np.float64 and np.array_equal(got, want)
