"""Metrics on a store's held-out split: ``streamdp evaluate MODEL STORE``.

For every user block, each user's factor is solved locally from their *training*
ratings (:mod:`streamdp.serving.local`, exactly what the user's device would do) and
their test ratings are predicted. Four non-private baselines (:data:`BASELINES`) are
computed in the same run from the training split: the global mean, the per-item mean
(an item without training ratings falls back to the global mean), the damped item mean
and the user+item bias. They are reference points for the reader, not released models,
and are labelled non-private.

**Passes.** One. The baselines need each item's exact training count and sum (the item
means, the damped means every user's offset is taken against, and the non-private
popularity chart) complete before the first test error can be computed: the
user+item-bias baseline's per-user offset depends on every item's damped mean, and a
per-item constant's mean absolute error on the distribution of each item's test
ratings, neither a sum that could be accumulated in the same pass and combined after.
The store's writer sees every training rating anyway, so it records those sums and
counts when the store is written (``train/item_sums``, ``train/item_counts``: the
owner's private statistics of the raw data, never released; the baselines and the
chart made from them are labelled non-private), and the evaluation reads them
(:func:`train_item_statistics`). Then one pass solves every user, gives the model's
RMSE and MAE over every test rating (exact, never sampled), the baselines' errors, and
the ranking metrics of a seeded sample of users (``ranking_users``,
:mod:`streamdp.serving.ranking`: their lists scored as float32 matrix products over tiles of
users and rescored exactly). A store written before the statistics were recorded gets
them from a pass of their own first (``evaluate: baselines``: the same per-block
partials added in the same order, so the same bits), and the result says so
(``item_statistics: "pass"`` and a note).

On an **implicit store** (interaction logs, ``RatingStore.implicit``) a held-out value
is a count, not a rating: there is no RMSE, no rating baseline and no rating-range
threshold. Only the ranking metrics are reported (always, whatever ``ranking``), every
held-out interaction being a relevant item, beside the most-popular lists
(:mod:`streamdp.serving.ranking`).
"""

from __future__ import annotations

import math

import numpy as np

from streamdp.errors import StoreError
from streamdp.kernels.csr import user_residual_means
from streamdp.kernels.topk import TILE_BYTES
from streamdp.privacy.budget import StoreBudget
from streamdp.serving.local import check_finite, list_model, local_kind, model_ridge, predict_block, solve_block
from streamdp.serving.model import Model, load_model
from streamdp.serving.ranking import (DEFAULT_K, DEFAULT_RANKING_USERS, check_k, check_ranking_users, format_ranking,
                              ranking_verdict, setup)
from streamdp.storage.catalogue import catalogue_view, store_catalogue
from streamdp.storage.fingerprint import store_fingerprint
from streamdp.storage.store import RatingStore, open_store
from streamdp.storage.timeline import segment_future
from streamdp.storage.writer import block_item_stats
from streamdp.stream.engine import Engine
from streamdp.stream.engine import add_into as _add


