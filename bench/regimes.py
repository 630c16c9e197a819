"""The regime suite: generated stores shaped like what users bring, every default held to the same properties.

    python bench/regimes.py                 # all regimes but the 200k-user one, 3 seeds (about 20 min idle)
    python bench/regimes.py --big           # also 200,000 users x 1,000 items
    python bench/regimes.py --only sparse --seeds 1 --epsilons 1,inf

Each regime is a store written by ``streamdp generate`` into a temporary directory
(20% per-user test split). For ``als`` (the default), ``means`` and ``oja`` at each
epsilon (``inf``: non-private) and seed it trains with the defaults, evaluates on the
test split and prints one markdown table of test RMSE (mean +- std over seeds) with
the non-private baselines of the same run, then checks, for ``als`` and ``means``:

* **monotone**: the mean RMSE never rises from one epsilon to the next larger one by
  more than the run-to-run noise (``2 sqrt(s_a^2 + s_b^2) / sqrt(seeds) + 0.0015 h``, ``h``
  half the rating range: 0.003 on a 1..5 scale);
* **als >= biases**: ``als`` is not worse than the private biases-only release at the
  same epsilon (``als --iters 0``) by more than that noise;
* **means >= global mean**: ``means`` is not worse than the non-private global mean
  by more than 0.005;
* **non-private >= damped item mean**: ``als --epsilon inf`` is not worse than the
  damped item mean (or the raw item mean when the damped baseline is absent) by more
  than 0.005 (``0.0025 h``, both).

It exits 1 when a property fails (after printing everything).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time

import numpy as np

import streamdp

#: name -> (description, generate() keywords)
REGIMES = {
    "jokes14-weak": ("jokes14 with little low-rank signal (u.v std 1 against noise 4): factors cannot pay",
                     dict(users=5_000, items=130, ratings_per_user=14, rating_min=-10.0, rating_max=10.0,
                          rating_step=0.0, global_mean=0.5, item_bias_std=1.5, noise=4.0, user_bias_std=2.0,
                          outlier_fraction=0.005, item_exponent=0.3)),
    "sparse": ("products: 50k users x 3k items, 1.2 ratings per user (most rate once), string ids",
               dict(users=50_000, items=3_000, ratings_per_user=1.2, user_bias_std=0.4, string_ids=True)),
    "jokes14": ("jokes: 5k users x 130 items, ~14 per user, continuous -10..10, 0.5% outliers",
                dict(users=5_000, items=130, ratings_per_user=14, rating_min=-10.0, rating_max=10.0,
                     rating_step=0.0, global_mean=0.5, item_bias_std=1.5, noise=4.0, user_bias_std=2.0,
                     interaction_scale=3.0, outlier_fraction=0.005, item_exponent=0.3)),
    "jokes70": ("jokes: 20k users x 100 items, ~70 per user, continuous -10..10",
                dict(users=20_000, items=100, ratings_per_user=70, rating_min=-10.0, rating_max=10.0,
                     rating_step=0.0, global_mean=0.5, item_bias_std=1.5, noise=4.0, user_bias_std=2.0,
                     interaction_scale=3.0, item_exponent=0.3)),
    "thousands": ("movies: 3k users x 3k items, ~60 per user, half stars",
                  dict(users=3_000, items=3_000, ratings_per_user=60, rating_min=0.5, rating_max=5.0,
                       rating_step=0.5, user_bias_std=0.4)),
    "200k": ("200k users x 1k items, ~50 per user",
             dict(users=200_000, items=1_000, ratings_per_user=50, user_bias_std=0.4)),
}
METHODS = ("als", "means", "oja")


def run_regime(name: str, root: str, epsilons, seeds: int, methods=METHODS) -> dict:
    """Train every (method, epsilon, seed) on the regime's store; ``{(method, eps): [rmse...]}`` and baselines."""
    desc, kw = REGIMES[name]
    path = os.path.join(root, f"{name}.zarr")
    if not os.path.exists(path):
        streamdp.generate(path, seed=1, test_fraction=0.2, **kw)
    st = streamdp.open_store(path)
    res, baselines = {}, None
    for m in (*methods, "als-biases"):
        for e in epsilons:
            if m == "als-biases" and not math.isfinite(e):
                continue
            out = []
            for sd in range(1 if not math.isfinite(e) else seeds):
                opts = {"iters": 0} if m == "als-biases" else {}
                model = streamdp.train(st, method=m.split("-")[0], epsilon=e, allow_nonprivate=True,
                                       seed=sd, over_budget=True, **opts)
                out.append(model.summary["test_rmse"])
                baselines = model.summary["baselines"]
            res[(m, e)] = out
    return {"name": name, "desc": desc, "n_users": st.n_users, "n_items": st.n_items, "n_ratings": st.n_ratings,
            "half_range": (float(st.rating_max) - float(st.rating_min)) / 2.0,
            "results": res, "baselines": baselines}


