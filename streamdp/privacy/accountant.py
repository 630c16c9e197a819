"""The one accountant wrapper: dp-accounting's PLD accountant, with RDP as a cross-check.

:func:`epsilon_of` composes an event (built with :mod:`streamdp.privacy.events`)
and reports ``epsilon`` at ``delta`` from the **PLD** accountant
(``dp_accounting.pld.PLDAccountant``) and, beside it, from the **RDP** accountant
(``dp_accounting.rdp.RdpAccountant``). Composition is always done by
dp-accounting; nothing here adds epsilons by hand. Also here: :func:`pld_grid`,
:func:`check_calibratable` and :data:`MAX_EPSILON`, :func:`parse_epsilon`,
:func:`check_privacy_params`, :class:`AccountingResult`.

Neighbouring relation: add/remove one user and all of their ratings
(``NeighborRel.ADD_OR_REMOVE_ONE``); the event's sensitivities must be user-level
(after trimming and clipping, :mod:`streamdp.privacy.bounding`).

Decisions a reader must know:

* the PLD's epsilon is an **upper bound** (its grid rounds pessimistically);
  :func:`pld_grid` sets the width from RDP's epsilon (``GRID_REL * max(epsilon_rdp, 1)``, ``GRID_REL = 1e-3``,
  relative, so memory does not grow with epsilon), at most 1/50 of the smallest Laplace
  epsilon, and aligned so that pure-DP releases are represented exactly;
* pure-DP events above 500 and any PLD that overflows float64 are reported as ``inf``
  (a valid upper bound); calibration refuses targets above :data:`MAX_EPSILON` = 500,
  where dp-accounting's answers stop being monotone; a non-private run is ``--epsilon inf``;
* RDP is reported beside PLD as a cross-check: it is looser by a known gap (measured
  3-12 % for Gaussians) and never below; the tests require ``pld <= rdp <= 1.25 pld``;
* pure epsilon-DP events (:class:`~streamdp.privacy.events.PureDpEvent`, Huber) are
  accounted through their dominating pair, binary randomized response, exact for
  ``delta = 0``.

Design notes (the grid's accuracy and measurements, the overflow limits, the RDP gap,
the pure-DP dominating pair): docs/design-notes.md#streamdpprivacyaccountantpy.
"""

from __future__ import annotations

import functools
import math
import re
import sys

import dp_accounting
import numpy as np
from dp_accounting import dp_event as _dpe
from dp_accounting.pld import common as _pld_common
from dp_accounting.pld import pld_privacy_accountant as _pld_acc
from dp_accounting.pld import privacy_loss_distribution as _pld
from dp_accounting.rdp import rdp_privacy_accountant as _rdp_acc

from streamdp.errors import ParameterError
from streamdp.privacy.events import DeltaDpEvent, PureDpEvent
from streamdp.privacy.result import (
    BOUNDED_ROW_CHANGE_RELATION,
    DP_ACCOUNTING_VERSION,
    NEIGHBOURING_RELATION,
    AccountingResult,
)

__all__ = [
    "NEIGHBOURING_RELATION",
    "BOUNDED_ROW_CHANGE_RELATION",
    "DP_ACCOUNTING_VERSION",
    "MAX_EPSILON",
    "AccountingResult",
    "check_calibratable",
    "check_privacy_params",
    "parse_epsilon",
    "epsilon_of",
    "pld_accountant",
    "pld_epsilon",
    "pld_grid",
    "rdp_accountant",
    "rdp_at_order",
    "rdp_epsilon",
    "filter_orders",
]

_REL = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE


#: The largest target epsilon noise is calibrated for (module docstring, "What the accountant can resolve").
MAX_EPSILON = 500.0

#: Pure-DP events above this epsilon are accounted as non-private (epsilon = inf):
#: dp-accounting's pessimistic PLD overflows computing exp(epsilon).
_MAX_PURE_EPSILON = MAX_EPSILON


