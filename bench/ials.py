"""Recall@10 of ``--method ials`` beside ``implicit``'s ALS and the most-popular lists, same split, same protocol.

    python bench/ials.py STORE [--epsilons inf,10,1] [--seeds 1] [--grid] [--option name=value ...]
                               [--speed] [--repeats 3] [--iters 4] [--workers 2]

On ``STORE``'s train/test split (e.g. ML-100K ingested with ``--test-fraction 0.2
--seed 1``), prints Recall@10 and NDCG@10 with ``streamdp evaluate``'s protocol
(:mod:`streamdp.serving.ranking`: each user's top 10 among the items she did not rate in
training; relevant = a held-out rating in the top 20% of the range; users without one
skipped) of

* ``ials`` at each epsilon (median over ``--seeds``), with the most-popular list by the
  model's own released counts (``private_popularity``) beside it;
* ``implicit``'s ALS (bench-only peer, never a dependency of streamdp): 64 factors,
  15 iterations, on the binarized training matrix, best Recall@10 over a small grid of
  regularization x alpha (its confidence is ``alpha`` on an observed pair, 1 elsewhere);
* the most-popular list by the exact training counts (non-private);

and the ratios of each ``ials`` line to implicit's best and to the exact chart.
``--speed`` times one iteration of each (``ials`` streamed from disk on ``--workers``
workers, non-private and at epsilon 1, the same factors; implicit in memory on as many
threads): each iteration's wall time inside the fit, the fits interleaved and repeated,
medians (:func:`speed`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.als_privacy import delta_for, fit_timed, split_frame  # noqa: E402

#: implicit's grid: (regularization, alpha).
GRID = ((0.01, 1.0), (0.1, 10.0), (1.0, 10.0), (0.1, 40.0), (1.0, 40.0), (10.0, 40.0))


def matrices(store, test=True):
    """``(train CSR binarized, test users, test items, test ratings)`` (only the first without ``test``)."""
    import scipy.sparse as sp

    u, i, _ = split_frame(store, "train")
    X = sp.csr_matrix((np.ones(len(u), np.float32), (u, i)), shape=(store.n_users, store.n_items))
    X.sum_duplicates()
    X.data[:] = 1.0
    return (X,) + (split_frame(store, "test") if test else ())


def recall_ndcg(lists, tu, ti, tr, threshold):
    """Recall@k and NDCG@k of ``lists`` (``n_users x k`` item indices, -1 padding) as :mod:`streamdp.serving.ranking`."""
    rel = tr >= threshold
    relevant = {}
    for u, j in zip(tu[rel], ti[rel]):
        relevant.setdefault(int(u), set()).add(int(j))
    k = lists.shape[1]
    disc = 1.0 / np.log2(np.arange(k) + 2.0)
    rec, nd = [], []
    for u, R in relevant.items():
        row = [j for j in lists[u] if j >= 0]
        hits = [a for a, j in enumerate(row) if j in R]
        rec.append(len(hits) / len(R))
        nd.append(sum(disc[a] for a in hits) / disc[:min(len(R), k)].sum())
    return float(np.mean(rec)), float(np.mean(nd))


def popular_lists(X, k):
    """Each user's top ``k`` unseen items by exact training counts (ties: lower index)."""
    counts = np.asarray(X.sum(axis=0)).ravel()
    order = np.lexsort((np.arange(len(counts)), -counts))
    out = np.full((X.shape[0], k), -1, np.int64)
    for u in range(X.shape[0]):
        seen = set(X.indices[X.indptr[u]:X.indptr[u + 1]].tolist())
        row = [j for j in order[:k + len(seen)] if j not in seen][:k]
        out[u, :len(row)] = row
    return out


def implicit_lists(X, k, reg, alpha, factors=64, iterations=15, threads=2, seed=1):
    """implicit's ALS fitted on ``alpha X`` and each user's top ``k`` unseen items: ``(lists, fit seconds)``."""
    from implicit.cpu.als import AlternatingLeastSquares

    m = AlternatingLeastSquares(factors=factors, regularization=reg, alpha=alpha, iterations=iterations,
                                num_threads=threads, random_state=seed, calculate_training_loss=False)
    t = time.perf_counter()
    m.fit(X, show_progress=False)
    secs = time.perf_counter() - t
    ids, _ = m.recommend(np.arange(X.shape[0]), X, N=k, filter_already_liked_items=True)
    return np.asarray(ids, np.int64), secs


def ials_metrics(store, epsilon, seed, workers, **opts):
    """``(recall, ndcg, private-chart recall, fit seconds)`` of one ials model, evaluated by streamdp."""
    from streamdp.serving.evaluate import evaluate_model

    f, secs = fit_timed(store, "ials", epsilon, seed, workers=workers, **opts)
    d = tempfile.mkdtemp(prefix="bench-ials-")
    try:
        out = os.path.join(d, "m")
        f.save(out)
        r = evaluate_model(out, store, baselines=False, ranking=True, workers=workers,
                           ranking_users="all")["ranking"]  # every user, as implicit's lists are measured
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return r["recall"], r["ndcg"], r["baselines"]["private_popularity"]["recall"], secs