def evaluate_model(model, store, *, workers=None, scheduler=None, memory_limit=None, ridge: float | None = None,
                   baselines: bool = True, allow_other_store: bool = False, ranking: bool = True, k: int = DEFAULT_K,
                   relevant_threshold: float | None = None, ranking_users: int | str | None = DEFAULT_RANKING_USERS,
                   segment=None) -> dict:
    """RMSE and MAE of ``model`` on ``store``'s test split (+ baselines).

    Parameters
    ----------
    model : str or Model
        A model directory or a loaded :class:`streamdp.serving.model.Model`.
    store : str or RatingStore
        Must have a test split; its items must be the model's items.
    ridge : float, optional
        Ridge of the local solve (default: the model's).
    baselines : bool
        Also compute the non-private global-mean and item-mean baselines.
    allow_other_store : bool
        Evaluate also on a store other than the one the model was trained on (its
        keyed fingerprint, ``model.info["store_fingerprint"]``, see
        :mod:`streamdp.storage.fingerprint`, differs); the result then says
        ``store_matches_model: False``. Without it that is an error: a re-split of
        the same ratings has test ratings the model was trained on, and its RMSE
        is optimistic.
    ranking : bool
        Also compute the ranking metrics of each user's top-``k`` list (:mod:`streamdp.serving.ranking`) in the same
        pass, beside the most-popular baselines.
    k : int
        List length of the ranking metrics.
    relevant_threshold : float, optional
        A held-out rating at or above it is relevant (default: the top 20% of the rating range).
    ranking_users : int or "all"
        How many users the ranking metrics are drawn from (a seeded sample,
        :func:`streamdp.serving.ranking.ranking_sample`), or ``"all"`` (every user). RMSE and MAE
        always cover every test rating.
    segment : int or "last", optional
        Score on this segment's ratings (``evaluate --segment``) as the future of the store before it, which is
        the store the model must have been trained on (:func:`streamdp.storage.timeline.segment_future`).

    Returns
    -------
    dict
        On an implicit store: ``implicit: True, n_interactions, n_users, ridge, method, guarantee,
        epsilon, store_matches_model, ranking`` (module docstring). Otherwise
        ``rmse, mae, n_ratings, n_users, ridge, method, guarantee`` and, with
        baselines, ``baselines: {global_mean: {rmse, mae}, item_mean: {rmse, mae}}``;
        ``store_matches_model`` (``None`` for a model that records no store fingerprint); with ranking,
        ``ranking`` (:meth:`streamdp.serving.ranking.Ranking.result`) and ``ranking_verdict``
        (:func:`streamdp.serving.ranking.ranking_verdict`: do the lists beat the most-popular chart by the released counts).

    Raises
    ------
    StoreError
        No test split, other items than the model's, another store than the model's
        (without ``allow_other_store``), a damaged store (a missing or corrupt
        chunk, :meth:`~streamdp.storage.store.RatingStore.check_chunks`; a block
        that does not match its recorded check, :meth:`~streamdp.storage.store.RatingStore.read_block`),
        or a store replaced while it was read.
    """
    m = model if isinstance(model, Model) else load_model(model)
    st, match = _store_for(m, store, allow_other_store, segment)
    # counts are no ratings, and an implicit model's scores (ials) are no predicted ratings: its lists only
    lists_only = st.implicit or local_kind(m) == "implicit"
    if lists_only:  # ranking metrics only (module docstring)
        ranking, baselines = True, False
    if ranking:
        k = check_k(k)
        ranking_users = check_ranking_users(ranking_users)
    # a model's items are its catalogue (streamdp.privacy.catalogue): a store item outside it is a cold item,
    # predicted from the global mean and the user's intercept, and never listed (Model.padded_to)
    released = m.padded_to(st.item_ids())
    m = released.in_order_of(st.item_ids())  # the model lists items by id, the store by popularity
    ridge = model_ridge(m, ridge)
    tot, width, rank, source = _measure(m, released, st, ridge, lists_only=lists_only, baselines=baselines,
                                        ranking=ranking, k=k, relevant_threshold=relevant_threshold,
                                        ranking_users=ranking_users, workers=workers, scheduler=scheduler,
                                        memory_limit=memory_limit)
    st.check_unchanged()  # the figures are of the store opened, not of one that replaced it meanwhile
    out = _result(m, released, st, tot, width, rank, source, match=match, ridge=ridge, lists_only=lists_only,
                  baselines=baselines)
    if segment is not None:
        out["segment"] = st.segment_record
    return out


