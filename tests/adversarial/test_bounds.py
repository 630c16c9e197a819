"""Smaller findings of the second adversarial round: what the checksum covers, and limits that blamed the wrong thing.

Before:

* ``user_ids`` of a generated store were outside ``verify``'s checksum: swapping two ids
  passed ``verify``, and batch recommend then wrote lists under the swapped ids;
* ``recommend --top 100000`` on 200 items sized every block's lists by 100000 and blamed
  ``--memory-limit`` ("one block needs 14.4 GB");
* ``tune --grid iters=1000000`` had no bound (a run that never ends);
* ``--method means`` was refused on a store of fewer than 8 items, because of the default
  rank it does not use.
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import zarr


# -- user ids inside the checksum -----------------------------------------------------------------------------------


@pytest.mark.parametrize("string_ids", [False, True], ids=["int-ids", "string-ids"])
def test_swapped_user_ids_of_a_generated_store_fail_verify(tmp_path, string_ids, cli):
    from streamdp.storage.generate import generate_store

    p = tmp_path / "g.zarr"
    generate_store(str(p), n_users=500, n_items=40, ratings_per_user=5, rank=2, seed=1, block_users=100,
                   string_ids=string_ids)
    code, out, err, exc = cli.run("verify", p)
    assert code == 0 and "OK" in out and "user ids" not in out, (err, exc)
    a = zarr.open_group(str(p), mode="a")["user_ids"]
    ids = a[:]
    ids[[3, 250]] = ids[[250, 3]]  # two users of different blocks trade ids
    a[:] = ids
    cli.error(cli.run("verify", p), "checksum mismatch", "ids")


def test_the_writer_hashes_id_slices_only_in_order(tmp_path):
    import numpy as np

    from streamdp.storage.writer import StoreWriter

    with pytest.raises(ValueError, match="consecutive slices"):
        with StoreWriter(str(tmp_path / "w.zarr"), n_users=4, n_items=2, block_users=2) as w:
            uid = w.create_array("user_ids", shape=(4,), dtype="int64", chunks=(2,))
            uid[2:4] = np.arange(2, 4)
    assert not (tmp_path / "w.zarr").exists()


# -- recommend --top beyond the items ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def few_items(tmp_path_factory, cli):
    """A small store of 5 items (fewer than the default rank 8) and a means model of it."""
    d = tmp_path_factory.mktemp("few")
    src = d / "r.csv"
    src.write_text("user,item,rating\n" + "".join(f"{u},{i},{1 + (u * i + u) % 5}\n" for u in range(120)
                                                    for i in range(5) if (u + i) % 4))
    (d / "items.txt").write_text("0\n1\n2\n3\n4\n")  # declared: 120 users are too few to select 5 items privately
    code, _, err, exc = cli.run("ingest", src, "--out", d / "s.zarr", "--rating-range", "1,5",
                                "--test-fraction", "0.2", "--items", d / "items.txt")
    assert code == 0, (err, exc)
    return d


def test_means_trains_on_fewer_items_than_the_default_rank(few_items, tmp_path, cli):
    code, out, err, exc = cli.run("train", few_items / "s.zarr", "--method", "means", "--epsilon", "1", "--seed", "1",
                              "--out", tmp_path / "m")
    assert code == 0, (err, exc)
    assert "released item biases and the global mean (it fits no factors)" in out
    code, out, err, exc = cli.run("tune", few_items / "s.zarr", "--method", "means", "--epsilon", "1", "--seed", "1",
                              "--out", tmp_path / "t")
    assert code == 0, (err, exc)
    # a method that fits factors refuses more factors than items when they are asked for; its default rank is
    # capped at the catalogue's size (a privately selected catalogue's size is not known before the run)
    cli.error(cli.run("train", few_items / "s.zarr", "--method", "als", "--epsilon", "1", "--rank", "8", "--out",
                      tmp_path / "a"), "--rank 8 exceeds the number of items (5)")
    code, out, err, exc = cli.run("train", few_items / "s.zarr", "--method", "als", "--epsilon", "1", "--seed", "1",
                                  "--out", tmp_path / "b")
    assert code == 0 and json.loads((tmp_path / "b" / "model.json").read_text())["rank"] <= 5, (err, exc)


def test_top_beyond_the_items_is_capped_and_said(few_items, tmp_path, cli):
    code, _, err, exc = cli.run("train", few_items / "s.zarr", "--epsilon", "inf", "--yes", "--rank", "2", "--seed", "1",
                            "--out", tmp_path / "m")
    assert code == 0, (err, exc)
    code, out, err, exc = cli.run("recommend", tmp_path / "m", "--store", few_items / "s.zarr", "--out",
                              tmp_path / "r.parquet", "--top", "100000", "--memory-limit", "1GB")
    assert code == 0, (err, exc)
    assert "memory" not in err and "--top 100000 is more than the store's 5 items" in err, err
    assert "top 5 for" in out
    t = pq.read_table(tmp_path / "r.parquet")
    assert t.num_rows > 0 and max(t.column("rank").to_pylist()) <= 5


# -- tune --grid bounds ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("grid,words", [
    (["iters=1000000"], "iters is at most 100"),
    (["iters=2,101"], "iters is at most 100"),
    (["rank=100000"], "rank is at most 512"),
    (["iters=1,2,3,4,5,6,7,8,9", "rank=1,2,3,4,5,6,7,8"], "72 configurations, at most 64"),
])
def test_tune_grid_values_are_bounded(few_items, tmp_path, grid, words, cli):
    args = ["tune", few_items / "s.zarr", "--epsilon", "1", "--out", tmp_path / "t"]
    for g in grid:
        args += ["--grid", g]
    cli.error(cli.run(*args), "--grid", words)
    assert not (tmp_path / "t").exists()
