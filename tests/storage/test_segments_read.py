"""What a segmented store's read of one split skips gives the blocks of a merge of every part's every split: a
segment's other split where it replaces nothing of the wanted one, the base's other split, small segments' blocks
kept in memory after their first read (each segment's, or all of them merged among themselves)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import streamdp
from streamdp.storage.segments import CACHE_BYTES, SegmentedStore
from streamdp.storage.store import open_store


def _segmented(tmp_path, test_fraction: float = 0.3) -> SegmentedStore:
    """A base split at random and three appends re-rating some of its pairs (so held out now and then) and
    adding new ones, all of users 0..99: the blocks of users 100.. untouched."""
    rng = np.random.default_rng(3)
    old = pd.DataFrame({"user": rng.integers(0, 200, 4000), "item": rng.integers(0, 30, 4000),
                        "rating": rng.integers(1, 6, 4000).astype(float)})
    p = str(tmp_path / "s.zarr")
    streamdp.ingest(old, p, block_users=32, test_fraction=test_fraction, seed=1)
    for k in range(3):
        again = old[old.user < 100].sample(15, random_state=k).assign(rating=float(k + 1))
        fresh = pd.DataFrame({"user": rng.integers(0, 100, 30), "item": rng.integers(0, 35, 30),
                              "rating": rng.integers(1, 6, 30).astype(float)})
        streamdp.ingest(pd.concat([again, fresh]), p, append=True)
    st = open_store(p)
    assert isinstance(st, SegmentedStore) and len(st.segments) == 3
    return st


@pytest.mark.parametrize("premerge", [False, True])
def test_a_read_of_one_split_skips_what_changes_nothing(tmp_path, premerge, monkeypatch):
    import streamdp.storage.segments as S

    st = _segmented(tmp_path)
    assert st._premerge  # three small segments of an explicit store: merged among themselves by default
    if not premerge:  # each segment's blocks kept alone
        monkeypatch.setattr(S, "PREMERGED_BYTES", 0)
        st = open_store(st.path)
        assert not st._premerge and st._keeps == {1, 2, 3}
    flags = [st._supersedes(i) for i in range(1, len(st.parts))]
    assert all(f is not None for f in flags)
    assert any(f.any() for f in flags) and not all(f.all() for f in flags)  # some blocks read the other split
    assert not st._needed(0, 0, "test", "train") and not st._needed(0, 0, "train", "test")

    plain = {id(p): p.read_block for p in st.parts}

    def every_source(b, s):
        return st._merge(b, st._sources(b, lambda p, bb, sp: (plain[id(p)](bb, sp), True)), s)[0]

    reads = []
    for i, seg in enumerate(st.segments):  # count the merged reads' reads of segments (an attribute over the method)
        seg.read_block = lambda b, s, i=i, f=seg.read_block: reads.append((i, b, s)) or f(b, s)
    for rep, splits in enumerate([("train",), ("test",), ("train", "test")]):
        for b in range(st.n_blocks):
            for s in splits:
                got, ref = st.read_block(b, s), every_source(b, s)
                assert got.first_user == ref.first_user and np.array_equal(got.indptr, ref.indptr)
                assert np.array_equal(got.items, ref.items) and np.array_equal(got.ratings, ref.ratings)
        if rep == 0 and premerge:  # every segment's every block once, merged among themselves for good
            assert sorted(reads) == sorted((i, b, s) for i in range(3) for b in range(st.n_blocks)
                                           for s in ("train", "test"))
        elif rep == 0:  # every segment's train blocks once, its test blocks only where they replace a train rating
            assert sorted(reads) == sorted([(i, b, "train") for i in range(3) for b in range(st.n_blocks)]
                                           + [(i, b, "test") for i in range(3) for b in range(st.n_blocks)
                                              if flags[i][1, b]])
        reads[:] = []
    assert not reads and 0 < st.cache_bytes <= CACHE_BYTES  # the third time from memory (a few KB here)
    assert bool(st._kept) and all((k[0] == "merged") == premerge for k in st._kept)


def test_segments_merged_among_themselves_only_where_they_fit_and_ratings_are_not_summed(tmp_path, monkeypatch):
    import streamdp.storage.segments as S

    p = _segmented(tmp_path).path
    assert open_store(p)._premerge
    monkeypatch.setattr(S, "PREMERGED_BYTES", 1000)  # the three segments' bound is over 1,000 bytes: each kept alone
    st = open_store(p)
    assert not st._premerge and st._keeps == {1, 2, 3}


@pytest.mark.parametrize("test_fraction", [0.0, 0.3])
def test_block_user_counts_are_the_merged_blocks(tmp_path, test_fraction):
    st = _segmented(tmp_path, test_fraction)  # one split: from the appends' recorded per-user counts
    for b in range(st.n_blocks):
        for s in ("train", "test") if test_fraction else ("train",):
            assert np.array_equal(st.block_user_counts(b, s), np.diff(st.read_block(b, s).indptr))


def test_an_append_onto_a_store_with_a_ledger_does_not_load_the_accountant(tmp_path):
    """The ledger is checked and records the data change without dp-accounting (0.65 s of an append's import)."""
    import subprocess
    import sys

    from streamdp.privacy.budget import StoreBudget

    p = str(tmp_path / "s.zarr")
    streamdp.ingest(pd.DataFrame({"user": [1, 2, 3], "item": [1, 2, 3], "rating": [1.0, 2.0, 3.0]}), p)
    StoreBudget(p).set(1.0, 1e-6)
    new = tmp_path / "new.csv"
    new.write_text("user,item,rating\n1,2,3\n4,1,2\n")
    code = ("import sys, streamdp; streamdp.ingest(sys.argv[1], sys.argv[2], append=True); "
            "assert 'dp_accounting' not in sys.modules, 'dp_accounting loaded'")
    done = subprocess.run([sys.executable, "-c", code, str(new), p], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-500:]
    assert [e for e in StoreBudget(p).show()["history"] if e.get("event") == "data replaced"]


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_an_ingest_and_an_append_do_not_import_pandas(tmp_path, fmt):
    """pyarrow's ``pa.array`` and ``to_numpy`` import pandas on first use (0.3-0.4 s of a command): the parse and
    the id mapping go through :func:`streamdp.storage.formats.to_arrow` and ``to_numpy`` instead."""
    import subprocess
    import sys

    rng = np.random.default_rng(0)
    for name, users in (("base", 300), ("more", 400)):
        df = pd.DataFrame({"user": rng.integers(0, users, 3000), "item": rng.integers(0, 50, 3000),
                           "rating": rng.integers(1, 6, 3000).astype(float)}).drop_duplicates(["user", "item"])
        df.to_csv(tmp_path / f"{name}.csv", index=False) if fmt == "csv" else df.to_parquet(tmp_path / f"{name}.pq")
    files = [str(tmp_path / (f"{n}.csv" if fmt == "csv" else f"{n}.pq")) for n in ("base", "more")]
    p = str(tmp_path / "s.zarr")
    code = ("import sys, streamdp; streamdp.ingest(sys.argv[1], sys.argv[3], test_fraction=0.2); "
            "streamdp.ingest(sys.argv[2], sys.argv[3], append=True); "
            "assert 'pandas' not in sys.modules, 'pandas imported'")
    done = subprocess.run([sys.executable, "-c", code, *files, p], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-500:]
    assert len(open_store(p).segments) == 1


def test_a_merged_read_into_given_arrays_is_the_same_block(tmp_path):
    """The engine's reused arrays (``read_block(into=)``): a merged block is written into them when they hold
    :meth:`read_into_size` ratings (its views' base is the given array), into its own arrays when shorter; the
    same rows either way."""
    st = _segmented(tmp_path)
    for s in ("train", "test"):
        size = st.read_into_size(s)
        assert size >= st.block_nnz(s).max() + st.info.n_items
        for b in range(st.n_blocks):
            ref = st.read_block(b, s)
            big = (np.full(size, -1, np.int32), np.full(size, np.nan, np.float32))
            small = (np.empty(1, np.int32), np.empty(1, np.float32))
            for given, reused in ((big, True), (small, False)):
                got = st.read_block(b, s, into=lambda indptr, g=given: g)
                assert np.array_equal(got.indptr, ref.indptr) and np.array_equal(got.items, ref.items)
                assert np.array_equal(got.ratings, ref.ratings)
                if b < st.base.info.n_blocks:  # a block of appended users only is merged into new arrays
                    assert (got.items.base is given[0] and got.ratings.base is given[1]) == reused


def test_read_ahead_merges_every_block_once_in_the_background_and_the_reads_are_the_same(tmp_path):
    st = _segmented(tmp_path)
    ref = [open_store(st.path).read_block(b, s) for b in range(st.n_blocks) for s in ("train", "test")]
    reads = []
    for i, seg in enumerate(st.segments):
        seg.read_block = lambda b, s, i=i, f=seg.read_block: reads.append((i, b, s)) or f(b, s)
    st.read_ahead()
    st.read_ahead()  # started once
    st._ahead.join(timeout=60)
    assert not st._ahead.is_alive() and {k[1] for k in st._kept} == set(range(st.n_blocks))
    assert sorted(reads) == sorted((i, b, s) for i in range(3) for b in range(st.n_blocks) for s in ("train", "test"))
    got = [st.read_block(b, s) for b in range(st.n_blocks) for s in ("train", "test")]
    assert len(reads) == 3 * st.n_blocks * 2  # the reads found every block merged: no segment read again
    for g, r in zip(got, ref):
        assert np.array_equal(g.indptr, r.indptr) and np.array_equal(g.items, r.items)
        assert np.array_equal(g.ratings, r.ratings)


def test_read_ahead_stops_at_a_damaged_segment_and_the_read_of_that_block_says_so(tmp_path):
    from streamdp.errors import StoreError

    st = _segmented(tmp_path)
    seg = st.segments[1]
    chunk = next((tmp_path / "s.zarr").glob(f"segments/{seg.path.rsplit('/', 1)[-1]}/train/items/c/0"))
    chunk.write_bytes(chunk.read_bytes()[:-3])  # truncated
    st.read_ahead()
    st._ahead.join(timeout=60)
    assert not st._ahead.is_alive() and ("merged", 0) not in st._kept
    with pytest.raises(StoreError, match="chunk 0"):
        st.read_block(0, "train")


def test_a_view_reads_its_store_ahead_and_a_plain_store_has_nothing_to_start(tmp_path):
    import threading

    from streamdp.storage.view import StoreView

    st = _segmented(tmp_path)
    StoreView(st).read_ahead()  # the view starts its store's
    st._ahead.join(timeout=60)
    assert {k[1] for k in st._kept} == set(range(st.n_blocks))
    streamdp.ingest(pd.DataFrame({"user": [1, 2], "item": [1, 2], "rating": [3.0, 4.0]}), str(tmp_path / "p.zarr"))
    before = {t.name for t in threading.enumerate()}
    open_store(str(tmp_path / "p.zarr")).read_ahead()
    assert {t.name for t in threading.enumerate()} - before == set()
