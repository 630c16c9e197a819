"""Serving a released model from Python: a stored user's list, every user's list as arrays, similar items, a summary.

The :class:`~streamdp.serving.model.Model` methods ``recommend_user``, ``recommend_all(...,
as_arrays=True)``, ``similar_items`` and ``summary`` are thin wrappers over these
functions. None of them spends privacy budget:

* :func:`recommend_user` is :meth:`Model.recommend <streamdp.serving.model.Model.recommend>`
  with the user's own *training* ratings read from the store (her row of the one block
  that holds her, found through the store's user ids block by block, never the whole
  store). Under joint DP her list may be shown to her, not published (as
  :mod:`streamdp.serving.batch` says of every list).
* :func:`recommend_arrays` gathers :func:`streamdp.serving.batch.recommend_all`'s per-block
  tables (streamed on the engine, within ``memory_limit``) into NumPy arrays.
* :func:`similar_items` is post-processing of the released item factors only (cosine
  similarity), at no privacy cost and with no user data.
* :func:`describe` reads ``model.json`` and ``privacy.json``.

Decisions where the request is loose:

* ``similar_items`` **excludes the item itself** (``implicit``'s ``similar_items``
  lists it first with similarity 1): the list is the ``n`` other items nearest to it,
  ties by ascending item id. Items whose factor row is all zero (no released
  direction) have similarity 0 to everything. A model that released no factors
  (a biases-only release: ``means``, or ``als`` choosing ``iters = 0``) has no
  similarity to offer: an :class:`~streamdp.errors.InputError` says so, rather than a
  list ordered by nothing.
* ``recommend_arrays`` has one row per user who gets a list, in the store's user order
  (a user who rated every item gets none, as in the Parquet output); a row shorter than
  ``n`` (a user who rated nearly everything) is padded with score ``NaN`` and item id
  ``-1`` (integer ids) or ``None`` (string ids): the score tells padding apart.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from streamdp.errors import InputError, ParameterError
from streamdp.manifest import ARRAYS, ATTRS, LISTS_PREFIX
from streamdp.serving.batch import dense_users, recommend_all
from streamdp.serving.local import factors_released, list_model
from streamdp.storage.ids import find, numeric, parse_id
from streamdp.storage.store import RatingStore, open_store


class Recommendations(NamedTuple):
    """Every user's top-``n`` list as arrays (:func:`recommend_arrays`)."""

    #: ``(n_users,)`` original user ids (int64, or object of str), in the store's order.
    user_ids: np.ndarray
    #: ``(n_users, n)`` original item ids, best first (padding: ``-1`` or ``None``).
    item_ids: np.ndarray
    #: ``(n_users, n)`` float32 predicted scores (clipped to the rating range; padding ``NaN``).
    scores: np.ndarray


