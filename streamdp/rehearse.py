"""Choosing epsilon without spending it: a synthetic store shaped like a real one.

``streamdp generate --like STORE --out SYN`` and ``streamdp sweep STORE --rehearse`` write a
store from :func:`streamdp.storage.generate.generate_store` whose shape is STORE's, made
only from what is public or already released, never from STORE's ratings:

public parameters (free)
    the number of items (the catalogue), the declared rating range and its step (the
    generator's ``rating_step`` when STORE was generated, else 1 when both ends of the
    range are integers, continuous otherwise), the test fraction the owner chose at
    ingest. An *observed* rating range (no ``--rating-range`` at ingest) is the data's
    exact minimum and maximum: every model released from STORE publishes it already.
shape statistics STORE has already released (free: post-processing)
    the number of users and the histogram of training ratings per user that the models
    released from STORE carry (``privacy.json``'s ``public_parameters.n_users``,
    ``model.json``'s ``user_profile``; als, means and irls release the histogram), and the
    histograms earlier rehearsals released (kept in their synthetic store). The
    budget's entries point at them (their ``model``); of several, the least noisy is used.
    A model or synthetic store deleted since is no longer a source.
what is missing
    released now: one Laplace histogram of training ratings per user over the public
    half-octave bins of :mod:`streamdp.methods._profile` (one user falls in one bin: L1
    sensitivity 1) at ``shape_epsilon`` (default :data:`SHAPE_EPSILON`), reserved in and
    charged to STORE's budget like any release (ledger method ``shape``; the entry points
    at the synthetic store, which records the noisy histogram so that the next rehearsal
    reuses it for free), and said in the output. It reads STORE's per-user row pointers,
    never its ratings; its noise always comes from OS entropy (a rehearsal's ``--seed`` seeds
    the synthetic runs, never a release from STORE). Or, with ``users`` / ``ratings_per_user`` (``--users N
    --ratings-per-user M``), the numbers the user gives, at no cost: they are hers to vouch
    for (read off the data, they are unaccounted wherever the rehearsal's output goes).

From a histogram (post-processing): the number of users is the sum of the bins a user can
be in (a user rates at most ``n_items`` items; an unbiased sum of the noisy counts), the
mean training ratings per user the mean of the bins' midpoints weighted by the counts that
stand above :data:`NOISE_FLOOR` noise standard deviations (a bin within the noise is read
as empty: otherwise the noise in the far, empty bins dominates the mean), divided by
``1 - test_fraction`` for the ratings per user (train and test); the generator's parameter is
the mean before its cap at ``n_items`` that gives this mean after it (:func:`generator_mean`).

The item side, from the least noisy als, irls or means model STORE has released (free: post-processing; the
ranking is by the counts' noise over their total, so models of different bounds compare): its noisy item weight
totals give the item popularity (:func:`item_side`: floored at the mean of clipped pure noise; then
:func:`drawing_weights`: the generator's drawing weights whose expected totals, for users of the generator's
activity and the model's per-user weights, match them, since a heavy user rates an item once and realized totals
are flatter than the law that drew them); its global mean and item biases give each item's mean rating, and the
generator's mean before its spread (``sqrt(interaction_scale^2 + noise^2 + user_bias_std^2)``), rounding and
clipping is the one whose mean after them is that (:func:`pre_clip_means`). A generator option given wins
(``item_exponent`` over the popularity, ``global_mean`` / ``item_bias_std`` over the means); without such a model
both are the generator's, as before, and the output says which was used.

Everything else (rank, noise, the interaction strength, user activity's tail) is the generator's default or the
option given: a rehearsal shows the regime (users, items, activity, item popularity and means, scale), not STORE's
own signal. The interaction strength of the popular items (how far ratings spread around their item's mean) is
what no release carries: on 2,000 users x 400 items it moves the test RMSE by up to 0.06 between generator seeds,
more than anything the released statistics fix (``tests/test_rehearse.py``). The sweep on the
synthetic store charges only the synthetic store's own budget; STORE's budget file is left
byte for byte as it was unless a statistic had to be released.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
from scipy.special import ndtr

from streamdp.errors import ParameterError, StreamdpError
from streamdp.methods._profile import EDGES, WHAT as PROFILE_WHAT, exact_histogram
from streamdp.model import load_model
from streamdp.privacy.mechanisms import huber_variance
from streamdp.privacy.budget import COUNTED, StoreBudget
from streamdp.privacy.ledger import GUARANTEE_USER_DP, Ledger
from streamdp.privacy.release import Release
from streamdp.storage.generate import generate_store
from streamdp.storage.store import RatingStore, open_store
from streamdp.storage.writer import check_destination

__all__ = ["SHAPE_EPSILON", "NOISE_FLOOR", "released_shape", "shape_from_histogram", "item_side", "generate_like",
           "REHEARSAL_NOTE"]

#: Epsilon of a histogram released for a rehearsal when STORE has released none (pure DP, Laplace).
SHAPE_EPSILON = 0.1
#: A noisy bin counts only above this many noise standard deviations.
NOISE_FLOOR = 2.0
#: The line a rehearsal prints first.
REHEARSAL_NOTE = ("REHEARSAL on synthetic data shaped like {store}: nothing is trained on its ratings; the curve "
                  "is the regime's (users, items, activity, scale), not its own data's")


def _possible_bins(n_items: int) -> np.ndarray:
    """The bins a user can fall in (at most ``n_items`` ratings)."""
    return EDGES <= max(int(n_items), 1)


def shape_from_histogram(counts, noise_std: float, n_items: int, test_fraction: float) -> dict:
    """``{"n_users", "ratings_per_user"}`` from a (noisy) histogram of training ratings per user over
    :data:`~streamdp.methods._profile.EDGES` (module docstring).

    >>> h = np.zeros(len(EDGES)); h[list(EDGES).index(16)] = 500.0  # 500 users with 16..23 training ratings
    >>> shape_from_histogram(h, 0.0, 100, 0.2)
    {'n_users': 500, 'ratings_per_user': 24.375}
    """
    h = np.asarray(counts, np.float64)[: len(EDGES)]
    ok = _possible_bins(n_items)[: len(h)]
    upper = np.r_[EDGES[1:], 2 * EDGES[-1]].astype(np.float64)
    mid = (EDGES + np.minimum(upper - 1, max(int(n_items), 1))) / 2.0
    n_users = max(1, int(round(float(h[ok].sum()))))
    w = np.where(ok & (h > NOISE_FLOOR * float(noise_std)), h, 0.0)
    if w.sum() <= 0:  # nothing stands above the noise: the positive counts, for want of better
        w = np.where(ok, np.maximum(h, 0.0), 0.0)
    train_mean = float((w * mid[: len(h)]).sum() / w.sum()) if w.sum() > 0 else 1.0
    rpu = min(max(train_mean / (1.0 - float(test_fraction)), 1.0), float(n_items))
    return {"n_users": n_users, "ratings_per_user": round(rpu, 3)}


def generator_mean(mean: float, n_items: int, user_exponent: float = 2.0) -> float:
    """The generator's ``ratings_per_user`` whose users have ``mean`` ratings on average once their Pareto activity
    is capped at ``n_items`` (a released histogram counts the capped numbers; the generator's parameter is the mean
    before the cap): ``E[min(X, N)] = s a / (a - 1) (1 - (s / N)^(a - 1)) + N (s / N)^a`` for ``X`` Pareto of scale
    ``s = m (a - 1) / a`` and exponent ``a``, solved for ``m`` by bisection.

    >>> generator_mean(14.296875, 80)  # 15 ratings per user before the cap at 80 items: 14.3 on average after it
    15.0
    """
    a, n = float(user_exponent), float(n_items)

    def capped(m):
        s = m * (a - 1.0) / a
        if s >= n:
            return n
        return s * a / (a - 1.0) * (1.0 - (s / n) ** (a - 1.0)) + n * (s / n) ** a

    if mean >= capped(n * 1e6):
        return float(n)
    lo, hi = 1.0, n * 1e6
    for _ in range(200):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if capped(mid) < mean else (lo, mid)
    return round(max(lo, 1.0), 3)


def _read_json(path) -> dict | None:
    try:
        with open(path) as f:
            d = json.load(f)
        return d if isinstance(d, dict) else None
    except (OSError, ValueError):
        return None


def _sources(entry: dict) -> list[dict]:
    """What one budget entry's output (a model, or a rehearsal's synthetic store) released about the shape:
    ``{"what": "n_users"|"histogram", "value", "std", "from"}`` (``std`` 0: exact or declared)."""
    where = entry.get("model")
    if not where or not os.path.isdir(where):
        return []
    frm = f"budget entry {entry['id']} ({where})"
    model, ledger = _read_json(os.path.join(where, "model.json")), _read_json(os.path.join(where, "privacy.json"))
    out = []
    if model is not None and ledger is not None:
        n = (ledger.get("public_parameters") or {}).get("n_users")
        if isinstance(n, dict) and isinstance(n.get("value"), int):
            std = 0.0
            if n.get("source") == "released":
                rel = [r for r in (ledger.get("bounds") or {}).get("releases", [])
                       if str(r.get("release", "")).startswith("number of users")]
                std = math.sqrt(2.0) * float(rel[0]["scale"]) if rel else math.inf
            out.append({"what": "n_users", "value": n["value"], "std": std, "from": frm})
        prof = model.get("user_profile")
        if isinstance(prof, dict) and prof.get("bin_lower_edges") == EDGES.tolist():
            out.append({"what": "histogram", "value": prof["users"], "std": float(prof["noise_std"]), "from": frm})
        items = _item_source(where, model, ledger)
        if items is not None:
            out.append({**items, "from": frm})
        return out
    try:
        attrs = open_store(where).attrs
    except StreamdpError:  # neither a model nor a store (any more): nothing to read
        return out
    rel = ((attrs.get("params") or {}).get("like") or {}).get("shape_release")
    if isinstance(rel, dict) and rel.get("entry") == entry["id"]:
        out.append({"what": "histogram", "value": rel["histogram"], "std": float(rel["noise_std"]), "from": frm})
    return out


#: The methods whose models release item counts and biases on the rating scale (als, irls, means: the noisy item
#: weight totals ``C_j``, the item biases and global mean of their statistics pass).
ITEM_METHODS = ("als", "irls", "means")
#: The released item weight totals' release in the ledger (its name starts so).
_COUNTS_RELEASE = "item weight totals C_j"


def _noise_std(rel: dict) -> float:
    """Standard deviation of one coordinate of the noise of a ledger's release entry."""
    mech, scale = rel.get("mechanism"), float(rel.get("scale", math.inf))
    if mech == "gaussian":
        return scale
    if mech == "laplace":
        return math.sqrt(2.0) * scale
    if mech == "huber":
        return math.sqrt(huber_variance(scale, float(rel.get("huber_transition", 0.0))))
    return math.inf


