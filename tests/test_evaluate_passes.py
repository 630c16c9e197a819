"""evaluate makes one pass over a store that recorded its training items' sums and counts when it was written
(issue 30 item 1), and two, with the same numbers to the bit, over a store written before."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import zarr

from streamdp.cli import format_train_summary
from streamdp.serving.evaluate import evaluate_model, format_evaluation
from streamdp.storage.store import RatingStore, open_store
from streamdp.storage.writer import block_item_stats
from streamdp.stream.engine import Engine
from streamdp.workflows.training import train


def without_item_stats(src: str, dst: str) -> str:
    """A copy of store ``src`` as streamdp wrote it before it recorded the training items' statistics: the same
    arrays and attributes (checksum, generation, release key) less ``train/item_sums``, ``train/item_counts`` and
    the ``train_item_stats`` attribute."""
    shutil.copytree(src, dst)
    for name in ("item_sums", "item_counts"):
        shutil.rmtree(os.path.join(dst, "train", name))
    g = zarr.open_group(dst, mode="r+")
    attrs = dict(g.attrs["streamdp"])
    del attrs["train_item_stats"]
    g.attrs["streamdp"] = attrs
    return dst


def passes(monkeypatch) -> list:
    """The progress labels of the engine's passes from now on (every pass of every caller is a ``map_reduce``)."""
    seen = []
    orig = Engine.map_reduce

    def recorded(self, *a, desc="pass", **k):
        seen.append(desc)
        return orig(self, *a, desc=desc, **k)

    monkeypatch.setattr(Engine, "map_reduce", recorded)
    return seen


def exact_stats(store) -> np.ndarray:
    """The training items' sums and counts summed from the blocks as the evaluation's own pass does."""
    S = np.zeros((2, store.n_items))
    for blk in store.blocks():
        S += block_item_stats(blk.items, blk.ratings, store.n_items)
    return S


@pytest.fixture(scope="module")
def trained(small_store, tmp_path_factory):
    """``(new store, old store, model)``: the small store, its copy without the statistics, a DP-ALS model of it."""
    d = tmp_path_factory.mktemp("evpass")
    out = str(d / "m")
    train(small_store.path, out=out, method="als", epsilon=2.0, delta=1e-5, rank=4, iters=2, select="off", seed=1,
          workers=1, evaluate_test=False)
    return small_store.path, without_item_stats(small_store.path, str(d / "old.zarr")), out


def test_the_writer_records_the_exact_training_item_statistics(small_store):
    sums, counts = small_store.train_item_stats()
    S = exact_stats(small_store)
    assert np.array_equal(sums, S[0]) and np.array_equal(counts, S[1])  # bit for bit
    assert counts.sum() == small_store.n_ratings


def test_one_pass_on_a_store_with_statistics_two_without_and_the_same_numbers(trained, monkeypatch):
    new, old, model = trained
    seen = passes(monkeypatch)
    one = evaluate_model(model, new, ranking_users="all")
    assert seen == ["evaluate"] and one["item_statistics"] == "recorded"
    seen.clear()
    two = evaluate_model(model, old, ranking_users="all")
    assert seen == ["evaluate: baselines", "evaluate"] and two["item_statistics"] == "pass"
    assert one["store_matches_model"] is True and two["store_matches_model"] is True  # the same data and key
    del one["item_statistics"], two["item_statistics"]
    assert one == two  # RMSE, MAE, every baseline, the ranking metrics and both charts, to the bit
    assert one["ranking"]["baselines"]["popularity"]["recall"] > 0  # the exact chart was measured
    assert "note:" not in format_evaluation({**one, "item_statistics": "recorded"})
    text = format_evaluation({**two, "item_statistics": "pass"})
    assert text.count("took a pass of their own") == 1


def test_the_recorded_statistics_give_the_numbers_of_the_pass_on_the_same_store(trained, monkeypatch):
    """The same store evaluated from its recorded statistics and, those ignored, from the pass: the same dict."""
    new, _, model = trained
    one = evaluate_model(model, new)
    monkeypatch.setattr(RatingStore, "train_item_stats", lambda self: None)
    seen = passes(monkeypatch)
    two = evaluate_model(model, new)
    assert seen == ["evaluate: baselines", "evaluate"]
    assert {**one, "item_statistics": "pass"} == two


