"""Mechanisms, contribution bounding, accountant wrappers, the ledger and the store budget.

Imports nothing from ``streamdp.methods`` or ``streamdp.kernels``. Every method
spends privacy through this package: it builds events with the ``*_event``
functions, composes them (``compose`` sequentially, ``parallel`` over disjoint
user blocks), calibrates noise with ``calibrate`` / ``calibrate_gaussian``, reports
with ``epsilon_of`` (PLD, RDP beside it) and writes a :class:`Ledger`.

The names load on first use (PEP 562): reading a model's ledger imports neither dp-accounting nor SciPy.
"""

from importlib import import_module

#: Where each public name lives: its module under ``streamdp.privacy``.
_HOME = {
    **dict.fromkeys(["AccountingResult", "DP_ACCOUNTING_VERSION", "NEIGHBOURING_RELATION", "check_privacy_params",
                     "epsilon_of"], "accountant"),
    **dict.fromkeys(["calibrate", "calibrate_gaussian", "calibrate_huber", "calibrate_laplace", "paper_sigma_jain"],
                    "calibration"),
    **dict.fromkeys(["PureDpEvent", "compose", "event_from_dict", "event_to_dict", "gaussian_event", "huber_event",
                     "laplace_event", "parallel", "pure_dp_event"], "events"),
    **dict.fromkeys(["GUARANTEE_APPROX_PREFIX", "GUARANTEE_JOINT_DP", "GUARANTEE_NONE", "GUARANTEE_USER_DP",
                     "SEEDED_NOTE", "Ledger"], "ledger"),
    **dict.fromkeys(["gaussian_noise", "huber_epsilon", "huber_noise", "laplace_noise", "make_rng", "spawn_rngs"],
                    "mechanisms"),
}

__all__ = list(_HOME)


def __getattr__(name: str):
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'streamdp.privacy' has no attribute {name!r}")
    value = getattr(import_module(f"streamdp.privacy.{home}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted({*globals(), *__all__})
