"""What a user runs on their own device: solve their factor from the released model, recommend.

Nothing here touches other users' data, so it costs no privacy: the model (item
factors ``Q``, item biases ``b``, global mean ``mu``) is public once released, and a
user combines it with their own ratings ``r`` on items ``I``::

    (u, c) = argmin_{x, c}  sum_{j in I} (r_j - mu - b_j - c - Q_j . x)^2 + ridge (||x||^2 + c^2)

(Jain et al. 2018, local component; Liu et al. 2015 eq. 5; Xin & Jaakkola eq. 4),
and predicts ``mu + b_j + c + Q_j . u`` clipped to the rating range. Models of
``--method irls`` replace the squared loss by the Huber loss (IRLS, the same kernel
the training's user side ran; :func:`local_loss`).

The papers' local solve has no user intercept ``c``. We add one (a column of ones
next to ``Q``, shrunk by the same ridge) because users' rating levels differ far
more than a released low-rank ``Q`` can express: measured on ML-100K (20% split,
rank 16) it lowers the test RMSE of a released SGD model by about 0.1. It costs no
privacy (it is part of the user's own solve) and can be turned off per model
(``model.json`` key ``local_user_bias: false``) or per call (``user_bias=False``).

Models of ``--method fw`` and ``--method svd`` carry their own local computation
(``model.json`` key ``local``, :func:`local_kind`): a ``fw`` user replays Jain et
al.'s local Frank-Wolfe steps on the released basis (:func:`fw_local_rows`), an
``svd`` user projects her rescaled ratings on the released subspace
(:func:`projection_rows`); both give coefficients ``c`` on ``Q`` (no intercept) and
predict ``mu + b_j + Q_j . c`` like every other model. A ``public-private`` model
(Xin & Jaakkola) is predicted by the paper's eq. 4 (:func:`eq4_rows`, ``local:
xin_jaakkola_eq4``), with no intercept.

The ridge default comes from the model (``model.json`` key ``ridge``; for
``--method oja`` the factors are scaled to rows of mean squared norm 1, so the
ridge is the ratio of residual to signal variance and is dimensionless); since the
solve is local, a user may choose any ridge at no privacy cost.
"""

from __future__ import annotations

import csv
import os

import numpy as np

from streamdp.errors import InputError, ParameterError
from streamdp.kernels.fw import fw_replay, project_rows
from streamdp.kernels.linalg import predict_rows, residuals, solve_users, solve_users_huber
from streamdp.storage.ids import find, numeric, parse_id, utf8_lines

#: A model's local computation (``model.json`` key ``local``; absent = ``ridge``).
LOCAL_KINDS = ("ridge", "frank_wolfe", "projection", "xin_jaakkola_eq4")

#: Ridge used when a model does not state one.
FALLBACK_RIDGE = 1.0


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
    U = np.zeros((len(indptr) - 1, Q.shape[1]))
    iters, delta = local_loss(model)
    solve_users_huber(np.asarray(indptr, np.int64), np.asarray(items, np.int32), res, Q, float(ridge), iters, delta,
                      U)
    return U


def local_kind(model) -> str:
    """The model's local computation: ``ridge`` (default), ``frank_wolfe``, ``projection`` or ``xin_jaakkola_eq4``."""
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
    lo, hi = rating_range(model)
    return np.clip(_raw_scores(model, items, ratings, ridge, user_bias), lo, hi)


def _raw_scores(model, items, ratings, ridge, user_bias) -> np.ndarray:
    """Unclipped predictions of every item (ratings checked against the model's range)."""
    lo, hi = rating_range(model)
    r = np.asarray(ratings, np.float64)
    bad = ~((r >= lo) & (r <= hi))
    if bad.any():
        raise InputError(f"rating {r[bad][0]:g} is outside the model's rating range [{lo:g}, {hi:g}]")
    u = solve_user(model, items, ratings, ridge, user_bias=user_bias)
    Q, bias = local_design(model, user_bias)
    return model.global_mean + bias + Q @ u


def recommend(model, items, ratings, *, top: int = 10, ridge: float | None = None, user_bias: bool | None = None):
    """Top-``top`` unseen items for a user with ``ratings`` on dense ``items``.

    Returns ``(dense_item_indices, predicted_ratings)``, best first. Items are ranked by
    the unclipped prediction (clipping to the rating range would tie every item
    predicted above the top of the scale), ties broken by the lower index (a released
    model lists its items by ascending id); the ratings returned are clipped. The batch
    form (:mod:`streamdp.batch`) and the ranking metrics (:mod:`streamdp.ranking`) rank
    the same way. A rating outside the model's rating range is an :class:`InputError`.
    """
    if top < 1:
        raise ParameterError(f"--top must be >= 1, got {top}")
    raw = _raw_scores(model, items, ratings, ridge, user_bias)
    seen = np.zeros(len(raw), bool)
    seen[np.asarray(items, np.int64)] = True
    cand = np.flatnonzero(~seen)
    order = cand[np.lexsort((cand, -raw[cand]))][:top]
    lo, hi = rating_range(model)
    return order, np.clip(raw[order], lo, hi)


def read_user_ratings(path: str, item_ids, rating_range: tuple[float, float] | None = None
                      ) -> tuple[np.ndarray, np.ndarray, list]:
    """Read one user's ``item,rating`` file and map items to the model's dense indices.

    Accepts comma, tab or whitespace separated lines with two columns (an optional
    header line ``item,rating``); items are in the original id space. Items the
    model does not know are returned in the third value (and otherwise ignored).
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
    if not items:
        raise InputError(f"{path}: no ratings of items the model knows")
    return np.asarray(items, np.int32), np.asarray(ratings, np.float32), unknown

