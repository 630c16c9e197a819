"""Private Oja and noisy subspace iteration: ``--method oja``.

Releases the top-``k`` right singular subspace ``V`` (``n_items x k``) of the
clipped, centred rating matrix ``A``, private singular values, item biases and a
global mean, all under one composed user-level (epsilon, delta) accounting.
Source: Jain, Thakkar, Thakurta (ICML 2018), Alg. 2 and Sec. 3.2, extended to
rank ``k`` by QR; and noisy subspace iteration (Hardt & Price 2014). Public names:
:class:`PrivateOja` (``oja``, options :class:`OjaOptions`), :func:`default_passes`.

Decisions a reader must know:

* row ``a_i`` holds user ``i``'s residuals on the private (or midpoint) centring,
  scaled to L2 norm at most ``L`` (``--clip``, default ``h sqrt(5)``); no per-user
  trimming is needed;
* a step ``A_S^T A_S V + G`` is a Gaussian mechanism of sensitivity ``L^2`` (no
  ``n x n`` noise matrix); steps of one pass see disjoint users, so a pass costs one
  Gaussian; with several steps per pass (``oja``, ``warm``) the accounting holds for
  the zero-out relation and the ledger says so;
* the item biases and the global mean (a mean over users) are one Gaussian release
  each; the singular values are the last pass's Ritz values (post-processing);
* the budget is split by ``sum 1/z^2`` (:func:`~streamdp.methods._centering.default_shares`)
  and calibrated by the PLD accountant; ``--calibration paper`` reproduces Alg. 2's;
* ``--schedule power`` is the default: one pass of small Oja steps lost clearly to a
  few passes of noisy subspace iteration, and a warm start was not reliably better.

The sensitivity argument, the calibration and the schedule measurements:
``docs/design-notes.md``, section ``streamdp/methods/oja.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from streamdp.errors import ParameterError
from streamdp.kernels.linalg import gram_apply, gram_apply_range
from streamdp.methods import register
from streamdp.methods._centering import (CenterOptions, CenterSettings, center_releases, center_settings,
                                         private_center, settings_shares)
from streamdp.methods._notes import range_notes, seed_notes
from streamdp.methods._subspace import DEFAULT_RIDGE, power_pass, residual_values, scaled_factors
from streamdp.methods.base import Fitted, Method, Plan
from streamdp.methods.options import option
from streamdp.privacy import paper_sigma_jain, spawn_rngs
from streamdp.privacy.release import Share, calibrate_releases
from streamdp.stream.engine import add_into as _add

#: Key of this method's random streams (independent of other methods' streams).
RNG_KEY = 0x0A1A


def default_passes(n_users: int, n_items: int, rank: int, epsilon: float) -> int:
    """Passes of noisy subspace iteration, from public parameters only.

    More passes converge further but each one gets ``1/P`` of the budget, so its
    noise grows like ``sqrt(P)``. Measured at a fixed budget on generated rank-8
    stores (1,000 items; fraction of the non-private subspace's energy captured,
    mean of 2 seeds):

    ==============  =====  =====  =====  =====  =====  =====
    users, epsilon  P=1    P=2    P=3    P=4    P=6    P=8
    ==============  =====  =====  =====  =====  =====  =====
    200k, 1         0.583  0.895  0.952  0.969  0.978  0.980
    200k, 0.2       0.252  0.555  0.668  0.699  0.687  0.648
    20k, 1          0.110  0.214  0.281  0.304  0.275  0.233
    ==============  =====  =====  =====  =====  =====  =====

    so 4 passes unless the public signal-to-noise proxy
    ``n_users epsilon / (rank sqrt(n_items))`` is large (>= 500, first row: 790),
    where 6 passes gain a little more. Non-private runs iterate to convergence (20).

    >>> default_passes(200_000, 1_000, 8, 1.0)
    6
    >>> default_passes(20_000, 1_000, 8, 1.0)
    4
    >>> default_passes(1_000, 2_000, 8, float("inf"))
    20
    """
    if not math.isfinite(epsilon):
        return 20
    proxy = n_users * epsilon / (rank * math.sqrt(n_items))
    return 6 if proxy >= 500 else 4


@dataclass(frozen=True)
class OjaOptions(CenterOptions):
    """``--method oja``'s options (``None``: derived from public parameters, see the module docstring)."""

    passes: int | None = option("passes over the data", minimum=1,
                                default_text="4-6 from the public signal-to-noise proxy, 20 non-private")
    schedule: Literal["power", "oja", "warm"] = option(
        "power: noisy subspace iteration; oja: block Oja steps; warm: Oja then power", default="power")
    step_users: int | None = option("users per Oja step (schedule oja/warm)", minimum=1,
                                    default_text="n_users / 16, at least 64")
    clip: float | None = option("row-norm bound L of the centred ratings", minimum=0, exclusive_minimum=True,
                                default_text="half the rating range x sqrt 5")
    calibration: Literal["pld", "paper"] = option(
        "pld: the least noise the accountant allows; paper: the noise of Jain et al. Alg. 2 (its sigma), for "
        "comparison", default="pld")
    #: Oja step size constant: ``eta_t = eta / (n_t L^2)``.
    eta: float = option("Oja step size constant", minimum=0, exclusive_minimum=True, default=4.0)


