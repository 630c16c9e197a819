"""``streamdp sweep``: test RMSE, Recall@10 and NDCG@10 against epsilon for several methods, with the privacy it costs.

Each ``(method, epsilon, repeat)`` is one ``streamdp train`` run (:func:`streamdp.workflows.api.train`):
a release, reserved in the store's privacy budget like any other, its model kept under
``OUT/models/``. The total spend of the whole sweep is computed **before** anything
runs, by composing the planned ledgers of every point with the store's counted
releases (PLD accountant at the budget's delta, basic composition beside it), printed,
and checked against the store's budget; ``--dry-run`` stops there.

Outputs (written into ``OUT``, created or, with ``--force``, replacing an earlier sweep):
``results.csv`` (one row per run, with its Recall@10 and NDCG@10), ``results.json``
(rows, per-point mean and spread, the non-private baselines, the spend) and
``rmse_vs_epsilon.png`` (log epsilon axis, one line per method with error bars from
repeats, the non-private item-mean baseline and each method's non-private RMSE as
horizontal lines; two more panels the same for Recall@10 and NDCG@10, with the most-popular lists as
horizontal lines: by the released counts and non-private; needs the ``plot`` extra).

A list method (``ials``: its scores rank items and are not ratings) has no test RMSE: its rows leave
``test_rmse`` empty (``None``; never a number made up) and it is drawn in the Recall and NDCG panels
only; a sweep of list methods alone (an implicit store's) has no RMSE panel. :func:`rehearse` takes list methods
too (the synthetic users then have tastes: :data:`LIST_TASTES`).
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import statistics
import time

from streamdp.errors import BudgetExceededError, ParameterError
from streamdp.methods import get_method
from streamdp.outputs import check_destination
from streamdp.privacy.accountant import check_calibratable, check_privacy_params, parse_epsilon
from streamdp.privacy.budget import StoreBudget
from streamdp.privacy.ledger import atomic_write_json
from streamdp.privacy.params import default_delta
from streamdp.privacy.users import check_users_bound, release_user_count
from streamdp.storage.fingerprint import store_fingerprint
from streamdp.storage.store import RatingStore, open_store
from streamdp.storage.timeline import check_contributions, data_period, period_users
from streamdp.stream.engine import dask_session
from streamdp.workflows.api import train
from streamdp.workflows.rehearse import REHEARSAL_NOTE, check_like, generate_like

__all__ = ["sweep", "rehearse", "replot", "parse_epsilons", "format_spend", "format_table"]

RESULTS_CSV = "results.csv"
RESULTS_JSON = "results.json"
PLOT_PNG = "rmse_vs_epsilon.png"
SWEEP_MARKER = ".streamdp-sweep"
#: A rehearsal's synthetic store, inside its sweep directory.
SYNTHETIC = "synthetic.zarr"
#: A rehearsal of a list method: the synthetic users' tastes (``generate --taste-clusters/--taste-strength``), so that
#: which items a user picks depends on her taste and not on popularity alone (``bench/ranking.py``'s shapes').
LIST_TASTES = {"taste_clusters": 20, "taste_strength": 2.0}
TASTES_SOURCE = ("the generator's assumption (bench/ranking.py's shapes): no release says how personal the "
                 "store's choices are, so the lists' gain over the chart is the regime's, not the store's")


def parse_epsilons(text: str) -> list[float]:
    """``"0.1,1,inf"`` -> ``[0.1, 1.0, inf]``; each must be > 0 (``inf``: non-private).

    >>> parse_epsilons("1, 0.5,inf")
    [1.0, 0.5, inf]
    """
    out = []
    for part in str(text).split(","):
        part = part.strip()
        try:
            e = float(part)
        except ValueError:
            raise ParameterError(f"--epsilons: {part!r} is not a number (use e.g. 0.5,1,inf)") from None
        e = parse_epsilon(part, "--epsilons")  # only the literal inf is infinite (1e309 is an error)
        if not e > 0:
            raise ParameterError(f"--epsilons: every epsilon must be > 0 (or inf), got {part}")
        check_calibratable(e, "--epsilons")
        out.append(e)
    if not out:
        raise ParameterError("--epsilons: give at least one epsilon")
    return out


def _is_sweep_dir(path) -> bool:
    return os.path.isfile(os.path.join(path, SWEEP_MARKER))


def _name(e: float) -> str:
    return "inf" if math.isinf(e) else f"{e:g}"


def rehearse(store, *, out: str, users: int | None = None, ratings_per_user: float | None = None,
             shape_epsilon: float | None = None, over_budget: bool = False, force: bool = False, echo=None,
             seed: int | None = None, dry_run: bool = False, synthetic_seed: int = 0, **options) -> dict:
    """The sweep on a synthetic store shaped like ``store`` (:mod:`streamdp.workflows.rehearse`), kept in ``OUT/synthetic.zarr``.

    ``store``'s ratings are never read and its budget is left as it was, unless a shape statistic it has not
    released must be (``users`` / ``ratings_per_user`` avoid it; ``shape_epsilon`` its cost, ``over_budget`` past
    the budget): then that one release is charged to it, and said. The sweep's releases are charged to the
    synthetic store's own budget. ``synthetic_seed``: the generator's (its default, 0, as ``streamdp generate``'s;
    ``seed`` seeds the runs, as in :func:`sweep`). ``options``: :func:`sweep`'s. With a list method among them the
    synthetic users get :data:`LIST_TASTES` (said, and recorded under ``rehearsal["tastes"]``). Returns the results,
    with ``rehearsal``.
    """
    say = echo or (lambda *a, **k: None)
    period = [f for f in ("since", "until", "window", "until_segment") if options.get(f) is not None]
    if period:
        raise ParameterError(f"--{period[0].replace('_', '-')}: a rehearsal is shaped by numbers released of the "
                             f"whole store, not of a period; sweep the period itself (without --rehearse)")
    if dry_run:
        raise ParameterError("--dry-run: a rehearsal spends nothing of the store's (it says so if it must release "
                             "its shape first); leave --dry-run out, or dry-run the real sweep without --rehearse")
    st = store if isinstance(store, RatingStore) else open_store(store)
    # everything is checked before the banner and before a shape statistic is charged (a typo then costs nothing)
    if not st.has_test:  # the synthetic store takes its test fraction from STORE: a sweep needs one
        raise ParameterError(f"{st.path}: a sweep needs a test split, and a rehearsal takes STORE's test fraction "
                             f"(ingest or generate with --test-fraction)")
    if not float((st.attrs.get("params") or {}).get("test_fraction") or 0.0) > 0:
        raise ParameterError(f"{st.path}: its test split came as a file (ingest --train/--test), so it has no test "
                             f"fraction for the synthetic store to take, and a sweep needs a test split; sweep "
                             f"STORE itself, or rehearse a store ingested with --test-fraction")
    check_like(st, users=users, ratings_per_user=ratings_per_user, shape_epsilon=shape_epsilon)
    methods = _check_run_options(st, options)
    tastes = dict(LIST_TASTES) if any(is_list_method(m) for m in methods) else {}
    check_destination(out, force, what="sweep directory", is_ours=_is_sweep_dir)
    say(REHEARSAL_NOTE.format(store=st.path))
    prepare_out(out, force)
    try:
        syn = generate_like(st, os.path.join(out, SYNTHETIC), users=users, ratings_per_user=ratings_per_user,
                            shape_epsilon=shape_epsilon, over_budget=over_budget, echo=say,
                            seed=int(synthetic_seed), show_progress=False, **tastes)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    if tastes:
        say(f"  tastes (lists): {tastes['taste_clusters']} clusters of strength {tastes['taste_strength']:g}, "
            f"{TASTES_SOURCE}")
    like = syn.attrs["params"]["like"]
    shape = like["shape"]
    say(f"the spend below is the synthetic store's ({syn.path}); {st.path}'s budget is not charged for the sweep")
    # STORE named by its keyed fingerprint (the rehearsal's shape statistics were released: it has a key), never by
    # its checksum, an unkeyed hash of its ratings (docs/privacy.md)
    rehearsal = {"like": st.path, "like_fingerprint": like.get("store_fingerprint"), "synthetic_store": syn.path,
                 "n_users": shape["n_users"], "ratings_per_user": shape["ratings_per_user"], "items": like["items"],
                 "spread": {k: v for k, v in like["spread"].items() if k != "rounds"},
                 **({"tastes": {**tastes, "source": TASTES_SOURCE}} if tastes else {})}
    res = sweep(syn, out=out, seed=seed, echo=echo, prepared=True, rehearsal=rehearsal, **options)
    say(f"REHEARSAL: the curve above is on synthetic data shaped like {st.path}, not on its ratings")
    return res


def _check_run_options(st, options: dict) -> list[str]:
    """What :func:`sweep` would refuse of ``options`` once the synthetic store exists, checked on STORE first:
    methods, epsilons, repeats, delta's range, users_bound, rank and the methods' options (STORE and its synthetic
    twin share their public parameters). Builds no plan and releases nothing; returns the methods."""
    methods, epsilons = check_points(st, options.get("methods", ""), options.get("epsilons", ""),
                                     options.get("repeats", 1))
    check_users_bound(options.get("users_bound"))
    delta = options.get("delta")
    if delta is not None:
        check_privacy_params(1.0, delta)
    for m in methods:
        for e in epsilons:  # a method's own refusals (sgd: only inf) too
            get_method(m)(epsilon=e, delta=1e-6 if delta is None else float(delta),
                          rank=options.get("rank")).check_rank(st.n_items)
    return methods


def planned_spend(store, points, *, delta, rank, seed, users=None) -> dict:
    """The store's spend if every point of the sweep is released: before, after, and the sweep alone."""
    ledgers = []
    for method, eps, r in points:
        m = get_method(method)(epsilon=eps, delta=delta, rank=rank, seed=None if seed is None else seed + r,
                               users=users if users is not None and get_method(method).RELEASES_USER_COUNT else None)
        ledgers.append(m.planned_ledger(store).to_dict())
    b = StoreBudget(store.path)
    private = [d for d in ledgers if math.isfinite(float(d["epsilon"]))]
    out = b.preview(private)  # the private points' spend, as printed
    out["non_private_runs"] = len(ledgers) - len(private)
    if out["non_private_runs"]:  # a non-private run is a release of infinite epsilon: it counts against a budget
        out["within_budget"] = b.preview(ledgers)["within_budget"]
    return out


