"""In-memory sources for ``streamdp.ingest``: pandas and polars DataFrames, Arrow tables, scipy.sparse matrices.

Each source becomes a :class:`~streamdp.storage.formats.Spec` whose :attr:`~streamdp.storage.formats.Spec.frame`
hands out Arrow record batches of at most ``batch_rows`` rows, read by the ingest pipeline
exactly like a Parquet file (:func:`streamdp.storage.formats.iter_parquet`): the same
validation, errors, duplicate handling and store. A batch is converted when it is read
(a slice of a DataFrame, a zero-copy slice of an Arrow table, a run of rows of a sparse
matrix), so no second copy of the whole source is made in memory; the pipeline spills
the parsed batches to disk as it does for files.

Columns are found as in a Parquet file: by the header names of
:data:`streamdp.storage.formats.COLUMN_NAMES` (``user``/``userId``, ``item``/``movieId``,
``rating``, ``timestamp``; a ``count``/``plays``/``clicks`` column, or user and item
columns alone, make an interaction log), other columns ignored, or named with
``columns`` (``"uid,iid,stars"`` or ``["uid", "iid", "stars"]``, names or 0-based
positions). The index of a pandas DataFrame is not read (``df.reset_index()`` makes it a
column).

Decisions where the request is loose:

* **Ids.** An integer column gives integer ids, a string (or categorical) column string
  ids, as a Parquet file's columns do. A floating-point id column is refused (an integer
  column holding a missing value becomes floats in pandas; its ids would otherwise
  become the text ``"1.0"``): cast it first. A missing value (``None``, ``NaN``,
  ``pd.NA``) anywhere is an error naming the row (0-based rows + 1, as for Parquet).
* **scipy.sparse.** Rows are users, columns items, and their ids are the row and
  column indices (int64); every *stored* entry is one rating (or, with
  ``implicit=True``, one count), an explicitly stored zero included (call
  ``eliminate_zeros()`` first to drop those; a zero count is refused like any count
  that is not positive). Rows and columns without a stored entry are not in the store.
  Duplicate entries of a matrix not in canonical form are read one by one, as repeated
  lines of a file: the last rating is kept, counts are summed (``sum_duplicates()``
  first gives scipy's meaning for ratings). CSR, CSC and COO are read in place; other
  formats (LIL, DOK, BSR, DIA) are converted to CSR first, which is a copy.
"""

from __future__ import annotations

import sys
from typing import Iterator

import numpy as np
import pyarrow as pa

from streamdp.errors import InputError, ParameterError
from streamdp.storage import formats as F


class Frame:
    """An in-memory source read by record batches: ``schema``, ``nbytes`` and ``batches(batch_rows, columns)``.

    Subclasses adapt one kind of object. ``batches`` may be called more than once (the
    ingest restarts its parse when ids it took for integers are not).
    """

    #: What the store's ``sources`` record and error messages call it.
    name = "frame"
    #: The ``format`` recorded in the store's ``sources``.
    format = "frame"

    @property
    def schema(self) -> pa.Schema:
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        raise NotImplementedError

    @property
    def n_rows(self) -> int:
        raise NotImplementedError

    def batches(self, batch_rows: int, columns: list) -> Iterator[pa.RecordBatch]:
        raise NotImplementedError


