"""Jain, Thakkar & Thakurta (ICML 2018) Figure 2: RMSE vs epsilon of private FW, private SVD and non-private FW.

    python bench/fw_privacy.py [--users 500000] [--items 400] [--epsilons 0.1,0.2,0.5,1,2,5] [--seeds 2]
                               [--svd-ranks 1,2,4,8] [--paper-calibration] [--png /work/results/fw_figure2.png]
                               [--real] [--no-generated]

Generates, in a temporary directory (removed after), the paper's synthetic set: an
exact rank-one matrix ``Y = u v^T`` with entries in ``[-1, 1]`` (``streamdp generate
--factors uniform --rank 1 --noise 0 --scale -1,1,0``), ``--users`` users x
``--items`` items, 81 ratings per user on uniformly random items, 1% of each user's
ratings held out (one per user; the paper: 1% of the ratings, at most 80 per user for
training). For every epsilon it trains ``--method fw`` (defaults) and ``--method svd``
at every rank of ``--svd-ranks`` (the best rank on the test split is reported: a
tuned baseline, which only makes the comparison harder for fw), and evaluates each
as the users' devices would (local replay / projection on the released model). The
non-private columns are the same methods at ``--epsilon inf``. Both methods use their
default ``--center private`` (a private global mean and item biases, released first;
non-private: the exact ones). delta is 1e-6 as in
the paper. It prints a markdown table (test RMSE, mean over ``--seeds``) and writes
the figure to ``--png`` (matplotlib, the ``plot`` extra; without it the table is
still printed and the script says so).

``--real`` adds ML-100K restricted to its 400 most-rated items (the paper's "top
400" protocol, applied to ML-100K from ../shared/data), with a 20% per-user test
split (943 users: a 1% split would hold ~500 ratings). The top-400 selection uses
exact counts, as in the paper: it is a preprocessing step outside the privacy
accounting.
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

import numpy as np

DELTA = 1e-6
INF = float("inf")


def fit_rmse(store, method, epsilon, seed, workers=2, **opts):
    """Test RMSE of one model at the paper's delta (:func:`als_privacy.fit_rmse`)."""
    from als_privacy import fit_rmse as fit

    return fit(store, method, epsilon, seed, workers, DELTA, **opts)


def table(store, name, args, png=None):
    eps_list = [float(e) for e in args.epsilons.split(",")]
    ranks = [int(r) for r in args.svd_ranks.split(",")]
    seeds = list(range(args.seeds))
    t0 = time.perf_counter()

    def mean(method, eps, **opts):
        rs = []
        for s in (seeds if math.isfinite(eps) else seeds[:1]):  # no noise: one run
            rs.append(fit_rmse(store, method, eps, s, **opts))
        r = statistics.mean(rs)
        print(f"  {name} {method} {opts} eps={eps:g}: {r:.4f} ({time.perf_counter() - t0:.0f}s)", file=sys.stderr,
              flush=True)
        return r

    def best_svd(eps):
        got = {r: mean("svd", eps, rank=r) for r in ranks}
        r = min(got, key=got.get)
        return got[r], r

    from als_privacy import _baselines  # the non-private global-mean and item-mean baselines (bench/)

    base = _baselines(store)
    fw_np = mean("fw", INF)
    svd_np, svd_np_rank = best_svd(INF)
    rows = []
    for e in eps_list:
        fw = mean("fw", e)
        paper = mean("fw", e, calibration="paper") if args.paper_calibration else None
        svd, r = best_svd(e)
        rows.append((e, fw, paper, svd, r))
    print(f"\n### {name}: {store.n_users:,} users, {store.n_items:,} items, {store.n_ratings:,} train / "
          f"{store.n_test:,} test ratings; test RMSE, mean of {args.seeds} seeds, delta {DELTA:g}\n")
    head = ["epsilon", "fw (private FW)"] + (["fw, paper sigma"] if args.paper_calibration else []) + \
        ["svd (private SVD, best rank)", "fw beats svd", "non-private fw", "non-private svd", "item mean"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for e, fw, paper, svd, r in rows:
        cells = [f"{e:g}", f"{fw:.4f}"] + ([f"{paper:.4f}"] if args.paper_calibration else []) + \
            [f"{svd:.4f} (r={r})", "yes" if fw < svd else "NO", f"{fw_np:.4f}", f"{svd_np:.4f} (r={svd_np_rank})",
             f"{base['item_mean']['rmse']:.4f}"]
        print("| " + " | ".join(cells) + " |")
    print(f"\nglobal mean (non-private): {base['global_mean']['rmse']:.4f}; {time.perf_counter() - t0:.0f}s")
    if png:
        plot(png, name, rows, fw_np, svd_np, base, args.paper_calibration)


def plot(png, name, rows, fw_np, svd_np, base, paper):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"\n(matplotlib is not installed: no figure; pip install 'streamdp[plot]' to write {png})")
        return
    eps = [r[0] for r in rows]
    fig, ax = plt.subplots(figsize=(7.5, 4))
    ax.plot(eps, [r[1] for r in rows], "o-", label="Private FW (fw)")
    if paper:
        ax.plot(eps, [r[2] for r in rows], "s:", label="Private FW, paper sigma")
    ax.plot(eps, [r[3] for r in rows], "^-", label="Private SVD (svd, best rank)")
    ax.axhline(fw_np, color="k", ls="--", label="Non-private FW")
    ax.axhline(svd_np, color="gray", ls="-.", label="Non-private SVD")
    ax.set_xscale("log")
    ax.set_xlabel("epsilon (user-level, delta = 1e-6)")
    ax.set_ylabel("test RMSE")
    ax.set_title(name)
    ys = [r[1] for r in rows] + [r[3] for r in rows] + [fw_np, svd_np]
    if min(ys) < 0.5 * max(ys):  # from 0 when the curves span a wide range (the synthetic set)
        ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(png)), exist_ok=True)
    fig.savefig(png, dpi=120)
    print(f"\nwrote {png}")


