"""A store's privacy budget and the ledger of everything released from it.

The ledger is ``STORE/privacy_budget.json``, beside the Zarr group (the store's
attributes and checksum stay as ingested). Every change is made under an exclusive
lock (``STORE/privacy_budget.lock``), first appended to a hash-chained journal
(``STORE/privacy_budget.journal``, :mod:`streamdp.privacy.journal`) and then written
atomically; ``STORE/release_witness`` records the journal's length and last hash a
second time. Public names: :class:`StoreBudget` (``reserve``, ``release``, ``writing``,
``complete``, ``fail``, ``settle``, ``set``, ``show``, ``restore``, ``data_replaced``),
:func:`carried_over`, :func:`format_budget`, :func:`parse_budget`, the file names
:data:`BUDGET_FILE`, :data:`LOCK_FILE`, :data:`WITNESS_FILE` and :data:`COUNTED`.

Decisions a reader must know:

* **a release is reserved before the model is written**, its events composed with
  everything counted; past the budget it is refused
  (:class:`~streamdp.errors.BudgetExceededError`, exit 3) unless ``over_budget``. Then
  ``writing``, then ``complete`` or ``fail`` (failed entries released nothing and do
  not count); updates run with Ctrl-C deferred;
* **a stale reservation keeps counting**: ``settle`` marks an entry whose owner is
  provably gone ``complete`` (its model carries the entry's id) or ``stale`` (counted);
  ``failed`` only with ``--refund-unreleased`` and a proof that nothing was released;
* **spent budget is never forgotten**: replacing a store's data (``--force``) carries
  the ledger and journal over (:func:`carried_over`; on object storage the ledger
  stays at the URL, :meth:`StoreBudget.data_replaced`); a ledger that is missing,
  invalid, unlike its journal, or a journal cut or edited, refuses ``train``,
  ``budget`` and ``ingest --force`` with one line saying how to recover
  (``--restore`` or a backup);
* on object storage the journal is one object per change, created with a conditional
  write; a change that loses the race is redone from a fresh read
  (:data:`CONFLICT_RETRIES`);
* the spend is the PLD composition (RDP beside it) of every counted entry's events at
  the budget's delta, continued from the previous one (:mod:`streamdp.privacy.spend`);
  basic composition is reported beside it and decides when an entry has no
  accountable events.

Every case in full (the recovery table, where the witness lives and why, the proof
behind a refund): ``docs/design-notes.md``, section ``streamdp/privacy/budget.py``.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import fcntl
import functools
import json
import math
import os
import random
import shutil
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

from streamdp.errors import BudgetExceededError, ParameterError, StoreError
from streamdp.model_dir import model_budget_entry
from streamdp.outputs import deferred_interrupts
from streamdp.owner import current_owner, describe_owner, owner_status
from streamdp.privacy.result import NEIGHBOURING_RELATION
from streamdp.privacy.journal import (
    GENESIS,
    JOURNAL_FILE,
    Journal,
    JournalError,
    LedgerInvalid,
    apply_record,
    canonical,
    copy_state,
    decoded,
    check_state,
    empty_state,
    make_lines,
    read_journal,
    state_text,
)
from streamdp.privacy.object_journal import JOURNAL_OBJECTS, Conflict, append_objects, read_object_journal
from streamdp.storage import remote
from streamdp.storage.fingerprint import KEY_FILE as KEY_FILE_NAME, key_id, key_path, release_key
from streamdp.storage.schema import is_store_dir
from streamdp.privacy.ledger import (
    GUARANTEE_NONE,
    GUARANTEE_PUBLIC_ONLY,
    Ledger,
    atomic_write_json,
    encode_json,
)

__all__ = ["StoreBudget", "BUDGET_FILE", "JOURNAL_FILE", "LOCK_FILE", "WITNESS_FILE", "carried_over",
           "format_budget", "shown"]

BUDGET_FILE = "privacy_budget.json"
LOCK_FILE = "privacy_budget.lock"
#: The journal's length and head, recorded a second time (see "The journal's witness").
WITNESS_FILE = "release_witness"
WITNESS_FORMAT = "streamdp-release-witness"
#: History records after which the entries before them no longer say which release key the store has.
_KEY_RESETS = ("data replaced", "release key lost", "ledger lost")
BUDGET_FORMAT = "streamdp-privacy-budget"
#: Written into the lock file when the store's journal is started: a third witness that the store had a ledger.
MARKER = "streamdp privacy budget journal started"

#: Statuses whose entries count as spent (``stale``: reserved by a run that is gone, see ``settle``).
COUNTED = ("reserved", "complete", "stale")


def _lazy(name: str):
    """``streamdp.privacy.NAME`` imported when first used: the accountant, events, filter and spend modules load
    dp-accounting (0.65 s), which a ledger needs to compose or cap a spend, not to be checked or to record that
    the store's data changed (``ingest --append`` onto a store with a ledger did both, and paid the import)."""
    import importlib

    return importlib.import_module(f"streamdp.privacy.{name}")


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


#: How often a change to a ledger on object storage is tried again after another run changed it first.
CONFLICT_RETRIES = 50


