"""No unkeyed digest of the data in any output (issue 40 item 2).

The store's content checksum (blake2b over every rating), its block digests and its item-statistics digest are
deterministic functions of the ratings: whoever knows every user but one can hash each candidate for the last
one and find the match. An output names its store by the keyed fingerprint
(:mod:`streamdp.storage.fingerprint`) or not at all. These tests run every command that writes something on a
small store and grep each file it wrote (zarr.json of written stores included) and its stdout/stderr.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from streamdp.cli import main


def _run(*args, input=None):
    r = CliRunner().invoke(main, [str(a) for a in args], input=input)
    assert r.exit_code == 0, (args, r.output, r.exception)
    return r


def _make(path):
    from streamdp.storage.generate import generate_store

    return generate_store(str(path), n_users=800, n_items=60, ratings_per_user=12, rank=3, seed=4,
                          test_fraction=0.2, block_users=200)


def _needles(store) -> dict[str, bytes]:
    """Every unkeyed digest of ``store``'s data it records, as the bytes that would betray it in a file."""
    out = {"checksum": store.checksum.split(":")[-1]}
    stats = store.attrs.get("train_item_stats")
    if stats:
        out["train_item_stats"] = str(stats).split(":")[-1]
    for split in ("train", "test"):
        d = store.block_digests(split)
        for b, row in enumerate(d if d is not None else []):
            out[f"{split}/block_digests[{b}]"] = row.tobytes().hex()
    needles = {}
    for name, hx in out.items():
        needles[name + " (hex)"] = hx.lower().encode()
        needles[name + " (HEX)"] = hx.upper().encode()
        needles[name + " (bytes)"] = bytes.fromhex(hx)
    return needles


def _assert_clean(what: str, data: bytes, needles: dict[str, bytes]):
    for name, n in needles.items():
        assert n not in data, f"{what} carries the store's {name}"


def _walk(root):
    if os.path.isfile(root):
        yield root
        return
    for d, _, files in os.walk(root):
        for f in files:
            yield os.path.join(d, f)


def test_no_command_writes_or_prints_an_unkeyed_digest_of_the_data(tmp_path):
    st = _make(tmp_path / "s.zarr")
    needles = _needles(st)
    s, o = st.path, tmp_path / "out"
    o.mkdir()
    (o / "mine.csv").write_text("".join(f"{i},{r}\n" for i, r in [(1, 5), (2, 4), (3, 1)]))
    runs = [
        # first, while nothing is released: the rehearsal releases the store's shape (and makes its key)
        ("sweep", s, "--rehearse", "--methods", "means", "--epsilons", "1", "--out", o / "rehearsal",
         "--shape-epsilon", "0.5"),
        ("train", s, "--method", "means", "--epsilon", "2", "--out", o / "means", "--seed", "1"),
        ("train", s, "--method", "als", "--epsilon", "1", "--out", o / "als", "--seed", "1", "--iters", "2",
         "--checkpoint", o / "ck", "--json"),
        ("tune", s, "--method", "means", "--epsilon", "1", "--out", o / "tuned", "--seed", "1", "--json"),
        ("lowrank", s, "--rank", "2", "--epsilon", "1", "--out", o / "lowrank", "--seed", "1"),
        ("evaluate", o / "als", s),
        ("evaluate", o / "als", s, "--json"),
        ("recommend", o / "als", "--ratings", o / "mine.csv"),
        ("recommend", o / "als", "--ratings", o / "mine.csv", "--json"),
        ("recommend", o / "als", "--store", s, "--out", o / "all.parquet"),
        ("sweep", s, "--methods", "means", "--epsilons", "1", "--out", o / "sweep", "--seed", "1"),
        ("sweep", s, "--methods", "means", "--epsilons", "1", "--out", o / "sweep-json", "--seed", "1", "--json"),
        ("sweep", "--replot", o / "rehearsal" / "results.json"),
        ("generate", "--like", s, "--out", o / "like.zarr", "--noise", "0.5"),  # (no spread to match: quick)
        ("budget", s),
        ("budget", s, "--json"),
    ]
    for args in runs:
        r = _run(*args)
        _assert_clean(f"`streamdp {' '.join(map(str, args))}`'s output", r.stdout_bytes + r.stderr_bytes, needles)
    assert (o / "rehearsal" / "synthetic.zarr" / "zarr.json").exists() and (o / "ck" / "checkpoint.npz").exists()
    # what named the store by its checksum names it by its keyed fingerprint, the one its models carry
    fp = json.loads((o / "als" / "model.json").read_text())["store_fingerprint"]
    rehearsal = json.loads((o / "rehearsal" / "results.json").read_text())["rehearsal"]
    syn = json.loads((o / "rehearsal" / "synthetic.zarr" / "zarr.json").read_text())["attributes"]["streamdp"]
    assert fp.startswith("hmac-sha256:") and rehearsal["like_fingerprint"] == fp
    assert syn["params"]["like"]["store_fingerprint"] == fp
    assert json.loads((o / "sweep" / "results.json").read_text())["store_fingerprint"] == fp
    files = list(_walk(o))
    assert len(files) > 50
    for path in files:
        with open(path, "rb") as fh:
            _assert_clean(path, fh.read(), needles)
    import pyarrow.parquet as pq  # its footer's metadata, in case a writer compressed it

    meta = pq.read_metadata(o / "all.parquet").metadata or {}
    _assert_clean("all.parquet's metadata", b"".join(k + v for k, v in meta.items()), needles)


