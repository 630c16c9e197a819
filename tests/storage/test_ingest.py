"""``streamdp ingest``: real data counts, round trip, formats, split, bad input."""

from __future__ import annotations

import gzip
import json
import os

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from streamdp import open_store
from streamdp.cli import main
from tests.conftest import shared_file


def run_cli(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    err = r.stderr if hasattr(r, "stderr") and r.stderr_bytes is not None else r.output
    out = r.stdout if r.stderr_bytes is not None else r.output  # notes on stderr are not part of the output
    return r.exit_code, out, err


def ingest_ok(*args):
    code, out, err = run_cli("ingest", *args)
    assert code == 0, err
    return out


def info_json(path):
    code, out, err = run_cli("info", path, "--json")
    assert code == 0, err
    return json.loads(out)


def read_store(path, split="train") -> pd.DataFrame:
    """Every rating of a split with original ids, read block by block."""
    s = open_store(path)
    uids, iids = s.user_ids(), s.item_ids()
    frames = []
    for b in s.blocks(split):
        users = np.repeat(np.arange(b.first_user, b.first_user + b.n_users), np.diff(b.indptr))
        assert (b.items >= 0).all() and (b.items < s.n_items).all()
        frames.append(pd.DataFrame({"user": uids[users], "item": iids[b.items], "rating": b.ratings}))
    return pd.concat(frames, ignore_index=True)


def synthetic_ratings(n=20_000, n_users=700, n_items=150, seed=0, str_users=True, str_items=False):
    """Ratings with duplicated pairs and timestamps (ties included), in input order."""
    rng = np.random.default_rng(seed)
    u = rng.integers(0, n_users, n)
    i = np.minimum(rng.zipf(1.6, n) - 1, n_items - 1)
    df = pd.DataFrame({
        "user": [f"u{x:04d}x" for x in u] if str_users else u * 5 + 3,
        "item": [f"it-{x}" for x in i] if str_items else i * 11 + 100,
        "rating": (rng.integers(1, 11, n) / 2.0).astype(np.float32),
        "timestamp": rng.integers(0, 50, n),  # few values: ties between duplicates
    })
    return df


def expected_after_dedup(df: pd.DataFrame, use_ts=True) -> pd.DataFrame:
    """Reference: the latest by timestamp, ties to the last seen; else the last seen."""
    d = df.reset_index(drop=True).assign(seq=np.arange(len(df)))
    d = d.sort_values(["timestamp", "seq"] if use_ts else ["seq"], kind="stable")
    d = d.drop_duplicates(["user", "item"], keep="last")
    return d[["user", "item", "rating"]]


def same(a: pd.DataFrame, b: pd.DataFrame):
    key = ["user", "item"]
    a = a.astype({"user": str, "item": str}).sort_values(key).reset_index(drop=True)
    b = b.astype({"user": str, "item": str}).sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b, check_dtype=False)


# --------------------------------------------------------------------------------------
# real data
# --------------------------------------------------------------------------------------


def test_ml100k_counts(tmp_path):
    src = shared_file("ml-100k", "u.data")
    ingest_ok(src, "--out", tmp_path / "s.zarr")
    d = info_json(tmp_path / "s.zarr")
    assert (d["n_users"], d["n_items"], d["n_ratings"], d["n_test"]) == (943, 1682, 100000, 0)
    assert (d["rating_min"], d["rating_max"], d["rating_range_source"]) == (1.0, 5.0, "observed")
    s = open_store(tmp_path / "s.zarr")
    assert s.attrs["created_with"] == "ingest" and s.attrs["sources"][0]["name"] == "u.data"
    assert s.attrs["sources"][0]["size"] == os.path.getsize(src)
    counts = s.item_counts()
    assert (np.diff(counts) <= 0).all() and counts.sum() == 100000
    assert s.user_counts().sum() == 100000
    assert list(s.user_ids()[:3]) == [1, 2, 3]  # users in sorted original id order


def test_filmtrust_duplicates(tmp_path):
    src = shared_file("filmtrust", "ratings.txt")
    out = ingest_ok(src, "--out", tmp_path / "f.zarr", "--json")
    rep = json.loads(out)
    assert rep["n_duplicates_dropped"] == 3 and rep["n_ratings"] == 35494
    s = open_store(tmp_path / "f.zarr")
    assert s.attrs["n_duplicates_dropped"] == 3 and s.n_ratings == 35494
    # no timestamps: the last seen wins (user 308, item 235: 4 at line 7412, then 1.5 at line 7468)
    df = read_store(tmp_path / "f.zarr")
    assert float(df[(df.user == 308) & (df.item == 235)].rating.iloc[0]) == 1.5
    assert float(df[(df.user == 308) & (df.item == 207)].rating.iloc[0]) == 3.0


