"""sgd/sgld epochs: today's Hogwild (one shared V) against ``--epoch-scheme blocks`` (the cluster path).

    python bench/epoch_scheme.py [--users 20000] [--items 500] [--seeds 3] [--workers 2] [--cluster]

Generates a store in a temporary directory (removed at the end), then trains sgd
(``--epsilon inf``) and sgld (``--epsilon 1`` and ``10``; ``--cases``) with both schemes for
each seed on local threads (and, with ``--cluster``, ``blocks`` on a 2-process
``LocalCluster``), and prints the test RMSE (median over seeds and each seed) and
the median fit seconds. One warm-up run per scheme compiles the kernels first.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--users", type=int, default=20_000)
    ap.add_argument("--items", type=int, default=500)
    ap.add_argument("--ratings-per-user", type=float, default=30)
    ap.add_argument("--block-users", type=int, default=2000)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=None, help="default: each method's (20)")
    ap.add_argument("--cases", default="sgd:inf,sgld:1,sgld:10", help="method:epsilon,...")
    ap.add_argument("--rounds", default="2,4,all", help="--round-blocks values of the blocks scheme")
    ap.add_argument("--cluster", action="store_true", help="also blocks (first --rounds value) on a 2-process "
                    "LocalCluster")
    a = ap.parse_args(argv)

    from streamdp.storage.generate import generate_store
    from streamdp.workflows.api import train

    tmp = tempfile.mkdtemp(prefix="streamdp-bench-epochs-")
    client = cluster = None
    try:
        st = generate_store(os.path.join(tmp, "s.zarr"), n_users=a.users, n_items=a.items,
                            ratings_per_user=a.ratings_per_user, rank=5, seed=1, test_fraction=0.2,
                            block_users=a.block_users, show_progress=False)
        rounds = [st.n_blocks if r == "all" else int(r) for r in a.rounds.split(",")]
        schemes = [("hogwild", None, None)] + [("blocks", r, None) for r in rounds]
        if a.cluster:
            from distributed import Client, LocalCluster

            cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
            client = Client(cluster, set_as_default=False)
            schemes.append(("blocks", rounds[0], client))
        out = {"store": {"users": a.users, "items": a.items, "ratings": st.n_ratings, "blocks": st.n_blocks}}
        cases = [(c.split(":")[0], float(c.split(":")[1])) for c in a.cases.split(",")]
        for method, eps in cases:
            for scheme, r, sched in schemes:
                name = f"{method} eps {eps:g} {scheme}" + (f" R={r}" if r else "") + \
                    (" cluster" if sched is not None else "")
                kw = dict(method=method, epsilon=eps, allow_nonprivate=True, workers=a.workers, scheduler=sched,
                          over_budget=True,
                          epoch_scheme=scheme, **({"round_blocks": r} if r else {}),
                          **({"epochs": a.epochs} if a.epochs else {}))
                try:
                    train(st, seed=999, evaluate=False, **kw)  # warm-up: compiles (in every worker process)
                except Exception as exc:  # noqa: BLE001 - a diverging setting is a result too
                    out[name] = {"error": str(exc)}
                    print(name, json.dumps(out[name]), flush=True)
                    continue
                rmse, secs = [], []
                for seed in range(a.seeds):
                    m = train(st, seed=seed, **kw)
                    rmse.append(m.summary["test_rmse"])
                    secs.append(m.summary["train_seconds"])
                out[name] = {"rmse_median": round(statistics.median(rmse), 4), "rmse": [round(r, 4) for r in rmse],
                             "seconds_median": round(statistics.median(secs), 3)}
                print(name, json.dumps(out[name]), flush=True)
        return out
    finally:
        if client is not None:
            client.close()
            cluster.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
