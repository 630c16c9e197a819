"""Data in the shapes people have (issue 31 item 5): their own train/test files, temporal and leave-last-n-out
splits, ``;``-separated files, item names kept in the store and shown in ``recommend``."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import streamdp
from streamdp import open_store
from streamdp.kernels.csr import hold_out_latest
from streamdp.kernels.ingest import group_dedup
from streamdp.storage.info import store_split
from tests.storage.test_ingest import expected_after_dedup, read_store, same, synthetic_ratings


def _unique_pairs(n_users=60, n_items=40, seed=0) -> pd.DataFrame:
    """Ratings with distinct (user, item) pairs and timestamps with ties, in input order."""
    rng = np.random.default_rng(seed)
    rows = [(u, i) for u in range(n_users) for i in rng.choice(n_items, rng.integers(1, 12), replace=False)]
    rng.shuffle(rows)
    df = pd.DataFrame(rows, columns=["user", "item"])
    df["rating"] = rng.integers(1, 6, len(df)).astype(float)
    df["timestamp"] = rng.integers(0, 8, len(df))
    return df


def _held_reference(df: pd.DataFrame, fraction=0.0, last_n=0) -> set:
    """(user, item) pairs each user holds out: her latest by a stable sort on time in input order."""
    held = set()
    for u, g in df.groupby("user", sort=False):
        n = len(g)
        k = last_n if last_n else int(np.floor(fraction * n + 0.5))
        k = max(0, min(k, n - 1))
        order = np.argsort(g["timestamp"].to_numpy(), kind="stable")
        held |= {(u, it) for it in g["item"].to_numpy()[order[n - k:]]} if k else set()
    return held


def _pairs(path, split):
    df = read_store(path, split)
    return set(zip(df.user.tolist(), df.item.tolist()))


# --------------------------------------------------------------------------------------
# temporal and leave-last-n-out splits
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", [("temporal", 0.3, 0), ("last-n", 0.0, 2)])
def test_temporal_and_last_n_hold_out_each_users_latest(tmp_path, cli, how):
    kind, fraction, last_n = how
    df = _unique_pairs()
    src = tmp_path / "r.csv"
    df.to_csv(src, index=False)
    args = ["--split", kind] + (["--test-fraction", fraction] if fraction else ["--last-n", last_n])
    code, out, err, exc = cli.run("ingest", src, "--out", tmp_path / "s.zarr", "--block-users", 7, *args)
    assert code == 0, (err, exc)
    assert f"split: {kind}" in out
    st = open_store(tmp_path / "s.zarr")
    assert st.attrs["split"] == ({"kind": "temporal", "test_fraction": fraction, "per": "user"} if kind == "temporal"
                                 else {"kind": "last-n", "last_n": last_n})
    held = _held_reference(df, fraction, last_n)
    assert _pairs(tmp_path / "s.zarr", "test") == held
    everything = set(zip(df.user.tolist(), df.item.tolist()))
    assert _pairs(tmp_path / "s.zarr", "train") == everything - held
    # every user keeps a training rating; the store's per-user counts are train + test
    assert (np.diff(st.read_block(0, "train").indptr) > 0).all()
    assert int(st.user_counts().sum()) == len(df)
    code, out, _, _ = cli.run("info", tmp_path / "s.zarr")
    assert f"split            {kind}" in out


def test_temporal_split_keeps_latest_of_duplicates_and_their_time(tmp_path):
    """A duplicated pair keeps its latest rating, and that rating's time decides the split."""
    src = tmp_path / "r.csv"
    src.write_text("user,item,rating,timestamp\n1,10,1,50\n1,11,2,10\n1,10,5,5\n1,12,3,20\n")
    streamdp.ingest(str(src), str(tmp_path / "s.zarr"), split="last-n", last_n=1)
    assert _pairs(tmp_path / "s.zarr", "test") == {(1, 10)}  # kept: rating 1 at time 50, the latest
    assert read_store(tmp_path / "s.zarr", "test").rating.tolist() == [1.0]


