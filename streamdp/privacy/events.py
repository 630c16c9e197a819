"""Immutable privacy events: what a mechanism spends, in terms the accountant understands.

Gaussian and Laplace releases are dp-accounting's own ``GaussianDpEvent`` /
``LaplaceDpEvent`` (noise multiplier = noise scale / sensitivity, L2 resp. L1).
The Huber mechanism is :class:`PureDpEvent` (pure epsilon-DP, exactly
``epsilon = L1 sensitivity / b``, see :mod:`streamdp.privacy.mechanisms`), which
:mod:`streamdp.privacy.accountant` teaches both accountants. Repetition is
``SelfComposedDpEvent``, sequence is ``ComposedDpEvent``.

**Parallel composition.** When the user blocks are disjoint and each user
contributes to exactly one step of a pass (a one-pass method that releases one
noisy statistic per block, or a pass whose per-block statistics are summed before
one noisy release), adding or removing one user changes only one of the steps.
The pass then costs what one step costs: :func:`parallel` returns ONE event (the
dominating one), not a composition over the number of steps.
"""

from __future__ import annotations

import math
from typing import Iterable

import attr
import dp_accounting
from dp_accounting import dp_event as _dpe

from streamdp.errors import ParameterError

__all__ = [
    "PureDpEvent",
    "DeltaDpEvent",
    "gaussian_event",
    "laplace_event",
    "huber_event",
    "pure_dp_event",
    "compose",
    "parallel",
    "event_to_dict",
    "event_from_dict",
]


@attr.s(frozen=True, slots=True, auto_attribs=True)
class PureDpEvent(dp_accounting.DpEvent):
    """A mechanism that is pure ``epsilon``-DP (e.g. the Huber mechanism).

    ``mechanism`` names it for the ledger. The accountants treat it through its
    dominating pair, binary randomized response with parameter ``epsilon``, which
    every epsilon-DP mechanism is a post-processing of (Kairouz et al. 2015); this
    is exact for the worst case and an upper bound for a particular mechanism.
    """

    epsilon: float
    mechanism: str = "pure"


@attr.s(frozen=True, slots=True, auto_attribs=True)
class DeltaDpEvent(dp_accounting.DpEvent):
    """A mechanism that is ``(0, delta)``-DP: with probability at most ``delta`` it tells the neighbours apart.

    The thresholding of a private partition selection (:mod:`streamdp.privacy.catalogue`): an item that only
    the added user rated is released with probability at most ``delta`` and otherwise nothing differs. The PLD
    accountant composes it exactly (dp-accounting's PLD of ``(0, delta)``: an infinite loss of mass ``delta``);
    the RDP accountant, which has no finite order for it, adds ``delta`` to the delta it converts at.
    """

    delta: float
    mechanism: str = "threshold"


def _positive(name: str, value: float, *, allow_zero: bool = False) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ParameterError(f"{name}: expected a number, got {value!r}") from None
    if math.isnan(value) or value < 0 or (value == 0 and not allow_zero):
        raise ParameterError(f"{name}: expected a {'non-negative' if allow_zero else 'positive'} number, got {value}")
    return value


def _count(count) -> int:
    if isinstance(count, bool) or int(count) != count or count < 1:
        raise ParameterError(f"count: expected a positive integer, got {count!r}")
    return int(count)


def _repeat(event: dp_accounting.DpEvent, count: int) -> dp_accounting.DpEvent:
    count = _count(count)
    return event if count == 1 else dp_accounting.SelfComposedDpEvent(event, count)


def gaussian_event(noise_multiplier: float, count: int = 1) -> dp_accounting.DpEvent:
    """``count`` Gaussian releases with ``sigma = noise_multiplier * L2 sensitivity``.

    ``noise_multiplier = 0`` is a non-private release (the accountant reports inf).

    Examples
    --------
    >>> gaussian_event(1.5, 3)
    SelfComposedDpEvent(event=GaussianDpEvent(noise_multiplier=1.5), count=3)
    """
    return _repeat(dp_accounting.GaussianDpEvent(_positive("noise_multiplier", noise_multiplier, allow_zero=True)),
                   count)


def laplace_event(b_over_sensitivity: float, count: int = 1) -> dp_accounting.DpEvent:
    """``count`` Laplace releases with scale ``b = b_over_sensitivity * L1 sensitivity``.

    Examples
    --------
    >>> laplace_event(2.0)
    LaplaceDpEvent(noise_multiplier=2.0)
    """
    return _repeat(dp_accounting.LaplaceDpEvent(_positive("b_over_sensitivity", b_over_sensitivity,
                                                          allow_zero=True)), count)


