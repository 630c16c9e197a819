"""Ranking metrics of the lists users would see: Precision@k, Recall@k, NDCG@k, MAP@k, coverage, popularity bias.

Computed on the users' side exactly as ``recommend`` does (:mod:`streamdp.serving.local`):
each user solves her row from her own *training* ratings and the released model, and her
top-``k`` list is taken among the items she did **not** rate in training, ranked by the
model's list score (:func:`streamdp.serving.local.list_scorer`), ties by ascending item
id. Streamed by user block through the engine, selected in Numba
(:func:`streamdp.kernels.topk.topn_blocked`). Public names: :class:`Ranking`,
:func:`setup`, :func:`ranking_sample`, :func:`ranking_verdict`, :func:`format_ranking`.

Decisions a reader must know:

* **which users**: a seeded uniform sample of :data:`DEFAULT_RANKING_USERS` user positions
  (fixed public seed :data:`SAMPLE_SEED`, the same users for the model and the baselines),
  or ``--ranking-users all``; each mean comes with its standard error (finite-population
  corrected);
* **relevance**: a held-out rating ``>=`` the threshold, by default the top 20% of the
  rating range (:func:`default_threshold`); on an implicit store every held-out
  interaction; users without a relevant test item are not evaluated;
* binary gains; coverage and popularity bias are of the measured users' lists;
* **baselines**: ``private_popularity`` (the counts the model itself released:
  post-processing) and ``popularity`` (exact training counts: non-private, a reference);
* the metrics are the data owner's (they read the test split): printed, never written
  into a model.

Design notes (the sample and its errors, each metric's formula, the baselines):
docs/design-notes.md#streamdpservingrankingpy.
"""

from __future__ import annotations

import numpy as np

from streamdp.errors import InputError, ParameterError
from streamdp.kernels.topk import SUMS, ranking_sums, topn_blocked, topn_by_order, topn_prepare
from streamdp.serving.local import RELEASED_COUNTS, list_bias, list_scorer, local_design, not_personalised_note, personalised
from streamdp.storage.ids import find

#: Default list length of the metrics (``--k``).
DEFAULT_K = 10
#: The default relevance threshold keeps the top share of the rating range.
TOP_SHARE = 0.2
#: The relevance of an implicit store's held-out values (counts, all positive).
IMPLICIT_RELEVANT = "implicit store: every held-out interaction is relevant"
#: The metrics of each list source, in output order.
METRICS = ("precision", "recall", "ndcg", "map", "coverage", "popularity_bias")
#: The per-user means whose sampling error is reported.
SAMPLED_METRICS = ("precision", "recall", "ndcg", "map")
#: Users the ranking metrics are drawn from by default (``--ranking-users``).
DEFAULT_RANKING_USERS = 10_000
#: The seed of the users' sample: fixed and public, so that every run measures the same users.
SAMPLE_SEED = 0


def check_ranking_users(value) -> int | None:
    """``--ranking-users``: a positive integer, or ``"all"`` (``None``: every user).

    >>> check_ranking_users("all"), check_ranking_users("500"), check_ranking_users(None)
    (None, 500, 10000)
    """
    if value is None:
        return DEFAULT_RANKING_USERS
    if isinstance(value, str):
        text = value.strip()
        if text.lower() == "all":
            return None
        n = int(text) if text.isdigit() else 0
    else:
        n = int(value) if not isinstance(value, bool) and int(value) == value else 0
    if n < 1:
        raise ParameterError(f"--ranking-users must be a positive integer or 'all', got {value!r}")
    return n


def ranking_sample(n_users: int, size: int | None, seed: int = SAMPLE_SEED) -> np.ndarray | None:
    """Sorted dense positions of ``size`` users drawn uniformly without replacement from ``n_users``.

    ``None`` (every user) when ``size`` is ``None`` or at least ``n_users``. Depends on
    ``(n_users, size, seed)`` only: the store's public shape, never its ratings.

    >>> ranking_sample(10, None) is None, ranking_sample(10, 10) is None
    (True, True)
    >>> s = ranking_sample(1000, 5); len(s), bool((s == ranking_sample(1000, 5)).all())
    (5, True)
    """
    if size is None or size >= n_users:
        return None
    return np.sort(np.random.default_rng(seed).choice(int(n_users), int(size), replace=False)).astype(np.int64)


def default_threshold(lo: float, hi: float) -> float:
    """``lo + 0.8 (hi - lo)``: the top 20% of the rating range.

    >>> default_threshold(1, 5)
    4.2
    """
    return round(float(lo) + (1.0 - TOP_SHARE) * (float(hi) - float(lo)), 12)


