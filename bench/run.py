"""Every benchmark in one run: streamdp against the peers measured in the same run, as one markdown table.

    python -m bench [--ratings 20000000] [--rss-sizes 10M,50M,200M] [--memory-limit 512MB]
                    [--scale-sizes 2M] [--repeats 3] [--only real,kernels,memory,scale] [--out bench-report.md]

(``python bench/run.py`` is the same.) Four parts, the first three each a set of rows
``| what | streamdp | peer | ratio |``:

* **real**: ML-100K and FilmTrust from ``../shared/data`` (skipped, said, when
  absent), ingested with a 20% per-user test split. scikit-surprise's ``SVD`` (its
  defaults: 100 factors, 20 epochs) against non-private ``als`` and ``sgd`` and
  private ``als`` at epsilon 1 (their defaults) on the same split: test RMSE and the
  wall seconds of the fit (ours on one worker; the ratio is surprise's time / ours);
  and each model's Recall@10 / NDCG@10 (relevant: held-out rating in the top 20% of
  the range; candidates: unrated items) against the non-private most-popular list.
* **kernels**: a generated power-law store of ``--ratings`` training ratings (20k
  items, 50 per user) in a temporary directory. One streamed oja pass (k=16) against
  scipy.sparse ``A.T @ (A @ V)`` on the same matrix in memory (one thread); one
  streamed sgd epoch (one worker, steady state) against the plain in-memory
  single-thread Numba SGD kernel of ``bench/sgd.py`` at k=16 and k=64, and against
  scikit-surprise's per-epoch rate; sgld against sgd; one DP-ALS iteration against
  the oja pass; 2 workers against 1 for oja, als and sgd.
* **memory**: for each size in ``--rss-sizes``, a generated store of that many
  ratings, then ``streamdp train --method als --iters 1`` in a subprocess under
  ``--memory-limit``; its peak RSS (the child tree, polled by psutil). The curve
  must be flat: the last row is largest / smallest peak.
* **scale**: ``bench/scale.py`` at ``--scale-sizes`` (small by default; its own
  defaults are 20M and 100M, docs/scale.md): ``streamdp train``'s passes, fit,
  evaluation and peak RSS against the in-memory scipy pass, its tables printed after
  the others.

Timings are medians of ``--repeats`` round-robin repeats (paired with the peer in
each repeat, ratios are medians of per-repeat ratios): this machine is shared and
noisy. At the defaults it runs in about 10-15 minutes on 2 cores; the temporary
stores are removed at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as a file: make ``bench`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.als import passes  # noqa: E402
from bench.als_privacy import REAL_STORES, fit_timed, surprise_fit  # noqa: E402
from bench.ingest import run_measured  # noqa: E402
from bench import scale as scale_bench  # noqa: E402
from bench.sgd import _steady, epoch_rates, in_memory_matrix, peer_rate, surprise_rate  # noqa: E402


def _size(text: str) -> int:
    """``10M`` / ``2.5e6`` / ``200000`` -> an integer count."""
    t = text.strip().upper()
    mult = {"K": 1e3, "M": 1e6, "G": 1e9}.get(t[-1:], 1)
    return int(float(t[:-1] if t[-1:] in "KMG" else t) * mult)


class Report:
    """Rows of the markdown table, printed as they come (a long run shows progress)."""

    def __init__(self):
        self.rows: list[tuple[str, str, str, str]] = []

    def section(self, title: str) -> None:
        print(f"\n== {title}", flush=True)
        self.rows.append((f"**{title}**", "", "", ""))

    def add(self, what: str, ours: str, peer: str, ratio: float | str) -> None:
        r = ratio if isinstance(ratio, str) else f"{ratio:.2f}"
        print(f"  {what}: {ours} | {peer} | {r}", flush=True)
        self.rows.append((what, ours, peer, r))

    def markdown(self) -> str:
        lines = ["| what | streamdp | peer (same run) | ratio |", "|---|---|---|---|"]
        lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in self.rows]
        return "\n".join(lines)


def _rate(x: float) -> str:
    return f"{x / 1e6:.2f}M/s" if x >= 1e5 else f"{x / 1e3:.0f}k/s"


# ---------------------------------------------------------------- real data vs scikit-surprise


def _ours(store, method, epsilon, **opts):
    """Our model on the same split, one worker: ``(test RMSE, wall seconds of the fit, rank, ranking)``."""
    f, dt = fit_timed(store, method, epsilon, 0, workers=1, **opts)
    ev = fitted_evaluation(store, f, workers=1)
    return ev["rmse"], dt, f.model_info.get("rank", "?"), ev["ranking"]


def fitted_evaluation(store, fitted, workers=1) -> dict:
    """:func:`streamdp.evaluate.evaluate_model` of a fitted model (saved to a temporary directory): RMSE and the
    ranking metrics at k = 10 beside the most-popular lists."""
    from streamdp.evaluate import evaluate_model

    d = tempfile.mkdtemp(prefix="bench-model-")
    try:
        fitted.save(os.path.join(d, "m"))
        return evaluate_model(os.path.join(d, "m"), store, baselines=False, workers=workers)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def real(rep: Report, tmp: str) -> None:
    from streamdp.storage.ingest import ingest

    here = os.path.dirname(os.path.abspath(__file__))
    for name, (rel, rr) in REAL_STORES.items():
        path = os.path.join(here, "..", "..", "shared", "data", rel)
        rep.section(f"{name}, 20% split, vs scikit-surprise SVD (defaults, 100 factors, 20 epochs)")
        if not os.path.exists(path):
            rep.add(f"{name} absent ({os.path.normpath(path)})", "skipped", "", "")
            continue
        st = ingest([path], f"{tmp}/{name}.zarr", test_fraction=0.2, seed=0, rating_range=rr)
        _ours(st, "als", float("inf"), iters=1)  # compile outside the timings
        s_rmse, s_sec = surprise_fit(st)
        for label, method, eps, opts in (("als non-private", "als", float("inf"), {}),
                                         ("sgd non-private", "sgd", float("inf"), {}),
                                         ("als epsilon 1", "als", 1.0, {})):
            rmse, sec, k, rk = _ours(st, method, eps, **opts)
            rep.add(f"{name}: test RMSE, {label} (rank {k}) vs surprise SVD", f"{rmse:.4f}", f"{s_rmse:.4f}",
                    f"{rmse - s_rmse:+.4f}")
            rep.add(f"{name}: fit seconds, {label}, 1 worker vs surprise SVD (speed-up)", f"{sec:.2f}s",
                    f"{s_sec:.2f}s", s_sec / sec)
            pop = rk["baselines"]["popularity"]
            rep.add(f"{name}: Recall@10 / NDCG@10, {label} vs most popular (non-private)",
                    f"{rk['recall']:.4f} / {rk['ndcg']:.4f}", f"{pop['recall']:.4f} / {pop['ndcg']:.4f}",
                    rk["ndcg"] / pop["ndcg"] if pop["ndcg"] > 0 else "n/a")


# ---------------------------------------------------------------- kernels vs in-memory peers


def kernels(rep: Report, tmp: str, n_ratings: int, repeats: int) -> None:
    import numpy as np
    import scipy.sparse as sp
    from threadpoolctl import threadpool_limits

    from streamdp.storage.generate import generate_store

    t = time.perf_counter()
    st = generate_store(f"{tmp}/k.zarr", n_users=max(n_ratings // 50, 100), n_items=20_000, ratings_per_user=50,
                        rank=8, seed=0, show_progress=False)
    rep.section(f"generated store: {st.n_ratings:,} ratings, {st.n_users:,} users, {st.n_items:,} items "
                f"(written in {time.perf_counter() - t:.0f}s)")
    nnz = st.n_ratings
    mat = in_memory_matrix(st)
    A = sp.csr_matrix((mat[2].astype(np.float64), mat[1], mat[0]), shape=(st.n_users, st.n_items))

    # oja pass vs scipy; als iteration vs oja pass; 1 vs 2 workers
    k = 16
    V = np.linalg.qr(np.random.default_rng(0).normal(size=(st.n_items, k)))[0]
    als_pass, oja_pass = passes(st, 8, "2GB")
    _, oja16 = passes(st, k, "2GB")
    for fn in (als_pass, oja16):
        fn(1)  # compile, page cache
    tm: dict = {}
    for _ in range(repeats):
        for name, fn in (("scipy", lambda: A.T @ (A @ V)), ("oja1", lambda: oja16(1)), ("oja2", lambda: oja16(2)),
                         ("als1", lambda: als_pass(1)), ("als2", lambda: als_pass(2)),
                         ("oja8_1", lambda: oja_pass(1))):
            with threadpool_limits(1):
                t = time.perf_counter()
                fn()
                tm.setdefault(name, []).append(time.perf_counter() - t)

    def ratio(a, b):  # speed of a over speed of b, median of per-repeat ratios
        return statistics.median(tb / ta for ta, tb in zip(tm[a], tm[b]))

    med = {n: nnz / statistics.median(v) for n, v in tm.items()}
    rep.add("oja pass k=16, 1 worker vs scipy.sparse A.T(AV) in memory, 1 thread", _rate(med["oja1"]),
            _rate(med["scipy"]), ratio("oja1", "scipy"))
    rep.add("oja pass k=16, 2 workers vs scipy in memory, 1 thread", _rate(med["oja2"]), _rate(med["scipy"]),
            ratio("oja2", "scipy"))
    rep.add("oja pass k=16, 2 workers vs 1 worker", _rate(med["oja2"]), _rate(med["oja1"]), ratio("oja2", "oja1"))
    rep.add("als iteration k=8 vs oja pass k=8, 1 worker", _rate(med["als1"]), _rate(med["oja8_1"]),
            ratio("als1", "oja8_1"))
    rep.add("als iteration k=8, 2 workers vs 1 worker", _rate(med["als2"]), _rate(med["als1"]), ratio("als2", "als1"))

    # sgd epochs vs the in-memory Numba kernel, sgld vs sgd, 2 vs 1 workers, surprise per epoch
    for k in (16, 64):
        peer_rate(mat, st.n_items, k, 0)  # compile
        epoch_rates(st, "sgd", k, False, 1, 0)
        r: dict = {}
        for i in range(repeats):
            r.setdefault("peer", []).append(peer_rate(mat, st.n_items, k, i)[0])
            for name, method, w in (("sgd1", "sgd", 1), ("sgd2", "sgd", 2), ("sgld1", "sgld", 1)):
                r.setdefault(name, []).append(_steady(epoch_rates(st, method, k, False, w, i)[0]))
        m = {n: statistics.median(v) for n, v in r.items()}

        def rr(a, b):
            return statistics.median(x / y for x, y in zip(r[a], r[b]))

        rep.add(f"sgd epoch k={k}, streamed, 1 worker vs in-memory Numba SGD, 1 thread (target >= 0.8)",
                _rate(m["sgd1"]), _rate(m["peer"]), rr("sgd1", "peer"))
        rep.add(f"sgd epoch k={k}, 2 workers vs 1 worker", _rate(m["sgd2"]), _rate(m["sgd1"]), rr("sgd2", "sgd1"))
        rep.add(f"sgld epoch k={k} vs sgd epoch, 1 worker", _rate(m["sgld1"]), _rate(m["sgd1"]), rr("sgld1", "sgd1"))
        s_rate = surprise_rate(st, 300_000, k, 1)
        rep.add(f"sgd epoch k={k}, 1 worker vs scikit-surprise SVD epoch (300k-rating subset)", _rate(m["sgd1"]),
                _rate(s_rate), m["sgd1"] / s_rate)
    shutil.rmtree(f"{tmp}/k.zarr", ignore_errors=True)


# ---------------------------------------------------------------- peak RSS vs store size


def memory(rep: Report, tmp: str, sizes: list[int], limit: str) -> None:
    exe = [sys.executable, "-m", "streamdp"]
    rep.section(f"peak RSS of `streamdp train --method als --iters 1 --epsilon 1 --memory-limit {limit}` "
                "(child tree, psutil) by store size")
    # compile the kernels into their cache first, so no row pays for it
    subprocess.run(exe + ["generate", "--out", f"{tmp}/tiny.zarr", "--users", "2000", "--items", "500"],
                   check=True, capture_output=True)
    subprocess.run(exe + ["train", f"{tmp}/tiny.zarr", "--epsilon", "1", "--iters", "1", "--out", f"{tmp}/m0",
                          "--memory-limit", limit], check=True, capture_output=True)
    peaks = []
    for n in sizes:
        store = f"{tmp}/rss.zarr"
        t = time.perf_counter()
        subprocess.run(exe + ["generate", "--out", store, "--users", str(max(n // 50, 100)), "--items", "20000",
                              "--ratings-per-user", "50", "--force"],
                       check=True, capture_output=True)
        gen = time.perf_counter() - t
        dt, peak, _ = run_measured(exe + ["train", store, "--epsilon", "1", "--iters", "1", "--out", f"{tmp}/m",
                                          "--memory-limit", limit, "--force", "--over-budget"])
        peaks.append(peak)
        rep.add(f"{n / 1e6:.0f}M ratings: peak RSS (train {dt:.0f}s, generate {gen:.0f}s)", f"{peak / 1e6:.0f} MB",
                f"limit {limit}", f"{peak / _size(limit.replace('B', '')):.2f} of the limit")
        shutil.rmtree(store, ignore_errors=True)
        shutil.rmtree(f"{tmp}/m", ignore_errors=True)
    if len(peaks) > 1:
        rep.add(f"flatness: largest / smallest peak ({sizes[-1] / sizes[0]:.0f}x the ratings)",
                f"{max(peaks) / 1e6:.0f} MB", f"{min(peaks) / 1e6:.0f} MB", max(peaks) / min(peaks))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    ap.add_argument("--ratings", default="20M", help="training ratings of the kernels' generated store")
    ap.add_argument("--rss-sizes", default="10M,50M,200M", help="store sizes of the peak-RSS curve")
    ap.add_argument("--memory-limit", default="512MB", help="--memory-limit of the peak-RSS runs")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--scale-sizes", default="2M", help="store sizes of the scale part (bench/scale.py)")
    ap.add_argument("--only", default="real,kernels,memory,scale", help="comma-separated parts to run")
    ap.add_argument("--out", default=None, help="also write the markdown table to this file")
    a = ap.parse_args(argv)
    parts = {p.strip() for p in a.only.split(",")}
    unknown = parts - {"real", "kernels", "memory", "scale"}
    if unknown:
        ap.error(f"--only: unknown part(s) {', '.join(sorted(unknown))} (choose from real, kernels, memory, scale)")
    t0 = time.perf_counter()
    rep = Report()
    tmp = tempfile.mkdtemp(prefix="bench-run-")
    try:
        if "real" in parts:
            real(rep, tmp)
        if "kernels" in parts:
            kernels(rep, tmp, _size(a.ratings), a.repeats)
        if "memory" in parts:
            memory(rep, tmp, [_size(s) for s in a.rss_sizes.split(",")], a.memory_limit)
        scaled = ""
        if "scale" in parts:
            sa = scale_bench.parser().parse_args(["--sizes", a.scale_sizes, "--repeats", str(a.repeats), "--dir", tmp,
                                                  "--memory-limit", "1GB"])
            scaled = "\n" + scale_bench.run([scale_bench._size(x) for x in a.scale_sizes.split(",")], sa) + "\n"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    text = (f"streamdp bench ({time.perf_counter() - t0:.0f}s, {os.cpu_count()} cores; medians of {a.repeats} "
            f"repeats, ratios are streamdp / peer, higher is better except peak RSS)\n\n{rep.markdown()}\n{scaled}")
    print("\n" + text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
