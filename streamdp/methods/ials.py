"""Private implicit-feedback ALS: ``--method ials``.

Hu, Koren & Volinsky (ICDM 2008) implicit ALS, made user-level DP in the style of
Chien et al. (ICML 2021) DP-ALS (which ``als`` implements for ratings). It learns
*which* items a user chose, not how she rated them: its lists are what it is for
(``docs/ranking.md``). Public names: :class:`IALS` (``ials``), :class:`IalsOptions`, and the
rules of a private run :func:`tau_from_profile`, :func:`private_rank`, :func:`item_floor_count`,
:func:`private_max_confidence`, :func:`default_preference`, and of a non-private one :func:`default_alpha`.

The model: an observed pair has preference 1 and confidence ``c_uj >= 1``
(:func:`streamdp.serving.local.implicit_pairs`), the rest preference 0 and weight 1; alternating
ridge solves with the Gramian trick (``G = sum_u x_u x_u^T``). A private run releases, calibrated
jointly by the PLD accountant, the item counts ``N_j`` (the chart), then per iteration the users'
Gramian ``G`` and the items' right-hand sides ``B`` (``--gramian item``: every ``A_j`` too). Each
user's row is solved on her device from the released item side
(:func:`streamdp.serving.local.implicit_rows`) and never released: joint DP, as ``als``.

Decisions a reader must know:

* item rows are ``[y_j, pi_j]``: a fixed **popularity column** ``pi_j = N_j / max N``
  from the released counts, so where the factors are noise a user's list falls back
  toward the chart, with no weight tuned on private data;
* the released counts (the chart) take every pair of a user, weight ``min(1, sqrt(tau / n_u))``
  (:func:`spread_weights`, ``--count-weights``); on a thin store a private top-K selection lists first (``topk.py``);
* a user's factor part is clipped to ``--clip`` and her popularity weight apart
  (``--clip-popularity``); only pairs of items above the **item floor**
  (:func:`item_floor_count`) reach the item side, with adaptive weights of L2 norm
  ``sqrt(tau)`` per user; a user with fewer than :data:`MIN_PAIRS` such pairs gives the
  item sums nothing;
* the factors are released only when they stand :data:`SIGNAL_Z` noise standard
  deviations above pure noise over enough items, and when the private choice between
  the factors and the chart (:meth:`IALS._class_sums`, :meth:`IALS._chart_wins`) keeps
  them; otherwise the release is the chart alone;
* confidences are capped at ``1 + alpha`` in a private run on an implicit store too, unless ``--max-confidence``
  is given (:func:`private_max_confidence`): the noise is calibrated for the cap, not for the data's confidences;
* non-private runs are plain iALS (every pair, no clip, no popularity column, conjugate
  gradients warm-started as ``implicit`` does, :meth:`IALS._cg_iteration`).

Derivation, sensitivities, measurements and alternatives not kept: ``docs/design-notes.md``,
section ``streamdp/methods/ials.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from streamdp.errors import ParameterError
from streamdp.kernels.als import symmetrize_upper, unpack_upper
from streamdp.kernels.csr import masked_indptr
from streamdp.kernels.ials import (ials_accumulate, ials_cg_users, ials_item_products, ials_solve_items,
                                   ials_solve_users, ials_solve_whitened, ials_whitened)
from streamdp.kernels.topk import TILE_BYTES, topn_blocked, topn_by_order, topn_prepare
from streamdp.methods import register
from streamdp.methods._notes import seed_notes
from streamdp.methods._profile import EDGES, UserProfile, user_profile
from streamdp.methods._psd import psd
from streamdp.methods._selection import MARGIN, held_positions, holdout, sample_record, validation_rate
from streamdp.methods._warm import WarmStart, initial_factors, warm_iters
from streamdp.methods.base import Fitted, Method, Plan, RunSettings
from streamdp.methods.options import MethodOptions, option
from streamdp.privacy.bounding import contribution_weights
from streamdp.privacy.release import Share, calibrate_releases
from streamdp.privacy.topk import K as TOPK_K, SHARE as TOPK_SHARE, TopKShare, chart_scores, topk_chart
from streamdp.serving.local import implicit_pairs
from streamdp.serving.ranking import default_threshold
from streamdp.stream.engine import add_into as _add
from streamdp.stream.memo import BlockMemo

#: Key of this module's random streams.
RNG_KEY = 0x1A15
_INIT, _STATS, _ITER, _PROFILE, _SELECT, _TOPK = 1, 2, 3, 4, 5, 6
#: Budget share of the private choice between the factors and the chart (``--select auto``).
SELECT_SHARE = 0.05
#: Users with fewer training items than this hold none out for the choice (``floor(0.1 n + 1/2) >= 1`` from 5): on
#: a store of 2-4 items per user the held-out item took most of her co-occurrences from the iterations (a generated
#: store shaped as a 72,000-user product set, 79% of users with one item, epsilon 10: the factors trained without
#: them listed at 0.18 against 0.34, and the choice kept the chart; with 5, 0.324, 1.36x the chart).
HOLDOUT_MIN_COUNT = 5
#: List length of the choice's held-out hits.
SELECT_K = 10
#: Private runs: a user gives the iterations' item sums her pairs only when she has at least this many above the item
#: floor (``--min-pairs``; :meth:`IALS.settings`, measured in the module docstring).
MIN_PAIRS = 2
#: ``tau`` from the released profile: the pairs of this share of the users fit under it, within these bounds.
TAU_QUANTILE, TAU_BOUNDS = 0.75, (4, 32)
#: The released item counts' per-user weights (``--count-weights``), as the ledger describes them.
COUNT_WEIGHTS = {"spread": "every pair of a user, weight min(1, sqrt(tau / her pairs)): L2 norm at most sqrt(tau)",
                 "uniform": "at most tau pairs per user, weight 1"}
#: How a rating becomes a preference by default in a non-private run (measured on ML-100K: docs/design-notes.md),
#: and in a private one (:func:`default_preference`, measured there).
DEFAULT_PREFERENCE, PRIVATE_PREFERENCE = "binary", "above"
#: The last iteration's factors are released only when their right-hand sides' excess energy over the noise is
#: this many standard deviations (:func:`_signal_z`); else only the popularity column.
SIGNAL_Z = 4.0
#: Factors by default (:meth:`IALS.default_rank`, measured there); private runs may take :data:`LOW_RANK`.
DEFAULT_RANK = 16
#: Factors are released only when at least this many items per factor (of the rank, or of :data:`DEFAULT_RANK` if
#: more) pass the item floor (:func:`item_floor_count`): with 8 factors FilmTrust's 50 items above the floor at
#: epsilon 0.5 (fewer than the 64 that 16 factors need) passed, and the choice's noise kept factors at 0.91x the chart.
MIN_ITEMS_PER_FACTOR = 4
#: A private run without ``--rank`` takes this many factors when the released counts are low against the noise
#: (:func:`private_rank`): the mean item's count below this many times the item floor's unit, and fewer than
#: ``RANK_ITEMS`` items per factor above that unit.
LOW_RANK, RANK_SNR, RANK_ITEMS = 8, 1.0, 32
#: ``--clip-popularity`` by default: the bound of a user's weight on the popularity column, which only the users'
#: Gramian ``G`` takes. It was 1 (the weight is about 0.7 on the bench stores): ``G``'s sensitivity
#: ``Delta^2 + Delta_pi^2`` was 1.16, 86% of it the weight's, and its noise swamped the factors' block of ``G``; 0.2
#: makes it 0.2 (the right-hand sides' noise unchanged). Recall@10, seed 1, alone: a 600 x 10,000 store at epsilon
#: 10 0.113 -> 0.121, issue 42's other shapes and ML-100K at epsilon 1 and 10 0% to +3%; 0.1 and 0.3 within 0.002
#: of 0.2. With :func:`private_rank`'s change, seeds 1-3: ``docs/benchmarks.md``, thin-600.
CLIP_POPULARITY = 0.2
#: ``--last-share`` by default in a private run of 2+ iterations: the share of the iterations' budget (the Gramians'
#: and the right-hand sides') spent on the last one, the rest split evenly over the earlier ones
#: (:meth:`IALS._per_iteration`). The released factors are solved from the last iteration's sums (and, averaged
#: toward them, the earlier ones': :meth:`IALS._averaged`); the earlier ones steer the users' rows toward the item
#: space. Recall@10, 3 iterations, seeds 1-3 (medians), even split -> 0.6: a 600 x 10,000 store at epsilon 10 0.121
#: -> 0.131; the 72,000-user product shape at epsilon 1 0.511 -> 0.523. With 4 iterations and the average, 0.4 (the
#: three earlier iterations 0.2 each): 0.3 and 0.5 listed alike or lower; per store in ``docs/benchmarks.md`` (issue
#: 42, part 4). At :data:`PRIVATE_ITERS` 5 as well (the four earlier 0.15 each).
LAST_SHARE = 0.4
#: A private run's iterations by default (``--iters``; 10 non-private). 5 with :data:`NOISE_RIDGE`'s ridge, against 4
#: (4 iterations and :data:`LAST_SHARE` with the average; 0.3 and 0.5 listed alike at 5). Recall@10, seeds 1-3
#: (medians), ``--noise-ridge 10 --shrink 0``, 4 -> 5 iterations: issue 42's product shape at epsilon 1 / 10 0.568 /
#: 0.657 -> 0.576 / 0.665, the repeat-count log 0.280 / 0.293 -> 0.283 / 0.295, log-6k 0.130 / 0.193 -> 0.131 / 0.192,
#: ML-100K at 10 0.316 -> 0.314, a 600 x 10,000 store at 10 0.148 -> 0.149 (seeds 4-8: 0.143 -> 0.147); the
#: iterations take 5/4 the time. A ``--warm-start`` run's quarter of it, rounded up, is now 2 (it was 1): a refresh
#: of the same store from a private model at the same epsilon, seeds 1-3, 1 -> 2 iterations: the 600 x 10,000 store
#: at 10 0.124 / 0.126 / 0.124 -> 0.145 / 0.145 / 0.146, the product shape at 1 0.587 / 0.587 / 0.577 -> 0.591 /
#: 0.590 / 0.593.
PRIVATE_ITERS = 5
#: The item floor and the private rank read the right-hand sides' noise at an even split over at most this many
#: iterations (:meth:`IALS._floor_rhs_scale`).
FLOOR_ITERS = 3
#: ``--noise-ridge`` by default: the weight ``nu`` of each item's ridge ``nu sigma_B Delta`` in proportion to the noise
#: its right-hand side receives (private runs; :meth:`IALS._solve_items`). Strong, the item solve no longer whitens
#: the noisy sums by the Gramian's weak directions, and the rows' James-Stein shrinkage (``--shrink``, :data:`SHRINK`)
#: then only takes signal away. Recall@10, seeds 1-3 (medians), 4 iterations, a 600 x 10,000 store at epsilon 10:
#: 0.139 by the defaults before (``--noise-ridge 1 --shrink 1``), 0.144 with 15 alone, 0.137 with ``--shrink 0``
#: alone, 0.148 with both; 6 / 10 / 30 and ``--reg 1000`` (no whitening at all) 0.147-0.150 at 5 iterations, and
#: 3 and 6 with the shrinkage 0.144. With :data:`PRIVATE_ITERS` 5, every store with factors the same or better, per
#: store in ``docs/benchmarks.md`` (issue 42): the product shape at epsilon 1 0.539 -> 0.577, ML-100K at 5 0.277 ->
#: 0.285; where the release is the chart (FilmTrust at 1-10, the 800 x 2,000 store, 20,000 users without taste
#: groups) nothing changes.
NOISE_RIDGE = 15.0
#: ``--shrink`` by default: off (:data:`NOISE_RIDGE`). It was 1 with ``--noise-ridge 1``, where it held ML-100K at
#: epsilon 10 at 0.217 against 0.055 without it (docs/ranking.md).
SHRINK = 0.0
#: ``--local-alpha`` by default in a private run: the confidence scale of each user's local solve from the released
#: rows (at most ``--alpha``), 1 against the iterations' 3. The iterations' confidences weigh each pair's term in the
#: item sums; the local solve weighs the released rows, which are noisy, clipped and bounded per user, and leans on
#: a few of them less at 1. Recall@10, seeds 4-8 (means), ``--alpha`` 3 -> 1 in the local solve alone: a 600 x
#: 10,000 store at epsilon 10 0.129 -> 0.131, issue 42's product shape at 1 / 10 0.534 / 0.624 -> 0.536 / 0.633,
#: the repeat-count log 0.265 / 0.277 -> 0.269 / 0.282, log-6k +0.5%, ML-100K the same; 0, 0.25 and 0.5 within
#: 0.4% of 1 except the repeat-count log (0: -1.5%); in the iterations too, 1 listed far worse (the 600-user store
#: 0.086). A non-private model's rows are fitted exactly to its ``--alpha``: there 1 listed lower (the 600-user
#: store 0.174 -> 0.170, the product shape 0.674 -> 0.668). Per store in ``docs/benchmarks.md``.
PRIVATE_LOCAL_ALPHA = 1.0
#: Conjugate-gradient steps per iteration of a non-private run's user and item solves (``implicit``'s default), and
#: the squared residual norm below which an item's solve stops.
CG_STEPS, CG_TOL = 3, 1e-20
#: Items per chunk of the batched item solves (bounds the ``n x d x d`` temporaries).
SOLVE_CHUNK = 1 << 13
#: ``--alpha`` by default (:func:`default_alpha`): 3; a non-private run on a store of at most ``SPARSE_PAIRS``
#: training pairs per user on average takes ``SPARSE_ALPHA``.
DEFAULT_ALPHA, SPARSE_ALPHA, SPARSE_PAIRS = 3.0, 10.0, 10.0
#: The settings ``model.json`` records as the run's ``parameters``.
MODEL_PARAMETERS = ("preference", "alpha", "max_confidence", "count_scale", "implicit", "tau", "iters", "clip", "select",
                    "clip_popularity", "last_share", "local_alpha", "average",
                    "reg", "ridge", "noise_ridge", "gramian", "popularity", "shrink", "count_share", "gram_share",
                    "item_floor", "item_weights", "adaptive_exponent", "reg_scaled", "min_pairs",
                    "count_weights")

_POS = dict(minimum=0, exclusive_minimum=True)

#: The largest confidence refused up front: 2^52, float64's ``1 / eps``. Every solve adds a pair's ``(c - 1) y y^T``
#: to ``Y^T Y + ridge I``, in which every other item weighs 1 (and ``implicit_pairs`` forms ``c = 1 + ...``); from
#: ``c ~ 2^52`` on the weight 1 is below float64's resolution next to ``c``, so the Gramians cannot hold both terms and
#: the solves break down (measured: ``1e16`` trains, ``1e18`` gives NaN rows, ``1e20`` a LinAlgError, ``1e300`` local
#: solves that overflow). A cap below this is a choice; one above it is not a confidence float64 can use.
MAX_CONFIDENCE = 2.0 ** 52


@dataclass(frozen=True)
class IalsOptions(MethodOptions):
    """``--method ials``: the confidence, the contribution bounds and the iterations."""

    preference: Literal["binary", "graded", "above"] = option(
        "ratings to preferences: binary (every rated item a positive), graded (confidence grows with the rating) "
        "or above (only ratings above the midpoint are positives); ignored on implicit stores",
        default=DEFAULT_PREFERENCE,
        default_text=f"{DEFAULT_PREFERENCE}; private runs: {PRIVATE_PREFERENCE}, unless the chart is a private top-K "
                     f"selection (a thin store)")
    alpha: float = option("how much more a pair counts as its rating or count grows (confidence c = 1 + alpha "
                          "f(value))", default=DEFAULT_ALPHA, minimum=0,
                          default_text=f"{DEFAULT_ALPHA:g}; non-private runs on a store of at most "
                                       f"{SPARSE_PAIRS:g} training pairs per user on average: {SPARSE_ALPHA:g}")
    max_confidence: float = option("largest confidence a pair can have: bounds each user's influence (cap c_max)",
                                   default=21.0, minimum=1,
                                   default_text="21; private runs on an implicit store: 1 + --alpha, at most 21")
    count_scale: float = option("implicit stores: the count at which confidence starts to grow slowly "
                                "(f(count) = log(1 + count / count_scale))", default=1.0, **_POS)
    tau: int = option("how much each user may weigh on the item side: the squared length of her weights (adaptive), "
                      "or how many of her pairs reach it with weight 1 (uniform; a seeded sample when she has more) "
                      "(bound tau)",
                      default=32, minimum=1, default_text="32; private --item-weights uniform: from a released "
                      "histogram of pairs per user, the count 75% of users are within, in 4..32")
    iters: int | None = option("ALS iterations", minimum=1, default_text=f"10 non-private, {PRIVATE_ITERS} private; "
                               f"under --warm-start a quarter of that, rounded up")
    average: Literal["auto", "off"] = option(
        "private runs of 3+ iterations (shared Gramian): solve the released rows from the last iteration's sums moved "
        "toward the noise-weighted mean of every iteration's after the first, as far as the released sums show their "
        "noise outweighing how far they drift between iterations (post-processing); off: the last iteration's alone",
        default="auto")
    last_share: float | None = option(
        "private runs of 2+ iterations: the share of the iterations' budget (their Gramians and right-hand sides) "
        "spent on the last, whose sums the released factors are solved from; the earlier ones split the rest evenly",
        default_text=f"{LAST_SHARE:g} (1 / --iters is an even split)", maximum=1, **_POS)
    local_alpha: float | None = option(
        "the confidence scale of each user's solve from the released item rows (the model's local solve and the "
        "private choice's; c = 1 + local_alpha f(value)); a user may solve with any on her device",
        default_text=f"private runs: {PRIVATE_LOCAL_ALPHA:g}, at most --alpha; non-private: --alpha", minimum=0)
    clip: float | None = option("largest norm a user's factor may have on the item side: "
                                "bounds each user's influence (clip Delta)",
                                default_text="0.4 private, none non-private", **_POS)
    clip_popularity: float = option("largest weight a user may give the popularity column on the item side "
                                    "(bound Delta_pi)",
                                    default=CLIP_POPULARITY, **_POS)
    reg: float = option("regularisation of the item solves (ridge lambda)", default=1.0, minimum=0)
    ridge: float | None = option("ridge of each user's solve (training and the released model's local solve)",
                                 default_text="--reg non-private, 1 private", **_POS)
    noise_ridge: float = option("extra regularisation of each item in proportion to the noise it receives "
                                "(weight nu of the ridge nu sigma_B Delta; private runs)", default=NOISE_RIDGE,
                                minimum=0)
    gramian: Literal["auto", "shared", "item"] = option(
        "shared: one noisy Gramian for all items, scaled by released confidence totals (A_j ~ W_j G / n_users); item: "
        "a noisy Gramian per item",
        default="auto", default_text="auto: shared private, item non-private")
    popularity: Literal["auto", "on", "off"] = option(
        "a popularity column log(1 + N_j) in the item rows, weighed by each user (released noisy counts N_j)",
        default="auto", default_text="auto: on private, off non-private")
    shrink: float = option("shrink noisy item rows toward zero, the more the noisier: threshold s, 0 turns it off "
                           "(James-Stein: max(0, 1 - s k sigma_B^2 / ||B_j||^2); post-processing; private runs)",
                           default=SHRINK, default_text="0: off (the noise ridge regularises the rows)",
                           minimum=0)
    count_share: float = option("budget share of the item counts (and confidence totals)", default=0.3, **_POS,
                                maximum=1)
    item_floor: float = option("private runs: only items with enough released count get factors and the users' "
                               "bounded pairs, the count at which an item's right-hand side can at most equal its "
                               "noise, times this (f of the floor f sqrt(k) sigma_B / (c_max Delta)); the rest rank "
                               "by popularity; 0: every item", default=1.0, minimum=0)
    item_weights: Literal["uniform", "adaptive"] = option(
        "private runs: how a user's bounded contribution spreads over her pairs in the iterations: uniform (at most "
        "tau of them, weight 1) or adaptive (every pair, weights of l2 norm sqrt(tau), rarer items by released count "
        "weighing more, Krichene et al. 2023)", default="adaptive")
    count_weights: Literal["spread", "uniform"] = option(
        "private runs: how a user's pairs weigh in the released item counts (the chart): spread (every pair, weight "
        "min(1, sqrt(tau / her pairs))) or uniform (weight 1 on at most tau of them, a seeded sample); both of L2 "
        "norm at most sqrt(tau) per user", default="spread")
    adaptive_exponent: float = option("--item-weights adaptive: how much less a pair of a popular item weighs, 0 or "
                                      "below: 0 weighs her pairs alike (exponent mu <= 0 of the weights N_j^mu)",
                                      default=0.0, maximum=0)
    min_pairs: int = option("private runs: a user with fewer of her pairs above the item floor than this gives the "
                            "item side's right-hand sides nothing in the iterations (only her Gramian): a lone pair "
                            "carries no co-occurrence, it only pulls its item's row toward itself",
                            default=MIN_PAIRS, minimum=1)
    reg_scaled: bool = option("private runs: scale each item's ridge by 1 + its released confidence total / users, "
                              "as its Gramian (G + A_j ~ (1 + W_j / n_users) G)", default=True)
    gram_share: float | None = option("budget share of the Gramians (all iterations)",
                                      default_text="0.02 shared, 0.3 item", **_POS, maximum=1)
    select: Literal["auto", "off"] = option(
        "auto: choose between the factors and the chart by the released counts by each user's held-out "
        "training items (about 10%, at most 2, from users of 5 or more, out of the iterations; on ratings, those in "
        "the top 20% of the range), "
        "their hits in either top 10 (private runs: released with noise, the factors kept only when they win by 3 "
        "noise standard deviations; without privacy: exact); private runs choose "
        "for users of fewer than 5 items apart (one held-out item of each user of 2-4, left in the iterations): "
        "where the chart wins for them, their local solve lists the chart; off: keep the factors",
        default="auto")
    checkpoint: str | None = option("run directory: per-iteration checkpoints (noisy iterates: counted as released, "
                                    "never refunded; keep it private); resumes if it holds one", metavar="DIR")


@dataclass(frozen=True)
class IalsSettings(RunSettings):
    """A run's resolved settings on one store (``model.json`` ``parameters``; the checkpoint fingerprint)."""

    #: The declared rating range (``None`` on an implicit store without a declared --count-cap: its observed
    #: count range is an exact statistic, never published; the confidence of a count does not use it).
    rating_min: float | None
    rating_max: float | None
    private: bool
    implicit: bool
    preference: str
    alpha: float
    max_confidence: float
    count_scale: float
    tau: int
    iters: int
    clip: float
    clip_popularity: float
    reg: float
    ridge: float
    noise_ridge: float
    gramian: str
    popularity: bool
    shrink: float
    count_share: float
    gram_share: float
    #: Whether the confidences differ between pairs (then ``W_j`` is a release of its own).
    graded: bool
    #: The largest confidence a pair can have: ``min(c_max, 1 + alpha)`` on a rating store (``f <= 1``),
    #: ``c_max`` on an implicit one; the sensitivities use it.
    conf_cap: float
    #: Whether the release is chosen between the factors and the chart on held-out items (private runs).
    select: bool = False
    #: The probability that a user holds items out for the choice (:func:`~streamdp.methods._selection.validation_rate`
    #: of the run's public or released user count): every user up to 100,000 of them, a keyed sample above.
    validation_rate: float = 1.0
    #: The released histogram of training ratings per user ``tau`` came from (model.json; not fingerprinted).
    profile: UserProfile | None = None
    #: Items get factors when their released count reaches this many times :func:`item_floor_count`'s unit.
    item_floor: float = 0.0
    item_weights: str = "uniform"
    adaptive_exponent: float = 0.0
    reg_scaled: bool = False
    #: Users with fewer pairs above the floor give the iterations' item sums nothing but their Gramian (private).
    min_pairs: int = 1
    #: Private runs: the weights of a user's pairs in the released item counts (``--count-weights``).
    count_weights: str = "uniform"
    #: The model a ``--warm-start`` run starts from (its path and run id; empty: a cold run): in the run's fingerprint.
    warm_start: str = ""
    #: Private runs: the chart's budget share of a private top-K selection (:mod:`streamdp.privacy.topk`), 0: the
    #: chart is the released counts alone.
    topk_share: float = 0.0
    #: Private runs of 2+ iterations: the last iteration's share of the iterations' Gramians and right-hand sides
    #: (:meth:`IALS._per_iteration`; 0: one noise scale for all, a run of one iteration or a non-private one).
    last_share: float = 0.0
    #: The confidence scale of the users' solves from the released rows (:meth:`local`; ``None``: ``alpha``).
    local_alpha: float | None = None
    #: Private runs of 3+ iterations: the released rows are solved from the iterations' sums averaged
    #: (:meth:`IALS._averaged`).
    average: bool = False
    #: The warm-start model's released choice a private ``--warm-start`` run reuses (its ``selection.chosen``; empty:
    #: none) and its ``chart_below``: :meth:`IALS._reused_choice`.
    reused_choice: str = ""
    reused_chart_below: int = 0

    def as_dict(self) -> dict:
        """:meth:`RunSettings.as_dict`, without ``warm_start`` and the reused choice in a cold run, ``topk_share`` and
        ``last_share`` when 0, ``local_alpha`` when ``alpha``'s (the fingerprints stay as they were)."""
        out = super().as_dict()
        for key in ("warm_start", "topk_share", "reused_choice", "reused_chart_below", "last_share"):
            if not out[key]:
                del out[key]
        if out["local_alpha"] is None:
            del out["local_alpha"]
        if not out["average"]:
            del out["average"]
        return out

    def confidences(self) -> dict:
        """How the iterations (and the released counts' confidence totals) turn a user's values into confidences:
        :func:`streamdp.serving.local.implicit_pairs`'s parameters, at ``alpha``."""
        return {"implicit": self.implicit, "preference": self.preference, "alpha": self.alpha,
                "max_confidence": self.max_confidence, "count_scale": self.count_scale,
                "rating_min": self.rating_min, "rating_max": self.rating_max}

    def local(self) -> dict:
        """``model.json``'s ``local_implicit``: :meth:`confidences` at ``local_alpha``, how each user solves her row
        from the released rows (the private choice's solves too)."""
        return {**self.confidences(), "alpha": self.alpha if self.local_alpha is None else self.local_alpha}


