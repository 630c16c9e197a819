"""Noise calibration by search over the accountant, and the papers' closed forms.

:func:`calibrate` returns the smallest noise parameter ``z`` (noise scale divided by
sensitivity) whose composed event has PLD epsilon at most the target: a geometric
bracket, then dp-accounting's ``mechanism_calibration.calibrate_dp_mechanism``
(Brent's method, falling back to bisection, returning the side with a non-positive
epsilon gap), then a final check with :func:`streamdp.privacy.accountant.epsilon_of`
exactly as the ledger will compute it, nudging ``z`` up if the grids disagree. The
result therefore never overshoots the target (property-tested), and is within a
relative ``1e-5`` of the smallest such ``z`` (so the epsilon spent prints as the target).

The result is rounded up to :data:`Z_BITS` significant bits (a relative step of at
most ``2^-19``, about ``2e-6``: inside the search's ``1e-5``; rounding up only adds
noise, so it never overshoots). That makes it the same number on every machine:
the accountant's arithmetic (NumPy's and SciPy's ``exp``/``log``, whose last bits
depend on the CPU's SIMD path: AVX-512 or AVX2 give different ones) moves the search's
answer by about ``1e-11`` relative, which moved every noisy release, and so every
seeded model, with the machine. A rounded ``z`` changes only when the search's
answer falls within that distance of a rounding step (a chance of about ``1e-5``). The bracket comes from the RDP
accountant first (an upper bound on PLD's epsilon, microseconds per evaluation even
where PLD is slow), so only noise levels near the answer are ever given to PLD.

Targets above :data:`~streamdp.privacy.accountant.MAX_EPSILON` (500) are refused
with a one-line ``ParameterError`` (:func:`~streamdp.privacy.accountant.check_calibratable`):
dp-accounting overflows there. Up to it a calibration takes well under a second and
about 10^4 PLD grid points (the grid is relative to the target); ``--epsilon 1e9``
asked for a 135 GiB array before.

The closed forms of Jain, Thakkar & Thakurta (ICML 2018, ../shared/seeds/000) are
kept for comparison and for ``--calibration paper`` (:func:`paper_sigma_jain`).
"""

from __future__ import annotations

import math
from typing import Callable

import dp_accounting
from dp_accounting import mechanism_calibration as _mc

from streamdp.errors import ParameterError
from streamdp.privacy.accountant import (check_calibratable, check_privacy_params, epsilon_of, pld_epsilon,
                                         pld_grid, rdp_accountant)
from streamdp.privacy.events import gaussian_event, huber_event, laplace_event

__all__ = ["calibrate", "calibrate_bound", "calibrate_gaussian", "calibrate_laplace", "calibrate_huber",
           "paper_sigma_jain"]

_REL_TOL = 1e-5
#: Significant bits kept of a calibrated noise parameter (rounded up): see the module docstring.
Z_BITS = 20


def _bracket(gap: Callable[[float], float], z: float, epsilon: float, factor: float = 2.0) -> tuple[float, float]:
    """``(lower, upper)`` around the root of the decreasing ``gap``: gap(lower) > 0 >= gap(upper)."""
    if gap(z) > 0:
        lo = z
        for _ in range(80):
            z *= factor
            if gap(z) <= 0:
                return lo, z
            lo = z
        raise ParameterError(f"calibration: no noise level up to {z:.3g} reaches epsilon={epsilon}")
    hi = z
    for _ in range(80):
        z /= factor
        if gap(z) > 0:
            return z, hi
        hi = z
    raise ParameterError(f"calibration: epsilon={epsilon} is met even with noise {z:.3g}")