def _noise(a, b, seeds, half_range: float) -> float:
    """Run-to-run noise of a difference of means, plus 0.0015 h (0.003 on a 1..5 scale)."""
    return 2.0 * math.sqrt(np.var(a) + np.var(b)) / math.sqrt(max(seeds, 1)) + 0.0015 * half_range


def check(r: dict, epsilons, seeds) -> list[str]:
    """The failed properties of one regime's results (empty when all hold)."""
    res, b = r["results"], r["baselines"]
    fails = []
    private = [e for e in epsilons if math.isfinite(e)]
    for m in ("als", "means"):
        for e0, e1 in zip(epsilons, epsilons[1:]):
            a, c = res[(m, e0)], res[(m, e1)]
            if np.mean(c) > np.mean(a) + _noise(a, c, seeds, r['half_range']):
                fails.append(f"{r['name']}: {m} RMSE rises from epsilon {e0:g} ({np.mean(a):.4f}) to {e1:g} "
                             f"({np.mean(c):.4f})")
    for e in private:
        a, c = res[("als", e)], res[("als-biases", e)]
        if np.mean(a) > np.mean(c) + _noise(a, c, seeds, r['half_range']):
            fails.append(f"{r['name']}: als at epsilon {e:g} ({np.mean(a):.4f}) worse than its biases-only release "
                         f"({np.mean(c):.4f})")
    g, tol = b["global_mean"]["rmse"], 0.0025 * r["half_range"]
    for e in epsilons:
        if np.mean(res[("means", e)]) > g + tol:
            fails.append(f"{r['name']}: means at epsilon {e:g} ({np.mean(res[('means', e)]):.4f}) worse than the "
                         f"global mean ({g:.4f})")
    damped = b.get("damped_item_mean", b["item_mean"])["rmse"]
    if math.inf in epsilons and np.mean(res[("als", math.inf)]) > damped + tol:
        fails.append(f"{r['name']}: non-private als ({np.mean(res[('als', math.inf)]):.4f}) worse than the damped "
                     f"item mean ({damped:.4f})")
    return fails


def table(results, epsilons) -> str:
    head = "| regime | method | " + " | ".join("inf" if not math.isfinite(e) else f"eps {e:g}" for e in epsilons)
    lines = [head + " |", "|---" * (len(epsilons) + 2) + "|"]
    for r in results:
        b = r["baselines"]
        names = ", ".join(f"{k.replace('_', ' ')} {v['rmse']:.4f}" for k, v in b.items())
        lines.append(f"| **{r['name']}** ({r['n_users']:,} users, {r['n_items']:,} items, {r['n_ratings']:,} "
                     f"ratings) | baselines: {names} |" + " |" * (len(epsilons) - 1))
        for m in (*METHODS, "als-biases"):
            cells = []
            for e in epsilons:
                v = r["results"].get((m, e))
                cells.append("" if not v else f"{np.mean(v):.4f}" + (f" ± {np.std(v):.4f}" if len(v) > 1 else ""))
            lines.append(f"| {r['name']} | {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=None, help="comma-separated regimes (default: all but 200k)")
    ap.add_argument("--big", action="store_true", help="include the 200k-user regime")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epsilons", default="0.5,1,2,5,10,inf")
    ap.add_argument("--dir", default=None, help="keep the stores here (default: a temporary directory)")
    a = ap.parse_args(argv)
    names = a.only.split(",") if a.only else [n for n in REGIMES if n != "200k" or a.big]
    eps = [float(x) for x in a.epsilons.split(",")]
    root = a.dir or tempfile.mkdtemp(prefix="streamdp-regimes-")
    results, fails = [], []
    for n in names:
        t0 = time.perf_counter()
        r = run_regime(n, root, eps, a.seeds)
        results.append(r)
        fails += check(r, eps, a.seeds)
        print(f"{n}: {time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
    print(table(results, eps))
    print()
    print("properties: " + ("all hold" if not fails else f"{len(fails)} failed"))
    for f in fails:
        print("FAILED: " + f)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
