"""``streamdp compact STORE``: a segmented store's segments folded into one plain store, out of core.

The merged blocks (:class:`~streamdp.storage.segments.SegmentedStore`) are written block by block into a new
store beside the old one (:class:`~streamdp.storage.writer.StoreWriter`), which is renamed over it once complete:
a reader sees the segmented store or the compacted one, and a compaction that fails or is killed leaves the
segmented store as it was (its temporary directory is removed, or swept by the next write once its owner is
gone). The privacy-budget ledger moves into the compacted store with a record of the compaction
(:func:`streamdp.privacy.budget.carried_over`), so every release on it keeps counting.

The compacted store holds the same ratings, users, items (same indices), counts and split as the segmented one:
a method trained on either, seeded, gives the same model. It is a plain store again (format version 1, or 2 for
an implicit store), with its own checksum and item statistics; ``compacted`` records what was folded.
"""

from __future__ import annotations

import datetime as _dt

import numpy as np

from streamdp.errors import ParameterError
from streamdp.outputs import note
from streamdp.progress import progress
from streamdp.storage import remote
from streamdp.storage.schema import SPLITS
from streamdp.storage.segments import SegmentedStore, append_lock, base_attrs
from streamdp.storage.store import RatingStore, open_store
from streamdp.storage.writer import StoreWriter

#: Attributes of the base that the writer sets for the compacted store (or that described the base's write).
_WRITER_SET = ("format", "format_version", "n_users", "n_items", "n_ratings", "n_test", "block_users", "n_blocks",
               "checksum", "checksum_ids", "checksum_attrs", "generation", "created_at", "created_by",
               "train_item_stats", "seconds", "phase_end_seconds")


def compact(path: str, *, show_progress: bool | None = None, notes: bool = True) -> RatingStore:
    """Fold the segments of the store at ``path`` into one store in its place and return it opened (a store
    without segments is returned as it is, with a note)."""
    if remote.is_url(path):
        raise ParameterError(f"compact {path}: only a store on a local disk (appends are local only)")
    st = open_store(path)
    if not isinstance(st, SegmentedStore):
        if notes:
            note(f"{st.path}: no segments to compact (nothing was appended since it was written)")
        return st
    path = st.path
    with append_lock(path):
        st = open_store(path)  # under the lock: the segment list no append changes any more
        if not isinstance(st, SegmentedStore):
            return st
        n_segments = len(st.segments)
        splits = tuple(s for s in SPLITS if st.has_test or s == "train")
        bu, n_users, n_items = st.info.block_users, st.info.n_users, st.info.n_items
        base = base_attrs(st.attrs)
        attrs = {k: v for k, v in base.items() if k not in _WRITER_SET}
        attrs["compacted"] = {"n_segments": n_segments, "segments": [e["name"] for e in st.attrs["segments"]],
                              "base_created_with": base.get("created_with"),
                              "at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
        attrs["created_with"] = "compact"
        if "item_names" in attrs and n_items != st.base.info.n_items:
            attrs["item_names"] = dict(attrs["item_names"], n_appended_unnamed=n_items - st.base.info.n_items)
        times = st.has_times  # each rating's time, merged with it (the kept rating's)
        with StoreWriter(path, n_users=n_users, n_items=n_items, block_users=bu, splits=splits, force=True,
                         times=times) as w:
            uc = w.create_array("user_counts", shape=(n_users,), dtype="int64", chunks=(bu,))
            uid = w.create_array("user_ids", shape=(n_users,), dtype=str if st.user_ids(0, 1).dtype == object
                                 else "int64", chunks=(bu,))
            with progress(total=st.info.n_blocks, desc="compact", unit="block", show=show_progress) as bar:
                for b in range(st.info.n_blocks):
                    first, end = st.block_range(b)
                    for s in splits:
                        blk, t = st.read_block_times(b, s) if times else (st.read_block(b, s), None)
                        w.write_block(b, blk.indptr, blk.items, blk.ratings, split=s, times=t)
                    uc[first:end] = st.user_counts(first, end)
                    uid[first:end] = st.user_ids(first, end)
                    bar.update(1)
            w.write_array("item_ids", st.item_ids())
            w.write_array("item_counts", st.item_counts())
            names = st.item_names()
            if names is not None:
                w.write_array("item_names", np.asarray(names, dtype=object), chunks=(max(1, min(n_items, 1 << 16)),))
            if "catalogue_ids" in st.root:
                w.write_array("catalogue_ids", np.asarray(st.base.array("catalogue_ids")[...]))
            if n_items == st.base.info.n_items and "truth" in st.root:
                for name in st.root["truth"].array_keys():
                    a = st.base.array(f"truth/{name}")
                    w.write_array(f"truth/{name}", np.asarray(a[...]), chunks=a.chunks)
            w.finalize(attrs)
    out = open_store(path)
    if notes:
        note(f"{path}: {n_segments} segment(s) folded into one store ({out.n_ratings} training ratings; its "
             f"privacy-budget ledger kept)")
    return out


__all__ = ["compact"]
