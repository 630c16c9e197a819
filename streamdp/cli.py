"""The ``streamdp`` command line: parse, validate, call one library function, print.

User errors (:class:`streamdp.errors.StreamdpError`) become one line on stderr and
their exit code (2, or 3 for a refused budget); Ctrl-C is one line saying what was
and was not released, and exit code 130; SIGTERM the same, exit code 143 (later
signals are ignored while the command settles, :func:`streamdp.outputs.interrupts_at_safe_points`);
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import json
import sys

import click
import numpy as np

from streamdp import __version__
from streamdp.errors import Interrupted, StreamdpError


class _Group(click.Group):
    """A click group that turns user errors into one-line messages."""

    def invoke(self, ctx):
        from streamdp.outputs import interrupt_exit_code, interrupts_at_safe_points

        try:
            with interrupts_at_safe_points(ignore_after_exit=True):
                return super().invoke(ctx)
        except Interrupted as exc:  # Ctrl-C or SIGTERM where a command knows what it released
            _quiet_abandoned_io()
            click.echo(f"streamdp: {exc}", err=True)
            ctx.exit(interrupt_exit_code(exc.exit_code))
        except StreamdpError as exc:
            click.echo(f"streamdp: error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            _quiet_abandoned_io()
            click.echo("streamdp: interrupted; nothing was released and nothing is left half-written "
                       "(outputs are written all or nothing)", err=True)
            ctx.exit(interrupt_exit_code(130))
        except OSError as exc:  # a full, over-quota or read-only disk is the user's to fix; other OSErrors are bugs
            from streamdp.outputs import describe_no_space

            message = describe_no_space(exc)
            if message is None:
                raise
            click.echo(f"streamdp: error: {message}", err=True)
            ctx.exit(2)


def _quiet_abandoned_io() -> None:
    """After Ctrl-C: Zarr's I/O tasks that the interrupted call was waiting for are abandoned (reads, or writes
    into temporary directories already removed); asyncio would log each of them at exit."""
    import logging

    logging.getLogger("asyncio").setLevel(logging.CRITICAL + 1)


def print_json(obj) -> None:
    """One JSON object on stdout."""
    click.echo(json.dumps(obj, default=_json_default))


def _quiet_under_json(ctx, param, value):
    """Callback of every ``--json`` flag: no progress bars for the rest of the command (stdout is one JSON
    object, and whoever reads it does not want a terminal drawn over)."""
    if value:
        from streamdp.progress import quiet

        ctx.with_resource(quiet())
    return value


def _json_default(o):
    from streamdp.jsonio import json_default

    return json_default(o)


class _Epsilon(click.ParamType):
    """An ``--epsilon``: a float, where only the literal ``inf`` is infinite (``1e309`` is an error, not a
    non-private run: :func:`streamdp.privacy.accountant.parse_epsilon`)."""

    name = "float"

    def convert(self, value, param, ctx):
        from streamdp.privacy.accountant import parse_epsilon

        return parse_epsilon(value, param.opts[0] if param is not None and param.opts else "--epsilon")


EPSILON = _Epsilon()


memory_limit_option = click.option(
    "--memory-limit",
    default=None,
    metavar="SIZE",
    help="Peak memory budget, e.g. 512MB or 2GB (default: half of the available RAM).",
)

#: ``--scheduler`` of every command that runs passes (see docs/cluster.md).
scheduler_option = click.option(
    "--scheduler", default=None, metavar="ADDRESS",
    help="Run the passes on Dask: tcp://host:port (a running cluster, whose workers must reach STORE and "
         "--state), 'processes' (a local cluster of --workers processes) or 'dask' (Dask in this process); "
         "default: local threads. Results are bit-identical either way (see docs/cluster.md). On a cluster "
         "--workers sizes the blocks in flight (default: the cluster's threads) and --memory-limit is this "
         "process's.")

#: ``--state`` of the commands that keep per-user state.
state_option = click.option(
    "--state", default=None, metavar="URL",
    help="Where per-user state goes (a directory or fsspec URL that the cluster's workers reach; default "
         "STORE.state beside the store). Removed when the run ends.")

#: ``--users-bound`` of the commands that take privacy parameters (streamdp.privacy.users).
users_bound_option = click.option(
    "--users-bound", "users_bound", type=click.IntRange(min=1), default=None, metavar="N",
    help="A public number of users you declare (e.g. the size of a published panel): used for the defaults and "
         "written in the model instead of the count released with noise (which then costs 1% of epsilon); a store "
         "with more users is refused.")

#: ``--items`` of the commands that release a model (streamdp.privacy.catalogue).
items_option = click.option(
    "--items", "items", default=None, metavar="FILE", help="The item catalogue, declared public by the data owner: a "
    "file of item ids, one per line, or the first field of each line (a header line is allowed; MovieLens' u.item "
    "works as it is). The model's items are these; ratings of other items are left out. Default: the catalogue the "
    "store declares (ingest --items), else one selected privately (partition selection, part of --epsilon); never "
    "the store's items as read off the data.")

k_option = click.option("--k", "k", type=int, default=10, show_default=True,
                        help="List length of the ranking metrics (Precision/Recall/NDCG/MAP@k).")
ranking_users_option = click.option(
    "--ranking-users", "ranking_users", default=str(10_000), show_default=True, metavar="N|all",
    help="Users the ranking metrics are measured on: a seeded sample of N users (the same for the model and the "
         "baselines; the output gives its standard error), or 'all'. RMSE and MAE always cover every test rating.")
relevant_threshold_option = click.option(
    "--relevant-threshold", type=float, default=None, metavar="RATING",
    help="A held-out rating at or above it is relevant (default: the top 20% of the rating range, "
    "min + 0.8 (max - min): 4.2 on 1..5).")


#: ``--yes`` of the commands that can make a store's spend infinite (``--epsilon inf``).
yes_option = click.option("--yes", "-y", "yes", is_flag=True,
                          help="Confirm a non-private run (epsilon inf), which makes the store's spend infinite for "
                          "good, without being asked (needed when there is no terminal to ask on).")

INFINITE_PROMPT = "this makes the store's spend infinite for good; continue?"


def _stdin_is_tty() -> bool:
    return sys.stdin.isatty()


def confirm_infinite(store: str, yes: bool, what: str) -> None:
    """Before a run that would make ``store``'s spend infinite (``what``: the flag that asks for it): ask on a
    terminal, refuse in one line without one unless ``--yes``. Nothing to ask when the spend is infinite already."""
    import math

    from streamdp.errors import ParameterError
    from streamdp.privacy.budget import COUNTED, StoreBudget

    if yes:
        return
    if any(math.isinf(float(e["epsilon"])) for e in StoreBudget(store).entries() if e["status"] in COUNTED):
        return
    if not _stdin_is_tty():
        raise ParameterError(f"{what}: a non-private release makes {store}'s spend infinite for good; pass --yes "
                             f"to confirm (there is no terminal to ask on)")
    if not click.confirm(f"{what}: {INFINITE_PROMPT}", default=False, err=True):
        raise ParameterError(f"{what}: not confirmed; nothing was released")


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="streamdp")
def main():
    """Train recommender models with user-level differential privacy, out of core."""


def run() -> None:
    """The console script ``streamdp`` and ``python -m streamdp``: :func:`main` with the objects of its imports out
    of the garbage collector's full collections, then an exit that skips the interpreter's teardown.

    ``gc.freeze()`` moves every object alive into the permanent generation, which full collections do not
    traverse. Numba's registries make them slow: 0.3-0.45 s of every command that ran a kernel at shutdown (an
    append of 1% of a store took 4 s in all), against 0.03 s frozen; and during a command each one stalls its
    threads (:func:`streamdp.memory.frozen_collector`, which the engine's passes hold). So the imports are frozen
    before the command (an append's two full collections, 0.08 s, traverse what the command creates only).

    Once the command has exited (click always ends with ``SystemExit``), :func:`exit_now` ends the process without
    the interpreter's teardown, which still cost 0.15-0.3 s after a command that ran kernels (module dictionaries
    cleared object by object, Numba's and LLVM's finalizers; measured with ``strace``: the last ``atexit``
    handler to ``exit_group``), 10-15% of a 1% append onto a 100M store. Nothing is lost: ``atexit`` handlers
    (temporary directories' finalizers, progress bars, Dask clients) run first, standard output and error are
    flushed, and every output was written and renamed before the command returned. A command that fails with an
    unexpected exception (a bug) keeps the ordinary exit and its traceback. Not done by :func:`main` itself: a
    process that goes on after a command (tests, ``CliRunner``) needs its collector and its interpreter.
    """
    import gc

    gc.freeze()
    try:
        main()
    except SystemExit as exc:
        gc.freeze()
        exit_now(exc.code)
        raise
    finally:
        gc.freeze()


def exit_now(code) -> None:
    """End the process with ``SystemExit(code)``'s status (``None`` 0, an int itself, anything else printed to
    stderr and 1, as the interpreter would), after the ``atexit`` handlers and a flush of stdout and stderr, without
    the interpreter's teardown (:func:`run`)."""
    import atexit
    import os

    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        print(code, file=sys.stderr)
        status = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            pass
    os._exit(status & 0xFF)


# ---------------------------------------------------------------------------------------
# storage: info / generate / ingest
# ---------------------------------------------------------------------------------------


@main.command()
@click.argument("store")
@click.option("--json", "as_json", is_flag=True, callback=_quiet_under_json, help="Print one JSON object.")
def info(store, as_json):
    """Counts, rating range, split sizes and item popularity of STORE."""
    from streamdp.storage.info import format_info, store_summary

    summary = store_summary(store)
    if as_json:
        print_json(summary)
    else:
        click.echo(format_info(summary))


@main.command()
@click.argument("store")
@click.option("--workers", type=int, default=None, help="Worker threads (default: all cores).")
@memory_limit_option
@scheduler_option
@click.option("--json", "as_json", is_flag=True, callback=_quiet_under_json, help="Print one JSON object.")
def verify(store, workers, memory_limit, scheduler, as_json):
    """Read all of STORE back, block by block, and check it against its recorded checksum."""
    from streamdp.stream.verify import format_verify, verify_store

    r = verify_store(store, workers=workers, memory_limit=memory_limit, scheduler=scheduler)
    if as_json:
        print_json(r)
    else:
        click.echo(format_verify(r))


@main.command()
@click.option("--out", required=True, help="Destination store: a directory, or an fsspec URL such as "
              "s3://bucket/ratings.zarr (credentials from the environment; see docs/cluster.md).")
@click.option("--users", "n_users", type=int, default=10_000, show_default=True, help="Number of users.")
@click.option("--items", "n_items", type=int, default=2_000, show_default=True, help="Number of items.")
@click.option("--ratings-per-user", type=float, default=50.0, show_default=True,
              help="Mean ratings per user (power-law activity).")
@click.option("--rank", type=int, default=8, show_default=True, help="Rank of the ground truth.")
@click.option("--noise", type=float, default=0.5, show_default=True, help="Std of the Gaussian observation noise.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed (the store is deterministic in it).")
@click.option("--test-fraction", type=float, default=0.0, show_default=True,
              help="Hold out this fraction of each user's ratings into the test split.")
@click.option("--item-exponent", type=float, default=0.9, show_default=True, help="Zipf exponent of item popularity.")
@click.option("--user-exponent", type=float, default=2.0, show_default=True, help="Pareto exponent of user activity.")
@click.option("--scale", default="1,5,1", show_default=True, metavar="MIN,MAX,STEP",
              help="Rating scale; STEP 0 keeps ratings continuous.")
@click.option("--factors", type=click.Choice(["gaussian", "uniform"]), default="gaussian", show_default=True,
              help="Ground truth: gaussian factors with item biases, or uniform: an exact rank-RANK truth without "
              "biases, every entry inside the scale (--rank 1 --noise 0 --scale -1,1,0 is Jain et al.'s synthetic "
              "set).")
@click.option("--user-bias-std", type=float, default=0.0, show_default=True,
              help="Std of a per-user offset added to every rating of the user (users' levels differ).")
@click.option("--activity-bias", type=float, default=0.0, show_default=True,
              help="Per-user offset a log(n / mean) for a user of n ratings (users' levels that go with their "
              "activity).")
@click.option("--interaction-scale", type=float, default=1.0, show_default=True,
              help="Standard deviation of the low-rank part u.v of a rating (gaussian factors).")
@click.option("--outlier-fraction", type=float, default=0.0, show_default=True,
              help="Fraction of ratings replaced by one end of the scale at random.")
@click.option("--string-ids", is_flag=True, help="Write user and item ids as strings (u00000042, B00000007).")
@click.option("--taste-clusters", type=int, default=0, show_default=True, metavar="K",
              help="Users in K taste clusters whose choice of items differs (on top of popularity), so that "
              "personalized lists can beat the popularity chart; 0: choice by popularity alone.")
@click.option("--taste-strength", type=float, default=2.0, show_default=True,
              help="With --taste-clusters: how strongly a cluster's affinity tilts its choice of items.")
@click.option("--implicit", is_flag=True, help="Write an implicit store (interaction counts, no ratings) from the "
              "same model: each chosen item's count grows with the user's preference for it.")
@click.option("--count-cap", type=float, default=None, metavar="C",
              help="With --implicit: cap the counts at C (declared; default: the observed range).")
@click.option("--timestamps", type=float, default=None, metavar="DAYS",
              help="Give every rating a time over DAYS days from 2024-01-01 (UTC): users arrive in turn, a fifth of "
              "the items appear during the span, and ratings come after both (a log to replay as appends).")
@click.option("--taste-drift", type=float, default=0.0, show_default=True,
              help="With --timestamps: how far each item's appeal moves over the span (rating points, times a "
              "standard normal per item).")
@click.option("--block-users", type=int, default=None,
              help="Users per block (default: about 1M ratings a block, train and test together).")
@click.option("--workers", type=int, default=None, help="Threads generating blocks (default: 2, or 1 on one core).")
@click.option("--force", is_flag=True, help="Replace an existing streamdp store at --out (anything else there is "
              "an error); its privacy-budget ledger is carried over.")
@click.option("--like", default=None, metavar="STORE", help="Shape the store like STORE: its items, rating scale "
              "and test fraction (public), its users and ratings per user as STORE has released them (or --users / "
              "--ratings-per-user, given; else released now at --shape-epsilon and charged to STORE's budget), its "
              "item popularity and item means as a released als/irls/means model has them (free; else the "
              "generator's), and how its ratings spread around those means (released once at --shape-epsilon, "
              "then free). Nothing is trained on STORE's ratings (docs/choosing-epsilon.md).")
@click.option("--shape-epsilon", type=float, default=None, metavar="E",
              help="With --like: epsilon charged to STORE for each shape statistic it must release (the histogram "
              "of ratings per user, the rating spread; default 0.1).")
@click.option("--over-budget", is_flag=True, help="With --like: release the shape statistic even past STORE's "
              "budget (recorded).")
@click.pass_context
def generate(ctx, out, n_users, n_items, ratings_per_user, rank, noise, seed, test_fraction, item_exponent,
             user_exponent, scale, factors, user_bias_std, activity_bias, interaction_scale, outlier_fraction,
             string_ids, taste_clusters, taste_strength, implicit, count_cap, timestamps, taste_drift, block_users,
             workers, force, like, shape_epsilon, over_budget):
    """Write a synthetic low-rank, power-law rating store, block by block (or one shaped like --like STORE)."""
    from streamdp.errors import ParameterError
    from streamdp.storage.generate import generate_store

    if like is not None:
        _generate_like(ctx, like, out, shape_epsilon, over_budget, force)
        return
    for flag, v in (("--shape-epsilon", shape_epsilon), ("--over-budget", over_budget or None)):
        if v is not None:
            raise ParameterError(f"{flag}: only with --like")
    try:
        lo, hi, step = (float(x) for x in scale.split(","))
    except ValueError:
        raise ParameterError(f"--scale: expected MIN,MAX,STEP, got {scale!r}") from None
    s = generate_store(out, n_users=n_users, n_items=n_items, ratings_per_user=ratings_per_user, rank=rank,
                       noise=noise, seed=seed, test_fraction=test_fraction, item_exponent=item_exponent,
                       user_exponent=user_exponent, rating_min=lo, rating_max=hi, rating_step=step,
                       factors=factors, user_bias_std=user_bias_std, activity_bias=activity_bias,
                       interaction_scale=interaction_scale, outlier_fraction=outlier_fraction,
                       taste_clusters=taste_clusters, taste_strength=taste_strength, implicit=implicit,
                       count_cap=count_cap, timestamps=timestamps, taste_drift=taste_drift,
                       string_ids=string_ids, block_users=block_users, workers=workers, force=force)
    what = "interactions (implicit: counts)" if s.implicit else "ratings"
    click.echo(f"wrote {s.path}: {s.n_users:,} users, {s.n_items:,} items, {s.n_ratings:,} train + "
               f"{s.n_test:,} test {what} in {s.attrs['seconds']:.1f}s")


def _generate_like(ctx, like, out, shape_epsilon, over_budget, force) -> None:
    """``generate --like STORE``: the options given on the command line go to the generator, except those STORE's
    public parameters fix (refused); ``--users``/``--ratings-per-user`` given are used at no cost."""
    from click.core import ParameterSource

    from streamdp.errors import ParameterError
    from streamdp.workflows.rehearse import generate_like

    fixed = {"n_items": "--items", "scale": "--scale", "test_fraction": "--test-fraction", "implicit": "--implicit",
             "count_cap": "--count-cap"}
    given = {k: v for k, v in ctx.params.items() if ctx.get_parameter_source(k) == ParameterSource.COMMANDLINE
             and k not in ("out", "like", "shape_epsilon", "over_budget", "force")}
    for k, flag in fixed.items():
        if k in given:
            raise ParameterError(f"{flag}: with --like it comes from {like}'s public parameters; leave it out")
    users, rpu = given.pop("n_users", None), given.pop("ratings_per_user", None)
    given.pop("seed", None)
    s = generate_like(like, out, users=users, ratings_per_user=rpu, shape_epsilon=shape_epsilon,
                      over_budget=over_budget, force=force, echo=click.echo,
                      seed=ctx.params["seed"], **given)
    read = ("its ratings read once for the rating spread released now" if "spread_release" in
            s.attrs["params"]["like"] else "none of its ratings read")
    what = "interactions (implicit: counts)" if s.implicit else "ratings"
    click.echo(f"wrote {s.path}: {s.n_users:,} users, {s.n_items:,} items, {s.n_ratings:,} train + "
               f"{s.n_test:,} test {what} in {s.attrs['seconds']:.1f}s (synthetic: shaped like {like}, {read})")


@main.command()
@click.argument("inputs", nargs=-1, metavar="[INPUT]...")
@click.option("--out", default=None, help="Destination store: a directory, or an fsspec URL such as "
              "s3://bucket/ratings.zarr (credentials from the environment; see docs/cluster.md).")
@click.option("--append", "append_to", default=None, metavar="STORE",
              help="Add the files to the existing STORE (instead of --out) as a new segment, without rewriting it: "
              "the store's rating range, pair rule, split and ids apply; new users and items are added, and a pair "
              "already in the store takes the appended rating (counted in the output). Its budget ledger is kept. "
              "A local store only; `streamdp compact STORE` folds the segments.")
@click.option("--train", "train_files", multiple=True, metavar="FILE",
              help="Your own split: the training ratings (like INPUT; repeatable). Goes with --test.")
@click.option("--test", "test_files", multiple=True, metavar="FILE",
              help="Your own split: the held-out ratings (e.g. MovieLens u1.test; repeatable), read and checked as "
              "the training files are. Users and items only in the test file are kept (counted in the output).")
@click.option("--format", "fmt", type=click.Choice(["udata", "dat", "csv", "ws", "parquet"]), default=None,
              help="Input format (default: detected from each file).")
@click.option("--sep", default=None, help="Field separator: one character, '\\t', '::', or 'ws' (whitespace runs).")
@click.option("--columns", default=None, metavar="U,I,R[,T]",
              help="Names or 0-based indices of the user, item, rating[, timestamp] columns; user,item[,count] "
              "for an interaction log (implicit store).")
@click.option("--implicit", is_flag=True, help="Read the files as interaction logs (clicks, plays, purchases): "
              "user,item per line, or user,item,count; repeated pairs are summed into counts (detected without it "
              "from --columns user,item[,count] or a header with no rating column).")
@click.option("--count-cap", type=float, default=None, metavar="C",
              help="Interaction logs: declared (public) cap of a pair's count; larger counts are set to C "
              "(default: none, the observed range, which a method must not publish).")
@click.option("--rating-range", default=None, metavar="MIN,MAX",
              help="Declared rating range (public); ratings outside it are errors unless --out-of-range clip/drop "
              "(default: none: a private run selects one privately, a non-private one uses the observed range).")
@click.option("--out-of-range", type=click.Choice(["error", "clip", "drop"]), default=None,
              help="Ratings outside the declared --rating-range: error (default; with --skip-bad-lines they are "
              "skipped as bad lines), clip to the range, or drop; the count is recorded in the store.")
@click.option("--split", type=click.Choice(["random", "temporal", "last-n"]), default=None,
              help="How to hold out a test split: random (--test-fraction of each user's ratings), temporal (each "
              "user's latest --test-fraction, by the timestamp column) or last-n (each user's --last-n latest); "
              "every user keeps at least one training rating. Default: random when --test-fraction is given.")
@click.option("--test-fraction", type=float, default=0.0, show_default=True,
              help="Hold out this fraction of each user's ratings into the test split (--split random, the "
              "default, or temporal).")
@click.option("--last-n", type=int, default=None, metavar="N",
              help="--split last-n: hold out each user's N latest ratings (leave-last-N-out).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the held-out split.")
@click.option("--item-names", default=None, metavar="FILE",
              help="A file of 'id,name' lines (a header, tab, '|', '::' or ';' also read): kept in the store and shown "
              "in recommend's lists. Names are treated as public metadata.")
@click.option("--items", "items", default=None, metavar="FILE",
              help="The item catalogue, declared public by the data owner: a file of item ids, one per line (a "
              "header line is allowed). Models trained on the store list these items; ratings of other items are "
              "left out of every model (their number is said here only). Without it, each private run selects "
              "its items privately.")
@click.option("--skip-bad-lines", is_flag=True, help="Skip and count malformed lines instead of failing.")
@memory_limit_option
@click.option("--block-users", type=int, default=None,
              help="Users per block (default: about 1M ratings a block, train and test together).")
@click.option("--force", is_flag=True, help="Replace an existing streamdp store at --out (anything else there is "
              "an error); its privacy-budget ledger is carried over.")
@click.option("--budget", default=None, metavar="EPSILON,DELTA",
              help="Set the store's total privacy budget (see `streamdp budget`).")
@click.option("--user-budget", default=None, metavar="EPSILON[,DELTA]",
              help="Cap every user's privacy loss over all releases from the store (an individual Renyi filter: a "
              "user whose next release would cross it is left out of it and of all later ones; see `streamdp "
              "budget`). DELTA defaults to the store's default delta.")
@click.option("--json", "as_json", is_flag=True, callback=_quiet_under_json, help="Print a JSON summary.")
def ingest(inputs, out, append_to, train_files, test_files, fmt, sep, columns, implicit, count_cap, rating_range,
           out_of_range, split, test_fraction, last_n, seed, item_names, items, skip_bad_lines, memory_limit,
           block_users, force, budget, user_budget, as_json):
    """Ingest rating files (u.data, ::-.dat, CSV, ;-separated, whitespace, Parquet; .gz) into a store, out of core;
    or interaction logs (user,item[,count]: clicks, plays, purchases) into an implicit store.

    The test split: your own files (--train FILE --test FILE), or held out from each user's ratings
    (--split random|temporal|last-n); recorded in the store (streamdp info shows it)."""
    from streamdp.errors import ParameterError
    from streamdp.workflows.api import ingest as ingest_files

    inputs = list(inputs) + list(train_files)
    if (out is None) == (append_to is None):
        raise ParameterError("ingest: give --out STORE (a new store) or --append STORE (an existing one), not "
                             + ("both" if out is not None else "neither"))
    if not inputs:
        raise ParameterError("ingest: give the rating files (INPUT...), or --train FILE --test FILE")
    if train_files and not test_files and append_to is None:
        raise ParameterError("--train: give the held-out ratings with --test FILE (or list the files as INPUT...)")
    s = ingest_files(inputs, out or append_to, fmt=fmt, sep=sep, columns=columns, rating_range=rating_range,
                     test_fraction=test_fraction, seed=seed, skip_bad_lines=skip_bad_lines,
                     memory_limit=memory_limit, block_users=block_users, force=force, budget=budget,
                     **({"user_budget": user_budget} if user_budget is not None else {}),
                     out_of_range=out_of_range, implicit=implicit, count_cap=count_cap, split=split, last_n=last_n,
                     test=list(test_files) or None, item_names=item_names, items=items,
                     **({"append": True, "notes": False} if append_to else {}))
    a = s.attrs
    if append_to is not None:
        from streamdp.storage.append import append_summary

        e = a["segments"][-1]
        if as_json:
            print_json({"store": s.path, "segment": e, "n_users": s.n_users, "n_items": s.n_items,
                        "n_ratings": s.n_ratings, "n_test": s.n_test, "n_segments": len(a["segments"])})
            return
        click.echo(append_summary(s.path, e, implicit=s.implicit))
        click.echo(f"  now {s.n_users:,} users, {s.n_items:,} items, {s.n_ratings:,} train + {s.n_test:,} test "
                   f"{'pairs' if s.implicit else 'ratings'} in {len(a['segments'])} segment(s) over the base")
        return
    if as_json:
        extra = {k: a[k] for k in ("value", "count_cap", "n_duplicates_aggregated", "n_counts_capped")} \
            if s.implicit else {}
        print_json({"store": s.path, "implicit": s.implicit, "n_users": s.n_users, "n_items": s.n_items,
                    "n_ratings": s.n_ratings, "n_test": s.n_test, "n_duplicates_dropped": a["n_duplicates_dropped"],
                    "n_bad_lines_skipped": a["n_bad_lines_skipped"], "out_of_range": a["out_of_range"],
                    "n_out_of_range_clipped": a["n_out_of_range_clipped"],
                    "n_out_of_range_dropped": a["n_out_of_range_dropped"], **extra, "split": a["split"],
                    "item_names": a.get("item_names"), "seconds": a["seconds"]})
        return
    from streamdp.storage.info import describe_item_names, describe_split

    notes = [describe_split(a["split"], s.n_test)] + ([describe_item_names(a["item_names"])]
                                                     if a.get("item_names") else [])
    if a.get("catalogue"):
        from streamdp.storage.info import describe_catalogue

        notes.append(describe_catalogue(s))
    if s.implicit:
        cap = (f", {a['n_counts_capped']:,} capped at {a['count_cap']:g}" if a["count_cap"] is not None else "")
        click.echo(f"wrote {s.path} (implicit: {a['value']}s of interactions): {s.n_users:,} users, "
                   f"{s.n_items:,} items, {s.n_ratings:,} train + {s.n_test:,} test (user, item) pairs; "
                   f"{a['n_duplicates_aggregated']:,} repeated interactions aggregated into counts{cap}, "
                   f"{a['n_bad_lines_skipped']:,} bad lines skipped, in {a['seconds']:.1f}s")
    else:
        oor = {"clip": f", {a['n_out_of_range_clipped']:,} out-of-range ratings clipped",
               "drop": f", {a['n_out_of_range_dropped']:,} out-of-range ratings dropped"}.get(a["out_of_range"], "")
        click.echo(f"wrote {s.path}: {s.n_users:,} users, {s.n_items:,} items, {s.n_ratings:,} train + "
                   f"{s.n_test:,} test ratings; {a['n_duplicates_dropped']:,} duplicates dropped, "
                   f"{a['n_bad_lines_skipped']:,} bad lines skipped{oor}, in {a['seconds']:.1f}s")
    for line in notes:
        if line:
            click.echo(f"  {line}")


@main.command()
@click.argument("store")
@click.option("--json", "as_json", is_flag=True, callback=_quiet_under_json, help="Print a JSON summary.")
def compact(store, as_json):
    """Fold the segments that `ingest --append` added to STORE into one store, out of core and atomically
    (written beside, renamed into place); the ratings, ids and split stay the same, and so does its budget
    ledger."""
    from streamdp.storage.compact import compact as compact_store

    s = compact_store(store, notes=not as_json)
    if as_json:
        print_json({"store": s.path, "n_users": s.n_users, "n_items": s.n_items, "n_ratings": s.n_ratings,
                    "n_test": s.n_test, "compacted": s.attrs.get("compacted")})


# ---------------------------------------------------------------------------------------
# models: train / evaluate / recommend / demo
# ---------------------------------------------------------------------------------------


def _report(summary: dict, as_json: bool, format_text) -> None:
    """Print a release's summary (one JSON object, or ``format_text(summary)``), its removed stale run directories
    and its privacy warnings (on stderr also under ``--json``: stdout stays one object)."""
    _note_stale_runs(summary.get("stale_runs_removed", []))
    if as_json:
        print_json(summary)
    else:
        click.echo(format_text(summary))
    for w in summary.get("privacy_warnings", []) + [(summary.get("user_filter") or {}).get("warning")]:
        if w:
            click.echo(f"streamdp: warning: {w}", err=True)


def _note_stale_runs(paths) -> None:
    """Say on stderr which run directories of dead processes were removed."""
    if paths:
        click.echo(f"note: removed {len(paths)} run director{'y' if len(paths) == 1 else 'ies'} left by "
                   f"process(es) that are gone: {', '.join(paths)}", err=True)


def _option_params(methods: dict) -> tuple[list, set]:
    """click options generated from the methods' declared options (``name -> class``): ``(params, names)``.

    One flag per option name over ``methods``; its help says which method reads it and
    how (one method: its own help line), with the declared default.
    """
    from streamdp.methods.options import merge_options, option_help

    params, merged = [], merge_options(methods)
    for name, slot in sorted(merged.items()):
        first = next(iter(slot["by_method"].values()))
        kind = slot["kind"]
        decls = [first.flag + "/--no-" + first.flag[2:]] if kind is bool else [first.flag]
        text = first.describe() if len(methods) == 1 else option_help(slot["by_method"])
        kw = dict(default=None, help=text, metavar=first.metavar)
        if kind == "choice":
            kw["type"] = click.Choice(slot["choices"])
        elif kind is not bool:
            kw["type"] = {int: int, float: float, str: str}[kind]
        params.append(click.Option(decls + [name], **kw))
    return params, set(merged)


class _LowrankCommand(click.Command):
    """``streamdp lowrank``: its options are generated from :class:`~streamdp.methods.lowrank.LowRank`'s declaration
    (added when the command parses or prints its help, as for ``train``)."""

    def get_params(self, ctx):
        if not getattr(self, "_options_loaded", False):
            from streamdp.methods.lowrank import LowRank

            params, _ = _option_params({"lowrank": LowRank})
            at = next(i for i, p in enumerate(self.params) if p.name == "out") + 1
            self.params[at:at] = params
            self._options_loaded = True
        return super().get_params(ctx)

    def parse_args(self, ctx, args):
        self.get_params(ctx)
        return super().parse_args(ctx, args)


class _TrainCommand(click.Command):
    """``streamdp train``: its method options are generated from the methods' declarations.

    They are added the first time the command parses or prints its help, so other
    commands do not pay for importing the methods (Numba kernels).
    """

    def _load_method_options(self):
        if getattr(self, "_method_options_loaded", False):
            return
        from streamdp.methods import METHODS, load_builtin
        from streamdp.workflows.train_help import rank_help

        load_builtin()
        for p in self.params:
            if p.name == "method":
                p.type = click.Choice(sorted(METHODS))
                p.help = ("Training method (listed below; `streamdp methods` compares them)  [default: als; ials on "
                          "an interaction log]")
            elif p.name == "rank":
                p.help = rank_help(METHODS)
        params, self._method_option_names = _option_params(METHODS)
        self.params.extend(params)
        self._method_options_loaded = True

    def parse_args(self, ctx, args):
        from streamdp.workflows.train_help import HELP_METHOD, method_in_args

        self._load_method_options()
        ctx.meta[HELP_METHOD] = method_in_args(args)  # `--method X --help` shows only X's options
        return super().parse_args(ctx, args)

    def format_options(self, ctx, formatter):
        from streamdp.workflows.train_help import format_train_options

        self._load_method_options()
        format_train_options(self, ctx, formatter, self._method_option_names)

    def get_params(self, ctx):
        self._load_method_options()
        return super().get_params(ctx)


def period_options(f):
    """The options naming the period of the store a model is trained on (:mod:`streamdp.storage.timeline`):
    ``train``'s, ``tune``'s and ``sweep``'s, one meaning."""
    for opt in reversed([
        click.option("--since", default=None, metavar="DATE", help="Train on the ratings made at or after DATE only "
                     "(ISO date or date and time, UTC unless an offset is given; a store that keeps rating times). "
                     "Recorded in the model (data_window; a sweep's results.json too)."),
        click.option("--until", default=None, metavar="DATE", help="Train on the ratings made before DATE only "
                     "(as --since)."),
        click.option("--window", default=None, metavar="LENGTH", help="Train on the ratings of the LENGTH (e.g. 90d, "
                     "12w, 36h) before --until, or before now (the clock of the run: never before the newest "
                     "rating, which is read off the data)."),
        click.option("--until-segment", "until_segment", type=int, default=None, metavar="N",
                     help="Train on the store as it was after its N-th append (0: before the first); "
                     "`evaluate --segment N+1` then scores the model on what came next.")]):
        f = opt(f)
    return f


@main.command(cls=_TrainCommand)
@click.argument("store")
@click.option("--method", default=None, help="Training method.")  # its help and choices: _load_method_options
@click.option("--epsilon", type=EPSILON, required=True, help="User-level epsilon of the whole release (with the "
              "private selections of the items and the rating range when the store declares neither); 'inf' trains "
              "without noise (non-private, labelled so).")
@click.option("--delta", type=float, default=None,
              help="User-level delta (default: a power of ten below one over ten times the number of users, at "
              "most 1e-6; the number of users is the count released with noise or --users-bound (the largest "
              "power of ten <= min(1e-6, 1/(10 n_users))).")
@users_bound_option
@click.option("--rank", type=int, default=None, help="Number of factors k (generated from the methods).")
@click.option("--out", required=True, help="Model directory to write (atomically).")
@items_option
@click.option("--warm-start", "warm_start", default=None, metavar="MODEL", help="Start from MODEL, released earlier "
              "(als/irls, or ials from an ials model; same rank; --rank defaults to its rank): its item factors "
              "replace the random initial ones (items matched by id; new items start cold; non-private als/irls "
              "runs also start from its item biases). "
              "Post-processing of a release: free in privacy, the epsilon is a cold run's. The iterations then "
              "default to a quarter of the cold default (rounded up); refused with a checkpoint directory. A MODEL "
              "that released no item factors (biases only) starts nothing: the run is a cold one, said so.")
@click.option("--lists", type=click.Choice(["auto", "own", "ials"]), default="auto", show_default=True,
              help="Where the model's lists come from: 'ials' trains an ials model on which items each user rated "
              "in the same release (at --lists-share of the epsilon left after the count of users; the rating model "
              "is calibrated so that the whole "
              "composes to --epsilon) and lists by it when its private choice kept its factors; 'own': the rating "
              "model's list score; 'auto': 'ials' when no --method is given, the run is private and the store holds "
              "ratings of 5,000 users or more (the released count), else 'own'.")
@click.option("--lists-share", type=float, default=None, help="The ials lists part's share of the epsilon left "
              "after the releases made first: the count of users, a private selection of the items or the rating "
              "range (default: "
              "0.45 where the rating model plans no factors, else 0.2).")
@click.option("--seed", type=int, default=None, help="Seed: reproducible, not private against whoever knows it.")
@click.option("--workers", type=int, default=None, help="Worker threads of the local pool (default: all cores; "
              "with --scheduler, the cluster's thread count, which sizes the blocks in flight).")
@memory_limit_option
@click.option("--scheduler", default=None, metavar="ADDRESS", help="Run the passes on Dask: tcp://host:port (a "
              "running cluster, whose workers must reach STORE and --state), 'processes' (a local cluster of "
              "--workers processes) or 'dask' (Dask in this process); default: local threads. Every method's passes "
              "and the evaluation run there, bit-identical to local threads; sgd/sgld only with their blocks "
              "epoch scheme (their default Hogwild epochs share one V in this process: refused on a cluster; see "
              "docs/cluster.md). On a cluster --workers sizes the blocks in flight and --state must be reachable "
              "by the workers; --memory-limit applies to this process.")
@state_option
@click.option("--over-budget", "--budget-override", "over_budget", is_flag=True,
              help="Train even if the store's privacy budget would be exceeded (recorded).")
@click.option("--force", is_flag=True, help="Replace an existing streamdp model at --out (anything else there is "
              "an error).")
@yes_option
@k_option
@ranking_users_option
@period_options
@click.option("--json", "as_json", is_flag=True, callback=_quiet_under_json, help="Print one JSON object.")
def train(store, method, epsilon, delta, users_bound, items, warm_start, rank, out, lists, lists_share, seed, workers,
          memory_limit, scheduler, state, over_budget, force, yes, k, ranking_users, since, until, window,
          until_segment, as_json, **options):
    """Train a private model on STORE and write it to --out."""
    import math

    from streamdp.errors import ParameterError
    from streamdp.methods import get_method
    from streamdp.workflows.training import train as train_model

    # `train` only: `sweep --rank` gives one rank to every method it runs and the Python API keeps accepting it
    # (unused, and said so in the summary), so a means point of a sweep is not refused
    if rank is not None and method is not None and not get_method(method).FITS_FACTORS:
        raise ParameterError(f"--rank: --method {method} fits no factors (it releases item biases and the global "
                             f"mean only); leave --rank out")
    if math.isinf(epsilon):
        confirm_infinite(store, yes, "--epsilon inf")

    summary = train_model(store, method=method, out=out, epsilon=epsilon, delta=delta, rank=rank, seed=seed,
                          workers=workers, scheduler=scheduler, memory_limit=memory_limit, over_budget=over_budget,
                          force=force, state=state, users_bound=users_bound, k=k, ranking_users=ranking_users,
                          items=items, warm_start=warm_start, since=since, until=until, window=window,
                          until_segment=until_segment, lists=lists, lists_share=lists_share, **options)
    _report(summary, as_json, format_train_summary)


@main.command()
@click.option("--json", "as_json", is_flag=True, callback=_quiet_under_json, help="Print one JSON object.")
def methods(as_json):
    """The methods: guarantee (exact/approximate), what is released, when to use each."""
    from streamdp.workflows.catalog import format_methods, methods_listing

    rows = methods_listing()
    if as_json:
        print_json({"methods": rows})
    else:
        click.echo(format_methods(rows))


def describe_period(w: dict) -> str:
    """One line on the period a model was trained on (``data_window``)."""
    parts = []
    if "until_segment" in w:
        parts.append(f"the store as of its segment {w['until_segment']} (0: before the first append)")
    if w.get("since_utc") or w.get("until_utc"):
        span = f"ratings from {w.get('since_utc') or 'the start'} to {w.get('until_utc') or 'the end'}"
        parts.append(span + (f" (--window {w['window']}, ending at {w['ends_at']})" if w.get("window") else ""))
    return "; ".join(parts)


def format_train_summary(summary: dict) -> str:
    """The lines ``streamdp train`` prints: what was written, the privacy spent, the RMSE beside the baselines."""
    from streamdp.serving.evaluate import format_baselines, format_verdict, statistics_note

    eps = summary["epsilon_spent"]
    if summary["guarantee"] == "non-private":
        privacy = "non-private (no noise, epsilon inf)"
    elif summary["guarantee"].startswith("not DP:"):
        privacy = f"{summary['guarantee']} (no epsilon: not differential privacy)"
    elif summary["guarantee"].startswith("private users' ratings are not used"):
        privacy = f"{summary['guarantee']} (nothing about private users released: epsilon 0 for them)"
    else:
        privacy = (f"{summary['guarantee']}, epsilon {eps if isinstance(eps, str) else f'{eps:.4g}'} "
                   f"(target {summary['epsilon']}), delta {summary['delta']:g}")
    from streamdp.methods import METHODS

    cls = METHODS.get(summary["method"])
    lists_model = getattr(cls, "LOCAL_SOLVER", None) == "implicit"  # ials: no biases, its chart instead
    unused = f"no factors released, so rank {summary['rank']} was not used"
    counts = "exact" if summary["guarantee"] == "non-private" else "noisy"
    steps = "" if getattr(cls, "RANK_IS_FACTORS", True) else " (its number of Frank-Wolfe iterations)"  # fw
    shape = (f"rank {summary['rank']}{steps}" if summary.get("factors_released", True) else
             f"released the most-popular chart by its {counts} item counts only ({unused})" if lists_model else
             "released item biases and the global mean (it fits no factors)" if not getattr(cls, "FITS_FACTORS", True)
             else f"released item biases and the global mean only ({unused})")
    timing = f"trained in {summary['train_seconds']:.1f}s"
    if "total_seconds" in summary:
        timing += f" ({summary['total_seconds']:.1f}s in all, with checks and evaluation)"
    lines = [f"wrote {summary['out']}: {summary['method']} {shape}, {privacy}, {timing}"]
    if "method_default" in summary:
        lines.append("method: " + summary["method_default"])
    if "items" in summary:
        lines.append("items: " + summary["items"])
    if "rating_range" in summary:
        lines.append("rating range: " + summary["rating_range"])
    if summary.get("data_window"):
        lines.append("period: " + describe_period(summary["data_window"]))
    if "warm_start" in summary and "started_cold" in summary["warm_start"]:
        w = summary["warm_start"]
        lines.append(f"warm start: none from {w['model']} ({w['method']}): {w['started_cold']}, so every item "
                     f"started cold, as in a cold run ({summary['iterations_run']} iterations)")
    elif "warm_start" in summary:
        w = summary["warm_start"]
        lines.append(f"warm start: from {w['model']} ({w['method']}), {summary['iterations_run']} iterations; items "
                     f"{w['items_matched']:,} from it, {w['items_new']:,} cold, {w['items_dropped']:,} of its dropped "
                     f"(post-processing of its release: no privacy cost)")
    if "user_filter" in summary:
        u = summary["user_filter"]
        lines.append(f"per-user budget: {u['participants']:,} users took part, {u['retired_now']:,} retired now "
                     f"(their cap would be crossed), {u['retired_total']:,} retired in all (see streamdp budget)")
    if "test_rmse" in summary:
        b = summary.get("baselines", {})
        lines.append(f"test RMSE {summary['test_rmse']:.4f}  MAE {summary['test_mae']:.4f} on "
                     f"{summary['test_ratings']:,} held-out ratings; non-private baselines: {format_baselines(b)}")
        lines.append("verdict: " + format_verdict(summary["verdict"], summary["test_rmse"]))
    if "release_choice" in summary:
        lines.append("choice: " + summary["release_choice"])
    lists = summary.get("lists_part")
    if lists:
        warmed = "; warm-started from the earlier model's part" if lists.get("warm_started") else ""
        lines.append(f"lists: {'from' if lists['used'] else 'not from'} the {lists['method']} part trained in the same "
                     f"release ({lists['share']:g} of the epsilon the releases made first left: epsilon "
                     f"{lists['epsilon']:.4g} with them alone; the whole composes to the epsilon above{warmed}): "
                     f"{lists['why']}")
    if not summary.get("factors_released", True) and not (lists and lists["used"]):
        from streamdp.serving.local import not_personalised_note

        lines.append("note: " + not_personalised_note(chart=lists_model))
    if (note := statistics_note(summary)) is not None:
        lines.append("note: " + note)
    if summary.get("ranking"):
        from streamdp.serving.ranking import format_ranking_short, format_ranking_verdict

        lines.append("ranking: " + format_ranking_short(summary["ranking"]))
        lines.append("ranking verdict: " + format_ranking_verdict(summary["ranking_verdict"]))
    return "\n".join(lines)


@main.command()
@click.argument("store")
@click.option("--epsilon", type=EPSILON, required=True, help="User-level epsilon of the whole run: the candidates, "
              "their noisy validation losses and the released model, composed in one ledger.")
@click.option("--method", default=None, help="Method to tune: als, irls, means (scored by held-out squared "
              "errors) or ials (by held-out items in each user's top 10)  [default: als; ials on an interaction log]")
@click.option("--out", required=True, help="Model directory to write (atomically): the chosen configuration.")
@click.option("--grid", "grid", multiple=True, metavar="KEY=V1,V2,...",
              help="Values to try for rank or one of the method's options (repeatable; the grid is their product). "
                   "Default: als/irls rank=4,8 (iters, unless given, from one released histogram of ratings per "
                   "user, as train sets it); means user_intercept=false,true; ials rank=16,32,64 (at most the "
                   "items) by alpha=1 and --alpha's default.")
@click.option("--delta", type=float, default=None,
              help="User-level delta (default: a power of ten below one over ten times the number of users, at "
              "most 1e-6; the number of users is the count released with noise or --users-bound (the largest "
              "power of ten <= min(1e-6, 1/(10 n_users))).")
@users_bound_option
@items_option
@click.option("--seed", type=int, default=None, help="Seed: reproducible, not private against whoever knows it.")
@click.option("--workers", type=int, default=None, help="Worker threads of the local pool (default: all cores).")
@memory_limit_option
@click.option("--over-budget", is_flag=True, help="Tune even if the store's privacy budget would be exceeded "
              "(recorded).")
@click.option("--force", is_flag=True, help="Replace an existing streamdp model at --out (anything else there is "
              "an error).")
@yes_option
@period_options
@click.option("--json", "as_json", is_flag=True, callback=_quiet_under_json, help="Print one JSON object.")
def tune(store, epsilon, method, out, grid, delta, users_bound, items, seed, workers, memory_limit, over_budget,
         force, yes, since, until, window, until_segment, as_json):
    """Choose a method's configuration privately on STORE, train it and write it to --out.

    Every configuration of the grid is trained privately on a Poisson sample of the
    users (20%, which makes the candidates cheap: the released model keeps about 98%
    of the epsilon), on each user's training ratings minus up to 2 held out; their
    validation losses (every user's) are released with
    Gaussian noise; the default configuration is kept unless another, not leaner,
    beats it by 3 noise standard deviations; the chosen one is trained on all
    training ratings. --method ials (its scores rank items) is scored instead by
    each user's held-out items in its top 10 (higher is better), by the same rule.
    All of it is composed in one ledger within --epsilon and reserved in the store's
    budget before the candidates run (see docs/tune.md). On a store too small for the noisy losses to tell
    configurations apart, nothing is tuned and the default gets the whole epsilon. --since, --until, --window
    and --until-segment tune and train on that period of STORE only, as train does.
    """
    import math

    from streamdp.workflows.tune import tune as run_tune

    if math.isinf(epsilon):
        confirm_infinite(store, yes, "--epsilon inf")
    # the run's summary (streamdp.workflows.api.tune's model.summary adds what the loaded model is)
    summary = run_tune(store, epsilon=epsilon, method=method, out=out, grid=list(grid) or None, delta=delta,
                       seed=seed, workers=workers, memory_limit=memory_limit, over_budget=over_budget, force=force,
                       users_bound=users_bound, items=items, since=since, until=until, window=window,
                       until_segment=until_segment)
    _report(summary, as_json, format_tune_summary)


def format_tune_summary(summary: dict) -> str:
    """``train``'s lines, then each candidate's noisy loss and the configuration chosen."""
    from streamdp.workflows.tune import config_name

    t = summary["tuning"]
    lines = [format_train_summary(summary)]
    if t.get("skipped"):
        lines.append(f"tune: no choice made: {t['skipped']}; trained {config_name(t['chosen'])} with the whole "
                     f"epsilon")
    else:
        what = "hits" if "noisy_hits" in t["candidates"][0] else "loss"
        lines.append(f"tune: {len(t['candidates'])} candidates at the noise of epsilon {t['candidate_epsilon']:.4g} "
                     f"each on a Poisson sample of {t['sample_rate']:.0%} of the users, noisy "
                     + ("held-out hits in the top 10 (higher is better" if what == "hits" else
                        "validation losses (lower is better")
                     + f"; std {t['selection_noise_std']:.4g}; per user in brackets):")
        for c in t["candidates"]:
            mark = "  <- chosen" if c["config"] == t["chosen"] else ""
            dflt = " (default)" if c["config"] == t["default"] else ""
            lines.append(f"  {config_name(c['config'])}{dflt}: {c['noisy_' + what]:.6g} "
                         f"({c['noisy_mean_' + what]:.4f}){mark}")
        lines.append(f"tune: chose {config_name(t['chosen'])} ({t['rule']}); released model at epsilon "
                     f"{t['final_epsilon']:.4g}; total epsilon {summary['epsilon_spent']:.4g} (target "
                     f"{summary['epsilon']})")
    return "\n".join(lines)


@main.command()
@click.argument("store", required=False)
@click.option("--methods", default="oja,sgld,als", show_default=True, help="Comma-separated methods.")
@click.option("--epsilons", default="0.1,0.5,1,2,5,10,inf", show_default=True,
              help="Comma-separated user-level epsilons; inf trains without noise.")
@click.option("--out", default=None, metavar="DIR", help="Directory for results.csv, results.json, the plot and "
              "the models (required unless --replot).")
@click.option("--repeats", type=int, default=1, show_default=True,
              help="Train each private point this many times (seeds differ); mean and spread are reported.")
@click.option("--delta", type=float, default=None, help="User-level delta of every run (default as for train).")
@users_bound_option
@click.option("--rank", type=int, default=None, help="Number of factors (default: each method's).")
@click.option("--seed", type=int, default=None, help="Seed of repeat 0 (repeat r uses seed + r): reproducible, not "
              "private against whoever knows it.")
@click.option("--workers", type=int, default=None, help="Worker threads (default: all cores).")
@memory_limit_option
@scheduler_option
@state_option
@click.option("--dry-run", is_flag=True, help="Print the sweep's total privacy spend and stop.")
@click.option("--over-budget", is_flag=True, help="Run even if the store's budget would be exceeded (recorded).")
@click.option("--force", is_flag=True, help="Replace an earlier sweep directory at --out.")
@click.option("--rehearse", is_flag=True, help="Rehearse: run the sweep on a synthetic store shaped like STORE "
              "(OUT/synthetic.zarr, from its public parameters and the statistics it has released), never on its "
              "ratings and without charging its budget for the sweep (docs/choosing-epsilon.md).")
@click.option("--users", "rehearse_users", type=click.IntRange(min=1), default=None, metavar="N",
              help="With --rehearse: the synthetic store's number of users, yours to give (no cost).")
@click.option("--ratings-per-user", "rehearse_rpu", type=float, default=None, metavar="M",
              help="With --rehearse: its mean ratings per user (train and test), yours to give (no cost).")
@click.option("--shape-epsilon", type=float, default=None, metavar="E",
              help="With --rehearse: epsilon charged to STORE for each shape statistic it has not released: the "
              "histogram of ratings per user (unless --users and --ratings-per-user are given), the rating spread "
              "(once a model has released item means; default 0.1).")
@click.option("--replot", default=None, metavar="RESULTS", help="Redraw the plot and print the table of a finished "
              "sweep from its results.json (or its directory): no training, no budget touched.")
@yes_option
@period_options
@click.option("--json", "as_json", is_flag=True, callback=_quiet_under_json, help="Print one JSON object.")
def sweep(store, methods, epsilons, out, repeats, delta, users_bound, rank, seed, workers, memory_limit, scheduler,
          state, dry_run, over_budget, force, rehearse, rehearse_users, rehearse_rpu, shape_epsilon, replot, yes,
          since, until, window, until_segment, as_json):
    """Test RMSE, Recall@10 and NDCG@10 against epsilon for several methods: results.csv/json and a plot, spend
    charged to the budget. A list method (ials) has no test RMSE: its points are its Recall@10 and NDCG@10, beside
    the most-popular chart's (an implicit store takes list methods only; --rehearse takes them too).

    With --rehearse, the same on a synthetic store shaped like STORE, whose budget pays only for a shape statistic
    it has not released yet (--shape-epsilon each, said when charged; never for the sweep); a list method's
    synthetic users get taste clusters (an assumption, said), an implicit STORE's synthetic store holds counts. With
    --replot, the plot and table of a finished sweep again. --since, --until, --window and --until-segment train
    and evaluate every point on that period of STORE only, as train does (not with --rehearse); a store with a
    per-user budget needs --users-bound.
    """
    from streamdp.errors import ParameterError
    from streamdp.workflows.sweep import format_table, rehearse as run_rehearsal, replot as run_replot
    from streamdp.workflows.sweep import sweep as run_sweep

    echo = None if as_json else click.echo
    if replot is not None:
        if store is not None or out is not None or rehearse or any(
                v is not None for v in (since, until, window, until_segment)):
            raise ParameterError("--replot RESULTS: redraws a finished sweep; give no STORE, --out, --rehearse or "
                                 "period")
        res = run_replot(replot, echo=echo)
        if as_json:
            print_json(encode_json_safe(res))
        else:
            click.echo(f"wrote {res['plot']}" if res.get("plot") else "no plot: pip install 'streamdp[plot]'")
        return
    if store is None:
        raise ParameterError("give STORE (or --replot RESULTS)")
    if out is None:
        raise ParameterError("--out DIR: give the directory to write the sweep to")
    if not rehearse:
        for flag, v in (("--users", rehearse_users), ("--ratings-per-user", rehearse_rpu),
                        ("--shape-epsilon", shape_epsilon)):
            if v is not None:
                raise ParameterError(f"{flag}: only with --rehearse")
    common = dict(methods=methods, epsilons=epsilons, out=out, repeats=repeats, seed=seed, delta=delta, rank=rank,
                  workers=workers, memory_limit=memory_limit, scheduler=scheduler, state=state,
                  over_budget=over_budget, dry_run=dry_run, force=force, echo=echo, users_bound=users_bound,
                  since=since, until=until, window=window, until_segment=until_segment)
    if rehearse:
        res = run_rehearsal(store, users=rehearse_users, ratings_per_user=rehearse_rpu, shape_epsilon=shape_epsilon,
                            **common)
    else:
        res = run_sweep(store, **common, confirm_infinite=lambda: confirm_infinite(store, yes, "--epsilons inf"))
    if as_json:
        print_json(encode_json_safe(res))
        return
    if not dry_run:
        click.echo(format_table(res))
    if res.get("data_window"):
        click.echo("period: " + describe_period(res["data_window"]))
    if not dry_run:
        click.echo(f"wrote {out}/results.csv, results.json" + (f", {res['plot']}" if res.get("plot") else
                   " (no plot: pip install 'streamdp[plot]')"))


def encode_json_safe(obj):
    """``obj`` with non-finite floats as strings (strict JSON)."""
    from streamdp.privacy.ledger import encode_json

    return encode_json(obj)


@main.command()
@click.argument("model")
@click.argument("store")
@click.option("--ridge", type=float, default=None, help="Ridge of the local user solve (default: the model's).")
@click.option("--workers", type=int, default=None, help="Worker threads (default: all cores).")
@memory_limit_option
@scheduler_option
@click.option("--allow-other-store", is_flag=True, help="Evaluate also on a store other than the one MODEL was "
              "trained on (its checksum differs; a re-split of the same ratings gives an optimistic RMSE); the "
              "output then says so (store_matches_model: false with --json).")
@k_option
@ranking_users_option
@relevant_threshold_option
@click.option("--segment", default=None, metavar="N|last", help="Score MODEL on segment N's ratings (1: the first "
              "append; 'last') as the future it must predict, each user's training ratings being the store before "
              "it: MODEL must have been trained on that store (train --until-segment N-1, or before the append).")
@click.option("--json", "as_json", is_flag=True, callback=_quiet_under_json, help="Print one JSON object.")
def evaluate(model, store, ridge, workers, memory_limit, scheduler, allow_other_store, k, ranking_users,
             relevant_threshold, segment, as_json):
    """RMSE/MAE of MODEL on STORE's test split, next to non-private baselines, and the ranking metrics
    (Precision/Recall/NDCG/MAP@k, coverage, popularity bias) of each user's top-k list of items unrated in
    training, beside the most-popular lists (by the model's released counts, and non-private), and a ranking
    verdict: do the lists beat the most-popular chart by the released counts, by what ratio of Recall@k.

    STORE must be the store MODEL was trained on (same checksum) unless --allow-other-store.
    """
    from streamdp.serving.evaluate import evaluate_model, format_evaluation

    ev = evaluate_model(model, store, workers=workers, memory_limit=memory_limit, ridge=ridge,
                        allow_other_store=allow_other_store, scheduler=scheduler, k=k,
                        relevant_threshold=relevant_threshold, ranking_users=ranking_users, segment=segment)
    if as_json:
        print_json(ev)
    else:
        click.echo(format_evaluation(ev))


#: First line of ``streamdp recommend``'s plain-text output (tab-separated, like its rows).
RECOMMEND_HEADER = "item_id\tpredicted_rating"


@main.command()
@click.argument("model")
@click.option("--ratings", "ratings_file", default=None, help="One user's own ratings: lines 'item,rating' "
              "(original item ids; ratings within the model's rating range).")
@click.option("--store", default=None, help="Batch form: recommend for every user of this store (or --users), each "
              "from her own training ratings; needs --out.")
@click.option("--out", default=None, metavar="FILE", help="Batch form: Parquet file to write (columns user_id, rank, "
              "item_id, score; original ids), atomically.")
@click.option("--users", "users_file", default=None, metavar="FILE", help="Batch form: only these users, one "
              "original user id a line.")
@click.option("--top", type=int, default=10, show_default=True, help="How many items to recommend (per user).")
@click.option("--item-names", default=None, metavar="SOURCE", help="Show item names: a store ingested with "
              "--item-names, or an 'id,name' file (the batch form takes --store's names by default).")
@click.option("--ridge", type=float, default=None, help="Ridge of the local user solve (default: the model's).")
@click.option("--workers", type=int, default=None, help="Batch form: worker threads (default: all cores).")
@memory_limit_option
@click.option("--scheduler", default=None, metavar="ADDRESS", help="Batch form: Dask distributed scheduler "
              "(tcp://host:port) whose workers must reach STORE.")
@click.option("--force", is_flag=True, help="Batch form: replace an existing file at --out.")
@click.option("--json", "as_json", is_flag=True, callback=_quiet_under_json, help="Print one JSON object.")
def recommend(model, ratings_file, store, out, users_file, top, item_names, ridge, workers, memory_limit, scheduler,
              force, as_json):
    """Top-N unseen items for one user (--ratings FILE), or for every user of a store (--store STORE --out FILE).

    One user: solved locally from MODEL and their ratings file; prints a header line (item_id, predicted_rating),
    then one tab-separated line per item. Items are ranked by the model's list score (model.json list_scorer: the
    predicted rating plus a weight times the log of the item counts the model released, free post-processing), or,
    for a model whose lists are its ials part's (train --lists; model.json lists), by that part's scores;
    the score shown is the predicted rating. A user none of whose items the model knows gets the most popular
    items by the model's released counts, said on stderr.

    With --item-names, a third column (and "names" in --json) gives each item's name.

    Batch: each user's row is solved from MODEL and her own training ratings in STORE, streamed block by block
    within --memory-limit; writes Parquet (user_id, rank, item_id, score; ranks from 1; score: the predicted
    rating, clipped to the rating range; item_name after item_id when STORE keeps names or --item-names gives them). Under joint DP each list depends on the released model and on that
    user's own data only: it may be shown to that user, but the file (every user's list) must not be published.
    """
    from streamdp.errors import ParameterError
    from streamdp.serving.local import not_personalised_note, personalised, rating_range, read_user_ratings
    from streamdp.serving.model import load_model

    if (ratings_file is None) == (store is None):
        raise ParameterError("give either --ratings FILE (one user) or --store STORE --out FILE (every user)")
    if store is None:
        for flag, v in (("--out", out), ("--users", users_file), ("--scheduler", scheduler)):
            if v is not None:
                raise ParameterError(f"{flag}: only with --store (batch recommendations)")
    elif out is None:
        raise ParameterError("--store: give --out FILE, the Parquet file to write")
    from streamdp.serving.serve import check_n

    top = check_n(top, "--top")  # the library's own check would name its parameter n
    m = load_model(model)
    if store is not None:
        res = m.recommend_all(store, top, out, users=users_file, ridge=ridge, workers=workers, scheduler=scheduler,
                              memory_limit=memory_limit, force=force, item_names=item_names)
        if not personalised(m):
            res["note"] = not_personalised_note(m)
        if as_json:
            print_json(res)
        else:
            if res.get("note"):
                click.echo(f"note: {res['note']}", err=True)
            click.echo(f"wrote {res['out']}: top {res['top']} for {res['users']:,} users ({res['rows']:,} rows) in "
                       f"{res['seconds']:.1f}s; each list is for its user only (joint DP): do not publish the file")
        return
    items, ratings, unknown = read_user_ratings(ratings_file, m.item_ids, rating_range(m))
    recs = m.recommend(zip(m.item_ids[items].tolist(), ratings.tolist()), n=top, ridge=ridge)
    ids, score = [i for i, _ in recs], np.array([s for _, s in recs])
    names = None
    if item_names is not None:
        from streamdp.storage.names import names_for

        names = names_for(item_names, np.asarray(ids, dtype=np.asarray(m.item_ids).dtype), memory_limit).tolist()
    notes = [recs.note] if recs.note else []
    if recs.source == "model" and not personalised(m):
        notes.append(not_personalised_note(m))
    if as_json:
        print_json({"items": ids, "scores": score.round(4).tolist(), "n_ratings_used": int(len(items)),
                    "unknown_items": unknown, "source": recs.source, "personalised": recs.source == "model"
                    and personalised(m), "notes": notes, **({} if names is None else {"names": names})})
        return
    if names is None:
        click.echo("\n".join([RECOMMEND_HEADER] + [f"{i}\t{s:.3f}" for i, s in zip(ids, score)]))
    else:
        click.echo("\n".join([f"{RECOMMEND_HEADER}\tname"] + [f"{i}\t{s:.3f}\t{nm}" for i, s, nm in
                                                              zip(ids, score, names)]))
    if unknown:
        click.echo(f"note: {len(unknown)} rated item(s) unknown to the model were ignored", err=True)
    for note in notes:
        click.echo(f"note: {note}", err=True)


@main.command()
@click.option("--out", default=None, metavar="DIR", help="Directory to keep the demo store and model in, "
              "DIR/ratings.zarr and DIR/model (default: a temporary one, removed at the end).")
@click.option("--force", is_flag=True, help="Replace DIR/ratings.zarr and DIR/model if they are a streamdp store "
              "and model (the store's budget ledger is carried over).")
@click.option("--epsilon", type=EPSILON, default=1.0, show_default=True, help="User-level epsilon of the model.")
@click.option("--json", "as_json", is_flag=True, callback=_quiet_under_json, help="Print one JSON object.")
def demo(out, force, epsilon, as_json):
    """Main job end to end: generate a store -> train als -> evaluate, print RMSE, baselines and privacy spent."""
    from streamdp.workflows.demo import run_demo

    res = run_demo(out, epsilon=epsilon, force=force, echo=None if as_json else click.echo)
    if as_json:
        print_json(res)


@main.command(cls=_LowrankCommand)
@click.argument("store")
@click.option("--rank", type=int, required=True, help="Rank k of the approximation.")
@click.option("--epsilon", type=EPSILON, required=True, help="Epsilon under the bounded row-change relation (see "
              "below); 'inf' runs without noise (non-private, labelled so).")
@click.option("--delta", type=float, default=None,
              help="Delta (default: a power of ten below one over ten times the number of users, at most 1e-6 "
              "(the largest power of ten <= min(1e-6, 1/(10 n_users))).")
@click.option("--out", required=True, help="Directory to write (atomically): privacy.json, model.json, factors.zarr.")
@click.option("--seed", type=int, default=None, help="Seed: reproducible, not private against whoever knows it.")
@click.option("--workers", type=int, default=None, help="Worker threads (default: all cores).")
@memory_limit_option
@scheduler_option
@state_option
@click.option("--over-budget", is_flag=True, help="Release even if the store's privacy budget would be exceeded "
              "(recorded).")
@click.option("--force", is_flag=True, help="Replace an existing streamdp model directory at --out.")
@yes_option
@click.option("--json", "as_json", is_flag=True, callback=_quiet_under_json, help="Print one JSON object.")
def lowrank(store, rank, epsilon, delta, out, seed, workers, memory_limit, scheduler, state, over_budget, force,
            yes, as_json, **options):
    """Private rank-k approximation of STORE's clipped rating matrix; writes its item side to --out.

    The guarantee holds for Hardt & Roth's relation (one user's clipped row changes by L2 norm <= L, users and
    items fixed): WEAKER than the user-level add/remove guarantee of `train`; the output says what it covers.
    """
    from streamdp.methods.lowrank import format_lowrank_summary
    from streamdp.privacy.params import default_delta
    from streamdp.storage.store import open_store
    from streamdp.workflows.training import lowrank as run_lowrank

    import math

    st = open_store(store)
    if math.isinf(epsilon):
        confirm_infinite(store, yes, "--epsilon inf")
    if delta is None:
        delta = default_delta(st.n_users)
    summary = run_lowrank(st, rank=rank, epsilon=epsilon, delta=delta, out=out, seed=seed, workers=workers,
                          memory_limit=memory_limit, over_budget=over_budget, force=force, scheduler=scheduler,
                          state=state, **{k: v for k, v in options.items() if v is not None})
    _report(summary, as_json, format_lowrank_summary)


# ---------------------------------------------------------------------------------------
# privacy: privacy epsilon / privacy calibrate / budget
# ---------------------------------------------------------------------------------------


def _fmt_eps(x: float) -> str:
    return f"{x:.6g}"


@main.group()
def privacy():
    """Accountant queries: epsilon of Gaussian releases, noise calibration."""


@privacy.command("epsilon")
@click.option("--noise-multiplier", "noise_multiplier", type=float, required=True,
              help="Gaussian noise std divided by the L2 sensitivity (0: non-private).")
@click.option("--count", type=int, default=1, show_default=True, help="Number of Gaussian releases composed.")
@click.option("--delta", type=float, required=True, help="Target delta.")
@click.option("--json", "as_json", is_flag=True, callback=_quiet_under_json, help="Print one JSON object.")
def privacy_epsilon(noise_multiplier, count, delta, as_json):
    """Epsilon of COUNT Gaussian releases (PLD accountant; RDP beside it)."""
    from streamdp.privacy import epsilon_of, gaussian_event
    from streamdp.privacy.ledger import encode_json

    r = epsilon_of(gaussian_event(noise_multiplier, count), delta)
    if as_json:
        print_json(encode_json({"noise_multiplier": noise_multiplier, "count": count, **r.to_dict()}))
        return
    click.echo(f"epsilon {_fmt_eps(r.epsilon)} (PLD)   epsilon_rdp {_fmt_eps(r.epsilon_rdp)} (RDP cross-check)   "
               f"for {count} Gaussian release(s), noise multiplier {noise_multiplier:g}, delta {delta:g}, "
               f"dp-accounting {r.dp_accounting_version}")


@privacy.command("calibrate")
@click.option("--epsilon", type=EPSILON, required=True, help="Target epsilon.")
@click.option("--delta", type=float, required=True, help="Target delta.")
@click.option("--count", type=int, default=1, show_default=True,
              help="Number of Gaussian releases composed (Jain et al.: T for Alg. 1, Gamma for Alg. 2).")
@click.option("--json", "as_json", is_flag=True, callback=_quiet_under_json, help="Print one JSON object.")
def privacy_calibrate(epsilon, delta, count, as_json):
    """Smallest Gaussian noise multiplier for (EPSILON, DELTA) over COUNT releases, beside the papers' forms."""
    import math

    from streamdp.errors import ParameterError
    from streamdp.privacy import calibrate_gaussian, epsilon_of, gaussian_event, paper_sigma_jain
    from streamdp.privacy.accountant import check_calibratable
    from streamdp.privacy.ledger import encode_json

    if math.isinf(epsilon):
        raise ParameterError("--epsilon inf: a non-private release needs no noise (multiplier 0), there is "
                             "nothing to calibrate; give a finite epsilon")
    check_calibratable(epsilon, instead="a non-private release needs no noise (multiplier 0)")
    z = calibrate_gaussian(epsilon, delta, count)
    r = epsilon_of(gaussian_event(z, count), delta)
    alg1 = paper_sigma_jain(epsilon, delta, count, "alg1")
    alg2 = paper_sigma_jain(epsilon, delta, count, "alg2")
    out = {"noise_multiplier": z, "epsilon_achieved": r.epsilon, "epsilon_rdp": r.epsilon_rdp, "epsilon": epsilon,
           "delta": delta, "count": count, "paper_jain_alg1": alg1, "paper_jain_alg2": alg2,
           "ratio_alg1": alg1 / z, "ratio_alg2": alg2 / z, "accountant": "pld",
           "dp_accounting_version": r.dp_accounting_version}
    if as_json:
        print_json(encode_json(out))
        return
    click.echo(f"noise multiplier {z:.6g}  (PLD; achieves epsilon {_fmt_eps(r.epsilon)}, RDP "
               f"{_fmt_eps(r.epsilon_rdp)}, for {count} release(s) at delta {delta:g})")
    click.echo(f"Jain et al. Alg. 1  {alg1:.6g}  ({alg1 / z:.2f}x)   sqrt(64 T log(1/delta)) / epsilon")
    click.echo(f"Jain et al. Alg. 2  {alg2:.6g}  ({alg2 / z:.2f}x)   sqrt(256 Gamma log(2/delta)) / epsilon")


@main.command()
@click.argument("store")
@click.option("--set", "set_budget", default=None, metavar="EPSILON,DELTA", help="Set the store's total budget.")
@click.option("--set-user", "set_user", default=None, metavar="EPSILON[,DELTA]",
              help="Set the per-user lifetime cap (an individual Renyi filter; set once: it cannot change after a "
              "release under it). DELTA defaults to the store's default delta.")
@click.option("--settle", is_flag=True, help="Settle reservations of runs that are gone (killed): complete if their "
              "model is in place, else 'stale' (counted as spent); remove their run directories in STORE.state/.")
@click.option("--refund-unreleased", is_flag=True, help="With --settle: mark 'failed' (not counted) the reservations "
              "proven to have released nothing (their run died before it began writing the model).")
@click.option("--restore", is_flag=True, help="Rebuild a missing, damaged or edited STORE/privacy_budget.json from "
              "its journal (privacy_budget.journal, whose hash chain must verify); a lost journal restarts from the "
              "ledger as it is, a journal cut short of STORE/release_witness from the lines that remain, a lost "
              "release key is accepted as lost: each recorded in its history.")
@click.option("--verify", is_flag=True, help="Compose every counted release again from scratch (dp-accounting) and "
              "compare with the spend the composition cache (STORE/privacy_budget.spend) gives: a mismatch is an "
              "error (the cache is then replaced).")
@click.option("--json", "as_json", is_flag=True, callback=_quiet_under_json, help="Print one JSON object.")
def budget(store, set_budget, set_user, settle, refund_unreleased, restore, verify, as_json):
    """Show (or --set, --set-user, --settle, --restore, --verify) the privacy budget of STORE and everything released
    from it; with a per-user budget, the distribution of the users' spend and how many are retired."""
    from streamdp.errors import ParameterError, StoreError
    from streamdp.privacy.budget import StoreBudget, format_budget, parse_budget, shown
    from streamdp.privacy.ledger import encode_json

    if refund_unreleased and not settle:
        raise ParameterError("--refund-unreleased: only with --settle")
    b = StoreBudget(store)
    if verify:
        v = b.verify()
        if not v["match"]:
            raise StoreError(f"{store}: the composition cache privacy_budget.spend claims epsilon {v['cached']:.6g}, "
                             f"but the {v['n_releases']} counted release(s) compose to {v['recomposed']:.6g} from "
                             f"scratch: the cache was edited or damaged (it is now replaced)")
        if not as_json:
            click.echo(f"verified: {v['n_releases']} counted release(s) compose from scratch to the cached spend "
                       f"(epsilon {v['recomposed']:.6g})")
    restored = None
    if restore:
        restored = b.restore()
        if not as_json:
            click.echo(f"restore: {restored['what']}"
                       + "".join(f"; the file it replaced is kept as {p}" for p in restored["set_aside"]))
    if set_budget is not None:
        b.set(*parse_budget(set_budget, name="--set"))
    if set_user is not None:
        from streamdp.privacy.filter import parse_user_budget
        from streamdp.storage.store import open_store

        n_users = open_store(store).n_users
        b.set_user(*parse_user_budget(set_user, n_users=n_users, flag="--set-user"), n_users=n_users)
    settled = stale = None
    if settle:
        from streamdp.stream.driver import sweep_stale_runs

        settled = b.settle(refund_unreleased=refund_unreleased)
        stale = sweep_stale_runs(store)
    n_users = None
    if b.user_budget() is not None:  # the users' spend: read by blocks over the store's users
        from streamdp.storage.store import open_store

        n_users = open_store(store).n_users
    s = shown(b.show(n_users))  # the ledger's records of the data's checksums stay in the store's files
    if as_json:
        extra = {} if settled is None else {"settled": settled, "stale_runs_removed": stale}
        print_json(encode_json({**s, **extra, **({} if restored is None else {"restored": restored})}))
        return
    if settled is not None:
        for r in settled:
            if r["changed"]:
                click.echo(f"settled {r['id']}: {r['before']} -> {r['after']}: {r['why']}")
            else:
                click.echo(f"unchanged {r['id']}: {r['after']}: {r['why']}")
        if not any(r["changed"] for r in settled):
            click.echo("settled: nothing changed" + ("" if settled else " (no reservations to settle)"))
        for d in stale:
            click.echo(f"removed {d}: run directory of a process that is gone")
    click.echo(format_budget(s))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
