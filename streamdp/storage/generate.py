"""``streamdp generate``: synthetic low-rank, power-law rating stores of any size.

The model (every parameter an option of :func:`generate_store`):

* **ground truth**: item factors and biases, a user factor drawn when its block is
  written (never stored); a rating is ``global_mean + b_i + u . v_i + N(0, noise^2)``,
  rounded to ``rating_step`` and clipped to the scale; ``truth/item_factors`` and
  ``truth/item_bias`` are saved in the store. ``factors="uniform"`` draws an exact
  rank-``rank`` truth inside the scale instead (with ``rank=1``, Jain, Thakkar &
  Thakurta's synthetic set, ICML 2018 Sec. 4);
* **item popularity** is a Zipf power law (``item_exponent``, default 0.9); **user
  activity** a Pareto tail (``user_exponent``, default 2.0) of mean ``ratings_per_user``;
* **what real sets add**, all off by default so existing seeds give the same stores:
  ``user_bias_std``, ``activity_bias``, ``interaction_scale``, ``outlier_fraction``,
  ``string_ids``;
* **tastes that cluster** (``taste_clusters``, off by default): users belong to clusters
  whose affinity steers which items they rate (:data:`TASTE_COHESION`), so a personalized
  model can beat the popularity chart; ``truth/taste_centers`` holds the centers;
* **interaction logs** (``implicit``): the same choice of items written as an implicit
  store of counts ``1 + Poisson(exp(z))``, capped at ``count_cap`` if given.

Nothing is materialized: blocks are generated in parallel threads, each from its own
seed, and written in order, so memory is a few blocks whatever the size. The store's
item numbering is the drawing order (the expected popularity order); ``item_counts``
records the realized counts.

Design notes (every distribution and its parameters, the measured shares):
docs/design-notes.md#streamdpstoragegeneratepy.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from streamdp.errors import ParameterError
from streamdp.kernels.csr import alias_table, synth_block
from streamdp.progress import progress
from streamdp.storage.schema import TARGET_BLOCK_RATINGS, default_block_users
from streamdp.storage.split import block_seed, check_fraction, split_block
from streamdp.storage.store import RatingStore, open_store
from streamdp.storage.timegen import NEW_ITEM_SHARE, START, block_times, time_truth
from streamdp.storage.writer import StoreWriter, block_digest, check_destination

_PURPOSE_COUNTS, _PURPOSE_RATINGS, _PURPOSE_SPLIT, _PURPOSE_REAL, _PURPOSE_TASTE, _PURPOSE_IMPLICIT = 1, 2, 3, 4, 5, 6
#: The share of a clustered user's factor variance that is her cluster's center (the rest is her own).
TASTE_COHESION = 0.7


def _tilts(V, centers, strength: float) -> np.ndarray:
    """Each cluster's affinity ``exp(strength * a)`` for each item, ``a`` its standardised ``center . v_i``: (n, k)."""
    a = V @ centers.T
    return np.exp(strength * (a - a.mean(axis=0)) / np.maximum(a.std(axis=0), 1e-12))


