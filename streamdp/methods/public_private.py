"""Public and private users: ``--method public-private`` (Xin & Jaakkola, NIPS 2014).

A few **public** users share their ratings openly; the item model (item means ``mu``
and a low-rank ``Sigma = W W^T``, ``W``: ``n_items x k``) is estimated from their ratings
alone, with no noise, by the paper's EM. Every other user is **private**: her ratings
are not used, and she predicts locally with eq. 4 (:func:`streamdp.serving.local.eq4_rows`).
Optionally, private users then contribute once each through one of the paper's
2nd-order mechanisms, PMD (discrete ratings) or PMC (continuous), which are **not**
differential privacy (first-order deniability), or through a Laplace-noised vector,
which is DP and accounted. Public names: :class:`PublicPrivate` (registered as
``public-private``, options :class:`PublicPrivateOptions`) and the guarantees
:data:`GUARANTEE_PMD`, :data:`GUARANTEE_PMC`.

Decisions a reader must know:

* **what the ledger claims**: ``--private-mechanism none`` (default) releases nothing
  about the private users (their rows are skipped before any arithmetic; nothing is
  spent); ``pmd`` / ``pmc`` are "not DP", epsilon ``inf``, counted as unbounded by a
  store budget; ``laplace`` is user-level DP of the whole vector (L1 sensitivity
  ``n_items (hi - lo)``, not the paper's per-rating scale), accounted by PLD;
  ``exact`` is non-private;
* **the rating range** is the store's declared one, else the public users' lowest and
  highest training rating (source ``public users``: public data), found in the roles pass
  before any private user responds (:meth:`PublicPrivate._with_range` then sets the Laplace
  sensitivity ``n_items (hi - lo)``); private users' ratings never set it, whatever the mechanism;
* **the public set** comes from ``--public-users FILE`` and/or ``--public-fraction``
  (a keyed hash of the user's original id); private users' counts never decide who
  is public (``most-active`` ranks the FILE's candidates only);
* **the EM**: completion keeps observed ratings, the M-step keeps the top ``--rank``
  eigenpairs (nothing is ``n_items^2``), scales by the public users' energy, and the
  ridge ``lambda'`` and a user-offset column are chosen on held-out public ratings
  (public data, no privacy cost); random starts are drawn in item-id order;
* **private rounds** take contributors in a random order (not the most active), weigh
  their responses by a weight chosen on held-out public ratings, and keep their
  statistic as a one-pass Nystrom sketch (``--sketch``).

Each rule in full, the mechanisms' definitions, the measurements behind the choices
and the memory and cost: ``docs/design-notes.md``, section
``streamdp/methods/public_private.py``.
"""

from __future__ import annotations

import csv
import hashlib
import math
import os
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from streamdp.errors import InputError, ParameterError
from streamdp.kernels.linalg import predict_rows, residuals, solve_users
from streamdp.kernels.public_private import (
    MECH_EXACT,
    MECH_LAPLACE,
    MECH_PMC,
    MECH_PMD,
    em_accumulate,
    id_keys,
    mean_abs_completed,
    private_sketch,
)
from streamdp.methods import register
from streamdp.methods._notes import seed_notes
from streamdp.methods.base import Fitted, Method, Plan, RunSettings
from streamdp.methods.options import MethodOptions, option
from streamdp.privacy import GUARANTEE_NONE, Ledger, epsilon_of
from streamdp.privacy.bounding import hash_keys
from streamdp.privacy.rating_range import user_extremes
from streamdp.privacy.ledger import GUARANTEE_PRIVATE_USERS_DP, GUARANTEE_PUBLIC_ONLY
from streamdp.privacy.release import Share, calibrate_releases, pure_epsilon
from streamdp.storage.ids import as_ids, parse_id, utf8_lines
from streamdp.stream.engine import add_into as _add

#: Key of this method's random streams.
RNG_KEY = 0x0B9B
_INIT, _KEYS, _OMEGA, _RESPONSE = 1, 2, 3, 4
#: What private users send (``--private-mechanism``).
Mechanism = Literal["none", "pmd", "pmc", "laplace", "exact"]
#: Which of the ``--public-users`` FILE's users are public (``--public-selection``).
Selection = Literal["most-active", "random"]
#: Pseudo-ratings that shrink a public item mean toward the public global mean.
MEAN_PRIOR = 5.0
#: Per-user role on disk: private (no response), public; a responder of round t has ``ROUND0 + t``.
PRIVATE, PUBLIC, ROUND0 = 0, 1, 1
#: Without ``--reg``: the first ``lambda' / rho``; the factors tried around the current ``lambda'`` in each EM
#: iteration after the first ``WARMUP_ITERS`` and up to ``VALIDATION_ITERS`` of them (fractions of ``--iters``),
#: judged on ``VALIDATION_FRACTION`` of the public ratings, held out of the sums until then.
REG_START, LAMBDA_STEPS, VALIDATION_FRACTION = 0.1, (1.0, 0.5, 2.0), 0.1
WARMUP_ITERS, VALIDATION_ITERS = 0.2, 0.6
#: Without ``--private-weight``: the weights of the private responses tried after each round (the paper's 1/2 and
#: less, down to none), judged on the held-out public ratings.
WEIGHTS = (0.5, 0.125, 0.03125, 0.0078125, 0.001953125, 0.0)
#: Ridges (rating units) of the user offset tried as a last column of ``W`` (``PublicPrivate._user_offset``).
OFFSET_RIDGES = (3.0, 10.0, 30.0)
#: Scratch bytes per call of the private-response kernel (Laplace noise rows).
RESPONSE_SCRATCH_BYTES = 16 << 20
#: ``model.json``'s ``rating_range.source`` on a store whose range was not declared: the public users' lowest and
#: highest training rating (public data, nothing spent), found in the roles pass; private users' never set it.
PUBLIC_RANGE = "public users"
PUBLIC_RANGE_NOTE = ("rating range: the public users' lowest and highest training rating (public data, nothing "
                     "spent; the store declares none), never the private users' ratings, which are clipped into it")

GUARANTEE_PMD = ("not DP: first-order deniability (Xin & Jaakkola 2014) for private users (PMD: each coordinate of "
                 "a response is uniform on the rating levels; the relations between a user's ratings are released); "
                 "public users' data is public")
GUARANTEE_PMC = ("not DP: first-order deniability (Xin & Jaakkola 2014) for private users (PMC: each coordinate of "
                 "a response is +-h with probability 1/2; the sign pattern of a user's centred ratings is released up "
                 "to one global sign); public users' data is public")

_POS = dict(minimum=0, exclusive_minimum=True)