def _pure_epsilons(event) -> list[float]:
    """The epsilons of the :class:`PureDpEvent` inside ``event``."""
    if isinstance(event, PureDpEvent):
        return [float(event.epsilon)]
    if isinstance(event, _dpe.SelfComposedDpEvent):
        return _pure_epsilons(event.event)
    if isinstance(event, _dpe.ComposedDpEvent):
        return [e for sub in event.events for e in _pure_epsilons(sub)]
    return []


def _releases(event, kind) -> int:
    """How many releases of ``kind`` ``event`` composes (a self-composition counts its repetitions)."""
    if isinstance(event, kind):
        return 1
    if isinstance(event, _dpe.SelfComposedDpEvent):
        return event.count * _releases(event.event, kind)
    if isinstance(event, _dpe.ComposedDpEvent):
        return sum(_releases(sub, kind) for sub in event.events)
    inner = getattr(event, "event", None)
    return _releases(inner, kind) if isinstance(inner, _dpe.DpEvent) else 0


def _laplace_epsilons(event) -> list[float]:
    """Per-release epsilons ``1 / noise_multiplier`` of the Laplace events inside ``event``."""
    if isinstance(event, _dpe.LaplaceDpEvent):
        return [1.0 / event.noise_multiplier] if event.noise_multiplier > 0 else []
    if isinstance(event, _dpe.SelfComposedDpEvent):
        return _laplace_epsilons(event.event)
    if isinstance(event, _dpe.ComposedDpEvent):
        return [e for sub in event.events for e in _laplace_epsilons(sub)]
    return []


#: The PLD grid's width relative to the answer (:func:`pld_grid`). 1e-3 rather than 1e-4: a Gaussian's PLD has
#: about 2 10^3 points instead of 2 10^4, six times faster to build (most of what a small store's training run
#: and the test suite spent), and the epsilon, still an upper bound, moves by about 1e-5 relative (measured:
#: five Gaussians and a repeated one at delta 1e-6, 2.253444 on the finer grid, 2.253472 on this one).
GRID_REL = 1e-3


def pld_grid(event, scale: float) -> float:
    """The PLD ``value_discretization_interval`` for ``event`` whose epsilon is about ``scale``.

    ``GRID_REL * max(scale, 1)`` (relative: bounded memory at any epsilon). Each Laplace repetition is
    rounded up by up to one grid width: beside Gaussians the width is divided by their number (together
    they add at most ``GRID_REL`` of the answer); an event of Laplace (and pure) releases only, whose PLDs
    are cheap, keeps the finer ``1e-4 * max(scale, 1)``, at most 1/50 of the smallest per-release Laplace
    epsilon (so one Laplace calibrates to ``b = sensitivity / epsilon`` to four digits). Then shrunk so
    that the largest pure epsilon lies on the grid, where dp-accounting's
    randomized-response PLD is exact (no rounding at all, however many repetitions).
    """
    base = max(float(scale), 1.0) if math.isfinite(scale) else 1.0
    interval = GRID_REL * base
    lap = _laplace_epsilons(event)
    if lap:
        if not _releases(event, _dpe.GaussianDpEvent):  # Laplace and pure only: cheap PLDs, the fine grid
            interval = min(1e-4 * base, min(lap) / 50.0)
        else:  # each Laplace repetition rounds up by a width at most: all of them by GRID_REL of the answer
            interval = GRID_REL * base / _releases(event, _dpe.LaplaceDpEvent)
        interval = max(interval, 1e-7)
    eps = [e for e in _pure_epsilons(event) if 0 < e <= _MAX_PURE_EPSILON]
    if eps:
        e = max(eps)
        k0 = max(1, math.ceil(e / interval - 1e-9))
        for k in range(k0, k0 + 256):  # dp-accounting rounds ceil(+-e / grid): e / grid must be exactly k
            cand = e / k
            for _ in range(4):
                q = e / cand
                if q == k:
                    return cand
                cand = math.nextafter(cand, math.inf if q > k else -math.inf)
    return interval


def _rr_noise_parameter(epsilon: float) -> float:
    """Noise parameter p of binary randomized response that is exactly epsilon-DP."""
    return 2.0 / (1.0 + math.exp(epsilon))


