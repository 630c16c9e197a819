"""Private hyperparameter tuning: ``streamdp tune``, the library side.

``tune(STORE, epsilon=E, method="als", grid={"rank": [4, 8], "iters": [0, 5]})``
trains every configuration of the grid privately on each user's training ratings
minus a few held out, scores them on the held-out ratings with one noisy release,
picks one, trains the picked configuration on every training rating and writes
it: all of it in ONE ledger whose PLD epsilon at the run's delta is at most ``E``,
reserved in the store's budget as ``train``'s releases are
(:func:`streamdp.methods.release`).

The choice: report-noisy-min with a margin, not random stopping
---------------------------------------------------------------
The selection is that of the private defaults (:mod:`streamdp.methods._selection`):
every user with two or more training ratings holds out 10% of them (at most 2), each
candidate model is solved for locally by every user from the rest of their ratings
(as on their device, :mod:`streamdp.local`), their held-out ratings are predicted and
the user's loss is the mean of the squared errors clipped to ``h^2`` (``h`` half the
rating range). The vector of the ``m`` candidates' summed losses (each user adds at
most ``h^2`` per coordinate: L2 sensitivity ``h^2 sqrt(m)``) is released once with
Gaussian noise; the default configuration is kept unless another one's noisy loss is
lower by :data:`~streamdp.methods._selection.MARGIN` noise standard deviations and
it is not leaner (fewer factors or iterations, :func:`_leaner`); a grid without the
default configuration takes the noisy argmin.

Papernot-Steinke random stopping (repeat a randomly chosen candidate a random number
of times, release the best) was not chosen: its guarantee is stated in Renyi DP
(dp-accounting's ``RepeatAndSelectEvent`` is composed by the RDP accountant only,
while every ledger here is a PLD one), it releases the winning candidate itself,
trained at the per-run epsilon, where here the released model gets most of the budget
(below), and on a grid of 2-6 points its random number of runs (mean well above
``m`` to try each point) costs more than ``m`` fixed runs composed by PLD.

Budget split (shares of the squared epsilon scale: Gaussian releases compose by
``sum 1 / z^2``)
--------------------------------------------------------------------------------
* :data:`FINAL_SHARE` = 0.85 for the released model: it is trained at about
  ``E sqrt(0.85) = 0.92 E`` (a little less measured: PLD composes a little worse than
  the squares suggest);
* :data:`SELECT_SHARE` = 0.03 for the noisy losses;
* the remaining 0.12 for the ``m`` candidates, each at about ``E sqrt(0.12 / m)``.

The split is a trade: every share the choice takes is budget the released model does
not get (measured on a generated 20,000-user store at epsilon 2, the default
configuration itself at 0.83 E lost 0.025 test RMSE against the default at E), and a
candidate at a fraction of E sees its configuration at a worse signal-to-noise ratio
than the released model will (so the choice leans to configurations that need less
budget: see :func:`_leaner`, which keeps the choice from following that lean).
0.75 / 0.05 / 0.20 and 0.8 / 0.04 / 0.16 were tried first (docs/tune.md).

The candidates and the losses are planned first; the released model's epsilon is then
calibrated (:func:`streamdp.privacy.calibrate`) so that everything composed is the
largest PLD epsilon not above ``E``. When the losses' noise would swamp a difference
of 5% of ``h^2`` per user (``MARGIN`` noise stds above ``0.05 h^2 n_users``: public
quantities only, the rule of ``--select auto``) nothing is tuned: the default
configuration is trained at the whole ``E`` and the output says so (on ML-100K and
FilmTrust at epsilon 1 this is what happens).

Why every candidate is accounted although none is released
-----------------------------------------------------------
A candidate is trained on the users' data (minus the held-out ratings: a deterministic
per-user split keyed by the run's entropy, so neighbouring stores give neighbouring
training views), so it is a private computation and its releases (noisy sums,
Gramians, counts) are accounted at their noise as if published. Its model is never
written or printed; it only feeds the losses. The losses are not post-processing of
the candidates alone (they read the users' held-out ratings), so they are a further
Gaussian release: given the candidates' outputs, each user's term depends on their
own data only, so its sensitivity is ``h^2 sqrt(m)`` and adaptive composition applies.
The choice is post-processing of the noisy losses. The released model is trained
afterwards, its configuration chosen from them: a mechanism chosen adaptively. Every
release here is Gaussian, and every possible final configuration is calibrated to the
same total, so each is (up to the calibration's within-budget tolerance) dominated by
the same Gaussian, and the adaptive composition is that of fixed Gaussians (Dong, Roth
& Su, Gaussian DP, adaptive composition). That is why ``mechanism`` cannot be a grid
key and tuning runs are Gaussian. The ledger lists the candidates' releases, the
losses and the final model's releases, composed by dp-accounting's PLD accountant;
the budget entry is reserved before the final model is trained, after the budget was
checked (not reserved) before the candidates ran: until the reservation nothing has
left the process.
"""

