"""Training orchestration: plan -> reserve the budget -> fit -> ledger -> save, the one path every release takes.

:func:`train` is what ``streamdp train``, :func:`streamdp.workflows.api.train` and ``streamdp
sweep`` run for every registered method (:mod:`streamdp.methods`): check the privacy
parameters and the destination (:func:`prepare`), reserve the planned release in the
store's budget **before** anything is written, fit on the stream engine, write the
model atomically and mark the budget entry complete (or failed) (:func:`release`),
and evaluate on the store's test split when there is one. :func:`lowrank` is the same
path for ``streamdp lowrank``.
"""

from __future__ import annotations

import math
import os
import signal
import time

import numpy as np

from streamdp.errors import InputError, Interrupted, ParameterError, StreamdpError
from streamdp.manifest import public_parameters
from streamdp.methods import Method, get_method
from streamdp.methods._lists import attach as attach_lists, lists_part_for
from streamdp.methods._warm import warm_start_from
from streamdp.methods.base import user_count_for
from streamdp.methods.lowrank import WEAKER_NOTE, LowRank
from streamdp.model_dir import model_budget_entry
from streamdp.outputs import interrupt_signal
from streamdp.privacy import GUARANTEE_NONE, check_privacy_params
from streamdp.privacy.accountant import check_calibratable, parse_epsilon
from streamdp.privacy.budget import StoreBudget
from streamdp.privacy.catalogue import declared_items
from streamdp.privacy.rating_range import catalogue_and_range_for
from streamdp.privacy.ledger import privacy_warnings
from streamdp.privacy.params import default_delta
from streamdp.serving.evaluate import evaluate_model
from streamdp.serving.local import (FALLBACK_RIDGE, factors_released, list_model, model_ridge, rating_range,
                                    user_scores)
from streamdp.serving.model import Model, check_model_destination
from streamdp.serving.ranking import DEFAULT_K, DEFAULT_RANKING_USERS, check_k, check_ranking_users
from streamdp.storage.fingerprint import store_fingerprint
from streamdp.storage.store import RatingStore, open_store
from streamdp.storage.timeline import check_contributions, contributors, data_period
from streamdp.stream.driver import sweep_stale_runs
from streamdp.stream.engine import Engine, dask_session


def default_method(store: RatingStore) -> str:
    """The method ``train`` runs when none is named: ``als``, or ``ials`` on an interaction log (an implicit store:
    counts, no ratings, which ``als`` refuses); read off the store's kind, a public parameter of its format."""
    return "ials" if store.info.implicit else "als"


#: What ``train``'s summary says when it chose ``ials`` for an interaction log (:func:`default_method`).
DEFAULT_IALS_NOTE = "ials, the default on an interaction log (als trains on ratings; --method names another)"