def test_a_run_id_and_a_checkpoint_name_the_store_by_its_keyed_fingerprint(tmp_path):
    """Two stores with the same ratings (the same checksum) and different release keys: the same seeded run on
    each gets run ids (in model.json) and checkpoint fingerprints that differ, as the keyed fingerprint does; an
    unkeyed hash of the checksum and the public settings would be equal, and testable by whoever guesses the data."""
    a = _make(tmp_path / "a.zarr")
    shutil.copytree(a.path, tmp_path / "b.zarr")  # no release yet: no key to copy, b gets its own
    ids, fps = [], []
    for name in ("a", "b"):
        out, ck = tmp_path / f"m-{name}", tmp_path / f"ck-{name}"
        _run("train", tmp_path / f"{name}.zarr", "--method", "als", "--epsilon", "1", "--out", out, "--seed", "1",
             "--iters", "2", "--checkpoint", ck)
        info = json.loads((out / "model.json").read_text())
        ids.append(_find(info, "run_id"))
        with np.load(ck / "checkpoint.npz") as z:
            fps.append(str(z["fp"]))
    from streamdp.storage.store import open_store

    assert open_store(a.path).checksum == open_store(str(tmp_path / "b.zarr")).checksum
    assert ids[0] and ids[1] and ids[0].split("-")[0] != ids[1].split("-")[0], ids
    assert fps[0] != fps[1], fps
    # the same store and settings still resume: the fingerprint is a function of the store and its key
    _run("train", a.path, "--method", "als", "--epsilon", "1", "--out", tmp_path / "m-a2", "--seed", "1",
         "--iters", "2", "--checkpoint", tmp_path / "ck-a")


def _find(d, key):
    if isinstance(d, dict):
        if key in d:
            return d[key]
        for v in d.values():
            got = _find(v, key)
            if got is not None:
                return got
    return None


def test_a_store_replaced_during_a_run_is_named_without_its_checksum(tmp_path):
    from streamdp.errors import StoreError
    from streamdp.storage.generate import generate_store
    from streamdp.storage.store import open_store

    st = _make(tmp_path / "s.zarr")
    old = st.checksum
    new = generate_store(str(tmp_path / "s.zarr"), n_users=800, n_items=60, ratings_per_user=12, rank=3, seed=5,
                         test_fraction=0.2, block_users=200, force=True)
    with pytest.raises(StoreError) as exc:
        st.check_unchanged()
    msg = str(exc.value)
    assert "changed while this run read it" in msg
    for c in (old, new.checksum, open_store(st.path).checksum):
        assert c.split(":")[-1] not in msg, msg


def test_budget_prints_no_checksum_of_the_data_it_keeps(tmp_path):
    """The ledger keeps the checksum of the data each release came from and of the data a replacement swapped (the
    store's own file); ``budget`` prints neither, in text or JSON."""
    from streamdp.privacy import GUARANTEE_USER_DP, Ledger, calibrate_gaussian, gaussian_event
    from streamdp.privacy.budget import BUDGET_FILE, StoreBudget
    from streamdp.storage.generate import generate_store

    old = _make(tmp_path / "s.zarr")
    b = StoreBudget(old.path)
    b.complete(b.reserve(Ledger(method="demo", guarantee=GUARANTEE_USER_DP, epsilon=1.0, delta=1e-6,
                                events=[gaussian_event(calibrate_gaussian(1.0, 1e-6))], store_checksum=old.checksum)))
    new = generate_store(old.path, n_users=800, n_items=60, ratings_per_user=12, rank=3, seed=5, test_fraction=0.2,
                         block_users=200, force=True)
    assert new.checksum != old.checksum
    kept = (tmp_path / "s.zarr" / BUDGET_FILE).read_text()
    assert old.checksum in kept and new.checksum in kept  # the owner's file keeps them
    text = _run("budget", old.path).output
    assert "data replaced by generate; the 1 release(s) before it still count" in text
    for out in (text, _run("budget", old.path, "--json").output):
        for c in (old.checksum, new.checksum):
            assert c.split(":")[-1] not in out, out
