"""``ingest --append`` (segments), merged reads, ``compact``: issue 43 part 1."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

import streamdp
from streamdp.cli import main
from streamdp.errors import InputError, ParameterError, StoreError
from streamdp.storage.compact import compact
from streamdp.storage.segments import SEGMENTS_DIR, SegmentedStore
from streamdp.storage.store import open_store


def _ratings(seed: int, n: int, users: int, items: int, user0: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"user": user0 + rng.integers(0, users, n), "item": rng.zipf(1.4, n) % items,
                         "rating": rng.integers(1, 6, n).astype(float)})


def _triples(st, split: str = "train") -> dict:
    """{(user id, item id): rating} of a split, through the store's own ids."""
    uid, iid, out = st.user_ids(), st.item_ids(), {}
    for b in range(st.n_blocks):
        blk = st.read_block(b, split)
        u = np.repeat(np.arange(blk.n_users), np.diff(blk.indptr)) + blk.first_user
        for a, i, r in zip(uid[u].tolist(), iid[blk.items].tolist(), blk.ratings.tolist()):
            assert (a, i) not in out
            out[(a, i)] = r
    return out


def _snapshot(path) -> dict:
    out = {}
    for root, _, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, path)] = hashlib.sha256(fh.read()).hexdigest()
    return out


@pytest.fixture()
def parts():
    old = _ratings(0, 6000, 300, 40)
    new = pd.concat([_ratings(1, 2000, 300, 40), _ratings(2, 300, 30, 45, user0=1000)])  # new users and items
    return old, new


@pytest.mark.parametrize("ids", ["int", "str"])
def test_append_reads_like_ingest_of_everything(tmp_path, parts, capsys, ids):
    old, new = parts
    if ids == "str":  # string ids, and an append of integer-looking item ids read as strings
        old, new = (df.assign(user=[f"u{x:05d}" for x in df.user]) for df in (old, new))
        old = old.assign(item=[f"i{x}" if x % 3 else str(x) for x in old.item])
        new = new.assign(item=new.item.astype(str))
    p, f = str(tmp_path / "s.zarr"), str(tmp_path / "f.zarr")
    streamdp.ingest(old, p, block_users=64)
    st = streamdp.ingest(new, p, append=True)
    assert "pair(s) already in the store were replaced by the appended rating" in capsys.readouterr().err
    full = streamdp.ingest(pd.concat([old, new]), f, block_users=64)
    assert isinstance(st, SegmentedStore) and st.attrs["format_version"] == 3
    assert (st.n_users, st.n_items, st.n_ratings) == (full.n_users, full.n_items, full.n_ratings)
    assert _triples(st) == _triples(full)  # the last seen wins, across segments as within an ingest
    assert dict(zip(st.user_ids().tolist(), st.user_counts().tolist())) == \
        dict(zip(full.user_ids().tolist(), full.user_counts().tolist()))
    assert dict(zip(st.item_ids().tolist(), st.item_counts().tolist())) == \
        dict(zip(full.item_ids().tolist(), full.item_counts().tolist()))
    assert int(st.block_nnz().sum()) == st.n_ratings
    e = st.attrs["segments"][-1]
    assert e["n_pairs_merged"] > 0 and e["n_new_users"] == len(set(new.user) - set(old.user))
    st.check_chunks()


def _train(store, seed=3):
    return streamdp.train(store, epsilon=5.0, seed=seed, evaluate=False, rank=4)


def _fit_once(store, seed=3):
    """A non-private als model fitted once (an explicit item ridge: nothing to choose), where any model will do."""
    return streamdp.train(store, epsilon=float("inf"), allow_nonprivate=True, reg=10.0, iters=3, seed=seed,
                          evaluate=False, rank=4)


