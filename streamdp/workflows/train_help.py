"""``streamdp train --help``, generated from the methods' declarations so it cannot drift from them.

Without ``--method``, the help lists the options every method shares and the methods
(their ``SUMMARY``), and says how to get one method's options. With ``--method X``
(anywhere on the command line), it lists the shared options a run sets, then ``X``'s
main options (its ``MAIN_OPTIONS``: iterations, mechanism...), then under "Expert
options" the rest of ``X``'s options (in declaration order) and the run's resources
(workers, memory, scheduler), each with the default the declaration gives, and ``--rank`` with ``X``'s default rank
(:meth:`~streamdp.methods.base.Method.default_rank`) and what the rank means for
``X`` (:mod:`streamdp.workflows.catalog`).

Parsing is unchanged: every method's flags are accepted by ``train``, and a flag of
another method is refused by the method with a one-line error (``--passes: not an
option of --method als``).

Examples
--------
>>> method_in_args(["ratings.zarr", "--method", "oja", "--help"])
'oja'
>>> method_in_args(["--method=fw", "-h"])
'fw'
>>> method_in_args(["ratings.zarr", "--", "--method", "oja"]) is None
True
"""

from __future__ import annotations

from collections import Counter

from streamdp.methods import METHODS, get_method
from streamdp.workflows.catalog import CATALOG, default_rank, guarantee_kind

__all__ = ["method_in_args", "option_record", "rank_help", "split_options", "format_train_options",
           "HELP_METHOD", "EXPERT_RUN_OPTIONS"]

#: ``ctx.meta`` key of the ``--method`` value seen on the command line, for the help.
HELP_METHOD = "streamdp.help_method"

_TYPE_METAVAR = {int: "INTEGER", float: "FLOAT", str: "TEXT"}


def method_in_args(args) -> str | None:
    """The value of the last ``--method`` among ``args`` (before a ``--``), or ``None``."""
    found = None
    it = iter(args)
    for a in it:
        if a == "--":
            break
        if a == "--method":
            found = next(it, None)
        elif a.startswith("--method="):
            found = a.split("=", 1)[1]
    return found


def option_record(o) -> tuple[str, str]:
    """``(flags, help)`` of one declared :class:`~streamdp.methods.options.Option`, as click prints them.

    >>> from streamdp.methods.options import Option
    >>> option_record(Option("step", ("fixed", "decay"), "the step rule", default="fixed"))
    ('--step [fixed|decay]', 'the step rule (default fixed)')
    >>> option_record(Option("tiering", bool, "hot items first", default=False))[0]
    '--tiering / --no-tiering'
    """
    if o.type is bool:
        flags = f"{o.flag} / --no-{o.flag[2:]}"
    elif o.is_choice:
        flags = f"{o.flag} [{'|'.join(o.type)}]"
    else:
        flags = f"{o.flag} {o.metavar or _TYPE_METAVAR[o.type]}"
    return flags, o.describe()


def rank_help(classes: dict) -> str:
    """``--rank``'s help over ``classes`` (name -> method class): the usual default and each exception."""
    plain = "number of factors k"
    ranks = {m: default_rank(c) for m, c in classes.items()}
    usual = Counter(ranks.values()).most_common(1)[0][0]
    text = f"Number of factors k (default {usual})."
    for m in sorted(classes):
        meaning = CATALOG[m].rank if m in CATALOG else plain
        if not getattr(classes[m], "FITS_FACTORS", True):
            text += f" {m}: not used (it fits no factors)."
        elif ranks[m] != usual or meaning != plain:
            text += f" {m}: the {meaning}, default {ranks[m]}."
    return text


#: ``train``'s own options a run rarely sets (resources, the user-count declaration, the budget override): the help
#: lists them under "Expert options" after the method's.
EXPERT_RUN_OPTIONS = ("users_bound", "workers", "memory_limit", "scheduler", "state", "over_budget")


def split_options(cls) -> tuple[list, list]:
    """``(main, expert)``: ``cls.OPTIONS`` split by ``cls.MAIN_OPTIONS`` (main ones in that order, the rest as
    declared)."""
    by_name = {o.name: o for o in cls.OPTIONS}
    main = [by_name[n] for n in cls.MAIN_OPTIONS]
    return main, [o for o in cls.OPTIONS if o.name not in cls.MAIN_OPTIONS]


def format_train_options(cmd, ctx, formatter, method_option_names: set) -> None:
    """Write ``train``'s option sections into ``formatter`` (click's ``format_options`` of the command).

    Order: the options every run sets (epsilon, rank, out...), the method and its main options, then
    "Expert options": the method's others and the run's resources. ``--rank`` is left out for a method that
    fits no factors (``means``: ``train`` refuses it there).
    """
    name = ctx.meta.get(HELP_METHOD)
    cls = get_method(name) if name is not None else None  # an unknown name: one line listing the methods
    common, run = [], []
    for p in cmd.get_params(ctx):
        if p.name in method_option_names:
            continue
        if cls is not None and p.name == "rank" and not cls.FITS_FACTORS:
            continue
        rec = p.get_help_record(ctx)
        if rec is None:
            continue
        if cls is not None and p.name == "rank":
            meaning = CATALOG[cls.name].rank if cls.name in CATALOG else "number of factors k"
            rec = (rec[0], f"{meaning[0].upper()}{meaning[1:]} (default {default_rank(cls)}).")
        (run if p.name in EXPERT_RUN_OPTIONS else common).append(rec)
    with formatter.section("Options"):
        formatter.write_dl(common)
    if cls is None:
        with formatter.section("Expert options (resources and budget)"):
            formatter.write_dl(run)
        with formatter.section("Methods"):
            formatter.write_dl([(m, METHODS[m].SUMMARY) for m in sorted(METHODS)])
        formatter.write_paragraph()
        formatter.write_text("A method's own options, with their defaults: streamdp train --method METHOD --help. "
                             "Guarantee, release and when to use each method: streamdp methods.")
        return
    info = CATALOG.get(cls.name)
    with formatter.section(f"Method {cls.name}"):
        formatter.write_text(cls.SUMMARY + ".")
        if not cls.FITS_FACTORS:
            formatter.write_text("It fits no factors: --rank does not apply.")
        if info is not None:
            formatter.write_dl([("guarantee", f"{guarantee_kind(cls)}: {info.guarantee}"), ("releases", info.releases),
                                ("use it", info.when)])
    main, expert = split_options(cls)
    with formatter.section(f"Options of --method {cls.name}"):
        if main:
            formatter.write_dl([option_record(o) for o in main])
        else:
            formatter.write_text("none beyond the options above; the expert options below have defaults derived "
                                 "from the store and epsilon.")
    with formatter.section("Expert options (their defaults are derived from the store and epsilon)"):
        formatter.write_dl([option_record(o) for o in expert] + run)
