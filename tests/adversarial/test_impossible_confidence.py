"""ials confidences float64 cannot hold, and a fitted model no user can solve on.

Finding (issue 40, third round): ``--alpha 1e20 --max-confidence 1e20`` ended in a LinAlgError traceback;
with ``1e300`` non-private, the error exit came from the evaluation after the write and left a complete model
and a ``complete`` budget entry. The cap is refused up front, and a fitted model whose local solve is not finite
is refused before anything is written (the entry marked failed).
"""

from __future__ import annotations

import math
import os

import pytest

from streamdp.privacy.budget import StoreBudget


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from streamdp.storage.generate import generate_store

    path = tmp_path_factory.mktemp("conf") / "s.zarr"
    return generate_store(str(path), n_users=200, n_items=30, ratings_per_user=8, rank=2, seed=3,
                          test_fraction=0.2, block_users=100)


@pytest.mark.parametrize("epsilon", ["1", "inf"])
def test_an_impossible_max_confidence_is_one_line_before_anything_is_spent(cli, store, tmp_path, epsilon):
    before = len(StoreBudget(store.path).entries())
    res = cli.run("train", store.path, "--method", "ials", "--alpha", "1e20", "--max-confidence", "1e20",
                  "--epsilon", epsilon, "--yes", "--out", tmp_path / "m")
    cli.error(res, "--max-confidence", "2^52")
    assert not (tmp_path / "m").exists()
    assert len(StoreBudget(store.path).entries()) == before


def test_a_cap_below_the_bound_is_accepted():
    from streamdp.methods import get_method

    get_method("ials")(epsilon=math.inf, delta=1e-6, max_confidence=2.0 ** 52 * 0.99)  # accepted


def test_a_model_whose_local_solve_overflows_is_never_written(store, tmp_path, monkeypatch):
    """The bound lifted: the non-private fit at confidences near float64's largest reaches the write (its arrays
    finite); a probe user's sum of two such confidences overflows, the probe refuses the model, nothing is left.
    (At 1e300 the lanes' solve, since ials8, gets a one-item user right where the old tile path overflowed.)"""
    import streamdp
    import streamdp.methods.ials as ials
    from streamdp.errors import StreamdpError

    monkeypatch.setattr(ials, "MAX_CONFIDENCE", math.inf)
    out = tmp_path / "m"
    with pytest.raises(StreamdpError, match="local solve is not finite"):
        streamdp.train(store, method="ials", out=str(out), epsilon=math.inf, alpha=1.7e308, max_confidence=1.7e308,
                       iters=2, allow_nonprivate=True)
    assert not out.exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".")]
    last = StoreBudget(store.path).entries()[-1]
    assert last["status"] == "failed" and last["method"] == "ials", last