def _store_for(m, store, allow_other_store: bool, segment=None):
    """``(st, match)``: the store to score ``m`` on (a view of its declared catalogue, if any) and whether it is the
    store the model was trained on (``None``: the model records no fingerprint), after the checks
    :func:`evaluate_model` documents (a test split, undamaged chunks, the model's store)."""
    st = store if isinstance(store, RatingStore) else open_store(store)
    if segment is not None:  # the segment's ratings as the test split of the store before it (storage/timeline.py)
        st = segment_future(getattr(st, "_catalogue_base", st), segment)
    if not st.has_test:
        raise StoreError(f"{st.path}: store has no test split (generate or ingest it with --test-fraction)")
    st.check_chunks()  # a damaged store fails here with one line, not with a wrong RMSE
    # scored on every test rating of the store's items: those of a catalogue it declares (no other item exists for
    # its models), else all of them, an item outside the model's catalogue predicted as a cold one
    # the store itself, as `streamdp evaluate STORE` opens it: not a run's view of its selected range (which clips
    # training ratings: streamdp.storage.range_view) nor of its catalogue
    st = getattr(st, "_range_inner", st)
    st = getattr(st, "_catalogue_base", st)
    declared = store_catalogue(st)
    if declared is not None:
        st = catalogue_view(st, declared[0])
    ck = m.info.get("store_fingerprint")
    match = None
    if ck:
        fp = store_fingerprint(st, create=False)  # a store without a key released no model...
        match = fp == ck
        lost = StoreBudget(st.path).key_problem() if fp is None and not allow_other_store else None
        if lost is not None:  # ...unless its ledger records releases: its key was deleted, say so
            raise StoreError(f"{lost}; pass --allow-other-store to evaluate the model anyway")
    elif m.info.get("store_checksum"):  # a model of an older streamdp (which released the plain checksum)
        match = m.info["store_checksum"] == st.checksum
    if match is False and not allow_other_store and segment is not None:
        raise StoreError(f"{st.path}: the model {m.path} was not trained on the store before segment "
                         f"{st.segment_record['number']} (train --until-segment {st.segment_record['number'] - 1}, "
                         f"or train before that append): it may have seen the ratings it is scored on; pass "
                         f"--allow-other-store to evaluate it anyway")
    if match is False and not allow_other_store:
        raise StoreError(f"{st.path}: not the store the model {m.path} was trained on (its fingerprint differs: "
                         f"other ratings, or the store was replaced since): its test split may hold ratings the model "
                         f"was trained on and give an "
                         f"optimistic RMSE; pass --allow-other-store to evaluate it anyway")
    return st, match


def _measure(m, released, st, ridge: float, *, lists_only: bool, baselines: bool, ranking: bool, k: int,
             relevant_threshold, ranking_users, workers, scheduler, memory_limit):
    """The evaluation's pass: ``(tot, width, rank, source)``, the summed per-block row (squared and absolute
    errors, count, then each baseline's, in ``tot[:width]``; the ranking's partials after), the ranking's setup
    (``None`` without it) and where the item statistics came from (``None`` when none were needed)."""
    n = st.n_items
    lo, hi = st.rating_min, st.rating_max
    with Engine(st, workers=workers, scheduler=scheduler, memory_limit=memory_limit,
                state_bytes=m.item_factors.nbytes * 5) as eng:  # + the ranking's float32 and transposed copies
        item_mean = damped = gm = rank = None
        source = None
        if baselines or ranking:
            S, source = train_item_statistics(st, eng)
            gm = float(S[0].sum() / max(S[1].sum(), 1.0))
            item_mean = np.where(S[1] > 0, S[0] / np.maximum(S[1], 1.0), gm)
            damped = (S[0] + ITEM_DAMPING * gm) / (S[1] + ITEM_DAMPING)  # shrunk toward the global mean
        lm = list_model(released)  # a lists part (streamdp.methods._lists) ranks by its own users' solves
        if ranking:
            rank = setup(lm, st, S[1], k=k, relevant_threshold=relevant_threshold, ranking_users=ranking_users)
            if lm is not released:
                rank.lists_part = released.info["lists"]

        def fn(block, b):
            test = st.read_block(b, "test")
            if lists_only:  # no RMSE: only the users whose lists are measured solve their rows
                U = solve_rows(m, block, rank.sampled(block.first_user, block.n_users), ridge)
                check_finite(m, U, "users' local solutions")
                return np.concatenate([[0.0, 0.0, float(test.nnz)], rank.block(U, block, test)])
            U = solve_block(m, block.indptr, block.items, block.ratings, ridge)
            check_finite(m, U, "users' local solutions")  # before the ranking uses U
            pred = predict_block(m, U, test.indptr, test.items)
            check_finite(m, pred)
            y = test.ratings.astype(np.float64)
            err = pred - y
            row = [np.sum(err * err), np.sum(np.abs(err)), float(test.nnz)]
            if baselines:
                bu = user_biases(block.indptr, block.items, block.ratings, gm, damped)
                users = np.repeat(np.arange(len(test.indptr) - 1), np.diff(test.indptr))
                for guess in (gm, item_mean[test.items], damped[test.items], damped[test.items] + bu[users]):
                    e = np.clip(guess, lo, hi) - y
                    row += [np.sum(e * e), np.sum(np.abs(e))]
            row = np.asarray(row, np.float64)
            if rank is None:
                return row
            if lm is not released:
                U = solve_rows(rank.model, block, rank.sampled(block.first_user, block.n_users), model_ridge(lm))
                check_finite(lm, U, "users' local solutions")
            return np.concatenate([row, rank.block(U, block, test)])

        width = 3 + 2 * len(BASELINES) if baselines else 3
        tot = eng.map_reduce(fn, _add, np.zeros(width + (rank.part_size if rank is not None else 0)),
                             extra_per_block=(8 * rank.part_size + TILE_BYTES + 16 * n) if rank is not None else 0,
                             desc="evaluate")
    return tot, width, rank, source


