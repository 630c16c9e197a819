"""The number of users a model publishes: released with noise, or declared public.

Under add/remove one user and all of their ratings, the exact number of users is a
statistic that changes by one between neighbouring stores: published exactly (in
``model.json``, the ledger, or any default derived from it: the default delta, ALS's
iterations, oja's steps, fw's nuclear-norm bound, ...), it tells the two apart with
certainty. So it is one of two things, and every setting reads it from here, never
from ``store.n_users``:

``released``
    a Laplace release of the count (L1 sensitivity 1) at :data:`COUNT_SHARE` of the
    run's epsilon (noise scale ``b = 1 / (COUNT_SHARE epsilon)``: 100 users at epsilon
    1, a standard deviation of 141), rounded and floored at 1 (post-processing). It is
    composed with the run's other events by the accountant (the methods calibrate
    their releases with it ``fixed``, as :mod:`streamdp.methods._profile` does).
``declared``
    ``--users-bound N``: a public number of users the data owner declares (the
    size of a published panel, a catalogue of accounts); nothing is spent on it, and a
    store with more users than ``N`` is refused (a message to the data owner only:
    nothing is released).

A non-private run (``--epsilon inf``) uses the exact count (``exact``); its model is
labelled non-private anyway.

Why Laplace (pure DP), not a Gaussian share: the default delta is derived from the
count (:func:`streamdp.privacy.params.default_delta`), so the count's own release
cannot depend on delta. A pure-DP release needs none. The delta that follows is
then a function of the released count: the run is calibrated to that delta after the
count is known (adaptive composition; the rule ``delta <= min(1e-6, 1/(10 n))`` has
powers of ten as its only values, so it differs from the exact count's only when
``n`` is within a few noise scales of a power of ten, and never above 1e-6). Its
noise is drawn when the method is built, before the budget is reserved; it leaves the
process only inside a released model, whose ledger lists it as its first event.

The noise comes from OS entropy, or, with ``--seed``, from the seed's own stream
(:data:`RNG_KEY`): a seeded run draws the same count every time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from streamdp.errors import ParameterError
from streamdp.privacy.release import Release

__all__ = ["COUNT_SHARE", "RNG_KEY", "UserCount", "release_user_count", "check_users_bound", "count_release"]

#: Share of the run's epsilon spent on the count (a pure Laplace release at ``COUNT_SHARE * epsilon``).
COUNT_SHARE = 0.01
#: Key of the count's random stream (``SeedSequence(seed, spawn_key=(RNG_KEY,))``).
RNG_KEY = 0x05E5
WHAT = "number of users (one user changes it by one)"


@dataclass(frozen=True)
class UserCount:
    """The number of users every setting and public field of a run reads.

    ``n`` is an integer at least 1: the rounded noisy count (``released``), the
    declared bound (``declared``), or the exact count of a non-private run
    (``exact``). ``release`` is the Laplace release (``released`` only). ``in_plan``:
    whether the method's plan spends it (``False`` when a wrapping run, ``tune``,
    accounts it once for all its candidates).
    """

    n: int
    source: str
    release: Release | None = None
    in_plan: bool = True

    def elsewhere(self) -> UserCount:
        """The same count, accounted by the caller rather than by the method's own plan."""
        return replace(self, in_plan=False)

    def spent(self) -> list:
        """The releases a plan holding this count spends on it (``[]`` when declared, exact or accounted elsewhere)."""
        return [self.release] if self.in_plan and self.release is not None and self.release.private else []

    @property
    def epsilon(self) -> float:
        """The pure epsilon of the count's release (0 when nothing was spent on it)."""
        return self.release.epsilon_each if self.release is not None and self.release.private else 0.0

    def public_parameter(self) -> dict:
        """The ledger's ``public_parameters.n_users``: the value and where it comes from."""
        d = {"value": int(self.n), "source": self.source}
        if self.source == "released":
            d["release"] = (f"Laplace, sensitivity 1, scale {self.release.scale:.6g} (pure epsilon "
                            f"{self.epsilon:.6g}: {COUNT_SHARE:g} of the run's), rounded, at least 1")
        elif self.source == "declared":
            d["release"] = "declared by the data owner (--users-bound): public, nothing spent"
        else:
            d["release"] = ("exact: a non-private run, or a method whose neighbouring relation keeps the users "
                            "fixed (lowrank, public-private)")
        return d


def check_users_bound(bound) -> int | None:
    """``--users-bound``: ``None`` or a positive integer (``ParameterError`` naming the option otherwise).

    >>> check_users_bound(2000), check_users_bound(None)
    (2000, None)
    """
    if bound is None:
        return None
    if isinstance(bound, bool) or not isinstance(bound, (int, np.integer, float)) or int(bound) != bound \
            or bound < 1:
        raise ParameterError(f"--users-bound: expected a positive integer, got {bound!r}")
    return int(bound)


def release_user_count(n_exact: int, *, epsilon: float, seed: int | None = None,
                       users_bound: int | None = None) -> UserCount:
    """The run's :class:`UserCount` for a store of ``n_exact`` users at ``epsilon``.

    >>> c = release_user_count(2000, epsilon=4.0, seed=1)
    >>> c.source, c.release.scale, abs(c.n - 2000) < 200
    ('released', 25.0, True)
    >>> release_user_count(2000, epsilon=4.0, users_bound=5000).n
    5000
    >>> release_user_count(2000, epsilon=float("inf")).n
    2000
    """
    bound = check_users_bound(users_bound)
    if bound is not None:
        if int(n_exact) > bound:
            raise ParameterError(f"--users-bound {bound}: the store has more users than the declared bound "
                                 f"(declare a bound at least the number of users, or leave it out to release "
                                 f"the count with noise)")
        return UserCount(bound, "declared")
    if not math.isfinite(epsilon):
        return UserCount(int(n_exact), "exact")
    rel = count_release(epsilon)
    seq = np.random.SeedSequence(seed, spawn_key=(RNG_KEY,)) if seed is not None else None
    noisy = float(rel.add(float(n_exact), np.random.default_rng(seq)))
    return UserCount(max(1, int(round(noisy))), "released", rel)


def count_release(epsilon: float) -> Release:
    """The Laplace release of the count at ``epsilon`` (its noise not drawn): what a run spends on it, known
    before the data is read (a per-user filter charges it first, :mod:`streamdp.privacy.filter`)."""
    return Release(WHAT, "laplace", 1.0, 1.0 / (COUNT_SHARE * float(epsilon)))