def _taste_tables(seed, V, bias, w, k: int, strength: float, uniform: bool, keep_marginal: bool = False,
                  pair_exponent: float | None = None):
    """The taste clusters' centers and item tables (module docstring), with the items renumbered by their
    marginal drawing probability: ``(V, bias, prob (k, n), alias (k, n), centers)``. ``keep_marginal`` (given
    ``item_weights``): each item's weight is divided so that the marginal over clusters stays proportional to ``w``
    (the tilts reshuffle popularity otherwise; a rehearsal's weights are the released popularity). ``pair_exponent``
    (with it, factors of the generator's own draw): the rows of ``V`` go to the items as in a store of the power law
    of that exponent, the k-th most popular there to the k-th largest ``w``, so that popularity and tastes go
    together as in the generator's own stores (an item is popular partly because clusters favour it)."""
    n, rank = V.shape
    rng = np.random.default_rng(np.random.SeedSequence(entropy=0 if seed is None else seed,
                                                       spawn_key=(_PURPOSE_TASTE,)))
    if uniform:
        centers = rng.uniform(-1.0, 1.0, (k, rank)) / np.sqrt(rank)
    else:
        centers = rng.standard_normal((k, rank)) / np.sqrt(np.sqrt(rank))
    if keep_marginal and pair_exponent is not None:
        Wb = np.arange(1, n + 1, dtype=np.float64)[:, None] ** -float(pair_exponent) * _tilts(V, centers, strength)
        V = V.copy()
        V[np.argsort(-w, kind="stable")] = V[np.argsort(-(Wb / Wb.sum(axis=0)).mean(axis=1), kind="stable")]
    W = (w[:, None] * _tilts(V, centers, strength)).T  # (k, n)
    if keep_marginal:  # multiplicative steps on a common per-item factor: the marginal back to w's shares
        target = w / w.sum()
        for _ in range(200):
            m = (W / W.sum(axis=1, keepdims=True)).mean(axis=0)
            step = np.divide(target, m, out=np.ones_like(m), where=m > 0)
            W = W * step[None, :]
            if np.abs(step - 1.0).max() < 1e-9:
                break
    marginal = (W / W.sum(axis=1, keepdims=True)).mean(axis=0)
    order = np.argsort(-marginal, kind="stable")
    W = np.ascontiguousarray(W[:, order])
    prob, alias = np.empty((k, n), np.float64), np.empty((k, n), np.int64)
    for c in range(k):
        alias_table(W[c], prob[c], alias[c])
    return np.ascontiguousarray(V[order]), bias[order], prob, alias, centers


def _counts(z: np.ndarray, seed: int, cap: float | None) -> np.ndarray:
    """Interaction counts ``1 + Poisson(exp(z))`` of latent preferences ``z`` (capped at ``cap``)."""
    c = 1.0 + np.random.default_rng(seed).poisson(np.exp(np.minimum(z.astype(np.float64), 8.0)))
    return (np.minimum(c, cap) if cap is not None else c).astype(np.float32)


def _realistic(rt, counts, seed, user_bias_std, outlier_fraction, lo, hi, step, activity_bias=0.0,
               mean_count=1.0) -> np.ndarray:
    """User offsets and outliers on one block's ratings (vectorised; see the module docstring)."""
    rng = np.random.default_rng(seed)
    r = rt.astype(np.float64)
    if user_bias_std > 0 or activity_bias != 0:
        offset = rng.normal(0.0, user_bias_std, len(counts)) if user_bias_std > 0 else np.zeros(len(counts))
        if activity_bias != 0:
            offset = offset + activity_bias * np.log(np.maximum(counts, 1) / mean_count)
        r = r + np.repeat(offset, counts)
        if step > 0:
            r = lo + np.rint((r - lo) / step) * step
    if outlier_fraction > 0:
        out = rng.random(len(r)) < outlier_fraction
        r[out] = np.where(rng.random(int(out.sum())) < 0.5, lo, hi)
    return np.clip(r, lo, hi).astype(np.float32)


def _user_counts(n: int, mean: float, exponent: float, n_items: int, seed: int | None, b: int) -> np.ndarray:
    rng = np.random.default_rng(np.random.SeedSequence(entropy=0 if seed is None else seed,
                                                       spawn_key=(_PURPOSE_COUNTS, b)))
    a = exponent
    x = (1.0 + rng.pareto(a, size=n)) * (mean * (a - 1.0) / a)
    return np.clip(np.rint(x), 1, n_items).astype(np.int64)


def _given_items(weights, bias, n_items: int, factors: str):
    """``item_weights`` / ``item_bias`` checked (:func:`generate_store`): float64 arrays or ``None``."""
    out = []
    for flag, v in (("item_weights", weights), ("item_bias", bias)):
        if v is None:
            out.append(None)
            continue
        a = np.asarray(v, np.float64)
        if a.shape != (n_items,) or not np.all(np.isfinite(a)):
            raise ParameterError(f"{flag}: expected {n_items:,} finite numbers (one per item), got shape {a.shape}")
        out.append(a)
    if out[0] is not None and not (np.all(out[0] >= 0) and out[0].sum() > 0):
        raise ParameterError("item_weights: expected numbers >= 0, not all 0")
    if out[1] is not None and factors == "uniform":
        raise ParameterError("item_bias: --factors uniform draws a truth without biases")
    return out[0], out[1]