@register
class IALS(Method):
    """``--method ials``: private implicit-feedback ALS (see the module docstring)."""

    name = "ials"
    MAIN_OPTIONS = ("iters", "preference", "alpha", "select", "checkpoint")
    WARM_START_FAMILIES = ("ials",)
    #: The earlier model's item rows a ``--warm-start`` run starts from (:mod:`streamdp.methods._warm`), or ``None``.
    warm: WarmStart | None = None
    SUMMARY = ("private implicit-feedback ALS (Hu, Koren & Volinsky 2008) with DP-ALS noise: ranks items, for "
               "lists; trains on ratings or on implicit data")
    Options = IalsOptions
    LOCAL_SOLVER = "implicit"
    ACCEPTS_IMPLICIT = True
    #: ``streamdp tune --method ials``: its releases are Gaussian and planned in full; candidates are scored by their
    #: held-out hits in each user's top 10 (:func:`streamdp.workflows.tune._hits`).
    TUNABLE = True
    TUNE_SCORE = "hits"

    def default_rank(self) -> int:
        """16; a private run without ``--rank`` then takes 8 where the released counts are low against the noise
        (:func:`private_rank`, after the counts are released).

        Private: every factor adds noise to every item row. Non-private: 64 (the usual iALS size) was the default
        until measured against 32 and 16 (seed 1, every user, evaluate's protocol; non-private Recall@10 64 / 32 /
        16): ML-100K 0.281 / 0.298 / 0.316, FilmTrust 0.323 / 0.523 / 0.634, the clustered 10k store 0.275 /
        0.355 / 0.382, a 6,040 x 3,706 generated movie-shaped store 0.221 / 0.239 / 0.243; implicit's best of its
        grid (bench/ranking.py) picks 32 factors on the first three. A larger catalogue may want more factors:
        ``--rank`` sets it.
        """
        return DEFAULT_RANK

    def __init__(self, *, epsilon: float, delta: float, rank: int | None = None, seed: int | None = None, **options):
        self.epsilon = float(epsilon)  # default_rank reads it
        super().__init__(epsilon=epsilon, delta=delta, rank=rank, seed=seed, **options)
        self._rank_given = rank is not None
        if not self.opts.max_confidence < MAX_CONFIDENCE:
            raise ParameterError(f"--max-confidence {self.opts.max_confidence:g} is too large: confidences must "
                                 f"stay below 2^52 = {MAX_CONFIDENCE:.4g} (float64 cannot add the weight 1 of the "
                                 f"other items to them)")

    def check_rank(self, n_items: int) -> None:
        """The default rank (:data:`DEFAULT_RANK`) is capped at the number of items (the catalogue is public); a
        ``--rank`` given above it is refused as for every method."""
        if not self._rank_given and self.rank > n_items:
            self.rank = max(1, int(n_items))
        super().check_rank(n_items)

    # -- settings ----------------------------------------------------------------------
    def settings(self, store, profile: UserProfile | None = None) -> IalsSettings:
        """The run's settings; a released ``profile`` (histogram of pairs per user) sets ``tau`` when not given."""
        o, private = self.opts, self.private
        implicit = bool(getattr(store, "implicit", False))
        declared = getattr(store, "rating_range_source", "unknown") == "declared"
        lo, hi = ((float(store.rating_min), float(store.rating_max)) if not implicit or declared else (None, None))
        alpha = o.alpha if private or o.is_given("alpha") else default_alpha(self._pairs_per_user(store))
        cmax = private_max_confidence(o) if private and implicit else o.max_confidence
        graded = implicit or o.preference == "graded"
        gramian = ("shared" if private else "item") if o.gramian == "auto" else o.gramian
        pop = private if o.popularity == "auto" else o.popularity == "on"
        cold_iters = PRIVATE_ITERS if private else 10
        s = IalsSettings(
            rating_min=lo, rating_max=hi, private=private,
            implicit=implicit, preference="counts" if implicit else o.preference, alpha=alpha,
            max_confidence=cmax, count_scale=o.count_scale,
            tau=o.tau if profile is None else tau_from_profile(profile.counts),  # adaptive: --tau (32), no profile
            iters=o.iters if o.iters is not None else (
                cold_iters if self.warm is None else warm_iters(cold_iters)),
            clip=o.clip if o.clip is not None else (0.4 if private else math.inf),
            clip_popularity=o.clip_popularity if private else math.inf, reg=o.reg,
            ridge=o.ridge if o.ridge is not None else (1.0 if private else max(o.reg, 1e-6)),
            noise_ridge=o.noise_ridge, gramian=gramian, popularity=pop, shrink=o.shrink if private else 0.0,
            count_share=o.count_share,
            gram_share=o.gram_share if o.gram_share is not None else (0.02 if gramian == "shared" else 0.3),
            graded=graded and min(cmax, 1.0 + alpha) > 1.0,
            conf_cap=cmax if implicit else min(cmax, 1.0 + alpha), profile=profile,
            select=o.select == "auto", validation_rate=validation_rate(self.n_users(store)),
            item_floor=o.item_floor if private else 0.0,
            item_weights=o.item_weights if private else "uniform", adaptive_exponent=o.adaptive_exponent,
            reg_scaled=o.reg_scaled and private, min_pairs=o.min_pairs if private else 1,
            count_weights=o.count_weights if private else "uniform",
            warm_start="" if self.warm is None else f"{self.warm.path} (run {self.warm.run_id})")
        if private and s.count_share + s.gram_share >= 1.0:
            raise ParameterError(f"--count-share + --gram-share = {s.count_share + s.gram_share:g} leaves no budget "
                                 f"for the right-hand sides (must be < 1)")
        if private and o.last_share == 1.0 and s.iters > 1:
            raise ParameterError("--last-share 1 leaves the earlier iterations no budget (must be < 1)")
        if self._reused_choice(s) is not None:
            # the earlier model's released choice stands: no held-out items, no choice pass, no choice release
            chosen, below = self.warm.chart_choice
            s = replace(s, select=False, reused_choice=chosen, reused_chart_below=below)
        if not implicit and not o.is_given("preference"):  # the chart's rule: public numbers only
            s = replace(s, preference=default_preference(private, private and self._thin_chart(store, s)))
        if private:
            s = replace(s, topk_share=self._topk_share(store, s))
            if s.iters > 1:
                s = replace(s, last_share=o.last_share if o.last_share is not None else LAST_SHARE)
        if private and s.iters >= 3 and s.gramian == "shared" and o.average == "auto":
            s = replace(s, average=True)
        if o.local_alpha is not None or private:
            s = replace(s, local_alpha=o.local_alpha if o.local_alpha is not None else min(alpha, PRIVATE_LOCAL_ALPHA))
        if pop and not private:
            raise ParameterError("--popularity on needs a private run (its column comes from the released counts)")
        if not implicit and 1.0 + o.alpha > cmax and o.is_given("alpha") and not o.is_given("max_confidence"):
            # a rating's confidence is at most 1 + alpha: the default cap would cut an asked-for alpha silently
            raise ParameterError(f"--alpha {o.alpha:g} gives confidences up to {1.0 + o.alpha:g}, above "
                                 f"--max-confidence {cmax:g} (the cap that bounds each user's influence): pass "
                                 f"--max-confidence {1.0 + o.alpha:g} to use it in full, or a smaller --alpha")
        return s

    def _reused_choice(self, s):
        """The warm-start model's released choice of its factors over the chart ``(chosen, chart_below)`` that a
        private ``--warm-start`` run makes again instead of choosing (``None``: it chooses as a cold run does).

        Decision, as ``als``'s (:meth:`streamdp.methods.als._AlsBase._reused_choice`): a refresh of
        a model whose ``--select auto`` kept its factors keeps them (for the same users: its
        ``chart_below``) when ``--select`` is not given. The choice is released in the model's
        ``model.json`` (an ials model only: ``WARM_START_FAMILIES``), so reusing it is
        post-processing; the refresh saves the choice's pass and its budget share, which goes to the
        right-hand sides, and its iterations keep the items the choice would hold out. The factors
        still go out only when they stand :data:`SIGNAL_Z` above the noise. ``--select auto``
        given chooses afresh.
        """
        w = self.warm
        if (w is None or w.chart_choice is None or not self.private or s.iters == 0 or not s.select
                or self.opts.is_given("select")):
            return None
        return w.chart_choice

    def _topk_share(self, store, s) -> float:
        """The top-K chart's budget share (:func:`streamdp.privacy.topk.topk_chart`: public numbers only, the
        released number of users, the items, ``tau`` and the target), from the right-hand sides': at most half."""
        if not getattr(self, "chart_topk", True):  # tune's candidates and model: Gaussian releases only
            return 0.0
        if not self._thin_chart(store, s):
            return 0.0
        left = 1.0 - s.count_share - s.gram_share - (SELECT_SHARE if s.select else 0.0)
        return float(min(TOPK_SHARE, left / 2.0))

    def _thin_chart(self, store, s) -> bool:
        """Whether the released counts' noise swamps the chart's top (:func:`streamdp.privacy.topk.topk_chart`, from
        the released number of users, the items, ``tau`` and the target: public numbers only)."""
        n_users = getattr(store, "expected_users", None) or self.n_users(store)
        return topk_chart(n_users, store.n_items, math.sqrt(s.tau), self.epsilon, self.delta, s.count_share)

    def _pairs_per_user(self, store) -> float:
        """A non-private run's mean training pairs per user (exact: nothing of the run is private)."""
        return float(np.sum(store.block_nnz("train"))) / max(float(self.n_users(store)), 1.0)

    def _d(self, s) -> int:
        return self.rank + (1 if s.popularity else 0)

    # -- privacy plan --------------------------------------------------------------------
    def _shares(self, store, s) -> list:
        """The plan's shares of the budget, in :meth:`_named_shares`' order."""
        return [share for _, share in self._named_shares(store, s)]

    @staticmethod
    def _per_iteration(s, name: str, what: str, sensitivity: float, share: float, **kw) -> list:
        """``[(name, Share)]`` of a sum released once per iteration: one scale for all (``last_share`` 0), or the
        earlier iterations' and the last's (``name + "_last"``), the last taking ``last_share`` of ``share``.

        Decision (issue 42): the released item rows are solved from the last iteration's sums alone, and the
        earlier releases only steer the users' rows toward the item space, so an even split spends most of the
        budget where the release does not read it. Gaussian releases compose by their ``count / z^2``
        (:func:`~streamdp.privacy.release.calibrate_releases`), so the split moves noise between iterations at
        the same epsilon. Measured: :data:`LAST_SHARE`.
        """
        T, f = s.iters, s.last_share
        if not f:
            return [(name, Share(f"{what} (one per iteration)", "gaussian", sensitivity, share, count=T, **kw))]
        early = "iteration 1" if T == 2 else f"iterations 1-{T - 1}, one each"
        return [(name, Share(f"{what} ({early})", "gaussian", sensitivity, share * (1.0 - f), count=T - 1, **kw)),
                (name + "_last", Share(f"{what} (the last iteration, whose sums the released item rows are solved "
                                       f"from)", "gaussian", sensitivity, share * f, **kw))]

    @staticmethod
    def _of_iteration(rel: dict, name: str, t: int, s):
        """Iteration ``t``'s release of ``name`` (:meth:`_per_iteration`)."""
        return rel[name + "_last"] if t == s.iters and name + "_last" in rel else rel[name]

    @staticmethod
    def _floor_rhs_scale(rel: dict) -> float:
        """The right-hand sides' noise scale at an even split of the iterations' budget over ``min(T, 3)`` iterations
        (:data:`FLOOR_ITERS`), ``sqrt(min(T, 3) / sum_t 1 / sigma_t^2)``: what the item floor and the rank read, so
        that ``--last-share`` moves noise between the iterations and never changes which items get factors (up to
        the calibration's last digits), and neither does a 4th iteration and more: with the iterations after the
        first averaged (:meth:`_averaged`) the released rows are no noisier for them. At the even split's scale of
        4 iterations the floor rose by ``sqrt(4 / 3)``: the default model's ``ials`` lists part on the product shape
        (epsilon 0.46) fell below the items its factors need on seeds 1-3 (its lists the chart, 0.230 against 0.45).

        Decision: the floor at the noisiest iteration's scale listed a little better on the 600 x 10,000 store at
        epsilon 10 (0.1321 against 0.1305, seeds 1-3) but left the default model's ``ials`` lists part on the
        product shape (epsilon 0.46) with fewer items than its factors need (:data:`MIN_ITEMS_PER_FACTOR`): the
        chart, 0.230 against 0.390; at the last iteration's scale, more items got factors and listed worse
        (0.121)."""
        if "rhs_last" not in rel:
            return rel["rhs"].scale
        early, last = rel["rhs"], rel["rhs_last"]
        T = min(early.count + 1, FLOOR_ITERS)
        return math.sqrt(T / (early.count / early.scale ** 2 + 1.0 / last.scale ** 2))

    def _named_shares(self, store, s) -> list:
        """``[(name, Share)]``: the plan's releases by the names :meth:`_fit` reads them under."""
        n, d, T = store.n_items, self._d(s), s.iters
        rt, D, cm = math.sqrt(s.tau), s.clip, s.conf_cap
        D2 = D * D + (s.clip_popularity ** 2 if s.popularity else 0.0)  # the bound on ||x||^2 (whole row)
        out = []
        counts_share = s.count_share * (0.5 if self._w_release(s) else 1.0)
        out.append(("counts", Share(f"item counts N_j ({COUNT_WEIGHTS[s.count_weights]})", "gaussian", rt,
                                    counts_share, shape=(n,))))
        if self._w_release(s):
            out.append(("wtotals", Share("item confidence totals W_j = sum_u (c_uj - 1)", "gaussian", (cm - 1.0) * rt,
                                         s.count_share - counts_share, shape=(n,))))
        gram = "users' Gramian G = sum_u x_u x_u^T"
        if s.gramian == "shared":
            out += self._per_iteration(s, "gram", gram, D2, s.gram_share, shape=(d, d), symmetric=True)
        else:
            out += self._per_iteration(s, "agram", "per-item Gramians A_j = sum_u (c_uj - 1) x_u x_u^T",
                                       (cm - 1.0) * D2 * rt, s.gram_share * 0.9, shape=(n, d, d), symmetric=True)
            out += self._per_iteration(s, "gram", gram, D2, s.gram_share * 0.1, shape=(d, d), symmetric=True)
        sel = SELECT_SHARE if s.select else 0.0
        out += self._per_iteration(s, "rhs", "item right-hand sides B_j = sum_u c_uj x_u", cm * D * rt,
                                   1.0 - s.count_share - s.gram_share - sel - s.topk_share, shape=(n, self.rank))
        if s.select:
            out.append(("select", Share(f"validation: sums over users of {HOLDOUT_MIN_COUNT}+ and of "
                                        f"2-{HOLDOUT_MIN_COUNT - 1} items of (hits of her held-out items in the "
                                        f"model's top {SELECT_K} - hits in the chart's) / her held-out count (each "
                                        f"user in [-1, 1], in one of the sums)", "gaussian", 1.0, sel, shape=(2,))))
        if s.topk_share:
            out.append(("topk", TopKShare(f"the chart: its top {TOPK_K} items in order, chosen from the {n:,} items "
                                          f"by their users (one-shot Gumbel top-K: the exponential mechanism "
                                          f"{TOPK_K} times by peeling)", TOPK_K, s.topk_share, n)))
        return out

    @staticmethod
    def _w_release(s) -> bool:
        """Whether the confidence totals are a release of their own (shared Gramian, differing confidences)."""
        return s.gramian == "shared" and s.graded

    def _plan(self, store) -> Plan:
        profile = None
        if self.private and not self.opts.is_given("tau") and self.opts.item_weights == "uniform":
            seq = np.random.SeedSequence(self.seed, spawn_key=(RNG_KEY, _PROFILE)) if self.seed is not None else None
            profile = user_profile(store, "gaussian", self.epsilon, self.delta, np.random.default_rng(seq))
        s = self.settings(store, profile)
        bounds = ({"rating_min": s.rating_min, "rating_max": s.rating_max,
                   "rating_range_source": getattr(store, "rating_range_source", "unknown")}
                  if s.rating_min is not None else {"values": "an implicit store's counts (no declared cap: the "
                                                              "observed range is not published)"})
        if not self.private:
            bounds["contribution"] = "none (non-private run: every pair, nothing clipped)"
            entries = [{"release": "item factors", "mechanism": "none (non-private)", "iterations": s.iters}]
            if s.select:
                entries.append({"release": f"choice between the factors and the chart: sum over users of (hits of "
                                           f"her held-out items in the model's top {SELECT_K} - hits in the chart's) "
                                           f"/ her held-out count", "mechanism": "none (non-private): exact"})
            return Plan(events=[], entries=entries, settings=s, bounds=bounds, releases={})
        fixed = [profile.release] if profile is not None else []
        named = self._named_shares(store, s)
        releases = calibrate_releases([share for _, share in named], self.epsilon, self.delta,
                                      fixed=self.spent_first(store) + fixed)
        names = [name for name, _ in named]
        counts_w = f"weight 1 on at most tau = {s.tau} positive pairs per user"
        if s.item_weights == "adaptive":
            mu = f"released N_j^{s.adaptive_exponent:g}" if s.adaptive_exponent else "one weight per user"
            iters_w = (f"iterations: adaptive (Krichene et al. 2023), every positive pair of the items above the floor "
                       f"(released counts), weights proportional to {mu}, of L2 norm sqrt(tau) per user, 0 for a user "
                       f"of fewer than {s.min_pairs} such pairs; "
                       f"item counts: uniform, {counts_w}")
        else:
            iters_w = (f"uniform: {counts_w} (iterations: of the items above the floor, none from a user of fewer "
                       f"than {s.min_pairs} of them)")
        bounds.update({"tau": s.tau, "sampling": s.item_weights, "clip_Delta": s.clip,
                       "clip_popularity": s.clip_popularity, "mechanism": "gaussian", "sensitivity_norm": "l2",
                       "weights": f"{iters_w}; confidence <= {s.conf_cap:g}"})
        rel = dict(zip(names, releases))
        releases = fixed + releases
        return Plan(events=[r.event() for r in releases], entries=[r.entry() for r in releases], settings=s,
                    bounds=bounds, releases=rel, own=releases)

    # -- memory --------------------------------------------------------------------------
    def state_bytes(self, store) -> int:
        """Item-side memory: ``Y``, ``B``, the per-item Gramians (private ``--gramian item``) or the vectors of the
        non-private conjugate-gradient solve, the solve's temporaries (private: the running sum of ``--average``)."""
        n, d = store.n_items, self.rank + 1
        item = self.opts.gramian == "item" or (self.opts.gramian == "auto" and not self.private)
        if item and not self.private:  # Y, the residual sums, r, p, A p, the step's temporaries (no d x d solves)
            return n * (8 * d * 8 + 4 * 8)
        gram = n * d * (d + 1) // 2 * 8 if item else 0
        return n * ((5 if self.private else 4) * d * 8 + 4 * 8) + gram + SOLVE_CHUNK * d * d * 8 * 3

    # -- block helpers -------------------------------------------------------------------
    def _pairs(self, block, s, seed, iterations: bool = False, sums_only: bool = False):
        """``(indptr, items, confidence, item-side weights)`` of a block's positive pairs (of the iterations: without
        the held-out validation items when the release is chosen; ``sums_only``, for a non-private pass that only
        sums over the pairs: every pair, the held-out ones of weight 0, which the kernels skip: the same sums
        without a copy of the block, 0.025 of 0.08 CPU s per 1M-pair block and conjugate-gradient step)."""
        ip, it, r = block.indptr, block.items, block.ratings
        if (iterations and s.select and sums_only and not self.private and s.preference != "above"
                and len(ip) > 1 and ip[0] == 0):  # "above" drops pairs: the positions would move
            ip, it, conf = implicit_pairs(ip, it, r, s.confidences())
            w = np.ones(len(it))
            w[held_positions(block.indptr, block.first_user, seed % (1 << 64), HOLDOUT_MIN_COUNT,
                             rate=s.validation_rate)] = 0.0
            return ip, it, conf, w
        drop = None
        if iterations and s.select and ip[0] == 0:  # the held-out ratings left out as the pairs are formed: no copy
            drop = held_positions(ip, block.first_user, seed % (1 << 64), HOLDOUT_MIN_COUNT, rate=s.validation_rate)
        elif iterations and s.select:
            ip, it, r = holdout(ip, it, r, block.first_user, seed % (1 << 64), min_count=HOLDOUT_MIN_COUNT,
                                rate=s.validation_rate)[0]
        ip, it, conf = implicit_pairs(ip, it, r, s.confidences(), drop=drop)
        if self.private:
            keep = getattr(self, "_keep", None) if iterations else None
            w = _bounded_weights(ip, it, s, block.first_user, seed, keep,
                                 getattr(self, "_N", None) if iterations else None)
        else:
            w = np.ones(len(it))
        return ip, it, conf, w

    def _block_memo(self, store, engine, s):
        """A :class:`~streamdp.stream.memo.BlockMemo` of the iterations' pairs (the same in every iteration: the
        held-out items, the bounded weights and the item floor are fixed before them) and, non-private, of the
        users' rows, when they fit within the memory limit beside the passes' blocks; else ``None``."""
        nnz = store.block_nnz("train")
        d = self._d(s)
        need = 20 * int(nnz.sum()) + 8 * (store.n_users + len(nnz))
        if self._item_cg(s):
            need += 8 * d * store.n_users
        return BlockMemo.within(engine, need, self._iteration_bytes(store, s))

    def _block_pairs(self, block, b, s, seed, sums_only: bool = False):
        """``(indptr, items, confidence, weights)`` of block ``b`` in the iterations: :meth:`_pairs`, or the memo's."""
        memo = getattr(self, "_memo", None)
        hit = None if memo is None else memo.get(b)
        if hit is not None:
            return hit[:4]
        out = self._pairs(block, s, seed, iterations=True, sums_only=sums_only and memo is None)
        if memo is not None:
            memo.put(b, out)
        return out

    def _iteration_bytes(self, store, s) -> int:
        """Bytes of one block in flight in an iteration's pass beyond the engine's own (its ``extra_per_block``)."""
        n, d, k = store.n_items, self._d(s), self.rank
        nnz = store.block_nnz("train")
        pairs = 20 * (int(nnz.max()) if len(nnz) else 0)
        if self._item_cg(s):  # the residual's partial, the users' rows (and the exact solve's whitened rows)
            return 8 * n * d + 16 * d * store.block_users + 8 * n * (d + 2) + pairs
        # the partials B (and A); the users' rows and their clipped copies, the whitened item rows L^-1 y_j (float64,
        # and their float32 copy when private), and the item-major users and weights of the item-side sums
        npk = d * (d + 1) // 2 if s.gramian == "item" else 0
        return 8 * n * k + 8 * n * npk + 16 * d * store.block_users + 12 * n * (d + 2) + pairs

    # -- fitting -------------------------------------------------------------------------
    def fit(self, store, engine) -> Fitted:
        plan = self.plan(store)
        rank = self.rank  # a private run may take fewer factors (private_rank); the method's own rank is kept
        try:
            with self.open_run(store, plan, rng_key=RNG_KEY, exclude=("profile",), engine=engine) as run:
                return self._fit(store, engine, run, plan)
        finally:
            self.rank = rank
            self._memo = None  # the blocks' pairs (and rows): memory for the next run

    def _fit(self, store, engine, run, plan) -> Fitted:
        s, rel = plan.settings, plan.releases
        n, k = store.n_items, self.rank
        self._choice = self._light_choice = self._choice_sd = None
        self._chart_below = s.reused_chart_below  # a reused choice's (0 without one)
        ck = run.checkpoint
        self._keep = self._N = self._topk = None
        if ck is not None:
            N, W, Y = ck["N"].copy(), ck["W"].copy(), ck["Y"].copy()
            self._topk = ck["topk"].copy() if "topk" in rel else None
        else:
            N, W = self._counts(store, engine, run, s, rel)
        # the chart: the released counts' order, or the top-K selection's items first (post-processing of both)
        P = N if self._topk is None else chart_scores(N, self._topk)
        if self.private:  # post-processing of the released counts: the rank, the items that get factors
            if not self._rank_given:
                self.rank = k = private_rank(s, N, self._floor_rhs_scale(rel), self.rank)
                plan = _with_rank(plan, k, self._d(s))
                rel = plan.releases
            self._keep = (N >= item_floor_count(s, self._floor_rhs_scale(rel), k) if s.item_floor > 0
                          else np.ones(n, bool))
            self._N = N
        if ck is None:
            g = run.rng(_INIT, 0)
            Y = np.zeros((n, self._d(s)))
            # the cold draw always (an item new to a warm start keeps its cold row), the model's rows over it
            Y[:, :k] = initial_factors(g.standard_normal((n, k)) * (1.0 / math.sqrt(k) if self.private else 0.01),
                                       self.warm)
            if self._keep is not None:
                Y[~self._keep, :k] = 0.0
            if s.popularity:
                Y[:, k] = _popularity(P)
        history = []
        self._avg = self._average_lambda = None
        if ck is not None and "avg_S" in ck:  # the running sums of --average, as the interrupted run left them
            self._avg = (ck["avg_S"].copy(), ck["avg_G"].copy(), float(ck["avg_P"]))
        n_users = getattr(store, "expected_users", self.n_users(store))
        rows = self._cg_rows(run, s) if self._item_cg(s) and run.start <= s.iters else None
        self._memo = self._block_memo(store, engine, s)
        for t in run.epochs(s.iters, desc=f"{self.name} iterations"):
            Y, B, clipped = self._iteration(store, engine, run, s, rel, Y, W, n_users, t, rows)
            if t == s.iters:
                self._memo = None  # its memory back for the passes of the choice below
            if self.private and t == s.iters:
                # too few items for k factors (never fewer than for the default rank's: MIN_ITEMS_PER_FACTOR's note)
                few = int(self._keep.sum()) < MIN_ITEMS_PER_FACTOR * max(k, DEFAULT_RANK)
                signal = -math.inf if few else _signal_z(B[self._keep], self._rhs_sd)
                if signal < SIGNAL_Z:  # no factor signal to speak of: release the chart (popularity column) alone
                    Y[:, :k] = 0.0
                elif s.select and self._chart_wins(store, engine, run, s, rel, Y, P):
                    Y[:, :k] = 0.0
            elif t == s.iters and s.select and self._chart_wins(store, engine, run, s, rel, Y, N):
                Y = _chart_rows(N, k)  # non-private: the exact chart, as a private run's popularity column
            history.append(int(clipped))
            avg = {} if self._avg is None else dict(zip(("avg_S", "avg_G", "avg_P"), self._avg))
            run.save(t, Y=Y, N=N, W=W, **({} if self._topk is None else {"topk": self._topk}), **avg)
        for r in rows or ():  # kept in a --checkpoint directory while the fit may still be resumed, then removed
            r.remove()
        return self._fitted(store, plan, run, Y, P, history)

    def _iteration(self, store, engine, run, s, rel, Y, W, n_users, t, rows):
        """One iteration: ``(Y, B, users clipped)``, ``B`` the (noisy) right-hand sides."""
        desc = f"{self.name} iteration {t}/{s.iters}"
        if rows is not None:
            return self._cg_iteration(store, engine, run, s, Y, rows, t, desc)
        B, A, G, clipped = self._iteration_sums(store, engine, run, s, Y, desc=desc)
        if self.private:
            g = run.rng(_ITER, t)
            G = self._of_iteration(rel, "gram", t, s).add(G, g)
            if s.gramian == "item":
                A = self._of_iteration(rel, "agram", t, s).add(A, g)
            B = self._of_iteration(rel, "rhs", t, s).add(B, g)
            sd = self._of_iteration(rel, "rhs", t, s).scale
            if s.average:
                B, G, sd = self._averaged(s, t, B, G, sd)
        else:
            sd = 0.0
        self._rhs_sd = sd
        return self._solve_items(s, sd, Y, B, A, G, W, n_users), B, clipped

    def _averaged(self, s, t: int, B, G, sd: float):
        """``(B, G, sd)`` the item rows are solved from at iteration ``t`` (``--average auto``): the iteration's own
        before the last; at the last, its sums moved toward the mean of every iteration's after the first, each
        weighed by its noise precision ``p_t = 1 / sigma_t^2``, by the share ``lambda`` that their released values
        show the noise outweighing the drift. Post-processing of released sums only.

        With ``D = sum_{t<T} w_t (B_t - B_T)`` (``w_t = p_t / P``, ``P`` over iterations 2..T, ``a = 1 - w_T``) the
        rows are solved from ``B_T + lambda D`` (and ``G_T + lambda`` the same of the Gramians), whose noise per
        entry has variance ``(1 - lambda a)^2 sigma_T^2 + lambda^2 s^2``, ``s^2 = sum_{t<T} w_t^2 sigma_t^2 = (P -
        p_T) / P^2``. The drift ``||E D||^2`` is estimated on the items above the floor as ``||D||^2`` less its noise
        ``n k (s^2 + a^2 sigma_T^2)``, floored at 0; ``lambda = n k a sigma_T^2 / (drift + n k (s^2 + a^2
        sigma_T^2))`` minimises the estimated squared error around ``E B_T``: 1 (the precision-weighted mean) when
        nothing drifts, toward 0 (the last iteration's alone) when the drift dominates.

        Decision: iteration 1's sums are left out (its users' rows come from the random start, not from the data's
        item rows); the last iteration's sums are the target (the iterations still move: a plain mean of 2-4 cut the
        product shape's lists at epsilon 10 from 0.659 to 0.645, while it lifted the 600 x 10,000 store's from 0.134
        to 0.142); ``lambda`` is one number for all items. Measured: ``lambda`` about 0.86 on that store at epsilon
        10, 0.08 on the product shape (its drift 11 times the noise); 0.85 and 0.13 at 5 iterations (seed 1).
        Only a running sum of ``p_t B_t`` and ``p_t G_t`` is kept (one more ``n x k`` array), in the checkpoint too.
        """
        acc = self._avg
        if t < 2:
            return B, G, sd
        p = 1.0 / (sd * sd)
        if t < s.iters:
            S, SG, P = acc if acc is not None else (np.zeros_like(B), np.zeros_like(G), 0.0)
            S += p * B
            SG += p * G
            self._avg = (S, SG, P + p)
            return B, G, sd
        if acc is None:  # a run of 2 iterations: nothing earlier to average
            return B, G, sd
        S, SG, prev = acc
        self._avg = None
        P = prev + p
        a = prev / P
        D = S / P - a * B
        s2 = prev / (P * P)
        keep = self._keep if self._keep is not None else np.ones(len(B), bool)
        nk = int(keep.sum()) * B.shape[1]
        noise = nk * (s2 + a * a * sd * sd)
        drift = max(float(np.sum(D[keep] ** 2)) - noise, 0.0)
        lam = nk * a * sd * sd / (drift + noise) if nk else 0.0
        self._average_lambda = lam
        out_sd = math.sqrt((1.0 - lam * a) ** 2 * sd * sd + lam * lam * s2)
        return B + lam * D, G + lam * (SG / P - a * G), out_sd

    def _chart_wins(self, store, engine, run, s, rel, Y, N) -> bool:
        """Whether the chart by the released counts beats the factors for every user (noisy when private, exact in a
        non-private run: a tie keeps the chart).

        **A private run keeps the factors only on clear evidence**, as :func:`~streamdp.methods._selection.choose`
        keeps its default (here the chart, what every list falls back to): the heavier users' noisy sum above
        :data:`~streamdp.methods._selection.MARGIN` (3) noise standard deviations, or the two sums added (every
        validation user; noise std ``sqrt(2)`` times) above 3 of theirs. Kept on the sign alone, the factors went
        out where they list below the chart whenever the noise outweighed a small negative sum: a 5,000 x 100 store
        rated -10..10 with 5% outliers, epsilon 1, seeds 3 and 4 of 5: heavier users' sums -8 and -19 exactly,
        released +50 and +4.5 (noise std 18.9), lists 0.89x and 0.83x the released chart. The pooled sum keeps
        the factors where the light users see them clearly win and the heavier users' sum is small (a 72,000-user
        store of 1.3 items per user, epsilon 1, seed 10, before ``--min-pairs``: released -18 and +330, exactly +26.5
        and +343, the factors winning for both classes, and the sign of the first released the chart). The cost:
        factors that win by less than the margin are
        not released (ML-100K, 943 users, epsilon 2: in 1 of 5 seeds, where the sign kept them in 4); the
        measured stores are in ``docs/ranking.md``.

        The lighter users (``self._chart_below``, :meth:`_class_sums`) get the chart when their noisy sum is below
        minus 3 noise standard deviations. Where few users have 2-4 items it is pure noise (the clustered
        10,000-user store: exactly 0 in 5 seeds of 5); at ``<= 0`` 2 of those 5 seeds gave its light users the
        chart on noise alone. When it is clearly negative and outweighs the heavier users' (the two sums added),
        no one keeps the factors: their own pair was even in the iterations, an edge to the factors, and the
        heavier users' sum is the noisier (72,000-user store of 1.3 items per user, epsilon 0.5, seed 3: released
        +92, exactly -19.5, the light sum -193 released, -226 exactly; Recall@10 0.987x the released chart with
        the factors for the heavier users, 1.000x without)."""
        sums = self._class_sums(store, engine, run, s, rel, Y, N)
        self._choice = float(sums[0])
        self._light_choice = float(sums[1]) if self.private else None
        self._choice_sd = float(rel["select"].scale) if self.private else None
        if not self.private:
            self._chart_below = 0
            return not self._choice > 0.0
        margin = MARGIN * self._choice_sd
        pooled = float(sums[0] + sums[1])
        heavy = self._choice > margin or pooled > math.sqrt(2.0) * margin
        clear = sums[1] < -margin  # the light users part from the heavier users' choice only on clear evidence
        if clear and pooled <= 0.0:  # and when they outweigh the heavier ones: the chart for everyone
            heavy = False
        self._chart_below = HOLDOUT_MIN_COUNT if heavy and clear else 0
        return not heavy

    def _class_sums(self, store, engine, run, s, rel, Y, N) -> np.ndarray:
        """The choice's sums over users of her difference in held-out hits, model's top minus chart's: ``[users of
        HOLDOUT_MIN_COUNT+ items, users of 2 to HOLDOUT_MIN_COUNT - 1]`` (private runs; non-private: the first only).

        Each user (with held-out items: :func:`streamdp.methods._selection.holdout`) solves her
        row from the rest, lists her top :data:`SELECT_K` by the
        model and by the chart, and contributes ``(hits_model - hits_chart) / held-out`` in
        ``[-1, 1]`` (on a rating store, of her held-out items rated in the top 20% of the range:
        ``evaluate``'s relevance; counting every held-out item, the chart won on the clustered
        store at epsilon 2 by 74 against a noise std of 10, where the factors' lists are 1.5x the
        chart's); the sums are released with Gaussian noise (a user adds to one of them: L2 sensitivity 1) and the
        factors are kept when the sums clear :meth:`_chart_wins`'s margin. Measured on FilmTrust (where the chart
        beats every model) and ML-100K / the clustered store (where the factors win from epsilon 5 / 1).
        A non-private run makes the same choice on the exact sum (a tie, e.g. no user with
        held-out items, keeps the chart, as a private run's does): on stores whose users
        choose by popularity alone its factors listed far below the chart (``docs/ranking.md``).
        The chart's counts include the held-out items (as a private run's released counts do),
        a slight edge to the chart.

        **The light users' sum** (private runs): users of :data:`HOLDOUT_MIN_COUNT` or more items hold items out
        of the iterations; lighter ones do not (on a store of 2-4 items per user that took most of the
        co-occurrences: 0.18 against 0.34). But on a light store most users who get lists hold 2-4 (the 72,000-user
        store of 1.3 items per user: 3,142 of the 4,583 users with relevant test items), and there the factors can
        lose to the chart while they tie or win for the heavier users (one seed at epsilon 1: Recall@10 on the test
        split of the users of 2-4 items 0.261 against the chart's 0.272, of 10+ items 0.093 against 0.087; the
        heavy sum +1 exactly, released +59 with noise std 19). So each user of 2-4 items also gives one item
        (:func:`~streamdp.methods._selection.holdout`'s, ``min_count`` 2) to the choice alone: her row is solved
        from the others, but the item stays in the iterations: an edge to the factors (her term in ``B_j`` has norm
        at most ``c_max Delta sqrt(tau / n_u)``, 5.2 for a user of 3 items, against noise of std 84 per coordinate
        at epsilon 1 on that store, 11 at 10), toward the release made before this choice existed. Tried first and
        not kept: the heavier validation users playing light users (each solving a second row from 1-4 of her
        remaining items): the right sign but a tenth of the real light users' sums (seed above: -10 against -104;
        noise std 27 with both sums from every user).
        """
        n, d = Y.shape
        Y = np.ascontiguousarray(Y, np.float64)
        YtY = np.ascontiguousarray(Y.T @ Y)
        order = np.lexsort((np.arange(n), -np.asarray(N, np.float64))).astype(np.int64)
        tiekey = np.arange(n, dtype=np.int64)
        zeros = np.zeros(n)
        prepared = topn_prepare(Y, zeros, 0.0)  # the lists by float32 matrix products (topn_scores's, bit for bit)
        seed, params = run.entropy, s.local()
        relevant = None if s.implicit else default_threshold(s.rating_min, s.rating_max)
        width = 2 if self.private else 1
        lightest = 2 if self.private else HOLDOUT_MIN_COUNT

        def fn(block, b):
            # the same keyed held-out items as the iterations' for users of HOLDOUT_MIN_COUNT+ (min_count only zeroes)
            (ip, it, r), (vu, vi, vr) = holdout(block.indptr, block.items, block.ratings, block.first_user,
                                                seed % (1 << 64), min_count=lightest, rate=s.validation_rate)
            # the held-out items a list should hold: on ratings, those in the top of the range (evaluate's relevance)
            keep = np.ones(len(vi), bool) if s.implicit else vr >= relevant
            vu, vi = vu[keep], vi[keep]
            if not len(vu):
                return np.zeros(width)
            pip, pit, conf = implicit_pairs(ip, it, r, params)
            nval = np.bincount(vu, minlength=block.n_users)
            want = (nval > 0).astype(np.uint8)
            # only the users with held-out items solve their rows (the same rows: each user's solve is her own)
            sel, per = np.flatnonzero(want), np.diff(pip)
            mine = np.repeat(want.astype(bool), per)
            Us = np.zeros((len(sel), d))
            ials_solve_users(np.r_[0, np.cumsum(per[sel])].astype(np.int64), np.ascontiguousarray(pit[mine]),
                             np.ascontiguousarray(conf[mine]), Y, YtY, float(s.ridge), Us, False)
            U = np.zeros((block.n_users, d))
            U[sel] = Us
            ip64, it32 = np.asarray(ip, np.int64), np.asarray(it, np.int32)
            lm = np.empty((block.n_users, SELECT_K), np.int32)
            lc = np.empty((block.n_users, SELECT_K), np.int32)
            topn_blocked(ip64, it32, want, U, Y, zeros, 0.0, tiekey, lm, np.empty((block.n_users, SELECT_K)),
                         prepared=prepared)
            topn_by_order(ip64, it32, want, order, lc)
            hm = (lm[vu] == vi[:, None]).any(axis=1).astype(np.float64)
            hc = (lc[vu] == vi[:, None]).any(axis=1).astype(np.float64)
            light = np.diff(np.asarray(block.indptr, np.int64))[vu] < HOLDOUT_MIN_COUNT
            return np.bincount(light.astype(np.int64), weights=(hm - hc) / nval[vu], minlength=2)[:width]

        diff = engine.map_reduce(fn, _add, np.zeros(width),
                                 extra_per_block=(16 * SELECT_K + 16 * d) * store.block_users + TILE_BYTES,
                                 desc=f"{self.name} choice")
        if self.private:
            diff = rel["select"].add(diff, run.rng(_SELECT, 0))
        return np.asarray(diff, np.float64)

    def _counts(self, store, engine, run, s, rel):
        """The item counts ``N_j`` and confidence totals ``W_j`` (noisy when private): one pass. With a top-K chart
        (``rel["topk"]``) the same pass counts each item's users (weight 1 per pair), from which the chart's items are
        chosen (``self._topk``, best first)."""
        n, seed, private = store.n_items, run.entropy, self.private
        rows = 3 if "topk" in rel else 2

        def fn(block, b):
            ip, it, conf, w = self._pairs(block, s, seed)
            out = [np.bincount(it, weights=w, minlength=n), np.bincount(it, weights=w * (conf - 1.0), minlength=n)]
            if rows == 3:  # a store holds each pair once: each count changes by at most 1 with a user
                out.append(np.bincount(it, minlength=n).astype(np.float64))
            return np.stack(out)

        tot = engine.map_reduce(fn, _add, np.zeros((rows, n)), extra_per_block=8 * rows * n + 64 * store.block_users,
                                desc=f"{self.name} counts")
        N, W = tot[0], tot[1]
        if rows == 3:
            self._topk = rel["topk"].select(tot[2], run.rng(_TOPK, 0))
        if private:
            g = run.rng(_STATS, 0)
            N = rel["counts"].add(N, g)
            if "wtotals" in rel:
                W = rel["wtotals"].add(W, g)
            else:  # every confidence is the same: W_j = (c - 1) N_j, post-processing of N
                W = (s.conf_cap - 1.0) * N
        return N, W

    def _iteration_sums(self, store, engine, run, s, Y, desc):
        n, d = Y.shape
        k = self.rank
        Y = np.ascontiguousarray(Y, np.float64)
        YtY = np.ascontiguousarray(Y.T @ Y)
        item_mode = s.gramian == "item"
        npk = d * (d + 1) // 2
        seed = run.entropy

        Yw, Li = ials_whitened(Y, YtY, s.ridge, self.private)  # private: float32 tiles

        def fn(block, b):
            ip, it, conf, w = self._block_pairs(block, b, s, seed)
            U = np.zeros((len(ip) - 1, d))
            ials_solve_whitened(ip, it, conf, Yw, Li, U)
            B = np.zeros((n, k))
            A = np.zeros((n, npk) if item_mode else (0, npk))
            G = np.zeros((d, d))
            clipped = ials_accumulate(ip, it, conf, w, U, float(s.clip), float(s.clip_popularity), B, A, G)
            return [B, A, G, clipped]

        def combine(acc, part):
            if acc is None:
                return part
            for i in range(4):
                acc[i] += part[i]
            return acc

        split = "train" if self._memo is None else self._memo.split()
        acc = engine.map_reduce(fn, combine, None, split=split, extra_per_block=self._iteration_bytes(store, s),
                                desc=desc)
        if acc is None:
            raise ParameterError(f"{store.path}: the training split has no users")
        B, A, G, clipped = acc
        return B, A, symmetrize_upper(G), clipped

    # -- non-private: the item side by conjugate gradients ---------------------------------
    def _item_cg(self, s) -> bool:
        """Whether the item rows are solved by conjugate gradients (non-private runs with per-item Gramians)."""
        return not self.private and s.gramian == "item"

    def _cg_rows(self, run, s):
        """The users' rows of the last two iterations on disk (``float64``, one chunk per block): iteration ``t``
        writes ``[t % 2]`` and starts its users' conjugate gradients from ``[(t - 1) % 2]``, so that the rows of
        the last finished iteration stay intact for a resume (kept in a ``--checkpoint`` directory until the fit
        ends)."""
        try:
            return run.user_state("ials_user_rows", self._d(s), np.float64)
        except FileNotFoundError:
            raise ParameterError(f"--checkpoint {run.dir}: the checkpoint has no users' rows to resume from (written "
                                 f"by an earlier streamdp, or removed); use another --checkpoint directory") from None

    def _cg_iteration(self, store, engine, run, s, Y, rows, t, desc):
        """One non-private iteration, both sides by :data:`CG_STEPS` conjugate-gradient steps: ``(Y, None, 0)``.

        As ``implicit`` solves them (``use_cg``), never forming a user's or an item's system.
        The first pass improves each user's row from the previous iteration's (``rows``,
        :meth:`_cg_rows`; :func:`streamdp.kernels.ials.ials_cg_users`; the first iteration, with no
        previous rows, solves them exactly), writes it to disk and sums ``G`` and the items'
        ``B_j - A_j y_j`` (the initial residual, :func:`streamdp.kernels.ials.ials_item_products`
        with ``residual``); item ``j``'s system ``(G + A_j + reg I) y_j = B_j`` is then solved by
        conjugate gradients warm-started from its previous row, without forming
        ``A_j = sum_{u in j} (c_uj - 1) x_u x_u^T``: each step is one more pass over the blocks
        and the rows for ``A_j p_j`` (``2 d`` multiply-adds per pair against ``d (d + 1) / 2`` to
        form ``A_j``). Four passes per iteration; partials are combined in block order
        (bit-identical on any number of workers). The products run in float32 (the users' rows,
        the directions, each block's partial; summed over blocks in float64): half the bytes of
        the random item rows, 0.78x the CPU time of float64 per product pass (issue 44), rounding
        well inside what three conjugate-gradient steps leave of the exact solve; the users' steps run on float32 tiles,
        as ``implicit``'s. The released model's local solve stays
        exact (:func:`streamdp.kernels.ials.ials_solve_users`). Where they fit within ``--memory-limit`` the blocks'
        pairs and the users' rows stay in memory across the passes and iterations (:meth:`_block_memo`: the rows
        then go to disk only for a ``--checkpoint`` run, which may be resumed). Measured on the 20M-rating bench
        store: ``docs/ranking.md``, ``docs/benchmarks.md``.
        """
        n, d = Y.shape
        Y = np.ascontiguousarray(Y, np.float64)
        YtY = np.ascontiguousarray(Y.T @ Y)
        Y32 = Y.astype(np.float32)
        seed, ridge = run.entropy, float(s.ridge)
        prev, cur = rows[(t - 1) % 2], rows[t % 2]
        memo = self._memo
        Yw, Li = ials_whitened(Y, YtY, ridge) if t == 1 else (None, None)  # the first iteration's exact solve

        def first(block, b):
            hit = None if memo is None else memo.get(b)
            ip, it, conf, w = self._block_pairs(block, b, s, seed)
            if t > 1:  # warm start: the previous iteration's rows (the memo's: this fit's last pass wrote them)
                U = hit[4] if hit is not None and len(hit) > 4 else np.ascontiguousarray(prev.read(b))
                ials_cg_users(ip, it, conf, Y32, YtY, ridge, CG_STEPS, U)  # float32 tiles, as implicit
            else:
                U = np.zeros((len(ip) - 1, d))
                ials_solve_whitened(ip, it, conf, Yw, Li, U)
            # on disk for a resume (--checkpoint) or where the memo has no room; a temporary run is never resumed
            if memo is None or not memo.put(b, (ip, it, conf, w, U)) or not run.own_dir:
                cur.write(b, U)
            R = np.zeros((n, d), np.float32)  # a block's partial in float32 (PRODUCT_DTYPE)
            ials_item_products(ip, it, conf, w, U.astype(np.float32), Y32, R, True)
            return [R, U.T @ U]

        def product(P):
            P32 = P.astype(np.float32)

            def fn(block, b):
                hit = None if memo is None else memo.get(b)
                if hit is not None and len(hit) > 4:
                    ip, it, conf, w, U = hit
                else:
                    ip, it, conf, w = self._block_pairs(block, b, s, seed, sums_only=True)
                    U = cur.read(b)
                out = np.zeros((n, d), np.float32)
                ials_item_products(ip, it, conf, w, U.astype(np.float32), P32, out, False)
                return out

            AP = engine.map_reduce(fn, _add, np.zeros((n, d)), split=split(), extra_per_block=per_block,
                                   desc=desc + " (item products)")
            return AP + P @ G + s.reg * P

        def split():
            return "train" if memo is None else memo.split()

        # per block: the residual's partial, the users' rows (and the exact solve's whitened rows L^-1 y_j), the pairs
        per_block = self._iteration_bytes(store, s)
        R, G = engine.map_reduce(first, _add_each, [np.zeros((n, d)), np.zeros((d, d))], split=split(),
                                 extra_per_block=per_block, desc=desc)
        r = R - Y @ G - s.reg * Y
        p = r.copy()
        rs = np.einsum("ja,ja->j", r, r)
        for _ in range(CG_STEPS):
            if not np.any(rs > CG_TOL):
                break
            Ap = product(p)
            pAp = np.einsum("ja,ja->j", p, Ap)
            step = np.divide(rs, pAp, out=np.zeros(n), where=(pAp > 0) & (rs > CG_TOL))
            Y = Y + step[:, None] * p
            r = r - step[:, None] * Ap
            new = np.einsum("ja,ja->j", r, r)
            p = r + np.divide(new, rs, out=np.zeros(n), where=rs > CG_TOL)[:, None] * p
            rs = new
        return Y, None, 0

    # -- the item solves -----------------------------------------------------------------
    def _solve_items(self, s, sd: float, Y, B, A, G, W, n_users: float) -> np.ndarray:
        """``y_j = (G + A_j + lambda_j I)^-1 B_j`` (the popularity coordinate kept fixed), then shrunk, rescaled;
        ``sd``: the noise scale of the right-hand sides ``B`` (private runs)."""
        n, k = B.shape
        d = G.shape[0]
        lam = np.full(n, float(s.reg))
        if self.private:
            lam = lam + s.noise_ridge * sd * s.clip
            G = psd(G)
        Wn = np.maximum(np.asarray(W, np.float64), 0.0)
        if s.reg_scaled:
            lam = lam * (1.0 + Wn / max(float(n_users), 1.0))
        out = Y.copy()
        if s.gramian == "shared":
            out[:, :k] = solve_shared(B, G, 1.0 + Wn / max(float(n_users), 1.0), lam, Y, k)
        elif not self.private:
            ials_solve_items(B, A, G, np.ones(n), lam, Y, k, out)
        else:  # noisy per-item Gramians: each projected onto the PSD cone first (NumPy, in chunks)
            eye = np.eye(k)
            for a in range(0, n, SOLVE_CHUNK):
                j = np.arange(a, min(n, a + SOLVE_CHUNK))
                M = G[None] + psd(unpack_upper(A[j], d))
                rhs = B[j]
                if s.popularity:
                    rhs = rhs - Y[j, k][:, None] * M[:, :k, k]
                out[j, :k] = np.linalg.solve(M[:, :k, :k] + lam[j, None, None] * eye, rhs[..., None])[..., 0]
        if self.private:
            keep = self._keep if self._keep is not None else np.ones(n, bool)
            out[~keep, :k] = 0.0  # the items below the floor rank by popularity alone
            # the rows' scale first (on the unshrunk solve), so that the shrinkage is not undone by it
            tot = float(np.mean(np.sum(out[keep, :k] ** 2, axis=1))) if keep.any() else 0.0
            if tot > 0:
                out[:, :k] /= math.sqrt(tot)
            if s.shrink:
                nb = np.sum(B ** 2, axis=1)
                out[:, :k] *= np.maximum(0.0, 1.0 - s.shrink * k * sd * sd / np.maximum(nb, 1e-300))[:, None]
        return out

    # -- the released model --------------------------------------------------------------
    def _fitted(self, store, plan, run, Y, N, history) -> Fitted:
        s = plan.settings
        notes = [] if self.private else ["non-private: --epsilon inf, no noise and no contribution bounding"]
        notes += seed_notes(self)
        notes.append("joint DP: the model releases item rows; each user solves her own row locally from them and "
                     "her own interactions (implicit-ALS solve), so her list depends on her data and the release only")
        released = bool(np.any(Y[:, :self.rank]))
        choice = getattr(self, "_choice", None)
        light, below = getattr(self, "_light_choice", None), getattr(self, "_chart_below", 0) if released else 0
        sd = getattr(self, "_choice_sd", None)  # the noise std of each private sum
        lam = getattr(self, "_average_lambda", None)
        if lam is not None and released:
            notes.append(f"--average auto: the released rows were solved from the last iteration's sums moved toward "
                         f"the noise-weighted mean of iterations 2-{s.iters}'s by lambda {lam:.3g} (1: the mean, 0: "
                         f"the last alone; post-processing of the released sums)")
        if choice is not None:
            notes.append(_choice_note(self.private, released, choice, light, below, sd))
        elif s.reused_choice and released:
            reused = (f"--select auto: the choice released by the warm-start model {self.warm.path} ({s.reused_choice}) "
                      f"is reused (post-processing of its model.json): no choice pass and no choice release, its budget "
                      f"share went to the right-hand sides")
            notes.append(reused)
        elif self.private and not released:
            notes.append(f"no factors released: at this epsilon they carried too little signal above the noise "
                         f"(the last iteration's noisy right-hand sides stood less than {SIGNAL_Z:g} noise standard "
                         f"deviations above pure noise); the lists are the chart by the released counts (the "
                         f"popularity column)")
        if self.warm is not None:
            notes.append(self.warm.note())
        topk = getattr(self, "_topk", None)
        if topk is not None:
            notes.append(f"the chart (the popularity column, the released noisy_item_weight) lists first the "
                         f"{len(topk)} items of a private top-{len(topk)} selection, in its order, then the rest by "
                         f"the released counts: on a store this thin the counts' noise over its {store.n_items:,} items "
                         f"swamps their top (streamdp.privacy.topk)")
        ledger = self.ledger(store, plan, notes=notes)
        pop_column = s.popularity or Y.shape[1] > self.rank  # a non-private run's chart (:func:`_chart_rows`)
        info = {"method": self.name, "factors_released": released, "rank": self.rank,
                **({"n_items_with_factors": int(self._keep.sum()) if released else 0} if self._keep is not None else {}), "epsilon": self.epsilon if self.private else "inf",
                "delta": self.delta, "seed": self.seed, "n_users": self.n_users(store), "n_items": store.n_items,
                "parameters": {key: getattr(s, key) for key in MODEL_PARAMETERS},
                "resumed_from_iteration": run.start - 1 if run.start > 1 else None, "run_id": run.run_id,
                "run_directory": None if run.own_dir else run.dir,
                "local": self.LOCAL_SOLVER, "local_user_bias": False, "local_implicit": s.local(),
                "ridge": s.ridge,
                **({"rating_range": {"min": s.rating_min, "max": s.rating_max}} if s.rating_min is not None else {}),
                # its scores are preferences that already hold the released popularity (its column): no rating blend
                "list_scorer": {"kind": "predicted_rating"},
                "iterations_run": len(history) + (run.start - 1), "popularity_column": pop_column,
                "item_factors": ("implicit-ALS item rows [y_j, popularity log(1 + N_j) / log(1 + max N)]; scores "
                                 "rank items, they are not ratings" if pop_column else
                                 "implicit-ALS item rows; scores rank items, they are not ratings")}
        if s.profile is not None:
            info["user_profile"] = s.profile.to_dict()
        if self.warm is not None:
            info["warm_start"] = self.warm.describe()
        if topk is not None:
            info["chart"] = {"kind": "top-k selection", "k": int(len(topk)),
                             "then": "the released item counts (noisy_item_weight holds the chart's scores)"}
        if choice is not None:
            info["selection"] = {**_selection_record(self.private, released, choice, light, below, sd),
                                 **sample_record(s.validation_rate)}
        elif s.reused_choice and released:
            info["selection"] = {"chosen": s.reused_choice, "reused_from": self.warm.path,
                                 **({"chart_below": int(below)} if below else {}), "why": reused}

        n = store.n_items
        return Fitted(item_factors=np.asarray(Y, np.float32), item_bias=np.zeros(n, np.float32),
                      item_ids=store.item_ids(), global_mean=0.0, model_info=info, ledger=ledger,
                      owner={"users_clipped_by_iteration": list(history)},
                      extras={"noisy_item_weight": np.asarray(N, np.float64)}, per_item_extras=("noisy_item_weight",))


