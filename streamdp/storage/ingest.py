"""``streamdp ingest``: rating files of any size -> a rating store, out of core.

Four streaming passes (nothing holds all ratings in memory):

1. **Parse** every input (:mod:`streamdp.storage.formats`) in blocks sized from
   ``memory_limit``, check ratings and ids, count distinct ids, spill the parsed columns
   in Arrow IPC to a temporary directory next to ``--out``;
2. **number** users by sorted original id and **partition** the ratings by user block
   (:func:`bucket_rows`; ids are mapped to indices by arrays, never a Python dict);
3. **group and de-duplicate** each partition (:func:`group_dedup`): a repeated (user,
   item) pair keeps the latest by timestamp, else the last seen in input order; the
   temporal, last-n and files splits are made here;
4. **renumber items** by descending count, sort each user's items (:func:`remap_sort`) and
   **write** the blocks through :class:`StoreWriter` (a random split: :func:`split_block`).

Decisions a reader must know:

* ``memory_limit`` bounds the working data; below :func:`min_memory_limit` it is refused,
  not silently exceeded; freed memory is given back to the OS between passes;
* ids are integers when every id of the column is a canonical integer, else strings kept
  exactly as written; users are numbered by sorted original id;
* ratings outside a declared ``--rating-range``: ``--out-of-range error`` (default),
  ``clip`` or ``drop``, counted in the store; non-finite ratings are always bad lines;
* interaction logs (no rating column, or ``--implicit``) make an **implicit** store:
  repeated pairs are summed, ``--count-cap`` caps the counts (format version 2);
* splits (:func:`resolve_split`) hold out **per user**, not at a global cutoff time; with
  ``--train/--test`` a pair in both files is kept in the test split only;
* a text file without a header has its columns taken by position, and a note says so.

Design notes (the passes in full, memory and disk, the id, range, implicit and split
rules): docs/design-notes.md#streamdpstorageingestpy.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamdp.errors import InputError, ParameterError
from streamdp.kernels.ingest import (bucket_rows, count_into, group_dedup, hash_strings, nonzero_counts,
                                     remap_sort, same_strings)
from streamdp.memory import format_size, release_freed_memory, resolve_memory_limit, unmap_large_frees
from streamdp.outputs import is_no_space, no_space_error, note, owned_temp_dir, remove_temp_dir
from streamdp.progress import progress
from streamdp.storage import formats as F
from streamdp.storage.formats import to_arrow, to_numpy
from streamdp.storage.names import read_item_names
from streamdp.storage.schema import default_block_users, storable_ratings
from streamdp.storage.split import block_seed, check_fraction, latest_mask, split_block, split_by_mask
from streamdp.storage.store import RatingStore, open_store
from streamdp.storage.writer import StoreWriter, check_destination

_PURPOSE_SPLIT = 3  # same purpose key as generate: the split of block b depends on (seed, b) only
#: Bytes of working memory per rating of a partition while it is grouped or written.
_BYTES_PER_PART_RATING = 256
#: Pass 4 writes the per-user counts of consecutive blocks together, at most this many users at a time (8 MB; one
#: slice is written by a thread while the next is gathered, 16 MB at most).
_USERS_PER_WRITE = 1 << 20
#: Peak bytes per rating of one partition in pass 3 (:func:`group_dedup`: its input columns, 20 with a
#: timestamp, one column's concatenation, the kernel's position and timestamp scratch, 16, and its outputs, 16).
_DEDUP_BYTES_PER_RATING = 64
#: pyarrow's streaming CSV reader reads ahead up to ~32 blocks when parsing is the
#: bottleneck, so a parse block is 1/_PARSE_SHARE of the limit per parsing thread,
#: within [_MIN_PARSE_BLOCK, _MAX_PARSE_BLOCK].
_PARSE_SHARE = 160
_MIN_PARSE_BLOCK = 1 << 18
_MAX_PARSE_BLOCK = 16 << 20
#: Values of ``out_of_range`` (``--out-of-range``).
OUT_OF_RANGE = ("error", "clip", "drop")
#: Values of ``split`` (``--split``); ``--train/--test`` files make the split ``"files"``.
SPLIT_KINDS = ("random", "temporal", "last-n")


def _threads() -> int:
    """Threads of the parse, partition and de-duplication passes."""
    return min(2, os.cpu_count() or 1)


def min_memory_limit() -> int:
    """The smallest ``memory_limit`` that ingest can keep to.

    Every working buffer is sized from the limit with a floor below which it stops
    shrinking; the largest floor is the parse blocks' (``_PARSE_SHARE`` blocks of
    ``_MIN_PARSE_BLOCK`` bytes per parsing thread, about 84 MB with 2 threads). The
    others (partition scatter chunks, id-count buffers, partitions) reach their floors
    only below 11 MB.
    """
    return _PARSE_SHARE * _threads() * _MIN_PARSE_BLOCK


@dataclass
class _Source:
    spec: F.Spec
    size: int
    spills: list
    rows: int = 0
    flag: int = 0  # 1: a --test file
    lo: float = np.inf  # its smallest and largest rating
    hi: float = -np.inf


class _BadLine(Exception):
    """A bad rating found by the fast path (its line is then located by the slow path)."""


class _KeyCounter:
    """Distinct keys and their counts, merged in bounded buffers.

    A merge sorts the keys by their 64-bit hash (:func:`_key_hashes`: an integer key is its own) and sums the
    counts of equal hashes, each group's strings checked equal byte for byte (a kernel on the Arrow buffers: no
    copy); a true collision of two keys merges exactly through pyarrow's group-by instead. Measured on 30M
    ratings of 2M string user ids: 393 MB of Arrow memory at the peak of pyarrow's group-by alone.
    """

    def __init__(self, max_buffered: int = 1 << 20):
        self.max_buffered = max_buffered
        self.keys: pa.Array | None = None  # in the order of their hashes
        self.hashes: np.ndarray | None = None
        self.counts: np.ndarray | None = None
        self.buf: list = []
        self.buffered = 0

    def add(self, arr: pa.Array) -> None:
        vc = pc.value_counts(arr)
        self.add_counts(vc.field("values"), vc.field("counts"))
        if self.buffered > max(self.max_buffered, 0 if self.keys is None else len(self.keys) // 4):
            self._merge()

    def add_counts(self, keys: pa.Array, counts: pa.Array) -> None:
        self.buf.append((keys, counts))
        self.buffered += len(keys)

    def _merge(self) -> None:
        if not self.buf:
            return
        ks = [k for k, _ in self.buf]
        cs = [to_numpy(c).astype(np.int64) for _, c in self.buf]
        hs = [_key_hashes(k) for k in ks]
        if self.keys is not None:
            ks.insert(0, self.keys)
            cs.insert(0, self.counts)
            hs.insert(0, self.hashes)
        self.buf, self.buffered = [], 0
        k, c, h = pa.concat_arrays(ks), np.concatenate(cs), np.concatenate(hs)
        order = np.argsort(h, kind="stable")
        h = h[order]
        starts = np.flatnonzero(np.concatenate([[True], h[1:] != h[:-1]]))
        rep = order[starts]  # each group's first key
        if not pa.types.is_integer(k.type):
            group = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, len(h))))
            same = np.empty(len(order), np.bool_)
            same_strings(*_string_buffers(k), order, rep[group], same)
            if not same.all():  # two keys share a hash: the exact merge
                t = pa.table({"k": k, "c": to_arrow(c)}).group_by("k", use_threads=False).aggregate([("c", "sum")])
                k, c = t.column("k").combine_chunks(), to_numpy(t.column("c_sum"))
                h = _key_hashes(k)
                order = np.argsort(h, kind="stable")
                self.keys, self.hashes, self.counts = k.take(to_arrow(order)), h[order], c[order]
                return
        self.keys = k.take(to_arrow(rep))
        self.hashes = h[starts]
        self.counts = np.add.reduceat(c[order], starts)

    def finish(self) -> tuple[pa.Array, np.ndarray]:
        """(keys sorted ascending, counts as int64)."""
        self._merge()
        idx = pc.sort_indices(self.keys)
        return self.keys.take(idx), self.counts[to_numpy(idx)]


class _IntCounter:
    """Counts of integer keys in a dense array over their observed range while the range
    stays below ``max_range`` entries (O(1) per key, no hashing); falls back to
    :class:`_KeyCounter` for sparse ids."""

    def __init__(self, max_range: int, max_buffered: int):
        self.max_range, self.max_buffered = max_range, max_buffered
        self.lo = 0
        self.seen = (0, -1)  # the smallest and largest id counted
        self.counts: np.ndarray | None = None
        self.fallback: _KeyCounter | None = None

    def add(self, arr: pa.Array) -> None:
        if self.fallback is not None:
            return self.fallback.add(arr)
        a = to_numpy(arr)
        lo, hi = int(a.min()), int(a.max())
        if self.counts is not None:  # the ids seen, not the array's slack, decide the fallback
            lo, hi = min(lo, self.seen[0]), max(hi, self.seen[1])
        if hi - lo + 1 > self.max_range:
            self.fallback = _KeyCounter(self.max_buffered)
            if self.counts is not None:
                nz = np.flatnonzero(self.counts)
                self.fallback.add_counts(to_arrow(nz + self.lo), to_arrow(self.counts[nz]))
                self.counts = None
            return self.fallback.add(arr)
        self.seen = (lo, hi)
        if self.counts is None or lo < self.lo or hi >= self.lo + len(self.counts):
            old = 0 if self.counts is None else len(self.counts)
            start, size = self._grown(lo, hi)
            new = np.zeros(size, np.int64)
            at, old_end = self.lo - start, self.lo - start + old
            if self.counts is not None and 0 <= at and old_end <= size:  # the old array inside the new: one copy
                new[at:old_end] = self.counts
            elif self.counts is not None:
                nz = np.flatnonzero(self.counts)  # the old slack may reach outside the new array: copy what counts
                new[nz + self.lo - start] = self.counts[nz]
            self.counts, self.lo = new, start
        count_into(self.counts, a, self.lo)

    def _grown(self, lo: int, hi: int) -> tuple[int, int]:
        """``(start, size)`` of the array that holds ids ``lo..hi`` (every id seen), within ``max_range``.

        Slack of an eighth of the ids' span (and at least a quarter of the old size, so that a slowly widening
        range is copied a geometric number of times) goes on the side that grew; ids that start near 0 are
        counted from 0. Each grown array is written in full by the copy and the counts, so its size is what
        the pass pays in page faults: doubling it (as this did) made a 1M-rating append of user ids up to 6M
        fault in 278 MB where 54 MB hold them (0.2-0.4 s of a 4 s command).
        """
        need = hi - lo + 1
        old = 0 if self.counts is None else len(self.counts)
        size = min(max(need + need // 8, old + old // 4), self.max_range)
        slack = size - need
        if self.counts is None or hi >= self.lo + old:  # grew upwards (or the first batch): slack above
            below = slack // 2 if self.counts is not None and lo < self.lo else 0
        else:
            below = slack
        if 0 <= lo <= slack or (lo >= 0 and lo - below < 0):  # ids counted from (near) 0: no slack below 0
            below = lo
        return lo - below, size

    def finish(self) -> tuple[pa.Array, np.ndarray]:
        if self.fallback is not None:
            return self.fallback.finish()
        keys, counts = nonzero_counts(self.counts, self.lo)
        return to_arrow(keys), counts


class _IdMap:
    """Original id -> dense index for sorted unique ``keys`` (never a Python dict).

    Integer ids: a lookup table over their range (up to ``lut_entries`` entries, or 4 per key), or a binary
    search (a random access per level: 0.2 s for 1M ids among 0.4M keys, 10x the table's gather). String ids:
    a binary search of each id's 64-bit hash (:func:`_string_hashes`) among the keys' sorted hashes, every
    match checked against the key itself; the few ids whose hash is shared go through
    ``pyarrow.compute.index_in``, which builds a hash table of every key at each call (100x slower with 2M
    keys: 0.2M ratings/s). ``values`` (int32 or int64 with values < 2^31): what the i-th key maps to (default
    ``i``), e.g. a store's index for an append, folded into the table.
    """

    def __init__(self, keys: pa.Array, values: np.ndarray | None = None, lut_entries: int = 0):
        self.is_int = pa.types.is_integer(keys.type)
        self.lut = None
        self.values = None if values is None else np.asarray(values).astype(np.int32)
        if self.is_int:
            self.np = to_numpy(keys)
            lo, hi = (int(self.np[0]), int(self.np[-1])) if len(self.np) else (0, -1)
            if hi - lo + 1 <= max(4 * len(self.np) + (1 << 20), lut_entries):
                self.lo = lo
                self.lut = np.full(hi - lo + 1, -1, np.int32)
                self.lut[self.np - lo] = (np.arange(len(self.np), dtype=np.int32) if self.values is None
                                          else self.values)
        else:
            self.keys = keys
            h = _string_hashes(keys)
            self.order = np.argsort(h, kind="stable").astype(np.int32)
            self.hashes = h[self.order]

    def __call__(self, arr: pa.Array) -> np.ndarray:
        if self.is_int:
            a = to_numpy(arr)
            if self.lut is not None:
                return self.lut[a - self.lo]
            return self._mapped(np.searchsorted(self.np, a).astype(np.int32))
        if len(self.keys) == 0 or len(arr) == 0:
            return _index_in(arr, self.keys)
        pos = np.minimum(np.searchsorted(self.hashes, _string_hashes(arr)), len(self.hashes) - 1)
        idx = self.order[pos]
        ok = to_numpy(pc.equal(self.keys.take(to_arrow(idx)), arr.cast(self.keys.type)))
        if not ok.all():  # a hash shared by two keys: looked up exactly
            bad = np.flatnonzero(~ok)
            idx[bad] = _index_in(arr.take(to_arrow(bad)), self.keys)
        return self._mapped(idx)

    def _mapped(self, idx: np.ndarray) -> np.ndarray:
        return idx if self.values is None else self.values[idx]


def _index_in(arr: pa.Array, keys: pa.Array) -> np.ndarray:
    return to_numpy(pc.index_in(arr, value_set=keys), fill=-1).astype(np.int32)


def _string_buffers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The offsets (shifted by the array's offset) and the bytes of a string (or large string) array."""
    off_type = np.int64 if pa.types.is_large_string(arr.type) else np.int32
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], off_type, count=len(arr) + 1, offset=arr.offset * np.dtype(off_type).itemsize)
    return offsets, (np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8))