def _result(m, released, st, tot, width, rank, source, *, match, ridge: float, lists_only: bool,
            baselines: bool) -> dict:
    """:func:`evaluate_model`'s result from the pass's sums (:func:`_measure`)."""
    said = {} if source is None else {"item_statistics": source}
    if lists_only:
        implicit = st.implicit
        return {"implicit": implicit, "lists_only": True,
                ("n_interactions" if implicit else "n_ratings"): int(tot[2]), "n_users": st.n_users, "ridge": ridge,
                "method": m.method, "guarantee": getattr(m.ledger, "guarantee", None), "epsilon": m.info.get("epsilon"),
                "store_matches_model": match, "ranking": (r := rank.result(tot[width:])),
                "ranking_verdict": ranking_verdict(r), **said, **release_choice(released)}
    cnt = max(tot[2], 1.0)
    out = {
        "rmse": math.sqrt(tot[0] / cnt),
        "mae": tot[1] / cnt,
        "n_ratings": int(tot[2]),
        "n_users": st.n_users,
        "ridge": ridge,
        "method": m.method,
        "guarantee": getattr(m.ledger, "guarantee", None),
        "epsilon": ledger_epsilon(m),
        "store_matches_model": match,
        **said,
    }
    if baselines:
        out["baselines"] = {name: {"rmse": math.sqrt(tot[3 + 2 * i] / cnt), "mae": tot[4 + 2 * i] / cnt,
                                   "guarantee": "non-private", "what": BASELINES[name]}
                            for i, name in enumerate(BASELINES)}
        out["verdict"] = verdict(out["rmse"], out["baselines"])
    if rank is not None:
        out["ranking"] = rank.result(tot[width:])
        out["ranking_verdict"] = ranking_verdict(out["ranking"])
    return out


#: ``item_statistics`` of an evaluation: read from the store, or summed by a pass of their own.
RECORDED, OWN_PASS, SEGMENTED_PASS = "recorded", "pass", "pass (segments)"


def train_item_statistics(store, eng) -> tuple[np.ndarray, str]:
    """``(S, source)``: each item's exact training sum (``S[0]``) and count (``S[1]``), float64.

    Read from the store when it recorded them as it was written
    (:meth:`~streamdp.storage.store.RatingStore.train_item_stats`, ``source`` :data:`RECORDED`); for a store
    written before, summed by a pass of ``eng`` over the training split (``source`` :data:`OWN_PASS`) of the
    same per-block partials (:func:`~streamdp.storage.writer.block_item_stats`) added in the same block order:
    the same bits either way.
    """
    recorded = store.train_item_stats()
    if recorded is not None:
        return np.stack(recorded), RECORDED
    n = store.n_items

    def part(block, b):
        return block_item_stats(block.items, block.ratings, n)

    S = eng.map_reduce(part, _add, np.zeros((2, n)), extra_per_block=16 * n, desc="evaluate: baselines")
    # a store with appended segments records no merged statistics (storage/segments.py): the same pass
    return S, SEGMENTED_PASS if getattr(store, "segments", None) is not None else OWN_PASS


def statistics_note(ev: dict) -> str | None:
    """The note of an evaluation whose item statistics took a pass of their own (``None`` otherwise)."""
    if ev.get("item_statistics") == SEGMENTED_PASS:
        return ("the store has appended segments, whose training items' sums and counts are not recorded merged, so "
                "the baselines and the exact popularity chart took a pass of their own over the training split "
                "(streamdp compact the store to evaluate in one pass)")
    if ev.get("item_statistics") != OWN_PASS:
        return None
    return ("the store was written before streamdp recorded its training items' sums and counts, so the "
            "baselines and the exact popularity chart took a pass of their own over the training split (ingest or "
            "generate the store again to evaluate in one pass)")