def generate_store(
    out: str,
    *,
    n_users: int,
    n_items: int,
    ratings_per_user: float = 50.0,
    rank: int = 8,
    noise: float = 0.5,
    seed: int | None = 0,
    test_fraction: float = 0.0,
    item_exponent: float = 0.9,
    user_exponent: float = 2.0,
    global_mean: float = 3.6,
    item_bias_std: float = 0.3,
    factors: str = "gaussian",
    rating_min: float = 1.0,
    rating_max: float = 5.0,
    rating_step: float = 1.0,
    user_bias_std: float = 0.0,
    activity_bias: float = 0.0,
    interaction_scale: float = 1.0,
    outlier_fraction: float = 0.0,
    string_ids: bool = False,
    block_users: int | None = None,
    workers: int | None = None,
    force: bool = False,
    show_progress: bool | None = None,
    taste_clusters: int = 0,
    taste_strength: float = 2.0,
    implicit: bool = False,
    count_cap: float | None = None,
    item_weights=None,
    item_bias=None,
    item_factors=None,
    like: dict | None = None,
    timestamps: float | None = None,
    taste_drift: float = 0.0,
) -> RatingStore:
    """Write a synthetic store to ``out`` and return it opened.

    ``taste_clusters``/``taste_strength`` (clustered tastes) and ``implicit``/``count_cap``
    (an interaction log) are described in the module docstring; with their defaults the
    store is the one earlier versions wrote, bit for bit. ``like``: a record of the store this one
    rehearses and where its shape came from (:mod:`streamdp.workflows.rehearse`), kept in ``params.like``.
    ``timestamps`` (days) and ``taste_drift``: a time order for every rating (:mod:`streamdp.storage.timegen`).

    ``item_weights`` (``n_items`` numbers >= 0, not all 0): each item's drawing weight, in place of the power law
    ``(i + 1) ** -item_exponent``; the items are numbered by descending weight (stable), as the store requires, and
    ``item_bias`` (``n_items`` finite numbers, in the order of ``item_weights`` when both are given) goes with them,
    in place of the ``N(0, item_bias_std^2)`` draw (drawn all the same, so the item factors stay those of ``seed``).
    Both are saved in ``truth/`` and recorded as ``given`` in ``params``; a rehearsal shapes the item side with them
    from a model's released item counts and biases. ``item_factors`` (``(n_items, rank)`` finite numbers, in the same
    order): the truth's item factors at ``interaction_scale`` 1, multiplied by it, in place of the Gaussian draw (a
    rehearsal gives a released model's factors, scaled so that ``u . v`` has unit variance per rating).

    Deterministic for a given ``seed`` (whatever ``workers``). A full, over-quota or
    read-only file system is a :class:`~streamdp.errors.StoreError` naming ``out``, with
    nothing left behind: every write goes through :class:`StoreWriter`, which removes
    its temporary directory (and first those of dead runs beside ``out``).
    """
    item_weights, item_bias, item_factors, test_fraction = _check_options(
        n_users=n_users, n_items=n_items, rank=rank, ratings_per_user=ratings_per_user, noise=noise,
        user_exponent=user_exponent, rating_min=rating_min, rating_max=rating_max, user_bias_std=user_bias_std,
        interaction_scale=interaction_scale, outlier_fraction=outlier_fraction, factors=factors,
        taste_clusters=taste_clusters, taste_strength=taste_strength, implicit=implicit, count_cap=count_cap,
        activity_bias=activity_bias, item_weights=item_weights, item_bias=item_bias, item_factors=item_factors,
        test_fraction=test_fraction)
    check_destination(out, force)
    V, bias, w, prob, alias, centers, global_mean, item_bias_std = _truth(
        seed, n_items, rank, factors=factors, rating_min=rating_min, rating_max=rating_max, global_mean=global_mean,
        item_bias_std=item_bias_std, interaction_scale=interaction_scale, item_exponent=item_exponent,
        item_weights=item_weights, item_bias=item_bias, item_factors=item_factors, taste_clusters=taste_clusters,
        taste_strength=taste_strength)
    k_taste = int(taste_clusters)
    times = time_truth(seed, n_items, timestamps, taste_drift)
    expected_total = n_users * min(ratings_per_user, n_items)
    bu = block_users or default_block_users(n_users, int(expected_total), TARGET_BLOCK_RATINGS)
    splits = ("train", "test") if test_fraction > 0 else ("train",)
    workers = workers or min(2, os.cpu_count() or 1)

    def make(b: int):
        return _make_block(b, bu=bu, n_users=n_users, n_items=n_items, ratings_per_user=ratings_per_user,
                           user_exponent=user_exponent, seed=seed, k_taste=k_taste, prob=prob, alias=alias, V=V,
                           bias=bias, rank=rank, noise=noise, factors=factors, centers=centers, implicit=implicit,
                           count_cap=count_cap, global_mean=global_mean, rating_min=rating_min,
                           rating_max=rating_max, rating_step=rating_step, user_bias_std=user_bias_std,
                           outlier_fraction=outlier_fraction, activity_bias=activity_bias,
                           test_fraction=test_fraction, times=times)

    t0 = time.perf_counter()
    with StoreWriter(out, n_users=n_users, n_items=n_items, block_users=bu, splits=splits, force=force,
                     times=times is not None) as w_:
        item_counts, seen = _write_blocks(w_, make, n_users=n_users, n_items=n_items, bu=bu, workers=workers,
                                          string_ids=string_ids, show_progress=show_progress)
        item_ids = np.arange(n_items, dtype=np.int64)
        w_.write_array("item_ids", np.char.add("B", np.char.zfill(item_ids.astype(str), 8)) if string_ids else item_ids)
        w_.write_array("item_counts", item_counts)
        w_.write_array("truth/item_factors", V.astype(np.float32), chunks=(min(n_items, 1 << 16), rank))
        w_.write_array("truth/item_bias", bias.astype(np.float32))
        if item_weights is not None:
            w_.write_array("truth/item_weight", w)
        if times is not None:  # when each item appeared (seconds since the epoch)
            w_.write_array("truth/item_appears", START + np.floor(times.appears).astype(np.int64))
        if k_taste:
            w_.write_array("truth/taste_centers", centers.astype(np.float32), chunks=(k_taste, rank))
        params = dict(n_users=n_users, n_items=n_items, ratings_per_user=ratings_per_user, rank=rank, noise=noise,
                      seed=seed, test_fraction=test_fraction, item_exponent=item_exponent,
                      user_exponent=user_exponent, global_mean=global_mean, item_bias_std=item_bias_std,
                      rating_step=rating_step, factors=factors, user_bias_std=user_bias_std,
                      **({"activity_bias": activity_bias} if activity_bias else {}),
                      outlier_fraction=outlier_fraction, string_ids=string_ids, interaction_scale=interaction_scale)
        if times is not None:  # recorded only when used: a default store's attributes are those of earlier versions
            params.update(timestamps=float(timestamps), taste_drift=float(taste_drift), time_start=START,
                          new_item_share=NEW_ITEM_SHARE)
        w_.finalize(_attrs(params, seen, t0, k_taste=k_taste, taste_strength=taste_strength,
                           given=dict(item_weights=item_weights, item_bias=item_bias, item_factors=item_factors),
                           like=like, implicit=implicit, count_cap=count_cap, rating_min=rating_min,
                           rating_max=rating_max))
    return open_store(out)