def train(store, *, method: str | None, out: str, epsilon: float, delta: float | None = None, rank: int | None = None,
          seed: int | None = None,
          workers: int | None = None, scheduler=None, memory_limit=None, over_budget: bool = False,
          force: bool = False, evaluate_test: bool = True, state: str | None = None, users_bound: int | None = None,
          users=None, k: int = DEFAULT_K, ranking_users=DEFAULT_RANKING_USERS, items=None, warm_start=None,
          since=None, until=None, window=None, until_segment=None, lists: str = "auto", lists_share=None,
          **options) -> dict:
    """Train ``method`` (``None``: :func:`default_method`) on ``store`` and write the model to ``out``; return a summary
    dict.

    The summary has ``method, epsilon, delta, rank, guarantee, seconds, out``, the
    accountant's ``epsilon_spent`` and, when the store has a test split,
    ``test_rmse`` / ``test_mae`` (local ridge solves, see :mod:`streamdp.serving.evaluate`);
    ``stale_runs_removed`` lists the run directories of dead processes removed from
    ``STORE.state/`` first (:func:`streamdp.stream.driver.sweep_stale_runs`), if any.
    Options that are ``None`` are left at the method's defaults. ``force`` replaces
    only an existing model at ``out``. ``scheduler`` (``None``, ``"dask"``,
    ``"processes"``, an address or a client) runs the training and the evaluation
    after it; ``state`` is the root of the per-user state (default beside the store).

    Ctrl-C raises :class:`~streamdp.errors.Interrupted` saying what was released:
    nothing (the reservation is marked failed), or the model and its budget entry
    (complete; the evaluation is skipped). ``delta=None`` is :func:`default_delta` of the
    run's number of users: ``users_bound`` when given (``--users-bound``, a public number the
    data owner declares), else the count released with noise (:mod:`streamdp.privacy.users`),
    never the exact count. ``users``: a count released already (``sweep`` shares one).
    ``k`` and ``ranking_users`` are the evaluation's list length and users of the ranking
    metrics (:func:`streamdp.serving.evaluate.evaluate_model`: a seeded sample by default, ``"all"``). ``items``: the
    catalogue the owner declares (ids, or the path of a file of ids, ``--items``); without it the store's declared
    catalogue, or one selected privately (:mod:`streamdp.privacy.catalogue`): the model's items are never the
    store's items as read off the data. ``warm_start``: a model released earlier (a path or a loaded
    :class:`~streamdp.serving.model.Model`) whose item factors start the run (``--warm-start``,
    :func:`warm_model`): free post-processing, fewer iterations by default; ``rank=None`` is then the model's rank.
    ``since``/``until``/``window``, ``until_segment``: train on a period of the store only
    (:func:`streamdp.storage.timeline.data_period`; recorded in the model and its ledger as ``data_window``).
    ``lists``/``lists_share``: the lists part (:mod:`streamdp.methods._lists`): ``"auto"`` trains an ``ials`` part
    at ``lists_share`` of the epsilon the releases made first leave (default 0.45 where the rating model plans no
    factors, else 0.2) in the same
    release when no ``method`` is named on a private run on a rating store of 5,000 or more users (the released
    count); ``"ials"`` asks for it, ``"own"`` never.
    """
    t0 = time.perf_counter()
    epsilon = parse_epsilon(epsilon)  # "1e309" is an error, only "inf" is infinite
    check_calibratable(epsilon)  # one message for every method, before the store is opened
    k, ranking_users = check_k(k), check_ranking_users(ranking_users)  # before anything is spent
    store = store if isinstance(store, RatingStore) else open_store(store)
    store = data_period(store, since=since, until=until, window=window, until_segment=until_segment)
    if scheduler is None:  # the blocks are read in this process: what the first pass needs starts now, beside the
        store.read_ahead()  # checks and the releases before the fit (a damaged store stops it: raised below)
    check_contributions(store)  # an empty period: refused before anything is reserved
    defaulted = method is None
    cls = get_method(default_method(store) if defaulted else method) if not callable(method) else method
    warm = None
    if warm_start is not None:  # every check that needs no store pass, before anything is released
        warm = warm_model(cls, warm_start, checkpoint=options.get("checkpoint"))
        if rank is None and factors_released(warm):  # a biases-only model's rank was never used
            rank = warm.rank
    # a per-user budget: the store without its retired users, and what the reservation advances the filter with
    store, user_filter = filtered_store(store, cls, epsilon=epsilon, items=items, users_bound=users_bound)
    if users is None or not cls.RELEASES_USER_COUNT:
        users = user_count_for(cls, store, epsilon=epsilon, seed=seed, users_bound=users_bound)
    if delta is None:
        delta = default_delta(users.n)
    check_model_destination(str(out), force)
    cls.check_store(store)
    store.check_chunks()  # a damaged store fails here, before the catalogue's (and the range's) pass
    check_privacy_params(epsilon, delta, n_users=users.n)
    store, catalogue = catalogue_and_range_for(cls, store, epsilon=epsilon, delta=delta, seed=seed,
                                               items=declared_items(items, store))
    st, m = prepare(store, method=cls, out=out, epsilon=epsilon, delta=delta, rank=rank, seed=seed,
                    force=force, users=users, catalogue=catalogue, **options)
    m.lists_part = lists_part_for(cls, st, lists=lists, share=lists_share, epsilon=epsilon, delta=delta, seed=seed,
                                  users=users, catalogue=catalogue, defaulted=defaulted,
                                  checkpoint=options.get("checkpoint"))
    if m.lists_part is not None and warm is not None and list_model(warm) is not warm:
        m.lists_part.warm = list_model(warm)  # the earlier lists part starts this one (streamdp.methods._lists)
    started_cold = None
    if warm is not None:
        m.warm = warm_start_from(warm, st.item_ids(), method=m.name, families=cls.WARM_START_FAMILIES, rank=m.rank,
                                 private=m.private)
        if m.warm.starts_nothing:  # nothing to start from: exactly a cold run (its iterations, its own passes)
            started_cold = {"model": m.warm.path, "method": m.warm.method, "started_cold": m.warm.cold_reason()}
            m.warm = None
    with dask_session(scheduler, workers) as scheduler:
        m.check_scheduler(scheduler)  # before anything is reserved
        fitted, seconds, stale = release(st, m, out, workers=workers, scheduler=scheduler,
                                         memory_limit=memory_limit, over_budget=over_budget, force=force, state=state,
                                         user_filter=user_filter)
        try:
            summary = run_summary(st, m, fitted, out, seconds, epsilon=epsilon, delta=delta, seed=seed, stale=stale,
                               evaluate_test=evaluate_test, workers=workers, memory_limit=memory_limit,
                               scheduler=scheduler, k=k, ranking_users=ranking_users)
            if user_filter is not None:
                from streamdp.privacy.filter import summary as filter_summary

                summary["user_filter"] = filter_summary(user_filter.result)
                if (w := cap_delta_warning(user_filter)) is not None:  # names the exact count: the owner's only
                    summary["user_filter"]["warning"] = w
            if defaulted and cls.name == "ials":
                summary["method_default"] = DEFAULT_IALS_NOTE
            if started_cold is not None:
                summary["warm_start"] = started_cold
                summary["iterations_run"] = fitted.model_info.get("iterations_run")
            summary["total_seconds"] = round(time.perf_counter() - t0, 3)
            return summary
        except KeyboardInterrupt:
            raise Interrupted(f"interrupted after the model was written to {out} and its budget recorded; "
                              f"evaluation skipped") from None


