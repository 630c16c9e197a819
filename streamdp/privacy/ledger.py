"""The privacy ledger of a model: ``privacy.json`` in every trained model directory.

It says what was released and under which guarantee, so that the claim can be
re-checked: guarantee type, epsilon and delta, the neighbouring relation (add/remove
one user and all of their ratings; ``streamdp lowrank``'s ledgers state the weaker
``BOUNDED_ROW_CHANGE_RELATION`` with ``GUARANTEE_ROW_DP``), the accountant and its version, every event
with all of its parameters, the contribution bounds, whether the run was seeded,
the store's checksum, and notes. :meth:`Ledger.recompute` recomposes the recorded
events with the accountant and must give the recorded epsilon.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from streamdp.errors import ParameterError, StoreError
from streamdp.jsonio import atomic_write_json, encode_json
from streamdp.privacy.result import DP_ACCOUNTING_VERSION, NEIGHBOURING_RELATION, AccountingResult

__all__ = [
    "Ledger",
    "LEDGER_FILE",
    "GUARANTEE_USER_DP",
    "GUARANTEE_JOINT_DP",
    "GUARANTEE_NONE",
    "GUARANTEE_ROW_DP",
    "GUARANTEE_APPROX_PREFIX",
    "GUARANTEE_PUBLIC_ONLY",
    "GUARANTEE_PRIVATE_USERS_DP",
    "GUARANTEE_NOT_DP_PREFIX",
    "SEEDED_NOTE",
    "encode_json",
    "privacy_warnings",
    "decode_json",
]

LEDGER_FILE = "privacy.json"
LEDGER_FORMAT = "streamdp-privacy-ledger"
LEDGER_VERSION = 1

GUARANTEE_USER_DP = "user-level (epsilon, delta)-DP"
GUARANTEE_JOINT_DP = "joint user-level (epsilon, delta)-DP"
GUARANTEE_NONE = "non-private"
#: The guarantee of ``streamdp lowrank``: DP under ``BOUNDED_ROW_CHANGE_RELATION`` (the ledger's relation).
GUARANTEE_ROW_DP = ("row-level (epsilon, delta)-DP: one user's clipped row changes by L2 norm <= L "
                    "(Hardt & Roth); weaker than user-level add/remove")
#: Guarantees that are not rigorous start with this, e.g. "approximate: SGLD ...".
GUARANTEE_APPROX_PREFIX = "approximate:"
#: A model estimated from public users' data only (``--method public-private``): nothing about the private users'
#: ratings is released (epsilon 0 for them, no events; a store budget counts nothing).
GUARANTEE_PUBLIC_ONLY = "private users' ratings are not used; public users' data is public (not protected)"
#: DP for the private users' releases only, the public users' data being public (``public-private --private-mechanism
#: laplace``).
GUARANTEE_PRIVATE_USERS_DP = ("user-level (epsilon, delta)-DP for private users; public users' data is public "
                              "(not protected)")
#: Mechanisms that are not differential privacy start with this, e.g. "not DP: first-order deniability ...": no
#: epsilon (the ledger's is inf), no events; a store budget counts them as unbounded.
GUARANTEE_NOT_DP_PREFIX = "not DP:"

SEEDED_NOTE = ("the run was seeded: it is reproducible, and NOT private against whoever knows the seed "
               "(the noise can be regenerated and subtracted)")
UNSEEDED_NOTE = "noise drawn from OS entropy (no seed given)"


def _check_guarantee(g: str) -> str:
    if g in (GUARANTEE_USER_DP, GUARANTEE_JOINT_DP, GUARANTEE_NONE, GUARANTEE_ROW_DP, GUARANTEE_PUBLIC_ONLY,
             GUARANTEE_PRIVATE_USERS_DP) or (
            isinstance(g, str) and any(g.startswith(p) and len(g) > len(p)
                                       for p in (GUARANTEE_APPROX_PREFIX, GUARANTEE_NOT_DP_PREFIX))):
        return g
    raise ParameterError(f"guarantee: expected one of {GUARANTEE_USER_DP!r}, {GUARANTEE_JOINT_DP!r}, "
                         f"{GUARANTEE_NONE!r} or a string starting with {GUARANTEE_APPROX_PREFIX!r}, got {g!r}")


_FLOAT_KEYS = {"epsilon", "delta", "epsilon_rdp", "rdp_order", "value_discretization_interval",
               "epsilon_basic", "budget_epsilon", "budget_delta", "spent_epsilon", "spent_delta"}


def decode_json(obj):
    """Inverse of :func:`encode_json` for the float fields of ledgers and budgets."""
    if isinstance(obj, dict):
        return {k: (float(v) if k in _FLOAT_KEYS and isinstance(v, str) else decode_json(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode_json(v) for v in obj]
    return obj


@dataclass
class Ledger:
    """What a model released and under which guarantee (``privacy.json``).

    Parameters
    ----------
    method : str
        The method name (registry key).
    guarantee : str
        One of the ``GUARANTEE_*`` constants or ``"approximate: ..."``.
    epsilon, delta : float
        The guarantee (``epsilon = inf`` for ``GUARANTEE_NONE``).
    events : list of dict or DpEvent
        What was spent, in order (DpEvents are stored via ``event_to_dict``).
    accounting : AccountingResult or None
        The accountant's result for the composition of ``events``.
    bounds : dict
        Contribution bounds: ``tau``, ``L``, weights summary, sensitivities...
    seeded : bool
        Whether a seed was given (reproducible, not private against its holder).
    store_checksum : str
        Checksum of the rating store trained on (kept in the store's budget entry; never
        written into ``privacy.json``: a hash of the data identifies it, see
        :mod:`streamdp.storage.fingerprint`).
    store_fingerprint : str
        The keyed fingerprint of that store, written in its place.
    public_parameters : dict
        What the release publishes exactly, and why (:func:`streamdp.manifest.public_parameters`).
    notes : list of str

    Examples
    --------
    >>> from streamdp.privacy.events import gaussian_event
    >>> from streamdp.privacy.accountant import epsilon_of
    >>> ev = gaussian_event(5.0, 4)
    >>> led = Ledger(method="demo", guarantee=GUARANTEE_USER_DP, epsilon=2.0, delta=1e-6, events=[ev],
    ...              accounting=epsilon_of(ev, 1e-6), bounds={"tau": 50, "L": 1.0}, seeded=True,
    ...              store_checksum="blake2b:00")
    >>> d = led.to_dict()
    >>> d["neighbouring_relation"], d["seeded"], d["events"][0]["count"]
    ('add/remove one user and all of their ratings', True, 4)
    """

    method: str
    guarantee: str
    epsilon: float
    delta: float
    events: list = field(default_factory=list)
    accounting: AccountingResult | None = None
    bounds: dict = field(default_factory=dict)
    seeded: bool = False
    store_checksum: str = ""
    notes: list = field(default_factory=list)
    store_fingerprint: str = ""
    public_parameters: dict = field(default_factory=dict)
    #: The neighbouring relation the guarantee holds for (another one than the default only with
    #: ``GUARANTEE_ROW_DP``: ``streamdp lowrank``).
    relation: str = NEIGHBOURING_RELATION
    #: The digest of the model's ``model.json`` as released (:func:`streamdp.manifest.released_digest`; set when
    #: the model is written, checked when it is loaded).
    model_digest: str = ""
    #: The per-user guarantee of a store with a user budget (:func:`streamdp.privacy.filter.statement`).
    individual: dict = field(default_factory=dict)

    def __post_init__(self):
        _check_guarantee(self.guarantee)
        if (self.guarantee == GUARANTEE_ROW_DP) != (self.relation != NEIGHBOURING_RELATION):
            raise ParameterError(f"ledger: the guarantee {self.guarantee!r} does not go with the neighbouring "
                                 f"relation {self.relation!r}")
        self.epsilon = float(self.epsilon)
        self.delta = float(self.delta)
        self.events = [dict(e) if isinstance(e, dict) else _event_dict(e) for e in self.events]
        if self.guarantee == GUARANTEE_NONE:
            if not math.isinf(self.epsilon):
                raise ParameterError("a non-private ledger must have epsilon = inf")
        elif self.guarantee == GUARANTEE_PUBLIC_ONLY or self.guarantee.startswith(GUARANTEE_NOT_DP_PREFIX):
            want = 0.0 if self.guarantee == GUARANTEE_PUBLIC_ONLY else math.inf
            if self.epsilon != want or self.delta != 0 or self.events or self.accounting is not None:
                raise ParameterError(f"ledger: {self.guarantee!r} claims no DP release: epsilon must be {want}, "
                                     f"delta 0, and no events be accounted")
        elif not (self.epsilon > 0) or not (0 < self.delta < 1) and self.delta != 0:
            raise ParameterError(f"ledger: invalid (epsilon, delta) = ({self.epsilon}, {self.delta})")
        if self.accounting is not None and self.guarantee != GUARANTEE_NONE and math.isfinite(self.epsilon):
            if self.accounting.epsilon > self.epsilon * (1 + 1e-9):
                raise ParameterError(f"ledger: the accountant's epsilon {self.accounting.epsilon:.6g} exceeds the "
                                     f"claimed epsilon {self.epsilon:.6g}")

    def event(self):
        """The composition of the recorded events, as one ``dp_accounting.DpEvent``."""
        from streamdp.privacy.events import compose, event_from_dict

        return compose([event_from_dict(e) for e in self.events])

    def recompute(self) -> AccountingResult:
        """Recompose the recorded events with the accountant (at the recorded delta)."""
        from streamdp.privacy.accountant import epsilon_of

        return epsilon_of(self.event(), self.delta if self.delta > 0 else 1e-12)

    def to_dict(self) -> dict:
        """The ``privacy.json`` content (non-finite floats as strings via :func:`encode_json`)."""
        acc = self.accounting.to_dict() if self.accounting is not None else None
        if acc is not None:
            acc["neighbouring_relation"] = self.relation
        return {
            "format": LEDGER_FORMAT,
            "format_version": LEDGER_VERSION,
            "method": self.method,
            "guarantee": self.guarantee,
            "epsilon": self.epsilon,
            "delta": None if self.guarantee == GUARANTEE_NONE else self.delta,  # no delta without a guarantee
            "neighbouring_relation": self.relation,
            "unit_of_privacy": "user",
            "accountant": {
                "name": "dp-accounting PLD",
                "cross_check": "dp-accounting RDP",
                "library": "dp-accounting",
                "version": DP_ACCOUNTING_VERSION,
            },
            "accounting": acc,
            "events": self.events,
            "bounds": self.bounds,
            "seeded": bool(self.seeded),
            "seed_note": SEEDED_NOTE if self.seeded else UNSEEDED_NOTE,
            "store_fingerprint": self.store_fingerprint,
            "notes": list(self.notes),
            **({"public_parameters": self.public_parameters} if self.public_parameters else {}),
            **({"model_digest": self.model_digest} if self.model_digest else {}),
            **({"individual_privacy": self.individual} if self.individual else {}),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Ledger":
        """Rebuild a ledger from :meth:`to_dict` output (or parsed ``privacy.json``)."""
        d = decode_json(d)
        acc = d.get("accounting")
        if acc is not None:
            fields = AccountingResult.__dataclass_fields__
            acc = AccountingResult(**{k: v for k, v in acc.items() if k in fields})
        try:
            return cls(method=d["method"], guarantee=d["guarantee"], epsilon=d["epsilon"],
                       delta=0.0 if d["delta"] is None else d["delta"],
                       events=d.get("events", []), accounting=acc, bounds=d.get("bounds", {}),
                       seeded=bool(d.get("seeded", False)), store_checksum=d.get("store_checksum", ""),
                       notes=d.get("notes", []), store_fingerprint=d.get("store_fingerprint", ""),
                       public_parameters=d.get("public_parameters", {}),
                       relation=d.get("neighbouring_relation", NEIGHBOURING_RELATION),
                       model_digest=d.get("model_digest", ""), individual=d.get("individual_privacy", {}))
        except KeyError as exc:
            raise StoreError(f"privacy ledger: missing field {exc}") from None

    def write(self, model_dir: str | os.PathLike) -> Path:
        """Write ``privacy.json`` into ``model_dir`` atomically (temp file + ``os.replace``)."""
        path = Path(model_dir) / LEDGER_FILE
        atomic_write_json(path, self.to_dict())
        return path

    @classmethod
    def read(cls, model_dir: str | os.PathLike) -> "Ledger":
        """Read ``privacy.json`` from ``model_dir`` (or the file itself)."""
        path = Path(model_dir)
        if path.is_dir():
            path = path / LEDGER_FILE
        try:
            with open(path) as fh:
                d = json.load(fh)
        except FileNotFoundError:
            raise StoreError(f"{path}: no privacy ledger") from None
        except json.JSONDecodeError as exc:
            raise StoreError(f"{path}: line {exc.lineno}: not a valid privacy ledger ({exc.msg})") from None
        return cls.from_dict(d)


def privacy_warnings(ledger) -> list[str]:
    """The ledger notes that qualify its guarantee (printed on stderr by the CLI, not only kept in the ledger).

    An observed (not declared) rating range, an approximate or unproven guarantee, a
    seeded run, or a release that is the private biases only.
    """
    keys = ("observed from the data", "approximate", "no privacy proof", "seeded", "NO privacy", "no factors")
    out = [n for n in getattr(ledger, "notes", []) if any(k in n for k in keys)]
    g = getattr(ledger, "guarantee", "")
    if g.startswith("approximate:") and not any(n.startswith("approximate") for n in out):
        out.insert(0, "the guarantee is approximate: " + g[len("approximate:"):].strip())
    if g.startswith("not DP:"):
        out.insert(0, "the guarantee is NOT differential privacy: " + g[len("not DP:"):].strip())
    return out


def _event_dict(event) -> dict:
    """A ``dp_accounting.DpEvent`` as the ledger records it (the accountant is imported only by who builds events:
    reading a ledger needs neither it nor SciPy)."""
    from streamdp.privacy.events import event_to_dict

    return event_to_dict(event)
