"""Tuned at total epsilon E against the default ``train`` at E: test RMSE, side by side in one run.

Usage::

    python bench/tune.py                       # ML-100K, FilmTrust, two generated stores; E = 1, 2; seeds 0-3
    python bench/tune.py --epsilons 1 --seeds 0 --stores G1

For each store, epsilon and seed: ``streamdp.workflows.tune.tune`` (default grid of ``als``) and
``streamdp.workflows.training.train`` (``als`` defaults), same seed, each charged to the store's
budget; prints both test RMSEs, their difference, the configuration tune chose (or
why it chose nothing), and the medians over seeds. Stores go to a temporary directory,
removed at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench.als_privacy import real_store  # noqa: E402

GENERATED = {
    "G1": dict(n_users=20_000, n_items=300, ratings_per_user=20, rank=8, seed=1),
    "G2": dict(n_users=40_000, n_items=1_000, ratings_per_user=30, rank=8, seed=11, user_bias_std=0.5),
}


def open_bench_store(tmp, name):
    if name in GENERATED:
        from streamdp.storage.generate import generate_store

        return generate_store(f"{tmp}/{name}.zarr", test_fraction=0.2, show_progress=False, **GENERATED[name])
    return real_store(tmp, name)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--stores", default="ML-100K,FilmTrust,G1,G2")
    ap.add_argument("--epsilons", default="1,2")
    ap.add_argument("--seeds", default="0,1,2,3")
    ap.add_argument("--method", default="als")
    a = ap.parse_args(argv)
    from streamdp.workflows.api import default_delta
    from streamdp.workflows.training import train
    from streamdp.workflows.tune import config_name, tune

    tmp = tempfile.mkdtemp(prefix="streamdp-bench-tune-")
    try:
        print("store | eps | seed | default RMSE | tuned RMSE | tuned - default | tuned eps spent | released model's eps "
              "| chosen | seconds d/t")
        for name in a.stores.split(","):
            st = open_bench_store(tmp, name)
            if st is None:
                continue
            delta = default_delta(st.n_users)
            for eps in [float(x) for x in a.epsilons.split(",")]:
                diffs, defaults, tuned = [], [], []
                for seed in [int(x) for x in a.seeds.split(",")]:
                    t0 = time.perf_counter()
                    d = train(st, method=a.method, out=f"{tmp}/d", epsilon=eps, delta=delta, seed=seed, force=True)
                    t1 = time.perf_counter()
                    t = tune(st, method=a.method, out=f"{tmp}/t", epsilon=eps, delta=delta, seed=seed, force=True)
                    t2 = time.perf_counter()
                    tu = t["tuning"]
                    chosen = config_name(tu["chosen"]) + (f" (no choice: {tu['skipped']})" if tu.get("skipped") else "")
                    diffs.append(t["test_rmse"] - d["test_rmse"])
                    defaults.append(d["test_rmse"])
                    tuned.append(t["test_rmse"])
                    print(f"{name} | {eps:g} | {seed} | {d['test_rmse']:.4f} | {t['test_rmse']:.4f} | "
                          f"{diffs[-1]:+.4f} | {t['epsilon_spent']:.4f} | {tu.get('final_epsilon', eps):.4f} | "
                          f"{chosen} | {t1 - t0:.0f}/{t2 - t1:.0f}",
                          flush=True)
                spread = statistics.stdev(defaults) if len(defaults) > 1 else float("nan")
                print(f"{name} | {eps:g} | median default {statistics.median(defaults):.4f}, tuned "
                      f"{statistics.median(tuned):.4f}; median tuned - default {statistics.median(diffs):+.4f}; "
                      f"run-to-run std of the default over seeds {spread:.4f}", flush=True)
            shutil.rmtree(st.path, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
