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
                         "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| list | Recall@5 | NDCG@5 | Recall@10 | NDCG@10 | note |" in text
    rows = json.loads(out.read_text())["results"][0]["rows"]
    for label in ("most popular (exact counts, non-private)", "most popular (default model's released counts)",
                  "default (als eps 1): list score", "default (als eps 1): predicted rating (old lists)",
                  "EASE (non-private, best lambda)"):
        assert 0 <= rows[label]["5"]["recall"] <= rows[label]["10"]["recall"] <= 1, label
    assert rows["EASE (non-private, best lambda)"]["setting"]["lambda"] in (10, 100)
    als = rows["implicit ALS (non-private, best of grid)"]
    if importlib.util.find_spec("implicit") is None:
        assert "skipped" in als
    else:
        assert als["setting"]["factors"] == 64 and 0 <= als["10"]["recall"] <= 1
