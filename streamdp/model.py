"""The released model: one directory layout written by every method.

::

    MODEL/
      privacy.json        the privacy ledger (streamdp.privacy.Ledger)
      model.json          method, rank, all parameters, the store's checksum, and
                          ``budget_entry``: the store-budget entry that released it
      factors.zarr/       Zarr group
        item_factors      float32 (n_items, k), in ascending item id order
        item_bias         float32 (n_items,)
        item_ids          original item ids (int64 or str), ascending
        <extras>          method-specific arrays (e.g. singular_values)
        attrs: global_mean

Items are released in ascending order of their original ids, never in the store's
order: a store numbers items by descending exact popularity (a statistic of the
data), and a release listed in that order would publish the popularity ranking
outside the accountant. Per-item arrays are permuted together
(``per_item_extras`` names the method-specific ones); evaluation maps a store's
items to the model's by id.

:func:`save_model` writes everything into a temporary directory beside ``out`` and
renames it into place (:func:`streamdp.outputs.install_dir`), so a failed or
interrupted run leaves no partial model; ``force`` replaces only an existing model
(:func:`is_model_dir`), never another file or directory.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field

import numpy as np
import zarr

from streamdp.batch import recommend_all
from streamdp.errors import InputError
from streamdp.local import recommend, user_scores
from streamdp.manifest import check_release
from streamdp.model_dir import MODEL_FORMAT, MODEL_FORMAT_VERSION, is_model_dir
from streamdp.outputs import check_destination, deferred_interrupts, install_dir, owned_temp_dir
from streamdp.privacy import Ledger
from streamdp.privacy.ledger import encode_json
from streamdp.storage.ids import as_ids, find, numeric, parse_id

_CORE_ARRAYS = ("item_factors", "item_bias", "item_ids")


@dataclass
class Model:
    """A loaded model (arrays in memory: item-side state only)."""

    path: str
    item_factors: np.ndarray
    item_bias: np.ndarray
    item_ids: np.ndarray
    global_mean: float
    info: dict
    ledger: object
    extras: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        g = getattr(self.ledger, "guarantee", None)
        eps = self.info.get("epsilon")
        return (f"Model({self.path!r}, method={self.method!r}, rank={self.rank}, n_items={self.n_items}, "
                f"epsilon={eps!r}, guarantee={g!r})")

    @property
    def n_items(self) -> int:
        return int(self.item_factors.shape[0])

    # -- what a user does with a released model (locally, at no privacy cost) ------------
    def _user(self, user_ratings):
        """``(dense items, ratings, unknown ids)`` from a dict, a DataFrame or (item, rating) pairs."""
        if hasattr(user_ratings, "columns"):  # a pandas DataFrame: 'item'/'rating' columns, or the first two
            cols = [c for c in ("item", "rating") if c in user_ratings.columns] or list(user_ratings.columns[:2])
            if len(cols) != 2:
                raise InputError("user_ratings: a DataFrame needs columns 'item' and 'rating'")
            pairs = zip(user_ratings[cols[0]].tolist(), user_ratings[cols[1]].tolist())
        elif isinstance(user_ratings, dict):
            pairs = user_ratings.items()
        else:
            pairs = user_ratings
        ids = np.asarray(self.item_ids)
        is_num = numeric(ids)
        keys, given, values, unknown = [], [], [], []
        for item, r in pairs:
            try:
                keys.append(parse_id(item, is_num))
            except (TypeError, ValueError, OverflowError):
                unknown.append(item)
                continue
            given.append(item)
            values.append(r)
        pos = find(ids, keys)
        unknown += [g for g, j in zip(given, pos.tolist()) if j < 0]
        items = [j for j in pos.tolist() if j >= 0]
        ratings = [float(r) for r, j in zip(values, pos.tolist()) if j >= 0]
        if not items:
            raise InputError("user_ratings: none of the rated items is known to the model")
        return np.asarray(items, np.int32), np.asarray(ratings, np.float32), unknown

    def predict(self, user_ratings, items=None, *, ridge: float | None = None) -> np.ndarray:
        """Predicted ratings of ``items`` (original ids; default: every item, in ``item_ids`` order) for a user.

        ``user_ratings`` is the user's own ratings: a dict ``{item_id: rating}``, a
        pandas DataFrame with ``item`` and ``rating`` columns, or ``(item, rating)``
        pairs; items the model does not know are ignored. The user's row is solved on
        their side (:mod:`streamdp.local`); nothing leaves the device.

        >>> import numpy as np
        >>> m = Model("(example)", np.eye(3, dtype=np.float32), np.zeros(3, np.float32), np.array([10, 20, 30]),
        ...           3.0, {"ridge": 1.0, "rating_range": {"min": 1, "max": 5}}, None)
        >>> m.predict({10: 5, 30: 1}, items=[20]).round(3).tolist()
        [3.0]
        """
        it, r, _ = self._user(user_ratings)
        scores = user_scores(self, it, r, ridge=ridge)
        if items is None:
            return scores
        ids = np.asarray(self.item_ids)
        want = list(items)
        try:
            keys = [parse_id(x, numeric(ids)) for x in want]
        except (TypeError, ValueError, OverflowError):
            keys = None
        j = find(ids, keys) if keys is not None else np.full(len(want), -1)
        if (j < 0).any():
            raise InputError(f"items: {want[int(np.flatnonzero(j < 0)[0])]!r} is not an item of the model")
        return scores[j]

    def recommend(self, user_ratings, n: int = 10, *, ridge: float | None = None) -> list:
        """The ``n`` best unseen items for a user, as ``(item_id, predicted_rating)`` pairs, best first.

        ``user_ratings`` as for :meth:`predict`.

        >>> import numpy as np
        >>> m = Model("(example)", np.eye(3, dtype=np.float32), np.zeros(3, np.float32), np.array([10, 20, 30]),
        ...           3.0, {"ridge": 1.0, "rating_range": {"min": 1, "max": 5}}, None)
        >>> [i for i, _ in m.recommend({10: 5}, n=2)]
        [20, 30]
        """
        it, r, _ = self._user(user_ratings)
        idx, score = recommend(self, it, r, top=n, ridge=ridge)
        ids = np.asarray(self.item_ids)[idx].tolist()
        return [(i, round(float(s), 6)) for i, s in zip(ids, score)]

    def recommend_all(self, store, n: int = 10, path=None, *, users=None, ridge: float | None = None, workers=None,
                      scheduler=None, memory_limit=None, force: bool = False):
        """Top-``n`` unseen items for every user of ``store`` (or the original ids in ``users``), each from her
        own training ratings: an iterator of pyarrow Tables ``user_id, rank, item_id, score`` (one per user
        block), or, with ``path``, a Parquet file written atomically (then a summary dict). See
        :mod:`streamdp.batch` (each list may be shown to its user, not published: joint DP)."""
        return recommend_all(self, store, n, path=path, users=users, ridge=ridge, workers=workers,
                             scheduler=scheduler, memory_limit=memory_limit, force=force)

    def save(self, out: str, *, force: bool = False) -> str:
        """Write the model to the directory ``out`` (atomically; ``force`` replaces only a model)."""
        return save_model(out, item_factors=self.item_factors, item_bias=self.item_bias, item_ids=self.item_ids,
                          global_mean=self.global_mean, model_info=self.info, ledger=self.ledger,
                          extras=self.extras, force=force)

    @property
    def rank(self) -> int:
        """Number of factors: the item rows' columns, less an ``ials`` model's popularity column."""
        return int(self.item_factors.shape[1]) - (1 if self.info.get("popularity_column") else 0)

    @property
    def method(self) -> str:
        return str(self.info.get("method", "?"))

    def in_order_of(self, item_ids) -> "Model":
        """This model with its per-item arrays reordered to ``item_ids`` (e.g. a store's dense order).

        Raises :class:`InputError` when an id is not one of the model's items.
        """
        ids, mine = as_ids(item_ids), as_ids(self.item_ids)
        pos = find(mine, ids) if ids.dtype == mine.dtype else np.full(len(ids), -1)
        if len(ids) != len(mine) or (pos < 0).any():
            raise InputError(f"{self.path}: the store's items are not the model's items")
        return Model(path=self.path, item_factors=self.item_factors[pos], item_bias=self.item_bias[pos],
                     item_ids=ids, global_mean=self.global_mean, info=self.info, ledger=self.ledger,
                     extras=self.extras)


def check_model_destination(out, force: bool) -> None:
    """Refuse an existing ``out`` unless ``force`` and it is a streamdp model (then it may be replaced)."""
    check_destination(out, force, what="model", is_ours=is_model_dir)


def save_model(out: str, *, item_factors, item_bias, item_ids, global_mean: float, model_info: dict, ledger,
               extras: dict | None = None, per_item_extras=(), force: bool = False) -> str:
    """Write a model directory atomically (temp dir + rename) and return its path.

    Parameters
    ----------
    out : str
        Destination directory; must not exist unless ``force``.
    item_factors : ndarray (n_items, k)
        Stored as float32.
    item_bias : ndarray (n_items,)
    item_ids : ndarray (n_items,)
        Original item ids in store item order.
    global_mean : float
    model_info : dict
        JSON-serializable description (method, rank, parameters, store checksum...).
    ledger : streamdp.privacy.Ledger
        Written as ``privacy.json``.
    extras : dict of str to ndarray, optional
        Additional arrays written into ``factors.zarr``.
    per_item_extras : iterable of str
        The extras indexed by item (first axis), permuted with the core arrays.
    force : bool
        Replace an existing model at ``out`` (anything else there is an error and is left untouched).
    """
    out = str(out).rstrip("/")
    check_model_destination(out, force)
    V = np.ascontiguousarray(item_factors, dtype=np.float32)
    if V.ndim != 2:
        raise ValueError(f"item_factors must be 2-D, got shape {V.shape}")
    n = V.shape[0]
    bias = np.ascontiguousarray(item_bias, dtype=np.float32)
    ids = np.asarray(item_ids)
    if bias.shape != (n,) or ids.shape != (n,):
        raise ValueError(f"item_bias {bias.shape} and item_ids {ids.shape} must have shape ({n},)")
    if not (np.all(np.isfinite(V)) and np.all(np.isfinite(bias)) and np.isfinite(global_mean)):
        raise ValueError("model arrays contain NaN or infinity")
    # release in ascending item id order: the store's order is the exact popularity ranking
    order = np.argsort(ids, kind="stable")
    V, bias, ids = np.ascontiguousarray(V[order]), bias[order], ids[order]
    extras = dict(extras or {})
    for name in per_item_extras:
        extras[name] = np.asarray(extras[name])[order]
    for name in extras:
        if name in _CORE_ARRAYS:
            raise ValueError(f"extra array name {name!r} clashes with a core array")
    info = dict(model_info)
    info.update(format=MODEL_FORMAT, format_version=MODEL_FORMAT_VERSION, n_items=int(n),
                rank=int(V.shape[1]), item_order="ascending item id")
    # every field must be declared with its provenance; a private model holds no exact statistic
    check_release(encode_json(info), ledger.to_dict(), [*_CORE_ARRAYS, *extras], ["global_mean"])
    parent = os.path.dirname(os.path.abspath(out)) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = owned_temp_dir(out, "tmp")  # records its owner; removes dead runs' temporary directories beside out
    try:
        # Ctrl-C is taken after the model is in place (or the write failed): Zarr writes on a
        # thread of its own, and a write cut off here could go on into a removed temp directory
        with deferred_interrupts():
            g = zarr.open_group(os.path.join(tmp, "factors.zarr"), mode="w")
            _put(g, "item_factors", V, chunks=(min(max(n, 1), 1 << 16), V.shape[1]))
            _put(g, "item_bias", bias)
            if ids.dtype.kind not in "iu":
                arr = g.create_array("item_ids", shape=ids.shape, dtype=str)
                arr[:] = np.array([str(x) for x in ids.tolist()], dtype=object)
            else:
                _put(g, "item_ids", ids.astype(np.int64))
            for name, arr in extras.items():
                _put(g, name, np.asarray(arr))
            g.attrs["global_mean"] = float(global_mean)
            with open(os.path.join(tmp, "model.json"), "w") as f:
                json.dump(encode_json(info), f, indent=2)
                f.write("\n")
            ledger.write(tmp)
            install_dir(tmp, out, force=force, what="model", is_ours=is_model_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _put(group, name: str, a: np.ndarray, chunks="auto") -> None:
    """Write ``a`` as array ``name`` of ``group`` (``create_array(data=...)`` exists only since zarr 3.1; the
    lower bound is 3.0.8)."""
    group.create_array(name, shape=a.shape, dtype=a.dtype, chunks=chunks)[...] = a


def _check_arrays(path: str, arrays: dict, global_mean: float, info: dict) -> None:
    """Refuse a model whose arrays do not fit together or hold NaN/infinity (one line naming the array)."""
    V = arrays["item_factors"]
    if V.ndim != 2:
        raise InputError(f"{path}/factors.zarr: item_factors has shape {V.shape}, not (n_items, rank)")
    n = V.shape[0]
    for name in ("item_bias", "item_ids"):
        if arrays[name].shape != (n,):
            raise InputError(f"{path}/factors.zarr: {name} has shape {arrays[name].shape}, not ({n},) like "
                             f"item_factors {V.shape}")
    rank = info.get("rank")
    if isinstance(rank, int) and rank != V.shape[1]:
        raise InputError(f"{path}/factors.zarr: item_factors has {V.shape[1]} columns, model.json says rank {rank}")
    for name, a in arrays.items():
        if name != "item_ids" and a.dtype.kind == "f" and not np.all(np.isfinite(a)):
            raise InputError(f"{path}/factors.zarr: {name} holds NaN or infinity: not a usable model")
    if not np.isfinite(global_mean):
        raise InputError(f"{path}/factors.zarr: global_mean is {global_mean}: not a usable model")


def load_model(path: str) -> Model:
    """Open a model directory written by :func:`save_model`."""
    path = str(path)
    mj = os.path.join(path, "model.json")
    if not os.path.isfile(mj):
        raise InputError(f"{path}: not a streamdp model (no model.json)")
    try:
        with open(mj) as f:
            info = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{mj}: unreadable ({exc})") from None
    if not isinstance(info, dict):
        raise InputError(f"{mj}: not a streamdp model description (a JSON object)")
    if info.get("format") != MODEL_FORMAT:
        raise InputError(f"{path}: not a streamdp model (format {info.get('format')!r})")
    if info.get("format_version") != MODEL_FORMAT_VERSION:
        raise InputError(f"{path}: model format version {info.get('format_version')}, this streamdp reads "
                         f"{MODEL_FORMAT_VERSION}")
    try:
        g = zarr.open_group(os.path.join(path, "factors.zarr"), mode="r")
        arrays = {name: g[name][:] for name in g.array_keys()}
        global_mean = float(g.attrs["global_mean"])
    except (FileNotFoundError, KeyError, ValueError, zarr.errors.GroupNotFoundError) as exc:
        raise InputError(f"{path}/factors.zarr: missing or corrupt ({exc.__class__.__name__}: {exc})") from None
    for name in _CORE_ARRAYS:
        if name not in arrays:
            raise InputError(f"{path}/factors.zarr: no array {name!r}")
    ledger = Ledger.read(path)
    _check_arrays(path, arrays, global_mean, info)
    ids = as_ids(arrays.pop("item_ids"))
    if len(ids) > 1 and not np.all(ids[1:] > ids[:-1]):
        raise InputError(f"{path}/factors.zarr: item ids are not unique and ascending (a model written by an older "
                         f"streamdp, whose item order leaks the store's popularity ranking: retrain it)")
    return Model(path=path, item_factors=np.asarray(arrays.pop("item_factors"), np.float32),
                 item_bias=np.asarray(arrays.pop("item_bias"), np.float32), item_ids=ids,
                 global_mean=global_mean, info=info, ledger=ledger, extras=arrays)

