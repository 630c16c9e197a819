"""The most-popular chart of a thin store: a private top-K selection instead of a ranking of noisy counts.

A chart released as Gaussian-noised counts pays L2 noise on every item: with thousands of items rarely
rated, the largest of their noise draws swamps the real top counts (``ials`` at epsilon 1 on a 600-user x
10,000-item store listed at 0.34x the exact chart). A chart is a ranking: :class:`TopKRelease` releases only
the identities of its top ``K`` items, in order, by the exponential mechanism applied ``K`` times by peeling,
drawn at once as the one-shot Gumbel top-K (Durfee & Rogers 2019, "Practical differentially private top-k
selection with pay-what-you-get composition"): each item's number of users plus Gumbel noise of scale
``1 / epsilon_each``, the ``K`` largest in order. The counts take each distinct pair of a user with weight 1
(a store holds each pair once), so one added user raises every count by 0 or 1 (L-infinity sensitivity 1)
and never lowers one: the scores are monotone, where the exponential mechanism with ``exp(epsilon u / Delta)``
is ``epsilon``-DP (McSherry & Talwar 2007), so each selection is a :class:`~streamdp.privacy.events.PureDpEvent`
of ``epsilon_each`` and the ``K`` of them are composed by the accountant with the run's other releases
(:class:`TopKShare`: ``epsilon_each = sqrt(share / K) / z``, the share in the Gaussian releases' ``1 / z^2``
terms, ``z`` the run's scalar that :func:`~streamdp.privacy.release.calibrate_releases` searches). The
candidates are the run's items (declared, or the private catalogue): public, the same for both neighbours.

When: from public numbers only (:func:`topk_chart`): the expected largest Gaussian noise of the counts over
the ``n_items`` (``sigma sqrt(2 ln n_items)``, ``sigma`` that of a count share alone at the target) against
the released number of users, the most any count can be. Above :data:`THIN_RATIO` the Gaussian chart is
mostly noise and the selection is made with :data:`SHARE` of the budget; below it the Gaussian chart stays
(plentiful stores: unchanged). The list beyond the ``K`` selected items follows the noisy counts
(:func:`chart_scores`). Measured: ``docs/ranking.md``, "A private top-K chart on thin stores".

Public names: :class:`TopKRelease`, :class:`TopKShare`, :func:`topk_chart`, :func:`chart_noise_ratio`,
:func:`noise_ratio` (``als``' own rule reads it too), :func:`chart_scores`, :data:`K`, :data:`SHARE`,
:data:`THIN_RATIO`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from streamdp.errors import ParameterError
from streamdp.privacy.calibration import calibrate_gaussian
from streamdp.privacy.events import pure_dp_event

__all__ = ["K", "SHARE", "THIN_RATIO", "TopKRelease", "TopKShare", "topk_chart", "chart_noise_ratio", "noise_ratio",
           "chart_scores"]

#: Items selected: a user's list of 10 takes the selected items she has not rated, then the noisy counts' order.
K = 10
#: Budget share of the selection (in the Gaussian releases' ``1 / z^2`` terms) when it is made.
SHARE = 0.4
#: The selection is made when the counts' expected largest noise over the items is at least this share of the users.
THIN_RATIO = 0.15
MECHANISM = "exponential (one-shot Gumbel top-K, monotone)"


@dataclass(frozen=True)
class TopKRelease:
    """``k`` items chosen by peeling with the exponential mechanism, pure ``epsilon_each``-DP each."""

    what: str
    k: int
    epsilon_each: float
    n_candidates: int = 0
    mechanism: str = "gumbel-topk"
    count_source: str = "each item's users (distinct pairs, weight 1: L-infinity sensitivity 1, monotone)"

    def __post_init__(self):
        if isinstance(self.k, bool) or int(self.k) != self.k or self.k < 1:
            raise ParameterError(f"{self.what}: k must be a positive integer, got {self.k!r}")
        if not (self.epsilon_each >= 0):
            raise ParameterError(f"{self.what}: epsilon_each must be >= 0, got {self.epsilon_each!r}")

    @property
    def private(self) -> bool:
        return self.epsilon_each > 0 and math.isfinite(self.epsilon_each)

    @property
    def count(self) -> int:
        return int(self.k)

    @property
    def scale(self) -> float:
        """The Gumbel noise scale on the counts (sensitivity 1): ``1 / epsilon_each``; 0 without privacy."""
        return 1.0 / self.epsilon_each if self.private else 0.0

    @property
    def noise_multiplier(self) -> float:
        return self.scale

    @property
    def std(self) -> float:
        """Standard deviation of one item's Gumbel noise (``pi / sqrt(6)`` times the scale)."""
        return math.pi / math.sqrt(6.0) * self.scale

    def event(self):
        """``k`` pure-DP selections (a non-private release: ``epsilon_each`` 0 means no noise, reported as such)."""
        if not self.private:
            from streamdp.privacy.events import gaussian_event

            return gaussian_event(0.0, self.count)
        return pure_dp_event(self.epsilon_each, self.count, mechanism=MECHANISM)

    def entry(self) -> dict:
        """The ledger's description."""
        return {"release": self.what, "mechanism": MECHANISM if self.private else "none (non-private)",
                "sensitivity_norm": "linf", "sensitivity": 1.0, "scale": self.scale, "count": self.count,
                "pure_epsilon_each": self.epsilon_each if self.private else math.inf,
                "candidates": int(self.n_candidates), "scores": self.count_source}

    def select(self, counts, rng: np.random.Generator) -> np.ndarray:
        """The indices of the ``k`` chosen items, best first: the largest ``counts + Gumbel(scale)`` (ties by
        index). Non-private: the exact top ``k``."""
        c = np.asarray(counts, np.float64)
        k = min(self.count, len(c))
        score = c + rng.gumbel(0.0, self.scale, len(c)) if self.private else c
        return np.lexsort((np.arange(len(c)), -score))[:k].astype(np.int64)


