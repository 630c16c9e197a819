"""Reading a rating store: :func:`open_store` and :class:`RatingStore`.

This is the one block reader of streamdp: every method, the evaluator and the
stream engine read ratings through :meth:`RatingStore.read_block`. Every read
refuses a missing or corrupt chunk and every block is validated before it is
returned (:class:`~streamdp.errors.StoreError` naming the store, the array and
the block); :meth:`RatingStore.check_chunks` is the cheap structural check that
``train`` and ``evaluate`` run before spending anything.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from typing import Iterator, NamedTuple

import numpy as np
import zarr

from streamdp.errors import ParameterError, StoreError
from streamdp.storage.chunks import FAST_CRC, ChunkReader, ZarrReader, chunk_crcs_digest, range_reader
from streamdp.storage.ids import as_ids
from streamdp.storage.schema import (ATTRS_KEY, CSR_ARRAYS, FORMAT_NAME, FORMAT_VERSION, READ_VERSIONS, SPLITS,
                                     storable_ratings)
from streamdp.storage.writer import block_digest, item_stats_digest


_fallback_lock = threading.Lock()
#: What turns an opened store whose attributes list segments into a merged view: installed by
#: :mod:`streamdp.storage.segments` (imported by the package ``streamdp.storage``, so before any store is opened).
_become_segmented = None


class Block(NamedTuple):
    """One user block as plain NumPy arrays.

    ``indptr`` is local (``indptr[0] == 0``, length ``n_users + 1``); user ``j`` of
    the block is global user ``first_user + j`` and rated ``items[indptr[j]:indptr[j+1]]``.
    """

    first_user: int
    indptr: np.ndarray
    items: np.ndarray
    ratings: np.ndarray

    @property
    def n_users(self) -> int:
        return len(self.indptr) - 1

    @property
    def nnz(self) -> int:
        return int(self.indptr[-1])


@dataclass(frozen=True)
class StoreInfo:
    """The public shape of a store, read from its attributes."""

    n_users: int
    n_items: int
    n_ratings: int
    n_test: int
    block_users: int
    n_blocks: int
    rating_min: float
    rating_max: float
    rating_range_source: str
    checksum: str
    #: An implicit store: interaction logs, ``ratings`` holds positive counts/weights (``attrs["value"]``).
    #: False for rating stores and for stores written before implicit stores existed.
    implicit: bool = False


class RatingStore:
    """An opened rating store (read-only).

    Parameters
    ----------
    path : str
        A local directory or any fsspec URL that Zarr can open.
    """

    def __init__(self, path: str, storage_options: dict | None = None, *, _attrs: dict | None = None):
        self.path = str(path)
        if self.local and not os.path.lexists(self.path):
            raise StoreError(f"{self.path}: does not exist")
        try:
            kw = {"storage_options": storage_options} if storage_options else {}
            self._root = zarr.open_group(self.path, mode="r", **kw)
        except (FileNotFoundError, zarr.errors.GroupNotFoundError, ValueError, OSError) as exc:
            raise self._not_a_store(f"not a streamdp rating store ({exc.__class__.__name__})") from None
        # ``_attrs``: the attributes an append is about to commit, to read the store as it will be (segments.py)
        attrs = _attrs if _attrs is not None else dict(self._root.attrs).get(ATTRS_KEY)
        if not isinstance(attrs, dict) or attrs.get("format") != FORMAT_NAME:
            raise self._not_a_store(f"not a streamdp rating store (no '{ATTRS_KEY}' attributes)")
        version = attrs.get("format_version")
        if version not in READ_VERSIONS:
            raise StoreError(
                f"{self.path}: store format version {version}, but this streamdp reads version "
                f"{FORMAT_VERSION} (and {READ_VERSIONS[1]} for implicit stores, {READ_VERSIONS[2]} for segmented "
                f"ones); re-ingest the data with this version"
            )
        self.attrs: dict = attrs
        self.info = StoreInfo(
            n_users=int(attrs["n_users"]),
            n_items=int(attrs["n_items"]),
            n_ratings=int(attrs["n_ratings"]),
            n_test=int(attrs.get("n_test", 0)),
            block_users=int(attrs["block_users"]),
            n_blocks=int(attrs["n_blocks"]),
            rating_min=float(attrs["rating_min"]),
            rating_max=float(attrs["rating_max"]),
            rating_range_source=str(attrs.get("rating_range_source", "observed")),
            checksum=str(attrs.get("checksum", "")),
            implicit=bool(attrs.get("implicit", False)),
        )
        self._cache: dict[str, dict] = {}
        self._readers: dict = {}
        self._members: dict[str, bool] = {}
        self._nnz: dict[str, np.ndarray] = {}
        self._storage_options = storage_options
        self.identity = self._identity(attrs)
        #: Blocks whose chunk files differed from their recorded CRC and were checked by their digest instead.
        self.digest_fallbacks = 0
        #: The whole store when this is a part (the base or a segment) of a segmented store, else None.
        self._owner = None
        if attrs.get("segments") is not None:  # the segment list is read once, here (storage/segments.py)
            if _become_segmented is None:
                raise StoreError(f"{self.path}: a segmented store, and nothing that reads one is installed "
                                 f"(streamdp.storage.segments)")
            _become_segmented(self)

    def _not_a_store(self, why: str) -> StoreError:
        """The error for a path that holds no store; on object storage, also why (a write that did not finish,
        or nothing there)."""
        if not self.local:
            from streamdp.storage import remote

            try:
                incomplete = remote.incomplete_reason(self.path)
                if incomplete is None and not remote.exists(self.path):
                    return StoreError(f"{self.path}: does not exist")
            except OSError as exc:
                return StoreError(f"{self.path}: cannot be read ({exc})")
            if incomplete is not None:
                return StoreError(f"{self.path}: not a streamdp rating store yet: {incomplete}")
        return StoreError(f"{self.path}: {why}")

    # -- identity ---------------------------------------------------------------------
    @property
    def local(self) -> bool:
        return "://" not in self.path

    def _identity(self, attrs: dict) -> tuple:
        """What tells this write of the store from another: its checksum and generation id; for a store written
        before generation ids, its checksum and the file identity of a local ``zarr.json`` (device, inode,
        mtime: a replaced or edited store has another)."""
        if attrs.get("generation") or not self.local:
            return (attrs.get("checksum"), attrs.get("generation"))
        st = os.stat(os.path.join(self.path, "zarr.json"))
        return (attrs.get("checksum"), None, st.st_dev, st.st_ino, st.st_mtime_ns)

    def current_identity(self) -> tuple | None:
        """:attr:`identity` as the store is now (read again from storage); ``None`` if it is gone or no longer
        a rating store."""
        try:
            if self.local:
                with open(os.path.join(self.path, "zarr.json")) as fh:
                    attrs = json.load(fh).get("attributes", {}).get(ATTRS_KEY)
            else:
                kw = {"storage_options": self._storage_options} if self._storage_options else {}
                attrs = dict(zarr.open_group(self.path, mode="r", **kw).attrs).get(ATTRS_KEY)
            return self._identity(attrs) if isinstance(attrs, dict) else None
        except (OSError, ValueError, AttributeError, zarr.errors.GroupNotFoundError):
            return None

    def changed(self) -> bool:
        """Whether the store at :attr:`path` is no longer the one opened (replaced, rewritten, removed, or a
        segment appended or compacted away since)."""
        if self._owner is not None:
            return self._owner.changed()
        return self.current_identity() != self.identity

    def check_unchanged(self) -> None:
        """Raise :class:`StoreError` if the store was replaced, rewritten or removed since it was opened.

        ``train`` calls it before releasing anything (and ``evaluate`` before reporting): a run that read
        blocks of two stores must not release a model recording one store's checksum.
        """
        if self.changed():
            raise self._replaced()

    def _replaced(self) -> StoreError:
        if self._owner is not None:
            return self._owner._replaced()
        # each write named by its random generation id, never by its checksum (an unkeyed hash of the ratings,
        # which whoever knows all users but one could test the last one against: docs/privacy.md)
        def name(ident):
            return f"generation {ident[1]}" if ident[1] else "a store written before generation ids"

        now = self.current_identity()
        if now is None:
            what = "it is gone"
        elif now[1] and now[1] != self.identity[1]:
            what = f"now {name(now)}"
        elif now[:2] != self.identity[:2]:
            what = "its content changed"
        else:
            what = "its zarr.json was rewritten"
        return StoreError(f"{self.path}: the store changed while this run read it (opened as {name(self.identity)}; "
                          f"{what}): its results would mix two stores' ratings; nothing was released, run again")

    # -- public shape -----------------------------------------------------------------
    def remote_view(self):
        """How a cluster worker, which opens the store by its path, reads blocks as this object does.

        ``None`` for a store itself. A view of a store (a subclass whose ``read_block`` changes the blocks: a
        catalogue, tune's held-out and sampled views) returns a picklable spec with a hashable ``key`` and
        ``view(store)``; :class:`~streamdp.stream.engine.Engine` applies it on the workers and refuses a view that
        has none (its tasks would read the store's own blocks).
        """
        return None

    def __getattr__(self, name):
        # n_users, n_items, ... straight from StoreInfo
        info = self.__dict__.get("info")
        if info is not None and name in StoreInfo.__dataclass_fields__:
            return getattr(info, name)
        raise AttributeError(name)

    def __repr__(self) -> str:
        i = self.info
        return (
            f"RatingStore({self.path!r}, n_users={i.n_users}, n_items={i.n_items}, "
            f"n_ratings={i.n_ratings}, n_test={i.n_test}, n_blocks={i.n_blocks})"
        )

    @property
    def root(self) -> zarr.Group:
        """The underlying Zarr group (read-only)."""
        return self._root

    @property
    def has_test(self) -> bool:
        return self._has("test") and self.info.n_test > 0

    def block_range(self, b: int) -> tuple[int, int]:
        """``(first_user, end_user)`` of block ``b``."""
        if not 0 <= b < self.info.n_blocks:
            raise IndexError(f"block {b} out of range 0..{self.info.n_blocks - 1}")
        first = b * self.info.block_users
        return first, min(first + self.info.block_users, self.info.n_users)

    # -- reading ----------------------------------------------------------------------
    # Every read goes through a range reader of streamdp.storage.chunks, which refuses a
    # missing, empty, truncated or undecodable chunk with a StoreError naming the array;
    # blocks are validated here, at the edge, so kernels never see out-of-range indices.
    def _has(self, name: str) -> bool:
        """Whether the store holds ``name`` (an array or a group), asked of Zarr once per opened store (each
        question is a round trip through Zarr's I/O thread, and a run asked the same ones a hundred times)."""
        has = self._members.get(name)
        if has is None:
            has = self._members[name] = name in self._root
        return has

    def _reader(self, name: str):
        """The checked range reader of array ``name`` (e.g. ``train/items``), cached."""
        r = self._readers.get(name)
        if r is None:
            try:
                arr = self._root[name]
            except (KeyError, ValueError, OSError) as exc:
                raise StoreError(f"{self.path}: {name}: array is missing or unreadable ({exc.__class__.__name__}) "
                                 f"(the store is damaged)") from None
            if not isinstance(arr, zarr.Array):
                raise StoreError(f"{self.path}: {name}: not an array (the store is damaged)")
            r = self._readers[name] = range_reader(arr, f"{self.path}: {name}")
        return r

    def _damaged(self, name: str, b: int | None, why: str) -> StoreError:
        where = "" if b is None else f"block {b}: "
        return StoreError(f"{self.path}: {name}: {where}{why} (the store is damaged)")

    def _split(self, split: str) -> dict:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
        sp = self._cache.get(split)
        if sp is None:
            if not self._has(split):
                raise StoreError(f"{self.path}: store has no '{split}' split")
            readers = {n: self._reader(f"{split}/{n}") for n in CSR_ARRAYS}
            nb, chunk = self.info.n_blocks, readers["items"].chunk
            if readers["indptr"].shape != self.info.n_users + 1:
                raise self._damaged(f"{split}/indptr", None, f"has {readers['indptr'].shape} entries, not "
                                                            f"n_users + 1 = {self.info.n_users + 1}")
            off = np.asarray(readers["block_offsets"].read(0, nb + 1), np.int64)
            padded = readers["items"].shape
            if (len(off) != nb + 1 or off[0] != 0 or off[-1] != padded or readers["ratings"].shape != padded
                    or np.any(np.diff(off) < 0) or np.any(off % chunk)):
                raise self._damaged(f"{split}/block_offsets", None,
                                    f"does not describe {nb} blocks on {chunk}-rating chunk boundaries of "
                                    f"{padded} items and {readers['ratings'].shape} ratings")
            total = self.info.n_ratings if split == "train" else self.info.n_test
            raw = all(isinstance(readers[n], ChunkReader) for n in ("indptr", "items", "ratings"))
            crc = self._recorded(f"{split}/block_crc32c", (nb,), np.uint32) if FAST_CRC and raw else None
            sp = self._cache[split] = {"readers": readers, "offsets": off, "chunk": chunk, "total": total,
                                       "crc": crc, "digests": self._recorded(f"{split}/block_digests", (nb, 16),
                                                                             np.uint8)}
        return sp

    def _recorded(self, name: str, shape: tuple, dtype) -> np.ndarray | None:
        """A per-block array of checks (``None`` if the store was written without it), of ``shape``."""
        if not self._has(name):
            return None
        a = np.asarray(self.array(name)[...], dtype)
        if a.shape != shape:
            raise self._damaged(name, None, f"shape {a.shape}, not {shape}")
        return a

    def _check_indptr(self, split: str, b: int, indptr: np.ndarray, sp: dict) -> None:
        """``indptr`` of block ``b`` (global positions) is non-decreasing inside the split, starts at
        0 in block 0, ends at the split's rating count in the last block, and holds as many
        ratings as ``block_offsets`` reserves for the block (rounded up to whole chunks)."""
        total, C, off = sp["total"], sp["chunk"], sp["offsets"]
        d = np.diff(indptr)
        first, last = int(indptr[0]), int(indptr[-1])
        why = None
        if first < 0 or last > total or (len(d) and int(d.min()) < 0):
            why = f"row pointers are not non-decreasing within [0, {total}]"
        elif b == 0 and first != 0:
            why = f"row pointers start at {first}, not 0"
        elif b == self.info.n_blocks - 1 and last != total:
            why = f"row pointers end at {last}, not at the {total} ratings of the split"
        elif -(-(last - first) // C) * C != off[b + 1] - off[b]:
            why = (f"row pointers give {last - first} ratings, but block_offsets reserve "
                   f"{off[b + 1] - off[b]} positions")
        if why:
            raise self._damaged(f"{split}/indptr", b, why)

    def _check_values(self, split: str, b: int, items: np.ndarray, ratings: np.ndarray | None) -> None:
        """Item indices within ``[0, n_items)``; ratings finite and inside the store's rating range.

        Four vectorized min/max reductions (and two scalar ``isfinite``: a store whose recorded
        range is infinite, as ingest once wrote for a rating of ``1e39``, would otherwise hold
        ``inf`` ratings); a NaN makes ``min``/``max`` NaN, which fails both comparisons.
        Measured on 1M-rating blocks: 0.17 ms per block in cache, about
        0.4 ms over ten blocks read in turn (a fused Numba loop with an early exit took
        0.55 ms: it does not vectorize); ``read_block`` with all checks took 3.3% longer
        (median of 21 paired rounds, 6.7-7.6 ms per block unchecked).
        """
        if not len(items):
            return
        n = self.info.n_items
        lo, hi = int(items.min()), int(items.max())
        if lo < 0 or hi >= n:
            raise self._damaged(f"{split}/items", b, f"item index {lo if lo < 0 else hi} outside [0, {n})")
        if ratings is None:  # not read (:meth:`read_block_items`)
            return
        rlo, rhi = np.float32(self.info.rating_min), np.float32(self.info.rating_max)
        a, z = ratings.min(), ratings.max()
        if not (a >= rlo and z <= rhi and np.isfinite(a) and np.isfinite(z)):  # an inf range holds inf ratings
            bad = a if not a >= rlo else z
            why = "not finite" if not np.isfinite(bad) else f"outside the store's range [{rlo:g}, {rhi:g}]"
            raise self._damaged(f"{split}/ratings", b, f"rating {bad:g} {why}")

    def read_block(self, b: int, split: str = "train", into=None) -> Block:
        """Read user block ``b`` of ``split`` into memory (whole chunks only), validated and checked.

        Raises :class:`StoreError` naming the store, the array and the block for a
        missing or corrupt chunk, row pointers that do not fit the block's extent, an
        item index outside ``[0, n_items)``, a rating that is not finite or outside
        the store's rating range, or a block that is not the one written: its chunk
        files must match the CRC32C recorded for the block (``block_crc32c``) or,
        when they do not or no CRC is recorded, its content must match its recorded
        digest (``block_digests``; a store written without either is not checked).
        When the store itself was replaced or rewritten since it was opened, the
        error says so instead (:meth:`check_unchanged`).

        The check runs in the calling thread (the engine's reader threads): a CRC of
        the compressed chunk files costs 0.3% of the CPU of an engine pass and 4-8% of a
        bare one-thread read loop (``bench/digest.py``); the digest (blake2b of the
        decoded block, about 0.9 GB/s) 2.6-4x the CPU of the read.

        ``into`` (optional): called with the block's row pointers (from 0), it returns the arrays (int32,
        float32, each at least the block's rating count long) to read the items and ratings into; the block's
        are then views of their leading elements (a merge of a segmented store's block reads its base there).
        """
        blk, crc_ok = self.read_block_unchecked(b, split, into)
        if crc_ok:
            return blk
        digests = self._split(split)["digests"]
        if digests is None:
            return blk
        if crc_ok is False:  # bytes differ from those written: maybe re-encoded, the digest decides
            with _fallback_lock:
                self.digest_fallbacks += 1
        if block_digest(b, blk.indptr, blk.items, blk.ratings) != digests[b].tobytes():
            if self.changed():
                raise self._replaced()
            first, end = self.block_range(b)
            raise StoreError(f"{self.path}: {split}: block {b} (users {first}..{end - 1}) does not match its "
                             f"recorded digest: the store was altered after it was written; run "
                             f"`streamdp verify {self.path}`")
        return blk

    def read_block_unchecked(self, b: int, split: str = "train", into=None,
                             ratings: bool = True) -> tuple[Block, bool | None]:
        """Block ``b`` of ``split`` validated like :meth:`read_block`, and whether its chunk files match the
        CRC32C recorded for it (``None``: none recorded, or not read from local chunk files); its digest is
        not checked (``streamdp verify`` recomputes it anyway). ``into``: as :meth:`read_block`'s.
        ``ratings=False``: the ratings' chunk files are read for the CRC only, not decoded (an empty array in
        their place; :meth:`read_block_items`)."""
        try:
            first, end = self.block_range(b)
            sp = self._split(split)
            r = sp["readers"]
            crcs = [] if sp["crc"] is not None else None
            indptr = np.asarray(r["indptr"].read(first, end + 1, crcs) if crcs is not None
                                else r["indptr"].read(first, end + 1), dtype=np.int64)
            self._check_indptr(split, b, indptr, sp)
            start = int(sp["offsets"][b])
            nnz = int(indptr[-1] - indptr[0])
            outs = into(indptr - indptr[0]) if into is not None else (None, None)
            items = _read_into(r["items"], start, start + nnz, crcs, outs[0], np.int32)
            if ratings:
                values = _read_into(r["ratings"], start, start + nnz, crcs, outs[1], np.float32)
            else:
                if crcs is not None:
                    r["ratings"].read_crcs(start, start + nnz, crcs)
                values = None
            crc_ok = None if crcs is None else chunk_crcs_digest(crcs) == int(sp["crc"][b])
            self._check_values(split, b, items, values)
        except StoreError:
            # blocks of another store than the one opened look damaged: say what happened instead
            if self.changed():
                raise self._replaced() from None
            raise
        return Block(first, indptr - indptr[0], items, np.empty(0, np.float32) if values is None else values), crc_ok

    def read_block_items(self, b: int, split: str = "train") -> Block:
        """Block ``b`` of ``split`` without its ratings (an empty array in their place): its row pointers and items,
        checked as :meth:`read_block` checks them (the ratings' chunk files are read for the block's CRC32C, not
        decoded); a block whose CRC does not match, or a store without CRCs, is read whole and checked so. For what
        needs only which items each user rated (an append's commit: half the decoding)."""
        sp = self._split(split)
        if sp["crc"] is not None and isinstance(sp["readers"]["ratings"], ChunkReader):
            blk, ok = self.read_block_unchecked(b, split, ratings=False)
            if ok:
                return blk
        # bytes differ from those written (maybe re-encoded), or nothing to check them by: the whole block decides
        return self.read_block(b, split)._replace(ratings=np.empty(0, np.float32))

    @property
    def has_times(self) -> bool:
        """Whether the store keeps each rating's time (``SPLIT/times``, :func:`~streamdp.storage.schema.time_attrs`)."""
        return isinstance(self.attrs.get("times"), dict)

    def read_block_times(self, b: int, split: str = "train", since: int | None = None) -> tuple[Block, np.ndarray]:
        """Block ``b`` of ``split`` (:meth:`read_block`) and its ratings' times (int64, aligned with its items);
        :class:`StoreError` for a store that keeps no times. ``since``: the caller drops the ratings made before
        it, so a store may leave out what holds only those (a segmented store's older parts); all are read here."""
        blk = self.read_block(b, split)
        return blk, self.block_times(b, split, blk.nnz)

    def block_times(self, b: int, split: str, nnz: int) -> np.ndarray:
        """The times of the ``nnz`` ratings of block ``b`` of ``split`` (read beside the block's items)."""
        if not self.has_times:
            raise StoreError(f"{self.path}: the store keeps no rating times (its input had no timestamp column)")
        sp = self._split(split)
        start = int(sp["offsets"][b])
        try:
            r = self._reader(f"{split}/times")
            if r.shape != sp["readers"]["items"].shape:
                raise self._damaged(f"{split}/times", None, f"has {r.shape} entries, not one per item position")
            return np.asarray(r.read(start, start + nnz), np.int64)
        except StoreError:
            if self.changed():
                raise self._replaced() from None
            raise

    def blocks(self, split: str = "train", *, start: int = 0, stop: int | None = None) -> Iterator[Block]:
        """Iterate over the user blocks of ``split`` in order."""
        stop = self.info.n_blocks if stop is None else min(stop, self.info.n_blocks)
        for b in range(start, stop):
            yield self.read_block(b, split)

    __iter__ = blocks

    def read_into_size(self, split: str = "train") -> int:
        """A length of arrays that a read of any block of ``split`` fits into (:meth:`read_block`'s ``into``): the
        largest block's ratings."""
        nnz = self.block_nnz(split)
        return int(nnz.max()) if len(nnz) else 0

    def block_nnz(self, split: str = "train") -> np.ndarray:
        """Number of ratings in each block (reads only ``indptr`` at block edges), validated
        against ``block_offsets`` and the split's rating count."""
        nnz = self._nnz.get(split)
        if nnz is None:
            sp = self._split(split)
            bu, n = self.info.block_users, self.info.n_users
            edges = np.minimum(np.arange(self.info.n_blocks + 1, dtype=np.int64) * bu, n)
            ip = sp["readers"]["indptr"]
            vals = np.array([int(ip.read(int(e), int(e) + 1)[0]) for e in edges], dtype=np.int64)
            nnz = np.diff(vals)
            C = sp["chunk"]
            bad = np.flatnonzero((nnz < 0) | (-(-nnz // C) * C != np.diff(sp["offsets"])))
            if vals[0] != 0 or vals[-1] != sp["total"] or len(bad):
                b = int(bad[0]) if len(bad) else (0 if vals[0] != 0 else self.info.n_blocks - 1)
                raise self._damaged(f"{split}/indptr", b, "row pointers at the block edges do not match "
                                                          "block_offsets and the split's rating count")
            self._nnz[split] = nnz
        return nnz

    def block_user_counts(self, b: int, split: str = "train") -> np.ndarray:
        """Ratings of each user of block ``b`` (reads only ``indptr``), validated like
        :meth:`read_block`."""
        first, end = self.block_range(b)
        sp = self._split(split)
        indptr = np.asarray(sp["readers"]["indptr"].read(first, end + 1), dtype=np.int64)
        self._check_indptr(split, b, indptr, sp)
        return np.diff(indptr)

    def block_digests(self, split: str = "train") -> np.ndarray | None:
        """The recorded :func:`~streamdp.storage.writer.block_digest` of every block of
        ``split`` (``(n_blocks, 16)`` uint8), or ``None`` for a store written without them."""
        return self._split(split)["digests"]

    def check_rating_range(self) -> None:
        """Refuse (:class:`ParameterError`) a rating range that no method can scale its clipping and noise to.

        An observed range of a store whose ratings are all equal (``[4, 4]``) is empty, and
        a range that is not finite as the store's float32 is damage: every method's
        ``plan`` checks it first (:meth:`streamdp.methods.base.Method.plan`), so none ends
        in a division by zero; ingest refuses to write such a store
        (:func:`streamdp.storage.ingest.check_observed_range`).
        """
        lo, hi = self.info.rating_min, self.info.rating_max
        if getattr(self, "implicit", False) and hi == lo:  # a log of single interactions: counts all 1, no scale
            return
        if not (storable_ratings(lo) and storable_ratings(hi)):
            raise ParameterError(f"{self.path}: rating range [{lo:g}, {hi:g}] is not finite as a float32 (the "
                                 f"store's ratings): re-ingest it, declaring --rating-range LO,HI")
        if not hi > lo:
            what = "observed" if self.info.rating_range_source == "observed" else "recorded"
            raise ParameterError(f"{self.path}: the {what} rating range [{lo:g}, {hi:g}] is empty (every rating is "
                                 f"{lo:g}): methods scale clipping and noise to it; re-ingest with --rating-range "
                                 f"LO,HI (the scale the ratings are on)")

    def read_ahead(self) -> None:
        """Start, in the background, what the first pass over the blocks will need (a segmented store: its segments'
        blocks merged among themselves, :meth:`SegmentedStore.read_ahead`); a plain store has nothing to start."""

    def check_chunks(self) -> None:
        """The cheap structural check run before anything is spent or written.

        Every chunk of the CSR arrays of each split and of the id and count arrays
        is present and not empty (Blosc chunks: as long as their header says);
        ``block_offsets`` and the row pointers at the block edges agree with the
        counts. Decodes only ``block_offsets``, one ``indptr`` chunk per block and
        ``item_ids``. Raises :class:`StoreError` naming the store, the array and the
        chunk; ``streamdp verify`` reads everything and recomputes the checksum.
        """
        names = [f"{s}/{a}" for s in SPLITS if self._has(s) for a in CSR_ARRAYS]
        names += ["user_ids", "item_ids"] + [a for a in ("user_counts", "item_counts") if self._has(a)]
        if "train_item_stats" in self.attrs:
            names += ["train/item_sums", "train/item_counts"]
        if self.has_times:
            names += [f"{s}/times" for s in SPLITS if self._has(s)]
        for name in names:
            self._reader(name).check()
        for s in SPLITS:
            if self._has(s):
                self.block_nnz(s)
        self.item_ids()  # item-side and small: decoded once, since every model releases them

    def _per_entity(self, name: str, n: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Entries ``start..stop`` of a per-user (``n = n_users``) or per-item array."""
        try:
            r = self._reader(name)
            if r.shape != n:
                raise self._damaged(name, None, f"has {r.shape} entries, not {n}")
            return r.read(start, n if stop is None else stop)
        except StoreError:
            if self.changed():  # arrays of a store replaced, appended to or compacted since: say so
                raise self._replaced() from None
            raise

    def user_ids(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Original user ids of dense users ``start..stop`` (``int64``, or ``object`` of ``str``: :mod:`.ids`)."""
        return as_ids(self._per_entity("user_ids", self.info.n_users, start, stop))

    def item_ids(self) -> np.ndarray:
        """Original item ids, indexed by the dense (popularity-ordered) item index (kinds as :meth:`user_ids`)."""
        return as_ids(self._per_entity("item_ids", self.info.n_items))

    def item_names(self) -> np.ndarray | None:
        """Names of the items (``ingest --item-names``; public metadata: :mod:`streamdp.storage.names`), indexed
        like :meth:`item_ids` (``""`` for an unnamed item), or ``None`` for a store without names."""
        if not self._has("item_names"):
            return None
        return np.asarray(self._per_entity("item_names", self.info.n_items), dtype=object)

    def item_counts(self) -> np.ndarray:
        """Ratings per item over train and test (the popularity order)."""
        return np.asarray(self._per_entity("item_counts", self.info.n_items), dtype=np.int64)

    def train_item_stats(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``(sums, counts)``: each item's exact sum and number of training ratings (both float64), recorded when
        the store was written (:func:`~streamdp.storage.writer.block_item_stats` added in block order), or ``None``
        for a store written before they were (no ``train_item_stats`` attribute).

        They are the owner's statistics of the raw data, never released: the non-private baselines and
        popularity chart of :mod:`streamdp.serving.evaluate` read them instead of a pass over the training split. Raises
        :class:`StoreError` when the arrays do not match the digest recorded with them (or their counts do not
        add up to the training ratings).
        """
        recorded = self.attrs.get("train_item_stats")
        if recorded is None:
            return None
        n = self.info.n_items
        sums = np.asarray(self._per_entity("train/item_sums", n), np.float64)
        counts = np.asarray(self._per_entity("train/item_counts", n), np.int64)
        if item_stats_digest(sums, counts) != recorded or int(counts.sum()) != self.info.n_ratings:
            raise self._damaged("train/item_sums", None, "the training ratings' item sums and counts do not match "
                                                         "their recorded digest (train_item_stats); run "
                                                         f"`streamdp verify {self.path}`")
        return sums, counts.astype(np.float64)

    def user_counts(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Ratings per user over train and test."""
        return np.asarray(self._per_entity("user_counts", self.info.n_users, start, stop), dtype=np.int64)

    def array(self, name: str) -> zarr.Array:
        """Any other array of the store by path (e.g. ``truth/item_factors``), after checking
        that all its chunks are present."""
        if not self._has(name):
            raise StoreError(f"{self.path}: store has no array '{name}'")
        arr = self._root[name]
        ZarrReader(arr, f"{self.path}: {name}").check()
        return arr


def _read_into(reader, start: int, stop: int, crcs: list | None, out: np.ndarray | None, dtype) -> np.ndarray:
    """``reader``'s elements ``[start, stop)`` as ``dtype`` (with ``crcs``: its chunk files' CRCs appended), read
    into ``out``'s leading elements when given (decoded there directly when the array has that dtype)."""
    have = reader.dtype if isinstance(reader, ChunkReader) else reader.arr.dtype
    direct = out is not None and np.dtype(have) == np.dtype(dtype)
    kw = {"out": out} if direct else {}
    got = reader.read(start, stop, crcs, **kw) if crcs is not None else reader.read(start, stop, **kw)
    got = np.asarray(got, dtype=dtype)
    if out is not None and not direct:
        out[:len(got)] = got
        got = out[:len(got)]
    return got


def open_store(path: str, storage_options: dict | None = None) -> RatingStore:
    """Open a rating store for reading.

    >>> import tempfile, os
    >>> from streamdp.storage.generate import generate_store
    >>> d = tempfile.mkdtemp()
    >>> s = generate_store(os.path.join(d, "s.zarr"), n_users=50, n_items=20, ratings_per_user=5, rank=2, seed=0)
    >>> s = open_store(os.path.join(d, "s.zarr"))
    >>> s.n_users, s.n_items
    (50, 20)
    >>> sum(b.nnz for b in s.blocks()) == s.n_ratings
    True
    """
    return RatingStore(path, storage_options)
