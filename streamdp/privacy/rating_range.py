"""The rating range of a private run on a store whose range was not declared: selected with differential privacy.

The lowest and highest rating of the data are statistics of it (one user alone may hold the only 1 on a 1-5
scale, or a stray 0), and every method clips and scales its noise to the range, which ``model.json`` publishes.
So a private run's range is one of (``RangeSelection.source``): ``declared`` (``ingest --rating-range``; a store
from ``generate``): public, nothing spent; or ``selected`` here; a non-private run (``--epsilon inf``) keeps the
store's observed range (nothing private is claimed), and an implicit store's counts are left alone (methods use
only a declared ``--count-cap``, never the observed maximum).

Selection: private partition selection over rating VALUES, with :mod:`streamdp.privacy.catalogue`'s machinery
(its threshold, budget share scheme and :class:`~streamdp.privacy.catalogue.ThresholdRelease`). Each user gives
her lowest and highest rating (:func:`user_extremes`, a Numba kernel; one pass, block by block): ``m = 2`` values
of weight ``1/sqrt(2)``, or one of weight 1 when they are equal (L2 norm 1). Every value some user gives gets
Gaussian noise of multiplier ``z``; those whose noisy total exceeds ``T = threshold(z, delta_t, cap=2)`` are kept,
and the range is ``[min kept, max kept]``. A value only the added user holds is kept with probability at most
``delta_t`` (``DeltaDpEvent``); the others see a Gaussian of sensitivity 1 (``GaussianDpEvent(z)``). Both ride on
the run's :class:`~streamdp.privacy.catalogue.Catalogue` (``range``), so ``train`` and ``tune`` spend them once,
first, composed by the accountant with the rest (the method's noise is calibrated to what is left). Training
ratings outside the range are clipped into it on read (:class:`~streamdp.storage.range_view.RangeView`).

Decisions. A user's two extremes, not all her distinct values: only extremes decide the range, and two values
weigh ``1/sqrt(2)`` each where five levels would weigh ``1/sqrt(5)``. Budget: :data:`SHARE` = 2% of the run's
Gaussian budget (``z = z_run / sqrt(SHARE)``; the method's noise grows by about 1%) and :data:`DELTA_SHARE` = 5% of
delta, fixed from the target alone: a scale's ends are shared by a large part of the users (ml-100k: 723 of 943
users rate a 1, 928 a 5: weighted totals 511 and 656 against ``T`` = 164 at epsilon 1, delta 1e-6), unlike items,
so a smaller share than the catalogue's 10% suffices. Fewer than two values kept (few users, a continuous scale,
a small epsilon), or more than :data:`MAX_VALUES` distinct extremes (memory): refused in one line asking the owner
to declare ``--rating-range``; no range is guessed. ``public-private`` selects none: it takes the public users' range (public data).

Public names: :class:`RangeSelection`, :func:`select_range`, :func:`range_for`, :func:`value_weights`,
:func:`catalogue_and_range_for` (what ``train`` and ``tune`` call).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from streamdp.kernels.jit import njit

from streamdp.errors import ParameterError
from streamdp.privacy.catalogue import ThresholdRelease, catalogue_for, selection_noise, threshold
from streamdp.privacy.release import Release
from streamdp.storage.range_view import RangeView

__all__ = ["SHARE", "DELTA_SHARE", "VALUES_PER_USER", "MAX_VALUES", "RNG_KEY", "RangeSelection", "range_for",
           "select_range", "value_weights", "user_extremes", "catalogue_and_range_for"]

#: Share of the run's Gaussian budget (``1 / z^2``) the selection takes.
SHARE = 0.02
#: Share of the run's delta bounding the release of a value only the added user holds.
DELTA_SHARE = 0.05
#: Values a user contributes: her lowest and highest rating.
VALUES_PER_USER = 2
#: Distinct contributed values held in memory at most (more: a continuous scale, refused: declare the range).
MAX_VALUES = 1 << 22
#: Key of the selection's random stream (``SeedSequence(seed, spawn_key=(RNG_KEY,))``).
RNG_KEY = 0x4A6E
WHAT = ("rating range: each rating value's users who hold it as their lowest or highest rating, weighted 1/sqrt(m) "
        "(m <= 2), thresholded at {T:.6g}; one noisy count per value some user holds, whose number is not published")
CUT = "rating range: a rating value only the added user holds kept with probability at most delta"


@dataclass(frozen=True)
class RangeSelection:
    """A run's rating range ``[lo, hi]``, where it comes from, and (``selected``) what its selection spent."""

    lo: float
    hi: float
    source: str
    release: Release | None = None
    cut: ThresholdRelease | None = None
    threshold: float | None = None
    values: np.ndarray | None = None  # the kept values, ascending (released with their noisy counts)
    counts: np.ndarray | None = None

    def releases(self) -> list:
        return [self.release, self.cut] if self.source == "selected" else []

    def public_parameter(self) -> dict:
        """The ledger's ``public_parameters.rating_range``."""
        d = {"min": float(self.lo), "max": float(self.hi), "source": self.source}
        if self.source == "selected":
            d["release"] = (f"private partition selection over rating values (each user's lowest and highest, "
                            f"weighted 1/sqrt(m), m <= {VALUES_PER_USER}): Gaussian noise multiplier "
                            f"{self.release.noise_multiplier:.6g}, threshold {self.threshold:.6g}; the range is the "
                            f"lowest and highest value kept, and training ratings outside it are clipped into it; a "
                            f"value only one user holds is kept with probability at most {self.cut.delta:.3g}")
        elif self.source == "declared":
            d["release"] = "declared by the data owner (ingest --rating-range): public, nothing spent"
        else:
            d["release"] = "the store's observed minimum and maximum (a non-private run: nothing private is claimed)"
        return d

    def describe(self) -> str:
        """One line for ``train``'s output."""
        if self.source == "selected":
            return (f"[{self.lo:g}, {self.hi:g}] selected privately ({len(self.values)} rating values kept, threshold "
                    f"{self.threshold:.4g}; a value one user alone holds is kept with probability at most "
                    f"{self.cut.delta:.2g})")
        return f"[{self.lo:g}, {self.hi:g}] " + ("declared" if self.source == "declared" else "observed (non-private)")


