"""Mechanisms, contribution bounding, accountant wrappers, the ledger and the store budget.

Imports nothing from ``streamdp.methods`` or ``streamdp.kernels``. Every method
spends privacy through this package: it builds events with the ``*_event``
functions, composes them (``compose`` sequentially, ``parallel`` over disjoint
user blocks), calibrates noise with ``calibrate`` / ``calibrate_gaussian``, reports
with ``epsilon_of`` (PLD, RDP beside it) and writes a :class:`Ledger`.
"""

from streamdp.privacy.accountant import (
    DP_ACCOUNTING_VERSION,
    NEIGHBOURING_RELATION,
    AccountingResult,
    check_privacy_params,
    epsilon_of,
)
from streamdp.privacy.calibration import (
    calibrate,
    calibrate_gaussian,
    calibrate_huber,
    calibrate_laplace,
    paper_sigma_jain,
)
from streamdp.privacy.events import (
    PureDpEvent,
    compose,
    event_from_dict,
    event_to_dict,
    gaussian_event,
    huber_event,
    laplace_event,
    parallel,
    pure_dp_event,
)
from streamdp.privacy.ledger import (
    GUARANTEE_APPROX_PREFIX,
    GUARANTEE_JOINT_DP,
    GUARANTEE_NONE,
    GUARANTEE_USER_DP,
    SEEDED_NOTE,
    Ledger,
)
from streamdp.privacy.mechanisms import (
    gaussian_noise,
    huber_epsilon,
    huber_noise,
    laplace_noise,
    make_rng,
    spawn_rngs,
)

__all__ = [
    "AccountingResult", "DP_ACCOUNTING_VERSION", "NEIGHBOURING_RELATION", "check_privacy_params", "epsilon_of",
    "calibrate", "calibrate_gaussian", "calibrate_huber", "calibrate_laplace", "paper_sigma_jain",
    "PureDpEvent", "compose", "event_from_dict", "event_to_dict", "gaussian_event", "huber_event",
    "laplace_event", "parallel", "pure_dp_event",
    "GUARANTEE_APPROX_PREFIX", "GUARANTEE_JOINT_DP", "GUARANTEE_NONE", "GUARANTEE_USER_DP", "SEEDED_NOTE",
    "Ledger",
    "gaussian_noise", "huber_epsilon", "huber_noise", "laplace_noise", "make_rng", "spawn_rngs",
]