def calibrate(make_event: Callable[[float], dp_accounting.DpEvent], epsilon: float, delta: float, *,
              lower: float | None = None, upper: float | None = None) -> float:
    """Smallest ``z`` with ``epsilon_of(make_event(z), delta).epsilon <= epsilon``.

    Parameters
    ----------
    make_event : callable
        ``z -> DpEvent``; epsilon must decrease as ``z`` grows (a noise multiplier).
    epsilon, delta : float
        The target; ``0 < epsilon <= MAX_EPSILON`` (``inf`` gives 0: no noise), ``0 < delta < 1``.
    lower, upper : float, optional
        A bracket (``lower`` over budget, ``upper`` within it); searched for if absent.

    Returns
    -------
    float
        The noise parameter, on the within-budget side.

    Examples
    --------
    >>> from streamdp.privacy.events import gaussian_event
    >>> z = calibrate(lambda z: gaussian_event(z, 10), 1.0, 1e-5)
    >>> round(z, 2), epsilon_of(gaussian_event(z, 10), 1e-5).epsilon <= 1.0
    (11.8, True)
    """
    check_privacy_params(epsilon, delta)
    epsilon, delta = float(epsilon), float(delta)
    if math.isinf(epsilon):
        return 0.0
    check_calibratable(epsilon)

    def gap(z: float) -> float:
        event = make_event(z)
        return pld_epsilon(event, pld_grid(event, epsilon), delta) - epsilon

    if lower is None or upper is None:
        # RDP upper-bounds PLD and costs microseconds even where PLD is slow (tiny noise,
        # huge epsilon), so bracket with RDP first: its answer is within PLD's budget.
        z_rdp = _rdp_answer(make_event, epsilon, delta, 1.0 if upper is None else float(upper))
        lower, upper = _bracket(gap, z_rdp, epsilon, factor=1.25)
    # Whatever grid the search uses, the final check below is the one the ledger makes.
    z = _mc.calibrate_dp_mechanism(lambda: _PldAtEpsilon(epsilon), make_event, epsilon, delta,
                                   bracket_interval=_mc.ExplicitBracketInterval(float(lower), float(upper)),
                                   tol=_REL_TOL * float(lower))
    z = _round_up(float(z))
    step = _REL_TOL
    for _ in range(60):  # the reported epsilon may use another PLD grid (a coarser one): nudge z up, doubling
        if epsilon_of(make_event(z), delta).epsilon <= epsilon:
            return z
        z = _round_up(z * (1.0 + step))
        step *= 2.0
    raise ParameterError(f"calibration did not converge for epsilon={epsilon}, delta={delta}")  # pragma: no cover


def calibrate_bound(make_event: Callable[[float], dp_accounting.DpEvent], epsilon: float, delta: float, *,
                    margin: float = 1e-3, accept: Callable[[float], bool] | None = None) -> float | None:
    """A noise parameter no smaller than :func:`calibrate`'s answer, for a decision that only needs to know the
    noise is at most so much: RDP's calibration (microseconds an evaluation) times ``1 + margin``, accepted when one
    PLD evaluation (the ledger's accountant, on :func:`calibrate`'s grid) finds it within the target; ``None``
    otherwise (then only :func:`calibrate` can say), for ``epsilon = inf``, and where ``accept(z)`` (the caller's
    decision on the bound, asked before the PLD evaluation) is false.

    ``calibrate`` returns the smallest ``z`` within budget up to its tolerance (``1e-5`` relative, rounded up to
    :data:`Z_BITS` bits; ``margin`` covers that and a few of its final nudges), and PLD's epsilon falls as ``z``
    grows, so its answer is at most this. One PLD evaluation against the dozen of a calibration: a plan that
    calibrates a first time only to decide a share (:meth:`streamdp.methods.als._AlsBase._plan`) decides on this.

    >>> from streamdp.privacy.events import gaussian_event
    >>> calibrate_bound(lambda z: gaussian_event(z, 10), 1.0, 1e-5) >= calibrate(lambda z: gaussian_event(z, 10),
    ...                                                                         1.0, 1e-5)
    True
    """
    check_privacy_params(epsilon, delta)
    epsilon, delta = float(epsilon), float(delta)
    if math.isinf(epsilon):
        return None
    check_calibratable(epsilon)

    z = _rdp_answer(make_event, epsilon, delta) * (1.0 + margin)  # RDP's answer is on its within-budget side
    if accept is not None and not accept(z):
        return None
    event = make_event(z)
    return z if pld_epsilon(event, pld_grid(event, epsilon), delta) <= epsilon else None


def _rdp_answer(make_event: Callable[[float], dp_accounting.DpEvent], epsilon: float, delta: float,
                start: float = 1.0) -> float:
    """The RDP accountant's calibration to ``1e-3`` of its bracket (``start`` begins the search): an upper bound on
    PLD's answer in microseconds an evaluation, where PLD is slow (tiny noise, huge epsilon). dp-accounting's
    ``calibrate_dp_mechanism`` returns the within-budget side of its last bracket. :func:`calibrate` starts its
    PLD search from it, :func:`calibrate_bound` widens it."""

    def rdp_gap(z: float) -> float:
        acc = rdp_accountant()
        acc.compose(make_event(z))
        return acc.get_epsilon(delta) - epsilon

    lo, hi = _bracket(rdp_gap, start, epsilon)
    return float(_mc.calibrate_dp_mechanism(rdp_accountant, make_event, epsilon, delta,
                                            bracket_interval=_mc.ExplicitBracketInterval(lo, hi), tol=1e-3 * lo))


