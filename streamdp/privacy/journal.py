"""The budget journal: an append-only, hash-chained log of every change to a store's budget ledger.

``STORE/privacy_budget.journal`` holds one JSON object a line, appended and fsynced
under the ledger's lock *before* the ledger (``privacy_budget.json``) is replaced.
Each line is a record ``{"seq", "at", "op", ..., "hash"}`` whose ``hash`` is
``sha256(previous line's hash + canonical JSON of the record without its hash)``
(the first line chains from :data:`GENESIS`). Replaying the records from the empty
state gives the ledger's ``budget``, ``entries`` and ``history`` exactly; the ledger
stores the chain head (``journal: {"lines", "head"}``) it was written at.

Records (``op``):

* ``adopt``: ``state`` (budget, entries, history) as a whole; only as line 1 (a
  ledger written before journals existed, or one restarted by ``--restore``);
* ``budget``: the total was set to ``budget``;
* ``reserve``: ``entry``, a new release, ``reserved`` at stage ``training``;
* ``update``: entry ``id`` changed the fields in ``set`` (``status``, ``stage``,
  ``finished``, ``reason``), made ``by`` ``writing``, ``complete``, ``fail`` or
  ``settle``. Statuses only move forward: ``reserved`` to ``complete``, ``failed``
  or ``stale``; a ``stale`` entry only by ``settle`` (to ``complete`` when its model
  proves it was released, to ``failed`` when it is proven nothing was); the stage
  only from ``training`` to ``writing``, while ``reserved``;
* ``history``: ``record`` appended to the history (e.g. the data was replaced);
* ``user_budget``: the per-user cap and its filter (:mod:`streamdp.privacy.filter`) were set.

The chain makes a hand edit, a deleted line or a flipped status visible; it is not
a signature: whoever can write the store can rewrite the whole chain with this code.

>>> rec = [{"seq": 1, "at": "t", "op": "budget", "budget": {"epsilon": 1.0, "delta": 1e-6, "set": "t"}}]
>>> rec[0]["hash"] = chain_hash(GENESIS, rec[0])
>>> replay(rec)["budget"]["epsilon"]
1.0
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from streamdp.privacy.ledger import decode_json, encode_json

__all__ = ["JOURNAL_FILE", "GENESIS", "STATUSES", "STAGES", "Journal", "JournalError", "LedgerInvalid", "decoded",
           "copy_state", "chain_hash", "read_journal", "parse_journal", "replay", "apply_record", "check_state", "empty_state"]

JOURNAL_FILE = "privacy_budget.journal"
#: What the first line's hash chains from.
GENESIS = "0" * 64
STATUSES = ("reserved", "complete", "failed", "stale")
STAGES = ("training", "writing")
#: Status changes an ``update`` may make, and by what (``None``: by any).
_FORWARD = {("reserved", "complete"): None, ("reserved", "failed"): None, ("reserved", "stale"): ("settle", "spent"),
            ("stale", "complete"): ("settle",), ("stale", "failed"): ("settle",)}
_UPDATE_FIELDS = {"status", "stage", "finished", "reason"}
_UPDATE_BY = ("writing", "complete", "fail", "settle", "spent")
_NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}
_NON_FINITE_TEXT = tuple(f'"{k}"'.encode() for k in _NON_FINITE)


def decoded(obj):
    """:func:`~streamdp.privacy.ledger.decode_json` of a file that may have been edited: a float field holding a
    string other than ``"inf"``, ``"-inf"``, ``"nan"`` stays a string (for the schema check to name), no error."""
    if isinstance(obj, dict):
        return {k: (decode_json({k: v})[k] if v in _NON_FINITE else v) if isinstance(v, str) else decoded(v)
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [decoded(v) for v in obj]
    return obj


class JournalError(Exception):
    """A journal line that does not verify or replay (``line``: 1-based, ``what``: why)."""

    def __init__(self, line: int, what: str):
        super().__init__(f"line {line}: {what}")
        self.line, self.what = line, what


class LedgerInvalid(Exception):
    """A ledger or journal state that breaks the schema (the message says where and what)."""


def canonical(obj) -> str:
    """The JSON text that is hashed (and written): sorted keys, no spaces, non-finite floats as strings."""
    return json.dumps(encode_json(obj), sort_keys=True, separators=(",", ":"), allow_nan=False)


def chain_hash(prev: str, record: dict) -> str:
    """``sha256(prev + canonical(record without "hash"))`` as hex."""
    return _hash_encoded(prev, encode_json(record))


def _hash_encoded(prev: str, record: dict) -> str:
    """:func:`chain_hash` of a record already in JSON form (as parsed: no encoding pass, a replay stays cheap)."""
    body = {k: v for k, v in record.items() if k != "hash"}
    return hashlib.sha256((prev + json.dumps(body, sort_keys=True, separators=(",", ":"),
                                             allow_nan=False)).encode()).hexdigest()


def copy_state(state: dict) -> dict:
    """A copy of ``state`` that shares nothing with it (a JSON round trip: C-fast, exact for these plain values;
    ``copy.deepcopy`` was a sixth of a change's time on a ledger of 400 releases)."""
    out = json.loads(json.dumps({k: v for k, v in state.items() if k != "_ids"}))
    out["_ids"] = {e["id"]: e for e in out["entries"]}
    return out


def empty_state() -> dict:
    """``budget``, ``entries``, ``history``, and ``_ids``: entries by id (not written; keeps a replay linear)."""
    return {"budget": None, "entries": [], "history": [], "_ids": {}}


# ---------------------------------------------------------------------------------------------------------
# schema
# ---------------------------------------------------------------------------------------------------------


def _number(v, what: str, *, allow_inf: bool, upper: float | None = None) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise LedgerInvalid(f"{what} is {v!r}, not a number")
    if math.isnan(v) or (math.isinf(v) and not allow_inf) or v < 0:
        raise LedgerInvalid(f"{what} is {v!r}: expected a non-negative {'number' if allow_inf else 'finite number'}")
    if upper is not None and v > upper:
        raise LedgerInvalid(f"{what} is {v!r}: expected at most {upper:g}")


def _str(v, what: str, *, optional: bool = False) -> None:
    if not (isinstance(v, str) or (optional and v is None)):
        raise LedgerInvalid(f"{what} is {v!r}, not a string")


def check_budget(b) -> None:
    if b is None:
        return
    if not isinstance(b, dict):
        raise LedgerInvalid(f"budget is {b!r}, not an object")
    # epsilon inf: an unlimited budget; delta < 1
    _number(b.get("epsilon"), "budget epsilon", allow_inf=True)
    _number(b.get("delta"), "budget delta", allow_inf=False, upper=1.0)


def check_user_budget(b) -> None:
    """A per-user cap: ``epsilon``, ``delta``, the filter's ``alpha`` and ``bound``, what it ``carried`` over."""
    if b is None:
        return
    if not isinstance(b, dict):
        raise LedgerInvalid(f"user_budget is {b!r}, not an object")
    _number(b.get("epsilon"), "user_budget epsilon", allow_inf=False)
    _number(b.get("delta"), "user_budget delta", allow_inf=False, upper=1.0)
    _number(b.get("alpha"), "user_budget alpha", allow_inf=False)
    _number(b.get("bound"), "user_budget bound", allow_inf=False)
    _number(b.get("carried_rdp", 0.0), "user_budget carried_rdp", allow_inf=True)
    if not (b["alpha"] > 1 and b["bound"] > 0 and type(b.get("carried_users", 0)) is int):
        raise LedgerInvalid(f"user_budget {b!r}: expected alpha > 1, bound > 0 and an integer carried_users")


def check_entry(e, where: str) -> None:
    """One ledger entry: required keys and types, non-negative epsilon (inf: a non-private release) and delta."""
    if not isinstance(e, dict):
        raise LedgerInvalid(f"{where} is {type(e).__name__}, not an object")
    for key in ("id", "status", "created", "method", "epsilon", "delta"):
        if key not in e:
            raise LedgerInvalid(f"{where} has no {key!r}")
    if not isinstance(e["id"], str) or not e["id"]:
        raise LedgerInvalid(f"{where}: id is {e['id']!r}, not a non-empty string")
    where = f"{where} ({e['id']})"
    if e["status"] not in STATUSES:
        raise LedgerInvalid(f"{where}: unknown status {e['status']!r} (expected one of {', '.join(STATUSES)})")
    if e.get("stage") is not None and e["stage"] not in STAGES:  # None: not recorded (an older streamdp)
        raise LedgerInvalid(f"{where}: unknown stage {e['stage']!r} (expected one of {', '.join(STAGES)})")
    _str(e["created"], f"{where}: created")
    _str(e["method"], f"{where}: method")
    _str(e.get("guarantee"), f"{where}: guarantee", optional=True)
    _str(e.get("reason"), f"{where}: reason", optional=True)
    _str(e.get("finished"), f"{where}: finished", optional=True)
    _number(e["epsilon"], f"{where}: epsilon", allow_inf=True)
    _number(e["delta"], f"{where}: delta", allow_inf=False, upper=1.0)
    if "over_budget" in e and not isinstance(e["over_budget"], bool):
        raise LedgerInvalid(f"{where}: over_budget is {e['over_budget']!r}, not true or false")
    events = e.get("events")
    if events is not None and not (isinstance(events, list) and all(isinstance(ev, dict) for ev in events)):
        raise LedgerInvalid(f"{where}: events is not a list of objects")


def check_state(d: dict) -> None:
    """``budget``, ``entries`` (unique ids) and ``history`` of a ledger (decoded: floats are floats)."""
    check_budget(d.get("budget"))
    check_user_budget(d.get("user_budget"))
    entries = d.get("entries")
    if not isinstance(entries, list):
        raise LedgerInvalid(f"entries is {type(entries).__name__}, not a list")
    seen = set()
    for i, e in enumerate(entries, 1):
        check_entry(e, f"entry {i}")
        if e["id"] in seen:
            raise LedgerInvalid(f"entry {i}: id {e['id']!r} appears twice")
        seen.add(e["id"])
    history = d.get("history", [])
    if not isinstance(history, list) or not all(isinstance(h, dict) and isinstance(h.get("event"), str)
                                                and isinstance(h.get("at"), str) for h in history):
        raise LedgerInvalid("history is not a list of records with 'event' and 'at'")


# ---------------------------------------------------------------------------------------------------------
# replay
# ---------------------------------------------------------------------------------------------------------


def apply_record(state: dict, r: dict) -> None:
    """Apply journal record ``r`` (decoded) to ``state`` in place; :class:`LedgerInvalid` if it may not.

    The state takes ``r``'s objects over (no copies: a replay stays linear); pass a record nothing else holds.
    """
    op = r.get("op")
    if op == "adopt":
        if r.get("seq") != 1:
            raise LedgerInvalid("'adopt' is allowed as the first record only")
        new = r.get("state")
        if not isinstance(new, dict):
            raise LedgerInvalid("'adopt' without a state")
        new = {"budget": new.get("budget"), "entries": new.get("entries"), "history": new.get("history", []),
               **({"user_budget": new["user_budget"]} if new.get("user_budget") is not None else {})}
        check_state(new)
        state.clear()
        state.update(new, _ids={e["id"]: e for e in new["entries"]})
    elif op == "budget":
        check_budget(r.get("budget"))
        state["budget"] = r.get("budget")
    elif op == "user_budget":
        check_user_budget(r.get("user_budget"))
        state["user_budget"] = r.get("user_budget")
    elif op == "reserve":
        e = r.get("entry")
        check_entry(e, "the reserved entry")
        if e["status"] != "reserved" or e.get("stage", "training") != "training":
            raise LedgerInvalid(f"entry {e['id']} is reserved as {e['status']}/{e.get('stage')}, not "
                                f"reserved/training")
        if e["id"] in state["_ids"]:
            raise LedgerInvalid(f"entry {e['id']} is reserved twice")
        state["entries"].append(e)
        state["_ids"][e["id"]] = e
    elif op == "update":
        _update(state, r)
    elif op == "history":
        h = r.get("record")
        if not (isinstance(h, dict) and isinstance(h.get("event"), str) and isinstance(h.get("at"), str)):
            raise LedgerInvalid("a history record without 'event' and 'at'")
        state.setdefault("history", []).append(copy.deepcopy(h))
    else:
        raise LedgerInvalid(f"unknown record {op!r}")


def _update(state: dict, r: dict) -> None:
    eid, by, change = r.get("id"), r.get("by"), r.get("set")
    if by not in _UPDATE_BY:
        raise LedgerInvalid(f"an update of entry {eid} by {by!r} (expected one of {', '.join(_UPDATE_BY)})")
    if not isinstance(change, dict) or not change or set(change) - _UPDATE_FIELDS:
        what = sorted(change) if isinstance(change, dict) else repr(change)
        raise LedgerInvalid(f"an update of entry {eid} changes {what} (only {', '.join(sorted(_UPDATE_FIELDS))} "
                            f"may change)")
    e = state["_ids"].get(eid) if isinstance(eid, str) else None
    if e is None:
        raise LedgerInvalid(f"an update of entry {eid!r}, which was never reserved")
    old, new = e["status"], change.get("status", e["status"])
    if new != old:
        allowed = _FORWARD.get((old, new), False)
        if allowed is False or (allowed is not None and by not in allowed):
            raise LedgerInvalid(f"entry {eid} goes from {old} to {new} (by {by}): statuses only move forward")
    elif "stage" not in change:
        raise LedgerInvalid(f"an update of entry {eid} that changes neither its status nor its stage")
    if "stage" in change and change["stage"] != e.get("stage"):
        if not (old == "reserved" and e.get("stage") == "training" and change["stage"] == "writing"):
            raise LedgerInvalid(f"entry {eid} goes from stage {e.get('stage')} to {change['stage']} while {old}")
    updated = {**e, **change}
    check_entry(updated, f"entry {eid}")
    e.update(updated)


def replay(records: list[dict], *, upto: int | None = None) -> dict:
    """The state (budget, entries, history) after the first ``upto`` (default: all) decoded records."""
    state = empty_state()
    for i, r in enumerate(copy.deepcopy(records[:upto]), 1):
        try:
            apply_record(state, r)
        except LedgerInvalid as exc:
            raise JournalError(i, str(exc)) from None
    return state


# ---------------------------------------------------------------------------------------------------------
# the file
# ---------------------------------------------------------------------------------------------------------


@dataclass
class Journal:
    """The verified lines of a journal file.

    ``records`` are as parsed (non-finite floats are strings), ``state`` what they replay to,
    ``at_text`` the canonical JSON of the state after line ``at`` (see
    :func:`read_journal`; None if it has fewer lines), ``size`` the bytes
    of the verified lines; anything after it is a torn last line (a crash while it
    was being appended), ignored and cut off by the next write.
    """

    path: Path
    lines: list[str] = field(default_factory=list)
    records: list[dict] = field(default_factory=list)
    at_text: str | None = None
    state: dict = field(default_factory=empty_state)
    size: int = 0
    file_size: int = 0
    newline: bool = True  # the last verified line ends with a newline (not: its write stopped just before it)

    @property
    def head(self) -> str:
        return self.records[-1]["hash"] if self.records else GENESIS

    @property
    def n_entries(self) -> int:
        return len(self.state["entries"])


def state_text(state: dict) -> str:
    """:func:`canonical` text of the state (what a ledger and its journal must agree on)."""
    part = {"budget": state.get("budget"), "entries": state.get("entries"), "history": state.get("history", [])}
    if state.get("user_budget") is not None:  # only then: a ledger without one reads as it always did
        part["user_budget"] = state["user_budget"]
    try:  # a decoded state holds plain JSON values: canonical as it is, unless a float is not finite
        return json.dumps(part, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (ValueError, TypeError):
        return canonical(part)


def read_journal(path: str | os.PathLike, *, at: int | None = None) -> Journal | None:
    """Read and verify ``path`` (``None`` if there is none): the hash chain, then the replay of every line.

    ``at``: also keep the canonical state after that many lines (what a ledger written there must hold).

    Raises :class:`JournalError` (line, what) on the first line that does not verify
    or replay, and ``OSError`` if it cannot be read.
    """
    path = Path(path)
    if not os.path.lexists(path):
        return None
    if path.is_dir():
        raise JournalError(0, "a directory, not a journal")
    with open(path, "rb") as fh:
        raw = fh.read()
    return parse_journal(raw, path, at=at)


#: The journal bytes this process verified last, per journal: ``(bytes, lines, records, state as JSON, at_text)``.
#: A later read whose bytes begin with them (an append since) verifies only what follows: the same lines parse to
#: the same records and state, so the result is the one a full read gives; any other change reads it all again.
_VERIFIED: dict[str, tuple[bytes, list, list, str, str]] = {}


def parse_journal(raw: bytes, path, *, at: int | None = None) -> Journal:
    """:func:`read_journal` of the journal's bytes ``raw`` (``path`` names it)."""
    j = Journal(path=path, file_size=len(raw))
    prev, state, offset, first = GENESIS, empty_state(), 0, 1
    seen = _VERIFIED.get(str(path))
    if seen is not None and raw.startswith(seen[0]) and (at is None or at >= len(seen[1])):
        offset, j.lines, j.records = len(seen[0]), list(seen[1]), list(seen[2])
        state = json.loads(seen[3])
        state["_ids"] = {e["id"]: e for e in state["entries"]}
        prev, first = (j.records[-1]["hash"] if j.records else GENESIS), len(j.records) + 1
        if at == len(j.records):
            j.at_text = seen[4]
    pieces = raw[offset:].split(b"\n")
    complete, tail = pieces[:-1], pieces[-1]
    if at == 0:
        j.at_text = state_text(state)
    for i, piece in enumerate(complete + ([tail] if tail else []), first):
        torn = i - first >= len(complete)
        try:
            rec = _verify(piece, i, prev)
            # the state takes its own copy: a second parse, or decoded() where a float is written as a string
            dec = decoded(rec) if any(s in piece for s in _NON_FINITE_TEXT) else json.loads(piece)
            apply_record(state, dec)
        except (JournalError, LedgerInvalid) as exc:
            if torn and isinstance(exc, JournalError):  # a crash while appending the last line: not recorded
                break
            raise exc if isinstance(exc, JournalError) else JournalError(i, str(exc)) from None
        prev = rec["hash"]
        offset += len(piece) + (0 if torn else 1)
        j.newline = not torn
        j.lines.append(piece.decode())
        j.records.append(rec)
        if i == at:
            j.at_text = state_text(state)
    j.state, j.size = state, offset
    if j.newline:
        _VERIFIED[str(path)] = (raw[:offset], list(j.lines), list(j.records),
                                json.dumps({k: v for k, v in state.items() if k != "_ids"}), state_text(state))
    return j


def _verify(piece: bytes, i: int, prev: str) -> dict:
    try:
        rec = json.loads(piece, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise JournalError(i, f"not a JSON record ({exc})") from None
    if not isinstance(rec, dict) or not isinstance(rec.get("hash"), str):
        raise JournalError(i, "not a journal record (no hash)")
    if rec.get("seq") != i:
        raise JournalError(i, f"out of sequence (seq {rec.get('seq')!r}): a line was removed or moved")
    if _hash_encoded(prev, rec) != rec["hash"]:
        raise JournalError(i, "its hash does not chain from the line before (the journal was edited)")
    return rec


def _no_constant(name: str):
    raise ValueError(f"{name} is not strict JSON")


def make_lines(records: list[dict], prev: str, first_seq: int) -> list[dict]:
    """``records`` numbered from ``first_seq`` and chained from ``prev`` (each gets ``seq`` and ``hash``)."""
    out = []
    for k, r in enumerate(records):
        r = {"seq": first_seq + k, **{key: v for key, v in r.items() if key not in ("seq", "hash")}}
        r["hash"] = chain_hash(prev, r)
        prev = r["hash"]
        out.append(r)
    return out
