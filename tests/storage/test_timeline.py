"""A store's ratings in time (issue 43 part 2): the window view, the store as of a segment, a segment's future."""

from __future__ import annotations

import numpy as np
import pytest

from streamdp.errors import ParameterError
from streamdp.kernels.window import keep_window, keep_window_reference
from streamdp.storage.append import append
from streamdp.storage.ingest import ingest
from streamdp.storage.store import RatingStore
from streamdp.storage.timeline import (TimeWindowView, parse_time, parse_window, resolve_window, segment_future,
                                       store_as_of, time_window)

DAY = 86400
# (user, item, rating, time): user 3 rates only on day 1, user 4 only on day 9
ROWS = [(1, 10, 4, 0 * DAY), (1, 11, 3, 2 * DAY), (1, 12, 5, 5 * DAY), (2, 10, 2, 3 * DAY), (2, 12, 4, 7 * DAY),
        (3, 11, 1, 1 * DAY), (4, 10, 5, 9 * DAY), (2, 11, 3, 6 * DAY)]


def _csv(path, rows, header="user,item,rating,timestamp"):
    path.write_text(header + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))
    return str(path)


def _pairs(st, split: str = "train") -> set:
    uid, iid, out = st.user_ids(), st.item_ids(), set()
    for b in range(st.n_blocks):
        blk = st.read_block(b, split)
        u = np.repeat(np.arange(blk.n_users), np.diff(blk.indptr)) + blk.first_user
        out |= set(zip(uid[u].tolist(), iid[blk.items].tolist(), blk.ratings.tolist()))
    return out


def test_the_window_kernel_matches_its_reference():
    rng = np.random.default_rng(0)
    ip = np.concatenate([[0], np.cumsum(rng.integers(0, 6, 40))]).astype(np.int64)
    n = int(ip[-1])
    it, r, t = rng.integers(0, 50, n).astype(np.int32), rng.random(n).astype(np.float32), rng.integers(0, 100, n)
    out = (np.empty_like(ip), np.empty(n, np.int32), np.empty(n, np.float32), np.empty(n, np.int64))
    w = keep_window(ip, it, r, t, 30, 70, *out)
    ref = keep_window_reference(ip, it, r, t, 30, 70)
    for a, b in zip((out[0], out[1][:w], out[2][:w], out[3][:w]), ref):
        np.testing.assert_array_equal(a, b)


def test_dates_and_windows_parse_or_are_refused_with_one_line():
    assert parse_time("1970-01-03") == 2 * DAY == parse_time("1970-01-03T00:00:00Z")
    assert parse_window("90d") == 90 * DAY and parse_window("2w") == 14 * DAY and parse_window("5h") == 5 * 3600
    for bad in ("2024-13-01", "yesterday", ""):
        with pytest.raises(ParameterError, match="not an ISO date"):
            parse_time(bad)
    for bad in ("90", "0d", "3m", "-1d"):
        with pytest.raises(ParameterError, match="--window"):
            parse_window(bad)
    with pytest.raises(ParameterError, match="give one"):
        resolve_window(since="1970-01-02", window="1d")
    with pytest.raises(ParameterError, match="is not before --until"):
        resolve_window(since="1970-01-05", until="1970-01-05")
    # a window ends at --until, else at the clock of the run (given here), never at the newest rating
    w = resolve_window(window="2d", until="1970-01-08")
    assert (w["since"], w["until"], w["ends_at"]) == (5 * DAY, 7 * DAY, "--until")
    w = resolve_window(window="1w", now=20 * DAY)
    assert (w["since"], w["until"], w["ends_at"]) == (13 * DAY, None, "the clock of the run")