def format_spend(p: dict) -> str:
    """The lines ``--dry-run`` prints."""
    s, a, b = p["sweep"], p["after"], p["before"]
    lines = [f"the sweep releases {s['n_releases']} private model(s): epsilon {_fmt(s['epsilon'])} at delta "
             f"{s['delta']:.3g} ({s['accountant']}; basic composition {_fmt(s['epsilon_basic'])})"]
    if p.get("non_private_runs"):
        lines.append(f"and {p['non_private_runs']} non-private model(s) (epsilon inf: no privacy for the store's "
                     f"users; the budget counts them as unlimited spend)")
    lines.append(f"the store's spend: epsilon {_fmt(b['epsilon'])} now, {_fmt(a['epsilon'])} after the private "
                 f"models" + (" (inf with the non-private ones)" if p.get("non_private_runs") else ""))
    if p["budget"] is not None:
        lines.append(f"the store's budget: epsilon {_fmt(p['budget']['epsilon'])} at delta "
                     f"{p['budget']['delta']:.3g}: " + ("within it" if p["within_budget"] else "EXCEEDED"))
    else:
        lines.append("the store has no budget set (streamdp budget STORE --set E,D)")
    return "\n".join(lines)


def _fmt(x) -> str:
    return "inf" if isinstance(x, float) and math.isinf(x) else f"{x:.4g}"


