"""A store's privacy budget ledger that is deleted, hand-edited or malformed: refused in one line, restorable.

Before the journal (``privacy_budget.journal``) existed:

* deleting ``privacy_budget.json`` reset the store to "no budget, spent 0";
* hand edits were accepted: a negative epsilon or delta, a ``complete`` entry
  flipped to ``failed`` (refunded), an unknown status, an entry removed, the budget raised;
* a ledger that is ``[]`` or a directory was a traceback.

Each test here failed then. Now every load checks the ledger's schema and that it is
the replay of its hash-chained journal; ``streamdp budget STORE --restore`` rebuilds it.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import shutil
import threading

import pytest
from click.testing import CliRunner

from streamdp.cli import main
from streamdp.errors import BudgetExceededError, StoreError
from streamdp.privacy import GUARANTEE_USER_DP, Ledger, calibrate_gaussian, gaussian_event
from streamdp.privacy.budget import BUDGET_FILE, JOURNAL_FILE, LOCK_FILE, WITNESS_FILE, StoreBudget
from streamdp.privacy.journal import GENESIS, canonical, make_lines, read_journal, state_text
from streamdp.storage.fingerprint import KEY_FILE
from tests.privacy import test_ledger_budget as ledger_tests


@functools.lru_cache(maxsize=None)
def _z(eps):
    return calibrate_gaussian(eps, 1e-6)


def _ledger(eps=0.5, method="demo"):
    return Ledger(method=method, guarantee=GUARANTEE_USER_DP, epsilon=eps, delta=1e-6, events=[gaussian_event(_z(eps))])


store = ledger_tests.store  # the fixture: a bare store directory (zarr.json only)


@pytest.fixture
def spent(store):
    """A store with a budget, one complete release and one failed (refunded) one: ``(store, show())``."""
    b = StoreBudget(store)
    b.set(2.0, 1e-6)
    b.complete(b.reserve(_ledger(0.5, "first")))
    b.fail(b.reserve(_ledger(0.5, "second")), "crashed")
    return store, b.show()


def cli(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    return r.exit_code, r.stdout, r.stderr


def assert_refused(code, err, *needles):
    assert code == 2, (code, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("streamdp: error: ") and "Traceback" not in err, err
    for n in needles:
        assert str(n) in lines[0], (n, lines[0])
    return lines[0]


def edit(store, change):
    p = store / BUDGET_FILE
    d = json.loads(p.read_text())
    change(d)
    p.write_text(json.dumps(d))


def same_spend(store, before):
    s = StoreBudget(store).show()
    assert s["budget"] == before["budget"] and s["entries"] == before["entries"] and s["spent"] == before["spent"]
    return s


# -- 1. a deleted ledger -------------------------------------------------------------------------------------


def test_deleted_ledger_is_refused_and_restored_from_the_journal(spent):
    store, before = spent
    os.remove(store / BUDGET_FILE)
    code, out, err = cli("budget", store)
    line = assert_refused(code, err)
    assert line == (f"streamdp: error: {store / BUDGET_FILE}: missing (the store had a budget ledger: 2 entries in "
                    f"{JOURNAL_FILE}); restore it with `streamdp budget {store} --restore`")
    assert out == ""
    with pytest.raises(StoreError, match="missing"):  # what train does first: nothing is reserved
        StoreBudget(store).reserve(_ledger())
    assert not (store / BUDGET_FILE).exists()

    code, out, err = cli("budget", store, "--restore")
    assert code == 0, err
    assert out.startswith(f"restore: rebuilt {BUDGET_FILE} from {JOURNAL_FILE} (5 lines, 2 entries)")
    s = same_spend(store, before)
    assert [h["event"] for h in s["history"]] == ["ledger rebuilt"]
    assert "ledger rebuilt (--restore) from the journal, 2 release(s)" in out
    code, out, _ = cli("budget", store, "--restore")  # a second time: nothing to do
    assert code == 0 and out.startswith(f"restore: nothing to restore: {BUDGET_FILE} agrees with {JOURNAL_FILE}")


def test_train_refuses_a_store_whose_ledger_was_deleted(tmp_path):
    """End to end: `streamdp train` on a store whose ledger was deleted writes no model and reserves nothing
    (``--epsilon inf``: no calibration, fast; the old code released it, as the ledger "had" no entries)."""
    from streamdp.storage.generate import generate_store

    s = generate_store(str(tmp_path / "s.zarr"), n_users=300, n_items=30, ratings_per_user=5, rank=2, seed=1)
    b = StoreBudget(s.path)
    first = b.reserve(_ledger(1.0))  # a model released from the store
    b.complete(first)
    os.remove(os.path.join(s.path, BUDGET_FILE))
    code, _, err = cli("train", s.path, "--method", "means", "--epsilon", "inf", "--yes", "--out", tmp_path / "m2")
    assert_refused(code, err, os.path.join(s.path, BUDGET_FILE), "missing", "1 entries", "--restore")
    assert not (tmp_path / "m2").exists()
    assert cli("budget", s.path, "--restore")[0] == 0
    assert [(e["id"], e["status"]) for e in StoreBudget(s.path).show()["entries"]] == [(first, "complete")]


# -- 2. hand edits -------------------------------------------------------------------------------------------


def _entry(d, method):
    return next(e for e in d["entries"] if e["method"] == method)


EDITS = {
    "negative epsilon": (lambda d: _entry(d, "first").update(epsilon=-1.0), "epsilon is -1.0"),
    "negative delta": (lambda d: _entry(d, "first").update(delta=-1e-6), "delta is -1e-06"),
    "epsilon nan": (lambda d: _entry(d, "first").update(epsilon="nan"), "epsilon is nan"),
    "epsilon not a number": (lambda d: _entry(d, "first").update(epsilon="small"), "epsilon is 'small', not a number"),
    "unknown status": (lambda d: _entry(d, "first").update(status="refunded"), "unknown status 'refunded'"),
    "no status": (lambda d: _entry(d, "first").pop("status"), "has no 'status'"),
    "entries not a list": (lambda d: d.update(entries={}), "entries is dict, not a list"),
    "entry not an object": (lambda d: d["entries"].append(3), "entry 3 is int, not an object"),
    "complete flipped to failed": (lambda d: _entry(d, "first").update(status="failed"),
                                   "status is failed in the ledger, complete in the journal"),
    "failed flipped to complete": (lambda d: _entry(d, "second").update(status="complete"),
                                   "status is complete in the ledger, failed in the journal"),
    "entry removed": (lambda d: d["entries"].remove(_entry(d, "first")), "(complete) is missing from the ledger"),
    "epsilon lowered": (lambda d: _entry(d, "first").update(epsilon=0.01), "epsilon is 0.01 in the ledger, 0.5"),
    "budget raised": (lambda d: d["budget"].update(epsilon=100.0), "the budget is epsilon=100.0"),
    "journal head dropped": (lambda d: d.pop("journal"), "it records no journal head"),
}


@pytest.mark.parametrize("name", list(EDITS))
def test_hand_edits_are_refused_and_restored(spent, name):
    store, before = spent
    change, what = EDITS[name]
    edit(store, change)
    edited = (store / BUDGET_FILE).read_text()
    for args in (["budget", store], ["budget", store, "--set", "50,1e-6"], ["budget", store, "--settle"]):
        code, out, err = cli(*args)
        assert_refused(code, err, store / BUDGET_FILE, what, f"`streamdp budget {store} --restore`")
        assert out == ""
    assert (store / BUDGET_FILE).read_text() == edited  # refused before anything was written
    code, out, err = cli("budget", store, "--restore")
    assert code == 0, err
    assert f"the file it replaced is kept as {store / BUDGET_FILE}.replaced-" in out
    same_spend(store, before)
    (kept,) = [n for n in os.listdir(store) if n.startswith(BUDGET_FILE + ".replaced-")]
    assert (store / kept).read_text() == edited


@pytest.mark.parametrize("content", ["[]", "", "{", "null", '"x"', "\x00\xff"])
def test_malformed_ledger_is_one_line_and_restorable(spent, content):
    store, before = spent
    (store / BUDGET_FILE).write_bytes(content.encode("latin-1"))
    code, _, err = cli("budget", store)
    assert_refused(code, err, store / BUDGET_FILE, f"{JOURNAL_FILE} verifies", "--restore")
    assert cli("budget", store, "--restore")[0] == 0
    same_spend(store, before)


def test_ledger_that_is_a_directory(spent):
    store, before = spent
    os.remove(store / BUDGET_FILE)
    (store / BUDGET_FILE).mkdir()
    code, _, err = cli("budget", store)
    assert_refused(code, err, f"{store / BUDGET_FILE}: a directory, not a budget ledger", "--restore")
    with pytest.raises(StoreError, match="a directory"):
        StoreBudget(store).reserve(_ledger())
    assert cli("budget", store, "--restore")[0] == 0
    same_spend(store, before)


def test_malformed_ledger_of_a_store_without_journal_is_one_line(store):
    """A ledger from before journals (nothing to restore from): ``[]`` and a directory were tracebacks."""
    for bad in ("[]", "dir"):
        if bad == "dir":
            os.remove(store / BUDGET_FILE)
            (store / BUDGET_FILE).mkdir()
        else:
            (store / BUDGET_FILE).write_text(bad)
        code, _, err = cli("budget", store)
        line = assert_refused(code, err, store / BUDGET_FILE)
        assert "--restore" not in line  # no journal: nothing to restore from
        code, _, err = cli("budget", store, "--restore")
        assert_refused(code, err, store / BUDGET_FILE)


# -- 3. the journal ------------------------------------------------------------------------------------------


def _journal_lines(store):
    return (store / JOURNAL_FILE).read_text().splitlines()


def test_the_ledger_is_the_replay_of_its_chain(spent):
    store, _ = spent
    j = read_journal(store / JOURNAL_FILE)
    assert [r["op"] for r in j.records] == ["budget", "reserve", "update", "reserve", "update"]
    assert [r["by"] for r in j.records if r["op"] == "update"] == ["complete", "fail"]
    d = json.loads((store / BUDGET_FILE).read_text())
    assert d["journal"] == {"file": JOURNAL_FILE, "lines": 5, "head": j.records[-1]["hash"]}
    assert state_text(d) == state_text(j.state)
    assert (store / LOCK_FILE).read_text().startswith("streamdp privacy budget journal started")


@pytest.mark.parametrize("damage, what", [
    (lambda lines: lines.__setitem__(2, lines[2].replace('"complete"', '"failed"')), "line 3: its hash does not chain"),
    (lambda lines: lines.pop(2), "line 3: out of sequence"),
    (lambda lines: lines.__setitem__(0, "{"), "line 1: not a JSON record"),
])
def test_an_edited_journal_cannot_be_restored_from(spent, damage, what):
    store, _ = spent
    lines = _journal_lines(store)
    damage(lines)
    (store / JOURNAL_FILE).write_text("\n".join(lines) + "\n")
    for args in (["budget", store], ["budget", store, "--restore"]):
        code, _, err = cli(*args)
        assert_refused(code, err, store / JOURNAL_FILE, what, "the journal cannot be trusted", "from a backup")


def test_a_rechained_journal_still_only_moves_forward(spent):
    """Rewriting the chain with valid hashes does not make complete -> failed acceptable."""
    store, _ = spent
    j = read_journal(store / JOURNAL_FILE)
    first = next(r for r in j.records if r["op"] == "reserve")["entry"]["id"]
    forged = make_lines([{"at": "t", "op": "update", "id": first, "by": "fail",
                          "set": {"status": "failed", "finished": "t", "reason": "refund me"}}],
                        j.head, len(j.records) + 1)
    with open(store / JOURNAL_FILE, "a") as fh:
        fh.write(canonical(forged[0]) + "\n")
    code, _, err = cli("budget", store)
    assert_refused(code, err, "line 6", f"entry {first} goes from complete to failed", "statuses only move forward")


@pytest.mark.parametrize("how", ["missing", "empty"])
def test_deleted_journal_is_refused_and_restarted_from_the_ledger(spent, how):
    store, before = spent
    os.remove(store / JOURNAL_FILE)
    if how == "empty":
        (store / JOURNAL_FILE).write_text("")
    code, _, err = cli("budget", store)
    assert_refused(code, err, f"{store / JOURNAL_FILE}: {how} (the ledger {BUDGET_FILE} was written at its line 5)",
                   "--restore")
    code, out, err = cli("budget", store, "--restore")
    assert code == 0 and f"started a new {JOURNAL_FILE} from {BUDGET_FILE} as it is (2 entries)" in out
    s = same_spend(store, before)
    assert [h["event"] for h in s["history"]] == ["journal restarted"] and "journal lost, restarted" in out
    assert [r["op"] for r in read_journal(store / JOURNAL_FILE).records] == ["adopt"]


def test_journal_and_ledger_deleted_the_lock_file_remembers(spent):
    store, _ = spent
    os.remove(store / BUDGET_FILE)
    os.remove(store / JOURNAL_FILE)
    code, _, err = cli("budget", store)
    assert_refused(code, err, f"{store / BUDGET_FILE}: missing, and so is {JOURNAL_FILE}, but {LOCK_FILE} shows",
                   "privacy.json", "--restore")
    with pytest.raises(StoreError, match="so is"):
        StoreBudget(store).reserve(_ledger())
    code, out, err = cli("budget", store, "--restore")
    assert code == 0, err
    assert "started an empty" in out and "ledger and journal lost, restarted empty" in out
    s = StoreBudget(store).show()
    assert s["budget"] is None and s["entries"] == [] and [h["event"] for h in s["history"]] == ["ledger lost"]
    # all three deleted: the witness and the release key still tell (see test_forgotten_history below); with
    # them deleted too nothing local can tell (documented): a fresh store
    for name in (BUDGET_FILE, JOURNAL_FILE, LOCK_FILE):
        os.remove(store / name)
    assert_refused(*cli("budget", store)[::2], WITNESS_FILE, KEY_FILE)
    for name in (WITNESS_FILE, KEY_FILE):
        os.remove(store / name)
    assert cli("budget", store)[0] == 0


def test_a_ledger_from_before_the_journal_is_adopted(store):
    legacy = {"format": "streamdp-privacy-budget", "format_version": 1,
              "budget": {"epsilon": 2.0, "delta": 1e-6, "set": "2024-01-01T00:00:00+00:00"},
              "entries": [{"id": "0123456789ab", "status": "complete", "created": "2024-01-01T00:00:00+00:00",
                           "finished": "2024-01-01T00:01:00+00:00", "method": "als",
                           "guarantee": GUARANTEE_USER_DP, "epsilon": 1.0, "delta": 1e-6,
                           "events": _ledger(1.0).events, "model": None, "over_budget": False, "reason": None}]}
    (store / BUDGET_FILE).write_text(json.dumps(legacy))
    (store / LOCK_FILE).write_text("")  # an older streamdp's lock file: empty
    b = StoreBudget(store)
    assert b.show()["entries"] == legacy["entries"] and not (store / JOURNAL_FILE).exists()  # read as it is
    b.complete(b.reserve(_ledger(0.5)))
    recs = read_journal(store / JOURNAL_FILE).records
    assert [r["op"] for r in recs] == ["adopt", "reserve", "update"]
    s = b.show()
    assert [e["id"] for e in s["entries"]][0] == "0123456789ab" and s["entries"][0] == legacy["entries"][0]
    (h,) = s["history"]
    assert h["event"] == "journal started" and h["n_entries"] == 1
    edit(store, lambda d: d["entries"].pop(0))  # from now on, edits are seen
    with pytest.raises(StoreError, match="0123456789ab \\(complete\\) is missing from the ledger"):
        b.show()


def test_a_crash_between_journal_and_ledger_rolls_forward(spent):
    """kill -9 after the journal append, before the ledger replace: the journaled change is not lost."""
    store, _ = spent
    behind = (store / BUDGET_FILE).read_text()
    b = StoreBudget(store)
    entry = b.reserve(_ledger(0.3, "third"))
    (store / BUDGET_FILE).write_text(behind)  # the ledger as it was before the reservation's replace
    assert [e["method"] for e in b.show()["entries"]] == ["first", "second", "third"]  # counted
    b.complete(entry)  # the next change writes it all
    d = json.loads((store / BUDGET_FILE).read_text())
    assert d["journal"]["lines"] == 7 and _entry(d, "third")["status"] == "complete"


def test_a_torn_last_journal_line_was_never_recorded(spent):
    store, before = spent
    size = (store / JOURNAL_FILE).stat().st_size
    with open(store / JOURNAL_FILE, "a") as fh:
        fh.write('{"seq": 6, "op": "update", "id": "x", "se')  # killed inside the append
    same_spend(store, before)
    b = StoreBudget(store)
    b.complete(b.reserve(_ledger(0.3, "third")))  # cut off, then appended after line 5
    j = read_journal(store / JOURNAL_FILE)
    assert len(j.records) == 7 and j.size == j.file_size > size


def test_a_failed_ledger_write_takes_the_journal_line_back(spent, monkeypatch):
    """A full disk while the ledger is replaced: the journal is cut back, nothing is recorded, the error names
    the ledger."""
    import streamdp.privacy.budget as budget_mod

    store, before = spent
    journal = (store / JOURNAL_FILE).read_bytes()

    def full(path, obj, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(budget_mod, "atomic_write_json", full)
    with pytest.raises(OSError) as exc:
        StoreBudget(store).reserve(_ledger(0.3))
    assert exc.value.filename == str(store / BUDGET_FILE)
    monkeypatch.undo()
    assert (store / JOURNAL_FILE).read_bytes() == journal
    same_spend(store, before)


def test_concurrent_reservations_keep_one_chain(store):
    b = StoreBudget(store)
    b.set(1.3, 1e-6)
    ts = [threading.Thread(target=lambda: _try_reserve(store)) for _ in range(6)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    j = read_journal(store / JOURNAL_FILE)
    s = b.show()
    assert len(j.records) == 1 + len(s["entries"]) and 2 <= len(s["entries"]) < 6
    assert state_text(json.loads((store / BUDGET_FILE).read_text())) == state_text(j.state)
    assert j.records[0]["hash"] != GENESIS


def _try_reserve(store):
    from streamdp.errors import BudgetExceededError

    try:
        StoreBudget(store).reserve(_ledger(0.5))
    except BudgetExceededError:
        pass


# -- 4. replaced stores --------------------------------------------------------------------------------------


def test_ingest_force_carries_the_journal(tmp_path):
    data = tmp_path / "r.data"
    data.write_text("1\t10\t4\n2\t10\t3\n2\t11\t5\n3\t11\t4\n")
    s = tmp_path / "s.zarr"
    assert cli("ingest", data, "--out", s, "--budget", "2,1e-2")[0] == 0
    b = StoreBudget(s)
    b.complete(b.reserve(_ledger(1.0)))
    old_lines = _journal_lines(s)
    code, _, err = cli("ingest", data, "--out", s, "--force")
    assert code == 0, err
    new_lines = _journal_lines(s)
    assert new_lines[:len(old_lines)] == old_lines and len(new_lines) == len(old_lines) + 1
    assert json.loads(new_lines[-1])["op"] == "history"
    assert (s / LOCK_FILE).read_text().startswith("streamdp privacy budget journal started")
    os.remove(s / BUDGET_FILE)  # the replaced store remembers its releases too
    code, _, err = cli("budget", s)
    assert_refused(code, err, "missing (the store had a budget ledger: 1 entries")
    # a store whose ledger is refused is not replaced (its spend would be lost)
    checksum = json.loads((s / "zarr.json").read_text())["attributes"]["streamdp"]["checksum"]
    code, _, err = cli("ingest", data, "--out", s, "--force")
    assert_refused(code, err, "missing")
    assert json.loads((s / "zarr.json").read_text())["attributes"]["streamdp"]["checksum"] == checksum
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith(".")) == []


def test_ingest_force_over_a_store_from_before_the_journal(tmp_path):
    data = tmp_path / "r.data"
    data.write_text("1\t10\t4\n2\t10\t3\n2\t11\t5\n3\t11\t4\n")
    s = tmp_path / "s.zarr"
    assert cli("ingest", data, "--out", s, "--budget", "2,1e-2")[0] == 0
    d = json.loads((s / BUDGET_FILE).read_text())
    d.pop("journal")
    d.pop("history")
    (s / BUDGET_FILE).write_text(json.dumps(d))  # what an older streamdp wrote: no journal, empty lock file
    os.remove(s / JOURNAL_FILE)
    os.remove(s / WITNESS_FILE)  # nor a witness
    (s / LOCK_FILE).write_text("")
    assert cli("ingest", data, "--out", s, "--force")[0] == 0
    assert [r["op"] for r in read_journal(s / JOURNAL_FILE).records] == ["adopt", "history"]
    assert [h["event"] for h in StoreBudget(s).show()["history"]] == ["journal started", "data replaced"]
    shutil.rmtree(s)


# -- 5. a history forgotten: the ledger files deleted, the journal cut, the release key deleted ------------------


def _released_store(tmp_path, n=2):
    """A generated store with a budget and ``n`` models released by `streamdp train` (means: fast)."""
    from streamdp.storage.generate import generate_store

    s = generate_store(str(tmp_path / "s.zarr"), n_users=300, n_items=30, ratings_per_user=5, rank=2, seed=1,
                       test_fraction=0.2)
    assert cli("budget", s.path, "--set", "3,1e-5")[0] == 0
    for i in range(n):
        code, _, err = cli("train", s.path, "--method", "means", "--epsilon", "1", "--out", tmp_path / f"m{i}")
        assert code == 0, err
    return s.path


def test_a_store_that_released_refuses_to_forget_its_history(tmp_path):
    """Finding 2: ledger, journal and lock deleted after two releases; the old `train` exited 0 with a fresh ledger
    (budget and releases forgotten). The release key and the journal's witness still say it released."""
    store = _released_store(tmp_path)
    for name in (BUDGET_FILE, JOURNAL_FILE, LOCK_FILE):
        os.remove(os.path.join(store, name))
    code, _, err = cli("train", store, "--method", "means", "--epsilon", "inf", "--yes", "--out", tmp_path / "m2")
    assert_refused(code, err, os.path.join(store, BUDGET_FILE), f"missing, and so is {JOURNAL_FILE}",
                   f"{WITNESS_FILE} records its line", KEY_FILE, "restore both from a backup", "--restore")
    assert not (tmp_path / "m2").exists()
    # the witness alone says so too (a store whose key was deleted as well)
    os.remove(os.path.join(store, KEY_FILE))
    assert_refused(*cli("budget", store)[::2], f"{WITNESS_FILE} records its line 7")
    code, out, err = cli("budget", store, "--restore")
    assert code == 0 and "started an empty" in out, err
    assert cli("train", store, "--method", "means", "--epsilon", "1", "--out", tmp_path / "m2")[0] == 0
    s = StoreBudget(store).show()
    assert [h["event"] for h in s["history"]] == ["ledger lost"] and len(s["entries"]) == 1


