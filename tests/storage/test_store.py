import numpy as np
import pytest
import zarr

from streamdp import open_store
from streamdp.errors import StoreError
from streamdp.storage.generate import generate_store
from streamdp.storage.schema import ATTRS_KEY


def test_blocks_cover_store(small_store):
    s = small_store
    assert s.n_blocks == 5
    total = 0
    for b, blk in enumerate(s.blocks()):
        assert blk.first_user == b * s.block_users
        assert blk.indptr[0] == 0 and np.all(np.diff(blk.indptr) >= 0)
        assert blk.items.dtype == np.int32 and blk.ratings.dtype == np.float32
        assert blk.items.min() >= 0 and blk.items.max() < s.n_items
        total += blk.nnz
    assert total == s.n_ratings
    assert sum(b.nnz for b in s.blocks("test")) == s.n_test


def test_blocks_start_on_chunk_boundaries(small_store):
    g = small_store.root["train"]
    chunk = g["items"].chunks[0]
    offsets = g["block_offsets"][:]
    assert np.all(offsets % chunk == 0)


def test_generate_deterministic(tmp_path):
    a = generate_store(str(tmp_path / "a.zarr"), n_users=500, n_items=50, ratings_per_user=10, seed=3, workers=1)
    b = generate_store(str(tmp_path / "b.zarr"), n_users=500, n_items=50, ratings_per_user=10, seed=3, workers=2,
                       block_users=500)
    assert a.attrs["checksum"] == b.attrs["checksum"] or a.block_users != b.block_users
    c = generate_store(str(tmp_path / "c.zarr"), n_users=500, n_items=50, ratings_per_user=10, seed=3, workers=2)
    assert a.attrs["checksum"] == c.attrs["checksum"]
    d = generate_store(str(tmp_path / "d.zarr"), n_users=500, n_items=50, ratings_per_user=10, seed=4)
    assert a.attrs["checksum"] != d.attrs["checksum"]


def test_split_disjoint_and_fraction(small_store):
    for tr, te in zip(small_store.blocks("train"), small_store.blocks("test")):
        for u in range(tr.n_users):
            a = set(tr.items[tr.indptr[u]:tr.indptr[u + 1]])
            t = set(te.items[te.indptr[u]:te.indptr[u + 1]])
            assert not a & t
            n = len(a) + len(t)
            assert len(t) <= max(0, n - 1)
            if n >= 2:
                assert abs(len(t) - 0.2 * n) <= 1


def test_other_format_version_is_refused(tmp_path):
    s = generate_store(str(tmp_path / "v.zarr"), n_users=20, n_items=5, ratings_per_user=3, seed=0)
    g = zarr.open_group(s.path, mode="r+")
    attrs = dict(g.attrs[ATTRS_KEY])
    attrs["format_version"] = 99
    g.attrs[ATTRS_KEY] = attrs
    with pytest.raises(StoreError, match="format version 99"):
        open_store(s.path)


def test_existing_destination_not_overwritten(tmp_path):
    p = str(tmp_path / "x.zarr")
    generate_store(p, n_users=20, n_items=5, ratings_per_user=3, seed=0)
    with pytest.raises(StoreError, match="already exists"):
        generate_store(p, n_users=20, n_items=5, ratings_per_user=3, seed=1)
    generate_store(p, n_users=20, n_items=5, ratings_per_user=3, seed=1, force=True)
    assert [f for f in (tmp_path).iterdir() if f.name.startswith(".")] == []