@dataclass(frozen=True)
class PublicPrivateOptions(MethodOptions):
    """The options of ``--method public-private`` (which combinations are allowed: :meth:`PublicPrivate.__init__`)."""

    public_users: str | None = option("file of public users' original ids, UTF-8 (one per line, or the first CSV "
                                      "field)", metavar="FILE")
    public_fraction: float | None = option("fraction of all users that are public: a random one (each user by her "
                                           "id's key), or with --public-users the most active/random of the file's "
                                           "users", **_POS, maximum=1)
    public_selection: Selection = option("with --public-users and --public-fraction: which of the file's users",
                                         default="most-active")
    iters: int = option("EM iterations over the public users (one pass each)", default=20, minimum=1)
    reg: float | None = option("regularisation of a private user's local prediction, as a multiple of the public "
                               "users' rating density (lambda' of eq. 4)",
                               default_text="chosen on held-out public ratings", **_POS)
    private_mechanism: Mechanism = option(
        "what private users send: none (public users only), pmd / pmc (2nd-order, not DP), laplace (DP noisy "
        "vectors), exact (no privacy)", default="none")
    private_fraction: float = option("fraction of private users that respond", default=1.0, **_POS, maximum=1)
    private_rounds: int = option("rounds of private responses (the model is updated after each)", default=5,
                                 minimum=1)
    round_iters: int = option("EM iterations over the public users after each round", default=3, minimum=0)
    private_weight: float | None = option("server weight of a private response (public users weigh 1)",
                                          default_text="after each round, the one of 1/2, 1/8, ..., 1/512, 0 that "
                                          "predicts held-out public ratings best", minimum=0)
    sketch: int | None = option("columns s of the sketch of the private responses' second moments",
                                default_text="4 k + 8, at most n_items", minimum=1)
    pmd_sweeps: int = option("PMD: greedy passes over the coordinates", default=2, minimum=0)
    pmd_swaps: int = option("PMD: random candidate pairs tried per coordinate and pass", default=4, minimum=1)
    pmc_h: Literal["user", "public"] = option(
        "PMC: the size of each response from the user's own vector or the public users' mean (h, Thm 4.2)",
        default="user")
    rating_step: float = option("PMD: spacing of the rating levels within the declared range", default=1.0, **_POS)
    checkpoint: str | None = option("run directory: per-iteration checkpoints (noisy iterates: counted as released, "
                                    "never refunded; keep it private); resumes if it holds one", metavar="DIR")


#: The settings ``model.json`` records as the run's ``parameters``.
RECORDED = ("iters", "reg", "public_users", "public_fraction", "public_selection", "private_mechanism",
            "private_fraction", "private_rounds", "round_iters", "private_weight", "sketch", "pmd_sweeps", "pmd_swaps",
            "pmc_h", "rating_step")


@dataclass(frozen=True)
class PublicPrivateSettings(RunSettings):
    """A run's resolved settings on one store: the options with the run's rating range and derived defaults.

    ``rating_min``/``rating_max`` are the store's declared range; ``None`` on a store that declares none until the
    roles pass finds the public users' range (:meth:`PublicPrivate._with_range`), as are PMD's ``levels``.

    ``private_rounds`` is 0 without a private mechanism, ``public_selection`` is
    ``random`` without a FILE (each user by her key), ``sketch`` is at most ``n_items``.
    ``levels`` are PMD's rating levels (``None`` for the other mechanisms, and then
    left out of :meth:`as_dict`: only PMD reads them). ``candidates`` are the
    ``--public-users`` FILE's users in the store (:func:`public_candidates`), read
    when planning so that a bad FILE fails before the run and held for ``fit`` to
    choose the public set; they are data, not a setting, and the run's fingerprint
    leaves them out.
    """

    rating_min: float | None
    rating_max: float | None
    private_mechanism: Mechanism
    iters: int
    reg: float | None
    public_users: str | None
    public_fraction: float | None
    public_selection: Selection
    private_fraction: float
    private_rounds: int
    round_iters: int
    private_weight: float | None
    sketch: int
    pmd_sweeps: int
    pmd_swaps: int
    pmc_h: Literal["user", "public"]
    rating_step: float
    levels: tuple | None = None
    candidates: dict | None = None

    def as_dict(self) -> dict:
        """The fields, without ``levels`` unless PMD uses them."""
        d = super().as_dict()
        if self.levels is None:
            del d["levels"]
        return d


