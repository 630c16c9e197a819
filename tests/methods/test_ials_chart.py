"""``ials``'s released chart on thin stores: the item counts spread every user's pairs (``--count-weights``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from streamdp.methods import get_method
from streamdp.methods.ials import IALS, spread_weights
from tests.methods.test_als import _fit as _fit_method


def _fit(store, **kw):
    return _fit_method(store, method="ials", **kw)


def test_the_released_counts_spread_every_users_pairs_within_the_uniform_bound(small_store):
    """By default every pair of a user reaches the counts, weight ``min(1, sqrt(tau / n_u))``: a user of at most
    ``tau`` pairs counts each once, a heavier one all of hers at L2 norm ``sqrt(tau)``: the sensitivity (and so the
    noise) of a uniform sample of ``tau`` pairs, which ``--count-weights uniform`` keeps."""
    tau = 16
    m = get_method("ials")(epsilon=1.0, delta=1e-6, rank=3, seed=1, tau=tau)
    s = m.plan(small_store).settings
    assert s.count_weights == "spread"
    b = small_store.read_block(0)
    ip, it, conf, w = m._pairs(b, s, 123)
    n_u = np.diff(ip)
    starts = ip[:-1][n_u > 0]
    norm2 = np.add.reduceat(w * w, starts)
    assert (n_u > tau).any() and (n_u[n_u > 0] <= tau).any()
    np.testing.assert_allclose(norm2, np.minimum(n_u[n_u > 0], tau), rtol=1e-9)
    assert np.all(norm2 <= tau) and np.all(w > 0) and np.all(w <= 1.0)
    light = np.repeat(n_u <= tau, n_u)
    np.testing.assert_allclose(w[light], 1.0, rtol=1e-9)
    _, f = _fit(small_store, epsilon=1.0, iters=1, tau=tau)
    (e,) = [e for e in f.ledger.bounds["releases"] if e["release"].startswith("item counts")]
    assert e["sensitivity"] == pytest.approx(math.sqrt(tau)) and "min(1, sqrt(tau / her pairs))" in e["release"]
    assert f.model_info["parameters"]["count_weights"] == "spread"
    _, g = _fit(small_store, epsilon=1.0, iters=1, tau=tau, count_weights="uniform")
    (u,) = [e for e in g.ledger.bounds["releases"] if e["release"].startswith("item counts")]
    assert u["scale"] == pytest.approx(e["scale"]) and "weight 1" in u["release"]
    assert g.ledger.accounting.epsilon == pytest.approx(f.ledger.accounting.epsilon)


def test_spread_weights_bound():
    ip = np.array([0, 1, 4, 104])
    w = spread_weights(ip, np.arange(104, dtype=np.int32), 9)
    assert w[0] == pytest.approx(1.0) and np.allclose(w[1:4], 1.0)
    assert np.sum(w[4:] ** 2) <= 9.0 and np.sum(w[4:] ** 2) == pytest.approx(9.0)


def _thin_chart_recalls(tmp_path, count_weights: str) -> tuple[list, float]:
    """A thin store (600 users x 10,000 items, ~160 ratings a user: the shape of issue 42, part 4):
    ``([Recall@10 of the chart by the released counts, seeds 1-3], the exact chart's)`` of ials at epsilon 1."""
    from streamdp.serving.evaluate import evaluate_model
    from streamdp.storage.store import open_store
    from tests.conftest import Cli

    path = tmp_path / "thin.zarr"
    if not path.exists():
        res = Cli.run("generate", "--users", 600, "--items", 10000, "--ratings-per-user", 165, "--test-fraction", 0.2,
                      "--seed", 0, "--out", str(path))
        assert res[0] == 0, res
    st = open_store(str(path))
    out, exact = [], None
    for seed in (1, 2, 3):
        _, f = _fit(st, epsilon=1.0, rank=8, iters=1, select="off", seed=seed, count_weights=count_weights)
        d = str(tmp_path / f"m_{count_weights}_{getattr(IALS, 'chart_topk', True)}_{seed}")
        f.save(d)
        r = evaluate_model(d, st, baselines=False, ranking_users="all", workers=1)["ranking"]
        out.append(r["baselines"]["private_popularity"]["recall"])
        exact = r["baselines"]["popularity"]["recall"]
    return out, exact


@pytest.mark.slow
def test_the_released_chart_holds_half_the_exact_chart_on_a_thin_store(tmp_path, monkeypatch):
    """The counts' noise is fixed by the bound; with every pair of a heavy user spread under it (instead of a
    sample of ``tau``), the top of the chart stands above the noise spikes of the thousands of rarely rated items.
    Measured on this store (seeds 1-3, mean; one iteration, as the chart is the counts alone), the counts alone
    (without the private top-K selection of :mod:`streamdp.privacy.topk`, which a thin store now adds in front of
    them: with it both weightings' charts reach 0.075-0.097): uniform 0.042 (0.36x), spread 0.088 (0.74x; 0.076 /
    0.090 / 0.097) of the exact chart's 0.118. Halved (300 x 5,000) the counts' signal halves against the same
    noise: 0.007 against 0.040 of 0.142. Asserted: the default chart (spread, top-K) at least 0.5x the exact
    chart; the counts alone, spread at least 0.5x the exact chart and 1.3x the uniform sample's."""
    default, exact = _thin_chart_recalls(tmp_path, "spread")
    assert np.mean(default) >= 0.5 * exact, (default, exact)
    monkeypatch.setattr(IALS, "chart_topk", False, raising=False)  # the counts alone
    spread, _ = _thin_chart_recalls(tmp_path, "spread")
    uniform, _ = _thin_chart_recalls(tmp_path, "uniform")
    assert np.mean(spread) >= 0.5 * exact, (spread, uniform, exact)
    assert np.mean(spread) >= 1.3 * np.mean(uniform), (spread, uniform, exact)