def filtered_store(store, cls, *, epsilon: float, items=None, users_bound=None):
    """``(store, FilterRequest)``: on a store with a per-user budget (:mod:`streamdp.privacy.filter`), the store
    seen without the users retired so far nor those who cannot afford the count of users, the first stage of
    this release (:class:`~streamdp.storage.retired.RetiredView`, ``n_counted`` its users with a rating in the
    period trained on), and the request its reservation advances the filter with (``contributors``: the users of
    the period, :func:`~streamdp.storage.timeline.contributors`: a user with no rating in it is charged nothing);
    ``(store, None)`` without one.

    Refused there, before anything is read: a non-private run (no user could afford it), and a private selection
    of the catalogue or of the rating range (each threshold is a ``(0, delta)`` event, which no Renyi filter can
    charge: declare the items and the range).
    """
    from streamdp.privacy.accountant import rdp_at_order
    from streamdp.privacy.filter import FilterMask, FilterRequest
    from streamdp.privacy.users import count_release
    from streamdp.storage.catalogue import store_catalogue
    from streamdp.storage.retired import RetiredView

    if not store.local:
        return store, None  # a per-user budget is refused on object storage (StoreBudget.set_user)
    ub, generation = StoreBudget(store.path).filter_view_state()
    if ub is None:
        return store, None
    if not math.isfinite(epsilon):
        raise ParameterError(f"--epsilon inf: {store.path} has a per-user budget; a non-private model would cross "
                             f"every user's cap")
    if items is None and store_catalogue(store) is None and cls.RELEASES_USER_COUNT:
        raise ParameterError(f"{store.path} has a per-user budget: declare the catalogue (train --items FILE, or "
                             f"ingest --items); its private selection ends in a (0, delta) event, which no Renyi "
                             f"filter can charge")
    if (getattr(cls, "SELECTS_RATING_RANGE", True) and not store.implicit
            and getattr(store, "rating_range_source", "declared") != "declared"):
        raise ParameterError(f"{store.path} has a per-user budget: declare the rating range (ingest --rating-range "
                             f"MIN,MAX); its private selection ends in a (0, delta) event, which no Renyi filter can "
                             f"charge")
    counted = cls.RELEASES_USER_COUNT and users_bound is None  # the count is released: the first stage
    first = rdp_at_order(count_release(epsilon).event(), ub["alpha"]) if counted else 0.0
    mask = FilterMask(store.path, ub, generation, threshold=first)
    contrib = contributors(store)  # a period: only its users take part, and only they are charged
    view = RetiredView(store, mask)
    view.n_counted = _count_kept(mask, contrib, store.n_users)
    if view.n_counted == 0:
        if contrib is not None and _count_kept(mask, None, store.n_users):
            raise ParameterError(f"{store.path}: every user with a rating in the period has reached her per-user cap "
                                 f"(epsilon={ub['epsilon']:g}): nothing can be released from it")
        raise ParameterError(f"{store.path}: every user has reached her per-user cap (epsilon={ub['epsilon']:g}): "
                             f"nothing can be released from it")
    return view, FilterRequest(generation=generation, n_users=int(store.n_users), stages=[first], view=view,
                               user_budget=ub, contributors=contrib)