def solve_rows(model, block, want, ridge: float) -> np.ndarray:
    """:func:`streamdp.serving.local.solve_block` for the users with ``want[u]`` only (each user's solve is her own);
    the other rows are 0. A block of only wanted users is solved whole."""
    rows = np.flatnonzero(want)
    if len(rows) == block.n_users:
        return solve_block(model, block.indptr, block.items, block.ratings, ridge)
    ip = np.asarray(block.indptr, np.int64)
    lens = np.diff(ip)[rows]
    sub = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lens, out=sub[1:])
    idx = np.repeat(ip[rows] - sub[:-1], lens) + np.arange(sub[-1])
    U_sub = solve_block(model, sub, block.items[idx], block.ratings[idx], ridge)
    U = np.zeros((block.n_users, U_sub.shape[1]))
    U[rows] = U_sub
    return U


def ledger_epsilon(model):
    """The model's epsilon as its ledger (``privacy.json``) records it: a number, or ``"inf"`` (no DP claim)."""
    eps = getattr(model.ledger, "epsilon", None)
    if eps is None:
        return model.info.get("epsilon")
    return float(eps) if math.isfinite(float(eps)) else "inf"


#: Pseudo-ratings at the global mean added to each item's ratings (damped item mean) and to each user's
#: residuals (user bias): Surprise's ``BaselineOnly`` defaults (reg_i 10, reg_u 15), the usual recommender
#: baseline, fixed here and never tuned on the data evaluated.
ITEM_DAMPING, USER_DAMPING = 10.0, 15.0

#: The non-private baselines, computed on the training split in the same run, each clipped to the rating range.
BASELINES = {
    "global_mean": "the mean training rating",
    "item_mean": "each item's mean training rating (the global mean for an item without ratings)",
    "damped_item_mean": f"each item's mean shrunk toward the global mean by {ITEM_DAMPING:g} pseudo-ratings",
    "user_item_bias": (f"global mean + damped item offset + the user's mean residual over her training ratings, "
                       f"shrunk by {USER_DAMPING:g} pseudo-ratings"),
}
#: The baselines the verdict compares with: what anybody could publish from item statistics alone.
ITEM_ONLY = ("global_mean", "item_mean", "damped_item_mean")


def user_biases(indptr, items, ratings, gm: float, damped) -> np.ndarray:
    """Each user's damped mean residual ``sum(r - damped_item) / (n + USER_DAMPING)`` over her training ratings.

    >>> user_biases(np.array([0, 2, 2]), np.array([0, 1]), np.array([5.0, 3.0]), 3.0, np.array([4.0, 3.0]))
    array([0.05882353, 0.        ])
    """
    out = np.empty(len(indptr) - 1, np.float64)
    user_residual_means(np.asarray(indptr, np.int64), np.asarray(items, np.int32), ratings,
                        np.ascontiguousarray(damped, np.float64), float(USER_DAMPING), out)
    return out


def verdict(rmse: float, baselines: dict) -> dict:
    """Whether a model beats the best non-private item-only baseline on the test split.

    The best of the global mean, the item mean and the damped item mean
    (:data:`ITEM_ONLY`): a private release that does not is no better than what
    anybody could publish from item statistics, and the output says so plainly. The
    user+item bias baseline is printed beside it (a model whose users solve their own
    intercept locally should approach it; it is not the verdict's bar because it uses
    each user's own ratings, which no item-side release can).

    >>> verdict(0.9, {"item_mean": {"rmse": 1.0}, "global_mean": {"rmse": 1.1}})["better"]
    True
    """
    name, b = min(((k, v) for k, v in baselines.items() if k in ITEM_ONLY), key=lambda kv: kv[1]["rmse"])
    margin = b["rmse"] - rmse
    out = {"better": bool(margin > 0), "baseline": name, "baseline_rmse": b["rmse"], "margin": margin,
           "relative": margin / b["rmse"] if b["rmse"] > 0 else 0.0}
    if "user_item_bias" in baselines:
        out["user_item_bias_rmse"] = baselines["user_item_bias"]["rmse"]
    return out


