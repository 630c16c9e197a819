"""A store that changes under a run: damage that still decodes, edited attributes, a store replaced mid-run.

Each case works on a copy of a small generated store (5 blocks, one chunk of items and
ratings each) and checks what the user sees: ``train`` exits 2 with one line naming the
store (and the split and block), its budget reservation is marked ``failed`` and no model
directory exists; ``evaluate`` prints no RMSE; ``verify`` fails where it said OK before.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import zarr
from numcodecs import blosc

from streamdp import open_store
from streamdp.errors import StoreError
from streamdp.storage.generate import generate_store

from tests.storage.test_damage import assert_one_line_error, run_cli, trained_store
from tests.storage.test_damage import budget_entries as entries

GEN = dict(n_users=3000, n_items=200, ratings_per_user=20, rank=3, test_fraction=0.2, block_users=700,
           show_progress=False)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A store with a test split and a model trained on it (the store's ledger removed)."""
    return trained_store(tmp_path_factory.mktemp("changes"), seed=2, **GEN)


@pytest.fixture
def copy(pristine, tmp_path):
    path = str(tmp_path / "d.zarr")
    shutil.copytree(pristine[0], path)
    return path, str(tmp_path / "m")


def flip_decodable_byte(store, split="train", b=1):
    """Flip one bit of block ``b``'s ratings chunk file so that Blosc still decodes it and every rating
    stays a valid one (a 5 becomes 2.5): only a digest can tell. Returns the changed positions."""
    s = open_store(store)
    nnz, lo, hi = s.read_block(b, split).nnz, s.rating_min, s.rating_max
    path = os.path.join(store, split, "ratings", "c", str(b))
    raw = open(path, "rb").read()
    orig = np.frombuffer(blosc.decompress(raw), np.float32)
    for pos in range(16, len(raw)):  # after the Blosc header
        r = bytearray(raw)
        r[pos] ^= 0x80
        try:
            dec = np.frombuffer(blosc.decompress(bytes(r)), np.float32)
        except (RuntimeError, ValueError):
            continue
        diff = np.flatnonzero(dec != orig)
        if len(diff) and diff.max() < nnz and np.all((dec[:nnz] >= lo) & (dec[:nnz] <= hi)):
            with open(path, "wb") as f:
                f.write(bytes(r))
            return diff
    raise AssertionError("no decodable flip found")


def without_chunk_crcs(store):
    """The store as written before chunk CRCs were recorded (block digests only)."""
    for s in ("train", "test"):
        shutil.rmtree(os.path.join(store, s, "block_crc32c"))


@pytest.mark.parametrize("kind", ["chunk crc", "digest only"])
def test_train_refuses_a_flipped_byte_that_still_decodes(copy, kind):
    store, model = copy
    if kind == "digest only":
        without_chunk_crcs(store)
    changed = flip_decodable_byte(store)
    assert open_store(store).root["train/ratings"][int(open_store(store).root["train/block_offsets"][1])
                                                   + int(changed[0])] == 2.5
    code, _, err = run_cli("train", store, "--epsilon", "1", "--out", model, "--seed", "0")
    assert_one_line_error(code, err, store, "train: block 1 (users 700..1399) does not match its recorded digest",
                          f"streamdp verify {store}")
    assert not os.path.exists(model)
    assert [e["status"] for e in entries(store)] == ["failed"]


def test_train_refuses_a_rating_rewritten_through_zarr(copy):
    store, model = copy
    a = zarr.open_array(os.path.join(store, "train", "ratings"), mode="r+")
    a[5] = 1.0 if a[5] != 1.0 else 2.0  # a valid chunk file with a valid rating: not the one written
    code, _, err = run_cli("train", store, "--method", "sgd", "--epsilon", "inf", "--yes", "--out", model, "--epochs", "1")
    assert_one_line_error(code, err, store, "train: block 0 (users 0..699) does not match its recorded digest")
    assert not os.path.exists(model) and all(e["status"] == "failed" for e in entries(store))