def _selection_record(private: bool, released: bool, choice: float, light: float | None, below: int,
                      sd: float | None = None) -> dict:
    """``model.json``'s ``selection``: the candidates, what was chosen for whom, the (noisy) validation losses
    (minus the sums of :meth:`IALS._class_sums`) and why. ``chart_below``: users of fewer training items than this
    get the chart by the released counts from their local solve (:func:`streamdp.serving.local.implicit_rows`).
    ``noise_std``: the noise standard deviation of each sum (a private run's; the margin is 3 of it).

    >>> r = _selection_record(True, True, 59.0, -4.0, 5, 1.0)
    >>> r["chosen"], r["chart_below"], [c["chosen"] for c in r["classes"]]
    ('factors for users of 5 or more training items, the chart by the released counts for the others', 5, ['factors', 'chart by the released counts'])
    """
    chart = "chart by the released counts"  # a non-private run's: the exact counts, released
    heavy = "factors" if released else chart
    rec = {"candidates": ["factors", chart]}
    if light is None:
        rec["chosen"] = heavy
    else:
        lighter = chart if below else heavy
        rec["chosen"] = heavy if lighter == heavy else (f"factors for users of {below} or more training items, "
                                                        f"the {chart} for the others")
        rec["classes"] = [{"users": f"{HOLDOUT_MIN_COUNT} or more training items", "min_items": HOLDOUT_MIN_COUNT,
                           "chosen": heavy, "sum": round(choice, 4)},
                          {"users": f"fewer than {HOLDOUT_MIN_COUNT} training items (validated by those of 2-"
                                    f"{HOLDOUT_MIN_COUNT - 1}, one item each, left in the iterations)",
                           "max_items": HOLDOUT_MIN_COUNT - 1, "chosen": lighter, "sum": round(light, 4)}]
        rec["chart_below"] = int(below)
    losses = [round(-choice, 4)] + ([] if light is None else [round(-light, 4)])
    rec["noisy_validation_losses" if private else "validation_losses"] = losses
    if sd is not None:
        rec["noise_std"] = round(sd, 4)
    rec["why"] = _choice_note(private, released, choice, light, below, sd)
    return rec


