"""The released model: one directory layout written by every method.

::

    MODEL/
      privacy.json        the privacy ledger (streamdp.privacy.Ledger)
      model.json          method, rank, all parameters, the store's keyed fingerprint, and
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

from streamdp.errors import InputError, ParameterError
from streamdp.manifest import check_release, released_digest
from streamdp.model_dir import MODEL_FORMAT, MODEL_FORMAT_VERSION, is_model_dir
from streamdp.outputs import check_destination, deferred_interrupts, install_dir, owned_temp_dir
from streamdp.privacy import Ledger
from streamdp.privacy.ledger import encode_json
from streamdp.serving.batch import recommend_all
from streamdp.serving.local import default_list_scorer, popular_list, recommend, user_scores
from streamdp.serving.serve import Summary, check_n, describe, recommend_arrays, recommend_user, similar_items
from streamdp.storage.ids import as_ids, find, numeric, parse_id

_CORE_ARRAYS = ("item_factors", "item_bias", "item_ids")


class Recommendations(list):
    """A list of ``(item_id, predicted_rating)`` pairs, best first, that says where it comes from.

    ``source`` is ``"model"`` (the user's own list) or ``"most_popular"`` (none of her
    rated items is known to the model: the fallback list of
    :func:`streamdp.serving.local.popular_list`, not personalised); ``note`` says so in words
    (empty for ``"model"``). ``names``: the items' names, in list order, when they are
    known (:meth:`Model.recommend_user` on a store that keeps names), else ``None``.
    """

    def __init__(self, pairs, source: str = "model", note: str = "", names: list | None = None):
        super().__init__(pairs)
        self.source, self.note, self.names = source, note, names


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
    #: Items added by :meth:`padded_to` (not the model's: never listed), ``None`` for a model as released.
    unlisted: np.ndarray | None = None

    def __repr__(self) -> str:
        g = getattr(self.ledger, "guarantee", None)
        eps = getattr(self.ledger, "epsilon", self.info.get("epsilon"))
        return (f"Model({self.path!r}, method={self.method!r}, rank={self.rank}, n_items={self.n_items}, "
                f"epsilon={eps!r}, guarantee={g!r})")

    @property
    def n_items(self) -> int:
        return int(self.item_factors.shape[0])

    # -- what a user does with a released model (locally, at no privacy cost) ------------
    def _user(self, user_ratings, allow_none: bool = False):
        """``(dense items, ratings, unknown ids)`` from a dict, a DataFrame or (item, rating) pairs.

        No known item is an :class:`InputError`, or, with ``allow_none``, empty arrays."""
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
        if isinstance(pairs, (str, bytes)) or not hasattr(pairs, "__iter__"):
            raise ParameterError(f"user_ratings: expected a dict {{item: rating}}, a DataFrame with item and rating "
                                 f"columns or (item, rating) pairs, got {type(user_ratings).__name__}")
        for pair in pairs:
            try:
                item, r = pair
            except (TypeError, ValueError):
                raise ParameterError(f"user_ratings: expected (item, rating) pairs (or a dict {{item: rating}}), got "
                                     f"the element {pair!r}") from None
            if isinstance(r, (bool, np.bool_)) or not isinstance(r, (int, float, np.integer, np.floating)):
                raise ParameterError(f"user_ratings: the rating of item {item!r} is {r!r}, not a number")
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
        if not items and not allow_none:
            raise InputError("user_ratings: none of the rated items is known to the model")
        return np.asarray(items, np.int32), np.asarray(ratings, np.float32), unknown

    def predict(self, user_ratings, items=None, *, ridge: float | None = None) -> np.ndarray:
        """Predicted ratings of ``items`` (original ids; default: every item, in ``item_ids`` order) for a user.

        ``user_ratings`` is the user's own ratings: a dict ``{item_id: rating}``, a
        pandas DataFrame with ``item`` and ``rating`` columns, or ``(item, rating)``
        pairs; items the model does not know are ignored. The user's row is solved on
        their side (:mod:`streamdp.serving.local`); nothing leaves the device.

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

    def recommend(self, user_ratings, n: int = 10, *, ridge: float | None = None) -> "Recommendations":
        """The ``n`` best unseen items for a user, as ``(item_id, predicted_rating)`` pairs, best first.

        ``user_ratings`` as for :meth:`predict`. Ranked by the model's list score
        (:func:`streamdp.serving.local.list_scorer`). When none of the rated items is known to
        the model, the list is the most popular items by the model's released counts
        (:func:`streamdp.serving.local.popular_list`), and the returned
        :class:`Recommendations` says so (``source == "most_popular"``, ``note``).

        >>> import numpy as np
        >>> m = Model("(example)", np.eye(3, dtype=np.float32), np.zeros(3, np.float32), np.array([10, 20, 30]),
        ...           3.0, {"ridge": 1.0, "rating_range": {"min": 1, "max": 5}}, None)
        >>> [i for i, _ in m.recommend({10: 5}, n=2)]
        [20, 30]
        """
        n = check_n(n)
        it, r, _ = self._user(user_ratings, allow_none=True)
        source, note = "model", ""
        if len(it):
            idx, score = recommend(self, it, r, top=n, ridge=ridge)
        else:
            idx, score, what = popular_list(self, n)
            source, note = "most_popular", f"none of the rated items is known to the model: {what} (not personalised)"
        ids = np.asarray(self.item_ids)[idx].tolist()
        return Recommendations([(i, round(float(s), 6)) for i, s in zip(ids, score)], source, note)

    def recommend_all(self, store, n: int = 10, path=None, *, users=None, ridge: float | None = None, workers=None,
                      scheduler=None, memory_limit=None, force: bool = False, as_arrays: bool = False,
                      item_names=None):
        """Top-``n`` unseen items for every user of ``store`` (or the original ids in ``users``), each from her
        own training ratings: an iterator of pyarrow Tables ``user_id, rank, item_id, score`` (one per user
        block), or, with ``path``, a Parquet file written atomically (then a summary dict), or, with
        ``as_arrays=True``, NumPy arrays ``(user_ids, item_ids, scores)`` (:class:`streamdp.serving.serve.Recommendations`:
        ``item_ids`` and ``scores`` have ``n`` columns, best first). See :mod:`streamdp.serving.batch` (each list may be
        shown to its user, not published: joint DP). The tables and the file have an ``item_name`` column
        when the store keeps item names or ``item_names`` (a store, an ``id,name`` file, a DataFrame, a Series
        indexed by id or a dict; ``True``: the store's, ``False``: none) gives them; the arrays do not.
        """
        n = check_n(n)
        kw = dict(users=users, ridge=ridge, workers=workers, scheduler=scheduler, memory_limit=memory_limit)
        if item_names is not None:
            kw["item_names"] = item_names
        if as_arrays:
            if path is not None:
                raise ParameterError("recommend_all: give either path (a Parquet file) or as_arrays=True")
            return recommend_arrays(self, store, n, **kw)
        return recommend_all(self, store, n, path=path, force=force, **kw)

    def recommend_user(self, store, user_id, n: int = 10, *, ridge: float | None = None) -> list:
        """The ``n`` best items for a user of ``store`` by her original id, as :meth:`recommend` gives them.

        Her own *training* ratings are read from ``store`` (the one block that holds her;
        the store is never loaded whole) and solved on the released model, exactly as
        :meth:`recommend` solves a ratings dict: ``model.recommend_user(store, 42)``
        equals ``model.recommend(her_ratings)``. Returns ``(item_id, predicted_rating)``
        pairs, best first, items she rated left out. Under joint DP the list is for her
        to see, not to publish. An id that is not a user of the store is an :class:`InputError`.
        When the store keeps item names (``ingest --item-names``), ``.names`` of the returned
        list holds each item's name (public metadata).
        """
        return recommend_user(self, store, user_id, n, ridge=ridge)

    def similar_items(self, item_id, n: int = 10) -> list:
        """The ``n`` items nearest to ``item_id`` as ``(item_id, cosine_similarity)`` pairs, most similar first.

        Cosine similarity of the released item factors: post-processing of the release,
        at no privacy cost. The item itself is **not** in the list (``implicit`` lists
        it first); ties go to the smaller item id. A model that released no factors
        (only item biases, e.g. ``--method means``) raises :class:`InputError`.

        >>> import numpy as np
        >>> m = Model("(example)", np.array([[1, 0], [0.9, 0.1], [0, 1]], np.float32), np.zeros(3, np.float32),
        ...           np.array([10, 20, 30]), 3.0, {}, None)
        >>> m.similar_items(10, n=2)
        [(20, 0.993884), (30, 0.0)]
        """
        return similar_items(self, item_id, n)

    @property
    def summary(self) -> Summary:
        """What this model is: a dict (``method``, ``guarantee``, ``epsilon``, ``delta``, ``epsilon_spent``,
        ``rank``, ``n_items``, ``factors_released``, ``personalised``, ``released``, ...) that prints as plain text.

        Read from ``model.json`` and ``privacy.json`` (:func:`streamdp.serving.serve.describe`);
        a model returned by :func:`streamdp.train` or :func:`streamdp.tune` also carries its
        run's summary (``test_rmse``, ``baselines``, ``verdict``, ``ranking``, ...).
        """
        return Summary({**describe(self), **(getattr(self, "_run_summary", None) or {})})

    @summary.setter
    def summary(self, run_summary: dict) -> None:
        self._run_summary = dict(run_summary)

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
        """The method, as ``model.json`` records it (the ledger's, which :func:`check_agrees` compares at load; a
        lists part, :func:`streamdp.serving.local.list_model`, shares its model's ledger and says its own), else
        as the ledger (``privacy.json``) does."""
        return str(self.info.get("method") or getattr(self.ledger, "method", None) or "?")

    def in_order_of(self, item_ids) -> "Model":
        """This model with its per-item arrays reordered to ``item_ids`` (e.g. a store's dense order), which may
        leave out some of its items.

        Raises :class:`InputError` when an id is not one of the model's items (:meth:`padded_to` first).
        """
        ids, mine = as_ids(item_ids), as_ids(self.item_ids)
        pos = find(mine, ids) if ids.dtype == mine.dtype else np.full(len(ids), -1)
        if (pos < 0).any():  # a model may hold items no rating of the store names (a declared catalogue)
            raise InputError(f"{self.path}: the store's items are not the model's items")
        return Model(path=self.path, item_factors=self.item_factors[pos], item_bias=self.item_bias[pos],
                     item_ids=ids, global_mean=self.global_mean, info=self.info, ledger=self.ledger,
                     extras=self.extras, unlisted=None if self.unlisted is None else self.unlisted[pos])


    def padded_to(self, item_ids) -> "Model":
        """This model with a cold row for every id of ``item_ids`` it does not hold (zero factors and bias, zero
        per-item extras), ``unlisted`` marking them: what :func:`streamdp.serving.evaluate.evaluate_model` scores a model
        with on a store of more items than its catalogue (their ratings are predicted as a cold item's, and no
        list names them). The model itself when it holds every id."""
        ids, mine = as_ids(item_ids), as_ids(self.item_ids)
        if len(ids) and len(mine) and ids.dtype != mine.dtype:
            raise InputError(f"{self.path}: the store's item ids are not of the model's kind")
        extra = ids[find(mine, ids) < 0] if len(mine) else ids
        if not len(extra):
            return self
        n, e = self.n_items, len(extra)

        def pad(a):
            a = np.asarray(a)
            if a.ndim == 0 or a.shape[0] != n:
                return a
            return np.concatenate([a, np.zeros((e,) + a.shape[1:], a.dtype)])

        extras = {k: pad(v) for k, v in self.extras.items()}
        unl = np.zeros(n + e, bool)
        unl[n:] = True
        return Model(path=self.path, item_factors=pad(self.item_factors), item_bias=pad(self.item_bias),
                     item_ids=np.concatenate([mine, extra]), global_mean=self.global_mean, info=self.info,
                     ledger=self.ledger, extras=extras, unlisted=unl)


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
        JSON-serializable description (method, rank, parameters, store fingerprint...).
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
    if "list_scorer" not in info:  # a method may state its own; the default reads names, range and user profile
        info["list_scorer"] = default_list_scorer(info, extras)
    _claim_epsilon(info, ledger)
    info.update(format=MODEL_FORMAT, format_version=MODEL_FORMAT_VERSION, n_items=int(n),
                rank=int(V.shape[1]), item_order="ascending item id")
    payload = json.loads(json.dumps(encode_json(info)))  # model.json as it is read back
    ledger.model_digest = released_digest(payload)  # the ledger keeps it: an edit after release is refused at load
    # every field must be declared with its provenance; a private model holds no exact statistic
    check_release(payload, ledger.to_dict(), [*_CORE_ARRAYS, *extras], ["global_mean"])
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
                json.dump(payload, f, indent=2)
                f.write("\n")
            ledger.write(tmp)
            install_dir(tmp, out, force=force, what="model", is_ours=is_model_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _claim_epsilon(info: dict, ledger) -> None:
    """``model.json``'s ``epsilon`` is the ledger's (:func:`check_agrees` compares them at load); the ``--epsilon``
    asked for, when the ledger claims another (public-private's 0 or ``inf``, sgld's ``epsilon / T``), is kept as
    ``epsilon_target``."""
    if "epsilon" not in info:
        return
    target = info["epsilon"]
    try:
        same = float(target) == float(ledger.epsilon)
    except (TypeError, ValueError):
        same = False
    if not same:
        info["epsilon_target"] = target
        info["epsilon"] = ledger.epsilon


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


def _number(v):
    """A JSON number or ``"inf"``/``"nan"`` string as a float (other values as they are)."""
    if isinstance(v, str) and v.lower() in ("inf", "+inf", "-inf", "infinity", "nan"):
        return float(v)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v


def check_agrees(path: str, info: dict, ledger) -> None:
    """Refuse (:class:`InputError`) a ``model.json`` whose claims differ from ``privacy.json``'s (the ledger).

    Compared, where both files carry them (a claim model.json leaves out is no disagreement: reports take it
    from the ledger): ``method``, ``epsilon``, ``delta`` (when the ledger
    claims one: a ledger whose guarantee has no delta, non-private or "not DP", writes
    none or 0), ``store_fingerprint``, whether the run was seeded (``seed`` against
    ``seeded``), and ``n_users``, ``n_items`` and the rating range against the ledger's
    ``public_parameters``; then every field, by the digest of ``model.json`` the ledger keeps
    (:func:`streamdp.manifest.released_digest`). Editing only ``epsilon`` to 0.01 in ``model.json`` made
    ``evaluate --json`` report 0.01, and editing ``method`` had ``evaluate`` call an als
    model "oja": reports take these values from the ledger, and a disagreement is one
    line naming the field and both files.
    """
    pairs = [("method", info.get("method"), ledger.method)] if "method" in info else []
    if "epsilon" in info:
        pairs.append(("epsilon", _number(info["epsilon"]), _number(ledger.epsilon)))
    if ledger.delta and "delta" in info:  # the ledger claims a delta: the model must say the same
        pairs.append(("delta", _number(info["delta"]), _number(ledger.delta)))
    if info.get("store_fingerprint") or ledger.store_fingerprint:
        pairs.append(("store_fingerprint", info.get("store_fingerprint"), ledger.store_fingerprint))
    if "seed" in info:
        pairs.append(("seed (seeded)", info["seed"] is not None, bool(ledger.seeded)))
    pub = ledger.public_parameters or {}
    for name in ("n_users", "n_items"):
        if name in info and name in pub:
            theirs = pub[name].get("value") if isinstance(pub[name], dict) else pub[name]  # n_users: {value, source}
            pairs.append((name, _number(info[name]), _number(theirs)))
    rr, prr = info.get("rating_range"), pub.get("rating_range")
    if isinstance(rr, dict) and isinstance(prr, dict):
        for end in ("min", "max"):
            pairs.append((f"rating_range.{end}", _number(rr.get(end)), _number(prr.get(end))))
    for name, mine, theirs in pairs:
        same = mine == theirs or (isinstance(mine, float) and isinstance(theirs, float) and mine != mine
                                  and theirs != theirs)
        if not same:
            raise InputError(f"{path}: model.json and privacy.json disagree on {name}: model.json says {mine!r}, "
                             f"privacy.json {theirs!r} (the directory was edited; privacy.json is the ledger)")
    # every other field (the local solve's settings, the list scorer, the chart's threshold...): the digest of
    # model.json as released, which the ledger keeps (a model written before it has none)
    try:
        digest = released_digest(info)
    except ValueError:  # a NaN or infinity json.load let in: never written by save_model
        digest = None
    if not ledger.model_digest:
        raise InputError(f"{path}: privacy.json keeps no digest of model.json (a model written by an older streamdp, "
                         f"or an edited ledger): retrain it")
    if digest != ledger.model_digest:
        raise InputError(f"{path}: model.json was edited after the model was released: it does not match the digest "
                         f"privacy.json keeps (privacy.json is the ledger)")


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


#: Fields the local solve and the lists read, and what each must be: (dotted key, check, what it must be).
_FIELD_TYPES = (
    ("ridge", lambda v: _is_number(v) and 0 <= v < float("inf"), "a number >= 0 (0: the user passes her own)"),
    ("local", lambda v: isinstance(v, str), "a string"),
    ("local_user_bias", lambda v: isinstance(v, bool), "true or false"),
    ("popularity_column", lambda v: isinstance(v, bool), "true or false"),
    ("factors_released", lambda v: isinstance(v, bool), "true or false"),
    ("selection", lambda v: isinstance(v, dict), "an object"),
    ("selection.chart_below", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
     "a count >= 0"),
    ("local_implicit", lambda v: isinstance(v, dict) and all(_is_number(v.get(k)) for k in ("alpha", "max_confidence"))
     and isinstance(v.get("preference", ""), str), "an object with numbers alpha and max_confidence"),
)


def _check_fields(path: str, info: dict) -> None:
    """Refuse (one line) a ``model.json`` field of the wrong type, and an ``ials`` model without ``local_implicit``.

    Behind the digest check a model whose two files were both edited could still hold them: they were tracebacks.
    """
    if info.get("local") == "implicit" and "local_implicit" not in info:
        raise InputError(f"{path}/model.json: no local_implicit: an implicit model's local solve needs it")
    for key, ok, what in _FIELD_TYPES:
        head, _, leaf = key.partition(".")
        holder = info.get(head) if leaf else info
        name = leaf or head
        if isinstance(holder, dict) and name in holder and not ok(holder[name]):
            raise InputError(f"{path}/model.json: {key} is {holder[name]!r}, not {what}")


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
    check_agrees(path, info, ledger)
    _check_fields(path, info)
    _check_arrays(path, arrays, global_mean, info)
    ids = as_ids(arrays.pop("item_ids"))
    if len(ids) > 1 and not np.all(ids[1:] > ids[:-1]):
        raise InputError(f"{path}/factors.zarr: item ids are not unique and ascending (a model written by an older "
                         f"streamdp, whose item order leaks the store's popularity ranking: retrain it)")
    return Model(path=path, item_factors=np.asarray(arrays.pop("item_factors"), np.float32),
                 item_bias=np.asarray(arrays.pop("item_bias"), np.float32), item_ids=ids,
                 global_mean=global_mean, info=info, ledger=ledger, extras=arrays)

