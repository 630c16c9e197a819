"""Privacy/utility of ``--method sgld``: test RMSE at several epsilons next to ``--method sgd``.

    python bench/sgld_privacy.py [--data ../shared/data/ml-100k/u.data] [--generated-users 200000]

Ingests ML-100K with a 20% per-user split (or generates a power-law store with
``--generated-users`` users and a 20% split), trains ``sgd`` (non-private) and
``sgld`` at each epsilon with the same rank/epochs, and prints the test RMSE of the
released model (users' factors solved locally from V, :mod:`streamdp.evaluate`)
plus the global-mean and item-mean baselines.
"""

from __future__ import annotations

import argparse
import os
import tempfile


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data",
                                                   "ml-100k", "u.data"))
    ap.add_argument("--generated-users", type=int, default=0)
    ap.add_argument("--epsilons", default="0.5,1,2,5,10,50")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--tau", type=int, default=100)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--posterior-scale", choices=["paper", "tight"], default="paper")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-sgld-") as d:
        run(a, d)


def run(a, d):
    from streamdp.evaluate import evaluate_model
    from streamdp.methods import train

    if a.generated_users:
        from streamdp.storage.generate import generate_store

        st = generate_store(os.path.join(d, "s.zarr"), n_users=a.generated_users, n_items=5000,
                            ratings_per_user=50, rank=8, seed=0, test_fraction=0.2)
    else:
        from streamdp.storage.ingest import ingest

        st = ingest([a.data], os.path.join(d, "s.zarr"), test_fraction=0.2, seed=0, rating_range=(1, 5))
    print(f"store: {st.n_users:,} users, {st.n_items:,} items, {st.n_ratings:,} train / {st.n_test:,} test; "
          f"rank {a.rank}, {a.epochs} epochs, tau {a.tau}")
    r = train(st, method="sgd", out=os.path.join(d, "sgd"), epsilon=float("inf"), delta=1e-6, rank=a.rank,
              seed=0, epochs=a.epochs, workers=a.workers)
    ev = evaluate_model(os.path.join(d, "sgd"), st)
    print(f"baselines (non-private): global mean {ev['baselines']['global_mean']['rmse']:.4f}, "
          f"item mean {ev['baselines']['item_mean']['rmse']:.4f}")
    print(f"sgd (non-private)          test RMSE {r['test_rmse']:.4f}")
    r = train(st, method="sgld", out=os.path.join(d, "sgld-inf"), epsilon=float("inf"), delta=1e-6, rank=a.rank,
              seed=0, epochs=a.epochs, tau=a.tau, workers=a.workers)
    print(f"sgld epsilon=inf (s = 1)   test RMSE {r['test_rmse']:.4f}")
    for eps in [float(x) for x in a.epsilons.split(",")]:
        r = train(st, method="sgld", out=os.path.join(d, f"sgld-{eps}"), epsilon=eps, delta=1e-6, rank=a.rank,
                  seed=0, epochs=a.epochs, tau=a.tau, workers=a.workers, posterior_scale=a.posterior_scale)
        print(f"sgld epsilon={eps:<6g}        test RMSE {r['test_rmse']:.4f}   (ledger epsilon "
              f"{r['epsilon_spent']:.4g}, approximate)", flush=True)


if __name__ == "__main__":
    main()
