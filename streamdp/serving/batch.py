"""Top-N recommendations for every user of a store: ``streamdp recommend MODEL --store STORE --out recs.parquet``.

Each user's list is what :func:`streamdp.serving.local.recommend` would give her on her own
device: her row solved from the released model and her own *training* ratings, every
item she did not rate scored, the ``n`` best kept (ranked by the model's list score,
:func:`streamdp.serving.local.list_scorer`, ties by ascending item id; the score written is the
predicted rating clipped to the rating range). Streamed block by block on the engine (local threads or a Dask
cluster) with the scoring as float32 matrix products over tiles of a block's users and the
selection in Numba (:func:`streamdp.kernels.topk.topn_blocked`: the lists and scores of
the per-user kernel :func:`streamdp.kernels.topk.topn_scores`, bit for bit), so memory
is bounded by ``--memory-limit`` whatever the number of users.

**What this is under joint DP.** The model is the release; the lists are not. Each
user's list depends on the released model and on that user's own ratings only, so
showing a user her own list keeps the joint-DP guarantee (Kearns et al.): the other
users' lists together reveal nothing more about her than the model does. The file
as a whole holds every user's list, computed from every user's ratings: it is the
data owner's to serve, one list to each user, **not to publish**.

Output: Parquet (pyarrow), one row per (user, rank): ``user_id, rank, item_id,
score`` with the original ids (integers or strings, as ingested), users in the
store's order, ranks from 1; and ``item_name`` after ``item_id`` when the store keeps
item names (``ingest --item-names``: public metadata, :mod:`streamdp.storage.names`) or
``item_names`` names a source of them. Written to a temporary file beside ``--out`` and renamed
into place when complete: a failed or interrupted run leaves no partial file.
"""

from __future__ import annotations

import os
import time

import numpy as np

from streamdp.errors import InputError, ParameterError, StoreError
from streamdp.kernels.topk import TILE_BYTES, topn_blocked, topn_prepare
from streamdp.outputs import deferred_interrupts
from streamdp.serving.local import (check_finite, list_bias, list_model, local_design, model_ridge, predict_block,
                                    score_range, solve_block)
from streamdp.storage.catalogue import catalogue_view
from streamdp.storage.ids import as_ids, find, numeric, parse_id, utf8_lines
from streamdp.storage.store import RatingStore, open_store
from streamdp.stream.engine import Engine

#: The columns of the output, in order.
COLUMNS = ("user_id", "rank", "item_id", "score")


def dense_users(store, keys) -> np.ndarray:
    """The dense index of each original user id in ``keys`` (-1 where it is not a user of ``store``).

    Looked up block by block: the store's user ids are never all in memory at once.
    """
    dense = np.full(len(keys), -1, np.int64)
    for b in range(store.n_blocks):
        first, end = store.block_range(b)
        pos = find(store.user_ids(first, end), keys)
        hit = pos >= 0
        dense[hit] = first + pos[hit]
    return dense


def read_user_list(path: str, store) -> np.ndarray:
    """The dense indices (sorted, unique) of the users listed in ``path``: one original user id per line.

    Blank lines and lines starting with ``#`` are skipped, as is a header line
    ``user_id`` (or ``user``) on the first line. An id that is not of the store's kind
    (a non-integer for integer ids) or not a user of the store is an
    :class:`InputError` naming the file and line.
    """
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file")
    is_num = numeric(store.user_ids(0, min(1, store.n_users)))
    keys, texts, lines = [], [], []
    with open(path, newline="", encoding="utf-8-sig") as f:
        for lineno, line in enumerate(utf8_lines(f, path), 1):
            text = line.strip()
            if not text or text.startswith("#") or (not keys and text.lower() in ("user_id", "user")):
                continue
            try:
                keys.append(parse_id(text, is_num))
            except ValueError:
                raise InputError(f"{path}:{lineno}: user id {text!r} is not an integer (the store's user ids are "
                                 f"integers)") from None
            texts.append(text)
            lines.append(lineno)
    if not keys:
        raise InputError(f"{path}: no user ids")
    dense = dense_users(store, keys)
    missing = np.flatnonzero(dense < 0)
    if len(missing):
        i = int(missing[0])
        raise InputError(f"{path}:{lines[i]}: user {texts[i]} is not a user of {store.path}"
                         + (f" ({len(missing)} ids in all are not)" if len(missing) > 1 else ""))
    return np.unique(dense)


