"""``ials --average``: the released rows solved from the iterations' sums averaged toward the last
(:meth:`streamdp.methods.ials.IALS._averaged`, post-processing of released sums)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from streamdp.methods import get_method
from streamdp.methods.ials import PRIVATE_ITERS
from tests.methods.test_als import _fit


def _averager(iters=4, keep=None):
    m = get_method("ials")(epsilon=2.0, delta=1e-6, rank=3, seed=1)
    m._avg, m._keep, m._average_lambda = None, keep, None
    return m, SimpleNamespace(iters=iters)


def _run(m, s, Bs, sds, G=None):
    """Feed iterations 1..T's ``(B, sd)`` (``Bs[0]`` is iteration 1's): the last call's ``(B, G, sd)``."""
    G = np.eye(2) if G is None else G
    out = None
    for t, (B, sd) in enumerate(zip(Bs, sds), start=1):
        out = m._averaged(s, t, B.copy(), G.copy() * t, sd)
        if t < s.iters:
            np.testing.assert_array_equal(out[0], B)  # before the last, each iteration solves from its own sums
            assert out[2] == sd
    return out


def test_noise_around_one_mean_is_averaged_by_precision():
    """Iterations 2..4 estimate the same sums (noise only, scales 2, 2, 1): ``lambda`` near 1, the rows from the
    precision-weighted mean (iteration 1, from the random start, left out), its noise ``1 / sqrt(sum p_t)``."""
    rng = np.random.default_rng(0)
    n, k = 4000, 8
    M = rng.normal(0.0, 5.0, (n, k))
    sds = [3.0, 2.0, 2.0, 1.0]
    Bs = [M + rng.normal(0.0, sd, (n, k)) for sd in sds]
    Bs[0] = rng.normal(0.0, 50.0, (n, k))  # iteration 1: anything
    m, s = _averager()
    B, G, sd = _run(m, s, Bs, sds)
    lam = m._average_lambda
    assert 0.95 <= lam <= 1.0
    p = np.array([1 / 4, 1 / 4, 1.0])
    mean = (p[0] * Bs[1] + p[1] * Bs[2] + p[2] * Bs[3]) / p.sum()
    np.testing.assert_allclose(B, Bs[3] + lam * (mean - Bs[3]), rtol=1e-12, atol=1e-12)
    assert sd == pytest.approx(1.0 / math.sqrt(p.sum()), rel=0.02)
    assert np.mean((B - M) ** 2) == pytest.approx(sd * sd, rel=0.05)  # the stated noise is the error's
    # the Gramians take the same weights (G_t = t I here)
    w = p / p.sum()
    np.testing.assert_allclose(G, np.eye(2) * (4 + lam * (w @ [2, 3, 4] - 4)), rtol=1e-12)


def test_sums_that_drift_between_iterations_keep_the_last():
    """Each iteration's sums far from the others' (drift 100 times the noise): ``lambda`` near 0, the last
    iteration's sums and noise; with no item above the floor nothing is averaged."""
    rng = np.random.default_rng(1)
    n, k = 2000, 8
    sds = [1.0, 1.0, 1.0, 1.0]
    Bs = [rng.normal(0.0, 10.0, (n, k)) for _ in sds]
    m, s = _averager()
    B, _, sd = _run(m, s, Bs, sds)
    assert m._average_lambda < 0.02
    assert np.max(np.abs(B - Bs[3])) < 0.02 * 10 * 6 and sd == pytest.approx(1.0, rel=0.02)
    m, s = _averager(keep=np.zeros(n, bool))
    B, _, sd = _run(m, s, Bs, sds)
    assert m._average_lambda == 0.0 and sd == 1.0
    np.testing.assert_array_equal(B, Bs[3])


def test_the_average_is_post_processing_on_by_default_in_private_runs(small_store, tmp_path):
    """A private run of 3+ iterations averages (the same releases and ledger as ``--average off``, other rows, the
    lambda in the model's notes); 2 iterations, ``--gramian item`` and non-private runs do not; a resumed run
    keeps the running sums (the checkpoint holds them) and gives the same model bit for bit."""
    opts = dict(epsilon=2.0, seed=3, select="off")
    m, on = _fit(small_store, method="ials", **opts)
    _, off = _fit(small_store, method="ials", average="off", **opts)
    assert m.plan(small_store).settings.average and on.model_info["parameters"]["iters"] == PRIVATE_ITERS == 5
    assert on.ledger.to_dict()["events"] == off.ledger.to_dict()["events"]
    assert on.ledger.to_dict()["bounds"] == off.ledger.to_dict()["bounds"]
    assert not np.array_equal(on.item_factors, off.item_factors)
    note = [x for x in on.ledger.notes if x.startswith("--average auto")]
    assert len(note) == 1 and "iterations 2-5" in note[0], on.ledger.notes
    assert not [x for x in off.ledger.notes if x.startswith("--average")]
    assert not get_method("ials")(epsilon=2.0, delta=1e-6, rank=3, iters=2).plan(small_store).settings.average
    assert not get_method("ials")(epsilon=2.0, delta=1e-6, rank=3, gramian="item").plan(small_store).settings.average
    non = get_method("ials")(epsilon=math.inf, delta=1e-6, rank=3).plan(small_store).settings
    assert not non.average and "average" not in non.as_dict()


def test_a_resumed_run_keeps_the_running_sums(small_store, tmp_path, interrupted_after_checkpoint):
    opts = dict(method="ials", epsilon=1.0, seed=7, select="off")
    _, full = _fit(small_store, checkpoint=str(tmp_path / "full"), **opts)
    with interrupted_after_checkpoint(3):
        _fit(small_store, checkpoint=str(tmp_path / "ck"), **opts)
    with np.load(tmp_path / "ck" / "checkpoint.npz") as z:
        assert {"avg_S", "avg_G", "avg_P"} <= set(z.files) and int(z["epoch"]) == 3
    _, res = _fit(small_store, checkpoint=str(tmp_path / "ck"), **opts)
    assert res.model_info["resumed_from_iteration"] == 3
    np.testing.assert_array_equal(res.item_factors, full.item_factors)
