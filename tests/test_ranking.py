"""Ranking metrics: each against a hand computation and an independent pure-Python implementation;
the top-N kernels against a NumPy sort (ties included); evaluate's ranking end to end against a dense
in-memory computation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as hs

from streamdp.cli import main
from streamdp.kernels.topk import SUMS, ranking_sums, topn_blocked, topn_by_order, topn_reference, topn_scores
from streamdp.serving.evaluate import evaluate_model
from streamdp.serving.local import local_design, solve_block
from streamdp.serving.model import load_model
from streamdp.serving.ranking import default_threshold, format_ranking, popularity_order


def _sums(lists, test, threshold, pop):
    """Run the kernel on ``test`` = per user a dict {item: rating}."""
    ip = np.cumsum([0] + [len(t) for t in test]).astype(np.int64)
    it = np.array([j for t in test for j in t], np.int32)
    r = np.array([x for t in test for x in t.values()], np.float64)
    sums, cov = np.zeros(len(SUMS)), np.zeros(len(pop))
    ranking_sums(np.asarray(lists, np.int32), ip, it, r, float(threshold), np.asarray(pop, np.float64),
                 np.ones(len(test), np.uint8), sums, cov)
    return dict(zip(SUMS, sums)), cov


def test_metrics_by_hand():
    # k = 3, the list (3, 1, 2); relevant: items 1 and 4 (rated >= 4); one hit, at rank 2
    s, cov = _sums([[3, 1, 2]], [{1: 5.0, 2: 2.0, 4: 4.0}], 4.0, [1, 2, 3, 4, 5])
    assert s["users"] == 1
    assert s["precision"] == pytest.approx(1 / 3)
    assert s["recall"] == pytest.approx(1 / 2)
    assert s["ndcg"] == pytest.approx((1 / math.log2(3)) / (1 + 1 / math.log2(3)))
    assert s["map"] == pytest.approx((1 / 2) / 2)  # P@2 = 1/2 at the hit, over min(R, k) = 2
    assert s["popularity"] == pytest.approx((4 + 2 + 3) / 3)
    assert cov.tolist() == [0, 1, 1, 1, 0]
    # a user without a relevant held-out item is not evaluated; hits at ranks 1 and 3 of a padded list
    s, _ = _sums([[0, 9, 9], [2, 0, 1]], [{0: 1.0}, {2: 5.0, 1: 5.0, 3: 5.0, 4: 5.0}], 4.5, np.ones(5))
    assert s["users"] == 1
    assert s["precision"] == pytest.approx(2 / 3) and s["recall"] == pytest.approx(2 / 4)
    assert s["map"] == pytest.approx((1 + 2 / 3) / 3)
    assert s["ndcg"] == pytest.approx((1 + 1 / 2) / (1 + 1 / math.log2(3) + 1 / 2))


def _python_metrics(lists, test, threshold, pop):
    """Independent implementation: sets and the textbook formulas, one user at a time."""
    out = {k: 0.0 for k in SUMS}
    for lst, t in zip(lists, test):
        rel = {j for j, r in t.items() if r >= threshold}
        if not rel:
            continue
        out["relevant_users"] += 1
        k = len(lst)
        shown = [j for j in lst if j >= 0]
        hit = [j in rel for j in shown]
        out["users"] += 1
        dcg = sum(1 / math.log2(i + 2) for i, h in enumerate(hit) if h)
        per = {"precision": sum(hit) / k, "recall": sum(hit) / len(rel),
               "ndcg": dcg / sum(1 / math.log2(i + 2) for i in range(min(len(rel), k))),
               "map": sum(sum(hit[:i + 1]) / (i + 1) for i, h in enumerate(hit) if h) / min(len(rel), k)}
        for name, v in per.items():
            out[name] += v
            out[name + "_sq"] += v * v
        out["popularity"] += sum(pop[j] for j in shown) / len(shown) if shown else 0.0
    return out


@settings(max_examples=60, deadline=None)
@given(hs.integers(0, 10_000), hs.integers(1, 6))
def test_metrics_match_a_python_implementation(seed, k):
    rng = np.random.default_rng(seed)
    n_items, n_users = 12, 9
    pop = rng.integers(0, 50, n_items).astype(float)
    lists, test = [], []
    for _ in range(n_users):
        lst = rng.permutation(n_items)[:k].tolist()
        cut = rng.integers(0, k + 1)  # padded lists, as for a user with few candidates
        lists.append(lst[:cut] + [-1] * (k - cut))
        items = rng.choice(n_items, size=rng.integers(0, 6), replace=False)
        test.append({int(j): float(rng.integers(1, 6)) for j in items})
    got, _ = _sums(lists, test, 4.0, pop)
    want = _python_metrics(lists, test, 4.0, pop)
    for key in SUMS:
        assert got[key] == pytest.approx(want[key], abs=1e-12), key


@settings(max_examples=60, deadline=None)
@given(hs.integers(0, 10_000), hs.integers(1, 8), hs.booleans())
def test_topn_kernels_match_a_numpy_sort_with_ties(seed, n, integer_scores):
    rng = np.random.default_rng(seed)
    n_users, n_items, k = 6, 10, 3
    U = rng.integers(-1, 2, (n_users, k)).astype(float) if integer_scores else rng.normal(size=(n_users, k))
    Q = rng.integers(-1, 2, (n_items, k)).astype(float) if integer_scores else rng.normal(size=(n_items, k))
    bias = rng.integers(0, 2, n_items).astype(float)
    tiekey = rng.permutation(n_items).astype(np.int64)
    seen = [rng.choice(n_items, size=rng.integers(0, n_items + 1), replace=False) for _ in range(n_users)]
    ip = np.cumsum([0] + [len(s) for s in seen]).astype(np.int64)
    it = np.concatenate(seen).astype(np.int32)
    want = np.ones(n_users, np.uint8)
    want[0] = 0
    lists, scores = np.empty((n_users, n), np.int32), np.empty((n_users, n))
    topn_scores(ip, it, want, U, Q, bias, 3.0, tiekey, lists, scores)
    full = 3.0 + bias + U @ Q.T
    ref = topn_reference(seen, full, tiekey, n)
    ref[0] = -1
    assert lists.tolist() == ref.tolist()
    ok = lists >= 0
    np.testing.assert_allclose(scores[ok], np.take_along_axis(full, np.maximum(lists, 0), 1)[ok])
    counts = rng.integers(0, 4, n_items).astype(float)
    topn_by_order(ip, it, want, popularity_order(counts, tiekey), lists)
    ref = topn_reference(seen, np.tile(counts, (n_users, 1)), tiekey, n)
    ref[0] = -1
    assert lists.tolist() == ref.tolist()


def test_default_threshold_is_the_top_fifth_of_the_range():
    assert default_threshold(1, 5) == 4.2 and default_threshold(0.5, 4) == 3.3 and default_threshold(-10, 10) == 6


def _dense_ranking(model, store, k, threshold):
    """evaluate's ranking recomputed in memory: dense scores, NumPy sort, Python metrics."""
    from streamdp.storage.ids import find

    ids = store.item_ids()
    tiekey = find(model.item_ids, ids)
    m = model.in_order_of(ids)
    Q, bias = local_design(m)
    counts = np.zeros(store.n_items)
    for blk in store.blocks():
        counts += np.bincount(blk.items, minlength=store.n_items)
    noisy = np.asarray(model.extras["noisy_item_weight"], float)[tiekey]
    lists = {"model": [], "private_popularity": [], "popularity": []}
    test = []
    for b in range(store.n_blocks):
        tr, te = store.read_block(b), store.read_block(b, "test")
        U = solve_block(m, tr.indptr, tr.items, tr.ratings, m.info["ridge"])
        full = m.global_mean + bias + U @ Q.T
        sc = model.info["list_scorer"]
        assert sc["kind"] == "rating_plus_log_count" and sc["counts"] == "noisy_item_weight"
        full = full + sc["weight"] * np.log1p(np.maximum(noisy, 0))  # the list score: rating + w log(1 + count)
        seen = [tr.items[tr.indptr[u]:tr.indptr[u + 1]] for u in range(tr.n_users)]
        lists["model"] += topn_reference(seen, full, tiekey, k).tolist()
        lists["private_popularity"] += topn_reference(seen, np.tile(noisy, (tr.n_users, 1)), tiekey, k).tolist()
        lists["popularity"] += topn_reference(seen, np.tile(counts, (tr.n_users, 1)), tiekey, k).tolist()
        test += [dict(zip(te.items[te.indptr[u]:te.indptr[u + 1]].tolist(),
                          te.ratings[te.indptr[u]:te.indptr[u + 1]].astype(float).tolist())) for u in range(te.n_users)]
    out = {}
    for name, ls in lists.items():
        s = _python_metrics(ls, test, threshold, counts)
        users = [lst for lst, t in zip(ls, test) if any(r >= threshold for r in t.values())]
        covered = {j for lst in users for j in lst if j >= 0}
        out[name] = {"precision": s["precision"] / s["users"], "recall": s["recall"] / s["users"],
                     "ndcg": s["ndcg"] / s["users"], "map": s["map"] / s["users"],
                     "coverage": len(covered) / store.n_items,
                     "popularity_bias": s["popularity"] / s["users"] / counts.mean(), "n_users": s["users"]}
    return out


