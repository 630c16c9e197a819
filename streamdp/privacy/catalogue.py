"""The items a model publishes: a catalogue declared by the data owner, or selected with differential privacy.

Which items exist is a statistic of the data: a user who alone rated an item adds it to
the store, and a model that lists the store's items says that someone rated it. So a
model's items are one of (:class:`Catalogue`, ``source``):

``declared``
    the owner's list (``ingest --items FILE``, ``train --items FILE``, ``items=``; a store
    made by ``generate`` declares its generator's items): public by declaration, nothing
    spent. Ratings of other items are dropped (:class:`~streamdp.storage.catalogue.CatalogueView`).
``selected``
    private partition selection (Gopi et al. 2020, "Differentially private set union";
    Desfontaines et al. 2022): each user gives at most :data:`ITEMS_PER_USER` of her items
    (a keyed random subset) the weight ``1 / sqrt(m)`` each, ``m`` how many she gives (L2
    norm 1); every item with a positive total gets Gaussian noise of multiplier ``z``; the
    items whose noisy total exceeds the threshold ``T`` are the catalogue, and their noisy
    totals are released with it. Items both neighbours hold see a Gaussian mechanism of
    sensitivity 1 (``GaussianDpEvent(z)``); an item only the added user rated is released
    with probability at most ``max_m m P(N(0, z^2) > T - 1/sqrt(m))`` = ``delta_threshold``
    (``DeltaDpEvent``). Both events are the run's first, composed with the rest by the
    accountant, like the count of users (:mod:`streamdp.privacy.users`).
``exact``
    a non-private run (``--epsilon inf``), or a method whose neighbouring relation keeps
    users and items fixed and public (``lowrank``, ``public-private``): the store's items.

Budget: ``z = z_run / sqrt(SHARE)``, ``z_run`` the one Gaussian that meets the run's target alone, so
the selection takes a :data:`SHARE` of the run's Gaussian budget (``1/z^2`` adds up under composition:
the method's own noise grows by ``1 / sqrt(1 - SHARE)``, 5.4%), and ``delta_threshold = DELTA_SHARE *
delta``. Both are fixed from the target alone, before anything is read. Why these numbers, and what
the selection keeps on stores of each shape: docs/privacy.md, "The item catalogue".

Public names: :class:`Catalogue`, :func:`catalogue_for`, :func:`select_catalogue`, :func:`threshold`,
:func:`weighted_counts`, :func:`store_catalogue`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import numpy as np
from scipy.special import ndtri

from streamdp.errors import ParameterError
from streamdp.privacy.accountant import epsilon_of
from streamdp.privacy.bounding import hash_keys, trim_mask
from streamdp.privacy.calibration import calibrate_gaussian
from streamdp.privacy.events import DeltaDpEvent, compose
from streamdp.privacy.release import Release
from streamdp.storage.catalogue import catalogue_ids, catalogue_view, store_catalogue
from streamdp.storage.ids import as_ids, numeric

__all__ = ["SHARE", "DELTA_SHARE", "ITEMS_PER_USER", "RNG_KEY", "Catalogue", "ThresholdRelease", "catalogue_for",
           "select_catalogue", "threshold", "weighted_counts", "store_catalogue", "declared_items"]

#: Share of the run's Gaussian budget (``1 / z^2``) the selection takes.
SHARE = 0.1
#: Share of the run's delta bounding the release of an item only the added user rated.
DELTA_SHARE = 0.25
#: Items a user contributes to the selection at most (a keyed random subset of hers beyond it).
ITEMS_PER_USER = 128
#: Key of the selection's random streams (``SeedSequence(seed, spawn_key=(RNG_KEY,))``).
RNG_KEY = 0xCA7A
WHAT = ("item catalogue: each item's users, weighted 1/sqrt(m) (m <= {cap} items a user), thresholded at {T:.6g}; "
        "one noisy count per item some user rated, whose number is not published (the store's item count is an "
        "exact statistic: one user alone on an item adds one)")


@dataclass(frozen=True)
class ThresholdRelease:
    """The thresholding part of the selection as the plan lists it: ``(0, delta)``-DP, no noise of its own."""

    delta: float
    what: str = "item catalogue: an item only the added user rated released with probability at most delta"
    mechanism: str = "threshold"
    count: int = 1
    noise_multiplier: float = math.inf

    @property
    def private(self) -> bool:
        return True

    @property
    def epsilon_each(self) -> float:
        return 0.0

    def event(self):
        return DeltaDpEvent(float(self.delta), "partition selection threshold")

    def entry(self) -> dict:
        return {"release": self.what, "mechanism": "threshold (partition selection)", "delta": float(self.delta),
                "count": 1}


@dataclass(frozen=True)
class Catalogue:
    """The items of a run: ``ids`` (the store's id kind), where they come from, and what their selection spent.

    ``release`` and ``cut`` are the selection's Gaussian release and threshold (``selected`` only);
    ``counts`` the released noisy totals of the selected items (in ``ids`` order). ``in_plan``: whether the
    method's plan spends it (``False`` when a wrapping run, ``tune``, accounts it once). ``range``: the run's rating
    range when selected privately (:class:`streamdp.privacy.rating_range.RangeSelection`), whose two releases ride
    here so that every run spends them where it spends the items' selection.
    """

    ids: np.ndarray
    source: str
    release: Release | None = None
    cut: ThresholdRelease | None = None
    threshold: float | None = None
    counts: np.ndarray | None = None
    by: str = ""
    in_plan: bool = True
    range: object = None  # RangeSelection | None: declared, a non-private run, counts or public-private

    @property
    def n(self) -> int:
        return int(len(self.ids))

    def elsewhere(self) -> Catalogue:
        """The same catalogue, accounted by the caller rather than by the method's own plan."""
        return replace(self, in_plan=False)

    def releases(self) -> list:
        """The selections' releases (the items' Gaussian and threshold, then the rating range's), whoever accounts
        them."""
        items = [self.release, self.cut] if self.source == "selected" else []
        return items + (self.range.releases() if self.range is not None else [])

    def spent(self) -> list:
        """The releases a plan holding this catalogue spends on it and on the range (``[]`` when both are declared
        or exact, or accounted elsewhere)."""
        return self.releases() if self.in_plan else []

    def public_parameter(self) -> dict:
        """The ledger's ``public_parameters.items``: how many, where they come from, what it cost."""
        d = {"n_items": self.n, "source": self.source}
        if self.source == "selected":
            d["release"] = (f"private partition selection: Gaussian noise multiplier {self.release.noise_multiplier:.6g} "
                            f"on each item's users weighted 1/sqrt(m), m <= {ITEMS_PER_USER} items a user, threshold "
                            f"{self.threshold:.6g}; an item only one user rated is released with probability at most "
                            f"{self.cut.delta:.3g}")
        elif self.source == "declared":
            d["release"] = f"declared by the data owner ({self.by}): public, nothing spent"
        else:
            d["release"] = f"the store's items, {self.by}"
        return d

    def describe(self) -> str:
        """One line for ``train``'s output."""
        if self.source == "selected":
            return (f"{self.n:,} items selected privately (partition selection, threshold {self.threshold:.4g}; an "
                    f"item one user alone rated is released with probability at most {self.cut.delta:.2g})")
        if self.source == "declared":
            return f"{self.n:,} items, declared ({self.by})"
        return f"{self.n:,} items, the store's ({self.by})"


def threshold(z: float, delta_t: float, cap: int = ITEMS_PER_USER) -> float:
    """The smallest ``T`` with ``m P(N(0, z^2) > T - 1/sqrt(m)) <= delta_t`` for every ``m = 1..cap``.

    A user who alone rated ``m`` of her contributed items gives each ``1/sqrt(m)``; each is released when its
    noise exceeds ``T - 1/sqrt(m)`` (a union bound over her ``m`` items).

    >>> round(threshold(1.0, 1e-6, cap=1), 4)  # 1 + z * 4.7534
    5.7534
    """
    m = np.arange(1, int(cap) + 1, dtype=np.float64)
    return float(np.max(1.0 / np.sqrt(m) - z * ndtri(delta_t / m)))


@functools.lru_cache(maxsize=64)
def selection_noise(epsilon: float, delta: float, share: float = SHARE,
                    delta_share: float = DELTA_SHARE) -> tuple[float, float]:
    """``(z, delta_threshold)`` of a selection taking ``share`` of the run's Gaussian budget and ``delta_share`` of
    its delta (the items' by default; the rating range's: :mod:`streamdp.privacy.rating_range`), fixed from the
    run's target alone (module docstring)."""
    return calibrate_gaussian(epsilon, delta) / math.sqrt(share), delta_share * float(delta)


def weighted_counts(store, *, key: int, cap: int = ITEMS_PER_USER) -> np.ndarray:
    """Each item's users weighted ``1/sqrt(m)`` (``m = min(her items, cap)``, a keyed random subset), float64.

    One pass over the training blocks, one block in memory at a time; vectorised per block.
    """
    out = np.zeros(store.n_items, np.float64)
    for blk in store.blocks("train"):
        if not blk.nnz:
            continue
        keys = np.empty(blk.nnz, np.float64)
        hash_keys(np.int64(blk.first_user), blk.indptr, blk.items, np.uint64(key), keys)
        keep = trim_mask(blk.indptr, keys, cap)
        m = np.minimum(np.diff(blk.indptr), cap)
        w = np.repeat(1.0 / np.sqrt(np.maximum(m, 1)), np.diff(blk.indptr))
        out += np.bincount(blk.items[keep], weights=w[keep], minlength=store.n_items)
    return out


def select_catalogue(store, *, epsilon: float, delta: float, seed: int | None = None) -> Catalogue:
    """The private catalogue of ``store`` at the run's target (module docstring).

    The noise and the subset key come from OS entropy, or with ``seed`` from the seed's own stream.
    """
    z, delta_t = selection_noise(epsilon, delta)
    T = threshold(z, delta_t)
    seq = np.random.SeedSequence(seed, spawn_key=(RNG_KEY,)) if seed is not None else np.random.SeedSequence()
    rng = np.random.default_rng(seq)
    key = int(rng.integers(0, 2 ** 63))
    counts = weighted_counts(store, key=key)
    cand = np.flatnonzero(counts > 0)
    # no shape: the counts' number is the store's item count, read off the data (the noise takes the counts' shape)
    rel = Release(WHAT.format(cap=ITEMS_PER_USER, T=T), "gaussian", 1.0, z)
    noisy = rel.add(counts[cand], rng)
    chosen = cand[noisy > T]
    ids = as_ids(store.item_ids())[chosen]
    order = np.argsort(ids, kind="stable")
    return Catalogue(ids[order], "selected", rel, ThresholdRelease(delta_t), T, noisy[noisy > T][order])


def declared_items(items, store, flag: str = "--items"):
    """``items`` as the store's kind of ids: ``None``, a file of ids (a path), or ids (numbers or strings)."""
    if items is None:
        return None
    return catalogue_ids(items, numeric=numeric(store.item_ids()[:1]) if store.n_items else True, flag=flag)


def catalogue_for(cls, store, *, epsilon: float, delta: float, seed: int | None = None, items=None,
                  items_source: str = "--items"):
    """``(store seen through the catalogue, Catalogue)`` for a run of method class ``cls``.

    ``items``: ids the owner declares (``--items``/``items=``); else the store's declared catalogue; else,
    for a private run of a method that releases its items, the private selection; else the store's items.
    (Runs call :func:`streamdp.privacy.rating_range.catalogue_and_range_for`, which adds the rating range.)
    """
    if items is not None:
        cat = Catalogue(as_ids(np.asarray(items)), "declared", by=items_source)
    elif (declared := store_catalogue(store)) is not None:
        cat = Catalogue(declared[0], "declared", by=declared[1])
    elif not math.isfinite(epsilon):
        return store, Catalogue(as_ids(store.item_ids()), "exact", by="a non-private run")
    elif not getattr(cls, "RELEASES_USER_COUNT", True):
        cat = Catalogue(as_ids(store.item_ids()), "exact",
                        by=f"public under {cls.name}'s neighbouring relation (users and items fixed)")
    else:
        cat = select_catalogue(store, epsilon=epsilon, delta=delta, seed=seed)
    if cat.n == 0:
        raise ParameterError("the catalogue is empty: no item "
                             + ("cleared the private selection's threshold; declare the items with --items FILE "
                                "(a list the owner publishes anyway), or train on more users or a larger epsilon"
                                if cat.source == "selected" else "was declared"))
    return (store if cat.source == "exact" else catalogue_view(store, cat.ids)), cat


def epsilon_alone(releases, delta: float) -> float:
    """The PLD epsilon at ``delta`` of ``releases`` on their own (what basic composition leaves a method)."""
    events = [r.event() for r in releases]
    return epsilon_of(compose(events), delta).epsilon if events else 0.0