def check_k(k) -> int:
    """``k`` as a positive int, else a :class:`ParameterError` naming ``--k``."""
    if isinstance(k, bool) or int(k) != k or k < 1:
        raise ParameterError(f"--k must be a positive integer, got {k}")
    return int(k)


def released_counts(model, pos):
    """``(counts in the store's item order, what)`` from the model's released item counts, or ``(None, why not)``.

    ``pos[j]`` is store item ``j``'s position in the model (its per-item extras are in
    the model's ascending-id order).
    """
    extras = getattr(model, "extras", None) or {}
    for name, what in RELEASED_COUNTS.items():
        if name in extras:
            c = np.asarray(extras[name], np.float64)
            if c.shape == (len(pos),):
                return c[pos], what
    return None, f"the model ({model.method}) releases no item counts"


def popularity_order(counts, tiekey) -> np.ndarray:
    """Items by ``counts`` descending, ties by ``tiekey`` ascending (``int64`` dense indices).

    >>> popularity_order(np.array([3.0, 5.0, 3.0]), np.array([2, 0, 1])).tolist()
    [1, 2, 0]
    """
    return np.lexsort((np.asarray(tiekey), -np.asarray(counts, np.float64))).astype(np.int64)


class Ranking:
    """The item-side state of one ranking evaluation; :meth:`block` runs on a worker, :meth:`result` at the end.

    Parameters
    ----------
    model : Model
        In the store's item order (:meth:`streamdp.serving.model.Model.in_order_of`).
    tiekey : ndarray of int
        Each store item's position in the released model (the tie-break).
    train_counts : ndarray
        Exact training ratings per item (the non-private baseline and the popularity bias).
    private_counts : ndarray or None
        The model's released counts in store order (:func:`released_counts`).
    k : int
    threshold : float
    released : Model, optional
        The model as released (ascending ids), whose list scorer ranks the model's lists
        (default: ``model``, when it is in that order already).
    sample : ndarray or None
        The sorted dense positions of the users measured (:func:`ranking_sample`); ``None``: every user.
    """

    def __init__(self, model, tiekey, train_counts, private_counts, private_what: str, *, k: int, threshold: float,
                 threshold_source: str, released=None, sample=None):
        self.sample = sample
        self.model, self.k, self.threshold, self.threshold_source = model, check_k(k), float(threshold), \
            threshold_source
        released = model if released is None else released
        self.Q, bias = local_design(model)
        self.bias = list_bias(released, bias, tiekey)  # the list score's item term (streamdp.serving.local.list_offset)
        # items outside the model's catalogue (Model.padded_to) are never listed: last in every released order
        unlisted = getattr(model, "unlisted", None)
        if unlisted is not None and unlisted.any():
            self.bias[unlisted] = -1e30
            if private_counts is not None:
                private_counts = np.where(unlisted, -np.inf, private_counts)
        self.tiekey = np.ascontiguousarray(tiekey, np.int64)
        self.pop = np.ascontiguousarray(train_counts, np.float64)
        self.n_items = len(self.pop)
        self.sources = {"model": None}
        if private_counts is not None:
            self.sources["private_popularity"] = popularity_order(private_counts, self.tiekey)
        self.private_what = private_what
        self.scorer, self.personalised = list_scorer(released), personalised(released)
        self.prepared = topn_prepare(self.Q, self.bias, float(model.global_mean))  # the scoring's item side, once
        self.sources["popularity"] = popularity_order(self.pop, self.tiekey)
        #: ``model.json``'s ``lists`` when the lists are a lists part's (:mod:`streamdp.methods._lists`): said so
        self.lists_part = None

    @property
    def part_size(self) -> int:
        """Length of one block's partial (float64): sums and per-item list counts of every source."""
        return len(self.sources) * (len(SUMS) + self.n_items)

    def sampled(self, first: int, n_users: int) -> np.ndarray:
        """``uint8`` per user of the block starting at dense user ``first``: 1 for a user in the sample."""
        if self.sample is None:
            return np.ones(n_users, np.uint8)
        want = np.zeros(n_users, np.uint8)
        lo, hi = np.searchsorted(self.sample, [first, first + n_users])
        want[self.sample[lo:hi] - first] = 1
        return want

    def block(self, U, train, test) -> np.ndarray:
        """The partial of one user block: ``U`` solved from ``train`` (:func:`streamdp.serving.local.solve_block`)."""
        n_users = len(train.indptr) - 1
        rel = test.ratings >= self.threshold
        users = np.repeat(np.arange(n_users), np.diff(test.indptr))
        sampled = self.sampled(int(getattr(train, "first_user", 0)), n_users)
        want = ((np.bincount(users[rel], minlength=n_users) > 0) & (sampled > 0)).astype(np.uint8)
        out = np.zeros(self.part_size)
        lists = np.empty((n_users, self.k), np.int32)
        ip, it = np.asarray(train.indptr, np.int64), np.asarray(train.items, np.int32)
        t_ip, t_it = np.asarray(test.indptr, np.int64), np.asarray(test.items, np.int32)
        t_r = np.asarray(test.ratings, np.float64)
        step = len(SUMS) + self.n_items
        for s, (name, order) in enumerate(self.sources.items()):
            if order is None:
                scores = np.empty((n_users, self.k))
                topn_blocked(ip, it, want, np.ascontiguousarray(U, np.float64), self.Q, self.bias,
                             float(self.model.global_mean), self.tiekey, lists, scores, prepared=self.prepared)
            else:
                topn_by_order(ip, it, want, order, lists)
            part = out[s * step:(s + 1) * step]
            ranking_sums(lists, t_ip, t_it, t_r, self.threshold, self.pop, sampled, part[:len(SUMS)],
                         part[len(SUMS):])
        return out

    def result(self, total) -> dict:
        """The metrics of every source from the summed partials."""
        step = len(SUMS) + self.n_items
        mean_pop = float(self.pop.mean()) if self.n_items else 0.0
        per = {}
        population = float(total[SUMS.index("relevant_users")])
        for s, name in enumerate(self.sources):
            part = total[s * step:(s + 1) * step]
            n = max(part[0], 1.0)
            per[name] = {"precision": part[1] / n, "recall": part[2] / n, "ndcg": part[3] / n, "map": part[4] / n,
                         "coverage": float(np.count_nonzero(part[len(SUMS):])) / max(self.n_items, 1),
                         "popularity_bias": (part[5] / n) / mean_pop if mean_pop > 0 else 0.0,
                         "standard_error": {m: standard_error(part[1 + i], part[6 + i], part[0], population,
                                                              self.sample is not None)
                                            for i, m in enumerate(SAMPLED_METRICS)}}
        out = {"k": self.k, "relevant_threshold": self.threshold, "threshold_source": self.threshold_source,
               "n_users": int(total[0]), "n_users_evaluable": int(population), "sampled": self.sample is not None,
               "users_drawn": None if self.sample is None else int(len(self.sample)),
               "sample_seed": None if self.sample is None else SAMPLE_SEED,
               "candidates": "items the user did not rate in training",
               "list_scorer": self.scorer, "personalised": self.personalised, **per.pop("model")}
        if self.lists_part is not None:
            out["lists_part"] = {k: self.lists_part[k] for k in ("method", "epsilon", "share", "why")}
        b = {}
        if "private_popularity" in per:
            b["private_popularity"] = {**per["private_popularity"], "guarantee": "post-processing",
                                       "what": "most popular unseen items by " + self.private_what}
        b["popularity"] = {**per["popularity"], "guarantee": "non-private",
                           "what": "most popular unseen items by the exact training counts"}
        out["baselines"] = b
        if "private_popularity" not in b:
            out["private_popularity_absent"] = self.private_what
        return out


