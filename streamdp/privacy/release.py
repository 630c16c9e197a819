"""One noise helper: release a statistic with a mechanism and a sensitivity, get the event back.

Every additive noisy release of every method goes through :class:`Release`: it
names what is released, the mechanism (``gaussian``, ``laplace`` or ``huber``),
the user-level sensitivity in the norm that mechanism needs (L2 for Gaussian, L1
for Laplace and Huber), the noise multiplier (noise scale / sensitivity) and how
many times it is released. From that one description come

* the noise itself (:meth:`Release.add`, :meth:`Release.noise`; a symmetric
  matrix gets its upper triangle drawn and mirrored, so a Gramian stays
  symmetric without doubling the noise on the off-diagonal entries),
* the dp-accounting event (:meth:`Release.event`), and
* the ledger entry (:meth:`Release.entry`),

so what is added, what is accounted and what is written down cannot drift apart.

Budget split
------------
:func:`calibrate_releases` turns a list of :class:`Share` (a release without its
noise level, plus its share of the budget) into calibrated releases. All shares
hang off one scalar ``z`` that :func:`streamdp.privacy.calibrate` searches with the
PLD accountant, so the composed epsilon is the largest not above the target:

* Gaussian releases compose through ``sum count_i / z_i^2`` (their PLDs are
  Gaussian), so a share ``f`` of that sum is ``z_i = z sqrt(count_i / f_i)``;
* Laplace and Huber releases are pure ``epsilon_i = 1 / z_i`` each, so a share
  ``f`` of the epsilon scale is ``z_i = z count_i / f_i``.

The shares of one method are tuned numbers (the methods document how), not
privacy parameters: whatever they are, the accountant's epsilon is what the
ledger reports and it never exceeds the target.

Examples
--------
>>> from streamdp.privacy import make_rng
>>> r = Release("item sums", "gaussian", sensitivity=2.0, noise_multiplier=3.0, shape=(4,))
>>> r.scale, r.event()
(6.0, GaussianDpEvent(noise_multiplier=3.0))
>>> r.add(np.zeros(4), make_rng(0)).shape
(4,)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from streamdp.errors import ParameterError
from streamdp.privacy.calibration import calibrate, calibrate_bound
from streamdp.privacy.events import compose, gaussian_event, huber_event, laplace_event
from streamdp.privacy.mechanisms import gaussian_noise, huber_noise, huber_variance, laplace_noise

__all__ = ["MECHANISMS", "Release", "Share", "calibrate_releases", "entry_std", "pure_epsilon"]

#: Additive mechanisms, and the norm each one's sensitivity is measured in.
MECHANISMS = {"gaussian": "l2", "laplace": "l1", "huber": "l1"}


def check_mechanism(name: str) -> str:
    """Validate a mechanism name (``ParameterError`` naming ``--mechanism`` otherwise).

    >>> check_mechanism("huber")
    'huber'
    """
    if name not in MECHANISMS:
        raise ParameterError(f"--mechanism: expected one of {', '.join(MECHANISMS)}, got {name!r}")
    return name


@dataclass(frozen=True)
class Release:
    """A noisy release of a statistic: its mechanism, sensitivity and noise level.

    Parameters
    ----------
    what : str
        What is released (for the ledger).
    mechanism : {"gaussian", "laplace", "huber"}
    sensitivity : float
        User-level sensitivity of ONE release: L2 norm for ``gaussian``, L1 norm
        for ``laplace``/``huber`` (for a symmetric matrix: of its upper triangle).
    noise_multiplier : float
        Noise scale divided by ``sensitivity`` (Gaussian ``sigma``, Laplace/Huber
        ``b``); 0 means no noise (a non-private run).
    count : int
        How many times the statistic is released, each with fresh noise.
    shape : tuple
        Shape of one release (for the ledger).
    symmetric : bool
        The statistic is a symmetric matrix (last two axes): noise is drawn on the
        upper triangle and mirrored.
    huber_c : float
        Huber transition as a multiple of the scale ``b`` (``huber`` only).
    """

    what: str
    mechanism: str
    sensitivity: float
    noise_multiplier: float
    count: int = 1
    shape: tuple = ()
    symmetric: bool = False
    huber_c: float = 1.0

    def __post_init__(self):
        check_mechanism(self.mechanism)
        for name in ("sensitivity", "noise_multiplier", "huber_c"):
            v = float(getattr(self, name))
            if not (math.isfinite(v) and v >= 0):
                raise ParameterError(f"{self.what}: {name} must be a finite non-negative number, got {v}")
        if isinstance(self.count, bool) or int(self.count) != self.count or self.count < 1:
            raise ParameterError(f"{self.what}: count must be a positive integer, got {self.count!r}")

    @property
    def private(self) -> bool:
        return self.noise_multiplier > 0

    @property
    def scale(self) -> float:
        """The noise scale: Gaussian ``sigma`` or Laplace/Huber ``b``."""
        return float(self.noise_multiplier) * float(self.sensitivity)

    @property
    def std(self) -> float:
        """Standard deviation of one coordinate of the noise (:func:`entry_std` of :meth:`entry`)."""
        return entry_std(self.entry())

    @property
    def epsilon_each(self) -> float:
        """Pure epsilon of one Laplace/Huber release (``1 / noise_multiplier``); ``nan`` for Gaussian."""
        if self.mechanism == "gaussian":
            return math.nan
        return 1.0 / self.noise_multiplier if self.noise_multiplier > 0 else math.inf

    def event(self):
        """The dp-accounting event of all ``count`` releases."""
        z = float(self.noise_multiplier)
        if self.mechanism == "gaussian":
            return gaussian_event(z, self.count)
        if self.mechanism == "laplace":
            return laplace_event(z, self.count)
        if z == 0:
            return gaussian_event(0.0, self.count)  # non-private: the accountant reports inf
        return huber_event(1.0 / z, self.count)

    def entry(self) -> dict:
        """The ledger's description of this release."""
        d = {"release": self.what, "mechanism": self.mechanism if self.private else "none (non-private)",
             "sensitivity_norm": MECHANISMS[self.mechanism], "sensitivity": float(self.sensitivity),
             "noise_multiplier": float(self.noise_multiplier), "scale": self.scale, "count": int(self.count),
             "shape": list(self.shape)}
        if self.symmetric:
            d["symmetric"] = "noise on the upper triangle, mirrored"
        if self.mechanism != "gaussian" and self.private:
            d["pure_epsilon_each"] = self.epsilon_each
        if self.mechanism == "huber":
            d["huber_transition"] = self.huber_c * self.scale
        return d

    def noise(self, rng: np.random.Generator, shape=None) -> np.ndarray:
        """Fresh noise of ``shape`` (default: the release's shape), float64."""
        if shape is None:
            shape = self.shape
        shape = tuple(int(x) for x in shape) if isinstance(shape, (tuple, list)) else (int(shape),)
        if not self.symmetric:
            return self._draw(rng, shape)
        if len(shape) < 2 or shape[-1] != shape[-2]:
            raise ParameterError(f"{self.what}: a symmetric release needs square last axes, got {shape}")
        d = shape[-1]
        iu = np.triu_indices(d)
        upper = self._draw(rng, shape[:-2] + (len(iu[0]),))
        out = np.zeros(shape)
        out[..., iu[0], iu[1]] = upper
        out[..., iu[1], iu[0]] = upper
        return out

    def _draw(self, rng, shape) -> np.ndarray:
        s = self.scale
        if self.mechanism == "gaussian":
            return gaussian_noise(rng, shape, s)
        if self.mechanism == "laplace":
            return laplace_noise(rng, shape, s)
        return huber_noise(rng, shape, s, self.huber_c * s)

    def add(self, value, rng: np.random.Generator) -> np.ndarray:
        """``value`` plus fresh noise, as a new float64 array (``value`` is not modified)."""
        value = np.asarray(value, dtype=np.float64)
        if not self.private:
            return value.copy()
        return value + self.noise(rng, value.shape)


