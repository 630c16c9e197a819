"""The Python API a practitioner expects (issue 31): top-level ingest/train/tune/evaluate, in-memory ingest
(pandas, Arrow, scipy.sparse), and a model's recommend_user, recommend_all(as_arrays=True), similar_items, summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import scipy.sparse as sp
from click.testing import CliRunner

import streamdp
from streamdp.cli import main
from streamdp.errors import InputError, ParameterError
from streamdp.serving.model import Model, load_model


# -- the top-level names --------------------------------------------------------------------------------------------
def test_top_level_functions_whatever_was_imported_before():
    import streamdp.serving.evaluate  # noqa: F401  the modules of the same names, loaded: the attributes stay the functions
    import streamdp.workflows.tune  # noqa: F401
    from streamdp.workflows import api

    for name in ("ingest", "train", "tune", "evaluate", "generate", "load_model"):
        assert callable(getattr(streamdp, name)), name
    assert streamdp.evaluate is api.evaluate and streamdp.tune is api.tune and streamdp.ingest is api.ingest
    from streamdp.serving.evaluate import evaluate_model  # the module itself is still importable by name

    assert callable(evaluate_model)
    assert {"ingest", "tune", "evaluate"} <= set(dir(streamdp))


def test_import_streamdp_stays_light():
    code = ("import sys, streamdp; heavy = [m for m in ('dp_accounting', 'numba', 'dask', 'pandas', 'scipy') "
            "if m in sys.modules]; print(heavy); assert not heavy")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(__file__))))
    assert r.returncode == 0, r.stdout + r.stderr


# -- ingest from memory ---------------------------------------------------------------------------------------------
def _ratings(n=12_000, seed=0, string_items=False, timestamps=True):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"user": rng.integers(0, 700, n), "item": rng.integers(0, 90, n),
                       "rating": rng.integers(1, 11, n) / 2.0})
    if string_items:
        df["item"] = "m" + df["item"].astype(str)
    if timestamps:
        df["timestamp"] = rng.permutation(n)  # duplicates: the latest is kept
    return df


def _content(st, skip=()) -> tuple:
    splits = ("train", "test") if st.has_test else ("train",)
    blocks = [(b.first_user, b.indptr.tolist(), b.items.tolist(), b.ratings.tolist())
              for s in splits for b in st.blocks(s)]
    keys = ("rating_min", "rating_max", "rating_range_source", "n_duplicates_dropped", "implicit", "value",
            "n_duplicates_aggregated")
    return (st.user_ids().tolist(), st.item_ids().tolist(), st.item_counts().tolist(), blocks,
            {k: st.attrs.get(k) for k in keys if k not in skip})


@pytest.mark.parametrize("string_items", [False, True])
def test_dataframe_and_arrow_ingest_equal_the_csv_ingest(tmp_path, string_items):
    df = _ratings(string_items=string_items)
    df.to_csv(tmp_path / "r.csv", index=False)
    kw = dict(test_fraction=0.2, seed=3, memory_limit="100MB")  # several record batches of >= 4096 rows
    want = _content(streamdp.ingest(str(tmp_path / "r.csv"), str(tmp_path / "csv.zarr"), **kw))
    from_pandas = streamdp.ingest(df, str(tmp_path / "pd.zarr"), **kw)
    assert _content(from_pandas) == want
    assert from_pandas.attrs["sources"][0]["format"] == "pandas" and from_pandas.attrs["sources"][0]["path"] is None
    assert _content(streamdp.ingest(pa.Table.from_pandas(df), str(tmp_path / "pa.zarr"), **kw)) == want
    # extra columns are ignored, named columns are taken as --columns takes them
    odd = df.rename(columns={"user": "uid", "item": "iid", "rating": "stars"}).assign(title="x")
    got = streamdp.ingest(odd, str(tmp_path / "named.zarr"), columns=["uid", "iid", "stars", "timestamp"], **kw)
    assert _content(got) == want


def test_a_dataframe_is_read_in_bounded_batches_not_copied_whole(tmp_path, monkeypatch):
    from streamdp.storage import frames

    sizes = []
    orig = frames.PandasFrame._batch
    monkeypatch.setattr(frames.PandasFrame, "_batch", lambda self, a, b, cols: sizes.append(
        (orig(self, a, b, cols).num_rows, len(cols))) or orig(self, a, b, cols))
    df = _ratings(n=30_000)
    st = streamdp.ingest(df, str(tmp_path / "s.zarr"), memory_limit="100MB")
    read = [n for n, k in sizes if k > 1]  # the batches of the chosen columns (the schema reads one row)
    assert sum(read) == len(df) and len(read) >= 3 and max(read) <= 10_000
    assert st.n_ratings + st.attrs["n_duplicates_dropped"] == len(df)


def test_polars_ingest_equals_the_csv_ingest(tmp_path):
    pl = pytest.importorskip("polars")
    df = _ratings(string_items=True)
    df.to_csv(tmp_path / "r.csv", index=False)
    want = _content(streamdp.ingest(str(tmp_path / "r.csv"), str(tmp_path / "csv.zarr")))
    assert _content(streamdp.ingest(pl.from_pandas(df), str(tmp_path / "pl.zarr"))) == want


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
def test_sparse_ingest_equals_the_csv_ingest(tmp_path, fmt):
    df = _ratings(timestamps=False).drop_duplicates(["user", "item"], keep="last")
    df.to_csv(tmp_path / "r.csv", index=False)
    kw = dict(test_fraction=0.2, seed=3, memory_limit="100MB")
    want = _content(streamdp.ingest(str(tmp_path / "r.csv"), str(tmp_path / "csv.zarr"), **kw))
    m = sp.coo_matrix((df.rating.to_numpy(), (df.user.to_numpy(), df.item.to_numpy()))).asformat(fmt)
    got = streamdp.ingest(m, str(tmp_path / "sp.zarr"), **kw)
    assert _content(got) == want and got.attrs["sources"][0]["format"] == "scipy.sparse"


def test_interaction_logs_from_memory_make_the_same_implicit_store(tmp_path):
    rng = np.random.default_rng(1)
    log = pd.DataFrame({"user": rng.integers(0, 300, 6000), "item": rng.integers(0, 50, 6000)})
    log.to_csv(tmp_path / "log.csv", index=False)
    want = _content(streamdp.ingest(str(tmp_path / "log.csv"), str(tmp_path / "csv.zarr")))
    got = streamdp.ingest(log, str(tmp_path / "pd.zarr"))  # user and item columns alone: a log
    assert got.implicit and _content(got) == want
    # a user x item count matrix, as implicit's user_items
    counts = log.groupby(["user", "item"]).size().reset_index(name="count")
    m = sp.csr_matrix((counts["count"].to_numpy(float), (counts.user.to_numpy(), counts.item.to_numpy())))
    got = streamdp.ingest(m, str(tmp_path / "sp.zarr"), implicit=True)
    once = ("n_duplicates_aggregated",)  # the matrix holds the counts already aggregated
    assert got.implicit and _content(got, once) == _content(streamdp.open_store(str(tmp_path / "csv.zarr")), once)
    counts.to_csv(tmp_path / "counts.csv", index=False)
    assert _content(streamdp.ingest(pa.Table.from_pandas(counts), str(tmp_path / "pa.zarr"))) == \
        _content(streamdp.ingest(str(tmp_path / "counts.csv"), str(tmp_path / "c.zarr")))


def test_bad_in_memory_input_is_one_line_and_writes_nothing(tmp_path):
    df = _ratings(n=5000)
    out = tmp_path / "s.zarr"
    bad = df.astype({"rating": float})
    bad.loc[4321, "rating"] = 7.0
    with pytest.raises(InputError, match=r"^pandas DataFrame: row 4322: rating 7 outside --rating-range"):
        streamdp.ingest(bad, str(out), rating_range=(0.5, 5))
    missing = df.astype({"rating": float})
    missing.loc[10, "rating"] = np.nan
    with pytest.raises(InputError, match=r"^pandas DataFrame: row 11: rating is NaN or missing \(not a finite"):
        streamdp.ingest(missing, str(out))
    with pytest.raises(InputError, match=r"column 'user' \(double\).*cast it first"):
        streamdp.ingest(df.astype({"user": float}), str(out))
    with pytest.raises(InputError, match=r"^Arrow table: columns .*no rating column"):
        streamdp.ingest(pa.table({"user": [1], "item": [2], "stars_given": [3.0]}), str(out))
    with pytest.raises(InputError, match=r"count 0 is not positive"):
        streamdp.ingest(_explicit_zero(), str(out), implicit=True)
    with pytest.raises(InputError, match="no ratings"):
        streamdp.ingest(df.iloc[:0], str(out))
    with pytest.raises(ParameterError, match="fmt: only for files"):
        streamdp.ingest(df, str(out), fmt="csv")
    with pytest.raises(ParameterError, match="numpy.ndarray is not something ingest reads"):
        streamdp.ingest(df.to_numpy(), str(out))
    with pytest.raises(ParameterError, match="columns: not for a scipy.sparse matrix"):
        streamdp.ingest(sp.eye(3, format="csr"), str(out), columns="a,b,c")
    assert not out.exists() and os.listdir(tmp_path) == []


def _explicit_zero():
    m = sp.csr_matrix(np.array([[1.0, 2.0], [0.0, 3.0]]))
    m.data[1] = 0.0  # a stored zero is an entry
    return m


# -- a model from Python --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def frame_model(small_store, tmp_path_factory):
    """A DataFrame of small_store's training ratings, the store ingested from it, and a model trained there."""
    d = tmp_path_factory.mktemp("api")
    parts = []
    for b in small_store.blocks():
        u = np.repeat(np.arange(b.first_user, b.first_user + b.n_users), np.diff(b.indptr))
        parts.append(pd.DataFrame({"user": small_store.user_ids()[u], "item": small_store.item_ids()[b.items],
                                   "rating": b.ratings}))
    df = pd.concat(parts, ignore_index=True)
    st = streamdp.ingest(df, str(d / "s.zarr"), block_users=700)
    m = streamdp.train(st, method="als", epsilon=float("inf"), allow_nonprivate=True,
                       rank=4, seed=1, workers=1, evaluate=False,
                       out=str(d / "m"))
    return df, st, m