def standard_error(total: float, squares: float, n: float, population: float, sampled: bool) -> float:
    """The standard error of a mean of ``n`` sampled values (their sum and sum of squares) from ``population``.

    ``sqrt(var / n * (1 - n / population))`` with the unbiased sample variance; 0 when
    nothing was sampled (every user measured: the mean is exact) or fewer than 2 values.

    >>> round(standard_error(2.0, 2.0, 4, 1e12, True), 6)  # values 1, 1, 0, 0: var 1/3
    0.288675
    >>> standard_error(2.0, 2.0, 4, 4, True)
    0.0
    """
    if not sampled or n < 2 or population <= 0:
        return 0.0
    var = max(squares - total * total / n, 0.0) / (n - 1)
    return float(np.sqrt(var / n * max(1.0 - n / population, 0.0)))


def setup(model, store, train_counts, *, k: int = DEFAULT_K, relevant_threshold: float | None = None,
          ranking_users: int | None = DEFAULT_RANKING_USERS) -> Ranking:
    """A :class:`Ranking` of ``model`` (as loaded: ascending item ids) on ``store``'s items.

    ``ranking_users``: how many users to draw (:func:`ranking_sample`); ``None``: every user.
    """
    ids = store.item_ids()
    pos = find(model.item_ids, ids) if np.asarray(model.item_ids).dtype == ids.dtype else np.full(len(ids), -1)
    if (pos < 0).any():
        raise InputError(f"{model.path}: the store's items are not the model's items")
    lo, hi = float(store.rating_min), float(store.rating_max)
    if relevant_threshold is None and getattr(store, "implicit", False):
        thr, src = 0.0, IMPLICIT_RELEVANT
    elif relevant_threshold is None:
        thr, src = default_threshold(lo, hi), f"default: the top {TOP_SHARE:.0%} of the rating range [{lo:g}, {hi:g}]"
    else:
        thr = float(relevant_threshold)
        if not np.isfinite(thr):
            raise ParameterError(f"--relevant-threshold must be a finite number, got {relevant_threshold}")
        src = "--relevant-threshold"
    counts, what = released_counts(model, pos)
    sample = ranking_sample(store.n_users, ranking_users)
    return Ranking(model.in_order_of(ids), pos, train_counts, counts, what, k=k, threshold=thr, threshold_source=src,
                   released=model, sample=sample)


