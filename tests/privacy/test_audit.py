"""An empirical audit of the releases against the ledger: two stores one canary user apart (issue 28, finding 0).

``means`` at epsilon 4 is trained many times on each store (other seeds each run). Two
released statistics are fitted against what the ledger says they are:

* the number of users (``model.json: n_users``), Laplace: its spread around the true
  count must be the ledger's scale ``b`` (mean absolute deviation, ``E|x| = b``), and a
  pair of runs with the same seed must move by exactly the sensitivity, 1;
* the item weight totals (``factors.zarr/noisy_item_weight``), Gaussian: the spread of
  every item over the runs must be the ledger's ``sigma``, and the canary's shift (a
  pair with the same seed: the noise cancels) must have L2 norm within the ledger's
  sensitivity.

A release whose noise were scaled to another sensitivity or epsilon than the ledger
states, or a statistic that moved by more than its stated sensitivity, fails here.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import zarr

from streamdp.workflows.training import train

RUNS = 80  # per store; about a minute on 2 cores
EPSILON = 4.0


def _run(store, out, seed):
    train(store, method="means", epsilon=EPSILON, out=out, seed=seed, workers=1, evaluate_test=False,
          over_budget=True, memory_limit="4GB")
    with open(os.path.join(out, "model.json")) as f:
        info = json.load(f)
    with open(os.path.join(out, "privacy.json")) as f:
        led = json.load(f)
    w = np.asarray(zarr.open_group(os.path.join(out, "factors.zarr"), mode="r")["noisy_item_weight"][:])
    return info["n_users"], w, led


def _release(led, prefix):
    return next(r for r in led["bounds"]["releases"] if r["release"].startswith(prefix))


@pytest.mark.slow
def test_the_canary_moves_the_releases_by_their_sensitivity_under_their_noise(tmp_path):
    from streamdp.storage.generate import generate_store

    n = 300
    a = generate_store(str(tmp_path / "a.zarr"), n_users=n, n_items=40, ratings_per_user=15, rank=3, seed=1,
                       block_users=n)
    b = generate_store(str(tmp_path / "b.zarr"), n_users=n + 1, n_items=40, ratings_per_user=15, rank=3, seed=1,
                       block_users=n)  # the same users, and one more: the canary
    assert b.block_user_counts(1)[0] > 0
    counts = {0: [], 1: []}
    weights = {0: [], 1: []}
    for side, st in enumerate((a, b)):
        for r in range(RUNS):
            c, w, led = _run(st, str(tmp_path / f"m{side}-{r}"), seed=1000 * side + r)
            counts[side].append(c - (n + side))
            weights[side].append(w)
    count_rel, weight_rel = _release(led, "number of users"), _release(led, "item weight totals")
    assert count_rel["mechanism"] == "laplace" and count_rel["sensitivity"] == 1.0
    assert np.isclose(count_rel["scale"], 1.0 / (0.01 * EPSILON))

    # the count: Laplace of the ledger's scale around the true count on either side (E|x| = b, se b / sqrt(2 RUNS))
    dev = np.abs(np.r_[counts[0], counts[1]])
    assert abs(dev.mean() / count_rel["scale"] - 1.0) < 0.25, dev.mean()
    # the item weight totals: Gaussian of the ledger's sigma (40 items x RUNS runs a side: se about 1%)
    resid = np.concatenate([np.asarray(weights[s]) - np.mean(weights[s], axis=0) for s in (0, 1)])
    sd = np.sqrt((resid ** 2).sum() / (resid.size - 2 * resid.shape[1]))
    assert abs(sd / weight_rel["scale"] - 1.0) < 0.05, (sd, weight_rel["scale"])

    # the canary's shift with the noise cancelled (the same seed on both stores): within the ledger's sensitivity
    c0, w0, _ = _run(a, str(tmp_path / "pair0"), seed=5)
    c1, w1, _ = _run(b, str(tmp_path / "pair1"), seed=5)
    assert c1 - c0 == count_rel["sensitivity"]
    shift = np.linalg.norm(w1 - w0)
    assert 0 < shift <= weight_rel["sensitivity"] * (1 + 1e-9), (shift, weight_rel["sensitivity"])
    # and the shift the unpaired runs see is that one, within their noise (a Gaussian fit of the mean difference)
    diff = np.mean(weights[1], axis=0) - np.mean(weights[0], axis=0)
    z = (diff - (w1 - w0)) / (weight_rel["scale"] * np.sqrt(2.0 / RUNS))
    assert abs(z.mean()) < 4 / np.sqrt(z.size) and abs(z.std() - 1.0) < 0.3, (z.mean(), z.std())