def sweep(store, *, methods, epsilons, out: str, repeats: int = 1, seed: int | None = None,
          delta: float | None = None, rank: int | None = None, workers=None, memory_limit=None, scheduler=None,
          state: str | None = None, over_budget: bool = False, dry_run: bool = False, force: bool = False,
          echo=None, users_bound: int | None = None, prepared: bool = False, rehearsal: dict | None = None,
          confirm_infinite=None, since=None, until=None, window=None, until_segment=None) -> dict:
    """Train and evaluate every (method, epsilon) ``repeats`` times; write the results and the plot.

    ``scheduler`` and ``state`` as for ``train`` (docs/cluster.md): every run's passes and
    evaluation go there; ``"dask"``/``"processes"`` start one client for the whole sweep.

    The number of users (the default delta, every run's defaults) is released once, at
    the sweep's smallest finite epsilon, or declared with ``users_bound``
    (:mod:`streamdp.privacy.users`); every model carries it and its ledger counts its
    release (so the store's budget counts it once per model: more than was spent).

    ``prepared``: ``out`` was made by :func:`prepare_out` already (a rehearsal keeps its synthetic store there);
    ``rehearsal``: what :func:`rehearse` records in the results (the plot and table then say so);
    ``confirm_infinite``: called, once the sweep is checked and before anything is released, when it has an ``inf``
    point (the CLI's confirmation; it raises to stop).

    ``since``/``until``/``window``, ``until_segment``: every run trains and is evaluated on that period of the store
    only, as ``train`` (:func:`streamdp.storage.timeline.data_period`; the count is of the period's users), recorded
    as ``data_window`` in every model and in the results. On a store with a per-user budget the runs go through
    ``train``'s filter (:func:`~streamdp.workflows.training.filtered_store`), checked for every method before
    anything is released, and ``users_bound`` is required (:func:`_check_user_budget`).

    Returns the ``results.json`` content (with ``dry_run: true`` and no rows for a dry run).
    """
    say = echo or (lambda *a, **k: None)
    st = store if isinstance(store, RatingStore) else open_store(store)
    if not st.has_test:
        raise ParameterError(f"{st.path}: a sweep needs a test split (ingest or generate with --test-fraction)")
    methods, epsilons = check_points(st, methods, epsilons, repeats)
    st = data_period(st, since=since, until=until, window=window, until_segment=until_segment)
    check_contributions(st)  # an empty period: refused before anything is released
    _check_user_budget(st, methods, epsilons, users_bound)
    finite = [e for e in epsilons if math.isfinite(e)]
    users = release_user_count(period_users(st), epsilon=min(finite) if finite else math.inf, seed=seed,
                               users_bound=users_bound)
    delta = default_delta(users.n) if delta is None else float(delta)
    points = [(m, e, r) for m in methods for e in epsilons for r in range(int(repeats) if math.isfinite(e) else 1)]
    spend = planned_spend(st, points, delta=delta, rank=rank, seed=seed, users=users)
    say(format_spend(spend))
    # the store named by its keyed fingerprint (None until its first release makes its key), never by its checksum
    result = {"store": st.path, "store_fingerprint": store_fingerprint(st, create=False), "methods": methods,
              "epsilons": [_name(e) for e in epsilons], "repeats": int(repeats), "delta": delta, "spend": spend,
              **({"data_window": st.data_window} if getattr(st, "data_window", None) else {}),
              **({"rehearsal": rehearsal} if rehearsal else {})}
    if dry_run:
        return {**result, "dry_run": True, "rows": []}
    if confirm_infinite is not None and any(math.isinf(e) for e in epsilons):
        confirm_infinite()
    if not spend["within_budget"] and not over_budget:
        raise BudgetExceededError(f"{st.path}: the sweep would take the store's spend to epsilon "
                                  f"{_fmt(spend['after']['epsilon'])}, past its budget epsilon "
                                  f"{_fmt(spend['budget']['epsilon'])}; see --dry-run, or pass --over-budget")
    if not prepared:
        prepare_out(out, force)
    rows, baselines, ranking_baselines = [], None, None
    t0 = time.perf_counter()
    with dask_session(scheduler, workers) as client:
        for i, (m, e, r) in enumerate(points, 1):
            model_dir = os.path.join(out, "models", f"{m}-eps{_name(e)}-r{r}")
            model = train(st, method=m, epsilon=e, delta=delta, out=model_dir, rank=rank,
                          seed=None if seed is None else seed + r, workers=workers, memory_limit=memory_limit,
                          scheduler=client, state=state, over_budget=over_budget, users=users,
                          users_bound=users_bound,  # a declared count: the per-user filter charges no count stage
                          allow_nonprivate=True)  # an inf point: confirm_infinite asked above
            s = model.summary
            baselines = baselines or s.get("baselines")
            rk = s.get("ranking") or {}
            if rk.get("baselines"):
                ranking_baselines = {k: {"recall": v["recall"], "ndcg": v["ndcg"], "guarantee": v["guarantee"]}
                                     for k, v in rk["baselines"].items()}
                ranking_baselines["k"] = rk["k"]
            rows.append(_row(m, e, r, model, model_dir))
            say(f"[{i}/{len(points)}] {m} epsilon {_name(e)} repeat {r}: " + point_line(rows[-1], s))
    summary = _aggregate(rows)
    result.update(dry_run=False, store_fingerprint=store_fingerprint(st, create=False), rows=rows, summary=summary,
                  baselines=baselines, ranking_baselines=ranking_baselines,
                  seconds=round(time.perf_counter() - t0, 2))
    _write(out, result)
    result["plot"] = plot(result, os.path.join(out, PLOT_PNG))
    return result