@dataclass(frozen=True)
class Share:
    """A release before calibration: everything but the noise level, plus its share of the budget."""

    what: str
    mechanism: str
    sensitivity: float
    share: float
    count: int = 1
    shape: tuple = ()
    symmetric: bool = False
    huber_c: float = 1.0

    def at(self, z: float) -> Release:
        """The release when the budget's scalar is ``z`` (see the module docstring)."""
        if not self.share > 0:
            raise ParameterError(f"{self.what}: budget share must be > 0, got {self.share}")
        if self.mechanism == "gaussian":
            zi = z * math.sqrt(self.count / self.share)
        else:
            zi = z * self.count / self.share
        return Release(self.what, self.mechanism, self.sensitivity, zi, self.count, tuple(self.shape),
                       self.symmetric, self.huber_c)


def calibrate_releases(shares: list[Share], epsilon: float, delta: float, *, fixed=()) -> list[Release]:
    """Calibrated :class:`Release` objects: the composed PLD epsilon is the largest not above ``epsilon``.

    ``epsilon = inf`` returns the releases without noise (non-private). ``fixed`` are
    releases whose noise is already set (e.g. a statistic drawn before the rest of
    the plan could be made, :mod:`streamdp.methods._profile`): their events are
    composed with the shares' in the search, so the whole stays within the target.

    Examples
    --------
    >>> from streamdp.privacy import epsilon_of
    >>> rs = calibrate_releases([Share("a", "gaussian", 1.0, 0.9, count=3), Share("b", "gaussian", 2.0, 0.1)],
    ...                         1.0, 1e-6)
    >>> epsilon_of(compose([r.event() for r in rs]), 1e-6).epsilon <= 1.0
    True
    >>> round(rs[1].noise_multiplier / rs[0].noise_multiplier, 3)  # sqrt((1/0.1) / (3/0.9))
    1.732
    """
    if not shares:
        return []
    if not math.isfinite(epsilon):
        return [replace_release(s.at(1.0), 0.0) for s in shares]
    before = [r.event() for r in fixed]
    z = calibrate(lambda z: compose(before + [s.at(z).event() for s in shares]), epsilon, delta)
    return [s.at(z) for s in shares]


