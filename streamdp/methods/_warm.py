"""``train --warm-start MODEL``: a refresh that starts its item factors from a model released earlier.

A released model's item factors and item biases are public once released (their cost is in
the store's budget already), so starting a new run from them is post-processing: the new
run's releases and its ledger's epsilon are those of a cold run with the same settings.
What the earlier release costs the users stays where it was recorded (the store's budget,
the earlier model's ``privacy.json``); the new model names the model it started from.

Items are matched by their ORIGINAL ids (the model's ``item_ids`` against the store's): an
item of the store the model does not hold starts as a cold run starts it (its random row,
a zero bias), an item of the model the store lacks is dropped; an item whose released row is
zero (the model fitted no factor for it) starts cold too.

Two more things the model released stand in a private refresh (``methods/als.py``): its
global mean centres a one-rating user's residual in the statistics pass (no pass of its own
for the new mean), and its ``--select auto`` choice of factors is released again instead of
choosing (no selection pass or release): :func:`released_choice`. Public names:
:class:`WarmStart`, :func:`warm_start_from`, :func:`initial_factors`, :func:`released_choice`,
:func:`released_chart_choice` (ials' choice of its factors over the chart, reused as als' is:
``methods/ials.py``), :data:`WARM_ITERS_FRACTION`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from streamdp.errors import ParameterError
from streamdp.serving.local import factors_released
from streamdp.storage.ids import as_ids, find

#: ``--iters`` by default under ``--warm-start``: this fraction of the cold default, rounded up (at least 1 when the
#: cold default fits factors). Measured in docs/design-notes.md, section ``streamdp/methods/_warm.py``.
WARM_ITERS_FRACTION = 0.25


@dataclass(frozen=True)
class WarmStart:
    """The earlier model's item side in the store's item order: ``factors`` ``(n_items, k)``, ``bias`` ``(n_items,)``
    and ``matched`` (which of the store's items the model holds; the other rows are zeros and unused)."""

    path: str
    method: str
    factors: np.ndarray
    bias: np.ndarray
    matched: np.ndarray
    #: The model's items the store lacks (dropped).
    dropped: int
    #: Whether the model released item factors (:func:`~streamdp.serving.local.factors_released`); without them no
    #: item starts warm.
    released: bool = True
    #: The model's run id and budget entry (``model.json``), to name it.
    run_id: str | None = None
    budget_entry: str | None = None
    #: The model's released global mean (public): the centre of a one-rating user's residual in the refresh's
    #: statistics pass, which then releases the new global mean from its own sums (no pass of its own).
    global_mean: float | None = None
    #: The model's released choice ``(kind, local ridge)`` (``selection.chosen`` of ``model.json``) when it chose its
    #: factors: a private refresh reuses it instead of releasing a choice of its own (:func:`reused_choice`).
    choice: tuple | None = None
    #: An ials model's released choice of its factors over the chart (:func:`released_chart_choice`): ``(chosen,
    #: chart_below)``, which a private ials refresh reuses (``IALS._reused_choice``); ``None`` when it made none.
    chart_choice: tuple | None = None

    @property
    def rank(self) -> int:
        return int(self.factors.shape[1])

    @property
    def starts_nothing(self) -> bool:
        """True when no item of the store starts from the model (it released no item factors, or holds none of the
        store's items with a factor): the run is then a cold run (``train`` drops the warm start and says so)."""
        return not bool(np.any(self.matched))

    def cold_reason(self) -> str:
        """Why :attr:`starts_nothing`, in words for ``train``'s summary."""
        if not self.released:
            return "it released no item factors (item biases or a chart only)"
        return "none of the store's items has a released factor row in it"

    def describe(self) -> dict:
        """What ``model.json`` records of the warm start (``warm_start``)."""
        return {"model": self.path, "method": self.method, "run_id": self.run_id, "budget_entry": self.budget_entry,
                "items_matched": int(self.matched.sum()), "items_new": int((~self.matched).sum()),
                "items_dropped": int(self.dropped),
                "privacy": "post-processing of the model's released item factors and biases: no privacy cost "
                           "here (the model's own release is counted where it was recorded)"}

    def note(self) -> str:
        """The ledger's note (``privacy.json``)."""
        return (f"warm start from the model {self.path} ({self.method}, run {self.run_id}): its released item factors "
                f"replace the random initial factors of the {int(self.matched.sum())} items it shares with the store "
                f"by item id ({int((~self.matched).sum())} new items start cold, {self.dropped} of its items dropped); "
                f"using a released model is post-processing, free in privacy: the epsilon of this release is that "
                f"of a cold run with the same settings (the earlier model's release is counted in the store's budget "
                f"where it was recorded)")


def warm_start_from(model, store_item_ids, *, method: str, families: tuple, rank: int, private: bool) -> WarmStart:
    """The :class:`WarmStart` of ``model`` (a path or a loaded :class:`~streamdp.serving.model.Model`) for a run of
    ``method`` at ``rank`` on a store of items ``store_item_ids``; a one-line :class:`ParameterError` when the model
    cannot start it.

    Refused: a path that is not a model, a model of a method outside ``families`` or (when it released factors) of
    another rank, a model whose item ids are of another kind than the store's, and a non-private model for a private
    run (its factors would carry the ratings, unprotected, into a release labelled private).

    A model that released no item factors (item biases or a chart: ``--select auto`` chose them, or too few users
    per item) gives a warm start that starts no item (:attr:`WarmStart.starts_nothing`). Decision: ``train`` then
    runs cold and says so, rather than refusing: a weekly refresh names the model released the week before, and
    whether that one fitted factors is the release's own (private) choice; every item of such a model is in the
    position of a new item, which starts cold.
    """
    from streamdp.errors import StreamdpError
    from streamdp.serving.model import Model, load_model

    if isinstance(model, Model):
        m = model
    else:
        path = os.fspath(model)
        try:
            m = load_model(path)
        except StreamdpError as exc:
            raise ParameterError(f"--warm-start {path}: not a model ({exc})") from None
    where = f"--warm-start {m.path}"
    if m.method not in families:
        raise ParameterError(f"{where}: a model of --method {m.method}, which cannot start --method {method} "
                             f"(it needs a model of {' or '.join(families)})")
    released = factors_released(m)
    if released and m.rank != rank:
        raise ParameterError(f"{where}: a model of rank {m.rank}, this run's rank is {rank} (give --rank {m.rank} or "
                             f"leave --rank out)")
    V = np.asarray(m.item_factors)[:, :rank] if released else np.zeros((len(m.item_ids), rank))
    eps = m.info.get("epsilon")
    if private and (eps == "inf" or (isinstance(eps, (int, float)) and math.isinf(eps))):
        raise ParameterError(f"{where}: a non-private model (epsilon inf) cannot start a private run (its factors "
                             f"would carry the ratings unprotected into the release)")
    ids, mine = as_ids(store_item_ids), as_ids(m.item_ids)
    if len(ids) and len(mine) and ids.dtype != mine.dtype:
        kind = {True: "integer", False: "string"}
        raise ParameterError(f"{where}: its item ids are {kind[mine.dtype.kind == 'i']} ids, the store's are "
                             f"{kind[ids.dtype.kind == 'i']} ids")
    pos = find(mine, ids) if len(mine) else np.full(len(ids), -1, np.int64)
    # an item whose released row is zero (not among the model's factored items) starts cold, as a new one
    matched = pos >= 0
    matched[matched] = np.any(V[pos[matched]] != 0, axis=1)
    n, k = len(ids), V.shape[1]
    factors = np.zeros((n, k), np.float64)
    bias = np.zeros(n, np.float64)
    factors[matched] = V[pos[matched]]
    bias[matched] = np.asarray(m.item_bias, np.float64)[pos[matched]]
    if not np.all(np.isfinite(factors)) or not np.all(np.isfinite(bias)):
        raise ParameterError(f"{where}: its item factors or biases are not all finite")
    mu = float(m.global_mean) if m.global_mean is not None and math.isfinite(float(m.global_mean)) else None
    return WarmStart(path=str(m.path), method=m.method, factors=factors, bias=bias, matched=matched,
                     dropped=int(len(mine) - (pos >= 0).sum()), released=released, run_id=m.info.get("run_id"),
                     budget_entry=m.info.get("budget_entry"), global_mean=mu, choice=released_choice(m.info),
                     chart_choice=released_chart_choice(m.info) if m.method == "ials" else None)


def released_choice(info: dict) -> tuple | None:
    """The factor candidate ``("factors", local ridge)`` a model's ``--select auto`` released (``model.json``'s
    ``selection.chosen``) for a refresh to reuse, or ``None`` (no choice released, biases won, or the factors were
    kept without leading).

    Decision: the choice keeps its default (the factors) unless another candidate's noisy loss is lower by
    :data:`~streamdp.methods._selection.MARGIN` noise standard deviations; a refresh that reused such a choice
    froze what was only a lack of evidence: on issue 43's weekly replay (training seed 2) the first refresh kept
    the factors with the item biases' noisy loss 238 below theirs (3,518 against 3,280), and every later refresh
    reused it, at a next-week RMSE of 1.099 averaged over 20 weeks where choosing afresh gave 1.054 (and
    Recall@10 0.184 against 0.188). So a choice is reused only when the factors' own noisy loss was the lowest of
    the released ones (below every candidate without factors); otherwise the refresh chooses afresh. A reused
    choice records no losses and is reused again: it descends from one whose factors led.

    >>> released_choice({"selection": {"chosen": "factors, ridge 30"}})
    ('factors', 30.0)
    >>> released_choice({"selection": {"chosen": "bias, ridge 3"}}) is None
    True
    >>> kept = {"chosen": "factors, ridge 10", "candidates": ["factors, ridge 10", "bias, ridge 3"]}
    >>> released_choice({"selection": {**kept, "noisy_validation_losses": [3280.0, 3518.0]}})
    ('factors', 10.0)
    >>> released_choice({"selection": {**kept, "noisy_validation_losses": [3518.0, 3280.0]}}) is None
    True
    """
    sel = info.get("selection") or {}
    chosen = sel.get("chosen")
    if not isinstance(chosen, str) or not chosen.startswith("factors, ridge "):
        return None
    if not _factors_led(sel):
        return None
    try:
        lam = float(chosen[len("factors, ridge "):])
    except ValueError:
        return None
    return ("factors", lam) if math.isfinite(lam) and lam > 0 else None


def _factors_led(sel: dict) -> bool:
    """Whether a released choice's noisy losses put the chosen factors below every candidate without factors (true
    when it records none: a reused choice, or a record of another form)."""
    names, losses = sel.get("candidates"), sel.get("noisy_validation_losses")
    if not isinstance(names, list) or not isinstance(losses, list) or len(names) != len(losses):
        return True
    try:
        mine = float(losses[names.index(sel["chosen"])])
        others = [float(v) for n, v in zip(names, losses) if not str(n).startswith("factors")]
    except (ValueError, TypeError):
        return True
    return all(mine < v for v in others)


def released_chart_choice(info: dict) -> tuple | None:
    """An ials model's released choice of its factors over the chart (``model.json``'s ``selection``): ``(chosen,
    chart_below)``, ``chart_below`` the training items below which a user lists the chart (0: none); ``None`` when
    it chose the chart or made no choice (a choice it reused from its own warm start is passed on, as als' is).

    >>> released_chart_choice({"selection": {"chosen": "factors"}})
    ('factors', 0)
    >>> released_chart_choice({"selection": {"chosen": "factors for users of 5 or more ...", "chart_below": 5}})
    ('factors for users of 5 or more ...', 5)
    >>> released_chart_choice({"selection": {"chosen": "chart by the released counts"}}) is None
    True
    """
    sel = info.get("selection") or {}
    chosen, below = sel.get("chosen"), sel.get("chart_below", 0)
    if not isinstance(chosen, str) or not chosen.startswith("factors"):
        return None
    if isinstance(below, bool) or not isinstance(below, int) or below < 0:
        return None
    return chosen, below


def initial_factors(cold: np.ndarray, warm: WarmStart | None) -> np.ndarray:
    """The initial item factors: ``cold`` (the cold run's random draw, ``(n_items, k)``) with every row the warm start
    holds replaced by the model's (items new to the store keep their cold row).

    >>> w = WarmStart("m", "als", np.array([[1.0, 2.0], [0.0, 0.0]]), np.zeros(2), np.array([True, False]), 0)
    >>> initial_factors(np.full((2, 2), 9.0), w).tolist()
    [[1.0, 2.0], [9.0, 9.0]]
    """
    if warm is None:
        return cold
    out = np.array(cold, np.float64, copy=True)
    out[warm.matched] = warm.factors[warm.matched]
    return out


def warm_iters(cold_default: int) -> int:
    """``--iters`` by default under ``--warm-start``: :data:`WARM_ITERS_FRACTION` of the cold default, rounded up
    (0 stays 0: a run that fits no factors has nothing to start).

    Decision: a quarter, a public rule (the cold default comes from public parameters and
    the released profile). Measured (docs/design-notes.md, section ``streamdp/methods/_warm.py``)
    on generated stores grown by 2-3% users: a private refresh at epsilon 1 from the earlier
    model beats the cold fit's test RMSE (by 0.04-0.05) and Recall@10 at 1, 2 and 3
    iterations, and is best at 1-2: each iteration it does not run leaves its budget to the
    others, and the start already holds what the first iterations would find. A non-private
    refresh matches the cold 15 iterations from 1 on (0.7083-0.7084 against 0.7084). A
    quarter keeps a margin for a store that changed more than these (new items start cold).

    >>> [warm_iters(t) for t in (0, 5, 7, 9, 15)]
    [0, 2, 2, 3, 4]
    """
    return math.ceil(WARM_ITERS_FRACTION * cold_default)