def cap_delta_warning(request) -> str | None:
    """A warning when the per-user cap's delta is no longer below one over the store's users (appends added users
    since it was set; it cannot change once releases were made under it: docs/privacy-user-budget.md)."""
    d, n = float(request.user_budget["delta"]), int(request.n_users)
    if d * n < 1:
        return None
    return (f"the per-user cap's delta={d:g} is no longer below 1/n_users ({n:,} users now, after appends): each "
            f"user's guarantee still holds at that delta, but it is weak at this size (a cap cannot change once "
            f"releases were made under it: see docs/privacy-user-budget.md)")


def _count_kept(mask, contrib, n_users: int) -> int:
    """How many of the first ``n_users`` users ``mask`` keeps who contribute (``contrib``; ``None``: all do)."""
    from streamdp.privacy.filter import BLOCK

    n = 0
    for lo in range(0, n_users, BLOCK):
        hi = min(n_users, lo + BLOCK)
        keep = mask.keep(lo, hi)
        n += int((keep if contrib is None else keep & contrib(lo, hi)).sum())
    return n


def warm_model(cls, warm_start, *, checkpoint=None):
    """The model ``train --warm-start`` starts from, loaded (one-line :class:`ParameterError` when it cannot be).

    Refused before anything is read or released: a method that takes no warm start
    (``WARM_START_FAMILIES`` empty: it iterates on no item factors), a path that is not a
    model, and ``--checkpoint`` with it. Decision: the two are refused together rather than
    letting the checkpoint win, since a resumed run would ignore the model the user named
    and a fresh one would be a run of another fingerprint than a later resume of it; resume
    without ``--warm-start`` (the checkpoint holds the iterate), or warm start without
    ``--checkpoint``. The model's method family, rank and item ids are checked against
    the run by :func:`streamdp.methods._warm.warm_start_from`.
    """
    from streamdp.methods import METHODS
    from streamdp.serving.model import load_model

    if not cls.WARM_START_FAMILIES:
        takes = sorted(n for n, c in METHODS.items() if c.WARM_START_FAMILIES)
        raise ParameterError(f"--warm-start: --method {cls.name} takes no warm start (its fit does not iterate from "
                             f"item factors a model releases; --warm-start works with --method {', '.join(takes)})")
    if checkpoint:
        raise ParameterError("--warm-start with --checkpoint: refused (a resumed run would not start from the model); "
                             "resume without --warm-start, or warm start without --checkpoint")
    if isinstance(warm_start, Model):
        return warm_start
    try:
        return load_model(os.fspath(warm_start))
    except StreamdpError as exc:
        raise ParameterError(f"--warm-start {os.fspath(warm_start)}: not a model ({exc})") from None


