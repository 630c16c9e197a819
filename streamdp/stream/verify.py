"""``streamdp verify STORE``: read a whole store back and recompute its content checksum.

The checksum is recomputed with the writer's own pieces
(:func:`~streamdp.storage.writer.block_digest` per block,
:class:`~streamdp.storage.writer.ContentHash` over the blocks, the id arrays and,
for stores written since they were covered, the attributes that give the ratings
their meaning: rating range and its source, counts, block layout, rating step;
they are listed in ``checksum_attrs``; an older store is still verified without
them, and the output notes it),
streaming user blocks as one pass of the stream engine (a bounded number of
blocks in flight, on local threads or Dask with ``--scheduler``; digests combined
in block order), so memory is a few blocks plus the item-side counts. On the way:

1. :meth:`RatingStore.check_chunks` first (every chunk file present and not
   empty, Blosc chunks as long as their header says, block edges consistent): a
   missing chunk is reported before anything is decoded;
2. every block of every split is read like :meth:`RatingStore.read_block` does
   (which refuses undecodable chunks and validates row pointers, item indices and
   rating values: finite as float32 and inside the rating range, itself finite) and
   its digest is compared with the one recorded for it in
   ``<split>/block_digests``, so the first damaged block is named (stores written
   before block digests were recorded only get the whole-store comparison);
3. ``user_counts`` and ``item_counts``, which the checksum does not cover, are
   compared with the counts of the ratings read, and so are the training items' exact
   sums and counts (``train/item_sums``, ``train/item_counts``: recomputed from the
   blocks as the writer did, bit for bit);
4. the recomputed checksum is compared with the recorded ``checksum`` attribute,
   and the store must still be the one opened (not replaced meanwhile).

Blocks whose chunk files differ from the CRC32C recorded for them
(``block_crc32c``) while their digest matches (a re-encoded copy) are counted and
noted: every ``train`` read then checks their digest, which is slower.

The first problem raises :class:`~streamdp.errors.StoreError` (one line naming
the store and the array or block; exit code 2 in the CLI).
"""

from __future__ import annotations

import time

import numpy as np

from streamdp.errors import StoreError
from streamdp.storage.schema import SPLITS, storable_ratings
from streamdp.storage.store import open_store
from streamdp.storage.writer import (ContentHash, block_digest, block_item_stats, checksum_attrs, checksum_ids,
                                     times_digest)
from streamdp.stream.engine import Engine


def verify_store(path: str, *, show_progress: bool | None = None, workers: int | None = None, scheduler=None,
                 memory_limit=None) -> dict:
    """Check every chunk, block and id of the store at ``path`` against its checksum.

    The blocks are read and hashed as one pass of the stream engine
    (:class:`~streamdp.stream.engine.Engine`: ``workers`` threads, or Dask with
    ``scheduler``, see docs/cluster.md); the digests are combined in block order,
    so the result is the same wherever the blocks ran.

    Returns a JSON-ready summary (``store, ok, checksum, n_blocks, n_ratings, n_test,
    block_digests, seconds``); raises :class:`StoreError` at the first damage.

    >>> import tempfile, os
    >>> from streamdp.storage.generate import generate_store
    >>> p = os.path.join(tempfile.mkdtemp(), "s.zarr")
    >>> _ = generate_store(p, n_users=60, n_items=20, ratings_per_user=5, rank=2, seed=0, test_fraction=0.2)
    >>> r = verify_store(p)
    >>> r["ok"], r["checksum"] == open_store(p).checksum
    (True, True)
    """
    t0 = time.perf_counter()
    st = _opened(path)
    if getattr(st, "segments", None):
        return _verify_segmented(st, t0, workers=workers, scheduler=scheduler, memory_limit=memory_limit,
                                 show_progress=show_progress)
    splits = [s for s in SPLITS if s in st.root]
    digests = {s: st.block_digests(s) for s in splits}  # (shape checked)
    h = ContentHash()
    for s in splits:
        h.add_split(s)
    item_counts, crc_mismatches, stats = _blocks_checked(st, splits, digests, h, workers=workers, scheduler=scheduler,
                                                         memory_limit=memory_limit, show_progress=show_progress)
    got, attrs = _whole_checked(st, h, item_counts, stats)
    st.check_unchanged()  # what was read is one store, the one whose checksum this reports
    return {
        "store": st.path,
        "ok": True,
        "checksum": got,
        "n_blocks": st.n_blocks,
        "n_ratings": st.n_ratings,
        "n_test": st.n_test,
        "splits": splits,
        "block_digests": all(d is not None for d in digests.values()),
        "attributes_covered": list(attrs),
        "ids_covered": list(checksum_ids(st.attrs)),
        "chunk_crc_mismatches": crc_mismatches,
        "seconds": round(time.perf_counter() - t0, 3),
    }