def _check_user_budget(st, methods, epsilons, users_bound) -> None:
    """On a store with a per-user budget, refuse (one line, before anything is released) what ``train`` would refuse
    of any point (:func:`~streamdp.workflows.training.filtered_store`: a non-private point, an undeclared catalogue or
    rating range, a period whose users are all retired), and a sweep without ``users_bound``.

    Decision: the sweep shares one count of users across its runs, released once, while the filter charges each
    run's own users, who change as users retire: no run could charge that one count to the users it counted, so the
    count is declared (``--users-bound``: public, nothing released) instead.
    """
    from streamdp.workflows.training import filtered_store

    if not st.local or StoreBudget(st.path).user_budget() is None:
        return
    if any(math.isinf(e) for e in epsilons):
        raise ParameterError(f"--epsilons inf: {st.path} has a per-user budget; a non-private model would cross "
                             f"every user's cap")
    for m in methods:
        filtered_store(st, get_method(m), epsilon=max(epsilons), users_bound=users_bound)
    if users_bound is None:
        raise ParameterError(f"{st.path} has a per-user budget: give --users-bound N (a public bound on its number "
                             f"of users); a sweep shares one count of users across its runs, which the per-user "
                             f"filter cannot charge to each run's users")


def check_points(st, methods, epsilons, repeats) -> tuple[list[str], list[float]]:
    """``(methods, epsilons)`` of a sweep on ``st``, checked (one-line :class:`ParameterError` otherwise): known
    methods that train on ``st`` and have a test RMSE, epsilons > 0 (or inf), a positive number of repeats.
    Reads no rating and releases nothing, so a rehearsal runs it before it charges anything."""
    methods = [m.strip() for m in (methods.split(",") if isinstance(methods, str) else methods) if m.strip()]
    if not methods:
        raise ParameterError("--methods: give at least one method")
    for m in methods:
        get_method(m).check_store(st)
    rated = [m for m in methods if not is_list_method(m)]
    if st.implicit and rated:  # a rating method that trains on counts passed check_store: its points are RMSEs
        raise ParameterError(f"{st.path}: an implicit store has no ratings and so no test RMSE, which --methods "
                             f"{rated[0]} is plotted by; sweep a list method (--methods ials: Recall@10 and "
                             f"NDCG@10 against epsilon)")
    epsilons = parse_epsilons(epsilons) if isinstance(epsilons, str) else [parse_epsilon(e, "--epsilons")
                                                                           for e in epsilons]
    if isinstance(repeats, bool) or int(repeats) != repeats or repeats < 1:
        raise ParameterError(f"--repeats must be a positive integer, got {repeats}")
    return methods, epsilons