def test_since_until_and_window_select_exactly_the_ratings_of_the_period(tmp_path):
    st = ingest([_csv(tmp_path / "a.csv", ROWS)], str(tmp_path / "s.zarr"), block_users=2)
    every = {(u, i, float(r)): t for u, i, r, t in ROWS}

    def expect(lo, hi):
        return {k for k, t in every.items() if lo <= t < hi}

    v = time_window(st, since="1970-01-03", until="1970-01-07")  # days 2..6
    assert isinstance(v, TimeWindowView) and _pairs(v) == expect(2 * DAY, 6 * DAY)
    assert _pairs(time_window(st, since="1970-01-06")) == expect(5 * DAY, 10 * DAY)
    assert _pairs(time_window(st, window="3d", until="1970-01-10")) == expect(6 * DAY, 9 * DAY)
    assert _pairs(time_window(st, window="1h", now=10 ** 9)) == set()
    assert time_window(st) is st
    # who contributed: user 3 (day 1) and user 4 (day 9) have no rating in days 2..6
    uid = st.user_ids()
    contributed = np.concatenate([v.contributed(b) for b in range(st.n_blocks)])
    assert dict(zip(uid.tolist(), contributed.tolist())) == {1: True, 2: True, 3: False, 4: False}
    assert v.n_contributors() == 2
    assert v.user_counts().tolist() == [2, 1, 0, 0] and v.user_counts(1, 3).tolist() == [1, 0]
    counts = dict(zip(st.item_ids().tolist(), v.item_counts().tolist()))
    assert counts == {10: 1, 11: 1, 12: 1}
    from streamdp.stream.engine import Engine

    with Engine(st, workers=1) as plain, Engine(v, workers=1) as windowed:  # the window's copies are budgeted
        assert windowed.block_bytes() - plain.block_bytes() == 28 * int(st.block_nnz().max())
    assert v.data_window["since_utc"] == "1970-01-03T00:00:00Z" and v.data_window["until_utc"] == "1970-01-07T00:00:00Z"


def test_a_store_without_times_refuses_a_window(tmp_path):
    st = ingest([_csv(tmp_path / "a.csv", [r[:3] for r in ROWS], "user,item,rating")], str(tmp_path / "s.zarr"))
    with pytest.raises(ParameterError, match="keeps no rating times"):
        time_window(st, since="1970-01-02")


def test_the_store_as_of_a_segment_and_a_segment_as_its_future(tmp_path):
    path = str(tmp_path / "s.zarr")
    base = ingest([_csv(tmp_path / "a.csv", ROWS)], path, block_users=2)
    checksum0, pairs0 = base.checksum, _pairs(base)
    # segment 1: a new user (5) and item (13), and user 1 re-rates item 10
    new = [(5, 13, 2, 11 * DAY), (1, 10, 1, 12 * DAY), (2, 13, 4, 13 * DAY)]
    st = append([_csv(tmp_path / "b.csv", new)], path, notes=False)
    assert _pairs(st) != pairs0
    v = store_as_of(st, 0)
    assert v.checksum == checksum0 and _pairs(v) == pairs0 and v.n_users == 4 and v.n_items == 3
    assert v.data_window == {"until_segment": 0}
    assert store_as_of(st, 1).checksum == st.checksum and _pairs(store_as_of(st, 1)) == _pairs(st)
    with pytest.raises(ParameterError, match="has 1 segment"):
        store_as_of(st, 2)

    f = segment_future(st, "last")
    assert f.checksum == checksum0 and f.has_test and f.n_users == 5 and f.n_items == 4
    assert _pairs(f, "train") == pairs0  # each user's training ratings: the store before the segment
    assert _pairs(f, "test") == {(u, i, float(r)) for u, i, r, _ in new}  # the segment's own ratings only
    assert int(f.block_nnz("test").sum()) == f.n_test == 3
    assert f.segment_record["number"] == 1
    for bad, why in ((2, "has segments 1..1"), ("x", "expected a segment number")):
        with pytest.raises(ParameterError, match=why):
            segment_future(st, bad)
    with pytest.raises(ParameterError, match="has no segments"):
        segment_future(base, "last")
    from streamdp.storage.compact import compact

    folded = compact(path, notes=False)
    with pytest.raises(ParameterError, match="was compacted"):
        store_as_of(folded, 0)


def test_the_store_as_of_each_of_several_segments_reads_its_own_rows(tmp_path):
    """A store of three segments merges its segments' rows among themselves once and keeps them (``_premerged``):
    the store as of an earlier append, and a segment's future, read their own parts, not the whole store's kept
    merge (a base alone has none: ``evaluate --segment 1`` failed on such a store), whichever is read first."""
    path = str(tmp_path / "s.zarr")
    snaps = [_pairs(ingest([_csv(tmp_path / "a.csv", ROWS)], path, block_users=2))]
    for k, rows in enumerate(([(5, 13, 2, 11 * DAY), (1, 10, 1, 12 * DAY)], [(2, 13, 4, 13 * DAY), (6, 10, 3, 14 * DAY)],
                              [(1, 10, 5, 15 * DAY), (3, 12, 2, 16 * DAY)])):
        snaps.append(_pairs(append([_csv(tmp_path / f"s{k}.csv", rows)], path, notes=False)))
    st = RatingStore(path)
    assert st._premerge and _pairs(st) == snaps[3]  # the whole store read (and its merge kept) first
    for n in (0, 1, 2, 3):
        assert _pairs(store_as_of(st, n)) == snaps[n], n
    for k in (1, 2, 3):
        assert _pairs(segment_future(st, k), "train") == snaps[k - 1], k
    st = RatingStore(path)  # and the views first
    assert [_pairs(store_as_of(st, n)) for n in (0, 1, 2)] == snaps[:3] and _pairs(st) == snaps[3]


