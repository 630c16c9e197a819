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
from streamdp.model import save_model
from streamdp.privacy import GUARANTEE_NONE, Ledger


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