def test_a_store_whose_key_remains_refuses_without_ledger(spent):
    """Only the release key left (no witness: e.g. a store of an older streamdp): still refused."""
    store, _ = spent
    for name in (BUDGET_FILE, JOURNAL_FILE, LOCK_FILE, WITNESS_FILE):
        os.remove(store / name)
    assert_refused(*cli("budget", store)[::2], f"its release key {KEY_FILE} shows it released models", "--restore")
    with pytest.raises(StoreError, match="release key"):
        StoreBudget(store).reserve(_ledger())


def test_a_cut_journal_is_seen(spent):
    """Finding 2: the journal's last lines cut and the ledger deleted; `--restore` rebuilt the shorter history and
    said nothing. Now the witness tells, and a rebuild from what remains is recorded as such."""
    store, before = spent
    lines = _journal_lines(store)
    (store / JOURNAL_FILE).write_text("\n".join(lines[:3]) + "\n")  # the failed release's reservation... gone
    os.remove(store / BUDGET_FILE)
    for args in (["budget", store], ["budget", store, "--set", "9,1e-6"]):
        assert_refused(*cli(*args)[::2], f"{store / JOURNAL_FILE}: ends at line 3, but {WITNESS_FILE} recorded its "
                       f"line 5: lines were cut off its end", "from a backup", "--restore")
    with pytest.raises(StoreError, match="cut off"):
        StoreBudget(store).reserve(_ledger())
    code, out, err = cli("budget", store, "--restore")
    assert code == 0, err
    assert out.startswith(f"restore: rebuilt {BUDGET_FILE} from the 3 lines that remain of {JOURNAL_FILE} "
                          f"({WITNESS_FILE} recorded 5; 1 entries): what the missing lines recorded is not counted")
    assert "journal found cut at line 3 of the 5 its witness recorded" in out
    s = StoreBudget(store).show()
    assert [h["event"] for h in s["history"]] == ["journal truncated"] and len(s["entries"]) == 1
    assert json.loads((store / WITNESS_FILE).read_text())["lines"] == 4  # the witness follows the new journal