def _verify_segmented(st, t0, *, workers, scheduler, memory_limit, show_progress) -> dict:
    """A segmented store (``ingest --append``, :mod:`streamdp.storage.segments`): each part (the base, each
    segment) verified as a store of its own (blocks against their digests, counts, its checksum), each segment's
    ``merge/...`` arrays and new ids against the digest committed with it, the store's checksum recomputed from
    the parts', and one pass over the merged blocks against the merged per-user, per-item and per-block counts."""
    from streamdp.storage.append import merge_arrays_digest
    from streamdp.storage.segments import merged_checksum

    splits = [s for s in SPLITS if s in st.root]
    mismatches = 0
    chain = None
    for part, entry in zip(st.parts, [None] + list(st.attrs["segments"])):
        h = ContentHash()
        for s in splits:
            h.add_split(s)
        digests = {s: part.block_digests(s) for s in splits}
        # in local threads: a cluster worker opens a store by its path, where the base alone is not a store
        item_counts, mism, stats = _blocks_checked(part, splits, digests, h, workers=workers, scheduler=None,
                                                   memory_limit=memory_limit, show_progress=show_progress)
        mismatches += mism
        got, _ = _whole_checked(part, h, item_counts, stats)
        if entry is None:
            chain = got
            continue
        merge = merge_arrays_digest(part)
        if merge != entry.get("merge_digest"):
            raise StoreError(f"{part.path}: its merge arrays or new ids do not match the digest committed with the "
                             f"segment (the store is damaged)")
        chain = merged_checksum(chain, got, merge)
    if chain != st.checksum:
        raise StoreError(f"{st.path}: checksum mismatch: the parts give {chain}, the store records {st.checksum} "
                         f"(its segment list or attributes were altered)")
    n_items = st.n_items

    def check_block(_, b):
        first, end = st.block_range(b)
        per_user = np.zeros(end - first, np.int64)
        counts = np.zeros(n_items, np.int64)
        nnz = []
        for s in splits:
            blk = st.read_block(b, s)
            per_user += np.diff(blk.indptr)
            counts += np.bincount(blk.items, minlength=n_items)
            nnz.append(len(blk.items))
        if not np.array_equal(st.user_counts(first, end), per_user):
            raise StoreError(f"{st.path}: user_counts (merged): block {b} (users {first}..{end - 1}) does not match "
                             f"the ratings stored (the store is damaged)")
        if any(int(st.block_nnz(s)[b]) != n for s, n in zip(splits, nnz)):
            raise StoreError(f"{st.path}: block {b}: its merged rating counts do not match the ratings stored (the "
                             f"store is damaged)")
        return counts

    with Engine(st, workers=workers, scheduler=scheduler, memory_limit=memory_limit, state_bytes=16 * n_items) as eng:
        counts = eng.map_reduce(check_block, lambda acc, c: acc.__iadd__(c), np.zeros(n_items, np.int64),
                                split=None, extra_per_block=32 * n_items, desc="verify merged", show=show_progress)
    if not np.array_equal(st.item_counts(), counts):
        raise StoreError(f"{st.path}: item_counts (merged) do not match the ratings stored (the store is damaged)")
    st.check_unchanged()
    return {
        "store": st.path, "ok": True, "checksum": chain, "n_blocks": st.n_blocks, "n_ratings": st.n_ratings,
        "n_test": st.n_test, "splits": splits, "segments": len(st.segments), "block_digests": True,
        "attributes_covered": list(checksum_attrs(st.base.attrs)), "ids_covered": list(checksum_ids(st.base.attrs)),
        "chunk_crc_mismatches": mismatches, "seconds": round(time.perf_counter() - t0, 3),
    }


def _opened(path: str):
    """The store at ``path``, opened, with a checksum to verify, storable rating bounds and its chunk files."""
    st = open_store(path)
    if not st.checksum:
        raise StoreError(f"{st.path}: no recorded checksum to verify")
    for name in ("rating_min", "rating_max"):
        if not storable_ratings(getattr(st, name)):
            raise StoreError(f"{st.path}: {name} {getattr(st, name):g} is not finite as a float32 (the store's "
                             f"ratings): the store is damaged or was written by a streamdp that let it in; re-ingest")
    st.check_chunks()
    return st


