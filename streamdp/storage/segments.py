"""A store that grows by immutable segments: reading one (:class:`SegmentedStore`), the commit point, ``compact``.

The layout (format version :data:`~streamdp.storage.schema.SEGMENTED_FORMAT_VERSION`) and every decision are
in :mod:`streamdp.storage.schema` ("Segments") and docs/design-notes.md; ``ingest --append`` writes a segment
(:func:`streamdp.storage.ingest.ingest` with ``append=True``), ``streamdp compact`` folds them (:func:`compact`).

Decisions a reader must know:

* the **commit point** is the root ``zarr.json``: its ``streamdp`` attributes list the committed segments
  (``segments``) and the merged store's shape; an append or a compaction writes it to a temporary name and
  renames it over the old one (:func:`commit_attrs`), so a reader that opened the store sees the segment list
  of before or of after, never a mix; each opening reads the list once, and every read of that
  :class:`SegmentedStore` uses it;
* a segment is a complete store-shaped Zarr group under ``segments/NAME`` on the store's user blocks (global
  user and item indices at the time of its append), written beside and renamed into place before the commit;
  a segment directory not in the committed list is the leftover of an interrupted append, removed by the next
  append or compaction (under the store's append lock, :func:`append_lock`);
* a (user, item) pair rated in several parts is one rating: the latest part's, in that part's split (the
  store's pair rule, "last seen wins"; an implicit store's counts are summed, capped at ``count_cap``):
  :func:`streamdp.kernels.segments.merge_rows`; each segment records the change it makes to the merged
  per-user, per-item and per-block counts (``merge/...``), computed when it was appended;
* a read of one split reads a segment's other split only in the blocks where that split replaces a rating of
  the wanted one (:data:`SUPERSEDES`, recorded at its append), the base's other split never; small segments'
  blocks are kept in memory after their first read (:data:`CACHE_BYTES`, counted by the engine), or merged among
  themselves and kept (:meth:`SegmentedStore._premerged`; ``train`` starts that merge in the background as it
  opens the store, :meth:`SegmentedStore.read_ahead`); the base's block is read into the merged block's own arrays
  and merged in place (:meth:`SegmentedStore._read_base_into`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import threading

import numpy as np
import zarr

from streamdp.errors import StoreError
from streamdp.storage.ids import as_ids
from streamdp.storage.schema import ATTRS_KEY, SPLITS
from streamdp.storage import store as _store
from streamdp.storage.store import Block, RatingStore, StoreInfo

#: The directory of the segments inside a store.
SEGMENTS_DIR = "segments"
#: The lock file taken by an append or a compaction (one writer at a time), ``.STORE.append.lock`` beside it.
LOCK_NAME = ".append.lock"
#: The arrays each segment records besides its CSR: the change it makes to the merged store's counts.
MERGE_ARRAYS = ("merge/user_counts", "merge/item_counts", "merge/block_nnz")
#: Per split and block of a segment (``2 x n_blocks``, uint8): whether its rows of the split replace a rating of the
#: other split before it; a read of one split reads a segment's other split only there (absent: everywhere).
SUPERSEDES = "merge/supersedes"
#: The most memory a segmented store keeps its small segments' decoded blocks in, between reads (they are read
#: with every block of the store: a zarr read and a CRC each, per pass). A segment is kept whole or not at all, at
#: most 16 bytes a rating; the engine counts what a store may keep (``cache_bytes``) against --memory-limit.
CACHE_BYTES = 32 << 20
#: The most memory a segmented store keeps its segments' blocks in once merged among themselves (at most 16 bytes a
#: rating, as :data:`CACHE_BYTES`): instead of each segment's, where there are several and they fit (the store is
#: then read as the base and one merged part; ``SegmentedStore._premerged``).
PREMERGED_BYTES = 2 * CACHE_BYTES
#: The keys of the base store's own attributes that the merged store's attributes replace.
BASE_KEYS = ("n_users", "n_items", "n_ratings", "n_test", "n_blocks", "checksum", "generation", "format_version",
             "train_item_stats", "checksum_ids", "checksum_attrs")


def info_from(attrs: dict) -> StoreInfo:
    return StoreInfo(
        n_users=int(attrs["n_users"]), n_items=int(attrs["n_items"]), n_ratings=int(attrs["n_ratings"]),
        n_test=int(attrs.get("n_test", 0)), block_users=int(attrs["block_users"]), n_blocks=int(attrs["n_blocks"]),
        rating_min=float(attrs["rating_min"]), rating_max=float(attrs["rating_max"]),
        rating_range_source=str(attrs.get("rating_range_source", "observed")), checksum=str(attrs.get("checksum", "")),
        implicit=bool(attrs.get("implicit", False)))


def base_attrs(attrs: dict) -> dict:
    """The base store's own attributes (as it was before its first append) from a segmented store's."""
    out = {k: v for k, v in attrs.items() if k not in ("segments", "base")}
    for k in BASE_KEYS:
        out.pop(k, None)
    out.update(attrs["base"])
    return out


def _part(owner: RatingStore, path: str, group: zarr.Group, attrs: dict) -> RatingStore:
    """One part (the base or a segment) of a segmented store, read like a plain store; errors name ``path`` and
    a change of the store is told by its owner (the whole store)."""
    p = object.__new__(RatingStore)
    p.path = path
    p._root = group
    p.attrs = attrs
    p.info = info_from(attrs)
    p._cache, p._readers, p._members, p._nnz = {}, {}, {}, {}
    p._storage_options = owner._storage_options
    p.identity = owner.identity
    p.digest_fallbacks = 0
    p._owner = owner
    return p


def _sparse_rows(indptr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A block's row pointers as what a kept block holds: the users with rows (int32) and their counts (int32)."""
    c = np.diff(indptr)
    rows = np.flatnonzero(c)
    return rows.astype(np.int32), c[rows].astype(np.int32)


