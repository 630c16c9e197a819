"""``generate --timestamps DAYS``: a time order for a generated store (issue 43: the replay of weekly refreshes).

Each rating gets a time (seconds since the epoch, from :data:`START`) over ``DAYS`` days:

* **users arrive** over time: user ``u`` (of ``n``) arrives at ``DAYS * u / n`` days (users are numbered in order
  of arrival) and rates after it, more often soon after (a time ``a + (DAYS - a) U^2``, ``U`` uniform);
* **items appear**: a share :data:`NEW_ITEM_SHARE` of the items (drawn at random, whatever their popularity)
  appears at a uniform time of the span, and a rating of one is moved after it;
* **tastes drift** slowly (``taste_drift``, 0: none): each item's appeal moves linearly over the span, by
  ``taste_drift * (t / span - 1/2) * d_i`` rating points (``d_i`` standard normal), rounded to the scale's step
  and clipped to it, so a model trained on an old period predicts the recent one worse.

All of it is drawn from the store's seed with purposes of its own: a store generated without ``--timestamps`` is the
one earlier versions wrote, bit for bit, and the same ratings with times only differ where a rating drifts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from streamdp.errors import ParameterError
from streamdp.storage.split import block_seed

#: The time the generated log starts at (2024-01-01T00:00:00Z): a public constant.
START = 1704067200
#: The share of the items that appear during the span rather than at its start.
NEW_ITEM_SHARE = 0.2
_PURPOSE_TIMES, _PURPOSE_ITEM_TIMES = 7, 8
DAY = 86400


@dataclass(frozen=True)
class TimeTruth:
    """The time model of a generated store: its span, each item's appearance time and drift direction."""

    span: float  # seconds
    appears: np.ndarray  # (n_items,) seconds after START
    drift: np.ndarray  # (n_items,) rating points over the span, already times taste_drift


def time_truth(seed, n_items: int, days, taste_drift: float) -> TimeTruth | None:
    """The items' side of the time model (``None`` without ``days``), drawn from ``seed``."""
    if days is None:
        if taste_drift:
            raise ParameterError("--taste-drift: only with --timestamps")
        return None
    if not (np.isfinite(days) and days > 0):
        raise ParameterError(f"--timestamps must be a positive number of days, got {days}")
    if not (np.isfinite(taste_drift) and taste_drift >= 0):
        raise ParameterError(f"--taste-drift must be a finite number >= 0, got {taste_drift}")
    span = float(days) * DAY
    rng = np.random.default_rng(np.random.SeedSequence(entropy=0 if seed is None else seed,
                                                       spawn_key=(_PURPOSE_ITEM_TIMES,)))
    late = rng.random(n_items) < NEW_ITEM_SHARE
    appears = np.where(late, rng.random(n_items) * span, 0.0)
    return TimeTruth(span, appears, rng.standard_normal(n_items) * float(taste_drift))


def block_times(truth: TimeTruth, seed, b: int, first: int, n_users: int, indptr, items, ratings, *, lo: float,
                hi: float, step: float, implicit: bool):
    """``(times, ratings)`` of block ``b`` (users ``first..``): each rating's time and its value after the drift."""
    rng = np.random.default_rng(block_seed(seed, b, _PURPOSE_TIMES))
    n = len(indptr) - 1
    arrive = truth.span * np.arange(first, first + n, dtype=np.float64) / n_users
    a = np.repeat(arrive, np.diff(indptr))
    t = a + (truth.span - a) * rng.random(len(items)) ** 2
    at = truth.appears[items]
    early = t < at
    t[early] = at[early] + (truth.span - at[early]) * rng.random(int(early.sum()))
    if not implicit and len(items) and truth.drift.any():
        r = ratings + truth.drift[items] * (t / truth.span - 0.5)
        if step > 0:
            r = lo + np.round((r - lo) / step) * step
        ratings = np.clip(r, lo, hi).astype(np.float32)
    return START + np.floor(t).astype(np.int64), ratings
