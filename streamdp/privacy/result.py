"""What a ledger records of an accounting, without the accountant: the neighbouring relations, the
dp-accounting version and :class:`AccountingResult`.

Kept apart from :mod:`streamdp.privacy.accountant` so that reading a model's ledger (``recommend``,
``evaluate``) does not import dp-accounting and SciPy (1.5 s and 60 MB per process); the accountant re-exports
every name here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["NEIGHBOURING_RELATION", "BOUNDED_ROW_CHANGE_RELATION", "DP_ACCOUNTING_VERSION", "AccountingResult"]

#: The neighbouring relation of every guarantee streamdp reports (unless its ledger states another one).
NEIGHBOURING_RELATION = "add/remove one user and all of their ratings"

#: The weaker relation of ``streamdp lowrank`` (Hardt & Roth, Def. 2.1, with unit ``L``): the users and items
#: are fixed and public, and one user's row changes by a bounded amount. For a Gaussian release the PLD
#: accountant's epsilon depends only on noise / L2 sensitivity, so it is exact for this relation when every
#: sensitivity is taken under it (see :mod:`streamdp.methods.lowrank`).
BOUNDED_ROW_CHANGE_RELATION = ("one user's row of the clipped matrix changes by a vector of L2 norm at most L "
                               "(bounds.clip_L); users and items fixed and public (Hardt & Roth, Def. 2.1, unit L)")

try:
    from importlib.metadata import version as _version

    DP_ACCOUNTING_VERSION = _version("dp-accounting")
except Exception:  # pragma: no cover - metadata missing in odd installs
    DP_ACCOUNTING_VERSION = "unknown"


@dataclass(frozen=True)
class AccountingResult:
    """Epsilon of a composed event at ``delta``, from PLD (the reported one) and RDP.

    Attributes
    ----------
    epsilon : float
        PLD epsilon (pessimistic upper bound; ``inf`` for a non-private event).
    epsilon_rdp : float
        RDP epsilon, a cross-check (never smaller than ``epsilon`` up to PLD's grid).
    delta : float
    accountant : str
        ``"pld"``: the accountant ``epsilon`` comes from.
    value_discretization_interval : float
        PLD grid width used.
    rdp_order : float
        Renyi order that gave ``epsilon_rdp``.
    dp_accounting_version : str
    """

    epsilon: float
    epsilon_rdp: float
    delta: float
    accountant: str = "pld"
    value_discretization_interval: float = 1e-4
    rdp_order: float = float("nan")
    dp_accounting_version: str = DP_ACCOUNTING_VERSION

    def to_dict(self) -> dict:
        """JSON-ready dict (``inf``/``nan`` kept as floats; ``json`` writes them as Infinity/NaN)."""
        d = asdict(self)
        d["cross_check"] = "rdp"
        d["neighbouring_relation"] = NEIGHBOURING_RELATION
        return d