def _item_source(where: str, model: dict, ledger: dict) -> dict | None:
    """The item side a model released (its noisy item weight totals, item biases and global mean), or ``None``:
    ``{"what": "items", "value": {"counts", "bias", "global_mean", "count_std", "method"}, "std"}``, ``std`` the
    counts' noise standard deviation over their (clipped) total, so that models of different bounds compare."""
    if model.get("method") not in ITEM_METHODS:
        return None
    try:
        m = load_model(where)
    except StreamdpError:
        return None
    counts = m.extras.get("noisy_item_weight")
    if counts is None:
        return None
    counts = np.asarray(counts, np.float64)
    if m.ledger.epsilon == math.inf or model.get("epsilon") == "inf":
        std = 0.0
    else:
        rel = [r for r in (ledger.get("bounds") or {}).get("releases", [])
               if str(r.get("release", "")).startswith(_COUNTS_RELEASE)]
        if not rel:
            return None
        std = _noise_std(rel[0])
    total = float(np.maximum(counts, 0.0).sum())
    if not (total > 0 and math.isfinite(std)):
        return None
    par = model.get("parameters") or {}
    rule = {"private": std > 0, "sampling": par.get("sampling", "adaptive"), "tau": float(par.get("tau") or 1.0),
            "l1": par.get("mechanism") in ("laplace", "huber"), "centred": std > 0 and model["method"] == "means"}
    return {"what": "items", "std": std / total,
            "value": {"counts": counts, "bias": np.asarray(m.item_bias, np.float64), "user_weight": rule,
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
#: what every user rating the item once would give (noise, or a heavier activity than the generator's) is not chased
#: to a weight that makes every user rate it first (measured corrections on generated stores: 1.5 at the top).
MAX_CORRECTION = 4.0
#: :func:`drawing_weights` solves for the top items one by one and for the rest in groups of alike totals, at most
#: this many unknowns in all (memory and time: ``len(activity) x GROUPS`` numbers, whatever the catalogue).
GROUPS = 2048


def drawing_weights(totals, activity, user_weight, iters: int = 20) -> np.ndarray:
    """The generator's drawing weights whose expected item weight totals are proportional to ``totals``.

    Released totals are flatter than the probabilities that drew them: a heavy user rates each item at most once,
    so the top items' share of her ratings is below their drawing probability. Drawing with the totals themselves
    would flatten the synthetic store twice. The weights ``p`` solve ``sum_users c(n) pi_j(n, p) ~ totals_j``
    (``c`` the model's per-user weight, ``pi_j`` :func:`_inclusion`, users at :func:`_activity`'s quantiles) by
    ``iters`` multiplicative steps ``p_j <- p_j totals_j / E_j(p)``, kept within :data:`MAX_CORRECTION` of the
    totals. Past the first ``GROUPS / 2`` items (by total)
    the items are solved in ``GROUPS / 2`` groups of consecutive totals (one factor ``p / total`` a group)."""
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


def clipped_mean(a, s: float, lo: float, hi: float, step: float) -> np.ndarray:
    """``E[clip(round(a + Z), lo, hi)]``, ``Z ~ N(0, s^2)``, rounded to ``step`` (0: continuous): the mean rating of an
    item whose ratings the generator draws around ``a`` (its rounding, then its clipping).

    >>> clipped_mean(np.array([3.0, 6.0]), 1.0, 1.0, 5.0, 1.0).round(3).tolist()
    [3.0, 4.927]
    """
    a = np.asarray(a, np.float64)[:, None]
    if s <= 0:
        r = a[:, 0] if step <= 0 else lo + np.floor((a[:, 0] - lo) / step + 0.5) * step
        return np.clip(r, lo, hi)
    if step > 0:
        v = lo + step * np.arange(int(round((hi - lo) / step)) + 1)
        upper = np.r_[v[:-1] + step / 2.0, np.inf]
        cdf = np.c_[np.zeros(len(a)), ndtr((upper[None, :-1] - a) / s), np.ones(len(a))]
        return (np.diff(cdf, axis=1) * v[None, :]).sum(axis=1)
    za, zb = (lo - a[:, 0]) / s, (hi - a[:, 0]) / s
    pdf = lambda z: np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)  # noqa: E731
    mid = a[:, 0] * (ndtr(zb) - ndtr(za)) + s * (pdf(za) - pdf(zb))
    return lo * ndtr(za) + mid + hi * (1.0 - ndtr(zb))


def pre_clip_means(target, s: float, lo: float, hi: float, step: float) -> np.ndarray:
    """The ``a`` whose :func:`clipped_mean` is ``target`` (each within ``(lo, hi)``; bisection): the generator's
    item means before its noise, rounding and clipping, that give the released item means after them.

    >>> pre_clip_means(clipped_mean(np.array([2.5, 5.5]), 1.0, 1.0, 5.0, 1.0), 1.0, 1.0, 5.0, 1.0).round(6).tolist()
    [2.5, 5.5]
    """
    t = np.clip(np.asarray(target, np.float64), lo + 1e-3 * (hi - lo), hi - 1e-3 * (hi - lo))
    width = (hi - lo) + 10.0 * max(float(s), 0.0)
    a_lo, a_hi = np.full(len(t), lo - width), np.full(len(t), hi + width)
    for _ in range(80):
        mid = (a_lo + a_hi) / 2.0
        below = clipped_mean(mid, s, lo, hi, step) < t
        a_lo, a_hi = np.where(below, mid, a_lo), np.where(below, a_hi, mid)
    return (a_lo + a_hi) / 2.0


def item_side(counts, count_std: float, bias) -> tuple[np.ndarray, np.ndarray]:
    """The synthetic store's item drawing weights and biases from a model's released item weight totals (noise
    standard deviation ``count_std``) and item biases (post-processing), most popular first.

    A noisy total is clipped at ``sigma / sqrt(2 pi)``, the mean of pure noise clipped at 0 (``sigma`` its standard
    deviation): an item whose total is within the noise is still drawn, about as often as the noise alone says,
    rather than never (a negative total) or as often as the noise's upward swings. Under the generator's model (a
    user's items drawn independently of her activity) a total ``C_j = sum_i c_ij`` is proportional to item ``j``'s
    drawing probability in expectation, whatever the per-user weights ``c_ij``, so the clipped totals serve as the
    weights themselves. Each item keeps its own released bias: popular items' means stay theirs.

    >>> w, b = item_side([5.0, -3.0, 20.0], 2.5, [0.1, -0.2, 0.3])
    >>> w.round(3).tolist(), b.tolist()
    ([20.0, 5.0, 0.997], [0.3, 0.1, -0.2])
    """
    c = np.asarray(counts, np.float64)
    w = np.maximum(c, float(count_std) / math.sqrt(2.0 * math.pi))
    order = np.argsort(-w, kind="stable")
    return w[order], np.asarray(bias, np.float64)[order]


def released_shape(store) -> dict:
    """The least noisy released ``n_users``, histogram of training ratings per user and item side (counts, biases,
    global mean) of ``store``, from its budget's counted entries (module docstring): ``{"n_users": source or None,
    "histogram": source or None, "items": source or None}``.
    Reads the budget and the outputs its entries point at; writes nothing."""
    path = store.path if isinstance(store, RatingStore) else str(store)
    best: dict = {"n_users": None, "histogram": None, "items": None}
    for e in StoreBudget(path).entries():
        if e.get("status") not in COUNTED or e.get("status") == "reserved":
            continue
        for s in _sources(e):
            if best[s["what"]] is None or s["std"] < best[s["what"]]["std"]:
                best[s["what"]] = s
    return best


def _public(st: RatingStore) -> dict:
    """The generator's parameters that STORE's public parameters fix (module docstring)."""
    a, p = st.attrs, st.attrs.get("params") or {}
    lo, hi = float(a["rating_min"]), float(a["rating_max"])
    step = p.get("rating_step")
    if step is None:
        step = 1.0 if lo == int(lo) and hi == int(hi) else 0.0
    return {"n_items": int(st.n_items), "rating_min": lo, "rating_max": hi, "rating_step": float(step),
            "test_fraction": float(p.get("test_fraction") or 0.0)}


def _release_histogram(st: RatingStore, epsilon: float) -> tuple[np.ndarray, Release]:
    """STORE's histogram of training ratings per user with Laplace noise (row pointers only, OS entropy)."""
    rel = Release(PROFILE_WHAT, "laplace", 1.0, 1.0 / float(epsilon), shape=(len(EDGES),))
    return rel.add(exact_histogram(st), np.random.default_rng()), rel


def generate_like(store, out: str, *, users: int | None = None, ratings_per_user: float | None = None,
                  shape_epsilon: float | None = None, over_budget: bool = False, force: bool = False,
                  echo=None, **options) -> RatingStore:
    """Write a synthetic store shaped like ``store`` to ``out`` (module docstring) and return it opened.

    ``users`` / ``ratings_per_user``: given by the caller, at no cost; what is neither given nor
    released is released now at ``shape_epsilon`` and charged to ``store``'s budget (refused past
    the budget unless ``over_budget``). ``options``: the generator's other parameters (rank, noise,
    seed, item_exponent, ...). ``echo`` gets the lines saying where each number came from.
    """
    say = echo or (lambda *a, **k: None)
    st = store if isinstance(store, RatingStore) else open_store(store)
    if st.implicit:
        raise ParameterError(f"{st.path}: an implicit store (counts, no ratings): a rehearsal writes ratings; "
                             f"generate an implicit store with `streamdp generate --implicit` instead")
    for name in ("n_items", "rating_min", "rating_max", "rating_step", "test_fraction", "n_users", "implicit"):
        if name in options:
            raise ParameterError(f"--like: {name} comes from {st.path} (its public parameters or released "
                                 f"statistics); leave it out")
    if users is not None and (isinstance(users, bool) or int(users) != users or users < 1):
        raise ParameterError(f"--users must be a positive integer, got {users}")
    if ratings_per_user is not None and not ratings_per_user >= 1:
        raise ParameterError(f"--ratings-per-user must be >= 1, got {ratings_per_user}")
    pub = _public(st)
    shape = {"n_users": None if users is None else {"value": int(users), "source": "given (--users): no cost"},
             "ratings_per_user": None if ratings_per_user is None else
             {"value": float(ratings_per_user), "source": "given (--ratings-per-user): no cost"}}
    found = released_shape(st)
    items = _items(found["items"], pub, options)
    if None in shape.values():
        if shape["n_users"] is None and found["n_users"] is not None:
            shape["n_users"] = {"value": int(found["n_users"]["value"]),
                                "source": f"released: {found['n_users']['from']}"}
        if found["histogram"] is not None:
            h = shape_from_histogram(found["histogram"]["value"], found["histogram"]["std"], pub["n_items"],
                                     pub["test_fraction"])
            src = f"released histogram of ratings per user: {found['histogram']['from']}"
            if shape["n_users"] is None:
                shape["n_users"] = {"value": h["n_users"], "source": src}
            if shape["ratings_per_user"] is None:
                shape["ratings_per_user"] = {"value": h["ratings_per_user"], "source": src}
    like = {"store": st.path, "store_checksum": st.checksum, "public": pub, "items": items.pop("record")}
    options = {**options, **items}
    check_destination(out, force)  # before anything is reserved
    if None in shape.values():
        return _generate_with_release(st, out, pub, shape, like, shape_epsilon, over_budget, force, say, options)
    _say_shape(say, st, pub, shape, like["items"])
    return _generate(out, shape, pub, like, force, options)


def _generate_with_release(st, out, pub, shape, like, shape_epsilon, over_budget, force, say, options):
    """Release the histogram now (reserved in STORE's budget, completed once the synthetic store that records it
    is written; failed, and so not counted, if writing it fails: the noisy values never left the process)."""
    eps = SHAPE_EPSILON if shape_epsilon is None else float(shape_epsilon)
    if not (math.isfinite(eps) and eps > 0):
        raise ParameterError(f"--shape-epsilon must be a finite number > 0, got {shape_epsilon}")
    hist, rel = _release_histogram(st, eps)
    h = shape_from_histogram(hist, math.sqrt(2.0) * rel.scale, pub["n_items"], pub["test_fraction"])
    ledger = Ledger(method="shape", guarantee=GUARANTEE_USER_DP, epsilon=eps, delta=0.0, events=[rel.event()],
                    bounds={"releases": [rel.entry()]}, store_checksum=st.checksum or "",
                    notes=["a rehearsal's shape statistic: the histogram of training ratings per user"])
    budget = StoreBudget(st.path)
    with budget.release(ledger, over_budget=over_budget, model=os.path.abspath(out)) as entry:
        src = f"released now: Laplace histogram of ratings per user at epsilon {eps:g}, budget entry {entry}"
        for key in ("n_users", "ratings_per_user"):
            if shape[key] is None:
                shape[key] = {"value": h[key], "source": src}
        like["shape_release"] = {"entry": entry, "epsilon": eps, "histogram": [round(float(x), 3) for x in hist],
                                 "noise_std": math.sqrt(2.0) * rel.scale}
        syn = _generate(out, shape, pub, like, force, options)
    say(f"charged to {st.path}'s budget: epsilon {eps:g} (pure, Laplace) for its histogram of training ratings "
        f"per user, which it had not released (entry {entry}; later rehearsals reuse it for free)")
    _say_shape(say, st, pub, shape, like["items"])
    return syn


def _generate(out, shape, pub, like, force, options) -> RatingStore:
    """The synthetic store: the generator's mean ratings per user, and its item drawing weights from the released
    totals (:func:`drawing_weights`) for users of that activity."""
    options = dict(options)
    m = _generator_rpu(shape, pub, options)
    rule = options.pop("user_weight", None)
    if rule is not None:
        n = _activity(m, pub["n_items"], options.get("user_exponent", 2.0))
        c = _user_weight(np.maximum(np.rint(n * (1.0 - pub["test_fraction"])), 1.0), rule)
        options["item_weights"] = drawing_weights(options["item_weights"], n, c)
    return generate_store(out, n_users=shape["n_users"]["value"], n_items=pub["n_items"], ratings_per_user=m,
                          rating_min=pub["rating_min"], rating_max=pub["rating_max"],
                          rating_step=pub["rating_step"], test_fraction=pub["test_fraction"], force=force,
                          like={**like, "shape": shape}, **options)


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
        popularity = ((f"noisy item weight totals (noise std {v['count_std']:.3g}, floored at "
                       f"{v['count_std'] / math.sqrt(2.0 * math.pi):.3g}) " if v["count_std"] > 0 else
                       "item weight totals (exact: a non-private release) ") + src
                      + ", turned into drawing weights for the generator's users (heavy users rate an item once)")
    else:
        popularity = (f"the generator's power law, exponent {options.get('item_exponent', 0.9):g} ("
                      + ("given" if "item_exponent" in options else "no model of an item release")
                      + ")")
    mine = {"global_mean", "item_bias_std"} & set(options) or options.get("factors") == "uniform"
    if v is not None and not mine:
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
                 + ("given" if mine else "no model of an item release")
                 + ")")
    out["record"] = {"popularity": popularity, "means": means}
    return out


def _say_shape(say, st, pub, shape, items=None) -> None:
    say(f"shaped like {st.path}: {pub['n_items']:,} items, ratings {pub['rating_min']:g}..{pub['rating_max']:g} "
        f"(step {pub['rating_step']:g}), test fraction {pub['test_fraction']:g} (public parameters)")
    say(f"  {shape['n_users']['value']:,} users: {shape['n_users']['source']}")
    say(f"  {shape['ratings_per_user']['value']:g} ratings per user (mean): {shape['ratings_per_user']['source']}")
    if items is not None:
        say(f"  item popularity: {items['popularity']}")
        say(f"  item means: {items['means']}")