# --------------------------------------------------------------------------------------
# round trip and formats
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("str_users,str_items", [(True, False), (False, True)])
def test_roundtrip_csv(tmp_path, monkeypatch, str_users, str_items):
    import streamdp.storage.ingest as ingest_mod

    df = synthetic_ratings(str_users=str_users, str_items=str_items)
    csv = tmp_path / "r.csv"
    df.rename(columns={"user": "userId", "item": "movieId"}).to_csv(csv, index=False)
    # partitions at their floor (4096 ratings) and tiny blocks: many partitions and blocks
    monkeypatch.setattr(ingest_mod, "_BYTES_PER_PART_RATING", 1 << 40)
    out = ingest_ok(csv, "--out", tmp_path / "s.zarr", "--block-users", 37, "--memory-limit", "84MB", "--json")
    assert len(json.loads(out)) and open_store(tmp_path / "s.zarr").n_blocks > 5
    exp = expected_after_dedup(df)
    rep = json.loads(out)
    assert rep["n_duplicates_dropped"] == len(df) - len(exp) > 0
    same(read_store(tmp_path / "s.zarr"), exp)
    s = open_store(tmp_path / "s.zarr")
    uids, iids = s.user_ids(), s.item_ids()
    assert uids.dtype.kind in ("UOT" if str_users else "i")
    assert iids.dtype.kind in ("UOT" if str_items else "i")
    assert list(uids) == sorted(uids)  # users by sorted original id
    counts = s.item_counts()
    ref = exp.groupby(exp["item"].astype(str)).size()
    assert list(counts) == [ref[str(x)] for x in iids]
    # items by descending count, ties by original id
    keys = list(zip(-counts, [x if not str_items else str(x) for x in iids]))
    assert keys == sorted(keys)
    ref_u = exp.groupby(exp["user"].astype(str)).size()
    assert list(s.user_counts()) == [ref_u[str(x)] for x in uids]
    assert s.rating_min == exp.rating.min() and s.rating_range_source == "observed"
    # items are sorted within each user
    for b in s.blocks():
        for j in range(b.n_users):
            seg = b.items[b.indptr[j]:b.indptr[j + 1]]
            assert (np.diff(seg) > 0).all()