def _choice_note(private: bool, released: bool, choice: float, light: float | None = None, below: int = 0,
                 sd: float | None = None) -> str:
    """The ledger's note (and ``train``/``evaluate``'s ``choice:`` line) on the choice between factors and chart;
    ``sd`` the noise standard deviation of each private sum (:meth:`IALS._chart_wins`'s margin is 3 of it).

    >>> _choice_note(False, False, -3.0)[:59]
    'the chart by the exact training counts was released instead'
    >>> _choice_note(True, True, 59.0, -4.0, 5, 1.0)[:96]
    'the factors were kept for users of 5 or more training items; users of fewer get the chart by the'
    >>> _choice_note(True, False, 20.0, 1.0, 0, 10.0)[:119]
    "the factors were dropped, no factors released: each user's held-out items (out of the iterations) were not clearly more"
    """
    how = (f"each user's held-out items (out of the iterations) were {'more' if released else 'not more'} often in "
           f"the model's top {SELECT_K} than in the chart's")
    if private:
        if light is None:
            sums = f"noisy sum of the differences {choice:.4g}"
        else:
            sums = (f"noisy sums of the differences: users of {HOLDOUT_MIN_COUNT}+ items {choice:.4g}, of "
                    f"2-{HOLDOUT_MIN_COUNT - 1} items {light:.4g}")
        margin = None if sd is None else MARGIN * sd
        if margin is not None:
            sums += f"; noise std {sd:.3g} each, the factors kept only above {MARGIN:g} of it"
        if released and below:
            return (f"the factors were kept for users of {below} or more training items; users of fewer get the chart "
                    f"by the released counts from their local solve: the held-out items of users of {below}+ items "
                    f"(out of the iterations) were more often in the model's top {SELECT_K} than in the chart's, "
                    f"those of users of 2-{below - 1} items (one each, left in the iterations) clearly less often "
                    f"({sums})")
        outweighed = light is not None and (choice > 0.0 if margin is None else choice > margin and light < -margin)
        if not released and outweighed:  # the light users outweighed the heavier ones
            return (f"the factors were dropped, no factors released: the held-out items of users of "
                    f"{HOLDOUT_MIN_COUNT}+ items (out of the iterations) were more often in the model's top {SELECT_K} "
                    f"than in the chart's, but those of users of 2-{HOLDOUT_MIN_COUNT - 1} items (one each, left in the "
                    f"iterations) clearly less often, and by more ({sums})")
        who = " for every user" if released and light is not None else ""
        if margin is not None:
            how = how.replace(" were not more often", " were not clearly more often").replace(
                " were more often", " were clearly more often")
        return (f"the factors were {'kept' + who if released else 'dropped, no factors released'}: {how} ({sums})")
    what = ("the factors were kept over the chart by the exact training counts" if released else
            "the chart by the exact training counts was released instead of the factors")
    return f"{what} (--select auto): {how} (exact sum over users of the differences in hits per held-out item " \
           f"{choice:.4g})"


