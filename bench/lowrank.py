"""Frobenius error of Gaussian measurements (Hardt & Roth) vs randomized response, by coherence and epsilon.

    python bench/lowrank.py [--epsilons 1,4,16,64,256] [--seeds 2] [--families all] [--png PATH]

Generates the coherence family (:func:`streamdp.storage.coherence.generate_coherence_store`,
dense, rows of norm <= 1, ``--clip 1``) into a temporary directory (removed at the
end): for two shapes (``n_users / n_items`` = 100 and 5), a low-coherence matrix
(random rank-``r`` factors, every row about the same norm) and one where a few
dominant rows (20 users) hold half of ``||A||_F^2`` in directions of their own.
For each, in the same run and at the same (epsilon, delta) under the same relation,
both mechanisms of ``streamdp lowrank`` stream the store
(:class:`streamdp.methods.lowrank.LowRank`, then its non-private error pass):

* ``meas``: Gaussian measurements, ``||A - Q [B~]_k||_F`` (the paper's rank-k output);
* ``rr``: randomized response, ``||A - [A + N]_k||_F`` (``RR_POWER_ITERS`` subspace iterations);
* ``local``: ``||A - A V_k V_k^T||_F``, every user projecting her own row on the
  released item basis (what the release lets users do without any user-side factor);

each divided by ``||A||_F`` (mean over ``--seeds``), beside the best rank-``k`` error
``||A - A_k||_F / ||A||_F`` computed exactly (dense SVD: the bench sizes fit in
memory). Prints a markdown table and writes a PNG (matplotlib, the ``plot`` extra)
to ``--png`` (default ``/work/results/lowrank.png``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

import numpy as np

#: (name, n_users, n_items, rank r, dominant users, dominant share of ||A||_F^2)
FAMILIES = [
    ("low coherence, 20000 x 200", 20_000, 200, 4, 0, 0.0),
    ("20 dominant rows, 20000 x 200", 20_000, 200, 4, 20, 0.5),
    ("low coherence, 5000 x 1000", 5_000, 1_000, 4, 0, 0.0),
    ("20 dominant rows, 5000 x 1000", 5_000, 1_000, 4, 20, 0.5),
]
DELTA = 1e-6
#: Randomized response's subspace iterations here: close to the exact truncated SVD of the noisy matrix, so the
#: baseline is not weakened by an unconverged SVD (the command's default is fewer).
RR_POWER_ITERS = 20


def dense(store) -> np.ndarray:
    """The whole (small, dense) matrix in memory: for the exact best rank-k only."""
    A = np.zeros((store.n_users, store.n_items))
    for blk in store.blocks():
        rows = np.repeat(np.arange(blk.n_users), np.diff(blk.indptr)) + blk.first_user
        A[rows, blk.items] = blk.ratings
    return A


def best_rank_k(A: np.ndarray, k: int) -> float:
    s = np.linalg.svd(A, compute_uv=False)
    return float(np.sqrt((s[k:] ** 2).sum()))


def run_one(store, mechanism, eps, k, seed, workers, **opts) -> dict:
    from streamdp.methods.lowrank import LowRank
    from streamdp.stream.engine import Engine

    if mechanism == "randomized-response":
        opts = {"power_iters": RR_POWER_ITERS, **opts}
    m = LowRank(epsilon=eps, delta=DELTA, rank=k, seed=seed, mechanism=mechanism, clip=1.0, **opts)
    with Engine(store, workers=workers, memory_limit="4GB") as eng:
        m.fit(store, eng)
        return m.errors(store, eng)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epsilons", default="1,4,16,64,256")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--families", default="all", help="comma-separated indices into FAMILIES, or all")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--png", default="/work/results/lowrank.png")
    ap.add_argument("--opts", default="{}", help="JSON options for LowRank (e.g. '{\"sketch_share\": 0.7}')")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--replot", default=None, metavar="JSON", help="only print the table and plot these saved results")
    args = ap.parse_args(argv)
    if args.replot:
        with open(args.replot) as fh:
            results = json.load(fh)
        print(table(results))
        if args.png:
            plot(results, args.png)
            print(f"\nwrote {args.png}")
        return

    from streamdp.storage.coherence import generate_coherence_store

    eps_list = [float(e) for e in args.epsilons.split(",")]
    fams = FAMILIES if args.families == "all" else [FAMILIES[int(i)] for i in args.families.split(",")]
    opts = json.loads(args.opts)
    tmp = tempfile.mkdtemp(prefix="bench-lowrank-")
    results = []
    try:
        for fi, (name, m, n, r, d, f) in enumerate(fams):
            st = generate_coherence_store(os.path.join(tmp, f"f{fi}.zarr"), n_users=m, n_items=n, rank=r,
                                          dominant_users=d, dominant_share=f, noise=0.1, seed=fi)
            k = r + max(1, r // 2)
            A = dense(st)
            fro = float(np.linalg.norm(A))
            best = best_rank_k(A, k) / fro
            mu0 = float(m * (A * A).sum(axis=1).max() / fro ** 2)
            del A
            for eps in eps_list:
                row = {"family": name, "n_users": m, "n_items": n, "k": k, "epsilon": eps, "best": best,
                       "coherence_mu0": mu0}
                t = time.perf_counter()
                for mech, key in (("measurements", "meas"), ("randomized-response", "rr")):
                    errs = [run_one(st, mech, eps, k, s, args.workers, **opts) for s in range(args.seeds)]
                    row[key] = float(np.mean([e["error"] for e in errs])) / fro
                    row[key + "_local"] = float(np.mean([e["error_local"] for e in errs])) / fro
                    if mech == "measurements":
                        row["meas_untruncated"] = float(np.mean([e["error_untruncated"] for e in errs])) / fro
                row["seconds"] = round(time.perf_counter() - t, 1)
                results.append(row)
                if not args.json:
                    print(f"  {name}, eps {eps:g}: meas {row['meas']:.3f}  rr {row['rr']:.3f}  best {best:.3f}  "
                          f"({row['seconds']}s)", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(results))
    else:
        print(table(results))
    if args.png:
        plot(results, args.png)
        with open(os.path.splitext(args.png)[0] + ".json", "w") as fh:
            json.dump(results, fh, indent=1)
        print(f"\nwrote {args.png} (results beside it, .json)")


def _winner(a: float, b: float) -> str:
    """Which error is lower; "neither" when both are >= 0.95 ||A||_F (about as bad as releasing zeros or worse)."""
    if min(a, b) >= 0.95:
        return "neither (both >= 0.95)"
    return "measurements" if a < b else "randomized response"


def table(results) -> str:
    lines = ["| matrix | mu0 | k | epsilon | best rank-k | measurements | randomized response | winner | "
             "meas local | rr local | winner, released basis | meas rank k' |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['family']} | {r['coherence_mu0']:.1f} | {r['k']} | {r['epsilon']:g} | {r['best']:.3f} | "
                     f"{r['meas']:.3f} | {r['rr']:.3f} | {_winner(r['meas'], r['rr'])} | {r['meas_local']:.3f} | "
                     f"{r['rr_local']:.3f} | {_winner(r['meas_local'], r['rr_local'])} | "
                     f"{r['meas_untruncated']:.3f} |")
    return "\n".join(lines)


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams = list(dict.fromkeys(r["family"] for r in results))
    fig, axes = plt.subplots(2, len(fams), figsize=(4.2 * len(fams), 7.0), sharex=True, squeeze=False)
    for j, fam in enumerate(fams):
        rs = [r for r in results if r["family"] == fam]
        e = [r["epsilon"] for r in rs]
        for i, (suffix, what) in enumerate((("", "rank-k output"), ("_local", "local projection on released basis"))):
            ax = axes[i][j]
            ax.plot(e, [r["meas" + suffix] for r in rs], "o-", label="Gaussian measurements")
            ax.plot(e, [r["rr" + suffix] for r in rs], "s-", label="randomized response")
            ax.plot(e, [r["best"] for r in rs], "k--", label="best rank k (non-private)")
            ax.axhline(1.0, color="grey", lw=0.8, ls=":", label="the zero matrix")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_title(f"{fam}: {what}", fontsize=8)
            ax.grid(alpha=0.3, which="both")
            if i == 1:
                ax.set_xlabel("epsilon (bounded row change, unit L)")
    axes[0][0].set_ylabel("||A - Q[B~]_k||_F or ||A - [A+N]_k||_F,  / ||A||_F", fontsize=8)
    axes[1][0].set_ylabel("||A - A V_k V_k^T||_F / ||A||_F", fontsize=8)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