def _write_formats(df: pd.DataFrame, d):
    """The same ratings in every supported format; returns {name: (path, extra args)}."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = df.itertuples(index=False)
    lines = [(str(r.user), str(r.item), f"{r.rating:g}", str(r.timestamp)) for r in rows]
    files = {}
    p = d / "u.data"
    p.write_text("".join("\t".join(x) + "\n" for x in lines))
    files["udata"] = (p, [])
    p = d / "ratings.dat.gz"
    with gzip.open(p, "wt") as f:
        f.write("".join("::".join(x) + "\n" for x in lines))
    files["dat"] = (p, [])
    p = d / "ratings.txt"
    p.write_text("".join(("  " if k % 7 == 0 else "") + " \t ".join(x) + "  \n" for k, x in enumerate(lines)))
    files["ws"] = (p, [])
    p = d / "ratings.csv"
    p.write_text('"userId","movieId","rating","timestamp"\n' + "".join(",".join(x) + "\n" for x in lines))
    files["csv"] = (p, [])
    p = d / "ratings.parquet"
    pq.write_table(pa.table({"user_id": df.user.to_numpy(), "item_id": df.item.to_numpy(),
                             "rating": df.rating.to_numpy(), "timestamp": df.timestamp.to_numpy()}), p,
                   row_group_size=1000)
    files["parquet"] = (p, [])
    p = d / "custom.txt"
    p.write_text("".join("|".join((x[3], "junk", x[1], x[0], x[2])) + "\n" for x in lines))
    files["custom"] = (p, ["--sep", "|", "--columns", "3,2,4,0"])
    p = d / "custom2.txt"
    p.write_text("".join(";;".join((x[0], x[1], x[2])) + "\n" for x in lines))
    files["custom-multichar"] = (p, ["--sep", ";;", "--columns", "0,1,2"])
    return files


@pytest.mark.parametrize("fmt", ["udata", "dat", "ws", "csv", "parquet", "custom", "custom-multichar"])
def test_formats(tmp_path, fmt):
    df = synthetic_ratings(n=3000, str_users=False, str_items=fmt == "custom")
    path, extra = _write_formats(df, tmp_path)[fmt]
    ingest_ok(path, "--out", tmp_path / "s.zarr", *extra)
    s = open_store(tmp_path / "s.zarr")
    if fmt in ("udata", "dat", "ws", "csv", "parquet", "custom"):
        assert s.attrs["params"]["formats"][0] == {"custom": "custom", "custom-multichar": "custom"}.get(fmt, fmt)
    same(read_store(tmp_path / "s.zarr"), expected_after_dedup(df, use_ts=fmt != "custom-multichar"))


def test_format_override_and_several_inputs(tmp_path):
    df = synthetic_ratings(n=2000, str_users=False)
    a, b = df.iloc[:1200], df.iloc[1200:]
    pa_ = tmp_path / "a.tsv"
    pa_.write_text("".join(f"{r.user}\t{r.item}\t{r.rating:g}\t{r.timestamp}\n" for r in a.itertuples()))
    pb = tmp_path / "b.tsv"
    pb.write_text("".join(f"{r.user}\t{r.item}\t{r.rating:g}\t{r.timestamp}\n" for r in b.itertuples()))
    ingest_ok(pa_, pb, "--format", "udata", "--out", tmp_path / "s.zarr", "--rating-range", "0.5,5")
    s = open_store(tmp_path / "s.zarr")
    assert (s.rating_min, s.rating_max, s.rating_range_source) == (0.5, 5.0, "declared")
    assert [x["name"] for x in s.attrs["sources"]] == ["a.tsv", "b.tsv"]
    same(read_store(tmp_path / "s.zarr"), expected_after_dedup(df))


def test_split(tmp_path):
    df = synthetic_ratings(n=30_000, n_users=400, n_items=400, str_users=False)
    csv = tmp_path / "r.csv"
    df.rename(columns={"user": "userId", "item": "movieId"}).to_csv(csv, index=False)
    F = 0.3
    ingest_ok(csv, "--out", tmp_path / "s.zarr", "--test-fraction", F, "--seed", 5, "--block-users", 64)
    s = open_store(tmp_path / "s.zarr")
    assert s.has_test and s.n_ratings + s.n_test == len(expected_after_dedup(df))
    for btr, bte in zip(s.blocks("train"), s.blocks("test")):
        for j in range(btr.n_users):
            tr = set(btr.items[btr.indptr[j]:btr.indptr[j + 1]].tolist())
            te = set(bte.items[bte.indptr[j]:bte.indptr[j + 1]].tolist())
            assert not tr & te
            n = len(tr) + len(te)
            assert abs(len(te) - F * n) <= 1.0
    same(pd.concat([read_store(tmp_path / "s.zarr"), read_store(tmp_path / "s.zarr", "test")]),
         expected_after_dedup(df))
    # deterministic in the seed
    ingest_ok(csv, "--out", tmp_path / "t.zarr", "--test-fraction", F, "--seed", 5, "--block-users", 64)
    assert open_store(tmp_path / "t.zarr").checksum == s.checksum


# --------------------------------------------------------------------------------------
# bad input: message names file and line, exit code 2, nothing left behind
# --------------------------------------------------------------------------------------

GOOD = "1\t10\t4\t100\n2\t10\t3\t101\n2\t11\t5\t102\n"

BAD_CASES = {
    # name: (content, bad line, expected words, extra args)
    "malformed": (GOOD + "3\t12\n" + GOOD, 4, "expected 4 fields", []),
    "not-a-number": (GOOD + GOOD + "3\t12\tfive\t103\n", 7, "not a number", []),
    "nan": (GOOD + "3\t12\tnan\t103\n", 4, "not finite", []),
    "inf": (GOOD + GOOD + GOOD + "3\t12\tinf\t103\n", 10, "not finite", []),
    "out-of-range": ("1\t10\t4\t100\n3\t12\t7\t103\n" + GOOD, 2, "outside --rating-range", ["--rating-range", "1,5"]),
    "bad-timestamp": (GOOD + "3\t12\t4\tyesterday\n", 4, "timestamp", []),
    "empty-id": (GOOD + "\t12\t4\t100\n", 4, "empty user id", []),
}


def _leftovers(d, keep):
    return sorted(set(os.listdir(d)) - set(keep))


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_lines(tmp_path, case):
    content, line, words, extra = BAD_CASES[case]
    p = tmp_path / "in.data"
    p.write_text(content)
    code, _, err = run_cli("ingest", p, "--out", tmp_path / "s.zarr", *extra)
    assert code == 2
    assert f"in.data: line {line}:" in err and words in err, err
    assert err.startswith("streamdp: error:") and "Traceback" not in err
    assert _leftovers(tmp_path, ["in.data"]) == []
    # with --skip-bad-lines: skipped and counted
    code, out, err = run_cli("ingest", p, "--out", tmp_path / "s.zarr", "--skip-bad-lines", "--json", *extra)
    assert code == 0, err
    rep = json.loads(out)
    assert rep["n_bad_lines_skipped"] == 1
    assert rep["n_ratings"] + rep["n_duplicates_dropped"] == content.count("\n") - 1
    assert _leftovers(tmp_path, ["in.data", "s.zarr"]) == []


@pytest.mark.parametrize("case", ["missing", "empty", "blank-lines", "unknown-format", "binary", "directory"])
def test_bad_files(tmp_path, case):
    p = tmp_path / "in.txt"
    if case == "empty":
        p.write_text("")
    elif case == "blank-lines":
        p.write_text("\n\n  \n")
    elif case == "unknown-format":
        p.write_text("hello\nworld\n")
    elif case == "binary":
        p.write_bytes(b"\x00\x01\x02garbage\x00" * 10)
    elif case == "directory":
        p.mkdir()
    good = tmp_path / "good.data"
    good.write_text(GOOD)
    keep = ["in.txt", "good.data"] if case != "missing" else ["good.data"]
    code, _, err = run_cli("ingest", good, p, "--out", tmp_path / "s.zarr")
    assert code == 2, err
    assert "in.txt" in err and err.startswith("streamdp: error:") and "Traceback" not in err
    assert {"missing": "no such file", "empty": "empty", "blank-lines": "empty", "unknown-format": "line 1",
            "binary": "line 1", "directory": "directory"}[case] in err
    assert _leftovers(tmp_path, keep) == []


def test_bad_options(tmp_path):
    good = tmp_path / "good.data"
    good.write_text(GOOD)
    for args, words in [(["--rating-range", "5,1"], "--rating-range"), (["--test-fraction", "1.5"], "--test-fraction"),
                        (["--memory-limit", "lots"], "--memory-limit"), (["--columns", "0"], "--columns"),
                        (["--format", "csv", "--columns", "user,item,rating"], "no column named")]:
        code, _, err = run_cli("ingest", good, "--out", tmp_path / "s.zarr", *args)
        assert code == 2 and words in err, (args, err)
        assert _leftovers(tmp_path, ["good.data"]) == []


def test_no_overwrite_without_force(tmp_path):
    good = tmp_path / "good.data"
    good.write_text(GOOD)
    ingest_ok(good, "--out", tmp_path / "s.zarr")
    before = open_store(tmp_path / "s.zarr").checksum
    good.write_text(GOOD + "9\t9\t1\t1\n")
    code, _, err = run_cli("ingest", good, "--out", tmp_path / "s.zarr")
    assert code == 2 and "already exists" in err
    assert open_store(tmp_path / "s.zarr").checksum == before
    ingest_ok(good, "--out", tmp_path / "s.zarr", "--force")
    assert open_store(tmp_path / "s.zarr").n_users == 3
    assert _leftovers(tmp_path, ["good.data", "s.zarr"]) == []


def test_mixed_int_and_string_ids(tmp_path):
    """An id column that is integer in the first lines but not later is read as strings."""
    p = tmp_path / "in.data"
    p.write_text(GOOD * 50 + "abc\t10\t2\t200\n")
    ingest_ok(p, "--out", tmp_path / "s.zarr")
    s = open_store(tmp_path / "s.zarr")
    assert sorted(map(str, s.user_ids())) == ["1", "2", "abc"]
    assert s.attrs["n_duplicates_dropped"] == 3 * 50 - 3


def test_budget_option(tmp_path):
    from streamdp.privacy.budget import StoreBudget

    good = tmp_path / "good.data"
    good.write_text(GOOD)
    ingest_ok(good, "--out", tmp_path / "s.zarr", "--budget", "2.5,1e-6")
    b = StoreBudget(tmp_path / "s.zarr").show()
    assert b["budget"]["epsilon"] == 2.5 and b["budget"]["delta"] == 1e-6
    code, _, err = run_cli("ingest", good, "--out", tmp_path / "t.zarr", "--budget", "0,1e-6")
    assert code == 2 and "epsilon" in err
    code, _, err = run_cli("ingest", good, "--out", tmp_path / "t.zarr", "--budget", "1,0.5")  # delta >= 1/n_users
    assert code == 2 and "delta" in err
    assert _leftovers(tmp_path, ["good.data", "s.zarr"]) == []


@pytest.mark.parametrize("fmt", ["csv", "ws"])
def test_parallel_byte_ranges(tmp_path, monkeypatch, fmt):
    """Large files are parsed as byte ranges in threads: same result, same error lines."""
    from streamdp.storage import formats

    monkeypatch.setattr(formats, "PARALLEL_MIN_BYTES", 1)
    df = synthetic_ratings(n=5000, str_users=False)
    path, extra = _write_formats(df, tmp_path)[fmt]
    assert len(formats.byte_ranges(str(path), 2)) == 2
    ingest_ok(path, "--out", tmp_path / "s.zarr", *extra)
    same(read_store(tmp_path / "s.zarr"), expected_after_dedup(df))
    lines = path.read_text().splitlines(keepends=True)
    lines[4000] = lines[4000].replace("\t", "  ").rstrip() + " 1e999 \n" if fmt == "ws" else "1,2,nan,3\n"
    path.write_text("".join(lines))
    code, _, err = run_cli("ingest", path, "--out", tmp_path / "t.zarr", *extra)
    assert code == 2 and f"line {4001}:" in err, err
    assert not (tmp_path / "t.zarr").exists()


def test_bad_gz_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = tmp_path / "in.data.gz"
    with gzip.open(p, "wt") as f:
        f.write(GOOD * 3 + "3\t12\n")
    code, _, err = run_cli("ingest", p, "--out", tmp_path / "s.zarr")
    assert code == 2 and "in.data.gz: line 10:" in err, err
    q = tmp_path / "in.parquet"
    pq.write_table(pa.table({"userId": [1, 2, 3], "movieId": [5, 6, 7], "rating": [1.0, float("nan"), 2.0]}), q)
    code, _, err = run_cli("ingest", q, "--out", tmp_path / "s.zarr")
    assert code == 2 and "in.parquet: row 2: rating nan is not finite" in err, err
    pq.write_table(pa.table({"userId": [1, None, 3], "movieId": [5, 6, 7], "rating": [1.0, 2.0, 2.0]}), q)
    code, _, err = run_cli("ingest", q, "--out", tmp_path / "s.zarr")
    assert code == 2 and "in.parquet: row 2: missing user" in err, err
    assert _leftovers(tmp_path, ["in.data.gz", "in.parquet"]) == []


def test_a_parquet_file_of_many_row_groups_is_parsed_in_parallel_runs_and_its_first_bad_row_named(tmp_path):
    """Row groups are cut into runs parsed by parallel threads, rows numbered from the file's first: the store is
    the one-thread parse's, and with bad rows in both runs the error names the first (row 1,501, not 4,001)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from streamdp.storage.formats import resolve_spec, row_group_ranges

    rng = np.random.default_rng(2)
    n = 6000
    t = pa.table({"userId": rng.integers(0, 300, n), "movieId": rng.integers(0, 50, n),
                  "rating": rng.integers(1, 6, n).astype(float)})
    q = tmp_path / "in.parquet"
    pq.write_table(t, q, row_group_size=1000)
    assert row_group_ranges(resolve_spec(str(q)), 2) == [(0, 3), (3, 6)]
    assert row_group_ranges(resolve_spec(str(q)), 1) == [None]
    ingest_ok(q, "--out", tmp_path / "s.zarr")
    df = pd.DataFrame({"user": t["userId"].to_numpy(), "item": t["movieId"].to_numpy(), "rating": t["rating"].to_numpy()})
    same(read_store(tmp_path / "s.zarr"), expected_after_dedup(df, use_ts=False))
    r = t["rating"].to_numpy().copy()
    r[[1500, 4000]] = np.nan
    pq.write_table(t.set_column(2, "rating", pa.array(r)), q, row_group_size=1000)
    code, _, err = run_cli("ingest", q, "--out", tmp_path / "t.zarr")
    assert code == 2 and "in.parquet: row 1501: rating nan is not finite" in err, err