def prepare(store, *, method: str | type[Method], out: str, epsilon: float, delta: float, rank: int | None = None,
            seed: int | None = None, force: bool = False, users=None, users_bound: int | None = None, catalogue=None,
            **options):
    """Check everything that can be checked before a run and build the method: ``(store, method instance)``.

    ``method`` is a registered name or a :class:`Method` subclass. Checked: the
    destination (``force`` replaces only a model), the store's chunks (a damaged store
    fails before any budget is reserved), the privacy parameters (``delta`` below one
    over the run's number of users: ``users``, or released here, or ``users_bound``) and the rank.
    """
    check_model_destination(str(out), force)
    st = store if isinstance(store, RatingStore) else open_store(store)
    st.check_chunks()  # a damaged store fails here, before any privacy budget is reserved
    cls = get_method(method) if isinstance(method, str) else method
    cls.check_store(st)
    check_privacy_params(epsilon, delta)
    if users is None:
        users = user_count_for(cls, st, epsilon=epsilon, seed=seed, users_bound=users_bound)
    check_privacy_params(epsilon, delta, n_users=users.n)
    kept = {k: v for k, v in options.items() if v is not None}
    m = cls(epsilon=epsilon, delta=delta, rank=rank, seed=seed, users=users, catalogue=catalogue, **kept)
    if rank is None and m.FITS_FACTORS and m.RANK_IS_FACTORS and m.rank > st.n_items >= 1:
        # a default rank above a small catalogue's size: as many factors as items (a given --rank is refused below)
        m = cls(epsilon=epsilon, delta=delta, rank=st.n_items, seed=seed, users=users, catalogue=catalogue, **kept)
    m.check_rank(st.n_items)  # fw's rank counts iterations (its basis may repeat directions); means fits none
    return st, m


