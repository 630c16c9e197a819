"""``streamdp ingest NEW --append STORE``: new ratings added to a store as an immutable segment, out of core.

The input goes through ingest's own passes (:mod:`streamdp.storage.ingest`: parse and validate, partition by
user block, de-duplicate, write), with the ids mapped onto the store's: a user or item already in the store keeps
its index; new users get the indices after the store's (in sorted id order, as ingest numbers them), new items
the indices after the store's items (by descending count in the new input, ties by id). The segment is a store
of its own on the store's user blocks (:mod:`streamdp.storage.segments`), written beside and renamed into
``STORE/segments/``; then the change it makes to the merged counts is counted from the blocks it touches while they are
written (its pairs looked up among the earlier parts' rows of its users, no merge: :class:`_MergeCounts`), and the
root attributes listing it are committed by one atomic rename.

Decisions a reader must know:

* the store's rules apply and the options that would change them are refused (one line naming the option): its
  rating range (a declared range with its ``--out-of-range`` rule; an observed range: a new rating outside it
  is refused, since every model scales clipping and noise to it), its kind (an interaction log onto a rating
  store, or ratings onto a log, is refused), its id kinds (string ids onto a store of integer ids are refused;
  integer-looking ids onto a store of string ids are read as strings), its split (random: the same fraction,
  each block drawn with a seed of its own for this segment; temporal and last-n: among each user's appended
  ratings; files: ``--test`` files of the append are its held-out ratings);
* a (user, item) pair already in the store: the appended rating replaces it (the store's rule, the last seen
  wins: the append is the later input, whatever the times a store keeps say), in the appended
  rating's split; an implicit store adds the counts (capped at its ``count_cap``; an implicit store without a
  cap is refused, its observed count range would change); the output says how many;
* the privacy-budget ledger stays where it is, in the store: the same users' spend keeps counting, and the
  append is recorded in its history (``data replaced``, by ``ingest --append``, old and new checksum);
* a run that opened the store before the append read its old segment list throughout; the append gives the
  store a new ``generation``, so such a run refuses to release at its end (:meth:`RatingStore.check_unchanged`);
* one writer at a time (a lock file beside the store); bad input is refused before anything is written, and
  any error after leaves the store as it was (the segment removed; a segment left by a killed process is
  not listed, so no reader sees it, and the next append or compaction removes it).
"""

from __future__ import annotations

import collections
import datetime as _dt
import hashlib
import os
import secrets
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import zarr

from streamdp.errors import ParameterError, StoreError
from streamdp.memory import frozen_collector, small_pages
from streamdp.outputs import note, owned_temp_dir, remove_temp_dir
from streamdp.storage import formats as F
from streamdp.storage.formats import to_arrow, to_numpy
from streamdp.storage import ingest as I
from streamdp.storage import remote
from streamdp.storage.chunks import ChunkWriter, write_slice
from streamdp.storage.schema import DEFAULT_CHUNK_RATINGS, SEGMENTED_FORMAT_VERSION, SPLITS, time_attrs
from streamdp.storage.segments import (BASE_KEYS, SEGMENTS_DIR, SUPERSEDES, SegmentedStore, append_lock,
                                       commit_attrs, count_delta, items_sources, merged_checksum, sweep_uncommitted)
from streamdp.storage.split import block_seed
from streamdp.storage.store import RatingStore, open_store
from streamdp.storage.ids import as_ids
from streamdp.storage.info import store_split
from streamdp.storage.writer import ContentHash, StoreWriter, ledger_keeper, padded_positions

_PURPOSE_APPEND = 11  # the seed of a segment's random split: (store seed, segment number)
_ARRAY_CONFIG = {"write_empty_chunks": True}
_READERS = 2  # threads reading the earlier parts' blocks an append counts its change in, ahead of the count
_HANDED_SHARE = 32  # the written blocks' rows waiting for the count hold at most 1/32 of the limit (the writer waits)
_USERS_PER_WRITE = 1 << 20  # the commit's per-user counts are written in slices of about this many users (8 MB)
_STR_ID_BYTES = 80  # the memory of a string id read into an object array (its str object and pointer), about