def clustered_csv(path, n_users, n_items, per_user, clusters=20, strength=1.5, seed=1):
    """A rating file where preference is more than popularity: users in ``clusters`` taste groups.

    Item ``j``'s weight for group ``g`` is ``pop_j exp(strength z_gj)`` (``pop_j`` Zipf 0.9,
    ``z`` standard normal): a user draws her ``~per_user`` items (Poisson, at least 1) without
    replacement by her group's weights, and rates each ``clip(round(3 + 1.2 z_gj + N(0, 0.7)), 1, 5)``.
    Bench-only stand-in for a clustered-taste generator (what ``streamdp generate`` chooses is
    popularity alone, so the chart beats every personalised model there).
    """
    rng = np.random.default_rng(seed)
    pop = 1.0 / np.arange(1, n_items + 1) ** 0.9
    z = rng.standard_normal((clusters, n_items))
    w = pop[None] * np.exp(strength * z)
    w /= w.sum(axis=1, keepdims=True)
    group = rng.integers(0, clusters, n_users)
    with open(path, "w") as f:
        for u in range(n_users):
            g = group[u]
            m = min(max(1, rng.poisson(per_user)), n_items // 2)
            items = rng.choice(n_items, m, replace=False, p=w[g])
            r = np.clip(np.round(3 + 1.2 * z[g, items] + rng.normal(0, 0.7, m)), 1, 5)
            f.write("".join(f"{u}\t{j}\t{int(x)}\n" for j, x in zip(items, r)))


def _value(text):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text, text)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("store", help="a store with a test split; with --clustered, where to write one")
    ap.add_argument("--clustered", default=None, metavar="USERS,ITEMS,PER_USER",
                    help="first write a clustered-taste store there (bench-only generator, 20%% test split, seed 1)")
    ap.add_argument("--epsilons", default="inf,10,1")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--option", action="append", default=[], help="an ials option name=value (repeatable)")
    ap.add_argument("--no-implicit", action="store_true", help="skip implicit's grid")
    ap.add_argument("--speed", action="store_true", help="time one iteration of each (64 factors)")
    ap.add_argument("--speed-only", action="store_true", help="only the timing (a store without a test split)")
    ap.add_argument("--repeats", type=int, default=3, help="--speed: interleaved repeats of the three fits")
    ap.add_argument("--iters", type=int, default=4, help="--speed: iterations per fit (the first is not counted)")
    a = ap.parse_args(argv)
    from streamdp.serving.ranking import default_threshold
    from streamdp.storage.store import open_store

    if a.clustered:
        import subprocess

        nu, ni, pu = (float(x) for x in a.clustered.split(","))
        csv = a.store.rstrip("/") + ".tsv"
        clustered_csv(csv, int(nu), int(ni), pu)
        subprocess.run([sys.executable, "-m", "streamdp", "ingest", csv, "--out", a.store, "--test-fraction", "0.2",
                        "--seed", "1", "--rating-range", "1,5", "--force"], check=True)
    st = open_store(a.store)
    opts = dict(o.split("=", 1) for o in a.option)
    opts = {key: _value(v) for key, v in opts.items()}
    if a.speed_only:
        speed(st, matrices(st, test=False)[0], a.workers, opts, repeats=a.repeats, iters=a.iters)
        return
    thr = default_threshold(st.rating_min, st.rating_max)
    X, tu, ti, tr = matrices(st)
    pop = recall_ndcg(popular_lists(X, 10), tu, ti, tr, thr)
    print(f"{a.store}: {st.n_users:,} users x {st.n_items:,} items, {X.nnz:,} training pairs; relevant: held-out "
          f">= {thr:g}")
    print(f"most popular (exact counts, non-private): Recall@10 {pop[0]:.4f}  NDCG@10 {pop[1]:.4f}")
    best = None
    if not a.no_implicit:
        for reg, alpha in GRID:
            lists, secs = implicit_lists(X, 10, reg, alpha, threads=a.workers)
            r = recall_ndcg(lists, tu, ti, tr, thr)
            print(f"implicit ALS reg {reg:g} alpha {alpha:g}: Recall@10 {r[0]:.4f}  NDCG@10 {r[1]:.4f}  "
                  f"({secs:.1f}s)")
            if best is None or r[0] > best[0]:
                best = r
        print(f"implicit ALS best: Recall@10 {best[0]:.4f}  NDCG@10 {best[1]:.4f}")
    for eps in [float(e) for e in a.epsilons.split(",")]:
        runs = [ials_metrics(st, eps, seed, a.workers, **opts) for seed in range(1, a.seeds + 1)]
        rec = statistics.median(r[0] for r in runs)
        nd = statistics.median(r[1] for r in runs)
        pp = statistics.median(r[2] for r in runs)
        ratio = f"  {rec / best[0]:.3f}x implicit" if best else ""
        print(f"ials epsilon {eps:g}: Recall@10 {rec:.4f}  NDCG@10 {nd:.4f}  ({rec / pop[0]:.3f}x the exact chart, "
              f"{rec / pp:.3f}x the chart by its released counts {pp:.4f}){ratio}  fit {runs[0][3]:.1f}s")
    if a.speed:
        speed(st, X, a.workers, opts, repeats=a.repeats, iters=a.iters)


