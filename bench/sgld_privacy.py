"""Privacy/utility of ``--method sgld``: test RMSE at several epsilons, medians over seeds, next to the baselines.

    python bench/sgld_privacy.py [--stores ml100k,filmtrust,generated] [--generated-users 200000]
                                 [--epsilons 1,10,100] [--seeds 3] [--posterior-scale paper]

For each store (ML-100K and FilmTrust from ``../shared/data`` with a 20% per-user
split, declared rating ranges; a generated power-law store of
``--generated-users`` users x 1,000 items, 20 ratings each, rank 8, the store of
``bench/als_privacy.py``), trains ``sgd`` (non-private, the accuracy reference)
and ``sgld`` at each epsilon for ``--seeds`` seeds with the same rank/epochs/tau,
and prints the median test RMSE of the released model (users' factors solved
locally from V, :mod:`streamdp.evaluate`, with the ridge the model states)
with the range over seeds, next to the non-private global-mean and item-mean
baselines, and the same models solved with the prior's lambda as the ridge (the
tempered conditional of ``u_i``, which models stated before :func:`streamdp.methods.sgld.local_ridge`).
``--ridges`` also evaluates every model at these local ridges (a user may choose
any ridge at no privacy cost), to show where the model's default sits. SGLD with
2+ workers is Hogwild (not bit-reproducible); ``--workers 1`` compares runs exactly.
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


def fit(store, method, epsilon, seed, a, workers):
    """One model fitted on the engine and saved under a temporary directory; returns its path."""
    from streamdp.methods import get_method
    from streamdp.stream.engine import Engine

    opts = dict(epochs=a.epochs)
    if method == "sgld":
        opts.update(tau=a.tau, posterior_scale=a.posterior_scale)
    m = get_method(method)(epsilon=epsilon, delta=1e-6, rank=a.rank, seed=seed, **opts)
    with Engine(store, workers=workers, memory_limit="4GB", state_bytes=m.state_bytes(store)) as eng:
        f = m.fit(store, eng)
    out = os.path.join(tempfile.mkdtemp(prefix="bench-sgld-model-"), "m")
    f.save(out)
    return out


def table(store, name, a):
    from streamdp.evaluate import evaluate_model

    ridges = [float(x) for x in a.ridges.split(",")] if a.ridges else []
    t0 = time.perf_counter()
    eps_list = [float(x) for x in a.epsilons.split(",")]
    print(f"\n### {name}: {store.n_users:,} users, {store.n_items:,} items, {store.n_ratings:,} train / "
          f"{store.n_test:,} test; rank {a.rank}, {a.epochs} epochs, tau {a.tau}, posterior scale "
          f"{a.posterior_scale}, median over {a.seeds} seeds (min-max)\n")
    rows = []

    def run(method, eps, seeds):
        res, at_ridge, ridge = [], {r: [] for r in ridges + ["lam"]}, None
        for seed in seeds:
            out = fit(store, method, eps, seed, a, a.workers)
            try:
                ev = evaluate_model(out, store, ranking=False, workers=a.workers)
                res.append(ev["rmse"])
                ridge = ev["ridge"]
                if method == "sgld":
                    from streamdp.model import load_model

                    lam = load_model(out).info["parameters"]["reg"]
                    at_ridge["lam"].append(evaluate_model(out, store, ridge=lam, baselines=False, ranking=False,
                                                          workers=a.workers)["rmse"])
                for r in ridges:
                    at_ridge[r].append(evaluate_model(out, store, ridge=r, baselines=False, ranking=False, workers=a.workers)["rmse"])
            finally:
                shutil.rmtree(os.path.dirname(out), ignore_errors=True)
        return ev, res, at_ridge, ridge

    def fmt(xs):
        return f"{statistics.median(xs):.4f} ({min(xs):.4f}-{max(xs):.4f})" if len(xs) > 1 else f"{xs[0]:.4f}"

    ev, res, at_ridge, ridge = run("sgd", math.inf, [0])
    b = ev["baselines"]
    print(f"non-private baselines: global mean {b['global_mean']['rmse']:.4f}, item mean "
          f"{b['item_mean']['rmse']:.4f}; sgd (non-private) {res[0]:.4f}\n")
    header = ["sgld epsilon", "test RMSE", "model's local ridge", "ridge = prior lambda"] + [f"ridge {r:g}"
                                                                                          for r in ridges]
    for eps in eps_list:
        ev, res, at_ridge, ridge = run("sgld", eps, range(a.seeds) if math.isfinite(eps) else [0])
        rows.append([f"{eps:g}", fmt(res), f"{ridge:.4g}", fmt(at_ridge["lam"])] + [fmt(at_ridge[r]) for r in ridges])
        print(f"  {name} sgld eps={eps:g}: {rows[-1][1]}", file=sys.stderr, flush=True)
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print(f"\n({time.perf_counter() - t0:.0f}s)", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stores", default="ml100k,generated")
    ap.add_argument("--generated-users", type=int, default=200_000)
    ap.add_argument("--epsilons", default="1,10,100,inf")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--tau", type=int, default=100)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--posterior-scale", choices=["paper", "tight"], default="paper")
    ap.add_argument("--ridges", default="", help="also evaluate at these local ridges, e.g. 1,10,100")
    a = ap.parse_args(argv)

    from als_privacy import REAL_STORES, generated_store, real_store  # bench/als_privacy.py, on sys.path as a script

    tmp = tempfile.mkdtemp(prefix="bench-sgld-")
    try:
        for name in a.stores.split(","):
            if name == "generated":
                table(generated_store(tmp, a.generated_users), f"generated ({a.generated_users:,} users)", a)
                continue
            st = real_store(tmp, {n.lower().replace("-", ""): n for n in REAL_STORES}[name])
            if st is not None:
                table(st, name, a)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
