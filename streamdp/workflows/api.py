"""The Python API: what ``streamdp train`` does, as one call that returns the released model.

>>> import os, tempfile
>>> import streamdp
>>> d = tempfile.mkdtemp()
>>> store = streamdp.generate(os.path.join(d, "ratings.zarr"), users=3000, items=200, ratings_per_user=20, seed=1,
...                           test_fraction=0.2)
>>> model = streamdp.train(store, method="als", epsilon=1.0, seed=0)
>>> model.summary["guarantee"], model.summary["epsilon_spent"] <= 1.0
('user-level (epsilon, delta)-DP', True)
>>> recs = model.recommend({0: 5.0, 3: 1.0, 7: 4.0}, n=3)  # a user's own ratings, on their side
>>> len(recs), [type(i) for i, _ in recs][0]
(3, <class 'int'>)
>>> len(model.recommend_user(store, 0, n=3))  # user 0 of the store, from her training ratings there
3
>>> users, items, scores = model.recommend_all(store, 3, as_arrays=True)
>>> items.shape == (store.n_users, 3)
True
>>> streamdp.evaluate(model, store)["method"]  # what `streamdp evaluate --json` prints
'als'
>>> path = model.save(os.path.join(d, "model"))
>>> streamdp.load_model(path).predict({0: 5.0}, items=[1, 2]).shape
(2,)
"""

from __future__ import annotations

import os
import shutil
import tempfile

from streamdp.errors import ParameterError, StoreError
from streamdp.jsonio import as_printed
from streamdp.outputs import is_no_space, no_space_reason

__all__ = ["train", "tune", "evaluate", "generate", "ingest", "default_delta"]