def test_train_summary_says_once_when_the_statistics_took_a_pass(trained, tmp_path, monkeypatch):
    _, old, _ = trained
    seen = passes(monkeypatch)
    s = train(old, out=str(tmp_path / "m"), method="means", epsilon=1.0, delta=1e-5, seed=1, workers=1)
    assert s["item_statistics"] == "pass" and seen[-2:] == ["evaluate: baselines", "evaluate"]
    assert format_train_summary(s).count("took a pass of their own") == 1
    assert "took a pass" not in format_train_summary({**s, "item_statistics": "recorded"})


def _csv(path, rows):
    path.write_text("user,item,rating,time\n" + "".join(f"{u},{i},{r},{t}\n" for u, i, r, t in rows))
    return str(path)


@pytest.mark.parametrize("how", ["plain", "random", "temporal", "files", "parquet", "frame", "sparse", "implicit"])
def test_every_kind_of_ingest_records_them(tmp_path, how):
    """Files, --test-fraction, --split temporal, --train/--test, Parquet, a DataFrame, a scipy.sparse matrix and an
    interaction log: each store's recorded statistics are those of its training blocks, bit for bit, and verify
    recomputes them."""
    import pandas as pd
    import scipy.sparse as sp

    import streamdp
    from streamdp.stream.verify import verify_store

    rng = np.random.default_rng(5)
    n = 900
    rows = list(zip(rng.integers(0, 120, n), rng.integers(0, 50, n), rng.integers(1, 11, n) / 2,
                    rng.integers(0, 10**6, n)))
    out = str(tmp_path / "s.zarr")
    if how == "files":
        src = dict(train=_csv(tmp_path / "a.csv", rows[:700]), test=_csv(tmp_path / "b.csv", rows[700:]))
        st = streamdp.ingest(out=out, **src)
    else:
        if how == "frame":
            src = pd.DataFrame(rows, columns=["user", "item", "rating", "time"])
        elif how == "sparse":
            src = sp.csr_matrix((np.array([r for *_, r, _ in rows]), ([u for u, *_ in rows], [i for _, i, *_ in rows])))
            src.sum_duplicates()
        elif how == "parquet":
            src = str(tmp_path / "r.parquet")
            pd.DataFrame(rows, columns=["user", "item", "rating", "time"]).to_parquet(src)
        else:
            src = _csv(tmp_path / "r.csv", rows)
        kw = {"random": dict(test_fraction=0.3, seed=1), "temporal": dict(split="temporal", test_fraction=0.3),
              "implicit": dict(columns="user,item", implicit=True, test_fraction=0.3, seed=1)}.get(how, {})
        st = streamdp.ingest(src, out=out, **kw)
    st = open_store(out)
    assert (how == "implicit") == st.implicit and st.has_test == (how in ("random", "temporal", "files", "implicit"))
    sums, counts = st.train_item_stats()
    S = exact_stats(st)
    assert np.array_equal(sums, S[0]) and np.array_equal(counts, S[1]) and counts.sum() == st.n_ratings
    assert verify_store(out)["ok"]


def test_generated_and_implicit_generated_stores_record_them(tmp_path):
    from streamdp.storage.generate import generate_store

    for kw in ({}, {"implicit": True}, {"test_fraction": 0.0}):
        st = generate_store(str(tmp_path / f"g{len(os.listdir(tmp_path))}.zarr"), n_users=300, n_items=30,
                            ratings_per_user=6, rank=2, seed=4, block_users=70, **({"test_fraction": 0.2} | kw))
        sums, counts = st.train_item_stats()
        S = exact_stats(st)
        assert np.array_equal(sums, S[0]) and np.array_equal(counts, S[1])


def test_a_store_without_them_opens_and_verifies_as_before(trained):
    _, old, _ = trained
    st = open_store(old)
    assert st.train_item_stats() is None
    st.check_chunks()
    from streamdp.stream.verify import verify_store

    r = verify_store(old)
    assert r["ok"] and r["checksum"] == open_store(trained[0]).checksum  # outside the checksum: the same store