@njit(cache=True, nogil=True)
def user_extremes(indptr, ratings, lo, hi):  # pragma: no cover - numba
    """``lo[u]``, ``hi[u]``: user ``u``'s lowest and highest rating in a block (local ``indptr``), left alone for a
    user with none (a kernel on raw arrays, as :func:`streamdp.privacy.bounding.hash_keys`: ``privacy`` imports no
    kernel module).

    Returns ``has``: a ``uint8`` per user, 1 when she has ratings.
    """
    n = len(indptr) - 1
    has = np.zeros(n, np.uint8)
    for u in range(n):
        s, e = indptr[u], indptr[u + 1]
        if e <= s:
            continue
        a = ratings[s]
        b = ratings[s]
        for p in range(s + 1, e):
            r = ratings[p]
            if r < a:
                a = r
            elif r > b:
                b = r
        lo[u] = a
        hi[u] = b
        has[u] = 1
    return has


def value_weights(store) -> tuple[np.ndarray, np.ndarray]:
    """``(values, weights)``: each rating value some user holds as her lowest or highest training rating, ascending
    (float32), and its users weighted ``1/sqrt(m)`` (``m`` her distinct extremes, 1 or 2), float64.

    One pass over the training blocks, one block in memory at a time (a Numba kernel per block; the merge is
    vectorised over the block's distinct values).
    """
    vals = np.zeros(0, np.float32)
    w = np.zeros(0, np.float64)
    half = 1.0 / math.sqrt(2.0)
    for blk in store.blocks("train"):
        if not blk.nnz:
            continue
        lo = np.empty(blk.n_users, np.float32)
        hi = np.empty(blk.n_users, np.float32)
        has = user_extremes(blk.indptr, np.ascontiguousarray(blk.ratings, np.float32), lo, hi).astype(bool)
        lo, hi = lo[has], hi[has]
        two = hi != lo
        v = np.concatenate([vals, lo, hi[two]])
        x = np.concatenate([w, np.where(two, half, 1.0), np.full(int(two.sum()), half)])
        vals, inv = np.unique(v, return_inverse=True)
        w = np.bincount(inv.ravel(), weights=x, minlength=len(vals))
        if len(vals) > MAX_VALUES:
            raise ParameterError(f"{store.path}: its ratings take more than {MAX_VALUES:,} distinct lowest and highest "
                                 f"values (a continuous scale): a private range cannot be selected; declare the "
                                 f"scale with ingest --rating-range LO,HI")
    return vals, w