def _plain(a: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``a`` with dictionary (categorical) and large/view string types made plain; float ids refused."""
    if isinstance(a, pa.ChunkedArray):
        a = a.combine_chunks() if a.num_chunks != 1 else a.chunk(0)
    if pa.types.is_dictionary(a.type):
        a = a.dictionary_decode()
    if pa.types.is_large_string(a.type) or getattr(pa.types, "is_string_view", lambda t: False)(a.type):
        a = a.cast(pa.string())
    return a


def _check_schema(schema: pa.Schema, spec: F.Spec) -> None:
    for role in ("user", "item"):
        t = schema.field(spec.cols[role]).type
        if pa.types.is_floating(t) or pa.types.is_decimal(t):
            raise InputError(f"{spec.path}: column {spec.cols[role]!r} ({t}) holds numbers with a fraction; "
                             f"{role} ids are integers or strings: cast it first (e.g. "
                             f"df[{spec.cols[role]!r}].astype('int64'))")


class ArrowFrame(Frame):
    """A :class:`pyarrow.Table` or :class:`pyarrow.RecordBatch`: zero-copy slices of its batches."""

    name = "Arrow table"
    format = "arrow"

    def __init__(self, table):
        self.table = pa.Table.from_batches([table]) if isinstance(table, pa.RecordBatch) else table

    @property
    def schema(self) -> pa.Schema:
        head = self.table.slice(0, 1)
        return pa.schema([pa.field(f.name, _plain(head.column(f.name)).type) for f in head.schema])

    @property
    def nbytes(self) -> int:
        return int(self.table.nbytes)

    @property
    def n_rows(self) -> int:
        return self.table.num_rows

    def batches(self, batch_rows: int, columns: list) -> Iterator[pa.RecordBatch]:
        t = self.table.select(columns)
        for rb in t.to_batches(max_chunksize=batch_rows):
            yield pa.record_batch([_plain(rb.column(j)) for j in range(len(columns))],
                                  names=list(columns))


class PandasFrame(Frame):
    """A pandas DataFrame: each batch is ``batch_rows`` rows converted by ``pyarrow.Array.from_pandas``."""

    name = "pandas DataFrame"
    format = "pandas"

    def __init__(self, df):
        self.df = df
        labels = list(df.columns)
        self.names = [str(c) for c in labels]
        if len(set(self.names)) != len(self.names):
            raise InputError(f"{self.name}: column names {self.names} are not unique")
        self.label = dict(zip(self.names, labels))

    def _batch(self, a: int, b: int, columns: list) -> pa.RecordBatch:
        arrays = []
        for c in columns:
            col = self.df[self.label[c]].iloc[a:b]
            try:
                arr = pa.Array.from_pandas(col)
            except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise InputError(f"{self.name}: column {c!r}: cannot read it ({why}; mixed types? make the column "
                                 f"one type, e.g. .astype(str))") from None
            arrays.append(_plain(arr))
        return pa.record_batch(arrays, names=list(columns))

    @property
    def schema(self) -> pa.Schema:
        """Types of the first row (a column that does not convert is typed null: reading it names the error)."""
        fields = []
        for c in self.names:
            try:
                fields.append(pa.field(c, self._batch(0, 1, [c]).schema.field(0).type))
            except InputError:
                fields.append(pa.field(c, pa.null()))
        return pa.schema(fields)

    @property
    def nbytes(self) -> int:
        return int(self.df.memory_usage(index=False, deep=False).sum())

    @property
    def n_rows(self) -> int:
        return len(self.df)

    def batches(self, batch_rows: int, columns: list) -> Iterator[pa.RecordBatch]:
        for a in range(0, len(self.df), batch_rows):
            yield self._batch(a, a + batch_rows, columns)


class PolarsFrame(Frame):
    """A polars DataFrame: each batch is a ``slice(...).to_arrow()`` of ``batch_rows`` rows."""

    name = "polars DataFrame"
    format = "polars"

    def __init__(self, df):
        self.df = df

    @property
    def schema(self) -> pa.Schema:
        return ArrowFrame(self.df.head(1).to_arrow()).schema

    @property
    def nbytes(self) -> int:
        return int(self.df.estimated_size())

    @property
    def n_rows(self) -> int:
        return self.df.height

    def batches(self, batch_rows: int, columns: list) -> Iterator[pa.RecordBatch]:
        for a in range(0, self.df.height, batch_rows):
            t = self.df.slice(a, batch_rows).select(columns).to_arrow()
            yield pa.record_batch([_plain(t.column(c)) for c in columns], names=list(columns))


class SparseFrame(Frame):
    """A scipy.sparse matrix (rows users, columns items): stored entries as ``user, item, rating`` rows.

    CSR is read by runs of whole rows, CSC by runs of whole columns, COO by slices of its
    entry arrays (module docstring for other formats).
    """

    name = "scipy.sparse matrix"
    format = "scipy.sparse"

    def __init__(self, matrix, implicit: bool):
        fmt = matrix.format
        if fmt not in ("csr", "csc", "coo"):
            matrix = matrix.tocsr()
            fmt = "csr"
        self.m, self.fmt = matrix, fmt
        self.value = "count" if implicit else "rating"
        if matrix.dtype.kind not in "biuf":
            raise InputError(f"{self.name}: values of dtype {matrix.dtype} are not numbers")
        self._check_indices()

    def _check_indices(self) -> None:
        """Refuse (one line) a matrix whose stored indices are not within its shape: a negative index or one past
        it (scipy checks them when the matrix is built, not after its arrays are changed or with ``check=False``),
        and CSR/CSC row pointers that do not run from 0 to the number of entries without going back. Each would
        otherwise be stored as a user or item id outside the matrix."""
        m = self.m
        n_rows, n_cols = m.shape
        if self.fmt == "coo":
            pairs = (("row", m.row, n_rows), ("column", m.col, n_cols))
        else:
            ptr = np.asarray(m.indptr, np.int64)
            if len(ptr) != (n_rows if self.fmt == "csr" else n_cols) + 1 or (len(ptr) and ptr[0] != 0) \
                    or np.any(np.diff(ptr) < 0) or ptr[-1] != len(m.indices) or len(m.indices) != len(m.data):
                raise InputError(f"{self.name}: its {self.fmt.upper()} index pointers are not those of its shape "
                                 f"{n_rows}x{n_cols} (call check_format() on it)")
            pairs = (("column" if self.fmt == "csr" else "row", m.indices, n_cols if self.fmt == "csr" else n_rows),)
        for what, idx, bound in pairs:
            idx = np.asarray(idx)
            if len(idx) == 0:
                continue
            bad = np.flatnonzero((idx < 0) | (idx >= bound))
            if len(bad):
                k = int(bad[0])
                raise InputError(f"{self.name}: stored entry {k} has {what} index {int(idx[k])}, outside its shape "
                                 f"{n_rows}x{n_cols} ({what} indices run from 0 to {bound - 1})")

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([("user", pa.int64()), ("item", pa.int64()), (self.value, pa.float64())])

    @property
    def nbytes(self) -> int:
        m = self.m
        parts = (m.data, m.row, m.col) if self.fmt == "coo" else (m.data, m.indices, m.indptr)
        return int(sum(p.nbytes for p in parts))

    @property
    def n_rows(self) -> int:
        return int(self.m.nnz)

    def _runs(self, indptr: np.ndarray, batch_rows: int):
        """``(first, end)`` runs of whole rows (or columns) of at most ``batch_rows`` entries (or one row)."""
        n = len(indptr) - 1
        a = 0
        while a < n:
            b = int(np.searchsorted(indptr, indptr[a] + batch_rows, side="right")) - 1
            b = min(max(b, a + 1), n)
            yield a, b
            a = b

    def batches(self, batch_rows: int, columns: list) -> Iterator[pa.RecordBatch]:
        m = self.m
        if self.fmt == "coo":
            for a in range(0, m.nnz, batch_rows):
                yield self._batch(m.row[a:a + batch_rows], m.col[a:a + batch_rows], m.data[a:a + batch_rows],
                                  columns)
            return
        indptr = np.asarray(m.indptr, np.int64)
        for a, b in self._runs(indptr, batch_rows):
            s, e = indptr[a], indptr[b]
            if s == e:
                continue
            major = np.repeat(np.arange(a, b, dtype=np.int64), np.diff(indptr[a:b + 1]))
            minor = m.indices[s:e]
            users, items = (major, minor) if self.fmt == "csr" else (minor, major)
            yield self._batch(users, items, m.data[s:e], columns)

    def _batch(self, users, items, values, columns: list) -> pa.RecordBatch:
        cols = {"user": pa.array(np.asarray(users, np.int64)), "item": pa.array(np.asarray(items, np.int64)),
                self.value: pa.array(np.asarray(values, np.float64))}
        return pa.record_batch([cols[c] for c in columns], names=list(columns))


def _is_sparse(obj) -> bool:
    # a scipy.sparse matrix exists only once scipy.sparse is imported: a path does not import it (SciPy, ~30 MB,
    # would otherwise come into every `streamdp ingest` on top of its --memory-limit)
    sp = sys.modules.get("scipy.sparse")
    return sp is not None and sp.issparse(obj)


def is_frame(obj) -> bool:
    """Whether ``obj`` is an in-memory source :func:`frame_spec` reads (not a path)."""
    mod = type(obj).__module__.split(".")[0]
    return (isinstance(obj, (pa.Table, pa.RecordBatch)) or _is_sparse(obj)
            or (mod in ("pandas", "polars") and type(obj).__name__ == "DataFrame"))


def frame_spec_name(obj) -> str:
    """What a source is called in messages ("pandas DataFrame", "Arrow table", "scipy.sparse matrix")."""
    if _is_sparse(obj):
        return SparseFrame.name
    if isinstance(obj, (pa.Table, pa.RecordBatch)):
        return ArrowFrame.name
    return f"{type(obj).__module__.split('.')[0]} DataFrame"


def frame_spec(obj, *, columns=None, implicit: bool = False, name: str | None = None) -> F.Spec:
    """The ingest :class:`~streamdp.storage.formats.Spec` of an in-memory source (module docstring).

    Parameters
    ----------
    obj : pandas.DataFrame, polars.DataFrame, pyarrow.Table, pyarrow.RecordBatch or scipy.sparse matrix
    columns : str or sequence of str/int, optional
        ``user,item,rating[,timestamp]`` (or ``user,item[,count]``) as names or 0-based
        positions, like ``--columns``; not for a sparse matrix.
    implicit : bool
        Read it as an interaction log (its value column is a count/weight; for a
        sparse matrix, its stored values).
    name : str, optional
        The name error messages and the store's ``sources`` give it (default: its kind).

    >>> import pyarrow as pa
    >>> s = frame_spec(pa.table({"userId": [1, 2], "movieId": ["a", "b"], "rating": [4.0, 3.5], "title": ["x", "y"]}))
    >>> s.path, s.format, s.cols
    ('Arrow table', 'arrow', {'user': 'userId', 'item': 'movieId', 'rating': 'rating', 'timestamp': None})
    """
    if _is_sparse(obj):
        if columns is not None:
            raise ParameterError("columns: not for a scipy.sparse matrix (rows are users, columns items, stored "
                                 "values the ratings)")
        frame: Frame = SparseFrame(obj, implicit)
        label = name or frame.name
        if obj.shape[0] == 0 or obj.shape[1] == 0 or frame.n_rows == 0:
            raise InputError(f"{label}: no ratings (no stored entries)")
        cols = {"user": "user", "item": "item", "rating": frame.value, "timestamp": None}
        return F.Spec(path=label, format=frame.format, sep=None, rewrite=None, header=True, n_fields=3, cols=cols,
                      names=list(frame.schema.names), implicit=implicit, frame=frame)
    mod = type(obj).__module__.split(".")[0]
    if isinstance(obj, (pa.Table, pa.RecordBatch)):
        frame = ArrowFrame(obj)
    elif mod == "pandas" and type(obj).__name__ == "DataFrame":
        frame = PandasFrame(obj)
    elif mod == "polars" and type(obj).__name__ == "DataFrame":
        frame = PolarsFrame(obj)
    else:
        raise ParameterError(f"source: a {type(obj).__module__}.{type(obj).__name__} is not something ingest reads "
                             f"(a path, a pandas or polars DataFrame, a pyarrow Table or a scipy.sparse matrix)")
    label = name or frame.name
    if frame.n_rows == 0:
        raise InputError(f"{label}: no ratings (no rows)")
    if columns is not None and not isinstance(columns, str):
        columns = ",".join(str(c) for c in columns)
    spec = F.named_spec(label, list(frame.schema.names), columns, implicit, fmt=frame.format, frame=frame)
    _check_schema(frame.schema, spec)
    return spec
