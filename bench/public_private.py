"""Xin & Jaakkola 2014, Figures 1 and 2, with ``--method public-private`` on ML-100K and a generated store.

    python bench/public_private.py [--no-real] [--no-generated] [--users 20000] [--seeds 2] [--iters T]
                                   [--out /work/results]

Figure 1: test RMSE against the fraction of public users (the rest private, predicting
locally with eq. 4 from the public-only model), the public users chosen most active first
or uniformly at random (every user of the store is listed as a candidate, as a
simulation of the paper's experiment; see :mod:`streamdp.methods.public_private` on why
"most active" needs the candidates' file). Figure 2: test RMSE against the number of
private users who answer once through PMC, PMD (not DP), Laplace-noised vectors (DP at
user-level epsilon 1 and 5, and at the paper's per-rating scale, i.e. user-level
``n_items x 5``), the exact second-order statistics (no privacy) and the full EM (the
public users plus as many random other users, all public); the public users are the most
active ``--fig2-public`` of the users (the paper: its top 100). The private weight is
chosen on held-out public ratings (the default) and, for PMC/PMD, also fixed at the
paper's 1/2.

``--iters T`` sets the EM iterations of every run (default: the method's 20); the PNGs'
names then end in ``_itersT``. The numbers also go to ``public_private_<store>.json``
(``--replot JSON...`` redraws the PNGs from them). Prints markdown tables and writes
``public_private_fig1_<store>.png`` and ``public_private_fig2_<store>.png`` under ``--out`` (matplotlib, the ``plot`` extra; without it the tables only, and it says so).
The stores live in a temporary directory, removed at the end; ML-100K comes from
../shared/data (skipped when absent).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from als_privacy import _baselines, delta_for, real_store  # noqa: E402  (the privacy benches' shared helpers)

FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
PRIVATE_FRACTIONS = (0.0, 0.05, 0.1, 0.2, 0.4, 0.7, 1.0)


def fit(store, tmp, seed, epsilon=math.inf, **opts):
    """Test RMSE of one ``public-private`` model (saved, evaluated as users' devices would) and its model info."""
    from streamdp.methods import get_method
    from streamdp.serving.evaluate import evaluate_model
    from streamdp.stream.engine import Engine

    m = get_method("public-private")(epsilon=epsilon, delta=delta_for(store), seed=seed, **opts)
    with Engine(store, workers=2, memory_limit="4GB", state_bytes=m.state_bytes(store)) as eng:
        f = m.fit(store, eng)
    out = tempfile.mkdtemp(prefix="bench-pp-model-", dir=tmp)
    try:
        f.save(os.path.join(out, "m"))
        return evaluate_model(os.path.join(out, "m"), store, baselines=False, ranking=False, workers=2)["rmse"], {**f.model_info, "owner": f.owner}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def ids_file(tmp, name, ids) -> str:
    path = os.path.join(tmp, name)
    with open(path, "w") as fh:
        fh.writelines(f"{i}\n" for i in ids)
    return path


def figure1(store, name, tmp, args):
    """RMSE by public fraction, most active first vs random: ``{selection: [(fraction, rmse, n_ratings)]}``."""
    every = ids_file(tmp, f"{name}-all.txt", store.user_ids().tolist())
    out = {}
    for sel in ("most-active", "random"):
        seeds = range(args.seeds if sel == "random" else 1)
        rows = []
        for F in FRACTIONS:
            res = [fit(store, tmp, s, public_users=every, public_fraction=F, public_selection=sel, **args.extra)
                   for s in seeds]
            rows.append((F, statistics.mean(r for r, _ in res),
                         statistics.mean(i["public"]["n_public_ratings"] for _, i in res)))
            print(f"  {name} fig1 {sel} {F:g}: {rows[-1][1]:.4f}", file=sys.stderr, flush=True)
        out[sel] = rows
    return out


def figure2(store, name, tmp, args):
    """RMSE by number of private responders for each mechanism: ``{label: [(responders, rmse)]}``."""
    ids = store.user_ids()
    counts = np.concatenate([store.block_user_counts(b) for b in range(store.n_blocks)])
    n_pub = int(math.ceil(args.fig2_public * store.n_users))
    top = np.lexsort((ids, -counts))[:n_pub]
    every = ids_file(tmp, f"{name}-all.txt", ids.tolist())
    base = dict(public_users=every, public_fraction=args.fig2_public, **args.extra)
    lap_paper = 5.0 * store.n_items  # the paper's Lap(range / 5) per coordinate, at user level
    curves = {
        "PMC": dict(private_mechanism="pmc"),
        "PMD": dict(private_mechanism="pmd"),
        "PMC, weight 1/2 (paper)": dict(private_mechanism="pmc", private_weight=0.5),
        "PMD, weight 1/2 (paper)": dict(private_mechanism="pmd", private_weight=0.5),
        "Lap eps=1 (user-level DP)": dict(private_mechanism="laplace", epsilon=1.0),
        "Lap eps=5 (user-level DP)": dict(private_mechanism="laplace", epsilon=5.0),
        f"Lap paper scale eps=5 per rating (user-level {lap_paper:g})": dict(private_mechanism="laplace",
                                                                            epsilon=lap_paper),
        "Exact 2nd order (no privacy)": dict(private_mechanism="exact"),
    }
    out = {}
    r0, _ = fit(store, tmp, 0, **base)
    for label, opts in curves.items():
        rows = [(0, r0)]
        for pf in PRIVATE_FRACTIONS[1:]:
            r, info = fit(store, tmp, 0, **base, private_fraction=pf, **opts)
            rows.append((sum(info["owner"]["private_responders_by_round"]), r))
            print(f"  {name} fig2 {label} {pf:g}: {r:.4f} ({rows[-1][0]} responders, weight "
                  f"{info['private']['weight']})", file=sys.stderr, flush=True)
        out[label] = rows
    # full EM: the public users and as many random other users, all public
    rng = np.random.default_rng(0)
    others = np.setdiff1d(np.arange(store.n_users), top)
    rows = [(0, r0)]
    for n_resp, _ in out["PMC"][1:]:
        pick = rng.choice(others, size=n_resp, replace=False)
        f = ids_file(tmp, f"{name}-full-{n_resp}.txt", ids[np.concatenate([top, pick])].tolist())
        r, _ = fit(store, tmp, 0, public_users=f, **args.extra)
        rows.append((n_resp, r))
        print(f"  {name} fig2 full EM {n_resp}: {r:.4f}", file=sys.stderr, flush=True)
    out["Full EM (all public, no privacy)"] = rows
    return out, n_pub


def print_tables(name, store, fig1, fig2, n_pub, base, seconds, iters=None):
    print(f"\n### {name}: {store.n_users:,} users, {store.n_items:,} items, {store.n_ratings:,} train ratings "
          f"(test RMSE; non-private baselines on all users: item mean {base['item_mean']['rmse']:.4f}, global mean "
          f"{base['global_mean']['rmse']:.4f}; EM iterations {iters or 'default (20)'}; {seconds:.0f}s)\n")
    print("Figure 1: test RMSE by fraction of public users (the others predict locally by eq. 4)\n")
    print("| public users | " + " | ".join(f"{F:g}" for F, _, _ in fig1["most-active"]) + " |")
    print("|---|" + "---|" * len(FRACTIONS))
    for sel, rows in fig1.items():
        print(f"| {sel} first | " + " | ".join(f"{r:.4f}" for _, r, _ in rows) + " |")
        print("| (public ratings) | " + " | ".join(f"{int(n):,}" for _, _, n in rows) + " |")
    print(f"\nFigure 2: test RMSE by number of private responders (public: the {n_pub} most active users)\n")
    cols = [n for n, _ in fig2["PMC"]]
    print("| mechanism | " + " | ".join(str(n) for n in cols) + " |")
    print("|---|" + "---|" * len(cols))
    for label, rows in fig2.items():
        print(f"| {label} | " + " | ".join(f"{r:.4f}" for _, r in rows) + " |")
    print("\n(columns: responders of the PMC runs; each curve's own counts are in its runs' model.json, equal for "
          "the same --private-fraction and seed)")


def plot(name, fig1, fig2, n_pub, out_dir, suffix=""):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("\n(matplotlib is not installed: pip install 'streamdp[plot]' for the figures; tables only)")
        return []
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    for sel, rows in fig1.items():
        ax[0].plot([100 * F for F, _, _ in rows], [r for _, r, _ in rows], marker="o", label=f"{sel} first")
        ax[1].plot([n / 1000 for _, _, n in rows], [r for _, r, _ in rows], marker="o", label=f"{sel} first")
    ax[0].set_xscale("log")
    ax[0].set_xlabel("percentage of public users")
    ax[1].set_xlabel("public ratings (thousands)")
    for a in ax:
        a.set_ylabel("test RMSE")
        a.legend()
    tag = f" ({suffix.strip('_').replace('iters', 'EM iterations ')})" if suffix else ""
    fig.suptitle(f"{name}{tag}: public users only (Xin & Jaakkola Fig. 1)")
    fig.tight_layout()
    p = os.path.join(out_dir, f"public_private_fig1_{name.lower().replace(' ', '_')}{suffix}.png")
    fig.savefig(p, dpi=120)
    plt.close(fig)
    paths.append(p)
    fig, ax = plt.subplots(figsize=(11, 5))
    markers = "os^vDP*Xph"
    for i, (label, rows) in enumerate(fig2.items()):
        # many curves coincide (a chosen weight of 0 is the public-only model): distinct markers and line styles
        style = ":" if label.startswith("Lap") else "--" if "paper" in label else "-"
        ax.plot([n for n, _ in rows], [r for _, r in rows], marker=markers[i % len(markers)], linestyle=style,
                markersize=5, label=label)
    ax.set_xlabel(f"number of private users who respond (public: the {n_pub} most active users)")
    ax.set_ylabel("test RMSE")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(f"{name}{tag}: private users' 2nd-order mechanisms (Xin & Jaakkola Fig. 2)")
    fig.tight_layout()
    p = os.path.join(out_dir, f"public_private_fig2_{name.lower().replace(' ', '_')}{suffix}.png")
    fig.savefig(p, dpi=120)
    plt.close(fig)
    paths.append(p)
    return paths


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=20_000, help="users of the generated store")
    ap.add_argument("--seeds", type=int, default=2, help="seeds of the random public selections (Figure 1)")
    ap.add_argument("--fig2-public", type=float, default=None,
                    help="fraction of most active users that are public in Figure 2 (default: 5%% of ML-100K, 0.5%% "
                         "of the generated store, about the paper's 100 users)")
    ap.add_argument("--iters", type=int, default=None, help="EM iterations of every run (default: the method's)")
    ap.add_argument("--out", default="/work/results", help="directory of the PNGs")
    ap.add_argument("--no-real", action="store_true")
    ap.add_argument("--no-generated", action="store_true")
    ap.add_argument("--replot", nargs="+", metavar="JSON", help="only redraw the PNGs from these runs' JSON files")
    args = ap.parse_args(argv)
    if args.replot:
        for path in args.replot:
            with open(path) as fh:
                d = json.load(fh)
            for p in plot(d["name"], d["fig1"], d["fig2"], d["n_pub"], args.out, d["suffix"]):
                print(f"wrote {p}")
        return
    tmp = tempfile.mkdtemp(prefix="bench-pp-")
    paths = []
    try:
        stores = []
        if not args.no_real:
            st = real_store(tmp, "ML-100K")
            if st is not None:
                stores.append(("ML-100K", st, 0.05))
        if not args.no_generated:
            from streamdp.storage.generate import generate_store

            stores.append(("generated", generate_store(f"{tmp}/g.zarr", n_users=args.users, n_items=500,
                                                       ratings_per_user=40, rank=8, seed=11, test_fraction=0.2,
                                                       show_progress=False), 0.005))
        for name, st, pub in stores:
            t0 = time.perf_counter()
            a = argparse.Namespace(**vars(args))
            a.fig2_public = args.fig2_public or pub
            a.extra = {} if args.iters is None else {"iters": args.iters}
            base = _baselines(st)
            f1 = figure1(st, name, tmp, a)
            f2, n_pub = figure2(st, name, tmp, a)
            print_tables(name, st, f1, f2, n_pub, base, time.perf_counter() - t0, args.iters)
            suffix = "" if args.iters is None else f"_iters{args.iters}"
            os.makedirs(args.out, exist_ok=True)
            data = os.path.join(args.out, f"public_private_{name.lower().replace(' ', '_')}{suffix}.json")
            with open(data, "w") as fh:  # the numbers of the tables and figures (--replot redraws from it)
                json.dump(dict(name=name, fig1=f1, fig2=f2, n_pub=n_pub, suffix=suffix), fh, indent=1)
            paths += [data] + plot(name, f1, f2, n_pub, args.out, suffix)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for p in paths:
        print(f"wrote {p}")


if __name__ == "__main__":
    main()
