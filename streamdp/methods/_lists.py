"""A rating model's lists from an ``ials`` part trained in the same release (``train --lists``).

A private ``als`` run answers "what would she rate this item?"; its lists rank items by that prediction (plus a
weight times the log of its released counts). Where users rate few items the run releases item biases only, and
every user gets the same list, no better than the most-popular chart (issue 42's product store of 72,000 users,
85% of them with one rating: 0.996x the exact chart at Recall@10; 1M users x 20k items: 0.99x). Which items a user
rated at all is the signal lists need there, and ``ials`` trains on it. ``train --lists ials`` (the default of
``train`` without ``--method`` on a rating store of :data:`LISTS_MIN_USERS` or more users, private: ``--lists
auto``) trains both in one release.

Decisions a reader must know:

* **the budget**: the ``ials`` part is calibrated alone at its share of the epsilon the releases made first
  (the count of users, private selections of the items or range) leave, plus theirs (``--lists-share``; by default
  :data:`LISTS_SHARE_BIASES` where the ``als`` plan fits no factors, ``--iters 0`` by default, decided on the
  released count and histogram of users before anything else is released: its RMSE barely moves with epsilon and
  its lists are one list for all; :data:`LISTS_SHARE` where it plans factors, whose RMSE needs the budget). Its
  releases are then spent first, like the count of users, and the ``als`` part's noise is calibrated so that
  everything composes (dp-accounting's PLD) to the run's epsilon: one ledger (its contribution bounds under
  ``bounds.lists``), one reservation of the store's budget, one charge per user of a per-user budget. Measured at
  epsilon 1 (seeds 1-3, docs/ranking.md): test RMSE +0.0000 to +0.0021 against ``--lists own``;
* **which lists are used** (post-processing of released values only): the ``ials`` part's when its own private
  choice kept its factors, else the ``als`` model's own (an ``ials`` chart is not a better list than the biases'
  one: 0.0469 against 0.0578 on a 6,040-user store). Where ratings carry the taste and the choice of items does
  not (200,000 users x 1,000 items drawn by popularity alone), ``ials`` keeps its chart and ``als``' factors list
  at 1.35x the chart: those are kept;
* **the model**: the ``als`` model as always (predictions, RMSE, ``recommend``'s scores), and, when used, the
  ``ials`` part's arrays as ``lists_*`` arrays beside its own and its ``model.json`` fields under ``lists``
  (:func:`streamdp.serving.local.list_model` rebuilds it); every list path (``evaluate``, ``recommend``, ``recommend
  --all``, ``serve``, ``similar_items`` of a model without factors) ranks by it and shows the rating model's
  predicted rating for the items listed;
* ``--lists auto`` is ``own`` (the old behaviour) for a named ``--method``, a non-private run, an interaction log
  (``ials`` is then the method), a store of fewer users (released count) than :data:`LISTS_MIN_USERS` (``ials``
  keeps its chart there at these shares: 600 users x 10,000 items), and a run with ``--checkpoint`` (the
  ``ials`` part keeps none). ``--warm-start MODEL`` warms both parts: the ``ials`` one from MODEL's lists part
  when MODEL listed by one (at its rank, a quarter of the iterations, its released choice reused), else cold.

Design notes (the single lists tried, the shares measured, the cost): docs/design-notes.md#streamdpmethods_listspy.
"""

from __future__ import annotations

import math
import numpy as np

from streamdp.errors import ParameterError
from streamdp.manifest import LISTS_PREFIX

__all__ = ["LISTS_CHOICES", "LISTS_SHARE", "LISTS_SHARE_BIASES", "LISTS_MIN_USERS", "ListsPart", "lists_part_for",
           "attach", "PREFIX"]