def is_list_method(name: str) -> bool:
    """Whether a method's scores rank items and are not ratings (``ials``): its sweep points are Recall@k and
    NDCG@k, with no test RMSE."""
    return get_method(name).LOCAL_SOLVER == "implicit"


def prepare_out(out: str, force: bool) -> None:
    """Make the sweep directory ``out`` (an earlier sweep's replaced with ``force``; anything else refused)."""
    check_destination(out, force, what="sweep directory", is_ours=_is_sweep_dir)
    if os.path.isdir(out) and force:
        shutil.rmtree(out)
    os.makedirs(os.path.join(out, "models"))
    with open(os.path.join(out, SWEEP_MARKER), "w") as f:
        f.write("streamdp sweep output\n")


def _row(m, e, r, model, model_dir) -> dict:
    s = model.summary
    rk = s.get("ranking") or {}
    # a list method (ials) has no test RMSE nor rating verdict: left empty (None), never a number
    return {"method": m, "epsilon": _name(e), "repeat": r, "test_rmse": s.get("test_rmse"),
            "test_mae": s.get("test_mae"), "recall_at_k": rk.get("recall"), "ndcg_at_k": rk.get("ndcg"),
            "epsilon_spent": s["epsilon_spent"], "guarantee": s["guarantee"],
            "better_than_baselines": (s.get("verdict") or {}).get("better"), "seconds": s["train_seconds"],
            "model": model_dir}


