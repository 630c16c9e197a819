"""Local user solve and recommendations: NumPy reference, id mapping, bad input."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

from streamdp.cli import main
from streamdp.errors import InputError
from streamdp.serving.local import read_user_ratings, recommend, solve_user


def _model(n=20, k=3, seed=0):
    rng = np.random.default_rng(seed)
    return SimpleNamespace(item_factors=rng.normal(size=(n, k)).astype(np.float32),
                           item_bias=rng.normal(size=n).astype(np.float32) * 0.2, global_mean=3.5,
                           item_ids=np.arange(100, 100 + n), info={"ridge": 2.0, "rating_range": {"min": 1, "max": 5}})


def test_solve_user_matches_numpy():
    m = _model()
    items = np.array([1, 4, 7, 9])
    r = np.array([5, 3, 1, 4], np.float32)
    Q = m.item_factors[items].astype(np.float64)
    y = r - m.global_mean - m.item_bias[items]
    ref = np.linalg.solve(Q.T @ Q + 2.0 * np.eye(3), Q.T @ y)
    np.testing.assert_allclose(solve_user(m, items, r, user_bias=False), ref, rtol=1e-5)
    # with the user intercept: the same ridge regression on [Q, 1]
    Qa = np.hstack([Q, np.ones((len(items), 1))])
    ref_b = np.linalg.solve(Qa.T @ Qa + 2.0 * np.eye(4), Qa.T @ y)
    np.testing.assert_allclose(solve_user(m, items, r), ref_b, rtol=1e-5)


def test_every_method_declares_a_local_solver_this_module_runs():
    """``Method.LOCAL_SOLVER`` is what a method writes as ``model.json``'s ``local``: a kind :func:`solve_block`
    dispatches on."""
    from streamdp.methods import METHODS, load_builtin
    from streamdp.methods.lowrank import LowRank
    from streamdp.serving.local import LOCAL_KINDS

    load_builtin()
    solvers = {name: cls.LOCAL_SOLVER for name, cls in {**METHODS, "lowrank": LowRank}.items()}
    assert set(solvers.values()) <= set(LOCAL_KINDS)
    assert solvers["fw"] == "frank_wolfe" and solvers["svd"] == "projection" and solvers["oja"] == "ridge"


def test_recommend_excludes_seen_and_sorts():
    m = _model()
    items = np.array([0, 1, 2])
    idx, score = recommend(m, items, np.array([5, 1, 4], np.float32), top=5)
    assert len(idx) == 5 and not set(idx) & {0, 1, 2}
    assert np.all(np.diff(score) <= 0) and np.all((score >= 1) & (score <= 5))


def test_read_user_ratings_maps_ids_and_reports_lines(tmp_path):
    f = tmp_path / "me.csv"
    f.write_text("item,rating\n105,4\n101,2.5\n999,5\n")
    items, r, unknown = read_user_ratings(str(f), np.arange(100, 120))
    assert items.tolist() == [5, 1] and r.tolist() == [4.0, 2.5] and unknown == ["999"]
    f.write_text("105,4\n106,x\n")
    with pytest.raises(InputError, match=r"me.csv:2: rating 'x'"):
        read_user_ratings(str(f), np.arange(100, 120))
    f.write_text("105,4\n105,3\n")
    with pytest.raises(InputError, match=r"me.csv:2: item 105 rated twice"):
        read_user_ratings(str(f), np.arange(100, 120))
    with pytest.raises(InputError, match="no such file"):
        read_user_ratings(str(tmp_path / "nope.csv"), np.arange(3))


def test_recommend_cli(small_store, tmp_path):
    runner = CliRunner()
    out = str(tmp_path / "m")
    res = runner.invoke(main, ["train", small_store.path, "--method", "oja", "--epsilon", "inf", "--yes", "--rank", "3",
                               "--out", out, "--seed", "1", "--passes", "5"])
    assert res.exit_code == 0, res.output
    ids = small_store.item_ids()
    f = tmp_path / "me.csv"
    f.write_text("".join(f"{ids[j]},{r}\n" for j, r in [(0, 5), (3, 1), (10, 4)]))
    res = runner.invoke(main, ["recommend", out, "--ratings", str(f), "--top", "4", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert len(d["items"]) == 4 and not set(d["items"]) & {int(ids[0]), int(ids[3]), int(ids[10])}
    res = runner.invoke(main, ["recommend", out, "--ratings", str(tmp_path / "missing.csv")])
    assert res.exit_code == 2 and "error:" in res.output and "Traceback" not in res.output
    # plain text: a header line, then one tab-separated row per item
    res = runner.invoke(main, ["recommend", out, "--ratings", str(f), "--top", "4"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0] == "item_id\tpredicted_rating" and len(lines) == 5
    assert [int(x.split("\t")[0]) for x in lines[1:]] == d["items"]


def test_recommend_refuses_a_rating_outside_the_models_range(small_store, tmp_path):
    """A 99 on a 1..5 model (every prediction would be 5.000) is an error naming the file and line, exit 2,
    and nothing is printed on stdout; --json output stays one JSON object."""
    runner = CliRunner()
    out = str(tmp_path / "m")
    res = runner.invoke(main, ["train", small_store.path, "--method", "means", "--epsilon", "inf", "--yes", "--out", out])
    assert res.exit_code == 0, res.output
    ids = small_store.item_ids()
    f = tmp_path / "me.csv"
    f.write_text(f"item,rating\n{ids[0]},5\n{ids[3]},99\n")
    for extra in ([], ["--json"]):
        res = runner.invoke(main, ["recommend", out, "--ratings", str(f)] + extra)
        assert res.exit_code == 2 and res.stdout == "", res.output
        assert res.stderr == (f"streamdp: error: {f}:3: rating 99 is outside the model's rating range [1, 5]\n")
    f.write_text(f"{ids[0]},5\n{ids[3]},1\n")
    res = runner.invoke(main, ["recommend", out, "--ratings", str(f), "--json"])
    assert res.exit_code == 0 and isinstance(json.loads(res.stdout), dict)


def test_read_user_ratings_rating_range(tmp_path):
    f = tmp_path / "me.csv"
    f.write_text("105,4\n106,0.5\n")
    with pytest.raises(InputError, match=r"me.csv:2: rating 0.5 is outside the model's rating range \[1, 5\]"):
        read_user_ratings(str(f), np.arange(100, 120), (1.0, 5.0))
    assert read_user_ratings(str(f), np.arange(100, 120))[1].tolist() == [4.0, 0.5]  # no range: no check
    with pytest.raises(InputError, match="rating 99 is outside the model's rating range"):
        recommend(_model(), np.array([0, 1]), np.array([5, 99], np.float32))