def select_range(store, *, epsilon: float, delta: float, seed: int | None = None) -> RangeSelection:
    """The private rating range of ``store`` at the run's target (module docstring); refused in one line
    (:class:`ParameterError`) when fewer than two values are kept.

    The noise comes from OS entropy, or with ``seed`` from the seed's own stream.
    """
    z, delta_t = selection_noise(epsilon, delta, SHARE, DELTA_SHARE)
    T = threshold(z, delta_t, cap=VALUES_PER_USER)
    seq = np.random.SeedSequence(seed, spawn_key=(RNG_KEY,)) if seed is not None else np.random.SeedSequence()
    rng = np.random.default_rng(seq)
    values, weights = value_weights(store)
    # no shape: the number of values is read off the data (the noise takes the counts' shape)
    rel = Release(WHAT.format(T=T), "gaussian", 1.0, z)
    noisy = rel.add(weights, rng)
    keep = noisy > T
    if int(keep.sum()) < 2:
        raise ParameterError(f"{store.path}: the rating range was not declared and fewer than two rating values "
                             f"cleared its private selection's threshold; declare the scale with ingest "
                             f"--rating-range LO,HI (public), or train on more users or a larger epsilon")
    kept = values[keep].astype(np.float64)
    return RangeSelection(float(kept[0]), float(kept[-1]), "selected", rel, ThresholdRelease(delta_t, CUT), T,
                          kept, noisy[keep])


def range_for(store, *, epsilon: float, delta: float, seed: int | None = None):
    """``(store seen through the run's range, RangeSelection or None)``.

    ``None`` (the store as it is) for a declared range, an implicit store (its counts: module docstring) and a
    non-private run; else the private selection and the store clipped to it (:class:`RangeView`).
    """
    if getattr(store, "rating_range_source", "declared") == "declared" or getattr(store, "implicit", False):
        return store, None
    if not math.isfinite(epsilon):
        return store, None
    sel = select_range(store, epsilon=epsilon, delta=delta, seed=seed)
    return RangeView(store, sel.lo, sel.hi), sel


def catalogue_and_range_for(cls, store, *, epsilon: float, delta: float, seed: int | None = None, items=None,
                            items_source: str = "--items"):
    """``(store seen through the run's catalogue and rating range, Catalogue)`` for a run of method class ``cls``.

    The items as :func:`streamdp.privacy.catalogue.catalogue_for` chooses them; then, for a private run of a method
    that selects its range (``cls.SELECTS_RATING_RANGE``) on a store whose range was not declared, the range selected
    on the catalogue's ratings (:func:`range_for`), held in ``Catalogue.range`` and spent with the items' selection
    (``Catalogue.spent``: first, in the method's plan or in ``tune``'s prefix).
    """
    view, cat = catalogue_for(cls, store, epsilon=epsilon, delta=delta, seed=seed, items=items,
                              items_source=items_source)
    if not getattr(cls, "SELECTS_RATING_RANGE", True):
        return view, cat
    view, sel = range_for(view, epsilon=epsilon, delta=delta, seed=seed)
    return view, (replace(cat, range=sel) if sel is not None else cat)
