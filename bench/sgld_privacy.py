"""Privacy/utility of ``--method sgld``: test RMSE at several epsilons, medians over seeds, next to the baselines.

    python bench/sgld_privacy.py [--stores ml100k,filmtrust,generated] [--generated-users 200000]
                                 [--epsilons 1,10,100] [--seeds 3] [--posterior-scale tight]

For each store (ML-100K and FilmTrust from ``../shared/data`` with a 20% per-user
split, declared rating ranges; a generated power-law store of
``--generated-users`` users x 1,000 items, 20 ratings each, rank 8, the store of
``bench/als_privacy.py``), trains ``sgd`` (non-private, the accuracy reference)
and ``sgld`` at each epsilon for ``--seeds`` seeds with the same rank/epochs/tau,
and prints the median test RMSE of the released model (users' factors solved
locally from V, :mod:`streamdp.serving.evaluate`, with the ridge the model states)
with the range over seeds, next to the non-private global-mean and item-mean
baselines, and the same models solved with the prior's lambda as the ridge (the
tempered conditional of ``u_i``, which models stated before :func:`streamdp.methods.sgld.local_ridge`).
``--ridges`` also evaluates every model at these local ridges (a user may choose
any ridge at no privacy cost), to show where the model's default sits. SGLD with
2+ workers is Hogwild (not bit-reproducible); ``--workers 1`` compares runs exactly.

``--netflix``: Liu et al.'s Figure 7 on a Netflix-shaped store (issue 23)::

    python bench/sgld_privacy.py --netflix [--netflix-users 480189] [--store PATH] [--epsilons 0.1,1,10,100]
                                 [--seeds 1] [--results FILE.json] [--png docs/sgld-netflix.png]

generates :data:`NETFLIX` (480,189 users x 17,770 items, Zipf item popularity with the
top 500 items holding 44% of the ratings as on Netflix, Pareto user activity with mean
209 ratings, 2% test split; about 98M training ratings, 48M after tau = 100) into
``--store`` (kept, reused when it exists) or a temporary directory, trains the
non-private lines (``sgd`` 20 epochs and ``als``, all ratings) and ``sgld`` at each
epsilon (the method's defaults plus ``--sgld-options``) for ``--seeds`` seeds, prints
the table (epsilon, test RMSE median (min-max), item mean, non-private lines) and the
smallest epsilon at which sgld beats the item mean, and plots the curve to ``--png``.
Each finished run is appended to ``--results`` (JSON) and skipped when the bench is
run again, so an interrupted or extended sweep only runs what is missing.
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
    from streamdp.serving.evaluate import evaluate_model

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
                    from streamdp.serving.model import load_model

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


#: Netflix's shape (Liu et al. Sec. 6.2; Figure 1's power law): see the module docstring.
NETFLIX = dict(n_items=17_770, ratings_per_user=209, item_exponent=0.82, user_exponent=2.0, rank=16, noise=0.8,
               interaction_scale=0.5, item_bias_std=0.4, user_bias_std=0.4, global_mean=3.6, test_fraction=0.02,
               seed=23)


def netflix_store(path, n_users):
    """The Netflix-shaped store at ``path`` (generated once, reused when it is there)."""
    from streamdp.storage.generate import generate_store
    from streamdp.storage.store import open_store

    if os.path.exists(path):
        return open_store(path)
    return generate_store(path, n_users=n_users, **NETFLIX)


def netflix(a):
    """Figure 7 on the Netflix-shaped store: runs what ``--results`` lacks, prints the table, plots the curve."""
    import json

    from streamdp.serving.evaluate import evaluate_model

    tmp = None
    if a.store:
        store = netflix_store(a.store, a.netflix_users)
    else:
        tmp = tempfile.mkdtemp(prefix="bench-sgld-netflix-")
        store = netflix_store(os.path.join(tmp, "nf.zarr"), a.netflix_users)
    extra = json.loads(a.sgld_options) if a.sgld_options else {}
    done = json.load(open(a.results)) if a.results and os.path.exists(a.results) else []

    def key(method, eps, seed, opts):
        own = extra if method == "sgld" else {k: v for k, v in opts.items() if k != "epochs"}
        return [method, str(eps), seed, own, store.n_users, opts.get("epochs"), a.rank]

    def run(method, eps, seed, opts):
        hit = [r for r in done if r["key"] == key(method, eps, seed, opts)]
        if hit:
            return hit[0]
        from streamdp.methods import get_method
        from streamdp.stream.engine import Engine

        t = time.perf_counter()
        m = get_method(method)(epsilon=eps, delta=1e-6, rank=a.rank, seed=seed, **opts)
        with Engine(store, workers=a.workers, memory_limit="4GB", state_bytes=m.state_bytes(store)) as eng:
            f = m.fit(store, eng)
        out = os.path.join(tempfile.mkdtemp(prefix="bench-sgld-model-"), "m")
        try:
            f.save(out)
            ev = evaluate_model(out, store, workers=a.workers)
        finally:
            shutil.rmtree(os.path.dirname(out), ignore_errors=True)
        r = {"key": key(method, eps, seed, opts), "rmse": ev["rmse"], "item_mean": ev["baselines"]["item_mean"]["rmse"],
             "global_mean": ev["baselines"]["global_mean"]["rmse"], "seconds": round(time.perf_counter() - t, 1)}
        print(f"  {method} epsilon={eps:g} seed={seed}: test RMSE {r['rmse']:.4f} ({r['seconds']:.0f}s)",
              file=sys.stderr, flush=True)
        done.append(r)
        if a.results:
            with open(a.results + ".tmp", "w") as fh:
                json.dump(done, fh, indent=1)
            os.replace(a.results + ".tmp", a.results)
        return r

    try:
        sgd = run("sgd", math.inf, 0, dict(epochs=a.sgd_epochs))
        als = run("als", math.inf, 0, json.loads(a.als_options)) if not a.skip_als else None
        rows = []
        for eps in [float(x) for x in a.epsilons.split(",")]:
            rs = [run("sgld", eps, seed, dict(epochs=a.epochs, **extra))["rmse"] for seed in range(a.seeds)]
            rows.append((eps, statistics.median(rs), min(rs), max(rs), len(rs)))
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    item = sgd["item_mean"]
    print(f"\n### Netflix-shaped store: {store.n_users:,} users x {store.n_items:,} items, {store.n_ratings:,} train / "
          f"{store.n_test:,} test ratings; rank {a.rank}, sgld {a.epochs} epochs (sgd {a.sgd_epochs}); sgld options {extra or 'defaults'}\n")
    print("| epsilon | sgld test RMSE, median (min-max) | seeds | item mean | sgd (non-private) | als (non-private) |")
    print("|---|---|---|---|---|---|")
    for eps, med, lo, hi, n in rows:
        print(f"| {eps:g} | {med:.4f} ({lo:.4f}-{hi:.4f}) | {n} | {item:.4f} | {sgd['rmse']:.4f} | "
              f"{als['rmse']:.4f} |" if als else f"| {eps:g} | {med:.4f} ({lo:.4f}-{hi:.4f}) | {n} | {item:.4f} | "
              f"{sgd['rmse']:.4f} | - |")
    beats = [eps for eps, med, *_ in rows if med < item]
    print(f"\nsgld beats the item mean ({item:.4f}) from epsilon {min(beats):g} on (of those measured)" if beats else
          f"\nsgld does not beat the item mean ({item:.4f}) at any epsilon measured (up to {rows[-1][0]:g})")
    if a.png:
        plot(rows, item, sgd["rmse"], als["rmse"] if als else None, a.png, store, extra)


def plot(rows, item, sgd, als, png, store, extra, others=()):
    """Test RMSE against epsilon (log x), min-max band over seeds, the item mean and the non-private lines.

    ``others``: more sgld series as ``(label, rows)`` (e.g. Liu et al.'s constants), drawn as open markers.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    eps = [r[0] for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot(eps, [r[1] for r in rows], "o-", color="C3", label="sgld (median over seeds)")
    ax.fill_between(eps, [r[2] for r in rows], [r[3] for r in rows], color="C3", alpha=0.2)
    for n, (label, rs) in enumerate(others):
        ax.plot([r[0] for r in rs], [r[1] for r in rs], "s--", mfc="none", color=f"C{4 + n}", label=label)
    ax.axhline(item, color="0.4", ls="--", label=f"item mean (non-private) {item:.3f}")
    ax.axhline(sgd, color="C0", ls=":", label=f"sgd (non-private) {sgd:.3f}")
    if als is not None:
        ax.axhline(als, color="C2", ls="-.", label=f"als (non-private) {als:.3f}")
    ax.set_xscale("log")
    ax.set_xlabel("user-level epsilon (sgld: exact-sample claim)")
    ax.set_ylabel("test RMSE")
    ax.set_title(f"Netflix-shaped store, {store.n_users:,} x {store.n_items:,}, rank 16"
                 + (f"\nsgld {extra}" if extra else ""), fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = png + ".tmp.png"
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, png)
    print(f"wrote {png}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stores", default="ml100k,generated")
    ap.add_argument("--generated-users", type=int, default=200_000)
    ap.add_argument("--epsilons", default="1,10,100,inf")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--sgd-epochs", type=int, default=20, help="--netflix: epochs of the non-private sgd line")
    ap.add_argument("--tau", type=int, default=100)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--posterior-scale", choices=["paper", "tight"], default="tight")
    ap.add_argument("--ridges", default="", help="also evaluate at these local ridges, e.g. 1,10,100")
    ap.add_argument("--netflix", action="store_true", help="Figure 7 on a Netflix-shaped store (module docstring)")
    ap.add_argument("--netflix-users", type=int, default=480_189)
    ap.add_argument("--store", default=None, help="--netflix: the store's path (generated there once, then reused)")
    ap.add_argument("--results", default=None, help="--netflix: JSON of finished runs (appended, reused)")
    ap.add_argument("--png", default=None, help="--netflix: write the figure here")
    ap.add_argument("--sgld-options", default="", help='--netflix: JSON of extra sgld options, e.g. {"kappa": 1}')
    ap.add_argument("--skip-als", action="store_true", help="--netflix: no non-private als line")
    ap.add_argument("--als-options", default="{}", help='--netflix: JSON of the als line\'s options, e.g. '
                    '{"select": "off"} (one fit: the default non-private als fits twice more to choose its item '
                    'ridge)')
    a = ap.parse_args(argv)
    if a.netflix:
        return netflix(a)

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