def _check_options(*, n_users, n_items, rank, ratings_per_user, noise, user_exponent, rating_min, rating_max,
                   user_bias_std, interaction_scale, outlier_fraction, factors, taste_clusters, taste_strength,
                   implicit, count_cap, activity_bias, item_weights, item_bias, item_factors, test_fraction):
    """:func:`generate_store`'s parameters checked (:class:`ParameterError`): ``(item_weights, item_bias,
    item_factors, test_fraction)`` as arrays (``None`` when not given) and a checked fraction."""
    for name, v in (("--users", n_users), ("--items", n_items), ("--rank", rank)):
        if int(v) < 1:
            raise ParameterError(f"{name} must be >= 1, got {v}")
    if not ratings_per_user >= 1:
        raise ParameterError(f"--ratings-per-user must be >= 1, got {ratings_per_user}")
    if not noise >= 0:
        raise ParameterError(f"--noise must be >= 0, got {noise}")
    if not user_exponent > 1:
        raise ParameterError(f"--user-exponent must be > 1 (finite mean), got {user_exponent}")
    if not rating_max > rating_min:
        raise ParameterError(f"rating range must have max > min, got [{rating_min}, {rating_max}]")
    if not user_bias_std >= 0:
        raise ParameterError(f"--user-bias-std must be >= 0, got {user_bias_std}")
    if not interaction_scale > 0:
        raise ParameterError(f"--interaction-scale must be > 0, got {interaction_scale}")
    if not 0 <= outlier_fraction < 1:
        raise ParameterError(f"--outlier-fraction must be in [0, 1), got {outlier_fraction}")
    if factors not in ("gaussian", "uniform"):
        raise ParameterError(f"--factors: expected gaussian or uniform, got {factors!r}")
    if isinstance(taste_clusters, bool) or int(taste_clusters) != taste_clusters or taste_clusters < 0:
        raise ParameterError(f"--taste-clusters must be an integer >= 0, got {taste_clusters}")
    if not (np.isfinite(taste_strength) and taste_strength >= 0):
        raise ParameterError(f"--taste-strength must be a finite number >= 0, got {taste_strength}")
    if count_cap is not None and not implicit:
        raise ParameterError("--count-cap: only with --implicit")
    if implicit:
        if count_cap is not None and not (np.isfinite(count_cap) and count_cap >= 1):
            raise ParameterError(f"--count-cap must be a finite number >= 1, got {count_cap}")
        if user_bias_std > 0 or outlier_fraction > 0 or activity_bias != 0:
            raise ParameterError("--implicit writes counts: --user-bias-std, --activity-bias and --outlier-fraction "
                                 "are for ratings")
    item_weights, item_bias = _given_items(item_weights, item_bias, int(n_items), factors)
    if item_factors is not None:
        item_factors = np.asarray(item_factors, np.float64)
        if item_factors.shape != (int(n_items), int(rank)) or not np.all(np.isfinite(item_factors)):
            raise ParameterError(f"item_factors: expected {int(n_items):,} x {int(rank)} finite numbers (items x "
                                 f"rank), got shape {item_factors.shape}")
        if factors == "uniform":
            raise ParameterError("item_factors: --factors uniform draws its own truth")
    return item_weights, item_bias, item_factors, check_fraction(test_fraction)


