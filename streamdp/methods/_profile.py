"""The shape of a store's users, released with noise: how many training ratings users have.

Defaults that only look at ``n_users epsilon / n_items`` assume that every user rates
many items; where most users rate one or two, a private ALS's factors are noise. What
separates the two is the distribution of ratings per user, a statistic of the data: it
is released here with noise and accounted, before the rest of the plan is made from it.
Public names: :func:`user_profile` (:class:`UserProfile`), :func:`profile_release`,
:func:`exact_histogram`, :func:`bin_centres`, :func:`effective_users`, :func:`mean_ratings`,
:func:`mean_weight_cap`.

Decisions a reader must know:

* the release is a histogram of the users' **training** ratings over fixed public
  half-octave bins (:data:`EDGES`): one user, one bin, sensitivity 1;
* its noise is fixed at the share :data:`PROFILE_SHARE` of the run's budget (Gaussian
  plans: noise multiplier ``z_0 / sqrt(PROFILE_SHARE)``; pure plans: a Laplace release at
  ``PROFILE_SHARE x epsilon``), and the rest of the plan is calibrated with it composed in
  (:func:`streamdp.privacy.release.calibrate_releases`, ``fixed=``): the run's epsilon
  is still the target and the histogram is the ledger's first event;
* it is drawn before the budget is reserved but never leaves the process unless a model
  is released, so a refused reservation released nothing;
* :func:`effective_users` counts the users whose own ratings can pin down a rank-``k``
  factor, ``n_eff = sum_i clip((n_i - k/2) / k, 0, 1)`` (the weight set from measurements);
  the methods use it where they used ``n_users`` in their signal-to-noise proxies.

Design notes (the calibration, the measurements behind ``w``):
docs/design-notes.md#streamdpmethods_profilepy.
"""

from __future__ import annotations

import math

import numpy as np

from streamdp.privacy.calibration import calibrate_gaussian
from streamdp.privacy.release import Release

__all__ = ["EDGES", "PROFILE_SHARE", "UserProfile", "exact_histogram", "profile_release", "user_profile",
           "bin_centres", "effective_users", "mean_ratings", "mean_weight_cap", "MEANS_PROFILE_SHARE",
           "ONE_RATING_NOISE"]

#: Lower edges of the bins of training ratings per user (the last bin is open): half octaves.
EDGES = np.array([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048,
                  4096], dtype=np.int64)
#: Share of a run's budget spent on the histogram.
PROFILE_SHARE = 0.01
#: ``means``' share: its global mean's weights come from the heavy bins, which the 1% histogram leaves in noise
#: on stores of a few hundred users (its noise std there is about 42 users per bin at epsilon 1; 19 at 5%).
MEANS_PROFILE_SHARE = 0.05
WHAT = "histogram of training ratings per user (public half-octave bins; one user, one bin)"
#: A released bin "holds users" when its noisy count exceeds this many noise standard deviations (the serving
#: layer's one-rating share reads a released ``user_profile`` with the same rule).
ONE_RATING_NOISE = 2.0


def exact_histogram(store, split: str = "train") -> np.ndarray:
    """Users per bin of :data:`EDGES` by their number of ``split`` ratings (users with none are not counted).

    Streams the row pointers only, block by block (8 bytes per user of one block at a time).
    """
    hist = np.zeros(len(EDGES), np.float64)
    for b in range(store.n_blocks):
        c = store.block_user_counts(b, split)
        c = c[c > 0]
        if len(c):
            hist += np.bincount(np.searchsorted(EDGES, c, side="right") - 1, minlength=len(EDGES))
    return hist


def profile_release(mechanism: str, epsilon: float, delta: float, share: float = PROFILE_SHARE) -> Release:
    """The histogram's release, its noise fixed from the run's target alone (see the module docstring).

    ``share`` replaces :data:`PROFILE_SHARE` (``means``, whose global mean is weighted from
    the histogram, takes :data:`MEANS_PROFILE_SHARE`).
    """
    if not math.isfinite(epsilon):
        return Release(WHAT, "gaussian", 1.0, 0.0, shape=(len(EDGES),))
    if mechanism == "gaussian":
        z = calibrate_gaussian(epsilon, delta) / math.sqrt(share)
        return Release(WHAT, "gaussian", 1.0, z, shape=(len(EDGES),))
    return Release(WHAT, "laplace", 1.0, 1.0 / (share * epsilon), shape=(len(EDGES),))