@dataclass(frozen=True)
class OjaSettings(CenterSettings):
    """A run's resolved settings: the options with the passes, step size and clip derived for the store."""

    schedule: str
    passes: int
    #: ``"oja"`` or ``"power"`` for each pass.
    pass_kinds: tuple
    #: Steps of each pass (1 for a power pass).
    steps_per_pass: tuple
    clip: float
    calibration: str
    step_users: int
    eta: float


@register
class PrivateOja(Method):
    """Private top-``k`` subspace (block Oja / noisy subspace iteration) with private biases."""

    name = "oja"
    MAIN_OPTIONS = ("passes", "schedule", "center")
    SUMMARY = "private top-k item subspace by noisy subspace iteration / block Oja (Jain et al. 2018, Alg. 2)"
    Options = OjaOptions

    # -- settings ----------------------------------------------------------------------
    def settings(self, store) -> OjaSettings:
        """All parameters of a run on ``store``, defaults resolved from public parameters."""
        o = self.opts
        n_users, n_items = self.n_users(store), store.n_items
        passes = o.passes
        if passes is None:
            passes = default_passes(n_users, n_items, self.rank, self.epsilon)
            if o.schedule == "warm":
                passes = max(2, passes)
        if o.schedule == "warm" and passes < 2:
            raise ParameterError("--schedule warm needs --passes >= 2 (one Oja pass, then power passes)")
        half = (store.rating_max - store.rating_min) / 2.0
        clip = o.clip if o.clip is not None else half * math.sqrt(5.0)
        # about 16 steps per Oja pass, at least 64 users a step
        step_users = o.step_users if o.step_users is not None else max(64, -(-n_users // 16))
        kinds = tuple("oja" if (o.schedule == "oja" or (o.schedule == "warm" and p == 0)) else "power"
                      for p in range(passes))
        # the steps of an Oja pass as the public count gives them (the ledger, model.json, the paper's sigma); the
        # run's own steps follow the store's blocks (_step_ranges), which depend on the exact count
        steps = tuple(max(1, -(-n_users // step_users)) if kd == "oja" else 1 for kd in kinds)
        return OjaSettings(**center_settings(o, store, self.epsilon, self.rank, n_users=n_users), schedule=o.schedule,
                           passes=passes, pass_kinds=kinds, steps_per_pass=steps, clip=clip,
                           calibration=o.calibration, step_users=step_users, eta=o.eta)

    # -- privacy plan ------------------------------------------------------------------
    def _shares(self, store, s: OjaSettings) -> list:
        """The run's releases before calibration (the privacy core's :class:`~streamdp.privacy.release.Share`)."""
        L = s.clip
        return [Share("A^T A V + G per pass (one Gaussian per pass: each user in one step)", "gaussian", L * L,
                      1.0 - s.stats_share - s.mean_share, count=s.passes, shape=(store.n_items, self.rank)),
                *settings_shares(s, store.n_items)]

    def _releases(self, store, s: OjaSettings) -> list:
        """Calibrated releases: PLD search (default), or Jain et al.'s Alg. 2 sigma (``--calibration paper``)."""
        shares = self._shares(store, s)
        if s.calibration == "paper":
            zp = paper_sigma_jain(self.epsilon_after_first(store), self.delta, count=sum(s.steps_per_pass), which="alg2")
            z = zp / math.sqrt(s.passes / shares[0].share)
            return [sh.at(z) for sh in shares]
        return calibrate_releases(shares, self.epsilon, self.delta, fixed=self.spent_first(store))

    def _plan(self, store) -> Plan:
        s = self.settings(store)
        bounds = {"clip_L": s.clip, "rating_min": s.rating_min, "rating_max": s.rating_max,
                  "rating_range_source": getattr(store, "rating_range_source", "unknown"),
                  "stats_weight": "w_i = min(1, 1/sqrt(n_i))"}
        if not self.private:
            entries = [{"release": "subspace passes and item biases", "mechanism": "none (non-private)",
                        "passes": s.passes}]
            return Plan(events=[], entries=entries, settings=s, bounds=bounds)
        releases = self._releases(store, s)
        entries = [r.entry() for r in releases]
        entries[0].update(steps_per_pass=list(s.steps_per_pass), calibration=s.calibration)
        entries.append({"release": "singular values (Ritz values of the last pass)",
                        "mechanism": "post-processing", "count": 0})
        return Plan(events=[r.event() for r in releases], entries=entries, settings=s, bounds=bounds,
                    releases=releases)

    # -- fitting -----------------------------------------------------------------------
    def fit(self, store, engine) -> Fitted:
        plan = self.plan(store)
        s = plan.settings
        n, k = store.n_items, self.rank
        L = s.clip
        run_steps = [len(_step_ranges(store, s.step_users)) if kind == "oja" else 1 for kind in s.pass_kinds]
        rngs = spawn_rngs(self.seed, 2 + sum(run_steps), key=RNG_KEY)
        z = _noise_multipliers(plan)
        sigma_pass = z["z_pass"] * L * L if self.private else 0.0

        stats, mean = center_releases(self, plan)
        mu, bias, weight, weight_sigma = private_center(
            store, engine, center=s.center, rating_min=s.rating_min, rating_max=s.rating_max,
            stats=stats, mean=mean, rng=rngs[1])
        release_pass = plan.releases[0] if self.private else None
        V = np.linalg.qr(rngs[0].standard_normal((n, k)))[0]
        values_of = residual_values(mu, bias, L, s.rating_min, s.rating_max)
        t = 2
        M = np.zeros((k, k))
        for p, (kind, n_steps) in enumerate(zip(s.pass_kinds, run_steps)):
            step_rngs = rngs[t:t + n_steps]
            t += n_steps
            desc = f"oja pass {p + 1}/{len(s.pass_kinds)}"
            if kind == "power":
                V, M = power_pass(engine, V, values_of, step_rngs[0], release_pass, desc=desc)
            else:
                V, M = _oja_pass(engine, store, V, values_of, step_rngs, release_pass, s.step_users, s.eta, L,
                                 desc=desc)
        # Ritz values of the last pass: post-processing of released products
        lam, W = np.linalg.eigh((M + M.T) / 2.0)
        order = np.argsort(lam)[::-1]
        lam, W = lam[order], W[:, order]
        V = V @ W
        sv = np.sqrt(np.maximum(lam, 0.0))
        # share of each direction that is signal: ||G e_j|| ~ sigma sqrt(n) against lambda_j
        noise = sigma_pass * math.sqrt(n)
        signal_share = lam.clip(0) ** 2 / (lam.clip(0) ** 2 + noise ** 2) if noise > 0 else np.ones(k)
        Q = scaled_factors(V, sv, weight, weight_sigma) * np.sqrt(signal_share)
        notes = []
        if not self.private:
            notes.append("non-private: --epsilon inf, no noise added (clipping and centering still applied)")
        notes += seed_notes(self)
        if "oja" in s.pass_kinds:  # whether a pass has several steps depends on the exact count: said for any
            notes.append("several steps per pass (unless --step-users is at least the number of users): users are "
                         "assigned to steps by their position in the store, so "
                         "the accounting holds for the zero-out neighbouring relation (one user's ratings replaced "
                         "by none); use --schedule power for add/remove one user")
        notes += range_notes(plan.bounds["rating_range_source"], self.private)
        ledger = self.ledger(store, plan, notes=notes)
        info = {"method": self.name, "rank": k, "epsilon": self.epsilon if self.private else "inf",
                "delta": self.delta, "seed": self.seed,
                "n_users": self.n_users(store), "n_items": n,
                "parameters": {**_parameters(s), **z},
                "item_factors": "V diag(w) / (p_j + p0), rows of mean squared norm 1 (see scaled_factors)",
                "ridge": DEFAULT_RIDGE,
                "rating_range": {"min": s.rating_min, "max": s.rating_max}}
        return Fitted(item_factors=Q.astype(np.float32), item_bias=bias.astype(np.float32),
                      item_ids=store.item_ids(), global_mean=float(mu), model_info=info, ledger=ledger,
                      extras={"singular_values": sv.astype(np.float64), "signal_share": signal_share,
                              "basis": V.astype(np.float32)}, per_item_extras=("basis",))


def _parameters(s: OjaSettings) -> dict:
    """The settings ``model.json`` records under ``parameters`` (sequences as lists)."""
    keys = ("schedule", "passes", "pass_kinds", "steps_per_pass", "clip", "center", "calibration", "step_users",
            "eta", "stats_share", "mean_share")
    values = {key: getattr(s, key) for key in keys}
    return {key: list(v) if isinstance(v, tuple) else v for key, v in values.items()}


def _noise_multipliers(plan) -> dict:
    """``z_pass, z_stats, z_mean``: the calibrated noise multipliers of the passes and of the centring's two
    releases (0 where there is no release)."""
    z = [r.noise_multiplier for r in plan.releases or ()]
    return {"z_pass": z[0] if z else 0.0, "z_stats": z[1] if len(z) > 1 else 0.0,
            "z_mean": z[2] if len(z) > 2 else 0.0}


def _step_ranges(store, step_users: int) -> list[tuple[int, int, int]]:
    """Oja steps as ``(first_block, last_block_exclusive, users_per_sub_step)`` groups.

    Steps of at least a block are whole groups of consecutive blocks (run in
    parallel by ``map_reduce``); smaller steps split each block into sub-ranges of
    ``step_users`` users, run in order. Depends on public shape only.
    """
    bu, nb = store.block_users, store.n_blocks
    if step_users >= bu:
        g = max(1, round(step_users / bu))
        return [(b, min(b + g, nb), 0) for b in range(0, nb, g)]
    out = []
    for b in range(nb):
        first, end = store.block_range(b)
        for u0 in range(0, end - first, step_users):
            out.append((b, b + 1, step_users))
    return out


def _oja_pass(engine, store, V, values_of, rngs, release, step_users, eta, L, desc="oja pass"):
    """One pass of block Oja; returns ``(V, sum_t V_{t-1}^T Y_t)`` (``release`` ``None``: non-private)."""
    n, k = V.shape
    steps = _step_ranges(store, step_users)
    M = np.zeros((k, k))
    if steps and steps[0][2] == 0:  # whole-block steps, each a parallel map_reduce
        for t, (b0, b1, _) in enumerate(steps):
            Vc = np.ascontiguousarray(V)

            def fn(block, b, Vc=Vc):
                out = np.zeros((n, k))
                gram_apply(block.indptr, block.items, values_of(block), Vc, out)
                return out

            Y = engine.map_reduce(fn, _add, np.zeros((n, k)), blocks=range(b0, b1), extra_per_block=8 * n * k,
                                  desc=f"{desc}, step {t + 1}/{len(steps)}")
            users = store.block_range(b1 - 1)[1] - store.block_range(b0)[0]
            if release is not None:
                Y = release.add(Y, rngs[t])
            M += V.T @ Y
            V = np.linalg.qr(V + (eta / (users * L * L)) * Y)[0]
        return V, M

    # sub-block steps: values computed in parallel, steps applied in order in this thread
    state = {"V": V, "t": 0, "M": M}

    def prep(block, b):
        return block, values_of(block)

    def run_steps(st, item):
        block, vals = item
        for u0 in range(0, block.n_users, step_users):
            u1 = min(u0 + step_users, block.n_users)
            Vt = np.ascontiguousarray(st["V"])
            Y = np.zeros((n, k))
            gram_apply_range(block.indptr, block.items, vals, Vt, u0, u1, Y)
            if release is not None:
                Y = release.add(Y, rngs[st["t"]])
            st["M"] += Vt.T @ Y
            st["V"] = np.linalg.qr(Vt + (eta / ((u1 - u0) * L * L)) * Y)[0]
            st["t"] += 1
        return st

    state = engine.map_reduce(prep, run_steps, state, extra_per_block=8 * n * k, desc=desc)
    return state["V"], state["M"]
