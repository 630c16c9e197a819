"""Choosing epsilon without spending it: a synthetic store shaped like a real one.

``streamdp generate --like STORE --out SYN`` and ``streamdp sweep STORE --rehearse`` write a store from
:func:`streamdp.storage.generate.generate_store` whose shape is STORE's, made only from what is public or released,
never trained on STORE's ratings. Public names: :func:`generate_like` (the command), :func:`check_like`,
:func:`released_shape`, :func:`shape_from_histogram`, :func:`calibrate_spread`, :data:`SHAPE_EPSILON`,
:data:`REHEARSAL_NOTE`.

Where each number comes from (a generator option given wins):

* **free**: the public parameters (items, rating range and step, test fraction) and what STORE's models or earlier
  rehearsals released (users, the histogram of ratings per user, the item side of the least noisy als, irls or
  means model, ``--select auto`` validation losses);
* **given**: ``--users`` / ``--ratings-per-user``, at no cost, the user's to vouch for;
* **released now**, once, at ``--shape-epsilon`` and charged to STORE's budget (ledger method ``shape``, said, reused
  for free later): a Laplace histogram of ratings per user (row pointers only) and, once a model released an item
  side, the rating spread (:func:`streamdp.kernels.spread.residual_spread`). Their noise comes from OS entropy,
  never from a rehearsal's ``--seed``.

Post-processing turns them into the generator's options: the activity law (:func:`fit_activity`), item popularity
and means (:func:`drawing_weights`, :func:`pre_clip_means`), and interaction, noise and user offsets matched on
pilot stores (:func:`calibrate_spread`). The sweep on the synthetic store charges only its own budget.
An implicit STORE gives an implicit store (counts; no rating range or spread), its popularity from a released ials
model's item counts; a list method's rehearsal adds the generator's taste clusters (``sweep.LIST_TASTES``).

The reasoning and measurements behind each step: ``docs/design-notes.md``, section
``streamdp/workflows/rehearse.py``; how close the curve comes: ``docs/choosing-epsilon.md``.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile

import numpy as np
from scipy.special import ndtr

from streamdp.errors import ParameterError, StreamdpError
from streamdp.kernels.spread import residual_spread
from streamdp.methods._profile import EDGES, WHAT as PROFILE_WHAT, exact_histogram
from streamdp.model_dir import read_model_json
from streamdp.privacy.budget import COUNTED, StoreBudget
from streamdp.privacy.ledger import GUARANTEE_USER_DP, Ledger
from streamdp.privacy.release import Release, entry_std
from streamdp.serving.local import rating_range
from streamdp.serving.model import load_model
from streamdp.serving.local import factors_released
from streamdp.storage.catalogue import catalogue_view, store_catalogue
from streamdp.storage.fingerprint import store_fingerprint
from streamdp.storage.generate import generate_store
from streamdp.storage.ids import as_ids, find
from streamdp.storage.store import RatingStore, open_store
from streamdp.storage.writer import check_destination

__all__ = ["SHAPE_EPSILON", "released_shape", "shape_from_histogram", "fit_activity", "item_side", "generate_like",
           "check_like", "REHEARSAL_NOTE"]

#: Epsilon of a histogram released for a rehearsal when STORE has released none (pure DP, Laplace).
SHAPE_EPSILON = 0.1
#: The line a rehearsal prints first.
REHEARSAL_NOTE = ("REHEARSAL on synthetic data shaped like {store}: nothing is trained on its ratings; the curve "
                  "is the regime's (users, items, activity, scale), not its own data's")


def _possible_bins(n_items: int) -> np.ndarray:
    """The bins a user can fall in (at most ``n_items`` ratings)."""
    return EDGES <= max(int(n_items), 1)


def _train_bins(n_items: int, test_fraction: float) -> np.ndarray:
    """``k_b``: the smallest number of ratings (train and test) whose training part, after
    :func:`streamdp.storage.split.split_block`'s hold-out (``floor(f n + 1/2)``, at most ``n - 1``), is in bin ``b`` of
    :data:`~streamdp.methods._profile.EDGES` or above (nondecreasing in ``n``); past ``n_items``: ``n_items + 1``."""
    f = float(test_fraction)
    out = np.empty(len(EDGES), np.int64)
    for b, e in enumerate(EDGES):
        k = np.arange(int(e), int(math.ceil((int(e) + 1) / max(1.0 - f, 1e-9))) + 3)
        t = k - np.minimum(np.floor(f * k + 0.5), k - 1)
        out[b] = min(int(k[np.argmax(t >= e)]), int(n_items) + 1)
    return out


def activity_histogram(m: float, n_items: int, test_fraction: float, user_exponent: float = 2.0,
                       k_b: np.ndarray | None = None) -> np.ndarray:
    """The share of the generator's users (:func:`streamdp.storage.generate._user_counts`: ``rint`` of a Pareto of
    exponent ``a`` and scale ``m (a - 1) / a``, clipped to ``[1, n_items]``) whose training ratings fall in each bin of
    :data:`~streamdp.methods._profile.EDGES` once ``test_fraction`` of them is held out.

    >>> activity_histogram(15.0, 400, 0.2)[3:9].round(3).tolist()  # the lightest users have 8 ratings, 6 training
    [0.0, 0.377, 0.356, 0.12, 0.083, 0.029]
    """
    a, s = float(user_exponent), float(m) * (float(user_exponent) - 1.0) / float(user_exponent)
    k = _train_bins(n_items, test_fraction) if k_b is None else k_b
    x = np.maximum(k.astype(np.float64) - 0.5, 1e-12)
    at_least = np.where(k <= 1, 1.0, np.where(k > n_items, 0.0, np.minimum(1.0, (s / x) ** a)))
    return at_least - np.r_[at_least[1:], 0.0]


def fit_activity(counts, noise_std: float, n_items: int, test_fraction: float, user_exponent: float = 2.0) -> float:
    """The generator's ``ratings_per_user`` (before its cap) whose expected histogram (:func:`activity_histogram`,
    times the users counted) fits the (noisy) ``counts`` best: least squares, each bin weighted by ``1 / (noise^2 +
    max(expected, 1))`` (the release's noise and the draw's), over a log grid of means then a golden-section search.

    >>> fit_activity(2000 * activity_histogram(15.0, 400, 0.2), 2.4, 400, 0.2)
    15.0
    """
    h = np.asarray(counts, np.float64)[: len(EDGES)]
    ok = _possible_bins(n_items)[: len(h)]
    n = max(float(h[ok].sum()), 1.0)
    k_b = _train_bins(n_items, test_fraction)[: len(h)]

    def loss(log_m):
        e = n * activity_histogram(math.exp(log_m), n_items, test_fraction, user_exponent, k_b)[: len(h)]
        return float((((h - e) ** 2) / (float(noise_std) ** 2 + np.maximum(e, 1.0)))[ok].sum())

    grid = np.linspace(0.0, math.log(max(float(n_items), 2.0) * 2.0), 400)
    i = int(np.argmin([loss(g) for g in grid]))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    r = (math.sqrt(5.0) - 1.0) / 2.0
    for _ in range(60):
        c, d = hi - r * (hi - lo), lo + r * (hi - lo)
        lo, hi = (lo, d) if loss(c) < loss(d) else (c, hi)
    return round(max(math.exp((lo + hi) / 2.0), 1.0), 3)


def shape_from_histogram(counts, noise_std: float, n_items: int, test_fraction: float,
                         user_exponent: float = 2.0) -> dict:
    """``{"n_users", "ratings_per_user"}`` from a (noisy) histogram of training ratings per user over
    :data:`~streamdp.methods._profile.EDGES` (module docstring): the users counted, and the mean ratings per user
    (train and test, after the cap at ``n_items``) of the generator's activity law that fits it
    (:func:`fit_activity`).

    >>> h = 500 * activity_histogram(12.0, 100, 0.2)
    >>> shape_from_histogram(h, 0.0, 100, 0.2)  # the law of mean 12 before the cap at 100 items
    {'n_users': 500, 'ratings_per_user': 11.64}
    """
    h = np.asarray(counts, np.float64)[: len(EDGES)]
    ok = _possible_bins(n_items)[: len(h)]
    n_users = max(1, int(round(float(h[ok].sum()))))
    m = fit_activity(h, noise_std, n_items, test_fraction, user_exponent)
    return {"n_users": n_users, "ratings_per_user": round(_capped_mean(m, n_items, user_exponent), 3)}


def _capped_mean(m: float, n_items: int, user_exponent: float = 2.0) -> float:
    """``E[min(X, N)]`` for ``X`` Pareto of exponent ``a`` and mean ``m`` (scale ``s = m (a - 1) / a``):
    ``s a / (a - 1) (1 - (s / N)^(a - 1)) + N (s / N)^a``."""
    a, n = float(user_exponent), float(n_items)
    s = float(m) * (a - 1.0) / a
    if s >= n:
        return n
    return s * a / (a - 1.0) * (1.0 - (s / n) ** (a - 1.0)) + n * (s / n) ** a


def generator_mean(mean: float, n_items: int, user_exponent: float = 2.0) -> float:
    """The generator's ``ratings_per_user`` whose users have ``mean`` ratings on average once their Pareto activity
    is capped at ``n_items`` (a released histogram counts the capped numbers; the generator's parameter is the mean
    before the cap): :func:`_capped_mean` solved for ``m`` by bisection.

    >>> generator_mean(14.296875, 80)  # 15 ratings per user before the cap at 80 items: 14.3 on average after it
    15.0
    """
    n = float(n_items)
    if mean >= _capped_mean(n * 1e6, n, user_exponent):
        return float(n)
    lo, hi = 1.0, n * 1e6
    for _ in range(200):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if _capped_mean(mid, n, user_exponent) < mean else (lo, mid)
    return round(max(lo, 1.0), 3)


def _sources(entry: dict) -> list[dict]:
    """What one budget entry's output (a model, or a rehearsal's synthetic store) released about the shape:
    ``{"what": "n_users"|"histogram", "value", "std", "from"}`` (``std`` 0: exact or declared)."""
    where = entry.get("model")
    if not where or not os.path.isdir(where):
        return []
    frm = f"budget entry {entry['id']} ({where})"
    model, ledger = read_model_json(where), read_model_json(where, "privacy.json")
    out = []
    if model is not None and ledger is not None:
        n = (ledger.get("public_parameters") or {}).get("n_users")
        if isinstance(n, dict) and isinstance(n.get("value"), int):
            std = _release_std(ledger, "number of users") if n.get("source") == "released" else 0.0
            out.append({"what": "n_users", "value": n["value"], "std": std, "from": frm})
        prof = model.get("user_profile")
        if isinstance(prof, dict) and prof.get("bin_lower_edges") == EDGES.tolist():
            out.append({"what": "histogram", "value": prof["users"], "std": float(prof["noise_std"]), "from": frm})
        sel = _selection_source(where, model)
        if sel is not None:
            out.append({**sel, "from": frm})
        items = _item_source(where, model, ledger)
        if items is not None:
            out.append({**items, "from": frm})
            if model.get("factors_released") and items["what"] == "items":
                out.append({**items, "what": "factor_items", "from": frm})
        return out
    try:
        attrs = open_store(where).attrs
    except StreamdpError:  # neither a model nor a store (any more): nothing to read
        return out
    like = (attrs.get("params") or {}).get("like") or {}
    rel = like.get("shape_release")
    if isinstance(rel, dict) and rel.get("entry") == entry["id"]:
        out.append({"what": "histogram", "value": rel["histogram"], "std": float(rel["noise_std"]), "from": frm})
    rel = like.get("spread_release")
    if _spread_record_ok(rel, entry["id"]):
        out.append({"what": "spread", "value": rel, "std": spread_targets(rel)["std"], "from": frm})
    return out


def _selection_source(where: str, model: dict) -> dict | None:
    """The validation losses a model's ``--select auto`` released (als: exact at ``inf``, noisy and accounted
    otherwise), when they hold a factors candidate and a biases one: ``{"what": "selection", "value": {"model",
    "method", "epsilon", "ratio"}, "std"}``, ``ratio`` the best factors candidate's loss over the best biases
    candidate's (below 1: the factors explain held-out ratings), ``std`` ``1 / epsilon`` (0 at ``inf``): the ranking
    of such sources, the least noisy first."""
    sel = model.get("selection")
    if not isinstance(sel, dict):
        return None
    losses = sel.get("validation_losses", sel.get("noisy_validation_losses"))
    names = sel.get("candidates")
    ratio = selection_ratio(names, losses)
    if ratio is None:
        return None
    eps = model.get("epsilon")
    eps = math.inf if eps in ("inf", None) else float(eps)
    return {"what": "selection", "std": 0.0 if math.isinf(eps) else 1.0 / eps,
            "value": {"model": where, "method": model.get("method"), "epsilon": eps, "ratio": ratio}}


def selection_ratio(names, losses) -> float | None:
    """The best (lowest) validation loss of the ``factors`` candidates over that of the ``bias`` candidates, or
    ``None`` when either kind is missing or a loss is not a positive number.

    >>> selection_ratio(["factors, ridge 10", "factors, ridge 30", "bias, ridge 3", "mean, no intercept"],
    ...                 [1995.6, 2052.4, 1920.5, 2257.6])
    1.0391
    """
    try:
        pairs = [(str(n).split(",")[0].strip(), float(x)) for n, x in zip(names, losses)]
    except (TypeError, ValueError):
        return None
    f = [x for k, x in pairs if k == "factors" and math.isfinite(x) and x > 0]
    b = [x for k, x in pairs if k == "bias" and math.isfinite(x) and x > 0]
    if not f or not b or len(pairs) != len(names or []):
        return None
    return round(min(f) / min(b), 4)


#: The methods whose models release item counts and biases on the rating scale (als, irls, means: the noisy item
#: weight totals ``C_j``, the item biases and global mean of their statistics pass).
ITEM_METHODS = ("als", "irls", "means")
#: The released item weight totals' release in the ledger (its name starts so); an ials model's item counts (the
#: chart's): a source of an implicit store's popularity only (``"chart"``: no biases on a rating scale).
_COUNTS_RELEASE, _CHART_RELEASE = "item weight totals C_j", "item counts N_j"


def _release_std(ledger: dict, name: str) -> float:
    """The noise standard deviation (one coordinate, :func:`streamdp.privacy.release.entry_std`) of the first release
    in ``ledger`` whose name starts with ``name``; ``inf`` when there is none."""
    rel = [r for r in (ledger.get("bounds") or {}).get("releases", []) if str(r.get("release", "")).startswith(name)]
    return entry_std(rel[0]) if rel else math.inf


def _item_source(where: str, model: dict, ledger: dict) -> dict | None:
    """The item side a model released (its noisy item weight totals, item biases and global mean), or ``None``:
    ``{"what": "items", "value": {"counts", "bias", "global_mean", "count_std", "method"}, "std"}``, ``std`` the
    counts' noise standard deviation over their (clipped) total, so that models of different bounds compare. An ials
    model's released counts: ``"what": "chart"`` (its biases are 0, its scale no rating's)."""
    chart = model.get("method") == "ials"
    if model.get("method") not in ITEM_METHODS and not chart:
        return None
    try:
        m = load_model(where)
    except StreamdpError:
        return None
    counts = m.extras.get("noisy_item_weight")
    if counts is None:
        return None
    counts = np.asarray(counts, np.float64)
    private = not (m.ledger.epsilon == math.inf or model.get("epsilon") == "inf")
    std = _release_std(ledger, _CHART_RELEASE if chart else _COUNTS_RELEASE) if private else 0.0
    total = float(np.maximum(counts, 0.0).sum())
    if not (total > 0 and math.isfinite(std)):
        return None
    par = model.get("parameters") or {}
    rule = {"private": std > 0, "sampling": par.get("sampling", "adaptive"), "tau": float(par.get("tau") or 1.0),
            "l1": par.get("mechanism") in ("laplace", "huber"), "centred": std > 0 and model["method"] == "means"}
    if chart:  # ials.COUNT_WEIGHTS: spread, min(1, sqrt(tau / n)) per pair; uniform, at most tau pairs
        rule.update(sampling="uniform" if par.get("count_weights") == "uniform" else "adaptive", l1=False, cap=True,
                    every_pair=par.get("preference") != "above")  # else only a rating store's high ratings counted
    return {"what": "chart" if chart else "items", "std": std / total, "model": where,
            "value": {"counts": counts, "counts_floored": np.maximum(counts, std / math.sqrt(2.0 * math.pi)),
                      "bias": np.asarray(m.item_bias, np.float64), "user_weight": rule,
                      "global_mean": float(m.global_mean), "count_std": std, "method": model["method"]}}


def _user_weight(n_train: np.ndarray, rule: dict) -> np.ndarray:
    """The weight one training rating of a user with ``n_train`` of them carries in a model's item weight totals
    (:func:`streamdp.privacy.bounding.contribution_weights`; private ``means`` counts ``1 - 1/n`` of it)."""
    n = np.maximum(np.asarray(n_train, np.float64), 1.0)
    if not rule["private"]:
        return np.ones_like(n)
    if rule["sampling"] == "uniform":
        c = np.minimum(n, rule["tau"]) / n
    else:  # adaptive (with exponent 0; other rules are read as it)
        c = rule["tau"] / n if rule["l1"] else np.sqrt(rule["tau"] / n)
        c = np.minimum(c, 1.0) if rule.get("cap") else c
    return c * (1.0 - 1.0 / n) if rule["centred"] else c


def _activity(mean: float, n_items: int, user_exponent: float, points: int = 128) -> np.ndarray:
    """The generator's ratings per user (:func:`streamdp.storage.generate._user_counts`) at ``points`` equally likely
    quantiles of its Pareto law."""
    a = float(user_exponent)
    q = (np.arange(points) + 0.5) / points
    return np.clip(np.rint((1.0 - q) ** (-1.0 / a) * (mean * (a - 1.0) / a)), 1, n_items)


def _inclusion(p: np.ndarray, n: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Probability that a user drawing ``n`` distinct items (the generator: draws from ``p``, repeats rejected) rates
    each item, ``(len(n), len(p))``: ``1 - exp(-p_j t)`` with ``sum_j m_j (1 - exp(-p_j t)) = n`` (Rosen's
    approximation of successive sampling; ``m_j`` items share the probability ``p_j``)."""
    target = np.minimum(n, float(m[p > 0].sum()) - 0.5)[:, None]  # an item of weight 0 is never drawn
    lo, hi = np.zeros((len(n), 1)), np.full((len(n), 1), 1.0)
    for _ in range(200):
        if not np.any((m[None, :] * (1.0 - np.exp(-p[None, :] * hi))).sum(axis=1, keepdims=True) < target):
            break
        hi = hi * 4.0
    for _ in range(30):
        t = (lo + hi) / 2.0
        below = (m[None, :] * (1.0 - np.exp(-p[None, :] * t))).sum(axis=1, keepdims=True) < target
        lo, hi = np.where(below, t, lo), np.where(below, hi, t)
    return 1.0 - np.exp(-p[None, :] * (lo + hi) / 2.0)


