"""Interaction logs (clicks, plays, purchases) into an implicit store (issue 29, item 2)."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from streamdp.cli import main
from streamdp.errors import InputError, ParameterError
from streamdp.storage.generate import generate_store
from streamdp.storage.info import format_info, store_summary
from streamdp.storage.ingest import ingest
from streamdp.storage.store import open_store

LOG = [(1, "a"), (1, "b"), (2, "a"), (1, "a"), (3, "c"), (1, "a")]  # (1, a) three times


def run(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    return r.exit_code, r.stdout, r.stderr, r.exception


def pairs(store, split="train") -> dict:
    """{(user id, item id): value} of one split."""
    s = store if hasattr(store, "blocks") else open_store(store)
    uids, iids = s.user_ids(), s.item_ids()
    out = {}
    for blk in s.blocks(split):
        for k in range(blk.n_users):
            a, b = blk.indptr[k], blk.indptr[k + 1]
            for it, r in zip(blk.items[a:b], blk.ratings[a:b]):
                out[(uids[blk.first_user + k].item(), str(iids[it]))] = float(r)
    return out


@pytest.fixture
def log(tmp_path):
    p = tmp_path / "log.csv"
    p.write_text("user,item\n" + "".join(f"{u},{i}\n" for u, i in LOG))
    return p


def test_two_column_log_aggregates_repeated_pairs_into_counts(tmp_path, log):
    code, out, err, exc = run("ingest", log, "--columns", "user,item", "--out", tmp_path / "s.zarr")
    assert code == 0, (err, exc)
    assert "implicit" in out and "2 repeated interactions aggregated into counts" in out
    s = open_store(tmp_path / "s.zarr")
    assert s.implicit and s.attrs["value"] == "count" and s.attrs["count_cap"] is None
    assert s.attrs["format_version"] == 2 and s.attrs["n_duplicates_aggregated"] == 2
    assert pairs(s) == {(1, "a"): 3.0, (1, "b"): 1.0, (2, "a"): 1.0, (3, "c"): 1.0}
    assert (s.rating_min, s.rating_max, s.rating_range_source) == (1.0, 3.0, "observed")
    assert s.item_counts().tolist() == [2, 1, 1]  # users per item, not summed counts
    # the same without --columns: a header with user and item and no rating names a log
    s2 = ingest([str(log)], str(tmp_path / "t.zarr"))
    assert s2.implicit and pairs(s2) == pairs(s)


def test_count_column_sums_weights_and_caps(tmp_path):
    p = tmp_path / "plays.csv"
    p.write_text("user_id,item_id,plays\n1,a,3\n1,b,2.5\n2,a,1\n1,a,4\n")
    s = ingest([str(p)], str(tmp_path / "s.zarr"), count_cap=5)
    assert s.implicit and s.attrs["value"] == "weight"  # 2.5 is not an integer count
    assert pairs(s) == {(1, "a"): 5.0, (1, "b"): 2.5, (2, "a"): 1.0}  # 3 + 4 = 7, capped at 5
    assert s.attrs["n_counts_capped"] == 1 and s.attrs["count_cap"] == 5.0
    assert (s.rating_min, s.rating_max, s.rating_range_source) == (0.0, 5.0, "declared")
    # --columns names the count column of a file whose header also has a rating-like extra column
    q = tmp_path / "q.csv"
    q.write_text("u,i,clicks,ts\n1,a,2,10\n1,a,1,5\n")
    s = ingest([str(q)], str(tmp_path / "q.zarr"), columns="u,i,clicks,ts")
    assert s.implicit and pairs(s) == {(1, "a"): 3.0}  # summed, whatever the timestamps


@pytest.mark.parametrize("kind", ["tsv.gz", "parquet", "headerless"])
def test_formats(tmp_path, kind):
    rows = [(7, 1, 2), (7, 2, 1), (8, 1, 1), (7, 1, 1)]
    if kind == "parquet":
        p = tmp_path / "log.parquet"
        pd.DataFrame(rows, columns=["user", "item", "count"]).to_parquet(p)
        s = ingest([str(p)], str(tmp_path / "s.zarr"))
    elif kind == "tsv.gz":
        p = tmp_path / "log.tsv.gz"
        with gzip.open(p, "wt") as f:
            f.write("".join(f"{u}\t{i}\t{c}\n" for u, i, c in rows))
        s = ingest([str(p)], str(tmp_path / "s.zarr"), implicit=True)
    else:
        p = tmp_path / "log.txt"
        p.write_text("".join(f"{u} {i}\n" for u, i, _ in rows))
        s = ingest([str(p)], str(tmp_path / "s.zarr"), columns="0,1")
    want = {(7, "1"): 3.0, (7, "2"): 1.0, (8, "1"): 1.0} if kind != "headerless" else \
        {(7, "1"): 2.0, (7, "2"): 1.0, (8, "1"): 1.0}
    assert s.implicit and pairs(s) == want


@pytest.mark.parametrize("value, why", [("0", "count 0 is not positive"), ("-2", "count -2 is not positive"),
                                        ("nan", "count 'nan' is not finite"), ("inf", "count 'inf' is not finite"),
                                        ("x", "count 'x' is not a number")])
def test_bad_counts_are_one_line_errors_naming_the_line(tmp_path, value, why):
    p = tmp_path / "log.csv"
    p.write_text(f"user,item,count\n1,a,2\n2,b,{value}\n")
    code, _, err, exc = run("ingest", p, "--out", tmp_path / "s.zarr")
    assert code == 2, (err, exc)
    assert err.count("\n") == 1 and f"log.csv: line 3: {why}" in err
    assert not (tmp_path / "s.zarr").exists()
    # --skip-bad-lines skips and counts it
    s = ingest([str(p)], str(tmp_path / "t.zarr"), skip_bad_lines=True)
    assert s.attrs["n_bad_lines_skipped"] == 1 and pairs(s) == {(1, "a"): 2.0}


def test_bad_parquet_count(tmp_path):
    p = tmp_path / "log.parquet"
    pd.DataFrame({"user": [1, 2], "item": [1, 2], "count": [1.0, 0.0]}).to_parquet(p)
    with pytest.raises(InputError, match="row 2: count 0 is not positive"):
        ingest([str(p)], str(tmp_path / "s.zarr"))


def test_options_that_do_not_fit(tmp_path, log):
    with pytest.raises(ParameterError, match="--rating-range: not for an interaction log"):
        ingest([str(log)], str(tmp_path / "s.zarr"), rating_range="1,5")
    with pytest.raises(ParameterError, match="--count-cap must be"):
        ingest([str(log)], str(tmp_path / "s.zarr"), count_cap=0)
    r = tmp_path / "r.csv"
    r.write_text("user,item,rating\n1,a,4\n")
    with pytest.raises(ParameterError, match="--count-cap: only for an interaction log"):
        ingest([str(r)], str(tmp_path / "s.zarr"), count_cap=3)
    with pytest.raises(InputError, match="cannot go into one store with the ratings"):
        ingest([str(log), str(r)], str(tmp_path / "s.zarr"))
    two = tmp_path / "two.csv"
    two.write_text("1,2\n3,4\n")
    code, _, err, _ = run("ingest", two, "--out", tmp_path / "s.zarr")
    assert code == 2 and err.count("\n") == 1 and "pass --implicit" in err
    assert not (tmp_path / "s.zarr").exists()


def test_held_out_interactions(tmp_path):
    rng = np.random.default_rng(0)
    p = tmp_path / "log.csv"
    p.write_text("user,item\n" + "".join(f"{u},{i}\n" for u, i in zip(rng.integers(0, 40, 2000),
                                                                       rng.integers(0, 60, 2000))))
    s = ingest([str(p)], str(tmp_path / "s.zarr"), test_fraction=0.2, seed=1)
    assert s.implicit and s.has_test and s.n_test > 0
    train, test = pairs(s), pairs(s, "test")
    assert not set(train) & set(test)
    assert sum(train.values()) + sum(test.values()) == 2000  # every interaction is in one split


def test_info_and_older_stores(tmp_path, log):
    s = ingest([str(log)], str(tmp_path / "s.zarr"), count_cap=2)
    d = store_summary(s.path)
    assert d["implicit"] and d["value"] == "count" and d["count_cap"] == 2.0
    assert "implicit: interactions" in format_info(d) and "declared cap 2" in format_info(d)
    code, out, _, _ = run("info", s.path, "--json")
    assert code == 0 and json.loads(out)["implicit"] is True
    # a rating store (and any store written before implicit stores) reads as explicit, format version 1
    g = generate_store(str(tmp_path / "g.zarr"), n_users=20, n_items=5, ratings_per_user=3, seed=0)
    assert g.implicit is False and "implicit" not in g.attrs and g.attrs["format_version"] == 1
    assert store_summary(g.path)["implicit"] is False


def test_wrong_field_count_and_checksum_covers_the_kind(tmp_path, log):
    import zarr

    from streamdp.errors import StoreError
    from streamdp.storage.schema import ATTRS_KEY
    from streamdp.stream.verify import verify_store

    bad = tmp_path / "bad.csv"
    bad.write_text("user,item\n1,a\n2,b,3\n")
    code, _, err, _ = run("ingest", bad, "--out", tmp_path / "b.zarr")
    assert code == 2 and err.count("\n") == 1 and "bad.csv: line 3: expected 2 fields, got 3" in err
    s = ingest([str(log)], str(tmp_path / "s.zarr"))
    assert verify_store(s.path)["ok"]
    g = zarr.open_group(s.path, mode="r+")
    attrs = dict(g.attrs[ATTRS_KEY])
    attrs["implicit"] = False  # counts relabelled as ratings: no longer the store that was written
    g.attrs[ATTRS_KEY] = attrs
    with pytest.raises(StoreError, match="checksum"):
        verify_store(s.path)
