"""The third adversarial round (issue 40, part 4): each test failed on the tree it was filed against.

* ``--epsilon 0`` in ``train`` and ``tune`` was a ``ZeroDivisionError`` traceback, ``--epsilon -1`` an answer
  about a "noise_multiplier": now one line naming ``--epsilon``, nothing written, nothing charged.
"""

from __future__ import annotations

import math
import os

import pytest

import streamdp
from streamdp.errors import ParameterError
from streamdp.methods import load_builtin
from streamdp.privacy.budget import StoreBudget


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A small generated store with a test split (200 users, 30 items) and a budget of epsilon 3."""
    from streamdp.storage.generate import generate_store

    path = tmp_path_factory.mktemp("third") / "s.zarr"
    st = generate_store(str(path), n_users=200, n_items=30, ratings_per_user=10, rank=2, seed=1, test_fraction=0.2,
                        show_progress=False)
    StoreBudget(st.path).set(3.0, 1e-6)
    return st.path


def _entries(path):
    return StoreBudget(path).entries()


@pytest.mark.parametrize("epsilon", ["0", "-1", "nan"])
@pytest.mark.parametrize("method", sorted(load_builtin()))
def test_train_epsilon_not_positive_is_one_line(cli, store, tmp_path, method, epsilon):
    before = _entries(store)
    res = cli.run("train", store, "--method", method, "--epsilon", epsilon, "--out", tmp_path / "m")
    cli.error(res, "--epsilon", "positive")
    assert "noise_multiplier" not in res[2]
    assert not (tmp_path / "m").exists() and _entries(store) == before


@pytest.mark.parametrize("epsilon", ["0", "-1"])
def test_tune_epsilon_not_positive_is_one_line(cli, store, tmp_path, epsilon):
    before = _entries(store)
    res = cli.run("tune", store, "--epsilon", epsilon, "--out", tmp_path / "m")
    cli.error(res, "--epsilon", "positive")
    assert not (tmp_path / "m").exists() and _entries(store) == before


@pytest.mark.parametrize("epsilon", [0, 0.0, -1, math.nan])
@pytest.mark.parametrize("call", ["train", "tune"])
def test_python_api_epsilon_not_positive(store, tmp_path, call, epsilon):
    before = _entries(store)
    kw = {"method": "means"} if call == "train" else {}
    with pytest.raises(ParameterError, match="epsilon: expected a positive number"):
        getattr(streamdp, call)(store, epsilon=epsilon, out=str(tmp_path / "m"), **kw)
    assert not os.path.exists(tmp_path / "m") and _entries(store) == before