def _string_hashes(arr: pa.Array) -> np.ndarray:
    """Each string's 64-bit FNV-1a hash (:func:`~streamdp.kernels.ingest.hash_strings`)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    out = np.empty(len(arr), np.uint64)
    hash_strings(*_string_buffers(arr), out)
    return out


def _key_hashes(keys: pa.Array) -> np.ndarray:
    """Each key's 64-bit hash: an integer key's own value, a string's :func:`_string_hashes`."""
    if pa.types.is_integer(keys.type):
        return to_numpy(keys).astype(np.int64).view(np.uint64)
    return _string_hashes(keys)


def _release_memory() -> None:
    """Give freed memory back to the OS: pyarrow's pool keeps freed pages, and glibc
    keeps freed heap of the parsing threads' arenas."""
    pa.default_memory_pool().release_unused()
    release_freed_memory()


def _parse_range(rating_range) -> tuple[float, float] | None:
    if rating_range is None:
        return None
    if isinstance(rating_range, str):
        try:
            lo, hi = (float(x) for x in rating_range.split(","))
        except ValueError:
            raise ParameterError(f"--rating-range: expected MIN,MAX, got {rating_range!r}") from None
    else:
        lo, hi = (float(x) for x in rating_range)
    if not (np.isfinite(lo) and np.isfinite(hi) and hi > lo):
        raise ParameterError(f"--rating-range: need finite MIN < MAX, got {lo:g},{hi:g}")
    return lo, hi


def _tofile(a: np.ndarray, f) -> None:
    """Write an array's bytes to an open binary file or a path.

    Not ``ndarray.tofile``: on a full disk it raises an ``OSError`` without an errno
    ("N requested and M written"), which could not be told from a bug.
    """
    if isinstance(f, (str, os.PathLike)):
        with open(f, "wb") as fh:
            return _tofile(a, fh)
    f.write(memoryview(np.ascontiguousarray(a)).cast("B"))


def _header_note(spec: F.Spec) -> str:
    """The note for a text file without a header: which column was taken as what (0-based, as --columns)."""
    names = {"rating": "count"} if spec.implicit else {}
    taken = ", ".join(f"{names.get(r, r)}={spec.cols[r]}" for r in F.ROLES if spec.cols.get(r) is not None)
    ts = "" if spec.has_timestamp else ", no timestamp"
    how = "USER,ITEM[,COUNT]" if spec.implicit else "USER,ITEM,RATING[,TIMESTAMP]"
    return (f"{spec.path} has no header: columns taken by position as {taken}{ts} (0-based; "
            f"use --columns {how} to change)")