def test_append_then_train_equals_ingest_of_everything(tmp_path):
    """Seeded, the same model bit for bit: new users' ids sort after the old ones, the append adds as many ratings
    to every old item (their popularity order stays) and new items are the least rated, so both stores number
    users and items alike and hold the same blocks (asserted), and the methods see nothing else of a store (its
    checksum and generation only name the run)."""
    old = _ratings(0, 8000, 400, 50)
    items = np.unique(old.item)
    rng = np.random.default_rng(5)
    again = old.drop_duplicates(["user", "item"], keep="last").sample(200, random_state=1)  # pairs rated again
    new = pd.concat([
        again.assign(rating=rng.integers(1, 6, len(again)).astype(float)),
        pd.DataFrame({"user": np.repeat(np.arange(5000, 5010), len(items)), "item": np.tile(items, 10),
                      "rating": rng.integers(1, 6, 10 * len(items)).astype(float)}),
        pd.DataFrame({"user": [5000, 5001, 5001], "item": [900, 900, 901], "rating": [4.0, 2.0, 5.0]})])
    p, f = str(tmp_path / "s.zarr"), str(tmp_path / "f.zarr")
    streamdp.ingest(old, p, block_users=128)
    st = streamdp.ingest(new, p, append=True)
    full = streamdp.ingest(pd.concat([old, new]), f, block_users=128)
    assert list(st.item_ids()) == list(full.item_ids()) and list(st.user_ids()) == list(full.user_ids())
    for b in range(st.n_blocks):
        a, c = st.read_block(b), full.read_block(b)
        assert np.array_equal(a.indptr, c.indptr) and np.array_equal(a.items, c.items)
        assert np.array_equal(a.ratings, c.ratings)
    m1, m2 = _train(st), _train(full)
    assert np.array_equal(m1.item_factors, m2.item_factors) and np.array_equal(m1.item_bias, m2.item_bias)


def test_compact_equals_segmented(tmp_path, parts):
    old, new = parts
    p = str(tmp_path / "s.zarr")
    streamdp.ingest(old, p, block_users=64, test_fraction=0.2)
    streamdp.ingest(new.iloc[:1000], p, append=True)
    st = streamdp.ingest(new.iloc[1000:], p, append=True)
    assert len(st.segments) == 2 and st.n_test > 0
    train, test = _triples(st), _triples(st, "test")
    assert not set(train) & set(test)  # a pair is in one split of the merged store
    uc, ic, uid, iid = st.user_counts(), st.item_counts(), list(st.user_ids()), list(st.item_ids())
    m1 = _fit_once(st)
    c = compact(p)
    assert not isinstance(c, SegmentedStore) and c.attrs["format_version"] == 1
    assert not os.path.exists(os.path.join(p, SEGMENTS_DIR))
    assert _triples(c) == train and _triples(c, "test") == test
    assert np.array_equal(c.user_counts(), uc) and np.array_equal(c.item_counts(), ic)
    assert list(c.user_ids()) == uid and list(c.item_ids()) == iid
    m2 = _fit_once(c)
    assert np.array_equal(m1.item_factors, m2.item_factors)
    # the ledger went along: both runs are on it
    from streamdp.privacy.budget import StoreBudget

    assert len(StoreBudget(p).entries()) == 2
    streamdp.storage.store.open_store(p).check_chunks()


@pytest.mark.parametrize("case", ["log", "range", "ids", "option", "implicit-cli"])
def test_bad_append_is_one_line_and_leaves_the_store(tmp_path, parts, case):
    old, _ = parts
    p = str(tmp_path / "s.zarr")
    streamdp.ingest(old, p, block_users=64)
    before = _snapshot(p)
    new = tmp_path / "new.csv"
    if case == "log":
        new.write_text("user,item,count\n1,2,3\n")
    elif case == "range":
        new.write_text("user,item,rating\n1,2,9\n")
    elif case == "ids":
        new.write_text("user,item,rating\nalice,2,3\n")
    else:
        new.write_text("user,item,rating\n1,2,3\n")
    extra = {"option": ["--rating-range", "1,10"], "implicit-cli": ["--implicit"]}.get(case, [])
    r = CliRunner().invoke(main, ["ingest", str(new), "--append", p, *extra])
    assert r.exit_code != 0, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in r.output, r.output
    want = {"log": "interaction log", "range": "--rating-range", "ids": "user ids", "option": "--rating-range",
            "implicit-cli": "interaction log"}[case]
    assert want in lines[0]
    assert _snapshot(p) == before


