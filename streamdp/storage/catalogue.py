"""A store seen through an item catalogue: :class:`CatalogueView`, and catalogue files (:func:`read_catalogue`).

A model's items are its catalogue, never the store's items as read off the data
(:mod:`streamdp.privacy.catalogue` declares or selects it). The view makes a store look as
if its items were the catalogue's: ratings of items outside it are dropped from every block,
catalogue items no rating names get an index with no ratings, and ``n_items``, ``item_ids``
and every per-item array follow the catalogue. Methods, the evaluator and the lists read it
like any store, so none of them needs to know about catalogues.

Public names: :class:`CatalogueView`, :func:`catalogue_view`, :func:`read_catalogue`,
:func:`catalogue_digest`.

The view's items are ordered like the store's (the store's items in the catalogue, in
the store's order, then the catalogue's items no rating names, in the catalogue's order):
the internal order never leaves the process (models are saved in ascending id order).
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import replace

import numpy as np

from streamdp.errors import InputError, ParameterError, StoreError
from streamdp.kernels.csr import masked_indptr
from streamdp.storage.ids import as_ids, find, parse_id
from streamdp.storage.store import Block, RatingStore
from streamdp.storage.view import StoreView

__all__ = ["CatalogueView", "catalogue_view", "catalogue_digest", "catalogue_ids", "read_catalogue", "store_catalogue"]


def catalogue_digest(ids) -> str:
    """A digest of a catalogue's ids (sorted): what a checkpoint's fingerprint covers. Not a digest of ratings."""
    ids = as_ids(ids)
    h = hashlib.blake2b(digest_size=16)
    for x in np.sort(ids):
        h.update(str(x).encode() + b"\0")
    return h.hexdigest()


class CatalogueView(StoreView):
    """``store`` with ``ids`` as its items (see the module docstring).

    ``ids`` must be of the store's id kind (integers or strings). Blocks are read from the
    store and filtered here (vectorised: one gather and one cumulative sum per block); a
    catalogue view of a catalogue view reads the store beneath both.
    """

    recounts = True  # ratings of items outside the catalogue leave the rows

    def __init__(self, store: RatingStore, ids):  # noqa: D107 - a view of an opened store
        base = store._catalogue_base if isinstance(store, CatalogueView) else store
        super().__init__(base)
        ids = as_ids(ids)
        if len(np.unique(ids)) != len(ids):
            raise ParameterError("catalogue: an item id appears twice")
        store_ids = as_ids(base.item_ids())
        if len(ids) and len(store_ids) and ids.dtype.kind != store_ids.dtype.kind:
            what = "strings" if store_ids.dtype.kind in "OUS" else "integers"
            raise ParameterError(f"catalogue: the store's item ids are {what}; the catalogue's are not")
        pos = find(store_ids, ids) if len(store_ids) else np.full(len(ids), -1)  # catalogue id -> store index
        present = np.sort(pos[pos >= 0])
        absent = ids[pos < 0]
        col_map = np.full(len(store_ids), -1, np.int32)
        col_map[present] = np.arange(len(present), dtype=np.int32)
        self._catalogue_base = base  # the store without its catalogue (serving reads it)
        self._col_map = col_map
        self._present = present  # view index -> store index, for the first len(present) view items
        self._cat_ids = np.concatenate([store_ids[present], absent]) if len(absent) else store_ids[present]
        self.catalogue_digest = catalogue_digest(ids)
        self.info = replace(base.info, n_items=len(ids))

    def _filter(self, blk: Block, split: str) -> Block:
        mapped = self._col_map[blk.items]
        keep = mapped >= 0
        if keep.all():
            return Block(blk.first_user, blk.indptr, mapped.astype(np.int32), blk.ratings)
        ip = np.empty(len(blk.indptr), np.int64)
        masked_indptr(np.asarray(blk.indptr, np.int64), keep, ip)  # no int64 per rating
        return Block(blk.first_user, ip, mapped[keep].astype(np.int32), blk.ratings[keep])

    # -- per-item arrays: the catalogue's ------------------------------------------------
    def _per_item(self, values: np.ndarray, fill=0) -> np.ndarray:
        out = np.full(self.info.n_items, fill, dtype=values.dtype)
        out[:len(self._present)] = values[self._present]
        return out

    def item_ids(self) -> np.ndarray:
        return self._cat_ids.copy()

    def item_names(self) -> np.ndarray | None:
        names = self._inner.item_names()
        return None if names is None else self._per_item(np.asarray(names, dtype=object), "")

    def item_counts(self) -> np.ndarray:
        return self._per_item(self._inner.item_counts())

    def train_item_stats(self):
        stats = self._inner.train_item_stats()
        if stats is None:
            return None
        return self._per_item(stats[0]), self._per_item(stats[1])

    def _spec_args(self) -> tuple:
        return (self._cat_ids,)

    def _spec_key(self):
        return catalogue_digest(self._cat_ids)


def catalogue_view(store: RatingStore, ids) -> RatingStore:
    """``store`` seen through the catalogue ``ids``; the store itself when its items are exactly ``ids``."""
    ids = as_ids(ids)
    if not isinstance(store, CatalogueView):
        own = as_ids(store.item_ids())
        if len(own) == len(ids) and own.dtype.kind == ids.dtype.kind and np.array_equal(np.sort(own), np.sort(ids)):
            return store
    return CatalogueView(store, ids)


def read_catalogue(path: str, *, numeric: bool, flag: str = "--items") -> np.ndarray:
    """The item ids in the catalogue file ``path``, one per line.

    Integer ids (``numeric``): the first field of each line, fields separated by ``|``, tab, ``,`` or ``;`` (so
    MovieLens' ``u.item`` is its own catalogue, whatever the encoding of its titles); blank lines and ``#`` comments
    are skipped, and so is a first line that is not an integer: a header. String ids: each line is one id exactly
    as written (UTF-8; only the line break is taken off, since an id may hold commas, quotes or spaces); blank
    lines are skipped.

    Refused with one line naming the file and line: an unreadable or empty file, an id of the wrong kind, an id
    twice.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "items.txt")
    >>> _ = open(p, "w").write("item\\n10\\n7|Some title|1995\\n\\n# retired: 3\\n")
    >>> read_catalogue(p, numeric=True).tolist()
    [10, 7]
    """
    try:
        with open(path, "rb") as fh:
            lines = fh.read().split(b"\n")
    except OSError as exc:
        raise InputError(f"{flag} {path}: cannot be read ({exc.strerror or exc})") from None
    ids, seen, header = [], {}, False
    for no, raw in enumerate(lines, 1):
        raw = raw[:-1] if raw.endswith(b"\r") else raw
        field = re.split(rb"[|\t,;]", raw, maxsplit=1)[0].strip() if numeric else raw
        if not field.strip() or (numeric and field.startswith(b"#")):
            continue
        try:
            text = field.decode("utf-8-sig" if no == 1 else "utf-8")
        except UnicodeDecodeError:
            raise InputError(f"{path}:{no}: the item id is not UTF-8 text") from None
        if numeric:
            try:
                value = int(text)
            except ValueError:
                if not ids and not header:  # a header
                    header = True
                    continue
                raise InputError(f"{path}:{no}: {text!r} is not an integer item id (the store's ids are "
                                 f"integers)") from None
            if not -2 ** 63 <= value < 2 ** 63:
                raise InputError(f"{path}:{no}: item id {text} is outside the 64-bit integer range")
        else:
            value = text
        if value in seen:
            raise InputError(f"{path}:{no}: item id {text!r} appears twice (first on line {seen[value]})")
        seen[value] = no
        ids.append(value)
    if not ids:
        raise InputError(f"{flag} {path}: no item ids (one id per line)")
    return np.asarray(ids, dtype=np.int64) if numeric else np.asarray(ids, dtype=object)


def catalogue_ids(items, *, numeric: bool, flag: str = "--items") -> np.ndarray:
    """A declared catalogue as a store's kind of ids: the path of a file of ids (:func:`read_catalogue`), or ids
    (numbers or strings; ``ParameterError`` for an id of another kind, none, or one twice)."""
    if isinstance(items, (str, os.PathLike)):
        return read_catalogue(os.fspath(items), numeric=numeric, flag=flag)
    try:
        ids = [parse_id(x, numeric) for x in items]
    except (TypeError, ValueError) as exc:
        raise ParameterError(f"items: expected item ids of the store's kind or the path of a file of ids ({exc})") \
            from None
    if not ids or len(set(ids)) != len(ids):
        raise ParameterError("items: expected distinct item ids, at least one")
    return np.asarray(ids, np.int64) if numeric else np.asarray(ids, dtype=object)


def store_catalogue(store) -> tuple[np.ndarray, str] | None:
    """The catalogue a store declares (``ingest --items``, ``generate``): ``(ids, by)``, or ``None``."""
    rec = store.attrs.get("catalogue")
    if not isinstance(rec, dict) or rec.get("source") != "declared":
        return None
    by = str(rec.get("by", "ingest --items"))
    if "catalogue_ids" in store.root:
        n = int(rec.get("n_items", -1))
        ids = as_ids(store.array("catalogue_ids")[...])
        if len(ids) != n:
            raise StoreError(f"{store.path}: catalogue_ids has {len(ids)} entries, not {n} (the store is damaged)")
        return ids, by
    return as_ids(store.item_ids()), by