class _PLDAccountant(_pld_acc.PLDAccountant):
    """dp-accounting's PLD accountant that also understands :class:`PureDpEvent`.

    Its float64 overflows (losses above ~709.78) make it return inf, an upper bound;
    numpy's warnings about them are silenced (they would be printed to the user).
    """

    def get_epsilon(self, target_delta: float) -> float:
        with np.errstate(over="ignore", divide="ignore"):
            return super().get_epsilon(target_delta)

    def _maybe_compose(self, event, count, do_compose):
        with np.errstate(over="ignore", divide="ignore"):
            return self._maybe_compose_pure(event, count, do_compose)

    def _maybe_compose_pure(self, event, count, do_compose):
        if isinstance(event, PureDpEvent):
            if do_compose and event.epsilon > _MAX_PURE_EPSILON:
                self._contains_non_dp_event = True  # exp(eps) overflows: report inf, an upper bound
            elif do_compose:
                pld = _pld.from_privacy_parameters(
                    _pld_common.DifferentialPrivacyParameters(float(event.epsilon), 0.0),
                    value_discretization_interval=self._value_discretization_interval)
                self._pld = self._pld.compose(pld.self_compose(count) if count > 1 else pld)
            return None
        if isinstance(event, DeltaDpEvent):
            if do_compose:
                pld = _pld.from_privacy_parameters(
                    _pld_common.DifferentialPrivacyParameters(0.0, float(event.delta)),
                    value_discretization_interval=self._value_discretization_interval)
                self._pld = self._pld.compose(pld.self_compose(count) if count > 1 else pld)
            return None
        return super()._maybe_compose(event, count, do_compose)


#: The leaf events whose RDP vector is ``count`` times a function of the event alone (dp-accounting's own
#: ``_maybe_compose`` multiplies by the count for each of them): :func:`_leaf_rdp` computes it once per process.
_MEMO_LEAVES = (_dpe.GaussianDpEvent, _dpe.LaplaceDpEvent, _dpe.PoissonSampledDpEvent, PureDpEvent)


@functools.lru_cache(maxsize=4096)
def _leaf_rdp(event, orders: tuple) -> np.ndarray:
    """The RDP vector over ``orders`` of one ``event`` (a :data:`_MEMO_LEAVES` leaf), read-only and shared.

    The same few releases are composed again and again: every ledger, every calibration step and every
    budget check recomposes its history, and the pure-DP leaf (randomized response at ~100 orders through
    ``logsumexp``) and the subsampled Gaussian cost milliseconds each. dp-accounting computes the vector;
    this only remembers it, so every sum is the same float operation as without the cache.
    """
    acc = _RdpAccountant(orders=list(orders), neighboring_relation=_REL)
    acc._compose_leaf(event, 1)
    out = acc._rdp.copy()
    out.flags.writeable = False
    return out


class _RdpAccountant(_rdp_acc.RdpAccountant):
    """dp-accounting's RDP accountant that also understands :class:`PureDpEvent` and :class:`DeltaDpEvent`.

    A ``(0, delta)`` event has no finite Renyi divergence; its delta is kept aside (``extra_delta``) and the
    conversion to ``(epsilon, delta)`` is made at ``delta - extra_delta`` (a mechanism that fails with
    probability ``delta'`` and is otherwise ``(epsilon, delta - delta')``-DP is ``(epsilon, delta)``-DP).
    """

    extra_delta = 0.0

    def get_epsilon_and_optimal_order(self, target_delta: float):
        rest = float(target_delta) - self.extra_delta
        if rest <= 0:
            return math.inf, None
        return super().get_epsilon_and_optimal_order(rest)

    def _maybe_compose(self, event, count, do_compose):
        if isinstance(event, DeltaDpEvent):
            if do_compose:
                self.extra_delta += count * float(event.delta)
            return None
        if do_compose and count > 0 and isinstance(event, _MEMO_LEAVES):  # compose() checked support first
            self._rdp += count * _leaf_rdp(event, tuple(self._orders.tolist()))
            return None
        return self._compose_leaf(event, count, do_compose)

    def _compose_leaf(self, event, count, do_compose=True):
        """dp-accounting's composition of ``event``, with :class:`PureDpEvent` as randomized response."""
        if isinstance(event, PureDpEvent):
            if do_compose and event.epsilon > _MAX_PURE_EPSILON:
                self._rdp += np.inf
            elif do_compose:
                self._rdp += count * _rdp_acc._compute_randomized_response_rdp(
                    _rr_noise_parameter(float(event.epsilon)), 2, self._orders,
                    dp_accounting.NeighboringRelation.REPLACE_ONE)
            return None
        return super()._maybe_compose(event, count, do_compose)