def test_killed_append_leaves_the_store(tmp_path, parts, monkeypatch):
    old, new = parts
    p = str(tmp_path / "s.zarr")
    streamdp.ingest(old, p, block_users=64)
    before = _snapshot(p)
    from streamdp.storage import append as A, ingest as I

    def boom(*a, **k):
        raise RuntimeError("killed")

    # mid-write; counting the change to the merged counts (its own thread, beside the writer); written but not
    # committed
    for target, name in ((I, "_write_blocks"), (A, "count_delta"), (A, "commit_attrs")):
        with monkeypatch.context() as m:
            m.setattr(target, name, boom)
            with pytest.raises(RuntimeError):
                streamdp.ingest(new, p, append=True)
        assert _snapshot(p) == before
        assert not isinstance(open_store(p), SegmentedStore)
    # a process killed after the segment was in place but before the commit: no reader sees it; the next append
    # removes it
    stale = os.path.join(p, SEGMENTS_DIR, "000001-deadbeef")
    os.makedirs(os.path.join(stale, "train"))
    import json
    import socket

    dead_tmp = os.path.join(p, SEGMENTS_DIR, ".000001-deadbeef.tmp-0123456789ab")  # its writer's, owner gone
    os.makedirs(dead_tmp)
    with open(os.path.join(dead_tmp, "owner.json"), "w") as fh:
        json.dump({"pid": 2**22 + 1, "host": socket.gethostname()}, fh)
    assert open_store(p).n_ratings == open_store(p).block_nnz().sum()
    st = streamdp.ingest(new, p, append=True)
    assert not os.path.exists(stale) and not os.path.exists(dead_tmp) and len(st.segments) == 1


def test_train_racing_append_reads_one_list_and_refuses(tmp_path, parts):
    old, new = parts
    p = str(tmp_path / "s.zarr")
    streamdp.ingest(old, p, block_users=64)
    opened = open_store(p)  # a run opened the store before the append
    before = _triples(opened)
    streamdp.ingest(new, p, append=True)
    assert _triples(opened) == before  # its reads stay on the list it opened: never a mix
    with pytest.raises(StoreError, match="changed while this run read it"):
        opened.check_unchanged()
    with pytest.raises(StoreError, match="changed while this run read it"):
        _train(opened)
    # and a segmented store opened before a second append, or a compaction, alike
    seg = open_store(p)
    streamdp.ingest(new.iloc[:10], p, append=True)
    with pytest.raises(StoreError, match="changed while this run read it"):
        seg.check_unchanged()
    seg2 = open_store(p)
    compact(p)
    with pytest.raises(StoreError, match="changed while this run read it"):
        seg2.check_unchanged()


def test_info_verify_evaluate_on_a_segmented_store(tmp_path, parts):
    old, new = parts
    p = str(tmp_path / "s.zarr")
    streamdp.ingest(old, p, block_users=64, test_fraction=0.2)
    streamdp.ingest(new.iloc[:1500], p, append=True)
    streamdp.ingest(new.iloc[1500:], p, append=True)
    r = CliRunner().invoke(main, ["info", p])
    assert r.exit_code == 0 and "segment " in r.output, r.output
    r = CliRunner().invoke(main, ["verify", p])
    assert r.exit_code == 0 and "OK" in r.output and "2 appended segment(s) each checked" in r.output, r.output
    m = _fit_once(open_store(p))
    res = streamdp.evaluate(m, p)
    assert np.isfinite(res["rmse"]) and res["item_statistics"] == "pass (segments)"  # merged, by one pass
    # damage in a segment is found
    st = open_store(p)
    arr = os.path.join(st.segments[0].path, "merge", "item_counts")
    import zarr

    z = zarr.open_array(arr, mode="r+")
    z[0] = z[0] + 1
    r = CliRunner().invoke(main, ["verify", p])
    assert r.exit_code != 0 and "merge arrays" in r.output, r.output