#: ``--lists`` values: ``auto`` (``ials`` for a private default run on a rating store, else ``own``), ``own`` (the
#: method's own list score), ``ials`` (an ``ials`` part trained in the same release).
LISTS_CHOICES = ("auto", "own", "ials")
#: The ``ials`` part's epsilon, as a share of the run's (``--lists-share``), where the rating model plans factors
#: (their lists may be good, and its RMSE needs the budget) and where it plans item biases only (one list for all;
#: the biases' RMSE barely moves with epsilon).
LISTS_SHARE, LISTS_SHARE_BIASES = 0.2, 0.45
#: ``--lists auto`` trains a lists part from this many users (the released count): below it ``ials`` keeps its
#: chart at the shares above, and the rating model's own lists cost nothing.
LISTS_MIN_USERS = 5_000
#: The prefix of the ``ials`` part's arrays in the model's ``factors.zarr`` (declared in :mod:`streamdp.manifest`).
PREFIX = LISTS_PREFIX
#: The rating methods a lists part can be trained with.
WITH = ("als",)


class ListsPart:
    """A run's lists part: its ``ials`` method, built once the rating model's plan knows whether it fits factors
    (:meth:`decide`, called by the rating method's plan before its calibration), and its share of the epsilon left
    after the releases made first."""

    def __init__(self, *, epsilon: float, delta: float, seed, users, catalogue, n_items: int, share: float | None,
                 requested: str):
        self._kw = dict(delta=delta, seed=seed, users=users, catalogue=catalogue)
        self.epsilon, self.n_items, self.given, self.requested = epsilon, n_items, share, requested
        self.share: float | None = None
        self._method = None
        #: The lists part of a ``--warm-start`` model (:func:`streamdp.serving.local.list_model`), when it listed:
        #: this part starts from it, at its rank (``None``: a cold part).
        self.warm = None

    def decide(self, fits_factors: bool, store) -> None:
        """Set the share (``--lists-share``, else :data:`LISTS_SHARE` or :data:`LISTS_SHARE_BIASES` by
        ``fits_factors``) and build the ``ials`` method; the first call decides (a plan is made once).

        The share is of the epsilon left once the releases made first are spent (the count of users, a private
        catalogue's and rating range's selections, which both parts share): the part's target is their epsilon
        plus the share of the rest (what :meth:`~streamdp.methods.base.Method.epsilon_after_first` leaves), so a
        store whose items are selected privately still gives the part its share."""
        if self._method is not None:
            return
        from streamdp.methods import get_method

        self.share = self.given if self.given is not None else LISTS_SHARE if fits_factors else LISTS_SHARE_BIASES
        icls = get_method("ials")
        eps = self.epsilon
        if math.isfinite(eps):
            left = icls(epsilon=eps, **self._kw).epsilon_after_first(store)
            eps = (eps - left) + self.share * left
        if self.warm is not None:  # the earlier part's rank, as an als --warm-start takes its model's
            m = icls(epsilon=eps, rank=self.warm.rank, **self._kw)
        else:
            m = icls(epsilon=eps, **self._kw)
            if m.rank > self.n_items >= 1:
                m = icls(epsilon=eps, rank=self.n_items, **self._kw)
        if self.warm is not None:
            from streamdp.methods._warm import warm_start_from

            w = warm_start_from(self.warm, store.item_ids(), method=m.name, families=icls.WARM_START_FAMILIES,
                                rank=m.rank, private=m.private)
            m.warm = None if w.starts_nothing else w
        self._method = m

    def plan(self, store):
        """The ``ials`` part's plan (made once), or a one-line :class:`ParameterError` when its share cannot pay
        for its releases (a share so small that the accountant finds no noise for it)."""
        try:
            return self.method.plan(store)
        except ParameterError as exc:
            if not str(exc).startswith("calibration:"):
                raise
            raise ParameterError(f"--lists-share {self.share:g}: the ials part's epsilon {self.method.epsilon:.4g} "
                                 f"does not pay for its releases; give a larger share") from None

    @property
    def method(self):
        if self._method is None:
            raise RuntimeError("the lists part is used before the rating model's plan decided it")
        return self._method


def check_share(share) -> float:
    """``--lists-share`` checked: a number in (0, 1)."""
    try:
        s = float(share)
    except (TypeError, ValueError):
        raise ParameterError(f"--lists-share must be a number in (0, 1), got {share!r}") from None
    if not 0.0 < s < 1.0:
        raise ParameterError(f"--lists-share must be in (0, 1) (the ials part's share of the epsilon left after the "
                             f"count of users), got {share}")
    return s