#: :func:`drawing_weights` moves a weight at most this factor away from its item's share of the totals: a total beyond
#: reach (noise, or a heavier activity than the generator's) is not chased to a weight that every user rates first.
MAX_CORRECTION = 4.0
#: :func:`drawing_weights` solves for the top items one by one and for the rest in groups of alike totals, at most
#: this many unknowns in all (memory and time: ``len(activity) x GROUPS`` numbers, whatever the catalogue).
GROUPS = 2048


def drawing_weights(totals, activity, user_weight, iters: int = 20) -> np.ndarray:
    """The generator's drawing weights whose expected item weight totals are proportional to ``totals`` (released
    totals are flatter than the law that drew them: a heavy user rates an item once). The weights ``p`` solve
    ``sum_users c(n) pi_j(n, p) ~ totals_j`` (``c`` the per-user weight, ``pi_j`` :func:`_inclusion`, users at
    :func:`_activity`'s quantiles) by ``iters`` multiplicative steps, within :data:`MAX_CORRECTION` of the totals;
    past the first ``GROUPS / 2`` items, in ``GROUPS / 2`` groups of consecutive totals."""
    tot = np.asarray(totals, np.float64)
    tot = tot / tot.sum()
    order = np.argsort(-tot, kind="stable")
    head = min(len(tot), GROUPS // 2) if len(tot) > GROUPS else len(tot)
    groups = [order[k:k + 1] for k in range(head)] + [g for g in np.array_split(order[head:], GROUPS // 2) if len(g)]
    m = np.array([len(g) for g in groups], np.float64)
    t = np.array([tot[g].mean() for g in groups])
    n = np.asarray(activity, np.float64)
    c = np.asarray(user_weight, np.float64)
    p = t.copy()
    for _ in range(iters):
        e = (c[:, None] * _inclusion(p, n, m)).sum(axis=0)
        e = e / (m * e).sum()
        p = np.where(t > 0, np.clip(p * t / np.maximum(e, 1e-300), t / MAX_CORRECTION, t * MAX_CORRECTION), 0.0)
        p = p / (m * p).sum()
    out = np.empty(len(tot))
    for g, pk, tk in zip(groups, p, t):
        out[g] = tot[g] * (pk / tk) if tk > 0 else 0.0
    return out / out.sum()


def clipped_mean(a, s, lo: float, hi: float, step: float) -> np.ndarray:
    """``E[clip(round(a + Z), lo, hi)]``, ``Z ~ N(0, s^2)``, rounded to ``step`` (0: continuous): the mean rating of an
    item whose ratings the generator draws around ``a`` (its rounding, then its clipping). ``s``: one spread, or one
    per item.

    >>> clipped_mean(np.array([3.0, 6.0]), 1.0, 1.0, 5.0, 1.0).round(3).tolist()
    [3.0, 4.927]
    """
    a = np.asarray(a, np.float64)[:, None]
    s = np.broadcast_to(np.asarray(s, np.float64), (len(a),))[:, None]
    if np.all(s <= 0):
        r = a[:, 0] if step <= 0 else lo + np.floor((a[:, 0] - lo) / step + 0.5) * step
        return np.clip(r, lo, hi)
    s = np.maximum(s, 1e-9)
    if step > 0:
        v = lo + step * np.arange(int(round((hi - lo) / step)) + 1)
        upper = np.r_[v[:-1] + step / 2.0, np.inf]
        cdf = np.c_[np.zeros(len(a)), ndtr((upper[None, :-1] - a) / s), np.ones(len(a))]
        return (np.diff(cdf, axis=1) * v[None, :]).sum(axis=1)
    s = s[:, 0]
    za, zb = (lo - a[:, 0]) / s, (hi - a[:, 0]) / s
    pdf = lambda z: np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)  # noqa: E731
    mid = a[:, 0] * (ndtr(zb) - ndtr(za)) + s * (pdf(za) - pdf(zb))
    return lo * ndtr(za) + mid + hi * (1.0 - ndtr(zb))


def pre_clip_means(target, s, lo: float, hi: float, step: float) -> np.ndarray:
    """The ``a`` whose :func:`clipped_mean` is ``target`` (each within ``(lo, hi)``; bisection): the generator's
    item means before its noise, rounding and clipping, that give the released item means after them.

    >>> pre_clip_means(clipped_mean(np.array([2.5, 5.5]), 1.0, 1.0, 5.0, 1.0), 1.0, 1.0, 5.0, 1.0).round(6).tolist()
    [2.5, 5.5]
    """
    t = np.clip(np.asarray(target, np.float64), lo + 1e-3 * (hi - lo), hi - 1e-3 * (hi - lo))
    width = (hi - lo) + 10.0 * max(float(np.max(s)), 0.0)
    a_lo, a_hi = np.full(len(t), lo - width), np.full(len(t), hi + width)
    for _ in range(80):
        mid = (a_lo + a_hi) / 2.0
        below = clipped_mean(mid, s, lo, hi, step) < t
        a_lo, a_hi = np.where(below, mid, a_lo), np.where(below, a_hi, mid)
    return (a_lo + a_hi) / 2.0


def item_side(counts, count_std: float, bias) -> tuple[np.ndarray, np.ndarray]:
    """The synthetic store's item drawing weights and biases from a model's released item weight totals (noise
    standard deviation ``count_std``) and item biases, most popular first. A noisy total is floored at ``sigma /
    sqrt(2 pi)``, the mean of pure noise clipped at 0: an item within the noise is still drawn, about as often as
    the noise alone says. Each item keeps its own released bias.

    >>> w, b = item_side([5.0, -3.0, 20.0], 2.5, [0.1, -0.2, 0.3])
    >>> w.round(3).tolist(), b.tolist()
    ([20.0, 5.0, 0.997], [0.3, 0.1, -0.2])
    """
    c = np.asarray(counts, np.float64)
    w = np.maximum(c, float(count_std) / math.sqrt(2.0 * math.pi))
    order = np.argsort(-w, kind="stable")
    return w[order], np.asarray(bias, np.float64)[order]


def released_shape(store) -> dict:
    """The least noisy released ``n_users``, histogram of training ratings per user, item side (counts, biases,
    global mean) and spread statistics of ``store``, from its budget's counted entries (module docstring):
    ``{"n_users": source or None, "histogram": ..., "items": ..., "spread": ...}``.
    Reads the budget and the outputs its entries point at; writes nothing."""
    path = store.path if isinstance(store, RatingStore) else str(store)
    best: dict = {"n_users": None, "histogram": None, "items": None, "factor_items": None, "spread": None,
                  "selection": None, "chart": None}
    for e in StoreBudget(path).entries():
        if e.get("status") not in COUNTED or e.get("status") == "reserved":
            continue
        for s in _sources(e):
            if best[s["what"]] is None or s["std"] < best[s["what"]]["std"]:
                best[s["what"]] = s
    return best


def rehearsal_items(st: RatingStore) -> RatingStore:
    """``st`` seen through the items a rehearsal may know (:mod:`streamdp.privacy.catalogue`): the catalogue the store
    declares, else that of the least noisy model released from it (post-processing); neither is a one-line
    :class:`ParameterError` (the store's own items are read off the data and no rehearsal publishes them)."""
    declared = store_catalogue(st)
    if declared is not None:
        return catalogue_view(st, declared[0])
    found = released_shape(st)
    for key in ("spread", "items", "factor_items", "chart"):
        src = found.get(key)
        where = (src or {}).get("model") or ((src or {}).get("value") or {}).get("model")
        if where:
            try:
                return catalogue_view(st, as_ids(load_model(where).item_ids))
            except StreamdpError:
                continue
    raise ParameterError(f"{st.path}: a rehearsal needs the store's items, which are never read off the data: "
                         f"declare its catalogue (ingest --items FILE), or release a model from it first (a rehearsal "
                         f"then uses that model's catalogue)")


def rehearsal_range(st: RatingStore) -> tuple[float, float]:
    """The rating range a rehearsal may know (:mod:`streamdp.privacy.rating_range`): the one the store declares, else
    the private one of the least noisy model released from it (post-processing); neither is a one-line
    :class:`ParameterError` (an observed range is the data's exact minimum and maximum, which no rehearsal
    publishes)."""
    if st.rating_range_source == "declared":
        return float(st.attrs["rating_min"]), float(st.attrs["rating_max"])
    found = released_shape(st)
    for key in ("spread", "items", "factor_items", "histogram"):
        src = found.get(key)
        where = (src or {}).get("model") or ((src or {}).get("value") or {}).get("model")
        if where:
            try:
                rr = load_model(where).info.get("rating_range") or {}
            except StreamdpError:
                continue
            if rr.get("source") in ("selected", "declared"):
                return float(rr["min"]), float(rr["max"])
    raise ParameterError(f"{st.path}: a rehearsal needs the store's rating range, which is never read off the data: "
                         f"declare it (ingest --rating-range LO,HI), or release a private model from it first (a "
                         f"rehearsal then uses that model's range, selected privately)")


def _public(st: RatingStore) -> dict:
    """The generator's parameters that STORE's public parameters fix (module docstring); an implicit store's: its
    items, test fraction and declared count cap (an implicit synthetic store, counts ``1 + Poisson(exp(z))``)."""
    p = st.attrs.get("params") or {}
    if st.implicit:
        cap = st.attrs.get("count_cap") if st.rating_range_source == "declared" else None
        return {"n_items": int(st.n_items), "test_fraction": float(p.get("test_fraction") or 0.0), "implicit": True,
                "count_cap": None if cap is None else float(cap)}
    lo, hi = rehearsal_range(st)
    step = p.get("rating_step")
    if step is None:
        step = 1.0 if lo == int(lo) and hi == int(hi) else 0.0
    return {"n_items": int(st.n_items), "rating_min": lo, "rating_max": hi, "rating_step": float(step),
            "test_fraction": float(p.get("test_fraction") or 0.0)}


def _release_rng() -> np.random.Generator:
    """The generator of a release's noise from STORE: OS entropy, never a rehearsal's ``--seed`` (a test may replace
    it to make one release repeatable)."""
    return np.random.default_rng()


def _release_histogram(st: RatingStore, epsilon: float) -> tuple[np.ndarray, Release]:
    """STORE's histogram of training ratings per user with Laplace noise (row pointers only, OS entropy)."""
    rel = Release(PROFILE_WHAT, "laplace", 1.0, 1.0 / float(epsilon), shape=(len(EDGES),))
    return rel.add(exact_histogram(st), _release_rng()), rel


def generate_like(store, out: str, *, users: int | None = None, ratings_per_user: float | None = None,
                  shape_epsilon: float | None = None, over_budget: bool = False, force: bool = False,
                  echo=None, **options) -> RatingStore:
    """Write a synthetic store shaped like ``store`` to ``out`` (module docstring) and return it opened.

    ``users`` / ``ratings_per_user``: given by the caller, at no cost; what is neither given nor
    released is released now at ``shape_epsilon`` and charged to ``store``'s budget (refused past
    the budget unless ``over_budget``): the histogram of ratings per user, and, once a model has released an item
    side, the spread statistics. ``options``: the generator's other parameters (rank, noise,
    seed, item_exponent, ...). ``echo`` gets the lines saying where each number came from.

    The stages: :func:`check_like` (the arguments), :func:`_known_shape` (what is given or already
    released), :func:`_histogram_released` and :func:`_spread_matched` (what is released now), :func:`_generate`.
    """
    say = echo or (lambda *a, **k: None)
    st = store if isinstance(store, RatingStore) else open_store(store)
    eps = check_like(st, users=users, ratings_per_user=ratings_per_user, shape_epsilon=shape_epsilon, options=options)
    st = rehearsal_items(st)
    pub = _public(st)
    shape, found, items = _known_shape(st, pub, users, ratings_per_user, options)
    # the store named by its keyed fingerprint (set below, once a release has made its key), never by its checksum
    like = {"store": st.path, "store_fingerprint": None, "public": pub, "items": items.pop("record")}
    options = {**options, **items}
    check_destination(out, force)  # before anything is reserved
    spread_model = _spread_wanted(st, found, options, items)
    budget, said = StoreBudget(st.path), []
    charge = dict(budget=budget, over_budget=over_budget, model=os.path.abspath(out))
    with contextlib.ExitStack() as stack:
        if None in shape.values():
            said.append(_histogram_released(st, eps, pub, shape, like, options, stack, **charge))
        if spread_model is not None:
            options = _spread_matched(st, eps, pub, shape, like, options, found, spread_model, said, stack, **charge)
        else:
            like["spread"] = {"source": _no_spread_reason(found, options, items, st.implicit)}
        like["store_fingerprint"] = store_fingerprint(st, create=False)
        syn = _generate(out, shape, pub, like, force, options)
    for line in said:
        say(line)
    _say_shape(say, st, pub, shape, like["items"], like["spread"])
    return syn


def check_like(st: RatingStore, *, users=None, ratings_per_user=None, shape_epsilon=None, options=()) -> float:
    """Check :func:`generate_like`'s arguments (one-line :class:`ParameterError`) and return the shape epsilon.
    Reads no rating and charges nothing: ``sweep --rehearse`` runs it before it prints or charges anything."""
    for name in ("n_items", "rating_min", "rating_max", "rating_step", "test_fraction", "n_users", "implicit"):
        if name in options:
            raise ParameterError(f"--like: {name} comes from {st.path} (its public parameters or released "
                                 f"statistics); leave it out")
    if users is not None and (isinstance(users, bool) or int(users) != users or users < 1):
        raise ParameterError(f"--users must be a positive integer, got {users}")
    if ratings_per_user is not None and not ratings_per_user >= 1:
        raise ParameterError(f"--ratings-per-user must be >= 1, got {ratings_per_user}")
    eps = SHAPE_EPSILON if shape_epsilon is None else float(shape_epsilon)
    if not (math.isfinite(eps) and eps > 0):
        raise ParameterError(f"--shape-epsilon must be a finite number > 0, got {shape_epsilon}")
    rehearsal_items(st)  # the items it may know: declared, or a released model's
    if not st.implicit:  # an implicit store's counts have no range to know (a declared cap is public)
        rehearsal_range(st)  # and the rating range, the same way
    return eps


def _known_shape(st, pub, users, ratings_per_user, options):
    """``(shape, found, items)``: the numbers given or already released (at no cost), and the item side's."""
    shape = {"n_users": None if users is None else {"value": int(users), "source": "given (--users): no cost"},
             "ratings_per_user": None if ratings_per_user is None else
             {"value": float(ratings_per_user), "source": "given (--ratings-per-user): no cost"}}
    found = released_shape(st)
    if found["spread"] is not None:  # the item side the spread was read against, so that the two agree
        where = found["spread"]["value"]["model"]
        src = _item_source(where, read_model_json(where) or {}, read_model_json(where, "privacy.json") or {})
        if src is not None:
            found["items"] = {**src, "from": found["spread"]["from"] + f", read against the model {where}"}
    chart = found["chart"] if found["chart"] and found["chart"]["value"]["user_weight"]["every_pair"] else None
    items = _items(chart if pub.get("implicit") else found["items"] or chart, pub, options)
    if None in shape.values():
        if shape["n_users"] is None and found["n_users"] is not None:
            shape["n_users"] = {"value": int(found["n_users"]["value"]),
                                "source": f"released: {found['n_users']['from']}"}
        if found["histogram"] is not None:
            _fill(shape, shape_from_histogram(found["histogram"]["value"], found["histogram"]["std"], pub["n_items"],
                                              pub["test_fraction"], options.get("user_exponent", 2.0)),
                  f"released histogram of ratings per user: {found['histogram']['from']}")
    return shape, found, items


def _fill(shape: dict, values: dict, source: str) -> None:
    """What ``shape`` lacks (users, ratings per user) from ``values``, said to come from ``source``."""
    for key in ("n_users", "ratings_per_user"):
        if shape[key] is None:
            shape[key] = {"value": values[key], "source": source}


def _histogram_released(st, eps, pub, shape, like, options, stack, *, budget, over_budget, model) -> str:
    """Release the histogram of ratings per user now (charged to the store's budget; the entry settles with
    ``stack``), fill what the shape lacks from it: the line that says so."""
    hist, rel = _release_histogram(st, eps)
    entry = stack.enter_context(budget.release(_shape_ledger(st, eps, rel, "the histogram of training "
                                                             "ratings per user"),
                                               over_budget=over_budget, model=model))
    _fill(shape, shape_from_histogram(hist, rel.std, pub["n_items"], pub["test_fraction"],
                                      options.get("user_exponent", 2.0)),
          f"released now: Laplace histogram of ratings per user at epsilon {eps:g}, budget entry {entry}")
    like["shape_release"] = {"entry": entry, "epsilon": eps, "histogram": [round(float(x), 3) for x in hist],
                             "noise_std": rel.std}
    return (f"charged to {st.path}'s budget: epsilon {eps:g} (pure, Laplace) for its histogram of "
            f"training ratings per user, which it had not released (entry {entry}; later rehearsals "
            f"reuse it for free)")


def _spread_matched(st, eps, pub, shape, like, options, found, spread_model, said, stack, *, budget, over_budget,
                    model) -> dict:
    """The generator's options with the rating spread matched (:func:`calibrate_spread`) to the released spread
    statistics, released now if no rehearsal did (charged to the store's budget; ``said`` gets the line)."""
    if found["spread"] is not None:
        record, src = found["spread"]["value"], f"released: {found['spread']['from']}"
    else:
        record, rel = _release_spread(st, spread_model, found["items"]["value"]["counts_floored"], eps, pub,
                                      shape, options.get("user_exponent", 2.0))
        what = (f"the rating spread (users weighted by min(test ratings, {record['weight_cap']}) / "
                f"{record['weight_cap']})")
        entry = stack.enter_context(budget.release(_shape_ledger(st, eps, rel, what),
                                                   over_budget=over_budget, model=model))
        record = {"entry": entry, "epsilon": eps, **record}
        like["spread_release"] = record
        src = f"released now: Laplace at epsilon {eps:g}, budget entry {entry}"
        said.append(f"charged to {st.path}'s budget: epsilon {eps:g} (pure, Laplace) for how its ratings "
                    f"spread around the released item means (its ratings read once; entry {entry}; "
                    f"later rehearsals reuse it for free)")
    v = found["items"]["value"]
    cal = calibrate_spread(spread_targets(record), shape, pub, options, spread_model, v["counts_floored"],
                           v["global_mean"], int(options.get("seed") or 0),
                           selection=None if found["selection"] is None else
                           {**found["selection"]["value"], "from": found["selection"]["from"]})
    options = {**options, **cal["options"]}
    options.pop("user_weight", None)
    like["spread"] = {**cal["record"], "source": src}
    like["items"]["means"] = (like["items"]["means"].split(", each the mean")[0] + ", each the mean of its "
                              "item's ratings once the matched rating spread (below), rounding and clipping "
                              "are added")
    return options


def _shape_ledger(st: RatingStore, eps: float, rel: Release, what: str) -> Ledger:
    """The ledger of one shape statistic released now (ledger method ``shape``, pure DP)."""
    return Ledger(method="shape", guarantee=GUARANTEE_USER_DP, epsilon=eps, delta=0.0, events=[rel.event()],
                  bounds={"releases": [rel.entry()]}, store_checksum=st.checksum or "",
                  notes=[f"a rehearsal's shape statistic: {what}"])


def _spread_wanted(st: RatingStore, found: dict, options: dict, items: dict) -> dict | None:
    """The model the spread statistics are (to be) read against, or ``None`` when there is no spread to match: no
    model released an item side, the item side is the generator's (an option given), or the spread's options are."""
    if st.implicit or found["items"] is None or "item_weights" not in items or "item_bias" not in items:
        return None
    if set(SPREAD_OPTIONS) & set(options):
        return None
    if found["spread"] is not None:
        rec = found["spread"]["value"]
        model = _spread_model(rec["model"], st, rec.get("factors_model"))  # its factors' model gone: no split
    else:  # the least noisy item side, and the least noisy model with item factors
        fi = found["factor_items"]
        model = _spread_model(found["items"]["model"], st, None if fi is None else fi["model"])
    if model is not None and "rank" in options:  # a rank given: the generator's factors, not the released ones
        model = {**model, "V": None}
    return model


def _no_spread_reason(found: dict, options: dict, items: dict, implicit: bool = False) -> str:
    if implicit:
        return "none: an implicit store has counts, not ratings"
    if set(SPREAD_OPTIONS) & set(options):
        return "the generator's options given (" + ", ".join(sorted(set(SPREAD_OPTIONS) & set(options))) + ")"
    if found["items"] is None:
        return ("the generator's (interaction scale 1, noise 0.5, no user offsets): no model released an item "
                "side to read the spread against")
    return "the generator's: the item side is the generator's (an option given)"


def _generate(out, shape, pub, like, force, options) -> RatingStore:
    """The synthetic store: the generator's mean ratings per user, and its item drawing weights from the released
    totals (:func:`drawing_weights`) for users of that activity."""
    options = dict(options)
    m = _generator_rpu(shape, pub, options)
    rule = options.pop("user_weight", None)
    if rule is not None:
        options["item_weights"] = _weights_for(options["item_weights"], rule, m, pub, options,
                                               shape["n_users"]["value"])
    scale = ({"implicit": True, "count_cap": pub["count_cap"]} if pub.get("implicit") else
             {k: pub[k] for k in ("rating_min", "rating_max", "rating_step")})
    return generate_store(out, n_users=shape["n_users"]["value"], n_items=pub["n_items"], ratings_per_user=m,
                          test_fraction=pub["test_fraction"], force=force, like={**like, "shape": shape}, **scale,
                          **options)


def _weights_for(totals, rule: dict, m: float, pub: dict, options: dict, n_users: int) -> np.ndarray:
    """:func:`drawing_weights` for the generator's users of mean ``m`` weighted as the model's ``rule`` weighed its
    users' training ratings (:func:`_user_weight`); with taste clusters, refined on pilot stores
    (:func:`_taste_weights`)."""
    n = _activity(m, pub["n_items"], options.get("user_exponent", 2.0))
    w = drawing_weights(totals, n, _user_weight(np.maximum(np.rint(n * (1.0 - pub["test_fraction"])), 1.0), rule))
    return _taste_weights(w, totals, rule, m, pub, options, n_users) if options.get("taste_clusters") else w


#: Pilot stores that refine the drawing weights under taste clusters (:func:`_taste_weights`).
TASTE_ROUNDS = 3
#: The generator's options that decide which items its users pick (a pilot of :func:`_taste_weights` takes them).
_CHOICE_OPTIONS = ("taste_clusters", "taste_strength", "rank", "item_factors", "user_exponent", "factors")


def _taste_weights(w, totals, rule: dict, m: float, pub: dict, options: dict, n_users: int) -> np.ndarray:
    """Drawing weights ``w`` (in the order of ``totals``) refined so that a store with taste clusters has the totals:
    :func:`drawing_weights` models users who draw from one popularity law, and a user of a cluster draws her
    cluster's favourites, rates them once and flattens the totals more (measured: docs/design-notes.md).
    :data:`TASTE_ROUNDS` pilot stores of ``min(n_users, PILOT_USERS)`` users (seeds apart from the store's), each
    item's weight times its released share over the pilot's (one added to both), within :data:`MAX_CORRECTION`."""
    t = np.asarray(totals, np.float64)
    w0 = w = np.asarray(w, np.float64)
    choice = {k: options[k] for k in _CHOICE_OPTIONS if k in options}
    seed = int(options.get("seed") or 0)
    with tempfile.TemporaryDirectory(prefix="streamdp-pilot-") as tmp:
        for r in range(TASTE_ROUNDS):
            pilot = generate_store(os.path.join(tmp, "p.zarr"), n_users=min(int(n_users), PILOT_USERS),
                                   n_items=pub["n_items"], ratings_per_user=m, test_fraction=pub["test_fraction"],
                                   item_weights=w, seed=seed + 1 + r, force=True, show_progress=False, **choice)
            got = np.zeros(len(w))
            for blk in pilot.blocks("train"):  # the pilot's totals, weighed as the model weighed its users
                k = np.diff(blk.indptr)
                got += np.bincount(blk.items, weights=np.repeat(_user_weight(k, rule), k), minlength=len(got))
            got[np.argsort(-w, kind="stable")] = got.copy()  # the generator numbered its items by weight
            ratio = (t * (got.sum() / max(t.sum(), 1e-300)) + 1.0) / (got + 1.0)
            w = np.clip(w * ratio, w0 / MAX_CORRECTION, w0 * MAX_CORRECTION)
    return w / w.sum()


def _generator_rpu(shape, pub, options) -> float:
    """The generator's ``ratings_per_user`` for the mean in ``shape`` (:func:`generator_mean`), recorded beside it."""
    m = generator_mean(shape["ratings_per_user"]["value"], pub["n_items"], options.get("user_exponent", 2.0))
    shape["ratings_per_user"]["generator_parameter"] = m
    return m


def _items(found: dict | None, pub: dict, options: dict) -> dict:
    """The generator's item-side arguments from a model's released item side (:func:`item_side`), and under
    ``record`` what each part comes from. An option the caller gives wins over the release: ``item_exponent`` for the
    popularity, ``global_mean`` / ``item_bias_std`` for the item means; without a release both are the generator's."""
    v = None if found is None else found["value"]
    if v is not None and len(v["counts"]) != pub["n_items"]:  # a model of another catalogue (the store was replaced)
        v = None
    src = None if v is None else (f"released by the {v['method']} model of {found['from']} (post-processing, no "
                                  f"cost)")
    out: dict = {}
    w, b = (None, None) if v is None else item_side(v["counts"], v["count_std"], v["bias"])
    if v is not None and "item_exponent" not in options:
        out["item_weights"], out["user_weight"] = w, v["user_weight"]
        what = "item counts" if v["method"] == "ials" else "item weight totals"
        popularity = ((f"noisy {what} (noise std {v['count_std']:.3g}, floored at "
                       f"{v['count_std'] / math.sqrt(2.0 * math.pi):.3g}) " if v["count_std"] > 0 else
                       f"{what} (exact: a non-private release) ") + src
                      + ", turned into drawing weights for the generator's users (heavy users rate an item once)")
    else:
        popularity = (f"the generator's power law, exponent {options.get('item_exponent', 0.9):g} ("
                      + ("given" if "item_exponent" in options else "no model of an item release")
                      + ")")
    mine = {"global_mean", "item_bias_std"} & set(options) or options.get("factors") == "uniform"
    if pub.get("implicit"):
        means = "none: an implicit store's counts 1 + Poisson(exp(z)), z the generator's (item biases, tastes)"
    elif v is not None and not mine and v["method"] != "ials":
        # most popular first by the released counts, with or without their weights: the generator's power law, when
        # given, numbers its items so too
        spread = math.sqrt(options.get("interaction_scale", 1.0) ** 2 + options.get("noise", 0.5) ** 2
                           + options.get("user_bias_std", 0.0) ** 2)
        a = pre_clip_means(v["global_mean"] + b, spread, pub["rating_min"], pub["rating_max"], pub["rating_step"])
        out["item_bias"], out["global_mean"] = a - v["global_mean"], v["global_mean"]
        means = (f"global mean {v['global_mean']:.3f} plus item biases {src}, each the mean of its item's ratings "
                 f"once the generator's spread (std {spread:.3g}), rounding and clipping are added")
    else:
        means = ("the generator's global mean and N(0, item_bias_std^2) item biases ("
                 + ("given" if mine else "no model of an item release" if v is None else
                    "an ials model releases no item means") + ")")
    out["record"] = {"popularity": popularity, "means": means}
    return out


def _say_shape(say, st, pub, shape, items, spread) -> None:
    scale = ((f"counts (an implicit store; cap {pub['count_cap']:g})" if pub["count_cap"] else
              "counts (an implicit store)") if pub.get("implicit") else
             f"ratings {pub['rating_min']:g}..{pub['rating_max']:g} (step {pub['rating_step']:g})")
    say(f"shaped like {st.path}: {pub['n_items']:,} items, {scale}, test fraction {pub['test_fraction']:g} (public "
        f"parameters)")
    say(f"  {shape['n_users']['value']:,} users: {shape['n_users']['source']}")
    say(f"  {shape['ratings_per_user']['value']:g} ratings per user (mean): {shape['ratings_per_user']['source']}")
    say(f"  item popularity: {items['popularity']}")
    say(f"  item means: {items['means']}")
    if "targets" in spread:
        t = spread["targets"]
        say(f"  rating spread: interaction scale {spread['interaction_scale']:g}, noise {spread['noise']:g}, user "
            f"offsets std {spread['user_bias_std']:g}, matched to the mean squared residual {t['total']:.3f}"
            + (f" (users weighted by their test ratings up to {t['weight_cap']:g})" if t.get("weight_cap", 1) > 1
               else "")
            + f", residual product {t['offset']:.3f}"
            + (f", unexplained by the released factors {t['unexplained']:.3f}" if t["unexplained"] is not None
               else "") + f" (noise std {t['std']:.3g}, about {release_noise_rmse(t):.2g} in the curve's RMSE; "
            f"{spread['source']}); factors: {spread['factors']}")
    else:
        say(f"  rating spread: {spread['source']}")


def release_noise_rmse(targets: dict) -> float:
    """What the spread release's noise (std ``targets["std"]`` on the mean squared residual ``targets["total"]``) makes
    of a test RMSE near ``sqrt(total)``: ``std / (2 sqrt(total))``, one standard deviation by which the whole curve
    moves with the release's draw (the rehearsal's own uncertainty, beside the data draw's)."""
    return float(targets["std"]) / (2.0 * math.sqrt(max(float(targets["total"]), 1e-6)))


# --- the rating spread: released once, then matched by the generator's interaction scale, noise and user offsets ---

#: The spread release in the ledger.
SPREAD_WHAT = ("a rehearsal's rating spread: per-user clipped mean squared residual after the released item means and "
               "mean product of two residuals (each user weighted by min(test ratings, c) / c, c in its record), "
               "leave-one-out "
               "residual after the released item factors; weights and users counted")
#: The heaviest weighting of the spread's first two sums: a user of this many test ratings or more counts fully, one of
#: ``n`` fewer ``n / SPREAD_WEIGHT_CAP`` of one (:func:`spread_weight_cap`; module docstring, the weighting's decision).
SPREAD_WEIGHT_CAP = 1024
#: The spread's weighting is the heaviest whose release noise on the weighted mean squared residual is at most this
#: times ``h^2`` (:func:`spread_weight_cap`).
SPREAD_NOISE = 1.0 / 400.0
#: Ridge of each user's fit on the released item factors (scaled so that ``u . v`` has unit variance per rating).
SPREAD_RIDGE = 1.0
#: The calibration's pilot stores have at most this many users; a store this small or smaller is its own pilot.
PILOT_USERS = 50_000
#: Rounds of the calibration at most (each generates one pilot store and reads its statistics).
PILOT_ROUNDS = 8
#: Noise over interaction scale (standard deviations) of the generator's defaults: the split of the spread beyond the
#: user offsets when no model released item factors nor validation losses of a factors and a biases candidate.
DEFAULT_SPLIT = 0.5
#: The generator's options the spread calibration sets (given ones win: no calibration).
SPREAD_OPTIONS = ("interaction_scale", "noise", "user_bias_std")


def spread_bounds(lo: float, hi: float, factors: bool) -> np.ndarray:
    """The per-user clipping bounds of :func:`streamdp.kernels.spread.residual_spread` on the scale ``[lo, hi]``:
    ``h^2``, ``h^2 / 2`` and ``h^2`` (``h`` half the range; the third 0 without factors).

    >>> spread_bounds(1.0, 5.0, True).tolist(), spread_bounds(1.0, 5.0, False).tolist()
    ([4.0, 2.0, 4.0], [4.0, 2.0, 0.0])
    """
    h2 = ((float(hi) - float(lo)) / 2.0) ** 2
    return np.array([h2, h2 / 2.0, h2 if factors else 0.0])


def spread_weight_cap(n_users: int, ratings_per_user: float, pub: dict, eps: float, bounds, factors: bool,
                      user_exponent: float = 2.0) -> int:
    """The cap ``c`` of the spread's weights ``min(n, c) / c``: the largest of :data:`SPREAD_WEIGHT_CAP`, half it,
    ..., 1 whose Laplace release at ``eps`` (L1 sensitivity ``B + 1``, ``B + 2`` with factors) leaves the weighted mean
    squared residual a noise standard deviation of at most :data:`SPREAD_NOISE` ``h^2``, the weights' sum predicted
    for ``n_users`` users of the generator's activity law of mean ``ratings_per_user`` (:func:`_activity`) and the
    store's test split (public parameters and released shape only: the choice reads no rating).

    >>> pub = {"n_items": 400, "test_fraction": 0.2, "rating_min": 1.0, "rating_max": 5.0}
    >>> b = spread_bounds(1.0, 5.0, False)
    >>> [spread_weight_cap(2000, 15.0, pub, e, b, False) for e in (10.0, 2.0, 0.1)]
    [32, 8, 1]
    """
    f = float(pub["test_fraction"])
    n = _activity(generator_mean(ratings_per_user, pub["n_items"], user_exponent), pub["n_items"], user_exponent)
    t = np.minimum(np.floor(f * n + 0.5), n - 1) if f > 0 else n  # her test ratings (training ones without a split)
    h2 = ((float(pub["rating_max"]) - float(pub["rating_min"])) / 2.0) ** 2
    std_sum = math.sqrt(2.0) * (float(np.sum(bounds)) + (2.0 if factors else 1.0)) / float(eps)
    cap = SPREAD_WEIGHT_CAP
    while cap > 1:
        weights = float(n_users) * float(np.mean(np.where(t >= 2, np.minimum(t, cap) / cap, 0.0)))
        if std_sum / max(weights, 1.0) <= SPREAD_NOISE * h2:
            break
        cap //= 2
    return int(cap)


def spread_sums(store, item_mean, V, bounds, cap: float = 1.0) -> np.ndarray:
    """``[sum w mean e^2, sum w residual product, sum LOO residual, sum w (the weights), users counted for the
    third]`` (:func:`streamdp.kernels.spread.residual_spread`, block by block): the first two over ``store``'s test
    ratings (its training ratings without a test split), each user weighted by ``w = min(n, cap) / cap`` (``n`` her
    ratings there; ``cap`` 1: one user one weight), the third over its training ratings, one user one weight
    (``V`` ``None``: no factors, 0 and 0 users).

    Test ratings, because the item means were fitted to the training ones; the unexplained residual is out of sample
    already (leave one out) and needs more ratings per user than a test split holds (docs/design-notes.md)."""
    item_mean = np.ascontiguousarray(item_mean, np.float64)
    bounds = np.asarray(bounds, np.float64)
    out, none = np.zeros(4), np.zeros((len(item_mean), 0))
    for blk in store.blocks("test" if store.has_test else "train"):
        residual_spread(blk.indptr, blk.items, blk.ratings, item_mean, none, SPREAD_RIDGE, bounds,
                        float(cap), out)
    loo, n_tr = np.zeros(4), 0
    if V is not None:
        V = np.ascontiguousarray(V, np.float64)
        for blk in store.blocks("train"):
            n_tr += residual_spread(blk.indptr, blk.items, blk.ratings, item_mean, V, SPREAD_RIDGE, bounds, 0.0,
                                    loo)
    return np.array([out[0], out[1], loo[2], out[3], float(n_tr)])


def _unit_factors(V, weights) -> np.ndarray:
    """The directions of ``V``'s rows (a row of zeros: a fixed random one), scaled so that ``u . v`` (``u ~ N(0,
    I / sqrt(k))``, the generator's users) has unit variance over ratings drawn with ``weights``. Directions only: the
    released norms are shrunk on rarely rated items and would put the whole interaction on the popular ones."""
    V = np.asarray(V, np.float64)
    norm = np.sqrt((V * V).sum(axis=1))[:, None]
    fill = np.random.default_rng(0).standard_normal(V.shape)
    fill /= np.sqrt((fill * fill).sum(axis=1))[:, None]
    V = np.where(norm > 0, V / np.where(norm > 0, norm, 1.0), fill)
    w = np.asarray(weights, np.float64) / float(np.sum(weights))
    ms = float((w * (V * V).sum(axis=1)).sum()) / math.sqrt(V.shape[1])
    return V / math.sqrt(ms) if ms > 0 else V


def _spread_model(where: str, st: RatingStore, factors_from: str | None = None) -> dict | None:
    """A released model's item means, and the item factors of the model ``factors_from`` (``None``: none), in the
    models' item order, and ``pos``: the models' position of each of ``st``'s items. What the spread statistics are
    read against."""
    try:
        m = load_model(where)
        f = None if factors_from is None else load_model(factors_from)
    except StreamdpError:
        return None
    ids = as_ids(st.item_ids())
    pos = find(as_ids(m.item_ids), ids)
    if len(pos) != st.n_items or (pos < 0).any():
        return None
    V = None
    if f is not None and factors_released(f):
        fpos = find(as_ids(f.item_ids), ids)
        if len(fpos) != st.n_items or (fpos < 0).any():
            return None
        V = np.empty((st.n_items, f.rank))
        V[pos] = np.asarray(f.item_factors, np.float64)[fpos, : f.rank]  # in the means model's item order
    mean = float(m.global_mean) + np.asarray(m.item_bias, np.float64)
    return {"path": where, "factors_path": None if V is None else factors_from, "pos": pos, "mean": mean, "V": V,
            "bias_prior": _bias_prior(where, m, _half_range(m, st))}


def _half_range(m, st: RatingStore) -> float:
    """Half the rating range the model ``m`` was trained on (its own, declared or selected privately), else the one
    a rehearsal may know of ``st`` (:func:`rehearsal_range`)."""
    lo, hi = rating_range(m)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        lo, hi = rehearsal_range(st)
    return (hi - lo) / 2.0


#: The release of the item sums behind a model's item biases in its ledger (its name starts so).
_SUMS_RELEASE = "item sums of user-centred residuals"


def _bias_prior(where: str, m, h: float) -> dict | None:
    """How the model at ``where`` (loaded: ``m``) shrank its item biases (:func:`streamdp.methods._biases.item_biases`:
    a public prior ``N(0, t^2)``, ``t = h / 5``, ``h`` half the rating range, against sums of residuals clipped to
    ``c`` over weight totals ``C_j``, spread ``s = min(h / 2, c)``, with noise ``sigma_S``): ``{"counts", "t2", "s2",
    "sigma_S", "global_mean"}``, or ``None`` when its biases are not that posterior mean or its sums' noise is not in
    its ledger. Only ``means`` models release that posterior mean as it is: ``als`` and ``irls`` refit their biases
    alongside the factors (with their own ridge)."""
    counts = m.extras.get("noisy_item_weight")
    if counts is None or m.method != "means":
        return None
    sigma = 0.0 if m.ledger.epsilon == math.inf else _release_std(
        read_model_json(where, "privacy.json") or {}, _SUMS_RELEASE)
    if not math.isfinite(sigma):
        return None
    try:
        clip = float((m.info.get("parameters") or {}).get("bias_clip", "inf"))
    except (TypeError, ValueError):
        return None
    return {"counts": np.asarray(counts, np.float64), "t2": (h / 5.0) ** 2, "s2": min(h / 2.0, clip) ** 2,
            "sigma_S": sigma, "global_mean": float(m.global_mean)}


def item_mean_draw(prior: dict | None, n: int, seed: int) -> np.ndarray | None:
    """One seeded draw of how far each item's true mean may lie from its released one, scaled as the released
    model's posterior (``None``: no prior): ``sd_j z_j``, ``sd_j^2 = 1 / (1 / t^2 + C_j^2 / (s^2 C_j + sigma_S^2))``
    under the model's prior ``N(0, t^2)``, spread ``s`` and sums' noise ``sigma_S`` (``C_j`` the released total).
    :func:`calibrate_spread` adds ``sqrt(mu)`` times it to the released means (the synthetic truth's), ``mu`` matched
    so that the pilot's released item means spread as the real ones did: a released mean is shrunk, and taken as the
    truth it makes privacy look cheaper (why, and the alternatives measured: docs/design-notes.md).

    >>> prior = {"counts": np.array([1e8, 0.0]), "t2": 0.16, "s2": 1.0, "sigma_S": 0.0}
    >>> d = item_mean_draw(prior, 2, 0)  # a well rated item has nothing to add, an unrated one its prior
    >>> bool(abs(d[0]) < 1e-3), bool(0 < abs(d[1]) < 5 * 0.4)
    (True, True)
    """
    if prior is None:
        return None
    C = np.maximum(np.asarray(prior["counts"], np.float64)[:n], 0.0)
    t2, s2, v0 = float(prior["t2"]), float(prior["s2"]), float(prior["sigma_S"]) ** 2
    info = np.divide(C * C, s2 * C + v0, out=np.zeros_like(C), where=C > 0)  # what the release says of the mean
    rng = np.random.default_rng(np.random.SeedSequence(entropy=int(seed), spawn_key=(_PURPOSE_MEANS,)))
    return np.sqrt(1.0 / (1.0 / t2 + info)) * rng.standard_normal(len(C))


#: The item means' draw (:func:`item_mean_draw`) is scaled by ``sqrt(mu)``, ``mu`` at most this.
MAX_DRAW = 4.0


#: The seed stream of :func:`item_mean_draw` (apart from the generator's own).
_PURPOSE_MEANS = 0x6D65616E


def _spread_record_ok(rel, entry_id) -> bool:
    """Whether ``rel`` is a spread release of this version for budget entry ``entry_id`` whose model is still there
    (anything else, e.g. a record of another version, is no source)."""
    try:
        return (isinstance(rel, dict) and rel.get("entry") == entry_id and os.path.isdir(str(rel.get("model")))
                and len(rel["values"]) == 5 and all(math.isfinite(float(x)) for x in rel["values"])
                and float(rel["noise_std"]) >= 0 and "factors" in rel
                and 1 <= int(rel["weight_cap"]) <= SPREAD_WEIGHT_CAP)
    except (KeyError, TypeError, ValueError):
        return False


def _release_spread(st: RatingStore, model: dict, weights, eps: float, pub: dict, shape: dict,
                    user_exponent: float = 2.0) -> tuple[dict, Release]:
    """The spread statistics of ``st`` against ``model`` with Laplace noise (OS entropy): the three sums and the
    weights counted (:func:`spread_sums`). One user moves each sum by at most its bound and each count by at most 1:
    L1 sensitivity ``B + 1`` (``B`` the bounds' sum), ``B + 2`` with factors (the users of the third sum counted too;
    why the counts are not scaled by ``B``: docs/design-notes.md)."""
    factors = model["V"] is not None
    bounds = spread_bounds(pub["rating_min"], pub["rating_max"], factors)
    V = _unit_factors(model["V"], weights) if factors else None
    cap = spread_weight_cap(shape["n_users"]["value"], shape["ratings_per_user"]["value"], pub, eps, bounds, factors,
                            user_exponent)
    sums = spread_sums(st, model["mean"][model["pos"]], None if V is None else V[model["pos"]], bounds, cap)
    B = float(bounds.sum())
    rel = Release(SPREAD_WHAT, "laplace", B + (2.0 if factors else 1.0), 1.0 / float(eps), shape=(5,))
    noisy = rel.add(sums, _release_rng())
    if not factors:
        noisy[[2, 4]] = 0.0  # 0 exactly (nothing to fit on, no user counted): nothing is learnt from their noise
    return {"values": [float(x) for x in noisy], "bound_sum": B, "bounds": bounds.tolist(),
            "noise_std": rel.std, "model": model["path"], "factors": factors,
            "factors_model": model["factors_path"], "ridge": SPREAD_RIDGE, "weight_cap": cap,
            "split": "test" if st.has_test else "train"}, rel


def spread_targets(record: dict) -> dict:
    """Weighted means of the released spread statistics (module docstring): ``total`` (mean squared residual),
    ``offset`` (mean residual product), ``unexplained`` (``None`` without factors), the weights counted (``users``),
    the noise standard deviation of the total (its sum's and its count's) and the weights' cap
    (:func:`spread_weight_cap`).

    >>> t = spread_targets({"values": [1000.0, 100.0, 0.0, 1000.0, 0.0], "noise_std": 20.0, "factors": False,
    ...                     "weight_cap": 8})
    >>> t["total"], t["offset"], t["unexplained"], t["users"], round(t["std"], 4), t["weight_cap"]  # std: 0.02 sqrt 2
    (1.0, 0.1, None, 1000.0, 0.0283, 8)
    """
    v = record["values"]
    n, n_tr = max(v[3], 1.0), max(v[4], 1.0)
    total = v[0] / n
    # the total is a ratio of two noisy numbers: the count's noise (relative std sigma / n) moves it as much as the
    # sum's does once it is near 1
    return {"total": total, "offset": v[1] / n, "unexplained": v[2] / n_tr if record["factors"] else None,
            "users": n, "std": float(record["noise_std"]) / n * math.sqrt(1.0 + total * total),
            "weight_cap": int(record.get("weight_cap", 1))}


def _pilot_release(pilot: RatingStore, where: str, tmp: str, seed: int) -> tuple[np.ndarray, np.ndarray | None,
                                                                                   float | None]:
    """What the model at ``where`` released about STORE, released about ``pilot`` instead: its method trained on the
    pilot at its epsilon and rank (seeded), and that model's item means, item factors (``None``: none released) in
    the pilot's item order, and its selection's :func:`selection_ratio` (``None``: no such candidates). The real
    store's statistics were read against the released model's means and factors, fitted to its own training ratings
    (with their estimation error and shrinkage); the pilot's are read against its own, fitted alike."""
    from streamdp.workflows.training import train as train_model

    info = read_model_json(where) or {}
    eps = info.get("epsilon")
    eps = math.inf if eps in ("inf", None) else float(eps)
    out = os.path.join(tmp, "pilot-model")
    train_model(pilot, method=str(info.get("method", "means")), epsilon=eps, rank=info.get("rank"), seed=seed,
                out=out, force=True, evaluate_test=False)
    m = load_model(out)
    pos = find(as_ids(m.item_ids), as_ids(pilot.item_ids()))
    mean = float(m.global_mean) + np.asarray(m.item_bias, np.float64)[pos]
    V = np.asarray(m.item_factors, np.float64)[pos, : m.rank] if factors_released(m) else None
    sel = _selection_source(out, read_model_json(out) or {})
    return mean, V, None if sel is None else sel["value"]["ratio"]


#: Rounds of the calibration at most when the split between interaction and noise is matched to a released
#: selection too (:func:`calibrate_spread`): one more unknown.
SPLIT_ROUNDS = 12
#: The split (noise over interaction, standard deviations) stays within these bounds.
SPLIT_RANGE = (0.05, 20.0)


def _next_split(split: float, ratio_p: float, ratio_t: float, last: tuple | None) -> float:
    """The next split (noise over interaction) towards the released selection ratio ``ratio_t`` from the pilot's
    ``ratio_p``: the pilot's factors doing better than the released ones (a lower ratio) means too much interaction.
    A secant step in ``(log split, log ratio)`` once two rounds moved the split (its slope at least 0.01: the ratio
    rises with the noise), else a factor 2; each step at most a factor 4, within :data:`SPLIT_RANGE`."""
    g = math.log(ratio_t) - math.log(ratio_p)
    step = math.copysign(math.log(2.0), g)
    if last is not None and abs(math.log(split) - math.log(last[0])) > 1e-6:
        slope = (math.log(ratio_p) - math.log(last[1])) / (math.log(split) - math.log(last[0]))
        if slope > 0.01:
            step = g / slope
    step = float(np.clip(step, -math.log(4.0), math.log(4.0)))
    return float(np.clip(split * math.exp(step), *SPLIT_RANGE))


def calibrate_spread(targets: dict, shape: dict, pub: dict, options: dict, model: dict, w_model,
                     global_mean: float, seed: int, selection: dict | None = None) -> dict:
    """The generator's ``interaction_scale``, ``noise`` and ``user_bias_std`` (and the item biases that keep the
    released item means; the released factors, if any, as the truth's) whose store has the released spread
    statistics: at most :data:`PILOT_ROUNDS` pilot stores of ``min(n_users, PILOT_USERS)`` users, each read against
    its own release (:func:`_pilot_release`), and secant updates of the variances (:class:`_SpreadSearch`).
    Without released factors the split (noise over interaction) is :data:`DEFAULT_SPLIT`, or matched to a released
    ``selection`` (:func:`_selection_source`, :func:`_next_split`; at most :data:`SPLIT_ROUNDS` rounds); why:
    docs/design-notes.md. Returns ``{"options": the generator's options, "record": what was matched}``."""
    search = _SpreadSearch(targets, shape, pub, options, model, w_model, global_mean, seed, selection)
    with tempfile.TemporaryDirectory(prefix="streamdp-pilot-") as tmp:
        for _ in range(SPLIT_ROUNDS if search.find_split else PILOT_ROUNDS):
            p, ratio_p = search.pilot(tmp)
            if search.step(p, ratio_p):
                break
    return {"options": search.options_for(), "record": search.record()}


class _SpreadSearch:
    """The state of :func:`calibrate_spread`'s search: the generator's fixed options and the variances being matched."""

    def __init__(self, targets, shape, pub, options, model, w_model, global_mean, seed, selection):
        self.t, self.pub, self.model, self.selection, self.seed = targets, pub, model, selection, seed
        self.global_mean = global_mean
        self.factors = factors = model["V"] is not None and targets["unexplained"] is not None
        self.find_split = not factors and selection is not None
        self.split = DEFAULT_SPLIT
        order = np.argsort(-np.asarray(w_model, np.float64), kind="stable")  # the synthetic items, most popular first
        opts = {k: v for k, v in options.items() if k != "user_weight"}
        self.m = m = _generator_rpu({"ratings_per_user": dict(shape["ratings_per_user"])}, pub, opts)
        wts = np.asarray(w_model, np.float64)[order]
        if "user_weight" in options:
            wts = _weights_for(wts, options["user_weight"], m, pub, opts, shape["n_users"]["value"])
        final = order[np.argsort(-wts, kind="stable")]  # the generator numbers its items so: nothing moves in it
        self.wts = wts = np.sort(wts)[::-1].copy()
        prior = model.get("bias_prior")
        if prior is not None and len(prior["counts"]) != len(model["mean"]):
            prior = None
        self.released_mean = model["mean"][final]
        draw = item_mean_draw(prior, len(model["mean"]), seed)
        self.draw = None if draw is None else draw[final]
        # how the released item means spread: the pilot's are matched to it
        self.spread_r = self.spread_p = float(np.var(self.released_mean))
        self.mu = 0.0
        self.V = _unit_factors(model["V"], w_model)[final] if factors else None
        if factors:
            opts["rank"], opts["item_factors"] = self.V.shape[1], self.V
        opts["item_weights"] = wts
        opts.pop("item_exponent", None)
        self.opts = opts
        self.lo, self.hi, self.step_ = pub["rating_min"], pub["rating_max"], pub["rating_step"]
        self.bounds = spread_bounds(self.lo, self.hi, factors)
        t = targets
        rnd = self.step_ * self.step_ / 12.0
        self.u2 = max(t["offset"], 0.0)
        if factors:
            self.n2 = max(t["unexplained"] - rnd, 1e-4)
            self.i2 = max(t["total"] - t["offset"] - t["unexplained"], 1e-4)
        else:
            self.i2, self.n2 = self.split_rest(max(t["total"] - t["offset"] - rnd, 1e-4), self.split)
        self.n_pilot = min(int(shape["n_users"]["value"]), PILOT_USERS)
        self.rounds, self.last, self.last_split, self.last_v = [], None, None, None

    @staticmethod
    def split_rest(q, split):
        return q / (1 + split ** 2), q * split ** 2 / (1 + split ** 2)

    def options_for(self) -> dict:
        """The generator's options at the current variances (and the item means' draw scale ``mu``)."""
        V, i2, n2, u2, mu = self.V, self.i2, self.n2, self.u2, self.mu
        per_item = (i2 * (V * V).sum(axis=1) / math.sqrt(V.shape[1]) if self.factors else i2) + n2 + u2
        target_mean = self.released_mean if self.draw is None else self.released_mean + math.sqrt(mu) * self.draw
        a = pre_clip_means(target_mean, np.sqrt(per_item), self.lo, self.hi, self.step_)
        return {**self.opts, "interaction_scale": math.sqrt(i2), "noise": math.sqrt(n2),
                "user_bias_std": math.sqrt(u2), "item_bias": a - self.global_mean, "global_mean": self.global_mean}

    def pilot(self, tmp: str):
        """``(statistics, selection ratio)`` of one pilot store at the current variances, released as the model was
        (the round is recorded)."""
        model, seed, pub = self.model, self.seed, self.pub
        i2, n2, u2, mu = self.i2, self.n2, self.u2, self.mu
        o = {k: v for k, v in self.options_for().items() if k not in ("seed", "show_progress")}
        pilot = generate_store(os.path.join(tmp, "p.zarr"), n_users=self.n_pilot, n_items=pub["n_items"],
                               ratings_per_user=self.m, rating_min=self.lo, rating_max=self.hi,
                               rating_step=self.step_, test_fraction=pub["test_fraction"], force=True, seed=seed,
                               show_progress=False, **o)
        mean_p, V_p, ratio_p = _pilot_release(pilot, model["path"], tmp, seed)
        s = spread_sums(pilot, mean_p, None, self.bounds, self.t["weight_cap"])
        if self.factors:  # the unexplained residual against factors fitted to the pilot as the released ones were
            if model["factors_path"] != model["path"]:
                _, V_p, _ = _pilot_release(pilot, model["factors_path"], tmp, seed)
            s[2:] = spread_sums(pilot, mean_p, self.V if V_p is None else _unit_factors(V_p, self.wts), self.bounds,
                                self.t["weight_cap"])[2:]
        if self.find_split and self.selection["model"] != model["path"]:
            _, _, ratio_p = _pilot_release(pilot, self.selection["model"], tmp, seed)
        if not (s[3] > 0 and (not self.factors or s[4] > 0)):  # no pilot user counted: 0 / 0 was a nan --noise
            raise ParameterError(f"a rehearsal cannot match the rating spread on {pub['n_items']:,} items: no user of "
                                 f"its {self.n_pilot:,}-user pilot store has the two ratings there that the spread "
                                 f"needs; give the spread yourself (--noise, --interaction-scale, --user-bias-std) or "
                                 f"rehearse a store of more items")
        p = {"total": s[0] / s[3], "offset": s[1] / s[3], "unexplained": s[2] / s[4] if self.factors else None}
        self.spread_p = float(np.var(mean_p))
        self.rounds.append({"interaction_scale": round(math.sqrt(i2), 4), "noise": round(math.sqrt(n2), 4),
                            "user_bias_std": round(math.sqrt(u2), 4),
                            **({"item_draw": round(mu, 4), "pilot_item_spread": round(self.spread_p, 5)}
                               if self.draw is not None else {}),
                            **{f"pilot_{k}": (None if v is None else round(float(v), 4)) for k, v in p.items()},
                            **({"pilot_selection_ratio": ratio_p} if self.find_split else {})})
        return p, ratio_p

    def step(self, p: dict, ratio_p) -> bool:
        """Move the variances toward the targets from the pilot's statistics ``p``; True: matched, stop."""
        t, factors, draw, selection = self.t, self.factors, self.draw, self.selection
        u2, n2, i2, mu, spread_p, spread_r = self.u2, self.n2, self.i2, self.mu, self.spread_p, self.spread_r
        g_t, g_o = t["total"] - p["total"], t["offset"] - p["offset"]
        g_n = t["unexplained"] - p["unexplained"] if factors else 0.0
        g_s = 0.0 if not self.find_split or ratio_p is None else math.log(selection["ratio"] / ratio_p)
        # the item means: the draw's scale moves how the pilot's released means spread (none needed: mu stays 0)
        g_v = 0.0 if draw is None or (mu == 0.0 and spread_p >= spread_r) else spread_r - spread_p
        if (max(abs(g_t), abs(g_n), 0.0 if (u2 == 0 and g_o < 0) else abs(g_o), abs(g_s) / 100.0) < 2e-4
                and abs(g_v) <= 0.02 * spread_r):
            return True
        if draw is not None:
            slope_v = 0.5 * float(np.mean(draw * draw))
            if self.last_v is not None and abs(mu - self.last_v[0]) > 1e-6:
                slope_v = float(np.clip((spread_p - self.last_v[1]) / (mu - self.last_v[0]), 0.05 * slope_v,
                                        4.0 * slope_v))
            self.last_v = (mu, spread_p)
            self.mu = float(np.clip(mu + g_v / slope_v, 0.0, MAX_DRAW))
        # the offsets' variance moves the offset (and the total as much); the noise the unexplained residual;
        # the rest of the total is the interaction's (with the noise's, without factors). Secant slopes: rounding
        # and clipping make a variance's effect on the statistics less than one.
        now = (u2, n2, i2, p)
        slope_n, slope_i = 1.0, 1.0
        if self.last is not None:
            lu, ln, li, lp = self.last
            if factors and abs(n2 - ln) > 1e-6:
                slope_n = float(np.clip((p["unexplained"] - lp["unexplained"]) / (n2 - ln), 0.25, 2.0))
            rest = (i2 - li) + (0.0 if factors else n2 - ln)
            if abs(rest) > 1e-6:
                moved = (p["total"] - lp["total"]) - (u2 - lu) - ((n2 - ln) if factors else 0.0)
                slope_i = float(np.clip(moved / rest, 0.25, 2.0))
        self.last = now
        u_new = max(u2 + g_o, 0.0)
        n_new = max(n2 + g_n / slope_n, 1e-4) if factors else n2
        step_rest = (g_t - (u_new - u2) - ((n_new - n2) if factors else 0.0)) / slope_i
        self.u2, n2_old = u_new, n2
        if factors:
            self.n2, self.i2 = n_new, max(i2 + step_rest, 1e-4)
        else:
            if self.find_split and ratio_p is not None and abs(g_s) >= 2e-2:
                self.split, self.last_split = (_next_split(self.split, ratio_p, selection["ratio"], self.last_split),
                                               (self.split, ratio_p))
            self.i2, self.n2 = self.split_rest(max(i2 + n2_old + step_rest, 1e-4), self.split)
        return False

    def record(self) -> dict:
        """What was matched, round by round (the rehearsal's record)."""
        selection, split, mu, draw = self.selection, self.split, self.mu, self.draw
        how = (f"the generator's (noise / interaction {DEFAULT_SPLIT:g}: no model released item factors nor als "
               f"validation losses)" if not self.find_split else
               f"noise / interaction {split:.3g}, matched to the validation losses of the "
               f"{selection.get('method')} model of {selection.get('from', selection['model'])} (its factors' loss "
               f"{selection['ratio']:g} times its biases'; no model released item factors)")
        record = {"targets": {k: (None if v is None else round(float(v), 4)) for k, v in self.t.items()},
                  "interaction_scale": round(math.sqrt(self.i2), 4), "noise": round(math.sqrt(self.n2), 4),
                  "user_bias_std": round(math.sqrt(self.u2), 4), "factors": "released" if self.factors else how,
                  "pilot_users": self.n_pilot, "rounds": self.rounds,
                  "item_draw": None if draw is None else round(mu, 4),
                  "item_means": ("the released ones" if draw is None else
                                 f"the released ones plus {math.sqrt(mu):.3g} times a draw of their posterior spread "
                                 f"(the pilot's released item means spread {self.spread_p:.3g} against the store's "
                                 f"{self.spread_r:.3g})")}
        if self.find_split:
            record["split"] = round(split, 4)
        return record