def test_recommend_user_is_recommend_with_her_ratings(frame_model):
    df, st, m = frame_model
    for uid in (0, 701, 2999):  # three blocks
        mine = df[df.user == uid]
        want = m.recommend(dict(zip(mine.item.tolist(), mine.rating.tolist())), n=7)
        assert m.recommend_user(st, uid, n=7) == want
        assert m.recommend_user(st.path, str(uid), n=7) == want  # a path, the id as typed
    with pytest.raises(InputError, match="user_id: 3000 is not a user of"):
        m.recommend_user(st, 3000)
    with pytest.raises(InputError, match="its user ids are integers"):
        m.recommend_user(st, "alice")


def test_recommend_user_reads_one_block(frame_model, monkeypatch):
    _, st, m = frame_model
    read = []
    orig = type(st).read_block
    monkeypatch.setattr(type(st), "read_block", lambda self, b, split="train": read.append(b) or orig(self, b, split))
    m.recommend_user(st, 1500, n=3)
    assert read == [1500 // st.block_users]


def test_recommend_all_arrays_equal_the_batch_tables(frame_model):
    _, st, m = frame_model
    users, items, scores = m.recommend_all(st, 7, as_arrays=True, workers=1)
    t = pa.concat_tables(list(m.recommend_all(st, 7, workers=1))).to_pydict()
    assert users.shape == (st.n_users,) and items.shape == scores.shape == (st.n_users, 7)
    assert users.dtype == np.int64 and items.dtype == np.int64 and scores.dtype == np.float32
    row = {u: k for k, u in enumerate(users.tolist())}
    got = [(u, r, items[row[u], r - 1], scores[row[u], r - 1]) for u, r in zip(t["user_id"], t["rank"])]
    assert [g[2] for g in got] == t["item_id"]
    np.testing.assert_array_equal(np.array([g[3] for g in got], np.float32), np.array(t["score"], np.float32))
    assert users.tolist() == sorted(set(t["user_id"]))
    # each row is the user's own list
    assert [i for i, _ in m.recommend_user(st, int(users[3]), n=7)] == items[3].tolist()
    with pytest.raises(ParameterError, match="either path"):
        m.recommend_all(st, 7, str(st.path) + ".parquet", as_arrays=True)


def test_recommend_all_arrays_pad_short_lists(monkeypatch):
    import streamdp.serving.serve as serving

    # two users of a block: one with two unseen items left, one with one
    tables = [pa.table({"user_id": [5, 5, 6], "rank": pa.array([1, 2, 1], pa.int32()), "item_id": [20, 30, 10],
                        "score": pa.array([4.0, 3.0, 2.0], pa.float32())})]
    monkeypatch.setattr(serving, "recommend_all", lambda *a, **k: iter(tables))
    users, items, scores = serving.recommend_arrays(None, None, 3)
    assert users.tolist() == [5, 6]
    assert items.tolist() == [[20, 30, -1], [10, -1, -1]]
    assert np.isnan(scores[0, 2]) and np.isnan(scores[1, 1:]).all() and scores[1, 0] == 2.0


def test_similar_items_is_cosine_on_the_released_factors_without_the_item(frame_model):
    _, _, m = frame_model
    V = m.item_factors.astype(np.float64)
    cos = V @ V.T / np.outer(np.linalg.norm(V, axis=1), np.linalg.norm(V, axis=1))
    for j in (0, 17, m.n_items - 1):
        got = m.similar_items(m.item_ids[j], n=5)
        order = [k for k in np.lexsort((np.arange(m.n_items), -cos[j])) if k != j][:5]
        assert [i for i, _ in got] == m.item_ids[order].tolist()
        np.testing.assert_allclose([s for _, s in got], cos[j, order], atol=1e-6)
        assert m.item_ids[j] not in [i for i, _ in got]
    assert len(m.similar_items(m.item_ids[0], n=10 ** 6)) == m.n_items - 1
    with pytest.raises(InputError, match="is not an item of the model"):
        m.similar_items("no such item")


def test_similar_items_ties_and_refusals():
    V = np.array([[1, 0], [2, 0], [0, 1], [3, 0], [0, 0]], np.float32)
    m = Model("(example)", V, np.zeros(5, np.float32), np.array([1, 2, 3, 4, 5]), 3.0, {}, None)
    assert m.similar_items(2, n=3) == [(1, 1.0), (4, 1.0), (3, 0.0)]  # equal similarities: smaller id first
    with pytest.raises(InputError, match="all-zero factor row"):
        m.similar_items(5)
    with pytest.raises(ParameterError, match="n must be a positive integer"):
        m.similar_items(1, n=0)
    biases_only = Model("b", np.zeros((5, 8), np.float32), np.zeros(5, np.float32), np.arange(5), 3.0,
                        {"method": "means", "factors_released": False}, None)
    with pytest.raises(InputError, match="released no item factors"):
        biases_only.similar_items(1)
    assert biases_only.summary["personalised"] is False
    assert "every user gets the same list" in str(biases_only.summary)


def test_summary_of_a_loaded_and_of_a_trained_model(frame_model, tmp_path):
    _, st, m = frame_model
    assert m.summary["guarantee"] == "non-private" and m.summary["epsilon"] == "inf"
    loaded = load_model(m.path)
    s = loaded.summary
    assert {"method", "guarantee", "epsilon", "delta", "epsilon_spent", "rank", "n_items", "released",
            "factors_released", "personalised"} <= set(s)
    assert s["method"] == "als" and s["rank"] == 4 and s["n_items"] == st.n_items and s["factors_released"]
    assert {"item_factors", "item_bias", "global_mean"} <= set(s["released"])
    json.dumps(s)  # a plain dict
    text = str(s)
    assert text.splitlines()[0] == f"als model, {st.n_items} items, rank 4" and "released: " in text


def test_evaluate_returns_what_evaluate_json_prints(small_store, tmp_path):
    out = str(tmp_path / "m")
    m = streamdp.train(small_store, method="als", epsilon=2.0, rank=4, seed=1, workers=1, out=out,
                       over_budget=True)
    s = m.summary
    assert s["epsilon_spent"] <= 2.0 and "test_rmse" in s and s["guarantee"] == "user-level (epsilon, delta)-DP"
    assert s["delta"] == load_model(out).ledger.delta
    got = streamdp.evaluate(out, small_store, k=5)
    r = CliRunner().invoke(main, ["evaluate", out, small_store.path, "--k", "5", "--json"])
    assert r.exit_code == 0, r.output
    assert got == json.loads(r.stdout)
    assert type(got["rmse"]) is float and type(got["ranking"]["precision"]) is float


# -- the third adversarial round (issue 40): loose arguments are one line naming them -------------------------------
@pytest.mark.parametrize("n", [2.5, float("nan"), "3", 0, True, None, float("inf")])
def test_a_list_length_that_is_not_a_positive_integer_is_one_line(frame_model, n):
    """Before: raw TypeErrors (``n=2.5``, ``"3"``) or a ValueError (``nan``) from deep inside."""
    _, st, m = frame_model
    for call in (lambda: m.recommend_user(st, 0, n=n), lambda: m.recommend({0: 4.0}, n=n),
                 lambda: m.recommend_all(st, n, as_arrays=True), lambda: m.similar_items(m.item_ids[0], n=n)):
        with pytest.raises(ParameterError, match=r"^n must be a positive integer, got "):
            call()
    assert [i for i, _ in m.recommend({0: 4.0}, n=3.0)] == [i for i, _ in m.recommend({0: 4.0}, n=3)]


@pytest.mark.parametrize("ratings,said", [([1, 2], "got the element 1"), ("12", "got str"),
                                          (7, "got int"), ([(1, "x")], "is 'x', not a number"),
                                          ([(1, 2, 3)], "got the element (1, 2, 3)")])
def test_user_ratings_that_are_not_pairs_are_one_line(frame_model, ratings, said):
    _, _, m = frame_model
    for call in (m.recommend, m.predict):
        with pytest.raises(ParameterError, match=r"^user_ratings: ") as e:
            call(ratings)
        assert said in str(e.value) and "\n" not in str(e.value)


@pytest.fixture(scope="module")
def counts_model(tmp_path_factory):
    """An ials model of an interaction log (its values are counts)."""
    d = tmp_path_factory.mktemp("counts")
    rng = np.random.default_rng(0)
    users, items = rng.integers(0, 150, 2000), np.minimum(rng.zipf(1.6, 2000) - 1, 29)
    p = d / "log.csv"
    p.write_text("user,item,count\n" + "".join(f"{u},{i},{1 + u % 3}\n" for u, i in zip(users, items)))
    st = streamdp.ingest([str(p)], str(d / "log.zarr"), implicit=True)
    return streamdp.train(st, method="ials", epsilon=float("inf"), out=str(d / "m"), iters=2, evaluate=False,
                          allow_nonprivate=True)


@pytest.mark.parametrize("count", [0, -2])
def test_a_count_that_is_not_positive_is_refused_by_an_implicit_model(counts_model, count):
    """Before: accepted (a count of -2 or 0 ranked as a weak positive); ingest refuses them in a log."""
    m = counts_model
    with pytest.raises(InputError, match="is not positive"):
        m.recommend({int(m.item_ids[0]): 3, int(m.item_ids[1]): count})
    assert len(m.recommend({int(m.item_ids[0]): 3}, n=3)) == 3