def release(st, m: Method, out: str, *, workers=None, scheduler=None, memory_limit=None, over_budget: bool = False,
            force: bool = False, state: str | None = None, entry: str | None = None, user_filter=None):
    """Reserve ``m``'s planned release in the store's budget, fit it, write it to ``out``: ``(fitted, seconds, stale)``.

    The one path from a method instance to a released model directory (``train``
    and ``lowrank``): the budget entry is reserved before the run, marked
    ``writing`` before the model write and ``complete`` once the model is in place,
    or ``failed`` when nothing was released: also when a block read does not match
    its recorded check or the store was replaced during the run
    (:meth:`~streamdp.storage.store.RatingStore.check_unchanged`, before the write). ``stale`` lists the run directories of
    dead processes removed from ``STORE.state/`` first. ``entry``: a reservation made already (``tune``
    reserves its whole run before its candidates), used instead of a new one. ``user_filter``: a per-user budget's
    request (:func:`filtered_store`): the reservation advances the filter, the fit reads without the users it
    retired, ``privacy.json`` states the per-user guarantee. Ctrl-C raises
    :class:`~streamdp.errors.Interrupted` saying what was released.
    """
    out = str(out)
    stale = sweep_stale_runs(st) + (sweep_stale_runs(st, state) if state is not None else [])
    t0 = time.perf_counter()
    if scheduler is None:  # the blocks are read in this process: what the first pass needs starts beside the setup
        st.read_ahead()
    planned = m.planned_ledger(st)
    budget = StoreBudget(st.path)
    if entry is None:
        entry = budget.reserve(planned, over_budget=over_budget, model=os.path.abspath(out), user_filter=user_filter)
    if user_filter is not None:  # the fit reads the users who take part in this release only
        from streamdp.privacy.filter import FilterMask

        user_filter.view.use(FilterMask(user_filter.view.path, user_filter.user_budget, entry))
    # a --checkpoint directory is the user's: its noisy iterates count as released from the first
    # checkpoint on, so the entry is never refunded (stage "writing" before the run; "stale", counted,
    # if the run then fails); only a private run directory keeps the proof that nothing left the process
    checkpoint = m.checkpoint
    part = getattr(m, "lists_part", None)  # an ials part trained in the same release (streamdp.methods._lists)
    try:
        if checkpoint:
            budget.writing(entry)
        held = max(m.state_bytes(st), part.method.state_bytes(st)) if part is not None else m.state_bytes(st)
        with Engine(st, workers=workers, scheduler=scheduler, memory_limit=memory_limit,
                    state_bytes=held, state=state) as engine:
            part_fit = part.method.fit(st, engine) if part is not None else None
            fitted = m.fit(st, engine)
            fitted.model_info.setdefault("engine", engine.describe())
            if not st.implicit or st.rating_range_source == "declared":  # an observed count range is not published
                fitted.model_info.setdefault("rating_range", {"min": st.rating_min, "max": st.rating_max})
                # declared, selected privately (streamdp.privacy.rating_range) or observed (a non-private run); a
                # method that sets its own (public-private: the public users' range) says so
                fitted.model_info["rating_range"].setdefault("source", st.rating_range_source)
        st.check_unchanged()  # the model records the fingerprint of the store opened: it must be the store read
        seconds = time.perf_counter() - t0
        fp = store_fingerprint(st)
        fitted.model_info["store_fingerprint"] = fp
        fitted.model_info["budget_entry"] = entry
        fitted.ledger.store_fingerprint = fp
        fitted.ledger.public_parameters = public_parameters(st, m.user_count(st), getattr(m, "catalogue", None),
                                                            fitted.model_info.get("rating_range"))
        window = getattr(st, "data_window", None)
        if window:  # the period trained on: public, the user chose it (storage/timeline.py)
            fitted.model_info["data_window"] = window
            fitted.ledger.public_parameters["data_window"] = window
        if user_filter is not None:
            from streamdp.privacy.filter import statement

            fitted.ledger.individual = statement(user_filter.user_budget, user_filter.result)
        if fitted.ledger.guarantee == GUARANTEE_NONE:
            fitted.model_info["delta"] = None  # a non-private model has no (epsilon, delta) guarantee
        check_local_solve(fitted, out)
        if part_fit is not None:  # its local solve reads the run's rating range, as the rating model's does
            if "rating_range" in fitted.model_info:
                part_fit.model_info.setdefault("rating_range", dict(fitted.model_info["rating_range"]))
            check_local_solve(part_fit, out)
            attach_lists(fitted, part_fit, part)
        budget.writing(entry)
        fitted.save(out, force=force)
        budget.complete(entry)
    except BaseException as exc:
        released = model_budget_entry(out) == entry  # the model was renamed into place before exc
        if isinstance(exc, KeyboardInterrupt):
            why = "interrupted (SIGTERM)" if interrupt_signal() == signal.SIGTERM else "interrupted (Ctrl-C)"
        else:
            why = f"{exc.__class__.__name__}: {exc}"
        if released:
            budget.complete(entry)
        elif checkpoint:
            budget.spent(entry, f"{why}; counted as spent: checkpoints were written to {checkpoint}")
        else:
            budget.fail(entry, why)
        if isinstance(exc, KeyboardInterrupt):
            if released:
                msg = f"interrupted after the model was written to {out} and its budget recorded"
            elif checkpoint:
                msg = (f"interrupted before the model was written; the checkpoints in {checkpoint} count as "
                       f"released, so the budget reservation {entry} in {budget.path} stays spent")
            else:
                msg = (f"interrupted before anything was released; the budget reservation {entry} in "
                       f"{budget.path} was marked failed")
            raise Interrupted(msg) from None
        raise
    return fitted, seconds, stale


