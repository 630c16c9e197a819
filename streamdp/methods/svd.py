"""The private SVD baseline: ``--method svd`` (noisy covariance, one-shot top-``r`` subspace, local projection).

The baseline of Jain, Thakkar & Thakurta's experiments (ICML 2018, Fig. 2; the
SVD-based algorithm of their supplement), in the style of McSherry & Mironov
(KDD 2009):

1. **Global** (released): one pass accumulates the covariance
   ``W = sum_i x_i x_i^T`` of the users' rows of centred ratings
   ``x_i = clip(P_Omega(r_i - mu - b), Delta)`` (:func:`streamdp.kernels.fw.gram_upper`),
   centred on a private global mean ``mu`` and item biases ``b`` released first
   (``--center private``, default: McSherry-Mironov's "cleansing", the same two
   releases and budget shares as ``--method fw``, :func:`streamdp.methods._centering.center_settings`)
   or on the public midpoint (``--center midpoint``, ``b = 0``),
   releases ``W + N`` with symmetric Gaussian noise ``N`` (upper triangle drawn and
   mirrored, :class:`streamdp.privacy.release.Release`), and keeps its top-``r``
   eigenvectors ``V_r`` (post-processing).
2. **Local** (on each user's device, no noise): user ``i`` projects her zero-filled
   row of centred ratings on ``V_r``, rescaled by the inverse of her sampling rate,
   ``Y_i = (n / n_i) P_Omega(r_i - mid) V_r V_r^T``
   (:func:`streamdp.serving.local.projection_rows`); the paper's "appropriate scaling" is
   ``m n / |Omega|``, the user's own ``n / n_i`` is its local, free version.

Sensitivity: adding a user adds ``x_i x_i^T``, whose upper triangle has L2 norm
``<= ||x_i||^2 <= Delta^2``: one Gaussian mechanism, calibrated to the target by
the PLD accountant together with the centring's releases (``--calibration paper``: the supplement's
``sigma = Delta^2 sqrt(64 log(1/delta)) / epsilon``, :func:`streamdp.privacy.paper_sigma_jain`).
The release ``V_r`` is user-level (epsilon, delta)-DP and each user's completed row
is local, so, like ``--method fw``, the per-user outputs are jointly DP; the ledger
says so.

The covariance is ``n_items x n_items`` (held once, plus one partial per block in
flight): this baseline is for catalogues of a few thousand items (the paper's top
400); the engine refuses it when the memory budget cannot hold it. ``--method oja``
computes a private subspace in ``O(n_items k)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy.linalg import eigh

from streamdp.errors import ParameterError
from streamdp.kernels.fw import gram_upper
from streamdp.kernels.linalg import residuals
from streamdp.methods import register
from streamdp.methods._centering import (CenterOptions, CenterSettings, center_settings, centering_text,
                                         settings_center, settings_shares)
from streamdp.methods._notes import joint_dp_notes
from streamdp.methods._subspace import canonical_signs
from streamdp.methods.base import Fitted, Method, Plan
from streamdp.methods.options import option
from streamdp.privacy import paper_sigma_jain, spawn_rngs
from streamdp.privacy.bounding import clip_rows
from streamdp.privacy.ledger import GUARANTEE_JOINT_DP
from streamdp.privacy.release import Share, calibrate_releases
from streamdp.stream.engine import add_into as _add

#: Key of this method's random streams.
RNG_KEY = 0x05BD


@dataclass(frozen=True)
class SVDOptions(CenterOptions):
    """``--method svd``'s options."""

    clip: float | None = option("largest norm a user's row of centred ratings may have: bounds each user's "
                                "influence (L2 bound Delta, sensitivity Delta^2)",
                                default_text="half the rating range x sqrt 5 private, none non-private", minimum=0,
                                exclusive_minimum=True)
    calibration: Literal["pld", "paper"] = option(
        "pld: the least noise the accountant allows; paper: the noise of the supplement's SVD (its sigma), for "
        "comparison", default="pld")


@dataclass(frozen=True)
class SVDSettings(CenterSettings):
    """A run's resolved settings."""

    #: The row bound Delta (``inf``: not clipped, non-private).
    clip: float
    calibration: str


