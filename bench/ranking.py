"""Recall@10 and NDCG@10 of the README's methods table (ML-100K, FilmTrust), beside the most-popular lists.

    python bench/ranking.py [--seeds 2] [--epsilons 0.5,1,2,10,inf]

The stores and models of ``bench/als_privacy.py --real`` (20% per-user split, its
declared rating ranges; ``means`` and ``oja`` at epsilon 1, ``als`` at each epsilon,
mean over ``--seeds``), evaluated as ``streamdp evaluate`` does
(:mod:`streamdp.ranking`: each user's top 10 among the items she did not rate in
training; relevant: a held-out rating in the top 20% of the range, >= 4.2 on
ML-100K (the 5s), >= 3.3 on FilmTrust (3.5 and 4)). Beside them the most-popular
lists: by the exact training counts (non-private) and by the noisy item counts that
``als`` at epsilon 1 released (private: post-processing of that release).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile

if __package__ in (None, ""):  # run as a file: make ``bench`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.als_privacy import REAL_STORES, fit_timed, real_store  # noqa: E402
from bench.run import fitted_evaluation  # noqa: E402


def ranking_of(store, method, eps, seed, **opts) -> dict:
    return fitted_evaluation(store, fit_timed(store, method, eps, seed, workers=1, **opts)[0], workers=1)["ranking"]


def table(store, name, seeds, epsilons) -> None:
    def mean(method, eps):
        rs = [ranking_of(store, method, eps, s) for s in range(seeds if math.isfinite(eps) else 1)]
        return (statistics.mean(r["recall"] for r in rs), statistics.mean(r["ndcg"] for r in rs), rs)

    cols = [("means", 1.0), ("oja", 1.0)] + [("als", e) for e in epsilons]
    out = {}
    for method, eps in cols:
        out[(method, eps)] = mean(method, eps)
        r, n, _ = out[(method, eps)]
        print(f"  {name} {method} eps {eps:g}: Recall@10 {r:.4f} NDCG@10 {n:.4f}", file=sys.stderr, flush=True)
    rs = out.get(("als", 1.0), mean("als", 1.0))[2]
    priv = [r["baselines"]["private_popularity"] for r in rs]
    pop = rs[0]["baselines"]["popularity"]
    print(f"\n### {name}: Recall@10 / NDCG@10 (mean of {seeds} seeds; relevant: held-out >= "
          f"{rs[0]['relevant_threshold']:g}, {rs[0]['n_users']} users)\n")
    head = ["most popular, non-private", "most popular by als eps 1's released counts"] + \
        [f"`{m}` eps {'inf' if math.isinf(e) else f'{e:g}'}" for m, e in cols]
    vals = [f"{pop['recall']:.3f} / {pop['ndcg']:.3f}",
            f"{statistics.mean(p['recall'] for p in priv):.3f} / {statistics.mean(p['ndcg'] for p in priv):.3f}"]
    vals += [f"{out[c][0]:.3f} / {out[c][1]:.3f}" for c in cols]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    print("| " + " | ".join(vals) + " |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--epsilons", default="0.5,1,2,10,inf")
    a = ap.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="bench-ranking-")
    try:
        for name in REAL_STORES:
            st = real_store(tmp, name)
            if st is not None:
                table(st, name, a.seeds, [float(e) for e in a.epsilons.split(",")])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
