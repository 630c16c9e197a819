"""Writing a rating store: :class:`StoreWriter`, shared by ``ingest`` and ``generate``.

Decisions a reader must know:

* **nothing at the destination unless the write succeeded**: the store is built in an
  owned temporary directory next to it (:func:`streamdp.outputs.owned_temp_dir`) and
  renamed into place in :meth:`StoreWriter.finalize`; any error removes it, and a full or
  read-only file system is one :class:`~streamdp.errors.StoreError`;
* ``force`` replaces only an existing *rating store*, and its privacy-budget ledger is
  carried over with a record that the data changed; the ledger belongs to the layer above,
  installed by the package root as the :class:`LedgerKeeper` (:func:`install_ledger_keeper`);
  without one a replacement is refused;
* every write runs with Ctrl-C deferred (:func:`streamdp.outputs.deferred_interrupts`),
  since Zarr writes on a thread of its own;
* every chunk of every array is written, also one equal to the fill value, so a reader
  can tell a deleted chunk from data (:mod:`streamdp.storage.chunks`);
* the content checksum is :class:`ContentHash` (the :func:`block_digest` of every block,
  the id arrays, then :data:`CHECKSUM_ATTRS`); per-block digests and chunk CRC32Cs are
  kept for ``verify`` and every read; a random ``generation`` id is outside the checksum;
* on object storage (an fsspec URL, no rename) a store is a store only once its root
  ``zarr.json`` carries the ``streamdp`` attributes, written last; a new store is written
  in place behind a :data:`~streamdp.storage.remote.WRITING_MARKER`, a replacement beside
  the old one and then copied over it; the ledger's objects are never deleted.

Design notes (the rules in full, object storage, the measured choice of in-place or
copy): docs/design-notes.md#streamdpstoragewriterpy.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import secrets
from dataclasses import dataclass
from typing import Callable

import numpy as np
import zarr

from streamdp._version import __version__
from streamdp.errors import StoreError
from streamdp.outputs import (
    check_destination as _check,
    deferred_interrupts,
    install_dir,
    is_no_space,
    no_space_error,
    owned_temp_dir,
    remove_temp_dir,
)
from streamdp.storage import remote
from streamdp.storage.chunks import FAST_CRC, ChunkReader, ChunkWriter, chunk_crcs_digest, write_slice
from streamdp.storage.schema import (
    ATTRS_KEY,
    DEFAULT_CHUNK_RATINGS,
    FORMAT_NAME,
    FORMAT_VERSION,
    time_attrs,
    IMPLICIT_FORMAT_VERSION,
    ITEM_PAD,
    is_store_dir,
    rating_compressor,
)


def block_digest(b: int, indptr, items, ratings) -> bytes:
    """Content digest of one block (its index, per-user counts, items, ratings).

    The store checksum hashes these digests in block order, so producers may compute
    them in parallel worker threads (hashlib releases the GIL on large buffers) and
    pass them to :meth:`StoreWriter.write_block`.
    """
    h = hashlib.blake2b(digest_size=16)
    h.update(np.int64(b).tobytes())
    # the arrays' buffers, not copies (.tobytes() cost a third of the time): the same bytes
    h.update(np.ascontiguousarray(np.diff(np.asarray(indptr, np.int64)), dtype="<i8"))
    h.update(np.ascontiguousarray(items, dtype="<i4"))
    h.update(np.ascontiguousarray(ratings, dtype="<f4"))
    return h.digest()


def times_digest(b: int, times) -> bytes:
    """Content digest of one block's rating times (its index and the times, in the block's order): the checksum
    covers a store's times as ``SPLIT/times`` blocks beside its splits' (``streamdp verify`` recomputes it)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(np.int64(b).tobytes())
    h.update(np.ascontiguousarray(times, dtype="<i8"))
    return h.digest()


def block_item_stats(items, ratings, n_items: int, out: np.ndarray | None = None) -> np.ndarray:
    """``(2, n_items)`` float64: each item's sum of the block's ratings (row 0) and their count (row 1).

    The one definition of a store's exact per-item training statistics: the writer adds
    the blocks' partials in block order into ``train/item_sums`` and ``train/item_counts``
    (``out``: added into it row by row, the same bits as ``out += block_item_stats(...)``
    with one row's partial in memory at a time), and a pass over a store written without
    them adds the same partials in the same order
    (:meth:`streamdp.stream.engine.Engine.map_reduce`), so both give the same bits.

    >>> block_item_stats(np.array([0, 2, 0]), np.array([4.0, 3.0, 5.0], np.float32), 3).tolist()
    [[9.0, 0.0, 3.0], [2.0, 0.0, 1.0]]
    """
    if out is None:
        out = np.zeros((2, n_items))
    out[0] += np.bincount(items, weights=np.asarray(ratings).astype(np.float64), minlength=n_items)
    out[1] += np.bincount(items, minlength=n_items)
    return out