def _retried(method):
    """Run ``method`` again, from reading the ledger on, when its change lost the race to another run's
    (:class:`~streamdp.privacy.object_journal.Conflict`, object storage only: nothing of it was written)."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        for attempt in range(CONFLICT_RETRIES):
            try:
                return method(self, *args, **kwargs)
            except Conflict:
                time.sleep(random.uniform(0.0, min(1.0, 0.02 * 2 ** attempt)))
        raise StoreError(f"{self.path}: {CONFLICT_RETRIES} other runs changed the budget ledger while this one "
                         f"tried to; nothing of this change was recorded, run it again")
    return wrapper


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
        self.remote = remote.is_url(store_path)
        if self.remote:  # on object storage: see "Object storage" above
            self.store = str(store_path).rstrip("/")
            if not is_store_dir(self.store):
                if not remote.exists(self.store):
                    raise StoreError(f"{self.store}: does not exist")
                why = remote.incomplete_reason(self.store)
                raise StoreError(f"{self.store}: not a rating store " + (f"yet: {why}" if why else "(no zarr.json)"))
            self.path = remote.join(self.store, BUDGET_FILE)
            self.journal_path = remote.join(self.store, JOURNAL_OBJECTS)
            self.lock_path = remote.join(self.store, LOCK_FILE)
            self.witness_path = remote.join(self.store, WITNESS_FILE)
            return
        self.store = Path(store_path)
        if not self.store.is_dir() or not (self.store / "zarr.json").exists():
            if not os.path.lexists(self.store):
                raise StoreError(f"{self.store}: does not exist")
            raise StoreError(f"{self.store}: not a rating store (no zarr.json)")
        self.path = self.store / BUDGET_FILE
        self.journal_path = self.store / JOURNAL_FILE
        self.lock_path = self.store / LOCK_FILE
        self.witness_path = self.store / WITNESS_FILE

    # -- storage ---------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self):
        if self.remote:  # no lock: each change is a conditional create (object_journal), retried on a conflict
            with deferred_interrupts():
                yield
            return
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

    def _restore_hint(self) -> str:
        return f"`streamdp budget {self.store} --restore`"

    def _read_ledger(self) -> tuple[dict | None, str | None]:
        """The decoded, schema-checked ledger (``None`` if there is none), or the one-line reason it is unusable."""
        p = self.path
        try:
            if self.remote:
                text = remote.read_bytes(p)
                if text is None:
                    return None, None
                raw = json.loads(text)
            else:
                if not os.path.lexists(p):
                    return None, None
                if p.is_dir():
                    return None, f"{p}: a directory, not a budget ledger"
                with open(p) as fh:
                    raw = json.load(fh)
        except json.JSONDecodeError as exc:
            return None, f"{p}: line {exc.lineno}: corrupt budget ledger ({exc.msg})"
        except UnicodeDecodeError:
            return None, f"{p}: corrupt budget ledger (not UTF-8 text)"
        except OSError as exc:
            return None, f"{p}: cannot read the budget ledger ({exc.strerror})"
        if not isinstance(raw, dict):
            return None, f"{p}: not a streamdp budget ledger (a JSON {type(raw).__name__}, not an object)"
        if raw.get("format") != BUDGET_FORMAT:
            return None, f"{p}: not a streamdp budget ledger"
        d = decoded(raw)
        try:
            check_state(d)
        except LedgerInvalid as exc:
            return None, f"{p}: {exc}"
        head = d.get("journal")
        if head is not None and not (isinstance(head, dict) and isinstance(head.get("head"), str)
                                     and isinstance(head.get("lines"), int) and head["lines"] >= 0):
            return None, f"{p}: its journal head is {head!r}, not {{'lines': N, 'head': HASH}}"
        return d, None

    def _inspect(self) -> _State:
        """The ledger checked against its journal (see "Journal" above); never raises for a bad ledger or journal.

        The ledger is read before the journal: a lock-free reader racing a writer
        (journal first, then ledger) then sees the journal at or ahead of the ledger.
        """
        ledger, ledger_err = self._read_ledger()
        head = (ledger or {}).get("journal")
        try:
            at = head["lines"] if head else None
            j = read_object_journal(self.store, at=at) if self.remote else read_journal(self.journal_path, at=at)
        except JournalError as exc:
            return _State(problem=f"{self.journal_path}: {exc.what if exc.line == 0 else exc}; the journal cannot "
                          f"be trusted: restore {BUDGET_FILE} and {JOURNAL_FILE} from a backup")
        except OSError as exc:
            return _State(problem=f"{self.journal_path}: cannot read the budget journal ({exc.strerror})")
        if j is not None and not j.records:
            j = None  # empty: a first append that never completed
        witness, witness_err = self._read_witness()
        if j is not None:
            st = self._against_journal(ledger, ledger_err, j)
            if st.problem is None or st.restorable == "rebuild":  # the journal is the record: check it is whole
                st = self._against_witness(st, j, witness, witness_err)
            return st
        recorded = (ledger or {}).get("journal")
        # what says the store had a ledger, when its journal is gone
        tells = [f"{LOCK_FILE} shows the store had one"] if _has_marker(self.lock_path) else []
        if witness is not None and witness["lines"] > 0:
            tells.append(f"{WITNESS_FILE} records its line {witness['lines']}")
        gone = "empty" if not self.remote and os.path.lexists(self.journal_path) else "missing"
        restart = (f"restore it from a backup, or start a new journal from the ledger as it is with "
                   f"{self._restore_hint()} (recorded in its history)")
        if ledger_err is not None:
            if tells:
                return _State(problem=f"{ledger_err}; and {JOURNAL_FILE} is missing ({tells[0]}): restore both "
                              f"from a backup")
            return _State(problem=ledger_err)
        if ledger is None:
            if self._has_key():
                tells.append(f"its release key {KEY_FILE_NAME} shows it released models")
            if tells:
                return _State(restorable="both-lost", problem=(
                    f"{self.path}: missing, and so is {JOURNAL_FILE}, but {' and '.join(tells)}: a store that "
                    f"released must not release again without its history; what it recorded cannot be recovered "
                    f"here (each released model's privacy.json still states its spend): restore both from a backup, "
                    f"or start an empty ledger with {self._restore_hint()} (recorded in its history)"))
            return _State(mode="fresh", d=_new_ledger(empty_state()))
        if recorded is not None and recorded["lines"] > 0:
            return _State(d=ledger, restorable="journal-lost", problem=(
                f"{self.journal_path}: {gone} (the ledger {BUDGET_FILE} was written at its line "
                f"{recorded['lines']}); {restart}"))
        if tells:
            return _State(d=ledger, restorable="journal-lost", problem=(
                f"{self.journal_path}: {gone} ({tells[0]}); {restart}"))
        return _State(mode="legacy", d=ledger)

    def _read_witness(self) -> tuple[dict | None, str | None]:
        """The journal's witness ``{"lines", "head"}`` (None if there is none), or why it is unusable."""
        p = self.witness_path
        try:
            if self.remote:
                raw = remote.read_bytes(p)
            elif os.path.lexists(p):
                with open(p, "rb") as fh:
                    raw = fh.read(65536)
            else:
                raw = None
        except OSError as exc:
            return None, f"{p}: cannot read the budget journal's witness ({exc.strerror or exc})"
        if raw is None:
            return None, None
        try:
            w = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            w = None
        if not (isinstance(w, dict) and w.get("format") == WITNESS_FORMAT and type(w.get("lines")) is int
                and w["lines"] >= 0 and isinstance(w.get("head"), str) and len(w["head"]) == 64):
            return None, (f"{p}: not a budget journal witness (edited or damaged): restore it from a backup, or "
                          f"rewrite it from {JOURNAL_FILE} with {self._restore_hint()} (recorded in its history)")
        return w, None

    def _against_witness(self, st: _State, j: Journal, witness: dict | None, witness_err: str | None) -> _State:
        """``st`` unless the witness shows the journal was cut (or replaced): see "The journal's witness"."""
        if witness_err is not None:
            return _State(journal=j, d=st.d, restorable="witness", problem=witness_err)
        if witness is None or witness["lines"] == 0:
            return st
        n, w = len(j.records), witness["lines"]
        if w > n:
            return _State(journal=j, restorable="truncated", witness_lines=w, problem=(
                f"{self.journal_path}: ends at line {n}, but {WITNESS_FILE} recorded its line {w}: lines were cut "
                f"off its end; restore {BUDGET_FILE} and {JOURNAL_FILE} from a backup, or rebuild the ledger from "
                f"the lines that remain with {self._restore_hint()} (what the missing lines recorded is then not "
                f"counted; recorded in its history)"))
        if j.records[w - 1]["hash"] != witness["head"]:
            return _State(problem=(
                f"{self.journal_path}: its line {w} is not the one {WITNESS_FILE} recorded (another hash): the "
                f"journal was replaced or rewritten; it cannot be trusted: restore {BUDGET_FILE}, {JOURNAL_FILE} "
                f"and {WITNESS_FILE} from a backup"))
        return st

    def _has_key(self) -> bool:
        """Whether the store has a release key (made by its first release: it released)."""
        try:
            return remote.exists(key_path(self.store)) if self.remote else os.path.lexists(key_path(self.store))
        except OSError:
            return False

    def _key_problem(self, d: dict) -> str | None:
        """Why a release may not use the store's release key as it is (None: it may): see "Journal"."""
        expected = _expected_key(d)
        if expected is None:
            return None
        kid, n, last = expected
        where = key_path(self.store)
        try:
            key = release_key(self.store, create=False)
        except StoreError as exc:
            return f"{exc}; the budget ledger records {n} release(s) fingerprinted with it (the last: entry {last})"
        if key is not None and key_id(key) == kid:
            return None
        what = "missing" if key is None else f"not the key the store released with ({key_id(key)}, not {kid})"
        return (f"{where}: {what}, but the budget ledger records {n} release(s) fingerprinted with it (the last: "
                f"entry {last}); a new key would leave every model released before unmatched by `evaluate`: "
                f"restore it from a backup, or accept a new key with {self._restore_hint()} (recorded in its "
                f"history)")

    def _against_journal(self, ledger: dict | None, ledger_err: str | None, j: Journal) -> _State:
        fix = f"restore it from the journal with {self._restore_hint()}"
        if ledger is None and ledger_err is None and self.remote:
            # on object storage the journal is the record: the ledger is written after it, and a run killed in
            # between leaves none (its first change) or one behind (see object_journal); rolled forward
            return _State(mode="journal", d=_new_ledger(j.state), journal=j, pending=len(j.records))
        if ledger is None:
            if ledger_err is None:
                return _State(journal=j, restorable="rebuild", problem=(
                    f"{self.path}: missing (the store had a budget ledger: {j.n_entries} entries in {JOURNAL_FILE}); "
                    f"restore it with {self._restore_hint()}"))
            return _State(journal=j, restorable="rebuild",
                          problem=f"{ledger_err}; {JOURNAL_FILE} verifies: {fix}")
        recorded, n = ledger.get("journal"), len(j.records)
        if recorded is None:
            diff = "it records no journal head (a copy from before the journal was started?)"
        elif recorded["lines"] > n:
            return _State(d=ledger, journal=j, restorable="journal-lost", problem=(
                f"{self.journal_path}: ends at line {n}, but the ledger {BUDGET_FILE} was written at its line "
                f"{recorded['lines']}: lines were removed; restore both from a backup, or start a new journal from "
                f"the ledger as it is with {self._restore_hint()} (recorded in its history)"))
        elif recorded["head"] != ([GENESIS] + [r["hash"] for r in j.records])[recorded["lines"]]:
            diff = f"its journal head (line {recorded['lines']}) is not the journal's hash of that line"
        else:
            diff = _difference(ledger, j.at_text)
        if diff is not None:
            return _State(journal=j, restorable="rebuild", problem=(
                f"{self.path}: does not match {JOURNAL_FILE}: {diff}; it was edited or replaced: {fix}"))
        # the journal may be ahead of the ledger: a crash between its append and the ledger's write
        d = _new_ledger(j.state, copied=False)
        d["journal"] = recorded
        return _State(mode="journal", d=d, journal=j, pending=n - recorded["lines"])

    def _checked(self, *, key: bool = False) -> _State:
        """The usable ledger, or :class:`StoreError`; ``key``: also check the store's release key (a release, or
        showing the ledger; not the runs finishing their entries, which must not be stopped by a deleted key)."""
        st = self._inspect()
        if st.problem is None and key:
            problem = self._key_problem(st.d)
            if problem is not None:
                st = replace(st, problem=problem, restorable="key-lost")
        if st.problem is not None:
            raise StoreError(st.problem)
        return st

    def _load(self) -> dict:
        return self._checked().d

    def _commit(self, st: _State, records: list[dict]) -> dict:
        """Append ``records`` to the journal (adopting a ledger that has none first), then replace the ledger."""
        if st.mode == "legacy":
            records = [_adopt(st.d, {"event": "journal started", "at": _now(), "n_entries": len(st.d["entries"])}),
                       *records]
        if self.remote:
            d = append_objects(self.store, BUDGET_FILE, st.journal, records, _new_ledger)
            _write_witness(self.witness_path, d["journal"])
        else:
            d = _append(self.path, self.journal_path, self.lock_path, st.journal, records)
        st.d, st.mode = d, "journal"
        return d

    # -- accounting --------------------------------------------------------------------

    def _composer(self) -> SpendComposer:
        """Composes the ledger's releases from where the last composition stopped (:mod:`streamdp.privacy.spend`)."""
        spend = _lazy("spend")
        return spend.SpendComposer(remote.join(self.store, spend.SPEND_FILE) if self.remote else
                                   self.store / spend.SPEND_FILE)

    @staticmethod
    def _spend(entries: list, delta: float | None, composer: SpendComposer | None = None, *,
               fresh: bool = False) -> dict:
        """Total spend of ``entries``: accountant composition at ``delta`` and basic composition.

        Releases that use no protected data (``GUARANTEE_PUBLIC_ONLY``: public users only) spend nothing and are
        counted as releases only. ``composer``: continues from compositions kept beside the ledger (the same
        floats as composing from scratch, :mod:`streamdp.privacy.spend`); ``fresh``: composes from scratch, trusting
        none of them. A continued composition below the largest single release's epsilon (a ledger entry whose
        delta is at least ``delta``: a composition never spends less than one of its releases) is a forged or
        damaged cache: composed again from scratch.
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
            composer = composer or _lazy("spend").SpendComposer(None)
            lists = [e["events"] for e in entries]
            eps, eps_rdp = composer.recompose(lists, delta) if fresh else composer.spend(lists, delta)
            single = max((e["epsilon"] for e in entries if e["delta"] >= delta), default=0.0)
            # an entry's epsilon is its target (>= what it achieved): a tolerance for calibration's slack
            if not fresh and composer.checked and eps < single * (1.0 - 1e-3):
                eps, eps_rdp = composer.recompose(lists, delta)
            out.update(epsilon=eps, epsilon_rdp=eps_rdp)
        else:
            out.update(epsilon=eps_basic, delta=delta_basic, accountant="basic composition (some releases have "
                       "no accountable events)")
        return out

    def _confirmed(self, entries: list, spend: dict, budget: dict | None, composer: SpendComposer) -> dict:
        """``spend`` (of ``entries``, at the budget's delta), composed again from scratch when the budget's decision
        rests on the cached PLD: within the budget by it, but not by an upper bound that needs no cached PLD: the
        RDP epsilon (its vector is checked against the releases' own on every use, :mod:`streamdp.privacy.spend`)
        or basic composition (each entry's own epsilon and delta summed). A forged cache that lowers the spend then
        cannot let a release past the budget; a store whose bound is within its budget pays nothing more."""
        if budget is None or spend["accountant"] != "pld" or not self._within(spend, budget):
            return spend
        if spend["epsilon_rdp"] <= budget["epsilon"] or (spend["epsilon_basic"] <= budget["epsilon"]
                                                         and spend["delta_basic"] <= budget["delta"]):
            return spend
        return self._spend(entries, budget["delta"], composer, fresh=True)

    def verify(self) -> dict:
        """The counted releases composed from scratch beside the spend the composition cache gives (both at the
        budget's delta, or at the entries' summed delta without a budget): ``{"cached", "recomposed", "match"}``
        (epsilons). Reads the ledger and the cache; a mismatching cache is replaced by the recomposed states."""
        d = self._checked().d
        budget = d.get("budget")
        counted = [e for e in d["entries"] if e["status"] in COUNTED]
        delta = budget["delta"] if budget else None
        spend = _lazy("spend")
        cached = self._spend(counted, delta, spend.SpendComposer(self._composer().cache, checked=False))["epsilon"]
        composer = spend.SpendComposer(self._composer().cache)
        fresh = self._spend(counted, delta, composer, fresh=True)["epsilon"]
        match = cached == fresh or (math.isinf(cached) and math.isinf(fresh))
        if not match:
            composer.save()
        return {"cached": cached, "recomposed": fresh, "match": match, "n_releases": len(counted)}

    def _within(self, spend: dict, budget: dict | None) -> bool:
        if budget is None:
            return True
        if not spend["epsilon"] <= budget["epsilon"] * (1 + 1e-12):
            return False
        return spend["accountant"] == "pld" or spend["delta"] <= budget["delta"]

    # -- public API --------------------------------------------------------------------

    def check(self) -> None:
        """Raise :class:`StoreError` (one line, how to recover) if the ledger cannot be used."""
        self._checked()

    def key_problem(self) -> str | None:
        """Why the store's release key is not the one its releases were fingerprinted with (missing, or another),
        in one line; None if it is, or if the ledger cannot tell (none, or unusable: :meth:`check` says why)."""
        st = self._inspect()
        return None if st.problem is not None or st.mode == "fresh" else self._key_problem(st.d)

    @_retried
    def data_replaced(self, *, by: str, old_checksum: str | None, new_checksum: str | None) -> None:
        """Record in the history that the store's data was replaced (the releases before it keep counting).

        Used on object storage, where the ledger stays at the store's URL when its data is replaced
        (on a local disk :func:`carried_over` moves it into the new store). Nothing is written when the store
        has no ledger.
        """
        with self._locked():
            st = self._checked()
            if st.mode == "fresh":
                return
            self._commit(st, [{"at": _now(), "op": "history", "record": {
                "event": "data replaced", "at": _now(), "by": by, "old_checksum": old_checksum,
                "new_checksum": new_checksum, "n_entries": len(st.d["entries"])}}])

    @_retried
    def set(self, epsilon: float, delta: float) -> None:
        """Set the store's total budget ``(epsilon, delta)`` (``epsilon = inf``: unlimited)."""
        _lazy("accountant").check_privacy_params(epsilon, delta)
        with self._locked():
            st = self._checked()
            self._commit(st, [{"at": _now(), "op": "budget",
                               "budget": {"epsilon": float(epsilon), "delta": float(delta), "set": _now()}}])

    @_retried
    def set_user(self, epsilon: float, delta: float, *, n_users: int) -> dict:
        """Set the per-user lifetime cap ``(epsilon, delta)`` (:mod:`streamdp.privacy.filter`); returns its record.

        Decision: a cap is set once. It may be set again to the same values (nothing is written), or replaced
        while no release was made under it; after one, its order ``alpha`` fixes what every user's accumulated RDP
        means, so another cap (looser or tighter) is refused. The releases counted before it are charged to
        every one of the store's ``n_users`` users now (``carried_rdp``, their RDP at ``alpha`` composed by
        dp-accounting): users appended later start at zero.
        """
        if self.remote:
            raise ParameterError(f"{self.store}: a per-user budget keeps per-user state beside the store: on a local "
                                 f"disk only")
        params = _lazy("filter").filter_parameters(epsilon, delta)
        with self._locked():
            st = self._checked()
            d = st.d
            old = d.get("user_budget")
            if old is not None and (old["epsilon"], old["delta"]) == (params["epsilon"], params["delta"]):
                return old
            if old is not None and _lazy("filter").current(d["entries"]) is not None:
                raise ParameterError(f"{self.store}: already has a per-user budget epsilon={old['epsilon']:g}, "
                                     f"delta={old['delta']:g}, and releases were made under it: it cannot be "
                                     f"changed (each user's spend is accounted at its Renyi order)")
            counted = [e for e in d["entries"] if e["status"] in COUNTED]
            carried = 0.0
            for e in counted:
                if e.get("guarantee") == GUARANTEE_PUBLIC_ONLY:
                    continue
                try:
                    ev = _lazy("events")
                    carried += _lazy("accountant").rdp_at_order(
                        ev.compose([ev.event_from_dict(x) for x in e.get("events") or []]),
                        params["alpha"]) if e.get("events") else math.inf
                except ParameterError:  # a (0, delta) event: no Renyi bound
                    carried = math.inf
            record = {**params, "set": _now(), "carried_rdp": carried, "carried_users": int(n_users),
                      "carried_releases": len(counted)}
            self._commit(st, [{"at": _now(), "op": "user_budget", "user_budget": record}])
            return record

    def user_budget(self) -> dict | None:
        """The per-user cap and its filter (``None``: the store has none)."""
        return self._load().get("user_budget")

    def filter_view_state(self) -> tuple[dict | None, str | None]:
        """``(user budget, current generation)``: what a release's view of the store reads."""
        d = self._load()
        return d.get("user_budget"), _lazy("filter").current(d["entries"])

    def show(self, n_users: int | None = None) -> dict:
        """The budget, the total spend (accountant and basic composition) and every entry; with a per-user budget,
        ``user_budget`` and, given the store's ``n_users``, ``users``: the distribution of their spend."""
        d = self._checked(key=True).d
        budget = d.get("budget")
        counted = [e for e in d["entries"] if e["status"] in COUNTED]
        composer = self._composer()
        spend = self._confirmed(counted, self._spend(counted, budget["delta"] if budget else None, composer),
                                budget, composer)
        composer.save()
        remaining = None
        if budget is not None:
            remaining = max(budget["epsilon"] - spend["epsilon"], 0.0) if math.isfinite(spend["epsilon"]) else 0.0
        # a spend that composes releases under different relations holds for the weakest of them only
        relations = sorted({e.get("neighbouring_relation", NEIGHBOURING_RELATION) for e in counted})
        out = {"store": str(self.store), "budget": budget, "spent": spend, "remaining_epsilon": remaining,
               "within_budget": self._within(spend, budget), "entries": d["entries"],
               "history": d.get("history", []), "neighbouring_relations": relations}
        if d.get("user_budget") is not None:
            out["user_budget"] = d["user_budget"]
            if n_users is not None:
                out["users"] = _lazy("filter").distribution(self.store, d["user_budget"], d["entries"], n_users)
        return out

    def entries(self) -> list[dict]:
        """The ledger's entries, read and checked without writing anything (not even the composition cache):
        what a rehearsal reads to find the statistics the store has already released."""
        return list(self._load()["entries"])

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
        composer = self._composer()
        before = self._spend(counted, delta, composer)
        after = self._confirmed(counted + new, self._spend(counted + new, delta, composer), budget, composer)
        composer.save()
        return {"budget": budget, "before": before, "after": after,
                "sweep": self._spend(new, delta), "within_budget": self._within(after, budget)}

    @_retried
    def reserve(self, ledger, *, over_budget: bool = False, model: str | None = None, user_filter=None) -> str:
        """Record a release before its model is written; refuse it if it would exceed the budget.

        Parameters
        ----------
        ledger : Ledger or dict
            The release's ledger (its events, epsilon, delta, guarantee, method).
        over_budget : bool
            Record and allow a release that exceeds the budget.
        model : str, optional
            Where the model will be written (for the record).
        user_filter : FilterRequest, optional
            On a store with a per-user budget (required there): the release's users, its generation advanced
            here (:func:`streamdp.privacy.filter.advance`), recorded in the entry's ``user_filter``.

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
            st = self._checked(key=True)
            d = st.d
            budget = d.get("budget")
            counted = [e for e in d["entries"] if e["status"] in COUNTED]
            if budget is not None:
                composer = self._composer()
                before = self._spend(counted, budget["delta"], composer)
                after = self._confirmed(counted + [entry], self._spend(counted + [entry], budget["delta"], composer),
                                        budget, composer)
                composer.save()  # the next reservation continues from one of these two
                if not self._within(after, budget):
                    if not over_budget:
                        raise BudgetExceededError(
                            f"{self.store}: releasing this {led.method} model (epsilon={led.epsilon:.4g}, "
                            f"delta={led.delta:.3g}) would take the store's spend from epsilon="
                            f"{before['epsilon']:.4g} to {after['epsilon']:.4g} at delta={budget['delta']:.3g}, "
                            f"past its budget epsilon={budget['epsilon']:.4g} ({after['accountant']}); "
                            f"pass --over-budget to release it anyway")
                    entry["over_budget"] = True
            # the key its model's fingerprint will use (made now by the store's first release): recorded, so that
            # a key deleted later is seen (see _key_problem) instead of silently made again
            self._filtered(d, entry, user_filter)  # before anything else is made: a refusal leaves nothing
            entry["release_key"] = key_id(release_key(self.store, create=True))
            try:
                self._commit(st, [{"at": _now(), "op": "reserve", "entry": entry}])
            finally:  # a generation whose entry was not recorded, or one superseded: removed
                if d.get("user_budget") is not None:
                    _lazy("filter").prune(self.store, st.d["entries"])
        return entry["id"]

    def _filtered(self, d: dict, entry: dict, request) -> None:
        """With a per-user budget: advance the filter for ``entry`` (its ``user_filter`` record)."""
        ub = d.get("user_budget")
        if ub is None:
            return
        if request is None:
            raise ParameterError(f"{self.store}: has a per-user budget, and this release was prepared without it "
                                 f"(it cannot leave retired users out, or the cap was set while it ran): refused, "
                                 f"nothing released; only `streamdp train` releases from such a store")
        entry["user_filter"] = request.result = _lazy("filter").advance(self.store, ub, d["entries"], entry, request)

    @_retried
    def _update(self, entry_id: str, by: str, change) -> None:
        """Under the lock, ``change(entry)`` returns the fields of entry ``entry_id`` to set (None: nothing to do);
        they are journaled as made ``by`` (``writing``, ``complete``, ``fail``) and written."""
        with self._locked():
            st = self._checked()
            for e in st.d["entries"]:
                if e["id"] == entry_id:
                    fields = change(e)
                    if fields:
                        self._commit(st, [{"at": _now(), "op": "update", "id": entry_id, "by": by, "set": fields}])
                    return
        raise ParameterError(f"{self.path}: no budget entry {entry_id!r}")

    def _finish(self, entry_id: str, status: str, reason: str | None) -> None:
        def change(e):
            if e["status"] == status:  # marked already (e.g. again after an interrupt)
                return None
            if e["status"] != "reserved":
                raise ParameterError(f"budget entry {entry_id} is already {e['status']}")
            return {"status": status, "finished": _now(), "reason": reason}

        self._update(entry_id, {"complete": "complete", "stale": "spent"}.get(status, "fail"), change)

    def writing(self, entry_id: str) -> None:
        """Record that the release's model write starts now (stage ``writing``; see "Stale reservations")."""
        def change(e):
            if e["status"] != "reserved":
                raise ParameterError(f"budget entry {entry_id} is already {e['status']}")
            return {"stage": "writing"} if e.get("stage") != "writing" else None

        self._update(entry_id, "writing", change)

    def complete(self, entry_id: str) -> None:
        """Mark a reserved release as done (its model was written)."""
        self._finish(entry_id, "complete", None)

    def spent(self, entry_id: str, reason: str) -> None:
        """Mark a reserved release that failed after noisy values left the process (``--checkpoint``) as
        ``stale``: it keeps counting, and no settle can refund it (its stage is ``writing``)."""
        self._finish(entry_id, "stale", str(reason))

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

    @_retried
    def settle(self, *, refund_unreleased: bool = False) -> list[dict]:
        """Settle the reservations of runs that are gone (see "Stale reservations" above).

        Returns one dict per entry looked at (every ``reserved`` one, and with
        ``refund_unreleased`` every ``stale`` one): ``id``, ``before``, ``after``
        (the status now), ``changed`` (``before != after``) and ``why``. Idempotent: an
        entry whose status stays is not written again (a ``stale`` entry that stays
        stale is reported as ``changed: false``, not settled a second time).
        """
        report = []
        with self._locked():
            st = self._checked()
            records = []
            for e in st.d["entries"]:
                if e["status"] != "reserved" and not (refund_unreleased and e["status"] == "stale"):
                    continue
                after, why = _settled(e, refund_unreleased)
                report.append({"id": e["id"], "before": e["status"], "after": after,
                               "changed": after != e["status"], "why": why})
                if after != e["status"]:
                    records.append({"at": _now(), "op": "update", "id": e["id"], "by": "settle",
                                    "set": {"status": after, "finished": _now(), "reason": "settled: " + why}})
            if records:
                self._commit(st, records)
        return report

    def restore(self) -> dict:
        """``streamdp budget STORE --restore``: make the ledger usable again from what the store still has.

        * the journal verifies: the ledger is rebuilt from it (a missing, unreadable,
          invalid or edited ledger; one behind its journal after a crash);
        * the journal is missing (or shorter than the ledger says) and the ledger is
          valid: a new journal starts from the ledger as it is;
        * both are missing but the lock file shows there was a ledger: an empty one
          starts. The last two are recorded in the ledger's history, shown by
          ``streamdp budget``; a ledger that already agrees with its journal is left as it is.

        A replaced file is kept beside it as ``NAME.replaced-TIME``. Returns ``restored``
        (whether anything was written), ``what`` (one line) and ``set_aside`` (paths).
        A journal that does not verify cannot be restored from: :class:`StoreError`.
        """
        if self.remote:
            return self._restore_remote()
        with self._locked():
            st = self._inspect()
            aside = []
            if st.problem is None:
                if st.mode != "fresh" and self._key_problem(st.d) is not None:
                    return self._accept_key(st)
                if st.mode == "fresh":
                    return {"restored": False, "what": "nothing to restore: the store has no budget ledger",
                            "set_aside": []}
                if st.mode == "legacy":
                    self._commit(st, [])
                    return {"restored": True, "what": f"started {JOURNAL_FILE} from the ledger (written before "
                            "journals existed)", "set_aside": []}
                if st.pending:
                    self._commit(st, [])
                    return {"restored": True, "what": f"rewrote {BUDGET_FILE} from {JOURNAL_FILE}: {st.pending} "
                            "change(s) journaled just before a crash are now in it", "set_aside": []}
                return {"restored": False, "what": f"nothing to restore: {BUDGET_FILE} agrees with {JOURNAL_FILE}",
                        "set_aside": []}
            if st.restorable in _FROM_JOURNAL:
                if st.d is None and os.path.lexists(self.path):
                    aside.append(_set_aside(self.path))
                if st.restorable == "witness" and os.path.lexists(self.witness_path):
                    aside.append(_set_aside(self.witness_path))
                records, what = self._journal_repair(st)
                _append(self.path, self.journal_path, self.lock_path, st.journal, records)
            elif st.restorable == "journal-lost":
                if os.path.lexists(self.journal_path):
                    aside.append(_set_aside(self.journal_path))
                _append(self.path, self.journal_path, self.lock_path, None, [_adopt(st.d, {
                    "event": "journal restarted", "at": _now(), "n_entries": len(st.d["entries"])})])
                what = f"started a new {JOURNAL_FILE} from {BUDGET_FILE} as it is ({len(st.d['entries'])} entries)"
            elif st.restorable == "both-lost":
                _append(self.path, self.journal_path, self.lock_path, None, [_adopt(empty_state(), {
                    "event": "ledger lost", "at": _now(), "n_entries": 0})])
                what = (f"started an empty {BUDGET_FILE}: the releases recorded before are not counted (their "
                        "models' privacy.json state what each spent)")
            else:
                raise StoreError(st.problem)
            return {"restored": True, "what": what, "set_aside": aside}

    def _journal_repair(self, st: _State) -> tuple[list[dict], str]:
        """The history record that rewrites the ledger (and the witness) from a journal that verifies, and what
        it did (``st.restorable``: ``rebuild``, ``truncated`` or ``witness``)."""
        j = st.journal
        n, entries = len(j.records), j.n_entries
        record = {"event": {"rebuild": "ledger rebuilt", "truncated": "journal truncated",
                            "witness": "witness rewritten"}[st.restorable], "at": _now(), "n_entries": entries}
        if st.restorable == "truncated":
            record.update(lines=n, recorded_lines=st.witness_lines)
            what = (f"rebuilt {BUDGET_FILE} from the {n} lines that remain of {JOURNAL_FILE} ({WITNESS_FILE} "
                    f"recorded {st.witness_lines}; {entries} entries): what the missing lines recorded is not counted")
        elif st.restorable == "witness":
            what = f"rewrote {WITNESS_FILE} (and {BUDGET_FILE}) from {JOURNAL_FILE} ({n} lines, {entries} entries)"
        else:
            what = f"rebuilt {BUDGET_FILE} from {JOURNAL_FILE} ({n} lines, {entries} entries)"
        return [{"at": _now(), "op": "history", "record": record}], what

    def _accept_key(self, st: _State) -> dict:
        """``--restore`` of a release key that is missing or another one (see :meth:`_key_problem`): recorded in
        the history, after which the key in place (or, if none, a new one the next release makes) is the store's."""
        kid, _, _ = _expected_key(st.d)
        key = release_key(self.store, create=False)  # a damaged key file: StoreError (restore or remove it)
        found = key_id(key) if key is not None else None
        self._commit(st, [{"at": _now(), "op": "history", "record": {
            "event": "release key lost", "at": _now(), "n_entries": len(st.d["entries"]), "key": kid,
            "found": found}}])
        what = (f"accepted the release key in place ({found}) instead of {kid}" if found else
                f"recorded that the release key {kid} is lost; the next release makes a new one")
        return {"restored": True, "what": what + ": models released before no longer match this store",
                "set_aside": []}

    @_retried
    def _restore_remote(self) -> dict:
        """:meth:`restore` on object storage: the journal objects are the record, so the repairs are to rewrite
        ``privacy_budget.json`` (and the witness) from them, or to accept a lost release key; a journal that is lost
        or does not verify must come back from a backup (a new journal cannot be started safely beside objects that
        may reappear)."""
        st = self._inspect()
        if st.problem is None and st.mode != "fresh" and self._key_problem(st.d) is not None:
            return self._accept_key(st)
        if st.problem is None and st.mode == "fresh":
            return {"restored": False, "what": "nothing to restore: the store has no budget ledger", "set_aside": []}
        if st.problem is None and st.mode == "journal" and not st.pending:
            return {"restored": False, "what": f"nothing to restore: {BUDGET_FILE} agrees with its journal",
                    "set_aside": []}
        if st.journal is None or (st.problem is not None and st.restorable not in _FROM_JOURNAL):
            raise StoreError(f"{st.problem or self.path + ': no journal to restore from'}; on object storage "
                             f"--restore only rewrites {BUDGET_FILE} from the journal objects "
                             f"({JOURNAL_OBJECTS}/): restore them from a backup")
        if st.problem is None:
            st.restorable = "rebuild"
        records, what = self._journal_repair(st)
        self._commit(st, records)
        return {"restored": True, "what": what.replace(JOURNAL_FILE, "its journal"), "set_aside": []}


#: What ``--restore`` repairs by rewriting the ledger from a journal that verifies.
_FROM_JOURNAL = ("rebuild", "truncated", "witness")


@dataclass
class _State:
    """What :meth:`StoreBudget._inspect` found: the ledger ``d`` to work on and how it stands.

    ``mode``: ``fresh`` (no ledger yet), ``legacy`` (a ledger written before journals: adopted at its next change),
    ``journal`` (verified against its journal, ``pending`` journal lines ahead of it). ``problem``: why it is
    refused (one line); ``restorable``: what ``--restore`` does about it (``rebuild``, ``truncated``,
    ``witness``, ``journal-lost``, ``both-lost``, ``key-lost``), None if it cannot. ``witness_lines``: the
    journal's length its witness recorded, when the journal is shorter.
    """

    mode: str | None = None
    d: dict | None = None
    journal: Journal | None = None
    pending: int = 0
    problem: str | None = None
    witness_lines: int = 0
    restorable: str | None = None


def _new_ledger(state: dict, *, copied: bool = True) -> dict:
    """A ledger holding ``state`` (``copied=False``: its very objects, for a state nothing else holds)."""
    part = {"budget": state.get("budget"), "entries": state["entries"], "history": state.get("history", [])}
    if state.get("user_budget") is not None:
        part["user_budget"] = state["user_budget"]
    return {"format": BUDGET_FORMAT, "format_version": 1, **(copy.deepcopy(part) if copied else part)}


def _adopt(d: dict, note: dict) -> dict:
    """The first journal record of a ledger taken as it is, with ``note`` appended to its history."""
    return {"at": _now(), "op": "adopt", "state": {"budget": d.get("budget"), "entries": d["entries"],
                                                   "history": [*d.get("history", []), note],
                                                   **({"user_budget": d["user_budget"]} if d.get("user_budget")
                                                      else {})}}


def _expected_key(d: dict) -> tuple[str, int, str] | None:
    """``(key id, n, last entry id)``: the release key the counted entries since the data was last replaced (or
    the key or ledger was lost) were fingerprinted with, ``n`` of them; None if none records one."""
    start = 0
    for h in d.get("history", []):
        if h.get("event") in _KEY_RESETS and type(h.get("n_entries")) is int:
            start = h["n_entries"]
    keyed = [e for e in d["entries"][start:] if e["status"] in COUNTED and isinstance(e.get("release_key"), str)]
    return (keyed[-1]["release_key"], len(keyed), keyed[-1]["id"]) if keyed else None


def _witness_bytes(head: dict) -> bytes:
    return (json.dumps({"format": WITNESS_FORMAT, "lines": head["lines"], "head": head["head"]}) + "\n").encode()


def _write_witness(path: Path | str, head: dict) -> None:
    """Record the journal's ``head`` (``{"lines", "head"}``) in its witness; best effort: a witness that could not
    be written lags behind the journal, which it may (see "The journal's witness")."""
    tmp = None
    try:
        if remote.is_url(path):
            remote.put(str(path), _witness_bytes(head))
            return
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as fh:
            fh.write(_witness_bytes(head))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _has_marker(lock_path: Path | str) -> bool:
    """Whether the lock file says a journal was started (see "Journal"); an old streamdp left it empty."""
    if remote.is_url(lock_path):  # only in a store copied from a local disk
        try:
            return MARKER.encode() in (remote.read_bytes(str(lock_path)) or b"")[:4096]
        except OSError:
            return False
    try:
        with open(lock_path, "rb") as fh:
            return MARKER.encode() in fh.read(4096)
    except OSError:
        return False


def _mark(lock_path: Path) -> None:
    """Write the marker into the lock file (best effort: without it one witness of the ledger is missing)."""
    if _has_marker(lock_path):
        return
    try:
        with open(lock_path, "a") as fh:
            fh.write(f"{MARKER} {_now()}\n")
            fh.flush()
            os.fsync(fh.fileno())
    except OSError:
        pass


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _append(ledger_path: Path, journal_path: Path, lock_path: Path, journal: Journal | None,
            records: list[dict]) -> dict:
    """Append ``records`` to the journal (``journal``: as read; None: start one) and fsync it, then replace the
    ledger with the state they lead to (its ``journal`` head on the last line). Either both happen or, on an
    error, the journal is cut back to what it was and the ledger is left as it was. Returns the ledger."""
    state = copy_state(journal.state) if journal is not None else empty_state()
    lines = make_lines(records, journal.head if journal is not None else GENESIS,
                       len(journal.records) + 1 if journal is not None else 1)
    for r in lines:
        apply_record(state, decoded(encode_json(r)))  # exactly what a replay of the written line gives
    d = _new_ledger(state, copied=False)  # the state is this function's own copy
    n = (len(journal.records) if journal is not None else 0) + len(lines)
    d["journal"] = {"file": JOURNAL_FILE, "lines": n, "head": lines[-1]["hash"] if lines else journal.head}
    created = journal is None or not os.path.exists(journal_path)
    keep = 0 if created else journal.size
    text = "".join(canonical(r) + "\n" for r in lines)
    if journal is not None and not created and not journal.newline:
        text = "\n" + text

    def cut_back():
        try:
            if created:
                os.unlink(journal_path)
            else:
                os.truncate(journal_path, keep)
        except OSError:
            pass  # left ahead of the ledger: the next load rolls it forward (counted, never forgotten)

    try:
        if created and os.path.lexists(journal_path):
            os.unlink(journal_path)  # an empty journal whose first append never completed
        elif not created and journal.file_size > keep:
            os.truncate(journal_path, keep)  # a torn last line: never recorded
        with open(journal_path, "ab") as fh:
            fh.write(text.encode())
            fh.flush()
            os.fsync(fh.fileno())
        if created:
            _fsync_dir(journal_path.parent)
        atomic_write_json(ledger_path, d, dumps=_ledger_text)
    except BaseException as exc:
        cut_back()
        if isinstance(exc, OSError) and exc.filename is None:  # the ledger (its journal) was not updated: name it
            exc.filename = str(ledger_path)
        raise
    _write_witness(journal_path.parent / WITNESS_FILE, d["journal"])
    if created:
        _mark(lock_path)
    return d


def _ledger_text(d: dict) -> str:
    """The ledger's JSON text: one entry (and history record) a line, each encoded by the C encoder (``indent``
    makes json use its pure-Python encoder: a third of a change's time on a ledger of 400 releases)."""
    def one(v) -> str:
        try:
            return json.dumps(v, allow_nan=False)
        except ValueError:  # a non-finite float (a non-private release's epsilon): as a string
            return json.dumps(encode_json(v), allow_nan=False)

    parts = []
    for k, v in d.items():
        if isinstance(v, list) and v:
            v = "[\n" + ",\n".join("    " + one(x) for x in v) + "\n  ]"
        else:
            v = one(v)
        parts.append(f"  {json.dumps(k)}: {v}")
    return "{\n" + ",\n".join(parts) + "\n}"


def _set_aside(path: Path) -> str:
    """Rename ``path`` to ``path.replaced-TIME`` (kept: what ``--restore`` replaced)."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    dest = f"{path}.replaced-{stamp}"
    k = 1
    while os.path.lexists(dest):
        k += 1
        dest = f"{path}.replaced-{stamp}-{k}"
    os.rename(path, dest)
    return dest


def _difference(ledger: dict, journal_state: str) -> str | None:
    """The first difference between the ledger's state and the journal's (canonical text) at its head, or None."""
    text = state_text(ledger)
    if text == journal_state:  # canonical texts: equal exactly when the states are
        return None
    mine, theirs = json.loads(text), json.loads(journal_state)
    if mine["budget"] != theirs["budget"]:
        return f"the budget is {_short(mine['budget'])} in the ledger, {_short(theirs['budget'])} in the journal"
    a = {e["id"]: e for e in mine["entries"]}
    b = {e["id"]: e for e in theirs["entries"]}
    for eid in b:
        if eid not in a:
            return f"entry {eid} ({b[eid]['status']}) is missing from the ledger"
    for eid in a:
        if eid not in b:
            return f"entry {eid} is not in the journal"
        if a[eid] != b[eid]:
            for key in ("status", "stage", "epsilon", "delta"):
                if a[eid].get(key) != b[eid].get(key):
                    return (f"entry {eid}: {key} is {a[eid].get(key)} in the ledger, {b[eid].get(key)} in "
                            f"the journal")
            keys = sorted(k for k in set(a[eid]) | set(b[eid]) if a[eid].get(k) != b[eid].get(k))
            return f"entry {eid}: {', '.join(keys)} differ"
    if list(a) != list(b):
        return "the entries are in another order"
    return "the history differs"


def _short(b) -> str:
    return "none" if b is None else f"epsilon={b.get('epsilon')}, delta={b.get('delta')}"


def _settled(e: dict, refund_unreleased: bool) -> tuple[str, str]:
    """The status a ``reserved`` (or ``stale``) entry settles to, and why."""
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
    between) and, if the old store has a ledger, writes it and its journal into
    ``new_store`` first with a ``history`` record ``{"event": "data replaced", "at",
    "by", "old_checksum", "new_checksum", "n_entries"}`` (journaled too; a ledger from
    before journals gets its journal started there). Every entry keeps counting
    against the new store's budget. An old ledger that is corrupt, missing while its
    journal says it existed, or unlike its journal raises :class:`StoreError` and
    nothing is replaced. A per-user budget's state (:mod:`streamdp.privacy.filter`) moves too when the same users
    keep their rows (``by="compact"``); replacing the data of a store that has one is refused (its users' spend is
    tied to their rows).
    """
    old = StoreBudget(old_store)
    new = Path(new_store)
    with old._locked():
        st = old._checked()
        if st.mode != "fresh" and st.d.get("user_budget") is not None:
            if by != "compact":
                raise StoreError(f"{old.store}: has a per-user budget, and each user's spend is tied to her row: "
                                 f"its data cannot be replaced (add data with `streamdp ingest NEW --append "
                                 f"{old.store}`, or write the new data to a new store)")
            filter_dir = _lazy("filter").FILTER_DIR
            if (old.store / filter_dir).is_dir():
                shutil.copytree(old.store / filter_dir, new / filter_dir)
        if st.mode != "fresh":
            record = {"event": "data replaced", "at": _now(), "by": by, "old_checksum": _store_checksum(old.store),
                      "new_checksum": checksum, "n_entries": len(st.d["entries"])}
            records = [{"at": _now(), "op": "history", "record": record}]
            journal = None
            if st.mode == "legacy":
                records.insert(0, _adopt(st.d, {"event": "journal started", "at": _now(),
                                                "n_entries": len(st.d["entries"])}))
            else:  # the verified lines move over as they are (a torn last line does not)
                text = "\n".join(st.journal.lines) + "\n"
                with open(new / JOURNAL_FILE, "w") as fh:
                    fh.write(text)
                    fh.flush()
                    os.fsync(fh.fileno())
                journal = replace(st.journal, path=new / JOURNAL_FILE, size=len(text.encode()),
                                  file_size=len(text.encode()), newline=True)
            _append(new / BUDGET_FILE, new / JOURNAL_FILE, new / LOCK_FILE, journal, records)
            _mark(new / LOCK_FILE)
        yield


#: What the ledger keeps of the store's data itself, left out of what ``streamdp budget`` prints: the checksum of the
#: ratings each entry was released from and of the data before and after a replacement (unkeyed hashes of the
#: ratings: whoever knows every user but one could test the last one against them; docs/privacy.md).
UNSHOWN = ("store_checksum", "old_checksum", "new_checksum")


def shown(s: dict) -> dict:
    """``s`` (:meth:`StoreBudget.show`) as ``streamdp budget`` prints it: without the fields in :data:`UNSHOWN`.

    >>> shown({"entries": [{"id": "a", "store_checksum": "blake2b:00"}], "history": [{"old_checksum": "x"}]})
    {'entries': [{'id': 'a'}], 'history': [{}]}
    """
    def strip(d):
        return {k: v for k, v in d.items() if k not in UNSHOWN} if isinstance(d, dict) else d

    return {**s, **{k: [strip(x) for x in s[k]] for k in ("entries", "history") if isinstance(s.get(k), list)}}


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
    lines += _user_lines(s)
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
        lines.append(f"  {h['at']}  {_history_line(h)}")
    return "\n".join(lines)


def _user_lines(s: dict) -> list[str]:
    """The per-user budget's lines of :func:`format_budget`: the cap, its filter, the spend's distribution."""
    ub = s.get("user_budget")
    if ub is None:
        return []
    lines = [f"user budget      epsilon={ub['epsilon']:.6g}  delta={ub['delta']:.3g} per user, lifetime  (Renyi "
             f"filter at order {ub['alpha']:g}, bound {ub['bound']:.6g}; each user "
             f"({ub['epsilon_guarantee']:.6g}, {ub['delta']:.3g})-DP)"]
    if ub.get("carried_releases"):
        lines.append(f"                 {ub['carried_releases']} release(s) before it charged to its "
                     f"{ub['carried_users']:,} users then (RDP {ub['carried_rdp']:.6g})")
    u = s.get("users")
    if u is None:
        return lines
    q = "  ".join(f"{'max' if k == '1' else 'min' if k == '0' else 'p' + format(float(k) * 100, 'g')} "
                  f"{v:.4g}" for k, v in u["quantiles"].items())
    lines.append(f"users            {u['n_users']:,}, {u['retired']:,} retired (left out of every later release)")
    lines.append(f"users' spend     epsilon at delta={ub['delta']:.3g}: {q}")
    rows = [("nothing", "", u["none"])]
    rows += [(f"{lo:4.0%}-{hi:4.0%}", f"epsilon <= {e:.4g}", c) for lo, hi, e, c in u["histogram"]]
    if u["over_cap"]:
        rows.append(("over the bound", "(carried from before the cap)", u["over_cap"]))
    top = max([c for _, _, c in rows] + [1])
    lines.append("  share of the bound spent (RDP), users:")
    for what, note, c in rows:
        lines.append(f"  {what:<10} {note:<20} {'#' * math.ceil(30 * c / top) if c else '':<30} {c:,}")
    return lines


def _history_line(h: dict) -> str:
    n = h.get("n_entries", "?")
    return {
        "data replaced": lambda: f"data replaced by {h.get('by')}; the {n} release(s) before it still count",
        "journal started": lambda: f"journal started; the {n} release(s) before it were taken from the ledger as is",
        "journal restarted": lambda: (f"journal lost, restarted (--restore) from the ledger as it was, "
                                      f"{n} release(s)"),
        "ledger rebuilt": lambda: f"ledger rebuilt (--restore) from the journal, {n} release(s)",
        "journal truncated": lambda: (f"journal found cut at line {h.get('lines')} of the {h.get('recorded_lines')} "
                                      f"its witness recorded; ledger rebuilt (--restore) from what remains, {n} "
                                      f"release(s): changes in the missing lines are not counted here (their models' "
                                      f"privacy.json state what each spent)"),
        "witness rewritten": lambda: f"journal witness rewritten (--restore) from the journal, {n} release(s)",
        "release key lost": lambda: (f"release key {h.get('key')} lost"
                                     + (f", {h.get('found')} accepted" if h.get("found") else "")
                                     + " (--restore): models released before it no longer match this store"),
        "ledger lost": lambda: ("ledger and journal lost, restarted empty (--restore): releases before it are not "
                                "counted here (their models' privacy.json state what each spent)"),
    }.get(h.get("event"), lambda: str(h.get("event")))()


def parse_budget(budget, *, name: str = "--budget") -> tuple[float, float] | None:
    """``(epsilon, delta)`` from ``"E,D"`` or a pair, checked (``None`` stays ``None``).

    >>> parse_budget("1,1e-6")
    (1.0, 1e-06)
    """
    if budget is None:
        return None
    parts = budget.split(",") if isinstance(budget, str) else tuple(budget)
    try:
        e, d = (float(x) for x in parts)
    except ValueError:
        raise ParameterError(f"{name}: expected EPSILON,DELTA, got {budget!r}") from None
    if not (e > 0 or math.isinf(e)):  # 0, negative, nan: the budget's own message (it names epsilon)
        _lazy("accountant").check_privacy_params(e, d)
    e = _lazy("accountant").parse_epsilon(parts[0], name)  # only the literal inf is infinite ("1e309" is an error)
    _lazy("accountant").check_privacy_params(e, d)
    return e, d
