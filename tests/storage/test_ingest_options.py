"""``ingest --out-of-range error|clip|drop`` and the note on a headerless file's columns (issue 19, item 6)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from streamdp.cli import main
from streamdp.errors import ParameterError
from streamdp.storage.ingest import ingest
from streamdp.storage.store import open_store

# 3 of 12 ratings outside [1, 5]: 7 (line 4), 0 (line 8), 5.5 (line 11); one duplicate pair is not involved
ROWS = [(1, 10, 4), (1, 11, 7), (2, 10, 3), (2, 12, 5), (3, 11, 1), (3, 12, 2), (4, 10, 0), (4, 11, 3),
        (5, 12, 4), (5, 10, 5.5), (6, 11, 2), (6, 12, 1)]


def run(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    return r.exit_code, r.stdout, r.stderr, r.exception


@pytest.fixture
def csv(tmp_path):
    p = tmp_path / "r.csv"
    p.write_text("user,item,rating\n" + "".join(f"{u},{i},{r:g}\n" for u, i, r in ROWS))
    return p


def ratings(store) -> dict:
    """{(user id, item id): rating} of the train split."""
    s = open_store(store)
    uids, iids = s.user_ids(), s.item_ids()
    out = {}
    for blk in s.blocks("train"):
        for k in range(blk.n_users):
            a, b = blk.indptr[k], blk.indptr[k + 1]
            for it, r in zip(blk.items[a:b], blk.ratings[a:b]):
                out[(int(uids[blk.first_user + k]), int(iids[it]))] = float(r)
    return out


def test_out_of_range_error_names_the_line_and_the_options(tmp_path, csv):
    code, _, err, exc = run("ingest", csv, "--out", tmp_path / "s.zarr", "--rating-range", "1,5")
    assert code == 2, (err, exc)
    assert err.count("\n") == 1 and "r.csv: line 3: rating 7 outside --rating-range [1, 5]" in err
    assert "--out-of-range clip or drop" in err and "--skip-bad-lines" in err
    assert not (tmp_path / "s.zarr").exists()
    # the same explicitly
    assert run("ingest", csv, "--out", tmp_path / "s.zarr", "--rating-range", "1,5", "--out-of-range", "error")[0] == 2


def test_clip_clips_to_the_declared_range_and_counts(tmp_path, csv):
    code, out, err, exc = run("ingest", csv, "--out", tmp_path / "s.zarr", "--rating-range", "1,5",
                              "--out-of-range", "clip", "--json")
    assert code == 0, (err, exc)
    rep = json.loads(out)
    assert rep["out_of_range"] == "clip" and rep["n_out_of_range_clipped"] == 3 and rep["n_out_of_range_dropped"] == 0
    s = open_store(tmp_path / "s.zarr")
    assert s.n_ratings == 12 and s.attrs["n_out_of_range_clipped"] == 3 and s.attrs["out_of_range"] == "clip"
    assert s.attrs["n_bad_lines_skipped"] == 0 and s.attrs["params"]["out_of_range"] == "clip"
    got = ratings(tmp_path / "s.zarr")
    want = {(u, i): float(np.clip(r, 1, 5)) for u, i, r in ROWS}
    assert got == want


def test_drop_drops_and_counts(tmp_path, csv):
    code, out, err, exc = run("ingest", csv, "--out", tmp_path / "s.zarr", "--rating-range", "1,5",
                              "--out-of-range", "drop")
    assert code == 0, (err, exc)
    assert "3 out-of-range ratings dropped" in out
    s = open_store(tmp_path / "s.zarr")
    assert s.n_ratings == 9 and s.attrs["n_out_of_range_dropped"] == 3 and s.attrs["n_out_of_range_clipped"] == 0
    assert ratings(tmp_path / "s.zarr") == {(u, i): float(r) for u, i, r in ROWS if 1 <= r <= 5}


def test_skip_bad_lines_still_skips_out_of_range_by_default(tmp_path, csv):
    code, _, err, _ = run("ingest", csv, "--out", tmp_path / "s.zarr", "--rating-range", "1,5", "--skip-bad-lines")
    assert code == 0, err
    s = open_store(tmp_path / "s.zarr")
    assert s.n_ratings == 9 and s.attrs["n_bad_lines_skipped"] == 3 and s.attrs["out_of_range"] == "error"


def test_clip_keeps_non_finite_ratings_bad(tmp_path):
    p = tmp_path / "r.csv"
    p.write_text("user,item,rating\n1,1,4\n1,2,9\n2,1,nan\n")
    code, _, err, _ = run("ingest", p, "--out", tmp_path / "s.zarr", "--rating-range", "1,5", "--out-of-range", "clip")
    assert code == 2 and "line 4" in err and "not finite" in err
    code, _, err, _ = run("ingest", p, "--out", tmp_path / "s.zarr", "--rating-range", "1,5", "--out-of-range", "clip",
                          "--skip-bad-lines")
    assert code == 0, err
    s = open_store(tmp_path / "s.zarr")
    assert s.n_ratings == 2 and s.attrs["n_bad_lines_skipped"] == 1 and s.attrs["n_out_of_range_clipped"] == 1


@pytest.mark.parametrize("policy", ["clip", "drop", "error"])
def test_out_of_range_needs_a_declared_range(tmp_path, csv, policy):
    code, _, err, _ = run("ingest", csv, "--out", tmp_path / "s.zarr", "--out-of-range", policy)
    assert code == 2 and err.count("\n") == 1 and "--out-of-range" in err and "--rating-range" in err, err
    with pytest.raises(ParameterError, match="declared --rating-range"):
        ingest([str(csv)], str(tmp_path / "s.zarr"), out_of_range=policy)
    with pytest.raises(ParameterError, match="expected one of"):
        ingest([str(csv)], str(tmp_path / "s.zarr"), rating_range=(1, 5), out_of_range="wrap")


def test_parquet_clip(tmp_path):
    p = tmp_path / "r.parquet"
    pd.DataFrame(ROWS, columns=["user", "item", "rating"]).to_parquet(p)
    code, _, err, _ = run("ingest", p, "--out", tmp_path / "e.zarr", "--rating-range", "1,5")
    assert code == 2 and "row 2: rating 7 outside" in err and "--out-of-range" in err
    s = ingest([str(p)], str(tmp_path / "s.zarr"), rating_range=(1, 5), out_of_range="clip")
    assert s.attrs["n_out_of_range_clipped"] == 3 and s.n_ratings == 12


# --------------------------------------------------------------------------------------
# a file without a header
# --------------------------------------------------------------------------------------


def test_headerless_file_says_which_columns_it_took(tmp_path):
    p = tmp_path / "data.csv"
    p.write_text("".join(f"{u},{i},{r:g},{1000 + k}\n" for k, (u, i, r) in enumerate(ROWS) if r <= 5))
    code, out, err, exc = run("ingest", p, "--out", tmp_path / "s.zarr", "--json")
    assert code == 0, (err, exc)
    json.loads(out)  # stdout stays one JSON object: the note is on stderr
    notes = err.strip().splitlines()
    assert notes == [f"note: {p} has no header: columns taken by position as user=0, item=1, rating=2, "
                     f"timestamp=3 (0-based; use --columns USER,ITEM,RATING[,TIMESTAMP] to change)"]
    src = open_store(tmp_path / "s.zarr").attrs["sources"][0]
    assert src["header"] is False and src["columns"] == {"user": 0, "item": 1, "rating": 2, "timestamp": 3}


def test_headerless_whitespace_without_timestamp(tmp_path):
    p = tmp_path / "ratings.txt"
    p.write_text("1 10 3.5\n2 10 2\n2 11 4\n")
    code, _, err, _ = run("ingest", p, "--out", tmp_path / "s.zarr")
    assert code == 0 and "columns taken by position as user=0, item=1, rating=2, no timestamp" in err, err


def test_no_note_with_a_header_or_columns(tmp_path, csv):
    code, _, err, _ = run("ingest", csv, "--out", tmp_path / "a.zarr", "--rating-range", "0,10")
    assert code == 0 and err == "", err
    p = tmp_path / "swapped.csv"
    p.write_text("10,1,4\n10,2,3\n11,2,5\n")  # item,user,rating
    code, _, err, _ = run("ingest", p, "--out", tmp_path / "b.zarr", "--columns", "1,0,2")
    assert code == 0 and "no header" not in err, err
    s = open_store(tmp_path / "b.zarr")
    assert [int(x) for x in s.user_ids()] == [1, 2] and s.attrs["sources"][0]["columns"]["user"] == 1
