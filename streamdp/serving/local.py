"""What a user runs on their own device: solve their factor from the released model, recommend.

Nothing here touches other users' data, so it costs no privacy: the model (item
factors ``Q``, item biases ``b``, global mean ``mu``) is public once released, and a
user combines it with their own ratings ``r`` on items ``I``::

    (u, c) = argmin_{x, c}  sum_{j in I} (r_j - mu - b_j - c - Q_j . x)^2 + ridge (||x||^2 + c^2)

(Jain et al. 2018, local component; Liu et al. 2015 eq. 5; Xin & Jaakkola eq. 4),
and predicts ``mu + b_j + c + Q_j . u`` clipped to the rating range. Public names:
:func:`solve_user`, :func:`user_scores`, :func:`recommend`, :func:`solve_block`,
:func:`predict_block`, :func:`list_scorer`, :func:`list_offset`, :func:`local_kind`.

Decisions a reader must know:

* **a user intercept** ``c``, which the papers' local solve lacks: users' rating levels
  differ more than a low-rank ``Q`` can express (about 0.1 RMSE on ML-100K); off per model
  (``local_user_bias: false``) or per call (``user_bias=False``);
* models carry their own local computation (``model.json`` ``local``, :func:`local_kind`):
  ``irls`` uses the Huber loss (:func:`local_loss`), ``fw`` replays local Frank-Wolfe
  steps (:func:`fw_local_rows`), ``svd`` projects (:func:`projection_rows`),
  ``public-private`` uses eq. 4 (:func:`eq4_rows`), ``ials`` the implicit-feedback solve
  (:func:`implicit_rows`, :func:`implicit_pairs`; its scores rank, :func:`score_range`);
* the ridge default comes from the model (``model.json`` ``ridge``); being local, a user
  may choose any ridge at no privacy cost;
* **lists** rank the unrated items by the model's list score (:func:`list_scorer`): the
  unclipped prediction plus, for a model that released item counts,
  ``weight * log(1 + max(count, 0))`` (:func:`list_offset`: post-processing, the same for
  every user); ``recommend``, the batch form, ``evaluate``'s ranking metrics and the API
  all rank through it. The weight ``(rating max - rating min) / 4``
  (:data:`LIST_WEIGHT_SHARE`) never fell below the most-popular chart where measured; divided by
  ``1 - s1`` where the model released the share ``s1`` of one-rating users (:func:`one_rating_share`).

Design notes (the local kinds, why the list score, the weight's measurements):
docs/design-notes.md#streamdpservinglocalpy.
"""

from __future__ import annotations

import csv
import os

import numpy as np

from streamdp.errors import InputError, ParameterError
from streamdp.kernels.fw import fw_replay, project_rows
from streamdp.kernels.csr import masked_indptr
from streamdp.kernels.ials import ials_solve_users, rating_confidences
from streamdp.kernels.linalg import predict_rows, residuals, solve_users, solve_users_huber
from streamdp.storage.ids import find, numeric, parse_id, utf8_lines

#: A model's local computation (``model.json`` key ``local``; absent = ``ridge``).
LOCAL_KINDS = ("ridge", "frank_wolfe", "projection", "xin_jaakkola_eq4", "implicit")

#: Ridge used when a model does not state one.
FALLBACK_RIDGE = 1.0

#: The list scorers a model may declare (``model.json`` key ``list_scorer``, ``kind``).
LIST_SCORERS = ("predicted_rating", "rating_plus_log_count")
#: Extras a model may release item counts in (first found is used), and what they are.
RELEASED_COUNTS = {
    "noisy_item_weight": "the model's released noisy item weight totals (post-processing, no further privacy cost)",
    "public_item_count": "the public users' item counts the model released (public data)",
}
#: The list score's popularity weight as a share of the declared rating range (module docstring).
LIST_WEIGHT_SHARE = 0.25
#: ``chart_first``: the list score's lift per place of a private top-K chart's items (:func:`list_offset`), far above
#: any difference of predicted ratings and log counts, so the chart's items list first, in its order.
CHART_FIRST_STEP = 1e6
#: The largest share of one-rating users the weight is divided by ``1 - share`` for (:func:`default_list_scorer`):
#: at most 20x the weight, where the list is the released chart but for the item term's ties.
ONE_RATING_MAX = 0.95


def model_ridge(model, ridge: float | None = None) -> float:
    """``ridge`` if given, else the model's default."""
    r = float(model.info.get("ridge", FALLBACK_RIDGE)) if ridge is None else float(ridge)
    if not (r > 0 and np.isfinite(r)):
        raise ParameterError(f"--ridge must be a positive number, got {ridge}")
    return r


def rating_range(model) -> tuple[float, float]:
    """The declared rating range the model was trained on (``(-inf, inf)`` if unknown)."""
    p = model.info.get("rating_range") or {}
    return float(p.get("min", -np.inf)), float(p.get("max", np.inf))


