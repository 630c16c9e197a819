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
   The entry records its owner (pid, host, boot id and process start time, see
   :mod:`streamdp.owner`) and its stage, ``training``.
2. ``writing(entry_id)`` right before the model write starts (stage ``writing``).
3. ``complete(entry_id)`` once the model is in place, or ``fail(entry_id, reason)``
   if the run failed or was interrupted before releasing anything. Failed entries
   do not count: they released nothing. Ledger updates run with Ctrl-C deferred
   (:func:`streamdp.outputs.deferred_interrupts`), so none is cut in half.

Stale reservations
------------------
A run killed so hard that it could mark nothing (``kill -9``, power loss) leaves its
entry ``reserved``, and it keeps counting. :meth:`StoreBudget.settle`
(``streamdp budget STORE --settle``) looks at every ``reserved`` entry whose owner
is provably gone (:func:`streamdp.owner.owner_status`; a process on another host,
or an entry without an owner, is left alone) and marks it:

* ``complete`` if the model at its recorded path carries its id (``model.json``:
  ``budget_entry``): the model was released;
* ``stale`` otherwise: *counted as spent*, the default, because a missing model
  proves nothing (it may have been written and then moved or deleted);
* ``failed`` (not counted) only with ``refund_unreleased=True``
  (``--refund-unreleased``) and only when it is *proven* that nothing was released:
  the owner is gone, **and** the entry's stage is still ``training`` (``train``
  records ``writing``, fsynced under the lock, before it starts writing the model,
  and a model only becomes visible by the final rename of that write, so a run that
  died in ``training`` never put a model in place), **and** nothing at the recorded
  model path carries the entry's id. The proof also rests on ``train`` producing no
  other output derived from the data before the model (true of every method here:
  progress lines count epochs and blocks only, run state stays in a private run
  directory); that is why the refund is an explicit choice and not the default.

Replaced stores
---------------
``ingest --force`` / ``generate --force`` over a store carry its ledger over into
the new store (:func:`carried_over`), with a ``history`` record of the replacement
(when, by what, old and new checksum): the people in the old data are likely in the
new data, and what was spent on them is never forgotten. ``--budget`` on such an
ingest changes only the total, not the entries.

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
from streamdp.outputs import deferred_interrupts
from streamdp.owner import current_owner, describe_owner, owner_status
from streamdp.privacy.accountant import NEIGHBOURING_RELATION, check_privacy_params, epsilon_of
from streamdp.privacy.events import compose, event_from_dict
from streamdp.privacy.ledger import GUARANTEE_NONE, GUARANTEE_PUBLIC_ONLY, Ledger, atomic_write_json, decode_json

__all__ = ["StoreBudget", "BUDGET_FILE", "carried_over", "format_budget"]

BUDGET_FILE = "privacy_budget.json"
LOCK_FILE = "privacy_budget.lock"
BUDGET_FORMAT = "streamdp-privacy-budget"

#: Statuses whose entries count as spent (``stale``: reserved by a run that is gone, see ``settle``).
COUNTED = ("reserved", "complete", "stale")


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
        with fh, deferred_interrupts():
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
        """Total spend of ``entries``: accountant composition at ``delta`` and basic composition.

        Releases that use no protected data (``GUARANTEE_PUBLIC_ONLY``: public users only) spend nothing and are
        counted as releases only.
        """
        n_releases = len(entries)
        entries = [e for e in entries if e.get("guarantee") != GUARANTEE_PUBLIC_ONLY]
        eps_basic = math.fsum(e["epsilon"] for e in entries)
        delta_basic = math.fsum(e["delta"] for e in entries)
        out = {"n_releases": n_releases, "epsilon_basic": eps_basic, "delta_basic": delta_basic,
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
        # a spend that composes releases under different relations holds for the weakest of them only
        relations = sorted({e.get("neighbouring_relation", NEIGHBOURING_RELATION) for e in counted})
        return {"store": str(self.store), "budget": budget, "spent": spend, "remaining_epsilon": remaining,
                "within_budget": self._within(spend, budget), "entries": d["entries"],
                "history": d.get("history", []), "neighbouring_relations": relations}

    def preview(self, ledgers) -> dict:
        """What releasing all of ``ledgers`` would spend, computed before any of them runs.

        Returns ``budget``, the counted spend ``before``, the spend ``after`` adding
        them, the spend of the ``sweep`` alone (all composed by the accountant at the
        budget's delta, or at the ledgers' largest delta without a budget) and
        ``within_budget``. Nothing is recorded.
        """
        d = self._load()
        budget = d.get("budget")
        counted = [e for e in d["entries"] if e["status"] in COUNTED]
        new = []
        for led in ledgers:
            led = led if isinstance(led, Ledger) else Ledger.from_dict(led)
            new.append({"method": led.method, "guarantee": led.guarantee, "epsilon": led.epsilon,
                        "delta": led.delta, "events": led.events})
        delta = budget["delta"] if budget else max([e["delta"] for e in new] or [1e-9])
        after = self._spend(counted + new, delta)
        return {"budget": budget, "before": self._spend(counted, delta), "after": after,
                "sweep": self._spend(new, delta), "within_budget": self._within(after, budget)}

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
                 "model": None if model is None else str(model), "over_budget": False, "reason": None,
                 "owner": current_owner(), "stage": "training", "neighbouring_relation": led.relation}
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

    def _update(self, entry_id: str, change) -> None:
        """``change(entry)`` on entry ``entry_id`` under the lock; it returns True when it changed it."""
        with self._locked():
            d = self._load()
            for e in d["entries"]:
                if e["id"] == entry_id:
                    if change(e):
                        self._save(d)
                    return
        raise ParameterError(f"{self.path}: no budget entry {entry_id!r}")

    def _finish(self, entry_id: str, status: str, reason: str | None) -> None:
        def change(e):
            if e["status"] == status:  # marked already (e.g. again after an interrupt)
                return False
            if e["status"] != "reserved":
                raise ParameterError(f"budget entry {entry_id} is already {e['status']}")
            e["status"], e["finished"], e["reason"] = status, _now(), reason
            return True

        self._update(entry_id, change)

    def writing(self, entry_id: str) -> None:
        """Record that the release's model write starts now (stage ``writing``; see "Stale reservations")."""
        def change(e):
            if e["status"] != "reserved":
                raise ParameterError(f"budget entry {entry_id} is already {e['status']}")
            e["stage"] = "writing"
            return True

        self._update(entry_id, change)

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

    def settle(self, *, refund_unreleased: bool = False) -> list[dict]:
        """Settle the reservations of runs that are gone (see "Stale reservations" above).

        Returns one dict per entry looked at (every ``reserved`` one, and with
        ``refund_unreleased`` every ``stale`` one): ``id``, ``before``, ``after``
        (the status now) and ``why``.
        """
        report = []
        with self._locked():
            d = self._load()
            changed = False
            for e in d["entries"]:
                if e["status"] != "reserved" and not (refund_unreleased and e["status"] == "stale"):
                    continue
                after, why = _settled(e, refund_unreleased)
                report.append({"id": e["id"], "before": e["status"], "after": after, "why": why})
                if after != e["status"]:
                    e["status"], e["finished"], e["reason"] = after, _now(), "settled: " + why
                    changed = True
            if changed:
                self._save(d)
        return report