class UserProfile:
    """A released (noisy) histogram of training ratings per user, and its release."""

    def __init__(self, counts: np.ndarray, release: Release):
        self.counts = np.asarray(counts, np.float64)
        self.release = release

    def to_dict(self) -> dict:
        """The released histogram (for ``model.json``): bin lower edges and noisy counts."""
        return {"bin_lower_edges": EDGES.tolist(), "users": [round(float(x), 3) for x in self.counts],
                "noise_std": self.noise_std()}

    def effective_users(self, rank: int) -> float:
        return effective_users(self.counts, rank)

    def mean_ratings(self) -> float:
        return mean_ratings(self.counts)

    def noise_std(self) -> float:
        """The standard deviation of each bin's noise (0 for an exact histogram)."""
        rel = self.release
        return float(rel.scale if rel.mechanism == "gaussian" else math.sqrt(2.0) * rel.scale)

    def has_one_rating_users(self) -> bool:
        """Whether the first bin (users with one training rating) clears :data:`ONE_RATING_NOISE` times its noise.

        Post-processing of the release. An exact histogram (non-private) says so when any user has one rating.

        >>> rel = Release(WHAT, "gaussian", 1.0, 10.0, shape=(len(EDGES),))
        >>> UserProfile(np.r_[25.0, np.zeros(len(EDGES) - 1)], rel).has_one_rating_users()
        True
        >>> UserProfile(np.r_[15.0, np.full(len(EDGES) - 1, 900.0)], rel).has_one_rating_users()
        False
        """
        return bool(self.counts[0] > ONE_RATING_NOISE * self.noise_std())


def user_profile(store, mechanism: str, epsilon: float, delta: float, rng: np.random.Generator,
                 share: float = PROFILE_SHARE) -> UserProfile:
    """Draw the noisy histogram of ``store``'s training ratings per user (exact when ``epsilon`` is inf)."""
    rel = profile_release(mechanism, epsilon, delta, share)
    return UserProfile(rel.add(exact_histogram(store), rng), rel)


def bin_centres() -> np.ndarray:
    """Each bin's geometric centre, ``sqrt(lower x (upper - 1))`` (the open last bin's upper edge taken as twice its
    lower): the number of ratings a bin's users are counted at.

    >>> bin_centres()[:3].tolist()
    [1.0, 2.0, 3.0]
    """
    upper = np.r_[EDGES[1:], 2 * EDGES[-1]].astype(np.float64)
    return np.sqrt(EDGES * np.maximum(upper - 1, EDGES))


def effective_users(hist, rank: int) -> float:
    """``sum_i w(n_i)``, ``w(n) = clip((n - k/2) / k, 0, 1)`` at each bin's geometric centre (negative counts as 0).

    >>> effective_users(np.r_[100.0, np.zeros(len(EDGES) - 1)], 8)  # 100 users with one rating each
    0.0
    >>> h = np.zeros(len(EDGES)); h[list(EDGES).index(16)] = 50.0  # 50 users with 16-23 ratings
    >>> effective_users(h, 8)
    50.0
    """
    centre = bin_centres()
    k = float(rank)
    w = np.clip((centre - k / 2.0) / k, 0.0, 1.0)
    return float(np.sum(np.maximum(np.asarray(hist, np.float64), 0.0) * w))


def mean_ratings(hist) -> float:
    """The mean training ratings per user of a (released) histogram: each bin's users at its geometric centre
    (as :func:`effective_users`), negative counts as 0; 0 for an empty histogram.

    >>> h = np.zeros(len(EDGES)); h[0], h[list(EDGES).index(64)] = 30.0, 10.0  # 30 users with 1, 10 with 64-95
    >>> round(mean_ratings(h), 1)
    20.2
    """
    centre = bin_centres()
    c = np.maximum(np.asarray(hist, np.float64), 0.0)
    total = float(c.sum())
    return float(c @ centre) / total if total > 0 else 0.0