def test_evaluate_refuses_a_flipped_byte(pristine, copy):
    store, _ = copy
    flip_decodable_byte(store, "test", 3)
    code, out, err = run_cli("evaluate", pristine[1], store)
    assert_one_line_error(code, err, store, "test: block 3", "does not match its recorded digest")
    assert "RMSE" not in out


def test_a_re_encoded_chunk_with_the_same_ratings_is_read_by_its_digest(copy):
    store, _ = copy
    path = os.path.join(store, "train", "ratings", "c", "2")
    data = blosc.decompress(open(path, "rb").read())
    again = blosc.compress(data, b"zstd", 3, blosc.SHUFFLE)  # other bytes, same ratings
    assert again != open(path, "rb").read()
    open(path, "wb").write(again)
    s = open_store(store)
    assert [s.read_block_unchecked(b)[1] for b in range(s.n_blocks)] == [True, True, False, True, True]
    s.read_block(2)
    assert s.digest_fallbacks == 1
    code, out, err = run_cli("verify", store)
    assert code == 0 and "OK" in out and "the chunk files of 1 block(s) differ" in out, err


# --------------------------------------------------------------------------------------
# attributes
# --------------------------------------------------------------------------------------


def _edit_attrs(store, **changes):
    g = zarr.open_group(store, mode="r+")
    attrs = dict(g.attrs["streamdp"])
    for k, v in changes.items():
        if v is None:
            attrs.pop(k, None)
        else:
            attrs[k] = v
    g.attrs["streamdp"] = attrs


@pytest.mark.parametrize("change", [{"rating_max": 10.0}, {"rating_min": 0.0}, {"rating_range_source": "observed"},
                                    {"params": "rating_step=0.5"}, {"checksum_attrs": ["n_users"]}])
def test_verify_refuses_edited_attributes(copy, change):
    """Edits that every read accepts (a wider range, another step...): only the checksum can tell."""
    store, _ = copy
    code, out, err = run_cli("verify", store)
    assert code == 0 and "note" not in out, err
    if "params" in change:
        change = {"params": {**open_store(store).attrs["params"], "rating_step": 0.5}}
    _edit_attrs(store, **change)
    open_store(store).read_block(0)
    code, out, err = run_cli("verify", store)
    assert_one_line_error(code, err, store, "checksum mismatch", "attributes (")
    assert out == ""


def test_verify_of_a_store_written_before_attributes_were_covered_notes_it(tmp_path, monkeypatch):
    from streamdp.storage import writer

    monkeypatch.setattr(writer, "CHECKSUM_ATTRS", ())  # what the writer did before
    store = generate_store(str(tmp_path / "old.zarr"), seed=3, **GEN).path
    assert "checksum_attrs" in open_store(store).attrs and not open_store(store).attrs["checksum_attrs"]
    _edit_attrs(store, checksum_attrs=None, rating_max=10.0)
    code, out, err = run_cli("verify", store)
    assert code == 0 and out.splitlines()[0].startswith(f"{store}: OK"), err
    assert "note: this store was written before its checksum covered its attributes" in out
    code, out, _ = run_cli("verify", store, "--json")
    assert json.loads(out)["attributes_covered"] == []


# --------------------------------------------------------------------------------------
# a store replaced while a run reads it
# --------------------------------------------------------------------------------------


def _train(store, out):
    from streamdp.workflows.training import train

    return train(store, method="als", out=out, epsilon=1.0, delta=1e-6, seed=0, workers=1, evaluate_test=False)


def test_store_replaced_between_blocks_fails_the_run(copy, monkeypatch):
    from streamdp.storage.store import RatingStore

    store, model = copy
    read = RatingStore.read_block
    replaced = []

    def read_then_replace(self, b, split="train"):
        if b == 2 and not replaced:  # `ingest --force` of other data, while the run is between blocks
            generate_store(store, seed=9, force=True, **GEN)
            replaced.append(b)
        return read(self, b, split)

    monkeypatch.setattr(RatingStore, "read_block", read_then_replace)
    with pytest.raises(StoreError, match=r"d\.zarr: the store changed while this run read it .*nothing was "
                                         r"released") as e:
        _train(store, model)
    assert "\n" not in str(e.value) and replaced
    assert not os.path.exists(model)
    assert [x["status"] for x in entries(store)] == ["failed"]  # the reservation, carried into the new store


