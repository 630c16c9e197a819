"""The private centring shared by ``oja``, ``fw`` and ``svd``: a private global mean and item biases, released first.

One statistics pass gives per item the sum of centred, clipped ratings and a weight
total, and the sum and number of user means (:func:`private_center`); two Gaussian
releases (:func:`center_shares`) make them private, and the biases are their
posterior mean (:func:`streamdp.methods._biases.item_biases`). ``--center midpoint``
centres on the public midpoint of the rating range instead and releases nothing.
The budget shares of the two releases come from public parameters only
(:func:`default_shares`). The sensitivity argument is in :mod:`streamdp.methods.oja`'s
docstring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from streamdp.methods._biases import item_biases
from streamdp.methods.base import RunSettings
from streamdp.methods.options import MethodOptions, option
from streamdp.privacy.bounding import clip_rows
from streamdp.privacy.release import Share
from streamdp.stream.engine import add_into as _add

#: Share of the Gaussian budget (in sum of 1/z^2) given to the private item biases.
STATS_SHARE = 0.1


#: Share given to the private global mean (one scalar pair: its noise is not spread over items).
MEAN_SHARE = 0.05


def default_shares(n_users: int, n_items: int, rank: int, epsilon: float) -> tuple[float, float]:
    """Budget shares ``(item biases, global mean)`` from public parameters only.

    When the public signal-to-noise proxy ``n_users epsilon / (rank sqrt(n_items))``
    is large the subspace is worth most of the budget (``STATS_SHARE``,
    ``MEAN_SHARE`` = 0.1, 0.05 at proxy >= 316); when it is small the private
    subspace is mostly noise and the biases carry the predictions, so they get up to
    0.85 and 0.1 (proxy <= 10), interpolated in ``log10(proxy)``. Measured on
    ML-100K (943 users, rank 8, delta 1e-6, two seeds): test RMSE at epsilon 1 went
    from 1.124 (0.1/0.05) to 1.104 (0.85/0.1), at epsilon 10 from 1.078 to 1.047.

    >>> default_shares(943, 1682, 8, 1.0)
    (0.85, 0.1)
    >>> default_shares(100_000, 1_000, 8, 1.0)
    (0.1, 0.05)
    """
    if not math.isfinite(epsilon):
        return STATS_SHARE, MEAN_SHARE
    proxy = n_users * epsilon / (rank * math.sqrt(n_items))
    t = min(max(math.log10(max(proxy, 1e-9) / 10.0) / 1.5, 0.0), 1.0)
    return round(0.85 - (0.85 - STATS_SHARE) * t, 4), round(0.1 - (0.1 - MEAN_SHARE) * t, 4)


def center_shares(stats_share: float, mean_share: float, rating_min: float, rating_max: float,
                  n_items: int) -> list:
    """The two releases of the private centring: item sums and weights, and the mean of user means.

    One user changes each by at most ``sqrt(1 + h^2)`` in L2 (``h`` half the rating
    range: a weight ``<= 1`` and a clipped, centred rating ``<= h`` per item with the
    rows clipped to norm 1; one user mean and one count). Shared by ``oja``, ``fw``
    and ``svd`` (:func:`private_center` adds exactly these).
    """
    d = math.sqrt(1.0 + ((rating_max - rating_min) / 2.0) ** 2)
    return [Share("item sums S_j and weights C_j (item biases, global mean)", "gaussian", d, stats_share,
                  shape=(2, n_items)),
            Share("sum over users of (user mean - midpoint) and number of users (global mean)", "gaussian", d,
                  mean_share, shape=(2,))]


def private_center(store, engine, *, center: str, rating_min: float, rating_max: float, stats=None, mean=None,
                   rng=None):
    """``(mu, b, C, sigma)``: the private (exact without releases) global mean and item biases, or the midpoint.

    One statistics pass: per item the sum ``S_j`` of centred, clipped ratings and the
    weight ``C_j`` (each user's weights ``min(1, 1/sqrt(n_i))``, rows clipped to norm 1),
    and the sum and number of user means; ``stats`` and ``mean`` (the releases of
    :func:`center_shares`, ``None`` for a non-private run) add their noise. Then the
    posterior-mean shrinkage of the biases under a public prior ``b_j ~ N(0, (h/4)^2)``
    (:func:`streamdp.methods._biases.item_biases` with prior and spread ``h/4``, the counts
    taken as exact; post-processing). ``center="midpoint"`` is ``(mid, 0, None, 0)`` and reads nothing.
    """
    n = store.n_items
    lo, hi = rating_min, rating_max
    mid, half = (lo + hi) / 2.0, (hi - lo) / 2.0
    if center == "midpoint":
        return mid, np.zeros(n), None, 0.0

    def fn(block, b):
        w = clip_rows(block.indptr, np.ones(block.nnz, np.float64), 1.0)
        r = np.clip(block.ratings.astype(np.float64), lo, hi) - mid
        counts = np.diff(block.indptr)
        user = np.repeat(np.arange(block.n_users), counts)
        means = np.bincount(user, weights=r, minlength=block.n_users)[counts > 0] / counts[counts > 0]
        out = np.zeros((2, n + 1))
        out[0, :n] = np.bincount(block.items, weights=r * w, minlength=n)
        out[1, :n] = np.bincount(block.items, weights=w, minlength=n)
        out[:, n] = means.sum(), len(means)
        return out

    SC = engine.map_reduce(fn, _add, np.zeros((2, n + 1)), extra_per_block=16 * n, desc="centring statistics")
    sigma = 0.0
    if stats is not None:
        sigma = stats.scale
        SC[:, :n] = stats.add(SC[:, :n], rng)
        SC[:, n] = mean.add(SC[:, n], rng)
    S, C = SC[:, :n]
    T, U = SC[:, n]
    mu = min(max(mid + float(T) / max(float(U), 1.0), lo), hi)
    # items whose noisy weight C_j is small next to the noise sigma get a bias near 0
    bias = item_biases(S - (mu - mid) * C, C, sigma, half, prior_scale=half / 4.0, spread=half / 4.0)
    return mu, bias, C, sigma


@dataclass(frozen=True)
class CenterOptions(MethodOptions):
    """The option of a method that centres privately (``oja``, ``fw``, ``svd``): ``--center``."""

    center: Literal["private", "midpoint"] = option(
        "private: centre on a private global mean and item biases, released first (McSherry-Mironov's cleansing); "
        "midpoint: the public midpoint of the rating range, no release", default="private")


@dataclass(frozen=True)
class CenterSettings(RunSettings):
    """The resolved centring of a run: the declared rating range, ``--center`` and the two budget shares."""

    rating_min: float
    rating_max: float
    #: The public midpoint of the rating range.
    mid: float
    center: str
    #: Share of the Gaussian budget (in sum of 1/z^2) of the item biases' release; 0 with the midpoint.
    stats_share: float
    #: Share of the global mean's release; 0 with the midpoint.
    mean_share: float


def center_settings(opts: CenterOptions, store, epsilon: float, rank: int = 1, *, n_users: int | None = None) -> dict:
    """The :class:`CenterSettings` fields of a run on ``store`` (keywords for a method's settings class).

    ``--center private`` (default) spends the shares of :func:`default_shares`
    (public parameters only: ``n_users``, the run's released or declared count
    (:mod:`streamdp.privacy.users`), ``n_items``, epsilon and ``rank``; ``fw`` and
    ``svd`` take rank 1, each of their releases being one direction) on a private
    global mean and item biases, released before anything else; ``midpoint`` centres on
    the public midpoint (no release, the paper's unnormalised ``[-1, 1]`` data).

    >>> from types import SimpleNamespace as NS
    >>> opts = CenterOptions.build({})
    >>> [center_settings(opts, NS(n_items=400, rating_min=1, rating_max=5), 1.0, n_users=m)["stats_share"]
    ...  for m in (500_000, 943)]
    [0.1, 0.5133]
    >>> center_settings(CenterOptions.build({"center": "midpoint"}), NS(rating_min=1, rating_max=5), 1.0)
    {'rating_min': 1.0, 'rating_max': 5.0, 'mid': 3.0, 'center': 'midpoint', 'stats_share': 0.0, 'mean_share': 0.0}
    """
    lo, hi = float(store.rating_min), float(store.rating_max)
    f, g = default_shares(n_users, store.n_items, rank, epsilon) if opts.center == "private" else (0.0, 0.0)
    return dict(rating_min=lo, rating_max=hi, mid=(lo + hi) / 2.0, center=opts.center, stats_share=f, mean_share=g)


def settings_shares(s: CenterSettings, n_items: int) -> list:
    """The private centring's releases (:func:`center_shares`) of settings ``s``; none for the midpoint."""
    if s.center != "private":
        return []
    return center_shares(s.stats_share, s.mean_share, s.rating_min, s.rating_max, n_items)


def centering_text(s: CenterSettings) -> str:
    """The ledger's ``centering`` bound."""
    if s.center == "private":
        return ("private global mean and item biases (item sums/weights with w_i = min(1, 1/sqrt(n_i)), mean of "
                "user means; released first, as --method oja)")
    return f"public midpoint {s.mid:g} of the declared rating range"


def center_releases(method, plan) -> tuple:
    """``(stats, mean)``: the centring's two calibrated releases of ``plan`` (the two after the first), or
    ``(None, None)`` for a non-private run or the midpoint."""
    if method.private and plan.settings.center == "private":
        return tuple(plan.releases[1:3])
    return None, None


def settings_center(method, store, engine, plan, rng) -> tuple[float, np.ndarray]:
    """``(mu, b)``: the private (non-private: exact) global mean and item biases, or ``(mid, 0)`` (``fw``, ``svd``).

    :func:`private_center` with this run's centring releases (:func:`center_releases`).
    The biases are rounded to float32, as the model stores them, so that the training and the
    users' devices centre alike.
    """
    s = plan.settings
    stats, mean = center_releases(method, plan)
    mu, bias, _, _ = private_center(store, engine, center=s.center, rating_min=s.rating_min,
                                    rating_max=s.rating_max, stats=stats, mean=mean, rng=rng)
    return float(mu), np.asarray(bias, np.float32).astype(np.float64)