def synthetic_store(tmp, users, items):
    """The paper's synthetic set: exact rank one, entries in [-1, 1], 81 uniform ratings a user, 1 held out."""
    from streamdp.storage.generate import generate_store

    return generate_store(f"{tmp}/rank1.zarr", n_users=users, n_items=items, ratings_per_user=81, rank=1, noise=0.0,
                          factors="uniform", rating_min=-1.0, rating_max=1.0, rating_step=0.0, item_exponent=0.0,
                          user_exponent=1000.0, test_fraction=0.01, seed=11, show_progress=False)


def top_items_store(tmp, n_top=400):
    """ML-100K restricted to its ``n_top`` most-rated items, 20% per-user split; ``None`` when absent."""
    from streamdp.storage.ingest import ingest

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "ml-100k",
                        "u.data")
    if not os.path.exists(path):
        print(f"\nML-100K: {path} absent, skipped")
        return None
    raw = np.loadtxt(path, dtype=np.int64)
    items, counts = np.unique(raw[:, 1], return_counts=True)
    top = items[np.lexsort((items, -counts))[:n_top]]
    keep = raw[np.isin(raw[:, 1], top)]
    csv = os.path.join(tmp, "ml100k-top.data")
    np.savetxt(csv, keep, fmt="%d", delimiter="\t")
    np.savetxt(f"{tmp}/ml100k-top.items", top, fmt="%d")  # declared, as the peers see them (bench.declared_items)
    return ingest([csv], f"{tmp}/ml100k-top{n_top}.zarr", test_fraction=0.2, seed=0, rating_range="1,5",
                  fmt="udata", items=f"{tmp}/ml100k-top.items")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=500_000)
    ap.add_argument("--items", type=int, default=400)
    ap.add_argument("--epsilons", default="0.1,0.2,0.5,1,2,5")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--svd-ranks", default="1,2,4,8")
    ap.add_argument("--paper-calibration", action="store_true", help="also fw with Jain et al.'s Alg. 1 sigma")
    ap.add_argument("--png", default="/work/results/fw_figure2.png", help="the figure (synthetic set)")
    ap.add_argument("--real", action="store_true", help="also ML-100K top 400 from ../shared/data")
    ap.add_argument("--no-generated", action="store_true", help="only the real store")
    args = ap.parse_args(argv)

    tmp = tempfile.mkdtemp(prefix="bench-fw-")
    try:
        if not args.no_generated:
            st = synthetic_store(tmp, args.users, args.items)
            table(st, f"rank-1 synthetic, {args.users:,} x {args.items}", args, png=args.png)
            shutil.rmtree(st.path, ignore_errors=True)
        if args.real:
            st = top_items_store(tmp)
            if st is not None:
                root, ext = os.path.splitext(args.png)
                table(st, "ML-100K top 400", args, png=f"{root}_ml100k_top400{ext}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
