"""A store's released fingerprint: which store a model came from, without a hash of its data.

A model used to record the store's content checksum (blake2b over every rating).
That is a deterministic function of the data: whoever knows every user but one can
hash each candidate rating vector of that user and find the one that matches, so a
released checksum defeats the guarantee outright. What a model releases instead is
a keyed fingerprint, ``HMAC-SHA256(key, checksum)``, with a random 256-bit key kept in
the store (``STORE/release_key``, created on the first release, mode 0600). Without
the key the fingerprint is a random string; with the store at hand, ``evaluate`` and
the data owner can still tell whether a model was trained on it. A store replaced by
``ingest --force`` gets a new key: its models are told apart from the old store's.

The key is created when the store's first release is reserved in its budget ledger
(:meth:`streamdp.privacy.budget.StoreBudget.reserve`), and each ledger entry records
its :func:`key_id`: a key deleted (or swapped) after releases is then seen by the
ledger, which refuses to let a new key be made silently (the models released before
would otherwise be refused by ``evaluate`` as "other ratings", with no word of why).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from streamdp.errors import StoreError

KEY_FILE = "release_key"
PREFIX = "hmac-sha256:"


def _read_key(where: str) -> bytes | None:
    """The key in file ``where`` (a local path or an fsspec URL); ``None`` when there is none."""
    import fsspec

    try:
        with fsspec.open(where, "rt") as fh:
            text = fh.read().strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreError(f"{where}: cannot read the store's release key ({exc.strerror or exc})") from None
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise StoreError(f"{where}: not a release key (64 hex digits); restore it from a backup or remove it "
                         f"(models released before then no longer match this store)")
    return key


def key_path(store_path) -> str:
    """Where the store's release key is (a local path or a URL)."""
    if "://" in str(store_path):
        from streamdp.storage import remote

        return remote.join(str(store_path), KEY_FILE)
    return str(Path(store_path) / KEY_FILE)


def key_id(key: bytes) -> str:
    """A short public name of ``key`` (what the budget ledger records): a hash, from which the key cannot be had.

    >>> key_id(bytes(32))
    'key:9988deb9cec9d270'
    """
    return "key:" + hashlib.sha256(b"streamdp release key id\0" + key).hexdigest()[:16]


def release_key(store_path, *, create: bool) -> bytes | None:
    """The store's release key; created (atomically, once even under concurrent runs) when ``create``."""
    if "://" in str(store_path):  # object storage: created with a conditional write, the first run's key wins
        from streamdp.storage import remote

        url = remote.join(str(store_path), KEY_FILE)
        key = _read_key(url)
        if key is None and create:
            try:
                remote.put_exclusive(url, (secrets.token_hex(32) + "\n").encode())
            except FileExistsError:
                pass
            key = _read_key(url)
        return key
    path = Path(store_path) / KEY_FILE
    key = _read_key(str(path))
    if key is not None or not create:
        return key
    tmp = path.with_name(f".{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)  # atomic and exclusive: a concurrent run's key wins if it came first
        except FileExistsError:
            pass
    except OSError as exc:
        if exc.filename is None or str(exc.filename) == str(tmp):  # a full disk: name the key, not its temporary
            exc.filename = str(path)
        raise
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
    return _read_key(str(path))


def store_fingerprint(store, *, create: bool = True) -> str | None:
    """``hmac-sha256:<hex>`` of ``store``'s checksum under its release key (None: no key and not ``create``).

    >>> import tempfile
    >>> class S: path, checksum = tempfile.mkdtemp(), "blake2b:00"
    >>> f = store_fingerprint(S())
    >>> f.startswith(PREFIX), f == store_fingerprint(S()), "blake2b" in f
    (True, True, False)
    """
    key = release_key(store.path, create=create)
    if key is None:
        return None
    return PREFIX + hmac.new(key, str(store.checksum).encode(), hashlib.sha256).hexdigest()