@dataclass(frozen=True)
class TopKShare:
    """The selection before calibration: ``k`` items, its ``share`` of the budget (module docstring)."""

    what: str
    k: int
    share: float
    n_candidates: int = 0

    def at(self, z: float) -> TopKRelease:
        if not self.share > 0:
            raise ParameterError(f"{self.what}: budget share must be > 0, got {self.share}")
        return TopKRelease(self.what, int(self.k), math.sqrt(self.share / self.k) / float(z), int(self.n_candidates))


@functools.lru_cache(maxsize=64)
def _z(epsilon: float, delta: float) -> float:
    return calibrate_gaussian(epsilon, delta)


def chart_noise_ratio(n_users: float, n_items: int, sensitivity: float, epsilon: float, delta: float,
                      count_share: float) -> float:
    """The expected largest noise of Gaussian counts over ``n_items`` items over the number of users: the counts
    of L2 ``sensitivity`` with ``count_share`` of the budget at ``(epsilon, delta)`` alone, ``sigma sqrt(2 ln n)``.
    Public numbers only.

    >>> r = chart_noise_ratio(600, 10_000, math.sqrt(32), 1.0, 1e-6, 0.3)
    >>> 0.25 < r < 0.35
    True
    """
    if not math.isfinite(epsilon) or n_items < 2:
        return 0.0
    return noise_ratio(_z(float(epsilon), float(delta)) / math.sqrt(count_share) * float(sensitivity), n_items,
                       n_users)


def noise_ratio(sigma: float, n_items: int, n_users: float) -> float:
    """The expected largest of ``n_items`` Gaussian noises of std ``sigma`` (``sigma sqrt(2 ln n_items)``) over
    ``n_users``, the most any item's count can be (0 for fewer than 2 items). Public numbers only.

    >>> round(noise_ratio(100.0, 1000, 371.7), 3)
    1.0
    """
    if n_items < 2:
        return 0.0
    return float(sigma) * math.sqrt(2.0 * math.log(n_items)) / max(float(n_users), 1.0)


def topk_chart(n_users: float, n_items: int, sensitivity: float, epsilon: float, delta: float,
               count_share: float) -> bool:
    """Whether a private run's chart is the top-K selection: :func:`chart_noise_ratio` at least :data:`THIN_RATIO`.

    >>> topk_chart(600, 10_000, math.sqrt(32), 1.0, 1e-6, 0.3), topk_chart(6_040, 3_706, math.sqrt(32), 1.0, 1e-6, 0.3)
    (True, False)
    """
    return n_items > K and chart_noise_ratio(n_users, n_items, sensitivity, epsilon, delta, count_share) >= THIN_RATIO


def chart_scores(counts, chosen) -> np.ndarray:
    """The chart's scores: the ``chosen`` items first, in their order, then the rest by ``max(counts, 0)``
    (post-processing of both releases). The chosen ones take ``top + (k - r) top / k`` (``r`` = 0, 1, ...; ``top``
    the largest count, at least 1), so they rank above every other item and in their order.

    >>> chart_scores(np.array([5.0, 9.0, -1.0, 2.0]), np.array([3, 0])).tolist()
    [13.5, 9.0, 0.0, 18.0]
    """
    s = np.maximum(np.asarray(counts, np.float64), 0.0)
    chosen = np.asarray(chosen, np.int64)
    k = len(chosen)
    if not k:
        return s
    top = max(float(s.max()), 1.0)
    s[chosen] = top + (k - np.arange(k)) * (top / k)
    return s