def item_stats_digest(sums: np.ndarray, counts: np.ndarray) -> str:
    """The ``train_item_stats`` attribute: a digest of the two arrays as stored (float64 sums, int64 counts), which
    a reader compares before it trusts them (:meth:`streamdp.storage.store.RatingStore.train_item_stats`)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(np.ascontiguousarray(sums, dtype="<f8"))
    h.update(np.ascontiguousarray(counts, dtype="<i8"))
    return "blake2b:" + h.hexdigest()


def check_finite_ratings(b: int, ratings: np.ndarray) -> None:
    """Refuse (:class:`StoreError`) a block whose float32 ratings are not all finite: the last guard of every
    path that writes ratings (ingest names the file and line before, for the user's data)."""
    if len(ratings) and not (np.isfinite(ratings.min()) and np.isfinite(ratings.max())):  # nan makes both nan
        raise StoreError(f"block {b}: a rating is not finite as a float32 (the store's ratings): refused, "
                         f"nothing was written")


#: Written on every array of a store: chunks equal to the fill value are written too.
_ARRAY_CONFIG = {"write_empty_chunks": True}
#: Blocks of a split are gathered until they fill this many rating positions (or hold as many users), then written
#: in one write per array (each Zarr write costs about a millisecond whatever its size: a segment of small blocks
#: paid it per block); at most 16 bytes a position (items, ratings, times) or 8 a user are held.
_FLUSH_RATINGS = DEFAULT_CHUNK_RATINGS
#: The id arrays covered by the checksum of a store that has no ``checksum_ids``
#: attribute (written before it was recorded): ``generate`` fills ``user_ids`` by
#: slices, which were never hashed.
_LEGACY_CHECKSUM_IDS = {"generate": ("item_ids",)}
_DEFAULT_CHECKSUM_IDS = ("user_ids", "item_ids")
#: The attributes that change what a store's ratings mean, covered by the checksum of stores written
#: since they were (those present are recorded in ``checksum_attrs``; a dotted name is a nested key).
#: Not covered: descriptions of how the store was made (sources, timings, ``generation``...).
CHECKSUM_ATTRS = ("format", "format_version", "n_users", "n_items", "n_ratings", "n_test", "block_users", "n_blocks",
                  "rating_min", "rating_max", "rating_range_source", "out_of_range", "params.rating_step",
                  "implicit", "value", "count_cap")


def checksum_ids(attrs: dict) -> tuple[str, ...]:
    """The id arrays, in hashing order, that the checksum of a store with ``attrs`` covers."""
    ids = attrs.get("checksum_ids")
    if ids is not None:
        return tuple(ids)
    return _LEGACY_CHECKSUM_IDS.get(attrs.get("created_with"), _DEFAULT_CHECKSUM_IDS)


def checksum_attrs(attrs: dict) -> tuple[str, ...]:
    """The attributes that the checksum of a store with ``attrs`` covers (none for a store written before)."""
    return tuple(attrs.get("checksum_attrs") or ())


def attr_value(attrs: dict, name: str):
    """``attrs[name]``, a dotted name reaching into nested dicts (``params.rating_step``); ``None`` if absent."""
    v = attrs
    for part in name.split("."):
        v = v.get(part) if isinstance(v, dict) else None
    return v


class ContentHash:
    """The store checksum, fed with content in the order the writer produces it.

    Per split, :meth:`add_block` takes the blocks' digests in block order; the id
    arrays go to :meth:`add_ids` whole or in consecutive slices (the digest is the
    same either way); :meth:`add_attrs` the attributes that give the ratings their
    meaning (stores written since it was added). :meth:`hexdigest` is the
    ``checksum`` attribute.

    >>> import numpy as np
    >>> a, b = ContentHash(), ContentHash()
    >>> a.add_ids("item_ids", np.array(["x", "y", "z"], dtype=object))
    >>> b.add_ids("item_ids", np.array(["x"], dtype=object)); b.add_ids("item_ids", np.array(["y", "z"], dtype=object))
    >>> a.hexdigest() == b.hexdigest()
    True
    """

    def __init__(self):
        self._splits: dict[str, hashlib.blake2b] = {}
        self._ids = hashlib.blake2b(digest_size=16)
        self._ids_open: str | None = None
        self.ids_names: list[str] = []
        self._attrs: bytes | None = None

    def add_block(self, split: str, digest: bytes) -> None:
        self._splits.setdefault(split, hashlib.blake2b(digest_size=16)).update(digest)

    def add_split(self, split: str) -> None:
        """Count ``split`` even if it has no blocks."""
        self._splits.setdefault(split, hashlib.blake2b(digest_size=16))

    def add_ids(self, name: str, data: np.ndarray) -> None:
        """The next slice of id array ``name`` (a new name starts a new array)."""
        data = np.asarray(data)
        continued = self._ids_open == name
        if not continued:
            self._ids.update(name.encode())
            self._ids_open = name
            self.ids_names.append(name)
        if data.dtype.kind in "UOT":
            text = "\x1f".join(map(str, data.tolist()))
            self._ids.update((("\x1f" if continued and len(data) else "") + text).encode())
        else:
            self._ids.update(np.ascontiguousarray(data).tobytes())

    def add_attrs(self, attrs: dict, names) -> None:
        """The attributes ``names`` of ``attrs`` (an absent one counts as ``null``); numbers compare as
        floats, so ``5`` and ``5.0`` are the same value.

        >>> a, b = ContentHash(), ContentHash()
        >>> a.add_attrs({"rating_max": 5.0}, ["rating_max"]); b.add_attrs({"rating_max": 10.0}, ["rating_max"])
        >>> a.hexdigest() == b.hexdigest()
        False
        """
        def canon(v):
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v

        pairs = [[n, canon(attr_value(attrs, n))] for n in names]
        self._attrs = json.dumps(pairs, sort_keys=True, separators=(",", ":")).encode()

    def hexdigest(self) -> str:
        h = hashlib.blake2b(digest_size=16)
        for s in sorted(self._splits):
            h.update(s.encode())
            h.update(self._splits[s].digest())
        h.update(self._ids.digest())
        if self._attrs is not None:  # stores written before attributes were covered: the checksum as it was
            h.update(b"attrs")
            h.update(hashlib.blake2b(self._attrs, digest_size=16).digest())
        return "blake2b:" + h.hexdigest()


@dataclass(frozen=True)
class LedgerKeeper:
    """The privacy layer's part in replacing a store: its budget ledger is carried over, never lost.

    ``carried_over(old_path, new_path, *, by, checksum)``: a context manager inside which a local
    store is replaced (:func:`streamdp.privacy.budget.carried_over`). ``ledger(url)``: the ledger of a
    store on object storage, with ``check()`` and ``data_replaced(*, by, old_checksum, new_checksum)``
    (:class:`streamdp.privacy.budget.StoreBudget`).
    """

    carried_over: Callable
    ledger: Callable


_ledger_keeper: Callable[[], LedgerKeeper] | None = None


def install_ledger_keeper(factory: Callable[[], LedgerKeeper]) -> None:
    """Install what carries a replaced store's budget ledger over (``factory()`` is called at each replacement).

    The writer sits below the privacy layer and does not import it; the package root
    (``streamdp/__init__.py``) installs it when ``streamdp`` is imported, which any import
    of this module does first.
    """
    global _ledger_keeper
    _ledger_keeper = factory


def ledger_keeper() -> LedgerKeeper:
    """The installed :class:`LedgerKeeper`; without one a replacement is refused (a ledger is never dropped)."""
    if _ledger_keeper is None:
        raise StoreError("replacing a store needs its privacy-budget ledger carried over, and nothing that can "
                         "do it is installed (streamdp.storage.writer.install_ledger_keeper)")
    return _ledger_keeper()


#: Objects under a store's URL that belong to its budget ledger, not to its data: a replacement keeps them
#: (on object storage the ledger stays where the store is, see :mod:`streamdp.privacy.budget`).
def _ledger_object(name: str) -> bool:
    return name.split("/", 1)[0].startswith("privacy_budget.")


def check_destination(path: str, force: bool) -> None:
    """Refuse an existing ``path`` unless ``force`` and it is a streamdp rating store (then it may be replaced).

    On object storage the same rules: a store there is replaced only with ``force``; so is an incomplete
    store (its write did not finish, :func:`streamdp.storage.remote.incomplete_reason`) and a prefix that holds
    only a budget ledger; anything else under the prefix is left untouched.
    """
    if not remote.is_url(path):
        _check(path, force, what="rating store", is_ours=is_store_dir)
        return
    fs, p = remote.url_fs(path)
    try:
        names = [f[len(p.rstrip("/")) + 1:] for f in fs.find(p.rstrip("/"))]
    except FileNotFoundError:
        names = []
    if not names:
        return
    if not force:
        why = remote.incomplete_reason(path)
        raise StoreError(f"{path}: {why}" if why else f"{path}: already exists (use --force to overwrite a streamdp "
                                                      f"rating store)")
    if not (is_store_dir(path) or remote.WRITING_MARKER in names or all(map(_ledger_object, names))):
        raise StoreError(f"{path}: exists and is not a streamdp rating store; --force replaces only a rating store, "
                         f"so it was left untouched")


def padded_positions(block_rows: np.ndarray, chunk: int) -> int:
    """The rating positions of blocks holding ``block_rows`` ratings each, every block padded to whole chunks of
    ``chunk`` (:class:`StoreWriter`'s ``train_positions`` from an upper bound of each block's ratings)."""
    rows = np.asarray(block_rows, np.int64)
    return int((-(-rows // chunk) * chunk).sum())


class _SplitWriter:
    def __init__(self, group: zarr.Group, n_users: int, n_blocks: int, block_users: int, chunk: int,
                 n_items: int | None = None, times: bool = False, positions: int = 0):
        self.g = group
        # the exact per-item sums and counts of the split's ratings, added block by block (train only: n_items)
        self.n_items = n_items
        self.item_stats = None if n_items is None else np.zeros((2, n_items))
        self.chunk = chunk
        self.block_users = block_users
        self.n_users = n_users
        self.indptr = group.create_array(
            "indptr", shape=(n_users + 1,), dtype="int64", chunks=(max(1, block_users),), fill_value=0,
            config=_ARRAY_CONFIG,
        )
        # ``positions``: the rating positions (padding included) the split is expected to need at most, the arrays'
        # first shape (each growth is a metadata write of Zarr's, 2.7 ms: ten of them for a 1% append's segment)
        self.items = group.create_array("items", shape=(positions,), dtype="int32", chunks=(chunk,),
                                        fill_value=ITEM_PAD, compressors=rating_compressor(), config=_ARRAY_CONFIG)
        self.ratings = group.create_array("ratings", shape=(positions,), dtype="float32", chunks=(chunk,),
                                          fill_value=0.0, compressors=rating_compressor(), config=_ARRAY_CONFIG)
        # each rating's time (int64, aligned with items; padding 0), only in a store that keeps times (schema.py)
        self.times = group.create_array("times", shape=(positions,), dtype="int64", chunks=(chunk,), fill_value=0,
                                        compressors=rating_compressor(), config=_ARRAY_CONFIG) if times else None
        self.time_span = [None, None]
        self.time_digests: list[bytes] = []
        self.offsets = np.zeros(n_blocks + 1, dtype=np.int64)
        self.next_block = 0
        self.nnz = 0
        self.padded = 0
        self.digests: list[bytes] = []
        # CRC32C of each block's chunk files as written (read back while in the page cache), so that readers can
        # check a block's bytes cheaply against those its digest was computed from (storage/chunks.py)
        self.crc_readers = None
        if FAST_CRC:
            # local stores only: on object storage reading each chunk back would download the whole store again
            rd = [ChunkReader.for_array(a, remote=False) for a in (self.indptr, self.items, self.ratings)]
            self.crc_readers = rd if all(r is not None for r in rd) else None
        self.chunk_crcs: list[list[int]] = []
        # items, ratings (and times) written as chunk files of our own (local stores; Zarr's write costs ~0.5 ms a
        # chunk, storage/chunks.py), their CRCs known as written; None: through Zarr
        self.raw = None
        if self.crc_readers is not None:
            rw = [ChunkWriter.for_array(a) for a in (self.items, self.ratings, self.times) if a is not None]
            self.raw = rw if all(w is not None for w in rw) else None
        self.raw_indptr = ChunkWriter.for_array(self.indptr) if self.raw is not None else None
        # blocks written but not yet flushed to the arrays: (block, first user, row pointers, start, items,
        # ratings, times); small blocks are gathered into one write of several chunks (see :meth:`_flush`)
        self._pending: list[tuple] = []
        self._pending_rows = 0

    def write(self, b: int, indptr: np.ndarray, items: np.ndarray, ratings: np.ndarray,
              digest: bytes | None = None, times: np.ndarray | None = None) -> None:
        if b != self.next_block:
            raise ValueError(f"blocks must be written in order: expected {self.next_block}, got {b}")
        first = b * self.block_users
        n_local = min(self.block_users, self.n_users - first)
        indptr = np.asarray(indptr, dtype=np.int64)
        if indptr.shape != (n_local + 1,) or indptr[0] != 0:
            raise ValueError(f"block {b}: indptr must have length {n_local + 1} and start at 0")
        nnz = int(indptr[-1])
        if len(items) != nnz or len(ratings) != nnz:
            raise ValueError(f"block {b}: indptr says {nnz} ratings, got {len(items)} items, {len(ratings)} ratings")
        items = np.ascontiguousarray(items, dtype=np.int32)
        with np.errstate(over="ignore"):
            ratings = np.ascontiguousarray(ratings, dtype=np.float32)
        check_finite_ratings(b, ratings)
        if (times is None) != (self.times is None) or (times is not None and len(times) != nnz):
            how = "with" if self.times is not None else "without"
            raise ValueError(f"block {b}: this store's blocks are written {how} one time per rating")
        start = self.padded
        end = start + nnz
        padded_end = -(-end // self.chunk) * self.chunk
        if times is not None:
            times = np.asarray(times, np.int64)
            if nnz:
                lo, hi = int(times.min()), int(times.max())
                a, z = self.time_span
                self.time_span = [lo if a is None else min(a, lo), hi if z is None else max(z, hi)]
            self.time_digests.append(times_digest(b, times))
        self._pending.append((b, first, indptr[:-1] + self.nnz, start, items, ratings, times))
        self._pending_rows += max(padded_end - start, n_local)  # its row pointers are held too
        self.offsets[b] = start
        self.digests.append(digest if digest is not None else block_digest(b, indptr, items, ratings))
        if self.item_stats is not None:
            block_item_stats(items, ratings, self.n_items, out=self.item_stats)
        self.nnz += nnz
        self.padded = padded_end
        self.offsets[b + 1] = padded_end
        self.next_block += 1
        if self._pending_rows >= _FLUSH_RATINGS:
            self._flush()
        else:  # kept until the next flush: copies, not views of the caller's (maybe much larger) arrays
            self._pending[-1] = self._pending[-1][:4] + tuple(None if x is None else x.copy()
                                                              for x in (items, ratings, times))

    def _flush(self) -> None:
        """Write the pending blocks: one write of their items, ratings (and times), each block's tail padded to
        whole chunks, and one of their row pointers; then the CRCs of their chunk files (final once written).

        A store's arrays grow by doubling (their shape is a metadata write of Zarr's each time: once per block cost
        as much as writing a small block) and are cut to their size when the split is closed."""
        if not self._pending:
            return
        s0, end = self._pending[0][3], self.padded
        written = [[], []]  # each chunk's CRC as written, items and ratings (the raw path)
        if end > self.items.shape[0]:
            size = max(end, 2 * self.items.shape[0])
            for a in (self.items, self.ratings, self.times):
                if a is not None:
                    a.resize((size,))
        if end > s0:
            buf_i = np.full(end - s0, ITEM_PAD, np.int32)
            buf_r = np.zeros(end - s0, np.float32)
            buf_t = np.zeros(end - s0, np.int64) if self.times is not None else None
            for _, _, _, start, items, ratings, times in self._pending:
                buf_i[start - s0:start - s0 + len(items)] = items
                buf_r[start - s0:start - s0 + len(ratings)] = ratings
                if buf_t is not None:
                    buf_t[start - s0:start - s0 + len(times)] = times
            if self.raw is not None:
                written = [w.write(s0, buf) for w, buf in zip(self.raw, (buf_i, buf_r, buf_t))]
            else:
                self.items[s0:end] = buf_i
                self.ratings[s0:end] = buf_r
                if buf_t is not None:
                    self.times[s0:end] = buf_t
        u0 = self._pending[0][1]
        # the blocks' row pointers: whole chunks (a chunk per block), the last one's padded (close() writes the final
        # pointer into it)
        ip = np.concatenate([x[2] for x in self._pending])
        if self.raw_indptr is not None and self.raw_indptr.fits(u0, len(ip), pad_last=True):
            self.raw_indptr.write(u0, ip, pad_last=True)
        else:
            self.indptr[u0:u0 + len(ip)] = ip
        if self.raw is not None:  # the CRCs of the chunk files as written
            C = self.chunk
            for _, _, _, start, items, _, _ in self._pending:
                chunks = range(start // C, (start + len(items) - 1) // C + 1) if len(items) else range(0)
                self.chunk_crcs.append([written[k][c - s0 // C] for k in (0, 1) for c in chunks])
        elif self.crc_readers is not None:  # the blocks' items and ratings chunks are final once written
            C = self.chunk
            for _, _, _, start, items, _, _ in self._pending:
                chunks = range(start // C, (start + len(items) - 1) // C + 1) if len(items) else range(0)
                self.chunk_crcs.append([r.chunk_crc(c) for r in self.crc_readers[1:] for c in chunks])
        self._pending, self._pending_rows = [], 0

    def close(self, n_blocks: int) -> None:
        if self.next_block != n_blocks:
            raise ValueError(f"only {self.next_block} of {n_blocks} blocks were written")
        self._flush()
        for a in (self.items, self.ratings, self.times):
            if a is not None and a.shape[0] != self.padded:  # the slack of the last doubling: no chunk written there
                a.resize((self.padded,))
        self.indptr[self.n_users : self.n_users + 1] = np.array([self.nnz], dtype=np.int64)
        if self.item_stats is not None:
            n = max(1, min(self.n_items, 1 << 20))
            sums, counts = self.item_stats[0], self.item_stats[1].astype(np.int64)
            for name, a in (("item_sums", sums), ("item_counts", counts)):
                self.g.create_array(name, shape=a.shape, dtype=a.dtype, chunks=(n,), config=_ARRAY_CONFIG)[...] = a
            self.stats_digest = item_stats_digest(sums, counts)
        arr = self.g.create_array(
            "block_offsets", shape=(n_blocks + 1,), dtype="int64", chunks=(max(1, n_blocks + 1),),
            config=_ARRAY_CONFIG,
        )
        arr[:] = self.offsets
        dig = self.g.create_array("block_digests", shape=(n_blocks, 16), dtype="uint8",
                                  chunks=(max(1, n_blocks), 16), config=_ARRAY_CONFIG)
        if n_blocks:
            dig[...] = np.frombuffer(b"".join(self.digests), np.uint8).reshape(n_blocks, 16)
        if self.crc_readers is not None:
            # indptr chunks are final only now (the last row pointer); a block reads its own chunk of them and
            # the first entry of the next: the chunks RatingStore.read_block reads, in the order it reads them
            ip, bu = self.crc_readers[0], self.block_users
            crcs = np.zeros(n_blocks, np.uint32)
            for b in range(n_blocks):
                first, end = b * bu, min((b + 1) * bu, self.n_users)
                head = [ip.chunk_crc(c) for c in ip.chunk_range(first, end + 1)]
                crcs[b] = chunk_crcs_digest(head + self.chunk_crcs[b])
            arr = self.g.create_array("block_crc32c", shape=(n_blocks,), dtype="uint32",
                                      chunks=(max(1, n_blocks),), config=_ARRAY_CONFIG)
            arr[:] = crcs


class _FilledArray:
    """An array of a store being written, filled in slices: each write runs with Ctrl-C deferred.

    With ``hash_as`` (an id array the checksum covers), the slices must come in order from 0 and
    each is fed to the store's :class:`ContentHash` as written (``generate`` writes ``user_ids`` by
    block: they were outside the checksum, so swapping two went unnoticed by ``verify``).
    """

    def __init__(self, array: zarr.Array, hash_as: tuple | None = None):
        self.array = array
        self._hash = hash_as  # (ContentHash, name) or None
        self.filled = 0
        self._raw = ChunkWriter.for_array(array)  # whole chunks of a local array: written as files of our own

    @deferred_interrupts()
    def __setitem__(self, key, value) -> None:
        if self._hash is not None:
            if not (isinstance(key, slice) and key.step in (None, 1) and (key.start or 0) == self.filled):
                raise ValueError(f"{self.array.name}: a hashed id array is filled by consecutive slices from 0")
            value = np.asarray(value)
            self._hash[0].add_ids(self._hash[1], value)
            self.filled += len(value)
        if self._raw is not None and isinstance(key, slice) and key.step in (None, 1) and key.stop is not None:
            value = np.asarray(value)
            start = key.start or 0
            if value.ndim == 1 and len(value) == key.stop - start and np.can_cast(value.dtype, self.array.dtype):
                write_slice(self.array, self._raw, start, value)
                return
        self.array[key] = value

    def __getattr__(self, name):
        return getattr(self.array, name)


class StoreWriter:
    """Write a store block by block into a temporary directory, then rename it into place.

    Parameters
    ----------
    path : str
        Destination directory, or an fsspec URL (see "Object storage" in the module docstring).
    n_users, n_items : int
        Dense sizes of the store.
    block_users : int
        Users per block.
    splits : tuple of str
        ``("train",)`` or ``("train", "test")``.
    force : bool
        Replace an existing rating store at the destination (only at :meth:`finalize`,
        carrying its privacy-budget ledger over); anything else there is an error.
    train_positions : int
        The rating positions (each block's ratings padded to whole chunks of ``chunk_ratings``) the train split
        is expected to need at most (:func:`padded_positions`): its arrays' first shape, cut to what was
        written at the close; 0 (or too few) grows them as written.
    """

    def __init__(
        self,
        path: str,
        *,
        n_users: int,
        n_items: int,
        block_users: int,
        splits: tuple[str, ...] = ("train",),
        force: bool = False,
        chunk_ratings: int = DEFAULT_CHUNK_RATINGS,
        times: bool = False,
        train_positions: int = 0,
    ):
        if n_users < 1 or n_items < 1:
            raise StoreError(f"{path}: a store needs at least one user and one item")
        check_destination(path, force)
        self.remote = remote.is_url(path)
        self.path = str(path).rstrip("/") if self.remote else os.path.abspath(path)
        self.force = force
        self.n_users, self.n_items, self.block_users = int(n_users), int(n_items), int(block_users)
        self.n_blocks = -(-self.n_users // self.block_users)
        self._failed = False
        self.tmp = None
        try:  # no `with` has been entered yet: an error or Ctrl-C here must remove the temp itself
            with deferred_interrupts():
                if self.remote:
                    self.tmp = self._remote_target()
                else:
                    self.tmp = owned_temp_dir(self.path, "tmp")
                # mode "a": the directory exists (with its owner record, which mode "w" would delete)
                kw = {"storage_options": remote.write_options(self.tmp)} if self.remote else {}
                self.root = zarr.open_group(self.tmp, mode="a", **kw)
                self.splits = {
                    s: _SplitWriter(self.root.create_group(s), self.n_users, self.n_blocks, self.block_users,
                                    chunk_ratings, n_items=self.n_items if s == "train" else None, times=times,
                                    positions=train_positions if s == "train" else 0)
                    for s in splits
                }
        except BaseException as exc:
            self._failed = True
            self.abort()
            if is_no_space(exc):
                raise no_space_error(exc, self.path) from None
            raise
        self._hash = ContentHash()
        self._hashed: list[_FilledArray] = []  # id arrays filled in slices, hashed as they are written
        self._done = False

    def _remote_target(self) -> str:
        """Where a store on object storage is written (see "Object storage" in the class docstring)."""
        if is_store_dir(self.path):  # replaced (force): the old store stays readable until the publish
            parent, name = self.path.rsplit("/", 1)
            target = f"{parent}/.{name}.tmp-{secrets.token_hex(6)}"
        else:  # nothing there, or leftovers of a write that did not finish (force): the data goes in place
            target = self.path
            remote.remove_prefix(target, keep=_ledger_object)
        remote.write_marker(target)
        return target

    # -- context manager: abort on error ----------------------------------------------
    def __enter__(self) -> "StoreWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None or not self._done:
            self._failed = self._failed or exc_type is not None
            self.abort()
        if exc is not None and is_no_space(exc):
            raise no_space_error(exc, self.path) from None

    def abort(self) -> None:
        """Remove the temporary directory (idempotent).

        After a failed write it waits briefly for Zarr writes still in flight that could
        recreate it (:func:`streamdp.outputs.remove_temp_dir`).
        """
        if self.tmp is None:
            return
        if self.remote:
            try:
                remote.remove_prefix(self.tmp, keep=_ledger_object if self.tmp == self.path else lambda n: False)
            except Exception:  # noqa: BLE001 - best effort: what is left is not a store (no attributes)
                pass
            self.tmp = None
            return
        remove_temp_dir(self.tmp, settle=self._failed)

    # -- content ------------------------------------------------------------------------
    @deferred_interrupts()
    def write_block(self, b: int, indptr, items, ratings, split: str = "train", *,
                    digest: bytes | None = None, times=None) -> None:
        """Write block ``b`` of ``split``; blocks of one split must come in order.

        ``digest`` is :func:`block_digest` of the same arrays if the caller already
        computed it (e.g. in a worker thread); it is computed here otherwise. A train
        block's items' sums and counts are added to the store's (:func:`block_item_stats`). ``times``: each
        rating's time, in a store written with ``times=True`` (and only there).
        """
        self.splits[split].write(b, indptr, items, ratings, digest, times)

    @deferred_interrupts()
    def write_array(self, name: str, data: np.ndarray, chunks: tuple[int, ...] | None = None) -> zarr.Array:
        """Write a whole auxiliary array (ids, counts, ground truth)."""
        data = np.asarray(data)
        if chunks is None:
            chunks = (max(1, min(len(data), 1 << 20)),) + tuple(data.shape[1:])
        if "/" in name:
            grp, leaf = name.rsplit("/", 1)
            g = self.root.require_group(grp)
        else:
            g, leaf = self.root, name
        dtype = str if data.dtype.kind in "UOT" else data.dtype
        arr = g.create_array(leaf, shape=data.shape, dtype=dtype, chunks=chunks, config=_ARRAY_CONFIG)
        if len(data):
            arr[...] = data
        if name in _DEFAULT_CHECKSUM_IDS:
            self._hash.add_ids(name, data)
        return arr

    @deferred_interrupts()
    def create_array(self, name: str, shape, dtype, chunks) -> "_FilledArray":
        """Create an auxiliary array to be filled in slices (e.g. ids streamed by block).

        An id array the checksum covers (``user_ids``, ``item_ids``) is hashed slice by slice as it is filled
        (in order from 0; another id array must not be written in between): :meth:`finalize` refuses it
        unfilled.
        """
        if "/" in name:
            grp, leaf = name.rsplit("/", 1)
            g = self.root.require_group(grp)
        else:
            g, leaf = self.root, name
        arr = _FilledArray(g.create_array(leaf, shape=shape, dtype=dtype, chunks=chunks, config=_ARRAY_CONFIG),
                           (self._hash, name) if name in _DEFAULT_CHECKSUM_IDS else None)
        if name in _DEFAULT_CHECKSUM_IDS:
            self._hashed.append(arr)
        return arr

    @deferred_interrupts()
    def finalize(self, attrs: dict) -> str:
        """Close the splits, write attributes and checksum, and move the store into place.

        ``attrs`` must hold ``rating_min``, ``rating_max`` and ``rating_range_source``;
        anything else (sources, parameters) is recorded as given.
        """
        for a in self._hashed:
            if a.filled != a.array.shape[0]:
                raise ValueError(f"{a.array.name}: {a.filled} of {a.array.shape[0]} ids were written")
        for s, w in self.splits.items():
            w.close(self.n_blocks)
            self._hash.add_split(s)
            for d in w.digests:
                self._hash.add_block(s, d)
            if w.times is not None:  # the times are content too (a store without them: the checksum as it was)
                self._hash.add_split(f"{s}/times")
                for d in w.time_digests:
                    self._hash.add_block(f"{s}/times", d)
        full = {
            "format": FORMAT_NAME,
            "format_version": IMPLICIT_FORMAT_VERSION if attrs.get("implicit") else FORMAT_VERSION,
            "n_users": self.n_users,
            "n_items": self.n_items,
            "n_ratings": self.splits["train"].nnz,
            "n_test": self.splits["test"].nnz if "test" in self.splits else 0,
            "block_users": self.block_users,
            "n_blocks": self.n_blocks,
            "checksum_ids": list(self._hash.ids_names),
            "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            # this write of the store: a run checks before releasing that the store it read is still this one
            "generation": secrets.token_hex(8),
        }
        # the digest of the exact per-item training sums and counts (outside the checksum: storage/schema.py)
        full["train_item_stats"] = self.splits["train"].stats_digest
        full["created_by"] = f"streamdp {__version__}"
        if any(w.times is not None for w in self.splits.values()):
            full["times"] = time_attrs([w.time_span for w in self.splits.values()])
        for k, v in attrs.items():
            full.setdefault(k, v)
        for k in ("rating_min", "rating_max", "rating_range_source"):
            if k not in full:
                raise ValueError(f"finalize: missing attribute {k}")
        full["checksum_attrs"] = [n for n in CHECKSUM_ATTRS if attr_value(full, n) is not None]
        if full["checksum_attrs"]:  # hashed as they will read back from zarr.json
            self._hash.add_attrs(json.loads(json.dumps(full)), full["checksum_attrs"])
        full["checksum"] = self._hash.hexdigest()
        by = str(attrs.get("created_with", "?"))
        if not self.remote:
            self.root.attrs[ATTRS_KEY] = full
        try:
            if self.remote:
                self._publish_remote(full, by=by)
            else:
                self._install_local(full, by=by)
        except BaseException:
            self._failed = True
            self.abort()
            raise
        self._done = True
        return self.path

    def _install_local(self, full: dict, *, by: str) -> None:
        """Rename the finished store into place on a local disk (a replaced store's budget ledger moves with it)."""
        budget = contextlib.nullcontext()
        if os.path.lexists(self.path):
            check_destination(self.path, self.force)
            # the replaced store's budget ledger moves into the new store, under its lock
            budget = ledger_keeper().carried_over(self.path, self.tmp, by=by, checksum=full["checksum"])
        with budget:
            install_dir(self.tmp, self.path, force=self.force, what="rating store", is_ours=is_store_dir)

    def _publish_remote(self, full: dict, *, by: str) -> None:
        """Make the store written on object storage visible: its root attributes are the last object written."""
        if self.tmp == self.path:
            self.root.attrs[ATTRS_KEY] = full  # the root zarr.json with the attributes: from now on a store
            self.tmp = None  # published: nothing to abort
            remote.remove_prefix(self.path, keep=lambda n: n != remote.WRITING_MARKER)
            return
        # replacing a store: the new one is complete under the temporary prefix; copy it over the old one
        self.root.attrs[ATTRS_KEY] = full
        check_destination(self.path, self.force)
        ledger = ledger_keeper().ledger(self.path)
        ledger.check()  # a corrupt ledger refuses the replacement before anything changes (as on a local disk)
        old_checksum = (remote_attrs(self.path) or {}).get("checksum")
        fs, dest = remote.url_fs(self.path)
        _, src = remote.url_fs(self.tmp)
        dest, src = dest.rstrip("/"), src.rstrip("/")
        with deferred_interrupts():
            remote.write_marker(self.path)
            fs.rm_file(f"{dest}/zarr.json")  # the old store is no longer one: nothing reads a mix of the two
            tmp, self.tmp = self.tmp, None  # from here on the new store under tmp is the only copy: kept on errors
            try:
                remote.remove_prefix(self.path, keep=lambda n: _ledger_object(n) or n == remote.WRITING_MARKER)
                names = [f[len(src) + 1:] for f in fs.find(src)]
                names = [n for n in names if n not in ("zarr.json", remote.WRITING_MARKER)]
                if names:
                    fs.copy([f"{src}/{n}" for n in names], [f"{dest}/{n}" for n in names])
                fs.copy(f"{src}/zarr.json", f"{dest}/zarr.json")  # last: the new store is now visible
            except Exception as exc:
                raise StoreError(f"{self.path}: replacing the store failed while publishing the new one "
                                 f"({exc.__class__.__name__}: {exc}); the old store is gone, the new one is complete "
                                 f"at {tmp}: write it again with --force") from None
            fs.invalidate_cache(dest)
            remote.remove_prefix(self.path, keep=lambda n: n != remote.WRITING_MARKER)
        remote.remove_prefix(tmp)
        # the ledger stayed where it was: its releases keep counting; say that the data changed
        ledger.data_replaced(by=by, old_checksum=old_checksum, new_checksum=full["checksum"])


def remote_attrs(url: str) -> dict | None:
    """The ``streamdp`` attributes in the root ``zarr.json`` at ``url`` (None: none, or not readable)."""
    try:
        raw = remote.read_bytes(remote.join(url, "zarr.json"))
        attrs = json.loads(raw).get("attributes", {}).get(ATTRS_KEY) if raw is not None else None
    except (OSError, ValueError, AttributeError):
        return None
    return attrs if isinstance(attrs, dict) else None