@register
class PrivateSVD(Method):
    """``--method svd``: noisy covariance, top-``r`` subspace, local projection (the paper's private baseline)."""

    name = "svd"
    MAIN_OPTIONS = ("center",)
    SUMMARY = ("private SVD baseline (McSherry-Mironov style, Jain et al. 2018's experiments): one noisy covariance, "
               "top-k subspace, users project locally; joint DP")
    Options = SVDOptions
    LOCAL_SOLVER = "projection"
    guarantee = GUARANTEE_JOINT_DP

    def settings(self, store) -> SVDSettings:
        """All parameters of a run on ``store``, defaults resolved from public parameters."""
        o = self.opts
        c = center_settings(o, store, self.epsilon, n_users=self.n_users(store))
        h = (c["rating_max"] - c["rating_min"]) / 2.0
        clip = o.clip if o.clip is not None else h * math.sqrt(5.0) if self.private else math.inf
        return SVDSettings(**c, clip=clip, calibration=o.calibration)

    def _plan(self, store) -> Plan:
        s = self.settings(store)
        D, n = s.clip, store.n_items
        bounds = {"clip_Delta": D, "rating_min": s.rating_min, "rating_max": s.rating_max,
                  "rating_range_source": getattr(store, "rating_range_source", "unknown"),
                  "centering": centering_text(s)}
        if not self.private:
            entries = [{"release": "top-r eigenvectors of the covariance", "mechanism": "none (non-private)"}]
            return Plan(events=[], entries=entries, settings=s, bounds=bounds)
        if not math.isfinite(D):
            raise ParameterError("--clip must be finite for a private run")
        what = ("covariance sum_i x_i x_i^T of the users' rows of centred ratings clipped to Delta (one Gaussian, "
                "symmetric noise)")
        centre = settings_shares(s, n)
        if s.calibration == "paper":
            # the supplement's sigma on the covariance exactly; the centring at the same budget scalar
            z = paper_sigma_jain(self.epsilon_after_first(store), self.delta, count=1, which="alg1")
            releases = [Share(what, "gaussian", D * D, 1.0, shape=(n, n), symmetric=True).at(z)]
            releases += [sh.at(z) for sh in centre]
        else:
            f, g = s.stats_share, s.mean_share
            share = Share(what, "gaussian", D * D, 1.0 - f - g, shape=(n, n), symmetric=True)
            releases = calibrate_releases([share] + centre, self.epsilon, self.delta, fixed=self.spent_first(store))
        release = releases[0]
        entry = release.entry()
        entry["calibration"] = s.calibration
        entries = [entry] + [r.entry() for r in releases[1:]] + [
            {"release": "top-r eigenvectors and eigenvalues of the noisy covariance", "mechanism": "post-processing",
             "count": 0}]
        return Plan(events=[r.event() for r in releases], entries=entries, settings=s, bounds=bounds,
                    releases=releases)

    def state_bytes(self, store) -> int:
        """Item-side memory: the covariance, its noisy copy and the eigendecomposition's workspace."""
        n = store.n_items
        return 8 * n * n * 4 + 8 * n * (self.rank + 8)

    def fit(self, store, engine) -> Fitted:
        plan = self.plan(store)
        s = plan.settings
        n, r = store.n_items, self.rank
        D = s.clip
        mu, bias = settings_center(self, store, engine, plan, spawn_rngs(self.seed, 2, key=RNG_KEY)[1])

        def fn(block, b):
            it = np.ascontiguousarray(block.items, dtype=np.int32)
            x = np.empty(block.nnz, np.float64)
            residuals(it, block.ratings, float(mu), bias, x)
            if math.isfinite(D):
                clip_rows(block.indptr, x, D, inplace=True)
            out = np.zeros((n, n))
            gram_upper(block.indptr, it, x, out)
            return out

        W = engine.map_reduce(fn, _add, np.zeros((n, n)), extra_per_block=8 * n * n + 8 * store.block_nnz().max(
            initial=0), desc="svd covariance")
        # in place from here on (the n x n matrix is the method's memory): mirror the upper triangle row by row,
        # add the noise (the same draws and sum as Release.add), and only the top r eigenpairs (LAPACK syevr)
        for i in range(1, n):
            W[i, :i] = W[:i, i]
        if plan.releases:
            W += plan.releases[0].noise(spawn_rngs(self.seed, 1, key=RNG_KEY)[0], W.shape)
        lam, E = eigh(W, subset_by_index=[max(n - r, 0), n - 1], overwrite_a=True, check_finite=False)
        del W
        order = np.argsort(lam)[::-1][:r]
        V, lam = canonical_signs(E[:, order]), lam[order]
        ledger = self.ledger(store, plan, notes=joint_dp_notes(
            self, plan.bounds, "the released subspace is user-level (epsilon, delta)-DP; each user's completed row is "
            "her own ratings projected on it on her device"))
        info = {"method": self.name, "rank": r, "epsilon": self.epsilon if self.private else "inf",
                "delta": self.delta, "seed": self.seed,
                "n_users": self.n_users(store), "n_items": n,
                "parameters": {"clip": D, "calibration": s.calibration, "center": s.center,
                               "stats_share": s.stats_share, "mean_share": s.mean_share},
                "local": self.LOCAL_SOLVER, "local_user_bias": False,
                "item_factors": "top-r eigenvectors of the noisy covariance; a user's row is (n / n_i) x_i V V^T "
                                "(streamdp.serving.local.projection_rows)",
                "rating_range": {"min": s.rating_min, "max": s.rating_max}}
        return Fitted(item_factors=V.astype(np.float32), item_bias=np.asarray(bias, np.float32),
                      item_ids=store.item_ids(), global_mean=float(mu), model_info=info, ledger=ledger,
                      extras={"eigenvalues": lam.astype(np.float64)})