def _refuse_options(**given) -> None:
    what = {"rating_range": ("--rating-range", "rating range"), "out_of_range": ("--out-of-range", "out-of-range rule"),
            "count_cap": ("--count-cap", "count cap"), "split": ("--split", "split"), "last_n": ("--last-n", "split"),
            "test_fraction": ("--test-fraction", "split"), "block_users": ("--block-users", "user blocks"),
            "force": ("--force", "data (an append never replaces it)"), "item_names": ("--item-names", "item names"),
            "items": ("--items", "catalogue")}
    for k, v in given.items():
        if v not in (None, False, 0, 0.0):
            flag, rule = what[k]
            raise ParameterError(f"{flag}: not with --append (the store's {rule} applies)")


def _id_kind_is_str(st: RatingStore, kind: str) -> bool:
    a = st.user_ids(0, 1) if kind == "user" else st.item_ids()[:1]
    return np.asarray(a).dtype == object


@small_pages()  # its many short-lived buffers: memory.small_pages
def append(inputs, out, *, fmt=None, sep=None, columns=None, rating_range=None, test_fraction=0.0, seed=0,
           skip_bad_lines=False, memory_limit=None, block_users=None, force=False, show_progress=None,
           out_of_range=None, notes=True, implicit=False, count_cap=None, split=None, last_n=None, test_inputs=None,
           item_names=None, items=None) -> RatingStore:
    """Add ``inputs`` (rating files or in-memory specs, as :func:`~streamdp.storage.ingest.ingest` reads them) to
    the store at ``out`` as a new segment and return the store opened (module docstring for the rules).

    Raises :class:`~streamdp.errors.InputError` for bad input, :class:`ParameterError` for an option or an
    input that does not fit the store (one line each), :class:`StoreError` for a store that cannot take it;
    the store is then unchanged.
    """
    t0 = time.perf_counter()
    if remote.is_url(out):
        raise ParameterError(f"--append {out}: only a store on a local disk can be appended to")
    _refuse_options(rating_range=rating_range, out_of_range=out_of_range, count_cap=count_cap, split=split,
                    last_n=last_n, test_fraction=test_fraction, block_users=block_users, force=force,
                    item_names=item_names, items=items)
    test_inputs = list(test_inputs or [])
    _, _, _, _, _, limit = I._check_options(inputs, [], rating_range=None, out_of_range=None, test_fraction=0.0,
                                            split=None, last_n=None, seed=seed, block_users=None,
                                            memory_limit=memory_limit)
    st = open_store(out)
    out = st.path
    how = dict(store_split(st.attrs, st.n_test))  # a store written before "split" was recorded: its parameters'
    kind = how.get("kind", "none")
    if kind == "random" and not how.get("test_fraction"):
        raise ParameterError(f"--append {out}: the store records no fraction for its random test split, so appended "
                             f"ratings cannot be held out alike; re-ingest everything")
    if test_inputs and kind != "files":
        raise ParameterError(f"--test: only onto a store split by files (--train/--test); {out} is split {kind}")
    if kind == "files":
        how = {"kind": "files"}
        I._check_distinct_files(inputs, test_inputs)
    cap = st.attrs.get("count_cap") if st.implicit else None
    if st.implicit and cap is None:
        raise ParameterError(f"--append {out}: an implicit store ingested without --count-cap cannot be appended to "
                             f"(summed counts would leave its observed count range); ingest it with --count-cap")
    declared = not st.implicit and st.info.rating_range_source == "declared"
    rr = (st.info.rating_min, st.info.rating_max) if declared else None
    oor = st.attrs.get("out_of_range") or "error" if declared else "error"
    names = ", ".join(str(getattr(p, "path", p)) for p in inputs + test_inputs)

    specs = [p if isinstance(p, F.Spec) else F.resolve_spec(p, fmt=fmt, sep=sep, columns=columns,
                                                            implicit=implicit or st.implicit)
             for p in inputs + test_inputs]
    for s in specs:
        if s.implicit != st.implicit:
            raise ParameterError(f"{s.path}: an interaction log (no rating column) cannot be appended to the rating "
                                 f"store {out}" if s.implicit else
                                 f"{s.path}: ratings cannot be appended to the implicit store (interaction log) "
                                 f"{out}; pass --implicit to read the file as a log")
    specs, is_implicit = I._input_specs(specs, how, fmt=fmt, sep=sep, columns=columns, implicit=st.implicit,
                                        rr=rr, out_of_range=None, count_cap=cap)
    as_str = (_id_kind_is_str(st, "user"), _id_kind_is_str(st, "item"))
    tmp = seg_path = None
    made_dir = False
    try:
        tmp = owned_temp_dir(I._spill_beside(out), "ingest")
        parsed, int_ids = I._parse_inputs(specs, len(inputs), tmp, rr, skip_bad_lines, limit, show_progress, oor,
                                          is_implicit, t0, as_strings=as_str)
        for k, role in enumerate(("user", "item")):
            if not as_str[k] and not int_ids[k]:
                raise ParameterError(f"{names}: {role} ids are not all integers, but the store's {role} ids are "
                                     f"integers (--append maps ids onto the store's; re-ingest everything to mix them)")
        if not declared and not is_implicit and (parsed.rmin < st.info.rating_min or parsed.rmax > st.info.rating_max):
            lo, hi = st.info.rating_min, st.info.rating_max
            raise ParameterError(f"{names}: ratings in [{parsed.rmin:g}, {parsed.rmax:g}], outside the store's "
                                 f"observed rating range [{lo:g}, {hi:g}] (--rating-range): an append keeps the "
                                 f"store's range; re-ingest everything, or ingest with a declared --rating-range")
        if st.attrs.get("times") and not parsed.has_ts:
            raise ParameterError(f"{names}: no timestamp column, but the store {out} keeps each rating's time "
                                 f"(every append must bring its ratings' times; name the column with --columns)")
        # the full collections of the passes below traverse only what they create, not Numba's registries that
        # the parse's first kernel loaded (memory.frozen_collector)
        with append_lock(out), frozen_collector():
            now = open_store(out)
            if now.identity != st.identity:
                raise StoreError(f"{out}: the store changed while this append read its input (another append or a "
                                 f"compaction); nothing was appended, run again")
            st = now
            committed = [e["name"] for e in st.attrs.get("segments") or []]
            for gone in sweep_uncommitted(out, committed):
                note(f"removed {gone}: a segment of an append that did not finish (never committed)")
            # a store with a ledger (any of its files: a lost ledger beside its journal is the ledger's to say): it is
            # checked before anything is written (a corrupt one refuses the append) and records the append
            ledger = ledger_keeper().ledger(out) if _has_ledger(out) else None
            if ledger is not None:
                ledger.check()
            seg_dir = os.path.join(out, SEGMENTS_DIR)
            made_dir = not os.path.isdir(seg_dir)
            os.makedirs(seg_dir, exist_ok=True)
            number = len(committed) + 1
            name = f"{number:06d}-{secrets.token_hex(4)}"
            seg_path = os.path.join(seg_dir, name)
            entry, counts = _write_segment(st, parsed, how, seg_path, name, number, tmp, limit, show_progress, rr,
                                           cap, is_implicit, t0)
            new_attrs = _commit(st, out, seg_path, entry, counts)
            seg_path = None  # committed: the store's now
            if ledger is not None:
                ledger.data_replaced(by="ingest --append", old_checksum=st.attrs.get("checksum"),
                                     new_checksum=new_attrs["checksum"])
    except BaseException:
        if seg_path is not None and os.path.lexists(seg_path):
            shutil.rmtree(seg_path, ignore_errors=True)
        if made_dir:
            try:
                os.rmdir(os.path.join(out, SEGMENTS_DIR))
            except OSError:
                pass
        raise
    finally:
        if tmp is not None:
            remove_temp_dir(tmp)
    if notes:
        note(append_summary(out, entry, implicit=is_implicit))
    return open_store(out)