def check_local_solve(fitted, out: str) -> None:
    """Refuse a fitted model whose users' local solve is not finite, before anything is written.

    Its arrays may be finite (``save_model`` checks them) while every user's solve on it overflows (``ials`` with
    confidences near float64's largest): found only by the evaluation after the write, such a model was left in place, its
    budget entry complete, behind an error exit. A probe user who rates the first items at both ends of the
    rating range (1 where the model has none: counts), and one who rates a single item, are solved here, as her device would (post-processing).
    """
    n = len(fitted.item_ids)
    if n == 0:
        return
    m = Model(path=out, item_factors=np.asarray(fitted.item_factors, np.float32),
              item_bias=np.asarray(fitted.item_bias, np.float32), item_ids=np.asarray(fitted.item_ids),
              global_mean=float(fitted.global_mean), info=fitted.model_info, ledger=fitted.ledger,
              extras=fitted.extras)
    lo, hi = rating_range(m)
    ends = [hi, lo] if math.isfinite(lo) and math.isfinite(hi) else [1.0]
    if (m.info.get("local_implicit") or {}).get("implicit"):  # counts: each > 0
        ends = [v if v > 0 else 1.0 for v in ends]
    try:  # the model's own ridge, or where it records none usable (sgld: 0) the one a user would have to pass
        model_ridge(m)
        ridge = None
    except ParameterError:
        ridge = FALLBACK_RIDGE
    try:  # a user of one item and one of more items than factors (ials solves them by two routes)
        for k in sorted({1, min(n, int(np.shape(fitted.item_factors)[1]) + 2)}):
            user_scores(m, np.arange(k, dtype=np.int32), np.resize(np.asarray(ends, np.float32), k), ridge=ridge)
    except InputError as exc:
        if "not finite" not in str(exc):
            raise
        raise StreamdpError(f"{out}: the fitted model's local solve is not finite (NaN or infinity): its settings "
                            f"overflow float64 arithmetic; nothing was written") from None


def run_summary(st, m, fitted, out, seconds, *, epsilon, delta, seed, stale, evaluate_test, workers,
             memory_limit, scheduler=None, k: int = DEFAULT_K, ranking_users=DEFAULT_RANKING_USERS) -> dict:
    led = fitted.ledger
    acc = getattr(led, "accounting", None)
    info = fitted.model_info
    released = bool(info.get("factors_released", fitted.item_factors.size and np.any(fitted.item_factors)))
    summary = {
        "method": m.name,
        "epsilon": epsilon if math.isfinite(epsilon) else "inf",
        "delta": delta if led.guarantee != GUARANTEE_NONE else None,  # no delta without a DP guarantee
        "rank": info.get("rank", m.rank),  # ials chooses its private rank on released counts (model.json)
        "factors_released": released,
        "effective_rank": int(fitted.item_factors.shape[1]) if released else 0,
        "guarantee": led.guarantee,
        "epsilon_spent": (acc.epsilon if acc is not None else ("inf" if not math.isfinite(epsilon) else 0.0)),
        "seeded": seed is not None,
        "train_seconds": round(seconds, 3),
        "out": out,
    }
    if getattr(m, "catalogue", None) is not None:
        summary["items"] = m.catalogue.describe()
        if getattr(m.catalogue, "range", None) is not None:
            summary["rating_range"] = m.catalogue.range.describe()
    rr = info.get("rating_range") or {}
    if "rating_range" not in summary and rr.get("source") == "public users":  # public-private on an undeclared range
        summary["rating_range"] = (f"[{rr['min']:g}, {rr['max']:g}] the public users' lowest and highest training "
                                   f"rating (public data, nothing spent)")
    if "data_window" in info:
        summary["data_window"] = info["data_window"]
    if "warm_start" in info:
        summary["warm_start"] = {k: v for k, v in info["warm_start"].items() if k != "privacy"}
        summary["iterations_run"] = info.get("iterations_run")
    if "lists" in info:  # the lists part (streamdp.methods._lists): its share, whether the lists are its, why
        summary["lists_part"] = {k: v for k, v in info["lists"].items() if k not in ("model", "extras", "global_mean")}
    if (why := (info.get("selection") or {}).get("why")) is not None:  # ials: the factors or the chart, and why
        summary["release_choice"] = why
    if fitted.owner:
        summary["owner"] = fitted.owner
    if stale:
        summary["stale_runs_removed"] = stale
    if evaluate_test and st.has_test:
        ev = evaluate_model(out, st, workers=workers, scheduler=scheduler, memory_limit=memory_limit, baselines=True,
                            k=k, ranking_users="all" if ranking_users is None else ranking_users)
        if "item_statistics" in ev:  # recorded in the store, or (a store written before) a pass of their own
            summary["item_statistics"] = ev["item_statistics"]
        if ev.get("lists_only"):  # counts, or an implicit model's scores: ranking metrics only (streamdp.evaluate)
            if ev.get("implicit"):
                summary["test_interactions"] = ev["n_interactions"]
            else:
                summary["test_ratings"] = ev["n_ratings"]
            summary["ranking"] = ev["ranking"]
            summary["ranking_verdict"] = ev["ranking_verdict"]
            summary["privacy_warnings"] = privacy_warnings(led)
            return summary
        summary["test_rmse"] = ev["rmse"]
        summary["test_mae"] = ev["mae"]
        summary["test_ratings"] = ev["n_ratings"]
        summary["baselines"] = {k: {"rmse": b["rmse"], "mae": b["mae"]} for k, b in ev["baselines"].items()}
        summary["verdict"] = ev["verdict"]
        summary["ranking"] = ev["ranking"]
        summary["ranking_verdict"] = ev["ranking_verdict"]
    summary["privacy_warnings"] = privacy_warnings(led)
    return summary