def ingest(
    inputs: list[str],
    out: str,
    *,
    fmt: str | None = None,
    sep: str | None = None,
    columns: str | None = None,
    rating_range=None,
    test_fraction: float = 0.0,
    seed: int | None = 0,
    skip_bad_lines: bool = False,
    memory_limit: str | int | None = None,
    block_users: int | None = None,
    force: bool = False,
    check_users: Callable[[int], None] | None = None,
    after_write: Callable[[RatingStore], None] | None = None,
    show_progress: bool | None = None,
    out_of_range: str | None = None,
    notes: bool = True,
    implicit: bool = False,
    count_cap: float | None = None,
    split: str | None = None,
    last_n: int | None = None,
    test_inputs: list | None = None,
    item_names: str | None = None,
    items=None,
) -> RatingStore:
    """Ingest rating files into a store at ``out`` and return it opened.

    The held-out split (recorded in the store's ``split`` attribute, :func:`resolve_split`):
    ``test_inputs`` (``--test FILE``: the user's own split, ``inputs`` the training files),
    or ``split`` ``"random"`` / ``"temporal"`` (``test_fraction`` of each user's ratings, at
    random or her latest) / ``"last-n"`` (her ``last_n`` latest); ``test_fraction > 0`` alone
    is ``"random"``. ``item_names``: a file of ``id,name`` lines kept in the store
    (:mod:`streamdp.storage.names`). ``items``: the item catalogue the owner declares (a file of ids, one per
    line, or ids; :mod:`streamdp.privacy.catalogue`), recorded in the store: every model trained on it lists
    these items and no rating of another item is used (the store keeps them, for the owner only).

    ``inputs`` are paths, or the :class:`~streamdp.storage.formats.Spec` of an in-memory
    frame (:func:`streamdp.storage.frames.frame_spec`: a DataFrame, an Arrow table, a
    sparse matrix), read by record batches like a Parquet file.

    The store's attributes carry ``n_duplicates_dropped``, ``n_bad_lines_skipped``,
    ``out_of_range``, ``n_out_of_range_clipped``, ``n_out_of_range_dropped``, ``sources``
    and ``params``. ``out_of_range`` (``"error"``, the default, ``"clip"`` or ``"drop"``)
    says what becomes of ratings outside a declared ``rating_range`` (module docstring).
    ``implicit`` reads every input as an interaction log (else detected from ``columns`` or
    the header); ``count_cap`` caps its aggregated counts (module docstring).
    ``notes``: once the store is written, print on stderr which columns of a headerless
    file were taken as what (after success only, so that an error stays one line).
    A full, over-quota or read-only file system is a :class:`StoreError` naming ``out``
    (temporary files removed). ``check_users(n_users)`` is called once the input is
    parsed, before anything is written (a caller's check that may refuse the ingest);
    ``after_write(store)`` once the store is in place, before it is returned (the
    Python API's :func:`streamdp.workflows.api.ingest` sets a privacy budget with these). Raises :class:`InputError` (file and line) for bad
    input (also a header naming no rating column, or a column of unknown name, see
    :mod:`streamdp.storage.formats`), :class:`ParameterError` for bad options (also a
    ``memory_limit`` below :func:`min_memory_limit`); nothing is left at ``out`` (nor
    temporary files) unless the ingest succeeded.

    ``force`` replaces an existing streamdp store at ``out`` and nothing else (a
    file or another directory there is a :class:`StoreError`, left untouched). The
    replaced store's privacy-budget ledger is **kept**: it is carried over into the
    new store with a record that the data changed, and its releases keep counting
    (decision: the people in the old data are likely in the new data, so what was
    spent on them must not be forgotten; a budget set then sets only the total). See
    :func:`streamdp.privacy.budget.carried_over`.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp(); p = os.path.join(d, "r.csv")
    >>> _ = open(p, "w").write("userId,movieId,rating,timestamp\\n7,a,4,1\\n7,b,3,2\\n9,a,5,3\\n7,a,2,0\\n")
    >>> s = ingest([p], os.path.join(d, "s.zarr"))
    >>> s.n_users, s.n_items, s.n_ratings, s.attrs["n_duplicates_dropped"]
    (2, 2, 3, 1)
    >>> list(s.item_ids()), [int(x) for x in s.user_ids()]
    (['a', 'b'], [7, 9])
    """
    t0 = time.perf_counter()
    rr, oor, test_fraction, test_inputs, how, limit = _check_options(
        inputs, test_inputs, rating_range=rating_range, out_of_range=out_of_range, test_fraction=test_fraction,
        split=split, last_n=last_n, seed=seed, block_users=block_users, memory_limit=memory_limit)
    check_destination(out, force)
    unmap_large_frees()  # else glibc's arenas keep the freed partitions and blocks resident (module docstring)
    tmp = None
    try:
        specs, is_implicit = _input_specs(inputs + test_inputs, how, fmt=fmt, sep=sep, columns=columns,
                                          implicit=implicit, rr=rr, out_of_range=out_of_range, count_cap=count_cap)
        tmp = owned_temp_dir(_spill_beside(out), "ingest")
        parsed, int_ids = _parse_inputs(specs, len(inputs), tmp, rr, skip_bad_lines, limit, show_progress, oor,
                                        is_implicit, t0)
        _check_parsed(parsed, rr, is_implicit, inputs, test_inputs, check_users)
        names = None if item_names is None else read_item_names(item_names, parsed.items, limit)
        catalogue = None if items is None else _declared_catalogue(items, numeric_ids=int_ids[1])
        params = dict(format=fmt, sep=sep, columns=columns, rating_range=list(rr) if rr else None,
                      test_fraction=test_fraction, seed=seed, skip_bad_lines=skip_bad_lines, memory_limit=limit,
                      block_users=block_users, formats=[s.format for s in specs], out_of_range=oor,
                      split=how["kind"], last_n=last_n)
        if is_implicit:
            params.update(implicit=True, count_cap=count_cap)
        store = _build(parsed, out, tmp, rr, how, seed, block_users, limit, force, show_progress,
                       params=params, t0=t0, count_cap=count_cap, names=names, catalogue=catalogue)
        if after_write is not None:
            after_write(store)
        if notes:  # after success only: an error stays one line
            for s in specs:
                if not s.header and columns is None:
                    note(_header_note(s))
        return store
    except OSError as exc:
        if is_no_space(exc):
            if tmp is not None:
                remove_temp_dir(tmp, settle=True)
            raise no_space_error(exc, out) from None
        raise
    finally:
        if tmp is not None:
            remove_temp_dir(tmp)


def _check_options(inputs, test_inputs, *, rating_range, out_of_range, test_fraction, split, last_n, seed,
                   block_users, memory_limit):
    """:func:`ingest`'s options checked before anything is read or written: ``(rr, oor, test_fraction,
    test_inputs, how, limit)``, the declared rating range (``None``: the observed one), what becomes of a rating
    outside it, the held-out fraction, the test files (a list), the split (:func:`resolve_split`) and the memory
    limit in bytes. Raises :class:`ParameterError`."""
    if not inputs:
        raise ParameterError("ingest: no input files given")
    rr = _parse_range(rating_range)
    if out_of_range is not None:
        if out_of_range not in OUT_OF_RANGE:
            raise ParameterError(f"--out-of-range: expected one of {', '.join(OUT_OF_RANGE)}, got {out_of_range!r}")
        if rr is None:
            raise ParameterError(f"--out-of-range {out_of_range}: only with a declared --rating-range MIN,MAX (without "
                                 f"one the range is the observed one and no rating is outside it)")
    oor = out_of_range or "error"
    test_fraction = check_fraction(test_fraction)
    test_inputs = list(test_inputs or [])
    how = resolve_split(split, test_fraction, last_n, seed, bool(test_inputs))
    _check_distinct_files(inputs, test_inputs)
    if block_users is not None and block_users < 1:
        raise ParameterError(f"--block-users must be >= 1, got {block_users}")
    limit = resolve_memory_limit(memory_limit)
    if limit < min_memory_limit():
        need = min_memory_limit()
        raise ParameterError(
            f"--memory-limit {format_size(limit)} is too small for ingest: its working buffers need at least "
            f"{format_size(need)} ({_threads()} parsing threads, each reading ahead up to {_PARSE_SHARE} blocks of "
            f"{_MIN_PARSE_BLOCK >> 10} KiB; the Python runtime, about 230 MB, comes on top); use --memory-limit "
            f"{-(-need // 10**6)}MB or more")
    return rr, oor, test_fraction, test_inputs, how, limit


