"""What every training method is: a small class with planned events, ``fit`` and a saved model.

A method is constructed from keyword-only privacy arguments and its own options,
exposes the privacy events it will spend **before** it runs (:meth:`Method.plan`,
so that a store budget can refuse it), and ``fit(store, engine)`` returns a
:class:`Fitted` whose :meth:`Fitted.save` writes the common model layout of
:mod:`streamdp.serving.model`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from streamdp.errors import ParameterError
from streamdp.methods.options import MethodOptions
from streamdp.privacy import GUARANTEE_NONE, Ledger, compose, epsilon_of
from streamdp.privacy.accountant import parse_epsilon
from streamdp.privacy.catalogue import epsilon_alone
from streamdp.privacy.users import UserCount, release_user_count
from streamdp.serving.model import save_model
from streamdp.storage.fingerprint import store_fingerprint
from streamdp.storage.timeline import period_users
from streamdp.stream.driver import Run, fingerprint


@dataclass
class Plan:
    """What a method will spend: events (dp-accounting), a description of each release, its settings.

    Give either ``events`` (the DpEvents in order; the ledger stores them one by
    one) or ``event`` (one composed DpEvent); both empty/``None`` means
    non-private. ``entries`` are JSON-ready dicts describing each release (what,
    mechanism, sensitivity, noise multiplier, count), written into the ledger's
    ``bounds["releases"]``.
    """

    event: object | None = None
    entries: list = field(default_factory=list)
    events: list = field(default_factory=list)
    #: The run's resolved settings (a frozen :class:`RunSettings`): options with their derived defaults.
    settings: object | None = None
    #: Contribution bounds and ranges for the ledger's ``bounds``.
    bounds: dict = field(default_factory=dict)
    #: The calibrated releases, as the method indexes them (by name, or in order).
    releases: object = None
    #: What a private run claims, when not the method's ``guarantee`` at ``--epsilon``: a privacy object whose
    #: guarantee holds at another epsilon (SGLD at temperature T claims ``epsilon / T``, labelled) says so here.
    claim: tuple[str, float] | None = None
    #: The plan's own releases in the order of its events, without those spent first (the count, the catalogue):
    #: what another run composes in when this one is a part of its release (:mod:`streamdp.methods._lists`).
    own: list = field(default_factory=list)

    def __post_init__(self):
        if self.events and self.event is None:
            self.event = compose(self.events)
        elif self.event is not None and not self.events:
            self.events = [self.event]


@dataclass
class Fitted:
    """A trained model in memory, ready to save."""

    item_factors: np.ndarray
    item_bias: np.ndarray
    item_ids: np.ndarray
    global_mean: float
    model_info: dict
    ledger: object
    extras: dict = field(default_factory=dict)
    #: Names of the ``extras`` indexed by item (released in the same item order as the factors).
    per_item_extras: tuple = ()
    #: Exact statistics of the run for the data owner (clipped users, train RMSE by epoch...): printed by
    #: ``train``, never written into the model (:mod:`streamdp.manifest`).
    owner: dict = field(default_factory=dict)

    def save(self, out: str, *, force: bool = False) -> str:
        return save_model(out, item_factors=self.item_factors, item_bias=self.item_bias, item_ids=self.item_ids,
                          global_mean=self.global_mean, model_info=self.model_info, ledger=self.ledger,
                          extras=self.extras, per_item_extras=self.per_item_extras, force=force)


@dataclass(frozen=True)
class RunSettings:
    """Base of a method's resolved settings: its options with every derived default filled in, for one store.

    Frozen: a method that revises a setting while planning makes a new one with
    :meth:`replace`. :meth:`as_dict` is what ``model.json`` records and what the
    checkpoint fingerprint covers.
    """

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        """``{field: value}``, arrays as lists (JSON-ready; nested settings stay objects' dicts)."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = v.tolist() if isinstance(v, np.ndarray) else v
        return out


def user_count_for(cls, store, *, epsilon: float, seed: int | None = None,
                   users_bound: int | None = None) -> UserCount:
    """The :class:`~streamdp.privacy.users.UserCount` a run of method class ``cls`` on ``store`` reads: released at
    ``epsilon`` from ``seed``'s stream, or ``users_bound`` declared (exact for a method whose relation keeps it)."""
    # a store whose retired users are left out (storage/retired.py) counts the users it keeps with a rating in the
    # period read (a retired view over a time window: workflows/training.py filtered_store)
    counted = getattr(store, "n_counted", None)
    n = store.n_users if counted is None else counted
    if not cls.RELEASES_USER_COUNT:
        return UserCount(int(n), "exact")
    if counted is None:  # a time window (storage/timeline.py): its users only
        n = period_users(store)
    return release_user_count(n, epsilon=epsilon, seed=seed, users_bound=users_bound)


class Method:
    """Base class of training methods.

    Subclasses set ``name``, ``Options`` (a frozen
    :class:`~streamdp.methods.options.MethodOptions` dataclass: one field per option,
    from which ``streamdp train`` generates its flags and help) and implement
    :meth:`_plan` and :meth:`fit`. Given options are converted and checked by their
    declaration once, here: ``self.opts`` is the frozen options object, with the
    declared defaults for what was not given (``self.opts.is_given(name)`` tells).

    Parameters
    ----------
    epsilon, delta : float
        Target user-level guarantee; ``epsilon = inf`` trains without noise (labelled
        non-private everywhere).
    rank : int
        Number of factors ``k``.
    seed : int, optional
        Seed of all randomness; a seeded run is reproducible, not private against
        whoever knows the seed (the ledger says so).
    users : UserCount, optional
        The number of users every setting reads (:mod:`streamdp.privacy.users`):
        released with noise or declared. Absent, the method releases it itself on the
        first store it plans for (at :data:`~streamdp.privacy.users.COUNT_SHARE` of
        epsilon, from ``seed``'s stream); its plan spends it first.
    """

    name: ClassVar[str] = ""
    #: The method's options (a frozen :class:`~streamdp.methods.options.MethodOptions` dataclass); ``OPTIONS``,
    #: the records the CLI and the help are generated from, is derived from it.
    Options: ClassVar[type] = MethodOptions
    OPTIONS: ClassVar[tuple] = ()
    #: One line for ``streamdp train --help`` and ``streamdp methods``.
    SUMMARY: ClassVar[str] = ""
    #: The computation a user runs on her device from the model (``model.json``'s ``local``, one of
    #: :data:`streamdp.serving.local.LOCAL_KINDS`): ``ridge`` (default, the key is then left out), ``frank_wolfe``...
    LOCAL_SOLVER: ClassVar[str] = "ridge"
    #: The entropy of a run this method is one candidate of (``None``: its own, from ``seed``): candidates that
    #: share it see the same held-out ratings (als' non-private choice of its item ridge).
    shared_entropy: int | None = None
    #: Whether ``streamdp tune`` can choose this method's configuration (its releases are Gaussian and planned in
    #: full before the run, so candidates compose under one envelope: :mod:`streamdp.workflows.tune`).
    TUNABLE: ClassVar[bool] = False
    #: What ``streamdp tune`` scores its candidates by: ``"loss"`` (clipped held-out squared errors, lower is better)
    #: or ``"hits"`` (held-out items in each user's top 10, higher is better: a method whose scores rank items).
    TUNE_SCORE: ClassVar[str] = "loss"
    #: Whether the run's number of users is released with noise (or declared): ``False`` for a method whose
    #: neighbouring relation leaves the count unchanged (public-private), which then reads the exact count.
    RELEASES_USER_COUNT: ClassVar[bool] = True
    #: Whether a private run on a store whose rating range was not declared selects the range privately
    #: (:mod:`streamdp.privacy.rating_range`, spent first with the catalogue's selection).
    SELECTS_RATING_RANGE: ClassVar[bool] = True
    #: Whether ``--rank`` is a number of factors (so at most ``n_items``); ``fw``'s is its number of iterations.
    RANK_IS_FACTORS: ClassVar[bool] = True
    #: Whether the method trains on an implicit store (interaction counts, ``RatingStore.implicit``); rating
    #: methods do not: a count is no rating (:meth:`check_store`).
    ACCEPTS_IMPLICIT: ClassVar[bool] = False
    #: Whether the method fits factors at all (``means`` releases the global mean and item biases only: its
    #: rank is unused, and a store of fewer items than the default rank is no reason to refuse it).
    FITS_FACTORS: ClassVar[bool] = True
    #: The methods whose released models can start this one's item factors (``train --warm-start MODEL``,
    #: :mod:`streamdp.methods._warm`); empty: the method takes no warm start.
    WARM_START_FAMILIES: ClassVar[tuple[str, ...]] = ()
    #: The options most runs set (names of ``OPTIONS``): ``streamdp train --method X --help`` lists them first and
    #: the rest under "Expert options" (their defaults are derived from the store and epsilon).
    MAIN_OPTIONS: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if "Options" in cls.__dict__:
            cls.OPTIONS = cls.Options.declared()
        names = {o.name for o in cls.OPTIONS}
        unknown = [n for n in cls.MAIN_OPTIONS if n not in names]
        if unknown:
            raise TypeError(f"{cls.__name__}.MAIN_OPTIONS names options it does not declare: {unknown}")

    def __init__(self, *, epsilon: float, delta: float, rank: int | None = None, seed: int | None = None,
                 users: UserCount | None = None, catalogue=None, **options):
        self.opts = self.Options.build(options, method=self.name)
        self.users = users
        #: The run's items (:class:`streamdp.privacy.catalogue.Catalogue`), when a training run chose them: its
        #: selection (if private) is spent first, with the count.
        self.catalogue = catalogue
        self.epsilon = parse_epsilon(epsilon)
        self.delta = float(delta)
        if rank is None:
            rank = self.default_rank()
        if isinstance(rank, bool) or int(rank) != rank or rank < 1:
            raise ParameterError(f"--rank must be a positive integer, got {rank}")
        self.rank = int(rank)
        self.seed = seed

    @classmethod
    def check_store(cls, store) -> None:
        """Refuse (:class:`~streamdp.errors.ParameterError`) a store this method cannot train on: an implicit
        store (interaction logs) for a rating method, and a store with 0 training ratings (``ingest --train F --test
        F`` once wrote one: a release on it spends epsilon on nothing). Checked by every entry point before anything
        is planned or reserved (a message to the data owner, who runs the command; nothing is released)."""
        if getattr(store, "implicit", False) and not cls.ACCEPTS_IMPLICIT:
            raise ParameterError(f"--method {cls.name}: {store.path} is an implicit store (interactions with counts, "
                                 f"no ratings) and {cls.name} trains on ratings; use --method ials")
        if getattr(store, "n_ratings", 1) == 0:
            raise ParameterError(f"{store.path}: the store holds 0 training ratings"
                                 + (" (all its ratings are in its test split)" if store.has_test else "")
                                 + "; there is nothing to train on: ingest it again with training ratings")
        if hasattr(store, "check_rating_range"):
            store.check_rating_range()  # before the item catalogue's pass: every method scales its noise to it

    def check_rank(self, n_items: int) -> None:
        """Refuse (:class:`ParameterError`) more factors than items (not for fw's steps, nor a method fitting none)."""
        if self.FITS_FACTORS and self.RANK_IS_FACTORS and self.rank > n_items:
            raise ParameterError(f"--rank {self.rank} exceeds the number of items ({n_items})")

    def default_rank(self) -> int:
        """The rank when ``--rank`` is not given (8; methods may derive it from public parameters)."""
        return 8

    def user_count(self, store) -> UserCount:
        """The run's number of users (:mod:`streamdp.privacy.users`), released on first use when not given."""
        if getattr(self, "users", None) is None:
            self.users = user_count_for(type(self), store, epsilon=self.epsilon, seed=self.seed)
        return self.users

    def n_users(self, store) -> int:
        """The number of users settings and public fields use: released or declared, never the exact count."""
        return self.user_count(store).n

    def spent_first(self, store) -> list:
        """Releases made before the plan (the count, the item catalogue's selection and, when a lists part is
        trained with this run, its releases: :mod:`streamdp.methods._lists`), which the plan's calibration composes
        in (``fixed``)."""
        if not self.private:
            return []
        cat = getattr(self, "catalogue", None)
        part = getattr(self, "lists_part", None)
        return (self.user_count(store).spent() + (cat.spent() if cat is not None else [])
                + (part.method.plan(store).own if part is not None else []))

    def epsilon_after_first(self, store) -> float:
        """The epsilon left once the releases made first are spent: for a release calibrated on its own (a paper's
        closed-form sigma, sgld's posterior sample), which basic composition then keeps within epsilon. Pure-DP
        releases (the count) count their epsilon; the others (the catalogue's selection) their PLD epsilon at the
        run's delta."""
        first = self.spent_first(store)
        pure = [r for r in first if r.mechanism in ("laplace", "huber")]
        rest = [r for r in first if r.mechanism not in ("laplace", "huber")]
        return self.epsilon - sum(r.count * r.epsilon_each for r in pure) - epsilon_alone(rest, self.delta)

    @property
    def checkpoint(self) -> str | None:
        """The ``--checkpoint`` directory, for a method that has the option (its noisy iterates count as released)."""
        return getattr(self.opts, "checkpoint", None)

    @property
    def private(self) -> bool:
        return math.isfinite(self.epsilon)

    def plan(self, store) -> Plan:
        """The releases on ``store`` with calibrated noise, computed once per store (memoized: calibration
        searches the accountant, and ``plan`` is asked before the run for the budget and again by ``fit``)."""
        key = (str(store.path), store.checksum)
        cache = self.__dict__.setdefault("_plans", {})
        if key not in cache:
            store.check_rating_range()  # every method scales clipping and noise to it: [4, 4] is refused here
            plan = self._plan(store)
            first = self.spent_first(store)
            if first:  # the count, released before the plan was made: the ledger's first event
                plan = dataclasses.replace(plan, event=None, events=[r.event() for r in first] + list(plan.events),
                                           entries=[r.entry() for r in first] + list(plan.entries))
            cache[key] = plan
        return cache[key]

    def _plan(self, store) -> Plan:  # pragma: no cover - abstract
        raise NotImplementedError

    def planned_events(self, store):
        """The composed DpEvent this method will spend on ``store`` (``None`` if non-private)."""
        return self.plan(store).event

    def fit(self, store, engine) -> Fitted:  # pragma: no cover - abstract
        raise NotImplementedError

    def check_scheduler(self, scheduler) -> None:
        """Refuse (:class:`~streamdp.errors.ParameterError`) a ``--scheduler`` the method cannot run on.

        Called before the release is reserved. Default: every scheduler is fine.
        """

    def state_bytes(self, store) -> int:
        """Item-side memory the method holds during a run (sizes the engine's blocks in flight).

        Default: a few ``n_items x rank`` float64 matrices (factors, their update, the
        running reduction) plus per-item vectors; methods holding more override it.
        """
        return 4 * store.n_items * self.rank * 8 + 8 * store.n_items * 8

    #: Guarantee string of a private run (non-private runs are labelled ``GUARANTEE_NONE``).
    guarantee: ClassVar[str] = "user-level (epsilon, delta)-DP"
    #: Neighbouring relation of a private run's ledger, when not the default add/remove one user.
    relation: ClassVar[str | None] = None

    def ledger(self, store, plan: Plan, *, notes=()):
        """The :class:`streamdp.privacy.Ledger` of ``plan`` on ``store`` (one composed accounting)."""
        private = self.private and bool(plan.events)
        acc = epsilon_of(plan.event, self.delta) if private else None
        bounds = dict(plan.bounds)
        bounds["releases"] = list(plan.entries)
        guarantee, epsilon = plan.claim or (self.guarantee, self.epsilon)
        return Ledger(method=self.name, guarantee=guarantee if private else GUARANTEE_NONE,
                      epsilon=epsilon if private else float("inf"), delta=self.delta,
                      events=list(plan.events) if private else [], accounting=acc, bounds=bounds,
                      seeded=self.seed is not None,
                      store_checksum=store.checksum, notes=list(notes),
                      **({"relation": self.relation} if private and self.relation else {}))

    def open_run(self, store, plan, *, rng_key: int, exclude=(), engine=None):
        """The :class:`~streamdp.stream.driver.Run` of one fit of ``plan`` on ``store`` (state, checkpoints, RNG).

        Its fingerprint covers the method, rank, privacy target, seed, store (its keyed
        fingerprint, :func:`_run_store_name`; its period, ``data_window``) and every planned setting but ``exclude`` and
        the derived entries (releases, bounds, the checkpoint path), so ``--checkpoint``
        resumes only the very same run. The temporary run directory goes under
        ``engine.state`` (``--state``) when set.
        """
        skip = {"checkpoint", *exclude}
        keep = {key: v for key, v in plan.settings.as_dict().items() if key not in skip}
        cat = {"items": store.catalogue_digest} if getattr(store, "catalogue_digest", None) else {}
        if getattr(store, "data_window", None):  # a period of the store (storage/timeline.py): another run's data
            cat["period"] = store.data_window
        fp = fingerprint(m=self.name, k=self.rank, eps=str(self.epsilon), delta=self.delta, seed=self.seed,
                         store=_run_store_name(store), s=keep, **cat)
        # a method fitted as one of several candidates of a run shares that run's entropy (same held-out ratings)
        seed = self.seed if self.shared_entropy is None else self.shared_entropy
        return Run(store, method=self.name, fingerprint=fp, seed=seed, rng_key=rng_key,
                   checkpoint=self.checkpoint, state=getattr(engine, "state", None))

    def planned_ledger(self, store):
        """The ledger this method will write, computed before it runs (for budget reservation)."""
        return self.ledger(store, self.plan(store))


def _run_store_name(store) -> str:
    """What names ``store`` in a run's fingerprint, which the run id in ``model.json`` and the checkpoint carry.

    The store's keyed fingerprint (:mod:`streamdp.storage.fingerprint`; its key is made when the run's release is
    reserved, before the fit); a method fitted directly, with nothing reserved on a store that has no key yet, gets
    the store's path and the random id of its write (``generation``). Never the store's checksum: a hash of the
    public settings and the checksum would let whoever knows every user but one test the last one (docs/privacy.md).
    """
    fp = store_fingerprint(store, create=False)
    if fp is not None:
        return fp
    return f"{store.path} generation {(getattr(store, 'attrs', None) or {}).get('generation')}"
