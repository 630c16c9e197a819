"""Reading a rating store: :func:`open_store` and :class:`RatingStore`.

This is the one block reader of streamdp: every method, the evaluator and the
stream engine read ratings through :meth:`RatingStore.read_block`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, NamedTuple

import numpy as np
import zarr

from streamdp.errors import StoreError
from streamdp.storage.chunks import ChunkReader
from streamdp.storage.schema import ATTRS_KEY, FORMAT_NAME, FORMAT_VERSION, SPLITS


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


class RatingStore:
    """An opened rating store (read-only).

    Parameters
    ----------
    path : str
        A local directory or any fsspec URL that Zarr can open.
    """

    def __init__(self, path: str, storage_options: dict | None = None):
        self.path = str(path)
        try:
            kw = {"storage_options": storage_options} if storage_options else {}
            self._root = zarr.open_group(self.path, mode="r", **kw)
        except (FileNotFoundError, zarr.errors.GroupNotFoundError, ValueError, OSError) as exc:
            raise StoreError(f"{self.path}: not a streamdp rating store ({exc.__class__.__name__})") from None
        attrs = dict(self._root.attrs).get(ATTRS_KEY)
        if not isinstance(attrs, dict) or attrs.get("format") != FORMAT_NAME:
            raise StoreError(f"{self.path}: not a streamdp rating store (no '{ATTRS_KEY}' attributes)")
        version = attrs.get("format_version")
        if version != FORMAT_VERSION:
            raise StoreError(
                f"{self.path}: store format version {version}, but this streamdp reads version "
                f"{FORMAT_VERSION}; re-ingest the data with this version"
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
        )
        self._cache: dict[str, dict[str, zarr.Array]] = {}

    # -- public shape -----------------------------------------------------------------
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
        return "test" in self._root and self.info.n_test > 0

    def block_range(self, b: int) -> tuple[int, int]:
        """``(first_user, end_user)`` of block ``b``."""
        if not 0 <= b < self.info.n_blocks:
            raise IndexError(f"block {b} out of range 0..{self.info.n_blocks - 1}")
        first = b * self.info.block_users
        return first, min(first + self.info.block_users, self.info.n_users)

    # -- reading ----------------------------------------------------------------------
    def _split(self, split: str) -> dict[str, zarr.Array]:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
        if split not in self._cache:
            if split not in self._root:
                raise StoreError(f"{self.path}: store has no '{split}' split")
            g = self._root[split]
            arrs = {"indptr": g["indptr"], "items": g["items"], "ratings": g["ratings"],
                    "block_offsets": g["block_offsets"][:]}
            # direct chunk decoding for local stores (2.35x Zarr's per-chunk path, see chunks.py)
            arrs["fast"] = {name: ChunkReader.for_array(arrs[name]) for name in ("indptr", "items", "ratings")}
            self._cache[split] = arrs
        return self._cache[split]

    def _read(self, arrs: dict, name: str, start: int, stop: int) -> np.ndarray:
        fast = arrs["fast"][name]
        if fast is not None:
            return fast.read(start, stop)
        return arrs[name][start:stop]

    def read_block(self, b: int, split: str = "train") -> Block:
        """Read user block ``b`` of ``split`` into memory (whole chunks only)."""
        first, end = self.block_range(b)
        arrs = self._split(split)
        indptr = np.asarray(self._read(arrs, "indptr", first, end + 1), dtype=np.int64)
        start = int(arrs["block_offsets"][b])
        nnz = int(indptr[-1] - indptr[0])
        items = np.asarray(self._read(arrs, "items", start, start + nnz), dtype=np.int32)
        ratings = np.asarray(self._read(arrs, "ratings", start, start + nnz), dtype=np.float32)
        return Block(first, indptr - indptr[0], items, ratings)

    def blocks(self, split: str = "train", *, start: int = 0, stop: int | None = None) -> Iterator[Block]:
        """Iterate over the user blocks of ``split`` in order."""
        stop = self.info.n_blocks if stop is None else min(stop, self.info.n_blocks)
        for b in range(start, stop):
            yield self.read_block(b, split)

    __iter__ = blocks

    def block_nnz(self, split: str = "train") -> np.ndarray:
        """Number of ratings in each block (reads only ``indptr`` at block edges)."""
        arrs = self._split(split)
        bu, n = self.info.block_users, self.info.n_users
        edges = np.minimum(np.arange(self.info.n_blocks + 1, dtype=np.int64) * bu, n)
        ip = arrs["indptr"]
        vals = np.array([int(ip[int(e)]) for e in edges], dtype=np.int64)
        return np.diff(vals)

    def user_ids(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Original user ids of dense users ``start..stop``."""
        return self._root["user_ids"][start:stop]

    def item_ids(self) -> np.ndarray:
        """Original item ids, indexed by the dense (popularity-ordered) item index."""
        return self._root["item_ids"][:]

    def item_counts(self) -> np.ndarray:
        """Ratings per item over train and test (the popularity order)."""
        return np.asarray(self._root["item_counts"][:], dtype=np.int64)

    def user_counts(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Ratings per user over train and test."""
        return np.asarray(self._root["user_counts"][start:stop], dtype=np.int64)

    def array(self, name: str) -> zarr.Array:
        """Any other array of the store by path (e.g. ``truth/item_factors``)."""
        if name not in self._root:
            raise StoreError(f"{self.path}: store has no array '{name}'")
        return self._root[name]


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
