"""Smoke test of ``bench/ranking.py`` on a tiny generated store, and EASE's closed form against a direct solve."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import scipy.sparse as sp

from bench import ranking


def test_ease_is_the_constrained_least_squares_solution():
    rng = np.random.default_rng(0)
    X = sp.csr_matrix((rng.random((40, 6)) < 0.4).astype(float))
    lam = 3.0
    B = ranking.ease_scores(X, lam)
    D = X.toarray()
    for j in range(6):  # column j: min ||D_j - D_{-j} b||^2 + lam ||b||^2 with b_j = 0
        rest = [i for i in range(6) if i != j]
        A = D[:, rest]
        b = np.linalg.solve(A.T @ A + lam * np.eye(5), A.T @ D[:, j])
        np.testing.assert_allclose(B[rest, j], b, rtol=1e-9, atol=1e-12)
        assert B[j, j] == 0


@pytest.mark.slow  # a bench smoke run (half a minute); the EASE solve above is its default-run guard
def test_bench_ranking_smoke(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ranking, "GENERATED", {"tiny": dict(users=600, items=60, ratings_per_user=12)})
    out = tmp_path / "r.json"
    assert ranking.main(["--stores", "tiny", "--k", "5,10", "--quick", "--workers", "1", "--ease-lambdas", "10,100",
                         "--epsilons", "1,inf", "--tune-epsilons", "10", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| list | Recall@5 | NDCG@5 | Recall@10 | NDCG@10 | note |" in text
    rows = json.loads(out.read_text())["results"][0]["rows"]
    for label in ("most popular (exact counts, non-private)", "most popular (default model's released counts)",
                  "default (als eps 1): list score", "default (als eps 1): predicted rating (old lists)",
                  "EASE (non-private, best lambda)"):
        assert 0 <= rows[label]["5"]["recall"] <= rows[label]["10"]["recall"] <= 1, label
    assert rows["EASE (non-private, best lambda)"]["setting"]["lambda"] in (10, 100)
    tuned = rows["ials tune eps 10"]  # streamdp tune --method ials --epsilon 10: its lists, its choice
    assert 0 <= tuned["10"]["recall"] <= 1 and "rank" in tuned["chosen"] and "released_chart" in tuned
    assert list(rows).index("ials eps inf") < list(rows).index("ials tune eps 10")
    als = rows["implicit ALS (non-private, best of grid)"]
    if importlib.util.find_spec("implicit") is None:
        assert "skipped" in als
    else:
        assert als["setting"]["factors"] == 64 and 0 <= als["10"]["recall"] <= 1


#: Issue 42's shapes at tiny sizes (the same options otherwise): the names are accepted and the stores build.
TINY_SHAPES = {name: {**kw, "users": 120, "items": 40, "ratings_per_user": min(kw["ratings_per_user"], 8)}
               for name, kw in ranking.SHAPES.items()}


def test_issue42_shapes_are_accepted_and_build(tmp_path, monkeypatch):
    assert set(ranking.SHAPES) == {"product-72k", "log-6k", "thin-600", "repeat-log", "million"}
    assert ranking.SHAPES["product-72k"]["users"] == 72_000 and ranking.SHAPES["thin-600"]["items"] == 10_000
    monkeypatch.setattr(ranking, "SHAPES", TINY_SHAPES)
    built = dict(ranking.open_stores(list(TINY_SHAPES), str(tmp_path), big=False))
    assert list(built) == list(TINY_SHAPES)
    for name, st in built.items():
        assert st.n_users == 120 and st.n_ratings > 0, name
        assert st.implicit == (name in ("log-6k", "repeat-log")), name
    train, test = ranking.splits(built["log-6k"])  # a log of the generated pairs: every count 1, both splits
    assert set(np.unique(train.data)) == {1.0} and test.nnz > 0
    assert built["repeat-log"].n_items == 40 and ranking.splits(built["repeat-log"])[0].data.max() > 1  # repeats
    with pytest.raises(SystemExit, match="unknown store 'nope'.*product-72k, log-6k, thin-600, repeat-log, million"):
        list(ranking.open_stores(["nope"], str(tmp_path), big=False))


def test_the_implicit_grid_option():
    assert len(ranking.parse_grid("issue42")) == 27 and ranking.parse_grid("default") is None
    assert {(g["factors"], g["alpha"], g["regularization"]) for g in ranking.parse_grid("issue42")} == {
        (f, a, r) for f in (16, 32, 64) for a in (1, 10, 40) for r in (0.01, 0.1, 1)}
    assert ranking.parse_grid("factors=16,64;alpha=10") == [dict(factors=16, regularization=0.01, alpha=10.0),
                                                            dict(factors=64, regularization=0.01, alpha=10.0)]
    with pytest.raises(SystemExit, match="--implicit-grid"):
        ranking.parse_grid("rank=4")


def test_a_tie_wider_than_the_margin_breaks_by_the_tiekey():
    """Every item ties (the chart's counts on a heavy user's unseen tail): the top k is the k smallest tie keys, not
    the partition's arbitrary picks (before: only the partition's first 37 were candidates, and item 99, first by its
    key, was not among them)."""
    n = 100
    train = sp.csr_matrix((np.ones(1), ([0], [50])), shape=(1, n))
    test = sp.csr_matrix((np.full(1, 5.0), ([0], [99])), shape=(1, n))
    tiekey = np.arange(n)[::-1].copy()  # item 99 first
    r = ranking.metrics_of_scores(lambda rows: np.ones((len(rows), n)), train, test, tiekey, 4.0, [5])
    assert r[5]["recall"] == 1.0 and r[5]["ndcg"] == 1.0


def test_the_tiekey_of_a_catalogue_model_is_evaluates_padded_order():
    """A model of a private catalogue (items 5 and 2 of a store of 2, 7, 5, 3): ``evaluate`` scores it padded with
    the store's other items in the store's order (``Model.padded_to``), so the exact chart's ties break by 5, 2, 7,
    3 (before: the items outside the model all had key -1, and the log's chart check failed at k=20 by one swap)."""
    from streamdp.serving.model import Model

    m = Model(path="m", item_factors=np.zeros((2, 1)), item_bias=np.zeros(2), item_ids=np.array([5, 2]),
              global_mean=0.0, info={}, ledger=None)
    st = type("St", (), {"item_ids": lambda self: np.array([2, 7, 5, 3])})()
    assert ranking.tiekey_of(st, m).tolist() == [1, 2, 0, 3]
    assert ranking.tiekey_of(st).tolist() == [0, 3, 2, 1]  # no model: ascending original id