#: Names re-exported here from modules that load dp-accounting and SciPy (59 MB of RSS), imported on first
#: use as each function imports what it runs: ``streamdp ingest`` (through :func:`ingest`) then stays within
#: the runtime its ``--memory-limit`` comes on top of (tests/storage/test_ingest_memory.py).
_LAZY = {"default_delta": "streamdp.privacy.params", "Model": "streamdp.serving.model", "load_model": "streamdp.serving.model"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'streamdp.workflows.api' has no attribute {name!r}")


def train(store, *, epsilon: float, method: str | None = None, delta: float | None = None, out: str | None = None,
          rank: int | None = None, seed: int | None = None, workers: int | None = None, memory_limit=None,
          scheduler=None, over_budget: bool = False, force: bool = False, evaluate: bool = True,
          users_bound: int | None = None, k: int = 10, ranking_users: int | str = 10_000,
          allow_nonprivate: bool = False, warm_start=None, **options) -> Model:
    """Train ``method`` on ``store`` with user-level privacy ``epsilon`` and return the released model.

    Exactly what ``streamdp train`` runs (:func:`streamdp.workflows.training.train`): the
    release is reserved in the store's privacy budget before anything is computed,
    the model is written atomically, and, when the store has a test split, evaluated
    beside the non-private baselines. ``out=None`` writes the model to a temporary
    directory, loads it and removes the directory (the budget entry says so):
    :meth:`~streamdp.serving.model.Model.save` writes it somewhere later. The returned
    :class:`~streamdp.serving.model.Model` carries the run's summary in ``model.summary``
    (``test_rmse``, ``baselines``, ``verdict``, ``epsilon_spent``, ...).

    Parameters
    ----------
    store : str or RatingStore
    epsilon : float
        User-level epsilon; ``float("inf")`` trains without noise (labelled non-private), with
        ``allow_nonprivate=True``.
    method : str, optional
        ``streamdp train --method`` name (see ``streamdp.methods.METHODS``); default ``als``, ``ials`` on an
        interaction log (:func:`streamdp.workflows.training.default_method`).
    delta : float, optional
        Default :func:`default_delta` of the run's number of users (``users_bound``, or the count released with
        noise: :mod:`streamdp.privacy.users`).
    users_bound : int, optional
        A public number of users the data owner declares (``--users-bound``): used for the defaults and written
        in the model instead of a noisy count, nothing spent on it; a store with more users is refused.
    items : path or sequence of ids, optional
        The item catalogue the data owner declares (``--items``): the model's items, public, nothing spent on
        them; without it the store's declared catalogue, else one selected privately
        (:mod:`streamdp.privacy.catalogue`).
    k, ranking_users : int, int or "all"
        The evaluation's ranking metrics: list length, and the users measured (a seeded sample of that many,
        or ``"all"``), as :func:`evaluate`.
    allow_nonprivate : bool
        The confirmation ``streamdp train --epsilon inf`` asks for (``--yes``): a non-private release makes the
        store's spend infinite for good, so ``epsilon=inf`` is refused (:class:`~streamdp.errors.ParameterError`,
        nothing released) without it, unless the store's spend is infinite already (as the CLI, which then asks
        nothing). Decision: an argument, not a prompt, since a library call has no terminal to ask on.
    warm_start : path or Model, optional
        A model released earlier (``als``/``irls``, or ``ials`` from ``ials``; same rank) whose item factors start the run instead of random
        ones (``--warm-start``): post-processing, free in privacy (the ledger's epsilon is a cold run's); items
        matched by id, new items start cold; ``iters`` defaults to a quarter of the cold default.
    **options
        The method's options, as the CLI's flags without dashes (``iters=5``, ``mechanism="laplace"``), and the
        period to train on: ``since``, ``until``, ``window``, ``until_segment`` (as ``train``'s flags).
    """
    from streamdp.workflows.training import train as train_model

    _confirm_nonprivate(store, epsilon, allow_nonprivate)
    return _released(out, lambda out: train_model(
        store, method=method, out=out, epsilon=epsilon, delta=delta, rank=rank, seed=seed, workers=workers,
        scheduler=scheduler, memory_limit=memory_limit, over_budget=over_budget, force=force,
        evaluate_test=evaluate, users_bound=users_bound, k=k, ranking_users=ranking_users, warm_start=warm_start,
        **options))


def _confirm_nonprivate(store, epsilon, allow: bool) -> None:
    """Refuse ``epsilon=inf`` without ``allow`` when ``store``'s spend is finite (see :func:`train`)."""
    import math

    from streamdp.privacy.accountant import parse_epsilon
    from streamdp.privacy.budget import COUNTED, StoreBudget

    if allow or not math.isinf(parse_epsilon(epsilon)):
        return
    from streamdp.storage.store import open_store

    path = (store if hasattr(store, "path") else open_store(store)).path  # a missing store says so first
    if any(math.isinf(float(e["epsilon"])) for e in StoreBudget(path).entries() if e["status"] in COUNTED):
        return
    raise ParameterError(f"epsilon=inf: a non-private release makes {path}'s spend infinite for good; pass "
                         f"allow_nonprivate=True to confirm (the CLI's --yes)")


def _released(out: str | None, run) -> Model:
    """``run(out)`` writes a model and returns its summary; the loaded model with ``.summary``.

    ``out=None``: the model is written to a temporary directory, loaded, and the
    directory removed (``model.path`` is then ``"(in memory)"``).
    """
    from streamdp.serving.model import load_model

    tmp = None
    if out is None:
        tmp = tempfile.mkdtemp(prefix="streamdp-model-")
        out = os.path.join(tmp, "model")
    try:
        summary = run(out)
        model = load_model(out)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    if tmp is not None:
        model.path = "(in memory)"
        summary["out"] = None
    model.summary = summary
    return model


def tune(store, *, epsilon: float, method: str | None = None, out: str | None = None, grid=None, delta: float | None = None,
         seed: int | None = None, workers: int | None = None, memory_limit=None, over_budget: bool = False,
         force: bool = False, evaluate: bool = True, users_bound: int | None = None, items=None,
         since=None, until=None, window=None, until_segment=None) -> Model:
    """Choose ``method``'s configuration privately and return the released model (``streamdp tune``).

    Exactly what ``streamdp tune`` runs (:func:`streamdp.workflows.tune.tune`): the grid's
    candidates, their noisy validation losses and the chosen configuration's release
    are composed in one ledger within ``epsilon`` and charged to the store's budget.
    ``grid`` is ``{"rank": [4, 8], "iters": [0, 5]}`` or ``["rank=4,8", ...]`` (``None``:
    the method's default grid). ``out=None``, ``users_bound``, ``items`` and the period (``since``, ``until``,
    ``window``, ``until_segment``) work as for :func:`train`.
    ``model.summary["tuning"]`` holds every candidate's noisy loss and the choice (``method="ials"``: each
    candidate's noisy held-out hits in the users' top 10, ``noisy_hits``, higher is better).
    """
    from streamdp.workflows.tune import tune as run_tune

    return _released(out, lambda out: run_tune(
        store, epsilon=epsilon, method=method, out=out, grid=grid, delta=delta, seed=seed, workers=workers,
        memory_limit=memory_limit, over_budget=over_budget, force=force, evaluate_test=evaluate,
        users_bound=users_bound, items=items, since=since, until=until, window=window, until_segment=until_segment))


def ingest(source=None, out: str | None = None, *, train=None, test=None, columns=None, implicit: bool = False,
           budget=None, user_budget=None, test_fraction: float = 0.0, split: str | None = None,
           last_n: int | None = None,
           item_names: str | None = None, seed: int | None = 0, force: bool = False, **options) -> RatingStore:
    """Build a rating store at ``out`` from files or in-memory data (``streamdp ingest``) and return it opened.

    Parameters
    ----------
    source : path, DataFrame, pyarrow.Table, scipy.sparse matrix, or a list of these
        A rating file or interaction log (CSV, TSV, u.data, ``::``, whitespace,
        Parquet; ``.gz``), detected as ``streamdp ingest`` detects it; a pandas or
        polars DataFrame or a pyarrow Table (columns found by name as in a Parquet
        file: ``user``/``userId``, ``item``/``movieId``, ``rating``, ``timestamp``, or
        a ``count``/``plays``/``clicks`` column for an interaction log; other columns
        ignored); a scipy.sparse matrix (rows users, columns items, stored entries the
        ratings: ids are the row and column indices). In-memory data is streamed into
        the pipeline in record batches (:mod:`streamdp.storage.frames`), never copied
        whole, and goes through the same validation as a file.
    out : str
        The store's directory (must not exist unless ``force``).
    train, test : as ``source``, optional
        Your own split (``--train FILE --test FILE``, e.g. MovieLens ``u1.base``/``u1.test``):
        ``train`` instead of ``source``, ``test`` the held-out ratings, read and checked the
        same way. Users and items only in ``test`` are kept, with no training ratings
        (:mod:`streamdp.storage.ingest`, "Splits"); the store's ``split`` attribute records it.
    split : str, optional
        ``"random"``, ``"temporal"`` (each user's latest ``test_fraction``, by the timestamp
        column) or ``"last-n"`` (each user's ``last_n`` latest): ``--split``.
    item_names : str, optional
        A file of ``id,name`` lines kept in the store (public metadata, :mod:`streamdp.storage.names`).
    columns : str or sequence, optional
        ``user,item,rating[,timestamp]`` (or ``user,item[,count]``): names or 0-based
        positions, as ``--columns``.
    implicit : bool
        Read the input as an interaction log (clicks, plays, purchases): an implicit
        store, repeated pairs summed into counts (``--implicit``).
    budget : (float, float) or str, optional
        ``(epsilon, delta)`` or ``"E,D"``: also set the store's privacy budget
        (:class:`streamdp.privacy.budget.StoreBudget`), checked before anything is
        read (and against the number of users once the input is parsed, before
        anything is written), set once the store is in place.
    user_budget : str or (float, float), optional
        ``"EPS[,DELTA]"``: also cap every user's loss over all releases from the store (``--user-budget``,
        :mod:`streamdp.privacy.filter`); checked like ``budget``.
    append : bool, in ``**options``
        ``out`` is an existing store: add the data to it as a new segment (``streamdp ingest NEW --append
        STORE``, :mod:`streamdp.storage.append`); its rating range, pair rule, split and id kinds apply, its
        budget ledger is kept; ``streamdp compact`` (:func:`streamdp.storage.compact.compact`) folds the segments.
    test_fraction, seed, force, **options
        As the flags of ``streamdp ingest`` (:func:`streamdp.storage.ingest.ingest`:
        ``rating_range``, ``out_of_range``, ``count_cap``, ``skip_bad_lines``,
        ``memory_limit``, ``block_users``, ``fmt`` and ``sep`` for files).

    Returns
    -------
    RatingStore

    Raises
    ------
    InputError
        Bad input: the file and line, or the frame and row (0-based + 1), of the first bad value.
    ParameterError
        A bad option, or a source of a kind ingest does not read.

    >>> import os, tempfile, pandas as pd
    >>> df = pd.DataFrame({"user": [7, 7, 9], "item": ["a", "b", "a"], "rating": [4.0, 3.0, 5.0]})
    >>> s = ingest(df, os.path.join(tempfile.mkdtemp(), "s.zarr"))
    >>> s.n_users, s.n_items, s.n_ratings, s.attrs["sources"][0]["format"]
    (2, 2, 3, 'pandas')
    """
    if (source is None) == (train is None):
        raise ParameterError("ingest: give either source or train= (with test=, your own split)")
    if out is None:
        raise ParameterError("ingest: give out, the store's directory")
    if train is not None and test is None:
        raise ParameterError("ingest: train= goes with test=, the held-out ratings (or pass the data as source)")
    # ingest reads files and frames with pyarrow (42 MB of RSS): imported here, so that streamdp.train does not
    from streamdp.storage.ingest import ingest as ingest_files

    if options.pop("append", False):  # onto an existing store, as a new segment (storage/append.py)
        from streamdp.storage.append import append as ingest_files  # noqa: F811 - the same signature
        if user_budget is not None:
            raise ParameterError("--user-budget: not with --append (streamdp budget STORE --set-user sets it)")
        if budget is not None:
            raise ParameterError("--budget: not with --append (the store's budget ledger is kept as it is; "
                                 "streamdp budget STORE --set changes it)")

    inputs = _inputs(train if source is None else source, columns, implicit, options)
    if test is not None:
        options["test_inputs"] = _inputs(test, columns, implicit, options)
    if columns is not None and not isinstance(columns, str):
        columns = ",".join(str(c) for c in columns)
    options.update(columns=columns, implicit=implicit, test_fraction=test_fraction, seed=seed, force=force,
                   split=split, last_n=last_n, item_names=None if item_names is None else os.fspath(item_names))
    if user_budget is not None:
        return _ingest_user_budget(inputs, out, budget, user_budget, options, ingest_files)
    if budget is None:
        return ingest_files(inputs, out, **options)
    from streamdp.privacy import check_privacy_params  # the ledger (dp-accounting): only with a budget
    from streamdp.privacy.budget import StoreBudget, parse_budget

    budget = parse_budget(budget)

    def check_users(n_users: int) -> None:
        check_privacy_params(*budget, n_users=n_users)

    def set_budget(store) -> None:
        try:
            StoreBudget(store.path).set(*budget)
        except OSError as exc:  # the store is in place: say so, not "nothing was written"
            if not is_no_space(exc):
                raise
            raise StoreError(f"{store.path}: the store was written but its budget was not set: "
                             f"{no_space_reason(exc)} writing its ledger; free some space and run "
                             f"streamdp budget {store.path} --set {budget[0]:g},{budget[1]:g}") from None

    return ingest_files(inputs, out, check_users=check_users, after_write=set_budget, **options)


def _ingest_user_budget(inputs, out, budget, user_budget, options, ingest_files) -> RatingStore:
    """:func:`ingest` with ``user_budget`` (and maybe ``budget``): both checked against the number of users once the
    input is parsed, before anything is written, and set once the store is in place."""
    from streamdp.privacy import check_privacy_params
    from streamdp.privacy.budget import StoreBudget, parse_budget
    from streamdp.privacy.filter import filter_parameters, parse_user_budget

    budget = parse_budget(budget)
    parse_user_budget(user_budget, n_users=1)  # its form, before anything is read
    caps = {}

    def check_users(n_users: int) -> None:
        if budget is not None:
            check_privacy_params(*budget, n_users=n_users)
        caps["user"] = parse_user_budget(user_budget, n_users=n_users)
        filter_parameters(*caps["user"])  # a cap no order converts to: refused before anything is written
        caps["n_users"] = n_users

    def set_budgets(store) -> None:
        b = StoreBudget(store.path)
        if budget is not None:
            b.set(*budget)
        b.set_user(*caps["user"], n_users=store.n_users)

    return ingest_files(inputs, out, check_users=check_users, after_write=set_budgets, **options)


def _inputs(source, columns, implicit: bool, options: dict) -> list:
    """The inputs of :func:`ingest`: paths as ``str``, in-memory data as the :class:`Spec` of its frame."""
    from streamdp.storage.frames import frame_spec, frame_spec_name, is_frame

    many = isinstance(source, (list, tuple))
    out = []
    for x in (source if many else [source]):
        if is_frame(x):
            for flag in ("fmt", "sep"):
                if options.get(flag) is not None:
                    raise ParameterError(f"{flag}: only for files; a {frame_spec_name(x)} has typed columns")
            out.append(frame_spec(x, columns=columns, implicit=implicit))
        elif isinstance(x, (str, os.PathLike)):
            out.append(os.fspath(x))
        else:
            raise ParameterError(f"source: a {type(x).__module__}.{type(x).__name__} is not something ingest reads "
                                 f"(a path, a pandas or polars DataFrame, a pyarrow Table or a scipy.sparse matrix"
                                 f"{'' if many else ', or a list of these'})")
    return out


def evaluate(model, store, *, k: int = 10, relevant_threshold: float | None = None, ridge: float | None = None,
             allow_other_store: bool = False, workers: int | None = None, memory_limit=None, scheduler=None,
             ranking_users: int | str = 10_000, segment=None) -> dict:
    """Evaluate ``model`` on ``store``'s test split: the dict ``streamdp evaluate --json`` prints.

    Exactly what ``streamdp evaluate`` runs (:func:`streamdp.serving.evaluate.evaluate_model`), with
    its numbers as plain Python floats and ints: ``rmse``, ``mae`` and ``baselines`` (the
    non-private global-mean, item-mean, damped-item-mean and user-item-bias predictors),
    ``verdict`` (whether the model beats the best of them), and ``ranking``
    (Precision/Recall/NDCG/MAP@``k`` of each user's top-``k`` list of items she did not
    rate in training, beside the most-popular lists); on an implicit store, the ranking
    metrics only. Evaluation reads the test split, which is the data owner's: it costs
    no privacy budget because its result is for the owner, not released.

    Parameters
    ----------
    model : str or Model
        A model directory or a loaded model.
    store : str or RatingStore
        The store the model was trained on (with a test split), unless ``allow_other_store``.
    k : int
        List length of the ranking metrics.
    relevant_threshold : float, optional
        A held-out rating at or above it is relevant (default: the top 20% of the rating range).
    ranking_users : int or "all"
        Users the ranking metrics are measured on: a seeded sample of that many (the output's
        ``ranking.n_users``, ``n_users_evaluable`` and ``standard_error`` say how many and how precise),
        or ``"all"``. RMSE and MAE always cover every test rating.
    ridge : float, optional
        Ridge of each user's local solve (default: the model's).
    segment : int or "last", optional
        Score on this segment's ratings as the future of the store before it (``evaluate --segment``).
    """
    from streamdp.serving.evaluate import evaluate_model

    return as_printed(evaluate_model(model, store, workers=workers, memory_limit=memory_limit, ridge=ridge,
                                     allow_other_store=allow_other_store, scheduler=scheduler, k=k,
                                     relevant_threshold=relevant_threshold, ranking_users=ranking_users,
                                     segment=segment))


def generate(out: str, *, users: int = 10_000, items: int = 2_000, ratings_per_user: float = 50.0, rank: int = 8,
             seed: int = 0, test_fraction: float = 0.0, force: bool = False, **kw) -> RatingStore:
    """A synthetic low-rank, power-law store (``streamdp generate``); returns the opened store."""
    from streamdp.storage.generate import generate_store

    return generate_store(out, n_users=users, n_items=items, ratings_per_user=ratings_per_user, rank=rank,
                          seed=seed, test_fraction=test_fraction, force=force, show_progress=False, **kw)
