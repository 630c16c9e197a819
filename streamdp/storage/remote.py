"""Stores on object storage: the few operations streamdp needs on an fsspec URL.

A store may live at any fsspec URL (``s3://bucket/ratings.zarr``, ``gs://...``,
``memory://...``); a path without ``://`` is a local directory and never comes here.
Credentials and endpoints come from the environment as the filesystem reads them
(for S3, s3fs/botocore: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_PROFILE``, ``AWS_ENDPOINT_URL``...); streamdp passes none of its own.

What object storage lacks and how streamdp does without it:

* **No rename.** A store becomes visible only when its root ``zarr.json`` carries the
  ``streamdp`` attributes, and the writer writes those last
  (:class:`streamdp.storage.writer.StoreWriter`); while it writes, an object
  :data:`WRITING_MARKER` beside the data records who is writing, so that opening a
  half-written store says why it is not one (:func:`incomplete_reason`).
* **No lock.** The budget journal is a series of objects, each created with a
  conditional write (:func:`put_exclusive`: S3's ``If-None-Match: *``, which fails if
  the object exists) under the sequence number of its first line: of two runs that
  append after the same line, exactly one succeeds and the other reads the journal
  again and re-decides (:mod:`streamdp.privacy.budget`).
"""

from __future__ import annotations

import json

from streamdp.errors import StoreError

__all__ = ["is_url", "url_fs", "join", "exists", "read_bytes", "put", "put_exclusive", "remove_prefix",
           "WRITING_MARKER", "write_marker", "incomplete_reason", "ExclusiveUnsupported"]

#: Object written first under a store being written on object storage (its writer's owner record), removed last.
WRITING_MARKER = ".streamdp-writing"


def is_url(path) -> bool:
    """Whether ``path`` is an fsspec URL (``proto://...``) rather than a local path.

    >>> is_url("s3://bucket/r.zarr"), is_url("/data/r.zarr"), is_url("r.zarr")
    (True, False, False)
    """
    return "://" in str(path)


def url_fs(url: str):
    """``(filesystem, path inside it)`` for ``url``."""
    from fsspec.core import url_to_fs

    return url_to_fs(str(url))


def join(url: str, *parts: str) -> str:
    """``url`` with ``parts`` appended, ``/``-separated.

    >>> join("s3://b/r.zarr/", "privacy_budget.json")
    's3://b/r.zarr/privacy_budget.json'
    """
    return "/".join([str(url).rstrip("/"), *parts])


def exists(url: str) -> bool:
    fs, p = url_fs(url)
    return bool(fs.exists(p))


def read_bytes(url: str) -> bytes | None:
    """The object's bytes, ``None`` if there is none."""
    fs, p = url_fs(url)
    try:
        return fs.cat_file(p)
    except FileNotFoundError:
        return None


def put(url: str, data: bytes) -> None:
    """Write (or overwrite) one object; a single PUT is atomic on S3 (all or nothing)."""
    fs, p = url_fs(url)
    if _is_local(fs):  # a file:// URL: no implicit parent directories
        fs.makedirs(fs._parent(p), exist_ok=True)
    fs.pipe_file(p, data)


def write_options(url: str) -> dict:
    """fsspec storage options for writing a Zarr group at ``url`` (a ``file://`` URL must create directories)."""
    return {"auto_mkdir": True} if _is_local(url_fs(url)[0]) else {}


def _is_local(fs) -> bool:
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return "file" in protocols or "local" in protocols


class ExclusiveUnsupported(StoreError):
    """The filesystem of a URL offers no create-if-absent write."""


def put_exclusive(url: str, data: bytes) -> None:
    """Create the object ``url`` holding ``data`` only if there is none: ``FileExistsError`` if there is.

    On S3 a PUT with ``If-None-Match: *`` (s3fs ``mode="create"``): atomic on the
    server, so of two concurrent creates of the same key exactly one succeeds (AWS S3
    since 2024; MinIO and moto honour it too). A local ``file://`` URL uses
    ``O_CREAT | O_EXCL``. Other filesystems have no such write here:
    :class:`ExclusiveUnsupported` (a budget ledger there cannot be kept safely).
    """
    fs, p = url_fs(url)
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    if "s3" in protocols or "s3a" in protocols:
        import inspect

        if "mode" not in inspect.signature(fs._pipe_file).parameters:
            raise ExclusiveUnsupported(f"{url}: this s3fs has no conditional write (mode='create'); "
                                       f"pip install 's3fs>=2025.2.0' (the streamdp[s3] extra)")
        fs.pipe_file(p, data, mode="create")
    elif _is_local(fs):
        import os

        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "xb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    else:
        raise ExclusiveUnsupported(f"{url}: {protocols[0]}:// has no conditional (create-if-absent) write that "
                                   f"streamdp can use, so a budget ledger cannot be kept there without lost updates; "
                                   f"keep the store on s3:// or a local disk")
    fs.invalidate_cache(p)


def remove_prefix(url: str, *, keep=lambda name: False) -> None:
    """Delete every object under ``url`` whose path relative to it does not satisfy ``keep``."""
    fs, p = url_fs(url)
    p = p.rstrip("/")
    try:
        found = fs.find(p)
    except FileNotFoundError:
        return
    doomed = [f for f in found if not keep(f[len(p) + 1:])]
    if doomed:
        fs.rm(doomed)
    fs.invalidate_cache(p)


def write_marker(url: str) -> None:
    """Write :data:`WRITING_MARKER` (this process's owner record) under the store ``url`` being written."""
    from streamdp.owner import current_owner

    put(join(url, WRITING_MARKER), json.dumps(current_owner()).encode())


def incomplete_reason(url: str) -> str | None:
    """Why ``url`` holds a store that is not one yet (its write began and has not finished), else ``None``."""
    from streamdp.owner import describe_owner, owner_status

    raw = read_bytes(join(url, WRITING_MARKER))
    if raw is None:
        return None
    try:
        owner = json.loads(raw)
    except ValueError:
        owner = None
    owner = owner if isinstance(owner, dict) else None
    who = describe_owner(owner) + (f", started {owner.get('started')}" if owner and owner.get("started") else "")
    state = {"gone": "is gone: the write was killed or failed",
             "alive": "is still running: wait for it to finish"}.get(owner_status(owner),
                                                                      "cannot be checked from this host")
    return (f"an incomplete store: a store on object storage becomes one only when its write publishes the root "
            f"zarr.json last, and its writer ({who}) {state}; if it is not running, write the store again with "
            f"--force")