def _truth(seed, n_items, rank, *, factors, rating_min, rating_max, global_mean, item_bias_std, interaction_scale,
           item_exponent, item_weights, item_bias, item_factors, taste_clusters, taste_strength):
    """The ground truth of the items, drawn from ``seed``: ``(V, bias, w, prob, alias, centers, global_mean,
    item_bias_std)``, the item factors and biases (items by descending weight ``w``), the alias tables of each taste
    cluster (one row without clusters), the clusters' centres, and the global mean and item-bias std the store
    records (``--factors uniform`` sets its own)."""
    rng = np.random.default_rng(np.random.SeedSequence(entropy=0 if seed is None else seed))
    if factors == "uniform":
        half = (rating_max - rating_min) / 2.0
        global_mean, item_bias_std = (rating_min + rating_max) / 2.0, 0.0
        V = rng.uniform(-1.0, 1.0, (n_items, rank)) * (half / np.sqrt(rank))
        bias = np.zeros(n_items)
    else:
        scale = float(interaction_scale) / np.sqrt(np.sqrt(rank))
        V = (rng.standard_normal((n_items, rank)) * scale).astype(np.float64)
        bias = rng.standard_normal(n_items) * item_bias_std
    if item_bias is not None:
        bias = item_bias
    if item_factors is not None:
        V = item_factors * float(interaction_scale)
    if item_weights is not None:
        order = np.argsort(-item_weights, kind="stable")
        w, bias = item_weights[order], bias[order] if item_bias is not None else bias
        V = V[order] if item_factors is not None else V
    else:
        w = (np.arange(1, n_items + 1, dtype=np.float64)) ** (-float(item_exponent))
    prob = np.empty(n_items, np.float64)
    alias = np.empty(n_items, np.int64)
    alias_table(w, prob, alias)
    k_taste = int(taste_clusters)
    if k_taste:
        V, bias, prob, alias, centers = _taste_tables(seed, V, bias, w, k_taste, float(taste_strength),
                                                      factors == "uniform", keep_marginal=item_weights is not None,
                                                      pair_exponent=item_exponent if item_factors is None else None)
    else:
        prob, alias, centers = prob[None, :], alias[None, :], np.zeros((1, rank))
    return V, bias, w, prob, alias, centers, global_mean, item_bias_std