def score_range(model) -> tuple[float, float]:
    """The range a model's scores are clipped to: its rating range, or none for scores that are not ratings
    (``local: implicit``: a preference score that only ranks)."""
    return (-np.inf, np.inf) if local_kind(model) == "implicit" else rating_range(model)


def uses_user_bias(model, user_bias: bool | None = None) -> bool:
    """Whether the local solve fits a user intercept (default: yes, unless the model says no; never for
    ``fw``/``svd`` models, whose local computation has none)."""
    if local_kind(model) != "ridge":
        return False
    return bool(model.info.get("local_user_bias", True)) if user_bias is None else bool(user_bias)


def local_design(model, user_bias: bool | None = None):
    """``(Q, b)``: the float64 item matrix of the local solve (``[Q, 1]`` with a user
    intercept) and item biases, computed once per model and kept on it."""
    ub = uses_user_bias(model, user_bias)
    cache = getattr(model, "_local_design", None)
    if cache is not None and cache[0] == ub:
        return cache[1], cache[2]
    Q = np.asarray(model.item_factors, dtype=np.float64)
    if ub:
        Q = np.hstack([Q, np.ones((Q.shape[0], 1))])
    Q = np.ascontiguousarray(Q)
    bias = np.ascontiguousarray(model.item_bias, dtype=np.float64)
    try:
        model._local_design = (ub, Q, bias)
    except AttributeError:  # a frozen or slotted stand-in: no caching
        pass
    return Q, bias


def solve_block(model, indptr, items, ratings, ridge: float, *, user_bias: bool | None = None) -> np.ndarray:
    """User factors of a CSR block of users' own ratings (dense item indices).

    Returns ``(n_users, k + 1)`` with the user intercept in the last column, or
    ``(n_users, k)`` without one.
    """
    Q, bias = local_design(model, user_bias)
    res = np.empty(len(items), np.float64)
    residuals(np.asarray(items, np.int32), np.asarray(ratings, np.float32), float(model.global_mean), bias, res)
    kind = local_kind(model)
    if kind == "frank_wolfe":
        return fw_local_rows(model, np.asarray(indptr, np.int64), np.asarray(items, np.int32), res, Q)
    if kind == "projection":
        return projection_rows(model, np.asarray(indptr, np.int64), np.asarray(items, np.int32), res, Q)
    if kind == "xin_jaakkola_eq4":
        return eq4_rows(np.asarray(indptr, np.int64), np.asarray(items, np.int32), res, Q, ridge)
    if kind == "implicit":
        return implicit_rows(model, indptr, items, ratings, Q, ridge)
    U = np.zeros((len(indptr) - 1, Q.shape[1]))
    iters, delta = local_loss(model)
    solve_users_huber(np.asarray(indptr, np.int64), np.asarray(items, np.int32), res, Q, float(ridge), iters, delta,
                      U)
    return U


def default_list_scorer(info: dict, extras: dict) -> dict:
    """The list scorer a model written with ``info`` and per-item ``extras`` gets when its method states none.

    ``rating_plus_log_count`` when the model releases item counts (:data:`RELEASED_COUNTS`)
    and declares its rating range, else ``predicted_rating``. Reads only the names of
    the released arrays and the declared range: no statistic of the data.

    >>> default_list_scorer({"rating_range": {"min": 1, "max": 5}}, {"noisy_item_weight": None})["weight"]
    1.0
    >>> default_list_scorer({}, {})
    {'kind': 'predicted_rating'}
    """
    rr = info.get("rating_range") or {}
    counts = next((name for name in RELEASED_COUNTS if name in extras), None)
    lo, hi = rr.get("min"), rr.get("max")
    if counts is None or lo is None or hi is None or not np.isfinite(float(hi) - float(lo)):
        return {"kind": "predicted_rating"}
    weight = LIST_WEIGHT_SHARE * (float(hi) - float(lo))
    rule = f"weight = {LIST_WEIGHT_SHARE:g} x (rating max - rating min), the declared range"
    s1 = one_rating_share(info.get("user_profile"))
    if s1 > 0:
        weight /= 1.0 - s1
        rule += f", / (1 - {s1:.3f}), the released share of users with one training rating"
    out = {"kind": "rating_plus_log_count", "counts": counts, "weight": round(weight, 12), "rule": rule}
    chart = info.get("chart") or {}
    if chart.get("kind") == "top-k selection":  # its items hold the K largest counts (privacy.topk.chart_scores)
        out["chart_first"] = int(chart["k"])
        out["rule"] += f"; the {int(chart['k'])} items of the private top-K chart first, in its order"
    return out