def point_line(row: dict, summary: dict) -> str:
    """A point's test RMSE beside the damped item mean's and its Recall@k beside the most-popular list's (the
    non-private references ``train``'s summary compares against), and its NDCG@k.

    >>> point_line({"test_rmse": 0.95, "recall_at_k": 0.3, "ndcg_at_k": 0.2},
    ...            {"baselines": {"damped_item_mean": {"rmse": 1.0}},
    ...             "ranking": {"k": 10, "baselines": {"popularity": {"recall": 0.25}}}})
    'test RMSE 0.9500 (damped item mean 1.0000), Recall@10 0.3000 (most popular 0.2500), NDCG@10 0.2000'
    """
    b = (summary.get("baselines") or {}).get("damped_item_mean")
    parts = []
    if row.get("test_rmse") is not None:
        parts.append(f"test RMSE {row['test_rmse']:.4f}" + (f" (damped item mean {b['rmse']:.4f})" if b else ""))
    rk = summary.get("ranking") or {}
    if rk and row.get("recall_at_k") is not None:
        pop = (rk.get("baselines") or {}).get("popularity")
        parts.append(f"Recall@{rk['k']} {row['recall_at_k']:.4f}" + (f" (most popular {pop['recall']:.4f})" if pop
                                                                      else "")
                     + f", NDCG@{rk['k']} {row['ndcg_at_k']:.4f}")
    return ", ".join(parts) or "no test RMSE and no lists measured"


def _aggregate(rows) -> list[dict]:
    groups: dict = {}
    for row in rows:
        groups.setdefault((row["method"], row["epsilon"]), []).append(row)
    out = []
    for (m, e), g in groups.items():
        d = {"method": m, "epsilon": e, "n": len(g)}
        v = [row["test_rmse"] for row in g if row.get("test_rmse") is not None]  # none for a list method
        if v:
            d.update(rmse_mean=statistics.fmean(v), rmse_std=statistics.stdev(v) if len(v) > 1 else 0.0,
                     rmse_min=min(v), rmse_max=max(v))
        for key in ("ndcg", "recall"):
            v = [row[f"{key}_at_k"] for row in g if row.get(f"{key}_at_k") is not None]
            if v:
                d[f"{key}_mean"] = statistics.fmean(v)
                d[f"{key}_std"] = statistics.stdev(v) if len(v) > 1 else 0.0
        out.append(d)
    return out