def test_split_needs_a_timestamp_column(tmp_path, cli):
    src = tmp_path / "r.txt"
    src.write_text("1 10 4\n2 10 3\n2 11 5\n")
    for args in (["--split", "temporal", "--test-fraction", "0.2"], ["--last-n", "1"]):
        cli.error(cli.run("ingest", src, "--out", tmp_path / "s.zarr", *args), "r.txt", "no timestamp column",
                  "--split random")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.txt"]


@pytest.mark.parametrize("args,words", [
    (["--split", "temporal"], ["--split temporal", "--test-fraction"]),
    (["--split", "last-n"], ["--last-n N"]),
    (["--split", "random", "--test-fraction", "0.2", "--last-n", "2"], ["--last-n", "only with --split last-n"]),
    (["--last-n", "2", "--test-fraction", "0.2"], ["--test-fraction", "not with --split last-n"]),
    (["--last-n", "0"], ["--last-n N", "got 0"]),
])
def test_bad_split_options(tmp_path, cli, args, words):
    src = tmp_path / "r.csv"
    _unique_pairs().to_csv(src, index=False)
    cli.error(cli.run("ingest", src, "--out", tmp_path / "s.zarr", *args), *words)


def test_random_split_is_recorded_and_old_stores_read_as_random(tmp_path):
    src = tmp_path / "r.csv"
    _unique_pairs().to_csv(src, index=False)
    st = streamdp.ingest(str(src), str(tmp_path / "s.zarr"), test_fraction=0.25, seed=3)
    assert st.attrs["split"] == {"kind": "random", "test_fraction": 0.25, "seed": 3}
    old = {k: v for k, v in st.attrs.items() if k != "split"}  # a store written before the attribute
    assert store_split(old, st.n_test) == {"kind": "random", "test_fraction": 0.25, "seed": 3}
    assert store_split({}, 0) == {"kind": "none"}


def test_hold_out_latest_kernel_matches_reference():
    rng = np.random.default_rng(1)
    counts = rng.integers(0, 9, 50)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    ts = rng.integers(0, 4, indptr[-1]).astype(np.int64)
    for fraction, last_n in ((0.3, 0), (0.0, 3), (0.9, 0)):
        held = np.zeros(len(ts), np.uint8)
        hold_out_latest(indptr, ts, fraction, last_n, held)
        for u in range(50):
            s, e = indptr[u], indptr[u + 1]
            n = e - s
            k = max(0, min(last_n if last_n else int(np.floor(fraction * n + 0.5)), n - 1))
            want = np.zeros(n, np.uint8)
            want[np.argsort(ts[s:e], kind="stable")[n - k:]] = 1 if k else 0
            assert (held[s:e] == want).all()


def test_group_dedup_flags_keep_the_test_rating_and_return_its_time():
    users = np.array([0, 0, 0, 1, 1], np.int32)
    items = np.array([3, 3, 2, 3, 3], np.int32)
    ratings = np.array([1, 2, 3, 4, 5], np.float32)
    ts = np.array([9, 1, 5, 1, 2], np.int64)
    flags = np.array([0, 1, 0, 0, 0], np.uint8)
    ip, oi, orr = np.empty(3, np.int64), np.empty(5, np.int32), np.empty(5, np.float32)
    ots, ofl = np.empty(5, np.int64), np.empty(5, np.uint8)
    nnz, dropped, across = group_dedup(users, items, ratings, ts, True, 2, 4, ip, oi, orr, False, flags, ots, ofl)
    assert (nnz, dropped, across) == (3, 2, 1)
    # user 0, item 3: the test rating (2, at time 1) wins over the later training one; user 1: the latest
    assert orr[:3].tolist() == [2, 3, 5] and ofl[:3].tolist() == [1, 0, 0] and ots[:3].tolist() == [1, 5, 2]


# --------------------------------------------------------------------------------------
# the user's own train and test files
# --------------------------------------------------------------------------------------


def _files(tmp_path):
    train = tmp_path / "u1.base"
    train.write_text("1\t10\t4\t100\n1\t11\t3\t101\n2\t10\t5\t102\n2\t12\t2\t103\n3\t11\t4\t104\n")
    # user 9 and item 99 are only in the test file; (1, 11) is in both
    test = tmp_path / "u1.test"
    test.write_text("1\t12\t5\t200\n2\t11\t1\t201\n9\t10\t3\t202\n1\t99\t4\t203\n1\t11\t2\t50\n")
    return train, test