def test_a_cluster_worker_rebuilds_each_view_from_its_spec(tmp_path):
    """What a Dask worker reads (``remote_view().view(store opened by path)``) is what the view reads."""
    import pickle

    from streamdp.storage.catalogue import CatalogueView
    from streamdp.storage.store import open_store

    path = str(tmp_path / "s.zarr")
    ingest([_csv(tmp_path / "a.csv", ROWS)], path, block_users=2)
    st = append([_csv(tmp_path / "b.csv", [(5, 13, 2, 11 * DAY), (1, 10, 1, 12 * DAY)])], path, notes=False)
    views = [time_window(st, since="1970-01-03"), store_as_of(st, 0), segment_future(st, 1),
             CatalogueView(time_window(store_as_of(st, 0), until="1970-01-06"), [10, 12])]
    for v in views:
        w = pickle.loads(pickle.dumps(v.remote_view())).view(open_store(path))
        assert w.checksum == v.checksum and w.n_items == v.n_items
        for split in ("train", "test") if v.has_test else ("train",):
            assert _pairs(w, split) == _pairs(v, split)


def test_a_window_reads_only_the_parts_that_reach_into_it(tmp_path, monkeypatch):
    """A window from day 15 on a store whose base (days 0-9) and first segment (days 11-13) are older: neither is
    read, and every block of the window is what a merge of every part gives (a re-rating in the last segment
    included); a window reaching into the first segment reads it; nothing is skipped without a start."""
    from streamdp.storage.segments import SegmentedStore

    path = str(tmp_path / "s.zarr")
    ingest([_csv(tmp_path / "a.csv", ROWS)], path, block_users=2)
    append([_csv(tmp_path / "b.csv", [(5, 13, 2, 11 * DAY), (1, 10, 1, 12 * DAY), (2, 13, 4, 13 * DAY)])], path,
           notes=False)
    st = append([_csv(tmp_path / "c.csv", [(1, 10, 3, 20 * DAY), (6, 11, 5, 21 * DAY), (2, 12, 1, 22 * DAY)])],
                path, notes=False)
    assert st.attrs["base_times"]["max"] == 9 * DAY
    assert [st.parts_before(x if x is None else x * DAY) for x in (None, 0, 10, 12, 15, 30)] == [0, 0, 1, 1, 2, 2]

    def windowed(store, lo):
        v = TimeWindowView(store, lo * DAY, None)
        return [(b, v.read_block_times(b, "train")) for b in range(v.n_blocks)]

    full = windowed(st, 15)
    reads = []
    for i, p in enumerate(st.parts):
        monkeypatch.setattr(p, "read_block", lambda b, s, p=p, i=i: reads.append(i) or RatingStore.read_block(p, b, s))
    assert [x[1][0].nnz for x in full] and reads == []  # read before the patch: count again
    again = windowed(st, 15)
    assert set(reads) == {2}
    reads.clear()
    monkeypatch.setattr(SegmentedStore, "parts_before", lambda self, since: 0)
    every = windowed(st, 15)
    assert set(reads) == {0, 1, 2}
    for (b, (x, tx)), (_, (y, ty)) in zip(again, every):
        np.testing.assert_array_equal(x.indptr, y.indptr)
        np.testing.assert_array_equal(x.items, y.items)
        np.testing.assert_array_equal(x.ratings, y.ratings)
        np.testing.assert_array_equal(tx, ty)
    assert sum(x.nnz for _, (x, _) in again) == 3


def test_a_window_starts_no_read_ahead_and_its_store_does(tmp_path):
    """A period's reads merge with times and keep nothing: its view starts no background merge; the store without
    the period does (two segments of an explicit store: merged among themselves)."""
    path = str(tmp_path / "s.zarr")
    ingest([_csv(tmp_path / "a.csv", ROWS)], path, block_users=2)
    append([_csv(tmp_path / "b.csv", [(5, 13, 2, 11 * DAY), (1, 10, 1, 12 * DAY)])], path, notes=False)
    st = append([_csv(tmp_path / "c.csv", [(1, 10, 3, 20 * DAY), (6, 11, 5, 21 * DAY)])], path, notes=False)
    TimeWindowView(st, 15 * DAY, None).read_ahead()
    assert st._ahead is None and not st._kept
    st.read_ahead()
    st._ahead.join(timeout=60)
    assert {k[1] for k in st._kept if k[0] == "merged"} == set(range(st.n_blocks))
