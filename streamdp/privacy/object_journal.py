"""The budget journal of a store on object storage: one object per change, created only if absent.

Object storage has no lock and no append, so the journal of a store at a URL
(:mod:`streamdp.privacy.journal` for its lines, hash chain and replay) is kept as
objects ``STORE/privacy_budget.journal.d/<seq>``: each holds the lines of one change
(a ``reserve``, an ``update``, ...) and is named by the 12-digit sequence number of
its first line. It is written with :func:`streamdp.storage.remote.put_exclusive`
(S3: ``PUT`` with ``If-None-Match: *``), which fails when the object exists. Two
runs that read the journal at the same line both try to create the object named by
the next line's number; the server lets exactly one of them succeed, and the other
gets :class:`Conflict`, reads the journal again and decides again (a reservation
that no longer fits the budget is then refused). So no change is lost and none is
counted twice, without a lock that a killed run could leave held.

The journal is read as the concatenation of an uploaded local journal file
(``STORE/privacy_budget.journal``, present when a store written on a local disk was
copied to object storage; never written here) and the objects in name order; the
chain check of every line (``seq`` and hash) refuses a missing, moved or edited
object. ``STORE/privacy_budget.json`` is rewritten after every change as on a local
disk, but it may lag behind the journal when two runs race (the later one's write
can land first): the journal is the record, and a ledger behind it is rolled forward
on every load.
"""

from __future__ import annotations

import json

from streamdp.privacy.journal import (
    GENESIS,
    JOURNAL_FILE,
    Journal,
    apply_record,
    canonical,
    copy_state,
    decoded,
    empty_state,
    make_lines,
    parse_journal,
)
from streamdp.privacy.ledger import encode_json
from streamdp.storage import remote

__all__ = ["JOURNAL_OBJECTS", "Conflict", "read_object_journal", "append_objects"]

#: The prefix (beside the store's data) of the journal's objects.
JOURNAL_OBJECTS = JOURNAL_FILE + ".d"


class Conflict(Exception):
    """Another run appended to the journal after it was read: read it again and redo the change."""


def _objects(store: str) -> tuple[object, list[str]]:
    fs, p = remote.url_fs(remote.join(store, JOURNAL_OBJECTS))
    fs.invalidate_cache(p)
    try:
        names = sorted(fs.find(p))
    except FileNotFoundError:
        names = []
    return fs, names


def read_object_journal(store: str, *, at: int | None = None) -> Journal | None:
    """The verified journal of the store at URL ``store`` (None if it has none); as
    :func:`~streamdp.privacy.journal.read_journal` (``JournalError`` on a line that does not verify)."""
    base = remote.read_bytes(remote.join(store, JOURNAL_FILE))
    fs, names = _objects(store)
    if base is None and not names:
        return None
    raw = base or b""
    if raw and not raw.endswith(b"\n"):
        raw += b"\n"
    if names:
        got = fs.cat(names)
        for n in names:
            raw += got[n]
    return parse_journal(raw, remote.join(store, JOURNAL_OBJECTS), at=at)


def append_objects(store: str, ledger_name: str, journal: Journal | None, records: list[dict], new_ledger) -> dict:
    """Append ``records`` after ``journal`` (as read) as one object, then rewrite the ledger; the ledger dict.

    ``new_ledger(state)`` makes the ledger dict of a state. Raises :class:`Conflict` if
    another run created the object first (nothing was written).
    """
    state = copy_state(journal.state) if journal is not None else empty_state()
    n0 = len(journal.records) if journal is not None else 0
    lines = make_lines(records, journal.head if journal is not None else GENESIS, n0 + 1)
    for r in lines:
        apply_record(state, decoded(encode_json(r)))  # exactly what a replay of the written object gives
    d = new_ledger(state)
    d["journal"] = {"file": JOURNAL_FILE, "lines": n0 + len(lines), "head": lines[-1]["hash"] if lines else
                    (journal.head if journal is not None else GENESIS)}
    if lines:
        text = "".join(canonical(r) + "\n" for r in lines).encode()
        try:
            remote.put_exclusive(remote.join(store, JOURNAL_OBJECTS, f"{n0 + 1:012d}"), text)
        except FileExistsError:
            raise Conflict from None
    remote.put(remote.join(store, ledger_name), (json.dumps(encode_json(d), indent=2, allow_nan=False)
                                                 + "\n").encode())
    return d