def format_baselines(b: dict) -> str:
    """``damped item mean 0.9650, user+item bias 0.9400, item mean 0.9820, global mean 1.1200`` (non-private).

    >>> format_baselines({"global_mean": {"rmse": 1.1}, "item_mean": {"rmse": 1.0}})
    'item mean 1.0000, global mean 1.1000'
    """
    order = ("damped_item_mean", "user_item_bias", "item_mean", "global_mean")
    return ", ".join(f"{k.replace('_', ' ').replace('user item', 'user+item')} {b[k]['rmse']:.4f}"
                     for k in order if k in b)


def format_verdict(v: dict, rmse: float) -> str:
    """One line: better than the best baseline by how much, or plainly no better.

    >>> format_verdict(verdict(1.02, {"item_mean": {"rmse": 1.0}, "global_mean": {"rmse": 1.1}}), 1.02)
    'NO BETTER than the non-private item-mean baseline: RMSE 1.0200 vs 1.0000 (0.0200 worse); this release does not beat item means'
    """
    name = v["baseline"].replace("_", "-")
    also = ""
    if "user_item_bias_rmse" in v:
        ub = v["user_item_bias_rmse"]
        also = (f"; user+item-bias baseline {ub:.4f} (" + ("beaten" if rmse < ub else "not beaten") + ")")
    if v["better"]:
        return (f"better than the non-private {name} baseline: RMSE {rmse:.4f} vs {v['baseline_rmse']:.4f} "
                f"({v['margin']:.4f} lower, {100 * v['relative']:.1f}%){also}")
    return (f"NO BETTER than the non-private {name} baseline: RMSE {rmse:.4f} vs {v['baseline_rmse']:.4f} "
            f"({-v['margin']:.4f} worse); this release does not beat {name.replace('-', ' ')}s{also}")


def release_choice(model) -> dict:
    """``{"release_choice": why}`` when the model says why it released its factors or its chart instead (``ials``'s
    ``--select auto``: ``model.json`` ``selection.why``), else ``{}``."""
    why = ((getattr(model, "info", None) or {}).get("selection") or {}).get("why")
    return {} if why is None else {"release_choice": why}


def format_evaluation(ev: dict) -> str:
    """Human-readable lines of :func:`evaluate_model`'s result."""
    if ev.get("implicit"):
        lines = [f"{ev['method']} ({ev.get('guarantee')}) on an implicit store: ranking metrics only, "
                 f"{ev['n_interactions']:,} held-out interactions (local ridge {ev['ridge']:g})"]
    elif ev.get("lists_only"):
        lines = [f"{ev['method']} ({ev.get('guarantee')}): ranking metrics only (its scores rank items, they are "
                 f"not predicted ratings: no RMSE), {ev['n_ratings']:,} held-out ratings (local ridge {ev['ridge']:g})"]
    else:
        lines = [f"{ev['method']} ({ev.get('guarantee')}): RMSE {ev['rmse']:.4f}  MAE {ev['mae']:.4f}  "
                 f"on {ev['n_ratings']:,} test ratings (local ridge {ev['ridge']:g})"]
    if ev.get("segment"):
        sg = ev["segment"]
        lines.append(f"segment {sg['number']} ({sg['name']}): its {sg['n_ratings']:,} ratings scored as the future of "
                     f"the store before it (each user's training ratings)")
    for name, b in (ev.get("baselines") or {}).items():
        what = f" ({b['what']})" if b.get("what") else ""
        lines.append(f"baseline {name.replace('_', '-')} (non-private): RMSE {b['rmse']:.4f}  MAE {b['mae']:.4f}"
                     f"{what}")
    if ev.get("verdict"):
        lines.append("verdict: " + format_verdict(ev["verdict"], ev["rmse"]))
    if ev.get("ranking"):
        lines.append(format_ranking(ev["ranking"], lists_only=bool(ev.get("lists_only"))))
    if ev.get("release_choice"):
        lines.append("choice: " + ev["release_choice"])
    if (note := statistics_note(ev)) is not None:
        lines.append("note: " + note)
    if ev.get("store_matches_model") is False:
        lines.append("another store than the model's (store_matches_model: false, --allow-other-store): the store's "
                     "fingerprint differs from that of the store the model was trained on; if it holds ratings the "
                     "model was trained on, the "
                     + ("ranking metrics are" if ev.get("lists_only") else "RMSE is") + " optimistic")
    return "\n".join(lines)
