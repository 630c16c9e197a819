"""Ratings no method can use: a value that overflows float32, a range of width zero.

Before:

* a rating of ``1e39`` in a CSV (finite as float64, ``inf`` as the store's float32) was
  stored as ``inf``; ``verify`` said OK, ``train`` exited 0 after a RuntimeWarning with an
  item bias of -4e37 and a rating range max of 1e39;
* a store whose ratings are all equal (observed range ``[4, 4]``) was written, and then
  ``als``/``irls`` ended in ``ZeroDivisionError``, oja/svd/fw/sgld in obscure messages
  ("L: expected a positive number ... got 0.0", "--kappa must be > ... got -0.0").

Now the overflowing value is a bad line (file and line; Parquet: row) at ingest and the
store writer refuses any non-finite rating; ``verify`` flags an existing store holding one;
ingest refuses all-equal ratings without ``--rating-range`` and every method refuses an
empty range, each in one line naming the fix.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamdp.storage import ingest as ingest_mod
from streamdp.storage import writer as writer_mod
from streamdp.storage.store import open_store


def csv(tmp_path, rows, name="r.csv"):
    p = tmp_path / name
    p.write_text("user,item,rating\n" + "".join(f"{u},{i},{r}\n" for u, i, r in rows))
    return p


def overflow_rows():
    rows = [(u, i, 1 + (u + i) % 5) for u in range(40) for i in range(6)]
    rows[17] = (rows[17][0], rows[17][1], "1e39")
    return rows


# -- a rating that overflows float32 --------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["1e39", "-3.5e38", "1e300"])
def test_overflowing_rating_is_a_bad_line(tmp_path, value, cli):
    rows = overflow_rows()
    rows[17] = (rows[17][0], rows[17][1], value)
    src = csv(tmp_path, rows)
    cli.error(cli.run("ingest", src, "--out", tmp_path / "s.zarr"), "r.csv: line 19:", f"rating '{value}'",
                 "float32")
    cli.error(cli.run("ingest", src, "--out", tmp_path / "s.zarr", "--rating-range", "1,5", "--out-of-range", "clip"),
                 "r.csv: line 19:", "float32")  # not clipped: not a number the store can hold
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.csv"]
    code, _, err, exc = cli.run("ingest", src, "--out", tmp_path / "s.zarr", "--skip-bad-lines")
    assert code == 0, (err, exc)
    st = open_store(tmp_path / "s.zarr")
    assert st.attrs["n_bad_lines_skipped"] == 1 and (st.rating_min, st.rating_max) == (1.0, 5.0)


def test_overflowing_rating_in_parquet_names_its_row(tmp_path, cli):
    src = tmp_path / "r.parquet"
    pq.write_table(pa.table({"user": [1, 1, 2, 3], "item": [1, 2, 1, 2], "rating": [4.0, 3.0, 1e39, 2.0]}), src)
    cli.error(cli.run("ingest", src, "--out", tmp_path / "s.zarr"), "r.parquet: row 3:", "float32")
    assert not (tmp_path / "s.zarr").exists()


def test_the_store_writer_refuses_non_finite_ratings(tmp_path):
    from streamdp.errors import StoreError

    with pytest.raises(StoreError, match="not finite"):
        with writer_mod.StoreWriter(str(tmp_path / "w.zarr"), n_users=2, n_items=2, block_users=2) as w:
            w.write_block(0, np.array([0, 1, 2]), np.array([0, 1]), np.array([4.0, 1e39]))
    assert not (tmp_path / "w.zarr").exists()


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_verify_flags_an_existing_store_with_an_infinite_rating(tmp_path, monkeypatch, cli):
    # the store as the old ingest wrote it: the rating stored as inf, rating_max 1e39, a consistent checksum
    monkeypatch.setattr(ingest_mod, "storable_ratings", lambda r: np.isfinite(r), raising=False)
    monkeypatch.setattr(writer_mod, "check_finite_ratings", lambda b, r: None, raising=False)
    src = csv(tmp_path, overflow_rows())
    code, _, err, exc = cli.run("ingest", src, "--out", tmp_path / "s.zarr", "--test-fraction", "0.2")
    assert code == 0, (err, exc)
    monkeypatch.undo()
    assert open_store(tmp_path / "s.zarr").rating_max == 1e39
    cli.error(cli.run("verify", tmp_path / "s.zarr"), "s.zarr", "rating_max 1e+39", "float32")
    cli.error(cli.run("train", tmp_path / "s.zarr", "--epsilon", "1", "--rank", "2", "--out", tmp_path / "m"),
                 "float32",
                 "--rating-range")
    assert not (tmp_path / "m").exists()


# -- all ratings equal ----------------------------------------------------------------------------------------------


def equal_rows():
    return [(u, i, 4) for u in range(60) for i in range(0, 12, 1 + u % 3)]


def test_all_equal_ratings_are_refused_at_ingest(tmp_path, cli):
    src = csv(tmp_path, equal_rows())
    cli.error(cli.run("ingest", src, "--out", tmp_path / "s.zarr"), "r.csv", "every rating is 4", "[4, 4]",
                 "--rating-range LO,HI")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.csv"]
    code, _, err, exc = cli.run("ingest", src, "--out", tmp_path / "s.zarr", "--rating-range", "1,5")
    assert code == 0, (err, exc)


@pytest.fixture(scope="module")
def equal_store(tmp_path_factory, cli):
    """A store of equal ratings as the old ingest wrote it (observed range [4, 4])."""
    d = tmp_path_factory.mktemp("equal")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ingest_mod, "check_observed_range", lambda *a: None, raising=False)
        code, _, err, exc = cli.run("ingest", csv(d, equal_rows()), "--out", d / "s.zarr", "--test-fraction", "0.2")
    assert code == 0, (err, exc)
    st = open_store(d / "s.zarr")
    assert (st.rating_min, st.rating_max) == (4.0, 4.0)
    return d / "s.zarr"


@pytest.mark.parametrize("method,extra", [("als", []), ("irls", []), ("means", []), ("oja", []), ("svd", []),
                                          ("fw", []), ("sgld", []), ("sgd", []),
                                          ("public-private", ["--public-fraction", "0.3"])])
def test_every_method_refuses_an_empty_range(equal_store, tmp_path, method, extra, cli):
    eps = "inf" if method in ("sgd", "public-private") else "1"
    rank = () if method == "means" else ("--rank", "2")  # means refuses --rank (it fits no factors)
    cli.error(cli.run("train", equal_store, "--method", method, "--epsilon", eps, "--yes", *rank, "--out",
                     tmp_path / "m", *extra), "[4, 4] is empty", "--rating-range LO,HI")
    assert not (tmp_path / "m").exists()


def test_lowrank_and_tune_refuse_an_empty_range(equal_store, tmp_path, cli):
    cli.error(cli.run("lowrank", equal_store, "--rank", "2", "--epsilon", "1", "--out", tmp_path / "l"),
                 "[4, 4] is empty", "--rating-range")
    cli.error(cli.run("tune", equal_store, "--epsilon", "1", "--out", tmp_path / "t"), "[4, 4] is empty",
                 "--rating-range")