@pytest.fixture(scope="module")
def als_model(small_store, tmp_path_factory):
    from streamdp.workflows.api import train

    out = str(tmp_path_factory.mktemp("rank") / "m")
    train(small_store, method="als", epsilon=float("inf"), allow_nonprivate=True, reg=10.0,  # one fit (no ridge choice)
          rank=4, out=out, seed=1, workers=1, evaluate=False)
    return out


def test_evaluate_ranking_matches_a_dense_computation(small_store, als_model):
    ev = evaluate_model(als_model, small_store, workers=2, k=7)
    r = ev["ranking"]
    assert r["k"] == 7 and r["relevant_threshold"] == 4.2 and "top 20%" in r["threshold_source"]
    want = _dense_ranking(load_model(als_model), small_store, 7, 4.2)
    assert r["n_users"] == want["model"]["n_users"] > 100
    for name, got in (("model", r), ("private_popularity", r["baselines"]["private_popularity"]),
                      ("popularity", r["baselines"]["popularity"])):
        for key in ("precision", "recall", "ndcg", "map", "coverage", "popularity_bias"):
            assert got[key] == pytest.approx(want[name][key], rel=1e-9, abs=1e-12), (name, key)
    assert r["baselines"]["popularity"]["guarantee"] == "non-private"
    assert r["recall"] > 0 and r["ndcg"] > 0