def pld_accountant(value_discretization_interval: float = 1e-4) -> dp_accounting.PrivacyAccountant:
    """A fresh PLD accountant (add/remove one user) that knows :class:`PureDpEvent`."""
    return _PLDAccountant(_REL, value_discretization_interval=value_discretization_interval)


def rdp_accountant() -> dp_accounting.PrivacyAccountant:
    """A fresh RDP accountant (add/remove one user, default orders) that knows :class:`PureDpEvent`."""
    return _RdpAccountant(neighboring_relation=_REL)


#: The spellings of an infinite epsilon that ask for a non-private run (case-insensitive).
INF_WORDS = ("inf", "+inf", "infinity", "+infinity")


def parse_epsilon(value, flag: str = "--epsilon") -> float:
    """``value`` (a number, or a string as typed) as an epsilon; only the literal ``inf`` means infinite.

    A string is parsed strictly: ``inf`` (and ``infinity``, with an optional ``+``, any case)
    asks for a non-private run; any other spelling that does not give a finite float is a
    one-line :class:`ParameterError` naming ``flag`` (``1e309`` overflows to ``inf`` in
    Python's ``float``: it must not silently train without noise). A number is taken as
    it is (a Python ``float('inf')`` is an explicit request). Decision: ``infinity`` is
    accepted because Python's ``float`` accepts it and it cannot be read as a finite number.
    Every epsilon a run or a budget is given passes here, so here it must be ``> 0``: ``0``, a
    negative number or ``nan`` is a one-line :class:`ParameterError` naming ``flag``, before
    anything is opened, released or charged (``0`` once divided a noise scale by zero, ``-1``
    answered about a noise multiplier). Whether noise can be calibrated for it is
    :func:`check_calibratable`'s.

    >>> parse_epsilon("1"), parse_epsilon("INF"), parse_epsilon(2)
    (1.0, inf, 2.0)
    >>> parse_epsilon("1e309")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    streamdp.errors.ParameterError: --epsilon 1e309: overflows a float (largest ...); only the literal inf is ...
    >>> parse_epsilon(0)
    Traceback (most recent call last):
    ...
    streamdp.errors.ParameterError: --epsilon: expected a positive number (or inf for a non-private run), got 0
    """
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in INF_WORDS:
            return math.inf
        try:
            x = float(text)
        except ValueError:
            raise ParameterError(f"{flag}: expected a number (or inf for a non-private run), got {value!r}") from None
        if math.isinf(x):
            raise ParameterError(f"{flag} {text}: overflows a float (largest {sys.float_info.max:.4g}); only the "
                                 f"literal inf is infinite (a non-private run)")
    elif isinstance(value, bool):
        raise ParameterError(f"{flag}: expected a number, got {value!r}")
    else:
        try:
            x = float(value)
        except (TypeError, ValueError):
            raise ParameterError(f"{flag}: expected a number (or inf for a non-private run), got {value!r}") from None
    if not x > 0:  # 0, negative, nan
        raise ParameterError(f"{flag}: expected a positive number (or inf for a non-private run), got "
                             f"{_fmt_number(x) if math.isfinite(x) else x}")
    return x