def ials_iteration_times(st, epsilon, workers, factors, iters, opts):
    """``(wall, cpu)`` seconds of each ``ials`` iteration of one fit after the first: its streamed passes (every
    block read from disk, the user solves and the item-side sums on ``workers`` workers) and the item solve, timed
    between the fit's per-iteration checkpoints (``Run.save``); ``cpu`` is the process's CPU time (all threads)."""
    from streamdp.methods import get_method
    from streamdp.stream.driver import Run
    from streamdp.stream.engine import Engine

    m = get_method("ials")(epsilon=epsilon, delta=delta_for(st), seed=1, rank=factors, iters=iters, **opts)
    marks, save = [], Run.save

    def timed_save(self, *args, **kw):
        marks.append((time.perf_counter(), time.process_time()))
        return save(self, *args, **kw)

    Run.save = timed_save
    try:
        with Engine(st, workers=workers, memory_limit="8GB", state_bytes=m.state_bytes(st)) as eng:
            m.fit(st, eng)
    finally:
        Run.save = save
    times = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(marks, marks[1:])]
    # the last iteration also runs the choice between the factors and the chart (a pass of its own; --select auto,
    # private or not)
    return times[:-1] if getattr(m, "_choice", None) is not None and len(times) > 1 else times


def implicit_iteration_times(X, workers, factors, iters):
    """``(wall, cpu)`` seconds of each iteration of ``implicit``'s ALS after the first (its per-iteration
    callback), in memory."""
    from implicit.cpu.als import AlternatingLeastSquares

    marks = []
    m = AlternatingLeastSquares(factors=factors, iterations=iters, num_threads=workers, random_state=1,
                                calculate_training_loss=False)
    m.fit(X, show_progress=False, callback=lambda it, elapsed, loss: marks.append((time.perf_counter(),
                                                                                   time.process_time())))
    return [(b[0] - a[0], b[1] - a[1]) for a, b in zip(marks, marks[1:])]


def speed(st, X, workers, opts, factors=64, repeats=3, iters=4):
    """Seconds per iteration: ``ials`` streamed (non-private and epsilon 1), ``implicit`` in memory, interleaved.

    Each fit runs ``iters`` iterations and its median iteration after the first is taken (the
    first compiles and warms the caches); the three fits are repeated ``repeats`` times in
    turn, so that load from other jobs on a shared machine falls on all of them alike; the
    medians over the repeats and the median of the per-repeat ratios are printed, of wall
    time and of the process's CPU time (all threads: on a machine whose cores other jobs
    share, the work each side does, free of how much of the cores it got).

    Returns ``{"inf" | "1" | "implicit": {"wall" | "cpu": median seconds}, "speed": {("wall" | "cpu", "inf" | "1"):
    implicit's seconds / ials's, median of the per-repeat ratios}}`` (:mod:`bench.run` tabulates it).
    """
    from threadpoolctl import threadpool_limits

    runs = {"inf": [], "1": [], "implicit": []}
    for r in range(repeats):
        for eps in ("inf", "1"):
            t = ials_iteration_times(st, float(eps), workers, factors, iters, opts)
            runs[eps].append(tuple(statistics.median(x[i] for x in t) for i in (0, 1)))
        with threadpool_limits(1, "blas"):  # implicit's own advice (its CG does its own threading)
            t = implicit_iteration_times(X, workers, factors, iters)
            runs["implicit"].append(tuple(statistics.median(x[i] for x in t) for i in (0, 1)))
        print(f"repeat {r + 1}: " + ", ".join(f"{key} {v[-1][0]:.3f}s (cpu {v[-1][1]:.3f}s)"
                                              for key, v in runs.items()), flush=True)
    out = {key: {what: statistics.median(x[i] for x in v) for i, what in ((0, "wall"), (1, "cpu"))}
           for key, v in runs.items()}
    out["speed"] = {}
    for i, what in ((0, "wall"), (1, "cpu")):
        for eps in ("inf", "1"):
            ratio = out["speed"][what, eps] = statistics.median(t[i] / o[i] for t, o in zip(runs["implicit"],
                                                                                            runs[eps]))
            print(f"one iteration ({what}), {factors} factors, {X.nnz:,} pairs, {st.n_users:,} users x "
                  f"{st.n_items:,} items: ials epsilon {eps} {out[eps][what]:.3f}s streamed on {workers} workers, "
                  f"implicit {out['implicit'][what]:.3f}s in memory on {workers} threads (medians of {repeats}): "
                  f"ials speed {ratio:.2f}x implicit's")
    print(f"issue 44 (target >= 1.3 at 20M ratings, 64 factors): implicit's CPU seconds per iteration / ials's: "
          f"non-private {out['speed']['cpu', 'inf']:.2f}, epsilon 1 {out['speed']['cpu', '1']:.2f} ({X.nnz:,} pairs, "
          f"{factors} factors)")
    return out


if __name__ == "__main__":
    main()
