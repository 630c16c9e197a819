"""Original user and item ids in memory: one representation, one lookup, used everywhere.

A store's ids are integers (``int64``) when every id of the column is an integer
written in canonical decimal form, else strings (:mod:`streamdp.storage.ingest`).
In memory they are always one of two kinds (:func:`as_ids`):

* ``int64`` for integer ids;
* an ``object`` array of Python ``str`` for string ids, whatever Zarr handed back.

Not NumPy's string dtypes, for two reasons measured with zarr 3.1 / numpy 2.4:
Zarr returns ``StringDType`` arrays, and ``np.searchsorted`` between two
``StringDType`` arrays that do not share a descriptor compares the wrong bytes for
strings longer than 15 bytes (numpy issue 31533: a model and its store disagreed on
which items they hold, "the store's items are not the model's items", for unicode and
long ids; sometimes ``MemoryError``); and casting to a fixed-width ``<U`` dtype
truncates longer strings, so a 300-character id could match another one's prefix.
Python ``str`` compares by code point, the order of ``StringDType``, ``<U`` and
Arrow's UTF-8 byte order alike, so the ascending order of a store or model is the same
in every representation.

>>> as_ids(np.array(["b", "a"])).dtype, as_ids([3, 1]).dtype
(dtype('O'), dtype('int64'))
>>> find(np.array(["b", "ä" * 20, "a"], dtype=object), ["a", "ä" * 20, "ä" * 19, "c"]).tolist()
[2, 1, -1, -1]
"""

from __future__ import annotations

import numpy as np

from streamdp.errors import InputError


def as_ids(ids) -> np.ndarray:
    """``ids`` as ``int64`` (integer ids) or an ``object`` array of ``str`` (anything else)."""
    a = np.asarray(ids)
    if a.dtype.kind in "iu":
        return a.astype(np.int64, copy=False)
    if a.dtype.kind == "b":
        raise TypeError("ids cannot be booleans")
    out = np.empty(a.shape, dtype=object)
    out[...] = [str(x) for x in a.ravel().tolist()] if a.ndim else str(a.item())
    return out


def numeric(ids) -> bool:
    """Whether ``ids`` (an id array of a store or model) are integers."""
    return np.asarray(ids).dtype.kind in "iu"


def parse_id(text, is_numeric: bool):
    """One id as a user typed it (a field of a file, a Python value) in the kind of ``is_numeric`` ids.

    Integer ids take ``int(text)`` (``ValueError`` if it is not one; ``"007"`` is 7,
    since an integer store holds no other 7); string ids take ``str(text)`` unchanged.

    >>> parse_id("007", True), parse_id("007", False), parse_id(7, False)
    (7, '007', '7')
    """
    if not is_numeric:
        return str(text)
    if isinstance(text, (bool, np.bool_)):
        raise ValueError(f"{text!r} is not an integer id")
    if isinstance(text, (float, np.floating)):
        if not float(text).is_integer():
            raise ValueError(f"{text!r} is not an integer id")
        return int(text)
    return int(text)


def find(haystack, needles) -> np.ndarray:
    """Position in ``haystack`` (any order, unique ids) of each of ``needles``, ``-1`` where absent.

    ``needles`` must be of ``haystack``'s kind (see :func:`parse_id`); both go through
    :func:`as_ids`, so no NumPy string dtype is compared.
    """
    hay = as_ids(haystack)
    want = as_ids(needles) if len(needles) else np.empty(0, hay.dtype)
    if want.dtype != hay.dtype:
        raise TypeError(f"ids of kind {want.dtype} looked up among ids of kind {hay.dtype}")
    if not len(hay):
        return np.full(len(want), -1, np.int64)
    order = np.argsort(hay, kind="stable")
    srt = hay[order]
    pos = np.minimum(np.searchsorted(srt, want), len(srt) - 1)
    hit = srt[pos] == want
    return np.where(hit, order[pos], -1).astype(np.int64)


def utf8_lines(f, path: str):
    """The lines of text file ``f`` (opened with ``encoding="utf-8-sig"``: ids are UTF-8 whatever the locale,
    a byte-order mark is dropped); a file that is not UTF-8 is an :class:`~streamdp.errors.InputError`."""
    try:
        yield from f
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text (ids are read as UTF-8): save the file as UTF-8") from None
