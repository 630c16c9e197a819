"""Private Frank-Wolfe matrix completion with joint DP: ``--method fw``.

Jain, Thakkar & Thakurta (ICML 2018), Alg. 1: nuclear-norm-constrained matrix
completion by Frank-Wolfe, split into a **global component**, the only thing
released (each iteration a noisy top eigenvector ``v_t`` of the users' clipped
residual rows' Gramian and its eigenvalue, by noisy power passes shared with ``oja``:
:mod:`streamdp.methods._subspace`), and a **local component**, each user's own row
update, never released (:func:`streamdp.serving.local.fw_local_rows` replays it on her
device). The per-user outputs are therefore **joint** (epsilon, delta)-DP (the
billboard lemma); the ledger's guarantee is :data:`streamdp.privacy.GUARANTEE_JOINT_DP`.
Ratings are centred on a private global mean and item biases first (``--center
private``, the statistics pass of ``oja``) or on the public midpoint. Per-user state
is ``O(T)`` coefficients on disk, item-side state ``O(n_items T)``; kernels in
:mod:`streamdp.kernels.fw`. Public names: :class:`PrivateFrankWolfe` (``fw``,
options :class:`FWOptions`), :func:`step_sizes`, :func:`default_nuclear_norm`,
:func:`passes_in`.

Decisions a reader must know (where the paper is loose or wrong):

* the **residual row is clipped** to ``L`` before it enters the sum, so the
  sensitivity is exactly ``L^2`` (the paper's is off by 4x); each power pass is a
  Gaussian mechanism, all calibrated jointly by the PLD accountant;
* the step direction is the last pass's input with its Ritz value (a consistent
  pair), the eigenvalue is inflated only by the pass's own noise, and each atom is
  scaled by its estimated signal share (:data:`SNR_SHRINK`);
* each user line-searches within Alg. 1's atom and projects her row to her rating
  range (both local, no privacy cost; ``--no-project`` turns the projection off);
* defaults from public parameters only: ``k = h sqrt(m n)``, ``T = 30``
  (:data:`DEFAULT_T`), ``L = h / 2``, 2 power passes private (4 non-private);
  ``--calibration paper`` reproduces Alg. 1's noise for comparison.

The derivation, the sensitivity argument and every measurement behind these choices:
``docs/design-notes.md``, section ``streamdp/methods/frank_wolfe.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from streamdp.errors import ParameterError
from streamdp.kernels.fw import fw_step
from streamdp.kernels.linalg import gram_apply, predict_rows, residuals
from streamdp.methods import register
from streamdp.methods._centering import (CenterOptions, CenterSettings, center_settings, centering_text,
                                         settings_center, settings_shares)
from streamdp.methods._notes import joint_dp_notes
from streamdp.methods._subspace import canonical_signs
from streamdp.methods.base import Fitted, Method, Plan
from streamdp.methods.options import option
from streamdp.privacy import paper_sigma_jain
from streamdp.privacy.bounding import clip_rows
from streamdp.privacy.ledger import GUARANTEE_JOINT_DP
from streamdp.privacy.release import Share, calibrate_releases
from streamdp.stream.engine import add_into as _add

#: Key of this method's random streams.
RNG_KEY = 0x0F3A
_INIT, _PASS = 1, 2
#: Failure probability of the eigenvalue inflation (Alg. 1's beta).
BETA = 0.1
_CENTER = 3
#: Default number of Frank-Wolfe iterations ``T`` (``--rank``).
DEFAULT_T = 30
#: Fraction of the public nuclear-norm bound ``h sqrt(m n)`` used as ``k``.
K_FRACTION = 1.0
#: ``L`` as a fraction of half the rating range ``h`` (see the module docstring).
CLIP_FRACTION = 0.5
#: Scale each private atom by the released pass's estimated signal share (see the module docstring).
SNR_SHRINK = True


def step_sizes(T: int, rule: str) -> np.ndarray:
    """The public step sizes ``eta_1..eta_T``: ``1/T`` (``fixed``, Alg. 1) or ``2/(t+1)`` (``decay``).

    >>> step_sizes(4, "fixed").tolist(), step_sizes(3, "decay").round(3).tolist()
    ([0.25, 0.25, 0.25, 0.25], [1.0, 0.667, 0.5])
    """
    if rule == "fixed":
        return np.full(T, 1.0 / T)
    return 2.0 / (np.arange(1, T + 1) + 1.0)


def default_nuclear_norm(n_users: int, n_items: int, half_range: float) -> float:
    """The default ``k`` from public parameters only (``n_users``, ``n_items``, the declared range).

    A rank-one matrix with entries bounded by ``h`` (half the rating range) has
    nuclear norm ``||Y||_* = ||Y||_F <= h sqrt(m n)`` (Corollary 3.1's regime, Remark 1:
    ``k = O(sqrt(m n))``); ``k = K_FRACTION h sqrt(m n)``.

    >>> default_nuclear_norm(400, 100, 2.0)
    400.0
    """
    return K_FRACTION * half_range * math.sqrt(n_users * n_items)


def _power_pass(engine, d, values_of, rng, release, desc, extra):
    """One noisy power pass: ``(Y / ||Y||, d^T Y, ||Y||^2)`` with ``Y = W_t d + g``.

    :func:`streamdp.methods._subspace.power_pass` for one vector (the same map-reduce and
    :func:`~streamdp.kernels.linalg.gram_apply`), also returning ``||Y||^2`` for the
    signal share of the release (post-processing).
    """
    n = d.shape[0]

    def fn(block, b):
        out = np.zeros((n, 1))
        gram_apply(block.indptr, block.items, values_of(block), d, out)
        return out

    Y = engine.map_reduce(fn, _add, np.zeros((n, 1)), extra_per_block=8 * n + int(extra), desc=desc)
    if release is not None:
        Y = release.add(Y, rng)
    y2 = float(Y[:, 0] @ Y[:, 0])
    return (Y / math.sqrt(y2) if y2 > 0 else Y), d.T @ Y, y2


def passes_in(t: int, P: int) -> int:
    """Power passes of iteration ``t``: ``P``, one more in the first (its input is a random vector).

    >>> [passes_in(t, 1) for t in (1, 2, 3)]
    [2, 1, 1]
    """
    return P + 1 if t == 1 else P


@dataclass(frozen=True)
class FWOptions(CenterOptions):
    """``--method fw``'s options (``None``: derived from public parameters, see the module docstring)."""

    passes: int | None = option("noisy power passes per Frank-Wolfe iteration (each one Gaussian release)",
                                minimum=1, default_text="2 private, 4 non-private")
    clip: float | None = option("largest norm a user's residual row may have in the global sum: bounds each "
                                "user's influence (L2 bound L, sensitivity L^2)",
                                default_text="a quarter of the rating range private, none non-private", minimum=0,
                                exclusive_minimum=True)
    nuclear_norm: float | None = option("nuclear-norm bound k of the completed matrix",
                                        default_text="half the rating range x sqrt(n_users n_items)", minimum=0,
                                        exclusive_minimum=True)
    step: Literal["fixed", "decay"] = option(
        "fixed: every step the same size (1/T, Alg. 1); decay: steps that shrink (2/(t+1))", default="fixed")
    project: bool = option("scale each user's row so her predictions at her rated items have RMS <= half the "
                           "rating range (Alg. 1's Pi_{L,Omega})", default=True)
    calibration: Literal["pld", "paper"] = option(
        "pld: the least noise the accountant allows; paper: the noise of Jain et al. Alg. 1 (its sigma), for "
        "comparison", default="pld")
    checkpoint: str | None = option("run directory: per-iteration checkpoints (noisy iterates: counted as "
                                    "released, never refunded; keep it private); resumes if it holds one",
                                    metavar="DIR")