def _settled(e: dict, refund_unreleased: bool) -> tuple[str, str]:
    """The status a ``reserved`` (or ``stale``) entry settles to, and why."""
    from streamdp.model import model_budget_entry

    owner, status = e.get("owner"), owner_status(e.get("owner"))
    who = describe_owner(owner)
    if status == "alive":
        return e["status"], f"its run ({who}) is still going"
    if status == "unknown":
        if owner is None:
            return e["status"], "no owner recorded (reserved by an older streamdp); counted as spent"
        return e["status"], f"its run ({who}) cannot be checked from this host; settle it there"
    model = e.get("model")
    if model and model_budget_entry(model) == e["id"]:
        return "complete", f"its run ({who}) is gone and its model {model} is in place: released"
    if e.get("stage") == "training":
        if refund_unreleased:
            return "failed", f"its run ({who}) is gone and never began writing its model: nothing released"
        return "stale", (f"its run ({who}) is gone; counted as spent (it never began writing its model: "
                         f"--refund-unreleased would mark it failed)")
    return "stale", f"its run ({who}) is gone, maybe while writing its model {model}; counted as spent"


def _store_checksum(store: Path) -> str | None:
    try:
        with open(store / "zarr.json") as fh:
            return json.load(fh)["attributes"]["streamdp"].get("checksum")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


@contextlib.contextmanager
def carried_over(old_store: str | os.PathLike, new_store: str | os.PathLike, *, by: str,
                 checksum: str | None = None):
    """``with carried_over(old, new): <replace old by new>``: the old store's ledger moves into the new one.

    Holds the old ledger's lock for the whole block (no release can be recorded in
    between) and, if the old store has a ledger, writes it into ``new_store`` first
    with a ``history`` record ``{"event": "data replaced", "at", "by", "old_checksum",
    "new_checksum", "n_entries"}``. Every entry keeps counting against the new
    store's budget. A corrupt old ledger raises :class:`StoreError` and nothing is
    replaced.
    """
    old = StoreBudget(old_store)
    with old._locked():
        if old.path.exists():
            d = old._load()
            d.setdefault("history", []).append({
                "event": "data replaced", "at": _now(), "by": by, "old_checksum": _store_checksum(old.store),
                "new_checksum": checksum, "n_entries": len(d["entries"])})
            atomic_write_json(Path(new_store) / BUDGET_FILE, d)
        yield


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
    weaker = [r for r in s.get("neighbouring_relations", []) if r != NEIGHBOURING_RELATION]
    if weaker:
        lines.append(f"relation         some releases hold only for a weaker relation than add/remove one user "
                     f"({'; '.join(weaker)}): the spend above holds for that relation, not for add/remove")
    for e in s["entries"]:
        flag = " over-budget" if e.get("over_budget") else ""
        note = e.get("reason") or (f"{describe_owner(e.get('owner'))}, {e.get('stage', '?')}"
                                   if e["status"] == "reserved" else None)
        lines.append(f"  {e['id']}  {e['status']:<8} {e['created']}  {e['method']:<12} epsilon={e['epsilon']:.4g} "
                     f"delta={e['delta']:.3g}{flag}" + (f"  ({note})" if note else ""))
    for h in s.get("history", []):
        lines.append(f"  {h['at']}  data replaced by {h['by']} ({h['old_checksum']} -> {h['new_checksum']}); "
                     f"the {h['n_entries']} release(s) before it still count")
    return "\n".join(lines)