def test_a_replaced_journal_is_seen(spent):
    """A journal written again from its first line (another chain of the same length) with the ledger deleted."""
    store, _ = spent
    recs = read_journal(store / JOURNAL_FILE).records
    forged = make_lines([{k: v for k, v in r.items() if k not in ("seq", "hash")} | {"at": "forged"} for r in recs],
                        GENESIS, 1)
    (store / JOURNAL_FILE).write_text("".join(canonical(r) + "\n" for r in forged))
    os.remove(store / BUDGET_FILE)
    for args in (["budget", store], ["budget", store, "--restore"]):
        assert_refused(*cli(*args)[::2], f"its line 5 is not the one {WITNESS_FILE} recorded", "cannot be trusted")


def test_a_damaged_witness_is_one_line_and_restorable(spent):
    store, before = spent
    (store / WITNESS_FILE).write_text("{")
    assert_refused(*cli("budget", store)[::2], f"{store / WITNESS_FILE}: not a budget journal witness", "--restore")
    code, out, err = cli("budget", store, "--restore")
    assert code == 0 and f"rewrote {WITNESS_FILE}" in out, err
    same_spend(store, before)


def test_a_deleted_release_key_is_seen(tmp_path):
    """Finding 8: a deleted release key was made again by the next `train`, and `evaluate` then refused the older
    models as "other ratings". Now `train` and `budget` say the key is missing; `evaluate` says so too."""
    store = _released_store(tmp_path)
    key = (tmp_path / "s.zarr" / KEY_FILE).read_bytes()
    os.remove(os.path.join(store, KEY_FILE))
    code, _, err = cli("train", store, "--method", "means", "--epsilon", "inf", "--yes", "--out", tmp_path / "m2")
    assert_refused(code, err, f"{os.path.join(store, KEY_FILE)}: missing, but the budget ledger records 2 release(s) "
                   f"fingerprinted with it", "restore it from a backup", "--restore")
    assert not os.path.exists(os.path.join(store, KEY_FILE)) and not (tmp_path / "m2").exists()
    assert_refused(*cli("budget", store)[::2], KEY_FILE, "missing")
    code, _, err = cli("evaluate", tmp_path / "m0", store)  # was: "not the store ... other ratings"
    assert_refused(code, err, f"{os.path.join(store, KEY_FILE)}: missing, but the budget ledger records 2",
                   "--allow-other-store")
    # another key in its place is not the store's either
    (tmp_path / "s.zarr" / KEY_FILE).write_text("ab" * 32 + "\n")
    assert_refused(*cli("budget", store)[::2], "not the key the store released with")
    # restored from a backup: everything as before
    (tmp_path / "s.zarr" / KEY_FILE).write_bytes(key)
    assert cli("budget", store)[0] == 0 and cli("evaluate", tmp_path / "m0", store)[0] == 0
    # or accepted as lost: recorded, and the next release makes a new key
    os.remove(os.path.join(store, KEY_FILE))
    code, out, err = cli("budget", store, "--restore")
    assert code == 0 and "release key" in out and "lost" in out and "no longer match" in out, err
    assert cli("train", store, "--method", "means", "--epsilon", "1", "--out", tmp_path / "m2")[0] == 0
    assert (tmp_path / "s.zarr" / KEY_FILE).read_bytes() != key
    assert [h["event"] for h in StoreBudget(store).show()["history"]] == ["release key lost"]