def test_append_cli_and_implicit_counts(tmp_path):
    p = str(tmp_path / "s.zarr")
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text("user,item,count\n" + "".join(f"{u},{i},1\n" for u in range(40) for i in range(u % 7 + 2)))
    b.write_text("user,item,count\n1,0,2\n1,0,1\n99,5,4\n")
    r = CliRunner().invoke(main, ["ingest", str(a), "--out", p, "--count-cap", "5"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["ingest", str(b), "--append", p])
    assert r.exit_code == 0, r.output
    assert "1 pair(s) already in the store had their counts added to" in r.output
    st = open_store(p)
    t = _triples(st)
    assert t[(1, 0)] == 4.0 and t[(99, 5)] == 4.0  # 1 + (2 + 1) summed; a new user
    r = CliRunner().invoke(main, ["ingest", str(b), "--append", p])
    assert open_store(p).n_ratings == st.n_ratings and _triples(open_store(p))[(1, 0)] == 5.0  # capped
    r = CliRunner().invoke(main, ["ingest", str(b), "--out", p, "--append", p])
    assert r.exit_code != 0 and "not both" in r.output
    merged = _triples(open_store(p))
    r = CliRunner().invoke(main, ["compact", p])
    assert r.exit_code == 0 and _triples(open_store(p)) == merged == t | {(1, 0): 5.0, (99, 5): 5.0}, r.output
    with pytest.raises(StoreError, match="changed while this run read it"):
        st.user_ids()  # a store opened before the compaction says so, not that it is damaged


@pytest.mark.parametrize("split", [dict(split="temporal", test_fraction=0.2),
                                   pytest.param(dict(split="last-n", last_n=1), marks=pytest.mark.slow),  # issue 41
                                   dict(test_fraction=0.3)])
def test_append_holds_out_by_the_stores_split(tmp_path, split):
    def rows(seed, n, t0):
        r = np.random.default_rng(seed)
        return pd.DataFrame({"user": r.integers(0, 200, n), "item": r.integers(0, 30, n),
                             "rating": r.integers(1, 6, n).astype(float), "timestamp": t0 + r.integers(0, 1000, n)})

    p = str(tmp_path / "s.zarr")
    old = streamdp.ingest(rows(0, 3000, 0), p, block_users=32, **split)
    st = streamdp.ingest(rows(1, 800, 2000), p, append=True)
    assert st.attrs["segments"][0]["n_test_added"] > 0 and st.n_test > old.n_test
    assert not set(_triples(st)) & set(_triples(st, "test"))
    from streamdp.stream.verify import verify_store

    assert verify_store(p)["ok"]
    if split.get("split"):  # a temporal split needs the appended ratings' times
        with pytest.raises(InputError, match="no timestamp column"):
            streamdp.ingest(rows(2, 10, 0).drop(columns="timestamp"), p, append=True)


def test_append_to_a_generated_store_and_workers_refuse_another_write(tmp_path):
    from streamdp.storage.generate import generate_store
    from streamdp.stream import engine

    p = str(tmp_path / "g.zarr")
    generate_store(p, n_users=300, n_items=40, ratings_per_user=10, rank=2, seed=0, test_fraction=0.2)
    gen = open_store(p).attrs["generation"]
    st = streamdp.ingest(pd.DataFrame({"user": [1, 999], "item": [0, 5], "rating": [3.0, 2.0]}), p, append=True)
    assert st.n_users == 301 and st.attrs["generation"] != gen
    # a cluster worker opening the store by path for a run that opened the earlier write refuses
    with pytest.raises(StoreError, match="changed while this run read it"):
        engine._cached_store(p, gen)
    assert engine._cached_store(p, st.attrs["generation"]).n_users == 301
    with pytest.raises(ParameterError, match="--block-users: not with --append"):
        streamdp.ingest(pd.DataFrame({"user": [1], "item": [0], "rating": [3.0]}), p, append=True, block_users=4)


def test_the_budget_ledger_is_kept_across_an_append(tmp_path, parts):
    from streamdp.privacy.budget import StoreBudget

    old, new = parts
    p = str(tmp_path / "s.zarr")
    streamdp.ingest(old, p, block_users=64, budget=(20.0, 1e-6))
    _train(open_store(p))
    spent = StoreBudget(p).show()["spent"]["epsilon"]
    assert spent > 0
    streamdp.ingest(new, p, append=True)
    s = StoreBudget(p).show()
    assert s["spent"]["epsilon"] == spent and s["budget"]["epsilon"] == 20.0 and len(s["entries"]) == 1
    assert s["history"][-1]["by"] == "ingest --append"
    with pytest.raises(ParameterError, match="--budget: not with --append"):
        streamdp.ingest(new, p, append=True, budget=(1.0, 1e-6))


def test_killed_compaction_leaves_the_segmented_store(tmp_path, parts, monkeypatch):
    from streamdp.storage import writer

    old, new = parts
    p = str(tmp_path / "s.zarr")
    streamdp.ingest(old, p, block_users=64)
    streamdp.ingest(new, p, append=True)
    before, merged = _snapshot(p), _triples(open_store(p))
    calls = []

    def boom(self, b, *a, **k):
        calls.append(b)
        if len(calls) > 2:
            raise RuntimeError("killed")
        return orig(self, b, *a, **k)

    orig = writer.StoreWriter.write_block
    monkeypatch.setattr(writer.StoreWriter, "write_block", boom)
    with pytest.raises(RuntimeError):
        compact(p)
    assert _snapshot(p) == before and _triples(open_store(p)) == merged
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".s.zarr.tmp")]