def _input_specs(inputs, how, *, fmt, sep, columns, implicit, rr, out_of_range, count_cap):
    """``(specs, is_implicit)``: each input's :class:`~streamdp.storage.formats.Spec` (training files, then test
    files) and whether they are interaction logs (:func:`_check_kind`); a temporal or last-n split needs a
    timestamp column in each (:class:`InputError`)."""
    specs = [p if isinstance(p, F.Spec) else F.resolve_spec(p, fmt=fmt, sep=sep, columns=columns,
                                                            implicit=implicit) for p in inputs]
    is_implicit = _check_kind(specs, rr, out_of_range, count_cap)
    if how["kind"] in ("temporal", "last-n"):
        for s in specs:
            if not s.has_timestamp:
                raise InputError(f"{s.path}: --split {how['kind']} holds out each user's latest ratings, but this "
                                 f"file has no timestamp column (integer times); name it with --columns "
                                 f"U,I,R,T, or use --split random")
    return specs, is_implicit


def _parse_inputs(specs, n_train: int, tmp, rr, skip_bad_lines, limit, show_progress, oor, is_implicit, t0,
                  as_strings=(False, False)):
    """``(parsed, int_ids)``: every input parsed into ``tmp`` (:func:`_pass_parse`; the files after the first
    ``n_train`` flagged as test files), user and item ids read as integers where every file's are (sniffed, and
    parsed again as strings when a later line says otherwise); ``int_ids`` says which were."""
    int_ids = [not as_strings[0], not as_strings[1]]  # --append onto a store of string ids: read them as strings
    for s in specs:
        a, b = F.sniff_id_kinds(s)
        int_ids[0] &= a
        int_ids[1] &= b
    while True:
        try:
            parsed = _pass_parse(specs, tmp, tuple(int_ids), rr, skip_bad_lines, limit, show_progress, oor,
                                 implicit=is_implicit)
            for src in parsed.sources[n_train:]:
                src.flag = 1
            parsed.phases["parse"] = round(time.perf_counter() - t0, 3)
            return parsed, int_ids
        except F._IdNotInteger as exc:
            int_ids[0 if exc.role == "user" else 1] = False


def _check_parsed(parsed, rr, is_implicit: bool, inputs, test_inputs, check_users) -> None:
    """The checks of the parsed input before anything is written: the observed rating range (without a declared
    one) and the caller's ``check_users``."""
    if rr is None and not is_implicit and test_inputs:
        _train_range(parsed)
    if rr is None and not is_implicit:  # counts all 1 (a two-column log) are a log, not a degenerate scale
        check_observed_range(parsed.rmin, parsed.rmax, inputs)
    if check_users is not None:
        check_users(len(parsed.users))


def _check_distinct_files(inputs, test_inputs) -> None:
    """Refuse a file given both as training and as test file (``--train F --test F``): its training ratings would all
    be dropped as also in the test file, leaving a store with 0 training ratings."""
    for t in test_inputs:
        for i in inputs:
            if isinstance(t, F.Spec) or isinstance(i, F.Spec):
                continue
            t_, i_ = str(t), str(i)
            try:
                same = os.path.samefile(t_, i_)
            except (OSError, ValueError):
                same = os.path.abspath(t_) == os.path.abspath(i_)
            if same:
                raise ParameterError(f"--train {i_} and --test {t_}: the same file; every training rating would also "
                                     f"be a test rating and be dropped from training (0 training ratings): give a "
                                     f"test file disjoint from the training files, or --test-fraction F")


def _train_range(parsed: _Parsed) -> None:
    """Without a declared ``--rating-range``, the observed range is the training files' alone (``parsed.rmin/rmax``
    set to it): a ``--test`` file's rating outside it is clipped into it when written, and counted
    (``n_test_ratings_clipped`` in the split; decision: a test rating must not widen the scale every method clips to
    and scales its noise to; declare the range to have out-of-range test ratings refused or dropped instead)."""
    train = [s for s in parsed.sources if not s.flag]
    parsed.rmin, parsed.rmax = min(s.lo for s in train), max(s.hi for s in train)


def _check_training_left(parsed: _Parsed, train_counts) -> None:
    """Refuse, before anything is written, a ``--train/--test`` ingest whose every training rating is also in the
    test files (the same ratings under two names): the store would hold 0 training ratings."""
    if not train_counts.any():
        names = [[s.spec.path for s in parsed.sources if s.flag == f] for f in (0, 1)]
        raise InputError(f"--train {', '.join(names[0])}: every training rating is also in --test "
                         f"{', '.join(names[1])}, so the store would hold 0 training ratings; give a test file "
                         f"disjoint from the training files")


def resolve_split(split: str | None, test_fraction: float, last_n: int | None, seed, files: bool) -> dict:
    """The store's ``split`` attribute from the options (a :class:`ParameterError` for a bad combination).

    ``{"kind": "none"}``, ``{"kind": "random", "test_fraction": F, "seed": S}``,
    ``{"kind": "temporal", "test_fraction": F, "per": "user"}``, ``{"kind": "last-n", "last_n": N}``
    or ``{"kind": "files"}`` (``--train/--test``; the ingest adds the file names and counts).
    ``--last-n N`` alone means ``--split last-n``; ``--test-fraction F`` alone ``--split random``.

    >>> resolve_split("temporal", 0.2, None, 0, False)
    {'kind': 'temporal', 'test_fraction': 0.2, 'per': 'user'}
    >>> resolve_split(None, 0.0, 1, 0, False)
    {'kind': 'last-n', 'last_n': 1}
    """
    if files:
        for flag, given in (("--split", split is not None), ("--test-fraction", test_fraction > 0),
                            ("--last-n", last_n is not None)):
            if given:
                raise ParameterError(f"{flag}: not with --test FILE (the test file is the split)")
        return {"kind": "files"}
    if split is None:
        split = "last-n" if last_n is not None else "random" if test_fraction > 0 else None
    if split is None:
        return {"kind": "none"}
    if split not in SPLIT_KINDS:
        raise ParameterError(f"--split: expected one of {', '.join(SPLIT_KINDS)}, got {split!r}")
    if split == "last-n":
        if last_n is None or isinstance(last_n, bool) or int(last_n) != last_n or last_n < 1:
            raise ParameterError(f"--split last-n: give --last-n N, the number of each user's latest ratings to hold "
                                 f"out (an integer >= 1){'' if last_n is None else f', got {last_n}'}")
        if test_fraction > 0:
            raise ParameterError("--test-fraction: not with --split last-n (it holds out --last-n ratings per user)")
        return {"kind": "last-n", "last_n": int(last_n)}
    if last_n is not None:
        raise ParameterError(f"--last-n: only with --split last-n, not --split {split}")
    if not test_fraction > 0:
        raise ParameterError(f"--split {split}: give --test-fraction F (0 < F < 1), the share of each user's ratings "
                             f"to hold out")
    if split == "random":
        return {"kind": "random", "test_fraction": test_fraction, "seed": seed}
    return {"kind": "temporal", "test_fraction": test_fraction, "per": "user"}


def _check_kind(specs, rr, out_of_range, count_cap) -> bool:
    """Whether the inputs are interaction logs (all of them, or none: else an InputError), and the options fit."""
    kinds = {s.implicit for s in specs}
    if len(kinds) > 1:
        log = next(s for s in specs if s.implicit).path
        rated = next(s for s in specs if not s.implicit).path
        raise InputError(f"{log}: an interaction log (no rating column) cannot go into one store with the ratings of "
                         f"{rated}; ingest them separately, or pass --implicit to read every file as a log")
    implicit = kinds == {True}
    if implicit and (rr is not None or out_of_range is not None):
        raise ParameterError(f"--{'rating-range' if rr is not None else 'out-of-range'}: not for an interaction log "
                             f"(its values are counts); declare --count-cap to bound them")
    if count_cap is not None:
        if not implicit:
            raise ParameterError("--count-cap: only for an interaction log (--implicit, or --columns user,item[,count]);"
                                 " a rating file declares --rating-range")
        if not (np.isfinite(count_cap) and count_cap > 0):
            raise ParameterError(f"--count-cap must be a finite number > 0, got {count_cap:g}")
    return implicit
