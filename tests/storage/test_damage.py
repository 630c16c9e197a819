"""Damaged stores: every read refuses a missing, truncated or inconsistent chunk with one line.

Each case damages a copy of a small generated store and runs the CLI: exit code 2,
one line ``streamdp: error: STORE: ARRAY: ...`` (no traceback), no model directory,
and no budget entry left 'complete' (damage that the structural check sees is refused
before anything is reserved). ``streamdp verify`` recomputes the checksum.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

from streamdp import open_store
from streamdp.cli import main
from streamdp.errors import StoreError
from streamdp.privacy.budget import StoreBudget
from streamdp.storage.generate import generate_store
from streamdp.storage.writer import item_stats_digest


def run_cli(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    return r.exit_code, r.stdout, r.stderr


def assert_one_line_error(code, err, *words):
    assert code == 2, err
    assert err.startswith("streamdp: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)


def budget_entries(store) -> list:
    p = os.path.join(store, "privacy_budget.json")
    return json.load(open(p))["entries"] if os.path.exists(p) else []


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A store with a test split, 5 blocks (one 256k-rating chunk of items/ratings each), and
    a model trained on it."""
    return trained_store(tmp_path_factory.mktemp("damage"), n_users=3000, n_items=200, ratings_per_user=20, rank=3,
                         seed=2, test_fraction=0.2, block_users=700)


def trained_store(d, **gen) -> tuple[str, str]:
    """``(store, model)``: a store generated in ``d`` and a model trained on it, the store left without a ledger."""
    s = generate_store(str(d / "s.zarr"), **gen)
    code, _, err = run_cli("train", s.path, "--epsilon", "1", "--out", d / "model", "--seed", "0")
    assert code == 0, err
    shutil.rmtree(d / "s.zarr.state", ignore_errors=True)
    for name in ("privacy_budget.json", "privacy_budget.journal", "privacy_budget.lock"):
        os.remove(os.path.join(s.path, name))  # each copy starts without the ledger's entries...
    StoreBudget(s.path).restore()  # ...from an empty one (the release key says the store released: refused without)
    return s.path, str(d / "model")


@pytest.fixture
def damaged(pristine, tmp_path):
    """A fresh copy of the store to damage, and where a model would go."""
    path = str(tmp_path / "d.zarr")
    shutil.copytree(pristine[0], path)
    return path, str(tmp_path / "m")


def truncate(path, keep=0.5):
    raw = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(raw[: int(len(raw) * keep)])


ARRAYS = ["train/indptr", "train/items", "train/ratings", "train/block_offsets", "test/indptr", "test/items",
          "test/ratings", "test/block_offsets", "user_ids", "item_ids", "train/item_sums", "train/item_counts"]


@pytest.mark.parametrize("array", ARRAYS)
def test_missing_chunk_refused_before_any_budget_is_reserved(damaged, array):
    store, model = damaged
    chunk = {"block_offsets": 0, "item_ids": 0, "item_sums": 0, "item_counts": 0}.get(array.split("/")[-1], 2)
    os.remove(os.path.join(store, array, "c", str(chunk)))
    code, _, err = run_cli("train", store, "--epsilon", "1", "--out", model, "--seed", "0")
    assert_one_line_error(code, err, store, f"{array}: chunk {chunk} is missing")
    assert not os.path.exists(model) and budget_entries(store) == []


@pytest.mark.parametrize("array", ["train/indptr", "train/items", "train/ratings", "test/indptr", "item_ids"])
def test_truncated_chunk_refused_before_any_budget_is_reserved(damaged, array):
    store, model = damaged
    truncate(os.path.join(store, array, "c", "0"))
    code, _, err = run_cli("train", store, "--epsilon", "1", "--out", model, "--seed", "0")
    assert_one_line_error(code, err, store, f"{array}: chunk 0")
    assert not os.path.exists(model) and budget_entries(store) == []


