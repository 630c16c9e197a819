"""Each rating's time kept in the store (issue 43 part 2): ingest, append, compact, merged reads."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from streamdp.errors import ParameterError, StoreError
from streamdp.storage.append import append
from streamdp.storage.compact import compact
from streamdp.storage.ingest import ingest
from streamdp.storage.store import open_store


def _csv(path, rows, header="user,item,rating,timestamp"):
    path.write_text(header + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))
    return str(path)


def _log(seed: int, n: int, users: int, items: int, t0: int) -> list:
    rng = np.random.default_rng(seed)
    return list(zip(rng.integers(0, users, n).tolist(), rng.integers(0, items, n).tolist(),
                    rng.integers(1, 6, n).tolist(), (t0 + rng.permutation(n)).tolist()))


def _timed(st, split: str = "train") -> dict:
    """{(user id, item id): (rating, time)} of a split, through the store's ids and merged reads."""
    uid, iid, out = st.user_ids(), st.item_ids(), {}
    for b in range(st.n_blocks):
        blk, t = st.read_block_times(b, split)
        assert len(t) == blk.nnz
        u = np.repeat(np.arange(blk.n_users), np.diff(blk.indptr)) + blk.first_user
        for a, i, r, s in zip(uid[u].tolist(), iid[blk.items].tolist(), blk.ratings.tolist(), t.tolist()):
            out[(a, i)] = (r, s)
    return out


def _expected(*logs) -> dict:
    """The pair rule: within an input the latest timestamp wins, and a later append replaces the store's."""
    out = {}
    for log in logs:
        df = pd.DataFrame(log, columns=["u", "i", "r", "t"]).sort_values("t", kind="stable")
        for u, i, r, t in df.drop_duplicates(["u", "i"], keep="last").itertuples(index=False):
            out[(u, i)] = (float(r), int(t))
    return out


@pytest.mark.parametrize("split", [pytest.param(None, marks=pytest.mark.slow),  # the temporal case keeps every
                                   pytest.param("random", marks=pytest.mark.slow), "temporal"])  # path: the default
def test_times_round_trip_through_ingest_append_and_compact(tmp_path, split):
    old, new = _log(0, 400, 40, 15, 1000), _log(1, 150, 50, 18, 5000)
    kw = {} if split is None else {"split": split, "test_fraction": 0.25}
    st = ingest([_csv(tmp_path / "old.csv", old)], str(tmp_path / "s.zarr"), block_users=7, **kw)
    assert st.has_times and st.attrs["times"]["unit"] == "s"
    splits = ("train", "test") if split else ("train",)
    got = {}
    for s in splits:
        got.update(_timed(st, s))
    assert got == _expected(old)
    kept = [t for _, t in _expected(old).values()]
    assert (st.attrs["times"]["min"], st.attrs["times"]["max"]) == (min(kept), max(kept))  # the kept ratings'

    st = append([_csv(tmp_path / "new.csv", new)], str(tmp_path / "s.zarr"), notes=False)
    merged, by_split = {}, {s: _timed(st, s) for s in splits}
    for part in by_split.values():
        assert not set(part) & set(merged)
        merged.update(part)
    assert merged == _expected(old, new)
    assert st.attrs["times"]["max"] == 5149
    seg = st.segments[0]
    assert seg.has_times and len(seg.read_block_times(0)[1]) == seg.read_block(0).nnz

    folded = compact(str(tmp_path / "s.zarr"), notes=False)
    assert folded.has_times and not hasattr(folded, "segments")
    for s in splits:
        assert _timed(folded, s) == by_split[s]


def test_a_store_without_times_reads_as_before_and_refuses_a_time_read(tmp_path):
    st = ingest([_csv(tmp_path / "a.csv", [(1, 2, 3), (2, 2, 4)], "user,item,rating")], str(tmp_path / "s.zarr"))
    assert not st.has_times and "times" not in st.attrs and "times" not in st.root["train"]
    with pytest.raises(StoreError, match="keeps no rating times"):
        st.read_block_times(0)
    # an append with times onto it keeps none either (the base has none to merge with)
    st = append([_csv(tmp_path / "b.csv", [(3, 2, 4, 9)])], str(tmp_path / "s.zarr"), notes=False)
    assert not st.has_times and not st.segments[0].has_times


def test_an_append_without_times_onto_a_store_with_them_is_refused_untouched(tmp_path):
    ingest([_csv(tmp_path / "a.csv", [(1, 2, 3, 10), (2, 2, 4, 11)])], str(tmp_path / "s.zarr"))
    before = open_store(str(tmp_path / "s.zarr")).attrs
    with pytest.raises(ParameterError, match="no timestamp column.*keeps each rating's time"):
        append([_csv(tmp_path / "b.csv", [(3, 2, 4)], "user,item,rating")], str(tmp_path / "s.zarr"), notes=False)
    assert open_store(str(tmp_path / "s.zarr")).attrs == before


def test_info_says_whether_a_store_keeps_times_and_their_span(tmp_path):
    from streamdp.storage.info import format_info, store_summary

    ingest([_csv(tmp_path / "a.csv", [(1, 2, 3, 86400), (2, 2, 4, 172800)])], str(tmp_path / "t.zarr"))
    ingest([_csv(tmp_path / "b.csv", [(1, 2, 3), (2, 2, 4)], "user,item,rating")], str(tmp_path / "n.zarr"))
    with_times = format_info(store_summary(str(tmp_path / "t.zarr")))
    assert "times            kept, 1970-01-02T00:00:00Z .. 1970-01-03T00:00:00Z" in with_times
    assert "times            none" in format_info(store_summary(str(tmp_path / "n.zarr")))


@pytest.mark.parametrize("name, text", [
    ("u.data", "1\t10\t4\t881250949\n2\t10\t3\t891717742\n1\t11\t5\t878887116\n"),
    ("ratings.dat", "1::10::4::978300760\n2::10::3::978302109\n1::11::5::978301968\n"),
])
def test_movielens_files_keep_their_fourth_field_as_the_time(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    st = ingest([str(tmp_path / name)], str(tmp_path / "s.zarr"))
    times = sorted(t for _, t in _timed(st).values())
    assert times == sorted(int(line.replace("::", "\t").split("\t")[3]) for line in text.splitlines())


def test_the_checksum_covers_the_times_and_verify_finds_one_altered(tmp_path):
    import zarr

    from streamdp.stream.verify import verify_store

    path = str(tmp_path / "s.zarr")
    rows = _log(3, 300, 30, 12, 100)
    ingest([_csv(tmp_path / "a.csv", rows)], path, block_users=7, test_fraction=0.2)
    append([_csv(tmp_path / "b.csv", _log(4, 60, 40, 12, 9000))], path, notes=False)
    assert verify_store(path)["ok"]
    compact(path, notes=False)
    assert verify_store(path)["ok"]
    t = zarr.open_array(f"{path}/train/times", mode="r+")
    t[0] = t[0] + 1  # one time moved by a second: the same ratings, another log
    with pytest.raises(StoreError, match=r"checksum mismatch.*rating times"):
        verify_store(path)