def check_privacy_params(epsilon: float, delta: float, n_users: int | None = None) -> None:
    """Raise ``ParameterError`` unless ``(epsilon, delta)`` is a meaningful target.

    ``epsilon`` must be > 0 (``inf`` is allowed and means a non-private run, which
    the caller must label ``GUARANTEE_NONE``); ``0 < delta < 1``; with ``n_users``,
    also ``delta < 1 / n_users`` (a larger delta allows releasing a user outright).

    Examples
    --------
    >>> check_privacy_params(1.0, 1e-6, n_users=1000)
    >>> check_privacy_params(0.0, 1e-6)
    Traceback (most recent call last):
    ...
    streamdp.errors.ParameterError: epsilon: expected a positive number (or inf for a non-private run), got 0.0
    """
    try:
        epsilon, delta = float(epsilon), float(delta)
    except (TypeError, ValueError):
        raise ParameterError(f"epsilon, delta: expected numbers, got {epsilon!r}, {delta!r}") from None
    if math.isnan(epsilon) or epsilon <= 0:
        raise ParameterError(f"epsilon: expected a positive number (or inf for a non-private run), got {epsilon}")
    if math.isnan(delta) or not 0 < delta < 1:
        raise ParameterError(f"delta: expected a number in (0, 1), got {delta}")
    if n_users is not None and n_users > 0 and delta >= 1.0 / n_users:
        raise ParameterError(f"delta: must be below 1/n_users = {1.0 / n_users:.3g} for {n_users} users, got {delta}")


def _fmt_number(x: float) -> str:
    """``x`` as a user would type it (``1e9``, ``750``, ``500.0001``, ``2.5e12``), not ``1e+09``."""
    text = f"{x:g}" if float(f"{x:g}") == x else repr(float(x))
    return re.sub(r"e([+-])0*(\d)", lambda m: "e" + ("-" if m.group(1) == "-" else "") + m.group(2), text)


def check_calibratable(epsilon: float, flag: str = "--epsilon", *,
                       instead: str = "for a non-private model use {flag} inf") -> None:
    """Raise ``ParameterError`` if noise cannot be calibrated for ``epsilon`` (above :data:`MAX_EPSILON`).

    ``inf`` passes (a non-private run needs no calibration). ``flag`` names the
    parameter in the message; ``instead`` is its advice (``{flag}`` is filled in).

    Examples
    --------
    >>> check_calibratable(500.0); check_calibratable(float("inf"))
    >>> check_calibratable(1e9)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    streamdp.errors.ParameterError: --epsilon 1e9: above what the accountant can resolve (max 500); for a ...
    """
    try:
        epsilon = float(epsilon)
    except (TypeError, ValueError):
        return  # not a number: check_privacy_params says so
    if math.isfinite(epsilon) and epsilon > MAX_EPSILON:
        raise ParameterError(f"{flag} {_fmt_number(epsilon)}: above what the accountant can resolve "
                             f"(max {MAX_EPSILON:g}); {instead.format(flag=flag)}")


def _compose_checked(accountant, event):
    if not accountant.supports(event):
        raise ParameterError(f"the accountant cannot account for the event {event!r}")
    accountant.compose(event)
    return accountant


#: PLD epsilons already computed in this process, by ``(repr(event), grid, delta)``; oldest dropped first.
_PLD_EPSILONS: dict[tuple[str, float, float], float] = {}
_PLD_EPSILONS_MAX = 4096


def pld_epsilon(event: dp_accounting.DpEvent, value_discretization_interval: float, delta: float) -> float:
    """PLD epsilon of ``event`` at ``delta`` on the grid ``value_discretization_interval``, remembered.

    Building a PLD is most of what a training run costs on a small store (a Gaussian's
    PLD takes tens of milliseconds, and a calibration asks for dozens), and the same
    events come back: a plan is made again for the ledger, a sweep repeats a point, the
    ledger re-checks the calibrated noise. The answer is a pure function of the event
    (its ``repr`` names every field, floats exactly), the grid and delta, so a repeat
    is looked up instead of recomputed: the same float as computing it again.
    """
    key = (repr(event), float(value_discretization_interval), float(delta))
    eps = _PLD_EPSILONS.get(key)
    if eps is None:
        eps = float(_compose_checked(pld_accountant(value_discretization_interval), event).get_epsilon(delta))
        if len(_PLD_EPSILONS) >= _PLD_EPSILONS_MAX:
            _PLD_EPSILONS.pop(next(iter(_PLD_EPSILONS)))
        _PLD_EPSILONS[key] = eps
    return eps


