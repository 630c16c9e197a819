"""Lists against the most-popular chart and the non-private list models, on one split, with ``evaluate``'s protocol.

    python bench/ranking.py                                  # ML-100K, FilmTrust, two generated stores
    python bench/ranking.py --stores ml-100k --k 10,20 --json out.json
    python bench/ranking.py --stores regimes                 # the regime suite's stores (bench/regimes.py)
    python bench/ranking.py --stores clustered-10k           # 10,000 users in 20 taste groups (bench/ials.py's)
    python bench/ranking.py --stores product-72k,log-6k,thin-600,repeat-log --implicit-grid issue42 \
        --epsilons 1,10,inf                                  # issue 42's shapes, its peers' grid (docs/benchmarks.md)
    python bench/ranking.py --stores million --ranking-users 20000 --store-dir /tmp/keep \
        --implicit-grid 'factors=16,64;alpha=1,10;regularization=1' --ease-max-items 10000 --k 10 \
        --epsilons 1,10,inf --tune-epsilons ''           # the 1M x 20k store: every list on one users' sample
    python bench/ranking.py --methods-table [--seeds 2]      # docs/methods.md's table: means, oja, als per epsilon

Per store (real sets ingested from ``../shared/data`` with ``--test-fraction 0.2 --seed 1``
and their declared ranges; generated ones with ``streamdp generate``; the clustered one written
by :func:`bench.ials.clustered_csv` and ingested as the real sets; issue 42's shapes, :data:`SHAPES`,
generated with ``--test-fraction 0.2 --seed 1``, ``log-6k``'s pairs then written as ``user,item`` files and
ingested with ``--columns user,item``), Recall@k and NDCG@k for each ``--k`` of:

* the two most-popular lists: by the exact training counts (non-private) and by the
  counts the default model released (post-processing of its release);
* the default model (``streamdp train STORE --epsilon 1``), its lists ranked as
  ``recommend`` ranks them (its ``list_scorer``: the prediction + a weight x log of the
  released counts) and, for comparison, by the predicted rating alone (the lists of
  streamdp before list scorers), with its test RMSE (unchanged by the scorer);
* ``--method ials`` at each ``--epsilons`` value (``inf``: non-private), when a method
  of that name is registered (:data:`streamdp.methods.METHODS`), and ``streamdp tune
  --method ials`` (its default grid) at each ``--tune-epsilons`` value (default 10);
* two non-private references fitted in the same run on the same training split:
  ``implicit``'s ALS (a bench-only import, skipped when it is not installed; a grid of
  factors x regularization x alpha on the binary training matrix, best reported;
  ``--implicit-grid issue42``: issue 42's 27 settings) and
  EASE (Steck 2019: ``B = I - P diag(1/diag(P))``, ``P = (X^T X + lambda I)^-1``, closed
  form in NumPy, for up to ``--ease-max-items`` items; best ``lambda`` of a grid reported).

After the stores' tables, one line per store of Recall@k (:func:`summary_table`): each list over the exact chart
(private ``ials``, the default) or over implicit's best (epsilon 10, non-private, tuned), and the lowest ratio of an
``ials`` model's lists to the chart by its own released counts: issue 42's targets read off it.

The peers' best setting is chosen on the test split itself: optimistic for them, the
bar streamdp is held to is therefore a high one. Their lists go through streamdp's own
metric code (:func:`streamdp.kernels.topk.ranking_sums`, the kernel ``evaluate`` uses)
with ``evaluate``'s protocol: each user's top k among the items she did not rate in
training, ties by ascending item id, relevant = a held-out rating in the top 20% of the
rating range (:func:`streamdp.serving.ranking.default_threshold`), users without a relevant
held-out rating not evaluated; every user, or with ``--ranking-users N`` ``evaluate --ranking-users N``'s seeded
sample (:func:`streamdp.serving.ranking.ranking_sample`) for every list, each mean with its standard error. The exact
most-popular list is computed both ways (through ``evaluate`` and through the peers' path) and the two must agree,
on the same users and with the same standard errors: the run stops if not.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time

import numpy as np

if __package__ in (None, ""):  # run as a file: make ``bench`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import declared_items, shared_data  # noqa: E402

#: Real stores: file under ../shared/data and declared rating range.
REAL = {"ml-100k": ("ml-100k/u.data", "1,5"), "filmtrust": ("filmtrust/ratings.txt", "0.5,4")}
#: Generated stores: issue 29's 30k x 2k (10 per user) and the README's worked example.
GENERATED = {"gen-30k": dict(users=30_000, items=2_000, ratings_per_user=10),
             "gen-10k": dict(users=10_000, items=500, ratings_per_user=20)}
#: Clustered-taste stores (:func:`bench.ials.clustered_csv`, ingested as ``bench/ials.py --clustered`` does): the
#: store of docs/ranking.md's ``ials`` table, where non-private lists beat the chart by about 1.9x.
CLUSTERED = {"clustered-10k": dict(n_users=10_000, n_items=1_000, per_user=20)}
#: The grids of the non-private references.
IMPLICIT_GRID = [dict(factors=f, regularization=r, alpha=a) for f in (32, 64) for r in (0.01, 0.1) for a in (1.0, 10.0)]
#: Issue 42's grid for implicit's ALS (its targets' "best of implicit's ALS"): factors x alpha x regularisation.
ISSUE42_GRID = [dict(factors=f, regularization=r, alpha=a) for f in (16, 32, 64) for a in (1.0, 10.0, 40.0)
                for r in (0.01, 0.1, 1.0)]
#: Issue 42's shapes (``streamdp generate`` options, ``--test-fraction 0.2 --seed 1``). ``log_pairs``: the
#: generated ratings' train and test pairs written as ``user,item`` files and ingested with ``--columns user,item``
#: (an interaction log, every count 1: tests/methods/test_ials_log.py's recipe).
SHAPES = {
    # the real product set's shape (docs/ranking.md, "lighter, as the real set"): 85% of users with one rating
    "product-72k": dict(users=72_000, items=2_400, ratings_per_user=1.3, user_exponent=1.5, taste_clusters=20,
                        taste_strength=4.0),
    # the 6,040 x 3,706 movie set as an interaction log, ~165 interactions per user
    "log-6k": dict(users=6_040, items=3_706, ratings_per_user=165, item_exponent=0.9, taste_clusters=20,
                   taste_strength=2.0, log_pairs=True),
    # issue 42 part 4's thin store: 600 users x 10,000 items, ~165 ratings per user
    "thin-600": dict(users=600, items=10_000, ratings_per_user=165, taste_clusters=20, taste_strength=2.0),
    # an implicit log with repeat counts (``generate --implicit``)
    "repeat-log": dict(users=15_000, items=2_000, ratings_per_user=20, taste_clusters=20, implicit=True),
    # a big product catalogue: 1M users x 20k items, ~20 ratings per user (20M), a heavy popularity head (Zipf 1.0)
    # and a heavy tail of light users (Pareto 1.5), tastes as product-72k's; run with --ranking-users
    "million": dict(users=1_000_000, items=20_000, ratings_per_user=20, item_exponent=1.0, user_exponent=1.5,
                    taste_clusters=20, taste_strength=4.0),
}
EASE_LAMBDAS = (10.0, 50.0, 200.0, 1000.0)


# -- the store's splits in memory (bench-only: small stores) ---------------------------------------------------
def splits(st):
    """``(train, test)`` as scipy CSR (users x items, the store's dense order; values: ratings)."""
    import scipy.sparse as sp

    out = []
    for split in ("train", "test"):
        ip, it, r = [np.zeros(1, np.int64)], [], []
        for b in range(st.n_blocks):
            blk = st.read_block(b, split)
            ip.append(ip[-1][-1] + np.asarray(blk.indptr[1:], np.int64))
            it.append(np.asarray(blk.items, np.int32))
            r.append(np.asarray(blk.ratings, np.float64))
        out.append(sp.csr_matrix((np.concatenate(r), np.concatenate(it), np.concatenate(ip)),
                                 shape=(st.n_users, st.n_items)))
    return out


def tiekey_of(st, model=None) -> np.ndarray:
    """Each store item's position in the released ``model`` (``None``: ascending original id, the order of a model
    of a store with declared items): ``evaluate``'s tie-break. A log ingested without its items declared has a
    private catalogue: the model's own items in its order, then the store's others in the store's order
    (``Model.padded_to``, as ``evaluate`` scores it)."""
    ids = st.item_ids()
    if model is not None:
        from streamdp.storage.ids import find

        return np.asarray(find(model.padded_to(ids).item_ids, ids), np.int64)
    key = np.empty(len(ids), np.int64)
    key[np.argsort(ids, kind="stable")] = np.arange(len(ids))
    return key


def metrics_of_scores(score_rows, train, test, tiekey, threshold, ks, block=2048, users=None) -> dict:
    """Recall@k and NDCG@k (each with its standard error) of the lists ranked by ``score_rows(rows)`` (dense
    ``(len(rows), items)`` scores of the users at dense positions ``rows``).

    Each user's top ``max(ks)`` unseen items by ``(-score, tiekey)``, then
    :func:`streamdp.kernels.topk.ranking_sums` (``evaluate``'s metric kernel) for each ``k``. ``users``: the sorted
    dense positions scored (:func:`streamdp.serving.ranking.ranking_sample`, ``evaluate --ranking-users``'s sample);
    ``None``: every user, standard error 0 (the means are exact).
    """
    from streamdp.kernels.topk import SUMS, ranking_sums
    from streamdp.serving.ranking import standard_error

    kmax = max(ks)
    n_items = train.shape[1]
    pop = np.bincount(train.indices, minlength=train.shape[1]).astype(np.float64)
    sums = {k: np.zeros(len(SUMS)) for k in ks}
    covered = np.zeros(n_items)
    rows_all = np.arange(train.shape[0]) if users is None else np.asarray(users, np.int64)
    for first in range(0, len(rows_all), block):
        rows = rows_all[first:first + block]
        S = np.array(score_rows(rows), np.float64, copy=True)
        tr = train[rows]
        lists = top_lists(S, tr, tiekey, kmax)
        te = test[rows]
        for k in ks:
            ranking_sums(np.ascontiguousarray(lists[:, :k]), te.indptr.astype(np.int64), te.indices.astype(np.int32),
                         te.data.astype(np.float64), float(threshold), pop, np.ones(len(rows), np.uint8), sums[k],
                         covered)
    # evaluate's population: every user with a relevant held-out item (the sampled ones are only part of them)
    population = float(np.count_nonzero(np.bincount(np.repeat(np.arange(test.shape[0]), np.diff(test.indptr))[
        test.data >= threshold], minlength=test.shape[0])))
    return {k: {"recall": s[2] / max(s[0], 1), "ndcg": s[3] / max(s[0], 1), "n_users": int(s[0]),
                "standard_error": {m: standard_error(s[i], s[i + 5], s[0], population, users is not None)
                                   for m, i in (("recall", 2), ("ndcg", 3))}}
            for k, s in sums.items()}


def top_lists(S, tr, tiekey, kmax) -> np.ndarray:
    """Each row's top ``kmax`` items of the scores ``S`` among those not in ``tr`` (CSR, the rows' training
    ratings), by ``(-score, tiekey)``; ``-1``-padded."""
    n_items = S.shape[1]
    S[np.repeat(np.arange(len(S)), np.diff(tr.indptr)), tr.indices] = -np.inf
    m = min(kmax + 32, n_items)  # a margin for ties at the partition's edge, then an exact sort
    part = np.argpartition(-S, m - 1, axis=1)[:, :m] if m < n_items else np.tile(np.arange(n_items), (len(S), 1))
    # the kmax-th score: where more than m items reach it (ties wider than the margin, e.g. the chart's counts
    # on a heavy user's unseen tail) the candidates are every item that reaches it, so the tie-break is exact
    kth = np.partition(S, n_items - kmax, axis=1)[:, n_items - kmax] if kmax < n_items else S.min(axis=1)
    wide = (S >= kth[:, None]).sum(axis=1) > m
    lists = np.full((len(S), kmax), -1, np.int32)
    for u in range(len(S)):
        cand = np.flatnonzero(S[u] >= kth[u]) if wide[u] else part[u]
        order = cand[np.lexsort((tiekey[cand], -S[u, cand]))][:kmax]
        order = order[np.isfinite(S[u, order])]
        lists[u, :len(order)] = order
    return lists


# -- the non-private references --------------------------------------------------------------------------------
def ease_scores(X, lam: float):
    """EASE's item-item matrix ``B`` (Steck 2019, eq. 8) of the binary matrix ``X``; scores are ``X B``."""
    G = (X.T @ X).toarray().astype(np.float64)
    G[np.diag_indices_from(G)] += lam
    P = np.linalg.inv(G)
    B = P / (-np.diag(P))
    B[np.diag_indices_from(B)] = 0.0
    return B


def peers(train, test, tiekey, threshold, ks, *, seed: int, threads: int, ease_max_items: int, grid=None,
          lambdas=EASE_LAMBDAS, users=None) -> dict:
    """The best ``implicit`` ALS and the best EASE of their grids, each with its setting (absent ones say why);
    every list scored on the users ``users`` (:func:`metrics_of_scores`)."""
    X = train.copy()
    X.data[:] = 1.0
    X = X.tocsr()
    out = {}
    try:
        from implicit.cpu.als import AlternatingLeastSquares
        from threadpoolctl import threadpool_limits
    except ImportError as exc:
        out["implicit_als"] = {"skipped": f"implicit not importable ({exc})"}
    else:
        best = None
        for g in (IMPLICIT_GRID if grid is None else grid):
            t = time.perf_counter()
            with threadpool_limits(1, "blas"):  # implicit's own advice: its threads, not BLAS's
                model = AlternatingLeastSquares(**g, iterations=15, random_state=seed, num_threads=threads)
                model.fit(X.astype(np.float32), show_progress=False)
            Uf, Vf = np.asarray(model.user_factors), np.asarray(model.item_factors)
            r = metrics_of_scores(lambda rows: Uf[rows] @ Vf.T, train, test, tiekey, threshold, ks, users=users)
            r["setting"], r["seconds"] = g, round(time.perf_counter() - t, 2)
            print(f"implicit {g}: Recall@{min(ks)} {r[min(ks)]['recall']:.4f}, {r['seconds']} s", file=sys.stderr)
            if best is None or r[min(ks)]["recall"] > best[min(ks)]["recall"]:
                best = r
        out["implicit_als"] = best
    if X.shape[1] > ease_max_items:
        out["ease"] = {"skipped": f"{X.shape[1]} items > --ease-max-items {ease_max_items}"}
    else:
        best = None
        for lam in lambdas:
            t = time.perf_counter()
            B = ease_scores(X, lam)
            r = metrics_of_scores(lambda rows: X[rows] @ B, train, test, tiekey, threshold, ks, users=users)
            r["setting"], r["seconds"] = {"lambda": lam}, round(time.perf_counter() - t, 2)
            if best is None or r[min(ks)]["recall"] > best[min(ks)]["recall"]:
                best = r
        out["ease"] = best
    return out


# -- streamdp's models ------------------------------------------------------------------------------------------
def streamdp_rows(st, tmp, ks, epsilons, seed, workers, old_lists=True, tune_epsilons=(), ranking_users="all") -> dict:
    """The two most-popular lists, the default model's lists (new and, with ``old_lists``, old scorer), ``ials``
    at each epsilon and ``tune --method ials`` at each of ``tune_epsilons`` (each with the chart by its own released
    counts, the floor its lists are held to); each scored on ``evaluate --ranking-users ranking_users``'s users."""
    import streamdp
    from streamdp.methods import load_builtin
    from streamdp.serving.evaluate import evaluate_model
    from streamdp.serving.model import load_model

    def ranked(model, **kw):
        # the users the references are scored on (metrics_of_scores with ranking_sample's users)
        return {k: evaluate_model(model, st, workers=workers, k=k, baselines=False, ranking_users=ranking_users,
                                  **kw)["ranking"] for k in ks}

    rows = {}
    k0 = min(ks)

    def pick(r, key=None):
        got = {k: r[k] if key is None else r[k]["baselines"][key] for k in ks}
        return {k: {"recall": g["recall"], "ndcg": g["ndcg"], "standard_error": {
            m: g["standard_error"][m] for m in ("recall", "ndcg")}} for k, g in got.items()}

    if st.implicit:  # the default on a log is ials (als refuses it): its row is ials eps 1's, the chart from it
        ref = None
        rows["most popular (exact counts, non-private)"] = None
        rows["default (als eps 1): list score"] = {"skipped": "an interaction log: the default is ials, the ials "
                                                              "eps 1 row"}
    else:
        path = os.path.join(tmp, f"default-{seed}")
        streamdp.train(st, epsilon=1.0, out=path, seed=seed, workers=workers, evaluate=False)
        m = load_model(path)
        ev = evaluate_model(m, st, workers=workers, k=min(ks), ranking=False)
        new = ref = ranked(m)
        ref_model = m
        rows["most popular (exact counts, non-private)"] = pick(new, "popularity")
        if "private_popularity" in new[k0]["baselines"]:
            rows["most popular (default model's released counts)"] = pick(new, "private_popularity")
        part = (m.info.get("lists") or {})
        rows["default (als eps 1): list score"] = {**pick(new), "rmse": ev["rmse"],
                                                   "personalised": new[k0]["personalised"],
                                                   "list_scorer": new[k0]["list_scorer"],
                                                   **({"lists_part": {k: part[k] for k in ("used", "epsilon")}}
                                                      if part else {})}
        if part.get("used"):  # the lists are the ials part's (streamdp.methods._lists): no old lists to compare
            rows["default (als eps 1): predicted rating (old lists)"] = {"skipped": "the lists are its ials part's"}
        elif old_lists:
            old_m = load_model(path)
            old_m.info = {**old_m.info, "list_scorer": {"kind": "predicted_rating"}}
            rows["default (als eps 1): predicted rating (old lists)"] = {**pick(ranked(old_m)), "rmse": ev["rmse"]}
    if "ials" in load_builtin():
        for e in epsilons:
            p = os.path.join(tmp, f"ials-{e:g}-{seed}")
            streamdp.train(st, method="ials", epsilon=e, allow_nonprivate=True,
                           out=p, seed=seed, workers=workers, evaluate=False)
            r = ranked(load_model(p))
            if ref is None:
                ref, ref_model = r, load_model(p)
                rows["most popular (exact counts, non-private)"] = pick(r, "popularity")
            rows[f"ials eps {e:g}"] = pick(r)
            if "private_popularity" in r[k0]["baselines"]:
                rows[f"ials eps {e:g}"]["released_chart"] = pick(r, "private_popularity")
        for e in tune_epsilons:
            p = os.path.join(tmp, f"ials-tune-{e:g}-{seed}")
            t = time.perf_counter()
            tuning = streamdp.tune(st, epsilon=e, method="ials", out=p, seed=seed, workers=workers,
                                   evaluate=False).summary["tuning"]
            r = ranked(load_model(p))
            label = f"ials tune eps {e:g}"
            rows[label] = {**pick(r), "chosen": tuning["chosen"], "tune_skipped": tuning.get("skipped"),
                           "seconds": round(time.perf_counter() - t, 1)}
            if "private_popularity" in r[k0]["baselines"]:
                rows[label]["released_chart"] = pick(r, "private_popularity")
    if ref is None:
        raise SystemExit(f"{st.path}: an implicit store needs ials (--epsilons) for its lists")
    return rows, ref[k0], tiekey_of(st, ref_model)


# -- docs/methods.md's table: streamdp's methods on the real stores -------------------------------------------
def methods_table(st, name, seeds, epsilons) -> None:
    """Recall@10 / NDCG@10 of ``means`` and ``oja`` at epsilon 1 and ``als`` at each epsilon (mean over seeds;
    the stores of ``bench/als_privacy.py --real``), beside the two most-popular lists; lists ranked by each
    model's list scorer, as ``recommend`` ranks them."""
    import statistics

    from bench.als_privacy import fit_timed, fitted_evaluation

    def mean(method, eps):
        rs = [fitted_evaluation(st, fit_timed(st, method, eps, s, workers=1)[0], workers=1)["ranking"]
              for s in range(seeds if math.isfinite(eps) else 1)]
        return (statistics.mean(r["recall"] for r in rs), statistics.mean(r["ndcg"] for r in rs), rs)

    cols = [("means", 1.0), ("oja", 1.0)] + [("als", e) for e in epsilons]
    out = {c: mean(*c) for c in cols}
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


# -- stores ------------------------------------------------------------------------------------------------------
def log_of(st, tmp, out):
    """``st``'s train and test pairs as an interaction log: written as ``user,item`` CSV files (original ids) and
    ingested with ``--columns user,item --train ... --test ...`` (every count 1), as tests/methods/test_ials_log.py
    builds the issue's movie log."""
    import streamdp

    uids, iids = st.user_ids(), st.item_ids()
    files = {}
    for split in ("train", "test"):
        files[split] = os.path.join(tmp, f"{os.path.basename(out)}-{split}.csv")
        with open(files[split], "w") as fh:
            fh.write("user,item\n")
            for b in st.blocks(split):
                n = np.diff(b.indptr)
                u = np.repeat(np.arange(b.first_user, b.first_user + len(n)), n)
                np.savetxt(fh, np.c_[uids[u], iids[b.items]], fmt="%s", delimiter=",")
    return streamdp.ingest(train=files["train"], test=files["test"], out=out, columns="user,item")


def shaped_store(name, tmp, keep=None):
    """Issue 42's store ``name`` (:data:`SHAPES`), generated (and, for a log, re-ingested) under ``tmp``; with
    ``keep`` (``--store-dir``) under ``keep`` instead, and reopened from there when a run left it."""
    import streamdp

    kw = dict(SHAPES[name])
    log_pairs = kw.pop("log_pairs", False)
    path = os.path.join(keep or tmp, name + ".zarr")
    if keep and os.path.exists(path):
        return streamdp.open_store(path)
    st = streamdp.generate(path + (".ratings" if log_pairs else ""), seed=1, test_fraction=0.2, **kw)
    return log_of(st, tmp, path) if log_pairs else st


def open_stores(names, tmp, big: bool, keep=None):
    """``(name, store)`` of each of ``names`` (``regimes``: every regime of bench/regimes.py)."""
    import streamdp
    from streamdp.storage.ingest import ingest

    for name in names:
        if name in REAL:
            rel, rr = REAL[name]
            path = shared_data(rel)
            if not os.path.exists(path):
                print(f"{name}: {path} absent, skipped", file=sys.stderr)
                continue
            yield name, ingest([path], os.path.join(tmp, name + ".zarr"), test_fraction=0.2, seed=1, rating_range=rr,
                               items=declared_items(path, tmp))
        elif name in GENERATED:
            yield name, streamdp.generate(os.path.join(tmp, name + ".zarr"), seed=1, test_fraction=0.2,
                                          **GENERATED[name])
        elif name in SHAPES:
            yield name, shaped_store(name, tmp, keep)
        elif name in CLUSTERED:
            from bench.ials import clustered_csv

            csv = os.path.join(tmp, name + ".tsv")
            clustered_csv(csv, **CLUSTERED[name])
            yield name, ingest([csv], os.path.join(tmp, name + ".zarr"), test_fraction=0.2, seed=1,
                               rating_range="1,5")
        elif name == "regimes":
            from bench.regimes import REGIMES

            for r, (_, kw) in REGIMES.items():
                if r == "200k" and not big:
                    continue
                yield f"regime {r}", streamdp.generate(os.path.join(tmp, r + ".zarr"), seed=1, test_fraction=0.2,
                                                       **kw)
        else:
            raise SystemExit(f"--stores: unknown store {name!r} (known: "
                             f"{', '.join([*REAL, *GENERATED, *CLUSTERED, *SHAPES, 'regimes'])})")


def run_store(name, st, tmp, a, old_lists=True) -> dict:
    """Every list of one store on its one split (``a``: this script's parsed arguments, or the same fields)."""
    from streamdp.serving.ranking import default_threshold

    from streamdp.serving.ranking import ranking_sample

    t = time.perf_counter()
    n_drawn = getattr(a, "ranking_users", None)  # None: every user
    rows, ref, tiekey = streamdp_rows(st, tempfile.mkdtemp(dir=tmp, prefix="models-"), a.k, a.epsilons, a.seed,
                                      a.workers, old_lists=old_lists, tune_epsilons=getattr(a, "tune_epsilons", ()),
                                      ranking_users="all" if n_drawn is None else n_drawn)
    t_streamdp = time.perf_counter() - t
    users = ranking_sample(st.n_users, n_drawn)  # evaluate's own sample: the same users for every list
    train, test = splits(st)
    # evaluate's relevance: on an implicit store every held-out interaction (counts > 0)
    thr = 0.0 if st.implicit else default_threshold(st.rating_min, st.rating_max)
    pop = np.bincount(train.indices, minlength=train.shape[1]).astype(np.float64)
    check = metrics_of_scores(lambda r: np.tile(pop, (len(r), 1)), train, test, tiekey, thr, a.k, users=users)
    for k in a.k:  # the peers' path must reproduce evaluate's exact chart, on the same users, errors and all
        want, got = rows["most popular (exact counts, non-private)"][k], check[k]
        if not (got["n_users"] == ref["n_users"] and all(
                math.isclose(g[m], w[m], rel_tol=1e-9, abs_tol=1e-12) for m in ("recall", "ndcg")
                for g, w in ((got, want), (got["standard_error"], want["standard_error"])))):
            raise SystemExit(f"{name}: the peers' metric path disagrees with evaluate's at k={k}: {check[k]} vs {want}")
    for peer, r in peers(train, test, tiekey, thr, a.k, seed=a.seed, threads=a.workers,
                         ease_max_items=a.ease_max_items, grid=a.grid, lambdas=a.ease_lambdas, users=users).items():
        label = {"implicit_als": "implicit ALS (non-private, best of grid)",
                 "ease": "EASE (non-private, best lambda)"}[peer]
        rows[label] = r
    return {"store": name, "n_users": st.n_users, "n_items": st.n_items, "n_ratings": st.n_ratings,
            "implicit": bool(st.implicit), "evaluated_users": ref["n_users"], "relevant_threshold": thr,
            "evaluable_users": ref["n_users_evaluable"], "users_drawn": ref.get("users_drawn"),
            "seconds": round(time.perf_counter() - t, 1), "streamdp_seconds": round(t_streamdp, 1), "rows": rows}


def format_table(res, ks) -> str:
    head = [f"{m}@{k}" for k in ks for m in ("Recall", "NDCG")]
    held = ("interaction" if res.get("implicit") else f"rating >= {res['relevant_threshold']:g}")
    lines = [f"### {res['store']}: {res['n_users']:,} users x {res['n_items']:,} items, {res['n_ratings']:,} training "
             f"{'interactions' if res.get('implicit') else 'ratings'}; {res['evaluated_users']:,} users with a held-out "
             f"{held}" + (f" (a seeded sample of {res['users_drawn']:,} of the {res['n_users']:,} users, "
                          f"`evaluate --ranking-users {res['users_drawn']}`'s: {res['evaluable_users']:,} with one; "
                          f"each mean ± its standard error)" if res.get("users_drawn") else ""),
             "", "| list | " + " | ".join(head) + " | note |", "|---|" + "---|" * (len(head) + 1)]
    for label, r in res["rows"].items():
        if "skipped" in r:
            lines.append(f"| {label} | " + " | ".join("" for _ in head) + f" | skipped: {r['skipped']} |")
            continue
        vals = [f"{r[k][m]:.4f}" + (f" ± {se:.4f}" if (se := r[k].get("standard_error", {}).get(m)) else "")
                for k in ks for m in ("recall", "ndcg")]
        note = []
        if "rmse" in r:
            note.append(f"test RMSE {r['rmse']:.4f}")
        if "lists_part" in r:
            lp = r["lists_part"]
            note.append(f"lists {'from' if lp['used'] else 'not from'} its ials part (epsilon {lp['epsilon']:g} of "
                        f"it alone, composed with the rest to 1)")
        if r.get("personalised") is False:
            note.append("biases only: one list for all")
        if "setting" in r:
            note.append(", ".join(f"{k} {v:g}" for k, v in r["setting"].items()))
        if "chosen" in r:
            note.append("chose " + ", ".join(f"{k} {v:g}" if isinstance(v, (int, float)) else
                                             f"{k} auto" if v is None else f"{k} {v}"
                                             for k, v in r["chosen"].items())
                        + (f" (no choice made: {r['tune_skipped']})" if r.get("tune_skipped") else ""))
        if "released_chart" in r:
            note.append(f"its released chart {r['released_chart'][ks[0]]['recall']:.4f}")
        lines.append(f"| {label} | " + " | ".join(vals) + f" | {'; '.join(note)} |")
    return "\n".join(lines)


def summary_table(results, k=10) -> str:
    """One line per store: Recall@``k`` of the exact chart, ``ials`` at each epsilon run (``x`` the exact chart for
    a private one; for epsilon 10, non-private and the tuned rows ``x`` implicit's best), the default's, the peers';
    the floor (each ials row over the chart by its own released counts, the lowest); issue 42's targets read off it.
    ``results``: :func:`run_store`'s dicts, or the same read back from ``--json`` (string keys)."""
    def rec(row):
        if not row or "skipped" in row:
            return None
        return (row.get(k) or row.get(str(k)))["recall"]

    def cell(v, ref=None, what=""):
        if v is None:
            return ""
        return f"{v:.3f}" + (f" ({v / ref:.2f}x{what})" if ref else "")

    labels = [lab for r in results for lab in r["rows"] if lab.startswith("ials ")]
    ials = list(dict.fromkeys(lab for lab in labels if not lab.startswith("ials tune")))
    tuned = list(dict.fromkeys(lab for lab in labels if lab.startswith("ials tune")))
    head = (["store", "exact chart"] + [f"`{lab}`" for lab in ials + tuned]
            + ["default eps 1", "implicit's ALS (best)", "EASE (best)", "ials / its released chart (lowest)"])
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        rows = r["rows"]
        chart = rec(rows.get("most popular (exact counts, non-private)"))
        imp = rec(rows.get("implicit ALS (non-private, best of grid)"))
        ses = [(row.get(k) or row.get(str(k)))["standard_error"]["recall"] for row in rows.values()
               if row and "skipped" not in row and "standard_error" in (row.get(k) or row.get(str(k)))]
        sample = (f"; {r['users_drawn']:,} users drawn, standard errors <= {max(ses):.3f}"
                  if r.get("users_drawn") and ses else "")
        vals = [f"{r['store']} ({r['n_users']:,} x {r['n_items']:,}{sample})", cell(chart)]
        floor = []
        for lab in ials + tuned:
            v = rec(rows.get(lab))
            eps = lab.split("eps ")[-1]
            big = eps in ("10", "inf") or lab in tuned
            vals.append(cell(v, imp if big else chart, " implicit" if big else " chart"))
            rel = (rows.get(lab) or {}).get("released_chart")
            if v is not None and rel:
                floor.append(v / max(rec(rel), 1e-12))
        default = rows.get("ials eps 1") if r.get("implicit") else rows.get("default (als eps 1): list score")
        vals.append(cell(rec(default), chart, " chart") + (" (ials)" if r.get("implicit") and default else ""))
        setting = (rows.get("implicit ALS (non-private, best of grid)") or {}).get("setting")
        vals.append(cell(imp) + (" (" + ", ".join(f"{a} {b:g}" for a, b in setting.items()) + ")" if setting else ""))
        vals.append(cell(rec(rows.get("EASE (non-private, best lambda)"))))
        vals.append(f"{min(floor):.2f}x" if floor else "")
        out.append("| " + " | ".join(vals) + " |")
    return "\n".join(out)


def _floats(text):
    return [float(x) for x in text.split(",") if x]


def parse_grid(text):
    """``--implicit-grid``: ``issue42`` (:data:`ISSUE42_GRID`), ``default`` (:data:`IMPLICIT_GRID`) or
    ``factors=16,32;alpha=1,10;regularization=0.1`` (their product; a key left out keeps the default's first value).

    >>> len(parse_grid("factors=16,32;alpha=1,10,40"))
    6
    """
    if text in (None, "", "default"):
        return None
    if text == "issue42":
        return list(ISSUE42_GRID)
    import itertools

    axes = {"factors": [32], "regularization": [0.01], "alpha": [1.0]}
    for part in filter(None, text.split(";")):
        key, _, vals = part.partition("=")
        if key.strip() not in axes or not vals:
            raise SystemExit(f"--implicit-grid: {part!r} is not KEY=V1,V2 with KEY one of {', '.join(axes)}")
        axes[key.strip()] = [int(v) if key.strip() == "factors" else float(v) for v in vals.split(",") if v]
    return [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stores", default="ml-100k,filmtrust,gen-30k,gen-10k",
                    help="comma-separated: ml-100k, filmtrust, gen-30k, gen-10k, clustered-10k, regimes, and issue "
                    "42's shapes: " + ", ".join(SHAPES))
    ap.add_argument("--k", default="10,20", help="list lengths (comma-separated)")
    ap.add_argument("--epsilons", default=None, help="ials's epsilons, when ials is registered (default "
                    "0.5,1,2,5,10,inf); with --methods-table als's (default 0.5,1,2,10,inf)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ease-max-items", type=int, default=20_000)
    ap.add_argument("--ease-lambdas", default=",".join(f"{x:g}" for x in EASE_LAMBDAS))
    ap.add_argument("--tune-epsilons", default="10", help="epsilons of `tune --method ials` rows, when ials is "
                    "registered (comma-separated; empty: none)")
    ap.add_argument("--implicit-grid", default="default", help="implicit's ALS grid: default (factors 32,64 x reg "
                    "0.01,0.1 x alpha 1,10), issue42 (factors 16,32,64 x alpha 1,10,40 x reg 0.01,0.1,1) or "
                    "'factors=16,64;alpha=10;regularization=0.1'")
    ap.add_argument("--ranking-users", type=int, default=None, metavar="N", help="score every list on a seeded "
                    "sample of N users (`evaluate --ranking-users N`'s, the same for streamdp's models and the peers; "
                    "means with their standard errors); default: every user")
    ap.add_argument("--store-dir", default=None, metavar="DIR", help="keep issue 42's generated stores in DIR and "
                    "reuse them on the next run (default: a temporary directory, removed)")
    ap.add_argument("--quick", action="store_true", help="one implicit ALS setting (64 factors, 0.01, alpha 1)")
    ap.add_argument("--big", action="store_true", help="with --stores regimes: also the 200k-user regime")
    ap.add_argument("--json", default=None, metavar="FILE", help="also write the results as JSON")
    ap.add_argument("--methods-table", action="store_true", help="docs/methods.md's table instead: means, oja at "
                    "epsilon 1, als at each --epsilons (default there 0.5,1,2,10,inf) on the real stores")
    ap.add_argument("--seeds", type=int, default=2, help="with --methods-table: seeds per private cell")
    a = ap.parse_args(argv)
    if a.methods_table:
        from bench.als_privacy import REAL_STORES, real_store

        eps = _floats(a.epsilons or "0.5,1,2,10,inf")
        tmp = tempfile.mkdtemp(prefix="bench-ranking-")
        try:
            for name in REAL_STORES:
                st = real_store(tmp, name)
                if st is not None:
                    methods_table(st, name, a.seeds, eps)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return 0
    a.k = sorted({int(x) for x in a.k.split(",") if x})
    if not a.k or a.k[0] < 1:
        raise SystemExit("--k: positive integers, e.g. 10,20")
    a.epsilons = _floats(a.epsilons or "0.5,1,2,5,10,inf")
    a.ease_lambdas = _floats(a.ease_lambdas)
    a.tune_epsilons = _floats(a.tune_epsilons)
    a.grid = [dict(factors=64, regularization=0.01, alpha=1.0)] if a.quick else parse_grid(a.implicit_grid)
    tmp = tempfile.mkdtemp(prefix="bench-ranking-")
    results = []
    try:
        if a.ranking_users is not None and a.ranking_users < 1:
            raise SystemExit("--ranking-users: a positive integer")
        for name, st in open_stores([s for s in a.stores.split(",") if s], tmp, a.big, a.store_dir):
            res = run_store(name, st, tmp, a)
            results.append(res)
            print(format_table(res, a.k) + "\n", flush=True)
        if results:
            print(f"### Recall@{a.k[0]}, every store\n\n" + summary_table(results, a.k[0]) + "\n", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"k": a.k, "seed": a.seed, "results": [{**r, "rows": {lab: {str(k): v for k, v in row.items()}
                                                                             for lab, row in r["rows"].items()}}
                                                            for r in results]}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