# --------------------------------------------------------------------------------------
# careless input: header names, memory limit
# --------------------------------------------------------------------------------------

ROWS = [("7", "a", "4", "100"), ("7", "b", "3", "101"), ("9", "a", "5", "102")]


@pytest.mark.parametrize("header,order", [
    ("userId,movieId,rating,timestamp", (0, 1, 2, 3)),
    ("rating,userId,movieId", (2, 0, 1)),                     # by name, not by position
    ('"User ID","item_id",Stars,ts', (0, 1, 2, 3)),
    ("score,uid,iid", (2, 0, 1)),
    ("TIMESTAMP,ITEM,USER,RATING", (3, 1, 0, 2)),
])
def test_header_columns_are_mapped_by_name(tmp_path, header, order):
    p = tmp_path / "r.csv"
    p.write_text(header + "\n" + "".join(",".join(r[k] for k in order) + "\n" for r in ROWS))
    ingest_ok(p, "--out", tmp_path / "s.zarr")
    same(read_store(tmp_path / "s.zarr"),
         pd.DataFrame({"user": [7, 7, 9], "item": ["a", "b", "a"], "rating": [4.0, 3.0, 5.0]}))


@pytest.mark.parametrize("header,words", [
    ("foo,bar,baz", "unknown column name(s) 'foo', 'bar', 'baz'; no user, item or rating column"),
    ("user,item,timestamp", "no rating column"),
    ("user,item,rating,comment", "unknown column name(s) 'comment'"),
    ("user,user_id,item,rating", "more than one user column"),
])
def test_header_without_rating_or_with_unknown_names_is_an_error(tmp_path, header, words):
    p = tmp_path / "r.csv"
    p.write_text(header + "\n" + "".join(",".join(r[:len(header.split(","))]) + "\n" for r in ROWS))
    code, _, err = run_cli("ingest", p, "--out", tmp_path / "s.zarr")
    assert code == 2 and err.startswith("streamdp: error: ") and err.count("\n") == 1, err
    assert f"r.csv: line 1: header {header}: {words}" in err and "--columns USER,ITEM,RATING" in err, err
    assert _leftovers(tmp_path, ["r.csv"]) == []