def epsilon_of(event: dp_accounting.DpEvent, delta: float, *,
               value_discretization_interval: float | None = None) -> AccountingResult:
    """Epsilon of ``event`` at ``delta``: PLD (reported) and RDP (cross-check).

    Parameters
    ----------
    event : dp_accounting.DpEvent
        The composed release (``compose`` / ``parallel`` / the ``*_event`` builders).
    delta : float
        Target delta, in (0, 1).
    value_discretization_interval : float, optional
        PLD grid width; by default relative to the answer (module docstring).

    Returns
    -------
    AccountingResult

    Examples
    --------
    >>> from streamdp.privacy.events import gaussian_event
    >>> r = epsilon_of(gaussian_event(1.0), 1e-5)
    >>> round(r.epsilon, 2), r.epsilon <= r.epsilon_rdp
    (4.38, True)
    """
    delta = float(delta)
    if math.isnan(delta) or not 0 < delta < 1:
        raise ParameterError(f"delta: expected a number in (0, 1), got {delta}")
    rdp = _compose_checked(rdp_accountant(), event)
    eps_rdp, order = rdp.get_epsilon_and_optimal_order(delta)
    eps_rdp = float(eps_rdp)
    if value_discretization_interval is None:
        scale = max(eps_rdp, 1.0) if math.isfinite(eps_rdp) else 1.0
        value_discretization_interval = pld_grid(event, scale)
    try:
        eps = pld_epsilon(event, value_discretization_interval, delta)
    except OverflowError:  # exp of a loss (or of a grid width) above 709.78: beyond float64, inf bounds it
        eps = math.inf
    return AccountingResult(epsilon=eps, epsilon_rdp=eps_rdp, delta=delta, accountant="pld",
                            value_discretization_interval=value_discretization_interval,
                            rdp_order=float(order) if order is not None else float("nan"))


def filter_orders() -> tuple:
    """dp-accounting's default RDP orders above 1.01 (below it its conversion to (epsilon, delta) is undefined)."""
    return tuple(float(a) for a in _rdp_acc.DEFAULT_RDP_ORDERS if a > 1.01)


def rdp_epsilon(alpha: float, rdp: float, delta: float) -> float:
    """The epsilon at ``delta`` of an RDP guarantee ``rdp`` at the one order ``alpha``: dp-accounting's conversion
    (``rdp_privacy_accountant.compute_epsilon``), nothing hand-rolled.

    >>> round(rdp_epsilon(8.0, 1.0, 1e-6), 4)
    2.543
    """
    if not math.isfinite(rdp):
        return math.inf
    return float(_rdp_acc.compute_epsilon([float(alpha)], [float(rdp)], float(delta))[0])


def rdp_at_order(event: dp_accounting.DpEvent, alpha: float) -> float:
    """The Renyi divergence at order ``alpha`` of ``event``, composed by dp-accounting's RDP accountant
    (pure-DP events through their dominating pair, as everywhere here). A ``(0, delta)`` event has no finite Renyi
    divergence: ``ParameterError`` (an individual Renyi filter cannot charge it).

    >>> from streamdp.privacy.events import gaussian_event
    >>> rdp_at_order(gaussian_event(2.0), 4.0)  # alpha / (2 sigma^2)
    0.5
    """
    acc = _compose_checked(_RdpAccountant(orders=[float(alpha)], neighboring_relation=_REL), event)
    if acc.extra_delta > 0:
        raise ParameterError("the release has a (0, delta) event, which has no Renyi divergence: a store with a "
                             "per-user budget cannot charge it to its users")
    return float(acc._rdp[0])