def pure_dp_event(epsilon: float, count: int = 1, *, mechanism: str = "pure") -> dp_accounting.DpEvent:
    """``count`` releases of a pure ``epsilon``-DP mechanism."""
    epsilon = _positive("epsilon", epsilon, allow_zero=True)
    if epsilon == 0:
        return dp_accounting.NoOpDpEvent()
    return _repeat(PureDpEvent(epsilon, mechanism), count)


def huber_event(epsilon: float, count: int = 1) -> dp_accounting.DpEvent:
    """``count`` Huber-mechanism releases, each pure ``epsilon``-DP (``epsilon = Δ_1 / b``).

    Examples
    --------
    >>> huber_event(0.5)
    PureDpEvent(epsilon=0.5, mechanism='huber')
    """
    return pure_dp_event(epsilon, count, mechanism="huber")


def compose(events: Iterable[dp_accounting.DpEvent]) -> dp_accounting.DpEvent:
    """Sequential composition of ``events`` (a single event is returned as is).

    Examples
    --------
    >>> compose([gaussian_event(1.0), huber_event(0.1)])  # doctest: +ELLIPSIS
    ComposedDpEvent(events=[GaussianDpEvent(noise_multiplier=1.0), PureDpEvent(...)])
    """
    events = [e for e in events if not isinstance(e, _dpe.NoOpDpEvent)]
    for e in events:
        if not isinstance(e, dp_accounting.DpEvent):
            raise ParameterError(f"compose: expected DpEvents, got {type(e).__name__}")
    if not events:
        return dp_accounting.NoOpDpEvent()
    if len(events) == 1:
        return events[0]
    return dp_accounting.ComposedDpEvent(list(events))


def parallel(events: Iterable[dp_accounting.DpEvent]) -> dp_accounting.DpEvent:
    """Parallel composition over disjoint user blocks: ONE event, the dominating one.

    Valid when each user contributes to exactly one of the ``events`` (disjoint
    user blocks, each user in one step). The result is the event that dominates
    all the others: equal events give that event; Gaussian or Laplace events give
    the one with the smallest noise multiplier; pure-DP events the largest epsilon.
    Mixed kinds have no single dominating event and raise ``ParameterError``.

    Examples
    --------
    >>> parallel([gaussian_event(2.0)] * 100)
    GaussianDpEvent(noise_multiplier=2.0)
    >>> parallel([gaussian_event(2.0), gaussian_event(1.5)])
    GaussianDpEvent(noise_multiplier=1.5)
    """
    events = list(events)
    if not events:
        return dp_accounting.NoOpDpEvent()
    first = events[0]
    if all(e == first for e in events):
        return first
    kinds = {type(e) for e in events}
    if kinds == {dp_accounting.GaussianDpEvent} or kinds == {dp_accounting.LaplaceDpEvent}:
        return min(events, key=lambda e: e.noise_multiplier)
    if kinds == {PureDpEvent}:
        return max(events, key=lambda e: e.epsilon)
    raise ParameterError("parallel: the events of the blocks differ in kind, so none dominates the others; "
                         "give every block the same mechanism")


def event_to_dict(event: dp_accounting.DpEvent) -> dict:
    """A JSON-ready dict of ``event`` and everything nested in it (for the ledger).

    Examples
    --------
    >>> event_to_dict(gaussian_event(1.0, 2))
    {'name': 'SelfComposedDpEvent', 'event': {'name': 'GaussianDpEvent', 'noise_multiplier': 1.0}, 'count': 2}
    """
    out = {"name": type(event).__name__}
    for f in attr.fields(type(event)):
        v = getattr(event, f.name)
        if isinstance(v, dp_accounting.DpEvent):
            v = event_to_dict(v)
        elif isinstance(v, (list, tuple)):
            v = [event_to_dict(x) if isinstance(x, dp_accounting.DpEvent) else x for x in v]
        out[f.name] = v
    return out


def event_from_dict(d: dict) -> dp_accounting.DpEvent:
    """Inverse of :func:`event_to_dict` (dp-accounting's events and :class:`PureDpEvent`).

    Examples
    --------
    >>> e = compose([gaussian_event(1.0, 2), huber_event(0.3)])
    >>> event_from_dict(event_to_dict(e)) == e
    True
    """
    d = dict(d)
    name = d.pop("name", None)
    cls = {"PureDpEvent": PureDpEvent, "DeltaDpEvent": DeltaDpEvent}.get(str(name)) or getattr(_dpe, str(name), None)
    if not (isinstance(cls, type) and issubclass(cls, dp_accounting.DpEvent)):
        raise ParameterError(f"unknown privacy event {name!r}")
    kwargs = {}
    for k, v in d.items():
        if isinstance(v, dict) and "name" in v:
            v = event_from_dict(v)
        elif isinstance(v, list):
            v = [event_from_dict(x) if isinstance(x, dict) and "name" in x else x for x in v]
        kwargs[k] = v
    return cls(**kwargs)
