"""Private low-rank approximation by Gaussian measurements (Hardt & Roth) and randomized response: ``lowrank``.

Source: Hardt & Roth, *Beating randomized response on incoherent matrices*: the
randomized range finder and projection of Halko, Martinsson & Tropp made private by
noise on the ``k``-dimensional sketch and on the projection (``--mechanism
measurements``, the default), against **randomized response** (noise on every entry,
then a truncated SVD by streamed subspace iteration). Both stream the store block by
block; neither holds anything ``n_users x n_items`` in memory (randomized response
regenerates its noise per pass). ``A``'s row ``a_i`` is user ``i``'s ratings minus the
public midpoint, clipped to L2 norm ``L`` (``--clip``). Released: the item-side basis
``V_k``, the singular values ``S_k`` and, for measurements, the noisy projection;
never the user side ``Q``. Public names: :class:`LowRank` (its own command,
``streamdp lowrank``; options :class:`LowRankOptions`), :func:`default_oversampling`,
:func:`format_lowrank_summary`, :data:`RELATION_COVERS`, :data:`WEAKER_NOTE`.

Decisions a reader must know:

* **the guarantee is for the paper's relation** (one row changed by at most ``L``,
  users and items fixed; :data:`streamdp.privacy.ledger.GUARANTEE_ROW_DP`): it covers
  zero-out and, at the epsilon the ledger states, replace-one, but **not add/remove
  one user** (the noise has a slot per user); the ledger, the budget and the output
  say so;
* each user's sketch row is clipped to ``C`` (deterministic sensitivity ``2C``, exact
  accounting) instead of the paper's tail bound over a secret ``Omega``; the
  projection takes one Gaussian of sensitivity ``max_i ||Q_i|| L``; the output is
  truncated to rank ``k``; pruning (``--prune``) is off by default;
* both releases are calibrated jointly by the PLD accountant, ``--sketch-share`` of
  the Gaussian budget to the sketch.

The algorithm step by step, the sensitivities, the decisions in full and the
measurements (``bench/lowrank.py``): ``docs/design-notes.md``, section
``streamdp/methods/lowrank.py``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from scipy.stats import chi2

from streamdp.errors import ParameterError
from streamdp.kernels.sketch import csr_matmul, csr_t_matmul
from streamdp.methods._notes import range_notes, seed_notes
from streamdp.methods._subspace import DEFAULT_RIDGE, residual_values, scaled_factors
from streamdp.methods.base import Fitted, Method, Plan, RunSettings
from streamdp.methods.options import MethodOptions, option
from streamdp.privacy import compose, epsilon_of, gaussian_event
from streamdp.privacy.accountant import BOUNDED_ROW_CHANGE_RELATION
from streamdp.privacy.bounding import clip_rows
from streamdp.privacy.ledger import GUARANTEE_ROW_DP
from streamdp.privacy.release import Share, calibrate_releases
from streamdp.stream.engine import add_into as _add

__all__ = ["LowRank", "default_oversampling", "format_lowrank_summary"]

#: Key of this method's random families (:class:`streamdp.stream.driver.Run`).
RNG_KEY = 0x10A4
_OMEGA, _SKETCH, _PROJECTION, _RR_NOISE, _RR_START = 1, 2, 3, 4, 5
#: Users per noise group: the noise of user ``u`` is drawn from the stream of group ``u // NOISE_GROUP_USERS``,
#: so it is the same whatever block holds ``u`` (and in every pass).
NOISE_GROUP_USERS = 256
#: Noise drawn at once per block in flight (randomized response: rows of ``n_items`` draws).
NOISE_CHUNK_BYTES = 16 << 20
#: Sketch rows are clipped to ``L`` times the square root of this quantile of chi-square(k') (decision 1).
SKETCH_QUANTILE = 0.95

RELATION_COVERS = {
    "bounded_row_change": "covered: one user's clipped row changes by a vector of L2 norm <= L (the stated relation)",
    "zero_out": "covered at the same (epsilon, delta): a user's row replaced by zeros moves it by ||a_i|| <= L",
    "replace_one": "covered at bounds.epsilon_replace_one: a row replaced by any other moves it by up to 2L",
    "add_remove": ("NOT covered: the number of users is public (every user's slot gets noise), so this is weaker "
                   "than streamdp's user-level add/remove guarantee"),
}
WEAKER_NOTE = ("the guarantee holds for the bounded row-change relation of Hardt & Roth (users and items fixed, one "
               "user's clipped row changes by L2 norm <= L), which is WEAKER than streamdp's user-level add/remove "
               "guarantee: it covers a user zeroing out her row, and replacing her row only at epsilon_replace_one; "
               "the number of users is public")


def default_oversampling(rank: int) -> int:
    """Oversampling ``p`` (``k' = k + p`` columns) from the rank only.

    HMT's ``p = k`` (the paper's eq. 4 regime). Measured with ``bench/lowrank.py``
    (k = 6, epsilon 4 / 16 / 64): ``p`` = 2, 6 and 18 were within 0.05 of each other
    on every error, none better throughout.

    >>> default_oversampling(8)
    8
    """
    return max(2, int(rank))


def _noise_rows(run, purpose: int, release, first: int, end: int, width: int, max_rows: int):
    """Yield ``(u0, u1, N)``: the noise rows of users ``first + u0 .. first + u1`` (local rows of a block).

    User ``u``'s row is drawn from the stream of group ``u // NOISE_GROUP_USERS``
    (``run.group_rng(purpose, 0, group)``), rows in order; rows of the group before
    ``first`` are drawn and discarded, so a user's noise does not depend on how users
    are cut into blocks, and every pass regenerates the same rows. Chunks hold at
    most ``max_rows`` rows (sequential draws from one stream do not depend on the
    chunking). ``release`` ``None`` (non-private): ``N`` is ``None``.
    """
    G = NOISE_GROUP_USERS
    max_rows = max(1, int(max_rows))
    if release is None:
        for u0 in range(0, end - first, max_rows):
            yield u0, min(u0 + max_rows, end - first), None
        return
    for g in range(first // G, -(-end // G)):
        g0 = g * G
        lo, hi = max(g0, first), min(g0 + G, end)
        if lo >= hi:
            continue
        rng = run.group_rng(purpose, 0, g)
        skip = lo - g0
        while skip > 0:
            r = min(skip, max_rows)
            release.noise(rng, (r, width))
            skip -= r
        for u in range(lo, hi, max_rows):
            r = min(max_rows, hi - u)
            yield u - first, u - first + r, release.noise(rng, (r, width))


def _clip_dense_rows(X: np.ndarray, bound: float) -> np.ndarray:
    """Rows of the dense ``X`` scaled to L2 norm at most ``bound`` (the one clipping function, on dense rows)."""
    if not math.isfinite(bound) or X.size == 0:
        return X
    n, k = X.shape
    return clip_rows(np.arange(0, n * k + 1, k, dtype=np.int64), np.ascontiguousarray(X).ravel(), bound) \
        .reshape(n, k)


def _orthonormalizer(G: np.ndarray) -> np.ndarray:
    """``T`` with ``Y T`` orthonormal for ``Y^T Y = G`` (eigen-decomposition; null directions dropped), columns by
    descending singular value of ``Y``."""
    lam, W = np.linalg.eigh((G + G.T) / 2.0)
    order = np.argsort(lam)[::-1]
    lam, W = lam[order], W[:, order]
    if not lam.size or not lam[0] > 0:
        raise ParameterError("lowrank: the clipped rating matrix is zero (no ratings?)")
    keep = lam > 1e-12 * lam[0]
    return W[:, keep] / np.sqrt(lam[keep])


@dataclass(frozen=True)
class LowRankOptions(MethodOptions):
    """``streamdp lowrank``'s options (``None``: derived from public parameters)."""

    mechanism: Literal["measurements", "randomized-response"] = option(
        "measurements: Gaussian measurements, noise on the k'-dimensional sketch and projection (Hardt & Roth); "
        "randomized-response: noise on every entry, then a truncated SVD (the baseline; n_users x n_items draws "
        "per pass)", default="measurements")
    oversampling: int | None = option("extra sketch columns p (k' = k + p)", minimum=0, default_text="max(2, k)")
    clip: float | None = option("row-norm bound L of the centred ratings", minimum=0, exclusive_minimum=True,
                                default_text="half the rating range x sqrt 5")
    #: Share of the Gaussian budget (in ``sum 1/z^2``) given to the sketch; the rest goes to the projection.
    #: Measured (``bench/lowrank.py``, 20,000 x 200 low-coherence matrix, k = 6): the error of the local projection
    #: on the released basis at epsilon 2 / 4 / 16 was 0.655 / 0.310 / 0.111 with share 0.2, 0.630 / 0.274 / 0.110
    #: with 0.35, 0.644 / 0.264 / 0.109 with 0.5 and 0.326 (epsilon 4) with 0.8; 0.5 is also the best of these
    #: for the paper's rank-k output.
    sketch_share: float = option("share of the budget for the sketch (measurements)", minimum=0,
                                 exclusive_minimum=True, maximum=1, default=0.5)
    prune: float | None = option("clip the rows of the range basis Q to C sqrt(k'/n_users) before the projection "
                                 "(measurements)", minimum=0, exclusive_minimum=True, default_text="off",
                                 metavar="C")
    #: Subspace-iteration passes of randomized response. Measured on a 5,000 x 1,000 low-coherence matrix at
    #: epsilon 16, k = 6: local-projection error 0.914 (3 passes), 0.631 (6), 0.473 (15): the noisy spectrum has
    #: a small gap, so randomized response needs many passes (each one regenerating ``n_users x n_items`` draws);
    #: ``bench/lowrank.py`` runs it with 20 so that the baseline is close to the exact truncated SVD.
    power_iters: int = option("subspace-iteration passes (randomized-response)", minimum=1, default=10)


