"""Item names (``ingest --item-names FILE``): read a file of ``id,name`` lines, keep them in the store.

The store keeps them in the array ``item_names`` (str, indexed like ``item_ids``: ``""`` for an
item the file does not name) and the attribute ``item_names`` (the file's name and the counts
below). ``recommend`` joins them into its lists (:func:`streamdp.storage.store.RatingStore.item_names`).

**Names are public.** They are metadata the data owner supplies (a catalogue's titles), not
data of the users: nothing is computed from them, they are not covered by any privacy
guarantee and are copied as given into outputs (lists, Parquet files). A name that says
something about a user (a private playlist's title) must not be given here.

The file: UTF-8 text, one item a line. Its separator is detected from the first line:
tab, ``::`` (MovieLens 1M ``movies.dat``), ``|`` (MovieLens 100K ``u.item``, once converted to
UTF-8: ``iconv -f latin1 -t utf-8``), ``;`` or ``,`` (with ``"`` quoting: MovieLens
``movies.csv``). A first line whose first field is a header name of an item column
(``item``, ``itemId``, ``movieId``, ``id``...) is a header; its name column is the first
named ``name``, ``title``, ``item_name`` or ``label``, else the second column. Without a
header the id is the first field and the name the second; further fields are ignored.

Decisions: ids that are not items of the store are ignored and counted
(``n_unmatched``); an id of the store named twice is refused in one line naming the file and
the id (which name is meant is not ours to guess); string ids must match the store's exactly, integer
ids may have blanks around them (names are kept as written). Memory: the file is parsed in blocks; only the names
of the store's items are kept (they are item-side data, ``O(n_items)`` like the item ids),
and more than a quarter of ``--memory-limit`` of them is refused.
"""

from __future__ import annotations

import csv
import os
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from streamdp.errors import InputError, ParameterError
from streamdp.memory import format_size, resolve_memory_limit
from streamdp.storage import formats as F
from streamdp.storage.ids import as_ids, find, parse_id
from streamdp.storage.schema import is_store_dir
from streamdp.storage.store import RatingStore, open_store

#: Header names of the name column (normalized as :func:`streamdp.storage.formats.column_role` does).
NAME_COLUMNS = ("name", "title", "itemname", "movietitle", "label")
_ID_HEADERS = ("id",) + F.COLUMN_NAMES["item"]


def _norm(name: str) -> str:
    return re.sub(r"[\s_\-]", "", name.strip().strip('"').lower())


def _detect(path: str) -> tuple[str, bytes | None, bool, int, int, int]:
    """``(delimiter, rewrite, header, n_fields, id column, name column)`` from the first line."""
    lines = F._first_lines(path, 2)
    if not lines:
        raise InputError(f"{path}: empty file (no item names)")
    first = lines[0]
    if "\t" in first:
        delim, rewrite = "\t", None
    elif "::" in first:
        delim, rewrite = F.FIELD_SEP, b"::"
    elif "|" in first:
        delim, rewrite = "|", None
    elif ";" in first and first.count(";") >= first.count(","):
        delim, rewrite = ";", None
    elif "," in first:
        delim, rewrite = ",", None
    else:
        raise InputError(f"{path}: line 1: expected an item id and a name separated by a tab, '::', '|', ';' or ','")
    fields = _split(first, delim, rewrite)
    if len(fields) < 2:
        raise InputError(f"{path}: line 1: expected an item id and a name, got {len(fields)} field")
    header = _norm(fields[0]) in _ID_HEADERS
    name_col = 1
    if header:
        named = [j for j, f in enumerate(fields) if _norm(f) in NAME_COLUMNS]
        name_col = named[0] if named else 1
    return delim, rewrite, header, len(fields), 0, name_col


def _split(line: str, delim: str, rewrite: bytes | None) -> list[str]:
    if rewrite is not None:
        return line.rstrip("\r\n").split(rewrite.decode())
    return next(csv.reader([line.rstrip("\r\n")], delimiter=delim, quotechar='"' if delim in ",;" else None)) \
        if delim in ",;" else line.rstrip("\r\n").split(delim)


def _locate(path: str, delim: str, rewrite: bytes | None, header: bool, n_fields: int) -> InputError:
    """The one-line error for the first bad line (the slow path, after pyarrow failed)."""
    for lineno, line in F._text_lines(path):
        if (lineno == 1 and header) or not line.strip():
            continue
        got = len(_split(line, delim, rewrite))
        if got != n_fields:
            return InputError(f"{path}: line {lineno}: expected {n_fields} fields (an item id and a name), got {got}")
    return InputError(f"{path}: not a readable file of item names")


