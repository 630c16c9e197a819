"""Input formats of ``streamdp ingest``: detection, streaming readers, and error location.

Supported (``--format``): ``udata`` (MovieLens 100K ``u.data``), ``dat`` (MovieLens 1M/10M
``ratings.dat``), ``csv`` (comma separated, with or without a header; semicolons are
detected), ``ws`` (runs of spaces/tabs, FilmTrust) and ``parquet``. Anything else:
``--sep`` and ``--columns`` (names or 0-based indices). ``.gz`` and other compressions
pyarrow detects are decompressed on the fly.

Decisions a reader must know:

* text is parsed by pyarrow's streaming CSV reader in blocks of ``block_size`` bytes; a
  multi-character separator or whitespace runs are first rewritten to one ``\\x1f`` byte,
  never by a Python loop over lines; a header is recognised when its third field is not a
  number;
* header columns are mapped by name, never by position (:data:`COLUMN_NAMES`; case,
  quotes, ``_``, ``-`` and spaces ignored); an unknown or repeated name, or a missing
  user, item or rating column, is an error naming the columns found;
* a ``count`` column or a header of user and item alone makes an **interaction log**
  (an implicit store, :mod:`streamdp.storage.ingest`);
* line numbers in errors come from :func:`locate_error`, a plain re-read that runs only
  after the fast path failed (non-UTF-8 lines, truncated compressed files: :func:`read_error`);
* UTF-8, with or without a byte-order mark; ids are int64 when every id of the column in
  every file is an integer, else strings; timestamps are integers.

Design notes (each format, the header names' table, the error rules):
docs/design-notes.md#streamdpstorageformatspy.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import math
import os
import re
import zlib
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from streamdp.errors import InputError
from streamdp.storage.schema import RATING_MAX_ABS, storable_ratings

FORMATS = ("udata", "dat", "csv", "ws", "parquet")
BOM = b"\xef\xbb\xbf"  # the UTF-8 byte-order mark; pyarrow's CSV reader skips it too
FIELD_SEP = "\x1f"  # what multi-character separators and whitespace runs are rewritten to

#: Header names of each column role, normalized (see :func:`column_role`).
COLUMN_NAMES = {
    "user": ("user", "userid", "uid", "customerid", "u"),
    "item": ("item", "itemid", "iid", "movie", "movieid", "productid", "i"),
    "rating": ("rating", "ratings", "score", "stars", "value", "r"),
    "timestamp": ("timestamp", "time", "ts", "date", "datetime", "t"),
    # the value column of an interaction log (an implicit store): it takes the rating's place
    "count": ("count", "counts", "weight", "weights", "plays", "playcount", "clicks", "quantity", "qty"),
}
ROLES = ("user", "item", "rating", "timestamp")
_ROLE_OF = {name: role for role, names in COLUMN_NAMES.items() for name in names}
_NAMES_HINT = ("user/userId/user_id/uid, item/itemId/movieId/item_id/iid, rating/score/stars, timestamp/time/ts; "
               "an interaction log: user, item and optionally count/weight/plays/clicks")


# pyarrow's pa.array and Array.to_numpy convert through its pandas layer, which imports pandas on first use: 0.3-0.4 s
# of every command that parses or maps ids (an append of 1M ratings took 2.4 s in all). Fixed-width numbers go
# between NumPy and Arrow through their buffers instead.
_FIXED = {pa.int8(): np.int8, pa.int16(): np.int16, pa.int32(): np.int32, pa.int64(): np.int64,
          pa.uint8(): np.uint8, pa.uint16(): np.uint16, pa.uint32(): np.uint32, pa.uint64(): np.uint64,
          pa.float32(): np.float32, pa.float64(): np.float64}
_ARROW_OF = {np.dtype(v): k for k, v in _FIXED.items()}


def to_arrow(a) -> pa.Array:
    """A 1-D array of fixed-width numbers (or booleans) as an Arrow array without nulls, sharing its buffer where
    it is contiguous; anything else (strings, objects) through ``pa.array``.

    >>> to_arrow(np.array([3, 1], np.int64)).to_pylist(), to_arrow(np.array([True, False])).type
    ([3, 1], DataType(bool))
    """
    a = np.asarray(a)
    if a.dtype == np.bool_:
        bits = np.packbits(a, bitorder="little")
        return pa.Array.from_buffers(pa.bool_(), len(a), [None, pa.py_buffer(bits)])
    typ = _ARROW_OF.get(a.dtype)
    if typ is None or a.ndim != 1:
        return pa.array(a)
    return pa.Array.from_buffers(typ, len(a), [None, pa.py_buffer(np.ascontiguousarray(a))])


def _bits(buf, offset: int, n: int) -> np.ndarray:
    return np.unpackbits(np.frombuffer(buf, np.uint8), count=offset + n, bitorder="little")[offset:].astype(bool)


def to_numpy(a, fill=None) -> np.ndarray:
    """An Arrow array (or chunked array) as NumPy: fixed-width numbers without nulls as a read-only view of their
    buffer (with ``fill``: their nulls replaced by it, in a copy), booleans without nulls unpacked; anything else
    (strings, nulls without ``fill``) through pyarrow's ``to_numpy``.

    >>> to_numpy(pa.chunked_array([to_arrow(np.array([1, 2])), to_arrow(np.array([3]))])).tolist()
    [1, 2, 3]
    """
    if isinstance(a, pa.ChunkedArray):
        parts = [to_numpy(c, fill) for c in a.chunks]
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.empty(0, _FIXED.get(a.type, object))
    dt = _FIXED.get(a.type)
    if a.null_count == 0 and pa.types.is_boolean(a.type) and a.buffers()[1] is not None:
        return _bits(a.buffers()[1], a.offset, len(a))
    if dt is None or (a.null_count and fill is None) or a.buffers()[1] is None:
        return a.to_numpy(zero_copy_only=False)
    v = np.frombuffer(a.buffers()[1], dt, count=len(a), offset=a.offset * np.dtype(dt).itemsize)
    if a.null_count:
        v = np.where(_bits(a.buffers()[0], a.offset, len(a)), v, dt(fill))
    return v

def column_role(name: str) -> str | None:
    """The role (user, item, rating, timestamp, count) a header name stands for, or None.

    >>> [column_role(n) for n in ("userId", '"movie_id"', "Rating", "foo")]
    ['user', 'item', 'rating', None]
    """
    return _ROLE_OF.get(re.sub(r"[\s_\-]", "", name.strip().strip('"').lower()))


def header_columns(path: str, names: list[str], *, extra_ok: bool = False,
                   implicit: bool = False) -> tuple[dict, bool]:
    """``({role: column index}, implicit)`` from a header's column ``names``; an InputError naming the
    columns found unless every column has a known name (``extra_ok``: other columns are
    ignored) and user, item and rating are all there.

    An **interaction log** (``implicit``, forced by ``--implicit``): a header with user and
    item columns, no rating column and at most a count column (:data:`COLUMN_NAMES`
    ``count``: count, weight, plays, clicks...). Its count column, if any, takes the
    rating's place (``cols["rating"]``, ``None`` when every row is one interaction); with
    ``implicit`` a column named as a rating is taken as the count.
    """
    cols: dict = {}
    unknown, twice = [], []
    for j, name in enumerate(names):
        role = column_role(name)
        if role is None:
            unknown.append(name)
        elif role in cols:
            twice.append(name)
        else:
            cols[role] = j
    if "count" in cols and "rating" in cols and not implicit:
        twice.append(names[cols["count"]])
    implicit = implicit or ("rating" not in cols and (len(names) == 2 or "count" in cols))
    if implicit:
        value = cols.pop("count", None)
        cols["rating"] = value if value is not None else cols.get("rating")
    missing = [r for r in (ROLES[:2] if implicit else ROLES[:3]) if r not in cols]
    problems = ([f"unknown column name(s) {', '.join(map(repr, unknown))}"] if unknown and not extra_ok else []) + \
               ([f"more than one {column_role(twice[0])} column" if column_role(twice[0]) != "count" else
                 "a rating and a count column (pass --implicit to read it as an interaction log)"] if twice else []) + \
               ([f"no {', '.join(missing[:-1]) + ' or ' if len(missing) > 1 else ''}{missing[-1]} column"]
                if missing else [])
    if problems:
        where = "line 1: header" if not extra_ok else "columns"
        raise InputError(
            f"{path}: {where} {','.join(names)}: {'; '.join(problems)}. Name the columns with --columns "
            f"USER,ITEM,RATING[,TIMESTAMP] (names or 0-based indices; USER,ITEM[,COUNT] for an interaction log), "
            f"or rename them to known names ({_NAMES_HINT})")
    cols.setdefault("timestamp", None)
    cols.setdefault("rating", None)
    return cols, implicit


def columns_roles(columns: str, implicit: bool = False) -> tuple[list[str], tuple[str, ...], bool]:
    """``(entries, roles, implicit)`` of a ``--columns`` value.

    Two entries (user, item) are an interaction log, each row one interaction; a third
    entry named as a count (``user,item,count``, :data:`COLUMN_NAMES`) or ``implicit``
    (``--implicit``) makes the third column an interaction log's count/weight.

    >>> columns_roles("user,item")[1:], columns_roles("u,i,plays")[1:], columns_roles("0,1,2")[1:]
    ((('user', 'item'), True), (('user', 'item', 'rating'), True), (('user', 'item', 'rating'), False))
    """
    given = [c.strip() for c in columns.split(",")]
    if len(given) not in (2, 3, 4) or not all(given):
        raise InputError(f"--columns: expected user,item,rating[,timestamp] (or user,item[,count] for an interaction "
                         f"log), got {columns!r}")
    implicit = implicit or len(given) == 2 or column_role(given[2]) == "count"
    return given, ROLES[:len(given)], implicit


@dataclass
class Spec:
    """How to read one input file (resolved by :func:`resolve_spec`)."""

    path: str
    format: str
    sep: str | None  # pyarrow delimiter after rewriting (one char), None for parquet
    rewrite: bytes | None  # multi-char separator to rewrite, b"" = whitespace runs, None = none
    header: bool
    n_fields: int
    cols: dict = field(default_factory=dict)  # role -> column index (text) or name (parquet)
    names: list = field(default_factory=list)  # column names (header or generated)
    #: An interaction log: ``cols["rating"]`` is its count/weight column, or ``None`` (every row one interaction).
    implicit: bool = False
    #: An in-memory source (:class:`streamdp.storage.frames.Frame`: a DataFrame, an Arrow table, a sparse
    #: matrix) read by record batches like a Parquet file; ``path`` is then its display name.
    frame: object = None

    @property
    def has_timestamp(self) -> bool:
        return self.cols.get("timestamp") is not None

    @property
    def columnar(self) -> bool:
        """Read by typed record batches (:func:`iter_parquet`: a Parquet file or an in-memory frame), not as text."""
        return self.format == "parquet" or self.frame is not None


# --------------------------------------------------------------------------------------
# opening and sniffing
# --------------------------------------------------------------------------------------


def _display(path: str) -> str:
    return os.path.basename(path) or path


def check_file(path: str) -> int:
    """Size in bytes of an input file, or an InputError naming it."""
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, not a ratings file")
    try:
        return os.path.getsize(path)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None


def _is_parquet(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"PAR1"


def _open_bytes(path: str):
    """A binary stream of the decompressed file content."""
    try:
        return pa.input_stream(path, compression="detect")
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"{path}: cannot open ({exc})") from None


def _first_lines(path: str, n: int = 5) -> list[str]:
    try:
        s = _open_bytes(path)
        data = s.read(1 << 16)
        s.close()
    except (pa.ArrowInvalid, OSError, EOFError) as exc:
        raise read_error(path, exc) from None
    if data.startswith(BOM):
        data = data[len(BOM):]
    if b"\x00" in data:
        raise InputError(f"{path}: line 1: binary data, not a text ratings file (use --format parquet for Parquet)")
    text = data.decode("utf-8", errors="replace")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(data) == 1 << 16 and lines:
        lines = lines[:-1] or lines  # the last line may be cut
    return lines[:n]


def split_fields(line: str, sep: str | None, rewrite: bytes | None) -> list[str]:
    """Split one text line the way the fast path does."""
    line = line.rstrip("\r\n")
    if rewrite == b"":
        return line.split()
    if rewrite is not None:
        return line.split(rewrite.decode())
    return line.split(sep)


def _parses(convert, s: str) -> bool:
    try:
        convert(s)
        return True
    except ValueError:
        return False


def _is_float(s: str) -> bool:
    return _parses(float, s)


def _is_int(s: str) -> bool:
    return _parses(int, s)


#: An integer id as written canonically (surrounding blanks aside): ``0`` or no leading zero, no ``+``. Ids
#: are integers only when every id is one, so that reading them back as text gives the ids as written:
#: ``007`` and ``7`` (or ``-0`` and ``0``) are two ids, not one integer.
CANONICAL_INT = r"^\s*(0|-?[1-9][0-9]*)\s*$"


def is_int_id(s: str) -> bool:
    """Whether the id field ``s`` is an integer in canonical form (:data:`CANONICAL_INT`).

    >>> [is_int_id(x) for x in ("7", " 42 ", "-3", "0", "007", "-0", "+7", "7.0", "")]
    [True, True, True, True, False, False, False, False, False]
    """
    return re.match(CANONICAL_INT, s) is not None and _is_int(s)


def id_column_as_int(arr: pa.Array, role: str) -> pa.Array:
    """A column of id text as int64; ``_IdNotInteger(role)`` unless every id is a canonical integer that fits."""
    if len(arr) == 0:
        return pa.array([], pa.int64())
    text = pc.utf8_trim_whitespace(arr)
    if not pc.all(pc.match_substring_regex(text, CANONICAL_INT)).as_py():
        raise _IdNotInteger(role)
    try:
        return pc.cast(text, pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # beyond int64: text
        raise _IdNotInteger(role) from None


def _sep_from_option(sep: str) -> tuple[str, bytes | None]:
    if sep in ("ws", "whitespace", " +", r"\s+"):
        return FIELD_SEP, b""
    sep = sep.encode().decode("unicode_escape") if "\\" in sep else sep
    if len(sep) == 1:
        return sep, None
    if not sep:
        raise InputError("--sep: empty separator")
    return FIELD_SEP, sep.encode()


def resolve_spec(path: str, *, fmt: str | None = None, sep: str | None = None, columns: str | None = None,
                 implicit: bool = False) -> Spec:
    """Detect (or apply the overrides for) the format of ``path``.

    ``implicit`` (``--implicit``) reads the file as an interaction log (user, item[,
    count]); without it a file is one when ``--columns`` or its header says so
    (:func:`columns_roles`, :func:`header_columns`).

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp(); p = os.path.join(d, "u.data")
    >>> _ = open(p, "w").write("196\\t242\\t3\\t881250949\\n186\\t302\\t3\\t891717742\\n")
    >>> s = resolve_spec(p); (s.format, s.header, s.cols)
    ('udata', False, {'user': 0, 'item': 1, 'rating': 2, 'timestamp': 3})
    """
    check_file(path)
    if fmt is not None and fmt not in FORMATS:
        raise InputError(f"--format: unknown format {fmt!r} (one of {', '.join(FORMATS)})")
    if fmt == "parquet" or (fmt is None and sep is None and _is_parquet(path)):
        return _parquet_spec(path, columns, implicit)
    lines = _first_lines(path)
    if not lines:
        raise InputError(f"{path}: empty file (no ratings)")
    first = lines[0]
    semicolon = False
    if sep is not None:
        delim, rewrite = _sep_from_option(sep)
        name = fmt or "custom"
    else:
        if fmt is None:
            if "::" in first:
                fmt = "dat"
            elif "\t" in first and len(first.split("\t")) >= 3 and all(
                    f and f == f.strip() for f in first.split("\t")):
                fmt = "udata"
            elif ";" in first and first.count(";") >= first.count(","):
                fmt, semicolon = "csv", True  # a spreadsheet export in a comma-decimal locale
            elif "," in first and len(first.split(",")) >= 2:
                fmt = "csv"
            elif len(first.split()) >= 2:
                fmt = "ws"
            else:
                raise InputError(
                    f"{path}: line 1: cannot detect the format (expected at least 3 fields separated by "
                    f"tab, '::', ',', ';' or spaces, or 2 for an interaction log); use --format/--sep/--columns"
                )
        name = fmt
        delim, rewrite = {"udata": ("\t", None), "dat": (FIELD_SEP, b"::"), "csv": (";" if semicolon else ",", None),
                          "ws": (FIELD_SEP, b"")}[fmt]
    fields = split_fields(first, delim, rewrite)
    n_fields = len(fields)
    header = False
    if columns is not None:
        roles, role_names, implicit = columns_roles(columns, implicit)
        if all(_is_int(c) for c in roles):
            idx = [int(c) for c in roles]
            if len(idx) > 2:
                rating_field = fields[idx[2]] if idx[2] < n_fields else ""
                header = not _is_float(rating_field)
            else:  # user, item only: a header names both
                header = all(i < n_fields and column_role(fields[i]) in ("user", "item") for i in idx)
        else:
            header = True
            lower = [f.strip().lower() for f in fields]
            idx = []
            for c in roles:
                if c.lower() not in lower:
                    raise InputError(f"{path}: line 1: no column named {c!r} in the header {fields}")
                idx.append(lower.index(c.lower()))
        for i in idx:
            if not 0 <= i < n_fields:
                raise InputError(f"{path}: line 1: column {i} out of range (the line has {n_fields} fields)")
        cols = dict(zip(role_names, idx))
    else:
        named = n_fields == 2 and all(column_role(f) in ("user", "item") for f in fields)
        if n_fields < 3 and not (implicit or named):
            raise InputError(f"{path}: line 1: expected at least 3 fields (user, item, rating), got {n_fields}; "
                             f"for an interaction log (user, item[, count] per line) pass --implicit")
        header = named or (n_fields >= 3 and not _is_float(fields[2]))
        if header:
            cols, implicit = header_columns(path, [f.strip() for f in fields], implicit=implicit)
        else:
            cols = {"user": 0, "item": 1, "rating": 2 if n_fields >= 3 else None,
                    "timestamp": 3 if n_fields >= 4 else None}
    cols.setdefault("rating", None)
    cols.setdefault("timestamp", None)
    data = lines[1] if header and len(lines) > 1 else (None if header else first)
    if cols["timestamp"] is not None and data is not None:
        dfields = split_fields(data, delim, rewrite)
        if len(dfields) == n_fields and not _is_int(dfields[cols["timestamp"]].strip().strip('"')):
            cols["timestamp"] = None  # not integer seconds: ignored (ties go to the last seen)
    return Spec(path=path, format=name, sep=delim, rewrite=rewrite, header=header, n_fields=n_fields,
                cols=cols, names=[f"f{i}" for i in range(n_fields)], implicit=implicit)


def _parquet_spec(path: str, columns: str | None, implicit: bool = False) -> Spec:
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"{path}: not a readable Parquet file ({exc})") from None
    return named_spec(path, list(schema.names), columns, implicit, fmt="parquet")


def named_spec(path: str, names: list, columns: str | None, implicit: bool = False, *, fmt: str,
               frame: object = None) -> Spec:
    """The :class:`Spec` of a source of named, typed columns (a Parquet file, an in-memory frame): its columns
    found by :data:`COLUMN_NAMES` (other columns ignored) or by ``columns`` (names or 0-based indices)."""
    lower = [n.lower() for n in names]
    cols: dict = {}
    if columns is not None:
        roles, role_names, implicit = columns_roles(columns, implicit)
        for role, c in zip(role_names, roles):
            if _is_int(c):
                if not 0 <= int(c) < len(names):
                    raise InputError(f"{path}: column {c} out of range (the file has {len(names)} columns)")
                cols[role] = names[int(c)]
            elif c.lower() in lower:
                cols[role] = names[lower.index(c.lower())]
            else:
                raise InputError(f"{path}: no column named {c!r} (columns: {names})")
    else:
        found, implicit = header_columns(path, names, extra_ok=True, implicit=implicit)
        cols = {role: None if j is None else names[j] for role, j in found.items()}
    cols.setdefault("rating", None)
    cols.setdefault("timestamp", None)
    return Spec(path=path, format=fmt, sep=None, rewrite=None, header=True, n_fields=len(names),
                cols=cols, names=names, implicit=implicit, frame=frame)


def sniff_id_kinds(spec: Spec) -> tuple[bool, bool]:
    """Whether the user and item ids of the first data lines look like integers."""
    if spec.columnar:
        import pyarrow.parquet as pq

        sch = spec.frame.schema if spec.frame is not None else pq.read_schema(spec.path)
        return (pa.types.is_integer(sch.field(spec.cols["user"]).type),
                pa.types.is_integer(sch.field(spec.cols["item"]).type))
    lines = _first_lines(spec.path, 6)[1 if spec.header else 0:]
    ok_u = ok_i = True
    for ln in lines:
        f = split_fields(ln, spec.sep, spec.rewrite)
        if len(f) != spec.n_fields:
            continue
        unquote = (lambda x: x[1:-1] if len(x) >= 2 and x[0] == x[-1] == '"' else x) if spec.format == "csv" \
            else (lambda x: x)
        ok_u &= is_int_id(unquote(f[spec.cols["user"]]))
        ok_i &= is_int_id(unquote(f[spec.cols["item"]]))
    return ok_u, ok_i


# --------------------------------------------------------------------------------------
# the fast path
# --------------------------------------------------------------------------------------


class _ByteStream(io.RawIOBase):
    """A readable stream over ``self.src`` whose subclasses define ``read``."""

    def __init__(self, src):
        super().__init__()
        self.src = src

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self.src.close()
        super().close()


class _Rewriter(_ByteStream):
    """A byte stream with a multi-character separator (or whitespace runs) rewritten to
    ``\\x1f``, processed a whole number of lines at a time."""

    _WS = re.compile(rb"[ \t\f\v]+")

    def __init__(self, raw, sep: bytes, chunk: int):
        super().__init__(raw)
        self.sep, self.chunk = sep, max(chunk, 1 << 16)
        self.buf = b""
        self.rest = b""
        self.eof = False

    def _convert(self, data: bytes) -> bytes:
        if self.sep:
            return data.replace(self.sep, b"\x1f")
        out = self._WS.sub(b"\x1f", data)
        out = out.replace(b"\n\x1f", b"\n").replace(b"\x1f\n", b"\n").replace(b"\x1f\r\n", b"\r\n")
        if out.startswith(b"\x1f"):
            out = out[1:]
        return out

    def _fill(self) -> None:
        while not self.buf and not self.eof:
            data = self.src.read(self.chunk)
            if not data:
                self.eof = True
                data, self.rest = self.rest, b""
                if data and not data.endswith(b"\n"):
                    data += b"\n"
            else:
                data = self.rest + data
                cut = data.rfind(b"\n") + 1
                data, self.rest = data[:cut], data[cut:]
            if data:
                self.buf = self._convert(data)

    def read(self, n: int = -1) -> bytes:
        self._fill()
        if n is None or n < 0 or n >= len(self.buf):
            out, self.buf = self.buf, b""
        else:
            out, self.buf = self.buf[:n], self.buf[n:]
        return out


class _IdNotInteger(Exception):
    """An id column did not parse as integers: restart the ingest with string ids."""

    def __init__(self, role: str):
        super().__init__(role)
        self.role = role


@dataclass
class Batch:
    """A parsed batch: ``user``/``item`` are Arrow arrays (int64 or string),
    ``rating`` float64 NumPy, ``timestamp`` int64 NumPy or None; ``row0`` is the file
    row (0-based data row) of the first entry, valid when no row was skipped before."""

    user: pa.Array
    item: pa.Array
    rating: np.ndarray
    timestamp: np.ndarray | None
    row0: int


def _coerce(arr: pa.Array, typ, role: str, skip: bool):
    """Cast a string column; returns (array, bad_mask or None)."""
    try:
        return pc.cast(arr, typ), None
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        if role in ("user", "item"):
            raise _IdNotInteger(role) from None
        if not skip:
            raise
    import pandas as pd

    # unparsable -> NaN (a literal "nan" rating is not finite, so bad anyway)
    vals = pd.to_numeric(pd.Series(arr.to_numpy(zero_copy_only=False)), errors="coerce").to_numpy(np.float64)
    bad = np.isnan(vals)
    if role == "timestamp":
        bad |= vals != np.floor(vals)
        vals = np.where(bad, 0, vals).astype(np.int64)
    return pa.array(vals), bad


_COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".lz4", ".br")


#: Uncompressed text files at least this large are parsed by several threads.
PARALLEL_MIN_BYTES = 32 << 20


def byte_ranges(path: str, parts: int, min_bytes: int | None = None) -> list[tuple[int, int] | None]:
    """Split an uncompressed text file into ``parts`` ranges cut just after a newline
    (so they can be parsed in parallel), or ``[None]`` (the whole file) when it is
    compressed or small."""
    size = os.path.getsize(path)
    min_bytes = PARALLEL_MIN_BYTES if min_bytes is None else min_bytes
    if parts <= 1 or size < min_bytes or path.lower().endswith(_COMPRESSED):
        return [None]
    cuts = [0]
    with open(path, "rb") as f:
        for j in range(1, parts):
            pos = max(size * j // parts, cuts[-1])
            f.seek(pos)
            while True:
                chunk = f.read(1 << 16)
                if not chunk:
                    pos = size
                    break
                k = chunk.find(b"\n")
                if k >= 0:
                    pos += k + 1
                    break
                pos += len(chunk)
            cuts.append(pos)
    cuts.append(size)
    return [(a, b) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]


class _RangeReader(_ByteStream):
    """Bytes ``[start, end)`` of a file."""

    def __init__(self, path: str, start: int, end: int):
        super().__init__(open(path, "rb"))
        self.src.seek(start)
        self.left = end - start

    def read(self, n: int = -1) -> bytes:
        n = self.left if n is None or n < 0 else min(n, self.left)
        data = self.src.read(n)
        self.left -= len(data)
        return data


def iter_text(spec: Spec, *, int_ids: tuple[bool, bool], block_size: int, skip: bool, bad: list,
              byte_range: tuple[int, int] | None = None) -> "iter[Batch]":
    """Stream-parse a text file (or the lines in ``byte_range``) into :class:`Batch` es.

    With ``skip``, rows with a wrong number of fields or unparsable numbers are
    dropped and counted in ``bad[0]``; otherwise pyarrow's error propagates (the
    caller then calls :func:`locate_error`). Raises ``_IdNotInteger`` when integer
    ids were assumed and a non-integer id appears.
    """
    roles = [r for r in ROLES if spec.cols.get(r) is not None]
    names = [f"f{i}" for i in range(spec.n_fields)]
    sel = {r: names[spec.cols[r]] for r in roles}
    want = {"user": pa.int64() if int_ids[0] else pa.string(), "item": pa.int64() if int_ids[1] else pa.string(),
            "rating": pa.float64(), "timestamp": pa.int64()}
    # with skip, numbers are parsed after the fact so that one bad value drops one row; ids are always read
    # as text and made integers by id_column_as_int (pyarrow's own int64 parsing takes 007 for 7)
    types = {sel[r]: pa.string() if skip or r in ("user", "item") else want[r] for r in roles}

    def on_invalid(row):
        if skip:
            bad[0] += 1
            return "skip"
        return "error"

    first = byte_range is None or byte_range[0] == 0
    ropts = pacsv.ReadOptions(block_size=int(block_size), column_names=names,
                              skip_rows=1 if spec.header and first else 0,
                              use_threads=True)
    popts = pacsv.ParseOptions(delimiter=spec.sep, quote_char='"' if spec.format == "csv" else False,
                               invalid_row_handler=on_invalid)
    copts = pacsv.ConvertOptions(column_types=types, include_columns=[sel[r] for r in roles], null_values=[],
                                 strings_can_be_null=False, quoted_strings_can_be_null=False)
    raw = _open_bytes(spec.path) if byte_range is None else _RangeReader(spec.path, *byte_range)
    src = _Rewriter(raw, spec.rewrite, block_size) if spec.rewrite is not None else raw

    def id_column_failed(exc):
        m = re.search(r"In CSV column #(\d+)", str(exc))
        if m:
            col = int(m.group(1))
            for k, r in enumerate(("user", "item")):
                if spec.cols[r] == col and int_ids[k]:
                    return _IdNotInteger(r)
        return None

    try:
        reader = pacsv.open_csv(src, read_options=ropts, parse_options=popts, convert_options=copts)
    except pa.ArrowInvalid as exc:
        src.close()
        if "Empty CSV file" in str(exc):
            return
        raise (id_column_failed(exc) or exc) from None
    except OSError as exc:  # reading the input failed (a truncated compressed file, an I/O error)
        src.close()
        raise read_error(spec.path, exc) from None
    row = 0
    try:
        for rb in reader:
            n = rb.num_rows
            if n == 0:
                continue
            cols = {r: rb.column(sel[r]) for r in roles}
            for k, r in enumerate(("user", "item")):
                if int_ids[k]:
                    cols[r] = id_column_as_int(cols[r], r)
            if skip:
                bad_mask = np.zeros(n, bool)
                out = {}
                for r in roles:
                    if r in ("user", "item"):
                        out[r] = cols[r]
                        continue
                    out[r], m = _coerce(cols[r], want[r], r, True)
                    if m is not None:
                        bad_mask |= m
                if bad_mask.any():
                    keep = to_arrow(~bad_mask)
                    bad[0] += int(bad_mask.sum())
                    out = {r: pc.filter(a, keep) for r, a in out.items()}
                cols = out
            rating = to_numpy(cols["rating"]).astype(np.float64, copy=False) \
                if "rating" in cols else np.ones(len(cols["user"]))  # an interaction log: one interaction a row
            ts = to_numpy(cols["timestamp"]).astype(np.int64, copy=False) \
                if "timestamp" in cols else None
            yield Batch(cols["user"], cols["item"], rating, ts, row)
            row += n
    except pa.ArrowInvalid as exc:
        raise (id_column_failed(exc) or exc) from None
    except OSError as exc:
        raise read_error(spec.path, exc) from None
    finally:
        src.close()


def row_group_ranges(spec: Spec, parts: int) -> list[tuple[int, int] | None]:
    """A Parquet file's row groups cut into up to ``parts`` consecutive runs ``(first, end)`` of about equal rows,
    parsed in parallel (:func:`iter_parquet`'s ``row_groups``); ``[None]`` (the whole file) for a frame, a file of
    one row group or one part."""
    import pyarrow.parquet as pq

    if spec.frame is not None or parts <= 1:
        return [None]
    try:
        md = pq.ParquetFile(spec.path).metadata
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputError(f"{spec.path}: not a readable Parquet file ({_first_line(exc)})") from None
    if md.num_row_groups < 2:
        return [None]
    ends = np.cumsum([md.row_group(g).num_rows for g in range(md.num_row_groups)])
    cuts = sorted({0, md.num_row_groups} | {int(np.searchsorted(ends, ends[-1] * j / parts)) + 1
                                             for j in range(1, parts)})
    return [(a, min(b, md.num_row_groups)) for a, b in zip(cuts, cuts[1:]) if a < min(b, md.num_row_groups)]


def iter_parquet(spec: Spec, *, int_ids: tuple[bool, bool], batch_rows: int,
                 row_groups: tuple[int, int] | None = None) -> "iter[Batch]":
    """Stream a Parquet file (or an in-memory frame, :attr:`Spec.frame`) by record batches; ``row_groups``: only
    the row groups ``first <= g < end`` (:func:`row_group_ranges`), rows numbered from the file's first."""
    import pyarrow.parquet as pq

    roles = [r for r in ROLES if spec.cols.get(r) is not None]
    row = 0
    if spec.frame is not None:
        batches = spec.frame.batches(int(batch_rows), [spec.cols[r] for r in roles])
    else:
        try:
            # pre_buffer=False: with it on (pyarrow's default) the reader keeps every row group's buffers it
            # read until the file is closed, ~8 bytes per row read (a 99M-row file held 1.4 GB under a 512 MB limit)
            pf = pq.ParquetFile(spec.path, pre_buffer=False)
            groups = None
            if row_groups is not None:
                groups = list(range(*row_groups))
                row = sum(pf.metadata.row_group(g).num_rows for g in range(row_groups[0]))
            batches = pf.iter_batches(batch_size=int(batch_rows), columns=[spec.cols[r] for r in roles],
                                      row_groups=groups)
        except (OSError, pa.ArrowInvalid) as exc:
            raise InputError(f"{spec.path}: not a readable Parquet file ({_first_line(exc)})") from None
    while True:
        try:
            rb = next(batches, None)
        except (OSError, pa.ArrowInvalid) as exc:  # a damaged or truncated page, with its row when known
            raise InputError(f"{spec.path}: damaged Parquet data after row {row} ({_first_line(exc)})") from None
        if rb is None:
            break
        n = rb.num_rows
        if n == 0:
            continue
        out = {}
        for r in roles:
            a = rb.column(spec.cols[r])
            if a.null_count:
                k = int(np.flatnonzero(to_numpy(a.is_null()))[0])
                if r == "rating":  # pandas reads NaN as missing: in a float column the two are one
                    what = "count" if spec.implicit else "rating"
                    raise InputError(f"{spec.path}: row {row + k + 1}: {what} is "
                                     + ("NaN or missing (not a finite number)" if pa.types.is_floating(a.type)
                                        else "missing"))
                raise InputError(f"{spec.path}: row {row + k + 1}: missing {r}")
            if r in ("user", "item"):
                want_int = int_ids[0 if r == "user" else 1]
                if want_int:
                    if not pa.types.is_integer(a.type):
                        raise _IdNotInteger(r)
                    try:
                        a = pc.cast(a, pa.int64())
                    except pa.ArrowInvalid:  # uint64 beyond int64: text
                        raise _IdNotInteger(r) from None
                else:
                    a = pc.cast(a, pa.string())
            elif r == "rating":
                try:
                    a = pc.cast(a, pa.float64())
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    if pa.types.is_integer(a.type):  # numeric, but beyond the integers a float holds exactly
                        v = a.to_numpy(zero_copy_only=False)
                        k = int(np.flatnonzero(np.abs(v.astype(np.float64)) > 2.0 ** 53)[0])
                        raise InputError(f"{spec.path}: row {row + k + 1}: "
                                         f"{'count' if spec.implicit else 'rating'} {int(v[k])} is out of range "
                                         f"(too large: beyond 2^53, the integers a float holds exactly)") from None
                    raise InputError(f"{spec.path}: column {spec.cols[r]!r} ({a.type}) is not numeric") from None
            else:
                try:
                    a = pc.cast(a, pa.int64()) if not pa.types.is_timestamp(a.type) else pc.cast(
                        pc.cast(a, pa.timestamp("s")), pa.int64())
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    raise InputError(f"{spec.path}: timestamp column {spec.cols[r]!r} ({a.type}) is not an "
                                     f"integer or timestamp") from None
            out[r] = a
        yield Batch(out["user"], out["item"],
                    to_numpy(out["rating"]) if "rating" in out else np.ones(n),
                    to_numpy(out["timestamp"]) if "timestamp" in out else None, row)
        row += n


# --------------------------------------------------------------------------------------
# the slow path: find the line of an error (only after the fast path failed)
# --------------------------------------------------------------------------------------


#: Python's own readers of compressed files (line by line, so that a truncated stream still yields every
#: complete line before it fails); other compressions pyarrow detects are read through pyarrow.
_PY_OPENERS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open, ".lzma": lzma.open}
#: What a damaged or truncated compressed stream raises while it is read.
_STREAM_ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError, pa.ArrowInvalid)