from __future__ import annotations

import itertools
import math
import time

import numpy as np

from streamdp.errors import BudgetExceededError, Interrupted, ParameterError
from streamdp.methods.base import Method, Plan
from streamdp.storage.store import Block, RatingStore

__all__ = ["tune", "parse_grid", "default_grid", "SUPPORTED", "FINAL_SHARE", "SELECT_SHARE"]

#: Methods ``tune`` supports (their releases are all Gaussian and listed in their plans).
SUPPORTED = ("als", "irls", "means")
#: Shares of the squared epsilon scale (see the module docstring).
FINAL_SHARE = 0.85
SELECT_SHARE = 0.03
CANDIDATES_SHARE = 1.0 - FINAL_SHARE - SELECT_SHARE
#: Grid keys that cannot be tuned: run plumbing, or (mechanism) what the adaptive choice's argument needs fixed.
_FORBIDDEN = {"checkpoint": "a run directory, not a hyperparameter", "select": "tune makes the choice itself",
              "mechanism": "tuning runs are Gaussian (the adaptive choice of the released model needs it)"}
_SELECT_RNG = 0x70E


def default_grid(method: str, store, epsilon: float) -> dict[str, list]:
    """The grid when ``--grid`` is absent: ``als``/``irls`` rank 4 and 8, ``means`` with and without the users'
    own intercepts.

    Not ``iters=0`` against factors: the released model's own ``--select auto`` makes that
    choice at the released model's epsilon, where the candidates here, at a fraction of
    it, favour the biases (measured on a generated 20,000-user store at epsilon 1: with
    ``iters=0,7`` in the grid tune chose the biases, test RMSE 1.008 against the default's
    0.942). Without ``iters`` in the grid every configuration's iterations come from one
    released histogram of ratings per user, as ``train``'s do.
    """
    if method == "means":
        return {"user_intercept": [False, True]}
    return {"rank": [4, 8]}


def _public_iters(store, epsilon: float, rank: int = 8) -> int:
    """``als``' default number of iterations from public quantities only (no released profile)."""
    from streamdp.methods.als import default_settings

    return default_settings(store.n_users, store.n_items, epsilon, rank)["iters"]


