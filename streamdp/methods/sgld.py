"""DP matrix factorization by SGLD posterior sampling (``--method sgld``) and its SGD twin (``--method sgd``).

Liu, Wang & Smola (RecSys 2015): sample ``(U, V)`` from ``exp(-epsilon/(4B) F(U, V))``
with Stochastic Gradient Langevin Dynamics, streaming user blocks, and release
``V``, the item biases and the global mean; users solve their own ``u_i`` locally
(eq. 5, :mod:`streamdp.serving.local`). The same kernels without noise are ``--method sgd``,
the project's non-private speed reference (scikit-surprise's ``SVD`` update). Public
names: :class:`SGLD`, :class:`SGD` (options :class:`SgldOptions`, :class:`SgdOptions`),
:func:`local_ridge`, :func:`default_step_users`, :func:`read_user_weights`.

Decisions a reader must know (where the paper is loose):

* the loss is the squared loss **truncated** at ``c`` (half the rating range by default)
  over each user's ratings trimmed to ``tau``, so a user's term is at most a public
  ``B = tau c^2`` for every ``(U, V)``: Thm 1 holds on the whole space with no
  rejection step; ``sgd`` uses the plain square;
* ``--posterior-scale tight`` (default) samples at ``s = epsilon / B``, exact for
  add/remove one user (the paper's ``4B`` covers replace-one, kept as ``paper``);
  ``--temperature`` below 1 samples a colder target whose guarantee is ``epsilon / T``,
  and the ledger says it is not the DP target of the ``--epsilon`` given;
* the prior is public (a fixed standard deviation, 0.3, under the target), never fitted
  on the data; ``sgld`` centres at the declared midpoint, ``sgd`` at the training mean;
* **the guarantee is approximate**: an exact sample would be epsilon-DP; a finite SGLD
  run is not one, and the ledger's guarantee string starts ``approximate:``
  (:class:`streamdp.privacy.posterior.PosteriorSample` is the accounted event);
  ``--noise-table`` has no privacy proof and is labelled so;
* runs checkpoint after every epoch and resume bit for bit (the shared driver,
  :class:`streamdp.stream.driver.Run`); a cluster scheduler needs
  ``--epoch-scheme blocks`` (another Markov chain, noted in the ledger).

The objective in full, the proof of the factor 4, the faithfulness audit against the
paper's constants and the run state: ``docs/design-notes.md``, section
``streamdp/methods/sgld.py``; measurements in ``docs/sgld.md`` and ``docs/cluster.md``.
"""

from __future__ import annotations

import csv
import functools
import math
import threading
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Literal

import numpy as np

from streamdp.errors import InputError, ParameterError
from streamdp.kernels import sgd as K
from streamdp.methods import register
from streamdp.methods._notes import range_notes, seed_notes
from streamdp.methods.base import Fitted, Method, Plan, RunSettings
from streamdp.methods.options import MethodOptions, option
from streamdp.privacy import compose, epsilon_of
from streamdp.privacy.bounding import personalized_weights, trim_block
from streamdp.privacy.posterior import GUARANTEE_SGLD, SCALE_FACTOR, TABLE_LABEL, PosteriorSample
from streamdp.storage.ids import as_ids, numeric, parse_id, utf8_lines
from streamdp.stream.engine import runs_in_this_process

#: Key of this module's random streams.
RNG_KEY = 0x5D1D
_INIT, _TRIM, _NOISE, _FLUSH, _TABLE, _BLOCK_FLUSH = 1, 2, 3, 4, 5, 6

#: Default prior sd of a factor coordinate and of a bias under the target (``lam = T / (2 s sd^2)``).
PRIOR_SD = 0.3
PRIOR_SD_BIAS = 0.3
#: Rating noise sd a user's local solve assumes, as a share of the rating range (1 on a 1..5 scale):
#: public, see :func:`local_ridge`.
LOCAL_NOISE_SD_SHARE = 0.25
#: Ridge of a user's local solve from a non-private ``sgd`` model (``model.json`` ``ridge``). The released model
#: has no user rows: each user solves ``[u_i, c_i]`` from ``V`` by ridge regression, where the SGD that trained
#: ``V`` shrank its own ``u_i`` by early stopping and ``--reg`` instead. Measured at k = 16 (seed 1; test RMSE at
#: local ridge 1 / 3 / 5 / 10): ML-100K (20% split, seed 1) 0.957 / 0.935 / 0.929 / 0.925, FilmTrust 0.817 /
#: 0.797 / 0.795 / 0.797, a generated 5,000 x 500 store without user offsets 0.794 / 0.787 / 0.796 / 0.823;
#: scikit-surprise's SVD (its defaults, k = 100) 0.931 and 0.800 on the same ML-100K and FilmTrust splits. 1 was
#: the default before; 5 is within 0.01 of the best on each.
SGD_LOCAL_RIDGE = 5.0

#: Ledger note of ``--epoch-scheme blocks`` (sgld).
BLOCKS_NOTE = ("--epoch-scheme blocks: the user blocks of a round (--round-blocks) start from the round's V and "
               "their item changes are applied in block order, so the sampler is a different Markov chain from "
               "Hogwild's (likelihood kicks see item state up to a round old; the Langevin noise is still drawn per "
               "step, the prior's flows compose exactly and every item is flowed over exactly the epoch's time); "
               "the guarantee's reasoning is unchanged: an exact sample of the target would be epsilon-DP, and a "
               "finite run of this chain, like Hogwild's, is not one")

#: ``--round-blocks`` default: blocks of one round of ``--epoch-scheme blocks`` (see docs/cluster.md).
ROUND_BLOCKS = 2

_POS = dict(minimum=0, exclusive_minimum=True)
_NONNEG = dict(minimum=0)