# issue 41: sgld and fw (6-8 s each, calibrated) with -m slow; als (test_compact_equals_segmented) and ials by default
@pytest.mark.parametrize("method", ["ials", pytest.param("sgld", marks=pytest.mark.slow),
                                    pytest.param("fw", marks=pytest.mark.slow)])
def test_other_methods_train_the_same_model_on_the_compacted_twin(tmp_path, parts, method):
    """Seeded and on one worker (sgld's Hogwild threads on several are not reproducible even on one store)."""
    old, new = parts
    p, c = str(tmp_path / "s.zarr"), str(tmp_path / "c.zarr")
    streamdp.ingest(old, p, block_users=64, test_fraction=0.2, rating_range=(1, 5))
    streamdp.ingest(new, p, append=True)
    import shutil

    shutil.copytree(p, c)
    compact(c)
    kw = dict(epsilon=5.0, method=method, seed=2, evaluate=False, workers=1)
    assert np.array_equal(streamdp.train(p, **kw).item_factors, streamdp.train(c, **kw).item_factors)


def test_a_segmented_store_on_dask_workers(tmp_path, parts):
    """Workers open the store by path: they see the merged store of the run's generation."""
    from streamdp.stream.verify import verify_store

    old, new = parts
    p = str(tmp_path / "s.zarr")
    streamdp.ingest(old, p, block_users=64, test_fraction=0.2)
    streamdp.ingest(new, p, append=True)
    assert verify_store(p, scheduler="dask", workers=2)["ok"]
    from streamdp.stream.engine import Engine

    st = open_store(p)
    with Engine(st, workers=2, scheduler="dask", memory_limit="2GB") as eng:
        nnz = eng.map_reduce(lambda blk, b: (b, len(blk.items), float(blk.ratings.sum())),
                             lambda acc, x: acc + [x], [], desc="count")
    assert [n for _, n, _ in sorted(nnz)] == st.block_nnz().tolist()
    assert sum(r for _, _, r in nnz) == pytest.approx(sum(float(st.read_block(b).ratings.sum())
                                                          for b in range(st.n_blocks)))