def one_rating_share(profile: dict | None) -> float:
    """The share of users with one training rating in a released ``user_profile`` (``model.json``), at most
    :data:`ONE_RATING_MAX`; 0 without a profile or where the bin's count does not clear twice its noise.

    Post-processing of the released histogram (:mod:`streamdp.methods._profile`). Negative noisy counts are 0.

    >>> one_rating_share({"bin_lower_edges": [1, 2], "users": [850.0, 150.0], "noise_std": 10.0})
    0.83
    >>> one_rating_share({"bin_lower_edges": [1, 2], "users": [15.0, 985.0], "noise_std": 10.0})
    0.0
    """
    if not profile or not profile.get("users") or profile.get("bin_lower_edges", [None])[0] != 1:
        return 0.0
    users = np.maximum(np.asarray(profile["users"], np.float64), 0.0)
    total = users.sum()
    noise = 2.0 * float(profile.get("noise_std") or 0.0)
    if total <= 0 or users[0] <= noise:
        return 0.0
    return round(min(float(users[0] - noise) / float(total), ONE_RATING_MAX), 6)


def list_scorer(model) -> dict:
    """The model's list scorer (``model.json`` ``list_scorer``; absent: ``predicted_rating``, the old behaviour)."""
    sc = (getattr(model, "info", None) or {}).get("list_scorer") or {"kind": "predicted_rating"}
    if sc.get("kind") not in LIST_SCORERS:
        raise InputError(f"model.json: unknown list scorer {sc.get('kind')!r} (this streamdp knows "
                         f"{', '.join(LIST_SCORERS)})")
    return sc


def list_offset(model) -> np.ndarray | None:
    """Per-item addition to the predicted rating that gives the list score (model's item order), or ``None``.

    ``weight * log(1 + max(count, 0))`` of the released counts named by the model's
    :func:`list_scorer`: post-processing of the release (a negative noisy count is
    taken as 0). ``None`` for ``predicted_rating``.

    >>> from types import SimpleNamespace
    >>> m = SimpleNamespace(info={"list_scorer": {"kind": "rating_plus_log_count", "counts": "c", "weight": 1.0}},
    ...                     extras={"c": np.array([-5.0, 0.0, np.e - 1])})
    >>> list_offset(m).round(6).tolist()
    [0.0, 0.0, 1.0]

    With ``chart_first`` (a private top-K chart, :func:`default_list_scorer`) the ``K`` largest counts, the chart's
    items, are lifted by :data:`CHART_FIRST_STEP` a place, in their order:

    >>> m.info["list_scorer"]["chart_first"] = 2
    >>> (list_offset(m) // CHART_FIRST_STEP).tolist()
    [0.0, 1.0, 2.0]
    """
    sc = list_scorer(model)
    if sc["kind"] == "predicted_rating":
        return None
    c = np.asarray((getattr(model, "extras", None) or {}).get(sc["counts"], ()), np.float64)
    if c.shape != (model.n_items if hasattr(model, "n_items") else len(c),):
        raise InputError(f"model.json: list scorer reads {sc['counts']!r}, which the model does not hold per item")
    off = float(sc["weight"]) * np.log1p(np.maximum(c, 0.0))
    k = min(int(sc.get("chart_first") or 0), len(c))
    if k:  # a private top-K chart's items, lifted above every count in its order (privacy.topk.chart_scores)
        first = np.lexsort((np.arange(len(c)), -c))[:k]
        off[first] += CHART_FIRST_STEP * (k - np.arange(k))
    return off


def list_bias(model, bias, pos=None) -> np.ndarray:
    """``bias`` plus the model's :func:`list_offset` (float64, contiguous): the item term of the list score.

    ``model`` is the model as released (its per-item extras in ascending-id order);
    ``pos[j]``, when given, is the model position of ``bias``'s item ``j`` (a store's
    order, :meth:`streamdp.serving.model.Model.in_order_of`).
    """
    off = list_offset(model)
    b = np.asarray(bias, np.float64)
    if off is not None and pos is not None:
        off = off[np.asarray(pos, np.int64)]
    return np.ascontiguousarray(b if off is None else b + off)


def list_model(model):
    """The model lists are ranked by: a rating model's lists part (``model.json``'s ``lists``, the ``lists_*``
    arrays: :mod:`streamdp.methods._lists`) when its lists are the part's, else ``model`` itself.

    Built from the model as it is (released, padded by :meth:`~streamdp.serving.model.Model.padded_to`): the part
    shares its items and their order; reorder the result with its own ``in_order_of``.
    """
    lists = (getattr(model, "info", None) or {}).get("lists") or {}
    if not lists.get("used"):
        return model
    cached = getattr(model, "_lists_model", None)
    if cached is not None:
        return cached
    import dataclasses

    from streamdp.manifest import LISTS_PREFIX as P

    ex = model.extras
    try:  # the model's own class (a Model), its items, ledger and padding
        lm = dataclasses.replace(model, item_factors=np.asarray(ex[P + "item_factors"], np.float32),
                                 item_bias=np.asarray(ex[P + "item_bias"], np.float32),
                                 global_mean=float(lists["global_mean"]), info=dict(lists["model"]),
                                 extras={n: ex[P + n] for n in lists.get("extras", ())})
    except KeyError as exc:
        raise InputError(f"{model.path}: model.json's lists part names {exc} and the model does not hold it") from None
    try:
        model._lists_model = lm
    except AttributeError:  # a frozen or slotted stand-in: no caching
        pass
    return lm