#: Prior scale of how far users' mean ratings move per unit of log activity, as a share of half the rating range
#: (:func:`mean_weight_cap`). Measured slopes (exact, per user, against ln n_i): ML-100K 0.04 h, FilmTrust 0.07 h,
#: the two generated stores of issue 28 (activity bias -0.3) 0.14 h.
ACTIVITY_SLOPE = 0.125


def mean_weight_cap(hist, noise_std: float, half_range: float, threshold: float = 0.0,
                    slope: float = ACTIVITY_SLOPE) -> float:
    """The cap ``c`` of the global mean's per-user weights ``min(n_i, c) / c``, chosen from a released histogram.

    A test RMSE is per rating, and heavy users have most ratings: where users' levels go
    with their activity, the mean of user means (``c = 1``) misses the level of the
    ratings that are predicted (issue 28: 0.094 on a store of 72,000 users, 85% with one
    rating; 0.137 on 610 users with 66-1,919 ratings each). Weighting user ``i``'s mean by
    ``min(n_i, c) / c`` moves the estimate towards the rating-weighted mean as ``c`` grows,
    but the weight total ``W(c) = sum_i min(n_i, c) / c`` shrinks and the noise of the mean
    (``noise_std / W(c)``: each user still moves the released sum and total by at most
    ``h`` and 1) grows. The cap minimises, over the bin edges, the expected squared error

        (noise_std / W(c))^2 + (slope h D(c))^2,

    ``D(c)`` the distance between the rating-weighted and the ``min(n, c)``-weighted mean
    of ``ln n`` over users: the bias if users' means moved by ``slope h`` per unit of
    ``ln n`` (:data:`ACTIVITY_SLOPE`, a public prior). Both are read off the histogram
    at each bin's geometric centre; bins whose noisy count is below ``threshold`` count as
    empty (the heavy bins' noise would otherwise pose as heavy users). Post-processing
    of the released histogram only: it costs no budget.

    >>> h = np.zeros(len(EDGES)); h[0] = 60000.0; h[list(EDGES).index(16)] = 2000.0
    >>> mean_weight_cap(h, 25.0, 2.0)  # many users: the rating-weighted mean (every weight n_i / 24) is affordable
    24.0
    >>> mean_weight_cap(h / 100, 25.0, 2.0)  # 620 users: the noise keeps the cap small
    3.0
    """
    H = _contiguous(hist, threshold)
    x = bin_centres()
    if not H.sum() > 0:
        return 1.0
    lx = np.log(x)
    target = float(np.sum(H * x * lx) / np.sum(H * x))
    best, cap = math.inf, 1.0
    for c in EDGES.astype(np.float64):
        w = H * np.minimum(x, c)
        W = float(w.sum()) / c
        d = target - float(np.sum(w * lx) / w.sum())
        err = (noise_std / max(W, 1e-12)) ** 2 + (slope * half_range * d) ** 2
        if err < best:
            best, cap = err, float(c)
    return cap


def _contiguous(hist, threshold: float) -> np.ndarray:
    """The histogram's bins at or above ``threshold`` that join the fullest bin without a gap; the rest 0.

    Users' activity fills neighbouring bins; a lone noisy bin far from the bulk is noise posing
    as users (an empty bin of a 1,000-user store passes two noise stds in about one run of 40).
    """
    H = np.maximum(np.asarray(hist, np.float64), 0.0)
    ok = H >= max(threshold, 0.0)
    out = np.zeros_like(H)
    if not ok.any():
        return out
    top = int(np.argmax(H))
    lo = hi = top
    while lo > 0 and ok[lo - 1]:
        lo -= 1
    while hi < len(H) - 1 and ok[hi + 1]:
        hi += 1
    out[lo:hi + 1] = H[lo:hi + 1]
    return out