def test_missing_indptr_chunk_with_sgd_is_an_error_not_a_segfault(damaged):
    store, model = damaged
    os.remove(os.path.join(store, "train", "indptr", "c", "1"))
    r = subprocess.run([sys.executable, "-m", "streamdp.cli", "train", store, "--method", "sgd", "--epsilon", "inf", "--yes",
                        "--out", model, "--epochs", "1"], capture_output=True, text=True, timeout=300)
    assert_one_line_error(r.returncode, r.stderr, store, "train/indptr: chunk 1 is missing")
    assert not os.path.exists(model)


@pytest.mark.parametrize("array,value", [("train/item_sums", 1.5), ("train/item_counts", 0)])
def test_evaluate_refuses_altered_training_item_statistics(pristine, damaged, array, value):
    """The recorded sums and counts the baselines read instead of a pass are checked against their digest."""
    store, _ = damaged
    _write(store, array, 3, value)
    code, out, err = run_cli("evaluate", pristine[1], store)
    assert_one_line_error(code, err, store, "train/item_sums: the training ratings' item sums and counts do not "
                                            "match their recorded digest", "streamdp verify")
    assert "RMSE" not in out


@pytest.mark.parametrize("array", ["test/ratings", "test/items", "train/ratings"])
def test_evaluate_refuses_a_missing_chunk(pristine, damaged, array):
    store, _ = damaged
    os.remove(os.path.join(store, array, "c", "1"))
    code, out, err = run_cli("evaluate", pristine[1], store)
    assert_one_line_error(code, err, store, f"{array}: chunk 1 is missing")
    assert "RMSE" not in out


def _write(store, array, index, value):
    a = zarr.open_array(os.path.join(store, array), mode="r+")
    a[index] = value


@pytest.mark.parametrize("array,value,words", [
    ("train/items", 200, "train/items: block 0: item index 200 outside [0, 200)"),
    ("train/items", -1, "train/items: block 0: item index -1 outside"),
    ("train/ratings", np.nan, "train/ratings: block 0: rating nan not finite"),
    ("train/ratings", 7.0, "train/ratings: block 0: rating 7 outside the store's range [1, 5]"),
])
def test_decodable_but_invalid_values_never_reach_a_kernel(damaged, array, value, words):
    store, model = damaged
    _write(store, array, 5, value)
    code, _, err = run_cli("train", store, "--method", "sgd", "--epsilon", "inf", "--yes", "--out", model, "--epochs", "1")
    assert_one_line_error(code, err, store, words)
    assert not os.path.exists(model)
    assert all(e["status"] != "complete" for e in budget_entries(store))


@pytest.mark.parametrize("value", [10**9, -5])
def test_inconsistent_row_pointers_are_refused(damaged, value):
    store, model = damaged
    _write(store, "train/indptr", 1400, value)  # first user of block 2
    code, _, err = run_cli("train", store, "--epsilon", "1", "--out", model, "--seed", "0")
    assert_one_line_error(code, err, store, "train/indptr: block")
    assert not os.path.exists(model) and budget_entries(store) == []
    with pytest.raises(StoreError, match="train/indptr: block 2: row pointers"):
        open_store(store).read_block(2)


def test_zarr_fallback_path_refuses_missing_and_corrupt_chunks(damaged, monkeypatch):
    from streamdp.storage.chunks import ChunkReader, ZarrReader

    store, _ = damaged
    monkeypatch.setattr(ChunkReader, "for_array", classmethod(lambda cls, arr, label=None: None))
    s = open_store(store)
    s.check_chunks()
    assert isinstance(s._split("train")["readers"]["ratings"], ZarrReader)
    ref = [open_store(store).read_block(b, "test") for b in range(s.n_blocks)]
    os.remove(os.path.join(store, "train", "ratings", "c", "3"))
    truncate(os.path.join(store, "test", "items", "c", "4"))
    s = open_store(store)
    with pytest.raises(StoreError, match=r"d\.zarr: train/ratings: chunk 3 is missing"):
        s.check_chunks()
    with pytest.raises(StoreError, match=r"d\.zarr: train/ratings: chunk 3 is missing"):
        s.read_block(3)
    with pytest.raises(StoreError, match=r"d\.zarr: test/items: .*cannot be decoded"):
        s.read_block(4, "test")
    np.testing.assert_array_equal(s.read_block(2, "test").items, ref[2].items)  # intact blocks still read