@dataclass(frozen=True)
class FWSettings(CenterSettings):
    """A run's resolved settings (all of them enter the checkpoint's fingerprint)."""

    #: Frank-Wolfe iterations (``--rank``).
    T: int
    half_range: float
    passes: int
    clip: float
    #: The nuclear-norm bound.
    k: float
    step: str
    project: bool
    #: RMS bound of a user's predictions at her items (``inf``: ``--no-project``).
    bound: float
    calibration: str
    #: The public step sizes ``eta_1..eta_T`` (:func:`step_sizes`).
    eta: tuple


@register
class PrivateFrankWolfe(Method):
    """``--method fw``: private Frank-Wolfe (Jain et al. 2018, Alg. 1), joint DP; ``--rank`` is ``T``."""

    name = "fw"
    MAIN_OPTIONS = ("passes", "nuclear_norm", "center", "checkpoint")
    SUMMARY = ("private Frank-Wolfe matrix completion (Jain et al. 2018, Alg. 1): noisy top eigenvector per "
               "iteration, users' rank-one updates local; joint DP")
    Options = FWOptions
    LOCAL_SOLVER = "frank_wolfe"
    RANK_IS_FACTORS = False
    guarantee = GUARANTEE_JOINT_DP

    def default_rank(self) -> int:
        """``T``, the number of Frank-Wolfe iterations (the rank of the release): see :data:`DEFAULT_T`."""
        return DEFAULT_T

    # -- settings ----------------------------------------------------------------------
    def settings(self, store) -> FWSettings:
        """All parameters of a run on ``store``, defaults resolved from public parameters."""
        o = self.opts
        c = center_settings(o, store, self.epsilon, n_users=self.n_users(store))
        h = (c["rating_max"] - c["rating_min"]) / 2.0
        default_passes, default_clip = (2, CLIP_FRACTION * h) if self.private else (4, math.inf)
        return FWSettings(**c, T=self.rank, half_range=h, passes=o.passes if o.passes is not None else default_passes,
                          clip=o.clip if o.clip is not None else default_clip,
                          k=(o.nuclear_norm if o.nuclear_norm is not None
                             else default_nuclear_norm(self.n_users(store), store.n_items, h)),
                          step=o.step, project=o.project, bound=h if o.project else math.inf,
                          calibration=o.calibration, eta=tuple(step_sizes(self.rank, o.step).tolist()))

    # -- privacy plan ------------------------------------------------------------------
    def _plan(self, store) -> Plan:
        s = self.settings(store)
        T, P, L = s.T, s.passes, s.clip
        bounds = {"clip_L": L, "nuclear_norm_k": s.k, "projection_rms_bound": s.bound,
                  "rating_min": s.rating_min, "rating_max": s.rating_max,
                  "rating_range_source": getattr(store, "rating_range_source", "unknown"),
                  "centering": centering_text(s)}
        if not self.private:
            entries = [{"release": "Frank-Wolfe basis v_t and eigenvalues lambda_t", "mechanism": "none (non-private)",
                        "iterations": T, "passes_per_iteration": P}]
            return Plan(events=[], entries=entries, settings=s, bounds=bounds)
        if not math.isfinite(L):
            raise ParameterError("--clip must be finite for a private run")
        count = sum(passes_in(t, P) for t in range(1, T + 1))
        f, g = s.stats_share, s.mean_share
        what = ("W_t v + g per power pass: users' residual rows clipped to L (one Gaussian per pass; T iterations x "
                "P passes, one more in the first)")
        centre = settings_shares(s, store.n_items)
        if s.calibration == "paper":
            # Alg. 1's sigma on the power passes exactly; the centring (not in the paper) at the same budget scalar
            z = paper_sigma_jain(self.epsilon_after_first(store), self.delta, count=count, which="alg1") / math.sqrt(count)
            releases = [Share(what, "gaussian", L * L, 1.0, count=count, shape=(store.n_items, 1)).at(z)]
            releases += [sh.at(z) for sh in centre]
        else:
            share = Share(what, "gaussian", L * L, 1.0 - f - g, count=count, shape=(store.n_items, 1))
            releases = calibrate_releases([share] + centre, self.epsilon, self.delta, fixed=self.spent_first(store))
        release = releases[0]
        entry = release.entry()
        entry.update(iterations=T, passes_per_iteration=P, calibration=s.calibration)
        entries = [entry] + [r.entry() for r in releases[1:]] + [
            {"release": "eigenvalues lambda_t (Ritz value of each iteration's last pass, inflated by the noise bound, "
                        "divided by the pass's estimated signal share)", "mechanism": "post-processing", "count": 0}]
        return Plan(events=[r.event() for r in releases], entries=entries, settings=s, bounds=bounds,
                    releases=releases)

    def state_bytes(self, store) -> int:
        """Item-side memory: the basis ``V`` (``n_items x T``), the power vectors and their partial sums."""
        n, T = store.n_items, self.rank
        return 8 * n * (2 * T + 8)

    # -- fitting -------------------------------------------------------------------------
    def fit(self, store, engine) -> Fitted:
        plan = self.plan(store)
        with self.open_run(store, plan, rng_key=RNG_KEY, engine=engine) as run:
            return self._fit(store, engine, run, plan)

    def _fit(self, store, engine, run, plan) -> Fitted:

        s = plan.settings
        n, T, P = store.n_items, s.T, s.passes
        release = plan.releases[0] if plan.releases else None
        sigma = release.scale if release is not None else 0.0
        tail = sigma * math.sqrt(2.0 * math.log(1.0 / BETA))  # lambda^2's noise d . g ~ N(0, sigma^2), 1 - beta
        ck = run.checkpoint
        if ck is not None:
            V, lam, v = ck["basis"].copy(), ck["lam"].copy(), ck["v"].copy()
            mu, bias = float(ck["mu"]), ck["bias"].copy()
        else:
            mu, bias = settings_center(self, store, engine, plan, run.rng(_CENTER, 0))
            V = np.zeros((n, T))
            lam = np.zeros(T)
            v = run.rng(_INIT, 0).standard_normal((n, 1))
            v /= np.linalg.norm(v)
        state = run.user_state("coef", T, dtype=np.float64)
        bu = store.block_users
        # per block beyond the engine's one float64 a rating: the residuals, and the coefficients read and written
        extra = 8 * int(store.block_nnz().max(initial=0)) + 16 * T * bu
        for t in run.epochs(T, desc="fw iterations"):
            n_pass = passes_in(t, P)
            for p in range(n_pass):
                # each pass's input, rounded to what the model stores (float32): the released direction is
                # exactly the vector whose Ritz value was computed, and the users' local steps in training
                # and on their devices use the same basis
                d = canonical_signs(v).astype(np.float32).astype(np.float64)
                d /= np.linalg.norm(d)
                values_of = self._values_fn(s, t, p, V, lam, state, bu, mu, bias)
                v, M, y2 = _power_pass(engine, d, values_of, run.group_rng(_PASS, t, p), release,
                                       desc=f"fw iteration {t}/{T}, pass {p + 1}/{n_pass}", extra=extra)
            # step t: the last pass's input and its Ritz value d . (W_t d + g); its output warm-starts t + 1
            V[:, t - 1] = d[:, 0]
            lam[t - 1] = math.sqrt(max(float(M[0, 0]) + tail, 0.0))
            if SNR_SHRINK and release is not None and lam[t - 1] > 0:
                # the share of the released Y = W d + g that is signal: s^2 = (||Y||^2 - n sigma^2) / ||Y||^2
                s2 = max(y2 - n * sigma * sigma, 0.0) / y2 if y2 > 0 else 0.0
                lam[t - 1] = lam[t - 1] / math.sqrt(s2) if s2 > 0 else 0.0
            run.save(t, basis=V, lam=lam, v=v, mu=mu, bias=bias)
        return self._fitted(store, plan, run, V, lam, mu, bias)

    def _values_fn(self, s, t, p, V, lam, state, bu, mu, bias):
        """Per block: the users' residual rows after ``t - 1`` steps, clipped to ``L``.

        The first pass of iteration ``t >= 2`` takes the local step ``t - 1`` (with
        ``v_{t-1}, lambda_{t-1}``) from the coefficients in slot ``(t - 2) % 2`` and
        writes them to slot ``(t - 1) % 2``; later passes read that slot.
        """
        L, k, bound, eta = s.clip, s.k, s.bound, s.eta
        zero_bias = np.zeros(V.shape[0])
        bias = np.ascontiguousarray(bias, dtype=np.float64)
        Vt = np.ascontiguousarray(V[:, :t - 1]) if t > 1 else None
        Vc = np.ascontiguousarray(V)

        def values(block):
            ip, it = block.indptr, np.ascontiguousarray(block.items, dtype=np.int32)
            b = block.first_user // bu
            x = np.empty(block.nnz, np.float64)
            residuals(it, block.ratings, float(mu), bias, x)
            if t == 1:
                resid = -x
            elif p == 0:
                C_in = state[(t - 2) % 2].read(b) if t > 2 else np.zeros((block.n_users, s.T))
                C_out = np.empty_like(C_in)
                resid = np.empty(block.nnz, np.float64)
                fw_step(ip, it, x, C_in, Vc, t - 2, float(lam[t - 2]), float(eta[t - 2]), k, L, bound, C_out, resid)
                state[(t - 1) % 2].write(b, C_out)
            else:
                C = np.ascontiguousarray(state[(t - 1) % 2].read(b)[:, :t - 1])
                resid = np.empty(block.nnz, np.float64)
                predict_rows(ip, it, C, Vt, zero_bias, 0.0, -np.inf, np.inf, resid)
                resid -= x
            return clip_rows(ip, resid, L, inplace=True) if math.isfinite(L) else resid

        return values

    # -- the released model --------------------------------------------------------------
    def _fitted(self, store, plan, run, V, lam, mu, bias) -> Fitted:
        s = plan.settings
        ledger = self.ledger(store, plan, notes=joint_dp_notes(
            self, plan.bounds, "the released basis v_1..v_T and eigenvalues lambda_1..lambda_T are user-level "
            "(epsilon, delta)-DP; each user's completed row is computed on her device from them and her own ratings "
            "(Jain et al. 2018, Alg. 1's local component)"))
        params = {key: getattr(s, key) for key in ("T", "passes", "clip", "k", "step", "project", "bound",
                                                   "calibration", "center", "stats_share", "mean_share")}
        info = {"method": self.name, "rank": s.T, "epsilon": self.epsilon if self.private else "inf",
                "delta": self.delta, "seed": self.seed,
                "n_users": self.n_users(store), "n_items": store.n_items, "parameters": params,
                "local": self.LOCAL_SOLVER, "local_user_bias": False,
                "local_fw": {"k": s.k, "clip": s.clip if math.isfinite(s.clip) else None,
                             "bound": s.bound if math.isfinite(s.bound) else None},
                "item_factors": "the released Frank-Wolfe basis v_1..v_T (columns); a user's row is c_i V^T with "
                                "c_i from her local steps (streamdp.serving.local.fw_local_rows)",
                "resumed_from_iteration": run.start - 1 if run.start > 1 else None, "run_id": run.run_id,
                "run_directory": None if run.own_dir else run.dir,
                "rating_range": {"min": s.rating_min, "max": s.rating_max}}
        return Fitted(item_factors=V.astype(np.float32), item_bias=np.asarray(bias, np.float32),
                      item_ids=store.item_ids(), global_mean=float(mu), model_info=info, ledger=ledger,
                      extras={"fw_lambda": np.asarray(lam, np.float64), "fw_eta": np.asarray(s.eta, np.float64)})