def _make_block(b: int, *, bu, n_users, n_items, ratings_per_user, user_exponent, seed, k_taste, prob, alias, V,
                bias, rank, noise, factors, centers, implicit, count_cap, global_mean, rating_min, rating_max,
                rating_step, user_bias_std, outlier_fraction, activity_bias, test_fraction, times=None):
    """Block ``b``'s ratings, drawn from its own seeds (so any worker may draw it): ``(train, train_digest, test,
    test_digest, item_counts, (min, max) or None)``, ``test`` ``None`` without a test split."""
    if implicit:  # the latent preference z, unrounded and unclipped, becomes a count
        gm_, lo_, hi_, step_ = 0.0, -np.inf, np.inf, 0.0
    else:
        gm_, lo_, hi_, step_ = float(global_mean), float(rating_min), float(rating_max), float(rating_step)
    first = b * bu
    n = min(bu, n_users - first)
    counts = _user_counts(n, ratings_per_user, user_exponent, n_items, seed, b)
    total = int(counts.sum())
    ip = np.empty(n + 1, np.int64)
    it = np.empty(total, np.int32)
    rt = np.empty(total, np.float32)
    cl = (np.random.default_rng(block_seed(seed, b, _PURPOSE_TASTE)).integers(0, k_taste, n).astype(np.int32)
          if k_taste else np.empty(0, np.int32))
    got = synth_block(block_seed(seed, b, _PURPOSE_RATINGS), counts, prob, alias, V, bias, gm_,
                      int(rank), float(noise), lo_, hi_, step_, factors == "uniform", ip, it, rt,
                      cl, centers, TASTE_COHESION)
    it, rt = it[:got], rt[:got]
    if implicit:
        rt = _counts(rt, block_seed(seed, b, _PURPOSE_IMPLICIT), count_cap)
    if user_bias_std > 0 or outlier_fraction > 0 or activity_bias != 0:
        rt = _realistic(rt, np.diff(ip), block_seed(seed, b, _PURPOSE_REAL), user_bias_std, outlier_fraction,
                        float(rating_min), float(rating_max), float(rating_step), float(activity_bias),
                        float(ratings_per_user))
    ts = None
    if times is not None:  # each rating's time, and its drift (storage/timegen.py)
        ts, rt = block_times(times, seed, b, first, n_users, ip, it, rt, lo=float(rating_min), hi=float(rating_max),
                             step=float(rating_step), implicit=implicit)
    if test_fraction > 0:
        train, test = split_block(ip, it, rt, test_fraction, block_seed(seed, b, _PURPOSE_SPLIT), times=ts)
    else:
        train, test = (ip, it, rt) + (() if ts is None else (ts,)), None
    # digests and item counts in the worker thread, off the writing thread
    train_d = block_digest(b, *train[:3])
    test_d = block_digest(b, *test[:3]) if test is not None else None
    counts_b = np.bincount(it, minlength=n_items)
    return train, train_d, test, test_d, counts_b, (float(rt.min()), float(rt.max())) if len(rt) else None