def test_a_journal_read_again_verifies_what_was_appended_and_sees_any_other_change(spent, monkeypatch):
    """Issue 28, finding 8: each change read and verified the whole journal again (three times per `train`). A
    read that finds the bytes this process verified, with lines appended, verifies only the new lines and gives what
    a full read gives; an edit anywhere else is read in full, and refused."""
    import streamdp.privacy.journal as journal_mod

    store, _ = spent
    path = store / JOURNAL_FILE
    read_journal(path)
    b = StoreBudget(store)
    b.complete(b.reserve(_ledger(0.3, "third")))  # two lines appended (its own reads resume too)
    calls = []
    real = journal_mod._verify
    monkeypatch.setattr(journal_mod, "_verify", lambda *a: calls.append(a[1]) or real(*a))
    j = read_journal(path, at=7)
    assert calls == [7]  # only the line the last change appended after it read the journal
    monkeypatch.setattr(journal_mod, "_VERIFIED", {})
    full = read_journal(path, at=7)
    assert calls[1:] == [1, 2, 3, 4, 5, 6, 7]  # a full read
    assert (j.lines, j.records, state_text(j.state), j.at_text, j.size) == \
        (full.lines, full.records, state_text(full.state), full.at_text, full.size)
    lines = _journal_lines(store)
    lines[2] = lines[2].replace('"complete"', '"failed"')
    path.write_text("\n".join(lines) + "\n")
    code, _, err = cli("budget", store)
    assert_refused(code, err, "line 3: its hash does not chain")