def test_own_train_and_test_files(tmp_path, cli):
    train, test = _files(tmp_path)
    code, out, err, exc = cli.run("ingest", "--train", train, "--test", test, "--out", tmp_path / "s.zarr")
    assert code == 0, (err, exc)
    assert "1 users only in the test file" in out and "1 items only in the test file" in out
    assert "1 training ratings also in the test file (dropped from training)" in out
    st = open_store(tmp_path / "s.zarr")
    sp = st.attrs["split"]
    # the test rating 1 is below the training files' observed range [2, 5], the store's: clipped to 2, counted
    assert sp == {"kind": "files", "train": ["u1.base"], "test": ["u1.test"], "n_test_only_users": 1,
                  "n_test_only_items": 1, "n_train_ratings_also_in_test": 1, "n_test_ratings_clipped": 1}
    assert [s["split"] for s in st.attrs["sources"]] == ["train", "test"]
    assert _pairs(tmp_path / "s.zarr", "test") == {(1, 12), (2, 11), (9, 10), (1, 99), (1, 11)}
    assert _pairs(tmp_path / "s.zarr", "train") == {(1, 10), (2, 10), (2, 12), (3, 11)}
    # the pair in both files keeps the test file's rating, though the training one is later
    te = read_store(tmp_path / "s.zarr", "test")
    assert te[(te.user == 1) & (te.item == 11)].rating.tolist() == [2.0]
    info = json.loads(cli.run("info", tmp_path / "s.zarr", "--json")[1])
    assert info["split"]["kind"] == "files"
    # a model trains and evaluates on it, the user with no training rating included
    model = streamdp.train(st, method="means", epsilon=float("inf"), allow_nonprivate=True, seed=0)
    ev = streamdp.evaluate(model, st)
    assert ev["n_ratings"] == 5 and np.isfinite(ev["rmse"])


def test_own_files_are_checked_alike(tmp_path, cli):
    train, test = _files(tmp_path)
    test.write_text(test.read_text() + "4\t10\tfive\t300\n")
    cli.error(cli.run("ingest", "--train", train, "--test", test, "--out", tmp_path / "s.zarr"),
              "u1.test: line 6", "not a number")
    cli.error(cli.run("ingest", "--train", train, "--out", tmp_path / "s.zarr"), "--train", "--test FILE")
    cli.error(cli.run("ingest", "--train", train, "--test", test, "--out", tmp_path / "s.zarr", "--split",
                      "random"), "--split", "not with --test FILE")
    cli.error(cli.run("ingest", "--out", tmp_path / "s.zarr"), "INPUT", "--train FILE --test FILE")
    assert not (tmp_path / "s.zarr").exists()


def test_python_api_train_and_test_frames(tmp_path):
    df = synthetic_ratings(n=2000, str_users=False)
    a, b = df.iloc[:1500], df.iloc[1500:]
    st = streamdp.ingest(train=a, test=b, out=str(tmp_path / "s.zarr"))
    assert st.attrs["split"]["kind"] == "files" and st.n_test > 0
    both = pd.concat([read_store(tmp_path / "s.zarr"), read_store(tmp_path / "s.zarr", "test")])
    assert len(both) <= len(expected_after_dedup(df))
    with pytest.raises(streamdp.errors.ParameterError, match="test="):
        streamdp.ingest(train=a, out=str(tmp_path / "t.zarr"))


# --------------------------------------------------------------------------------------
# ';' separated files
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("header", [True, False])
def test_semicolon_is_detected(tmp_path, header):
    df = synthetic_ratings(n=1500, str_users=False)
    p = tmp_path / "r.csv"
    lines = [f"{r.user};{r.item};{r.rating:g};{r.timestamp}\n" for r in df.itertuples()]
    p.write_text(("userId;movieId;rating;timestamp\n" if header else "") + "".join(lines))
    st = streamdp.ingest(str(p), str(tmp_path / "s.zarr"))
    assert st.attrs["sources"][0]["format"] == "csv"
    same(read_store(tmp_path / "s.zarr"), expected_after_dedup(df))


# --------------------------------------------------------------------------------------
# item names
# --------------------------------------------------------------------------------------

