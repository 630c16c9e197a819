"""Every benchmark in one run: streamdp against the peers measured in the same run, as one markdown page.

    python -m bench [--ratings 5M] [--rss-sizes 5M,50M] [--memory-limit 512MB] [--scale-sizes 2M]
                    [--repeats 2] [--lists-stores ml-100k,filmtrust,clustered-10k] [--ials-ratings 2M]
                    [--ials-repeats 3] [--ials-iters 3] [--only real,lists,ials,kernels,memory,scale]
                    [--write docs/benchmarks.md]

(``python bench/run.py`` is the same.) Six parts, the first five each a set of rows
``| what | streamdp | peer | ratio |``:

* **real**: ML-100K and FilmTrust from ``../shared/data`` (skipped, said, when
  absent), ingested with a 20% per-user test split. scikit-surprise's ``SVD`` (its
  defaults: 100 factors, 20 epochs) against non-private ``als`` and ``sgd`` and
  private ``als`` at epsilon 1 (their defaults) on the same split: test RMSE and the
  wall seconds of the fit (ours on one worker; the ratio is surprise's time / ours);
  and each model's Recall@10 / NDCG@10 (relevant: held-out rating in the top 20% of
  the range; candidates: unrated items) against the non-private most-popular list.
* **lists**: the list-quality rows issue 29 holds streamdp to, per store of
  ``--lists-stores`` (``bench/ranking.py``'s: ML-100K and FilmTrust with its split,
  ``--test-fraction 0.2 --seed 1``, skipped and said when absent; ``clustered-10k``,
  10,000 users in 20 taste groups x 1,000 items written by ``bench/ials.py``'s
  ``clustered_csv``), all on one split in this run, every user measured with
  ``evaluate``'s protocol (:func:`bench.ranking.run_store`): Recall@10 / NDCG@10 of
  ``ials`` at epsilon 1 and non-private, the default (``streamdp train STORE --epsilon
  1``), the most-popular chart by the default's released counts and by the exact
  counts, ``implicit``'s ALS (bench-only peer, best of its grid; skipped and said when
  not installed) and EASE (best lambda), both non-private and tuned on the test split.
* **ials**: one ``ials`` iteration (64 factors, streamed from disk on 2 workers;
  non-private and epsilon 1) against one ``implicit`` ALS iteration (in memory, 2
  threads) on a generated store of ``--ials-ratings`` ratings (20 per user; 2,000
  items, 5,000 from 10M ratings: ``--ials-ratings 20M`` is issue 29's store), wall and
  CPU time (:func:`bench.ials.speed`: ``--ials-iters`` iterations per fit, the first
  not counted, the fits interleaved over ``--ials-repeats`` repeats).
* **kernels**: a generated power-law store of ``--ratings`` training ratings (20k
  items, 50 per user) in a temporary directory. One streamed oja pass (k=16) against
  scipy.sparse ``A.T @ (A @ V)`` on the same matrix in memory (one thread); one
  streamed sgd epoch (one worker, steady state) against the plain in-memory
  single-thread Numba SGD kernel of ``bench/sgd.py`` at k=16 and k=64, and against
  scikit-surprise's per-epoch rate; sgld against sgd; one DP-ALS iteration against
  the oja pass; 2 workers against 1 for oja, als and sgd.
* **memory**: for each size in ``--rss-sizes``, a generated store of that many
  ratings, then ``streamdp train --method als --iters 1`` in a subprocess under
  ``--memory-limit``; its peak RSS (the child tree: its own high-water mark, its descendants polled). The curve
  must be flat: the last row is largest / smallest peak.
* **scale**: ``bench/scale.py`` at ``--scale-sizes`` (small by default; its own
  defaults are 20M and 100M, docs/scale.md): ``streamdp train``'s passes, fit,
  evaluation and peak RSS against the in-memory scipy pass, its tables printed after
  the others.

Timings are medians of ``--repeats`` round-robin repeats (paired with the peer in
each repeat, ratios are medians of per-repeat ratios): this machine is shared and
noisy (``--repeats`` 2 by default, to keep the whole run near 12 minutes on a busy
2-core machine: at load average 15, about 11 minutes for 4 minutes of CPU). ``--write PATH`` writes the whole page (a header with the date, the commit,
the machine's CPUs, its load average at the start and the end and the run's time,
then the tables) to ``PATH`` through a temporary file renamed over it:
``python -m bench --write docs/benchmarks.md`` is how that page is made (the sections other
scripts write there, ``bench/roofline.py``'s, ``bench/ranking.py``'s on issue 42's shapes,
``bench/refresh.py``'s and ``bench/append.py``'s, are kept: :data:`KEPT_HEADINGS`). A part that
fails is a row saying so; the page then goes to ``PATH.failed`` instead, the exit
status is 1. The temporary stores are removed at the end.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

if __package__ in (None, ""):  # run as a file: make ``bench`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import shared_data  # noqa: E402
from bench.als import passes  # noqa: E402
from bench.als_privacy import REAL_STORES, fit_timed, fitted_evaluation, surprise_fit  # noqa: E402
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
        lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in self.rows]
        return "\n".join(lines)


def _rate(x: float) -> str:
    return f"{x / 1e6:.2f}M/s" if x >= 1e5 else f"{x / 1e3:.0f}k/s"


# ---------------------------------------------------------------- real data vs scikit-surprise


def _ours(store, method, epsilon, **opts):
    """Our model on the same split, one worker: ``(test RMSE, wall seconds of the fit, rank, ranking)``."""
    f, dt = fit_timed(store, method, epsilon, 0, workers=1, **opts)
    ev = fitted_evaluation(store, f, workers=1)
    return ev["rmse"], dt, f.model_info.get("rank", "?"), ev["ranking"]


def real(rep: Report, tmp: str) -> None:
    from streamdp.storage.ingest import ingest

    for name, (rel, rr) in REAL_STORES.items():
        path = shared_data(rel)
        rep.section(f"{name}, 20% split, vs scikit-surprise SVD (defaults, 100 factors, 20 epochs)")
        if not os.path.exists(path):
            rep.add(f"{name} absent ({path})", "skipped", "", "")
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


# ---------------------------------------------------------------- lists: issue 29's rows, one split per store


def _rk(r: dict) -> str:
    return f"{r['recall']:.4f} / {r['ndcg']:.4f}"


def _over(a: dict, b: dict) -> float | str:
    """Recall ratio ``a / b`` (``n/a`` when ``b``'s is 0)."""
    return a["recall"] / b["recall"] if b["recall"] > 0 else "n/a"


def lists(rep: Report, tmp: str, stores: list[str], workers: int = 2, k: int = 10) -> None:
    """Issue 29's list rows on each store of ``stores`` (names of :func:`bench.ranking.open_stores`), every row of
    a store from one :func:`bench.ranking.run_store` on one split."""
    from bench import ranking

    a = argparse.Namespace(k=[k], epsilons=[1.0, math.inf], seed=1, workers=workers, ease_max_items=20_000,
                           grid=None, ease_lambdas=list(ranking.EASE_LAMBDAS))
    for name in stores:
        if name in ranking.REAL and not os.path.exists(shared_data(ranking.REAL[name][0])):
            rep.section(f"lists on {name}")
            rep.add(f"{name} absent ({shared_data(ranking.REAL[name][0])})", "skipped", "", "")
            continue
        for label, st in ranking.open_stores([name], tmp, big=False):
            list_rows(rep, ranking.run_store(label, st, tmp, a, old_lists=False), k)


def list_rows(rep: Report, res: dict, k: int) -> None:
    """The rows of one store's :func:`bench.ranking.run_store` result, each beside the bar issue 29 sets it."""
    rows = res["rows"]
    chart = rows["most popular (exact counts, non-private)"][k]
    rep.section(f"lists on {res['store']}: {res['n_users']:,} users x {res['n_items']:,} items, "
                f"{res['n_ratings']:,} training ratings; Recall@{k} / NDCG@{k} of all {res['evaluated_users']:,} "
                f"users with a held-out rating >= {res['relevant_threshold']:g} (`evaluate`'s protocol, one split); "
                f"ratio: Recall@{k}, streamdp / peer")
    rep.add("most popular by the exact training counts (non-private reference)", "", _rk(chart), "")
    d = rows["default (als eps 1): list score"]
    note = f"test RMSE {d['rmse']:.4f}" + ("; biases only: one list for all" if d.get("personalised") is False else "")
    rep.add(f"default (`train --epsilon 1`, {note}) vs the exact chart (issue 29: >= 1)", _rk(d[k]), _rk(chart),
            _over(d[k], chart))
    released = rows.get("most popular (default model's released counts)")
    if released:
        rep.add("most popular by the default's released counts vs the exact chart", _rk(released[k]), _rk(chart),
                _over(released[k], chart))
    imp = rows["implicit ALS (non-private, best of grid)"]
    if "ials eps 1" not in rows:
        rep.add("ials: no method of that name in this checkout", "skipped", "", "")
    else:
        e1, inf = rows["ials eps 1"], rows["ials eps inf"]
        rep.add("ials epsilon 1 vs the exact chart (issue 29: >= 1.25 where non-private lists beat it by 1.5x)",
                _rk(e1[k]), _rk(chart), _over(e1[k], chart))
        if "released_chart" in e1:
            rep.add("ials epsilon 1 vs the chart by its own released counts (issue 29: never below)", _rk(e1[k]),
                    _rk(e1["released_chart"][k]), _over(e1[k], e1["released_chart"][k]))
        rep.add("ials non-private vs implicit's ALS (issue 29: >= 0.95)", _rk(inf[k]),
                f"skipped: {imp['skipped']}" if "skipped" in imp else _rk(imp[k]),
                "" if "skipped" in imp else _over(inf[k], imp[k]))
    for key, what in (("implicit ALS (non-private, best of grid)", "implicit's ALS"),
                      ("EASE (non-private, best lambda)", "EASE")):
        r = rows[key]
        if "skipped" in r:
            rep.add(f"{what} (non-private peer)", "", f"skipped: {r['skipped']}", "")
            continue
        setting = ", ".join(f"{n} {v:g}" for n, v in r["setting"].items())
        ratio = _over(r[k], chart)
        rep.add(f"{what} (non-private peer, the best of its grid on the test split: {setting}) vs the exact chart",
                "", _rk(r[k]), ratio if isinstance(ratio, str) else f"{ratio:.2f} (peer / chart)")


# ---------------------------------------------------------------- one ials iteration vs one implicit iteration


def ials_speed(rep: Report, tmp: str, n_ratings: int, repeats: int, iters: int, workers: int = 2) -> None:
    """:func:`bench.ials.speed` on a generated store of ``n_ratings`` ratings (20 per user; 2,000 items, 5,000
    from 10M ratings: issue 29's 20M-rating store is ``streamdp generate --users 1000000 --items 5000
    --ratings-per-user 20 --seed 1``)."""
    import streamdp
    from bench import ials as ials_bench
    from streamdp.methods import load_builtin

    users, items = max(n_ratings // 20, 100), 5_000 if n_ratings >= 10_000_000 else 2_000
    what = (f"one `ials` iteration (64 factors, streamed from disk on {workers} workers) vs one `implicit` ALS "
            f"iteration (in memory, {workers} threads, BLAS on 1)")
    try:
        import implicit
    except ImportError as exc:
        rep.section(what)
        rep.add(f"implicit not importable ({exc})", "skipped", "", "")
        return
    if "ials" not in load_builtin():
        rep.section(what)
        rep.add("ials: no method of that name in this checkout", "skipped", "", "")
        return
    t = time.perf_counter()
    path = os.path.join(tmp, "ials.zarr")
    st = streamdp.generate(path, users=users, items=items, ratings_per_user=20, seed=1)
    rep.section(f"{what}, implicit {implicit.__version__}: generated store of {st.n_ratings:,} ratings, {users:,} "
                f"users x {items:,} items (written in {time.perf_counter() - t:.0f}s); medians of {repeats} "
                f"interleaved repeats of {iters} iterations per fit, the first not counted (nor a private fit's "
                "last, which also runs its choice between factors and chart); ratio: implicit's seconds / ials's "
                "(speed)")
    res = ials_bench.speed(st, ials_bench.matrices(st, test=False)[0], workers, {}, repeats=repeats, iters=iters)
    for eps, label in (("inf", "non-private"), ("1", "epsilon 1")):
        for kind, name in (("wall", "wall"), ("cpu", "CPU time, all threads")):
            target = "issue 44: >= 1.3 in CPU time at 20M ratings" if kind == "cpu" else "issue 29: >= 0.8 at 20M"
            rep.add(f"ials {label}, one iteration, {name}, vs implicit's ({target})",
                    f"{res[eps][kind]:.3f} s", f"{res['implicit'][kind]:.3f} s", res["speed"][kind, eps])
    shutil.rmtree(path, ignore_errors=True)


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


#: The parts, in the order they run.
PARTS = ("real", "lists", "ials", "kernels", "memory", "scale")


def _git(*args: str) -> str:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        return subprocess.run(["git", "-C", here, *args], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return ""


def commit(exclude: str | None = None) -> str:
    """The checkout's commit, ``+ uncommitted changes`` when tracked files differ from it (``exclude``, the page
    being written, aside)."""
    head = _git("rev-parse", "--short", "HEAD").strip() or "unknown (not a git checkout)"
    top = _git("rev-parse", "--show-toplevel").strip()
    changed = [ln[3:] for ln in _git("status", "--porcelain", "--untracked-files=no").splitlines() if ln.strip()]
    if exclude and top:
        changed = [c for c in changed if os.path.abspath(os.path.join(top, c)) != os.path.abspath(exclude)]
    return head + (f" + uncommitted changes ({', '.join(changed)})" if changed else "")


def machine() -> str:
    """CPUs (model), memory."""
    import psutil

    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cpus = f"{os.cpu_count()} CPUs" + (f" ({usable} usable)" if usable != os.cpu_count() else "")
    return f"{cpus}{f' ({model})' if model else ''}, {psutil.virtual_memory().total / 2 ** 30:.0f} GiB"


def _load() -> str:
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


def _duration(sec: float) -> str:
    return f"{int(sec // 60)} min {sec % 60:02.0f} s" if sec >= 60 else f"{sec:.0f} s"


def page(rep: Report, scaled: str, *, argv: list[str], started: float, load_start: str, load_end: str,
         seconds: dict, repeats: int, ials_repeats: int, exclude: str | None = None) -> str:
    """The whole markdown page of one run: a header (when, which commit, which machine, how loaded, how long),
    the table, then the scale part's tables. ``seconds``: ``{part: (wall, CPU)}``; ``started``: the run's
    ``time.time()``; ``exclude``: the page's own path (its being rewritten is no uncommitted change)."""
    total, cpu = time.time() - started, sum(c for _, c in seconds.values())
    parts = ", ".join(f"{p} {_duration(t)}" for p, (t, _) in seconds.items())
    head = f"""# Benchmarks

Every benchmark of `python -m bench` against the peers it measures in the same run, in one
table, written by that one run (`python -m bench --write docs/benchmarks.md` from the repository's
root; `bench/run.py`, whose `--help` lists the parts and their sizes): run it again rather than
edit this page.
The `bench/*.py` scripts go further on one subject each ([development.md](development.md)).

- **Run**: {time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started))}, commit {commit(exclude)},
  `python -m bench{"".join(" " + a for a in argv)}`
- **Machine**: {machine()}; load average (1, 5, 15 min) {load_start} at the start, {load_end} at the end
  (above the number of CPUs: other jobs shared the cores, and only the ratios within this run mean much).
- **Run time**: {_duration(total)} ({parts}); CPU time {_duration(cpu)} (all threads and child processes).
- **Reading it**: the kernels' rates and the scipy pass are medians of {repeats} round-robin repeats,
  each paired with its peer, their ratios medians of the per-repeat ratios; `ials` iterations are
  medians of {ials_repeats} interleaved repeats; the real sets' fit seconds and the peak RSS rows are one
  run each. Ratios are streamdp / peer (for times: the peer's seconds / streamdp's, a speed-up),
  higher is better except peak RSS. List rows: Recall@10 / NDCG@10, the ratio of Recall@10.
"""
    body = rep.markdown() + "\n"
    if scaled:
        body += "\n## Training at scale (`bench/scale.py`)\n\n" + scaled.strip() + "\n"
    return head + "\n" + body


#: Sections of the page written by other scripts (``bench/roofline.py``; ``bench/ranking.py`` on issue 42's shapes,
#: tens of minutes, too long for this run; ``bench/refresh.py``'s weekly replay; ``bench/append.py``'s appends to a
#: 100M-rating store), kept when ``--write`` rewrites it.
KEPT_HEADINGS = ("## ALS-family kernels against the machine", "## Lists on issue 42's shapes",
                 "## A store that grows week by week", "## Appending to a big store")


def kept_sections(path: str) -> str:
    """The sections of the page at ``path`` under :data:`KEPT_HEADINGS` (each up to the next ``## ``), or ``""``."""
    try:
        with open(path) as f:
            old = f.read()
    except OSError:
        return ""
    out = []
    for head in KEPT_HEADINGS:
        i = old.find("\n" + head)
        if i >= 0:
            j = old.find("\n## ", i + 1)
            out.append(old[i:j if j >= 0 else len(old)].rstrip("\n") + "\n")
    return "".join(out)


def _cpu() -> float:
    """CPU seconds of this process and its finished children (every thread)."""
    import resource

    return sum(resource.getrusage(w).ru_utime + resource.getrusage(w).ru_stime
               for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


def _run_part(rep: Report, name: str, fn, failed: list) -> tuple[float, float]:
    """Run one part: ``(wall, CPU)`` seconds. A failure is a row of the table (its traceback on stderr), not the
    end of the run."""
    t, c = time.perf_counter(), _cpu()
    try:
        fn()
    except (Exception, SystemExit) as exc:  # noqa: BLE001 -- any failure of a part is reported, the others run
        traceback.print_exc()
        msg = (str(exc).strip().splitlines() or [""])[0]
        msg = msg if len(msg) <= 240 else msg[:240] + "..."
        rep.add(f"part `{name}` failed: {type(exc).__name__}: {msg}", "failed", "", "")
        failed.append(name)
    return time.perf_counter() - t, _cpu() - c


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--ratings", default="5M", help="training ratings of the kernels' generated store")
    ap.add_argument("--rss-sizes", default="5M,50M", help="store sizes of the peak-RSS curve (measured: 289 MB "
                    "at 1M, 362-376 MB from 5M to 100M; the curve is flat from 5M)")
    ap.add_argument("--memory-limit", default="512MB", help="--memory-limit of the peak-RSS runs")
    ap.add_argument("--repeats", type=int, default=2, help="round-robin repeats of the kernels and the scipy pass")
    ap.add_argument("--scale-sizes", default="2M", help="store sizes of the scale part (bench/scale.py)")
    ap.add_argument("--lists-stores", default="ml-100k,filmtrust,clustered-10k",
                    help="stores of the lists part (bench/ranking.py's names)")
    ap.add_argument("--ials-ratings", default="2M", help="ratings of the ials part's generated store (20M: issue "
                    "29's)")
    ap.add_argument("--ials-repeats", type=int, default=3, help="interleaved repeats of the ials part's three fits")
    ap.add_argument("--ials-iters", type=int, default=3, help="iterations per fit of the ials part (the first is "
                    "not counted)")
    ap.add_argument("--only", default=",".join(PARTS), help="comma-separated parts to run")
    ap.add_argument("--write", "--out", dest="write", default=None, metavar="PATH",
                    help="write the whole page (header and tables) to PATH, e.g. docs/benchmarks.md")
    a = ap.parse_args(argv)
    parts = [p.strip() for p in a.only.split(",") if p.strip()]
    unknown = set(parts) - set(PARTS)
    if unknown:
        ap.error(f"--only: unknown part(s) {', '.join(sorted(unknown))} (choose from {', '.join(PARTS)})")
    from bench import ranking
    from streamdp.jsonio import atomic_write_json

    stores = [x.strip() for x in a.lists_stores.split(",") if x.strip()]
    known = [*ranking.REAL, *ranking.GENERATED, *ranking.CLUSTERED, "regimes"]
    if set(stores) - set(known):
        ap.error(f"--lists-stores: unknown store(s) {', '.join(sorted(set(stores) - set(known)))} "
                 f"(choose from {', '.join(known)})")
    try:
        sizes = {n: [_size(x) for x in getattr(a, n).split(",")] for n in ("ratings", "rss_sizes", "scale_sizes",
                                                                             "ials_ratings")}
    except ValueError as exc:
        ap.error(f"a size is not a number: {exc}")
    if min(a.repeats, a.ials_repeats) < 1 or a.ials_iters < 2:
        ap.error("--repeats and --ials-repeats must be >= 1, --ials-iters >= 2")
    if a.write and not os.path.isdir(os.path.dirname(os.path.abspath(a.write))):
        ap.error(f"--write: no directory {os.path.dirname(os.path.abspath(a.write))}")

    started, load_start = time.time(), _load()
    rep, failed, seconds, scaled = Report(), [], {}, []
    tmp = tempfile.mkdtemp(prefix="bench-run-")
    jobs = {
        "real": lambda: real(rep, tmp),
        "lists": lambda: lists(rep, tmp, stores),
        "ials": lambda: ials_speed(rep, tmp, sizes["ials_ratings"][0], a.ials_repeats, a.ials_iters),
        "kernels": lambda: kernels(rep, tmp, sizes["ratings"][0], a.repeats),
        "memory": lambda: memory(rep, tmp, sizes["rss_sizes"], a.memory_limit),
        "scale": lambda: scaled.append(scale_bench.run(sizes["scale_sizes"], scale_bench.parser().parse_args(
            ["--sizes", a.scale_sizes, "--repeats", str(a.repeats), "--dir", tmp, "--memory-limit", "1GB"]))),
    }
    try:
        for p in PARTS:
            if p in parts:
                seconds[p] = _run_part(rep, p, jobs[p], failed)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    text = page(rep, "".join(scaled), argv=argv, started=started, load_start=load_start, load_end=_load(),
                seconds=seconds, repeats=a.repeats, ials_repeats=a.ials_repeats, exclude=a.write)
    if a.write:
        text = text.rstrip("\n") + "\n" + kept_sections(a.write)
    print("\n" + text)
    if a.write:
        dest = a.write + ".failed" if failed else a.write
        # through a temporary file beside it, renamed over it: never half a page (streamdp's own atomic writer)
        atomic_write_json(dest, text.rstrip("\n"), dumps=str)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(dest, 0o666 & ~umask)  # a page, readable as any file written by the user (mkstemp's is 0600)
        print(f"written to {dest}" + (f" (not to {a.write}: part(s) {', '.join(failed)} failed)" if failed else ""),
              file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
