"""A release by posterior sampling (the exponential mechanism), drawn approximately with Langevin dynamics.

``--method sgld`` (Liu, Wang & Smola 2015) releases one sample of
``exp(-s F / T)``, ``F`` the objective with every user's term in ``[0, B]``.
An **exact** sample is pure epsilon-DP (Thm 1, the exponential mechanism); the
sampler is a finite SGLD run, which is not one, so the guarantee is labelled
``approximate:``. :class:`PosteriorSample` is to that release what
:class:`~streamdp.privacy.release.Release` is to an additive one: from its one
description come

* the sampler's noise: the scale ``s``, the Langevin time of a rating
  (:meth:`PosteriorSample.langevin_time`), the prior's flow rate
  (:meth:`PosteriorSample.flow_rate`), the temperature, and the standard normals
  the kernels consume (:meth:`PosteriorSample.draws`, fresh or from Liu et al.'s
  lookup table, which has no privacy proof);
* the dp-accounting event (:meth:`PosteriorSample.event`): one pure-DP event at
  the epsilon the sampler runs at, fitted just under the claim so that the PLD
  grid's rounding stays within it (:func:`event_epsilon`);
* the ledger entry (:meth:`PosteriorSample.entry`), the guarantee string and the
  ``bounds.target`` label (:meth:`PosteriorSample.guarantee`, :func:`target_label`),

so what the chain draws, what is accounted and what is written down cannot drift apart.

Scale and the factor 4 (``posterior_scale``): for add/remove one user and a
non-negative per-user loss bounded by ``B``, an exact sample at ``s = epsilon / B``
is epsilon-DP (``tight``); Liu et al.'s Alg. 1 uses ``s = epsilon / (4B)``
(``paper``, which covers replace-one). The proof is in :mod:`streamdp.methods.sgld`.

Examples
--------
>>> p = PosteriorSample.calibrated("V", 2.0, 1e-5, bound=400.0, temperature=0.5)
>>> p.epsilon_claimed, p.epsilon_event <= 4.0, round(p.scale, 6)
(4.0, True, 0.005)
>>> p.event().mechanism
'exponential (SGLD posterior sample, approximate)'
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from streamdp.errors import ParameterError
from streamdp.privacy.accountant import epsilon_of
from streamdp.privacy.events import pure_dp_event

__all__ = ["GUARANTEE_SGLD", "PER_USER_SHARE", "SCALE_FACTOR", "TABLE_LABEL", "PosteriorSample", "event_epsilon",
           "target_label"]

#: ``posterior_scale``: ``s = epsilon / (factor * B)``. ``paper``: Alg. 1's ``4B``; ``tight``: ``B``,
#: the exact add/remove bound for a non-negative loss bounded by ``B``.
SCALE_FACTOR = {"paper": 4.0, "tight": 1.0}
#: Per-user epsilon as a share of ``epsilon * B_i / B``: Thm 2's 1/2 (paper) or 1 (tight).
PER_USER_SHARE = {"paper": 0.5, "tight": 1.0}

GUARANTEE_SGLD = ("approximate: epsilon-DP for an exact posterior sample; approximate for a finite SGLD run "
                  "(Liu et al. Thm 1; Jain et al. 2018 note SGLD's (epsilon, delta) is unquantified)")
TABLE_LABEL = "Gaussian lookup table: no privacy proof"
_NO_OFFSETS = np.zeros(0, np.int64)


def target_label(epsilon: float, temperature: float, epsilon_claimed: float) -> str:
    """``privacy.json: bounds.target``: whether the chain samples the epsilon-DP target of ``--epsilon``.

    ``--temperature T != 1`` (Liu et al.'s zeta) makes the chain sample ``exp(-s F / T)``:
    the exact target of ``epsilon / T``, which is what the ledger then claims, but NOT the
    DP target of the ``--epsilon`` given.

    >>> target_label(1.0, 1.0, 1.0)
    'the epsilon-DP target exp(-epsilon/(cB) F) of --epsilon 1'
    >>> target_label(1.0, 0.1, 10.0)
    'not the DP target of --epsilon 1: temperature 0.1 samples exp(-s F / T), the target of epsilon / T = 10 (claimed)'
    """
    if float(temperature) == 1.0:
        return f"the epsilon-DP target exp(-epsilon/(cB) F) of --epsilon {epsilon:g}"
    return (f"not the DP target of --epsilon {epsilon:g}: temperature {temperature:g} samples exp(-s F / T), the "
            f"target of epsilon / T = {epsilon_claimed:.4g} (claimed)")


@functools.lru_cache(maxsize=64)
def event_epsilon(epsilon: float, delta: float) -> float:
    """The largest ``e <= epsilon`` whose pure-DP event the PLD accountant reports at ``<= epsilon``.

    The PLD of a pure ``e``-DP event lands slightly above ``e`` (its discretization);
    the sampler is then run at ``e`` (scale ``s = e T / (c B)``), so the exact sample
    spends ``e`` and the accountant's conservative figure stays within the target.

    >>> e = event_epsilon(2.0, 1e-5)
    >>> e <= 2.0
    True
    """
    e = float(epsilon)
    for _ in range(20):
        try:
            got = epsilon_of(pure_dp_event(e), delta).epsilon
        except OverflowError:  # dp-accounting evaluates exp(epsilon)
            raise ParameterError(f"--epsilon {epsilon:g} (after temperature) is beyond what the accountant can "
                                 "evaluate (exp(epsilon) overflows above ~700)") from None
        if got <= epsilon:
            return e
        if not math.isfinite(got):
            raise ParameterError(f"--epsilon {epsilon:g} (after temperature) is beyond what the accountant can "
                                 f"evaluate for a pure-DP event (it reports {got})")
        e -= max(got - epsilon, 1e-9 * epsilon) * 1.5
    raise ParameterError(f"cannot fit a pure-DP event under epsilon={epsilon} with the accountant")


@dataclass(frozen=True)
class PosteriorSample:
    """One sample of ``exp(-s F / T)`` drawn by SGLD: its guarantee, its event and its sampler's noise.

    Build it with :meth:`calibrated` (which fits :attr:`epsilon_event`).

    Parameters
    ----------
    what : str
        What is released (for the ledger).
    epsilon : float
        The ``--epsilon`` given; ``inf`` samples the unscaled posterior (``s = 1``, non-private).
    epsilon_event : float
        The epsilon of the accounted event and of the sampler (:func:`event_epsilon` of
        :attr:`epsilon_claimed`); ``inf`` when non-private.
    bound : float
        ``B``: every user's term of ``F`` lies in ``[0, B]`` (public).
    posterior_scale : {"tight", "paper"}
        ``s = epsilon_event T / (SCALE_FACTOR[posterior_scale] B)``.
    temperature : float
        ``T``: the chain samples ``exp(-s F / T)``, the exact target of ``epsilon / T``.
    epochs : int
        Langevin epochs of the run (for the ledger).
    noise_table : int or None
        Size of Liu et al.'s Gaussian lookup table used instead of fresh draws (no privacy proof).
    """

    what: str
    epsilon: float
    epsilon_event: float
    bound: float
    posterior_scale: str = "tight"
    temperature: float = 1.0
    epochs: int = 1
    noise_table: int | None = None

    @classmethod
    def calibrated(cls, what: str, epsilon: float, delta: float, *, bound: float, posterior_scale: str = "tight",
                   temperature: float = 1.0, epochs: int = 1, noise_table: int | None = None) -> PosteriorSample:
        """The sample whose event the PLD accountant reports within the claim ``epsilon / temperature``."""
        eps_event = event_epsilon(epsilon / temperature, delta) if math.isfinite(epsilon) else math.inf
        return cls(what, epsilon, eps_event, bound, posterior_scale, temperature, epochs, noise_table)

    @property
    def private(self) -> bool:
        return math.isfinite(self.epsilon)

    @property
    def epsilon_claimed(self) -> float:
        """The exact-sample guarantee claimed: ``epsilon / T`` (the ledger's epsilon)."""
        return self.epsilon / self.temperature

    @property
    def scale(self) -> float:
        """``s`` of the target ``exp(-s F / T)``: ``epsilon_event T / (c B)``; 1 when non-private."""
        if not self.private:
            return 1.0
        return self.epsilon_event * self.temperature / (SCALE_FACTOR[self.posterior_scale] * self.bound)

    @property
    def user_share(self) -> float:
        """User ``i``'s epsilon is ``epsilon_event * B_i / B`` times this (Thm 2's 1/2 with ``paper``)."""
        return PER_USER_SHARE[self.posterior_scale]

    def langevin_time(self, lr: float, n_ratings: int) -> float:
        """Langevin time of one rating's step when an epoch with learning rate ``lr`` covers ``n_ratings``.

        In SGD units a kick is ``lr`` times the gradient of ``F``, i.e. ``lr / (2 s)`` of Langevin time
        on the energy ``s F`` (the kick ``lr w l'(e) / 2``); an epoch is one such step for the whole energy.
        """
        return lr / (2.0 * self.scale) / n_ratings

    def flow_rate(self, lam: float) -> float:
        """``a = 2 s lam``: the prior's Ornstein-Uhlenbeck rate; a flow of duration ``t`` adds
        ``N(0, T (1 - exp(-2 a t)) / a)`` per coordinate (:mod:`streamdp.kernels.sgd`)."""
        return 2.0 * self.scale * lam

    def table(self, rng: np.random.Generator) -> np.ndarray:
        """Liu et al.'s Gaussian lookup table of ``noise_table`` numbers (float32), drawn once per run."""
        return rng.standard_normal(self.noise_table).astype(np.float32)

    def draws(self, rng: np.random.Generator, n_flows: int, k1: int, table=None, out=None):
        """The noise of ``n_flows`` flows of ``k1`` coordinates: ``(noise, offsets)`` for the kernels.

        Fresh standard normals (float32, into ``out`` when given; ``offsets`` empty), or, with the
        lookup ``table``, the table and one random segment start per flow.

        >>> from streamdp.privacy import make_rng
        >>> p = PosteriorSample("V", 1.0, 1.0, 10.0)
        >>> noise, offsets = p.draws(make_rng(0), 3, 5)
        >>> noise.shape, noise.dtype, len(offsets)
        ((15,), dtype('float32'), 0)
        """
        if table is not None:
            return table, rng.integers(0, len(table) - k1, size=n_flows).astype(np.int64)
        if out is None:
            return rng.standard_normal(n_flows * k1, dtype=np.float32), _NO_OFFSETS
        rng.standard_normal(out=out, dtype=np.float32)
        return out, _NO_OFFSETS

    def event(self):
        """The accounted event: what an exact sample spends (pure ``epsilon_event``-DP)."""
        return pure_dp_event(self.epsilon_event, mechanism="exponential (SGLD posterior sample, approximate)")

    def target(self) -> str:
        """``bounds.target`` (:func:`target_label`)."""
        return target_label(self.epsilon, float(self.temperature), self.epsilon_claimed)

    def guarantee(self) -> str:
        """The ledger's guarantee: approximate; the lookup table and a temperature other than 1 say so."""
        g = GUARANTEE_SGLD + ("; " + TABLE_LABEL if self.noise_table else "")
        if float(self.temperature) != 1.0:
            g += "; " + self.target()
        return g

    def entry(self) -> dict:
        """The ledger's description of this release."""
        label = "exponential mechanism via an approximate posterior sample (SGLD)"
        if self.noise_table:
            label += "; " + TABLE_LABEL
        return {"release": self.what, "mechanism": label, "epsilon_exact_sample": self.epsilon_event,
                "epsilon_claimed": self.epsilon_claimed, "scale_s": self.scale, "sensitivity_of_F": 2 * self.bound,
                "count": 1, "epochs": self.epochs,
                "approximation": "exact only for an exact sample; a finite SGLD run is not one (no delta bound)",
                "noise": TABLE_LABEL if self.noise_table else "numpy Generator (PCG64DXSM) standard normals"}