class ItemNames:
    """The names read for a store's items, by raw (sorted original id) item index, and what was read."""

    def __init__(self, path: str, names: pa.Array, n_lines: int, n_unmatched: int):
        self.path, self.names, self.n_lines, self.n_unmatched = path, names, n_lines, n_unmatched

    def write(self, writer, order: np.ndarray) -> None:
        """Write ``item_names`` in the store's item order (``order[k]``: the raw index of item ``k``)."""
        named = self.names.take(pa.array(order))
        self.n_named = len(named) - named.null_count - int(pc.sum(pc.equal(named, "")).as_py() or 0)
        writer.write_array("item_names", pc.fill_null(named, "").to_numpy(zero_copy_only=False),
                           chunks=(max(1, min(len(order), 1 << 16)),))

    def attrs(self) -> dict:
        return {"file": os.path.basename(self.path), "n_lines": self.n_lines, "n_named": self.n_named,
                "n_unmatched": self.n_unmatched, "public": True}


def _lookup(keys: pa.Array, ids: pa.Array) -> np.ndarray:
    """The index of each of ``ids`` in the sorted unique ``keys`` (-1: not a key)."""
    n = len(keys)
    if pa.types.is_integer(keys.type):
        text = pc.utf8_trim_whitespace(ids)
        ok = pc.match_substring_regex(text, F.CANONICAL_INT).to_numpy(zero_copy_only=False)
        out = np.full(len(ids), -1, np.int64)
        if ok.any():
            try:
                vals = pc.cast(pc.filter(text, pa.array(ok)), pa.int64()).to_numpy()
            except pa.ArrowInvalid:  # beyond int64: not an item of an integer-id store
                return out
            kn = keys.to_numpy()
            pos = np.minimum(np.searchsorted(kn, vals), n - 1)
            out[np.flatnonzero(ok)] = np.where(kn[pos] == vals, pos, -1)
        return out
    return pc.fill_null(pc.index_in(ids, value_set=keys), -1).to_numpy().astype(np.int64)


def read_item_names(path: str, items: pa.Array, memory_limit: int) -> ItemNames:
    """Read ``path`` (module docstring) for the store's items ``items`` (sorted original ids)."""
    F.check_file(path)
    delim, rewrite, header, n_fields, id_col, name_col = _detect(path)
    cols = [f"f{j}" for j in range(n_fields)]
    ropts = pacsv.ReadOptions(block_size=1 << 20, column_names=cols, skip_rows=1 if header else 0)
    popts = pacsv.ParseOptions(delimiter=delim, quote_char='"' if delim in ",;" else False)
    copts = pacsv.ConvertOptions(column_types={c: pa.string() for c in cols},
                                 include_columns=[cols[id_col], cols[name_col]], null_values=[],
                                 strings_can_be_null=False, quoted_strings_can_be_null=False)
    raw = F._open_bytes(path)
    src = F._Rewriter(raw, rewrite, 1 << 20) if rewrite is not None else raw
    where, names = [], []
    n_lines = n_unmatched = kept_bytes = 0
    cap = memory_limit // 4
    try:
        reader = pacsv.open_csv(src, read_options=ropts, parse_options=popts, convert_options=copts)
        for rb in reader:
            idx = _lookup(items, rb.column(0))
            hit = idx >= 0
            n_lines += rb.num_rows
            n_unmatched += int((~hit).sum())
            if hit.any():
                name = pc.filter(rb.column(1), pa.array(hit))
                kept_bytes += name.nbytes
                if kept_bytes > cap:
                    raise ParameterError(f"{path}: the names of the store's items take more than a quarter of "
                                         f"--memory-limit ({format_size(cap)}); raise --memory-limit")
                where.append(idx[hit])
                names.append(name)
    except pa.ArrowInvalid as exc:
        if "UTF8" in str(exc) or "utf8" in str(exc).lower():
            for _ in F._text_lines(path):  # names the first line that is not UTF-8
                pass
        raise _locate(path, delim, rewrite, header, n_fields) from None
    except OSError as exc:
        raise F.read_error(path, exc) from None
    finally:
        src.close()
    full = np.full(len(items), -1, np.int64)
    if where:
        pos = np.concatenate(where)
        seen, counts = np.unique(pos, return_counts=True)
        if len(seen) < len(pos):  # which of two names is meant is the owner's to say: refused, not guessed
            raise InputError(f"{path}: item id {items[int(seen[np.argmax(counts > 1)])].as_py()!r} is named "
                             f"more than once (give each item one name)")
        full[pos] = np.arange(len(pos))
        allnames = pa.concat_arrays(names)
    else:
        allnames = pa.array([], pa.string())
    taken = allnames.take(pa.array(full, mask=full < 0))
    return ItemNames(path, taken, n_lines, n_unmatched)