def _round_up(z: float) -> float:
    """``z`` rounded up to :data:`Z_BITS` significant bits (``z > 0``).

    Examples
    --------
    >>> _round_up(1.0), _round_up(1.0 + 2.0 ** -40) == 1.0 + 2.0 ** -19
    (1.0, True)
    """
    m, e = math.frexp(z)
    return math.ldexp(math.ceil(math.ldexp(m, Z_BITS)), e - Z_BITS)


class _PldAtEpsilon:
    """The accountant ``calibrate_dp_mechanism`` asks for (an empty ledger, ``compose``, ``get_epsilon``).

    It answers with :func:`pld_epsilon` (remembered PLD epsilons) on the grid
    ``pld_grid(event, epsilon)``: the grid depends on the event (pure epsilons are put
    on it), and ``gap`` above uses the same one, so the two searches share results.
    """

    ledger = dp_accounting.NoOpDpEvent()

    def __init__(self, epsilon: float):
        self.epsilon = epsilon
        self.event = None

    def compose(self, event: dp_accounting.DpEvent) -> "_PldAtEpsilon":
        self.event = event
        return self

    def get_epsilon(self, delta: float) -> float:
        return pld_epsilon(self.event, pld_grid(self.event, self.epsilon), delta)


def calibrate_gaussian(epsilon: float, delta: float, count: int = 1) -> float:
    """Smallest Gaussian noise multiplier for ``count`` releases to meet ``(epsilon, delta)``.

    Examples
    --------
    >>> round(calibrate_gaussian(1.0, 1e-5), 3)
    3.731
    """
    gaussian_event(1.0, count)  # validates count
    return calibrate(lambda z: gaussian_event(z, count), epsilon, delta)


def calibrate_laplace(epsilon: float, delta: float, count: int = 1) -> float:
    """Smallest Laplace ``b / L1 sensitivity`` for ``count`` releases to meet ``(epsilon, delta)``.

    Examples
    --------
    >>> round(calibrate_laplace(1.0, 1e-5), 3)  # one release: b = sensitivity / epsilon
    1.0
    """
    laplace_event(1.0, count)
    return calibrate(lambda z: laplace_event(z, count), epsilon, delta)


def calibrate_huber(epsilon: float, delta: float, count: int = 1) -> float:
    """Smallest Huber ``b / L1 sensitivity`` (per-release epsilon ``1/z``) for ``count`` releases.

    Examples
    --------
    >>> round(1 / calibrate_huber(1.0, 1e-5), 2)  # a single release: pure epsilon
    1.0
    """
    huber_event(1.0, count)
    return calibrate(lambda z: huber_event(1.0 / z, count), epsilon, delta)


def paper_sigma_jain(epsilon: float, delta: float, count: int, which: str = "alg2") -> float:
    """Jain et al. (ICML 2018) closed-form noise, as a noise multiplier.

    Both algorithms add ``N(0, sigma^2)`` to a statistic whose L2 (Frobenius)
    sensitivity to one user is ``L^2`` (the covariance ``sum_i A_i^T A_i`` with
    ``||A_i||_2 <= L``, or ``A^T A v`` with ``||v|| = 1``), so the noise multiplier is
    ``sigma / L^2``:

    - Alg. 1 (private Frank-Wolfe): ``sigma = L^2 sqrt(64 T log(1/delta)) / epsilon``
      with ``T`` Frank-Wolfe iterations;
    - Alg. 2 (private Oja): ``sigma = L^2 sqrt(256 Gamma log(2/delta)) / epsilon``
      with ``Gamma`` Oja iterations.

    ``count`` is the number of Gaussian releases the closed form covers: ``T`` for
    Alg. 1 and ``Gamma`` for Alg. 2 (decision: the paper states Alg. 2's sigma for
    one run of ``Gamma`` steps; a caller composing several runs passes the total).
    The paper requires ``epsilon <= 2 log(1/delta)``; outside it the formula is
    still returned (it only gets more conservative), as in the paper's experiments.

    Examples
    --------
    >>> round(paper_sigma_jain(1.0, 1e-5, 1, "alg2"), 2)
    55.9
    >>> round(paper_sigma_jain(1.0, 1e-5, 1, "alg1"), 2)
    27.14
    """
    check_privacy_params(epsilon, delta)
    check_calibratable(epsilon)
    gaussian_event(1.0, count)
    if which == "alg1":
        return math.sqrt(64.0 * count * math.log(1.0 / delta)) / epsilon
    if which == "alg2":
        return math.sqrt(256.0 * count * math.log(2.0 / delta)) / epsilon
    raise ParameterError(f"which: expected 'alg1' or 'alg2', got {which!r}")