def _prepare(model, store, n, users, ridge, item_names=None):
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise ParameterError(f"--top must be a positive integer, got {n}")
    m = model
    st = store if isinstance(store, RatingStore) else open_store(store)
    st.check_chunks()
    # the model's items are its catalogue: each user's ratings of other items are left out, and only its items
    # are listed (streamdp.storage.catalogue)
    st = catalogue_view(getattr(st, "_catalogue_base", st), as_ids(m.item_ids))
    ids = st.item_ids()
    if st.n_items != m.n_items or np.asarray(m.item_ids).dtype != ids.dtype or (find(m.item_ids, ids) < 0).any():
        raise StoreError(f"{st.path}: the store's items are not the items of the model {m.path}")
    tiekey = find(m.item_ids, ids)
    mo = m.in_order_of(ids)
    ridge = model_ridge(m, ridge)
    if users is None:
        wanted = None
    elif isinstance(users, (str, os.PathLike)):
        wanted = read_user_list(str(users), st)
    else:  # Python API: original ids
        is_num = numeric(st.user_ids(0, min(1, st.n_users)))
        keys = [parse_id(u, is_num) for u in users]
        dense = dense_users(st, keys)
        if (dense < 0).any():
            raise InputError(f"users: {keys[int(np.flatnonzero(dense < 0)[0])]!r} is not a user of {st.path}")
        wanted = np.unique(dense)
    if item_names is None or item_names is True:  # True: the store's names, which it must keep
        names = st.item_names()
        if names is None and item_names is True:
            raise InputError(f"item_names=True: {st.path} keeps no item names (ingest it with --item-names FILE, or "
                             f"give item_names a file, a DataFrame, a Series or a dict)")
    elif item_names is False:
        names = None
    else:
        from streamdp.storage.names import names_for  # pyarrow: not loaded by `train` (docs/scale.md)

        names = names_for(item_names, ids)
    return m, st, mo, ids, tiekey, ridge, wanted, names


def _schema(st, item_ids, names=None):
    import pyarrow as pa  # 42 MB of RSS: loaded by the commands that write lists, not by `train` (docs/scale.md)

    uk = pa.int64() if numeric(st.user_ids(0, min(1, st.n_users))) else pa.string()
    ik = pa.int64() if numeric(item_ids) else pa.string()
    named = [("item_name", pa.string())] if names is not None else []
    return pa.schema([("user_id", uk), ("rank", pa.int32()), ("item_id", ik), *named, ("score", pa.float32())])


def _tables(m, st, mo, ids, tiekey, ridge, wanted, n, schema, names=None, *, workers, scheduler, memory_limit):
    """Yield one pyarrow Table per block (users in store order, ranks from 1)."""
    import pyarrow as pa

    lm = list_model(m)  # a lists part ranks (streamdp.methods._lists); the score written is the model's prediction
    lo_ = mo if lm is m else lm.in_order_of(mo.item_ids)
    l_ridge = ridge if lm is m else model_ridge(lm)
    Q, bias = local_design(lo_)
    rank_bias = list_bias(lm, bias, tiekey)  # the list score's item term; the score written is the prediction
    offset = rank_bias - bias
    mu = float(lo_.global_mean)
    lo, hi = score_range(mo)
    tiekey = np.ascontiguousarray(tiekey, np.int64)
    prepared = topn_prepare(Q, rank_bias, mu)  # the item side of the scoring, once
    if wanted is None:
        blocks = None
    else:
        blocks = np.unique(np.searchsorted([st.block_range(b)[1] for b in range(st.n_blocks)], wanted, "right"))
    item_kind = schema.field("item_id").type

    def fn(block, b):
        nu = block.n_users
        first = block.first_user
        if wanted is None:
            want = np.ones(nu, np.uint8)
        else:
            want = np.zeros(nu, np.uint8)
            sel = wanted[(wanted >= first) & (wanted < first + nu)] - first
            want[sel] = 1
        U = solve_block(lo_, block.indptr, block.items, block.ratings, l_ridge)
        check_finite(lo_, U, "users' local solutions")
        lists = np.empty((nu, n), np.int32)
        scores = np.empty((nu, n), np.float64)
        topn_blocked(np.asarray(block.indptr, np.int64), np.asarray(block.items, np.int32), want,
                     np.ascontiguousarray(U, np.float64), Q, rank_bias, mu, tiekey, lists, scores, prepared=prepared)
        ok = lists >= 0
        check_finite(lo_, scores[ok], "scores")
        if lm is m:
            pred = scores[ok] - offset[lists[ok]]
        else:  # the rating model's predictions of the items listed
            Um = solve_block(mo, block.indptr, block.items, block.ratings, ridge)
            check_finite(mo, Um, "users' local solutions")
            row_counts = ok.sum(axis=1)
            pred = predict_block(mo, Um, np.concatenate([[0], np.cumsum(row_counts)]).astype(np.int64),
                                 lists[ok].astype(np.int32))
        row, rank = np.nonzero(ok)  # row-major: by user, then rank
        uids = st.user_ids(first, first + nu)[row]
        named = [pa.array(names[lists[ok]], pa.string())] if names is not None else []
        return pa.table([pa.array(uids, type=schema.field("user_id").type), pa.array(rank + 1, pa.int32()),
                         pa.array(ids[lists[ok]], type=item_kind), *named,
                         pa.array(np.clip(pred, lo, hi).astype(np.float32), pa.float32())], schema=schema)

    k = Q.shape[1]
    with Engine(st, workers=workers, scheduler=scheduler, memory_limit=memory_limit,
                state_bytes=Q.nbytes * 5) as eng:  # Q, its float32 and transposed copies; the tables
        per_block = st.block_users * (n * 48 + 8 * (k + 2)) + max(TILE_BYTES, 4 * st.n_items) + 16 * st.n_items
        # lists, scores, the table; U; a float32 score tile; the candidate kernel's item arrays
        for _, table in eng.imap(fn, blocks=blocks, extra_per_block=per_block, desc="recommend"):
            yield table
    st.check_unchanged()