def _is_compressed(path: str) -> bool:
    return path.lower().endswith(_COMPRESSED) or path.lower().endswith(".lzma")


def _raw_lines(path: str):
    """``(line_number, bytes)`` of the decompressed file; a stream that breaks off is an
    :class:`InputError` naming the line where its data stops."""
    ext = os.path.splitext(path.lower())[1]
    lineno = 0
    try:
        if ext in _PY_OPENERS:
            f = _PY_OPENERS[ext](path, "rb")
        elif _is_compressed(path):
            f = pa.input_stream(path, compression="detect")
        else:
            f = open(path, "rb")
        with f:
            for raw in iter(f.readline, b""):
                lineno += 1
                yield lineno, raw
    except _STREAM_ERRORS as exc:
        if not _is_compressed(path):
            raise InputError(f"{path}: line {lineno + 1}: cannot read ({_first_line(exc)})") from None
        # the line being read when the data stopped: the last one yielded if it was cut, else the next
        cut = lineno if lineno and not raw.endswith(b"\n") else lineno + 1
        raise InputError(f"{path}: line {cut}: {_damaged(exc)}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _damaged(exc: BaseException) -> str:
    return (f"the compressed data ends early or is damaged ({_first_line(exc)}): the file is truncated or corrupt "
            f"(an interrupted download or copy?)")


def read_error(path: str, exc: BaseException) -> InputError:
    """The one-line error for a failure to read ``path`` (from pyarrow's fast path or the first lines).

    For a compressed file it re-reads the file in Python to name the line where the
    data stops (a truncated ``.gz``); otherwise it names the file and the reason.
    """
    if _is_compressed(path):
        try:
            for _ in _raw_lines(path):
                pass
        except InputError as located:
            return located
        return InputError(f"{path}: {_damaged(exc)}")
    return InputError(f"{path}: cannot read ({_first_line(exc)})")


def _text_lines(path: str):
    """``(line_number, str)`` of the file: UTF-8 (a leading byte-order mark dropped), decoded strictly; the
    first line that is not UTF-8 is an :class:`InputError` naming it."""
    for lineno, raw in _raw_lines(path):
        if lineno == 1 and raw.startswith(BOM):
            raw = raw[len(BOM):]
        try:
            yield lineno, raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            col = raw[:exc.start].decode("utf-8", errors="replace")
            raise InputError(
                f"{path}: line {lineno}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at character {len(col) + 1}); "
                f"streamdp reads UTF-8: convert the file first, e.g. iconv -f latin1 -t utf-8") from None


def check_fields(fields: list[str], spec: Spec, int_ids: tuple[bool, bool], rating_range) -> str | None:
    """Why one split line is bad, or None."""
    if len(fields) != spec.n_fields:
        return f"expected {spec.n_fields} fields, got {len(fields)}"
    if spec.format == "csv":
        fields = [f[1:-1] if len(f) >= 2 and f[0] == f[-1] == '"' else f for f in fields]
    c = spec.cols
    for r, want in (("user", int_ids[0]), ("item", int_ids[1])):
        if fields[c[r]] == "":
            return f"empty {r} id"
    if c.get("rating") is None:  # an interaction log without a count column: every line is one interaction
        r = "1"
    else:
        r = fields[c["rating"]]
    what = "count" if spec.implicit else "rating"
    try:
        v = float(r)
    except ValueError:
        return f"{what} {r!r} is not a number"
    if not math.isfinite(v):
        return f"{what} {r!r} is not finite"
    if not storable_ratings(v):
        return f"{what} {r!r} is not finite as a float32 (the store's values; at most {RATING_MAX_ABS:.4g} in size)"
    if spec.implicit and not v > 0:
        return not_positive_reason(v)
    if rating_range is not None and not (rating_range[0] <= v <= rating_range[1]):
        return out_of_range_reason(v, rating_range)
    if c.get("timestamp") is not None and not _is_int(fields[c["timestamp"]].strip()):
        return f"timestamp {fields[c['timestamp']]!r} is not an integer"
    return None


def not_positive_reason(v: float) -> str:
    """Why a count or weight of an interaction log is an error.

    >>> not_positive_reason(0)
    'count 0 is not positive (an interaction log counts interactions: each count or weight must be > 0)'
    """
    return f"count {v:g} is not positive (an interaction log counts interactions: each count or weight must be > 0)"


def out_of_range_reason(v: float, rating_range) -> str:
    """Why a rating outside the declared range is an error, and the options that accept it.

    >>> print(out_of_range_reason(7, (1, 5)))  # doctest: +NORMALIZE_WHITESPACE
    rating 7 outside --rating-range [1, 5] (--out-of-range clip or drop keeps such ratings clipped or drops them;
    --skip-bad-lines skips every bad line)
    """
    return (f"rating {v:g} outside --rating-range [{rating_range[0]:g}, {rating_range[1]:g}] (--out-of-range clip "
            f"or drop keeps such ratings clipped or drops them; --skip-bad-lines skips every bad line)")


def locate_error(spec: Spec, int_ids: tuple[bool, bool], rating_range, *, row: int | None = None) -> tuple[int, str]:
    """Re-read ``spec.path`` in Python and return ``(line_number, reason)``.

    With ``row`` (0-based data row as counted by the fast path), the line of that
    row; otherwise the first line that fails :func:`check_fields`. An in-memory frame
    has no lines: ``(0, "")``.
    """
    if spec.frame is not None:
        return 0, ""
    data_row = -1
    for lineno, line in _text_lines(spec.path):
        if lineno == 1 and spec.header:
            continue
        if not line.strip():
            continue
        data_row += 1
        fields = split_fields(line, spec.sep, spec.rewrite)
        if row is not None:
            if data_row == row:
                return lineno, check_fields(fields, spec, int_ids, rating_range) or "bad rating"
            continue
        why = check_fields(fields, spec, int_ids, rating_range)
        if why:
            return lineno, why
    return 0, ""


def error_at(spec: Spec, line: int, reason: str) -> InputError:
    where = f"line {line}" if line else "unknown line"
    return InputError(f"{spec.path}: {where}: {reason}")
