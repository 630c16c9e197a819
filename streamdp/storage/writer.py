"""Writing a rating store: :class:`StoreWriter`, shared by ``ingest`` and ``generate``.

The writer builds the store in a temporary directory next to the destination and
renames it into place only in :meth:`StoreWriter.finalize`; on any error (or when
used as a context manager and the body raises) the temporary directory is removed,
so nothing is ever left at the destination unless the write succeeded.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import shutil
import uuid

import numpy as np
import zarr

from streamdp.errors import StoreError
from streamdp.storage.schema import (
    ATTRS_KEY,
    DEFAULT_CHUNK_RATINGS,
    FORMAT_NAME,
    FORMAT_VERSION,
    ITEM_PAD,
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
    h.update(np.diff(np.asarray(indptr, np.int64)).astype("<i8").tobytes())
    h.update(np.ascontiguousarray(items, dtype="<i4").tobytes())
    h.update(np.ascontiguousarray(ratings, dtype="<f4").tobytes())
    return h.digest()


def check_destination(path: str, force: bool) -> None:
    """Refuse to overwrite an existing path unless ``force``."""
    if os.path.lexists(path) and not force:
        raise StoreError(f"{path}: already exists (use --force to overwrite)")


class _SplitWriter:
    def __init__(self, group: zarr.Group, n_users: int, n_blocks: int, block_users: int, chunk: int):
        self.g = group
        self.chunk = chunk
        self.block_users = block_users
        self.n_users = n_users
        self.indptr = group.create_array(
            "indptr", shape=(n_users + 1,), dtype="int64", chunks=(max(1, block_users),), fill_value=0
        )
        self.items = group.create_array("items", shape=(0,), dtype="int32", chunks=(chunk,), fill_value=ITEM_PAD,
                                        compressors=rating_compressor())
        self.ratings = group.create_array("ratings", shape=(0,), dtype="float32", chunks=(chunk,), fill_value=0.0,
                                          compressors=rating_compressor())
        self.offsets = np.zeros(n_blocks + 1, dtype=np.int64)
        self.next_block = 0
        self.nnz = 0
        self.padded = 0
        self.hash = hashlib.blake2b(digest_size=16)

    def write(self, b: int, indptr: np.ndarray, items: np.ndarray, ratings: np.ndarray,
              digest: bytes | None = None) -> None:
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
        ratings = np.ascontiguousarray(ratings, dtype=np.float32)
        start = self.padded
        end = start + nnz
        padded_end = -(-end // self.chunk) * self.chunk
        if padded_end > self.items.shape[0]:
            self.items.resize((padded_end,))
            self.ratings.resize((padded_end,))
        if nnz:
            # Write whole chunks: pad the tail of the block's last chunk ourselves.
            pad = padded_end - end
            self.items[start:padded_end] = np.concatenate([items, np.full(pad, ITEM_PAD, np.int32)])
            self.ratings[start:padded_end] = np.concatenate([ratings, np.zeros(pad, np.float32)])
        self.indptr[first : first + n_local] = indptr[:-1] + self.nnz
        self.offsets[b] = start
        self.hash.update(digest if digest is not None else block_digest(b, indptr, items, ratings))
        self.nnz += nnz
        self.padded = padded_end
        self.offsets[b + 1] = padded_end
        self.next_block += 1

    def close(self, n_blocks: int) -> None:
        if self.next_block != n_blocks:
            raise ValueError(f"only {self.next_block} of {n_blocks} blocks were written")
        self.indptr[self.n_users : self.n_users + 1] = np.array([self.nnz], dtype=np.int64)
        arr = self.g.create_array(
            "block_offsets", shape=(n_blocks + 1,), dtype="int64", chunks=(max(1, n_blocks + 1),)
        )
        arr[:] = self.offsets


class StoreWriter:
    """Write a store block by block into a temporary directory, then rename it into place.

    Parameters
    ----------
    path : str
        Destination directory (local).
    n_users, n_items : int
        Dense sizes of the store.
    block_users : int
        Users per block.
    splits : tuple of str
        ``("train",)`` or ``("train", "test")``.
    force : bool
        Overwrite an existing destination (only at :meth:`finalize`).
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
    ):
        if n_users < 1 or n_items < 1:
            raise StoreError(f"{path}: a store needs at least one user and one item")
        check_destination(path, force)
        self.path = os.path.abspath(path)
        self.force = force
        self.n_users, self.n_items, self.block_users = int(n_users), int(n_items), int(block_users)
        self.n_blocks = -(-self.n_users // self.block_users)
        parent = os.path.dirname(self.path) or "."
        os.makedirs(parent, exist_ok=True)
        self.tmp = os.path.join(parent, f".{os.path.basename(self.path)}.tmp-{uuid.uuid4().hex[:12]}")
        self.root = zarr.open_group(self.tmp, mode="w")
        self.splits = {
            s: _SplitWriter(self.root.create_group(s), self.n_users, self.n_blocks, self.block_users, chunk_ratings)
            for s in splits
        }
        self._ids_hash = hashlib.blake2b(digest_size=16)
        self._done = False

    # -- context manager: abort on error ----------------------------------------------
    def __enter__(self) -> "StoreWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None or not self._done:
            self.abort()

    def abort(self) -> None:
        """Remove the temporary directory (idempotent)."""
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- content ------------------------------------------------------------------------
    def write_block(self, b: int, indptr, items, ratings, split: str = "train", *,
                    digest: bytes | None = None) -> None:
        """Write block ``b`` of ``split``; blocks of one split must come in order.

        ``digest`` is :func:`block_digest` of the same arrays if the caller already
        computed it (e.g. in a worker thread); it is computed here otherwise.
        """
        self.splits[split].write(b, indptr, items, ratings, digest)

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
        arr = g.create_array(leaf, shape=data.shape, dtype=dtype, chunks=chunks)
        if len(data):
            arr[...] = data
        if name in ("user_ids", "item_ids"):
            self._ids_hash.update(name.encode())
            self._ids_hash.update("\x1f".join(map(str, data.tolist())).encode() if dtype is str else data.tobytes())
        return arr

    def create_array(self, name: str, shape, dtype, chunks) -> zarr.Array:
        """Create an auxiliary array to be filled in slices (e.g. ids streamed by block)."""
        if "/" in name:
            grp, leaf = name.rsplit("/", 1)
            g = self.root.require_group(grp)
        else:
            g, leaf = self.root, name
        return g.create_array(leaf, shape=shape, dtype=dtype, chunks=chunks)

    def finalize(self, attrs: dict) -> str:
        """Close the splits, write attributes and checksum, and move the store into place.

        ``attrs`` must hold ``rating_min``, ``rating_max`` and ``rating_range_source``;
        anything else (sources, parameters) is recorded as given.
        """
        for s, w in self.splits.items():
            w.close(self.n_blocks)
        h = hashlib.blake2b(digest_size=16)
        for s in sorted(self.splits):
            h.update(s.encode())
            h.update(self.splits[s].hash.digest())
        h.update(self._ids_hash.digest())
        full = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "n_users": self.n_users,
            "n_items": self.n_items,
            "n_ratings": self.splits["train"].nnz,
            "n_test": self.splits["test"].nnz if "test" in self.splits else 0,
            "block_users": self.block_users,
            "n_blocks": self.n_blocks,
            "checksum": "blake2b:" + h.hexdigest(),
            "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }
        from streamdp import __version__

        full["created_by"] = f"streamdp {__version__}"
        for k, v in attrs.items():
            full.setdefault(k, v)
        for k in ("rating_min", "rating_max", "rating_range_source"):
            if k not in full:
                raise ValueError(f"finalize: missing attribute {k}")
        self.root.attrs[ATTRS_KEY] = full
        if os.path.lexists(self.path):
            if not self.force:
                self.abort()
                raise StoreError(f"{self.path}: already exists (use --force to overwrite)")
            trash = self.tmp + ".old"
            os.rename(self.path, trash)
            os.rename(self.tmp, self.path)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.rename(self.tmp, self.path)
        self._done = True
        return self.path