def parse_grid(specs, cls: type[Method]) -> dict[str, list]:
    """``["rank=4,8", "iters=0,5"]`` -> ``{"rank": [4, 8], "iters": [0, 5]}``, each value checked by its option.

    Keys are ``rank`` and the method's options (``-`` or ``_``); a bad key, a repeated
    key, an empty or repeated value, or a value its option refuses is a
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
                if key == "rank":
                    v = float(raw)
                    if not v.is_integer() or v < 1:
                        raise ValueError
                    v = int(v)
                else:
                    v = declared[key].check(raw)
            except (ValueError, ParameterError) as exc:
                why = str(exc) if isinstance(exc, ParameterError) else "--rank must be a positive integer"
                raise ParameterError(f"--grid {spec!r}: {raw!r}: {why}") from None
            if v in vals:
                raise ParameterError(f"--grid {spec!r}: {raw!r} is given twice")
            vals.append(v)
        out[key] = vals
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


def _default_config(cls: type[Method], store, epsilon: float, delta: float, keys) -> dict:
    """What ``train`` would use for each grid key (``iters`` from public quantities only)."""
    m = cls(epsilon=epsilon, delta=delta)
    d = {}
    for k in keys:
        if k == "rank":
            d[k] = m.rank
        elif k == "iters" and getattr(cls, "FIXED_ITERS", None) is None:
            d[k] = _public_iters(store, epsilon, m.rank)
        else:
            o = next(o for o in cls.OPTIONS if o.name == k)
            d[k] = o.default
    if d.get("iters") == 0:
        d.pop("rank", None)
    return d


def _leaner(c: dict, default: dict) -> bool:
    """Whether ``c`` fits fewer factors or fewer iterations than ``default``: it may not replace it.

    The candidates run at a fraction of the epsilon the released model gets, and at that
    lower signal-to-noise ratio leaner models score better than they will at the released
    one's: measured on two generated stores (20,000 and 40,000 users, rank-8 truth,
    epsilon 1 and 2, 2 seeds each), rank 4 beat the default rank 8 on the noisy losses
    every time and then lost to it by 0.016-0.062 test RMSE when released, and biases only
    (``iters=0``) beat the factors and lost by 0.04-0.07. A richer candidate that wins
    already at the lower epsilon is kept (it can only gain from more budget, as far as
    those measurements go).
    """
    for k in ("rank", "iters"):
        if k in default and c.get(k, 0 if k == "iters" else default[k]) < default[k]:
            return True
    if c.get("iters", default.get("iters")) == 0 and default.get("iters", 0) > 0:
        return True
    return False


def config_name(c: dict) -> str:
    """``{"rank": 8, "iters": 5}`` -> ``"iters=5 rank=8"`` (``"defaults"`` when empty)."""
    return " ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in sorted(c.items())) or "defaults"


class _HeldOut(RatingStore):
    """The store as the candidates see it: each user's training ratings minus their validation ratings.

    Every block of the training split goes through :func:`streamdp.methods._selection.holdout`
    with the run's key, exactly as the scoring pass splits it.
    """

    def __init__(self, store: RatingStore, key: int):  # noqa: D107 - a view of an opened store
        self.__dict__.update(store.__dict__)
        self._holdout_key = int(key)

    def read_block(self, b: int, split: str = "train") -> Block:
        from streamdp.methods._selection import holdout

        blk = super().read_block(b, split)
        if split != "train":
            return blk
        (ip, it, r), _ = holdout(blk.indptr, blk.items, blk.ratings, blk.first_user, self._holdout_key)
        return Block(blk.first_user, ip, it, r)


class _Tuned(Method):
    """The released model of a tuning run: the chosen configuration's fit, with the whole run's ledger."""

    def __init__(self, final: Method, prefix_events: list, prefix_entries: list, notes: list, tuning: dict,
                 epsilon: float):
        self.final = final
        self.name = final.name
        self.guarantee = final.guarantee
        self.epsilon, self.delta, self.rank, self.seed = float(epsilon), final.delta, final.rank, final.seed
        self.options = {}
        self.prefix_events, self.prefix_entries = list(prefix_events), list(prefix_entries)
        self.notes, self.tuning = list(notes), tuning

    def _plan(self, store) -> Plan:
        p = self.final.plan(store)
        entries = self.prefix_entries + [{**e, "release": "released model: " + e["release"]} for e in p.entries]
        return Plan(events=self.prefix_events + list(p.events), entries=entries, params={"bounds": p.params.get(
            "bounds", {})})

    def state_bytes(self, store) -> int:
        return self.final.state_bytes(store)

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


def _losses(st, models, key: int, workers, memory_limit) -> np.ndarray:
    """Summed per-user validation losses of ``models`` (each user: mean squared error over their held-out
    ratings, clipped to ``h^2``), every user solving their row from the rest of their training ratings."""
    from types import SimpleNamespace

    from streamdp.local import model_ridge, predict_block, solve_block
    from streamdp.methods._selection import holdout
    from streamdp.stream.engine import Engine, add_into

    lo, hi = float(st.rating_min), float(st.rating_max)
    h = (hi - lo) / 2.0
    views = [SimpleNamespace(item_factors=f.item_factors, item_bias=f.item_bias, global_mean=f.global_mean,
                             info=f.model_info) for f in models]

    def fn(block, b):
        (ip, it, r), (vu, vi, vr) = holdout(block.indptr, block.items, block.ratings, block.first_user, key)
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


def tune(store, *, epsilon: float, method: str = "als", out: str, grid=None, delta: float | None = None,
         seed: int | None = None, workers: int | None = None, memory_limit=None, over_budget: bool = False,
         force: bool = False, evaluate_test: bool = True) -> dict:
    """Choose ``method``'s configuration on ``grid`` privately, train it, write it to ``out``: the summary dict.

    ``grid`` maps option names (and ``rank``) to lists of values, or is a list of
    ``KEY=V1,V2`` strings (:func:`parse_grid`); ``None`` is :func:`default_grid`. The
    summary is ``train``'s (``epsilon_spent`` is the whole run's) plus ``tuning``:
    the candidates with their noisy losses, the default and chosen configurations,
    the split of the budget and whether the choice was skipped (and why).
    """
    from streamdp.api import default_delta
    from streamdp.methods import get_method
    from streamdp.methods._selection import MARGIN, choose
    from streamdp.methods.als import SELECT_USEFUL
    from streamdp.model import check_model_destination
    from streamdp.privacy import calibrate_gaussian, check_privacy_params
    from streamdp.privacy.accountant import check_calibratable
    from streamdp.privacy.budget import StoreBudget
    from streamdp.storage.store import open_store
    from streamdp.stream.engine import Engine

    t0 = time.perf_counter()
    if method not in SUPPORTED:
        get_method(method)  # an unknown name: the registry's message
        raise ParameterError(f"--method {method}: tune supports {', '.join(SUPPORTED)} (their releases are "
                             f"Gaussian and planned in full)")
    if not math.isfinite(float(epsilon)):
        raise ParameterError("--epsilon: tune needs a finite epsilon (a non-private choice needs no tuning "
                             "budget: train each configuration and evaluate it)")
    check_calibratable(epsilon)
    cls = get_method(method)
    check_model_destination(str(out), force)
    st = store if isinstance(store, RatingStore) else open_store(store)
    st.check_chunks()
    delta = default_delta(st.n_users) if delta is None else float(delta)
    check_privacy_params(epsilon, delta, n_users=st.n_users)
    epsilon = float(epsilon)
    if grid is None:
        grid = default_grid(method, st, epsilon)
    elif not isinstance(grid, dict):
        grid = parse_grid(list(grid), cls)
    else:
        grid = parse_grid([f"{k}={','.join(str(v) for v in vs)}" for k, vs in grid.items()], cls)
    # without --iters an als plan releases a histogram of ratings per user, read from the data while planning:
    # tune releases it once, and pins every configuration's iters from it (below)
    pin = getattr(cls, "FIXED_ITERS", None) is None and "iters" not in grid
    configs = _configs(grid, cls)
    for c in configs:
        try:
            m = cls(epsilon=epsilon, delta=delta, seed=seed, **c)
        except ParameterError as exc:
            raise ParameterError(f"--grid: {config_name(c)}: {exc}") from None
        if m.rank > st.n_items:
            raise ParameterError(f"--grid: {config_name(c)}: rank {m.rank} exceeds the number of items "
                                 f"({st.n_items})")
    dflt = _default_config(cls, st, epsilon, delta, grid)
    default = configs.index(dflt) if dflt in configs else None
    m_c = len(configs)
    h = (float(st.rating_max) - float(st.rating_min)) / 2.0
    z_sel = calibrate_gaussian(epsilon * math.sqrt(SELECT_SHARE), delta) if m_c > 1 else 0.0
    sel = _selection_release(h, m_c, max(z_sel, 1e-12))
    std = sel.scale
    tuning = {"method": method, "grid": {k: list(v) for k, v in grid.items()},
              "candidates": [{"config": c} for c in configs],
              "default": dflt if default is not None else None, "rule": None,
              "split": {"final": FINAL_SHARE, "selection": SELECT_SHARE, "candidates": CANDIDATES_SHARE}}
    skip = None
    if m_c == 1:
        skip = "the grid has one configuration: nothing to choose"
    elif MARGIN * std > SELECT_USEFUL * h * h * st.n_users:
        skip = (f"the losses' noise (std {std:.4g}) would swamp any difference the choice could see on "
                f"{st.n_users:,} users (it needs {MARGIN:g} stds below {SELECT_USEFUL:g} h^2 per user)")
    if skip is not None:
        chosen = default if default is not None else 0
        final = cls(epsilon=epsilon, delta=delta, seed=seed, **configs[chosen])
        tuning.update(skipped=skip, chosen=configs[chosen], split=None,
                      rule="none: the whole epsilon went to the released model")
        wrapper = _Tuned(final, [], [], [f"tune: no choice was made ({skip}); configuration "
                                         f"{config_name(configs[chosen])} trained at the whole epsilon"],
                         tuning, epsilon)
        return _release(st, wrapper, final, out, tuning, t0, epsilon=epsilon, delta=delta, seed=seed,
                        workers=workers, memory_limit=memory_limit, over_budget=over_budget, force=force,
                        evaluate_test=evaluate_test)

    pre_events, pre_entries = [], []
    if pin:
        from streamdp.methods._profile import user_profile
        from streamdp.methods.als import default_settings

        profile = user_profile(st, "gaussian", epsilon, delta, np.random.default_rng(
            np.random.SeedSequence([int(seed), _SELECT_RNG, 5]) if seed is not None else None))
        e_nominal = epsilon * math.sqrt(FINAL_SHARE)
        base_rank = cls(epsilon=epsilon, delta=delta).rank

        def with_iters(c):
            rank = c.get("rank", base_rank)
            it = default_settings(st.n_users, st.n_items, e_nominal, rank,
                                  n_eff=profile.effective_users(rank))["iters"]
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
        m_c = len(configs)
        pre_events = [profile.release.event()]
        pre_entries = [{**profile.release.entry(), "release": "tune: " + profile.release.entry()["release"] +
                        " (sets every configuration's iterations, as train does)"}]
        tuning.update(candidates=[{"config": c} for c in configs], default=dflt if default is not None else None,
                      user_profile=profile.to_dict())
        sel = _selection_release(h, m_c, sel.noise_multiplier)
        std = sel.scale
    if m_c == 1:  # the histogram left one configuration: nothing to choose, the rest of the budget is the model's
        final = _calibrated(cls, configs[0], pre_events, epsilon, delta, seed, st)
        tuning.update(skipped="one configuration once the iterations were set", chosen=configs[0], split=None,
                      rule="none", final_epsilon=final.epsilon)
        wrapper = _Tuned(final, pre_events, pre_entries, [f"tune: one configuration ({config_name(configs[0])}) "
                                                          f"once the iterations were set; nothing was chosen"],
                         tuning, epsilon)
        return _release(st, wrapper, final, out, tuning, t0, epsilon=epsilon, delta=delta, seed=seed,
                        workers=workers, memory_limit=memory_limit, over_budget=over_budget, force=force,
                        evaluate_test=evaluate_test)

    # -- the candidates: planned at their share, trained on the held-out view ---------------------------------
    key = (_child_seed(seed, _SELECT_RNG, 1) if seed is not None
           else int(np.random.SeedSequence().generate_state(1, np.uint64)[0] >> np.uint64(1)))
    view = _HeldOut(st, key)
    e_c = epsilon * math.sqrt(CANDIDATES_SHARE / m_c)
    cands = [cls(epsilon=e_c, delta=delta, seed=_child_seed(seed, _SELECT_RNG, 2, i), select="off", **c)
             for i, c in enumerate(configs)]
    prefix_events, prefix_entries = list(pre_events), list(pre_entries)
    for i, (c, m) in enumerate(zip(configs, cands)):
        p = m.plan(view)
        prefix_events += list(p.events)
        prefix_entries += [{**e, "release": f"tune candidate {i + 1} ({config_name(c)}): {e['release']}"}
                           for e in p.entries]
    prefix_events.append(sel.event())
    prefix_entries.append(sel.entry())

    def final_for(c, i):
        return _calibrated(cls, c, prefix_events, epsilon, delta, seed, st)

    # the budget is checked before anything is computed (reserved once the configuration is known)
    probe = _Tuned(final_for(configs[default if default is not None else 0], 0), prefix_events, prefix_entries,
                   [], tuning, epsilon)
    budget = StoreBudget(st.path)
    pv = budget.preview([probe.planned_ledger(st)])
    if not pv["within_budget"] and not over_budget:
        raise BudgetExceededError(f"{st.path}: tuning {method} (epsilon={epsilon:.4g}, delta={delta:.3g}) would take "
                                  f"the store's spend from epsilon={pv['before']['epsilon']:.4g} to "
                                  f"{pv['after']['epsilon']:.4g}, past its budget epsilon="
                                  f"{pv['budget']['epsilon']:.4g}; pass --over-budget to release it anyway")
    try:
        fitted = []
        for m in cands:
            with Engine(view, workers=workers, memory_limit=memory_limit, state_bytes=m.state_bytes(view)) as eng:
                fitted.append(m.fit(view, eng))
        losses = _losses(st, fitted, key, workers, memory_limit)
    except KeyboardInterrupt:
        raise Interrupted("interrupted while the candidates were trained: nothing was released and nothing "
                          "was charged to the budget") from None
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), _SELECT_RNG, 4]) if seed is not None else None)
    noisy = sel.add(losses, rng)
    allowed = np.array([default is None or not _leaner(c, configs[default]) for c in configs])
    chosen = (choose(np.where(allowed, noisy, np.inf), default, std) if default is not None
              else int(np.argmin(noisy)))
    final = final_for(configs[chosen], chosen)
    for i, c in enumerate(tuning["candidates"]):
        c["epsilon"] = e_c
        c["noisy_loss"] = float(noisy[i])
        c["noisy_mean_loss"] = float(noisy[i]) / max(st.n_users, 1)
    tuning.update(chosen=configs[chosen], skipped=None, selection_noise_std=std, candidate_epsilon=e_c,
                  final_epsilon=final.epsilon,
                  rule=(f"default unless another, not leaner (rank, iters), is lower by {MARGIN:g} noise stds"
                        if default is not None
                        else "noisy argmin (the grid has no default configuration)"))
    note = (f"tuned privately over {m_c} configurations of {method} ({', '.join(config_name(c) for c in configs)}): "
            f"chosen {config_name(configs[chosen])}; the candidates (epsilon {e_c:.4g} each, never released) and "
            f"their noisy validation losses are composed in this ledger with the released model (epsilon "
            f"{final.epsilon:.4g})")
    wrapper = _Tuned(final, prefix_events, prefix_entries, [note], tuning, epsilon)
    return _release(st, wrapper, final, out, tuning, t0, epsilon=epsilon, delta=delta, seed=seed, workers=workers,
                    memory_limit=memory_limit, over_budget=over_budget, force=force, evaluate_test=evaluate_test)


def _selection_release(h: float, m: int, noise_multiplier: float):
    """The release of the ``m`` candidates' summed validation losses (each user at most ``h^2`` per candidate)."""
    from streamdp.methods._selection import loss_sensitivity
    from streamdp.privacy.release import Release

    return Release(f"tune: validation losses of the {m} candidate configurations (per user, the mean squared error "
                   f"clipped to h^2 over up to 2 held-out training ratings: each user at most h^2 per candidate)",
                   "gaussian", loss_sensitivity(h, m, "l2"), noise_multiplier, shape=(m,))