@dataclass(frozen=True)
class SgdOptions(MethodOptions):
    """``--method sgd``'s options (scikit-surprise ``SVD``'s defaults), the base of sgld's.

    The last fields are not options of sgd: they are sgld's knobs at the values the plain
    SGD runs with (its loss is not truncated, no weights, no noise), so both methods
    settle their settings the same way.
    """

    epochs: int = option("passes over the data", default=20, minimum=1)
    eta: float = option("initial learning rate (eta_0)", default=0.005, **_POS)
    gamma: float = option("how fast the learning rate decays, 0 for none (eta_t = eta_0 / t^gamma)", default=0.0,
                          **_NONNEG)
    reg: float | None = option("L2 regularization per rating", default=0.02, **_NONNEG)
    reg_bias: float | None = option("L2 regularization of the biases per rating", default=0.02, **_NONNEG)
    init_std: float = option("std of the initial factors", default=0.1, **_NONNEG)
    tau: int | None = option("ratings kept per user (random trimming)", default_text="all", minimum=1)
    tiering: Literal["auto", "on", "off"] = option(
        "process each group's hot (popular) items first; auto: on where it measured faster (sgld whose item state "
        "exceeds the workers' share of the L3 cache; never sgd: docs/sgld.md)", default="auto")
    hot_items: int | None = option("hot-tier size", default_text="half of L2", minimum=0)
    step_users: int | None = option("users per group", default=256, minimum=1)
    checkpoint: str | None = option("run directory (U on disk, per-epoch checkpoints: counted as released, never "
                                    "refunded; keep it private); resumes if it holds one", metavar="DIR")
    epoch_scheme: Literal["hogwild", "blocks"] = option(
        "hogwild: one shared V on local threads; blocks: rounds of --round-blocks blocks start from the round's V, "
        "their changes applied in block order (runs on --scheduler; see docs/cluster.md)", default="hogwild")
    round_blocks: int = option("blocks per round of --epoch-scheme blocks (its parallelism; more: staler V)",
                               default=ROUND_BLOCKS, minimum=1)
    kappa: float | None = 1.0
    rho: float = 1.0
    user_weights: str | None = None
    posterior_scale: Literal["paper", "tight"] = "tight"
    temperature: float = 1.0
    noise_table: int | None = None


@dataclass(frozen=True)
class SgldOptions(SgdOptions):
    """``--method sgld``'s options: sgd's names where they mean the same, its own help where they do not."""

    reg: float | None = option("regularisation of the factors (prior lambda on U, V)",
                               default_text="from a prior sd of 0.3 at the run's scale s",
                               **_NONNEG)
    reg_bias: float | None = option("regularisation of the biases (prior lambda)",
                                    default_text="from a prior sd of 0.3", **_NONNEG)
    tau: int | None = option("ratings kept per user (random trimming; sets the loss bound B)", default=100,
                             minimum=1)
    step_users: int | None = option("users per SGLD step", default_text="about 16 n_items ratings a step",
                                    minimum=1)
    kappa: float | None = option(
        "how far a squared error may grow before it is capped, which bounds each user's influence (c = r_max - "
        "r_min + kappa, any c > 0; the loss min(e^2, c^2) is bounded whatever kappa; B = tau c^2; Liu et al. use "
        "kappa 1)", default_text="c = half the rating range (kappa = -(r_max - r_min) / 2)")
    rho: float = option("largest per-user weight (cap of w_i)", default=1.0, **_POS)
    user_weights: str | None = option("personalized privacy: CSV 'user,weight' or 'user,epsilon' (Liu et al. Thm 2)",
                                      metavar="FILE")
    posterior_scale: Literal["paper", "tight"] = option(
        "tight: the exact add/remove bound (s = epsilon/B); paper: as Liu et al. (epsilon/(4B)), 4x more diffuse "
        "at the same claim", default="tight")
    temperature: float = option("temperature T; the exact-sample guarantee becomes epsilon / T", default=1.0, **_POS)
    noise_table: int | None = option("Gaussian lookup table of SIZE numbers instead of fresh draws (NO privacy "
                                     "proof)", metavar="SIZE", minimum=1)


@dataclass(frozen=True)
class SgdSettings(RunSettings):
    """The resolved settings of one sgd/sgld run on a store: the options with their derived defaults.

    ``tiering`` is the decision of ``on``/``off`` (``None`` for ``auto``: decided by ``fit``, which knows the
    number of workers; ``tiering_option`` is what was asked), ``clip`` the loss bound
    ``c`` (0: the plain square loss of sgd), ``reg``/``reg_bias`` sgld's prior lambdas at the
    run's scale. What the sampler's noise and the guarantee need is the plan's
    :class:`~streamdp.privacy.posterior.PosteriorSample` (``plan.releases``).
    """

    epochs: int
    eta: float
    gamma: float
    reg: float
    reg_bias: float
    init_std: float
    tau: int | None
    kappa: float
    rho: float
    temperature: float
    epoch_scheme: str
    round_blocks: int
    tiering_option: str
    tiering: bool | None
    hot_items: int
    step_users: int
    noise_table: int | None
    user_weights: str | None
    rating_min: float
    rating_max: float
    clip: float
    posterior_scale: str
    checkpoint: str | None

    @property
    def bound(self) -> float | None:
        """``B = tau c^2``: every user's term of sgld's objective is in ``[0, B]`` (None for sgd)."""
        return self.tau * self.clip ** 2 if self.clip > 0 else None


def _trim_groups(ip, it, rt, tau, G, rng_of):
    """:func:`streamdp.privacy.bounding.trim_block` per group of ``G`` users, each with its own generator."""
    n_u = len(ip) - 1
    if n_u == 0 or int(np.diff(ip).max()) <= tau:
        return ip, it, rt
    ips, its, rts = [np.zeros(1, np.int64)], [], []
    off = 0
    for q, g0 in enumerate(range(0, n_u, G)):
        g1 = min(g0 + G, n_u)
        a, z = int(ip[g0]), int(ip[g1])
        sub = ip[g0:g1 + 1] - a
        if int(np.diff(sub).max(initial=0)) > tau:
            sip, sit, srt = trim_block(sub, it[a:z], rt[a:z], tau, seed=rng_of(q))
        else:
            sip, sit, srt = sub, it[a:z], rt[a:z]
        ips.append(np.asarray(sip[1:], np.int64) + off)
        its.append(sit)
        rts.append(srt)
        off += int(sip[-1])
    return np.concatenate(ips), np.concatenate(its), np.concatenate(rts)