# -- 3. a forged composition cache (issue 40, third round) ------------------------------------------------------


def _forge_spend_cache(store, rdp=True):
    """Zero every state of STORE/privacy_budget.spend (its PLD: no privacy loss, and its RDP vector unless ``rdp`` is
    False) and recompute its checksum, as a forger who read streamdp/privacy/spend.py would."""
    import io

    import numpy as np

    from streamdp.privacy import spend

    path = store / spend.SPEND_FILE
    with np.load(io.BytesIO(path.read_bytes()), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(str(arrays.pop("meta")))
    arrays.pop("checksum")
    for i, s in enumerate(meta["states"]):
        if rdp:
            arrays[f"s{i}_rdp"] = np.zeros_like(arrays[f"s{i}_rdp"])
        for side in ("remove", "add"):
            if s[side] is not None:
                for k in [k for k in arrays if k.startswith(f"s{i}_{side}_")]:
                    del arrays[k]
                s[side].update(kind="dense", lower_loss=0, infinity_mass=0.0)
                arrays[f"s{i}_{side}_probs"] = np.array([1.0])
    meta_text = json.dumps(meta, sort_keys=True)
    buf = io.BytesIO()
    np.savez(buf, meta=np.array(meta_text), checksum=np.array(spend._checksum(meta_text, arrays)), **arrays)
    path.write_bytes(buf.getvalue())


@pytest.fixture
def near_budget(store):
    """A store with a budget of epsilon 3 and two releases of 1.5: one more of 2.5 composes to about 3.2."""
    from streamdp.privacy.spend import full_spend

    b = StoreBudget(store)
    b.set(3.0, 1e-6)
    for _ in range(2):
        b.complete(b.reserve(_ledger(1.5)))
    events = [e["events"] for e in b.show()["entries"]] + [_ledger(2.5).events]
    assert full_spend(events, 1e-6)[0] > 3.0  # the truth: a 2.5 release does not fit
    return store


@pytest.mark.parametrize("rdp", [True, False], ids=["states zeroed", "pld zeroed"])
def test_a_forged_composition_cache_does_not_let_a_release_past_the_budget(near_budget, rdp):
    store = near_budget
    _forge_spend_cache(store, rdp=rdp)
    with pytest.raises(BudgetExceededError, match="past its budget"):
        StoreBudget(store).reserve(_ledger(2.5))
    assert [e["status"] for e in StoreBudget(store).show()["entries"]] == ["complete", "complete"]


@pytest.mark.parametrize("rdp", [True, False], ids=["states zeroed", "pld zeroed"])
def test_a_forged_cache_never_shows_less_than_the_largest_release(near_budget, rdp):
    store = near_budget
    truth = StoreBudget(store).show()["spent"]["epsilon"]
    _forge_spend_cache(store, rdp=rdp)
    assert StoreBudget(store).show()["spent"]["epsilon"] == truth


def test_budget_verify_recomposes_from_scratch_and_reports_a_forged_cache(near_budget):
    store = near_budget
    code, out, err = cli("budget", store, "--verify")
    assert code == 0 and out.startswith("verified: 2 counted release(s) compose from scratch"), err
    _forge_spend_cache(store)
    code, out, err = cli("budget", store, "--verify")
    assert_refused(code, err, "privacy_budget.spend", "compose to")
    assert out == ""
    assert cli("budget", store, "--verify")[0] == 0  # the cache was replaced