def check_observed_range(lo: float, hi: float, inputs) -> None:
    """Refuse (:class:`InputError`) input whose ratings are all equal when no ``--rating-range`` is declared.

    The observed range ``[4, 4]`` is empty: every method scales its clipping and noise to
    the range (and would divide by its width), so such a store is not written; the fix is to
    declare the scale the ratings are on.
    """
    if not hi > lo:
        names = ", ".join(str(p) for p in inputs)
        raise InputError(f"{names}: every rating is {lo:g}, so the observed rating range [{lo:g}, {hi:g}] is empty; "
                         f"declare the scale the ratings are on with --rating-range LO,HI (e.g. 1,5)")


def _spill_beside(out: str) -> str:
    """Where the spill files of an ingest to ``out`` go (beside it): for a store on object storage, a local
    place named after its URL in the temporary directory (spills are read back many times)."""
    if "://" not in str(out):
        return out
    import hashlib
    import tempfile

    tag = hashlib.sha256(str(out).encode()).hexdigest()[:12]
    return os.path.join(tempfile.gettempdir(), f"streamdp-{str(out).rstrip('/').rsplit('/', 1)[-1]}-{tag}")


@dataclass
class _Parsed:
    sources: list
    users: pa.Array
    user_rows: np.ndarray
    items: pa.Array
    n_rows: int
    n_bad: int
    rmin: float
    rmax: float
    has_ts: bool
    phases: dict
    out_of_range: str = "error"
    n_out_of_range: int = 0
    implicit: bool = False
    item_rows: np.ndarray | None = None  # ratings per distinct item (``items`` order)


def _checked_batch(b, spec, rr, oor: str, implicit: bool, skip: bool):
    """``(users, items, ratings, timestamps, n_bad, n_out_of_range)`` of one parsed batch ``b``, validated.

    Bad rows (a rating that is not finite or not a float32, a count not > 0, an empty id, a
    rating outside ``rr`` with ``oor="error"``) are dropped with ``skip``, otherwise the first one
    raises (:class:`InputError` naming its row for a columnar file, ``_BadLine`` for text: the caller
    re-reads the file to name the line); ratings outside ``rr`` are clipped or dropped as ``oor`` says.
    """
    r = b.rating
    n_bad = n_oor = 0
    badm = ~storable_ratings(r)  # nan, inf, and what overflows the store's float32
    if implicit:
        with np.errstate(invalid="ignore"):
            badm |= ~(r > 0)
    drop = None
    if rr is not None:
        with np.errstate(invalid="ignore"):
            outside = (r < rr[0]) | (r > rr[1])
        if oor == "error":
            badm |= outside
        elif outside.any():
            n_oor += int(outside.sum())
            if oor == "clip":  # post-processing with the declared (public) bounds
                r = np.where(outside, np.clip(r, rr[0], rr[1]), r)
            else:
                drop = outside
    u, i, ts = b.user, b.item, b.timestamp
    for ids in (u, i):
        if not pa.types.is_integer(ids.type):  # an empty string is no id
            badm |= to_numpy(pc.equal(pc.binary_length(ids), 0))
    if badm.any() or drop is not None:
        if badm.any() and not skip:
            j = int(np.argmax(badm))
            if spec.columnar:
                what = "count" if implicit else "rating"
                why = (f"{what} {float(r[j])} is not finite" if not np.isfinite(r[j]) else
                       f"{what} {float(r[j]):g} is not finite as a float32 (the store's values)"
                       if not storable_ratings(r[j]) else
                       F.not_positive_reason(r[j]) if implicit and not r[j] > 0 else
                       F.out_of_range_reason(r[j], rr)
                       if rr is not None and not rr[0] <= r[j] <= rr[1] else "empty id")
                raise InputError(f"{spec.path}: row {b.row0 + j + 1}: {why}")
            raise _BadLine()
        keep = ~(badm if drop is None else badm | drop)
        n_bad += int(badm.sum())
        km = to_arrow(keep)
        u, i, r = pc.filter(u, km), pc.filter(i, km), r[keep]
        ts = ts[keep] if ts is not None else None
    return u, i, r, ts, n_bad, n_oor