def test_store_replaced_after_the_last_block_is_refused_before_release(copy, monkeypatch):
    """The same ratings written again (same checksum): still another store, with another generation id."""
    from streamdp.stream.engine import Engine

    store, model = copy
    before = open_store(store)
    close = Engine.close

    def close_then_replace(self):
        close(self)
        generate_store(store, seed=2, force=True, **GEN)

    monkeypatch.setattr(Engine, "close", close_then_replace)
    with pytest.raises(StoreError, match="the store changed while this run read it") as e:
        _train(store, model)
    after = open_store(store)
    assert after.checksum == before.checksum and after.identity != before.identity
    assert f"generation {before.identity[1]}" in str(e.value)
    assert not os.path.exists(model) and [x["status"] for x in entries(store)] == ["failed"]


def test_identity_of_a_store_without_generation_id_is_its_zarr_json(copy):
    store, _ = copy
    _edit_attrs(store, generation=None)  # as written before generation ids
    s = open_store(store)
    assert s.identity[1] is None and not s.changed()
    s.check_unchanged()
    raw = open(os.path.join(store, "zarr.json")).read()
    tmp = os.path.join(store, "zarr.json.new")
    open(tmp, "w").write(raw)
    os.replace(tmp, os.path.join(store, "zarr.json"))  # same text, another file: a rewrite
    assert s.changed()
    with pytest.raises(StoreError, match="its zarr.json was rewritten"):
        s.check_unchanged()


def test_store_removed_under_a_run_is_named(copy):
    store, _ = copy
    s = open_store(store)
    shutil.rmtree(store)
    with pytest.raises(StoreError, match=r"the store changed while this run read it \(.*; it is gone\)"):
        s.read_block(0)


# --------------------------------------------------------------------------------------
# a store that is not there
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["train", "verify", "info", "evaluate", "budget"])
def test_missing_store_does_not_exist(pristine, tmp_path, command):
    missing = tmp_path / "nowhere.zarr"
    args = {"train": ["train", missing, "--epsilon", "1", "--out", tmp_path / "m"], "verify": ["verify", missing],
            "info": ["info", missing], "evaluate": ["evaluate", pristine[1], missing],
            "budget": ["budget", missing]}[command]
    code, out, err = run_cli(*args)
    assert_one_line_error(code, err, f"{missing}: does not exist")
    assert out == "" and not os.path.exists(tmp_path / "m")


# --------------------------------------------------------------------------------------
# fuzzing: no flipped byte of a block's chunk files is ever read silently
# --------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("array", ["train/ratings", "train/items", "train/indptr", "test/ratings"])
def test_no_flipped_byte_is_read_silently(pristine, tmp_path, array):
    store = str(tmp_path / "f.zarr")
    shutil.copytree(pristine[0], store)
    split = array.split("/")[0]
    ref = open_store(store)
    blocks = [ref.read_block(b, split) for b in range(ref.n_blocks)]
    path = os.path.join(store, array, "c", "1")
    raw = open(path, "rb").read()
    rng = np.random.default_rng(0)
    positions = sorted(set(rng.integers(0, len(raw), 300).tolist()) | {0, 4, 12, len(raw) - 1})
    refused = silent_same = 0
    for pos in positions:
        for bit in (0x01, 0x80):
            r = bytearray(raw)
            r[pos] ^= bit
            open(path, "wb").write(bytes(r))
            s = open_store(store)
            try:
                got = [s.read_block(b, split) for b in range(s.n_blocks)]
            except StoreError as exc:
                assert "\n" not in str(exc) and store in str(exc)
                refused += 1
                continue
            for g, w in zip(got, blocks):  # read without an error: then it is exactly what was written
                for x, y in zip(g, w):
                    np.testing.assert_array_equal(x, y)
            silent_same += 1
    open(path, "wb").write(raw)
    assert refused > 0.9 * 2 * len(positions), (refused, silent_same)