def _full_indptr(rows: np.ndarray, counts: np.ndarray, n: int) -> np.ndarray:
    """The ``n + 1`` row pointers of :func:`_sparse_rows`' ``(rows, counts)``."""
    ip = np.zeros(n + 1, np.int64)
    ip[rows.astype(np.int64) + 1] = counts
    np.cumsum(ip, out=ip)
    return ip


def become_segmented(st: RatingStore) -> None:
    """Turn the opened ``st`` (whose attributes list segments) into a :class:`SegmentedStore`: its parts are
    opened from the segment list read once, here."""
    st.__class__ = SegmentedStore
    attrs = st.attrs
    st.base = _part(st, st.path, st._root, base_attrs(attrs))
    st.segments = []
    for entry in attrs["segments"]:
        name = entry["name"]
        where = f"{SEGMENTS_DIR}/{name}"
        label = f"{st.path.rstrip('/')}/{where}"
        try:
            g = st._root[where]
        except (KeyError, ValueError, OSError):
            g = None
        seg_attrs = dict(g.attrs).get(ATTRS_KEY) if isinstance(g, zarr.Group) else None
        if not isinstance(seg_attrs, dict):
            raise StoreError(f"{label}: segment listed in the store but missing or unreadable (the store is damaged)")
        if seg_attrs.get("checksum") != entry.get("checksum"):
            raise StoreError(f"{label}: segment's checksum is not the one committed (the store is damaged)")
        st.segments.append(_part(st, label, g, seg_attrs))
    st.parts = [st.base] + st.segments
    plan_kept_blocks(st)


def plan_kept_blocks(st: SegmentedStore) -> None:
    """What ``st`` keeps of its segments' blocks in memory, decided from its own ``segments``: its caches emptied,
    then :attr:`_premerge` (the segments' rows merged among themselves, kept whole) or :attr:`_keeps` (the small
    segments kept as read), within :data:`CACHE_BYTES`. Called again for a view of fewer segments (the store as of
    an earlier append, :mod:`streamdp.storage.timeline`): the whole store's choice and kept blocks are not its own
    (a base alone has nothing to premerge, and a block premerged over every segment would put later ratings into
    an earlier store)."""
    st._flags, st._kept = {}, {}
    st._ahead = None  # the thread merging the segments' blocks ahead of the first pass (SegmentedStore.read_ahead)
    st._keeps, room = set(), CACHE_BYTES
    need = [16 * (seg.info.n_ratings + seg.info.n_test) + 2048 * seg.info.n_blocks for seg in st.segments]
    #: whether a checked read merges the base with the segments' rows merged among themselves (:meth:`_premerged`)
    st._premerge = len(st.segments) > 1 and not st.info.implicit and sum(need) <= PREMERGED_BYTES
    #: one lock per block: a block's segments are merged among themselves once, by whichever thread comes first
    st._merging = [threading.Lock() for _ in range(st.info.n_blocks)] if st._premerge else []
    if st._premerge:
        room -= sum(need)
    else:
        for i, n in enumerate(need, 1):
            if n <= room:
                st._keeps.add(i)
                room -= n
    #: the most bytes the store keeps its small segments' blocks in (:data:`CACHE_BYTES`, :data:`PREMERGED_BYTES`)
    st.cache_bytes = CACHE_BYTES - room