def default_alpha(pairs_per_user: float) -> float:
    """A non-private run's ``--alpha`` when not given: :data:`SPARSE_ALPHA` (10) on a store of at most
    :data:`SPARSE_PAIRS` (10) training pairs per user on average, else :data:`DEFAULT_ALPHA` (3).

    Issue 42, part 2: with a pair or two per user her row is solved from those alone, and a larger confidence pulls
    it closer to them against the weak zeros of the other items. Measured non-private (16 factors, seed 1, Recall@10
    alpha 3 -> 10): four generated stores of 1.5-8 pairs per user gain 2-6% (72k x 2.4k 0.652 -> 0.690, another
    0.566 -> 0.594, 20k x 3k 0.523 -> 0.532, 30k x 2k 0.361 -> 0.368); the denser ones lose 6-13% (ML-100K, 85 per
    user, 0.312 -> 0.290; a 6,040 x 3,706 store of 131 0.243 -> 0.221, as a log 0.198 -> 0.185; FilmTrust, 19 per
    user, the chart 0.653 -> 0.645): they keep 3. Private runs keep 3 (the product shape at epsilon 10: 0.629 ->
    0.623; the mean would need a release of its own). The table: ``docs/design-notes.md``.

    >>> default_alpha(1.6), default_alpha(85.0)
    (10.0, 3.0)
    """
    return SPARSE_ALPHA if pairs_per_user <= SPARSE_PAIRS else DEFAULT_ALPHA