def ranking_verdict(r: dict) -> dict:
    """Whether the model's lists beat the most-popular chart, and by how much (Recall@k ratio and difference).

    The bar is the chart by the counts the model released (``private_popularity``:
    what anybody holding the model can show without it); for a model that released no
    counts, the chart by the exact training counts (non-private), said in ``baseline``.
    ``ratio`` is the model's Recall@k over the chart's (``None`` when the chart's is 0),
    ``difference`` the model's minus the chart's.

    >>> v = ranking_verdict({"k": 10, "recall": 0.2, "ndcg": 0.1,
    ...                      "baselines": {"private_popularity": {"recall": 0.16, "ndcg": 0.09}}})
    >>> v["better"], round(v["ratio"], 2), round(v["difference"], 2)
    (True, 1.25, 0.04)
    """
    b = r.get("baselines", {})
    name = "private_popularity" if "private_popularity" in b else "popularity"
    base = b[name]
    rec, brec = float(r["recall"]), float(base["recall"])
    ratio = rec / brec if brec > 0 else None  # undefined against a chart that finds nothing
    return {"better": rec > brec, "equal": rec == brec, "baseline": name, "k": int(r["k"]), "recall": rec,
            "baseline_recall": brec, "ratio": ratio, "difference": rec - brec,
            "ndcg": float(r["ndcg"]), "baseline_ndcg": float(base["ndcg"])}


def format_ranking_verdict(v: dict) -> str:
    """One plain sentence: do the lists beat the most-popular chart, by what ratio and difference of Recall@k.

    >>> format_ranking_verdict(ranking_verdict({"k": 10, "recall": 0.2, "ndcg": 0.1,
    ...     "baselines": {"private_popularity": {"recall": 0.16, "ndcg": 0.09}}}))
    'the lists BEAT the most-popular chart by the released counts: Recall@10 0.2000 vs 0.1600 (1.25x, +0.0400)'
    """
    chart = ("the most-popular chart by the released counts" if v["baseline"] == "private_popularity" else
             "the most-popular chart by the exact counts (non-private; the model released no counts)")
    k = v["k"]
    ratio = "" if v["ratio"] is None else f"{v['ratio']:.2f}x, "
    fig = f"Recall@{k} {v['recall']:.4f} vs {v['baseline_recall']:.4f} ({ratio}{v['difference']:+.4f})"
    if v["better"]:
        return f"the lists BEAT {chart}: {fig}"
    if v["equal"]:
        return f"the lists only MATCH {chart}: {fig}"
    return f"the lists do NOT beat {chart}: {fig}; showing that chart would serve users better"


def relevant_text(r: dict, *, short: bool = False) -> str:
    """What made a held-out item relevant, for the output lines.

    >>> relevant_text({"relevant_threshold": 0.0, "threshold_source": IMPLICIT_RELEVANT}, short=True)
    'every held-out interaction'
    >>> relevant_text({"relevant_threshold": 4.2, "threshold_source": "--relevant-threshold"}, short=True)
    'held-out >= 4.2'
    """
    if r["threshold_source"] == IMPLICIT_RELEVANT:
        return "every held-out interaction" if short else "a held-out interaction (implicit store: each is relevant)"
    if short:
        return f"held-out >= {r['relevant_threshold']:g}"
    return f"a held-out rating >= {r['relevant_threshold']:g} ({r['threshold_source']})"


