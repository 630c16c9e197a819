"""Samplers (moments, tails, Huber histogram vs density), random streams, the Huber epsilon."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from streamdp.errors import ParameterError
from streamdp.privacy import gaussian_noise, huber_epsilon, huber_noise, laplace_noise, make_rng, spawn_rngs
from streamdp.privacy.mechanisms import huber_log_density, huber_loss

N = 400_000  # samples per statistical check; tolerances below are > 5 standard errors


def test_make_rng_seeded_reproducible_and_unseeded_differs():
    assert np.array_equal(make_rng(11).random(8), make_rng(11).random(8))
    assert not np.array_equal(make_rng(None).random(8), make_rng(None).random(8))
    with pytest.raises(ParameterError, match="seed"):
        make_rng(-1)


def test_spawn_rngs_independent_of_order_and_keyed():
    a = [g.random(4) for g in spawn_rngs(3, 5)]
    b = [g.random(4) for g in reversed(spawn_rngs(3, 5))][::-1]
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    # stream b only depends on (seed, key, b), not on how many streams were asked for
    assert np.array_equal(spawn_rngs(3, 2)[1].random(4), a[1])
    other = [g.random(4) for g in spawn_rngs(3, 5, key=1)]
    assert not any(np.array_equal(x, y) for x, y in zip(a, other))
    # streams are uncorrelated
    x = np.stack([g.standard_normal(20_000) for g in spawn_rngs(0, 4)])
    c = np.corrcoef(x)
    assert np.abs(c[np.triu_indices(4, 1)]).max() < 0.03


def test_gaussian_moments_and_tail():
    sigma = 2.5
    x = gaussian_noise(make_rng(1), N, sigma)
    assert x.dtype == np.float64
    assert abs(x.mean()) < 5 * sigma / math.sqrt(N)
    assert abs(x.var() / sigma**2 - 1) < 5 * math.sqrt(2 / N)
    p = np.mean(np.abs(x) > 3 * sigma)
    p0 = 2 * stats.norm.sf(3)
    assert abs(p - p0) < 5 * math.sqrt(p0 / N)
    assert not gaussian_noise(make_rng(1), (3, 4), 0.0).any()


def test_laplace_moments_and_tail():
    b = 0.7
    x = laplace_noise(make_rng(2), N, b)
    assert abs(x.mean()) < 5 * math.sqrt(2) * b / math.sqrt(N)
    assert abs(x.var() / (2 * b * b) - 1) < 0.02
    for t in (1.0, 3.0):
        p, p0 = np.mean(np.abs(x) > t * b * 3), math.exp(-3 * t)
        assert abs(p - p0) < 5 * math.sqrt(p0 / N) + 1e-4


def _huber_pdf(b, c):
    return lambda t: math.exp(float(huber_log_density(t, b, c)))


@pytest.mark.parametrize("b,c", [(1.0, 0.5), (1.0, 3.0), (0.5, 0.0), (2.0, 10.0), (0.3, 0.01)])
def test_huber_density_normalized_and_moments(b, c):
    pdf = _huber_pdf(b, c)
    pts = [-c, 0.0, c] if c > 0 else [0.0]
    tot = sum(integrate.quad(pdf, lo, hi, points=None)[0] for lo, hi in
              zip([-np.inf] + pts, pts + [np.inf]))
    assert tot == pytest.approx(1.0, abs=1e-8)
    var = 2 * sum(integrate.quad(lambda t: t * t * pdf(t), lo, hi)[0] for lo, hi in ((0, c), (c, np.inf)) if hi > lo)
    x = huber_noise(make_rng(3), N, b, c)
    assert abs(x.mean()) < 5 * math.sqrt(var / N)
    assert abs(x.var() / var - 1) < 0.03
    # tail: P(|x| > c + t) = 2 b exp(-c/(2b)) exp(-t/b) / Z, Z = 1 / pdf(0)
    t = 2 * b
    p0 = 2 * b * math.exp(-c / (2 * b)) * math.exp(-t / b) * pdf(0.0)
    assert abs(np.mean(np.abs(x) > c + t) - p0) < 5 * math.sqrt(p0 / N)


@pytest.mark.parametrize("b,c", [(1.0, 1.0), (1.0, 4.0), (0.5, 0.2)])
def test_huber_histogram_matches_density(b, c):
    """Chi-square goodness of fit of 400k samples against the exact bin probabilities."""
    pdf = _huber_pdf(b, c)
    x = huber_noise(make_rng(4), N, b, c)
    edges = np.unique(np.concatenate([np.linspace(-c - 4 * b, c + 4 * b, 41), [-c, c]]))
    probs = np.array([integrate.quad(pdf, lo, hi)[0] for lo, hi in zip(edges[:-1], edges[1:])])
    lo_tail = integrate.quad(pdf, -np.inf, edges[0])[0]
    probs = np.concatenate([[lo_tail], probs, [lo_tail]])
    counts = np.histogram(x, np.concatenate([[-np.inf], edges, [np.inf]]))[0]
    assert probs.sum() == pytest.approx(1.0, abs=1e-8)
    chi2, p = stats.chisquare(counts, probs * N)
    assert p > 1e-3, (chi2, p)


def test_huber_c0_is_laplace():
    x = huber_noise(make_rng(5), N, 1.3, 0.0)
    assert stats.kstest(x, stats.laplace(scale=1.3).cdf).pvalue > 1e-3


def test_huber_epsilon_is_exact_on_a_grid():
    """max over a grid of the log density ratio equals Δ/b (bound attained), never more."""
    b, delta1 = 0.8, 1.5
    xs = np.linspace(-30, 30, 6001)
    for c in (0.0, 0.5, 2.0, 10.0):
        eps = huber_epsilon(b, delta1)
        # scalar shifts of size up to Δ
        for v in np.linspace(-delta1, delta1, 13):
            ratio = (huber_loss(xs - v, c) - huber_loss(xs, c)) / b
            assert ratio.max() <= abs(v) / b + 1e-12
        ratio = (huber_loss(xs - delta1, c) - huber_loss(xs, c)) / b
        assert ratio.max() == pytest.approx(eps, abs=1e-9)
        # 2-d: all shift vectors with ||v||_1 = Δ, on a 2-d grid of outputs
        g = np.linspace(-20, 20, 401)
        X, Y = np.meshgrid(g, g)
        best = -np.inf
        for a in np.linspace(0, 1, 11):
            v = (a * delta1, -(1 - a) * delta1)
            r = (huber_loss(X - v[0], c) + huber_loss(Y - v[1], c) - huber_loss(X, c) - huber_loss(Y, c)) / b
            assert r.max() <= eps + 1e-12
            best = max(best, r.max())
        assert best == pytest.approx(eps, abs=1e-9)


def test_huber_noise_reproducible_and_shaped():
    a = huber_noise(make_rng(9), (3, 5), 1.0, 1.0)
    assert a.shape == (3, 5) and a.dtype == np.float64
    assert np.array_equal(a, huber_noise(make_rng(9), (3, 5), 1.0, 1.0))
    assert not huber_noise(make_rng(9), 4, 0.0, 1.0).any()


@pytest.mark.parametrize("call", [
    lambda: gaussian_noise(make_rng(0), 3, -1.0),
    lambda: laplace_noise(make_rng(0), 3, float("nan")),
    lambda: huber_noise(make_rng(0), 3, 1.0, -0.5),
    lambda: huber_epsilon(1.0, -1.0),
    lambda: huber_epsilon(0.0, 1.0),
])
def test_invalid_noise_parameters(call):
    with pytest.raises(ParameterError):
        call()


def test_huber_variance_grows_with_c_at_equal_epsilon():
    """Documented trade-off: same b (same epsilon), more variance as c grows; c = 0 is Laplace's 2 b^2."""
    v = [np.var(huber_noise(make_rng(6), N, 1.0, c)) for c in (0.0, 1.0, 5.0)]
    assert abs(v[0] / 2.0 - 1) < 0.03 and abs(v[1] / 2.2445 - 1) < 0.03 and abs(v[2] / 5.2042 - 1) < 0.03
