"""The on-disk layout of a streamdp rating store (format version 1; 2 for an implicit store).

A store is a Zarr v3 group::

    STORE/
      zarr.json              root attributes under the key ``"streamdp"`` (see below)
      train/indptr           int64 (n_users + 1,)  CSR row pointer, no gaps, chunks = block_users
      train/items            int32 (padded,)       item index of each rating, users in order
      train/ratings          float32 (padded,)     the rating values
      train/block_offsets    int64 (n_blocks + 1,) position in items/ratings where each block starts
      train/block_digests    uint8 (n_blocks, 16)  blake2b digest of each block (``streamdp verify``)
      train/block_crc32c     uint32 (n_blocks,)    CRC32C of each block's chunk files as written
      train/item_sums        float64 (n_items,)    each item's sum of training ratings (see below)
      train/item_counts      int64 (n_items,)      each item's number of training ratings
      test/...               the CSR and check arrays for the held-out split, if there is one
      user_ids, item_ids     original ids (int64 or str), indexed by the dense index
      user_counts            int64 (n_users,)  ratings per user, train + test
      item_counts            int64 (n_items,)  ratings per item, train + test
      item_names             str (n_items,), only with ``ingest --item-names``
      truth/item_factors     float32 (n_items, rank), only in generated stores

Users are grouped into **user blocks** of ``block_users`` consecutive users. Every
block's ratings start on a chunk boundary of ``items``/``ratings`` (the gap after a
block is padding: item -1, rating 0), so reading or writing a block touches whole
chunks only and blocks can be written independently. ``block_offsets[b]`` is the
padded position of block ``b``'s first rating; the CSR positions in ``indptr``
are unpadded (``indptr[-1] == n_ratings``).

Items are numbered by descending popularity (item 0 is the most rated, ties broken
by original id order) so that later methods can tier items by index alone.

Every chunk of every array is present: the writer also writes chunks equal to the
fill value, and the padding after a block never fills a whole chunk. A missing
chunk is therefore damage, and readers refuse it (:mod:`streamdp.storage.chunks`).
Format version policy: the version changes only when a reader of the previous
version would misread a new store. Additions that older readers ignore and newer
readers do without when absent stay within the version, each listed here with what
a store written without it gets:

* ``block_digests``: stores without it are read as before and ``verify`` compares
  only their whole checksum (the attribute ``checksum_ids`` names the id arrays the
  checksum covers; see :class:`streamdp.storage.writer.ContentHash`).
* ``block_crc32c`` (CRC32C over the per-chunk CRC32Cs of the chunk files a block
  read touches: its ``indptr`` chunks, then ``items``, then ``ratings``; see
  :func:`streamdp.storage.chunks.chunk_crcs_digest`): every
  :meth:`~streamdp.storage.store.RatingStore.read_block` compares it; without it
  (or when the chunk files were re-encoded) a read compares the block's
  ``block_digests`` instead, which is slower; with neither, blocks are not checked.
* ``checksum_attrs``: the attributes the checksum covers (rating range and its
  source, counts, block layout, out-of-range policy, rating step); without it the
  checksum covers the ratings and ids only and ``verify`` notes it.
* ``implicit`` (``true`` in an **implicit store**: interaction logs, see
  :mod:`streamdp.storage.ingest`), with ``value`` (``count`` or ``weight``: what the
  ``ratings`` array holds, positive and summed over repeated interactions) and
  ``count_cap`` (the declared cap of the counts, or ``null``). A reader of version 1
  would take counts for ratings, so an implicit store is written with format version
  :data:`IMPLICIT_FORMAT_VERSION` (2), which older streamdp refuses; a rating store
  keeps version 1 and has no ``implicit`` attribute, and a store without it (every
  store written before) reads as a rating store (``RatingStore.implicit`` false).
* ``split``: how the test split was made (``{"kind": "none" | "random" | "temporal" | "last-n" |
  "files", ...}``, :func:`streamdp.storage.ingest.resolve_split`); a store without it reads as
  ``random`` when it has a test split (:func:`streamdp.storage.info.store_split`).
* ``item_names`` (an array of str indexed like ``item_ids``, ``""`` for unnamed items, and an
  attribute of the same name: ``ingest --item-names``, public metadata,
  :mod:`streamdp.storage.names`; outside the checksum): a store without it has no names.
* ``train/item_sums``, ``train/item_counts`` and the attribute ``train_item_stats`` (a
  digest of the two, :func:`streamdp.storage.writer.item_stats_digest`): each item's exact
  sum and count of training ratings, added block by block by the writer
  (:func:`streamdp.storage.writer.block_item_stats`). They are the owner's statistics of
  the raw data, never released: ``evaluate`` reads them for its non-private baselines and
  popularity chart instead of a pass of their own (:mod:`streamdp.serving.evaluate`), a read
  checks them against the digest, ``verify`` recomputes them from the ratings. Outside
  the checksum (derived from the ratings it covers, like ``item_counts``), so the same data
  keeps its checksum. A store without them is evaluated with that extra pass, and says so.
* ``generation``: a random id of each write of a store (not in the checksum: the
  same data written twice has the same checksum). A run checks it before releasing
  (:meth:`~streamdp.storage.store.RatingStore.check_unchanged`); without it the
  device, inode and mtime of a local ``zarr.json`` stand in.
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
#: The versions this streamdp reads.
READ_VERSIONS = (FORMAT_VERSION, IMPLICIT_FORMAT_VERSION)
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
