"""Batch recommendations (``recommend MODEL --store STORE --out FILE``): the same lists as a dense in-memory NumPy
top-N and as the single-user path, original (string) ids, the --users filter and its errors, no partial file,
and bounded memory on a 1M-user store (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from streamdp.cli import main
from streamdp.serving.local import local_design, recommend, solve_block
from streamdp.serving.model import load_model
from streamdp.storage.ids import find

REPO = Path(__file__).resolve().parents[1]


def _dense_topn(model, store, n):
    """Every user's top-n unseen items in memory: all U at once, U Q^T, a full sort by (-score, item id)."""
    ids = store.item_ids()
    tiekey = find(model.item_ids, ids)
    m = model.in_order_of(ids)
    Q, bias = local_design(m)
    lo, hi = m.info["rating_range"]["min"], m.info["rating_range"]["max"]
    rows = []
    for b in range(store.n_blocks):
        tr = store.read_block(b)
        U = solve_block(m, tr.indptr, tr.items, tr.ratings, m.info["ridge"])
        S = m.global_mean + bias + U @ Q.T
        sc = model.info["list_scorer"]  # the list score: the prediction + w log(1 + released count)
        off = sc["weight"] * np.log1p(np.maximum(np.asarray(model.extras[sc["counts"]], float)[tiekey], 0))
        S = S + off
        uids = store.user_ids(tr.first_user, tr.first_user + tr.n_users)
        for u in range(tr.n_users):
            S[u, tr.items[tr.indptr[u]:tr.indptr[u + 1]]] = -np.inf
            order = np.lexsort((tiekey, -S[u]))[:n]
            order = order[np.isfinite(S[u, order])]
            rows += [(uids[u], r + 1, ids[j], np.clip(S[u, j] - off[j], lo, hi)) for r, j in enumerate(order)]
    return rows


@pytest.fixture(scope="module")
def model(small_store, tmp_path_factory):
    from streamdp.workflows.api import train

    out = str(tmp_path_factory.mktemp("batch") / "m")
    train(small_store, method="als", epsilon=float("inf"), allow_nonprivate=True,
          rank=4, out=out, seed=1, workers=1, evaluate=False)
    return out


def _rows(table):
    d = table.to_pydict()
    return list(zip(d["user_id"], d["rank"], d["item_id"], d["score"]))


def _same(got, want):
    assert [r[:3] for r in got] == [tuple(x.item() if hasattr(x, "item") else x for x in r[:3]) for r in want]
    np.testing.assert_allclose([r[3] for r in got], [r[3] for r in want], rtol=1e-6)