def factors_released(model) -> bool:
    """Whether ``model`` released item factors: a non-zero entry among its factor columns (an ``ials`` model's
    popularity column is not a factor; a release of item biases or of a chart holds zeros), unless ``model.json``'s
    ``factors_released`` says it did not. The one test of it (``recommend``, ``similar_items``, ``--warm-start``,
    rehearse).

    >>> from types import SimpleNamespace as M
    >>> factors_released(M(item_factors=np.zeros((3, 2)), rank=2, info={}))
    False
    >>> factors_released(M(item_factors=np.eye(3), rank=3))
    True
    >>> factors_released(M(item_factors=np.eye(3), rank=3, info={"factors_released": False}))
    False
    """
    if (getattr(model, "info", None) or {}).get("factors_released") is False:
        return False
    V = np.asarray(model.item_factors)
    return V.ndim == 2 and bool(np.any(V[:, :getattr(model, "rank", V.shape[1])]))


def personalised(model) -> bool:
    """Whether the model's lists differ between users beyond the items each rated: its lists model
    (:func:`list_model`) released factors (:func:`factors_released`).

    A release of item biases only (``factors_released: false``, or all-zero factors)
    ranks every user's unrated items the same way: her own intercept shifts every
    score alike.
    """
    return factors_released(list_model(model))


#: What ``recommend``/``evaluate``/``train`` say of a release without factors (a rating model: its item biases).
NOT_PERSONALISED = "only item biases released: every user gets the same list (apart from the items she rated)"
#: The same for an ``ials`` model without factors: it ranks by its released item counts.
NOT_PERSONALISED_CHART = ("only the most-popular chart released (its item counts, noisy unless non-private): every user "
                          "gets the same list (apart from the items she rated)")


def not_personalised_note(model=None, *, chart: bool | None = None) -> str:
    """What to say of a release without factors: :data:`NOT_PERSONALISED_CHART` for an implicit model (``local:
    implicit``, or ``chart=True``), :data:`NOT_PERSONALISED` otherwise."""
    if chart is None:
        chart = model is not None and local_kind(list_model(model)) == "implicit"
    return NOT_PERSONALISED_CHART if chart else NOT_PERSONALISED


def popular_list(model, top: int):
    """The fallback list of a user none of whose items the model knows: ``(dense items, scores, what)``.

    The most popular items by the counts the model released (post-processing), or,
    for a model that released none, its list score for a user without ratings
    (``mu + b_j``); the scores returned are what the model predicts for a user
    without ratings (``mu + b_j``, clipped to the rating range).
    """
    if top < 1:
        raise ParameterError(f"--top must be >= 1, got {top}")
    lo, hi = rating_range(model)
    base = float(model.global_mean) + np.asarray(model.item_bias, np.float64)
    extras = getattr(list_model(model), "extras", None) or {}  # a lists part's counts: its chart
    name = next((n for n in RELEASED_COUNTS if n in extras), None)
    idx = np.arange(len(base))
    if name is not None:
        c = np.asarray(extras[name], np.float64)
        order = idx[np.lexsort((idx, -c))][:top]
        what = "the most popular items by " + RELEASED_COUNTS[name].split(" (")[0]
    else:
        order = idx[np.lexsort((idx, -list_bias(model, base)))][:top]
        what = "the model's best items for a user without ratings (it released no item counts)"
    return order, np.clip(base[order], lo, hi), what
def check_finite(model, values, what: str = "predictions") -> None:
    """Refuse (:class:`InputError`) non-finite ``values`` computed from ``model`` (a user's row, predictions, scores).

    A model whose values are finite but absurd (factors of ``1e30``: loading accepts them)
    overflows the local solve: ``evaluate`` printed ``RMSE nan`` and a verdict "nan worse"
    with exit 0. Every output computed from a model (evaluate, recommend, batch
    recommend) checks what it computed here, so such a model is one line naming it.

    >>> from types import SimpleNamespace
    >>> m = SimpleNamespace(path="m", item_factors=np.full((2, 1), 1e30, np.float32))
    >>> check_finite(m, np.array([1.0, np.nan]))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    streamdp.errors.InputError: m: its predictions are not finite (NaN or infinity): the model's values ...
    """
    v = np.asarray(values)
    if v.size and not np.isfinite(v).all():
        V = np.asarray(getattr(model, "item_factors", np.zeros(0)))
        big = f" (largest |item factor| {float(np.abs(V).max()):.3g})" if V.size else ""
        raise InputError(f"{getattr(model, 'path', 'model')}: its {what} are not finite (NaN or infinity): the "
                         f"model's values{big} overflow the local solve's arithmetic; the model is damaged or edited")