def read_user_weights(path: str, numeric: bool | None = None):
    """Read ``--user-weights FILE``: CSV with header ``user,weight`` or ``user,epsilon``.

    Returns ``(kind, ids, values)`` with ``ids`` sorted: original user ids in the kind
    of the store's (``numeric``: int64, else ``str`` taken as written, so ``007`` and
    ``7`` stay two users; ``None``: int64 when they all parse as integers), as
    :func:`streamdp.storage.ids.as_ids`. Weights must be ``>= 0``, epsilons ``> 0``.
    """
    def fields(line):
        return [p.strip() for p in next(csv.reader([line], delimiter="\t" if "\t" in line and "," not in line
                                                   else ","))]

    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            lines = utf8_lines(f, path)
            header = next(lines, "").strip()
            cols = [c.lower() for c in fields(header)] if header else []
            if len(cols) != 2 or cols[1] not in ("weight", "epsilon"):
                raise InputError(f"{path}:1: expected a header 'user,weight' or 'user,epsilon', got {header!r}")
            kind = cols[1]
            ids, vals = [], []
            for ln, line in enumerate(lines, start=2):
                line = line.strip()
                if not line:
                    continue
                parts = fields(line)
                if len(parts) != 2:
                    raise InputError(f"{path}:{ln}: expected 'user,{kind}', got {line!r}")
                try:
                    v = float(parts[1])
                except ValueError:
                    raise InputError(f"{path}:{ln}: {kind} {parts[1]!r} is not a number") from None
                if not math.isfinite(v) or v < 0 or (kind == "epsilon" and v == 0):
                    raise InputError(f"{path}:{ln}: {kind} must be {'> 0' if kind == 'epsilon' else '>= 0'}, "
                                     f"got {parts[1]}")
                if numeric:
                    try:
                        parts[0] = parse_id(parts[0], True)
                    except ValueError:
                        raise InputError(f"{path}:{ln}: user id {parts[0]!r} is not an integer (the store's user "
                                         f"ids are integers)") from None
                ids.append(parts[0])
                vals.append(v)
    except OSError as exc:
        raise InputError(f"{path}: cannot read user weights ({exc.strerror})") from None
    if numeric is None:
        try:
            ids = [int(x) for x in ids]
        except ValueError:
            pass
    arr = as_ids(ids) if ids else np.empty(0, np.int64 if numeric is not False else object)
    order = np.argsort(arr, kind="stable")
    arr, vals = arr[order], np.asarray(vals, np.float64)[order]
    if len(arr) > 1 and np.any(arr[1:] == arr[:-1]):
        raise InputError(f"{path}: user id {arr[1:][arr[1:] == arr[:-1]][0]} listed twice")
    return kind, arr, vals


