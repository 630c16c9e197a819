"""Seconds per pass of every method on three schedulers of the same engine, side by side.

    python bench/engine.py [--users 60000] [--repeats 3] [--methods als,oja,...] [--store PATH]

Generates (or reuses with ``--store``) a store, then trains every method in
``--methods`` (seeded, ``--epsilon 1``, no evaluation) on

* **threads**: today's local thread pool (``scheduler=None``, ``--workers``);
* **dask**: Dask distributed in this process (``scheduler="dask"``,
  ``Client(processes=False)`` with ``--workers`` threads);
* **cluster**: a 2-process ``LocalCluster`` (one thread each), the path of
  ``--scheduler tcp://...`` (blocks read, tasks pickled and results sent back).

Each scheduler trains once to warm up (Numba compiles in every worker process),
then ``--repeats`` times; a run's passes are counted (``Engine.map_reduce`` and
``Engine.foreach`` calls) and the median seconds per pass is printed with the
ratios dask/threads and cluster/threads of the same run, and whether the released
item factors are bit-identical to the thread pool's. ``sgd``/``sgld`` run with
``--epoch-scheme blocks`` (their epochs as engine passes; Hogwild is refused on a
cluster), 3 epochs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

METHOD_OPTIONS = {"public-private": {"public_fraction": 0.3},
                  "sgd": {"epsilon": float("inf"), "epochs": 3, "epoch_scheme": "blocks"},
                  "sgld": {"epochs": 3, "epoch_scheme": "blocks"}, "fw": {"rank": 6}}
ALL = "als,means,oja,svd,fw,public-private,lowrank,sgld,sgd"


def _fit(store, method, scheduler, workers, memory_limit):
    """One seeded fit on the engine; ``(seconds, passes, item_factors)``."""
    from streamdp.methods import get_method
    from streamdp.methods.lowrank import LowRank
    from streamdp.stream.engine import Engine

    kw = {"epsilon": 1.0, "delta": 1e-6, "rank": 4, "seed": 3}
    kw.update(METHOD_OPTIONS.get(method, {}))
    cls = LowRank if method == "lowrank" else get_method(method)
    m = cls(**kw)
    passes = [0]
    with Engine(store, workers=workers, scheduler=scheduler, memory_limit=memory_limit,
                state_bytes=m.state_bytes(store)) as eng:
        for name in ("map_reduce", "foreach"):
            orig = getattr(eng, name)

            def counted(*a, _orig=orig, **k):
                passes[0] += 1
                return _orig(*a, **k)

            setattr(eng, name, counted)
        t = time.perf_counter()
        fitted = m.fit(store, eng)
        sec = time.perf_counter() - t
    return sec, passes[0], np.asarray(fitted.item_factors)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=60_000)
    ap.add_argument("--items", type=int, default=2_000)
    ap.add_argument("--ratings-per-user", type=float, default=40.0)
    ap.add_argument("--methods", default=ALL)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--store", default=None, help="reuse this store instead of generating one")
    ap.add_argument("--memory-limit", default="4GB")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    import dask
    import distributed

    from streamdp.storage.generate import generate_store
    from streamdp.storage.store import open_store

    tmp = None
    try:
        if args.store:
            store = open_store(args.store)
        else:
            tmp = tempfile.mkdtemp(prefix="bench-engine-", dir="/tmp")
            store = generate_store(os.path.join(tmp, "s.zarr"), n_users=args.users, n_items=args.items,
                                   ratings_per_user=args.ratings_per_user, rank=4, seed=1,
                                   block_users=max(1000, args.users // 16), show_progress=False)
        print(f"store: {store.n_users} users, {store.n_items} items, {store.n_ratings} ratings, "
              f"{store.n_blocks} blocks; {args.workers} workers, median of {args.repeats}", file=sys.stderr)
        rows = []
        with dask.config.set({"temporary-directory": tmp or tempfile.gettempdir(),
                              "distributed.worker.daemon": False}), \
                distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                         dashboard_address=None) as cluster, \
                distributed.Client(cluster, set_as_default=False) as client:
            for method in args.methods.split(","):
                res = {}
                for name, sch in (("threads", None), ("dask", "dask"), ("cluster", client)):
                    _fit(store, method, sch, args.workers, args.memory_limit)  # warm-up (Numba in each process)
                    runs = [_fit(store, method, sch, args.workers, args.memory_limit) for _ in range(args.repeats)]
                    res[name] = (statistics.median(r[0] / max(r[1], 1) for r in runs), runs[0][1], runs[0][2])
                ref = res["threads"][2]
                row = {"method": method, "passes": res["threads"][1]}
                for name in ("threads", "dask", "cluster"):
                    row[f"{name}_s_per_pass"] = round(res[name][0], 4)
                    if name != "threads":
                        row[f"{name}_ratio"] = round(res[name][0] / res["threads"][0], 3)
                        row[f"{name}_identical"] = bool(np.array_equal(res[name][2], ref))
                rows.append(row)
                if not args.json:
                    print(f"{method:15s} passes {row['passes']:3d}  threads {row['threads_s_per_pass']:.4f}s  "
                          f"dask {row['dask_s_per_pass']:.4f}s (x{row['dask_ratio']:.3f}, identical "
                          f"{row['dask_identical']})  cluster {row['cluster_s_per_pass']:.4f}s "
                          f"(x{row['cluster_ratio']:.3f}, identical {row['cluster_identical']})", flush=True)
        if args.json:
            print(json.dumps(rows, indent=1))
        return 0
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