def local_kind(model) -> str:
    """The model's local computation: ``ridge`` (default), ``frank_wolfe``, ``projection``, ``xin_jaakkola_eq4``
    or ``implicit``."""
    kind = (getattr(model, "info", None) or {}).get("local", "ridge")
    if kind not in LOCAL_KINDS:
        raise InputError(f"model.json: unknown local computation {kind!r} (this streamdp knows "
                         f"{', '.join(LOCAL_KINDS)})")
    return kind


def eq4_rows(indptr, items, x, W, lam: float) -> np.ndarray:
    """Each user's coefficients ``u`` of Xin & Jaakkola's eq. 4 with ``Sigma = W W^T`` (``W``: the item factors).

    Eq. 4 predicts the unobserved items ``phi^c`` from the centred ratings ``x_phi``
    (``x = r - mu``, ``mu`` the item means ``global_mean + item_bias``) as
    ``x_hat = Sigma_{phi^c, phi} (lambda' I + Sigma_{phi, phi})^-1 x_phi``. With
    ``Sigma = W W^T`` the push-through identity
    ``W_phi^T (lambda' I + W_phi W_phi^T)^-1 = (lambda' I_k + W_phi^T W_phi)^-1 W_phi^T``
    gives ``x_hat = W_{phi^c} u`` with ``u = (lambda' I_k + W_phi^T W_phi)^-1 W_phi^T x_phi``,
    a ``k x k`` ridge solve: ``O(|phi| k^2 + k^3)`` per user instead of the
    ``|phi| x |phi|`` inverse, then ``O(k)`` per predicted item; ``Sigma`` is never
    formed. ``lam`` is ``lambda'`` (the model's ``ridge``). Predictions are
    ``mu_j + W_j . u`` (no separate user intercept: eq. 4 has none; a public-private
    model may carry one as a constant last column of ``W``, ``model.json``
    ``user_offset``, which this same solve fits with ridge ``lam / s^2``).
    """
    U = np.zeros((len(indptr) - 1, W.shape[1]))
    solve_users(indptr, items, x, W, float(lam), U)
    return U


#: How a value becomes a preference and a confidence (``local_implicit.preference``): see :func:`implicit_pairs`.
PREFERENCES = ("binary", "graded", "above")


def implicit_pairs(indptr, items, values, params: dict, drop=None):
    """``(indptr, items, confidence)``: a CSR block's positive pairs and their confidences ``c >= 1``.

    ``params`` is ``model.json``'s ``local_implicit`` (the training uses the same
    function, so the user's device and the item side agree):

    * an implicit store (``implicit: true``, values are counts or weights):
      ``c = 1 + min(alpha log(1 + value / count_scale), max_confidence - 1)``;
    * a rating store: ``binary``: every rated item is a positive with ``c = 1 + alpha``;
      ``graded``: every rated item a positive with ``c = 1 + alpha (r - min) / (max - min)``;
      ``above``: only ratings above the range's midpoint are positives, ``c = 1 + alpha``;
      every ``c`` capped at ``max_confidence``.

    ``drop``: positions in the block's arrays left out first (the training's held-out validation ratings,
    :func:`streamdp.methods._selection.held_positions`; ``indptr[0] == 0``): the pairs of the block without them,
    as if those ratings were not there. On a rating store the positions, the preference's filter and the
    confidences are one kernel pass (:func:`streamdp.kernels.ials.rating_confidences`), no copy of the block.

    >>> p = {"implicit": False, "preference": "above", "alpha": 3.0, "max_confidence": 10.0,
    ...      "rating_min": 1.0, "rating_max": 5.0, "count_scale": 1.0}
    >>> ip, it, c = implicit_pairs(np.array([0, 3]), np.array([4, 5, 6]), np.array([5.0, 2.0, 4.0]), p)
    >>> ip.tolist(), it.tolist(), c.tolist()
    ([0, 2], [4, 6], [4.0, 4.0])
    >>> implicit_pairs(np.array([0, 3]), np.array([4, 5, 6]), np.array([5.0, 2.0, 4.0]), p, drop=[0])[1].tolist()
    [6]
    """
    indptr = np.asarray(indptr, np.int64)
    items = np.asarray(items, np.int32)
    alpha, cmax = float(params["alpha"]), float(params["max_confidence"])
    dropping = drop is not None and len(drop) > 0
    if params.get("implicit"):
        if dropping:
            keep = np.ones(len(items), bool)
            keep[np.asarray(drop, np.int64)] = False
            out_ip = np.empty(len(indptr), np.int64)
            masked_indptr(indptr, keep, out_ip)
            indptr, items, values = out_ip, items[keep], np.asarray(values)[keep]
        table = _count_table(values, float(params.get("count_scale", 1.0)), alpha, cmax)
        if table is not None:
            return indptr, items, table[0][table[1]]
        v = np.asarray(values, np.float64)
        f = np.log1p(np.maximum(v, 0.0) / float(params.get("count_scale", 1.0)))
        return indptr, items, 1.0 + np.minimum(alpha * f, cmax - 1.0)
    pref = params["preference"]
    if pref == "binary" and not dropping:  # one confidence: no per-rating arithmetic
        return indptr, items, np.full(len(items), 1.0 + min(alpha, cmax - 1.0))
    # a rating store's pairs: one kernel pass, no temporary per rating
    above, graded = pref == "above", pref == "graded"
    lo, hi = (float(params["rating_min"]), float(params["rating_max"])) if above or graded else (0.0, 1.0)
    values = np.asarray(values)
    if values.dtype not in (np.float32, np.float64):
        values = values.astype(np.float64)
    if not above and not dropping:
        conf = np.empty(len(items))
        rating_confidences(items, values, _ALL, graded, lo, hi, alpha, cmax, np.empty(0, np.int32), conf)
        return indptr, items, conf
    keep = values > (lo + hi) / 2.0 if above else np.ones(len(items), bool)
    if dropping:
        keep[np.asarray(drop, np.int64)] = False
    out_ip = np.empty(len(indptr), np.int64)
    n = masked_indptr(indptr, keep, out_ip)
    # one spare slot: the kernel writes the ratings after the last pair there (branch-free)
    out_it, conf = np.empty(n + 1, np.int32), np.empty(n + 1)
    rating_confidences(items, values, keep, graded, lo, hi, alpha, cmax, out_it, conf)
    return out_ip, out_it[:n], conf[:n]