@dataclass(frozen=True)
class LowRankSettings(RunSettings):
    """A run's resolved settings (the run's fingerprint covers them all)."""

    mechanism: str
    rank: int
    oversampling: int
    #: Sketch columns ``k' = k + p`` (at most ``n_items`` and ``n_users``).
    columns: int
    clip: float
    #: The sketch rows' bound ``C`` (``inf`` non-private).
    sketch_clip: float
    sketch_quantile: float
    sketch_share: float
    prune: float | None
    #: The rows' bound ``tau`` of ``Q`` (``inf``: no pruning).
    prune_bound: float
    power_iters: int
    rating_min: float
    rating_max: float
    midpoint: float


class LowRank(Method):
    """Private rank-``k`` approximation of the clipped rating matrix (see the module docstring).

    Not a ``train`` method (not registered): ``streamdp lowrank`` runs it through
    :func:`lowrank`. After :meth:`fit`, :meth:`errors` measures the Frobenius error
    of the approximation on the same store (non-private diagnostics, for benchmarks
    and tests only).
    """

    #: Users are fixed by this method's relation (:data:`RELATION_COVERS`: add/remove is not covered and every
    #: user's slot gets noise), so the run reads the exact number of users and spends nothing on it.
    RELEASES_USER_COUNT = False

    name = "lowrank"
    SUMMARY = "private low-rank approximation by Gaussian measurements (Hardt & Roth) or randomized response"
    Options = LowRankOptions
    guarantee = GUARANTEE_ROW_DP
    relation = BOUNDED_ROW_CHANGE_RELATION

    # -- settings ----------------------------------------------------------------------
    def settings(self, store) -> LowRankSettings:
        """All parameters of a run on ``store``, defaults resolved from public parameters."""
        o = self.opts
        lo, hi = float(store.rating_min), float(store.rating_max)
        if o.mechanism == "measurements" and not o.sketch_share < 1.0:
            raise ParameterError(f"--sketch-share must be < 1 (the projection needs a share too), got {o.sketch_share}")
        p = o.oversampling if o.oversampling is not None else default_oversampling(self.rank)
        kp = int(min(self.rank + p, store.n_items, self.n_users(store)))
        clip = o.clip if o.clip is not None else (hi - lo) / 2.0 * math.sqrt(5.0)
        C = clip * math.sqrt(chi2.ppf(SKETCH_QUANTILE, kp)) if self.private else math.inf
        tau = o.prune * math.sqrt(kp / self.n_users(store)) if o.prune is not None else math.inf
        return LowRankSettings(mechanism=o.mechanism, rank=self.rank, oversampling=kp - self.rank, columns=kp,
                               clip=clip, sketch_clip=C, sketch_quantile=SKETCH_QUANTILE, sketch_share=o.sketch_share,
                               prune=o.prune, prune_bound=tau, power_iters=o.power_iters, rating_min=lo,
                               rating_max=hi, midpoint=(lo + hi) / 2.0)

    # -- privacy plan ------------------------------------------------------------------
    def _shares(self, store, s: LowRankSettings) -> list:
        m, n, kp, L = self.n_users(store), store.n_items, s.columns, s.clip
        if s.mechanism == "measurements":
            return [Share("sketch rows clip(a_i Omega, C) + N1 (user side, never written: input of Q)", "gaussian",
                          2.0 * s.sketch_clip, s.sketch_share, shape=(m, kp)),
                    Share("noisy projection Q^T A + N2 (sensitivity L max_i ||Q_i||, set from the released sketch; "
                          "planned at its bound L)", "gaussian", L, 1.0 - s.sketch_share, shape=(kp, n))]
        return [Share("noisy matrix A + N (every entry; never materialized, regenerated per user group each pass)",
                      "gaussian", L, 1.0, shape=(m, n))]

    def _plan(self, store) -> Plan:
        s = self.settings(store)
        bounds = {"clip_L": s.clip, "rating_min": s.rating_min, "rating_max": s.rating_max,
                  "rating_range_source": getattr(store, "rating_range_source", "unknown"),
                  "centre": "public midpoint of the rating range"}
        if s.mechanism == "measurements":
            bounds.update(sketch_clip_C=s.sketch_clip, sketch_quantile=s.sketch_quantile, prune_bound=s.prune_bound)
        if not self.private:
            return Plan(events=[], entries=[{"release": "low-rank approximation", "mechanism": "none (non-private)"}],
                        settings=s, bounds=bounds)
        releases = calibrate_releases(self._shares(store, s), self.epsilon, self.delta,
                                      fixed=self.spent_first(store))
        bounds["epsilon_replace_one"] = self._epsilon_replace_one(releases, self.spent_first(store))
        bounds["relation_covers"] = dict(RELATION_COVERS)
        entries = [r.entry() for r in releases]
        entries.append({"release": "item basis V_k and singular values S_k (top-k of the noisy projection / matrix)",
                        "mechanism": "post-processing", "count": 0})
        return Plan(events=[r.event() for r in releases], entries=entries, settings=s, bounds=bounds,
                    releases=releases)

    def _epsilon_replace_one(self, releases, first=()) -> float:
        """Epsilon when one user's row may be replaced by any other: the sensitivities of ``L`` double (the sketch's
        ``2C`` covers it already); same accountant, same delta. ``first``: the releases spent before the plan (a
        rating range selected privately, :mod:`streamdp.privacy.rating_range`): its Gaussian's sensitivity grows
        from 1 to ``sqrt(2)`` (two users' contributions of norm 1 with non-negative entries), its threshold's delta
        stays (only the replaced user's own values can appear or vanish)."""
        zs = [r.noise_multiplier / (1.0 if "sketch rows" in r.what else 2.0) for r in releases]
        events = [gaussian_event(z) for z in zs]
        events += [gaussian_event(r.noise_multiplier / math.sqrt(2.0)) if r.mechanism == "gaussian" else r.event()
                   for r in first]
        return float(epsilon_of(compose(events), self.delta).epsilon)

    def state_bytes(self, store) -> int:
        """Item-side state: ``Omega``/``V`` and their products (``n_items x k'`` float64), a few of them."""
        kp = self.settings(store).columns
        return 6 * store.n_items * kp * 8

    def _extra_per_block(self, store, kp: int, noise_width: int) -> int:
        """Bytes a block in flight holds beyond its ratings: partials, sketch rows, a noise chunk."""
        rows = min(store.block_users, max(1, NOISE_CHUNK_BYTES // (8 * max(noise_width, 1))))
        return 8 * store.n_items * kp + 4 * 8 * store.block_users * kp + 2 * 8 * rows * noise_width

    # -- fitting -----------------------------------------------------------------------
    def fit(self, store, engine) -> Fitted:
        plan = self.plan(store)
        s = plan.settings
        values_of = residual_values(s.midpoint, np.zeros(store.n_items), s.clip, s.rating_min, s.rating_max)
        t0 = time.perf_counter()
        with self.open_run(store, plan, rng_key=RNG_KEY, engine=engine) as run:
            if s.mechanism == "measurements":
                state = self._fit_measurements(store, engine, plan, run, values_of)
            else:
                state = self._fit_rr(store, engine, plan, run, values_of)
        state.update(run=run, values_of=values_of, plan=plan)
        self._state = state
        return self._fitted(store, plan, state, time.perf_counter() - t0)

    def _fit_measurements(self, store, engine, plan, run, values_of) -> dict:
        s = plan.settings
        n, kp, C = store.n_items, s.columns, s.sketch_clip
        rel1, rel2 = plan.releases if self.private else (None, None)
        Omega = run.rng(_OMEGA, 0).standard_normal((n, kp))
        sketch = _sketch_fn(run, Omega, C, rel1, values_of)
        extra = self._extra_per_block(store, kp, kp)

        def gram(block, b):
            _, Y = sketch(block)
            return Y.T @ Y

        G = engine.map_reduce(gram, _add, np.zeros((kp, kp)), extra_per_block=extra, desc="lowrank sketch")
        T = _orthonormalizer(G)
        r = T.shape[1]
        tau = s.prune_bound

        def project(block, b):
            vals, Y = sketch(block)
            Q = _clip_dense_rows(Y @ T, tau)
            P = np.zeros((n, r))
            csr_t_matmul(block.indptr, block.items, vals, np.ascontiguousarray(Q), P)
            return P, float(np.sqrt((Q * Q).sum(axis=1).max())) if len(Q) else 0.0

        def combine(acc, part):
            P = acc[0]
            P += part[0]
            return P, max(acc[1], part[1])

        Bt, mu = engine.map_reduce(project, combine, (np.zeros((n, r)), 0.0), extra_per_block=extra,
                                   desc="lowrank projection")
        realized = None
        if rel2 is not None:
            realized = replace(rel2, sensitivity=mu * s.clip, shape=(r, n))
            Bt = realized.add(Bt, run.rng(_PROJECTION, 0))
        Uo, S, Vh = np.linalg.svd(Bt, full_matrices=False)
        k = min(self.rank, r)
        return dict(Omega=Omega, T=T, mu=mu, projection_release=realized, noisy_projection=Bt,
                    basis=Uo[:, :k], singular_values=S[:k], UB=Vh[:k].T)

    def _fit_rr(self, store, engine, plan, run, values_of) -> dict:
        n, kp, passes = store.n_items, plan.settings.columns, plan.settings.power_iters
        rel = plan.releases[0] if self.private else None
        V = np.linalg.qr(run.rng(_RR_START, 0).standard_normal((n, kp)))[0]
        extra = self._extra_per_block(store, kp, n)
        H = None
        for t in range(passes):
            Vc = np.ascontiguousarray(V)

            def fn(block, b, Vc=Vc):
                vals = values_of(block)
                Z = np.zeros((n, kp))
                for u0, u1, N, ip in _rr_chunks(run, rel, block, n):
                    X = np.empty((u1 - u0, kp))
                    csr_matmul(ip, block.items, vals, Vc, X)
                    if N is not None:
                        X += N @ Vc
                    csr_t_matmul(ip, block.items, vals, X, Z)
                    if N is not None:
                        Z += N.T @ X
                return Z

            Z = engine.map_reduce(fn, _add, np.zeros((n, kp)), extra_per_block=extra,
                                  desc=f"lowrank randomized response {t + 1}/{passes}")
            H, V_in = V.T @ Z, V
            V = np.linalg.qr(Z)[0]
        # Rayleigh-Ritz on the last pass's basis: V_in^T A~^T A~ V_in = H
        lam, W = np.linalg.eigh((H + H.T) / 2.0)
        order = np.argsort(lam)[::-1][:self.rank]
        return dict(basis=V_in @ W[:, order], singular_values=np.sqrt(np.maximum(lam[order], 0.0)))

    def _fitted(self, store, plan, state, seconds) -> Fitted:
        s = plan.settings
        V, sv = state["basis"], state["singular_values"]
        notes = [WEAKER_NOTE] if self.private else [
            "non-private: --epsilon inf, no noise added (clipping still applied, sketch rows not clipped)"]
        notes += seed_notes(self)
        notes += range_notes(plan.bounds["rating_range_source"], self.private)
        if V.shape[1] < self.rank:
            notes.append(f"the noisy range has rank {V.shape[1]} < k = {self.rank}: {V.shape[1]} factors released")
        ledger = self.ledger(store, plan, notes=notes)
        rel = state.get("projection_release")
        if rel is not None:  # the projection's sensitivity, realized from the released sketch
            at = len(self.spent_first(store)) + 1  # after the releases made first (a selected range) and the sketch
            ledger.bounds["releases"][at] = {**rel.entry(), "sensitivity_rule": "L max_i ||Q_i|| (realized)"}
            ledger.bounds["projection_mu"] = state["mu"]
        released = ["item_factors: scaled item basis for a local solve (n_items x k)",
                    "basis: item basis V_k (n_items x k)", "singular_values: S_k (k)"]
        extras = {"singular_values": np.asarray(sv, np.float64), "basis": np.asarray(V, np.float32)}
        if s.mechanism == "measurements":
            released.append(f"noisy_projection: (Q^T A + N2)^T (n_items x {state['noisy_projection'].shape[1]})")
            extras["noisy_projection"] = state["noisy_projection"].astype(np.float32)
        info = {"method": self.name, "mechanism": s.mechanism, "rank": int(V.shape[1]),
                "epsilon": self.epsilon if self.private else "inf", "delta": self.delta, "seed": self.seed,
                 "n_users": self.n_users(store), "n_items": store.n_items,
                "parameters": {k: getattr(s, k) for k in ("oversampling", "columns", "clip", "sketch_clip",
                                                          "sketch_quantile", "sketch_share", "prune", "prune_bound",
                                                          "power_iters")},
                "released": released,
                "not_released": "user-side factors (Q, U_B; the noisy sketch or matrix): each user projects her own "
                                "row on the basis locally",
                "item_factors": "V_k diag(w), rows of mean squared norm 1 (see scaled_factors)",
                "ridge": DEFAULT_RIDGE}
        return Fitted(item_factors=scaled_factors(V, sv).astype(np.float32) if V.shape[1] else
                      np.zeros((store.n_items, 0), np.float32),
                      item_bias=np.zeros(store.n_items, np.float32), item_ids=store.item_ids(),
                      global_mean=s.midpoint, model_info=info, ledger=ledger, extras=extras,
                      per_item_extras=tuple(k for k in ("basis", "noisy_projection") if k in extras))

    # -- diagnostics (non-private) -----------------------------------------------------
    def errors(self, store, engine) -> dict:
        """Frobenius errors of the fitted approximation on ``store`` (non-private: for benchmarks and tests).

        One streamed pass; returns ``frobenius`` (``||A||_F``), ``error``
        (``||A - A^||_F`` of the paper's rank-``k`` output: ``Q [B~]_k`` or ``[A~]_k``),
        ``error_local`` (``||A - A V_k V_k^T||_F``: every user projecting her own row
        on the released basis) and, for measurements, ``error_untruncated``
        (``||A - Q B~||_F``, rank ``k'``, HMT's output).
        """
        st = getattr(self, "_state", None)
        if st is None:
            raise ParameterError("lowrank: errors() needs a fitted run (call fit first)")
        plan, run, values_of = st["plan"], st["run"], st["values_of"]
        s = plan.settings
        release = plan.releases[0] if self.private else None
        V = np.ascontiguousarray(st["basis"])
        k = V.shape[1]
        n = store.n_items
        if s.mechanism == "measurements":
            sketch = _sketch_fn(run, st["Omega"], s.sketch_clip, release, values_of)
            T, UB, sv, Bt = st["T"], st["UB"], st["singular_values"], np.ascontiguousarray(st["noisy_projection"])
            UBs = UB * sv  # (r x k): Q_i UBs = coordinates of row i of A^ on V
            BBt = Bt.T @ Bt

            def fn(block, b):
                vals, Y = sketch(block)
                Q = Y @ T
                AV = np.empty((block.n_users, k))
                csr_matmul(block.indptr, block.items, vals, V, AV)
                AB = np.empty((block.n_users, Bt.shape[1]))
                csr_matmul(block.indptr, block.items, vals, Bt, AB)
                C = Q @ UBs
                a2 = float(vals @ vals)
                return np.array([a2, a2 - 2.0 * float((AV * C).sum()) + float((C * C).sum()),
                                 a2 - float((AV * AV).sum()),
                                 a2 - 2.0 * float((AB * Q).sum()) + float(((Q @ BBt) * Q).sum())])
        else:
            def fn(block, b):
                vals = values_of(block)
                a2 = float(vals @ vals)
                out = np.array([a2, a2, a2, 0.0])
                for u0, u1, N, ip in _rr_chunks(run, release, block, n):
                    X0 = np.empty((u1 - u0, k))
                    csr_matmul(ip, block.items, vals, V, X0)
                    X = X0 + N @ V if N is not None else X0
                    out[1] += -2.0 * float((X0 * X).sum()) + float((X * X).sum())
                    out[2] -= float((X0 * X0).sum())
                return out

        tot = engine.map_reduce(fn, _add, np.zeros(4), extra_per_block=self._extra_per_block(store, k, n),
                                desc="lowrank error")
        r = np.sqrt(np.maximum(tot, 0.0))
        out = {"frobenius": float(r[0]), "error": float(r[1]), "error_local": float(r[2])}
        if s.mechanism == "measurements":
            out["error_untruncated"] = float(r[3])
        return out


def _sketch_fn(run, Omega, C, release, values_of):
    """``block -> (values, Y~)``: a block's clipped values and noisy sketch rows ``clip(A_b Omega, C) + N1``.

    The noise rows come from the run's family per user group (:func:`_noise_rows`),
    so every pass regenerates the same ``Y~``.
    """
    kp = Omega.shape[1]
    Om = np.ascontiguousarray(Omega)

    def sketch(block):
        vals = values_of(block)
        Y = np.empty((block.n_users, kp))
        csr_matmul(block.indptr, block.items, vals, Om, Y)
        Y = _clip_dense_rows(Y, C)
        if release is not None:
            for u0, u1, N in _noise_rows(run, _SKETCH, release, block.first_user, block.first_user + block.n_users,
                                         kp, block.n_users):
                Y[u0:u1] += N
        return vals, Y

    return sketch


def _rr_chunks(run, release, block, n_items: int):
    """Yield ``(u0, u1, N, indptr)`` over a block's rows in chunks: randomized response's noise rows (``None``
    when non-private) and the chunk's row pointers."""
    rows = max(1, NOISE_CHUNK_BYTES // (8 * n_items))
    for u0, u1, N in _noise_rows(run, _RR_NOISE, release, block.first_user, block.first_user + block.n_users,
                                 n_items, rows):
        yield u0, u1, N, block.indptr[u0:u1 + 1]


def format_lowrank_summary(summary: dict) -> str:
    """The lines ``streamdp lowrank`` prints: what was released, the guarantee, its relation and what it covers."""
    mech = {"measurements": "Gaussian measurements (Hardt & Roth)",
            "randomized-response": "randomized response (input perturbation)"}[summary["mechanism"]]
    lines = [f"wrote {summary['out']}: rank-{summary['rank']} approximation of {summary['n_users']:,} users x "
             f"{summary['n_items']:,} items by {mech}, {summary['seconds']:.1f}s"]
    lines.append("released: " + "; ".join(summary["released"]))
    lines.append("not released: " + summary["not_released"])
    if summary["guarantee"] == "non-private":
        lines.append("guarantee: non-private (no noise, epsilon inf)")
        return "\n".join(lines)
    lines.append(f"guarantee: {summary['guarantee']}; epsilon {summary['epsilon_spent']:.4g} (target "
                 f"{summary['epsilon']}), delta {summary['delta']:g}, L = {summary['clip_L']:g}")
    lines.append(f"neighbouring relation: {summary['neighbouring_relation']}")
    c = summary["relation_covers"]
    lines.append(f"covers: zero-out of a user's row at the same epsilon; replacing a user's row by any other at "
                 f"epsilon {summary['epsilon_replace_one']:.4g}; add/remove one user: {c['add_remove']}")
    return "\n".join(lines)