# -- the library side of `streamdp lowrank` ----------------------------------------------------------------------------
def lowrank(store, *, rank: int, epsilon: float, delta: float, out: str, seed: int | None = None,
            workers: int | None = None, memory_limit=None, over_budget: bool = False, force: bool = False,
            scheduler=None, state: str | None = None, **options) -> dict:
    """Release a private rank-``rank`` approximation's item side from ``store`` into ``out``; return a summary.

    The model directory (``privacy.json``, ``model.json``, ``factors.zarr`` with
    ``basis``, ``singular_values`` and, for measurements, ``noisy_projection``) is
    written atomically, after the release is reserved in the store's budget
    (:func:`release`, as ``train`` does). Options: those of
    :class:`~streamdp.methods.lowrank.LowRank` (``mechanism``, ``oversampling``, ``clip``, ``sketch_share``,
    ``prune``, ``power_iters``). ``scheduler`` and ``state`` as for ``train``. The number of users is public
    under this method's relation (users fixed, :data:`~streamdp.methods.lowrank.RELATION_COVERS`): exact; so are the
    items. A private run on a store whose rating range was not declared selects it privately first
    (:mod:`streamdp.privacy.rating_range`), as ``train`` does.
    """
    epsilon = parse_epsilon(epsilon)
    check_model_destination(str(out), force)
    store = store if isinstance(store, RatingStore) else open_store(store)
    LowRank.check_store(store)
    store.check_chunks()  # a damaged store fails here, before the range's pass
    check_privacy_params(epsilon, delta)
    store, cat = catalogue_and_range_for(LowRank, store, epsilon=epsilon, delta=delta, seed=seed)
    st, m = prepare(store, method=LowRank, out=out, epsilon=epsilon, delta=delta, rank=rank, seed=seed, force=force,
                    catalogue=cat if cat.range is not None else None, **options)
    fitted, seconds, stale = release(st, m, out, workers=workers, memory_limit=memory_limit, scheduler=scheduler,
                                     over_budget=over_budget, force=force, state=state)
    led, info = fitted.ledger, fitted.model_info
    acc = led.accounting
    summary = {
        "method": "lowrank", "mechanism": info["mechanism"], "rank": info["rank"],
        "columns": info["parameters"]["columns"], "n_users": m.n_users(st), "n_items": st.n_items,
        "epsilon": epsilon if math.isfinite(epsilon) else "inf", "delta": delta,
        "epsilon_spent": acc.epsilon if acc is not None else "inf",
        "guarantee": led.guarantee, "neighbouring_relation": led.relation,
        "clip_L": info["parameters"]["clip"], "released": info["released"], "not_released": info["not_released"],
        "singular_values": [float(x) for x in fitted.extras["singular_values"]],
        "seeded": seed is not None, "seconds": round(seconds, 3), "out": str(out),
    }
    warnings = privacy_warnings(led)
    if m.private:
        summary["epsilon_replace_one"] = led.bounds["epsilon_replace_one"]
        summary["relation_covers"] = led.bounds["relation_covers"]
        summary["weaker_than_user_level"] = True
        warnings.insert(0, WEAKER_NOTE)
    if stale:
        summary["stale_runs_removed"] = stale
    summary["privacy_warnings"] = warnings
    return summary