def _blocks_checked(st, splits, digests, h, *, workers, scheduler, memory_limit, show_progress):
    """One pass of the engine over the blocks: each block against its digest and its users' counts; the digests
    added to ``h`` in block order. ``(item counts, chunk CRC mismatches, training item sums and counts)``."""
    has_uc = "user_counts" in st.root
    has_stats = "train_item_stats" in st.attrs
    has_times = st.has_times
    n_items = st.n_items

    def check_block(_, b):
        # on a worker: read both splits unchecked, compare each block's digest, count; nothing order-dependent
        first, end = st.block_range(b)
        per_user = np.zeros(end - first, np.int64)
        counts = np.zeros(n_items, np.int64)
        found, mismatches, stats = [], 0, None
        for s in splits:
            blk, crc_ok = st.read_block_unchecked(b, s)  # the digest is computed here in any case
            mismatches += crc_ok is False
            d = block_digest(b, blk.indptr, blk.items, blk.ratings)
            if digests[s] is not None and digests[s][b].tobytes() != d:
                raise StoreError(f"{st.path}: {s}: block {b} (users {first}..{end - 1}) does not match its "
                                 f"recorded digest (its ratings or {s}/block_digests were altered)")
            found.append((s, d))
            if has_times:  # each rating's time, covered by the checksum as the writer covered it
                found.append((f"{s}/times", times_digest(b, st.block_times(b, s, blk.nnz))))
            per_user += np.diff(blk.indptr)
            counts += np.bincount(blk.items, minlength=n_items)
            if s == "train" and has_stats:
                stats = block_item_stats(blk.items, blk.ratings, n_items)
        if has_uc and not np.array_equal(st.user_counts(first, end), per_user):
            raise StoreError(f"{st.path}: user_counts: block {b} (users {first}..{end - 1}) does not match "
                             f"the ratings stored (the store is damaged)")
        return found, mismatches, counts, stats

    def combine(acc, part):
        # in block order (the engine's guarantee): the content hash and item sums are the writer's, whatever ran where
        found, mismatches, counts, stats = part
        for s, d in found:
            h.add_block(s, d)
        acc[0] += counts
        acc[1] += mismatches
        if stats is not None:
            acc[2] += stats
        return acc

    with Engine(st, workers=workers, scheduler=scheduler, memory_limit=memory_limit,
                state_bytes=16 * n_items) as eng:
        return eng.map_reduce(
            check_block, combine, [np.zeros(n_items, np.int64), 0, np.zeros((2, n_items))], split=None,
            extra_per_block=32 * n_items, desc="verify", show=show_progress)


def _whole_checked(st, h, item_counts, stats):
    """The item counts, the ids and attributes into the checksum, the checksum, the training item sums (in that
    order: altered ratings are named as such). ``(the checksum computed, the attributes it covers)``."""
    if "item_counts" in st.root and not np.array_equal(st.item_counts(), item_counts):
        j = int(np.flatnonzero(st.item_counts() != item_counts)[0])
        raise StoreError(f"{st.path}: item_counts: item {j} does not match the ratings stored "
                         f"(the store is damaged)")
    for name in checksum_ids(st.attrs):
        if name == "item_ids":
            h.add_ids(name, st.item_ids())
            continue
        for a in range(0, st.n_users, st.block_users):  # user ids by block: nothing O(n_users) in memory
            h.add_ids(name, st.user_ids(a, min(a + st.block_users, st.n_users)))
    attrs = checksum_attrs(st.attrs)
    if attrs:
        h.add_attrs(st.attrs, attrs)
    got, recorded = h.hexdigest(), st.checksum
    if got != recorded:
        what = "ids or attributes (" + ", ".join(attrs) + ")" if attrs else "ids"
        what = f"rating times ({'/'.join(SPLITS)}/times), " + what if st.has_times else what
        raise StoreError(f"{st.path}: checksum mismatch: the content gives {got}, the store records {recorded} "
                         f"({what} were altered)")
    # after the checksum: altered ratings are named as such, these arrays only when they alone differ
    if "train_item_stats" in st.attrs:
        kept = np.stack(st.train_item_stats())  # (its digest checked)
        if not np.array_equal(kept, stats):
            j = int(np.flatnonzero((kept != stats).any(axis=0))[0])
            raise StoreError(f"{st.path}: train/item_sums: item {j}'s training sum or count does not match the "
                             f"ratings stored (the store is damaged)")
    return got, attrs


def format_verify(r: dict) -> str:
    """One line for :func:`verify_store`'s result (and a note for what it could not cover)."""
    segs = f", the base and {r['segments']} appended segment(s) each checked" if r.get("segments") else ""
    lines = [f"{r['store']}: OK, checksum {r['checksum']} ({r['n_ratings']:,} train + {r['n_test']:,} test "
             f"ratings in {r['n_blocks']:,} blocks{segs}, {r['seconds']:.1f}s)"]
    if not r["attributes_covered"]:
        lines.append("note: this store was written before its checksum covered its attributes (rating range, "
                     "counts): they were not verified; re-ingest it to cover them")
    if "user_ids" not in r.get("ids_covered", ["user_ids"]):
        lines.append("note: this store was generated before its checksum covered its user ids: they were not "
                     "verified; generate it again to cover them")
    if r["chunk_crc_mismatches"]:
        lines.append(f"note: the chunk files of {r['chunk_crc_mismatches']} block(s) differ from those written "
                     f"(re-encoded?) though their ratings match: every read checks those blocks' digests, "
                     f"which is slower")
    return "\n".join(lines)
