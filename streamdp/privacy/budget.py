"""A store's privacy budget and the ledger of everything released from it.

The budget ledger is ``STORE/privacy_budget.json``, a file of its own beside the
Zarr group: the store's ``zarr.json`` attributes and checksum stay exactly as
ingested. Every change is made under an exclusive lock (``fcntl.flock`` on
``STORE/privacy_budget.lock``, so concurrent ``train`` runs serialize) and written
atomically (temporary file + ``os.replace``), so a crash never leaves a torn file.

Life of a release
-----------------
1. ``reserve(ledger)``: before the model is written, the release's events are
   composed with everything already counted; if that would take the store past its
   budget, :class:`~streamdp.errors.BudgetExceededError` (exit code 3) is raised and
   nothing is recorded, unless ``over_budget=True`` (then the entry is recorded
   with ``over_budget: true``). Otherwise the entry is recorded as ``reserved``.
2. ``complete(entry_id)`` once the model is in place, or ``fail(entry_id, reason)``
   if the run failed or was interrupted before releasing anything. Failed entries
   do not count: they released nothing. A run killed so hard that it could mark
   nothing stays ``reserved`` and keeps counting (conservative).

How spends add up
-----------------
The recorded events of all counted entries (``reserved`` and ``complete``) are
composed with the accountant (:func:`streamdp.privacy.accountant.epsilon_of`,
PLD with RDP beside it) at the budget's delta; that epsilon is compared with the
budget. Basic composition (the sums of the entries' epsilons and deltas) is
reported beside it. If some entry has no accountable events (e.g. an approximate
guarantee stated as a bare (epsilon, delta)), the accountant cannot compose it and
basic composition is used for the decision, and the output says so.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import math
import os
import uuid
from pathlib import Path

from streamdp.errors import BudgetExceededError, ParameterError, StoreError
from streamdp.privacy.accountant import check_privacy_params, epsilon_of
from streamdp.privacy.events import compose, event_from_dict
from streamdp.privacy.ledger import GUARANTEE_NONE, Ledger, atomic_write_json, decode_json

__all__ = ["StoreBudget", "BUDGET_FILE", "format_budget"]

BUDGET_FILE = "privacy_budget.json"
LOCK_FILE = "privacy_budget.lock"
BUDGET_FORMAT = "streamdp-privacy-budget"

COUNTED = ("reserved", "complete")


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


class StoreBudget:
    """The budget ledger of the rating store at ``store_path``.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> store = pathlib.Path(tempfile.mkdtemp()); _ = (store / "zarr.json").write_text("{}")
    >>> from streamdp.privacy import Ledger, GUARANTEE_USER_DP, gaussian_event
    >>> b = StoreBudget(store)
    >>> b.set(2.0, 1e-6)
    >>> led = Ledger(method="demo", guarantee=GUARANTEE_USER_DP, epsilon=1.0, delta=1e-6,
    ...              events=[gaussian_event(5.0)])
    >>> entry = b.reserve(led)
    >>> b.complete(entry)
    >>> s = b.show()
    >>> s["spent"]["n_releases"], s["spent"]["epsilon"] < 1.0
    (1, True)
    """

    def __init__(self, store_path: str | os.PathLike):
        self.store = Path(store_path)
        if not self.store.is_dir() or not (self.store / "zarr.json").exists():
            raise StoreError(f"{self.store}: not a rating store (no zarr.json)")
        self.path = self.store / BUDGET_FILE
        self.lock_path = self.store / LOCK_FILE

    # -- storage ---------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self):
        try:
            fh = open(self.lock_path, "a+")
        except OSError as exc:
            raise StoreError(f"{self.lock_path}: cannot lock the budget ledger ({exc.strerror})") from None
        with fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    def _load(self) -> dict:
        if not self.path.exists():
            return {"format": BUDGET_FORMAT, "format_version": 1, "budget": None, "entries": []}
        try:
            with open(self.path) as fh:
                d = decode_json(json.load(fh))
        except json.JSONDecodeError as exc:
            raise StoreError(f"{self.path}: line {exc.lineno}: corrupt budget ledger ({exc.msg})") from None
        if d.get("format") != BUDGET_FORMAT:
            raise StoreError(f"{self.path}: not a streamdp budget ledger")
        return d

    def _save(self, d: dict) -> None:
        atomic_write_json(self.path, d)

    # -- accounting --------------------------------------------------------------------

    @staticmethod
    def _spend(entries: list, delta: float | None) -> dict:
        """Total spend of ``entries``: accountant composition at ``delta`` and basic composition."""
        eps_basic = math.fsum(e["epsilon"] for e in entries)
        delta_basic = math.fsum(e["delta"] for e in entries)
        out = {"n_releases": len(entries), "epsilon_basic": eps_basic, "delta_basic": delta_basic,
               "delta": delta, "epsilon": 0.0 if not entries else float("nan"), "epsilon_rdp": float("nan"),
               "accountant": "pld"}
        if not entries:
            out["epsilon_rdp"] = 0.0
            return out
        if any(e.get("guarantee") == GUARANTEE_NONE or math.isinf(e["epsilon"]) for e in entries):
            out.update(epsilon=float("inf"), epsilon_rdp=float("inf"))
            return out
        if delta is None:
            delta = max(delta_basic, 1e-12) if delta_basic > 0 else 1e-9
            out["delta"] = delta
        if all(e.get("events") for e in entries):
            event = compose([event_from_dict(ev) for e in entries for ev in e["events"]])
            r = epsilon_of(event, delta)
            out.update(epsilon=r.epsilon, epsilon_rdp=r.epsilon_rdp)
        else:
            out.update(epsilon=eps_basic, delta=delta_basic, accountant="basic composition (some releases have "
                       "no accountable events)")
        return out

    def _within(self, spend: dict, budget: dict | None) -> bool:
        if budget is None:
            return True
        if not spend["epsilon"] <= budget["epsilon"] * (1 + 1e-12):
            return False
        return spend["accountant"] == "pld" or spend["delta"] <= budget["delta"]

    # -- public API --------------------------------------------------------------------

    def set(self, epsilon: float, delta: float) -> None:
        """Set the store's total budget ``(epsilon, delta)`` (``epsilon = inf``: unlimited)."""
        check_privacy_params(epsilon, delta)
        with self._locked():
            d = self._load()
            d["budget"] = {"epsilon": float(epsilon), "delta": float(delta), "set": _now()}
            self._save(d)

    def show(self) -> dict:
        """The budget, the total spend (accountant and basic composition) and every entry."""
        d = self._load()
        budget = d.get("budget")
        counted = [e for e in d["entries"] if e["status"] in COUNTED]
        spend = self._spend(counted, budget["delta"] if budget else None)
        remaining = None
        if budget is not None:
            remaining = max(budget["epsilon"] - spend["epsilon"], 0.0) if math.isfinite(spend["epsilon"]) else 0.0
        return {"store": str(self.store), "budget": budget, "spent": spend, "remaining_epsilon": remaining,
                "within_budget": self._within(spend, budget), "entries": d["entries"]}

    def reserve(self, ledger, *, over_budget: bool = False, model: str | None = None) -> str:
        """Record a release before its model is written; refuse it if it would exceed the budget.

        Parameters
        ----------
        ledger : Ledger or dict
            The release's ledger (its events, epsilon, delta, guarantee, method).
        over_budget : bool
            Record and allow a release that exceeds the budget.
        model : str, optional
            Where the model will be written (for the record).

        Returns
        -------
        str
            The entry id, for :meth:`complete` / :meth:`fail`.

        Raises
        ------
        BudgetExceededError
            The store's total would exceed its budget (exit code 3); nothing is recorded.
        """
        led = ledger if isinstance(ledger, Ledger) else Ledger.from_dict(ledger)
        entry = {"id": uuid.uuid4().hex[:12], "status": "reserved", "created": _now(), "finished": None,
                 "method": led.method, "guarantee": led.guarantee, "epsilon": led.epsilon, "delta": led.delta,
                 "events": led.events, "seeded": led.seeded, "store_checksum": led.store_checksum,
                 "model": None if model is None else str(model), "over_budget": False, "reason": None}
        with self._locked():
            d = self._load()
            budget = d.get("budget")
            counted = [e for e in d["entries"] if e["status"] in COUNTED]
            if budget is not None:
                before = self._spend(counted, budget["delta"])
                after = self._spend(counted + [entry], budget["delta"])
                if not self._within(after, budget):
                    if not over_budget:
                        raise BudgetExceededError(
                            f"{self.store}: releasing this {led.method} model (epsilon={led.epsilon:.4g}, "
                            f"delta={led.delta:.3g}) would take the store's spend from epsilon="
                            f"{before['epsilon']:.4g} to {after['epsilon']:.4g} at delta={budget['delta']:.3g}, "
                            f"past its budget epsilon={budget['epsilon']:.4g} ({after['accountant']}); "
                            f"pass --over-budget to release it anyway")
                    entry["over_budget"] = True
            d["entries"].append(entry)
            self._save(d)
        return entry["id"]

    def _finish(self, entry_id: str, status: str, reason: str | None) -> None:
        with self._locked():
            d = self._load()
            for e in d["entries"]:
                if e["id"] == entry_id:
                    if e["status"] != "reserved":
                        raise ParameterError(f"budget entry {entry_id} is already {e['status']}")
                    e["status"], e["finished"], e["reason"] = status, _now(), reason
                    self._save(d)
                    return
        raise ParameterError(f"{self.path}: no budget entry {entry_id!r}")

    def complete(self, entry_id: str) -> None:
        """Mark a reserved release as done (its model was written)."""
        self._finish(entry_id, "complete", None)

    def fail(self, entry_id: str, reason: str) -> None:
        """Mark a reserved release as failed: it released nothing and stops counting."""
        self._finish(entry_id, "failed", str(reason))

    @contextlib.contextmanager
    def release(self, ledger, *, over_budget: bool = False, model: str | None = None):
        """``with budget.release(ledger):`` reserve, then complete on success or fail on any exception.

        Use it around writing the model: an exception (including Ctrl-C) inside
        the block marks the entry failed and propagates.
        """
        entry_id = self.reserve(ledger, over_budget=over_budget, model=model)
        try:
            yield entry_id
        except BaseException as exc:
            self.fail(entry_id, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
            raise
        self.complete(entry_id)


def format_budget(s: dict) -> str:
    """Human-readable summary of :meth:`StoreBudget.show`."""
    b, sp = s["budget"], s["spent"]
    lines = [f"store            {s['store']}"]
    if b is None:
        lines.append("budget           none set (streamdp budget STORE --set EPSILON,DELTA)")
    else:
        lines.append(f"budget           epsilon={b['epsilon']:.6g}  delta={b['delta']:.3g}")
    lines.append(f"spent            epsilon={sp['epsilon']:.6g} at delta={sp['delta'] if sp['delta'] is not None else 0:.3g}"
                 f"  ({sp['accountant']}; RDP {sp['epsilon_rdp']:.6g})  over {sp['n_releases']} release(s)")
    lines.append(f"basic composition epsilon={sp['epsilon_basic']:.6g}  delta={sp['delta_basic']:.3g}")
    if b is not None:
        lines.append(f"remaining        epsilon={s['remaining_epsilon']:.6g}"
                     + ("" if s["within_budget"] else "  (OVER BUDGET)"))
    for e in s["entries"]:
        flag = " over-budget" if e.get("over_budget") else ""
        lines.append(f"  {e['id']}  {e['status']:<8} {e['created']}  {e['method']:<12} epsilon={e['epsilon']:.4g} "
                     f"delta={e['delta']:.3g}{flag}" + (f"  ({e['reason']})" if e.get("reason") else ""))
    return "\n".join(lines)