NAMES_CSV = 'movieId,title,genres\n10,"Heat, the",Crime\n77,Not rated,x\n11,Jumanji (1995),Kids\n'


@pytest.fixture(scope="module")
def named(tmp_path_factory):
    d = tmp_path_factory.mktemp("named")
    rng = np.random.default_rng(0)
    rows = [(u, 10 + i, float(rng.integers(1, 6))) for u in range(80) for i in rng.choice(6, 4, replace=False)]
    pd.DataFrame(rows, columns=["user", "item", "rating"]).to_csv(d / "r.csv", index=False)
    (d / "names.csv").write_text(NAMES_CSV)
    st = streamdp.ingest(str(d / "r.csv"), str(d / "s.zarr"), item_names=str(d / "names.csv"), test_fraction=0.2)
    model = streamdp.train(st, method="means", epsilon=float("inf"), allow_nonprivate=True, seed=0, out=str(d / "m"))
    return d, st, model


def test_item_names_kept_in_the_store(named, cli):
    d, st, _ = named
    names = dict(zip(st.item_ids().tolist(), st.item_names().tolist()))
    assert names == {10: "Heat, the", 11: "Jumanji (1995)", 12: "", 13: "", 14: "", 15: ""}
    assert st.attrs["item_names"] == {"file": "names.csv", "n_lines": 3, "n_named": 2, "n_unmatched": 1,
                                      "public": True}
    out = cli.run("info", d / "s.zarr")[1]
    assert "item names       2 items named from names.csv (public metadata); 1 lines name no item" in out


@pytest.mark.parametrize("text,sep", [("10|Heat|01-Jan-1995|x\n11|Jumanji|y|z\n", "|"),
                                      ("10\tHeat\n11\tJumanji\n", "tab"), ("10::Heat::Crime\n11::Jumanji::Kids\n", "::"),
                                      ("id;name\n10;Heat\n11;Jumanji\n", ";")])
def test_item_names_files_of_other_shapes(tmp_path, text, sep):
    (tmp_path / "r.csv").write_text("user,item,rating\n1,10,4\n1,11,2\n2,10,5\n")
    (tmp_path / "n.txt").write_text(text)
    st = streamdp.ingest(str(tmp_path / "r.csv"), str(tmp_path / "s.zarr"), item_names=str(tmp_path / "n.txt"))
    assert dict(zip(st.item_ids().tolist(), st.item_names().tolist())) == {10: "Heat", 11: "Jumanji"}


def test_bad_item_names_file_is_one_line_naming_it(tmp_path, cli):
    (tmp_path / "r.csv").write_text("user,item,rating\n1,10,4\n1,11,2\n2,10,5\n")
    (tmp_path / "n.txt").write_text("10|Heat|x\n11|Jumanji\n")
    cli.error(cli.run("ingest", tmp_path / "r.csv", "--out", tmp_path / "s.zarr", "--item-names",
                      tmp_path / "n.txt"), "n.txt: line 2", "expected 3 fields")
    (tmp_path / "n.txt").write_bytes(b"10|Heat\n11|Caf\xe9\n")
    cli.error(cli.run("ingest", tmp_path / "r.csv", "--out", tmp_path / "s.zarr", "--item-names",
                      tmp_path / "n.txt"), "n.txt: line 2", "not UTF-8", "iconv")
    cli.error(cli.run("ingest", tmp_path / "r.csv", "--out", tmp_path / "s.zarr", "--item-names",
                      tmp_path / "none.txt"), "none.txt: no such file")
    assert not (tmp_path / "s.zarr").exists()