def default_preference(private: bool, thin_chart: bool = False) -> str:
    """``--preference`` on a rating store when not given: :data:`PRIVATE_PREFERENCE` (``above``: only ratings above
    the range's midpoint are positives) in a private run, :data:`DEFAULT_PREFERENCE` (``binary``) in a non-private
    one and in a private one whose chart is a top-K selection (``thin_chart``: the released counts' noise swamps
    their top, :func:`streamdp.privacy.topk.topk_chart`).

    Issue 42 (a thin store's lists at epsilon 10): under a user's bound of L2 norm ``sqrt(tau)`` spread over her
    pairs above the item floor, each pair's weight is ``sqrt(tau / n_u)``, so an item's right-hand side stands
    above its noise by about ``sum_u 1 / sqrt(n_u)``: the fewer (and the more telling) pairs a user has, the more
    each carries. Her liked items are fewer, and they are the ones the lists are judged by (``evaluate``'s relevance,
    the top of the range). Measured (Recall@10, every user, binary -> above, ``docs/design-notes.md``): a 600 x
    10,000 generated store at epsilon 10 0.0987 / 0.1002 / 0.0996 -> 0.1127 / 0.1135 / 0.1151 (seeds 1-3); ML-100K
    at epsilon 10 0.256 / 0.251 -> 0.299 / 0.300, at epsilon 1 (the chart alone) 0.145 -> 0.158 (mean of 5 seeds,
    above in each); its first 200 users (1,420 items) at 10 +3 to +10% (3 seeds); FilmTrust within 0.005 at 1 and
    10; the 72,000-user product shape +0.6% / +1.2% at 1 / 10.

    Where the chart is a top-K selection the release is mostly the chart, and a chart of the liked pairs alone has
    fewer counts under the same noise: the 600 x 10,000 store at epsilon 1 0.0250 -> 0.0222, 0.69x -> 0.61x the
    exact chart (7 seeds, 5 lower); a 300 x 3,000 store without taste clusters (half its ratings above the
    midpoint) found 1.7 of the exact top 10 against 6.7 (seeds 1-3). There every rating counts (``binary``, as
    before); ML-100K at epsilon 1 (a top-K chart too) would gain 9% with ``above`` but keeps ``binary`` by the same
    rule. Non-private runs keep ``binary`` (ML-100K 0.284 / 0.289 with 64 factors: a tie, and the measurements of
    their defaults stand).

    >>> default_preference(True), default_preference(True, thin_chart=True), default_preference(False)
    ('above', 'binary', 'binary')
    """
    return PRIVATE_PREFERENCE if private and not thin_chart else DEFAULT_PREFERENCE