def format_ranking(r: dict, *, lists_only: bool = False) -> str:
    """The lines ``evaluate`` prints: the model's metrics, then each baseline's on the same users.

    ``lists_only``: the model's scores only rank items (an ``ials`` model), they are no predicted ratings.
    """
    def row(d):
        return (f"P@{k} {d['precision']:.4f}  R@{k} {d['recall']:.4f}  NDCG@{k} {d['ndcg']:.4f}  "
                f"MAP@{k} {d['map']:.4f}  coverage {d['coverage']:.1%}  popularity bias {d['popularity_bias']:.2f}")

    k = r["k"]
    lines = [f"ranking @{k} over {users_text(r)} with {relevant_text(r)}; candidates: unrated items",
             "  model:                     " + row(r)]
    b = r.get("baselines", {})
    if "private_popularity" in b:
        lines.append("  most popular (released):   " + row(b["private_popularity"]))
    else:
        lines.append(f"  most popular (released):   n/a: {r.get('private_popularity_absent', '')}")
    if "popularity" in b:
        lines.append("  most popular (non-private): " + row(b["popularity"]))
    part = r.get("lists_part")
    if part is not None:  # a rating model's lists part (streamdp.methods._lists)
        scorer = (f"the {part['method']} part trained in the same release (its preference score; epsilon "
                  f"{part['epsilon']:.4g} of it alone): {part['why']}")
    else:
        scorer = "the model's preference score" if lists_only else describe_scorer(r.get("list_scorer"))
    lines.append(f"  lists ranked by {scorer}")
    if r.get("personalised") is False:
        lines.append("  note: " + not_personalised_note(chart=lists_only or part is not None))
    lines.append("ranking verdict: " + format_ranking_verdict(ranking_verdict(r)))
    return "\n".join(lines)


def users_text(r: dict) -> str:
    """Which users the metrics cover, and the sampling error of Recall@k when they are a sample.

    >>> users_text({"n_users": 50, "n_users_evaluable": 50, "sampled": False})
    'all 50 users'
    >>> users_text({"k": 10, "n_users": 40, "n_users_evaluable": 900, "sampled": True, "users_drawn": 60,
    ...             "standard_error": {"recall": 0.0123}})
    '40 of 900 users (a seeded sample of 60 users; standard error of Recall@10 0.0123)'
    """
    if not r.get("sampled"):
        return f"all {r['n_users']:,} users"
    return (f"{r['n_users']:,} of {r['n_users_evaluable']:,} users (a seeded sample of {r['users_drawn']:,} users; "
            f"standard error of Recall@{r['k']} {r['standard_error']['recall']:.4f})")


def describe_scorer(sc) -> str:
    """``predicted rating``, or the predicted rating plus a bonus for items popular by the released counts.

    >>> describe_scorer({"kind": "rating_plus_log_count", "counts": "noisy_item_weight", "weight": 1.0})
    'predicted rating plus a bonus for items popular by the released counts (predicted rating + 1 x log(1 + released noisy_item_weight))'
    """
    sc = sc or {"kind": "predicted_rating"}
    if sc["kind"] == "predicted_rating":
        return "predicted rating"
    text = (f"predicted rating plus a bonus for items popular by the released counts (predicted rating + "
            f"{sc['weight']:g} x log(1 + released {sc['counts']}))")
    if sc.get("chart_first"):
        text += f", after the {sc['chart_first']} items of the private top-K chart"
    return text


def format_ranking_short(r: dict) -> str:
    """One line for ``train``: ``Recall@10 0.0812  NDCG@10 0.0931 (most popular, non-private: 0.0700 / 0.0800)``."""
    k = r["k"]
    b = r.get("baselines", {})
    text = f"Recall@{k} {r['recall']:.4f}  NDCG@{k} {r['ndcg']:.4f}  (relevant: {relevant_text(r, short=True)}"
    if r.get("sampled"):
        text += f"; {r['n_users']:,} sampled users, standard error {r['standard_error']['recall']:.4f}"
    text += ")"
    extra = []
    if "private_popularity" in b:
        p = b["private_popularity"]
        extra.append(f"most popular by released counts {p['recall']:.4f} / {p['ndcg']:.4f}")
    if "popularity" in b:
        p = b["popularity"]
        extra.append(f"most popular, non-private {p['recall']:.4f} / {p['ndcg']:.4f}")
    return text + ("; " + ", ".join(extra) if extra else "")