def _mapping(source) -> dict | None:
    """``{id: name}`` from a dict, a pandas Series (index: ids) or DataFrame (columns ``id``/``item``... and
    ``name``/``title``...; else two columns, id then name; or one column of names indexed by id); ``None`` for
    anything else. A repeated id keeps its last name, as in a file."""
    if isinstance(source, dict):
        return source
    if hasattr(source, "columns") and hasattr(source, "index"):  # a DataFrame
        cols = list(source.columns)
        ids = [c for c in cols if _norm(str(c)) in _ID_HEADERS]
        named = [c for c in cols if _norm(str(c)) in NAME_COLUMNS]
        if ids and named:
            return dict(zip(source[ids[0]].tolist(), source[named[0]].tolist()))
        if len(cols) == 2:
            return dict(zip(source[cols[0]].tolist(), source[cols[1]].tolist()))
        if len(cols) == 1:
            return dict(zip(source.index.tolist(), source[cols[0]].tolist()))
        raise InputError(f"item_names: a DataFrame needs columns id and name (or two columns: id, name), got "
                         f"{[str(c) for c in cols]}")
    if hasattr(source, "index") and hasattr(source, "tolist") and getattr(source, "ndim", 0) == 1:  # a Series
        return dict(zip(source.index.tolist(), source.tolist()))
    return None


def _from_mapping(mapping: dict, ids: np.ndarray) -> np.ndarray:
    """The names of ``ids`` from ``{id: name}`` (keys read as the ids' kind; a missing name, or NaN, is ``""``)."""
    is_num = ids.dtype.kind in "iu"
    names = {}
    for k, v in mapping.items():
        try:
            key = parse_id(k, is_num)
        except (TypeError, ValueError, OverflowError):
            continue  # not an id of this kind: names no item
        names[key] = "" if v is None or (isinstance(v, float) and v != v) else str(v)
    return np.array([names.get(i, "") for i in ids.tolist()], dtype=object)


def names_for(source, ids, memory_limit=None) -> np.ndarray:
    """The names (object array of ``str``, ``""`` when unnamed) of the original item ids ``ids``, from
    ``source``: a rating store that keeps names (a :class:`~streamdp.storage.store.RatingStore` or its path),
    a file of ``id,name`` lines (read as ``ingest --item-names`` reads it), or names held in Python: a dict
    ``{id: name}``, a pandas Series (index: ids) or DataFrame (``id`` and ``name`` columns, or two columns id
    then name, or one column of names indexed by id). Anything else is a one-line :class:`InputError`."""
    ids = as_ids(ids)
    mapping = _mapping(source)
    if mapping is not None:
        return _from_mapping(mapping, ids)
    if not isinstance(source, (str, os.PathLike, RatingStore)):
        raise InputError(f"item_names: expected a store, an id,name file, a DataFrame, a Series or a dict, got "
                         f"{type(source).__name__}")
    if isinstance(source, RatingStore) or is_store_dir(source):
        st = source if isinstance(source, RatingStore) else open_store(source)
        names = st.item_names()
        if names is None:
            raise InputError(f"{st.path}: the store keeps no item names (ingest it with --item-names FILE)")
        if not len(ids):
            return np.empty(0, object)
        pos = find(st.item_ids(), ids) if as_ids(st.item_ids()[:1]).dtype == ids.dtype else np.full(len(ids), -1)
        return np.where(pos >= 0, names[pos], "").astype(object)
    keys = np.unique(ids)
    got = read_item_names(str(source), pa.array(keys), resolve_memory_limit(memory_limit))
    names = pc.fill_null(got.names, "").to_numpy(zero_copy_only=False)
    return names[np.searchsorted(keys, ids)].astype(object) if len(ids) else np.empty(0, object)