class _SgdBase(Method):
    """Shared settings, preprocessing and the epoch loop of ``sgd`` and ``sgld``."""

    Options = SgdOptions
    noisy = False
    #: Several workers update V without locks: results with 2+ workers are not bit-reproducible
    #: (the tests compare their RMSE instead); with 1 worker they are.
    HOGWILD = True
    #: ``sgd`` with 2+ workers: each block trains on a private copy of the item parameters and
    #: adds its change to the shared ones under a lock when it ends (delayed-update Hogwild), as
    #: long as a copy of ``V`` is at most this many bytes. Why: with power-law items both threads
    #: keep writing the same hot rows of a shared ``V``, and the cache lines bounce between cores.
    #: Measured on the bare kernel (k=16, 20k items, 8 blocks of 1M ratings): 1 thread 25-28M
    #: ratings/s; 2 threads on a shared V 23-24.5M/s (0.81-0.94x); 2 threads on private copies
    #: 47-51M/s (1.73-1.98x). The price is staleness: a block does not see the updates other
    #: workers make while it runs (at most ``workers - 1`` blocks). ``sgld`` keeps plain Hogwild
    #: (its lazy-noise clocks are shared state). One worker is unaffected (bit-reproducible).
    REPLICA_MAX_BYTES = 16 * 2**20
    #: ``--method sgd`` is non-private by design (the speed reference).
    NON_PRIVATE = False

    # -- settings ----------------------------------------------------------------------
    def settings(self, store) -> SgdSettings:
        """The options with their derived defaults on ``store``; checks that need the store or the rank.

        Derived: the hot tier and group sizes from the store's shape, sgld's ``kappa``
        (``c`` = half the rating range, measured against kappa 1 in docs/sgld.md) and its prior
        lambdas from a fixed prior sd at the run's scale ``s`` (data-independent, so the target
        ``exp(-s F / T)`` keeps factors at a sensible scale whatever ``s`` is).
        """
        o = self.opts
        if o.noise_table is not None and o.noise_table < 4 * (self.rank + 1):
            raise ParameterError(f"--noise-table must hold at least {4 * (self.rank + 1)} numbers, got "
                                 f"{o.noise_table}")
        lo, hi = store.rating_min, store.rating_max
        kappa = o.kappa if o.kappa is not None else -(hi - lo) / 2.0
        clip = (hi - lo) + kappa if self.noisy else 0.0
        if self.noisy and not clip > 0:
            raise ParameterError(f"--kappa must be > -(r_max - r_min) = {lo - hi:g} (the loss bound c = r_max - "
                                 f"r_min + kappa must be > 0), got {kappa}")
        s = SgdSettings(
            epochs=o.epochs, eta=o.eta, gamma=o.gamma, reg=o.reg, reg_bias=o.reg_bias, init_std=o.init_std,
            tau=o.tau, kappa=kappa, rho=o.rho, temperature=o.temperature, epoch_scheme=o.epoch_scheme,
            round_blocks=o.round_blocks, tiering_option=o.tiering,
            tiering=None if o.tiering == "auto" else o.tiering == "on",
            hot_items=o.hot_items if o.hot_items is not None else K.hot_tier_items(self.rank, store.n_items),
            step_users=o.step_users if o.step_users is not None else default_step_users(store.n_items, o.tau,
                                                                                          self.noisy),
            noise_table=o.noise_table, user_weights=o.user_weights, rating_min=lo, rating_max=hi, clip=clip,
            posterior_scale=o.posterior_scale, checkpoint=o.checkpoint)
        if self.noisy:
            scale, T = self.posterior(s, store).scale, s.temperature
            s = s.replace(reg=T / (2.0 * scale * PRIOR_SD ** 2) if o.reg is None else o.reg,
                          reg_bias=T / (2.0 * scale * PRIOR_SD_BIAS ** 2) if o.reg_bias is None else o.reg_bias)
        return s

    def posterior(self, s: SgdSettings, store) -> PosteriorSample:
        """sgld's release: one sample of ``exp(-s F / T)`` with ``B = tau c^2``, calibrated to the target.

        Its epsilon is what the count of users (:mod:`streamdp.privacy.users`, pure DP, released first) leaves:
        ``--epsilon`` minus the count's (basic composition), lowered by the accountant's discretization until
        the PLD of both is within the claim (:meth:`_claim`).
        """
        first = [r.event() for r in self.spent_first(store)]
        eps = self.epsilon_after_first(store)
        for _ in range(200):
            sample = PosteriorSample.calibrated(
                "V, item biases (one posterior sample after the last epoch); global mean public (midpoint)",
                eps, self.delta, bound=s.bound, posterior_scale=s.posterior_scale, temperature=s.temperature,
                epochs=s.epochs, noise_table=s.noise_table)
            if not (first and sample.private) or (
                    epsilon_of(compose(first + [sample.event()]), self.delta).epsilon <= self._claim(sample)):
                return sample
            eps *= 1.0 - 1e-4
        raise ParameterError(f"sgld: the posterior sample could not be calibrated within --epsilon "
                             f"{self.epsilon:g} beside the count of users")  # pragma: no cover

    def _claim(self, sample: PosteriorSample) -> float:
        """The ledger's epsilon: the count's (``--epsilon`` minus the sample's) plus the sample's claim."""
        return (self.epsilon - sample.epsilon) + sample.epsilon_claimed

    def check_scheduler(self, scheduler) -> None:
        """Hogwild epochs (one shared ``V`` in this process) do not run on a cluster: a one-line refusal."""
        if self.opts.epoch_scheme != "blocks" and not runs_in_this_process(scheduler):
            where = scheduler if isinstance(scheduler, str) else "a Dask cluster"
            raise ParameterError(f"--scheduler {where}: the Hogwild epochs of --method {self.name} (--epoch-scheme "
                                 f"hogwild, the default) update one V in this process and do not run on a "
                                 f"cluster; pass --epoch-scheme blocks to run them there (another sampler, see "
                                 f"docs/cluster.md) or drop --scheduler")

    def state_bytes(self, store) -> int:
        """Item-side memory: ``V`` (float32), item biases, item clocks (sgld adds its noise table).

        Per-block working memory (U rows, stamps, noise buffers) is declared per pass
        as ``extra_per_block``.
        """
        return store.n_items * (4 * self.rank + 4 + 8)

    # -- preprocessing: counts, weights ------------------------------------------------
    def _user_weight_lookup(self, store, s: SgdSettings):
        if s.user_weights is None:
            return None
        return read_user_weights(s.user_weights, numeric=numeric(store.user_ids(0, min(1, store.n_users))))

    def _block_weights(self, store, b, counts, s: SgdSettings, sample, lookup):
        """Per-user weights (float32) of block ``b`` from trimmed counts ``m``; and per-user epsilons."""
        m = counts if s.tau is None else np.minimum(counts, s.tau)
        if not self.noisy:
            return np.ones(len(m), np.float32), None
        rho, tau = float(s.rho), s.tau
        frac = np.ones(len(m))
        cap = np.full(len(m), np.inf)
        if lookup is not None:
            kind, ids, vals = lookup
            first, end = store.block_range(b)
            uid_cmp, ids_cmp, vals_l = store.user_ids(first, end), ids, vals  # one kind (read_user_weights)
            pos = np.searchsorted(ids_cmp, uid_cmp)
            pos_c = np.minimum(pos, max(len(ids_cmp) - 1, 0))
            hit = (len(ids_cmp) > 0) & (ids_cmp[pos_c] == uid_cmp) if len(ids_cmp) else np.zeros(len(uid_cmp), bool)
            if kind == "epsilon":
                # Thm 2: eps_i = eps B_i / (2B)  =>  B_i / B = min(1, 2 eps_i / eps)
                eps_t = sample.epsilon_event
                frac[hit] = np.minimum(1.0, vals_l[pos_c[hit]] / (sample.user_share * eps_t)) \
                    if math.isfinite(eps_t) else 1.0
            else:
                cap[hit] = vals_l[pos_c[hit]]
        w = personalized_weights(m, tau, frac)          # f tau / m  (B_i = f B)
        w = np.minimum(np.minimum(w, rho), cap)
        B_frac = w * m / tau                             # B_i / B
        eps_i = None
        if self.private:
            eps_i = sample.epsilon_event * B_frac * sample.user_share
        return w.astype(np.float32), eps_i

    def _prepass(self, store, s: SgdSettings, sample, lookup):
        """Trimmed rating count of each block and the per-user epsilon distribution (from indptr only)."""
        nb = store.n_blocks
        block_n = np.zeros(nb, np.int64)
        dist: dict = {}
        for b in range(nb):
            c = store.block_user_counts(b)
            m = c if s.tau is None else np.minimum(c, s.tau)
            block_n[b] = int(m.sum())
            if self.noisy and self.private:
                _, eps_i = self._block_weights(store, b, c, s, sample, lookup)
                vals, cnt = np.unique(np.round(eps_i, 12), return_counts=True)
                for v, n_ in zip(vals.tolist(), cnt.tolist()):
                    dist[v] = dist.get(v, 0) + n_
        per_user = None
        if dist:
            keys = sorted(dist)
            counts = np.array([dist[k] for k in keys])
            cum = np.cumsum(counts)
            total = int(cum[-1])
            med_lo = keys[int(np.searchsorted(cum, (total + 1) // 2))]
            med_hi = keys[int(np.searchsorted(cum, total // 2 + 1))]
            per_user = {"min": keys[0], "median": (med_lo + med_hi) / 2.0, "max": keys[-1], "n_users": total,
                        "rule": ("Thm 2: epsilon_i = epsilon * B_i / (2B)" if s.posterior_scale == "paper" else
                                 "add/remove, non-negative loss: epsilon_i = s B_i = epsilon * B_i / B")
                        + ", B_i = m_i w_i c^2",
                        "note": "a statistic of the training data (counts, weights) for the data owner, not a "
                                "DP release"}
        return block_n, per_user

    # -- plan --------------------------------------------------------------------------
    def _plan(self, store) -> Plan:
        """Settings, bounds and, for sgld, the posterior sample (``plan.releases``) with its event and entry."""
        s = self.settings(store)
        sample = self.posterior(s, store) if self.noisy else None
        bounds = {"rating_min": s.rating_min, "rating_max": s.rating_max,
                  "rating_range_source": getattr(store, "rating_range_source", "unknown"), "tau": s.tau}
        if self.noisy:
            bounds.update({"kappa": s.kappa, "loss_bound_c": s.clip, "B": s.bound, "rho": s.rho,
                           "weights": "w_i = min(rho, B / (m_i c^2)), m_i = min(tau, n_i); --user-weights caps "
                                      "them" if s.user_weights is None else
                                      "w_i = min(rho, f_i B / (m_i c^2), file weight) from --user-weights",
                           "loss": "min(e^2, c^2), c = r_max - r_min + kappa",
                           "scale_s": sample.scale, "temperature": s.temperature,
                           "prior_lambda": s.reg, "prior_lambda_bias": s.reg_bias,
                           "posterior_scale": f"{s.posterior_scale}: s = epsilon / "
                                              f"({SCALE_FACTOR[s.posterior_scale]:g} B)"})
        if not (self.noisy and self.private):
            entries = [{"release": "item factors, item biases, global mean", "mechanism": "none (non-private)",
                        "epochs": s.epochs}]
            return Plan(entries=entries, settings=s, bounds=bounds, releases=sample)
        bounds["target"] = sample.target()
        return Plan(event=sample.event(), entries=[sample.entry()], settings=s, bounds=bounds, releases=sample,
                    claim=(sample.guarantee(), self._claim(sample)))

    guarantee = GUARANTEE_SGLD

    # -- fit ---------------------------------------------------------------------------
    def fit(self, store, engine) -> Fitted:
        """Run the epochs on ``engine`` and return the released item side (see the module docstring)."""
        # a run may be extended: the number of epochs is not part of its fingerprint
        with self.open_run(store, self.plan(store), rng_key=RNG_KEY, exclude=("epochs",), engine=engine) as run:
            return self._fit(store, engine, run)

    def _fit(self, store, engine, run) -> Fitted:
        """Plan the run's state (:meth:`_start`), run the epochs (:meth:`_epoch`), release (:meth:`_released`)."""
        plan = self.plan(store)
        c = self._start(store, engine, run, plan)
        for e in run.epochs(c.s.epochs):
            self._epoch(store, engine, run, c, e)
        return self._released(store, run, plan, c)

    def _start(self, store, engine, run, plan) -> SimpleNamespace:
        """The run's state before the first epoch: the item side (or a checkpoint's), the step sizes and the noise's
        rates, and what each block in flight costs beyond its ratings."""
        s, sample = plan.settings, plan.releases  # sample: sgld's PosteriorSample (its sampler's noise); sgd: None
        k, n_items = self.rank, store.n_items
        lookup = self._user_weight_lookup(store, s)
        block_n, per_user = self._prepass(store, s, sample, lookup)
        N = int(block_n.sum())
        if N == 0:
            raise ParameterError(f"{store.path}: the training split has no ratings")
        pos0 = np.concatenate([[0], np.cumsum(block_n)[:-1]]).astype(np.int64)
        ck = run.checkpoint
        if ck is not None:
            V, bv = ck["V"].copy(), ck["bv"].copy()
        else:
            g = run.rng(_INIT, 0)
            V = (g.standard_normal((n_items, k)) * s.init_std).astype(np.float32)
            bv = np.zeros(n_items, np.float32)
        bufs = run.user_state("user_state", k + 1)

        lo, hi = s.rating_min, s.rating_max
        mu = (lo + hi) / 2.0 if self.noisy else self._train_mean(store, engine)
        lrs = [s.eta / (e ** s.gamma) for e in range(1, s.epochs + 1)]
        if self.noisy:  # the Langevin time per rating, the prior's flow rates and the temperature of the noise
            deltas = [sample.langevin_time(lr, N) for lr in lrs]
            a, a_b, temp = sample.flow_rate(s.reg), sample.flow_rate(s.reg_bias), s.temperature
        else:
            deltas, a, a_b, temp = [0.0] * len(lrs), 0.0, 0.0, 0.0
        table = sample.table(run.rng(_TABLE, 0)) if s.noise_table else None
        # --tiering auto is decided here, where the number of workers is known (K.tiering_pays)
        tiering = s.tiering if s.tiering is not None else K.tiering_pays(
            k, n_items, noisy=self.noisy, workers=getattr(engine, "workers", 1))
        history = list(ck["history"]) if ck is not None and "history" in ck else []

        # per block in flight beyond the ratings: U rows (read, copies, written), the item
        # stamps and, for SGLD, the noise buffer (users + at most n_items flows per step)
        bu_ = store.block_users
        extra = 3 * bu_ * (k + 1) * 4 + bu_ * 16
        if self.noisy:
            steps = -(-bu_ // s.step_users)
            max_nnz = int(store.block_nnz().max()) if store.n_blocks else 0
            extra += 8 * n_items + 4 * (k + 1) * (bu_ + min(max_nnz, steps * n_items))
        replicate = (not self.noisy and getattr(engine, "workers", 1) > 1
                     and n_items * (k + 1) * 4 <= self.REPLICA_MAX_BYTES)
        blocks = s.epoch_scheme == "blocks"
        replicate = replicate and not blocks
        merge_lock = threading.Lock() if replicate else None  # (a lock does not pickle: none in a cluster task)
        if blocks:
            extra += 3 * n_items * (k + 1) * 4  # the task's copy of V, bv and the touched rows' deltas
        if replicate:
            extra += 3 * n_items * (k + 1) * 4
        return SimpleNamespace(
            s=s, sample=sample, k=k, n_items=n_items, lookup=lookup, per_user=per_user, N=N, pos0=pos0, V=V, bv=bv,
            bufs=bufs, run_id=run.run_id, lo=lo, hi=hi, mu=mu, lrs=lrs, deltas=deltas, a=a, a_b=a_b, temp=temp,
            item_last=np.zeros(n_items, np.int64), table=table, hot=s.hot_items, tiering=tiering, history=history,
            bu_=bu_, extra=extra, replicate=replicate, blocks=blocks, merge_lock=merge_lock, epoch_seconds=[])

    def _epoch(self, store, engine, run, c, e: int) -> None:
        """Epoch ``e``: every block's update on the engine (by rounds of blocks with ``--epoch-scheme blocks``), the
        items' last flow, the epoch's training RMSE and its checkpoint."""
        t_epoch = time.perf_counter()
        s, V, bv, n_items = c.s, c.V, c.bv, c.n_items
        fn = self._block_update(store, run, c, e)
        desc = f"{self.name} epoch {e}/{s.epochs}"
        if c.blocks:
            covered = np.zeros(n_items, np.int64) if self.noisy else None
            R, parts = s.round_blocks, []
            for r0 in range(0, store.n_blocks, R):  # a round's blocks start from the same V (snapshot)
                parts = engine.map_reduce(functools.partial(fn, V_ep=V.copy(), bv_ep=bv.copy()),
                                          functools.partial(_add_block_delta, V, bv, covered), parts,
                                          blocks=range(r0, min(r0 + R, store.n_blocks)),
                                          extra_per_block=c.extra, desc=desc)
            if self.noisy:  # the flush below flows each item over the clock time no block covered (N - covered)
                c.item_last[:] = covered
        else:
            parts = engine.foreach(fn, extra_per_block=c.extra, desc=desc)
        if self.noisy:
            noise, offsets = c.sample.draws(run.rng(_FLUSH, e), n_items, c.k + 1, c.table)
            K.flush_items(V, bv, c.item_last, c.N, c.deltas[e - 1], c.a, c.a_b, c.temp, noise, offsets,
                          c.table is not None)
        c.epoch_seconds.append(round(time.perf_counter() - t_epoch, 4))
        sse = sum(p[0] for p in parts)
        c.history.append(math.sqrt(sse / max(c.N, 1)))
        run.save(e, V=V, bv=bv, history=np.asarray(c.history))
        if not np.all(np.isfinite(V)):
            raise ParameterError(f"{self.name} diverged at epoch {e} (non-finite item factors): lower --eta")

    def _block_update(self, store, run, c, e: int):
        """The task of epoch ``e`` on one block ``fn(block, b)``: its users' updates and the items' (the kernels)."""
        s, sample, lookup, k, n_items = c.s, c.sample, c.lookup, c.k, c.n_items
        V, bv, item_last, pos0, mu, lo, hi = c.V, c.bv, c.item_last, c.pos0, c.mu, c.lo, c.hi
        a, a_b, temp, table, hot, tiering = c.a, c.a_b, c.temp, c.table, c.hot, c.tiering
        blocks, replicate, merge_lock, bu_ = c.blocks, c.replicate, c.merge_lock, c.bu_
        lr, delta = c.lrs[e - 1], c.deltas[e - 1]
        u_dt0, u_dt1 = K.user_flow_coefficients(e, c.deltas, c.N)
        src, dst = c.bufs[(e - 1) % 2], c.bufs[e % 2]
        G = min(s.step_users, bu_)  # a group is at most a block

        def fn(block, b, e=e, lr=lr, delta=delta, u_dt0=u_dt0, u_dt1=u_dt1, src=src, dst=dst, V_ep=None,
               bv_ep=None):
            # all randomness comes from the generator of the user group (global group id), so the
            # result does not depend on how users are cut into blocks when G divides block_users
            # groups numbered per block (ceil(bu / G) ids each): never the same generator for two groups; the
            # same numbering as first_user // G when G divides block_users
            gid0 = (block.first_user // bu_) * -(-bu_ // G)
            ip, it, rt = block.indptr, block.items, block.ratings
            if s.tau is not None:
                ip, it, rt = _trim_groups(ip, it, rt, s.tau, G,
                                          lambda q: run.group_rng(_TRIM, 0, gid0 + q))
            # the block's arrays are this task's own (a fresh read): used in place, also by the tier partition
            it = np.ascontiguousarray(it, np.int32)
            rt = np.clip(np.asarray(rt, np.float32), np.float32(lo), np.float32(hi)) if self.noisy else \
                np.ascontiguousarray(rt, np.float32)
            ip = np.ascontiguousarray(ip, np.int64)
            n_u = len(ip) - 1
            w, _ = self._block_weights(store, b, np.diff(block.indptr), s, sample, lookup)
            split = ip[1:].copy()
            if tiering:
                K.partition_tiers(ip, it, rt, hot, split)
            if e == 1:
                UB = np.zeros((n_u, k + 1), np.float32)
                for q, g0 in enumerate(range(0, n_u, G)):
                    g1 = min(g0 + G, n_u)
                    UB[g0:g1, :k] = run.group_rng(_INIT, 1, gid0 + q).standard_normal((g1 - g0, k)) \
                        * s.init_std
            else:
                UB = src.read(b)
            U = np.ascontiguousarray(UB[:, :k])
            bu = np.ascontiguousarray(UB[:, k])
            Vw, bvw, lastw = _block_start(V_ep, bv_ep, int(pos0[b])) if blocks else (V, bv, item_last)
            if self.noisy:
                noise, offsets = _group_noise(sample, lambda q: run.group_rng(_NOISE, e, gid0 + q),
                                              K.group_draws(ip, it, G, n_items, k), k + 1, table)
                sse, _ = K.sgld_block(ip, it, rt, w, split, U, bu, Vw, bvw, lastw, mu, lr, s.clip,
                                      G, int(pos0[b]), delta, u_dt0, u_dt1, a, a_b, temp,
                                      noise, offsets, table is not None)
            elif replicate:
                V0, bv0 = V.copy(), bv.copy()
                Vl, bvl = V0.copy(), bv0.copy()
                sse = K.sgd_block(ip, it, rt, w, split, U, bu, Vl, bvl, mu, lr, s.reg, s.reg_bias, G)
                Vl -= V0
                bvl -= bv0
                with merge_lock:
                    V[...] += Vl
                    bv[...] += bvl
            else:
                sse = K.sgd_block(ip, it, rt, w, split, U, bu, Vw, bvw, mu, lr, s.reg, s.reg_bias, G)
            UB[:, :k] = U
            UB[:, k] = bu
            dst.write(b, UB)
            out = float(sse), int(ip[-1]), float(bu.sum(dtype=np.float64)), n_u
            if blocks:
                flush = None
                if self.noisy:
                    flush = (sample, run.group_rng(_BLOCK_FLUSH, e, b), int(pos0[b]) + int(ip[-1]), delta, a,
                             a_b, temp, table)
                out += (_block_delta(Vw, bvw, lastw, V_ep, bv_ep, it, flush),)
            return out

        return fn

    def _released(self, store, run, plan, c) -> Fitted:
        """The released item side with its ledger, notes and model info (the users' side is not released)."""
        s, sample, k, tiering, blocks = c.s, c.sample, c.k, c.tiering, c.blocks
        # released global mean: mu plus the mean user bias of the final state, so that a user solving
        # only u_i locally (no bias) starts from the average user (post-processing of the sample)
        final = c.bufs[s.epochs % 2]
        bu_sum = 0.0
        for b in range(store.n_blocks):
            bu_sum += float(final.read(b)[:, k].sum(dtype=np.float64))
        mu_release = float(c.mu + bu_sum / max(self.n_users(store), 1))
        notes = self._notes(store, s, sample, tiering, blocks)
        ledger = self.ledger(store, plan, notes=notes)
        ledger.bounds["run_id"] = c.run_id
        params = {key: getattr(s, key) for key in ("epochs", "eta", "gamma", "reg", "reg_bias", "init_std", "tau",
                                                   "kappa", "rho", "temperature", "noise_table",
                                                   "hot_items", "step_users", "epoch_scheme")}
        params["tiering"] = tiering
        if blocks:
            params["round_blocks"] = s.round_blocks
        params.update({"scale_s": sample.scale if self.noisy else None, "B": s.bound, "loss_bound_c": s.clip or None,
                       "user_weights": s.user_weights})
        info = {"method": self.name, "rank": k, "epsilon": self.epsilon if self.private else "inf",
                "delta": self.delta, "seed": self.seed, "n_users": self.n_users(store),
                "n_items": c.n_items, "parameters": params,
                "resumed_from_epoch": run.start - 1 if run.start > 1 else None, "run_id": c.run_id,
                "ridge": local_ridge(s, sample.scale) if self.noisy else SGD_LOCAL_RIDGE,
                "rating_range": {"min": c.lo, "max": c.hi}, "run_directory": None if run.own_dir else run.dir}
        if not self.noisy:  # sgd: the exact training mean (a non-private model only)
            info["mu_train"] = float(c.mu)
        if self.noisy:
            info["ridge_rule"] = ("sigma^2 * 2 s lam / T: the sample's prior on u_i (sd sqrt(T / (2 s lam))) and "
                                  "the user's own ratings, untempered, with noise sd sigma = rating range / 4")
        fitted = Fitted(item_factors=c.V.copy(), item_bias=c.bv.copy(), item_ids=store.item_ids(),
                        global_mean=mu_release, model_info=info, ledger=ledger,
                        owner={"n_train_used": c.N, "train_rmse_by_epoch": c.history,
                               "epoch_seconds": c.epoch_seconds,
                               **({"per_user_epsilon": c.per_user} if c.per_user is not None else {})})
        # U is not released; a named run directory keeps it for a resume (and for tests)
        fitted.user_states = None if run.own_dir else c.bufs[s.epochs % 2]
        return fitted

    def _notes(self, store, s, sample, tiering, blocks) -> list[str]:
        """The released model's notes: what its guarantee is (and is not), and what the settings mean for it."""
        notes = []
        if self.noisy and self.private:
            notes.append("approximate guarantee: an exact posterior sample would be epsilon-DP (Thm 1); this is "
                         "a finite SGLD run")
            if s.temperature != 1.0:
                notes.append(f"temperature {s.temperature}: {sample.target()}; Liu et al.'s zeta (0.07, "
                             "0.0025 in their Figure 7) is this temperature")
            if s.noise_table:
                notes.append(TABLE_LABEL + f" (--noise-table {s.noise_table})")
            sd = math.sqrt(s.temperature / (2.0 * sample.scale * max(s.reg, 1e-12)))
            notes.append(f"the target's prior alone gives each factor coordinate sd {sd:.3g} (T / (2 s lam), "
                         f"s = epsilon T / ({SCALE_FACTOR[s.posterior_scale]:g} B) = {sample.scale:.3g}); the data "
                         f"only outweighs it for parameters "
                         f"with many ratings, so small epsilon on small stores releases mostly prior noise")
            if tiering:
                notes.append("tiering uses the store's item order (popularity); it only reorders updates and does "
                             "not change the target distribution")
        if blocks and self.noisy:
            notes.append(BLOCKS_NOTE)
        if not (self.noisy and self.private):
            notes.append("non-private: no privacy noise (" + ("--method sgd" if not self.noisy else
                                                              "--epsilon inf: SGLD of the unscaled posterior") + ")")
        notes += seed_notes(self)
        notes += range_notes(getattr(store, "rating_range_source", "unknown"), self.private)
        return notes

    def _train_mean(self, store, engine) -> float:
        tot = engine.map_reduce(lambda blk, b: (float(blk.ratings.sum(dtype=np.float64)), blk.nnz),
                                lambda acc, x: (acc[0] + x[0], acc[1] + x[1]), (0.0, 0), desc="sgd mean")
        return tot[0] / max(tot[1], 1)


def _block_start(V_ep, bv_ep, pos0: int):
    """``--epoch-scheme blocks``: a block's own copy of the epoch's item state, its clocks at the block's start."""
    return V_ep.copy(), bv_ep.copy(), np.full(V_ep.shape[0], pos0, np.int64)


def _block_delta(Vw, bvw, lastw, V_ep, bv_ep, items, flush):
    """``--epoch-scheme blocks``: the rows a block touched, as an affine map from the round's ``V``.

    Returns ``(touched, d, d_b, A, A_b, span)`` with the block's result ``V[touched] = d V_ep[touched] + A``
    (``bv`` likewise with ``d_b``). For SGD ``d = 1`` and ``A`` is the change. For SGLD (``flush`` =
    ``(sample, rng, block end, delta, a, a_b, temp, table)``) the touched items are first flowed to the block's
    end, so every touched item's flows cover exactly the block's span of the clock and the prior's decay
    over it is the one factor ``d = exp(-a delta span)``: applying ``d V + A`` to the current ``V`` in block
    order composes the Ornstein-Uhlenbeck flows exactly (a sum of deltas would apply the decay once per
    block: measured, it wrecks the sample), and only the likelihood kicks see a stale ``V``. The caller
    flows every item over the time no block covered it (:func:`_add_block_delta`'s ``covered``).
    """
    touched = np.unique(items).astype(np.int64)
    Vt, bvt = Vw[touched], bvw[touched]
    d = d_b = 1.0
    if flush is not None:
        sample, rng, end, delta, a, a_b, temp, table = flush
        noise, offsets = sample.draws(rng, len(touched), Vw.shape[1] + 1, table)
        K.flush_items(Vt, bvt, lastw[touched], end, delta, a, a_b, temp, noise, offsets, table is not None)
        d, d_b = math.exp(-a * delta * len(items)), math.exp(-a_b * delta * len(items))
    d, d_b = np.float32(d), np.float32(d_b)
    return touched, d, d_b, Vt - d * V_ep[touched], bvt - d_b * bv_ep[touched], int(len(items))


def _group_noise(sample, rng_of, per_group, k1: int, table):
    """The noise of one block's SGLD steps, ``(noise, offsets)``: group ``q`` draws ``per_group[q]`` values
    (``k1`` per flow) from its own generator ``rng_of(q)``, in group order, into one buffer."""
    if table is not None:
        offsets = [sample.draws(rng_of(q), int(d) // k1, k1, table)[1] for q, d in enumerate(per_group)]
        return table, np.concatenate(offsets or [np.zeros(0, np.int64)])
    noise = np.empty(int(per_group.sum()), np.float32)
    at = 0
    for q, d in enumerate(per_group):
        sample.draws(rng_of(q), int(d) // k1, k1, out=noise[at:at + int(d)])
        at += int(d)
    return noise, np.zeros(0, np.int64)


def _add_block_delta(V, bv, covered, acc, part):
    """Combine of ``--epoch-scheme blocks`` (in block order): apply the block's affine item map to ``V``/``bv``."""
    touched, d, d_b, A, A_b, span = part[4]
    V[touched] = d * V[touched] + A
    bv[touched] = d_b * bv[touched] + A_b
    if covered is not None:
        covered[touched] += span
    acc.append(part[:4])
    return acc


def local_ridge(s: SgdSettings, scale: float) -> float:
    """Ridge of a user's local solve of ``u_i`` given the released sample (``model.json`` ``ridge``).

    Within the target ``exp(-s F / T)`` the conditional of ``u_i`` given ``V`` is a
    ridge regression with ridge ``lam / w_i`` (the prior's ``lam``, e.g. 55,555 at
    epsilon 1 on a 1..5 store): both the user's loss and the prior are tempered by
    ``s``, and the solve returns ``u_i ~ 0`` (users' predictions ignore the factors
    and their own intercept). But a user's solve is post-processing of the release
    on their own data, which needs no tempering: their likelihood is their ratings
    with noise variance ``sigma^2``, and the prior on ``u_i`` is the one the sample
    was drawn under, precision ``2 s lam / T`` per coordinate (sd ``PRIOR_SD`` with
    the default ``--reg``). Hence ``ridge = sigma^2 * 2 s lam / T`` with the public
    ``sigma = LOCAL_NOISE_SD_SHARE * (r_max - r_min)``: 11.1 on a 1..5 store with the
    default prior, whatever epsilon is. Measured (``bench/sgld_privacy.py``, median of
    3 seeds, epsilon 1): ML-100K test RMSE 1.229 -> 1.099, FilmTrust 1.209 -> 0.92.

    >>> from types import SimpleNamespace as S
    >>> round(local_ridge(S(reg=1 / (2 * 1e-4 * 0.09), temperature=1.0, rating_min=1.0, rating_max=5.0), 1e-4), 2)
    11.11
    """
    sigma = LOCAL_NOISE_SD_SHARE * (float(s.rating_max) - float(s.rating_min))
    return sigma ** 2 * 2.0 * float(scale) * float(s.reg) / float(s.temperature)


def default_step_users(n_items: int, tau: int | None, noisy: bool) -> int:
    """Users per step/group, from public parameters only (the catalogue's size and ``--tau``).

    SGD: 256 (a group's hot ratings keep the hot tier in cache). SGLD: enough users
    that a step holds at most about ``16 n_items`` ratings when every user keeps ``tau``
    (the public bound on a user's ratings), so that each item is drawn for at most once
    per step however often it is touched (noise draws per rating <= ``(k+1)/16`` for
    the items; a normal from numpy's Generator costs about as much as a rating's update
    at k=16). It used to divide by the store's exact mean number of ratings per user,
    which ``model.json`` then published (``parameters.step_users`` recovered the rating
    count to 0.5%): on a store whose users keep fewer than ``tau`` ratings a step now
    holds fewer ratings than ``16 n_items`` (more noise draws per rating, the same
    sampler). A run's groups are at most a block (``store.block_users``, applied when
    the run starts, not recorded).

    >>> default_step_users(20_000, 100, True)
    3200
    >>> default_step_users(20_000, 100, False)
    256
    """
    if not noisy:
        return 256
    per_user = float(tau) if tau is not None else 1.0
    return int(max(64, math.ceil(16 * n_items / per_user)))


@register
class SGLD(_SgdBase):
    """``--method sgld``: DP-SGLD posterior sample (Liu et al. 2015) with lazy noise and tiering."""

    name = "sgld"
    MAIN_OPTIONS = ("epochs", "user_weights", "temperature", "checkpoint")
    SUMMARY = "one SGLD posterior sample of DP matrix factorization (Liu, Wang & Smola 2015)"
    Options = SgldOptions
    noisy = True

    def state_bytes(self, store) -> int:
        """sgd's item-side memory plus the optional noise table (float32)."""
        return super().state_bytes(store) + (self.opts.noise_table or 0) * 4


@register
class SGD(_SgdBase):
    """``--method sgd``: plain biased-MF SGD (surprise's SVD update), non-private speed reference."""

    name = "sgd"
    MAIN_OPTIONS = ("epochs", "eta", "reg", "checkpoint")
    SUMMARY = "plain biased-MF SGD, the non-private speed and accuracy reference (needs --epsilon inf)"
    noisy = False
    NON_PRIVATE = True

    def __init__(self, **kw):
        super().__init__(**kw)
        if self.private:
            raise ParameterError("--method sgd is non-private: pass --epsilon inf (use --method sgld for privacy)")