def format_table(result: dict) -> str:
    """The table a sweep ends with (and ``--replot`` prints again): each point's mean test RMSE and its spread,
    Recall@k and NDCG@k, then the non-private baselines they are to be compared with."""
    rb = result.get("ranking_baselines") or {}
    k = rb.get("k", 10)
    reh = result.get("rehearsal") or {}
    tastes = reh.get("tastes")
    lines = [("REHEARSAL on synthetic data shaped like " + reh["like"] + "\n" if reh else "")
             + (f"(rehearsal lists: synthetic tastes, {tastes['taste_clusters']} clusters of strength "
                f"{tastes['taste_strength']:g}: the generator's assumption)\n" if tastes else "")
             + f"{'method':<10} {'epsilon':>8} {'n':>3}  {'test RMSE (mean +- std)':<24} {'Recall@' + str(k):>9} "
               f"{'NDCG@' + str(k):>8}"]
    order = {m: i for i, m in enumerate(result["methods"])}

    def eps_key(s):
        return math.inf if s["epsilon"] == "inf" else float(s["epsilon"])

    for s in sorted(result["summary"], key=lambda s: (order.get(s["method"], 0), eps_key(s))):
        rec = f"{s['recall_mean']:.4f}" if "recall_mean" in s else "-"
        nd = f"{s['ndcg_mean']:.4f}" if "ndcg_mean" in s else "-"
        rmse = f"{s['rmse_mean']:.4f} +- {s['rmse_std']:.4f}" if "rmse_mean" in s else "- (lists only)"
        lines.append(f"{s['method']:<10} {s['epsilon']:>8} {s['n']:>3}  {rmse:<24} {rec:>9} {nd:>8}")
    b = result.get("baselines") or {}
    refs = [f"{label} RMSE {b[key]['rmse']:.4f}" for key, label in
            (("damped_item_mean", "damped item mean"), ("item_mean", "item mean")) if key in b]
    refs += [f"{label} Recall@{k} {rb[key]['recall']:.4f}" for key, label in
             (("popularity", "most popular"), ("private_popularity", "most popular by released counts"))
             if key in rb]
    if refs:
        lines.append("non-private baselines: " + ", ".join(refs))
    return "\n".join(lines)


def replot(results: str, echo=None) -> dict:
    """Redraw the plot of a finished sweep from its ``results.json`` (written beside it) and print its table:
    nothing is trained, no store or budget is opened. Returns the results with ``plot`` (None without
    matplotlib)."""
    say = echo or (lambda *a, **k: None)
    path = os.path.join(results, RESULTS_JSON) if os.path.isdir(results) else results
    try:
        with open(path) as f:
            result = json.load(f)
    except OSError as exc:
        raise ParameterError(f"--replot {results}: cannot read it ({exc.strerror})") from None
    except ValueError as exc:
        raise ParameterError(f"--replot {path}: not JSON ({exc})") from None
    if not isinstance(result, dict) or result.get("dry_run") or not all(
            k in result for k in ("methods", "summary", "store", "delta", "repeats")):
        raise ParameterError(f"--replot {path}: not the results.json of a finished sweep")
    say(format_table(result))
    result["plot"] = plot(result, os.path.join(os.path.dirname(os.path.abspath(path)), PLOT_PNG))
    return result


