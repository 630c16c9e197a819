"""Random streams and the three additive noise mechanisms: Gaussian, Laplace, Huber.

Public names: :func:`make_rng`, :func:`spawn_rngs`, :func:`gaussian_noise`,
:func:`laplace_noise`, :func:`huber_noise` and the Huber mechanism's
:func:`huber_loss`, :func:`huber_log_density`, :func:`huber_variance`,
:func:`huber_epsilon`.

Decisions a reader must know:

* all noise comes from :class:`numpy.random.Generator` over ``PCG64DXSM``, seeded from
  OS entropy unless a ``seed`` is given; a seeded run is *reproducible, not private
  against whoever knows the seed*, and the ledger records ``seeded``;
* independent streams per block or pass come from :meth:`numpy.random.SeedSequence.spawn`,
  so a block's stream does not depend on the scheduler's order;
* ``PCG64DXSM`` is not a cryptographic generator and noise is sampled in double precision
  (no floating-point hardening a la Mironov 2012), as in the usual numpy-based DP
  libraries: stated, not hidden;
* the **Huber mechanism** (density ``∝ exp(-H_c(x) / b)``, the paper's, ../shared/seeds/001;
  ``c = 0`` is Laplace) is pure DP with ``epsilon = Δ / b`` **exactly**, for L1
  sensitivity ``Δ`` and any ``c`` (``H_c`` is 1-Lipschitz and the bound is attained;
  checked numerically by ``tests/privacy/test_mechanisms.py``);
* at equal epsilon its variance *grows* with ``c`` (``2 b^2`` at ``c = 0``, about ``b c``
  for ``c >> b``): never less noisy than Laplace; offered because the paper's methods use it;
* its sampler is exact: a truncated Gaussian core or one of two exponential tails, each
  picked with its mass.

Design notes (the Huber density, the epsilon's derivation, the measured variances, the
sampler): docs/design-notes.md#streamdpprivacymechanismspy.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from streamdp.errors import ParameterError

__all__ = [
    "make_rng",
    "spawn_rngs",
    "gaussian_noise",
    "laplace_noise",
    "huber_noise",
    "huber_epsilon",
    "huber_variance",
    "huber_log_density",
    "huber_loss",
]


def _seed_sequence(seed) -> np.random.SeedSequence:
    if seed is None:
        return np.random.SeedSequence()
    if isinstance(seed, np.random.SeedSequence):
        return seed
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ParameterError(f"seed: expected a non-negative integer or None, got {seed!r}")
    return np.random.SeedSequence(int(seed))


def make_rng(seed: int | None = None) -> np.random.Generator:
    """A ``numpy.random.Generator`` (PCG64DXSM), from OS entropy when ``seed`` is None.

    Parameters
    ----------
    seed : int or None
        Non-negative seed; ``None`` draws fresh entropy from the OS.

    Returns
    -------
    numpy.random.Generator

    Examples
    --------
    >>> a, b = make_rng(3).normal(size=2), make_rng(3).normal(size=2)
    >>> bool((a == b).all())
    True
    """
    return np.random.Generator(np.random.PCG64DXSM(_seed_sequence(seed)))


def spawn_rngs(seed: int | None, n: int, *, key: int = 0) -> list[np.random.Generator]:
    """``n`` independent generators, one per block, via ``SeedSequence.spawn``.

    Stream ``b`` depends only on ``(seed, key, b)``, never on scheduling, so a
    parallel run with a seed is reproducible. Different ``key`` values (e.g. one
    per pass or per purpose: trimming vs noise) give unrelated families.

    Parameters
    ----------
    seed : int or None
        Root seed; ``None`` uses OS entropy (then the streams are not reproducible).
    n : int
        Number of streams.
    key : int, optional
        Family of streams drawn from the same seed.

    Returns
    -------
    list of numpy.random.Generator

    Examples
    --------
    >>> x = [g.integers(1 << 30) for g in spawn_rngs(5, 3, key=1)]
    >>> y = [g.integers(1 << 30) for g in spawn_rngs(5, 3, key=1)]
    >>> x == y, len(set(x)) == 3
    (True, True)
    """
    if n < 0:
        raise ParameterError(f"n: expected a non-negative number of streams, got {n}")
    if key < 0:
        raise ParameterError(f"key: expected a non-negative integer, got {key}")
    root = _seed_sequence(seed)
    family = np.random.SeedSequence(root.entropy, spawn_key=tuple(root.spawn_key) + (int(key),))
    return [np.random.Generator(np.random.PCG64DXSM(s)) for s in family.spawn(n)]


def _check_scale(name: str, value: float, *, allow_zero: bool = True) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        kind = "non-negative" if allow_zero else "positive"
        raise ParameterError(f"{name}: expected a finite {kind} number, got {value}")
    return value


def gaussian_noise(rng: np.random.Generator, shape, sigma: float) -> np.ndarray:
    """I.i.d. ``N(0, sigma^2)`` noise as float64 (``sigma = 0`` gives zeros: non-private).

    Parameters
    ----------
    rng : numpy.random.Generator
    shape : int or tuple of int
    sigma : float
        Standard deviation (noise multiplier times L2 sensitivity).

    Returns
    -------
    numpy.ndarray of float64

    Examples
    --------
    >>> gaussian_noise(make_rng(0), (2, 3), 0.0).sum()
    np.float64(0.0)
    """
    sigma = _check_scale("sigma", sigma)
    if sigma == 0:
        return np.zeros(shape, dtype=np.float64)
    return rng.normal(0.0, sigma, size=shape)


def laplace_noise(rng: np.random.Generator, shape, b: float) -> np.ndarray:
    """I.i.d. Laplace noise with scale ``b`` (density ``exp(-|x|/b) / (2b)``), float64.

    Examples
    --------
    >>> laplace_noise(make_rng(0), 4, 1.0).shape
    (4,)
    """
    b = _check_scale("b", b)
    if b == 0:
        return np.zeros(shape, dtype=np.float64)
    return rng.laplace(0.0, b, size=shape)


def huber_loss(x, c: float) -> np.ndarray:
    """The Huber loss ``H_c(x)`` (quadratic within ``[-c, c]``, linear outside).

    Examples
    --------
    >>> huber_loss(np.array([0.0, 0.5, 2.0]), 1.0).tolist()
    [0.0, 0.125, 1.5]
    """
    x = np.abs(np.asarray(x, dtype=np.float64))
    c = _check_scale("c", c)
    if c == 0:
        return x
    return np.where(x <= c, x * x / (2.0 * c), x - c / 2.0)


def _huber_masses(b: float, c: float) -> tuple[float, float]:
    """(core mass, one tail's mass) of the unnormalized density exp(-H_c(x)/b)."""
    core = math.sqrt(2.0 * math.pi * b * c) * math.erf(math.sqrt(c / (2.0 * b))) if c > 0 else 0.0
    tail = b * math.exp(-c / (2.0 * b))
    return core, tail


def huber_log_density(x, b: float, c: float) -> np.ndarray:
    """Log of the normalized Huber-mechanism density at ``x`` (per coordinate).

    Examples
    --------
    >>> from scipy import integrate
    >>> round(integrate.quad(lambda t: np.exp(huber_log_density(t, 1.0, 2.0)), -np.inf, np.inf)[0], 9)
    1.0
    """
    b = _check_scale("b", b, allow_zero=False)
    c = _check_scale("c", c)
    core, tail = _huber_masses(b, c)
    return -huber_loss(x, c) / b - math.log(core + 2.0 * tail)


def huber_variance(b: float, c: float) -> float:
    """Variance of the Huber-mechanism noise of scale ``b`` and transition ``c`` (``2 b^2`` at ``c = 0``).

    From the mixture of the module docstring: the core's second moment is
    ``b c (M_core - 2 c e^{-c/(2b)})`` and each tail's ``b e^{-c/(2b)} (c^2 + 2 b c + 2 b^2)``,
    over the total mass ``M_core + 2 b e^{-c/(2b)}``.

    >>> huber_variance(1.0, 0.0), round(huber_variance(1.0, 1.0), 3)
    (2.0, 2.244)
    """
    b = _check_scale("b", b, allow_zero=False)
    c = _check_scale("c", c)
    core, tail = _huber_masses(b, c)
    et = math.exp(-c / (2.0 * b))
    m2 = (b * c * (core - 2.0 * c * et) if c > 0 else 0.0) + 2.0 * b * et * (c * c + 2.0 * b * c + 2.0 * b * b)
    return m2 / (core + 2.0 * tail)


def huber_epsilon(b: float, sensitivity: float) -> float:
    """Exact pure-DP epsilon of the Huber mechanism: ``Δ / b`` for L1 sensitivity ``Δ``.

    Independent of the transition ``c`` (see the module docstring for the proof
    that this is the supremum of the privacy loss, not only an upper bound).

    Examples
    --------
    >>> huber_epsilon(2.0, 1.0)
    0.5
    """
    b = _check_scale("b", b, allow_zero=False)
    sensitivity = _check_scale("sensitivity", sensitivity)
    return sensitivity / b


def huber_noise(rng: np.random.Generator, shape, b: float, c: float) -> np.ndarray:
    """Exact i.i.d. samples of density ``∝ exp(-H_c(x)/b)`` as float64.

    A mixture of a truncated ``N(0, b c)`` core on ``[-c, c]`` and two tails
    ``±(c + Exp(b))``, with the exact masses (module docstring). ``c = 0`` is
    Laplace(b); ``b = 0`` gives zeros (non-private).

    Parameters
    ----------
    rng : numpy.random.Generator
    shape : int or tuple of int
    b : float
        Scale; ``epsilon = L1 sensitivity / b``.
    c : float
        Transition between the quadratic and linear parts of the Huber loss.

    Returns
    -------
    numpy.ndarray of float64

    Examples
    --------
    >>> x = huber_noise(make_rng(1), 100_000, 1.0, 1.0)
    >>> bool(abs(x.mean()) < 0.02)
    True
    """
    b = _check_scale("b", b)
    c = _check_scale("c", c)
    if b == 0:
        return np.zeros(shape, dtype=np.float64)
    core, tail = _huber_masses(b, c)
    p_core = core / (core + 2.0 * tail)
    n = int(np.prod(shape, dtype=np.int64))
    in_core = rng.random(n) < p_core
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    mag = np.empty(n, dtype=np.float64)
    n_core = int(in_core.sum())
    if n_core:
        s = math.sqrt(b * c)
        lo = 0.5 * math.erfc(math.sqrt(c / b) / math.sqrt(2.0))  # Phi(-c/s)
        u = lo + rng.random(n_core) * (0.5 - lo)
        mag[in_core] = np.minimum(-s * special.ndtri(u), c)
    n_tail = n - n_core
    if n_tail:
        mag[~in_core] = c + rng.exponential(b, n_tail)
    return (sign * mag).reshape(shape)
