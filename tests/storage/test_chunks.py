import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st

from streamdp.errors import StoreError
from streamdp.storage.chunks import ChunkReader, ZarrReader


def test_fast_path_is_used_and_equals_zarr_on_every_block(small_store):
    for split in ("train", "test"):
        readers = small_store._split(split)["readers"]
        assert all(isinstance(r, ChunkReader) for r in readers.values())
        z = {name: small_store.root[f"{split}/{name}"] for name in readers}
        for b in range(small_store.n_blocks):
            first, end = small_store.block_range(b)
            ip = z["indptr"][first:end + 1]
            np.testing.assert_array_equal(readers["indptr"].read(first, end + 1), ip)
            np.testing.assert_array_equal(ZarrReader(z["indptr"]).read(first, end + 1), ip)
            s0, n = int(z["block_offsets"][b]), int(ip[-1] - ip[0])
            for name in ("items", "ratings"):
                got = readers[name].read(s0, s0 + n)
                assert got.dtype == z[name].dtype
                np.testing.assert_array_equal(got, z[name][s0:s0 + n])
                np.testing.assert_array_equal(ZarrReader(z[name]).read(s0, s0 + n), got)


@pytest.fixture(scope="module")
def blosc_array(tmp_path_factory):
    from zarr.codecs import BloscCodec

    p = tmp_path_factory.mktemp("chunks") / "a.zarr"
    a = zarr.create_array(str(p), shape=(1000,), chunks=(64,), dtype="int32", fill_value=-7,
                          compressors=[BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")],
                          config={"write_empty_chunks": True})
    a[:] = -7
    a[100:900] = np.arange(800, dtype=np.int32)  # chunks 0 and 15 hold only the fill value, and are written
    return a


@settings(max_examples=60, deadline=None)
@given(start=st.integers(-5, 1005), length=st.integers(0, 400))
def test_any_slice_equals_zarr(blosc_array, start, length):
    r = ChunkReader.for_array(blosc_array)
    assert r is not None
    lo, hi = max(0, start), min(1000, start + length)
    np.testing.assert_array_equal(r.read(start, start + length), blosc_array[lo:hi] if hi > lo else [])


def test_missing_or_truncated_chunk_is_an_error_not_the_fill_value(tmp_path):
    from zarr.codecs import BloscCodec

    for comp in (BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"), "zstd"):
        p = tmp_path / f"{comp if isinstance(comp, str) else 'blosc'}.zarr"
        a = zarr.create_array(str(p), shape=(300,), chunks=(64,), dtype="int64", fill_value=0,
                              compressors=[comp] if not isinstance(comp, str) else "auto")
        a[:] = np.arange(300)
        for reader in (ChunkReader.for_array(a, "S: arr"), ZarrReader(a, "S: arr")):
            assert reader is not None
            reader.check()
            np.testing.assert_array_equal(reader.read(0, 300), np.arange(300))
        raw = (p / "c" / "2").read_bytes()
        (p / "c" / "2").write_bytes(raw[: len(raw) // 2])
        (p / "c" / "4").unlink()
        # check() reads no data: it sees a truncated Blosc chunk (its header says how long it is),
        # a truncated Zstd chunk only when it is decoded
        for reader, checked in ((ChunkReader.for_array(a, "S: arr"), "chunk (2 is truncated|4 is missing)"),
                                (ZarrReader(a, "S: arr"), "chunk 4 is missing")):
            with pytest.raises(StoreError, match=r"^S: arr: .*(is truncated|cannot be decoded)"):
                reader.read(100, 200)
            with pytest.raises(StoreError, match=r"^S: arr: chunk 4 is missing"):
                reader.read(290, 300)
            with pytest.raises(StoreError, match=rf"^S: arr: {checked}"):
                reader.check()
            np.testing.assert_array_equal(reader.read(0, 128), np.arange(128))  # intact chunks still read


def test_other_layouts_fall_back_to_zarr(tmp_path):
    from zarr.codecs import GzipCodec

    gz = zarr.create_array(str(tmp_path / "g.zarr"), shape=(10,), chunks=(4,), dtype="int32", compressors=[GzipCodec()])
    assert ChunkReader.for_array(gz) is None
    two_d = zarr.create_array(str(tmp_path / "m.zarr"), shape=(4, 4), chunks=(2, 2), dtype="float32")
    assert ChunkReader.for_array(two_d) is None
    mem = zarr.create_array(zarr.storage.MemoryStore(), shape=(10,), chunks=(4,), dtype="int32")
    assert ChunkReader.for_array(mem) is None


def test_user_state_raw_chunks_round_trip_through_zarr(tmp_path):
    from streamdp.stream.state import UserState

    st = UserState(str(tmp_path), "u", n_users=10, k=3, block_users=4, fill=-1.0)
    assert st._raw is not None
    rows = np.arange(6, dtype=np.float32).reshape(2, 3)
    st.write(2, rows)                                  # last, short block
    st.write(0, np.ones((4, 3), np.float32))
    z = zarr.open_array(str(tmp_path / "u"), mode="r")  # what Zarr itself reads back
    np.testing.assert_array_equal(z[8:10], rows)
    np.testing.assert_array_equal(z[0:4], 1.0)
    np.testing.assert_array_equal(z[4:8], -1.0)        # never written: fill value
    np.testing.assert_array_equal(st.read(1), -1.0)
    z2 = zarr.open_array(str(tmp_path / "u"), mode="r+")
    z2[4:8] = 5.0                                      # and what Zarr writes, the fast path reads
    np.testing.assert_array_equal(st.read(1), 5.0)
    assert st.read(2).shape == (2, 3) and not list(tmp_path.rglob("*.tmp"))


@pytest.mark.parametrize("dtype", ["int32", "float32", "int64"])
@pytest.mark.parametrize("codec", ["blosc", "zstd"])
def test_chunk_writer_writes_the_bytes_zarr_writes(tmp_path, dtype, codec):
    from zarr.codecs import BloscCodec, ZstdCodec

    from streamdp.storage.chunks import ChunkWriter, write_slice

    comp = BloscCodec(cname="lz4", clevel=5, shuffle="shuffle") if codec == "blosc" else ZstdCodec()
    a, b = (zarr.create_array(str(tmp_path / f"{n}.zarr"), shape=(1000,), chunks=(64,), dtype=dtype, fill_value=3,
                              compressors=[comp], config={"write_empty_chunks": True}) for n in "ab")
    data = np.sort(np.random.default_rng(0).integers(0, 500, 1000)).astype(dtype)
    a[0:128], a[128:992], a[992:1000] = data[:128], data[128:992], data[992:]  # whole chunks, a short last one
    w = ChunkWriter.for_array(b)
    assert w is not None and not w.fits(10, 64) and not w.fits(0, 100) and w.fits(960, 40) and w.fits(0, 1000)
    crcs = w.write(0, data[:128]) + w.write(128, data[128:992], pad_last=True)  # the last chunk in part: fill value
    write_slice(b, w, 992, data[992:])   # a slice inside the last chunk, not from its start: through Zarr
    reader = ChunkReader.for_array(b)
    for c in range(a.cdata_shape[0]):
        assert (tmp_path / f"a.zarr/c/{c}").read_bytes() == (tmp_path / f"b.zarr/c/{c}").read_bytes(), c
    assert crcs[:15] == [reader.chunk_crc(c) for c in range(15)]
    np.testing.assert_array_equal(b[:], data)
    with pytest.raises(ValueError, match="not whole chunks"):
        w.write(10, data[:64])
    assert not list(tmp_path.rglob("*.partial"))