# --------------------------------------------------------------------------------------
# streamdp verify
# --------------------------------------------------------------------------------------


def test_verify_intact_store(pristine):
    code, out, err = run_cli("verify", pristine[0])
    assert code == 0, err
    assert out.startswith(f"{pristine[0]}: OK, checksum {open_store(pristine[0]).checksum}")
    code, out, err = run_cli("verify", pristine[0], "--json")
    r = json.loads(out)
    assert code == 0 and r["ok"] and r["block_digests"] and r["n_ratings"] == open_store(pristine[0]).n_ratings


def test_verify_ingested_store_with_string_ids(tmp_path):
    p = tmp_path / "r.csv"
    rng = np.random.default_rng(0)
    rows = [f"u{u},it{i},{r}" for u, i, r in zip(rng.integers(0, 300, 5000), rng.integers(0, 90, 5000),
                                                 rng.integers(1, 6, 5000))]
    p.write_text("user,item,rating\n" + "\n".join(rows) + "\n")
    code, _, err = run_cli("ingest", p, "--out", tmp_path / "s.zarr", "--block-users", 40, "--test-fraction", 0.2)
    assert code == 0, err
    code, out, err = run_cli("verify", tmp_path / "s.zarr")
    assert code == 0 and "OK" in out, err


def test_verify_legacy_store_without_digests_or_checksum_ids(damaged):
    store, _ = damaged
    g = zarr.open_group(store, mode="r+")
    attrs = dict(g.attrs["streamdp"])
    del attrs["checksum_ids"]
    # a legacy generated store's checksum covers item_ids only; this one (generated since user_ids are covered) is
    # read as a legacy ingested store, whose checksum covers both
    attrs["created_with"] = "ingest"
    g.attrs["streamdp"] = attrs
    for s in ("train", "test"):
        shutil.rmtree(os.path.join(store, s, "block_digests"))
    code, out, err = run_cli("verify", store, "--json")
    assert code == 0 and not json.loads(out)["block_digests"], err
    _write(store, "train/ratings", 10, 5.0 if open_store(store).read_block(0).ratings[10] != 5.0 else 4.0)
    code, _, err = run_cli("verify", store)
    assert_one_line_error(code, err, store, "checksum mismatch")


@pytest.mark.parametrize("damage,words", [
    ("missing", "train/ratings: chunk 3 is missing"),
    ("truncated", "test/ratings: chunk 1 is truncated"),
    ("rating", "train: block 2 (users 1400..2099) does not match its recorded digest"),
    ("item_ids", "checksum mismatch"),
    ("user_counts", "user_counts: block 4"),
    ("item_counts", "item_counts: item 7"),
    ("train/item_sums", "train/item_sums: item 5's training sum or count does not match the ratings stored"),
])
def test_verify_damaged_store(damaged, damage, words):
    store, _ = damaged
    if damage == "missing":
        os.remove(os.path.join(store, "train", "ratings", "c", "3"))
    elif damage == "truncated":
        truncate(os.path.join(store, "test", "ratings", "c", "1"), 0.9)
    elif damage == "rating":  # still a valid rating: only the digest tells
        s = open_store(store)
        pos = int(s.root["train/block_offsets"][2]) + 3
        _write(store, "train/ratings", pos, 1.0 if s.root["train/ratings"][pos] != 1.0 else 2.0)
    elif damage == "item_ids":
        _write(store, "item_ids", 0, 12345)
    elif damage == "user_counts":
        _write(store, "user_counts", 2900, 1)
    elif damage == "train/item_sums":  # altered with its digest: only the ratings tell
        _write(store, "train/item_sums", 5, 1.5)
        g = zarr.open_group(store, mode="r+")
        st = open_store(store)
        g.attrs["streamdp"] = {**st.attrs, "train_item_stats": item_stats_digest(st.root["train/item_sums"][...],
                                                                                 st.root["train/item_counts"][...])}
    else:
        _write(store, "item_counts", 7, 0)
    code, out, err = run_cli("verify", store)
    assert_one_line_error(code, err, store, words)
    assert out == ""
