"""Small blocks written and read cheaply (issue 43's 1% append): the writer gathers them into few Zarr writes,
a segment's chunks fit its blocks, and an append's commit reads the blocks' items without their ratings."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
import zarr

import streamdp
from streamdp.errors import StoreError
from streamdp.storage import writer as W
from streamdp.storage import append as A, ingest as I
from streamdp.storage.append import segment_chunk
from streamdp.storage.chunks import ChunkWriter
from streamdp.storage.schema import DEFAULT_CHUNK_RATINGS
from streamdp.storage.store import open_store
from streamdp.storage.writer import StoreWriter


def _blocks(seed: int, n_users: int, bu: int, n_items: int, per_user: float):
    rng = np.random.default_rng(seed)
    out = []
    for b in range(-(-n_users // bu)):
        n = min(bu, n_users - b * bu)
        counts = rng.poisson(per_user, n) * (b % 5 != 2)  # every fifth block empty
        ip = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        out.append((ip, rng.integers(0, n_items, ip[-1]).astype(np.int32),
                    (rng.integers(1, 11, ip[-1]) / 2).astype(np.float32),
                    rng.integers(0, 10**9, ip[-1]).astype(np.int64)))
    return out


def test_small_blocks_are_gathered_into_few_writes_and_read_back(tmp_path, monkeypatch):
    n_users, bu, n_items, chunk = 3000, 40, 50, 16
    train, test = _blocks(0, n_users, bu, n_items, 0.6), _blocks(1, n_users, bu, n_items, 0.2)
    resizes, writes = [], []
    orig_resize, orig_set = zarr.Array.resize, zarr.Array.__setitem__
    monkeypatch.setattr(zarr.Array, "resize", lambda a, s: (resizes.append(a.path), orig_resize(a, s))[1])
    monkeypatch.setattr(zarr.Array, "__setitem__", lambda a, k, v: (writes.append(a.path), orig_set(a, k, v))[1])
    orig_raw = ChunkWriter.write  # a local store's chunk files are written by streamdp's own writer
    monkeypatch.setattr(ChunkWriter, "write", lambda w, *a, **k: (writes.append(w._arr.path), orig_raw(w, *a, **k))[1])
    monkeypatch.setattr(W, "_FLUSH_RATINGS", 256)  # several flushes, each of several blocks
    p = str(tmp_path / "s.zarr")
    with StoreWriter(p, n_users=n_users, n_items=n_items, block_users=bu, splits=("train", "test"), times=True,
                     chunk_ratings=chunk) as w:
        for b, (tr, te) in enumerate(zip(train, test)):
            w.write_block(b, *tr[:3], split="train", times=tr[3])
            w.write_block(b, *te[:3], split="test", times=te[3])
        w.finalize({"rating_min": 0.5, "rating_max": 5.0, "rating_range_source": "declared"})
    n_blocks = len(train)
    # the arrays grow by doubling and are cut to size once: not a resize per block (75 blocks, 3 arrays, 2 splits)
    assert len(resizes) <= 2 * 3 * (int(np.log2(sum(len(t[1]) for t in train) + n_blocks * chunk)) + 2) < 6 * n_blocks
    items_writes = writes.count("train/items")
    assert 1 < items_writes < n_blocks // 4, items_writes
    st = open_store(p)
    for split, blocks in (("train", train), ("test", test)):
        padded = st._split(split)["offsets"][-1]
        assert st._root[f"{split}/items"].shape == st._root[f"{split}/times"].shape == (padded,)
        assert st._root[f"{split}/items"].chunks == (chunk,)
        for b, (ip, it, r, ts) in enumerate(blocks):
            blk, crc_ok = st.read_block_unchecked(b, split)
            assert crc_ok  # the chunk CRCs recorded at the flush are those of the files
            np.testing.assert_array_equal(blk.indptr, ip)
            np.testing.assert_array_equal(blk.items, it)
            np.testing.assert_array_equal(blk.ratings, r)
            np.testing.assert_array_equal(st.block_times(b, split, blk.nnz), ts)
            only = st.read_block_items(b, split)
            np.testing.assert_array_equal(only.indptr, ip)
            np.testing.assert_array_equal(only.items, it)
            assert len(only.ratings) == 0
    assert st.n_ratings == sum(len(t[1]) for t in train)


@pytest.mark.parametrize("hint", ["exact", "over", "under", "none"])
def test_a_train_split_sized_ahead_is_cut_to_what_was_written(tmp_path, monkeypatch, hint):
    """``train_positions`` (an append's bound from its input rows) is the arrays' first shape: exactly right, no
    resize at all; too large, one cut at the close; too small or absent, grown as written. The same store each way."""
    n_users, bu, n_items, chunk = 600, 40, 50, 16
    train = _blocks(2, n_users, bu, n_items, 0.6)
    need = W.padded_positions([len(t[1]) for t in train], chunk)
    positions = {"exact": need, "over": need + 5 * chunk, "under": need // 3, "none": 0}[hint]
    resizes = []
    orig_resize = zarr.Array.resize
    monkeypatch.setattr(zarr.Array, "resize", lambda a, s: (resizes.append(a.path), orig_resize(a, s))[1])
    p = str(tmp_path / "s.zarr")
    with StoreWriter(p, n_users=n_users, n_items=n_items, block_users=bu, times=True, chunk_ratings=chunk,
                     train_positions=positions) as w:
        for b, (ip, it, r, ts) in enumerate(train):
            w.write_block(b, ip, it, r, times=ts)
        w.finalize({"rating_min": 0.5, "rating_max": 5.0, "rating_range_source": "declared"})
    assert (len(resizes) == 0) == (hint == "exact") and (hint != "over" or len(resizes) == 3), resizes
    st = open_store(p)
    assert st._root["train/items"].shape == st._root["train/ratings"].shape == st._root["train/times"].shape == (need,)
    for b, (ip, it, r, ts) in enumerate(train):
        blk, crc_ok = st.read_block_unchecked(b, "train")
        assert crc_ok
        np.testing.assert_array_equal(blk.indptr, ip)
        np.testing.assert_array_equal(blk.items, it)
        np.testing.assert_array_equal(blk.ratings, r)
        np.testing.assert_array_equal(st.block_times(b, "train", blk.nnz), ts)


def test_items_only_read_checks_the_ratings_chunks_too(tmp_path):
    p = str(tmp_path / "s.zarr")
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"user": rng.integers(0, 200, 3000), "item": rng.integers(0, 30, 3000),
                       "rating": rng.integers(1, 6, 3000).astype(float)})
    streamdp.ingest(df, p, block_users=50)
    st = open_store(p)
    blk = st.read_block(1)
    a = zarr.open_array(os.path.join(p, "train/ratings"), mode="r+")
    start = int(st._split("train")["offsets"][1])
    a[start] = 1.0 if blk.ratings[0] != 1.0 else 2.0  # decodable, in range, not the rating written
    st = open_store(p)
    np.testing.assert_array_equal(st.read_block_items(0).items, st.read_block(0).items)
    with pytest.raises(StoreError, match="block 1 .* does not match its recorded digest"):
        st.read_block_items(1)  # its ratings' chunk CRC differs: read whole, and the digest refuses it


def test_a_small_append_gets_chunks_of_its_blocks_size(tmp_path, monkeypatch):
    assert segment_chunk(np.full(2_012_489, 1, np.int64)[:0], 21183) == 1024
    assert segment_chunk(np.r_[np.full(21183 * 95, 0), np.full(21183, 1)], 21183) == 32768  # non-empty blocks only
    assert segment_chunk(np.full(10**6, 10), 1000) == 16384
    assert segment_chunk(np.full(10**5, 10**3), 10**4) == DEFAULT_CHUNK_RATINGS
    rng = np.random.default_rng(1)
    old = pd.DataFrame({"user": rng.integers(0, 2000, 20000), "item": rng.integers(0, 100, 20000),
                        "rating": rng.integers(1, 6, 20000).astype(float)})
    new = pd.DataFrame({"user": rng.integers(0, 2100, 600), "item": rng.integers(0, 100, 600),
                        "rating": rng.integers(1, 6, 600).astype(float)})
    p, f = str(tmp_path / "s.zarr"), str(tmp_path / "f.zarr")
    streamdp.ingest(old, p, block_users=100)
    for m in (I, A):  # the per-user counts written in slices of a few blocks
        monkeypatch.setattr(m, "_USERS_PER_WRITE", 250)
    st = streamdp.ingest(new, p, append=True)
    seg = st.parts[-1]
    assert seg._root["train/items"].chunks == (1024,)  # ~29 ratings a block
    full = streamdp.ingest(pd.concat([old, new]), f, block_users=100)
    assert _triples(st) == _triples(full)
    assert dict(zip(st.user_ids().tolist(), st.user_counts().tolist())) == \
        dict(zip(full.user_ids().tolist(), full.user_counts().tolist()))
    seg_counts = st.parts[-1].user_counts()  # the segment's own, written by pass 4 in slices
    assert seg_counts.tolist() == [int((new.user == u).any() and new[new.user == u].item.nunique())
                                   for u in st.user_ids().tolist()]
    st.check_chunks()


def _triples(st) -> dict:
    uid, iid, out = st.user_ids(), st.item_ids(), {}
    for b in range(st.n_blocks):
        blk = st.read_block(b)
        u = np.repeat(np.arange(blk.n_users), np.diff(blk.indptr)) + blk.first_user
        out.update(zip(zip(uid[u].tolist(), iid[blk.items].tolist()), blk.ratings.tolist()))
    return out