#: ``rating_confidences``' mask meaning every rating is a pair.
_ALL = np.zeros(0, np.bool_)


#: Counts below this are looked up (:func:`_count_table`) instead of computed per pair.
COUNT_TABLE = 1 << 16


def _count_table(values, scale: float, alpha: float, cmax: float):
    """``(table, counts)`` with ``table[counts]`` :func:`implicit_pairs`' confidences bit for bit, when every value is
    a whole count below :data:`COUNT_TABLE` (interaction counts are), else ``None``: one ``log1p`` per distinct
    count instead of one per pair (8 of 11 ms per 1M-pair block, which every pass of ``ials`` pays)."""
    v = np.asarray(values)
    if not len(v):
        return None
    counts = v.astype(np.int64)
    top = int(counts.max())
    if top >= COUNT_TABLE or int(counts.min()) < 0 or not np.array_equal(counts, v):
        return None
    f = np.log1p(np.maximum(np.arange(top + 1, dtype=np.float64), 0.0) / scale)
    return 1.0 + np.minimum(alpha * f, cmax - 1.0), counts


def implicit_rows(model, indptr, items, values, Q, ridge: float) -> np.ndarray:
    """Each user's row of an ``ials`` model: the implicit-ALS solve on the released item rows ``Q``.

    ``u = (Q^T Q + sum_{j in I} (c_j - 1) q_j q_j^T + ridge I)^-1 sum_{j in I} c_j q_j``
    (:func:`streamdp.kernels.ials.ials_solve_users`, the kernel the training's user side
    ran); ``Q^T Q`` is computed once per model. When the release chose the chart for light users
    (``model.json`` ``selection.chart_below``: ``ials``'s per-class choice), a user of fewer
    training items than that gets the row that scores the popularity column alone: her list is
    the chart by the released counts (her own count decides, on her device: joint DP).

    A user whose solve is exactly zero (every item she chose has a zero row: no factors and no released
    popularity, e.g. items below the item floor whose noisy counts were clipped to 0) would score every item
    alike and list by the tie-break alone; she gets the popularity column's row too, the chart (FilmTrust at
    epsilon 0.5, no factors released: 20 of 1,508 users, which put the lists at 0.998x the chart).
    """
    ip, it, conf = implicit_pairs(indptr, items, values, model.info["local_implicit"])
    cache = getattr(model, "_local_gram", None)
    if cache is None or cache[0] is not Q:
        cache = (Q, np.ascontiguousarray(Q.T @ Q))
        try:
            model._local_gram = cache
        except AttributeError:
            pass
    U = np.zeros((len(ip) - 1, Q.shape[1]))
    ials_solve_users(ip, it, conf, Q, cache[1], float(ridge), U, False)
    if model.info.get("popularity_column"):
        below = int((model.info.get("selection") or {}).get("chart_below") or 0)
        if below:  # the release chose the chart for users this light: their rows start from zero
            U[np.diff(np.asarray(indptr, np.int64)) < below] = 0.0
        # a zero row would rank by the tie-break alone: its scores are the popularity column, the chart by the
        # released counts
        U[~U.any(axis=1), -1] = 1.0
    return U