def _write_blocks(w_, make, *, n_users, n_items, bu, workers, string_ids, show_progress):
    """Draw the blocks with ``make`` on ``workers`` threads and write them in order with ``w_``, with the users' ids
    and counts: ``(item_counts, [min, max])``, each item's number of ratings and the observed range."""
    item_counts = np.zeros(n_items, np.int64)
    seen = [np.inf, -np.inf]  # the observed range of an implicit store's counts
    n_blocks = w_.n_blocks
    # per-user arrays are written block by block (chunks = blocks): nothing O(n_users) in memory
    uid = w_.create_array("user_ids", shape=(n_users,), dtype=str if string_ids else "int64", chunks=(bu,))
    ucnt = w_.create_array("user_counts", shape=(n_users,), dtype="int64", chunks=(bu,))
    with ThreadPoolExecutor(max_workers=workers) as ex, \
            progress(total=n_blocks, desc="generate", unit="block", show=show_progress) as bar:
        # bounded look-ahead keeps memory at ~2 * workers blocks
        pending = {}
        next_submit = 0
        for b in range(n_blocks):
            while next_submit < n_blocks and next_submit < b + 2 * workers:
                pending[next_submit] = ex.submit(make, next_submit)
                next_submit += 1
            train, train_d, test, test_d, counts_b, rng_b = pending.pop(b).result()
            if rng_b is not None:
                seen[0], seen[1] = min(seen[0], rng_b[0]), max(seen[1], rng_b[1])
            w_.write_block(b, *train[:3], split="train", digest=train_d, times=train[3] if len(train) > 3 else None)
            uc = np.diff(train[0])
            item_counts += counts_b
            if test is not None:
                w_.write_block(b, *test[:3], split="test", digest=test_d, times=test[3] if len(test) > 3 else None)
                uc = uc + np.diff(test[0])
            first = b * bu
            ids = np.arange(first, first + len(uc), dtype=np.int64)
            uid[first:first + len(uc)] = np.char.add("u", np.char.zfill(ids.astype(str), 8)) if string_ids else ids
            ucnt[first:first + len(uc)] = uc
            bar.update(1)
    return item_counts, seen


def _attrs(params, seen, t0, *, k_taste, taste_strength, given, like, implicit, count_cap, rating_min,
           rating_max) -> dict:
    """The generated store's attributes: ``params`` completed with what was used only when used (so that a default
    store's attributes are those of earlier versions), its kind and rating range."""
    kind = {}
    if k_taste:  # recorded only when used: the default store's attributes are those of earlier versions
        params.update(taste_clusters=k_taste, taste_strength=float(taste_strength))
    for name, v in given.items():  # recorded only when given, as the clusters are
        if v is not None:
            params[name] = "given"
    if like is not None:
        params["like"] = like
    if implicit:
        params.update(implicit=True, count_cap=count_cap)
        kind = {"implicit": True, "value": "count", "count_cap": None if count_cap is None else float(count_cap)}
        if count_cap is not None:
            rating_min, rating_max, source = 0.0, float(count_cap), "declared"
        else:
            rating_min, rating_max, source = seen[0], seen[1], "observed"
    else:
        source = "declared"
    return {
        **kind,
        "rating_min": float(rating_min),
        "rating_max": float(rating_max),
        "rating_range_source": source,
        # the items are the generator's parameter, not read off anyone's data: a declared catalogue
        "catalogue": {"source": "declared", "by": "generate: its items are a parameter of the generator"},
        "sources": [],
        "created_with": "generate",
        "params": params,
        "seconds": round(time.perf_counter() - t0, 3),
    }