def _calibrated(cls, config, prefix_events, epsilon, delta, seed, st):
    """``cls`` with ``config`` at the largest epsilon that, composed with ``prefix_events``, stays within ``epsilon``."""
    from streamdp.privacy import calibrate, compose, epsilon_of, gaussian_event

    e = epsilon
    if prefix_events:
        z_f = calibrate(lambda z: compose(prefix_events + [gaussian_event(z)]), epsilon, delta)
        e = epsilon_of(gaussian_event(z_f), delta).epsilon
    for _ in range(50):
        f = cls(epsilon=e, delta=delta, seed=_child_seed(seed, _SELECT_RNG, 3), **config)
        if epsilon_of(compose(list(prefix_events) + list(f.plan(st).events)), delta).epsilon <= epsilon:
            return f
        e *= 0.999  # the PLD grids of one Gaussian and of its parts differ by a hair
    raise ParameterError("tune: the released model could not be calibrated within --epsilon")  # pragma: no cover


def _release(st, wrapper, final, out, tuning, t0, *, epsilon, delta, seed, workers, memory_limit, over_budget,
             force, evaluate_test) -> dict:
    from streamdp.methods import _summary, release

    fitted, seconds, stale = release(st, wrapper, out, workers=workers, memory_limit=memory_limit,
                                     over_budget=over_budget, force=force)
    try:
        summary = _summary(st, final, fitted, out, seconds, epsilon=epsilon, delta=delta, seed=seed, stale=stale,
                           evaluate_test=evaluate_test, workers=workers, memory_limit=memory_limit)
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted after the model was written to {out} and its budget recorded; "
                          f"evaluation skipped") from None
    summary["tuning"] = tuning
    summary["total_seconds"] = round(time.perf_counter() - t0, 3)
    return summary
