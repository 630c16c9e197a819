"""``generate --taste-clusters`` (preference beyond popularity) and ``--implicit`` (issue 29, item 5).

The measure of "preference is more than popularity" is the one ``evaluate`` uses
(:mod:`streamdp.ranking`): Recall@10 of each user's top 10 among the items she did not
rate in training; relevant: a held-out rating in the top 20% of the range, or on an
implicit store every held-out interaction. A non-private personalized reference (EASE,
Steck 2019, closed form in NumPy) must beat the exact most-popular list by 1.5x or more on
a clustered store, and does not on the default store (popularity alone).
"""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from streamdp.cli import main
from streamdp.errors import ParameterError
from streamdp.ranking import default_threshold
from streamdp.storage.generate import generate_store
from streamdp.storage.store import open_store

SHAPE = dict(n_users=2000, n_items=300, ratings_per_user=15, seed=0, test_fraction=0.2)


def dense(store, split):
    X = np.zeros((store.n_users, store.n_items), np.float32)
    for b in store.blocks(split):
        X[np.repeat(np.arange(b.n_users) + b.first_user, np.diff(b.indptr)), b.items] = b.ratings
    return X


def recall10(store, ridge=200.0) -> dict:
    """Recall@10 of EASE and of the exact most-popular list, with ``evaluate``'s protocol (module docstring)."""
    train, test = dense(store, "train") > 0, dense(store, "test")
    thr = 0.0 if store.implicit else default_threshold(store.rating_min, store.rating_max)
    rel = test >= thr if not store.implicit else test > 0
    users = np.flatnonzero(rel.any(1))
    X = train.astype(np.float64)
    G = X.T @ X + ridge * np.eye(store.n_items)
    P = np.linalg.inv(G)
    B = -P / np.diag(P)
    np.fill_diagonal(B, 0.0)
    out = {}
    for name, S in (("popularity", np.tile(X.sum(0), (len(users), 1))), ("ease", X[users] @ B)):
        S[train[users]] = -np.inf
        top = np.argsort(-S, axis=1, kind="stable")[:, :10]
        out[name] = float(np.mean(np.take_along_axis(rel[users], top, 1).sum(1) / rel[users].sum(1)))
    return out


@pytest.mark.parametrize("implicit", [False, True])
def test_clustered_tastes_let_a_personalized_model_beat_the_chart(tmp_path, implicit):
    s = generate_store(str(tmp_path / "s.zarr"), taste_clusters=10, implicit=implicit, **SHAPE)
    r = recall10(s)
    assert r["ease"] >= 1.5 * r["popularity"], r
    # the default generator: choice by popularity alone, nothing to personalize
    d = recall10(generate_store(str(tmp_path / "d.zarr"), **SHAPE))
    assert d["ease"] < 1.2 * d["popularity"], d


def test_default_store_is_bit_identical_to_earlier_versions(tmp_path):
    """Checksums recorded with the generator before the taste and implicit options (commit 0f1e894)."""
    a = generate_store(str(tmp_path / "a"), n_users=300, n_items=50, ratings_per_user=8, seed=2, test_fraction=0.2)
    b = generate_store(str(tmp_path / "b"), n_users=200, n_items=40, ratings_per_user=6, seed=5, factors="uniform",
                       rank=2, user_bias_std=0.2, outlier_fraction=0.1, string_ids=True)
    assert a.checksum == "blake2b:f91dccdf35fe0bcc5e4bbc78c8e939c2"
    assert b.checksum == "blake2b:2f8aa542af5bd4a40765497f999332fd"
    assert "taste_clusters" not in a.attrs["params"] and "implicit" not in a.attrs


def test_clustered_store_is_numbered_by_popularity_and_deterministic(tmp_path):
    s = generate_store(str(tmp_path / "s.zarr"), taste_clusters=8, **SHAPE)
    c = s.item_counts()
    assert np.corrcoef(np.argsort(np.argsort(-c)), np.arange(len(c)))[0, 1] > 0.9  # drawing order ~ popularity
    assert s.array("truth/taste_centers").shape == (8, 8)
    again = generate_store(str(tmp_path / "t.zarr"), taste_clusters=8, workers=1, **SHAPE)
    assert again.checksum == s.checksum


def test_implicit_store_holds_counts(tmp_path):
    s = generate_store(str(tmp_path / "s.zarr"), taste_clusters=5, implicit=True, **SHAPE)
    assert s.implicit and s.attrs["value"] == "count" and s.attrs["format_version"] == 2
    v = np.concatenate([b.ratings for b in s.blocks()])
    assert v.min() >= 1 and np.all(v == np.floor(v)) and v.max() > 3
    assert s.rating_range_source == "observed" and s.rating_min == 1.0 and s.rating_max >= v.max()
    # counts grow with the user's latent preference: they follow the truth's item bias
    bias = np.asarray(s.array("truth/item_bias")[...])
    X = dense(s, "train")
    mean_count = np.where((X > 0).sum(0) > 0, X.sum(0) / np.maximum((X > 0).sum(0), 1), np.nan)
    ok = ~np.isnan(mean_count)
    assert np.corrcoef(bias[ok], np.log(mean_count[ok]))[0, 1] > 0.3
    capped = generate_store(str(tmp_path / "c.zarr"), implicit=True, count_cap=3, **SHAPE)
    assert (capped.rating_min, capped.rating_max, capped.rating_range_source) == (0.0, 3.0, "declared")
    assert max(float(b.ratings.max()) for b in capped.blocks()) == 3.0


def test_options_and_cli(tmp_path):
    with pytest.raises(ParameterError, match="--count-cap: only with --implicit"):
        generate_store(str(tmp_path / "x"), n_users=10, n_items=5, count_cap=3)
    with pytest.raises(ParameterError, match="--taste-clusters"):
        generate_store(str(tmp_path / "x"), n_users=10, n_items=5, taste_clusters=-1)
    with pytest.raises(ParameterError, match="--outlier-fraction"):
        generate_store(str(tmp_path / "x"), n_users=10, n_items=5, implicit=True, outlier_fraction=0.1)
    r = CliRunner().invoke(main, ["generate", "--out", str(tmp_path / "s.zarr"), "--users", "300", "--items", "40",
                                  "--ratings-per-user", "5", "--taste-clusters", "4", "--implicit"])
    assert r.exit_code == 0 and "interactions (implicit: counts)" in r.stdout, r.stdout + r.stderr
    assert open_store(tmp_path / "s.zarr").implicit