def _has_ledger(path: str) -> bool:
    """Whether the store holds any file of a privacy-budget ledger (``privacy_budget.*``,
    :mod:`streamdp.privacy.budget`): without one there is nothing to keep, and the privacy layer (dp-accounting,
    2 s to import) is not loaded."""
    return any(n.startswith("privacy_budget.") for n in os.listdir(path))


def append_summary(out: str, e: dict, *, implicit: bool) -> str:
    """The line an append prints: what was added and what became of the pairs already in the store."""
    pairs = (f"{e['n_pairs_merged']} pair(s) already in the store had their counts added to (the store's rule: "
             f"repeated pairs are summed, capped at its count cap)" if implicit else
             f"{e['n_pairs_merged']} pair(s) already in the store were replaced by the appended rating (the store's "
             f"rule: the last seen wins)")
    within = "aggregated" if implicit else "dropped"
    return (f"{out}: appended segment {e['name']}: {e['n_input_ratings']} ratings read, {e['n_new_users']} new "
            f"users, {e['n_new_items']} new items; {e['n_duplicates_in_input']} repeated pair(s) within the input "
            f"{within}; {pairs}")


def _write_segment(st, parsed, how, seg_path, name, number, tmp, limit, show_progress, rr, cap, is_implicit,
                   t0) -> tuple[dict, "_MergeCounts"]:
    """Passes 2-4 of ingest onto the store's indices: the segment written and renamed into place (not committed);
    returns its entry for the segment list and its change to the merged counts (counted as it was written)."""
    n_old_users, n_old_items, bu = st.info.n_users, st.info.n_items, st.info.block_users
    uidx, new_users = _users_onto(parsed.users, st, limit)
    iidx, new_items = _onto(parsed.items, st.item_ids(), n_old_items, parsed.item_rows)
    n_users, n_items = n_old_users + len(new_users), n_old_items + len(new_items)
    user_rows = np.zeros(n_users, np.int64)
    user_rows[uidx] = parsed.user_rows
    n_blocks = -(-n_users // bu)
    parts = I._plan_partitions(user_rows, bu, I._partition_cap(limit, parsed.n_rows))
    part_first = np.array([b0 * bu for b0, _ in parts] + [n_users], dtype=np.int64)
    kind = how["kind"]
    pl = I._Plan(n_users=n_users, n_raw_items=n_items, bu=bu, n_blocks=n_blocks, parts=parts,
                 part_first=part_first, has_ts=parsed.has_ts,
                 test_fraction=how.get("test_fraction", 0.0) if kind == "random" else 0.0, files=kind == "files",
                 presplit=kind in ("files", "temporal", "last-n"),
                 base=[os.path.join(tmp, f"part{p}") for p in range(len(parts))],
                 user_index=uidx.astype(np.int32), item_index=iidx.astype(np.int32),
                 keep_times=bool(st.attrs.get("times")))
    parsed.user_rows = user_rows  # pass 3 sizes its threads by the partitions' ratings
    splits = tuple(s for s in SPLITS if s in st._root)
    counts = _MergeCounts(st, n_users, n_items, splits, user_rows, limit)  # reading the earlier parts from here on
    try:
        entry = _write_parts(st, parsed, how, seg_path, name, number, limit, show_progress, rr, cap, t0, pl, new_users,
                             new_items, splits, counts)
        counts.finish()
    finally:
        counts.close()
    return entry, counts


def _write_parts(st, parsed, how, seg_path, name, number, limit, show_progress, rr, cap, t0, pl, new_users, new_items,
                 splits, counts) -> dict:
    """:func:`_write_segment`'s passes 3-4 and the segment's attributes, each block handed to ``counts`` once
    written."""
    n_users, n_items, bu = pl.n_users, pl.n_raw_items, pl.bu
    user_rows = parsed.user_rows
    n_groups = I._scatter(parsed, pl, limit, show_progress)
    I._release_memory()
    agg = I._dedup_pass(parsed, pl, n_groups, how, limit, cap, show_progress)
    I._release_memory()
    if pl.files:
        I._check_training_left(parsed, agg["train_counts"])
    seg_seed = block_seed(how.get("seed"), number, _PURPOSE_APPEND)
    chunk = segment_chunk(user_rows, bu)
    with StoreWriter(seg_path, n_users=n_users, n_items=n_items, block_users=bu, splits=splits,
                     times=pl.keep_times, chunk_ratings=chunk,  # the input's rows: at least what is written
                     train_positions=padded_positions(I.block_rows(user_rows, bu), chunk)) as w:
        I._write_blocks(w, parsed, pl, np.arange(n_items, dtype=np.int32), rr, seg_seed, show_progress,
                        written=counts.written)
        w.write_array("new_user_ids", I._ids_numpy(new_users), chunks=(bu,))
        w.write_array("new_item_ids", I._ids_numpy(new_items))
        appended = {"n_new_users": len(new_users), "n_new_items": len(new_items),
                    "n_input_ratings": int(parsed.n_rows), "n_duplicates_in_input": int(agg["n_dup"]),
                    "n_bad_lines_skipped": parsed.n_bad,
                    "n_out_of_range_clipped": parsed.n_out_of_range if parsed.out_of_range == "clip" else 0,
                    "n_out_of_range_dropped": parsed.n_out_of_range if parsed.out_of_range == "drop" else 0}
        seg_attrs = {"rating_min": st.info.rating_min, "rating_max": st.info.rating_max,
                     "rating_range_source": st.info.rating_range_source, "created_with": "ingest --append",
                     "segment": name, "appended": appended,
                     "sources": [{"name": os.path.basename(s.spec.path), "rows": s.rows, "format": s.spec.format,
                                  **({"split": "test" if s.flag else "train"} if pl.files else {})}
                                 for s in parsed.sources],
                     "seconds": round(time.perf_counter() - t0, 3)}
        for k in ("implicit", "value", "count_cap", "out_of_range"):
            if k in st.attrs:
                seg_attrs[k] = st.attrs[k]
        w.finalize(seg_attrs)
    seg_root = zarr.open_group(seg_path, mode="r")
    return {"name": name, "checksum": dict(seg_root.attrs)["streamdp"]["checksum"], **appended,
            "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


def segment_chunk(user_rows: np.ndarray, bu: int) -> int:
    """The chunk (ratings) of a segment's ``items`` and ``ratings``: the power of two at or above the mean of its
    non-empty blocks' input rows (an upper bound of what each holds), within [1024, the store default].

    Every block starts a chunk of its own, so a small append onto a big store, a few ratings in each of its many
    blocks, wrote and then read back (its commit, every pass over the store) as many store-sized chunks, mostly
    padding: 1% of a 100M store, 262144-rating chunks for about 10,000 ratings a block."""
    rows = I.block_rows(user_rows, bu)
    rows = rows[rows > 0]
    mean = int(rows.mean()) if len(rows) else 1
    return int(min(max(1 << max(mean - 1, 1).bit_length(), 1 << 10), DEFAULT_CHUNK_RATINGS))


def _users_onto(keys: pa.Array, st: RatingStore, limit: int):
    """:func:`_onto` for the users, reading the store's user ids a slice of blocks at a time (at most 1/32 of
    ``limit``, never all of them at once; a read per block cost ~1 ms of Zarr's each, 96 of them for a 100M store):
    a store's users are numbered by sorted id within its base and within each segment's new users, so each
    block's ids are matched against the parsed keys (sorted unique) by binary search; a run of ids that is not
    sorted (a store written otherwise) is matched by a hash lookup instead."""
    is_str = _id_kind_is_str(st, "user")
    keys = keys.cast(pa.string() if is_str else pa.int64())
    k = np.asarray(to_numpy(keys), dtype=object if is_str else np.int64)
    index = np.full(len(k), -1, np.int64)
    bu, n = st.info.block_users, st.info.n_users
    per_read = bu * max(1, limit // 32 // ((_STR_ID_BYTES if is_str else 8) * bu))
    for a in range(0, n, bu):
        if a % per_read == 0:
            ids_read = np.asarray(st.user_ids(a, min(a + per_read, n)), dtype=object if is_str else np.int64)
        ids = ids_read[a % per_read:a % per_read + min(bu, n - a)]
        if len(ids) > 1 and not bool(np.all(ids[1:] > ids[:-1])):
            vs = pa.array(ids.tolist(), pa.string()) if is_str else to_arrow(ids)
            found = pc.index_in(keys, value_set=vs)
            hit = ~to_numpy(found.is_null())
            index[hit] = a + np.asarray(to_numpy(found, fill=0)[hit], np.int64)
            continue
        lo, hi = np.searchsorted(k, ids[0], "left"), np.searchsorted(k, ids[-1], "right")
        if hi > lo:
            pos = np.searchsorted(ids, k[lo:hi])
            pos_c = np.minimum(pos, len(ids) - 1)
            hit = ids[pos_c] == k[lo:hi]
            index[lo:hi][hit] = a + pos_c[hit]
    new_pos = np.flatnonzero(index < 0)
    index[new_pos] = n + np.arange(len(new_pos))
    return index, keys.take(to_arrow(new_pos.astype(np.int64)))


def _onto(keys: pa.Array, store_ids: np.ndarray, n_old: int, rows: np.ndarray | None):
    """``(index, new_keys)``: the store's index of each parsed key (sorted unique ``keys``): the store's own for a
    key it has, else after ``n_old``: in key order (users), or by descending ``rows``, ties by key (items)."""
    if store_ids.dtype == object:
        value_set = pa.array(store_ids.tolist(), pa.string())
        keys = keys.cast(pa.string())
    else:
        value_set = to_arrow(store_ids.astype(np.int64))
        keys = keys.cast(pa.int64())
    found = pc.index_in(keys, value_set=value_set)
    is_new = to_numpy(found.is_null())
    index = np.asarray(to_numpy(found, fill=0), np.int64)
    new_pos = np.flatnonzero(is_new)
    if rows is not None and len(new_pos):
        new_pos = new_pos[np.lexsort((new_pos, -rows[new_pos]))]
    index[new_pos] = n_old + np.arange(len(new_pos))
    return index, keys.take(to_arrow(new_pos.astype(np.int64)))


class _MergeCounts:
    """An append's change to the merged counts (``merge/...``), counted block by block while its segment is written.

    The earlier parts' rows of each block the segment may touch (the blocks of its input's users) are read without
    their ratings (:func:`~streamdp.storage.segments.items_sources`) by :data:`_READERS` threads from the moment the
    users are mapped, ahead of the writer; once the writer has written a block (:meth:`written`), one counting
    thread looks its pairs up among them (:func:`~streamdp.storage.segments.count_delta`), in block order. Those
    reads, the base's items of every block a 1% append touches (0.4-0.7 CPU-s onto a 100M store), thus run beside
    the append's single-threaded passes (partition, de-duplicate, write) instead of after them, as the commit did.

    Memory: at most :data:`_READERS` blocks read ahead of the count; the written blocks' rows waiting for it are
    copies (not views that would keep their partition alive) of at most 1/:data:`_HANDED_SHARE` of ``limit`` (or
    one block), and the writer waits while they would hold more. Two blocks at most, as this was, kept the writer
    waiting for the count 0.05 s of a 1% append's 0.36 s pass onto a 100M store (96 blocks of about 10,000 new
    ratings each: 0.2 MB a block). The per-user change is kept sparse (the users whose count changes: at most the
    segment's users), the per-item change whole.
    """

    def __init__(self, st: RatingStore, n_users: int, n_items: int, splits, user_rows: np.ndarray, limit: int):
        self.parts = list(st.parts) if isinstance(st, SegmentedStore) else [st]
        self.n_users, self.n_items, self.splits = n_users, n_items, tuple(splits)
        self.bu = st.info.block_users
        self.n_blocks = -(-n_users // self.bu)
        self.item_delta = np.zeros(n_items, np.int64)
        self.block_delta = np.zeros((2, self.n_blocks), np.int64)
        self.supersedes = np.zeros((2, self.n_blocks), np.uint8)
        #: block -> (the block's users whose count changes, by how much)
        self.users: dict = {}
        rows = I.block_rows(user_rows, self.bu)
        self._ahead = collections.deque(int(b) for b in np.flatnonzero(rows > 0))
        self._reads: dict = {}
        self._lock = threading.Lock()
        self._room = threading.Condition()  # the bytes of the written blocks' rows waiting for the count
        self._held, self._budget = 0, max(1, limit // _HANDED_SHARE)
        self._counted = collections.deque()
        self._readers = ThreadPoolExecutor(max_workers=_READERS)
        self._counter = ThreadPoolExecutor(max_workers=1)
        for _ in range(_READERS):
            self._read_next()

    def _n(self, b: int) -> int:
        return min(self.bu, self.n_users - b * self.bu)

    def _read_next(self) -> None:
        with self._lock:
            if self._ahead:
                b = self._ahead.popleft()
                self._reads[b] = self._readers.submit(items_sources, self.parts, b, self._n(b), self.splits)

    def written(self, b: int, rows) -> None:
        """The writer's call once block ``b`` is written, ``rows`` its ``(split, indptr, items)``: counted by the
        counting thread (a block without rows changes nothing). Raises the count's error, if one failed."""
        while self._counted and self._counted[0].done():
            self._counted.popleft().result()
        if not any(int(ip[-1]) for _, ip, _ in rows):
            return
        rows = {s: (np.array(ip, np.int64), np.array(it, np.int32)) for s, ip, it in rows}  # copies
        size = sum(ip.nbytes + it.nbytes for ip, it in rows.values())
        with self._room:
            self._room.wait_for(lambda: self._held == 0 or self._held + size <= self._budget)
            self._held += size
        try:
            self._counted.append(self._counter.submit(self._count, b, rows, size))
        except BaseException:
            self._release(size)
            raise

    def _release(self, size: int) -> None:
        with self._room:
            self._held -= size
            self._room.notify_all()

    def _count(self, b: int, rows: dict, size: int) -> None:
        try:
            with self._lock:  # blocks read ahead that came out empty, or before this one, are not counted
                while self._ahead and self._ahead[0] <= b:
                    self._ahead.popleft()
                for k in [k for k in self._reads if k < b]:
                    self._reads.pop(k).cancel()
                got = self._reads.pop(b, None)
            n = self._n(b)
            src = got.result() if got is not None else items_sources(self.parts, b, n, self.splits)
            self._read_next()
            last = len(self.parts)
            for s in self.splits:
                ip, it = rows.get(s, (np.zeros(n + 1, np.int64), np.empty(0, np.int32)))
                src.append((last, SPLITS.index(s), np.asarray(ip, np.int64), np.asarray(it, np.int32)))
            du, self.block_delta[:, b], self.supersedes[:, b] = count_delta(src, n, last, self.n_items,
                                                                            self.item_delta)
            changed = np.flatnonzero(du)
            self.users[b] = (changed, du[changed])
        finally:
            self._release(size)

    def finish(self) -> None:
        """Wait for every block's count (raising the first error)."""
        while self._counted:
            self._counted.popleft().result()

    def close(self) -> None:
        """Stop reading and counting (after :meth:`finish`, or on an error): no thread outlives the append's write."""
        with self._lock:
            self._ahead.clear()
            for f in self._reads.values():
                f.cancel()
            self._reads.clear()
        self._counter.shutdown(wait=True, cancel_futures=True)
        self._readers.shutdown(wait=True, cancel_futures=True)

    def block_users(self, b: int) -> np.ndarray:
        """The change of block ``b``'s users' merged counts (zero for a block the segment left alone)."""
        du = np.zeros(self._n(b), np.int64)
        got = self.users.get(b)
        if got is not None:
            du[got[0]] = got[1]
        return du


def _commit(st: RatingStore, out: str, seg_path: str, entry: dict, counts: _MergeCounts) -> dict:
    """The segment's change to the merged counts (``merge/...``, counted as it was written) written into it, then
    the new segment list committed; returns the committed attributes."""
    old = st.attrs
    seg = open_store(seg_path)
    n_users, n_items, n_blocks = seg.info.n_users, seg.info.n_items, seg.info.n_blocks
    new = {k: v for k, v in old.items()}
    if "base" not in new:
        new["base"] = {k: old[k] for k in BASE_KEYS if k in old}
    for k in ("train_item_stats", "checksum_ids", "checksum_attrs"):
        new.pop(k, None)  # they describe the base (kept under "base")
    new.update(format_version=SEGMENTED_FORMAT_VERSION, n_users=n_users, n_items=n_items, n_blocks=n_blocks,
               segments=list(old.get("segments") or []) + [entry], generation=secrets.token_hex(8))
    bu = st.info.block_users
    g = zarr.open_group(seg_path, mode="a")
    ua = g.create_array("merge/user_counts", shape=(n_users,), dtype="int64", chunks=(bu,), config=_ARRAY_CONFIG)
    ua_raw = ChunkWriter.for_array(ua)  # whole chunks as files of our own (Zarr's write: ~0.5 ms a chunk)
    item_delta, block_delta, supersedes = counts.item_delta, counts.block_delta, counts.supersedes
    hu = hashlib.blake2b(digest_size=16)
    pending, since = [], 0  # consecutive blocks' user counts from user `since`, written together (a Zarr write
    for b in range(n_blocks):  # costs ~1 ms whatever its size)
        du = counts.block_users(b)
        end = min((b + 1) * bu, n_users)
        pending.append(du)
        if end - since >= _USERS_PER_WRITE or b == n_blocks - 1:
            write_slice(ua, ua_raw, since, np.concatenate(pending))
            pending, since = [], end
        hu.update(np.ascontiguousarray(du, dtype="<i8"))
    g.create_array("merge/item_counts", shape=(n_items,), dtype="int64", chunks=(max(1, min(n_items, 1 << 20)),),
                   config=_ARRAY_CONFIG)[:] = item_delta
    g.create_array("merge/block_nnz", shape=(2 * n_blocks,), dtype="int64", chunks=(max(1, 2 * n_blocks),),
                   config=_ARRAY_CONFIG)[:] = block_delta.reshape(-1)
    g.create_array(SUPERSEDES, shape=(2 * n_blocks,), dtype="uint8", chunks=(max(1, 2 * n_blocks),),
                   config=_ARRAY_CONFIG)[:] = supersedes.reshape(-1)
    digest = _digest(hu, item_delta, block_delta.reshape(-1), seg, supersedes.reshape(-1))
    added = int(seg.info.n_ratings) + int(seg.info.n_test)  # the segment's own pairs, as its writer counted them
    entry.update(merge_digest=digest, n_ratings_added=int(block_delta[0].sum()),
                 n_test_added=int(block_delta[1].sum()),
                 n_pairs_merged=added - int(block_delta.sum()))
    if old.get("times") and "segments" not in old:  # the base's own span, kept (a window skips an older base)
        new["base_times"] = old["times"]
    if old.get("times"):  # the span of the merged store's times (replaced pairs' old times included: owner's only)
        new["times"] = time_attrs([[old["times"].get("min"), old["times"].get("max")],
                                   [seg.attrs["times"].get("min"), seg.attrs["times"].get("max")]])
    new.update(n_ratings=int(old["n_ratings"]) + int(block_delta[0].sum()),
               n_test=int(old.get("n_test", 0)) + int(block_delta[1].sum()),
               checksum=merged_checksum(old.get("checksum"), entry["checksum"], digest))
    commit_attrs(out, new, expect_generation=old.get("generation"))
    return new


def merge_arrays_digest(seg: RatingStore) -> str:
    """The digest of a committed segment's ``merge/...`` arrays, as :func:`_commit` recorded it (``verify``)."""
    n_users, n_items, n_blocks = seg.info.n_users, seg.info.n_items, seg.info.n_blocks
    bu = seg.info.block_users
    hu = hashlib.blake2b(digest_size=16)
    for b in range(n_blocks):
        first, end = b * bu, min((b + 1) * bu, n_users)
        hu.update(np.ascontiguousarray(seg._per_entity("merge/user_counts", n_users, first, end), dtype="<i8"))
    flags = seg._per_entity(SUPERSEDES, 2 * n_blocks) if seg._has(SUPERSEDES) else None
    return _digest(hu, seg._per_entity("merge/item_counts", n_items), seg._per_entity("merge/block_nnz", 2 * n_blocks),
                   seg, flags)


def _digest(hu, item_delta, block_delta, seg: RatingStore, supersedes=None) -> str:
    """The digest of a segment's ``merge/...`` arrays (``hu``: the user counts' hash, fed block by block;
    ``supersedes``: None for a segment appended before it was recorded) and of its new users' and items' ids
    (outside the segment's own checksum, which covers its blocks)."""
    ids = ContentHash()
    a = seg.attrs["appended"]
    for kind in ("user", "item"):
        n = int(a[f"n_new_{kind}s"])
        ids.add_ids(f"new_{kind}_ids", as_ids(seg._per_entity(f"new_{kind}_ids", n)))
    h = hashlib.blake2b(digest_size=16)
    h.update(hu.digest())
    h.update(np.ascontiguousarray(item_delta, dtype="<i8"))
    h.update(np.ascontiguousarray(block_delta, dtype="<i8"))
    h.update(ids.hexdigest().encode())
    if supersedes is not None:
        h.update(np.ascontiguousarray(supersedes, dtype=np.uint8))
    return "blake2b:" + h.hexdigest()