@register
class PublicPrivate(Method):
    """``--method public-private``: item model from public users by EM, eq. 4 locally, optional 2nd-order phase."""

    #: The exact number of users: this method's guarantees do not hide a user's presence (public users are public;
    #: the Laplace run's accounting is for a change of one private user's ratings, zero-out, under which the count
    #: does not move; the others are not DP), so nothing is spent on it.
    RELEASES_USER_COUNT = False
    #: No private range selection (its ledger's epsilon is the private users' Laplace responses alone, 0 with no
    #: responses, which a selection spent first would not fit): a range the store does not declare is the public
    #: users' lowest and highest rating (public data), never the private users' (:data:`PUBLIC_RANGE`).
    SELECTS_RATING_RANGE = False

    name = "public-private"
    MAIN_OPTIONS = ("public_users", "public_fraction", "private_mechanism", "iters", "checkpoint")
    SUMMARY = ("public and private users (Xin & Jaakkola 2014): EM on public users only, private users predict "
               "locally (eq. 4); optional PMD/PMC (not DP) or Laplace (DP) responses from private users")
    Options = PublicPrivateOptions
    LOCAL_SOLVER = "xin_jaakkola_eq4"

    def __init__(self, *, epsilon, delta, rank=None, seed=None, users=None, **options):
        super().__init__(epsilon=epsilon, delta=delta, rank=rank, seed=seed, users=users, **options)
        o = self.opts
        mech = o.private_mechanism
        if not o.is_given("public_users") and not o.is_given("public_fraction"):
            raise ParameterError("--method public-private needs --public-users FILE or --public-fraction F")
        if o.is_given("public_selection") and not o.is_given("public_users"):
            raise ParameterError("--public-selection chooses among the --public-users FILE's users (ranking all users "
                                 "by activity would let private users' rating counts choose the public set): give "
                                 "the candidates with --public-users FILE")
        if o.is_given("public_selection") and not o.is_given("public_fraction"):
            raise ParameterError("--public-selection needs --public-fraction (how many of the FILE's users)")
        if mech in ("pmd", "pmc") and math.isfinite(self.epsilon):
            raise ParameterError(f"--private-mechanism {mech} is not differential privacy (first-order deniability, "
                                 f"Xin & Jaakkola 2014): it has no epsilon and counts as a non-private release in a "
                                 f"store budget; run it with --epsilon inf")
        if mech == "exact" and math.isfinite(self.epsilon):
            raise ParameterError("--private-mechanism exact sends private users' exact second-order statistics "
                                 "(the paper's reference, non-private); run it with --epsilon inf")
        if mech == "laplace" and not math.isfinite(self.epsilon):
            raise ParameterError("--private-mechanism laplace needs a finite --epsilon (its noise is calibrated to it)")
        only = {"pmd_sweeps": "pmd", "pmd_swaps": "pmd", "rating_step": "pmd", "pmc_h": "pmc"}
        for name, m in only.items():
            if o.is_given(name) and mech != m:
                raise ParameterError(f"--{name.replace('_', '-')}: only with --private-mechanism {m}")
        if mech == "none":
            for name in ("private_fraction", "private_rounds", "round_iters", "private_weight", "sketch"):
                if o.is_given(name):
                    raise ParameterError(f"--{name.replace('_', '-')}: only with a --private-mechanism")

    # -- settings ----------------------------------------------------------------------
    def _sketch(self, n_items: int) -> int:
        """Columns of the private responses' sketch: ``--sketch`` or ``4 k + 8``, at most ``n_items``."""
        return min(self.opts.sketch if self.opts.sketch is not None else 4 * self.rank + 8, n_items)

    def settings(self, store) -> PublicPrivateSettings:
        """The options resolved on ``store``; reads the ``--public-users`` FILE (its users' ids and counts).

        The rating range is the store's when declared, else left to the run (``None``: the public users' range).
        """
        o = self.opts
        lo = hi = None
        if getattr(store, "rating_range_source", "observed") == "declared":
            lo, hi = float(store.rating_min), float(store.rating_max)
        mech = o.private_mechanism
        return PublicPrivateSettings(
            rating_min=lo, rating_max=hi, private_mechanism=mech, iters=o.iters, reg=o.reg,
            public_users=o.public_users, public_fraction=o.public_fraction,
            public_selection=o.public_selection if o.public_users is not None else "random",
            private_fraction=o.private_fraction, private_rounds=o.private_rounds if mech != "none" else 0,
            round_iters=o.round_iters, private_weight=o.private_weight, sketch=self._sketch(store.n_items),
            pmd_sweeps=o.pmd_sweeps, pmd_swaps=o.pmd_swaps, pmc_h=o.pmc_h, rating_step=o.rating_step,
            levels=tuple(rating_levels(lo, hi, o.rating_step).tolist()) if mech == "pmd" and lo is not None else None,
            candidates=public_candidates(store, o.public_users) if o.public_users else None)

    # -- privacy plan --------------------------------------------------------------------
    def _plan(self, store) -> Plan:
        """The releases; on a store that declares no range, bound to the public users' range by :meth:`_fit`.

        The Laplace release is calibrated here (its noise multiplier, scale over sensitivity, is what the
        accountant reads: the range does not move it); its sensitivity ``n_items (max - min)`` is set with the
        range (:meth:`_with_range`), before any private user responds.
        """
        s = self.settings(store)
        declared = s.rating_min is not None
        bounds = {"rating_min": s.rating_min, "rating_max": s.rating_max,
                  "rating_range_source": "declared" if declared else PUBLIC_RANGE,
                  "public_users": _public_rule(s, store),
                  "private_users": _private_rule(s)}
        releases, rel = [], None  # rel: the Laplace release, the one ``Plan.releases`` holds (None otherwise)
        if s.private_mechanism == "laplace":
            share = Share("each responding private user's completed rating vector, clipped to the rating range, with "
                          "Laplace noise on every item (released once by the user: local, parallel over users)",
                          "laplace", store.n_items, 1.0, shape=(store.n_items,))  # x (max - min): _with_range
            releases = calibrate_releases([share], self.epsilon, self.delta)
            rel = releases[0]
            bounds["pure_epsilon"] = pure_epsilon(releases)
            bounds["sensitivity"] = (f"L1 n_items (max - min) = {store.n_items} x (the public users' range, found in "
                                     f"the run): any two completed vectors clipped to the range")
        entries = [r.entry() for r in releases]
        if s.private_mechanism in ("pmd", "pmc", "exact"):
            entries.append({"release": f"one {s.private_mechanism.upper()} response per responding private user",
                            "mechanism": f"{s.private_mechanism} (not DP)", "count": 1})
        plan = Plan(events=[r.event() for r in releases], entries=entries, settings=s, bounds=bounds, releases=rel)
        return self._with_range(plan, store, s.rating_min, s.rating_max) if declared else plan

    def _with_range(self, plan: Plan, store, lo: float, hi: float) -> Plan:
        """``plan`` bound to the rating range ``[lo, hi]``: the settings (and PMD's levels), the ledger's bounds and
        the Laplace release's sensitivity ``n_items (hi - lo)`` (its noise multiplier, and so its event, unchanged).
        """
        s = plan.settings
        levels = tuple(rating_levels(lo, hi, s.rating_step).tolist()) if s.private_mechanism == "pmd" else None
        bounds = dict(plan.bounds, rating_min=float(lo), rating_max=float(hi))
        rel, entries = plan.releases, list(plan.entries)
        if rel is not None:
            width = hi - lo
            bound = replace(rel, sensitivity=store.n_items * width)
            entries = [bound.entry() if e == rel.entry() else e for e in entries]
            bounds["sensitivity"] = (f"L1 n_items (max - min) = {store.n_items} x {width:g}: any two completed "
                                     f"vectors clipped to the range")
            rel = bound
        return replace(plan, settings=replace(s, rating_min=float(lo), rating_max=float(hi), levels=levels),
                       bounds=bounds, entries=entries, releases=rel)

    def ledger(self, store, plan: Plan, *, notes=()):
        mech = plan.settings.private_mechanism
        bounds = dict(plan.bounds)
        bounds["releases"] = list(plan.entries)
        notes = list(notes)
        common = dict(method=self.name, bounds=bounds, seeded=self.seed is not None, store_checksum=store.checksum)
        if mech == "none":
            notes.insert(0, "public users only: the private users' ratings are not used (their rows are skipped "
                            "before any arithmetic), so nothing about them is released (epsilon 0 for them); the public "
                            "users' ratings are public data and are not protected")
            return Ledger(guarantee=GUARANTEE_PUBLIC_ONLY, epsilon=0.0, delta=0.0, notes=notes, **common)
        if mech in ("pmd", "pmc"):
            notes.insert(0, "first-order deniability is NOT differential privacy: no epsilon is reported and a store "
                            "budget counts this release as unbounded")
            return Ledger(guarantee=GUARANTEE_PMD if mech == "pmd" else GUARANTEE_PMC, epsilon=math.inf, delta=0.0,
                          notes=notes, **common)
        if mech == "exact":
            notes.insert(0, "NO privacy for private users: their exact second-order statistics (+-(r - mu)) are used "
                            "(the paper's 'exact 2nd order' reference)")
            return Ledger(guarantee=GUARANTEE_NONE, epsilon=math.inf, delta=self.delta, notes=notes, **common)
        notes.insert(0, "the epsilon is that of the private users' Laplace-noised vectors (each user's response is "
                        "local DP); the public users' ratings are public data and are not protected")
        notes.append("the accounting holds for any change of one private user's ratings (zero-out: a responder "
                     "without ratings still answers); her presence among the responders is not hidden")
        pe = bounds.get("pure_epsilon")
        if pe is not None and math.isfinite(pe):
            notes.append(f"the Laplace release is pure DP: epsilon = {pe:.6g} at delta = 0; the reported (epsilon, "
                         f"delta) is the PLD accountant's figure")
        return Ledger(guarantee=GUARANTEE_PRIVATE_USERS_DP, epsilon=self.epsilon, delta=self.delta,
                      events=list(plan.events), accounting=epsilon_of(plan.event, self.delta), notes=notes, **common)

    # -- memory ----------------------------------------------------------------------------
    def state_bytes(self, store) -> int:
        """Item-side memory: ``W``, its basis, ``C Q`` and temporaries; the sketch, its test matrix and factors."""
        n, k = store.n_items, self.rank
        s = self._sketch(n) if self.opts.private_mechanism != "none" else 0
        return n * (8 * k * 8 + 4 * s * 8 + 6 * 8)

    # -- fitting -----------------------------------------------------------------------------
    def fit(self, store, engine) -> Fitted:
        plan = self.plan(store)
        with self.open_run(store, plan, rng_key=RNG_KEY, exclude=("candidates",), engine=engine) as run:
            return self._fit(store, engine, run, plan)

    def _schedule(self, s) -> list:
        """The steps of a run, ``(kind, t)``.

        EM iterations over the public users: with ``lambda'`` chosen on held-out public
        ratings (no ``--reg``) the first ``WARMUP_ITERS`` keep it and the next ones up to
        ``VALIDATION_ITERS`` try factors around it (``em-warmup``, ``em-validate``);
        ``em-held`` iterations leave the held-out ratings out of the sums, ``em`` ones use
        all public ratings. Then per round: the responses (``respond``), the choice of the
        private weight on the held-out ratings (``weigh``, when ``--private-weight`` is not
        given) and ``--round-iters`` EM iterations; after the last round, as many on all
        public ratings when the held-out ratings were kept out until then.
        """
        T, R, E = s.iters, s.private_rounds, s.round_iters
        weigh = R > 0 and s.private_weight is None
        tv = 0 if s.reg is not None else int(math.ceil(VALIDATION_ITERS * T))
        tw = int(math.ceil(WARMUP_ITERS * T)) if tv else 0
        rest = "em-held" if weigh else "em"
        steps = [("em-warmup" if t <= tw else "em-validate" if t <= tv else rest, t) for t in range(1, T + 1)]
        for t in range(1, R + 1):
            steps += [("respond", t)] + ([("weigh", t)] if weigh else []) + [(rest, t)] * E
        if weigh:
            steps += [("em", R)] * max(E, 1)
        return steps

    def _fit(self, store, engine, run, plan) -> Fitted:
        s = plan.settings
        n, k = store.n_items, self.rank
        keys = run.rng(_KEYS, 0).integers(0, 2 ** 63, size=3)
        public = PublicSet.build(s, store, int(keys[0]))
        roles = run.user_state("role", 1, dtype=np.int16)[0]
        ck = run.checkpoint
        if ck is not None:
            stats = {name: ck[name].copy() for name in ("item_sum", "item_count", "responders")}
            stats.update(n_public=int(ck["n_public"]), n_ratings=int(ck["n_ratings"]),
                         public_min=float(ck["public_min"]), public_max=float(ck["public_max"]))
        else:
            stats = self._roles_pass(store, engine, roles, public, int(keys[1]), s)
        if stats["n_ratings"] == 0:
            raise ParameterError(f"{store.path}: the public users ({stats['n_public']}) have no training ratings")
        if s.rating_min is None:  # no declared range: the public users' (public data), before any private response
            lo, hi = stats["public_min"], stats["public_max"]
            if not hi > lo:
                raise ParameterError(f"{store.path}: declares no rating range and the public users' ratings are all "
                                     f"{lo:g}: declare the scale with ingest --rating-range LO,HI")
            plan = self._with_range(plan, store, lo, hi)
            s = plan.settings
        rr = (s.rating_min, s.rating_max)
        gm = float(stats["item_sum"].sum() / stats["n_ratings"])
        mu = (stats["item_sum"] + MEAN_PRIOR * gm) / (stats["item_count"] + MEAN_PRIOR)
        bias = mu - gm
        rho = stats["n_ratings"] / (max(stats["n_public"], 1) * n)
        item_order = np.argsort(store.item_ids(), kind="stable")  # draws in item-id order, never popularity order
        sk = s.sketch if s.private_rounds else 0
        if ck is not None:
            W, Q, sigma, Y = ck["W"].copy(), ck["Q"].copy(), ck["sigma"].copy(), ck["Y"].copy()
            lam, mult = float(ck["lam"]), float(ck["mult"])
            last = (ck["CQ_last"].copy(), ck["Q_last"].copy())
            h_public = None if float(ck["h_public"]) < 0 else float(ck["h_public"])
            history, lam_history, mult_history = ([float(x) for x in ck[name]] for name in
                                                  ("history", "lam_history", "mult_history"))
        else:
            Q = np.zeros((n, k))
            Q[item_order] = run.rng(_INIT, 0).standard_normal((n, k))
            Q[stats["item_count"] == 0] = 0.0  # no information on an item no public user rated
            Q = np.ascontiguousarray(np.linalg.qr(Q)[0])
            W, sigma, Y = np.zeros((n, k)), np.zeros(k), np.zeros((n, sk))
            lam = (s.reg if s.reg is not None else REG_START) * rho
            mult = s.private_weight if s.private_weight is not None else WEIGHTS[0]
            last, h_public = (np.zeros((n, k)), Q), None
            history, lam_history, mult_history = [], [], []
        Omega = None
        if sk:
            Omega = np.zeros((n, sk))
            Omega[item_order] = run.rng(_OMEGA, 0).standard_normal((n, sk))
        factors = _nystrom(Y, Omega) if sk else None

        def private_part(Qb, m):
            if factors is None or not len(factors[1]) or m == 0:
                return None
            return m * (factors[0] @ (factors[1][:, None] * (factors[0].T @ Qb)))

        steps = self._schedule(s)
        for e in run.epochs(len(steps), desc=f"{self.name} steps"):
            kind, t = steps[e - 1]
            desc = f"{self.name} {kind} {e}/{len(steps)}"
            if kind.startswith("em"):
                held_out = VALIDATION_FRACTION if kind != "em" else 0.0
                lams = lam * np.array(LAMBDA_STEPS if kind == "em-validate" else [1.0])
                CQ, sse = self._em_pass(store, engine, roles, gm, bias, W, Q, lams, int(keys[2]), held_out, rr,
                                        desc)
                if kind == "em-validate":
                    lam = float(lams[int(np.argmin(sse))])
                last = (CQ, Q)
                W, Q, sigma = _m_step(CQ, private_part(Q, mult), Q, stats["n_public"], n)
            elif kind == "respond":
                if s.private_mechanism == "pmc" and s.pmc_h == "public" and h_public is None:
                    h_public = self._public_h(store, engine, roles, gm, bias, W, lam, rr)
                Y += self._respond_pass(store, engine, run, roles, t, mu, gm, bias, W, lam, Omega, h_public, plan,
                                        desc)
                factors = _nystrom(Y, Omega)
            else:  # weigh: the private weight whose M-step predicts the held-out public ratings best
                cands = [_m_step(last[0], private_part(last[1], m), last[1], stats["n_public"], n) for m in WEIGHTS]
                sse = self._validation_pass(store, engine, roles, gm, bias, [c[0] for c in cands], lam,
                                            int(keys[2]), rr, desc)
                g = int(np.argmin(sse))
                mult = WEIGHTS[g]
                W, Q, sigma = cands[g]
            history.append(float(sigma.sum()))
            lam_history.append(lam)
            mult_history.append(mult)
            run.save(e, W=W, Q=Q, sigma=sigma, Y=Y, lam=lam, mult=mult, CQ_last=last[0], Q_last=last[1],
                     history=np.asarray(history), lam_history=np.asarray(lam_history),
                     mult_history=np.asarray(mult_history), n_public=stats["n_public"], n_ratings=stats["n_ratings"],
                     item_sum=stats["item_sum"], item_count=stats["item_count"], responders=stats["responders"],
                     public_min=stats["public_min"], public_max=stats["public_max"],
                     h_public=-1.0 if h_public is None else h_public)
        W, offset = self._user_offset(store, engine, roles, gm, bias, W, lam, int(keys[2]), rr)
        return self._fitted(store, plan, run, public, stats, W, sigma, gm, bias, lam, h_public,
                            dict(sigma_trace=history, lambda_prime=lam_history, private_weight=mult_history), rho,
                            offset)

    def _user_offset(self, store, engine, roles, gm, bias, W, lam, seed, rr):
        """``W`` with a user-offset column ``sqrt(lambda' / r) 1`` appended, or ``W``; and ``r`` (``inf``: none).

        Eq. 4 has no user intercept: a private user whose ratings sit above the item means
        everywhere is predicted at the item means, unless ``Sigma`` happens to hold a
        constant direction. Read as the Gaussian model eq. 4 is the posterior mean of,
        ``Sigma + s^2 1 1^T`` adds a user offset with prior variance ``s^2`` to every item;
        in factor form it is one more column of ``W``, constant ``s``, and each user's
        local ridge solve (unchanged: :func:`streamdp.serving.local.eq4_rows`) then fits her own
        offset with ridge ``lambda' / s^2`` = ``r`` in rating units. ``r`` is chosen among
        :data:`OFFSET_RIDGES` and no offset on the held-out public ratings (public data, no
        privacy cost; the last EM iterations saw them, which favours the candidates
        alike: they share ``W``). Measured, ``--public-fraction 0.2`` (seeds 1-3): ML-100K
        1.0111 / 1.0163 / 0.9912 without the offset, 0.9501 / 0.9566 / 0.9477 with
        ``r = 10`` (flat from 1 to 10); FilmTrust 0.820 / 0.822 -> 0.798 / 0.799; a
        generated store without user offsets (5,000 x 500, rank 8) 0.765 / 0.758 without,
        0.772 / 0.764 with ``r = 10``, which is why the choice is made on data.
        """
        ones = np.ones((W.shape[0], 1))
        cands = [W] + [np.hstack([W, math.sqrt(lam / r) * ones]) for r in OFFSET_RIDGES]
        sse = self._validation_pass(store, engine, roles, gm, bias, cands, lam, seed, rr,
                                    f"{self.name} user offset")
        g = int(np.argmin(sse))
        return cands[g], (math.inf if g == 0 else OFFSET_RIDGES[g - 1])

    # -- passes ----------------------------------------------------------------------------
    def _roles_pass(self, store, engine, roles, public, contributor_seed, s) -> dict:
        """Decide and write every user's role; sum the public users' ratings per item and find their lowest and
        highest rating (``public_min``, ``public_max``: the run's range when none is declared), their data only.

        Ratings are clipped to a declared range; with none the public users' own range holds them all.
        """
        n, R = store.n_items, s.private_rounds
        lo, hi = (-math.inf, math.inf) if s.rating_min is None else (s.rating_min, s.rating_max)
        frac = s.private_fraction
        m = 2 * n + 2 + R  # the sums, then the public ratings' -lowest and highest (combined by maximum)

        def fn(block, b):
            first, end = block.first_user, block.first_user + block.n_users
            ids = store.user_ids(first, end)
            pub = public.mask(first, ids)
            role = np.where(pub, PUBLIC, PRIVATE).astype(np.int16)
            if R > 0:
                key = user_keys(ids, contributor_seed)
                respond = ~pub & (key < frac)
                rnd = np.minimum((key / frac * R).astype(np.int64), R - 1) + 1
                role[respond] = (ROUND0 + rnd[respond]).astype(np.int16)
            roles.write(b, role[:, None])
            ip, it, r, _ = select_rows(block.indptr, block.items, block.ratings, pub)
            out = np.zeros(m + 2)
            out[m:] = -math.inf
            if len(it):
                ulo, uhi = np.empty(len(ip) - 1, np.float32), np.empty(len(ip) - 1, np.float32)
                has = user_extremes(ip, np.ascontiguousarray(r, np.float32), ulo, uhi).astype(bool)
                out[m:] = -float(ulo[has].min()), float(uhi[has].max())
            r = np.clip(r.astype(np.float64), lo, hi)
            out[:n] = np.bincount(it, weights=r, minlength=n)
            out[n:2 * n] = np.bincount(it, minlength=n)
            out[2 * n] = pub.sum()
            out[2 * n + 1] = len(it)
            if R > 0:
                out[2 * n + 2:m] = np.bincount(role[role > ROUND0] - ROUND0 - 1, minlength=R)
            return out

        def combine(acc, part):
            acc[:m] += part[:m]
            np.maximum(acc[m:], part[m:], out=acc[m:])
            return acc

        init = np.zeros(m + 2)
        init[m:] = -math.inf
        tot = engine.map_reduce(fn, combine, init, extra_per_block=24 * n + 16 * store.block_users,
                                desc=f"{self.name} roles")
        return dict(item_sum=tot[:n], item_count=tot[n:2 * n], n_public=int(tot[2 * n]),
                    n_ratings=int(tot[2 * n + 1]), responders=tot[2 * n + 2:m].astype(np.int64),
                    public_min=-float(tot[m]), public_max=float(tot[m + 1]))

    def _user_rows(self, block, roles, b, role_value, gm, bias, lo, hi):
        """The block's users with ``role_value``: their CSR rows, centred ratings ``x`` and local indices."""
        role = roles.read(b)[:, 0]
        ip, it, r, local = select_rows(block.indptr, block.items, block.ratings, role == role_value)
        r = np.clip(r, np.float32(lo), np.float32(hi))
        x = np.empty(len(it), np.float64)
        residuals(it, r, float(gm), bias, x)
        return ip, it, x, local

    def _solve(self, ip, it, x, W, lam):
        U = np.zeros((len(ip) - 1, W.shape[1]))
        solve_users(ip, it, x, W, float(lam), U)
        return U

    def _held_out(self, block, ip, it, x, local, seed, held_out):
        """Split the public rows ``(ip, it, x)`` into kept and held-out ratings.

        A rating is held out when its key (a hash of the global user, the item and
        ``seed``) is below ``held_out``: the same ratings whatever the blocking.
        """
        key = np.empty(block.nnz)
        hash_keys(block.first_user, block.indptr, block.items, np.uint64(seed), key)
        mask = np.zeros(block.n_users, bool)
        mask[local] = True
        return split_ratings(ip, it, x, key[np.repeat(mask, np.diff(block.indptr))] >= held_out)

    def _sse(self, kept, val, W, lam, gm, bias, lo, hi) -> float:
        """Squared error of eq. 4's predictions of the held-out ratings ``val`` from the ``kept`` ones."""
        vip, vit, vx = val
        U = self._solve(*kept, W, lam)
        pred = np.empty(len(vit))
        predict_rows(vip, vit, U, W, bias, float(gm), lo, hi, pred)
        return float(np.sum((pred - (vx + gm + bias[vit])) ** 2))

    def _em_pass(self, store, engine, roles, gm, bias, W, Q, lams, seed, held_out, rr, desc):
        """``C Q`` of the public users' completed vectors (one pass) and held-out errors.

        The E-step uses ``lams[0]``. With ``held_out > 0`` the held-out public ratings
        (:meth:`_held_out`) are left out of the sums and predicted by eq. 4 with each
        ``lambda'`` of ``lams``; their squared errors are returned (one per ``lams``).
        """
        n, k = W.shape
        H, G = Q.T @ W, W.T @ W
        lo, hi = rr

        def fn(block, b):
            ip, it, x, local = self._user_rows(block, roles, b, PUBLIC, gm, bias, lo, hi)
            sse = np.zeros(len(lams))
            if held_out > 0:
                (ip, it, x), val = self._held_out(block, ip, it, x, local, seed, held_out)
                if len(lams) > 1:
                    sse[:] = [self._sse((ip, it, x), val, W, lam_g, gm, bias, lo, hi) for lam_g in lams]
            U = self._solve(ip, it, x, W, lams[0])
            MC, T = np.zeros((k, k)), np.zeros((n, k))
            em_accumulate(ip, it, x, U, W, Q, H, G, MC, T)
            return [MC, T, sse]

        acc = engine.map_reduce(fn, _add_parts, None, extra_per_block=16 * n * k + 32 * store.block_users * k,
                                desc=desc)
        return W @ acc[0] + acc[1], acc[2]

    def _validation_pass(self, store, engine, roles, gm, bias, Ws, lam, seed, rr, desc) -> np.ndarray:
        """Held-out squared error of each model ``W`` of ``Ws`` (one pass over the public users; ``rr``: the run's
        rating range)."""
        lo, hi = rr

        def fn(block, b):
            ip, it, x, local = self._user_rows(block, roles, b, PUBLIC, gm, bias, lo, hi)
            kept, val = self._held_out(block, ip, it, x, local, seed, VALIDATION_FRACTION)
            return np.array([self._sse(kept, val, W, lam, gm, bias, lo, hi) for W in Ws])

        return engine.map_reduce(fn, _add, np.zeros(len(Ws)), extra_per_block=32 * store.block_users, desc=desc)

    def _public_h(self, store, engine, roles, gm, bias, W, lam, rr) -> float:
        """PMC's shared ``h``: the mean over public users of ``mean_j |r_j - mu_j|`` of their completed vectors."""
        lo, hi = rr

        def fn(block, b):
            ip, it, x, _ = self._user_rows(block, roles, b, PUBLIC, gm, bias, lo, hi)
            U = self._solve(ip, it, x, W, lam)
            h = np.zeros(len(ip) - 1)
            mean_abs_completed(ip, it, x, U, W, h)
            return np.array([h.sum(), len(h)])

        tot = engine.map_reduce(fn, _add, np.zeros(2), extra_per_block=store.n_items, desc=f"{self.name} PMC h")
        return float(tot[0] / max(tot[1], 1.0))

    def _respond_pass(self, store, engine, run, roles, t, mu, gm, bias, W, lam, Omega, h_public, plan, desc):
        """Round ``t``: each responder completes her vector, applies the mechanism, answers; the server sketches.

        Returns the round's part of the sketch ``Y``.
        """
        n, sk = Omega.shape
        s = plan.settings
        mech = s.private_mechanism
        code = {"exact": MECH_EXACT, "pmc": MECH_PMC, "pmd": MECH_PMD, "laplace": MECH_LAPLACE}[mech]
        levels = np.asarray(s.levels if s.levels is not None else [0.0], np.float64)
        order = np.argsort(store.item_ids(), kind="stable").astype(np.int64)
        rel = plan.releases
        lo, hi = s.rating_min, s.rating_max
        h = -1.0 if h_public is None else float(h_public)
        chunk = max(1, RESPONSE_SCRATCH_BYTES // (8 * n)) if mech == "laplace" else 1 << 30

        def fn(block, b):
            ip, it, x, local = self._user_rows(block, roles, b, ROUND0 + t, gm, bias, lo, hi)
            n_u = len(ip) - 1
            Yb = np.zeros((n, sk))
            if n_u == 0:
                return [Yb, 0]
            U = self._solve(ip, it, x, W, lam)
            seeds = np.zeros(n_u, np.uint64)
            choice = np.zeros(n_u, np.int64)
            signs = np.zeros(n_u, np.float64)
            for c0 in range(0, n_u, chunk):
                c1 = min(n_u, c0 + chunk)
                noise = np.zeros((c1 - c0, n) if mech == "laplace" else (0, 0))
                for q in range(c0, c1):
                    # the user's own generator: her response does not depend on scheduling or blocking
                    g = run.group_rng(_RESPONSE, t, block.first_user + int(local[q]))
                    seeds[q] = g.integers(0, 2 ** 63)
                    choice[q] = g.integers(0, len(levels))
                    signs[q] = 1.0 - 2.0 * g.integers(0, 2)
                    if mech == "laplace":
                        noise[q - c0] = rel.noise(g, (n,))
                sub = slice(ip[c0], ip[c1])
                private_sketch(ip[c0:c1 + 1] - ip[c0], it[sub], x[sub], U[c0:c1], W, mu, code, levels, order,
                               seeds[c0:c1], choice[c0:c1], signs[c0:c1], h, lo, hi, noise, s.pmd_sweeps,
                               s.pmd_swaps, np.ones(c1 - c0), Omega, Yb)
            return [Yb, n_u]

        acc = engine.map_reduce(fn, _add_parts, None, extra_per_block=8 * n * sk + 8 * n * len(levels)
                                + RESPONSE_SCRATCH_BYTES, desc=desc)
        return acc[0]

    # -- the released model ----------------------------------------------------------------
    def _fitted(self, store, plan, run, public, stats, W, sigma, gm, bias, lam, h_public, trace, rho,
                offset=math.inf) -> Fitted:
        s = plan.settings
        notes = []
        notes += seed_notes(self)
        if plan.bounds["rating_range_source"] == PUBLIC_RANGE:
            notes.append(PUBLIC_RANGE_NOTE)
        ledger = self.ledger(store, plan, notes=notes)
        ledger.bounds["public_users_count"] = stats["n_public"]
        ledger.bounds["public_ratings"] = stats["n_ratings"]
        responders = [int(c) for c in stats["responders"]]
        params = {key: getattr(s, key) for key in RECORDED}
        info = {"method": self.name, "rank": int(W.shape[1]), "epsilon": self.epsilon if math.isfinite(self.epsilon)
                else "inf", "delta": self.delta, "seed": self.seed,
                "n_users": store.n_users, "n_items": store.n_items, "parameters": params,
                "public": {"rule": plan.bounds["public_users"], "n_public": stats["n_public"],
                           "n_public_ratings": stats["n_ratings"], "n_candidates": public.n_candidates},
                "private": {"mechanism": s.private_mechanism, "pmc_h_public": h_public,
                            "weight": trace["private_weight"][-1] if responders else None,
                            "weight_source": "--private-weight" if s.private_weight is not None else
                            "chosen after each round on the held-out public ratings"},
                "local": self.LOCAL_SOLVER, "ridge": float(lam), "lambda_prime": float(lam),
                "lambda_prime_source": ("--reg x public density" if s.reg is not None else
                                        f"chosen on {VALIDATION_FRACTION:g} of the public ratings, held out in the "
                                        f"first {VALIDATION_ITERS:g} of the EM iterations"),
                "reg_chosen": float(lam / rho) if rho > 0 else None,
                "user_offset": {"column": bool(math.isfinite(offset)), "ridge": offset if math.isfinite(offset)
                                else None, "source": "chosen on the held-out public ratings (none, or a last "
                                "column of the item factors: ridge lambda' / its value^2)"},
                "by_step": {key: [float(x) for x in v] for key, v in trace.items()}, "run_id": run.run_id,
                "run_directory": None if run.own_dir else run.dir,
                "rating_range": {"min": s.rating_min, "max": s.rating_max,
                                 "source": plan.bounds["rating_range_source"]}}
        return Fitted(item_factors=np.asarray(W, np.float32), item_bias=np.asarray(bias, np.float32),
                      item_ids=store.item_ids(), global_mean=float(gm), model_info=info, ledger=ledger,
                      extras={"sigma_eigenvalues": np.asarray(sigma, np.float64),
                              "public_item_count": np.asarray(stats["item_count"], np.int64)},
                      per_item_extras=("public_item_count",),
                      owner={"private_responders_by_round": responders})


# -- the public set ----------------------------------------------------------------------------


class PublicSet:
    """Who is public: the FILE's users (all, or ``ceil(F n_users)`` of them), or each user with probability ``F``.

    ``mask(first_user, ids)`` gives the public users of a block from their original
    ids; ``indices`` (sorted dense indices) is held only for a FILE (its size).
    """

    def __init__(self, indices=None, fraction=None, seed=0, n_candidates=None):
        self.indices = indices
        self.fraction = fraction
        self.seed = int(seed)
        self.n_candidates = n_candidates

    @classmethod
    def build(cls, s, store, seed: int) -> "PublicSet":
        cand = s.candidates
        F = s.public_fraction
        if cand is None:
            return cls(fraction=float(F), seed=seed)
        idx, ids, counts = cand["indices"], cand["ids"], cand["counts"]
        if F is not None:
            want = int(math.ceil(F * store.n_users))
            if want > len(idx):
                raise ParameterError(f"--public-fraction {F:g} asks for {want} public users but "
                                     f"{s.public_users} lists only {len(idx)}")
            if s.public_selection == "most-active":
                pick = np.lexsort((ids, -counts))[:want]
            else:
                pick = np.lexsort((ids, user_keys(ids, seed)))[:want]
            idx = idx[pick]
        return cls(indices=np.sort(idx), seed=seed, n_candidates=len(cand["indices"]))

    def mask(self, first_user: int, ids) -> np.ndarray:
        if self.indices is not None:
            n = len(ids)
            lo, hi = np.searchsorted(self.indices, [first_user, first_user + n])
            m = np.zeros(n, bool)
            m[self.indices[lo:hi] - first_user] = True
            return m
        return user_keys(ids, self.seed) < self.fraction


def user_keys(ids, seed: int) -> np.ndarray:
    """Each user's key in [0, 1) from her original id and ``seed`` (integer ids hashed in Numba, others by blake2b)."""
    ids = np.asarray(ids)
    if ids.dtype.kind not in "iu":
        ids = np.array([int.from_bytes(hashlib.blake2b(str(v).encode(), digest_size=8).digest(), "little")
                        for v in ids.tolist()], dtype=np.uint64)
    out = np.empty(len(ids), np.float64)
    id_keys(np.ascontiguousarray(ids), np.uint64(seed), out)
    return out


def read_user_ids(path: str, numeric: bool) -> tuple[list, list]:
    """The ids of a public-users file and their line numbers (UTF-8; see :mod:`streamdp.storage.ids`).

    One id per line (the whole line for string ids, so ``a b`` is one id; the first word
    for integer ids), or the first field of a comma- or tab-separated line, CSV-quoted
    (``"x,y"`` is one id). String ids are taken as written: ``007`` is not ``7``.

    Blank lines and ``#`` comments are skipped, and a first line that is not an id
    (a header) when ids are integers. Errors name ``FILE:LINE``.
    """
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file (--public-users)")
    ids, lines, first = [], [], {}
    with open(path, newline="", encoding="utf-8-sig") as f:  # ids are text: UTF-8 whatever the locale
        for lineno, line in enumerate(utf8_lines(f, path), 1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            if "," in text or "\t" in text or text.startswith('"'):  # the first field, CSV-quoted ("a,b" is one id)
                raw = key = next(csv.reader([text], delimiter="\t" if "\t" in text and "," not in text else ","))[0].strip()
            else:  # the whole line: a string id may hold spaces; an integer id is the first word
                raw = key = text.split()[0] if numeric else text
            if not key:
                raise InputError(f"{path}:{lineno}: no user id on the line")
            if numeric:
                try:
                    key = parse_id(key, True)
                except ValueError:
                    if not ids and lineno == _first_content_line(path):
                        continue  # a header
                    raise InputError(f"{path}:{lineno}: user id {raw!r} is not an integer (the store's user "
                                     f"ids are integers)") from None
            if key in first:
                raise InputError(f"{path}:{lineno}: user id {key} listed twice (first on line "
                                 f"{first[key]})")
            first[key] = lineno
            ids.append(key)
            lines.append(lineno)
    if not ids:
        raise InputError(f"{path}: no user ids (--public-users)")
    return ids, lines


def _first_content_line(path: str) -> int:
    with open(path, encoding="utf-8-sig") as f:
        for lineno, line in enumerate(utf8_lines(f, path), 1):
            t = line.strip()
            if t and not t.startswith("#"):
                return lineno
    return 0


def public_candidates(store, path: str) -> dict:
    """The users of ``path`` in ``store``: sorted-by-file ``ids``, dense ``indices`` and training ``counts``.

    Reads the store's user ids and row pointers block by block; an id that is not a
    user of the store is an :class:`InputError` naming ``FILE:LINE``.
    """
    numeric = store.user_ids(0, min(1, store.n_users)).dtype.kind in "iu"
    ids, lines = read_user_ids(path, numeric)
    fid = as_ids(ids)  # never a NumPy string dtype: see streamdp.storage.ids
    order = np.argsort(fid, kind="stable")
    sid = fid[order]
    dense = np.full(len(fid), -1, np.int64)
    counts = np.zeros(len(fid), np.int64)
    for b in range(store.n_blocks):
        first, end = store.block_range(b)
        uid = store.user_ids(first, end)
        pos = np.minimum(np.searchsorted(sid, uid), len(sid) - 1)
        hit = sid[pos] == uid
        if hit.any():
            cnt = store.block_user_counts(b)
            dense[order[pos[hit]]] = first + np.flatnonzero(hit)
            counts[order[pos[hit]]] = cnt[hit]
    missing = np.flatnonzero(dense < 0)
    if len(missing):
        i = missing[0]
        raise InputError(f"{path}:{lines[i]}: user id {ids[i]} is not a user of {store.path}"
                         + (f" ({len(missing)} ids of the file are not)" if len(missing) > 1 else ""))
    return {"ids": fid, "indices": dense, "counts": counts}


def _public_rule(s, store) -> str:
    F, f = s.public_fraction, s.public_users
    if f is None:
        return (f"each user public with probability {F:g}, from a key hashing her original id with the run's seed "
                f"(no data used); the public users' ratings are public data")
    base = f"the users listed in {os.path.abspath(f)} (public data: they agreed to share their ratings)"
    if F is None:
        return base
    how = ("the most active first (most training ratings among the listed users only; ties: smaller id)"
           if s.public_selection == "most-active" else "chosen uniformly at random by their id keys")
    return f"ceil({F:g} x n_users) = {int(math.ceil(F * store.n_users))} of {base}, {how}"


def _private_rule(s) -> str:
    mech = s.private_mechanism
    if mech == "none":
        return "not used: the model is estimated from public users only"
    return (f"each private user responds with probability {s.private_fraction:g} (from her id key), once, in one "
            f"of {s.private_rounds} rounds (random order, not by activity), with mechanism {mech}; server weight "
            + (f"{s.private_weight:g}" if s.private_weight is not None else
               "chosen after each round on held-out public ratings (public data)"))


# -- helpers -----------------------------------------------------------------------------------


def rating_levels(lo: float, hi: float, step: float) -> np.ndarray:
    """The discrete rating levels ``lo, lo + step, ..., hi`` of PMD (``ParameterError`` unless they fit).

    >>> rating_levels(1, 5, 1).tolist()
    [1.0, 2.0, 3.0, 4.0, 5.0]
    """
    K = (hi - lo) / step
    if not (abs(K - round(K)) <= 1e-6 * max(1.0, K)) or round(K) < 1 or round(K) + 1 > 127:
        raise ParameterError(f"--rating-step {step:g} must divide the rating range [{lo:g}, {hi:g}] into 1 to 126 "
                             f"steps")
    return lo + step * np.arange(int(round(K)) + 1, dtype=np.float64)


def split_ratings(indptr, items, values, keep):
    """Split a CSR block by a per-rating mask: ``((indptr, items, values) kept, (indptr, items, values) others)``.

    >>> a, b = split_ratings(np.array([0, 2, 3]), np.arange(3), np.ones(3), np.array([True, False, True]))
    >>> a[0].tolist(), b[0].tolist()
    ([0, 1, 2], [0, 1, 1])
    """
    rows = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    out = []
    for m in (keep, ~keep):
        ip = np.zeros(len(indptr), np.int64)
        np.cumsum(np.bincount(rows[m], minlength=len(indptr) - 1), out=ip[1:])
        out.append((ip, np.ascontiguousarray(items[m], np.int32), np.ascontiguousarray(values[m])))
    return out[0], out[1]


def select_rows(indptr, items, ratings, mask):
    """The CSR rows of the users in ``mask``: ``(indptr, items, ratings, local user indices)``.

    >>> select_rows(np.array([0, 2, 3, 5]), np.arange(5), np.ones(5), np.array([True, False, True]))[0].tolist()
    [0, 2, 4]
    """
    counts = np.diff(indptr)
    keep = np.repeat(mask, counts)
    ip = np.zeros(int(mask.sum()) + 1, np.int64)
    np.cumsum(counts[mask], out=ip[1:])
    return ip, np.ascontiguousarray(items[keep], np.int32), ratings[keep], np.flatnonzero(mask)


def _m_step(CQ, CQp, Q, n_public: int, n_items: int):
    """Rayleigh-Ritz on ``Q^T C Q``, one subspace-iteration step, and the paper's M-step scale.

    ``CQ`` is ``C Q`` of the public users' completed vectors, ``CQp`` (or ``None``) that of
    the private responses' weighted statistic. The directions are the Ritz vectors
    ``E`` of ``Q^T (C + C_p) Q``; the scale of each is the public users' energy in it,
    ``theta_l = e_l^T Q^T C Q e_l``: ``sigma_l = sqrt(theta_l / (n_public n_items))``,
    the eigenvalues of the paper's ``Sigma = (C / (n m))^(1/2)``. Returns
    ``(W, Q_new, sigma)`` with ``Q_new = orth(C_total Q E)`` and ``W = Q_new diag(sigma)^(1/2)``.
    """
    Hp = Q.T @ CQ
    Hp = (Hp + Hp.T) / 2.0
    tot = CQ if CQp is None else CQ + CQp
    Hm = Q.T @ tot
    theta, E = np.linalg.eigh((Hm + Hm.T) / 2.0)
    E = E[:, ::-1]
    theta = np.einsum("al,ab,bl->l", E, Hp, E)
    Qn = np.linalg.qr(tot @ E)[0]
    sigma = np.sqrt(np.maximum(theta, 0.0) / max(float(n_public) * n_items, 1e-300))
    Qn = np.ascontiguousarray(Qn)
    return np.ascontiguousarray(Qn * np.sqrt(sigma)), Qn, sigma


def _nystrom(Y, Omega):
    """The fixed-rank PSD approximation ``U diag(lam) U^T`` of the matrix sketched as ``Y = A Omega``.

    Tropp, Yurtsever, Udell & Cevher (2017), Alg. 3, with an eigendecomposition in place
    of the Cholesky factor (robust when ``Omega^T Y`` is singular).
    """
    n, s = Y.shape
    if s == 0 or not np.any(Y):
        return np.zeros((n, 0)), np.zeros(0)
    nu = math.sqrt(n) * np.finfo(np.float64).eps * np.linalg.norm(Y, 2)
    Yn = Y + nu * Omega
    B = Omega.T @ Yn
    b, V = np.linalg.eigh((B + B.T) / 2.0)
    keep = b > b.max() * 1e-12
    E = Yn @ (V[:, keep] / np.sqrt(b[keep]))
    U, S, _ = np.linalg.svd(E, full_matrices=False)
    return U, np.maximum(S * S - nu, 0.0)




def _add_parts(acc, part):
    if acc is None:
        return part
    for i in range(len(part)):
        acc[i] += part[i]
    return acc