def items_sources(parts: list, b: int, n: int, splits) -> list:
    """Block ``b`` of each of ``parts`` (a store's base and segments, in order) without its ratings, for
    :func:`count_delta`: per part and split (of ``splits``, in that order) ``(part, split index, indptr, items)``,
    the row pointers padded to the merged block's ``n`` users (a part's last block may hold fewer; a part without
    the block, or without the split, has none of its rows)."""
    out = []
    for i, p in enumerate(parts):
        for s in splits:
            if b < p.info.n_blocks and p._has(s):
                blk = p.read_block_items(b, s)
                ip = blk.indptr
                if len(ip) - 1 < n:
                    ip = np.concatenate([ip, np.full(n - (len(ip) - 1), ip[-1], np.int64)])
                out.append((i, SPLITS.index(s), ip, blk.items))
            else:
                out.append((i, SPLITS.index(s), np.zeros(n + 1, np.int64), np.empty(0, np.int32)))
    return out


def count_delta(src: list, n: int, last: int, n_items: int, item_delta: np.ndarray) -> tuple:
    """What part ``last`` (an append's new segment, the last of ``src``'s parts) changes in a block's merged counts,
    from its parts' rows (:func:`items_sources`, the new part's appended alike) and no merge
    (:func:`~streamdp.kernels.segments.append_delta`): ``(per user of the block's ``n``, per split, whether its
    rows of each split replace a rating of the other)``; the per-item change is added into ``item_delta``."""
    from streamdp.kernels.segments import append_delta

    indptrs = np.stack([x[2] for x in src]).astype(np.int64, copy=False)
    sizes = np.array([len(x[3]) for x in src], np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    du, splits, replaces = np.zeros(n, np.int64), np.zeros(2, np.int64), np.zeros(2, np.uint8)
    append_delta(n, indptrs, starts, np.concatenate([x[3] for x in src[1:]] or [np.empty(0, np.int32)]),
                 np.array([x[0] for x in src], np.int64), np.array([x[1] for x in src], np.int64),
                 last, n_items, du, item_delta, splits, replaces, src[0][3])
    return du, splits, replaces


class SegmentedStore(RatingStore):
    """A store with committed segments: every read merges the base's and the segments' rows block by block.

    Opened by :class:`~streamdp.storage.store.RatingStore` itself (``open_store``) when the root attributes list
    segments; ``base`` and ``segments`` are its parts, each read (and checked: chunk CRCs, digests, values)
    like a plain store.
    """

    base: RatingStore
    segments: list
    parts: list

    # -- blocks ---------------------------------------------------------------------------
    def _sources(self, b: int, read, times: bool = False, want: str | None = None, keep: bool = False,
                 skip: int = 0, base_want: bool = True) -> list:
        """For each part and split, block ``b``'s rows padded to the merged block's users: ``(part, split index,
        indptr, items, ratings, crc_ok)``, and with ``times`` the ratings' times seventh; in part order, the base's
        ``want`` split first (the merge reads it in place). ``want``: only the sources a merge of that split
        needs (:meth:`_needed`); all by default. ``keep``: small segments' blocks from memory (:meth:`_kept_read`;
        ``read`` is then the checked read). ``skip``: the first ``skip`` parts left out (:meth:`parts_before`).
        ``base_want=False``: the base's ``want`` split left out (:meth:`_read_base_into` reads it after)."""
        first, end = self.block_range(b)
        n = end - first
        out = []
        splits = [s for s in SPLITS if self.base._has(s)]  # every part has the store's splits
        if want is not None:
            splits.sort(key=lambda s: s != want)
        for i, p in enumerate(self.parts):
            if i < skip:
                continue
            for s in splits:
                if want is not None and not self._needed(i, b, s, want) or (i == 0 and s == want and not base_want):
                    continue
                if b < p.info.n_blocks and p._has(s):
                    blk, ok = self._kept_read(i, b, s, read) if keep and i in self._keeps else read(p, b, s)
                    ip = blk.indptr
                    if len(ip) - 1 < n:
                        ip = np.concatenate([ip, np.full(n - (len(ip) - 1), ip[-1], np.int64)])
                    t = (p.block_times(b, s, blk.nnz),) if times else ()
                    out.append((i, SPLITS.index(s), ip, blk.items, blk.ratings, ok) + t)
                else:
                    out.append((i, SPLITS.index(s), np.zeros(n + 1, np.int64), np.empty(0, np.int32),
                                np.empty(0, np.float32), True) + ((np.empty(0, np.int64),) if times else ()))
        return out

    def _kept_read(self, i: int, b: int, s: str, read) -> tuple[Block, bool]:
        """Part ``i``'s block ``b`` of split ``s``, read (checked) once and then kept: users with rows and their
        counts, items and ratings (a small segment's block holds few users of the block)."""
        got = self._kept.get((i, b, s))
        p = self.parts[i]
        if got is None:
            blk, ok = read(p, b, s)
            self._kept[(i, b, s)] = (len(blk.indptr) - 1, *_sparse_rows(blk.indptr), blk.items, blk.ratings)
            return blk, ok
        n, rows, counts, items, ratings = got
        return Block(p.block_range(b)[0], _full_indptr(rows, counts, n), items, ratings), True

    def _premerged(self, b: int, read) -> list:
        """Every segment's rows of block ``b`` merged among themselves, once, then kept: a source per split (as
        :meth:`_sources` gives them, all of part 1), each pair once, of its latest segment and in that segment's
        split. A read then merges the base with these two instead of with every segment's two: on an 11-part
        store the per-user walk of 12 sources and the rebuilding of each kept segment's rows, every pass, were half
        a segmented pass's extra time. Only where the segments fit in :data:`PREMERGED_BYTES` and the store is
        explicit (:attr:`_premerge`): a pair's rating is then its latest part's whichever way the parts are
        grouped, so the merged block is the same bit for bit (an implicit store sums a pair's values, whose
        rounding depends on the order they are added in)."""
        first, end = self.block_range(b)
        got = self._kept.get(("merged", b))
        if got is None:
            with self._merging[b]:  # the read-ahead's thread may be merging it (read_ahead)
                got = self._kept.get(("merged", b))
                if got is None:
                    src = self._sources(b, read, skip=1)
                    got = []
                    for s in (s for s in SPLITS if self.base._has(s)):
                        blk = self._merge(b, src, s)[0]
                        got.append((SPLITS.index(s), *_sparse_rows(blk.indptr), blk.items.copy(),
                                    blk.ratings.copy()))
                    self._kept[("merged", b)] = got
        return [(1, s, _full_indptr(rows, counts, end - first), items, ratings, True)
                for s, rows, counts, items, ratings in got]

    def read_ahead(self) -> None:
        """Merge the segments' blocks among themselves (:meth:`_premerged`) in a background thread, in block order,
        while the run does what comes before its first pass; that pass then finds them merged (on the 11-part 91M
        store of ``bench/append.py``, the merge was half of the first pass's 0.36 s over its compacted twin's).

        Only where a read keeps them (:attr:`_premerge`); started once. A block the thread has not reached is merged
        by the reader that needs it, under the same lock; an error (a damaged chunk) stops the thread, and the
        reader's own read of the block raises it as it would have."""
        if not self._premerge or self._ahead is not None:
            return

        def run():
            for b in range(self.info.n_blocks):
                try:
                    self._premerged(b, _checked)
                except Exception:  # noqa: BLE001 - raised again by the reader's own read of the block
                    return

        self._ahead = threading.Thread(target=run, name="streamdp-read-ahead", daemon=True)
        self._ahead.start()

    def _needed(self, part: int, b: int, split: str, want: str) -> bool:
        """Whether a merge of split ``want`` of block ``b`` needs ``part``'s rows of ``split``: its own split's, and
        the other's only where they replace an earlier rating of the pair in ``want`` (a later rating in the other
        split takes the pair out of ``want``), as the segment recorded when it was appended (``merge/supersedes``;
        a segment without the record: always). The base's other split never: nothing precedes it. An implicit
        store sums a pair over every part: all needed. A user's rows are then sorted by item when they come from
        several of the parts read (what ingest writes, so the same rows as a merge of every source)."""
        if split == want or self.info.implicit:
            return True
        if part == 0:
            return False
        flags = self._supersedes(part)
        return flags is None or (b < flags.shape[1] and bool(flags[SPLITS.index(split), b]))

    def _supersedes(self, part: int) -> np.ndarray | None:
        """Segment ``part``'s ``merge/supersedes`` as ``(2, its n_blocks)`` booleans, None if it has none."""
        got = self._flags.get(part, False)
        if got is False:
            seg = self.parts[part]
            nb = seg.info.n_blocks
            got = None
            if seg._has(SUPERSEDES):
                got = np.asarray(seg._per_entity(SUPERSEDES, 2 * nb), np.uint8).reshape(2, nb).astype(bool)
            self._flags[part] = got
        return got

    def _merged(self, b: int, split: str, read, keep: bool = False, given=None) -> tuple[Block, bool | None]:
        """Block ``b`` of ``split`` merged, and whether every part's CRC matched: the segments' sources read first,
        then the base's block into the merged block's own arrays (:meth:`_read_base_into`; ``given``: as
        :meth:`read_block`'s ``into``), merged in place."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
        if not self.base._has(split):
            raise StoreError(f"{self.path}: store has no '{split}' split")
        src = self._premerged(b, read) if keep and self._premerge else None
        if b >= self.base.info.n_blocks:  # a block of appended users only: nothing of the base to read in place
            return self._merge(b, src if src else self._sources(b, read, want=split, keep=keep), split)
        if src is None:
            src = self._sources(b, read, want=split, keep=keep, base_want=False)
        base, buffers = self._read_base_into(b, split, read, src, given)
        return self._merge(b, [base] + src, split, inplace=buffers)

    def read_into_size(self, split: str = "train") -> int:
        """A length of arrays that a read of any block of ``split`` fits into (:meth:`read_block`'s ``into``): the
        base's rows of the block, every segment's rows of it in both splits (what the merge may read into the
        arrays' gap) and the longest row a user can have (the store's items)."""
        size = np.zeros(self.info.n_blocks, np.int64)
        base = self.base.block_nnz(split)
        size[:len(base)] += base
        for seg in self.segments:
            for s in SPLITS:
                if seg._has(s):
                    d = seg.block_nnz(s)
                    size[:len(d)] += d
        return int(size.max()) + self.info.n_items if len(size) else 0

    def _read_base_into(self, b: int, split: str, read, others: list, given=None) -> tuple[tuple, tuple]:
        """The base's source of block ``b`` of ``split`` (as :meth:`_sources` gives it), read into the end of
        arrays the merge then writes its output into from their start: ``(source, (items, ratings, gap))``, the
        base's rows at ``gap`` on. ``gap`` is the rows of the ``others`` sources plus the block's longest row of
        the base, so that no write of the merge reaches a base row not yet read: the merged rows before a user's
        are at most the base's and the others' rows before hers, and hers at most her own (the kernel's
        ``_merge_sorting`` reads a user's rows in any order). No other source: no gap, nothing to merge.
        Against a merge into new arrays it saves their allocation (page faults on every block: about 3 ms a
        block of 0.9M ratings) and holds the block once, not twice."""
        n = int(sum(len(x[3]) for x in others))
        held = []

        def into(indptr: np.ndarray):
            counts = np.diff(indptr)
            gap = n + (int(counts.max()) if len(counts) else 0) if n else 0
            nnz = int(indptr[-1])
            arrays = given(indptr) if given is not None else None
            if arrays is not None and min(len(arrays[0]), len(arrays[1])) >= gap + nnz:  # the caller's, reused
                bufs = (arrays[0], arrays[1], gap)
            else:
                bufs = (np.empty(gap + nnz, np.int32), np.empty(gap + nnz, np.float32), gap)
            held.append(bufs)
            return bufs[0][gap:], bufs[1][gap:]

        blk, ok = read(self.base, b, split, into)
        first, end = self.block_range(b)
        ip = blk.indptr
        if len(ip) - 1 < end - first:
            ip = np.concatenate([ip, np.full(end - first - (len(ip) - 1), ip[-1], np.int64)])
        return (0, SPLITS.index(split), ip, blk.items, blk.ratings, ok), held[0]

    def read_block_times(self, b: int, split: str = "train", since: int | None = None) -> tuple[Block, np.ndarray]:
        """:meth:`read_block` and the merged ratings' times (each kept rating's, from the part it was kept from).

        ``since``: the caller drops every rating made before it (a time window): the leading parts whose ratings
        are all older are not read (:meth:`parts_before`; the merged rows from ``since`` on are the same)."""
        if not self.has_times:
            raise StoreError(f"{self.path}: the store keeps no rating times (its input had no timestamp column)")
        if not self.base._has(split):
            raise StoreError(f"{self.path}: store has no '{split}' split")
        src = self._sources(b, lambda p, bb, s: (p.read_block(bb, s), True), times=True, want=split,
                            skip=self.parts_before(since))
        return self._merge(b, src, split, times=True)

    def parts_before(self, since: int | None) -> int:
        """How many leading parts hold only ratings made before ``since`` (at most all but the last part).

        Leaving them out of a merge changes no merged rating made from ``since`` on: a pair's kept rating is its
        latest part's, so a rating kept from a later part is kept whatever came before it, and a pair whose latest
        part is left out had its kept rating, and all others, before ``since``. The base's own span is recorded by
        the first append (``base_times``); a store appended to before that records none, and nothing is skipped."""
        if since is None:
            return 0
        spans = [self.attrs.get("base_times")] + [seg.attrs.get("times") for seg in self.segments]
        k = 0
        while k < len(self.parts) - 1 and isinstance(spans[k], dict) and spans[k].get("max") is not None \
                and int(spans[k]["max"]) < int(since):
            k += 1
        return k

    def _merge(self, b: int, src: list, split: str, times: bool = False, inplace: tuple | None = None):
        """The kernel's merge of ``src`` (:meth:`_sources`) for ``split``, and whether every part's CRC matched
        (with ``times``: the merged block and its ratings' times instead). The first source (the base's) is read
        in place; the outputs are sized by the sources of ``split`` (a merge keeps at most those rows) and
        returned as views, not copied. ``inplace``: the arrays the base's source was read into
        (:meth:`_read_base_into`), written with the output."""
        first, end = self.block_range(b)
        n = end - first
        want = SPLITS.index(split)
        src = sorted(src, key=lambda x: (x[0], x[1] != want))  # by part: the latest part last, its k largest
        oks = [s[5] for s in src]
        ok = False if any(o is False for o in oks) else (True if all(o is True for o in oks) else None)
        if inplace is not None and len(src) == 1:  # the base's rows alone: the merge would copy them as they are
            return Block(first, src[0][2], src[0][3], src[0][4]), ok
        indptrs = np.stack([s[2] for s in src]).astype(np.int64, copy=False)
        sizes = np.array([len(s[3]) for s in src], np.int64)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        items0, ratings0 = (np.ascontiguousarray(src[0][3], np.int32), np.ascontiguousarray(src[0][4], np.float32))
        rest = src[1:]
        items = np.concatenate([s[3] for s in rest] or [np.empty(0, np.int32)]).astype(np.int32, copy=False)
        ratings = np.concatenate([s[4] for s in rest] or [np.empty(0, np.float32)]).astype(np.float32, copy=False)
        split_of = np.array([s[1] for s in src], np.int64)
        part_of = np.array([s[0] for s in src], np.int64)
        from streamdp.kernels.segments import merge_rows  # numba: on first read, not at import (streamdp stays light)

        cap = self.attrs.get("count_cap") if self.info.implicit else None
        room = int(sizes[split_of == want].sum())
        out_ip = np.empty(n + 1, np.int64)
        if inplace is not None:
            out_items, out_ratings = inplace[0], inplace[1]
        else:
            out_items, out_ratings = np.empty(room, np.int32), np.empty(room, np.float32)
        out_src = np.empty(room if times else 0, np.int64)
        nnz = merge_rows(n, indptrs, starts, items, ratings, part_of, split_of, want, self.info.implicit,
                         float(cap or 0.0), out_ip, out_items, out_ratings, out_src, items0, ratings0)
        if times:
            ts = np.concatenate([s[6] for s in src]).astype(np.int64)
            return Block(first, out_ip, out_items[:nnz], out_ratings[:nnz]), ts[out_src[:nnz]]
        return Block(first, out_ip, out_items[:nnz], out_ratings[:nnz]), ok

    def read_block(self, b: int, split: str = "train", into=None) -> Block:
        """Block ``b`` of ``split`` merged over the parts, each part's block read and checked by
        :meth:`RatingStore.read_block` (a change of the store since it was opened is said as such); a small
        segment's blocks once, then from memory (:data:`CACHE_BYTES`). ``into``: as :meth:`RatingStore.read_block`'s
        (the merged block is written into the arrays it returns when they are at least :meth:`read_into_size` long,
        into arrays of its own otherwise)."""
        return self._merged(b, split, _checked, keep=True, given=into)[0]

    def read_block_unchecked(self, b: int, split: str = "train"):
        return self._merged(b, split, _unchecked)

    def read_block_items(self, b: int, split: str = "train") -> Block:
        """:meth:`read_block` without the ratings (each part's read whole: a merge needs them)."""
        return self.read_block(b, split)._replace(ratings=np.empty(0, np.float32))

    def block_nnz(self, split: str = "train") -> np.ndarray:
        nnz = self._nnz.get(split)
        if nnz is None:
            nb = self.info.n_blocks
            nnz = np.zeros(nb, np.int64)
            base = self.base.block_nnz(split)
            nnz[:len(base)] += base
            k = SPLITS.index(split)
            for seg in self.segments:
                d = np.asarray(seg._per_entity("merge/block_nnz", 2 * seg.info.n_blocks), np.int64)
                d = d.reshape(2, seg.info.n_blocks)[k]
                nnz[:len(d)] += d
            total = self.info.n_ratings if split == "train" else self.info.n_test
            if (nnz < 0).any() or int(nnz.sum()) != total:
                raise self._damaged(f"{SEGMENTS_DIR}/*/merge/block_nnz", None,
                                    "the merged block counts do not add up to the split's rating count")
            self._nnz[split] = nnz
        return nnz

    def block_user_counts(self, b: int, split: str = "train") -> np.ndarray:
        """Ratings of each user of block ``b`` in ``split``: of a store with one split, the merged per-user counts
        (:meth:`user_counts`, recorded by each append: no block merged); else from the merged block."""
        if split in SPLITS and self.base._has(split) and not any(self.base._has(o) for o in SPLITS if o != split):
            return self.user_counts(*self.block_range(b))
        return np.diff(self.read_block(b, split).indptr)

    def block_digests(self, split: str = "train"):
        """None: a merged block has no recorded digest (each part's block is checked by its own when read)."""
        return None

    # -- per user and per item ------------------------------------------------------------------
    def _summed(self, base_name: str, delta_name: str, n: int, start: int, stop: int | None) -> np.ndarray:
        stop = n if stop is None else min(stop, n)
        out = np.zeros(max(stop - start, 0), np.int64)
        for p, name in [(self.base, base_name)] + [(s, delta_name) for s in self.segments]:
            pn = p.info.n_users if "user" in base_name else p.info.n_items
            a, z = start, min(stop, pn)
            if z > a:
                out[:z - a] += np.asarray(p._per_entity(name, pn, a, z), np.int64)
        return out

    def user_counts(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        return self._summed("user_counts", "merge/user_counts", self.info.n_users, start, stop)

    def item_counts(self) -> np.ndarray:
        return self._summed("item_counts", "merge/item_counts", self.info.n_items, 0, None)

    def _ids(self, kind: str, start: int, stop: int | None) -> np.ndarray:
        n = self.info.n_users if kind == "user" else self.info.n_items
        stop = n if stop is None else min(stop, n)
        pieces, lo = [], 0
        for p in self.parts:
            if p is self.base:
                hi = p.info.n_users if kind == "user" else p.info.n_items
                name = f"{kind}_ids"
            else:
                e = p.attrs["appended"]
                hi = lo + int(e[f"n_new_{kind}s"])
                name = f"new_{kind}_ids"
            a, z = max(start, lo), min(stop, hi)
            if z > a:
                pieces.append(as_ids(p._per_entity(name, hi - lo, a - lo, z - lo)))
            lo = hi
        if lo != n:
            raise self._damaged(f"{kind}_ids", None, f"the parts hold {lo} {kind} ids, not {n}")
        if not pieces:
            return as_ids(self.base._per_entity(f"{kind}_ids", self.base.info.n_users if kind == "user"
                                                else self.base.info.n_items, 0, 0))
        if any(x.dtype == object for x in pieces):
            return np.concatenate([x.astype(object) for x in pieces])
        return np.concatenate(pieces)

    def user_ids(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        return self._ids("user", start, stop)

    def item_ids(self) -> np.ndarray:
        return self._ids("item", 0, None)

    def item_names(self) -> np.ndarray | None:
        """The base's item names, ``""`` for the items appended after it (an append takes no names)."""
        names = self.base.item_names()
        if names is None:
            return None
        return np.concatenate([names, np.full(self.info.n_items - len(names), "", dtype=object)])

    def train_item_stats(self):
        """None: a segmented store records no merged item statistics; whoever needs them computes them in one
        pass over the merged training blocks, in block order (the same bits as a compacted store's)."""
        return None

    def check_chunks(self) -> None:
        """:meth:`RatingStore.check_chunks` of the base, and of each segment its CSR, id and merge arrays."""
        self.base.check_chunks()
        for seg in self.segments:
            names = [f"{s}/{a}" for s in SPLITS if seg._has(s)
                     for a in ("indptr", "items", "ratings", "block_offsets") + (("times",) if seg.has_times else ())]
            names += ["new_user_ids", "new_item_ids", *MERGE_ARRAYS] + ([SUPERSEDES] if seg._has(SUPERSEDES) else [])
            for name in names:
                seg._reader(name).check()
            for s in SPLITS:
                if seg._has(s):
                    seg.block_nnz(s)
        for s in SPLITS:
            if self.base._has(s):
                self.block_nnz(s)
        self.item_ids()

    def array(self, name: str):
        if name.startswith("truth/") and self.info.n_items != self.base.info.n_items:
            raise StoreError(f"{self.path}: {name} describes the generated items only, and items were appended "
                             f"since")
        return self.base.array(name)


_store._become_segmented = become_segmented


def _checked(p: RatingStore, b: int, split: str, into=None) -> tuple[Block, bool]:
    """A part's checked read of block ``b`` (``into``: :meth:`RatingStore.read_block`'s, given only when set)."""
    return (p.read_block(b, split) if into is None else p.read_block(b, split, into=into)), True


def _unchecked(p: RatingStore, b: int, split: str, into=None) -> tuple[Block, bool | None]:
    return p.read_block_unchecked(b, split) if into is None else p.read_block_unchecked(b, split, into=into)


# -- the commit point -------------------------------------------------------------------------------
def read_root_json(path: str) -> dict:
    with open(os.path.join(path, "zarr.json")) as fh:
        return json.load(fh)


def commit_attrs(path: str, attrs: dict, *, expect_generation: str | None) -> None:
    """Replace the root ``zarr.json``'s ``streamdp`` attributes atomically: written beside, flushed, renamed over
    it (the commit point of an append). ``expect_generation``: the write of the store the new attributes were
    made from; another one there now (the store replaced by ``ingest --force``, which takes no append lock) is
    refused with nothing changed."""
    doc = read_root_json(path)
    now = (doc.get("attributes") or {}).get(ATTRS_KEY) or {}
    if now.get("generation") != expect_generation:
        raise StoreError(f"{path}: the store was replaced while this append wrote its segment; nothing was appended, "
                         f"run again")
    doc.setdefault("attributes", {})[ATTRS_KEY] = attrs
    tmp = os.path.join(path, f".zarr.json.{secrets.token_hex(6)}")
    try:
        with open(tmp, "w") as fh:
            json.dump(doc, fh, indent=2)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, os.path.join(path, "zarr.json"))
    finally:
        if os.path.lexists(tmp):
            os.remove(tmp)
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


@contextlib.contextmanager
def append_lock(path: str):
    """The store's writer lock (an append or a compaction at a time; a second one is refused, not queued)."""
    import fcntl

    parent, name = os.path.split(os.path.abspath(path).rstrip(os.sep))
    lock = os.path.join(parent, f".{name}{LOCK_NAME}")  # beside the store: a compaction renames the store
    fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise StoreError(f"{path}: another append or compaction is writing this store; run again when it "
                             f"has finished") from None
        yield
    finally:
        os.close(fd)


def sweep_uncommitted(path: str, committed) -> list[str]:
    """Remove segment directories that no committed segment list names (an interrupted append's), under the
    lock, and the temporary directories of segment writers whose process is gone (owner record)."""
    import shutil

    from streamdp.outputs import remove_dead_owned_dirs

    d = os.path.join(path, SEGMENTS_DIR)
    if not os.path.isdir(d):
        return []
    keep = set(committed)
    removed = remove_dead_owned_dirs(d, lambda name, _: name.startswith("."))
    for name in sorted(os.listdir(d)):
        full = os.path.join(d, name)
        if name.startswith(".") or name in keep or not os.path.isdir(full) or os.path.islink(full):
            continue
        shutil.rmtree(full, ignore_errors=True)
        removed.append(full)
    return removed


def merged_checksum(previous: str, segment_checksum: str, merge_digest: str) -> str:
    """The checksum of a store after an append: its previous checksum, the segment's and its merge arrays'."""
    h = hashlib.blake2b(digest_size=16)
    for x in (previous, segment_checksum, merge_digest):
        h.update(str(x).encode())
        h.update(b"\x1f")
    return "blake2b:" + h.hexdigest()


__all__ = ["SegmentedStore", "append_lock", "base_attrs", "commit_attrs", "merged_checksum", "sweep_uncommitted"]
