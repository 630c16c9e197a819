"""Hostile model directories: non-finite values, arrays of the wrong shape, a broken manifest.

Finding: a model whose factors held NaN/inf loaded, and ``recommend`` printed ``nan``
items with exit 0; factors of the wrong shape gave a traceback. Every case is now one
line naming the model and the array, exit 2, before anything is computed.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

from streamdp.cli import main
from streamdp.privacy import GUARANTEE_NONE, Ledger
from streamdp.serving.model import save_model


@pytest.fixture
def model(tmp_path):
    out = tmp_path / "m"
    save_model(str(out), item_factors=np.eye(4, 2), item_bias=np.zeros(4), item_ids=np.array([1, 2, 3, 4]),
               global_mean=3.0, model_info={"method": "als", "ridge": 1.0, "rating_range": {"min": 1, "max": 5}},
               ledger=Ledger(method="als", guarantee=GUARANTEE_NONE, epsilon=math.inf, delta=1e-6))
    ratings = tmp_path / "me.csv"
    ratings.write_text("item,rating\n1,5\n")
    return out, ratings


def _replace(path, name, data):
    g = zarr.open_group(str(path / "factors.zarr"), mode="a")
    del g[name]
    g.create_array(name, data=data)


def _recommend(out, ratings):
    r = CliRunner().invoke(main, ["recommend", str(out), "--ratings", str(ratings)])
    return r.exit_code, r.output


def test_a_sound_model_recommends(model):
    code, out = _recommend(*model)
    assert code == 0 and "nan" not in out


@pytest.mark.parametrize("name,data,words", [
    ("item_factors", np.array([[np.nan, 0], [0, 1], [1, 0], [0, 0]], np.float32), "item_factors holds NaN"),
    ("item_bias", np.array([0, np.inf, 0, 0], np.float32), "item_bias holds NaN or infinity"),
    ("item_factors", np.ones((3, 2), np.float32), "item_bias has shape (4,), not (3,)"),
    ("item_factors", np.ones(4, np.float32), "item_factors has shape (4,)"),
    ("item_factors", np.ones((4, 3), np.float32), "3 columns, model.json says rank 2"),
])
def test_a_broken_model_is_refused_in_one_line(model, name, data, words):
    out, ratings = model
    _replace(out, name, data)
    code, text = _recommend(out, ratings)
    assert code == 2 and words in text and text.count("\n") == 1 and "Traceback" not in text, text


def test_a_non_finite_global_mean_is_refused(model):
    out, ratings = model
    g = zarr.open_group(str(out / "factors.zarr"), mode="a")
    g.attrs["global_mean"] = float("nan")
    code, text = _recommend(out, ratings)
    assert code == 2 and "global_mean" in text, text


def test_a_model_json_that_is_not_an_object_is_refused(model):
    out, ratings = model
    (out / "model.json").write_text(json.dumps([1, 2]))
    code, text = _recommend(out, ratings)
    assert code == 2 and "model.json" in text and "Traceback" not in text, text


# -- finite but absurd factors: non-finite predictions ----------------------------------------------------------------


@pytest.fixture(scope="module")
def absurd(tmp_path_factory):
    """A non-private als model of a small store whose factors were all set to 1e30 (finite: it loads)."""
    from streamdp.storage.generate import generate_store
    from streamdp.workflows.training import train

    d = tmp_path_factory.mktemp("absurd")
    st = generate_store(str(d / "s.zarr"), n_users=300, n_items=60, ratings_per_user=10, rank=2, seed=1,
                        test_fraction=0.2)
    train(st, method="als", out=str(d / "m"), epsilon=math.inf, rank=2, seed=1, evaluate_test=False)
    g = zarr.open_group(str(d / "m" / "factors.zarr"), mode="a")
    V = np.asarray(g["item_factors"][:])
    del g["item_factors"]
    g.create_array("item_factors", data=np.full_like(V, 1e30))
    blk = st.read_block(0)
    ids = st.item_ids()
    me = d / "me.csv"  # user 0's own ratings: her local solve overflows
    me.write_text("item,rating\n" + "".join(f"{ids[i]},{r:g}\n" for i, r in zip(blk.items[:blk.indptr[1]],
                                                                                 blk.ratings[:blk.indptr[1]])))
    return d


@pytest.mark.parametrize("args", [
    ["evaluate", "{d}/m", "{d}/s.zarr"],
    ["evaluate", "{d}/m", "{d}/s.zarr", "--json"],
    ["recommend", "{d}/m", "--ratings", "{d}/me.csv"],
    ["recommend", "{d}/m", "--store", "{d}/s.zarr", "--out", "{d}/recs.parquet"],
], ids=["evaluate", "evaluate-json", "recommend", "batch-recommend"])
def test_non_finite_predictions_are_one_line(absurd, args):
    r = CliRunner().invoke(main, [a.format(d=absurd) for a in args])
    assert r.exit_code == 2, (r.exit_code, r.output)
    assert r.stdout == "" and "nan" not in r.output.lower().replace("nan or", ""), r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "not finite" in lines[0] and str(absurd / "m") in lines[0], r.stderr
    assert not (absurd / "recs.parquet").exists()