def lists_part_for(cls, store, *, lists: str, share, epsilon: float, delta: float, seed, users, catalogue,
                   defaulted: bool, checkpoint=None) -> ListsPart | None:
    """The run's lists part, or ``None`` (the method's own lists). ``lists`` is a :data:`LISTS_CHOICES` value;
    ``defaulted``: no ``--method`` was given; ``users``: the run's :class:`~streamdp.privacy.users.UserCount`
    (released or declared). Refused (one line) where ``ials`` is asked for and cannot be."""
    if lists not in LISTS_CHOICES:
        raise ParameterError(f"--lists must be one of {', '.join(LISTS_CHOICES)}, got {lists!r}")
    share = None if share is None else check_share(share)
    if lists == "own":
        return None
    implicit = bool(getattr(store, "implicit", False))
    if lists == "auto":
        if not (defaulted and cls.name in WITH and not implicit and math.isfinite(epsilon) and not checkpoint
                and users.n >= LISTS_MIN_USERS):
            return None
    else:
        if cls.name not in WITH:
            raise ParameterError(f"--lists ials: --method {cls.name} takes no lists part (it is trained with "
                                 f"{', '.join(WITH)}; --method ials lists by itself)")
        if implicit:
            raise ParameterError(f"--lists ials: {store.path} is an interaction log; train --method ials on it")
        if checkpoint:
            raise ParameterError("--lists ials: the ials part keeps no --checkpoint; drop one of the two")
    return ListsPart(epsilon=epsilon, delta=delta, seed=seed, users=users, catalogue=catalogue,
                     n_items=int(store.n_items), share=share, requested=lists)


def _uses_part(part_info: dict, private: bool = True) -> tuple[bool, str]:
    """Whether the model lists by the ``ials`` part, and why (released values only: post-processing)."""
    choice = "private choice" if private else "choice (exact: non-private)"
    if part_info.get("factors_released"):
        return True, f"the ials part's {choice} kept its factors"
    return False, f"the ials part's {choice} kept its chart: the rating model's own lists are kept"


def attach(fitted, part_fit, part: ListsPart) -> dict:
    """Put the lists part into ``fitted`` (the rating model, before it is saved): ``model.json``'s ``lists`` and,
    when used, the part's arrays as ``lists_*``; its contribution bounds into the ledger's ``bounds['lists']``.
    Returns ``model.json``'s ``lists``."""
    from streamdp.manifest import check_release
    from streamdp.serving.local import default_list_scorer

    if not np.array_equal(np.asarray(fitted.item_ids), np.asarray(part_fit.item_ids)):
        raise RuntimeError("the lists part was trained on other items than the rating model")  # one catalogue: never
    pinfo = dict(part_fit.model_info)
    if "list_scorer" not in pinfo:
        pinfo["list_scorer"] = default_list_scorer(pinfo, part_fit.extras)
    used, why = _uses_part(pinfo, math.isfinite(part.method.epsilon))
    check_release(pinfo, {"epsilon": fitted.ledger.epsilon}, [], [])  # its fields, as a model.json of its own
    lists = {"method": part.method.name, "share": part.share, "epsilon": part.method.epsilon, "used": used,
             "why": why, "requested": part.requested, "warm_started": part.method.warm is not None}
    if used:
        lists.update(model=pinfo, global_mean=float(part_fit.global_mean),
                     extras=sorted(part_fit.extras))
        fitted.extras[PREFIX + "item_factors"] = np.asarray(part_fit.item_factors, np.float32)
        fitted.extras[PREFIX + "item_bias"] = np.asarray(part_fit.item_bias, np.float32)
        names = [PREFIX + "item_factors", PREFIX + "item_bias"]
        for name, arr in part_fit.extras.items():
            fitted.extras[PREFIX + name] = arr
            if name in part_fit.per_item_extras:
                names.append(PREFIX + name)
        fitted.per_item_extras = tuple(fitted.per_item_extras) + tuple(names)
    fitted.model_info["lists"] = lists
    bounds = {k: v for k, v in part_fit.ledger.bounds.items() if k != "releases"}
    fitted.ledger.bounds["lists"] = {"method": part.method.name, "epsilon_alone": part.method.epsilon, **bounds}
    if part_fit.owner:
        fitted.owner["lists"] = part_fit.owner
    return lists