def _write(out, result) -> None:
    tmp = os.path.join(out, RESULTS_CSV + ".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(result["rows"][0]))
        w.writeheader()
        w.writerows(result["rows"])
    os.replace(tmp, os.path.join(out, RESULTS_CSV))
    atomic_write_json(os.path.join(out, RESULTS_JSON), result)


def plot(result: dict, path: str) -> str | None:
    """The RMSE-vs-epsilon figure (PNG), with Recall@k- and NDCG@k-vs-epsilon panels below it when the runs were
    ranked (a sweep of list methods alone: those two panels only); ``None`` when matplotlib (the ``plot`` extra) is
    absent."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    finite = sorted({float(s["epsilon"]) for s in result["summary"] if s["epsilon"] != "inf"})
    listed = [key for key in ("recall", "ndcg") if any(f"{key}_mean" in s for s in result["summary"])]
    ranked = bool(listed)
    rated = any("rmse_mean" in s for s in result["summary"]) or not ranked  # list methods alone: no RMSE panel
    n = int(rated) + len(listed)
    fig, axes = plt.subplots(n, 1, figsize=(9, 4.25 * n if n > 1 else 4.5), squeeze=False)
    panels = iter(ax[0] for ax in axes)
    if rated:
        b = result.get("baselines") or {}
        lines = [(b[key]["rmse"], f"{label}, non-private", style) for key, label, style in
                 (("item_mean", "item mean", "--"), ("damped_item_mean", "damped item mean", "-."),
                  ("user_item_bias", "user+item bias", (0, (1, 3)))) if key in b]
        _panel(plt, next(panels), result, finite, "rmse", "test RMSE", lines)
    if ranked:
        rb = result.get("ranking_baselines") or {}
        k = rb.get("k", 10)
        for key in listed:
            label = f"test {'Recall' if key == 'recall' else 'NDCG'}@{k} (unrated items)"
            lines = [(rb[b_][key], what, style) for b_, what, style in
                     (("private_popularity", "most popular by released counts", "--"),
                      ("popularity", "most popular, non-private", "-.")) if b_ in rb and key in rb[b_]]
            _panel(plt, next(panels), result, finite, key, label, lines)
    rehearsal = (f"REHEARSAL on synthetic data shaped like {os.path.basename(result['rehearsal']['like'].rstrip('/'))}"
                 "\n" if result.get("rehearsal") else "")
    what = " and ".join((["test RMSE"] if rated else []) + (["Recall and NDCG"] if ranked else []))
    axes[0][0].set_title(rehearsal + f"{os.path.basename(result['store'].rstrip('/'))}: {what} vs epsilon "
                         f"(delta {result['delta']:.0e}, {result['repeats']} repeat(s))")
    fig.tight_layout()
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def _panel(plt, ax, result, finite, key, ylabel, baselines) -> None:
    """One panel: each method's mean ``key`` against epsilon (error bars from repeats), its non-private value and
    the ``(value, label, linestyle)`` baselines as horizontal lines."""
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, m in enumerate(result["methods"]):
        pts = sorted((float(s["epsilon"]), s[f"{key}_mean"], s[f"{key}_std"]) for s in result["summary"]
                     if s["method"] == m and s["epsilon"] != "inf" and f"{key}_mean" in s)
        c = colors[i % len(colors)]
        if pts:
            x, y, err = zip(*pts)
            ax.errorbar(x, y, yerr=err, marker="o", capsize=3, color=c, label=f"{m} (private)")
        inf = [s for s in result["summary"] if s["method"] == m and s["epsilon"] == "inf" and f"{key}_mean" in s]
        if inf:
            ax.axhline(inf[0][f"{key}_mean"], color=c, linestyle=":", linewidth=1,
                       label=f"{m} non-private ({inf[0][f'{key}_mean']:.3f})")
    for value, label, style in baselines:
        ax.axhline(value, color="black", linestyle=style, linewidth=1, label=f"{label} ({value:.3f})")
    if finite:
        ax.set_xscale("log")
        ax.set_xticks(finite)
        ax.set_xticklabels([f"{e:g}" for e in finite])
        ax.minorticks_off()
    ax.set_xlabel("user-level epsilon (log scale)")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)  # beside the lines, never on them