def test_recommend_shows_item_names(named, cli, tmp_path):
    d, st, model = named
    (tmp_path / "me.csv").write_text("12,5\n13,1\n")
    for source in (d / "s.zarr", d / "names.csv"):
        code, out, err, exc = cli.run("recommend", d / "m", "--ratings", tmp_path / "me.csv", "--item-names", source,
                                      "--top", 6)
        assert code == 0, (err, exc)
        lines = out.strip().splitlines()
        assert lines[0] == "item_id\tpredicted_rating\tname"
        got = {int(x.split("\t")[0]): x.split("\t")[2] for x in lines[1:]}
        assert got[10] == "Heat, the" and got[11] == "Jumanji (1995)" and got[14] == ""
        js = json.loads(cli.run("recommend", d / "m", "--ratings", tmp_path / "me.csv", "--item-names", source,
                                "--json")[1])
        assert dict(zip(js["items"], js["names"]))[10] == "Heat, the"
    # batch: the store's names by default
    code, _, err, exc = cli.run("recommend", d / "m", "--store", d / "s.zarr", "--out", tmp_path / "r.parquet")
    assert code == 0, (err, exc)
    t = pq.read_table(tmp_path / "r.parquet")
    assert t.column_names == ["user_id", "rank", "item_id", "item_name", "score"]
    pairs = set(zip(t.column("item_id").to_pylist(), t.column("item_name").to_pylist()))
    assert (10, "Heat, the") in pairs and (12, "") in pairs
    # Python: a stored user's list carries the names
    recs = model.recommend_user(st, 0, n=3)
    assert recs.names == [{10: "Heat, the", 11: "Jumanji (1995)"}.get(i, "") for i, _ in recs]


@pytest.mark.parametrize("names", [
    pd.DataFrame({"movieId": [10, 11], "title": ["Heat", "Jumanji"], "genres": ["a", "b"]}),
    pd.DataFrame({"a": ["10", "11"], "b": ["Heat", "Jumanji"]}),  # two columns: id, name (ids as typed)
    pd.DataFrame({"title": ["Heat", "Jumanji"]}, index=[10, 11]),
    pd.Series(["Heat", "Jumanji", "no such item"], index=[10, 11, 99]),
    {10: "Heat", 11: "Jumanji", "x": "not an id"},
], ids=["frame by header", "frame of two columns", "frame indexed by id", "series", "dict"])
def test_item_names_as_a_practitioner_holds_them(named, names):
    """Issue 40: a DataFrame (or ``item_names=True``) was a raw TypeError in ``recommend_all``."""
    _, st, model = named
    t = pa.concat_tables(list(model.recommend_all(st, 3, item_names=names)))
    got = dict(zip(t.column("item_id").to_pylist(), t.column("item_name").to_pylist()))
    assert got.get(10, "Heat") == "Heat" and got.get(11, "Jumanji") == "Jumanji" and got.get(12, "") == ""
    assert set(got) & {10, 11}


def test_item_names_true_false_and_other_values(named, tmp_path):
    from streamdp.errors import InputError

    _, st, model = named
    t = pa.concat_tables(list(model.recommend_all(st, 3, item_names=True)))
    assert "item_name" in t.column_names
    assert "item_name" not in pa.concat_tables(list(model.recommend_all(st, 3, item_names=False))).column_names
    for bad, said in ((42, "got int"), ([1, 2], "got list"), (pd.DataFrame({"a": [1], "b": [2], "c": [3]}),
                                                              "needs columns id and name")):
        with pytest.raises(InputError, match=said):
            list(model.recommend_all(st, 3, item_names=bad))
    plain = streamdp.ingest(pd.DataFrame({"user": [1, 1, 2], "item": [10, 11, 10], "rating": [4.0, 2.0, 5.0]}),
                            str(tmp_path / "p.zarr"))
    m = streamdp.train(plain, method="means", epsilon=float("inf"), seed=0, out=str(tmp_path / "m"), evaluate=False,
                       allow_nonprivate=True)
    with pytest.raises(InputError, match="keeps no item names"):
        list(m.recommend_all(plain, 1, item_names=True))


def test_item_names_beyond_a_quarter_of_the_memory_limit_are_refused(tmp_path):
    import pyarrow as pa

    from streamdp.errors import ParameterError
    from streamdp.storage.names import read_item_names

    (tmp_path / "n.csv").write_text("".join(f"{i},{'x' * 50} {i}\n" for i in range(200)))
    got = read_item_names(str(tmp_path / "n.csv"), pa.array(range(0, 400, 2)), 1 << 20)
    assert got.n_unmatched == 100 and got.names.to_pylist()[:2] == ["x" * 50 + " 0", "x" * 50 + " 2"]
    with pytest.raises(ParameterError, match="quarter of --memory-limit"):
        read_item_names(str(tmp_path / "n.csv"), pa.array(range(200)), 4000)