def private_max_confidence(o) -> float:
    """A private run's confidence cap on an implicit store: ``--max-confidence`` when given, else ``1 + alpha``
    (at most the option's default, 21): the bound of a rating store's pairs (``f <= 1``).

    Why (issue 42, part 3): the right-hand sides ``B_j`` and totals ``W_j`` are noised for the cap, not for the
    confidences the data has. A log's cap was 21 where a pair of count 1 has ``1 + alpha log 2`` = 3.08: ``B``'s
    noise 5.25x a rating store's (whose cap and confidence are both 4), so the factors reached 1.10x the chart and
    the choice rightly dropped them; the held-out relevance of every interaction, the margin and the budget split
    were not the cause. Measured (``docs/design-notes.md``): an epsilon-1 log listed the chart, 0.069, and lists
    1.7x it with the cap at 4; on a log of repeat counts 4 also beat 8 and 21 at epsilon 1 and 10. A non-private
    run pays no noise for the cap and keeps 21.

    >>> from types import SimpleNamespace
    >>> o = SimpleNamespace(alpha=3.0, max_confidence=21.0, is_given=lambda name: False)
    >>> private_max_confidence(o), private_max_confidence(SimpleNamespace(**{**vars(o), "alpha": 40.0}))
    (4.0, 21.0)
    """
    if o.is_given("max_confidence"):
        return float(o.max_confidence)
    return float(min(o.max_confidence, 1.0 + o.alpha))