def test_batch_matches_a_dense_numpy_top_n_and_the_single_user_path(small_store, model, tmp_path):
    out = tmp_path / "recs.parquet"
    res = CliRunner().invoke(main, ["recommend", model, "--store", small_store.path, "--out", str(out), "--top", "7",
                                    "--workers", "2", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    t = pq.read_table(out)
    assert t.column_names == ["user_id", "rank", "item_id", "score"]
    assert summary["rows"] == t.num_rows == 7 * small_store.n_users and summary["users"] == small_store.n_users
    m = load_model(model)
    want = _dense_topn(m, small_store, 7)
    _same(_rows(t), want)
    # the single-user path gives each user the same list from her own ratings
    tr = small_store.read_block(1)
    for u in (0, 5, 17):
        items = tr.items[tr.indptr[u]:tr.indptr[u + 1]]
        ratings = tr.ratings[tr.indptr[u]:tr.indptr[u + 1]]
        recs = m.recommend(zip(small_store.item_ids()[items].tolist(), ratings.tolist()), n=7)
        uid = small_store.user_ids(tr.first_user + u, tr.first_user + u + 1)[0]
        assert [i for i, _ in recs] == [r[2] for r in _rows(t) if r[0] == uid]
    # the Python API: an iterator of tables, one per block, the same rows
    tables = list(m.recommend_all(small_store, 7))
    assert len(tables) == small_store.n_blocks and all(isinstance(x, pa.Table) for x in tables)
    _same(_rows(pa.concat_tables(tables)), want)


def test_single_user_ranks_by_the_unclipped_prediction():
    # three items predicted above the top of the scale: ranked by how far above, not by their index
    m = SimpleNamespace(item_factors=np.array([[1.0], [3.0], [2.0], [0.0]], np.float32),
                        item_bias=np.zeros(4, np.float32), global_mean=4.0, item_ids=np.arange(4),
                        info={"ridge": 0.01, "local_user_bias": False, "rating_range": {"min": 1, "max": 5}})
    idx, score = recommend(m, np.array([3, 0]), np.array([5.0, 5.0], np.float32), top=2)
    assert idx.tolist() == [1, 2] and score.tolist() == [5.0, 5.0]


def test_string_ids_and_the_users_filter(tmp_path):
    from streamdp.storage.generate import generate_store
    from streamdp.workflows.api import train

    st = generate_store(str(tmp_path / "s.zarr"), n_users=400, n_items=60, ratings_per_user=8, rank=2, seed=3,
                        block_users=150, string_ids=True)
    train(st, method="als", epsilon=float("inf"), allow_nonprivate=True,
          rank=2, out=str(tmp_path / "m"), seed=1, workers=1,
          evaluate=False)
    m = load_model(str(tmp_path / "m"))
    want = _dense_topn(m, st, 4)
    out = tmp_path / "r.parquet"
    res = CliRunner().invoke(main, ["recommend", str(tmp_path / "m"), "--store", st.path, "--out", str(out),
                                    "--top", "4"])
    assert res.exit_code == 0, res.output
    assert "do not publish" in res.output
    t = pq.read_table(out)
    assert t.schema.field("user_id").type == pa.string() and t.schema.field("item_id").type == pa.string()
    _same(_rows(t), want)
    # --users: original ids, any order, duplicates and a header; users in the store's order in the output
    uids = st.user_ids()
    pick = [uids[350], uids[3], uids[151], uids[3]]
    f = tmp_path / "users.txt"
    f.write_text("user_id\n" + "\n".join(pick) + "\n")
    res = CliRunner().invoke(main, ["recommend", str(tmp_path / "m"), "--store", st.path, "--out", str(out),
                                    "--users", str(f), "--force"])
    assert res.exit_code == 0, res.output
    got = _rows(pq.read_table(out))
    assert sorted({r[0] for r in got}) == sorted(set(pick))
    _same(got, [r for r in _dense_topn(m, st, 10) if r[0] in set(pick)])
    assert [r[0] for r in got][::10] == [uids[3], uids[151], uids[350]]


def test_bad_users_files_and_arguments_are_one_line_errors_and_write_nothing(small_store, model, tmp_path):
    out = tmp_path / "r.parquet"
    uid = int(small_store.user_ids(0, 1)[0])
    cases = [("123x", "users.txt:2: user id '123x' is not an integer (the store's user ids are integers)"),
             ("99999999", "users.txt:2: user 99999999 is not a user of"),
             ("", "users.txt: no user ids")]
    for bad, msg in cases:
        f = tmp_path / "users.txt"
        f.write_text(f"{uid}\n{bad}\n" if bad else "# nobody\n")
        res = CliRunner().invoke(main, ["recommend", model, "--store", small_store.path, "--out", str(out),
                                        "--users", str(f)])
        assert res.exit_code == 2 and msg in res.stderr and len(res.stderr.splitlines()) == 1, res.output
        assert res.stderr.startswith("streamdp: error: ") and not out.exists()
    for args, msg in ((["--users", str(tmp_path / "nope.txt")], "nope.txt: no such file"),
                      (["--top", "0"], "--top must be a positive integer, got 0")):
        res = CliRunner().invoke(main, ["recommend", model, "--store", small_store.path, "--out", str(out), *args])
        assert res.exit_code == 2 and msg in res.stderr, res.output
    for args, msg in ((["--store", small_store.path], "--store: give --out FILE"),
                      (["--store", small_store.path, "--ratings", "x.csv", "--out", str(out)], "either --ratings"),
                      ([], "either --ratings"), (["--ratings", "x.csv", "--out", str(out)], "--out: only with --store")):
        res = CliRunner().invoke(main, ["recommend", model, *args])
        assert res.exit_code == 2 and msg in res.stderr, res.output
    assert not out.exists() and os.listdir(tmp_path) == ["users.txt"]
    text = " ".join(CliRunner().invoke(main, ["recommend", "--help"]).output.split())
    assert "Under joint DP each list depends on the released model and on that user's own data only" in text
    assert "may be shown to that user, but the file (every user's list) must not be published" in text


def test_no_partial_file_on_failure_and_no_overwrite_without_force(small_store, model, tmp_path, monkeypatch):
    import streamdp.serving.batch

    out = tmp_path / "r.parquet"
    calls = []
    real = streamdp.serving.batch.solve_block

    def failing(*a, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("disk on fire")
        return real(*a, **kw)

    monkeypatch.setattr(streamdp.serving.batch, "solve_block", failing)
    with pytest.raises(RuntimeError, match="disk on fire"):
        load_model(model).recommend_all(small_store, 5, str(out), workers=1)
    assert len(calls) >= 3 and os.listdir(tmp_path) == []  # neither the file nor its temporary
    monkeypatch.setattr(streamdp.serving.batch, "solve_block", real)
    out.write_text("mine")
    res = CliRunner().invoke(main, ["recommend", model, "--store", small_store.path, "--out", str(out)])
    assert res.exit_code == 2 and "already exists (use --force" in res.stderr and out.read_text() == "mine"


@pytest.mark.slow
def test_one_million_users_within_one_gigabyte(tmp_path_factory):
    """1M users x 2,000 items, 5 ratings each: the whole batch within --memory-limit 1GB, peak RSS by wait4."""
    from tests.conftest import peak_rss

    d = Path(tempfile.mkdtemp(prefix="batch-1m-", dir="/tmp"))
    try:
        exe = [sys.executable, "-m", "streamdp"]
        subprocess.run(exe + ["generate", "--out", str(d / "s.zarr"), "--users", "1000000", "--items", "2000",
                              "--ratings-per-user", "5", "--seed", "1"], check=True, capture_output=True, cwd=REPO)
        subprocess.run(exe + ["train", str(d / "s.zarr"), "--epsilon", "1", "--iters", "2", "--out", str(d / "m")],
                       check=True, capture_output=True, cwd=REPO)
        code, out, err, peak = peak_rss(exe + ["recommend", str(d / "m"), "--store", str(d / "s.zarr"), "--out",
                                               str(d / "r.parquet"), "--memory-limit", "1GB", "--json"], cwd=REPO)
        assert code == 0, err[-2000:]
        res = json.loads(out)
        print(f"1M users: {res['seconds']:.0f}s, {1e6 / res['seconds']:.0f} users/s, peak RSS {peak / 2**20:.0f} MiB")
        from streamdp.storage.store import open_store

        counts = open_store(str(d / "s.zarr")).user_counts()  # no test split: every rating is a training one
        rows = int(np.minimum(10, 2000 - counts).sum())  # a user who rated every item gets no row
        assert res["users"] == int((counts < 2000).sum()) > 999_000 and res["rows"] == rows
        assert peak < 1 << 30, f"peak RSS {peak / 2**20:.0f} MiB"
        assert pq.ParquetFile(d / "r.parquet").metadata.num_rows == rows
    finally:
        import shutil

        shutil.rmtree(d, ignore_errors=True)


def test_blocked_scoring_keeps_the_per_user_lists_with_ties(small_store, model):
    """Batch recommend's float32 tiles give the per-user kernel's lists (same items, same order), here for a model
    whose scores tie everywhere (integer factors and biases, repeated items): ties by ascending item id."""
    import dataclasses

    from streamdp.kernels.topk import topn_scores
    from streamdp.serving.local import list_bias

    m = load_model(model)
    V = np.round(np.asarray(m.item_factors, np.float64))
    V[1::2] = V[0::2][:len(V[1::2])]
    tied = dataclasses.replace(m, item_factors=V.astype(m.item_factors.dtype),
                               item_bias=np.round(np.asarray(m.item_bias)).astype(m.item_bias.dtype))
    got = tied.recommend_all(small_store, 9, as_arrays=True)
    ids = small_store.item_ids()
    tiekey = find(tied.item_ids, ids)
    mo = tied.in_order_of(ids)
    Q, bias = local_design(mo)
    rank_bias = list_bias(tied, bias, tiekey)
    want = []
    for b in range(small_store.n_blocks):
        tr = small_store.read_block(b)
        U = solve_block(mo, tr.indptr, tr.items, tr.ratings, tied.info["ridge"])
        lists = np.empty((tr.n_users, 9), np.int32)
        topn_scores(tr.indptr.astype(np.int64), tr.items.astype(np.int32), np.ones(tr.n_users, np.uint8), U, Q,
                    rank_bias, float(mo.global_mean), tiekey.astype(np.int64), lists, np.empty((tr.n_users, 9)))
        want.append(np.where(lists >= 0, ids[np.maximum(lists, 0)], -1))
    want = np.concatenate(want)
    assert (np.asarray(got.item_ids) == want).all()
    # the scores tie: many lists hold equal scores, ordered by ascending item id
    s = np.asarray(got.scores)
    assert (s[:, :-1] == s[:, 1:]).mean() > 0.1
