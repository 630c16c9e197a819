"""The on-disk layout of a streamdp rating store (format version 1; 2 for an implicit store; 3 with segments).

A store is a Zarr v3 group::

    STORE/
      zarr.json              root attributes under the key ``"streamdp"``
      train/indptr           int64 (n_users + 1,)  CSR row pointer, no gaps, chunks = block_users
      train/items            int32 (padded,)       item index of each rating, users in order
      train/ratings          float32 (padded,)     the rating values
      train/times            int64 (padded,)       each rating's time (seconds since the epoch), if kept
      train/block_offsets    int64 (n_blocks + 1,) position in items/ratings where each block starts
      train/block_digests    uint8 (n_blocks, 16)  blake2b digest of each block (``streamdp verify``)
      train/block_crc32c     uint32 (n_blocks,)    CRC32C of each block's chunk files as written
      train/item_sums        float64 (n_items,)    each item's sum of training ratings
      train/item_counts      int64 (n_items,)      each item's number of training ratings
      test/...               the CSR and check arrays for the held-out split, if there is one
      user_ids, item_ids     original ids (int64 or str), indexed by the dense index
      user_counts            int64 (n_users,)  ratings per user, train + test
      item_counts            int64 (n_items,)  ratings per item, train + test
      item_names             str (n_items,), only with ``ingest --item-names``
      truth/item_factors     float32 (n_items, rank), only in generated stores

Decisions a reader must know:

* users are grouped into **user blocks** of ``block_users``; every block starts on a chunk
  boundary of ``items``/``ratings`` (padding: item -1, rating 0), so a block is read or
  written as whole chunks; ``indptr`` is unpadded (``indptr[-1] == n_ratings``);
* items are numbered by descending popularity (ties by original id) in an ingested or generated store;
  appended items come after (also once compacted): sgld's hot tier, the order's one reader, only runs slower;
* **segments** (``ingest --append``): ``segments/NAME`` are store-shaped groups on the same user
  blocks, listed in the root attributes (``segments``; the base's own counts and checksum under
  ``base``), which are the commit point (:mod:`streamdp.storage.segments`, docs/design-notes.md);
* every chunk of every array is present: a missing chunk is damage, refused by readers
  (:mod:`streamdp.storage.chunks`);
* the format version changes only when a reader of the previous version would misread a
  new store: an implicit store is version :data:`IMPLICIT_FORMAT_VERSION` (2); additions
  that older readers ignore (block digests and CRCs, checksum attributes, ``split``,
  ``item_names``, item statistics, ``generation``, ``times``) stay within the version.

Design notes (the root attributes, each addition): docs/design-notes.md#streamdpstorageschemapy.
"""

from __future__ import annotations

import json
import os

import numpy as np

from streamdp.storage import remote

FORMAT_NAME = "streamdp-ratings"
FORMAT_VERSION = 1
#: The format version of an implicit store (interaction counts in ``ratings``): older readers refuse it.
IMPLICIT_FORMAT_VERSION = 2
#: The format version of a store with committed segments (``ingest --append``; rating or implicit: ``implicit``
#: says which): older readers refuse it rather than read its base alone. ``compact`` writes version 1 or 2 again.
SEGMENTED_FORMAT_VERSION = 3
#: The versions this streamdp reads.
READ_VERSIONS = (FORMAT_VERSION, IMPLICIT_FORMAT_VERSION, SEGMENTED_FORMAT_VERSION)
ATTRS_KEY = "streamdp"

SPLITS = ("train", "test")
CSR_ARRAYS = ("indptr", "items", "ratings", "block_offsets")

#: Default number of ratings per chunk of ``items``/``ratings`` (1 MiB of int32).
#: Measured on a 10.6M-rating generated store (``bench``-style block reads, 2 cores):
#: Zstd (Zarr's default) 64k chunks read 23M ratings/s and write 10M/s; Blosc-LZ4 with
#: byte shuffle at 256k chunks reads 58-61M/s and writes 26-33M/s, at a smaller size
#: (2.15 vs 2.42 bytes per rating). Zarr's per-chunk overhead is why larger chunks win.
DEFAULT_CHUNK_RATINGS = 1 << 18
#: Target mean number of ratings in one user block when choosing ``block_users``
#: (about 8 MB of items + ratings before compression; the padding after a block's
#: last chunk then costs at most a quarter, on average an eighth, of a block's reads).
TARGET_BLOCK_RATINGS = 1 << 20


def time_attrs(spans) -> dict:
    """The ``times`` attribute of a store that keeps each rating's time (an input with a timestamp column): the
    unit (integer times are read as seconds since the epoch, as MovieLens writes them) and the span of
    ``spans`` (``[min, max]`` pairs, ``None`` for a part without ratings): read off the data, so store metadata
    shown to the owner (``info``), never put in a model release.

    >>> time_attrs([[5, 9], [None, None], [2, 7]])
    {'unit': 's', 'min': 2, 'max': 9}
    """
    lo = [a for a, _ in spans if a is not None]
    hi = [z for _, z in spans if z is not None]
    return {"unit": "s", "min": min(lo) if lo else None, "max": max(hi) if hi else None}


def rating_compressor():
    """The codec of ``items``/``ratings``: Blosc-LZ4 with byte shuffle (fast to decode)."""
    from zarr.codecs import BloscCodec

    return BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")

ITEM_PAD = -1
#: The dtype of the stored ratings.
RATING_DTYPE = np.float32
#: The largest magnitude a stored rating can have (a larger number becomes ``inf`` in :data:`RATING_DTYPE`).
RATING_MAX_ABS = float(np.finfo(RATING_DTYPE).max)


def storable_ratings(values) -> np.ndarray:
    """Boolean mask of the ``values`` that stay finite in the store's rating dtype (float32).

    ``1e39`` is a finite float64 but ``inf`` as a float32: such a rating is a bad line
    at ingest, like ``nan`` or ``inf`` written out.

    >>> storable_ratings(np.array([4.0, 1e39, np.nan, -3.4e38])).tolist()
    [True, False, False, True]
    """
    with np.errstate(over="ignore", invalid="ignore"):
        return np.isfinite(np.asarray(values).astype(RATING_DTYPE, copy=False))


def default_block_users(n_users: int, n_ratings: int, target: int = TARGET_BLOCK_RATINGS) -> int:
    """Users per block so that a mean block holds about ``target`` ratings.

    Uses only the counts, which are public parameters of the store's shape.

    >>> default_block_users(1000, 100_000)
    1000
    >>> default_block_users(10_000_000, 1_000_000_000)
    10485
    """
    if n_users <= 0:
        return 1
    mean = max(n_ratings / n_users, 1e-9)
    users = int(target / mean)
    return max(1, min(n_users, users))


def is_store_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` (a directory or an fsspec URL) is a streamdp rating store (its ``zarr.json`` names the
    format; any version).

    Read from the raw ``zarr.json``, so a store of another format version (or one
    whose arrays are damaged) still counts as a store that ``--force`` may replace.
    """
    try:
        if remote.is_url(path):
            raw = remote.read_bytes(remote.join(str(path), "zarr.json"))
            attrs = json.loads(raw).get("attributes", {}).get(ATTRS_KEY) if raw is not None else None
        else:
            with open(os.path.join(path, "zarr.json")) as fh:
                attrs = json.load(fh).get("attributes", {}).get(ATTRS_KEY)
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(attrs, dict) and attrs.get("format") == FORMAT_NAME
