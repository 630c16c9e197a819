"""Privacy/utility of ``--method als`` / ``irls`` under Gaussian, Laplace and Huber noise, beside the baselines.

    python bench/als_privacy.py [--users 200000] [--epsilons 0.5,1,2,5,10,inf] [--seeds 2]
                                [--methods als,irls] [--mechanisms gaussian,laplace,huber] [--real]

Generates, in a temporary directory, the store of issue 9 (``streamdp generate
--users 200000 --items 1000 --ratings-per-user 20 --rank 8 --seed 11 --test-fraction
0.2``) and prints, in one run, the test RMSE (users solved locally from the released
item side, mean over ``--seeds``) of every (method, mechanism, epsilon), next to the
non-private global-mean and item-mean baselines, the private item-mean baseline
(``--method means`` at the same epsilon) and ``--method oja`` at the same epsilon.
``--real`` adds ML-100K and FilmTrust (20% split) from ../shared/data when present,
with scikit-surprise's SVD (non-private) on the same split.

The aim (issue 9): at epsilon 1, als closes at least half (aim 80%) of the gap from
the item mean to non-private ALS; at every epsilon it beats the private item mean and
oja; on the real stores it is never worse than the item mean by more than 0.005.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile
import time


def fit_timed(store, method, epsilon, seed, workers=2, delta=None, **opts):
    """``(fitted, seconds)``: one model fitted on the engine (the fit's wall time only)."""
    from streamdp.methods import get_method
    from streamdp.stream.engine import Engine

    m = get_method(method)(epsilon=epsilon, delta=delta_for(store) if delta is None else delta, seed=seed, **opts)
    with Engine(store, workers=workers, memory_limit="8GB", state_bytes=m.state_bytes(store)) as eng:
        t = time.perf_counter()
        f = m.fit(store, eng)
        return f, time.perf_counter() - t


def fitted_evaluation(store, fitted, workers=1) -> dict:
    """:func:`streamdp.serving.evaluate.evaluate_model` of a fitted model (saved to a temporary directory): RMSE and the
    ranking metrics at k = 10 beside the most-popular lists."""
    from streamdp.serving.evaluate import evaluate_model

    d = tempfile.mkdtemp(prefix="bench-model-")
    try:
        fitted.save(os.path.join(d, "m"))
        return evaluate_model(os.path.join(d, "m"), store, baselines=False, workers=workers)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def fitted_rmse(store, fitted, workers=2) -> float:
    """Test RMSE of a fitted model: saved to a temporary directory, evaluated as the users' devices would."""
    from streamdp.serving.evaluate import evaluate_model

    d = tempfile.mkdtemp(prefix="bench-model-")
    try:
        out = os.path.join(d, "m")
        fitted.save(out)
        return evaluate_model(out, store, baselines=False, ranking=False, workers=workers)["rmse"]
    finally:
        shutil.rmtree(d, ignore_errors=True)


def fit_rmse(store, method, epsilon, seed, workers=2, delta=None, **opts):
    """Test RMSE of one model (fitted on the engine, saved, evaluated as a user's device would)."""
    return fitted_rmse(store, fit_timed(store, method, epsilon, seed, workers, delta, **opts)[0], workers)


def delta_for(store) -> float:
    """The CLI's default delta (:func:`streamdp.workflows.api.default_delta` of the store's number of users)."""
    from streamdp.workflows.api import default_delta

    return default_delta(store.n_users)


def split_frame(store, split):
    """``(users, items, ratings)`` of one split of ``store``, whole, in memory (the peers need it so)."""
    import numpy as np

    parts = [store.read_block(b, split) for b in range(store.n_blocks)]
    users = np.concatenate([p.first_user + np.repeat(np.arange(p.n_users), np.diff(p.indptr)) for p in parts])
    return users, np.concatenate([p.items for p in parts]), np.concatenate([p.ratings for p in parts])


def surprise_fit(store, seed=0):
    """scikit-surprise SVD (its defaults) on the train split: ``(test RMSE, wall seconds of the fit)``."""
    import numpy as np
    import pandas as pd
    from surprise import SVD, Dataset, Reader

    u, i, r = split_frame(store, "train")
    ds = Dataset.load_from_df(pd.DataFrame({"u": u, "i": i, "r": r}),
                              Reader(rating_scale=(store.rating_min, store.rating_max))).build_full_trainset()
    algo = SVD(random_state=seed)
    t = time.perf_counter()
    algo.fit(ds)
    dt = time.perf_counter() - t
    tu, ti, tr = split_frame(store, "test")
    pred = np.array([algo.predict(a, b).est for a, b in zip(tu, ti)])
    return math.sqrt(float(np.mean((pred - tr) ** 2))), dt


def surprise_rmse(store, seeds=3):
    """scikit-surprise SVD (its defaults) on the store's train split, RMSE on its test split (mean of seeds)."""
    return statistics.mean(surprise_fit(store, s)[0] for s in range(seeds))


def table(store, name, args):
    from streamdp.serving.evaluate import evaluate_model  # noqa: F401  (imported for the side effect of compiling early)

    eps_list = [float(e) for e in args.epsilons.split(",")]
    seeds = range(args.seeds)

    def mean_rmse(method, eps, **opts):
        n = 1 if not math.isfinite(eps) else len(seeds)
        return statistics.mean(fit_rmse(store, method, eps, s, **opts) for s in list(seeds)[:n])

    t0 = time.perf_counter()
    base = _baselines(store)
    rows = []
    header = ["method", "mechanism"] + [("inf" if not math.isfinite(e) else f"{e:g}") for e in eps_list]
    rows.append(["means (private item mean)", "gaussian"] + [f"{mean_rmse('means', e):.4f}" for e in eps_list])
    rows.append(["oja", "gaussian"] + [f"{mean_rmse('oja', e):.4f}" for e in eps_list])
    for method in args.methods.split(","):
        for mech in args.mechanisms.split(","):
            row = [method, mech]
            for e in eps_list:
                if not math.isfinite(e) and mech != args.mechanisms.split(",")[0]:
                    row.append("same")  # no noise: the mechanism does not matter
                    continue
                row.append(f"{mean_rmse(method, e, mechanism=mech):.4f}")
                print(f"  {name} {method} {mech} eps={e:g}: {row[-1]}", file=sys.stderr, flush=True)
            rows.append(row)
    print(f"\n### {name}: {store.n_users:,} users, {store.n_items:,} items, {store.n_ratings:,} train ratings "
          f"(test RMSE, mean of {args.seeds} seeds; delta {delta_for(store):g})\n")
    print(f"non-private baselines: global mean {base['global_mean']['rmse']:.4f}, item mean "
          f"{base['item_mean']['rmse']:.4f}" + (f", scikit-surprise SVD {surprise_rmse(store):.4f}" if args.real and
                                                 name != "generated" else ""))
    print()
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print(f"\n({time.perf_counter() - t0:.0f}s)")


def _baselines(store):
    """The non-private baselines of :func:`streamdp.serving.evaluate.evaluate_model`, from a zero model."""
    import numpy as np

    from streamdp.serving.evaluate import evaluate_model
    from streamdp.serving.model import Model

    m = Model(path="(baselines)", item_factors=np.zeros((store.n_items, 1), np.float32),  # zeros: any order
              item_bias=np.zeros(store.n_items, np.float32), item_ids=store.item_ids(),
              global_mean=(store.rating_min + store.rating_max) / 2, info={}, ledger=None)
    return evaluate_model(m, store, ranking=False)["baselines"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=200_000)
    ap.add_argument("--epsilons", default="0.5,1,2,5,10,inf")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--methods", default="als,irls")
    ap.add_argument("--mechanisms", default="gaussian,laplace,huber")
    ap.add_argument("--real", action="store_true", help="also ML-100K and FilmTrust from ../shared/data")
    ap.add_argument("--no-generated", action="store_true", help="only the real stores")
    args = ap.parse_args(argv)

    tmp = tempfile.mkdtemp(prefix="bench-als-")
    try:
        if not args.no_generated:
            table(generated_store(tmp, args.users), "generated", args)
        if args.real:
            for name in REAL_STORES:
                st = real_store(tmp, name)
                if st is not None:
                    table(st, name, args)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


#: The real stores of the privacy benches: file under ../shared/data and declared rating range.
REAL_STORES = {"ML-100K": ("ml-100k/u.data", "1,5"), "FilmTrust": ("filmtrust/ratings.txt", "0.5,4")}


def generated_store(tmp, users):
    """The generated store of the privacy benches (issue 9's): ``users`` x 1,000 items, 20 ratings each, rank 8."""
    from streamdp.storage.generate import generate_store

    return generate_store(f"{tmp}/g.zarr", n_users=users, n_items=1000, ratings_per_user=20, rank=8, seed=11,
                          test_fraction=0.2, show_progress=False)


def real_store(tmp, name):
    """``name`` of :data:`REAL_STORES` ingested with a 20% per-user split; ``None`` (said) when the data is absent."""
    from bench import declared_items
    from streamdp.storage.ingest import ingest

    rel, rr = REAL_STORES[name]
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", rel)
    if not os.path.exists(path):
        print(f"\n{name}: {path} absent, skipped")
        return None
    return ingest([path], f"{tmp}/{name}.zarr", test_fraction=0.2, seed=0, rating_range=rr,
                  items=declared_items(path, tmp))


if __name__ == "__main__":
    main()