def _pass_parse(specs, tmp, int_ids, rr, skip, limit, show_progress, oor="error", *, implicit=False) -> _Parsed:
    """Pass 1: parse, validate, count ids, spill.

    A large uncompressed text file is cut into byte ranges at line ends that are
    parsed by parallel threads (pyarrow and the counting kernel release the GIL);
    each range spills to its own file, and the spills are read back in file order,
    so "last seen" keeps meaning the input order.
    """
    workers = _threads()
    block_size = int(min(max(limit // (_PARSE_SHARE * workers), _MIN_PARSE_BLOCK), _MAX_PARSE_BLOCK))
    pool = pa.default_memory_pool()
    # a buffered (key, count) pair costs ~16 bytes, twice while merging
    nbuf = max(limit // 512, 4096)
    ucount = _IntCounter(max(limit // 32, 1 << 16), nbuf) if int_ids[0] else _KeyCounter(nbuf)
    icount = _IntCounter(max(limit // 32, 1 << 16), nbuf) if int_ids[1] else _KeyCounter(nbuf)
    lock = threading.Lock()
    failed_at = [np.inf]  # the first range that failed (a list: the threads set it)
    utype = pa.int64() if int_ids[0] else pa.string()
    itype = pa.int64() if int_ids[1] else pa.string()
    schema = pa.schema([("u", utype), ("i", itype), ("r", pa.float32()), ("t", pa.int64())])

    def parse_range(spec, spill, byte_range, bar, j):
        """Parse range ``j`` of a file (its bytes, or its row groups), or the whole file, into ``spill``; returns
        (rows, rmin, rmax, n_bad, n_out_of_range). A range stops early once an earlier one failed: the error said
        is the first range's that fails, its first bad row (a later range's is said only if no earlier one fails)."""
        bad = [0]
        rows, rmin, rmax, n_batches, n_oor = 0, np.inf, -np.inf, 0, 0
        if spec.columnar:
            it = F.iter_parquet(spec, int_ids=int_ids, batch_rows=max(block_size // 32, 4096), row_groups=byte_range)
        else:
            it = F.iter_text(spec, int_ids=int_ids, block_size=block_size, skip=skip, bad=bad,
                             byte_range=byte_range)
        with pa.OSFile(spill, "wb") as sink, pa.ipc.new_stream(sink, schema) as w:
            try:
                for b in it:
                    if failed_at[0] < j:
                        return rows, rmin, rmax, bad[0], n_oor
                    u, i, r, ts, nb, no = _checked_batch(b, spec, rr, oor, implicit, skip)
                    bad[0] += nb
                    n_oor += no
                    n = len(r)
                    if n == 0:
                        continue
                    rmin = min(rmin, float(r.min()))
                    rmax = max(rmax, float(r.max()))
                    with lock:
                        ucount.add(u)
                        icount.add(i)
                    t = to_arrow(ts) if ts is not None else pa.nulls(n, pa.int64())
                    w.write_batch(pa.record_batch([u, i, to_arrow(r.astype(np.float32)), t], schema=schema))
                    rows += n
                    bar.update(n)
                    n_batches += 1
                    if n_batches % 16 == 0:
                        pool.release_unused()  # mimalloc keeps freed pages otherwise
            except (pa.ArrowInvalid, _BadLine) as exc:
                failed_at[0] = min(failed_at[0], j)
                # the slow path: re-read the file in Python to name the first bad line
                line, why = F.locate_error(spec, int_ids, rr if oor == "error" else None)
                if line:
                    raise F.error_at(spec, line, why) from None
                raise InputError(f"{spec.path}: {str(exc).splitlines()[0] if str(exc) else 'bad input'}") from None
            except BaseException:
                failed_at[0] = min(failed_at[0], j)
                raise
        return rows, rmin, rmax, bad[0], n_oor

    sources = []
    n_bad = n_oor = 0
    rmin, rmax = np.inf, -np.inf
    with progress(total=None, desc="parse", unit="rating", show=show_progress, unit_scale=True) as bar, \
            ThreadPoolExecutor(max_workers=workers) as ex:
        for k, spec in enumerate(specs):
            ranges = F.row_group_ranges(spec, workers) if spec.columnar else F.byte_ranges(spec.path, workers)
            size = spec.frame.nbytes if spec.frame is not None else F.check_file(spec.path)
            src = _Source(spec, size, [os.path.join(tmp, f"spill{k}_{j}.arrow")
                                                          for j in range(len(ranges))])
            futs = [ex.submit(parse_range, spec, sp, br, bar, j) for j, (sp, br) in enumerate(zip(src.spills, ranges))]
            results = []
            for f in futs:  # surface the first error in file order
                results.append(f.result())
            for rows, lo, hi, nb, no in results:
                src.rows += rows
                n_bad += nb
                n_oor += no
                rmin, rmax = min(rmin, lo), max(rmax, hi)
                src.lo, src.hi = min(src.lo, lo), max(src.hi, hi)
            if src.rows == 0:
                raise InputError(f"{spec.path}: no ratings" + (" (all lines were bad)" if n_bad else " (empty file)"))
            sources.append(src)
    _release_memory()
    users, user_rows = ucount.finish()
    items, item_rows = icount.finish()
    return _Parsed(sources, users, user_rows, items, int(user_rows.sum()), n_bad, rmin, rmax,
                   all(s.spec.has_timestamp for s in sources), {}, oor, n_oor, implicit, item_rows)


def _partition_cap(limit: int, n_rows: int) -> int:
    """The most input rows a partition is planned to hold: what ``limit`` allows (:data:`_BYTES_PER_PART_RATING` a
    row), and no more than an even share of ``n_rows`` among the de-duplication threads, so that a small input is
    grouped by all of them (in one partition one thread grouped 1M appended ratings, 0.09 s, while the other waited,
    and pass 4 waited for the whole partition's sort before writing its first block)."""
    return max(1 << 12, min(limit // _BYTES_PER_PART_RATING, -(-int(n_rows) // _threads())))


def block_rows(user_rows: np.ndarray, bu: int) -> np.ndarray:
    """The rows of each block of ``bu`` users, from each user's (int64; empty for no users)."""
    if not len(user_rows):
        return np.zeros(0, np.int64)
    return np.add.reduceat(np.asarray(user_rows, np.int64), np.arange(0, len(user_rows), bu))


def _plan_partitions(user_rows: np.ndarray, bu: int, cap: int) -> list[tuple[int, int]]:
    """Runs of consecutive blocks ``(b0, b1)`` holding at most ``cap`` ratings (or one block)."""
    rows = block_rows(user_rows, bu)
    parts, b0, acc = [], 0, 0
    for b, c in enumerate(rows.tolist()):
        if b > b0 and acc + c > cap:
            parts.append((b0, b))
            b0, acc = b, 0
        acc += c
    parts.append((b0, len(rows)))
    return parts


def _dedup_workers(limit: int, part_rows: np.ndarray) -> int:
    """Partitions grouped at once in pass 3: up to :func:`_threads`, as many of the largest as fit in ``limit``
    (at least one). A partition is at least one block, which can hold more ratings than the limit's share
    (the store's blocks are its shape, not sized from the limit): then fewer threads.
    """
    biggest = int(part_rows.max()) if len(part_rows) else 0
    return max(1, min(_threads(), limit // max(1, biggest * _DEDUP_BYTES_PER_RATING)))


@dataclass
class _Plan:
    """How :func:`_build` cuts the parsed ratings: users per block, the partitions (block ranges, each worked on in
    memory in pass 3), and what the split asks of the passes."""
    n_users: int
    n_raw_items: int
    bu: int
    n_blocks: int
    parts: list
    part_first: np.ndarray  # first user of each partition, then n_users
    has_ts: bool
    test_fraction: float  # random split: held out when a block is written (pass 4)
    files: bool  # the user's own test files
    presplit: bool  # split in pass 3, while each rating's time and file are known
    base: list  # each partition's temporary file prefix
    #: ``--append``: the store's index of each parsed user and item (``parsed.users``/``items`` order), else None
    user_index: np.ndarray | None = None
    item_index: np.ndarray | None = None
    #: each rating's time goes into the store (``train/times``): the input has them (an append: the store keeps them)
    keep_times: bool = False

    @property
    def n_parts(self) -> int:
        return len(self.parts)


def _build(parsed: _Parsed, out, tmp, rr, how, seed, block_users, limit, force, show_progress, *,
           params, t0, count_cap=None, names=None, catalogue=None) -> RatingStore:
    pl = _plan_build(parsed, tmp, how, block_users, limit)
    n_groups = _scatter(parsed, pl, limit, show_progress)
    parsed.phases["partition"] = round(time.perf_counter() - t0, 3)
    _release_memory()
    agg = _dedup_pass(parsed, pl, n_groups, how, limit, count_cap, show_progress)
    item_counts_raw, train_counts_raw = agg["item_counts"], agg["train_counts"]
    parsed.phases["dedup"] = round(time.perf_counter() - t0, 3)
    _release_memory()
    if pl.files:
        _check_training_left(parsed, train_counts_raw)

    # -- pass 4: items by descending count, write blocks --------------------------------
    n_raw_items = pl.n_raw_items
    order = np.lexsort((np.arange(n_raw_items), -item_counts_raw))  # new item k = raw item order[k]
    new_index = np.empty(n_raw_items, np.int32)
    new_index[order] = np.arange(n_raw_items, dtype=np.int32)
    splits = ("train", "test") if pl.test_fraction > 0 or pl.presplit else ("train",)
    with StoreWriter(out, n_users=pl.n_users, n_items=n_raw_items, block_users=pl.bu, splits=splits,
                     force=force, times=pl.keep_times) as w:
        n_test_clipped = _write_blocks(w, parsed, pl, new_index, rr, seed, show_progress)
        w.write_array("user_ids", _ids_numpy(parsed.users), chunks=(pl.bu,))
        w.write_array("item_ids", _ids_numpy(parsed.items.take(to_arrow(order))))
        w.write_array("item_counts", item_counts_raw[order])
        if names is not None:
            names.write(w, order)
        if catalogue is not None:
            w.write_array("catalogue_ids", catalogue)
        w.finalize(_store_attrs(parsed, pl, how, agg, n_test_clipped, rr=rr, count_cap=count_cap, names=names,
                                catalogue=catalogue, params=params, t0=t0))
    return open_store(out)


def _plan_build(parsed: _Parsed, tmp, how, block_users, limit) -> _Plan:
    """The blocks and partitions of the store to write from ``parsed`` within ``limit`` bytes."""
    n_users, n_raw_items = len(parsed.users), len(parsed.items)
    bu = int(block_users or default_block_users(n_users, parsed.n_rows))
    n_blocks = -(-n_users // bu)
    parts = _plan_partitions(parsed.user_rows, bu, _partition_cap(limit, parsed.n_rows))
    part_first = np.array([b0 * bu for b0, _ in parts] + [n_users], dtype=np.int64)
    kind = how["kind"]
    test_fraction = how.get("test_fraction", 0.0) if kind == "random" else 0.0  # split when written (pass 4)
    files = kind == "files"
    presplit = kind in ("files", "temporal", "last-n")  # split in pass 3, while each rating's time and file are known
    base = [os.path.join(tmp, f"part{p}") for p in range(len(parts))]
    return _Plan(n_users=n_users, n_raw_items=n_raw_items, bu=bu, n_blocks=n_blocks, parts=parts,
                 part_first=part_first, has_ts=parsed.has_ts, test_fraction=test_fraction, files=files,
                 presplit=presplit, base=base, keep_times=parsed.has_ts)


def _scatter(parsed: _Parsed, pl: _Plan, limit, show_progress) -> int:
    """Pass 2: dense ids, scattered to partition files; returns the number of groups the partitions' files are cut
    into (which pass 3 concatenates).

    The spills are cut into consecutive groups scattered by parallel threads, each to
    its own partition files; pass 3 concatenates them in group order, which keeps
    the input order within every partition.
    """
    bu, parts, n_parts, base, has_ts, files = pl.bu, pl.parts, pl.n_parts, pl.base, pl.has_ts, pl.files
    # --append: onto the store's indices (pl.user_index, pl.item_index), folded into the maps; a lookup table
    # of int32 may take 1/16 of the limit (sparse ids: 1M ids among 0.4M keys spread over 6M looked up 10x faster)
    umap = _IdMap(parsed.users, pl.user_index, lut_entries=limit // 64)
    imap = _IdMap(parsed.items, pl.item_index, lut_entries=limit // 64)
    cols = ("u", "i", "r", "t") if has_ts else ("u", "i", "r")
    if files:
        cols += ("s",)
    part_of_block = np.empty(pl.n_blocks, np.int32)  # partition of each block, for the kernel
    for p, (b0, b1) in enumerate(parts):
        part_of_block[b0:b1] = p
    spills = [(sp, src.flag) for src in parsed.sources for sp in src.spills]
    workers = min(_threads(), len(spills))
    spill_groups = [[spills[j] for j in g] for g in np.array_split(np.arange(len(spills)), workers)]
    chunk_rows = max(1 << 14, limit // (320 * workers))  # ~40 bytes a row while bucketing, twice
    keep_open = n_parts <= 256

    def scatter(g: int) -> None:
        handles: dict = {}
        pending: dict = {c: [] for c in cols}

        def fh(p, col):
            f = handles.get((p, col))
            if f is None:
                f = open(f"{base[p]}.{g}.{col}", "ab")
                if keep_open:
                    handles[(p, col)] = f
            return f

        def flush():
            arrays = {c: np.concatenate(v) if len(v) > 1 else v[0] for c, v in pending.items()}
            for v in pending.values():
                v.clear()
            if n_parts == 1:
                groups = [(0, None)]
            else:
                order = np.empty(len(arrays["u"]), np.int64)
                starts = np.empty(n_parts + 1, np.int64)
                bucket_rows(arrays["u"], bu, part_of_block, order, starts)
                groups = [(p, (starts[p], starts[p + 1])) for p in np.flatnonzero(np.diff(starts)).tolist()]
            for c in cols:
                a = arrays[c] if n_parts == 1 else arrays[c][order]
                for p, se in groups:
                    f = fh(p, c)
                    _tofile(a if se is None else a[se[0]:se[1]], f)
                    if not keep_open:
                        f.close()

        try:
            n_pending = 0
            for spill, flag in spill_groups[g]:
                with pa.OSFile(spill, "rb") as f, pa.ipc.open_stream(f) as rd:
                    for rb in rd:
                        pending["u"].append(umap(rb.column(0)))
                        pending["i"].append(imap(rb.column(1)))
                        pending["r"].append(to_numpy(rb.column(2)))
                        if has_ts:
                            pending["t"].append(to_numpy(rb.column(3)))
                        if files:
                            pending["s"].append(np.full(rb.num_rows, flag, np.uint8))
                        n_pending += rb.num_rows
                        if n_pending >= chunk_rows:
                            flush()
                            n_pending = 0
                        bar.update(rb.num_rows)
                os.remove(spill)
            if n_pending:
                flush()
        finally:
            for f in handles.values():
                f.close()

    with progress(total=parsed.n_rows, desc="partition", unit="rating", show=show_progress,
                  unit_scale=True) as bar, \
            ThreadPoolExecutor(max_workers=workers) as ex:
        for _ in ex.map(scatter, range(workers)):
            pass
    return workers  # the scatter's groups, which pass 3 concatenates (not pass 3's threads)


def _dedup_pass(parsed: _Parsed, pl: _Plan, n_groups: int, how, limit, count_cap, show_progress) -> dict:
    """Pass 3: each partition grouped by user, de-duplicated (or aggregated into counts), held out (a presplit) and
    written to its files; returns the sums over the partitions: ``item_counts``, ``train_counts`` (presplit),
    ``n_dup``, ``n_test_only_users``, ``n_across`` and ``values`` (:class:`_ValueStats`)."""
    parts, part_first, base, has_ts, files, presplit = (pl.parts, pl.part_first, pl.base, pl.has_ts, pl.files,
                                                         pl.presplit)
    n_raw_items, n_parts = pl.n_raw_items, pl.n_parts

    def load_groups(p: int, col: str, dtype) -> np.ndarray:
        parts_ = [f"{base[p]}.{g}.{col}" for g in range(n_groups)]
        arrs = [np.fromfile(x, dtype) for x in parts_ if os.path.exists(x)]
        for x in parts_:
            if os.path.exists(x):
                os.remove(x)
        return np.concatenate(arrs) if len(arrs) > 1 else arrs[0]

    def dedup(p):
        b0, b1 = parts[p]
        n_loc = int(part_first[p + 1] - part_first[p])
        u = load_groups(p, "u", np.int32) - np.int32(part_first[p])
        it = load_groups(p, "i", np.int32)
        r = load_groups(p, "r", np.float32)
        t = load_groups(p, "t", np.int64) if has_ts else np.empty(0, np.int64)
        fl = load_groups(p, "s", np.uint8) if files else np.empty(0, np.uint8)
        ip = np.empty(n_loc + 1, np.int64)
        oi = np.empty(len(u), np.int32)
        orr = np.empty(len(u), np.float32)
        keep = pl.keep_times
        ots = np.empty(len(u) if (presplit and not files) or keep else 0, np.int64)
        ofl = np.empty(len(fl), np.uint8)
        nnz, dropped, across = group_dedup(u, it, r, t, has_ts and not parsed.implicit, n_loc, n_raw_items, ip, oi,
                                           orr, parsed.implicit, fl, ots, ofl)
        del u, it, r, t, fl
        vals = orr[:nnz]
        stats = _value_stats(vals, count_cap) if parsed.implicit else None
        counts = np.bincount(oi[:nnz], minlength=n_raw_items).astype(np.int64)
        extra = None
        if presplit:
            held = ofl[:nnz] if files else latest_mask(ip, ots[:nnz], fraction=how.get("test_fraction", 0.0),
                                                        last_n=how.get("last_n", 0))
            if keep:
                (ip, oi, vals, times), test = split_by_mask(ip, oi[:nnz], vals, held, times=ots[:nnz])
            else:
                (ip, oi, vals), test = split_by_mask(ip, oi[:nnz], vals, held)
            del orr, ots, ofl, held  # the partition's arrays before the split
            for c, a in zip(("tip", "ti", "tr", "tts"), test):
                _tofile(a, f"{base[p]}.{c}")
            test_only = int(((np.diff(ip) == 0) & (np.diff(test[0]) > 0)).sum())
            extra = (np.bincount(oi, minlength=n_raw_items).astype(np.int64), test_only, int(across))
            nnz = len(oi)
        _tofile(ip, f"{base[p]}.ip")
        _tofile(oi[:nnz], f"{base[p]}.i")
        _tofile(vals, f"{base[p]}.r")
        if keep:
            _tofile(times if presplit else ots[:nnz], f"{base[p]}.ts")
        return counts, int(dropped), stats, extra

    item_counts_raw = np.zeros(n_raw_items, np.int64)
    train_counts_raw = np.zeros(n_raw_items, np.int64)
    n_dup = n_test_only_users = n_across = 0
    values = _ValueStats()
    dedup_threads = _dedup_workers(limit, np.add.reduceat(parsed.user_rows, part_first[:-1]))
    with ThreadPoolExecutor(max_workers=dedup_threads) as ex, \
            progress(total=n_parts, desc="aggregate" if parsed.implicit else "dedup", unit="part",
                     show=show_progress) as bar:
        for cnt, d, stats, extra in ex.map(dedup, range(n_parts)):
            item_counts_raw += cnt
            n_dup += d
            if stats is not None:
                values.add(*stats)
            if extra is not None:
                train_counts_raw += extra[0]
                n_test_only_users += extra[1]
                n_across += extra[2]
            bar.update(1)
    return {"item_counts": item_counts_raw, "train_counts": train_counts_raw, "n_dup": n_dup,
            "n_test_only_users": n_test_only_users, "n_across": n_across, "values": values}


def _write_blocks(w, parsed: _Parsed, pl: _Plan, new_index, rr, seed, show_progress, written=None) -> int:
    """Pass 4: each partition's users read back with the items renumbered by ``new_index`` (the next partition
    loaded while one is written) and written block by block with ``w``, held out as the split says; returns the
    number of test ratings clipped into the training files' range. ``written(b, rows)``, when given, is called once
    block ``b`` is written, ``rows`` its ``(split, indptr, items)`` as written (an append counts its change to the
    merged counts from them, :class:`streamdp.storage.append._MergeCounts`)."""
    bu, parts, n_parts, part_first, base = pl.bu, pl.parts, pl.n_parts, pl.part_first, pl.base
    n_users, files, presplit, test_fraction = pl.n_users, pl.files, pl.presplit, pl.test_fraction

    keep = pl.keep_times

    def load(p):
        out_ = []
        for c in (("ip", "i", "r", "ts"), ("tip", "ti", "tr", "tts"))[:2 if presplit else 1]:
            c = c if keep else c[:3]
            ip = np.fromfile(f"{base[p]}.{c[0]}", np.int64)
            it = np.fromfile(f"{base[p]}.{c[1]}", np.int32)
            r = np.fromfile(f"{base[p]}.{c[2]}", np.float32)
            ts = np.fromfile(f"{base[p]}.{c[3]}", np.int64) if keep else np.empty(0, np.int64)
            remap_sort(ip, it, r, new_index, ts)
            for x in c:
                os.remove(f"{base[p]}.{x}")
            out_.append((ip, it, r, ts) if keep else (ip, it, r))
        return out_

    clip_test = files and rr is None and not parsed.implicit
    n_test_clipped = 0
    uc_arr = w.create_array("user_counts", shape=(n_users,), dtype="int64", chunks=(bu,))
    # the users' counts are written by a thread of their own, one slice at a time, beside the blocks (96 chunk files
    # of a 100M store's 2M users: 0.05 s of a 1% append's write pass on the writing thread)
    with ThreadPoolExecutor(max_workers=1) as ex, ThreadPoolExecutor(max_workers=1) as uc_ex, \
            progress(total=pl.n_blocks, desc="write", unit="block", show=show_progress) as bar:
        nxt = ex.submit(load, 0)
        counts = []
        uc_write = None
        for p, (b0, b1) in enumerate(parts):
            loaded = nxt.result()
            if p + 1 < n_parts:
                nxt = ex.submit(load, p + 1)
            for b in range(b0, b1):
                lo = b * bu - part_first[p]
                hi = min((b + 1) * bu, n_users) - part_first[p]
                bip, bit, brt, *bts = _rows(loaded[0], lo, hi)
                bts = bts[0] if keep else None
                if presplit:
                    test = _rows(loaded[1], lo, hi)
                    if clip_test:  # the training files' observed range is the store's (see _train_range)
                        outside = (test[2] < parsed.rmin) | (test[2] > parsed.rmax)
                        if outside.any():
                            n_test_clipped += int(outside.sum())
                            test = (test[0], test[1],
                                    np.clip(test[2], parsed.rmin, parsed.rmax).astype(np.float32)) + test[3:]
                    w.write_block(b, bip, bit, brt, split="train", times=bts)
                    w.write_block(b, *test[:3], split="test", times=test[3] if keep else None)
                    counts.append(np.diff(bip) + np.diff(test[0]))
                    rows = (("train", bip, bit), ("test", test[0], test[1]))
                elif test_fraction > 0:
                    train, test = split_block(bip, bit, brt, test_fraction, block_seed(seed, b, _PURPOSE_SPLIT),
                                              times=bts)
                    w.write_block(b, *train[:3], split="train", times=train[3] if keep else None)
                    w.write_block(b, *test[:3], split="test", times=test[3] if keep else None)
                    counts.append(np.diff(bip))
                    rows = (("train", train[0], train[1]), ("test", test[0], test[1]))
                else:
                    w.write_block(b, bip, bit, brt, split="train", times=bts)
                    counts.append(np.diff(bip))
                    rows = (("train", bip, bit),)
                if written is not None:
                    written(b, rows)
                bar.update(1)
                # users' counts written a slice of blocks at a time (a Zarr write costs about a millisecond: per
                # block, a small append's blocks paid it 96 times), at most _USERS_PER_WRITE users held
                n_held, end_user = sum(len(c) for c in counts), b * bu + (hi - lo)
                if n_held >= _USERS_PER_WRITE or b == pl.n_blocks - 1:
                    if uc_write is not None:  # one slice in flight at most (another held while it is written)
                        uc_write.result()
                    uc_write = uc_ex.submit(uc_arr.__setitem__, slice(end_user - n_held, end_user),
                                            np.concatenate(counts))
                    counts.clear()
            del loaded
        if uc_write is not None:
            uc_write.result()
    return n_test_clipped


def _store_attrs(parsed: _Parsed, pl: _Plan, how, agg: dict, n_test_clipped: int, *, rr, count_cap, names,
                 catalogue, params, t0) -> dict:
    """The ingested store's attributes: its value kind and rating range, the split, the sources and the counts
    of what was dropped, clipped or skipped (:func:`ingest`)."""
    values, n_dup = agg["values"], agg["n_dup"]
    if rr is not None:
        rating_min, rating_max, source = rr[0], rr[1], "declared"
    elif parsed.implicit and count_cap is not None:
        rating_min, rating_max, source = 0.0, float(count_cap), "declared"
    elif parsed.implicit:
        rating_min, rating_max, source = values.lo, values.hi, "observed"
    else:
        rating_min, rating_max, source = parsed.rmin, parsed.rmax, "observed"
    value_kind = values.attrs(n_dup, count_cap) if parsed.implicit else {}
    split_attr = dict(how)
    files = pl.files
    if files:
        split_attr.update(
            train=[os.path.basename(s.spec.path) for s in parsed.sources if not s.flag],
            test=[os.path.basename(s.spec.path) for s in parsed.sources if s.flag],
            n_test_only_users=agg["n_test_only_users"],
            n_test_only_items=int(((agg["train_counts"] == 0) & (agg["item_counts"] > 0)).sum()),
            n_train_ratings_also_in_test=agg["n_across"],
            **({"n_test_ratings_clipped": n_test_clipped} if n_test_clipped else {}))
    return {
        **value_kind,
        "split": split_attr,
        **({} if names is None else {"item_names": names.attrs()}),
        **({} if catalogue is None else {"catalogue": {"source": "declared", "by": "ingest --items",
                                                       "n_items": int(len(catalogue))}}),
        "rating_min": float(rating_min),
        "rating_max": float(rating_max),
        "rating_range_source": source,
        "sources": [{"name": os.path.basename(s.spec.path),
                     "path": None if s.spec.frame is not None else os.path.abspath(s.spec.path),
                     "size": s.size, "format": s.spec.format, "rows": s.rows, "header": s.spec.header,
                     "columns": {r: s.spec.cols.get(r) for r in F.ROLES},
                     **({"split": "test" if s.flag else "train"} if files else {})} for s in parsed.sources],
        "created_with": "ingest",
        "params": params,
        "n_duplicates_dropped": 0 if parsed.implicit else n_dup,
        "n_bad_lines_skipped": parsed.n_bad,
        "out_of_range": parsed.out_of_range,
        "n_out_of_range_clipped": parsed.n_out_of_range if parsed.out_of_range == "clip" else 0,
        "n_out_of_range_dropped": parsed.n_out_of_range if parsed.out_of_range == "drop" else 0,
        "seconds": round(time.perf_counter() - t0, 3),
        "phase_end_seconds": parsed.phases,
    }


def _rows(part, lo, hi):
    """Users ``lo..hi`` of a partition's CSR part ``(indptr, items, ratings[, times])``, as a block (local row
    pointer), the times fourth when the part has them."""
    ip = part[0]
    s, e = ip[lo], ip[hi]
    return (ip[lo:hi + 1] - s,) + tuple(a[s:e] for a in part[1:])


def _value_stats(vals: np.ndarray, cap: float | None) -> tuple[int, float, float, bool]:
    """Cap one partition's aggregated counts in place: ``(n capped, min, max, all integers)`` after capping."""
    n_capped = 0
    if cap is not None:
        over = vals > cap
        n_capped = int(over.sum())
        vals[over] = np.float32(cap)
    if not len(vals):
        return n_capped, np.inf, -np.inf, True
    return n_capped, float(vals.min()), float(vals.max()), bool(np.all(vals == np.floor(vals)))


class _ValueStats:
    """The implicit store's value statistics merged over partitions (exact: they stay in the store)."""

    def __init__(self):
        self.n_capped, self.lo, self.hi, self.integer = 0, np.inf, -np.inf, True

    def add(self, n_capped: int, lo: float, hi: float, integer: bool) -> None:
        self.n_capped += n_capped
        self.lo, self.hi, self.integer = min(self.lo, lo), max(self.hi, hi), self.integer and integer

    def attrs(self, n_aggregated: int, cap: float | None) -> dict:
        return {"implicit": True, "value": "count" if self.integer else "weight",
                "count_cap": None if cap is None else float(cap), "n_duplicates_aggregated": int(n_aggregated),
                "n_counts_capped": self.n_capped}


def _declared_catalogue(items, *, numeric_ids: bool) -> np.ndarray:
    """``--items``: the declared catalogue as the store's kind of ids (a file of ids, or ids)."""
    from streamdp.storage.catalogue import catalogue_ids

    return catalogue_ids(items, numeric=numeric_ids)


def _ids_numpy(keys: pa.Array) -> np.ndarray:
    if pa.types.is_integer(keys.type):
        return to_numpy(keys).astype(np.int64)
    return keys.to_numpy(zero_copy_only=False)  # object array of str