def stored_ratings(store, user_id) -> tuple[np.ndarray, np.ndarray]:
    """``(item ids, ratings)`` of user ``user_id`` (her original id) in ``store``'s training split.

    Her dense index comes from the store's user ids, read block by block
    (:func:`streamdp.serving.batch.dense_users`); then only the block that holds her is read.
    An id of the wrong kind or not in the store is an :class:`InputError`.
    """
    st = store if isinstance(store, RatingStore) else open_store(store)
    is_num = numeric(st.user_ids(0, min(1, st.n_users)))
    try:
        key = parse_id(user_id, is_num)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"user_id: {user_id!r} is not a user of {st.path} (its user ids are integers)") from None
    dense = int(dense_users(st, [key])[0])
    if dense < 0:
        raise InputError(f"user_id: {user_id!r} is not a user of {st.path}")
    blk = st.read_block(dense // st.block_users, "train")
    j = dense - blk.first_user
    s, e = int(blk.indptr[j]), int(blk.indptr[j + 1])
    return st.item_ids()[blk.items[s:e]], np.asarray(blk.ratings[s:e], np.float32)


def recommend_user(model, store, user_id, n: int = 10, *, ridge: float | None = None) -> list:
    """``model.recommend`` for a user of ``store`` by her original id, from her training ratings there.

    When the store keeps item names (``ingest --item-names``), the list's ``names`` holds the name of
    each recommended item (``""`` when unnamed); otherwise ``names`` is ``None``.
    """
    n = check_n(n)
    st = store if isinstance(store, RatingStore) else open_store(store)
    items, ratings = stored_ratings(st, user_id)
    recs = model.recommend(zip(items.tolist(), ratings.tolist()), n=n, ridge=ridge)
    if st.item_names() is not None:
        from streamdp.storage.names import names_for  # pyarrow: not loaded by `train` (docs/scale.md)

        recs.names = names_for(st, [i for i, _ in recs]).tolist()
    return recs


def recommend_arrays(model, store, n: int = 10, **kw) -> Recommendations:
    """Every user's top-``n`` list (:func:`streamdp.serving.batch.recommend_all`, same ``kw``) as NumPy arrays."""
    users, items, scores = [], [], []
    for t in recommend_all(model, store, n, **kw):
        if not t.num_rows:
            continue
        rank = t.column("rank").to_numpy()
        first = rank == 1
        row = np.cumsum(first) - 1
        uid = t.column("user_id").to_numpy(zero_copy_only=False)[first]
        iid = t.column("item_id").to_numpy(zero_copy_only=False)
        integer = iid.dtype.kind in "iu"
        it = np.full((len(uid), n), -1 if integer else None, dtype=np.int64 if integer else object)
        sc = np.full((len(uid), n), np.nan, np.float32)
        it[row, rank - 1] = iid
        sc[row, rank - 1] = t.column("score").to_numpy()
        users.append(uid)
        items.append(it)
        scores.append(sc)
    if not users:
        st = store if isinstance(store, RatingStore) else open_store(store)
        kind = np.int64 if numeric(model.item_ids) else object
        ukind = np.int64 if numeric(st.user_ids(0, min(1, st.n_users))) else object
        return Recommendations(np.empty(0, ukind), np.empty((0, n), kind), np.empty((0, n), np.float32))
    return Recommendations(np.concatenate(users), np.concatenate(items), np.concatenate(scores))


def check_n(n, name: str = "n") -> int:
    """``n`` as an int >= 1, or a one-line :class:`ParameterError` naming ``name`` (a fraction, NaN, a string, a
    bool: the Python API's list lengths, checked before anything is read).

    >>> check_n(3.0)
    3
    >>> check_n(float("nan"))
    Traceback (most recent call last):
    ...
    streamdp.errors.ParameterError: n must be a positive integer, got nan
    """
    number = isinstance(n, (int, float, np.integer, np.floating)) and not isinstance(n, (bool, np.bool_))
    if not (number and n >= 1 and float(n).is_integer()):
        raise ParameterError(f"{name} must be a positive integer, got {n!r}")
    return int(n)


def similar_items(model, item_id, n: int = 10) -> list:
    """The ``n`` items most similar to ``item_id`` by cosine similarity of the released item factors.

    Post-processing of the release (no privacy cost, no user data). The item itself is
    left out; ties go to the smaller item id (module docstring).
    """
    n = check_n(n)
    if not factors_released(model):  # a rating model of item biases only: its lists part's factors, if any
        model = list_model(model)
    if not factors_released(model):
        raise InputError(f"{model.path}: this {model.method} model released no item factors (only item biases and "
                         f"the global mean), so items have no similarity; train with factors (e.g. a larger epsilon "
                         f"or store, or --iters) to get them")
    ids = np.asarray(model.item_ids)
    try:
        key = parse_id(item_id, numeric(ids))
    except (TypeError, ValueError, OverflowError):
        key = None
    j = -1 if key is None else int(find(ids, [key])[0])
    if j < 0:
        raise InputError(f"item_id: {item_id!r} is not an item of the model {model.path}")
    V = np.asarray(model.item_factors, np.float64)
    norms = np.linalg.norm(V, axis=1)
    if norms[j] == 0:
        raise InputError(f"item_id: {item_id!r} has an all-zero factor row in {model.path} (the release gives it no "
                         f"direction), so it has no similarity to other items")
    with np.errstate(invalid="ignore", divide="ignore"):
        sims = np.where(norms > 0, V @ V[j] / (norms * norms[j]), 0.0)
    sims[j] = -np.inf
    n = min(int(n), len(ids) - 1)
    if n <= 0:
        return []
    cand = np.argpartition(-sims, n - 1)[:n] if n < len(ids) else np.arange(len(ids))
    # the n-th best may tie with items left out of the partition: take every item at least as similar
    cand = np.flatnonzero(sims >= sims[cand].min())
    order = cand[np.lexsort((cand, -sims[cand]))][:n]  # ids ascending, so index order is id order
    return [(i, round(float(s), 6)) for i, s in zip(ids[order].tolist(), sims[order])]


class Summary(dict):
    """A model's summary: a plain dict (``json.dumps`` takes it) whose ``str`` is a few plain sentences."""

    def __str__(self) -> str:
        eps = self.get("epsilon")
        lines = [f"{self.get('method')} model, {self.get('n_items'):,} items"
                 + (f", rank {self.get('effective_rank')}" if self.get("factors_released") else "")]
        g = self.get("guarantee")
        if eps in ("inf", None) or (isinstance(eps, float) and math.isinf(eps)):
            lines.append(f"privacy: {g} (no noise)")
        else:
            spent = self.get("epsilon_spent")
            lines.append(f"privacy: {g}, epsilon {eps:g}"
                         + (f" (accountant: {spent:.4g})" if isinstance(spent, (int, float)) else "")
                         + (f", delta {self['delta']:g}" if self.get("delta") else "")
                         + (" (seeded: reproducible, not private against whoever knows the seed)"
                            if self.get("seeded") else ""))
        lines.append(f"released: {', '.join(self.get('released', []))}")
        lines.append(self.get("lists", ""))
        if "test_rmse" in self:
            v = self.get("verdict") or {}
            lines.append(f"test RMSE {self['test_rmse']:.4f}" + (
                f" against {v['baseline_rmse']:.4f} for the non-private {v['baseline']} baseline: "
                f"{'better' if v.get('better') else 'no better'}" if v.get("baseline") else ""))
        return "\n".join(x for x in lines if x)


def describe(model) -> Summary:
    """What a loaded model is, from its ``model.json`` and ``privacy.json``.

    Keys: ``method``, ``guarantee``, ``epsilon``, ``delta`` (``None`` without a DP
    guarantee), ``epsilon_spent`` (the accountant's, ``None`` when nothing was
    accounted), ``seeded``, ``rank`` (as trained), ``effective_rank`` (0 when no factors
    were released), ``n_items``, ``factors_released``, ``personalised``, ``released``
    (the arrays and attributes the model holds, with what each is: :data:`streamdp.manifest.ARRAYS`),
    ``lists`` (a sentence on what the lists are), ``path``.
    """
    led = model.ledger
    has_factors = factors_released(model)
    acc = getattr(led, "accounting", None)
    eps = getattr(led, "epsilon", model.info.get("epsilon"))
    released = {"global_mean": ATTRS["global_mean"][1]}
    for name in ("item_factors", "item_bias", *sorted(model.extras)):
        if name == "item_factors" and not has_factors:
            continue
        own = name[len(LISTS_PREFIX):] if name.startswith(LISTS_PREFIX) else name
        released[name] = ARRAYS.get(own, ("", name))[1] + (" (the lists part's)" if own != name else "")
    lm = list_model(model)
    part = (f"the item factors of the {model.info['lists']['method']} part trained in the same release (epsilon "
            f"{model.info['lists']['epsilon']:.4g} of it alone)" if lm is not model else "the released item factors")
    listed = factors_released(lm)
    lists = (f"personalised: each user's list is solved from {part} and her own ratings, on her side" if listed else
             "not personalised: only item biases released, so every user gets the same list (minus the items she "
             "rated)")
    return Summary(
        method=model.method,
        guarantee=getattr(led, "guarantee", None),
        epsilon="inf" if isinstance(eps, float) and math.isinf(eps) else eps,
        delta=(getattr(led, "delta", None) or None),
        epsilon_spent=None if acc is None else float(acc.epsilon),
        seeded=bool(getattr(led, "seeded", False)),
        rank=int(model.info.get("rank", model.rank)),
        effective_rank=model.rank if has_factors else 0,
        n_items=model.n_items,
        factors_released=has_factors,
        personalised=listed,
        released=released,
        lists=lists,
        path=model.path,
    )