def test_unknown_header_mapped_with_columns_and_headerless_by_position(tmp_path):
    p = tmp_path / "r.csv"
    p.write_text("foo,bar,baz,qux\n" + "".join(f"{r[3]},{r[0]},{r[1]},{r[2]}\n" for r in ROWS))
    ingest_ok(p, "--out", tmp_path / "s.zarr", "--columns", "bar,baz,qux,foo")
    exp = pd.DataFrame({"user": [7, 7, 9], "item": ["a", "b", "a"], "rating": [4.0, 3.0, 5.0]})
    same(read_store(tmp_path / "s.zarr"), exp)
    q = tmp_path / "plain.csv"  # no header: user, item, rating[, timestamp] by position, as before
    q.write_text("".join(",".join(r) + "\n" for r in ROWS))
    ingest_ok(q, "--out", tmp_path / "t.zarr")
    same(read_store(tmp_path / "t.zarr"), exp)


def test_parquet_columns_by_name(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    q = tmp_path / "in.parquet"
    pq.write_table(pa.table({"title": ["x", "y", "z"], "Rating": [4.0, 3.0, 5.0], "movie_id": ["a", "b", "a"],
                             "UserId": [7, 7, 9]}), q)
    ingest_ok(q, "--out", tmp_path / "s.zarr")  # other Parquet columns are ignored
    same(read_store(tmp_path / "s.zarr"),
         pd.DataFrame({"user": [7, 7, 9], "item": ["a", "b", "a"], "rating": [4.0, 3.0, 5.0]}))
    pq.write_table(pa.table({"user": [1], "item": [2], "timestamp": [3]}), q)
    code, _, err = run_cli("ingest", q, "--out", tmp_path / "t.zarr")
    assert code == 2 and "in.parquet: columns user,item,timestamp: no rating column" in err, err
    assert not (tmp_path / "t.zarr").exists()


def test_memory_limit_below_what_ingest_can_keep_is_an_error(tmp_path):
    from streamdp.storage.ingest import min_memory_limit

    good = tmp_path / "good.data"
    good.write_text(GOOD)
    need = min_memory_limit()
    for limit in ("1KB", str(need - 1)):
        code, _, err = run_cli("ingest", good, "--out", tmp_path / "s.zarr", "--memory-limit", limit)
        assert code == 2 and err.startswith("streamdp: error: --memory-limit ") and err.count("\n") == 1, err
        assert "too small for ingest" in err and f"use --memory-limit {-(-need // 10**6)}MB or more" in err, err
        assert _leftovers(tmp_path, ["good.data"]) == []
    ingest_ok(good, "--out", tmp_path / "s.zarr", "--memory-limit", str(need))