def tau_from_profile(hist) -> int:
    """``tau`` from a noisy histogram over :data:`~streamdp.methods._profile.EDGES`: the top of the bin where
    :data:`TAU_QUANTILE` of the users are reached, within :data:`TAU_BOUNDS` (post-processing).

    A bound above most users' counts costs noise on every release and buys little (measured, Recall@10 at
    epsilon 1 / 10, 2 seeds, tau 16 / 24 / 32: ML-100K, 106 ratings per user, 0.120 / 0.130 / 0.139 and
    0.207 / 0.222 / 0.227; the clustered 10,000-user bench store, 16 per user, 0.184 / 0.180 / 0.175 and
    0.287 / 0.287 / 0.284).

    >>> h = np.zeros(len(EDGES)); h[list(EDGES).index(16)] = 80.0; h[list(EDGES).index(48)] = 20.0
    >>> tau_from_profile(h)
    23
    """
    c = np.maximum(np.asarray(hist, np.float64), 0.0)
    if c.sum() <= 0:
        return TAU_BOUNDS[1]
    i = int(np.searchsorted(np.cumsum(c), TAU_QUANTILE * c.sum()))
    top = int(EDGES[i + 1]) - 1 if i + 1 < len(EDGES) else TAU_BOUNDS[1]
    return int(min(max(top, TAU_BOUNDS[0]), TAU_BOUNDS[1]))


def private_rank(s, N, sd: float, rank: int) -> int:
    """A private run's number of factors when ``--rank`` is not given: ``rank`` (:data:`DEFAULT_RANK`), or
    :data:`LOW_RANK` when the released counts are low against the noise at ``rank`` factors. The unit is
    :func:`item_floor_count` with ``f = 1`` (the count at which an item's right-hand side can at most equal its
    noise); ``rank`` is kept when the mean item's count reaches :data:`RANK_SNR` (1) unit, or when at least
    :data:`RANK_ITEMS` (32) items per factor reach one unit.

    Post-processing of the released counts, the noise scale and public bounds; no release is added and no
    sensitivity changes (the sensitivities bound a user's row whatever its length). Every factor adds noise to
    every item row: where users hold few items or epsilon is small, 8 factors carry more of the signal than 16.
    The second test is for a long catalogue, whose tail (items below the floor, without factors at any rank)
    drags the mean down while hundreds of items carry signal: a 600 x 10,000 store of ~130 ratings per user
    (mean 0.35 / 0.73 unit at epsilon 30 / 100, 681 / 1,808 items above it) lists at 0.141 / 0.156 with 8
    factors, 0.152 / 0.178 with 16. Where 8 win it stays below both tests: ML-100K at epsilon 5 / 10 (mean
    0.42 / 0.72 unit, 21 items per factor at 10; 0.267 / 0.299 with 8, 0.180 / 0.292 with 16), the product
    shape at epsilon 1 (0.26 unit; 0.504 against 0.451), a repeat-count log at epsilon 1 (0.58; 0.260 against
    0.251). The threshold was 3 units before: the product shape at epsilon 10 (1.55 units) now takes 16 factors,
    0.571 -> 0.622 (Recall@10, seed 1, every user; the table: ``docs/benchmarks.md``, thin-600).

    >>> from types import SimpleNamespace
    >>> s = SimpleNamespace(conf_cap=4.0, clip=0.4)
    >>> private_rank(s, np.full(100, 20.0), 10.0, 16), private_rank(s, np.full(100, 40.0), 10.0, 16)
    (8, 16)
    >>> tail = lambda m: np.where(np.arange(10_000) < m, 30.0, 0.0)  # m items at 30 >= 25, the rest 0: mean < 25
    >>> private_rank(s, tail(600), 10.0, 16), private_rank(s, tail(300), 10.0, 16)  # 37.5 / 18.75 items per factor
    (16, 8)
    """
    if rank <= LOW_RANK:
        return int(rank)
    unit = math.sqrt(rank) * float(sd) / (float(s.conf_cap) * float(s.clip))
    N = np.maximum(np.asarray(N, np.float64), 0.0)
    mean = float(np.mean(N)) if len(N) else 0.0
    above = int(np.count_nonzero(N >= unit))
    return int(rank) if mean >= RANK_SNR * unit or above >= RANK_ITEMS * rank else LOW_RANK


def _with_rank(plan, k: int, d: int):
    """``plan`` with the releases' shapes for ``k`` factors (``d`` coordinates per row): the ledger's description
    only (a shape changes no noise scale)."""
    shapes = {"rhs": lambda sh: (sh[0], k), "gram": lambda sh: (d, d), "agram": lambda sh: (sh[0], d, d)}
    rel = dict(plan.releases)
    new = {}
    for name, f in [(name + last, f) for name, f in shapes.items() for last in ("", "_last")]:
        if name in rel:
            new[rel[name].what] = rel[name] = replace(rel[name], shape=f(rel[name].shape))
    entries = [new[e["release"]].entry() if e.get("release") in new else e for e in plan.entries]
    return replace(plan, releases=rel, entries=entries)


def item_floor_count(s, sd: float, k: int) -> float:
    """The released count an item needs to get factors: ``f sqrt(k) sigma_B / (c_max Delta)``, ``f = --item-floor``.

    An item of ``N_j`` users has a right-hand side ``B_j = sum_u c_uj x_u`` of norm at most
    ``N_j c_max Delta`` (clipped rows), against noise of norm about ``sqrt(k) sigma_B``; below
    the floor its row is noise at best, and the users' bounded pairs are better spent on the
    items above it (Chien et al. 2021 train DP-ALS on the most frequent items only). A
    function of public parameters, the noise scale and the released counts.

    >>> from types import SimpleNamespace
    >>> item_floor_count(SimpleNamespace(item_floor=1.0, conf_cap=4.0, clip=0.5), 2.0, 16)
    4.0
    """
    return float(s.item_floor) * math.sqrt(k) * float(sd) / (float(s.conf_cap) * float(s.clip))


def _bounded_weights(ip, it, s, first_user: int, seed: int, keep=None, N=None) -> np.ndarray:
    """A private run's item-side weight of each pair: the user's bounded contribution over the pairs of the items
    in ``keep`` (all without), uniform (``tau`` of them) or adaptive (``--item-weights``, by the released ``N``);
    0 on the rest, and in the iterations (``N`` given) 0 for a user of fewer than ``--min-pairs`` pairs in ``keep``
    (:func:`_without_lone`). The counts (``N`` not given, ``--count-weights spread``): every pair, weight
    ``min(1, sqrt(tau / n_u))`` (:func:`spread_weights`)."""
    if N is None and keep is None and getattr(s, "count_weights", "uniform") == "spread":
        return spread_weights(ip, it, s.tau)
    rule = "adaptive" if s.item_weights == "adaptive" and N is not None else "uniform"
    extra = dict(item_counts=N, exponent=s.adaptive_exponent) if rule == "adaptive" else {}
    lone = s.min_pairs if N is not None else 1  # the iterations only (the counts are the chart: every user)
    if keep is None or keep.all():
        w = contribution_weights(ip, it, rule=rule, tau=s.tau, norm="l2", first_user=first_user, seed=seed,
                                 **extra)
        return _without_lone(np.asarray(ip, np.int64), w, lone)
    m = keep[it]
    sub_ip = np.empty(len(ip), np.int64)
    masked_indptr(np.asarray(ip, np.int64), m, sub_ip)
    sub = contribution_weights(sub_ip, it[m], rule=rule, tau=s.tau, norm="l2", first_user=first_user, seed=seed,
                               **extra)
    w = np.zeros(len(it))
    w[m] = _without_lone(sub_ip, sub, lone)
    return w


def spread_weights(indptr, items, tau: int) -> np.ndarray:
    """``min(1, sqrt(tau / n_u))`` on every pair of a user of ``n_u`` pairs: the released counts' weights
    (``--count-weights spread``). Her weights' L2 norm is ``sqrt(min(n_u, tau))`` at most, the bound of a uniform
    sample of ``tau`` pairs of weight 1 (the same sensitivity and noise), and a user of at most ``tau`` pairs counts
    exactly as there; a heavier user's pairs all count, each less, instead of a random ``tau`` of them, so the
    counts carry no sampling noise. Measured on a 600-user x 10,000-item store of ~160 ratings per user at epsilon 1
    (3 seeds, ``tests/methods/test_ials_chart.py``): the chart by the released counts listed at 0.36x the exact
    chart with the uniform sample, 0.74x spread (``docs/ranking.md``).

    >>> w = spread_weights(np.array([0, 2, 10]), np.arange(10, dtype=np.int32), 2)
    >>> w[:2].round(9).tolist(), round(float(np.sum(w[2:] ** 2)), 9)
    ([1.0, 1.0], 2.0)
    """
    w = contribution_weights(indptr, items, rule="adaptive", tau=tau, norm="l2")
    return np.minimum(w, 1.0)


def _without_lone(indptr, w, min_pairs: int):
    """``w`` with the pairs of the users of fewer than ``min_pairs`` pairs set to 0 (in place; ``--min-pairs``).

    >>> _without_lone(np.array([0, 1, 3, 6]), np.ones(6), 2).tolist()
    [0.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    """
    if min_pairs > 1:
        per = np.diff(indptr)
        w[np.repeat(per < min_pairs, per)] = 0.0
    return w


def _signal_z(B, sd: float) -> float:
    """How far the noisy right-hand sides ``B`` (``n x k``) stand above their noise, in standard deviations.

    Under pure noise ``||B_j||^2 / sd^2`` is chi-square with ``k`` degrees of freedom, so
    ``sum_j ||B_j||^2 / sd^2 - n k`` has mean 0 and standard deviation ``sqrt(2 n k)``; the
    z-score of the observed sum is a test for any signal at all (released values only).
    Measured (epsilon 1 / 10, after 3 iterations): ML-100K 0.8 / 50, the clustered
    10,000-user bench store 40 / 3000; ML-100K at epsilon 1 released factors that put its
    lists at 0.93x the chart by its own counts.

    >>> round(_signal_z(np.ones((200, 4)), 1.0), 3)
    0.0
    """
    n, k = B.shape
    if sd <= 0 or n * k == 0:
        return math.inf
    return float((np.sum(B * B) / (sd * sd) - n * k) / math.sqrt(2.0 * n * k))


def solve_shared(B, G, scale, lam, Y, k: int) -> np.ndarray:
    """``x_j = (scale_j G + lam_j I)^-1 (B_j - Y[j, k] scale_j G[:k, k])`` over ``[:k]`` for every item at once
    (``--gramian shared``; the popularity coordinate ``Y[j, k]`` fixed when ``G`` has ``k + 1`` rows).

    Every item's system is the one Gramian up to its scale and ridge, so one eigendecomposition ``G[:k, :k] = Q
    diag(e) Q^T`` solves them all: ``x_j = Q diag(1 / (scale_j e + lam_j)) Q^T rhs_j``, two ``n x k x k`` BLAS
    products where a Cholesky per item cost ``k^3 / 6`` each (20,000 items at ``k = 64``: 0.13 CPU s, issue 44);
    the same solution within rounding (``lam_j > 0``; ``G`` positive semi-definite, :func:`~streamdp.methods._psd.psd`).
    """
    rhs = np.asarray(B, np.float64)[:, :k]
    if G.shape[0] > k:
        rhs = rhs - (scale * Y[:, k])[:, None] * G[None, :k, k]
    e, Q = np.linalg.eigh(G[:k, :k])
    return ((rhs @ Q) / (scale[:, None] * e[None, :] + lam[:, None])) @ Q.T


def _add_each(acc, part):
    """Element-wise :func:`~streamdp.stream.engine.add_into` of lists of arrays (a pass's several sums)."""
    for a, b in zip(acc, part):
        a += b
    return acc


def _chart_rows(N, k: int) -> np.ndarray:
    """A non-private run's release of the chart: ``k`` zero factor columns and the popularity column of the exact
    counts ``N`` (:func:`_popularity`), the rows a private run releases when its factors lose. Each user's local solve
    gives her a weight ``>= 0`` on the column (``> 0`` with an item of count ``> 0``), so her list is the chart
    (ties by the same key).

    >>> _chart_rows(np.array([2.0, 4.0]), 2).tolist()
    [[0.0, 0.0, 0.5], [0.0, 0.0, 1.0]]
    """
    Y = np.zeros((len(N), k + 1))
    Y[:, k] = _popularity(N)
    return Y


def _popularity(N) -> np.ndarray:
    """``max(N_j, 0) / max N``: the popularity column from (noisy) counts, in ``[0, 1]``.

    Linear, not logarithmic: the top of the chart must stand out from the rest in the
    users' scores, or noise in the factors reorders it (measured on ML-100K at epsilon 1:
    log(1 + N) / log(1 + max N) gave Recall@10 0.015 against the released chart's 0.064).
    """
    p = np.maximum(np.asarray(N, np.float64), 0.0)
    top = float(p.max()) if len(p) else 0.0
    return p / top if top > 0 else p