def recommend_all(model, store, n: int = 10, *, path=None, users=None, ridge: float | None = None, workers=None,
                  scheduler=None, memory_limit=None, force: bool = False, item_names=None):
    """Top-``n`` unseen items of every user of ``store`` (or of ``users``) from ``model``.

    Parameters
    ----------
    model : Model
        A loaded model (:meth:`streamdp.serving.model.Model.recommend_all` is the public entry point).
    store : str or RatingStore
        Its items must be the model's items; each user's training ratings are her own data.
    n : int
        Items per user (fewer for a user who rated nearly everything). More than the store's items is
        capped at their number (a list cannot be longer), and the summary's ``note`` says so: it used to
        size every block's lists by ``n`` and blame ``--memory-limit`` ("one block needs 14.4 GB").
    path : str, optional
        Write Parquet there (temporary file + rename) and return a summary dict;
        without it, return an iterator of :class:`pyarrow.Table` (one per user block).
    users : str or iterable, optional
        A file of original user ids (one a line), or the ids themselves.
    force : bool
        Replace an existing file at ``path``.
    item_names : str, RatingStore, DataFrame, Series, dict or bool, optional
        Where the ``item_name`` column comes from: a store keeping names, an ``id,name`` file, or names held in
        Python (a DataFrame, a Series indexed by id, a dict) (:func:`streamdp.storage.names.names_for`); ``True``:
        ``store``'s names, which it must keep; ``False``: no names. Default: ``store``'s names, if it keeps any.
    """
    m, st, mo, ids, tiekey, ridge, wanted, names = _prepare(model, store, n, users, ridge, item_names)
    asked, n = int(n), min(int(n), st.n_items)
    schema = _schema(st, ids, names)
    kw = dict(workers=workers, scheduler=scheduler, memory_limit=memory_limit)
    if path is None:
        return _tables(m, st, mo, ids, tiekey, ridge, wanted, n, schema, names, **kw)
    res = _write(str(path), _tables(m, st, mo, ids, tiekey, ridge, wanted, n, schema, names, **kw), schema,
                 force=force, n=n)
    if asked > n:
        res["top_requested"] = asked
        res["note"] = (f"--top {asked} is more than the store's {st.n_items} items: each list holds at most "
                       f"{st.n_items} (the items its user has not rated)")
    return res


def _write(path: str, tables, schema, *, force: bool, n: int) -> dict:
    import pyarrow.parquet as pq

    def check():
        if os.path.lexists(path) and not force:
            raise StoreError(f"{path}: already exists (use --force to overwrite it)")
        if os.path.lexists(path) and (os.path.islink(path) or not os.path.isfile(path)):
            raise StoreError(f"{path}: exists and is not a file; --force replaces only a file, so it was left "
                             f"untouched")

    check()
    t0 = time.perf_counter()
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise StoreError(f"{path}: directory {d} does not exist")
    tmp = os.path.join(d, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    rows = users = 0
    try:
        with pq.ParquetWriter(tmp, schema) as w:
            for t in tables:
                if t.num_rows:
                    w.write_table(t)
                    rows += t.num_rows
                    users += int((t.column("rank").to_numpy() == 1).sum())
        with deferred_interrupts():
            check()
            os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    return {"out": path, "rows": rows, "users": users, "top": n, "columns": list(schema.names),
            "seconds": round(time.perf_counter() - t0, 3)}