def bound_releases(shares: list[Share], epsilon: float, delta: float, *, fixed=(), accept=None
                   ) -> list[Release] | None:
    """Releases whose noise is at least :func:`calibrate_releases`' for the same arguments (every release's, the
    budget's one scalar being at least its: :func:`~streamdp.privacy.calibration.calibrate_bound`), or ``None`` where
    that cheap bound cannot be had (then calibrate). For a decision monotone in the noise, not for a release.
    ``accept(releases)``: the caller's decision on the bound, asked before its one PLD evaluation (false: ``None``).

    >>> shares = [Share("a", "gaussian", 1.0, 0.9, count=3), Share("b", "gaussian", 2.0, 0.1)]
    >>> up, rs = bound_releases(shares, 1.0, 1e-6), calibrate_releases(shares, 1.0, 1e-6)
    >>> all(u.noise_multiplier >= r.noise_multiplier for u, r in zip(up, rs))
    True
    """
    if not shares or not math.isfinite(epsilon):
        return None
    before = [r.event() for r in fixed]
    z = calibrate_bound(lambda z: compose(before + [s.at(z).event() for s in shares]), epsilon, delta,
                        accept=None if accept is None else (lambda z: accept([s.at(z) for s in shares])))
    return None if z is None else [s.at(z) for s in shares]


def entry_std(entry: dict) -> float:
    """Standard deviation of one coordinate of the noise of a ledger's release entry (:meth:`Release.entry`): 0
    without noise, ``inf`` for a mechanism it does not know.

    >>> entry_std(Release("x", "laplace", 1.0, 2.0).entry()) == 2.0 * math.sqrt(2.0)
    True
    """
    mech, scale = entry.get("mechanism"), float(entry.get("scale", math.inf))
    if scale == 0.0:
        return 0.0
    if mech == "gaussian":
        return scale
    if mech == "laplace":
        return math.sqrt(2.0) * scale
    if mech == "huber":
        return math.sqrt(huber_variance(scale, float(entry.get("huber_transition", 0.0))))
    return math.inf


def replace_release(r: Release, noise_multiplier: float) -> Release:
    """``r`` with another noise multiplier."""
    return replace(r, noise_multiplier=float(noise_multiplier))


def pure_epsilon(releases) -> float:
    """Basic composition of pure-DP releases (``sum count_i / z_i``): the pure epsilon (delta = 0) they give.

    ``nan`` when any release is not pure (Gaussian, or the catalogue's threshold). Basic composition is
    exact for pure DP at delta = 0 (the worst case of each release adds up), which
    dp-accounting's PLD cannot report (it counts the tails it truncates as infinite
    loss at delta = 0); at delta > 0 the PLD figure in the ledger is the tighter one.

    >>> pure_epsilon([Release("a", "laplace", 1.0, 2.0, count=3)])
    1.5
    """
    total = 0.0
    for r in releases:
        if r.mechanism not in ("laplace", "huber"):
            return math.nan
        total += r.count * r.epsilon_each
    return total
