"""Private hyperparameter tuning: ``streamdp tune``, the library side.

``tune(STORE, epsilon=E, method="als", grid={"rank": [4, 8], "iters": [0, 5]})``
trains every configuration of the grid privately on a Poisson sample of the users
(each user's training ratings minus a few held out; above 100,000 users, a keyed sample's: ``--select auto``'s),
scores them on the held-out ratings with one noisy release, picks one, trains the picked configuration
on every training rating and writes it: all of it in ONE ledger whose PLD epsilon at
the run's delta is at most ``E``, the whole ``E`` reserved in the store's budget
before any candidate reads a rating. Public names: :func:`tune`, :func:`default_grid`,
:func:`parse_grid`, :func:`tunable_methods`, :func:`config_name`, :func:`sampled_users`,
:func:`gaussian_equivalent`, :func:`hits_sensitivity`, :data:`HITS_K` and the shares :data:`SAMPLE_RATE`,
:data:`SELECT_SHARE`, :data:`CANDIDATE_NOMINAL_SHARE`.

Decisions a reader must know:

* **the choice** is that of the private defaults (:mod:`streamdp.methods._selection`):
  report-noisy-min over the candidates' summed clipped losses (L2 sensitivity
  ``h^2 sqrt(m)``), keeping the default unless another, not leaner (:func:`_leaner`), is
  lower by ``MARGIN`` noise stds; not Papernot-Steinke random stopping. A method whose scores
  rank items (``ials``, ``Method.TUNE_SCORE == "hits"``) is scored by its held-out hits in each
  user's top 10 instead (:func:`_hits`, each user in ``[0, 1]``: L2 sensitivity ``sqrt(m)``,
  :func:`hits_sensitivity`), chosen by report-noisy-max with the margin mirrored, and neither a
  leaner nor a noise-favoured configuration (:func:`_favoured_by_noise`) replaces the default;
* **the budget**: candidates are planned at ``E sqrt(CANDIDATE_NOMINAL_SHARE / m)`` and
  trained on a keyed Poisson sample (amplification makes them cheap), the losses take
  :data:`SELECT_SHARE` of the squared scale, the released model the rest (about
  0.977 E); when the losses' noise would swamp a 5% difference, nothing is tuned and
  the default is trained at the whole ``E``;
* **every candidate is accounted though none is released**: all releases are
  Gaussian, every final configuration is calibrated under one envelope Gaussian of
  multiplier ``z_f`` (:func:`_calibrated`), so the adaptive choice composes as fixed
  Gaussians; that is why ``mechanism`` is no grid key;
* **reservation**: the whole ``E`` (the envelope) is reserved before any candidate reads
  a rating; a failure or Ctrl-C before the model is in place marks it failed.

The run's stages are the functions :func:`tune` calls in order (check, plan the choice,
pin the iterations, plan the candidates, run and choose, release). The reasoning in
full and the measurements (``bench/tune.py``): ``docs/design-notes.md``, section
``streamdp/workflows/tune.py``, and ``docs/tune.md``.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from types import SimpleNamespace

import numpy as np
from dp_accounting import GaussianDpEvent, PoissonSampledDpEvent, SelfComposedDpEvent
from dp_accounting import dp_event as E

from streamdp.errors import BudgetExceededError, Interrupted, ParameterError
from streamdp.kernels.topk import TILE_BYTES, topn_blocked, topn_prepare
from streamdp.methods import METHODS, get_method, load_builtin
from streamdp.methods._profile import user_profile
from streamdp.methods._selection import (MARGIN, MIX, choose, holdout, loss_sensitivity, mix, sample_record,
                                         validating_users, validation_rate)
from streamdp.methods.als import PROFILE_STREAM, RNG_KEY, SELECT_USEFUL, default_settings
from streamdp.methods.base import Method, Plan, user_count_for
from streamdp.methods.options import MethodOptions
from streamdp.privacy import calibrate, calibrate_gaussian, check_privacy_params, compose, epsilon_of, gaussian_event
from streamdp.privacy.accountant import check_calibratable, parse_epsilon
from streamdp.privacy.budget import StoreBudget
from streamdp.privacy.catalogue import declared_items
from streamdp.privacy.rating_range import catalogue_and_range_for
from streamdp.privacy.params import default_delta
from streamdp.privacy.release import Release
from streamdp.serving.evaluate import solve_rows
from streamdp.serving.local import list_bias, local_design, model_ridge, predict_block, solve_block
from streamdp.serving.model import check_model_destination
from streamdp.serving.ranking import DEFAULT_K, default_threshold
from streamdp.storage.store import Block, RatingStore, open_store
from streamdp.storage.timeline import check_contributions, data_period
from streamdp.storage.view import StoreView
from streamdp.stream.engine import Engine, add_into
from streamdp.workflows.training import default_method, release, run_summary

__all__ = ["tune", "parse_grid", "default_grid", "tunable_methods", "hits_sensitivity", "SELECT_SHARE", "SAMPLE_RATE",
           "CANDIDATE_NOMINAL_SHARE", "HITS_K"]

def tunable_methods() -> list[str]:
    """The registered methods ``tune`` runs (``Method.TUNABLE``: Gaussian releases planned in full)."""
    load_builtin()
    return sorted(n for n, c in METHODS.items() if c.TUNABLE)
#: Share of the squared epsilon scale the noisy losses get (see the module docstring).
SELECT_SHARE = 0.02
#: Each candidate's noise is what it would be at ``E sqrt(CANDIDATE_NOMINAL_SHARE / m)`` on every user; run on a
#: Poisson sample of users at :data:`SAMPLE_RATE`, all ``m`` together cost well under 1% of ``E`` (subsampling).
CANDIDATE_NOMINAL_SHARE = 0.12
SAMPLE_RATE = 0.2
#: Grid keys that cannot be tuned: run plumbing, or (mechanism) what the adaptive choice's argument needs fixed.
_FORBIDDEN = {"checkpoint": "a run directory, not a hyperparameter", "select": "tune makes the choice itself",
              "mechanism": "tuning runs are Gaussian (the adaptive choice of the released model needs it)"}
_SELECT_RNG = 0x70E
#: List length of the held-out hits (methods scored by them: :func:`_hits`): ``evaluate``'s default ``k``.
HITS_K = DEFAULT_K
#: The largest value of a grid key whose value is work (each candidate runs it): beyond the options' own limits, so
#: that ``--grid iters=1000000`` is one line, not a run that never ends. Decision: 10x and more the defaults (private
#: als runs 0-9 iterations, 15 non-private; irls 2 reweighting steps), and ranks of the regime als is built for.
GRID_MAX = {"rank": 512, "iters": 100, "irls_iters": 50, "select_after": 100}
#: The most configurations a grid may have (each is a candidate run; their noise grows with their number).
MAX_CONFIGS = 64


def default_grid(method: str, store, epsilon: float) -> dict[str, list]:
    """The grid when ``--grid`` is absent: ``als``/``irls`` rank 4 and 8, ``means`` with and without the users'
    own intercepts, ``ials`` its default rank, 32 and 64 factors (at most the store's items) by two alphas
    (:func:`_ials_grid`): six configurations.

    Not ``iters=0`` against factors: the released model's own ``--select auto`` makes that
    choice at the released model's epsilon, where the candidates here, at a fraction of
    it, favour the biases (measured on a generated 20,000-user store at epsilon 1: with
    ``iters=0,7`` in the grid tune chose the biases, test RMSE 1.008 against the default's
    0.942). Without ``iters`` in the grid every configuration's iterations come from one
    released histogram of ratings per user, as ``train``'s do.
    """
    if method == "means":
        return {"user_intercept": [False, True]}
    if method == "ials":
        return _ials_grid(store)
    return {"rank": [4, 8]}


def _ials_grid(store) -> dict[str, list]:
    """``ials``' default grid from public parameters only: ranks ``{default, 32, 64}`` (at most the items) by alphas
    ``{1, default}`` (``{1, 10}`` if the default is 1).

    The default rank is ``None`` (shown ``rank=auto``): the configuration trains as ``train`` does without
    ``--rank``, its private rule choosing 16 or 8 factors from the released counts
    (:func:`streamdp.methods.ials.private_rank`) at the candidate's epsilon and again at the released model's.
    Decision: with 16 given, the default candidate was not ``train``'s default where the rule takes 8, and tune
    listed below ``train`` (600 x 10,000 generated store at epsilon 10: 0.108 against 0.121).

    Why these two keys: on sparse product data ``--rank 64 --alpha 10`` alone took non-private ``ials`` from 0.73x
    to 0.88x ``implicit``'s ALS (issue 42). Why no alpha above the default: a larger alpha is favoured by the
    candidates' noise and may not replace the default (:func:`_favoured_by_noise`), so its candidates could never be
    chosen. The regularisation and the count share are left at their defaults (``--grid reg=...`` /
    ``count_share=...`` tune them): each key multiplies the candidates, and the noise of the choice grows with their
    square root.
    """
    cls = get_method("ials")
    m = cls(epsilon=1.0, delta=1e-6)
    m.check_rank(store.n_items)
    ranks = [None, *(r for r in (32, 64) if m.rank < r <= store.n_items)]
    a = float(next(o for o in cls.OPTIONS if o.name == "alpha").default)
    return {"rank": ranks, "alpha": sorted({a, 1.0 if a != 1.0 else 10.0})}


def _pins_iters(cls: type[Method]) -> bool:
    """Whether ``cls``' iterations come from a released histogram of ratings per user (``als``, ``irls``): tune then
    releases it once and sets every configuration's iterations from it (:func:`_pinned_iters`)."""
    return "FIXED_ITERS" in dir(cls) and cls.FIXED_ITERS is None


def _public_iters(n_users: int, store, epsilon: float, rank: int = 8) -> int:
    """``als``' default number of iterations from public quantities only (the run's released or declared number of
    users, no released profile)."""
    return default_settings(n_users, store.n_items, epsilon, rank).iters


def parse_grid(specs, cls: type[Method]) -> dict[str, list]:
    """``["rank=4,8", "iters=0,5"]`` -> ``{"rank": [4, 8], "iters": [0, 5]}``, each value checked by its option.

    Keys are ``rank`` (``auto``: ``None``, the method's own default, by its rule where it has one) and the method's
    options (``-`` or ``_``); a bad key, a repeated
    key, an empty or repeated value, a value its option refuses, a value of work above
    :data:`GRID_MAX` or more than :data:`MAX_CONFIGS` configurations is a
    ``ParameterError`` naming ``--grid``.
    """
    declared = {o.name: o for o in cls.OPTIONS}
    out: dict[str, list] = {}
    for spec in specs:
        key, sep, values = str(spec).partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key or not values.strip():
            raise ParameterError(f"--grid {spec!r}: expected KEY=V1,V2,... (e.g. rank=4,8,16)")
        if key in _FORBIDDEN:
            raise ParameterError(f"--grid {spec!r}: {key} cannot be tuned ({_FORBIDDEN[key]})")
        if key != "rank" and key not in declared:
            keys = ", ".join(["rank"] + sorted(k for k in declared if k not in _FORBIDDEN))
            raise ParameterError(f"--grid {spec!r}: {key!r} is not an option of --method {cls.name} "
                                 f"(choose from {keys})")
        if key in out:
            raise ParameterError(f"--grid {spec!r}: {key} is given twice")
        vals = []
        for raw in values.split(","):
            raw = raw.strip()
            try:
                if key == "rank" and raw.lower() == "auto":
                    v = None
                elif key == "rank":
                    v = float(raw)
                    if not v.is_integer() or v < 1:
                        raise ValueError
                    v = int(v)
                else:
                    v = declared[key].check(raw)
            except (ValueError, ParameterError) as exc:
                why = str(exc) if isinstance(exc, ParameterError) else "--rank must be a positive integer or auto"
                raise ParameterError(f"--grid {spec!r}: {raw!r}: {why}") from None
            if v in vals:
                raise ParameterError(f"--grid {spec!r}: {raw!r} is given twice")
            if key in GRID_MAX and v is not None and v > GRID_MAX[key]:
                raise ParameterError(f"--grid {spec!r}: {raw!r}: {key} is at most {GRID_MAX[key]} in a tuning grid "
                                     f"(every candidate runs it)")
            vals.append(v)
        out[key] = vals
    n = math.prod(len(v) for v in out.values())
    if n > MAX_CONFIGS:
        raise ParameterError(f"--grid: {n} configurations, at most {MAX_CONFIGS} (each is a candidate run, and "
                             f"their noise grows with their number): give fewer values")
    return out


def _configs(grid: dict[str, list], cls: type[Method]) -> list[dict]:
    """Every point of ``grid`` (``rank`` dropped where no factors are fitted: ``iters`` 0), without repeats."""
    keys = sorted(grid)
    out = []
    for vals in itertools.product(*(grid[k] for k in keys)):
        c = dict(zip(keys, vals))
        if c.get("iters") == 0 and "rank" in c:
            del c["rank"]  # no factors: the rank changes nothing
        if c not in out:
            out.append(c)
    return out


def _default_config(cls: type[Method], store, epsilon: float, delta: float, keys, n_users: int) -> dict:
    """What ``train`` would use for each grid key (``iters`` from public quantities only)."""
    m = cls(epsilon=epsilon, delta=delta)
    m.check_rank(store.n_items)  # ials' default rank is capped at the items
    d = {}
    for k in keys:
        if k == "rank":
            d[k] = None if None in keys[k] else m.rank  # None: the method's own rule (ials' default grid)
        elif k == "iters" and _pins_iters(cls):
            d[k] = _public_iters(n_users, store, epsilon, m.rank)
        else:
            o = next(o for o in cls.OPTIONS if o.name == k)
            d[k] = o.default
    if d.get("iters") == 0:
        d.pop("rank", None)
    return d


def _leaner(c: dict, default: dict, auto_rank: int | None = None) -> bool:
    """Whether ``c`` fits fewer factors or fewer iterations than ``default``: it may not replace it. A rank ``None``
    (``rank=auto``, the method's own rule) counts as ``auto_rank``, the method's default rank (ials' rule takes at
    most that many).

    The candidates run at a fraction of the epsilon the released model gets, and at that
    lower signal-to-noise ratio leaner models score better than they will at the released
    one's: measured on two generated stores (20,000 and 40,000 users, rank-8 truth,
    epsilon 1 and 2, 2 seeds each), rank 4 beat the default rank 8 on the noisy losses
    every time and then lost to it by 0.016-0.062 test RMSE when released, and biases only
    (``iters=0``) beat the factors and lost by 0.04-0.07. A richer candidate that wins
    already at the lower epsilon is kept (it can only gain from more budget, as far as
    those measurements go).

    ``ials`` (scored by held-out hits, :func:`_hits`) keeps the rule for the same reason: its candidates at a
    fraction of the epsilon are noisier than the released model, and more factors (and more iterations) each add
    noise to every item row (every factor's right-hand side is a release), so at the candidates' lower epsilon
    fewer factors score better than they will at the released one's; a richer configuration may win. Its other
    keys have noise-favoured directions of their own: :func:`_favoured_by_noise`.
    """
    for k in ("rank", "iters"):
        if k not in default:
            continue
        v, d = c.get(k, 0 if k == "iters" else default[k]), default[k]
        v, d = (auto_rank if v is None else v), (auto_rank if d is None else d)
        if None not in (v, d) and v < d:
            return True
    if c.get("iters", default.get("iters")) == 0 and default.get("iters", 0) > 0:
        return True
    return False


def _favoured_by_noise(c: dict, default: dict) -> bool:
    """Whether ``ials`` configuration ``c`` gains from noise against ``default`` in a key :func:`_leaner` does not
    know: it may not replace the default (the candidates' signal-to-noise ratio is far below the released model's:
    a fifth of the users, at a seventh of the epsilon for six candidates).

    * a larger ``reg``: a ridge's best strength grows with the noise it damps;
    * a larger ``alpha``: every pair's confidence grows, toward the cap the sensitivities are scaled to (an implicit
      store's ``--max-confidence``), and each user's solve leans on her own items more than on the noisy item
      side. Measured on a generated implicit store (20,000 users x 2,000 items, 20 interactions each, 16 taste
      clusters, epsilon 10, seeds 1-3): ``alpha=10`` beat the default 3 on the candidates' noisy hits by 35-95
      noise stds every time, then listed below it when released (Recall@10 0.2607 / 0.2614 / 0.2611 against
      0.2683 / 0.2661 / 0.2629); on generated ratings (15,000 x 1,500, 25 each, seed 1), with candidates on half
      the users at half the squared scale, ``alpha=10`` won by 5.6 noise stds and listed at 0.3721 against the
      default's 0.3789.

    ``count_share`` has no such direction (either share's noise shrinks as the other's grows): any value may win.

    >>> _favoured_by_noise({"reg": 10.0}, {"reg": 1.0}), _favoured_by_noise({"reg": 0.1}, {"reg": 1.0})
    (True, False)
    >>> _favoured_by_noise({"alpha": 10.0}, {"alpha": 3.0}), _favoured_by_noise({"alpha": 1.0}, {"alpha": 3.0})
    (True, False)
    """
    return any(k in default and c.get(k, default[k]) > default[k] for k in ("reg", "alpha"))


def config_name(c: dict) -> str:
    """``{"rank": 8, "iters": 5}`` -> ``"iters=5 rank=8"`` (``"defaults"`` when empty; a rank ``None``, the method's
    own rule: ``rank=auto``).

    >>> config_name({"rank": None, "alpha": 3.0}), config_name({})
    ('alpha=3.0 rank=auto', 'defaults')
    """
    def text(k, v):
        return "auto" if v is None and k == "rank" else str(v).lower() if isinstance(v, bool) else v

    return " ".join(f"{k}={text(k, v)}" for k, v in sorted(c.items())) or "defaults"


class _HeldOut(StoreView):
    """The store as the candidates see it: each user's training ratings minus their validation ratings.

    Every block of the training split goes through :func:`streamdp.methods._selection.holdout`
    with the run's key, exactly as the scoring pass splits it; the rest (a catalogue view's items, a segmented
    store's users) is the inner store's (:class:`~streamdp.storage.view.StoreView`).
    """

    def __init__(self, store: RatingStore, key: int, rate: float = 1.0):  # noqa: D107 - a view of an opened store
        super().__init__(store)
        self._holdout_key = int(key)
        self._holdout_rate = float(rate)

    def _filter(self, blk: Block, split: str) -> Block:
        if split != "train":
            return blk
        (ip, it, r), _ = holdout(blk.indptr, blk.items, blk.ratings, blk.first_user, self._holdout_key,
                                 rate=self._holdout_rate)
        return Block(blk.first_user, ip, it, r)

    def _spec_args(self) -> tuple:
        return (self._holdout_key, self._holdout_rate)


def sampled_users(first_user: int, n: int, key: int, q: float) -> np.ndarray:
    """Which of users ``first_user .. first_user + n - 1`` are in the candidates' Poisson sample (rate ``q``).

    Each user independently with probability ``q``: a keyed splitmix64 hash of the run's key and the
    user's global index (as :func:`streamdp.methods._selection.holdout` keys its choices), so the
    sample depends on no rating and is the same in every pass.
    """
    users = np.arange(first_user, first_user + n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        h = mix((np.uint64(key) * MIX) ^ mix(users * MIX + np.uint64(0x5A3D)))
    return (h >> np.uint64(11)).astype(np.float64) * 2.0 ** -53 < q


class _Sampled(_HeldOut):
    """The candidates' view: the held-out view of the Poisson-sampled users only (the others have no ratings).

    ``expected_users`` (``q n_users``, ``n_users`` the run's released or declared count) is what a method divides
    by where it averages over users (:meth:`streamdp.methods.als._AlsBase._solve_items`' shared Gramian): not the
    sample's size, which would depend on whether a given user was sampled.
    """

    def __init__(self, store: RatingStore, key: int, q: float, n_users: int, rate: float = 1.0):  # noqa: D107
        super().__init__(store, key, rate)
        self._sample_q = float(q)
        self._sample_n = int(n_users)
        self.expected_users = max(float(q) * n_users, 1.0)

    def _spec_args(self) -> tuple:
        return (self._holdout_key, self._sample_q, self._sample_n, self._holdout_rate)

    def _filter(self, blk: Block, split: str) -> Block:
        blk = super()._filter(blk, split)
        if split != "train":
            return blk
        keep = sampled_users(blk.first_user, blk.n_users, self._holdout_key, self._sample_q)
        lens = np.diff(blk.indptr)
        mask = np.repeat(keep, lens)
        ip = np.zeros(blk.n_users + 1, dtype=blk.indptr.dtype)
        np.cumsum(np.where(keep, lens, 0), out=ip[1:])
        return Block(blk.first_user, ip, blk.items[mask], blk.ratings[mask])


def _gaussian_only(m: Method) -> Method:
    """``m`` planning Gaussian releases only (:func:`gaussian_equivalent` needs them): ``ials`` keeps the chart of its
    released counts, not the top-K selection it makes on a thin store (:mod:`streamdp.privacy.topk`, pure-DP events)."""
    m.chart_topk = False
    return m


def gaussian_equivalent(event) -> float:
    """The noise multiplier of the one Gaussian that ``event`` (Gaussian releases only, composed) is.

    The privacy loss of a Gaussian release of multiplier ``z`` is N(1/(2z^2), 1/z^2); adaptive
    compositions add them, so the composition is exactly the Gaussian with ``1/z^2 = sum 1/z_i^2``
    (Dong, Roth & Su, Gaussian DP). dp-accounting subsamples only a single Gaussian event.
    """
    def inv_sq(e):
        if isinstance(e, E.GaussianDpEvent):
            return math.inf if e.noise_multiplier == 0 else 1.0 / e.noise_multiplier ** 2
        if isinstance(e, E.SelfComposedDpEvent):
            return e.count * inv_sq(e.event)
        if isinstance(e, E.ComposedDpEvent):
            return math.fsum(inv_sq(x) for x in e.events)
        if isinstance(e, E.NoOpDpEvent):
            return 0.0
        raise ParameterError(f"tune: a candidate's release is not Gaussian ({type(e).__name__})")

    s = inv_sq(event)
    return math.inf if s == 0 else 1.0 / math.sqrt(s)


class _Tuned(Method):
    """The released model of a tuning run: the chosen configuration's fit, with the whole run's ledger."""

    def __init__(self, final: Method, prefix_events: list, prefix_entries: list, notes: list, tuning: dict,
                 epsilon: float, z_f: float | None = None):
        self.final = final
        #: The envelope of a choice among configurations: the one Gaussian that dominates each one's releases. The
        #: adaptive choice's guarantee is that of this envelope, so the ledger composes it (and the store's budget
        #: reserved the same events); the released model's own releases are listed in the ledger's entries.
        self.z_f = z_f
        self.name = final.name
        self.guarantee = final.guarantee
        self.epsilon, self.delta, self.rank, self.seed = float(epsilon), final.delta, final.rank, final.seed
        self.opts = final.opts
        self.prefix_events, self.prefix_entries = list(prefix_events), list(prefix_entries)
        self.catalogue = getattr(final, "catalogue", None)  # public_parameters; its selection is in the prefix
        self.notes, self.tuning = list(notes), tuning

    def _plan(self, store) -> Plan:
        p = self.final.plan(store)
        entries = self.prefix_entries + [{**e, "release": "released model: " + e["release"]} for e in p.entries]
        if self.z_f is None:
            events = self.prefix_events + list(p.events)
        else:
            events = self.prefix_events + [gaussian_event(self.z_f)]
        return Plan(events=events, entries=entries, bounds=dict(p.bounds))

    def state_bytes(self, store) -> int:
        return self.final.state_bytes(store)

    def user_count(self, store):
        return self.final.user_count(store)

    def spent_first(self, store) -> list:
        return []  # the count is in the prefix (or in the final's own plan when nothing was tuned)

    def fit(self, store, engine):
        fitted = self.final.fit(store, engine)
        if self.tuning.get("user_profile") is not None:
            fitted.model_info["user_profile"] = self.tuning.pop("user_profile")
        fitted.ledger = self.ledger(store, self.plan(store), notes=list(fitted.ledger.notes) + self.notes)
        fitted.model_info["epsilon"] = self.epsilon
        fitted.model_info["tuning"] = self.tuning
        return fitted


def _child_seed(seed: int | None, *key) -> int | None:
    if seed is None:
        return None
    return int(np.random.SeedSequence([int(seed), *key]).generate_state(1, np.uint64)[0] >> np.uint64(1))


def _losses(st, models, key: int, workers, memory_limit, rate: float = 1.0) -> np.ndarray:
    """Summed per-user validation losses of ``models`` (each user: mean squared error over their held-out
    ratings, clipped to ``h^2``), every user solving their row from the rest of their training ratings."""
    lo, hi = float(st.rating_min), float(st.rating_max)
    h = (hi - lo) / 2.0
    views = [SimpleNamespace(item_factors=f.item_factors, item_bias=f.item_bias, global_mean=f.global_mean,
                             info=f.model_info) for f in models]

    def fn(block, b):
        (ip, it, r), (vu, vi, vr) = holdout(block.indptr, block.items, block.ratings, block.first_user, key,
                                            rate=rate)
        out = np.zeros(len(views))
        if not len(vu):
            return out
        wv = 1.0 / np.bincount(vu, minlength=block.n_users)[vu]  # a user's loss: the mean over theirs
        vip = np.r_[0, np.cumsum(np.bincount(vu, minlength=block.n_users))].astype(np.int64)
        vr = np.clip(vr.astype(np.float64), lo, hi)
        for c, mv in enumerate(views):
            U = solve_block(mv, ip, it, r, model_ridge(mv))
            pred = predict_block(mv, U, vip, np.ascontiguousarray(vi, np.int32))
            e = pred - vr
            out[c] = float(np.sum(np.minimum(e * e, h * h) * wv))
        return out

    with Engine(st, workers=workers, memory_limit=memory_limit) as eng:
        return eng.map_reduce(fn, add_into, np.zeros(len(views)), extra_per_block=64 * st.block_users,
                              desc="tune: validation losses")


def _hits(st, models, key: int, workers, memory_limit, rate: float = 1.0) -> np.ndarray:
    """Summed per-user held-out hits of ``models`` (methods whose scores rank items: ``ials``).

    Each user with relevant held-out items (:func:`streamdp.methods._selection.holdout` with the run's key, the
    ratings the candidates never saw; relevant as ``evaluate`` has it: every interaction of an implicit store, a
    rating in the top 20% of the range otherwise) solves her row from the rest of her training items as on her
    device (:func:`streamdp.serving.local.solve_block`), lists the model's top :data:`HITS_K` among the items she
    did not train on (:func:`streamdp.kernels.topk.topn_blocked`, ``evaluate``'s lists) and scores
    ``hits / min(HITS_K, n)`` in ``[0, 1]`` (``n`` her relevant held-out items): a Recall@10 per user. L2
    sensitivity of the sums: :func:`hits_sensitivity`.
    """
    implicit = bool(getattr(st, "implicit", False))
    thr = None if implicit else default_threshold(float(st.rating_min), float(st.rating_max))
    n = st.n_items
    tiekey = np.arange(n, dtype=np.int64)
    views = []
    for f in models:
        mv = SimpleNamespace(item_factors=f.item_factors, item_bias=f.item_bias, global_mean=f.global_mean,
                             info=f.model_info, extras=getattr(f, "extras", None) or {})
        Q, bias = local_design(mv)
        b = list_bias(mv, bias)
        views.append((mv, Q, b, topn_prepare(Q, b, float(mv.global_mean))))

    def fn(block, b_):
        (ip, it, r), (vu, vi, vr) = holdout(block.indptr, block.items, block.ratings, block.first_user, key,
                                            rate=rate)
        out = np.zeros(len(views))
        if not implicit:
            keep = vr >= thr
            vu, vi = vu[keep], vi[keep]
        if not len(vu):
            return out
        nval = np.bincount(vu, minlength=block.n_users)
        want = (nval > 0).astype(np.uint8)
        rest = Block(block.first_user, ip, it, r)
        ip64, it32 = np.asarray(ip, np.int64), np.asarray(it, np.int32)
        lists = np.empty((block.n_users, HITS_K), np.int32)
        scores = np.empty((block.n_users, HITS_K))
        denom = np.minimum(nval[vu], HITS_K).astype(np.float64)
        for c, (mv, Q, bias, prepared) in enumerate(views):
            U = solve_rows(mv, rest, want, model_ridge(mv))
            topn_blocked(ip64, it32, want, np.ascontiguousarray(U, np.float64), Q, bias, float(mv.global_mean),
                         tiekey, lists, scores, prepared=prepared)
            hit = (lists[vu] == vi[:, None]).any(axis=1)
            out[c] = float(np.sum(hit / denom))
        return out

    d = max((int(v[1].shape[1]) for v in views), default=1)  # a user's row: the widest candidate's
    with Engine(st, workers=workers, memory_limit=memory_limit) as eng:
        return eng.map_reduce(fn, add_into, np.zeros(len(views)),
                              extra_per_block=(16 * HITS_K + 16 * d) * st.block_users + TILE_BYTES,
                              desc="tune: held-out hits")


def tune(store, *, epsilon: float, method: str | None = None, out: str, grid=None, delta: float | None = None,
         seed: int | None = None, workers: int | None = None, memory_limit=None, over_budget: bool = False,
         force: bool = False, evaluate_test: bool = True, users_bound: int | None = None, items=None,
         since=None, until=None, window=None, until_segment=None) -> dict:
    """Choose ``method``'s configuration on ``grid`` privately, train it, write it to ``out``: the summary dict.

    ``method=None`` is ``train``'s default (:func:`streamdp.workflows.training.default_method`). ``grid`` maps option
    names (and ``rank``) to lists of values, or is a list of
    ``KEY=V1,V2`` strings (:func:`parse_grid`); ``None`` is :func:`default_grid`. The
    summary is ``train``'s (``epsilon_spent`` is the whole run's) plus ``tuning``:
    the candidates with their noisy losses, the default and chosen configurations,
    the split of the budget and whether the choice was skipped (and why). The number of users (the default
    delta, the public rules below) is released once for the whole run (the ledger's first event, composed with the
    rest) or declared with ``users_bound``, as for ``train`` (:mod:`streamdp.privacy.users`).
    ``since``/``until``/``window``, ``until_segment``: tune and train on a period of the store only, as ``train``
    (:func:`streamdp.storage.timeline.data_period`: the candidates, the losses and the model read its ratings, the
    count is of its users; recorded in the model as ``data_window``).

    The stages: :func:`_checked_run` (arguments, grid, budget: before any rating is read),
    :func:`_selection_plan` (the choice's noise, or why there is no choice), :func:`_pinned_iters`
    (the iterations set from the users' histogram, as ``train`` does), :func:`_candidates_planned`
    (their accounting and the released model's envelope), :func:`_candidates_run` (reserve, fit,
    choose) and :func:`_release`.
    """
    if method is None:  # train's default: als, ials on an interaction log
        store = store if isinstance(store, RatingStore) else open_store(store)
        method = default_method(store)
    r = _checked_run(store, method, epsilon, delta, seed, grid, out, force, over_budget, users_bound, items,
                     dict(workers=workers, memory_limit=memory_limit, over_budget=over_budget, force=force,
                          evaluate_test=evaluate_test),
                     dict(since=since, until=until, window=window, until_segment=until_segment))
    configs = _configs(r.grid, r.cls)
    _check_configs(r, configs)
    # a store whose budget cannot take E is refused before any pass over its ratings (the whole E is reserved
    # once the candidates are planned, before they run; the default-only paths reserve as train does)
    _check_budget(r)
    dflt = _default_config(r.cls, r.st, r.epsilon, r.delta, r.grid, r.n_users)
    default = configs.index(dflt) if dflt in configs else None
    sel, tuning, skip = _selection_plan(r, configs, dflt, default)
    if skip is not None:
        chosen = default if default is not None else 0
        final = _gaussian_only(r.cls(epsilon=r.epsilon, delta=r.delta, seed=r.seed, users=r.users,
                                     catalogue=r.catalogue, **configs[chosen]))  # spends the count and the items'
        tuning.update(skipped=skip, chosen=configs[chosen], split=None,
                      rule="none: the whole epsilon went to the released model")
        wrapper = _Tuned(final, [], [], [f"tune: no choice was made ({skip}); configuration "
                                         f"{config_name(configs[chosen])} trained at the whole epsilon"],
                         tuning, r.epsilon)
        return _release(r.st, wrapper, final, r.out, tuning, r.t0, epsilon=r.epsilon, delta=r.delta, seed=r.seed,
                        **r.release_kw)

    pre_events, pre_entries = [], []
    if r.pin:
        configs, dflt, default, pre_events, pre_entries, sel = _pinned_iters(r, configs, dflt, default, sel, tuning)
    if len(configs) == 1:  # the histogram left one configuration: nothing to choose, the rest is the model's
        final = _calibrated(r.cls, configs[0], r.count_events + pre_events, r.epsilon, r.delta, r.seed, r.st,
                            r.shared, catalogue=r.shared_cat)
        tuning.update(skipped="one configuration once the iterations were set", chosen=configs[0], split=None,
                      rule="none", final_epsilon=final.epsilon)
        wrapper = _Tuned(final, r.count_events + pre_events, r.count_entries + pre_entries,
                         [f"tune: one configuration ({config_name(configs[0])}) once the iterations were set; "
                          f"nothing was chosen"], tuning, r.epsilon)
        return _release(r.st, wrapper, final, r.out, tuning, r.t0, epsilon=r.epsilon, delta=r.delta, seed=r.seed,
                        **r.release_kw)

    cand = _candidates_planned(r, configs, sel, pre_events, pre_entries)
    chosen, noisy, final, entry = _candidates_run(r, cand, configs, default, sel, tuning)
    _record_choice(r, cand, tuning, configs, chosen, noisy, final, default, sel.scale)
    m_c = len(configs)
    note = (f"tuned privately over {m_c} configurations of {r.method} "
            f"({', '.join(config_name(c) for c in configs)}): "
            f"chosen {config_name(configs[chosen])}; the candidates (each at the noise of epsilon {cand.e_c:.4g}, on a "
            f"Poisson sample of users at rate {SAMPLE_RATE:g}, never released) and their noisy validation losses "
            f"are composed in this ledger with the released model (epsilon {final.epsilon:.4g}); this ledger and the "
            f"store's budget entry count the released model as one Gaussian of noise multiplier {cand.z_f:.6g}, which "
            f"dominates its releases (listed): the guarantee of the adaptive choice is that of this envelope")
    wrapper = _Tuned(final, cand.prefix_events, cand.prefix_entries, [note], tuning, r.epsilon, z_f=cand.z_f)
    return _release(r.st, wrapper, final, r.out, tuning, r.t0, epsilon=r.epsilon, delta=r.delta, seed=r.seed,
                    entry=entry, **r.release_kw)


def _checked_run(store, method, epsilon, delta, seed, grid, out, force, over_budget, users_bound, items, release_kw,
                 period=None):
    """The run's arguments checked and its store opened (through its ``period``, as ``train`` reads it), the count
    released (or declared), the grid parsed."""
    t0 = time.perf_counter()
    if not get_method(method).TUNABLE:  # an unknown name: the registry's message
        raise ParameterError(f"--method {method}: tune supports {', '.join(tunable_methods())} (their releases are "
                             f"Gaussian and planned in full)")
    epsilon = parse_epsilon(epsilon)
    if not math.isfinite(epsilon):
        raise ParameterError("--epsilon: tune needs a finite epsilon (a non-private choice needs no tuning "
                             "budget: train each configuration and evaluate it)")
    check_calibratable(epsilon)
    cls = get_method(method)
    check_model_destination(str(out), force)
    st = store if isinstance(store, RatingStore) else open_store(store)
    st = data_period(st, **(period or {}))
    check_contributions(st)  # an empty period: refused before anything is reserved
    cls.check_store(st)
    st.check_chunks()
    epsilon = float(epsilon)
    users = user_count_for(cls, st, epsilon=epsilon, seed=seed, users_bound=users_bound)
    n_users = users.n
    delta = default_delta(n_users) if delta is None else float(delta)
    check_privacy_params(epsilon, delta, n_users=n_users)
    # the count, released once: the first event of every path's ledger; every method below reads it (elsewhere())
    # the items and the rating range: declared, or selected privately once for the whole run (their releases composed
    # like the count's)
    if grid is not None:  # checked before the catalogue's pass over the ratings
        grid = (parse_grid(list(grid), cls) if not isinstance(grid, dict) else
                parse_grid([f"{k}={','.join('auto' if v is None else str(v) for v in vs)}"
                            for k, vs in grid.items()], cls))
    st, cat = catalogue_and_range_for(cls, st, epsilon=epsilon, delta=delta, seed=seed,
                                      items=declared_items(items, st))
    first = users.spent() + cat.spent()
    count_events = [r.event() for r in first]
    count_entries = [{**r.entry(), "release": "tune: " + r.entry()["release"]} for r in first]
    shared = users.elsewhere()
    if grid is None:
        grid = default_grid(method, st, epsilon)
    # without --iters an als plan releases a histogram of ratings per user, read from the data while planning:
    # tune releases it once, and pins every configuration's iters from it (_pinned_iters)
    pin = _pins_iters(cls) and "iters" not in grid
    return SimpleNamespace(t0=t0, cls=cls, method=method, st=st, epsilon=epsilon, delta=delta, seed=seed,
                           users=users, n_users=n_users, count_events=count_events, count_entries=count_entries,
                           shared=shared, catalogue=cat, shared_cat=cat.elsewhere(), grid=grid, pin=pin, out=out,
                           over_budget=over_budget, z_e=None, release_kw=release_kw)


def _check_configs(r, configs: list[dict]) -> None:
    """Every configuration of the grid is one the method takes, at a rank the store's items allow."""
    for c in configs:
        try:
            m = _gaussian_only(r.cls(epsilon=r.epsilon, delta=r.delta, seed=r.seed, **c))
            if _by_hits(r):  # ials' settings refuse what its options alone do not (an alpha above the cap)
                m.settings(r.st)
        except ParameterError as exc:
            raise ParameterError(f"--grid: {config_name(c)}: {exc}") from None
        try:
            m.check_rank(r.st.n_items)
        except ParameterError:
            raise ParameterError(f"--grid: {config_name(c)}: rank {m.rank} exceeds the number of items "
                                 f"({r.st.n_items})") from None


def _check_budget(r) -> None:
    """Refuse a store whose budget cannot take the whole epsilon (unless ``--over-budget``)."""
    r.z_e = calibrate_gaussian(r.epsilon, r.delta)  # the whole E as one Gaussian
    pv = StoreBudget(r.st.path).preview([_Tuned(_Envelope(r.cls, r.epsilon, r.delta, r.seed, r.z_e), [], [], [],
                                                {}, r.epsilon).planned_ledger(r.st)])
    if not pv["within_budget"] and not r.over_budget:
        raise BudgetExceededError(f"{r.st.path}: tuning {r.method} (epsilon={r.epsilon:.4g}, delta={r.delta:.3g}) "
                                  f"would take the store's spend from epsilon={pv['before']['epsilon']:.4g} to "
                                  f"{pv['after']['epsilon']:.4g}, past its budget epsilon="
                                  f"{pv['budget']['epsilon']:.4g}; pass --over-budget to release it anyway")


def _selection_plan(r, configs: list[dict], dflt: dict, default: int | None):
    """``(selection release, tuning record, skip)``: the noisy losses' release, and why no choice is made (or None)."""
    m_c = len(configs)
    z_sel = calibrate_gaussian(r.epsilon * math.sqrt(SELECT_SHARE), r.delta) if m_c > 1 else 0.0
    sel = _selection_release(r, m_c, max(z_sel, 1e-12))
    std = sel.scale
    tuning = {"method": r.method, "grid": {k: list(v) for k, v in r.grid.items()},
              "score": "held-out hits" if _by_hits(r) else "validation loss",
              "candidates": [{"config": c} for c in configs],
              "default": dflt if default is not None else None, "rule": None,
              "split": {"selection": SELECT_SHARE, "candidate_nominal": CANDIDATE_NOMINAL_SHARE,
                        "sample_rate": SAMPLE_RATE}}
    skip = None
    if m_c == 1:
        skip = "the grid has one configuration: nothing to choose"
    elif _by_hits(r) and MARGIN * std > SELECT_USEFUL * validating_users(r.n_users):
        skip = (f"the store is too small to tell configurations apart: the noise on their held-out hits (std "
                f"{std:.4g}) would hide any difference smaller than {SELECT_USEFUL:.0%} of the held-out items in the "
                f"top {HITS_K} per user over {validating_users(r.n_users):,.0f} users ({MARGIN:g} noise stds "
                f"below {SELECT_USEFUL:g} per "
                f"user)")
    elif not _by_hits(r) and MARGIN * std > SELECT_USEFUL * _h(r) ** 2 * validating_users(r.n_users):
        skip = (f"the store is too small to tell configurations apart: the noise on their validation losses "
                f"(std {std:.4g}) would hide any difference smaller than {SELECT_USEFUL:.0%} of the largest error "
                f"per user over {validating_users(r.n_users):,.0f} users ({MARGIN:g} noise stds below "
                f"{SELECT_USEFUL:g} h^2 per user, h "
                f"half the rating range)")
    return sel, tuning, skip


def _pinned_iters(r, configs, dflt, default, sel, tuning):
    """Every configuration's iterations set from one released histogram of ratings per user (as ``train`` does).

    ``(configs, dflt, default, pre_events, pre_entries, sel)``: configurations that became equal are merged, and the
    selection release is remade for their number at the same noise multiplier.
    """
    st, epsilon, delta, seed = r.st, r.epsilon, r.delta, r.seed
    # train's own draw for a seeded run (the same seed gives the same histogram, as for the released model)
    profile = user_profile(st, "gaussian", epsilon, delta, np.random.default_rng(
        np.random.SeedSequence(seed, spawn_key=(RNG_KEY, PROFILE_STREAM)) if seed is not None else None))
    e_nominal = epsilon * math.sqrt(1.0 - SELECT_SHARE)  # the released model's, about (the candidates: < 1%)
    base_rank = r.cls(epsilon=epsilon, delta=delta).rank

    def with_iters(c):
        rank = base_rank if c.get("rank") is None else c["rank"]  # None (rank=auto): the method's default
        it = default_settings(r.n_users, st.n_items, e_nominal, rank, n_eff=profile.effective_users(rank),
                              per_user=profile.mean_ratings()).iters
        c = {**c, "iters": it}
        if it == 0:
            c.pop("rank", None)
        return c

    pinned = []
    for c in map(with_iters, configs):
        if c not in pinned:
            pinned.append(c)
    dflt = with_iters(dflt) if default is not None else dflt
    configs = pinned
    default = configs.index(dflt) if default is not None and dflt in configs else None
    pre_events = [profile.release.event()]
    pre_entries = [{**profile.release.entry(), "release": "tune: " + profile.release.entry()["release"] +
                    " (sets every configuration's iterations, as train does)"}]
    tuning.update(candidates=[{"config": c} for c in configs], default=dflt if default is not None else None,
                  user_profile=profile.to_dict())
    return configs, dflt, default, pre_events, pre_entries, _selection_release(r, len(configs), sel.noise_multiplier)


def _candidates_planned(r, configs, sel, pre_events, pre_entries):
    """The candidates planned at their nominal share on a Poisson sample of the held-out view, their ledger entries,
    and the released model's envelope ``z_f``: the one Gaussian every final configuration is calibrated under."""
    epsilon, delta, seed, n_users = r.epsilon, r.delta, r.seed, r.n_users
    m_c = len(configs)
    key = (_child_seed(seed, _SELECT_RNG, 1) if seed is not None
           else int(np.random.SeedSequence().generate_state(1, np.uint64)[0] >> np.uint64(1)))
    view = _Sampled(r.st, key, SAMPLE_RATE, n_users, validation_rate(n_users))
    e_c = epsilon * math.sqrt(CANDIDATE_NOMINAL_SHARE / m_c)
    cands = [_gaussian_only(r.cls(epsilon=e_c, delta=delta, seed=_child_seed(seed, _SELECT_RNG, 2, i), select="off",
                                  users=r.shared, catalogue=r.shared_cat, **c)) for i, c in enumerate(configs)]
    plans = [m.plan(view) for m in cands]
    z_cands = [gaussian_equivalent(compose(list(p.events))) for p in plans]
    # every candidate accounted at the smallest of their equivalent multipliers (they differ by the calibration's
    # tolerance only): the m events are then one subsampled PLD self-composed, m times cheaper to calibrate against
    z_c = min(z_cands)
    sampled = PoissonSampledDpEvent(SAMPLE_RATE, GaussianDpEvent(z_c))
    prefix_events = r.count_events + list(pre_events) + [sampled] * m_c
    prefix_entries = r.count_entries + list(pre_entries)
    for i, (c, p) in enumerate(zip(configs, plans)):
        prefix_entries.append({
            "release": (f"tune candidate {i + 1} ({config_name(c)}): its {len(p.entries)} releases, trained on a "
                        f"Poisson sample of users (rate {SAMPLE_RATE:g}, keyed by the run's secret), composed as "
                        f"the one Gaussian they are (noise multiplier {z_cands[i]:.6g}; accounted at the "
                        f"candidates' smallest, {z_c:.6g}) and subsampled; never written"),
            "mechanism": "gaussian", "sampling_probability": SAMPLE_RATE, "noise_multiplier": z_c,
            "count": 1, "releases": [dict(e) for e in p.entries]})
    prefix_events.append(sel.event())
    prefix_entries.append(sel.entry())
    z_f = _envelope_multiplier(r, pre_events, sel, sampled, m_c, z_c, prefix_events)
    return SimpleNamespace(key=key, rate=validation_rate(n_users), view=view, e_c=e_c, cands=cands, z_cands=z_cands,
                           z_c=z_c, prefix_events=prefix_events, prefix_entries=prefix_entries, z_f=z_f)


def _envelope_multiplier(r, pre_events, sel, sampled, m_c, z_c, prefix_events) -> float:
    """The released model's noise multiplier: the rest of ``epsilon`` once the candidates and the choice are counted."""
    epsilon, delta = r.epsilon, r.delta
    rest = list(pre_events) + [sel.event()]  # Gaussian: with the candidates unsampled, the total is a Gaussian
    room = 1.0 / r.z_e ** 2 - m_c / z_c ** 2 - gaussian_equivalent(compose(rest)) ** -2
    # (a bracket from the Gaussian parts alone: the count's Laplace, when there is one, takes a little more)
    bracket = dict(lower=r.z_e, upper=1.01 / math.sqrt(room)) if room > 0 and not r.count_events else {}
    z_f = calibrate(lambda z: compose(r.count_events + rest + [SelfComposedDpEvent(sampled, m_c), gaussian_event(z)]),
                    epsilon, delta, **bracket)
    for _ in range(100):  # the ledger lists the candidates one by one: its composition is the one that counts
        if epsilon_of(compose(prefix_events + [gaussian_event(z_f)]), delta).epsilon <= epsilon:
            return z_f
        z_f *= 1.0001
    raise ParameterError(f"tune: the released model's noise could not be calibrated within --epsilon {epsilon:g} "
                         f"with the candidates' releases counted one by one (the accountant's discretization); "
                         f"try a larger --epsilon or fewer --grid values")


def _candidates_run(r, c, configs, default, sel, tuning):
    """Reserve the whole epsilon, fit the candidates, release their noisy losses and choose.

    ``(chosen index, noisy losses, the final method calibrated under the envelope, budget entry)``; on an error or
    Ctrl-C the reservation is marked failed (nothing left the process).
    """
    # the whole E is reserved before any candidate reads a rating: the envelope stands for the released model
    # (every configuration's releases compose to a Gaussian of multiplier >= z_f: dominated, _calibrated)
    envelope = _Tuned(_Envelope(r.cls, r.epsilon, r.delta, r.seed, c.z_f), c.prefix_events, c.prefix_entries, [],
                      tuning, r.epsilon)
    workers, memory_limit = r.release_kw["workers"], r.release_kw["memory_limit"]
    budget = StoreBudget(r.st.path)
    entry = budget.reserve(envelope.planned_ledger(r.st), over_budget=r.over_budget,
                           model=os.path.abspath(str(r.out)))
    try:
        fitted = []
        for m in c.cands:
            with Engine(c.view, workers=workers, memory_limit=memory_limit, state_bytes=m.state_bytes(c.view)) as eng:
                fitted.append(m.fit(c.view, eng))
        hits = _by_hits(r)
        scores = (_hits if hits else _losses)(r.st, fitted, c.key, workers, memory_limit, c.rate)
        rng = np.random.default_rng(np.random.SeedSequence([int(r.seed), _SELECT_RNG, 4]) if r.seed is not None
                                    else None)
        noisy = sel.add(scores, rng)
        # report-noisy-min over the losses; over the hits (higher is better) report-noisy-max, as the min of minus
        # them: the same margin rule mirrored
        lower = -noisy if hits else noisy
        auto_rank = r.cls(epsilon=r.epsilon, delta=r.delta).rank
        allowed = np.array([default is None or not (_leaner(k, configs[default], auto_rank) or (
            hits and _favoured_by_noise(k, configs[default]))) for k in configs])
        chosen = (choose(np.where(allowed, lower, np.inf), default, sel.scale) if default is not None
                  else int(np.argmin(lower)))
        final = _calibrated(r.cls, configs[chosen], c.prefix_events, r.epsilon, r.delta, r.seed, r.st, r.shared,
                            z_f=c.z_f, catalogue=r.shared_cat)
    except BaseException as exc:
        why = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"{exc.__class__.__name__}: {exc}"
        budget.fail(entry, f"{why} while the candidates were trained (nothing left the process)")
        if isinstance(exc, KeyboardInterrupt):
            raise Interrupted(f"interrupted while the candidates were trained: nothing was released; the budget "
                              f"reservation {entry} in {budget.path} was marked failed") from None
        raise
    return chosen, noisy, final, entry


def _record_choice(r, c, tuning, configs, chosen, noisy, final, default, std) -> None:
    """The candidates' noisy losses and the choice, into the run's ``tuning`` record."""
    what = "hits" if _by_hits(r) else "loss"
    for i, k in enumerate(tuning["candidates"]):
        k["epsilon"] = c.e_c
        k["noise_multiplier"] = c.z_cands[i]
        k["accounted_noise_multiplier"] = c.z_c
        k[f"noisy_{what}"] = float(noisy[i])
        k[f"noisy_mean_{what}"] = float(noisy[i]) / max(validating_users(r.n_users), 1.0)
    better, best = ("higher", "noisy argmax") if _by_hits(r) else ("lower", "noisy argmin")
    tuning.update(sample_record(c.rate))
    tuning.update(chosen=configs[chosen], skipped=None, selection_noise_std=std, candidate_epsilon=c.e_c,
                  sample_rate=SAMPLE_RATE, final_epsilon=final.epsilon, final_noise_multiplier=c.z_f,
                  rule=("default unless another, "
                        + ("neither leaner (rank, iters) nor favoured by noise (a larger reg or alpha)" if _by_hits(r)
                           else "not leaner (rank, iters)")
                        + f", is {better} by {MARGIN:g} noise stds"
                        if default is not None
                        else f"{best} (the grid has no default configuration)"))


class _Envelope(Method):
    """The released model as the budget reserves it before the choice: one Gaussian of multiplier ``z_f``."""

    def __init__(self, cls, epsilon, delta, seed, z_f):  # noqa: D107
        self.name, self.guarantee = cls.name, cls.guarantee
        self.epsilon, self.delta, self.seed, self.rank, self.opts = epsilon, delta, seed, 0, MethodOptions()
        self.z_f = float(z_f)

    def spent_first(self, store) -> list:
        return []

    def _plan(self, store) -> Plan:
        return Plan(events=[gaussian_event(self.z_f)], entries=[{
            "release": "the chosen configuration's releases, reserved as the one Gaussian that dominates them",
            "mechanism": "gaussian", "noise_multiplier": self.z_f, "count": 1}])


def _h(r) -> float:
    """Half the declared rating range: a user's squared error is clipped to its square."""
    return (float(r.st.rating_max) - float(r.st.rating_min)) / 2.0


def _by_hits(r) -> bool:
    """Whether the run scores its candidates by held-out hits (a method whose scores rank items: ``ials``)."""
    return getattr(r.cls, "TUNE_SCORE", "loss") == "hits"


def _selection_release(r, m: int, noise_multiplier: float):
    """The release of the ``m`` candidates' scores: summed validation losses (each user at most ``h^2`` per
    candidate: L2 sensitivity ``h^2 sqrt(m)``) or summed held-out hits (:func:`_hits`: each user in ``[0, 1]`` per
    candidate, L2 sensitivity ``sqrt(m)``)."""
    if _by_hits(r):
        return Release(f"tune: held-out hits of the {m} candidate configurations (per user, her held-out items "
                       f"in the candidate's top {HITS_K} of the items she did not train on, over min({HITS_K}, her "
                       f"held-out items): each user in [0, 1] per candidate)",
                       "gaussian", hits_sensitivity(m), noise_multiplier, shape=(m,))
    h = _h(r)
    return Release(f"tune: validation losses of the {m} candidate configurations (per user, the mean squared error "
                   f"clipped to h^2 over up to 2 held-out training ratings: each user at most h^2 per candidate)",
                   "gaussian", loss_sensitivity(h, m, "l2"), noise_multiplier, shape=(m,))


def hits_sensitivity(m: int) -> float:
    """L2 sensitivity of the ``m`` candidates' summed held-out hits (:func:`_hits`) under adding or removing a user.

    Each user adds one score per candidate, her hits over ``min(HITS_K, n)`` with ``n`` her relevant held-out
    items: at least 0 and at most 1 (at most ``min(HITS_K, n)`` of them fit in a list of ``HITS_K``). Her
    held-out items, her training items and the candidates' item sides do not depend on any other user's score (the
    candidates are released-grade noisy models: their dependence on her is accounted apart, in their own events),
    so adding or removing her changes each coordinate by at most 1: ``sqrt(m)`` in L2 (``m`` in L1).

    >>> hits_sensitivity(4)
    2.0
    """
    return loss_sensitivity(1.0, m, "l2")


def _calibrated(cls, config, prefix_events, epsilon, delta, seed, st, users, z_f: float | None = None,
                catalogue=None):
    """``cls`` with ``config`` at the largest epsilon that, composed with ``prefix_events``, stays within ``epsilon``
    and whose releases compose to a Gaussian of multiplier at least ``z_f`` (the reserved envelope)."""
    e = epsilon
    if prefix_events:
        if z_f is None:
            z_f = calibrate(lambda z: compose(prefix_events + [gaussian_event(z)]), epsilon, delta)
        e = epsilon_of(gaussian_event(z_f), delta).epsilon
    for _ in range(50):
        f = _gaussian_only(cls(epsilon=e, delta=delta, seed=seed, users=users, catalogue=catalogue,  # train's seed:
                               **config))  # the candidates' are children
        ev = list(f.plan(st).events)
        if (epsilon_of(compose(list(prefix_events) + ev), delta).epsilon <= epsilon
                and (z_f is None or gaussian_equivalent(compose(ev)) >= z_f)):
            return f
        e *= 0.999  # the PLD grids of one Gaussian and of its parts differ by a hair
    raise ParameterError("tune: the released model could not be calibrated within --epsilon")  # pragma: no cover


def _release(st, wrapper, final, out, tuning, t0, *, epsilon, delta, seed, workers, memory_limit, over_budget,
             force, evaluate_test, entry: str | None = None) -> dict:
    fitted, seconds, stale = release(st, wrapper, out, workers=workers, memory_limit=memory_limit,
                                     over_budget=over_budget, force=force, entry=entry)
    try:
        summary = run_summary(st, final, fitted, out, seconds, epsilon=epsilon, delta=delta, seed=seed, stale=stale,
                           evaluate_test=evaluate_test, workers=workers, memory_limit=memory_limit)
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted after the model was written to {out} and its budget recorded; "
                          f"evaluation skipped") from None
    summary["tuning"] = tuning
    summary["total_seconds"] = round(time.perf_counter() - t0, 3)
    return summary