def fw_local_rows(model, indptr, items, x, Q) -> np.ndarray:
    """Each user's Frank-Wolfe coefficients ``c`` (``Y_i = c Q^T``) from her centred ratings ``x``.

    The ``T`` local steps of Jain et al.'s Alg. 1 (``A_local``), replayed on the
    released basis ``Q`` with the released ``lambda_t`` and step sizes
    (:func:`streamdp.kernels.fw.fw_replay`): the same arithmetic the training ran for
    her, from her own ratings only.
    """
    p = model.info.get("local_fw") or {}
    clip, bound = p.get("clip"), p.get("bound")
    C = np.zeros((len(indptr) - 1, Q.shape[1]))
    fw_replay(indptr, items, x, Q, np.asarray(model.extras["fw_lambda"], np.float64),
              np.asarray(model.extras["fw_eta"], np.float64), float(p["k"]),
              np.inf if clip is None else float(clip), np.inf if bound is None else float(bound), C)
    return C


def projection_rows(model, indptr, items, x, Q) -> np.ndarray:
    """Each user's coefficients on the released subspace: ``(n_items / n_i) Q^T P_Omega(x_i)``.

    The private SVD baseline's local step (Jain et al. 2018, the SVD algorithm of
    their supplement; McSherry & Mironov 2009): project the zero-filled row of
    centred ratings, rescaled by the inverse of the user's own sampling rate.
    """
    C = np.zeros((len(indptr) - 1, Q.shape[1]))
    project_rows(indptr, items, x, Q, Q.shape[0], C)
    return C


def local_loss(model) -> tuple[int, float]:
    """``(irls_iters, huber_delta)`` of the model's local solve: ``(0, inf)`` is the squared loss.

    ``--method irls`` models say ``model.json`` ``local_huber: {delta, irls_iters}``: the
    user solves with the same Huber-loss IRLS the training's user side used.
    """
    h = (getattr(model, "info", None) or {}).get("local_huber") or {}
    return int(h.get("irls_iters", 0)), float(h.get("delta", np.inf))


def predict_block(model, U, indptr, items, *, user_bias: bool | None = None) -> np.ndarray:
    """Predicted ratings of a block's users on ``items`` (CSR), clipped to the rating range.

    ``U`` is what :func:`solve_block` returned with the same ``user_bias``.
    """
    lo, hi = rating_range(model)
    Q, bias = local_design(model, user_bias)
    out = np.empty(len(items), np.float64)
    predict_rows(np.asarray(indptr, np.int64), np.asarray(items, np.int32), np.asarray(U, np.float64),
                 Q, bias, float(model.global_mean), lo, hi, out)
    return out


def solve_user(model, items, ratings, ridge: float | None = None, *, user_bias: bool | None = None) -> np.ndarray:
    """One user's factor from their ratings on dense item indices (intercept last, if fitted).

    >>> from types import SimpleNamespace
    >>> m = SimpleNamespace(item_factors=np.eye(3), item_bias=np.zeros(3), global_mean=3.0, info={})
    >>> solve_user(m, np.array([0, 2]), np.array([5.0, 1.0]), ridge=1.0, user_bias=False).round(3).tolist()
    [1.0, 0.0, -1.0]
    >>> solve_user(m, np.array([0, 2]), np.array([5.0, 1.0]), ridge=1.0).round(3).tolist()
    [1.0, 0.0, -1.0, 0.0]
    """
    items = np.asarray(items, np.int32)
    return solve_block(model, np.array([0, len(items)], np.int64), items, np.asarray(ratings, np.float32),
                       model_ridge(model, ridge), user_bias=user_bias)[0]


def user_scores(model, items, ratings, *, ridge: float | None = None, user_bias: bool | None = None) -> np.ndarray:
    """Predicted rating of every item of ``model`` for a user with ``ratings`` on dense ``items``.

    The user's row is solved locally (:func:`solve_user`), predictions are clipped to
    the model's rating range. A rating outside that range is an :class:`InputError`.
    """
    lo, hi = score_range(model)
    return np.clip(_raw_scores(model, items, ratings, ridge, user_bias), lo, hi)


def _raw_scores(model, items, ratings, ridge, user_bias) -> np.ndarray:
    """Unclipped predictions of every item (ratings checked against the model's range)."""
    lo, hi = rating_range(model)
    r = np.asarray(ratings, np.float64)
    bad = ~((r >= lo) & (r <= hi))
    if bad.any():
        raise InputError(f"rating {r[bad][0]:g} is outside the model's rating range [{lo:g}, {hi:g}]")
    if local_kind(model) == "implicit" and ((model.info.get("local_implicit") or {}).get("implicit")):
        if not (r > 0).all():  # the values are counts: ingest refuses a count <= 0 in an interaction log, so do we
            from streamdp.storage.formats import not_positive_reason  # pyarrow: not loaded by `train`

            raise InputError(not_positive_reason(float(r[~(r > 0)][0])))
    u = solve_user(model, items, ratings, ridge, user_bias=user_bias)
    Q, bias = local_design(model, user_bias)
    raw = model.global_mean + bias + Q @ u
    check_finite(model, raw)
    return raw