def test_evaluate_cli_ranking_options(small_store, als_model):
    runner = CliRunner()
    res = runner.invoke(main, ["evaluate", als_model, small_store.path, "--k", "5", "--relevant-threshold", "4",
                               "--json"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout)["ranking"]
    assert r["k"] == 5 and r["relevant_threshold"] == 4 and r["threshold_source"] == "--relevant-threshold"
    assert {"precision", "recall", "ndcg", "map", "coverage", "popularity_bias"} <= set(r)
    res = runner.invoke(main, ["evaluate", als_model, small_store.path])
    assert res.exit_code == 0
    assert "NDCG@10" in res.output and ">= 4.2 (default: the top 20% of the rating range" in res.output
    assert "most popular (non-private)" in res.output and "most popular (released)" in res.output
    res = runner.invoke(main, ["evaluate", als_model, small_store.path, "--k", "0"])
    assert res.exit_code == 2 and res.stderr.strip() == "streamdp: error: --k must be a positive integer, got 0"


def test_train_summary_carries_the_ranking(small_store, tmp_path):
    runner = CliRunner()
    out = str(tmp_path / "t")
    fit = ("--epsilon", "inf", "--yes", "--rank", "4", "--iters", "5", "--reg", "10")  # one fit: no ridge to choose
    res = runner.invoke(main, ["train", small_store.path, *fit, "--out", out, "--seed", "1", "--json", "--workers", "1"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout)["ranking"]
    ev = evaluate_model(out, small_store, workers=1)["ranking"]
    assert r["k"] == 10 and r["ndcg"] == pytest.approx(ev["ndcg"]) and r["recall"] == pytest.approx(ev["recall"])
    assert r["baselines"]["popularity"]["recall"] == pytest.approx(ev["baselines"]["popularity"]["recall"])
    res = runner.invoke(main, ["train", small_store.path, *fit, "--out", out, "--seed", "1", "--force", "--workers", "1"])
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if x.startswith("ranking: "))
    assert f"Recall@10 {r['recall']:.4f}  NDCG@10 {r['ndcg']:.4f}" in line and "most popular, non-private" in line


@settings(max_examples=80, deadline=None)
@given(hs.integers(0, 10_000), hs.integers(1, 9), hs.booleans(), hs.integers(1, 5), hs.sampled_from([12, 64, 130, 201]))
def test_blocked_topn_is_the_per_user_kernel_bit_for_bit(seed, n, integer_scores, tile_rows, n_items):
    """float32 sgemm tiles + float64 rescoring of the candidates == the float64 per-user kernel: same items, same
    order, same scores; with ties (integer factors, repeated items), users who rated every item, several tiles, and
    catalogues of whole and partial chunks of the rescoring's scans (``SCAN_CHUNK``, 64 items)."""
    rng = np.random.default_rng(seed)
    n_users, k = 9, 3
    U = rng.integers(-2, 3, (n_users, k)).astype(float) if integer_scores else rng.normal(size=(n_users, k)) * 10
    Q = rng.integers(-2, 3, (n_items, k)).astype(float) if integer_scores else rng.normal(size=(n_items, k))
    Q[n_items // 2:] = Q[:n_items - n_items // 2]  # repeated items: tied scores whatever the user
    bias = rng.integers(0, 2, n_items).astype(float) if integer_scores else rng.normal(size=n_items) * 1e-7
    tiekey = rng.permutation(n_items).astype(np.int64)
    seen = [rng.choice(n_items, size=rng.integers(0, n_items + 1), replace=False) for _ in range(n_users)]
    seen[1] = np.arange(n_items)  # rated everything: no list
    seen[2] = np.arange(n_items - 1)  # one candidate
    ip = np.cumsum([0] + [len(s) for s in seen]).astype(np.int64)
    it = np.concatenate(seen).astype(np.int32)
    want = (rng.random(n_users) < 0.8).astype(np.uint8)
    want[:3] = 1
    old, old_s = np.empty((n_users, n), np.int32), np.zeros((n_users, n))
    new, new_s = np.empty((n_users, n), np.int32), np.zeros((n_users, n))
    topn_scores(ip, it, want, U, Q, bias, 3.0, tiekey, old, old_s)
    topn_blocked(ip, it, want, U, Q, bias, 3.0, tiekey, new, new_s, tile_bytes=4 * n_items * tile_rows)
    assert (new == old).all()
    assert (new_s[new >= 0] == old_s[old >= 0]).all()
    assert (new[1] == -1).all() and new[2, 0] == n_items - 1


def test_sampled_ranking_agrees_with_every_user_within_its_standard_error(small_store, als_model):
    """The default is a seeded sample of users; on a small store the sample's metrics agree with the full
    computation (--ranking-users all) within 4 standard errors, for the model and both baselines, and the
    same users are measured for each."""
    full = evaluate_model(als_model, small_store, workers=2, ranking_users="all")["ranking"]
    ev = evaluate_model(als_model, small_store, workers=2, ranking_users=900)
    r = ev["ranking"]
    assert not full["sampled"] and full["n_users"] == full["n_users_evaluable"] > 1000
    assert full["standard_error"]["recall"] == 0.0
    assert r["sampled"] and r["users_drawn"] == 900 and r["n_users_evaluable"] == full["n_users"]
    assert 100 < r["n_users"] < 900
    for name, got, want in (("model", r, full),
                            *((b, r["baselines"][b], full["baselines"][b]) for b in ("private_popularity",
                                                                                      "popularity"))):
        for key in ("precision", "recall", "ndcg", "map"):
            se = got["standard_error"][key]
            assert 0 < se < 0.05, (name, key)
            assert abs(got[key] - want[key]) <= 4 * se, (name, key, got[key], want[key], se)
    # the RMSE is over every test rating whatever the sample
    assert ev["n_ratings"] == small_store.block_nnz("test").sum()
    text = format_ranking(r)
    assert f"over {r['n_users']:,} of {r['n_users_evaluable']:,} users (a seeded sample of 900 users" in text


def test_ranking_users_option(small_store, als_model, tmp_path):
    runner = CliRunner()
    res = runner.invoke(main, ["evaluate", als_model, small_store.path, "--ranking-users", "300", "--json"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout)["ranking"]
    assert r["sampled"] and r["users_drawn"] == 300 and r["n_users"] < 300
    res = runner.invoke(main, ["evaluate", als_model, small_store.path, "--ranking-users", "some"])
    assert res.exit_code == 2
    assert res.stderr.strip() == "streamdp: error: --ranking-users must be a positive integer or 'all', got 'some'"
    out = str(tmp_path / "t")
    res = runner.invoke(main, ["train", small_store.path, "--epsilon", "inf", "--rank", "4", "--iters", "5", "--reg", "10",
                               "--out", out, "--seed", "1", "--workers", "1", "--k", "5", "--ranking-users", "400"])
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if x.startswith("ranking: "))
    assert "Recall@5" in line and "sampled users, standard error" in line


def test_solve_rows_is_the_block_solve_of_the_wanted_users(small_store, als_model):
    """An implicit evaluation (no RMSE) solves only the sampled users' rows: each the row the whole block's
    solve gives her, bit for bit; the others 0."""
    from streamdp.serving.evaluate import solve_rows

    m = load_model(als_model).in_order_of(small_store.item_ids())
    tr = small_store.read_block(1)
    full = solve_block(m, tr.indptr, tr.items, tr.ratings, 0.1)
    want = (np.random.default_rng(0).random(tr.n_users) < 0.1).astype(np.uint8)
    got = solve_rows(m, tr, want, 0.1)
    assert (got[want > 0] == full[want > 0]).all() and not got[want == 0].any()
    assert (solve_rows(m, tr, np.ones(tr.n_users, np.uint8), 0.1) == full).all()
    assert not solve_rows(m, tr, np.zeros(tr.n_users, np.uint8), 0.1).any()