def recommend(model, items, ratings, *, top: int = 10, ridge: float | None = None, user_bias: bool | None = None):
    """Top-``top`` unseen items for a user with ``ratings`` on dense ``items``.

    Returns ``(dense_item_indices, predicted_ratings)``, best first. Items are ranked by
    the model's list score (the unclipped prediction plus the model's :func:`list_offset`;
    clipping to the rating range would tie every item predicted above the top of the
    scale), ties broken by the lower index (a released model lists its items by
    ascending id); the ratings returned are the predictions, clipped. The batch form
    (:mod:`streamdp.serving.batch`) and the ranking metrics (:mod:`streamdp.serving.ranking`) rank the
    same way. A rating outside the model's rating range is an :class:`InputError`.
    """
    if top < 1:
        raise ParameterError(f"--top must be >= 1, got {top}")
    raw = _raw_scores(model, items, ratings, ridge, user_bias)
    lm = list_model(model)  # a lists part ranks (at its own ridge); the ratings shown are the model's predictions
    ranked = raw if lm is model else _raw_scores(lm, items, ratings, None, None)
    off = list_offset(lm)
    score = ranked if off is None else ranked + off
    seen = np.zeros(len(raw), bool)
    seen[np.asarray(items, np.int64)] = True
    cand = np.flatnonzero(~seen)
    order = cand[np.lexsort((cand, -score[cand]))][:top]
    lo, hi = score_range(model)
    return order, np.clip(raw[order], lo, hi)


def read_user_ratings(path: str, item_ids, rating_range: tuple[float, float] | None = None
                      ) -> tuple[np.ndarray, np.ndarray, list]:
    """Read one user's ``item,rating`` file and map items to the model's dense indices.

    Accepts comma, tab or whitespace separated lines with two columns (an optional
    header line ``item,rating``); items are in the original id space. Items the
    model does not know are returned in the third value (and otherwise ignored).
    A file whose items are all unknown gives empty arrays (the caller falls back to
    :func:`popular_list`); a file with no rating at all is an :class:`InputError`.
    Raises :class:`InputError` naming the file and line on malformed input, and on a
    rating outside ``rating_range`` (the model's, :func:`rating_range`): a 99 on a
    1..5 model would otherwise push every prediction to the top of the range.
    """
    lo, hi = (-np.inf, np.inf) if rating_range is None else (float(rating_range[0]), float(rating_range[1]))
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file")
    ids = np.asarray(item_ids)
    is_num = numeric(ids)
    keys, raw, lines, ratings, unknown = [], [], [], [], []
    with open(path, newline="", encoding="utf-8-sig") as f:  # ids are text: UTF-8 whatever the locale
        for lineno, line in enumerate(utf8_lines(f, path), 1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            parts = next(csv.reader([text], delimiter="," if "," in text else "\t")) if ("," in text or "\t" in text) \
                else text.split()
            parts = [p.strip() for p in parts]
            if len(parts) < 2:
                raise InputError(f"{path}:{lineno}: expected 'item,rating', got {text!r}")
            try:
                r = float(parts[1])
            except ValueError:
                if lineno == 1 or not keys:
                    continue  # header
                raise InputError(f"{path}:{lineno}: rating {parts[1]!r} is not a number") from None
            if not np.isfinite(r):
                raise InputError(f"{path}:{lineno}: rating {parts[1]!r} is not finite")
            if not lo <= r <= hi:
                raise InputError(f"{path}:{lineno}: rating {parts[1]} is outside the model's rating range "
                                 f"[{lo:g}, {hi:g}]")
            try:
                keys.append(parse_id(parts[0], is_num))
            except ValueError:
                raise InputError(f"{path}:{lineno}: item id {parts[0]!r} is not an integer (the model's item "
                                 f"ids are integers)") from None
            raw.append(parts[0])
            lines.append(lineno)
            ratings.append(r)
    pos = find(ids, keys).tolist()
    items, kept, seen = [], [], {}
    for text, j, lineno, r in zip(raw, pos, lines, ratings):
        if j < 0:
            unknown.append(text)
            continue
        if j in seen:
            raise InputError(f"{path}:{lineno}: item {text} rated twice (first on line {seen[j]})")
        seen[j] = lineno
        items.append(j)
        kept.append(r)
    ratings = kept
    if not raw:
        raise InputError(f"{path}: no ratings (lines 'item,rating')")
    return np.asarray(items, np.int32), np.asarray(ratings, np.float32), unknown

