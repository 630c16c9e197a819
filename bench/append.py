"""Issue 43's at-scale targets for a growing store: append 1% to a big store, compact it, train both.

Usage::

    python bench/append.py --quick                         # a tiny store, in process (the smoke test's run)
    python bench/append.py --size 100M --dir /tmp/a43      # issue 43's store: 2M users x 20k items
    python bench/append.py --size 20M --appends 1          # one append of the whole 1%
    python bench/append.py --size 100M --write docs/benchmarks.md   # also keep the table in that page

Rating files (Parquet, ``userId,movieId,rating``; power-law items, 50 ratings per user on average) are written
out of core, a row group at a time: the base (``1 - --append-fraction`` of ``--size``) and ``--appends`` files
that together hold the rest (new ratings of the base's users, a few new users, some pairs rated again). A tiny
store is ingested, trained, appended to, trained again and compacted first, so that no timed step compiles a
kernel; the disk is synced before each step, so that none pays for the one before's writeback, and the files a
step reads are read through once before it (:func:`_cached`), so that each finds them in the page cache. Then,
each in a child process (``python -m streamdp ...``) with its wall and CPU seconds and the peak RSS of its process
tree (its own high-water mark, and its descendants' polled; :func:`bench.ingest.run_measured`):

* ``ingest BASE --out STORE --rating-range 0.5,5 --items items.txt --memory-limit M`` (the base, timed; run again
  into a scratch store between the one append's runs below, ``--repeats`` runs in all);
* ``ingest FILE --append STORE --memory-limit M``, one per append file;
* ``train STORE --method als --epsilon 1 --seed 1 --memory-limit M`` on the segmented store;
* ``compact STORE`` (it has no ``--memory-limit``: its peak RSS is what it takes);
* the same ``train`` on the compacted store; the two models' item factors compared; then ``--fit-repeats - 1``
  more trains of each, alternated (the segmented store kept as a copy made before the compaction), every store read
  through first: the target reads the two medians;
* the whole share again as one append (fresh ratings) onto the compacted store, ``--repeats`` times (default 5),
  each onto a fresh copy of it, alternated with the base's ingest again: the target reads the two medians
  (``--onto STORE``: the appends alone, onto copies of STORE).

Targets (issue 43): all the appends together cost at most 0.1x ingesting the whole store (the base's ingest
scaled to the whole store's ratings); the segmented store trains within 1.2x its compacted twin's fit seconds
(``train_seconds``, the engine's own measure) and gives the same model. ``--quick`` runs everything in this
process (no child, no peak RSS): seconds, for the smoke test. ``--write PATH`` puts the table into PATH under
:data:`HEADING` (a section ``python -m bench --write`` keeps).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

if __package__ in (None, ""):  # run as a file: make ``bench`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.ingest import compiled_between, kernel_cache_state, run_measured, warm_shape  # noqa: E402

#: The section of docs/benchmarks.md this script writes (kept by ``python -m bench --write``).
HEADING = "## Appending to a big store, compacting, training both (`bench/append.py`)"
COLUMNS = ("step", "ratings", "wall s", "CPU s", "peak RSS", "note")
RATING_RANGE = "0.5,5"


def _size(text: str) -> int:
    t = text.strip().upper()
    mult = {"K": 1e3, "M": 1e6, "G": 1e9}.get(t[-1:], 1)
    return int(float(t[:-1] if t[-1:] in "KMG" else t) * mult)


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a tiny store (default 20k ratings), all in this process")
    p.add_argument("--size", default=None, help="ratings in the whole store (default 100M; quick 20k)")
    p.add_argument("--items", type=int, default=None, help="items (default 20000; quick 300)")
    p.add_argument("--per-user", type=int, default=50, help="ratings per user on average (default 50)")
    p.add_argument("--append-fraction", type=float, default=0.01, help="share of the store appended (0.01)")
    p.add_argument("--appends", type=int, default=10, help="appends sharing that share (default 10)")
    p.add_argument("--memory-limit", default="512MB")
    p.add_argument("--dir", default=None, help="work directory (default: a temporary one, removed)")
    p.add_argument("--keep", action="store_true", help="keep the files and stores in --dir")
    p.add_argument("--write", default=None, metavar="PATH", help="put the table into PATH (docs/benchmarks.md)")
    p.add_argument("--repeats", type=int, default=5, help="runs of the base's ingest and of the one append of the "
                   "whole share (onto fresh copies of the compacted store), whose medians the targets read (default 5: "
                   "on a shared host one run moves by 10-20%%; quick 1)")
    p.add_argument("--fit-repeats", type=int, default=3, help="trains of the segmented store and of its compacted "
                   "twin, alternated, whose median fit seconds the target reads (default 3; quick 1)")
    p.add_argument("--onto", default=None, metavar="STORE", help="only the one append of the whole share, onto STORE "
                   "(a store an earlier run kept with --keep; each run onto a copy of it), in child processes")
    a = p.parse_args(argv)
    a.size = _size(a.size or ("20k" if a.quick else "100M"))
    a.items = a.items or (300 if a.quick else 20_000)
    if not 0 < a.append_fraction < 1 or a.appends < 1 or a.size < 1000 or a.repeats < 1 or a.fit_repeats < 1:
        p.error("--append-fraction in (0, 1), --appends >= 1, --size >= 1000, --repeats >= 1, --fit-repeats >= 1")
    given = argv if argv is not None else sys.argv[1:]
    if a.quick and "--repeats" not in given:
        a.repeats = 1
    if a.quick and "--fit-repeats" not in given:
        a.fit_repeats = 1
    return a


# ---------------------------------------------------------------- the rating files, out of core


class Ratings:
    """Power-law items over fixed ids, users ``u * 3 + 11`` (non-contiguous ids), ratings 0.5..5 by halves."""

    def __init__(self, n_users: int, n_items: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        w = np.arange(1, n_items + 1, dtype=np.float64) ** -0.9
        self.cdf = np.cumsum(w) / w.sum()
        self.item_ids = rng.permutation(n_items).astype(np.int64) * 7 + 1
        self.n_users, self.n_items = n_users, n_items

    def write(self, path: str, n: int, *, users: tuple[int, int], seed: int, chunk: int = 4_000_000) -> None:
        """``n`` ratings of users ``users[0] <= u < users[1]`` into a Parquet file, ``chunk`` rows at a time."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        rng = np.random.default_rng(seed)
        schema = pa.schema([("userId", pa.int64()), ("movieId", pa.int64()), ("rating", pa.float64())])
        with pq.ParquetWriter(path, schema) as wr:
            done = 0
            while done < n:
                m = min(chunk, n - done)
                u = rng.integers(users[0], users[1], m) * 3 + 11
                i = self.item_ids[np.minimum(np.searchsorted(self.cdf, rng.random(m)), self.n_items - 1)]
                r = rng.integers(1, 11, m) / 2.0
                wr.write_table(pa.table({"userId": u, "movieId": i, "rating": r}, schema=schema))
                done += m


def write_files(a, root: str) -> tuple[str, list[str], int, list[int]]:
    """The base file and the append files (and ``items.txt``, the declared catalogue): ``(base, appends, base
    ratings, ratings of each append)``."""
    n_users = max(a.size // a.per_user, 10)
    gen = Ratings(n_users, a.items)
    n_new = int(round(a.size * a.append_fraction))
    n_base = a.size - n_new
    sizes = [n_new // a.appends + (1 if k < n_new % a.appends else 0) for k in range(a.appends)]
    base = os.path.join(root, "base.parquet")
    np.savetxt(os.path.join(root, "items.txt"), gen.item_ids, fmt="%d")
    gen.write(base, n_base, users=(0, n_users), seed=1)
    extra = max(n_users // 100, 1)  # 1% more users: some appended ratings are of new users
    appends = []
    for k, n in enumerate(sizes):
        appends.append(os.path.join(root, f"append{k:02d}.parquet"))
        gen.write(appends[-1], n, users=(0, n_users + extra), seed=100 + k)
    return base, appends, n_base, sizes


# ---------------------------------------------------------------- the steps, each measured


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "streamdp", *args]


class Steps:
    """Each step measured, in a child process (peak RSS of its tree) or, ``in_process``, here (no RSS)."""

    def __init__(self, in_process: bool, warm_up: bool = False):
        self.in_process, self.warm_up = in_process, warm_up  # a warm-up's steps compile: nothing to say
        self.rows: list[tuple] = []
        self.compiled: list[str] = []  # kernels a timed step compiled (bench.ingest.compiled_between)

    def run(self, label: str, n: int | str, cmd: list[str], here, note: str = "") -> dict:
        """Run ``cmd`` (or ``here()`` in process); a row of the table; the step's JSON output (``--json``)."""
        if hasattr(os, "sync"):  # the last step's writes flushed first: a step timed beside the previous one's
            os.sync()  # writeback (a compaction's whole store) measured its disk, not its own work (0.3 s an append)
        cache = {} if self.warm_up else kernel_cache_state()
        if self.in_process:
            t, c = time.perf_counter(), time.process_time()
            out = here()
            wall, cpu, peak = time.perf_counter() - t, time.process_time() - c, None
        else:
            wall, peak, _err, cpu, stdout = run_measured(cmd, with_cpu=True, with_stdout=True)
            out = json.loads(stdout) if "--json" in cmd else {}
        compiled = [] if self.warm_up else compiled_between(cache, kernel_cache_state())
        if compiled:  # the step's seconds include compiling these: the warm-up missed them (said, not hidden)
            note = "; ".join(filter(None, [note, f"compiled {len(compiled)} kernel(s) while timed: "
                                                 + ", ".join(compiled)]))
            self.compiled.extend(compiled)
        self.rows.append((label, n, wall, cpu, peak, note))
        print(f"  {label}: {wall:.2f} s wall, {cpu:.2f} s CPU" + (f", peak RSS {peak / 1e6:.0f} MB" if peak else "")
              + (f" ({note})" if note else ""), flush=True)
        return out


def ingest_all(steps: Steps, a, store: str, base: str, appends: list[str], n_base: int, sizes: list[int]) -> None:
    from streamdp.workflows import api

    lim = a.memory_limit
    a.n_base = n_base
    ingest_base(steps, a, base, store, 0)
    for k, (path, n) in enumerate(zip(appends, sizes)):
        steps.run(f"append {k + 1} of {len(appends)}", n,
                  _cli("ingest", path, "--append", store, "--memory-limit", lim, "--json"),
                  lambda path=path: api.ingest(path, store, append=True, memory_limit=lim))


def _cached(*paths: str) -> None:
    """Read each file through once (untimed), so that the step after finds it in the page cache."""
    for p in paths:
        with open(p, "rb") as f:
            while f.read(1 << 24):
                pass


def ingest_base(steps: Steps, a, base: str, out: str, r: int) -> None:
    """Run ``r`` (from 0) of the base's ingest into ``out``: the first writes the store the other steps use, the
    others (alternated with the one append's runs, :func:`one_append`) a scratch store, removed."""
    from streamdp.workflows import api

    lim, items = a.memory_limit, os.path.join(os.path.dirname(base), "items.txt")
    label = INGEST_BASE if a.repeats == 1 else f"{INGEST_BASE} ({r + 1} of {a.repeats})"
    _cached(base, items)
    steps.run(label, a.n_base, _cli("ingest", base, "--out", out, "--rating-range", RATING_RANGE, "--items", items,
                                    "--memory-limit", lim, "--json"),
              lambda: api.ingest(base, out, rating_range=RATING_RANGE, items=items, memory_limit=lim))
    if r:
        shutil.rmtree(out)


def train_one(steps: Steps, a, store: str, out: str, label: str) -> float:
    """``train --method als --epsilon 1 --seed 1``: its fit seconds (``train_seconds``)."""
    from streamdp.workflows import api

    def here():
        return api.train(store, method="als", epsilon=1.0, seed=1, out=out, evaluate=False,
                         memory_limit=a.memory_limit).summary

    s = steps.run(label, "", _cli("train", store, "--method", "als", "--epsilon", "1", "--seed", "1", "--out", out,
                                  "--memory-limit", a.memory_limit, "--json"), here)
    steps.rows[-1] = steps.rows[-1][:5] + ("; ".join(filter(None, [f"fit {s['train_seconds']:.2f} s",
                                                                    steps.rows[-1][5]])),)
    return float(s["train_seconds"])


def compare(m1: str, m2: str) -> tuple[bool, float]:
    """Whether the two models' item ids and factors are identical, and the largest factor difference."""
    from streamdp import load_model

    a, b = load_model(m1), load_model(m2)
    if a.item_factors.shape != b.item_factors.shape or not np.array_equal(a.item_ids, b.item_ids):
        return False, float("inf")
    diff = float(np.max(np.abs(a.item_factors - b.item_factors))) if a.item_factors.size else 0.0
    same = np.array_equal(a.item_factors, b.item_factors) and np.array_equal(a.item_bias, b.item_bias)
    return bool(same), diff


def warm(root: str, a) -> None:
    """Compile every kernel the timed steps use into Numba's cache, on a store shaped to take their paths.

    The store has the bench's ratings per user and users per item with at most 200,000 users (200,000 x 2,000, 10M
    ratings, at the defaults): other shapes take other paths. With 2,000 users x 200 items the ALS fitted no
    factors and skipped its parameter selection (``grid_em``, the held-out lanes: 8 kernels the first timed train
    then compiled, 13 s of its 18 s fit on a cold cache, the 11-segment fit 3.99x its compacted twin's); with
    200,000 x 2,000 x 10 ratings it weighed users otherwise (``bounding``); with 200,000 x 20,000 x 50 (10 users
    per item, not 100) it never ran the factor iterations (12 kernels). The ingest runs under half the
    limit, so that it partitions by user block (``bucket_rows``) as the base's does; then the segmented store's
    own kernels (the append's merge, the merged reads, compact). :func:`bench.ingest.compiled_between` checks
    every timed step afterwards and the targets table says any it finds.
    """
    w = os.path.join(root, "warm")
    os.makedirs(w, exist_ok=True)
    n_users, n_items = warm_shape(max(a.size // a.per_user, 10), a.items)
    gen = Ratings(n_users, n_items)
    store, half = os.path.join(w, "w.zarr"), f"{_size(a.memory_limit.upper().rstrip('B')) // 2 // 1_000_000}MB"
    gen.write(os.path.join(w, "w.parquet"), n_users * a.per_user, users=(0, n_users), seed=3)
    np.savetxt(os.path.join(w, "items.txt"), gen.item_ids, fmt="%d")
    steps = Steps(False, warm_up=True)
    steps.run("warm-up", "", _cli("ingest", os.path.join(w, "w.parquet"), "--out", store, "--rating-range",
                                  RATING_RANGE, "--items", os.path.join(w, "items.txt"), "--memory-limit", half), None)
    gen.write(os.path.join(w, "w2.parquet"), n_users // 10, users=(0, n_users + n_users // 100 + 1), seed=4)
    steps.run("warm-up", "", _cli("ingest", os.path.join(w, "w2.parquet"), "--append", store, "--memory-limit",
                                  a.memory_limit), None)
    # no limit here: where kernels compile in this process (STREAMDP_COMPILE=here) they hold ~200 MB more
    steps.run("warm-up", "", _cli("train", store, "--method", "als", "--epsilon", "1", "--seed", "1",
                                  "--memory-limit", "8GB", "--out", os.path.join(w, "m")), None)
    steps.run("warm-up", "", _cli("compact", store), None)
    shutil.rmtree(w, ignore_errors=True)


def measure(a, root: str) -> dict:
    """The whole run: files, base ingest, appends, train (segmented), compact, train (compacted)."""
    from streamdp import open_store

    t = time.perf_counter()
    base, appends, n_base, sizes = write_files(a, root)
    print(f"files: {n_base:,} + {sum(sizes):,} ratings in {len(sizes)} appends, written in "
          f"{time.perf_counter() - t:.0f} s", flush=True)
    steps, store = Steps(a.quick), os.path.join(root, "store.zarr")
    if not a.quick:  # compile the kernels into their cache first, so no step pays for it
        warm(root, a)
    ingest_all(steps, a, store, base, appends, n_base, sizes)
    st = open_store(store)
    n_segments, n_ratings = len(getattr(st, "segments", ())) + 1, st.n_ratings
    seg_label, reps = f"train, {n_segments} segments", a.fit_repeats
    label = (lambda what, r: what if reps == 1 else f"{what} ({r + 1} of {reps})")
    _cached(*_files(store))  # every train finds its store in the page cache (this host drops pages idle ~30 s)
    fit_seg = [train_one(steps, a, store, os.path.join(root, "m_segmented"), label(seg_label, 0))]
    twin = os.path.join(root, "segmented.zarr")  # the segmented store kept for the later rounds (compact folds it)
    if reps > 1:
        shutil.copytree(store, twin)
    steps.run("compact", n_ratings, _cli("compact", store, "--json"), lambda: _compact(store))
    _cached(*_files(store))
    fit_cmp = [train_one(steps, a, store, os.path.join(root, "m_compacted"), label(TRAIN_COMPACTED, 0))]
    same, diff = compare(os.path.join(root, "m_segmented"), os.path.join(root, "m_compacted"))
    for r in range(1, reps):  # alternated: a shared host's slower minutes fall on both (each read through first)
        _cached(*_files(twin))
        fit_seg.append(train_one(steps, a, twin, os.path.join(root, f"m_segmented{r}"), label(seg_label, r)))
        _cached(*_files(store))
        fit_cmp.append(train_one(steps, a, store, os.path.join(root, f"m_compacted{r}"), label(TRAIN_COMPACTED, r)))
    shutil.rmtree(twin, ignore_errors=True)
    one_append(steps, a, root, store, base)
    return {"steps": steps, "n_base": n_base, "sizes": sizes, "n_ratings": n_ratings, "n_segments": n_segments,
            "fit": (float(np.median(fit_seg)), float(np.median(fit_cmp))), "fit_runs": reps, "same": same,
            "diff": diff}


def _files(root: str) -> list[str]:
    """Every file under ``root`` (a store's chunks, to be read through before a timed train)."""
    return [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]


TRAIN_COMPACTED = "train, compacted"


ONE_APPEND = "one append of the whole share, onto the compacted store"
INGEST_BASE = "ingest the base"


def one_append(steps: Steps, a, root: str, store: str, base: str | None = None) -> int:
    """The whole ``--append-fraction`` of ``--size`` as one append (fresh ratings) onto ``store``: its ratings.

    ``--repeats`` runs (a shared host's speed moves one run by 10-40%, and for minutes at a time), each onto a fresh
    copy of ``store`` (copied before the step, untimed; ``store`` is left as it was), alternated with as many more
    runs of the base's ingest (``base``, into a scratch store) as make ``--repeats`` of those: the target reads the
    two medians (:func:`median_row`), measured side by side rather than minutes apart.

    Each run finds what it reads in the page cache (the copy just written, the input read through: :func:`_cached`),
    as the base's ingest finds its input. This host gives back pages untouched for some 30 s: an append onto a
    store left idle that long read 18 MB from the disk and took 1.21 s, against 1.00-1.05 s onto fresh copies; the
    last run, onto ``store`` itself (as this did), was the slowest of every run at 1.27-1.31 s."""
    from streamdp.workflows import api

    n_users = max(a.size // a.per_user, 10)
    n = int(round(a.size * a.append_fraction))
    path = os.path.join(root, "append_all.parquet")
    Ratings(n_users, a.items).write(path, n, users=(0, n_users + max(n_users // 100, 1)), seed=200)
    for r in range(a.repeats):
        onto = os.path.join(root, "onto.zarr")
        shutil.copytree(store, onto)
        _cached(path)
        label = ONE_APPEND if a.repeats == 1 else f"{ONE_APPEND} ({r + 1} of {a.repeats})"
        steps.run(label, n, _cli("ingest", path, "--append", onto, "--memory-limit", a.memory_limit, "--json"),
                  lambda onto=onto: api.ingest(path, onto, append=True, memory_limit=a.memory_limit))
        shutil.rmtree(onto)
        if base is not None and r + 1 < a.repeats:
            ingest_base(steps, a, base, os.path.join(root, "scratch.zarr"), r + 1)
    os.remove(path)
    return n


def median_row(rows: list, label: str) -> tuple | None:
    """The row of step ``label`` for the targets (the base's ingest, the one append): its median over the
    ``--repeats`` runs (wall and CPU each), the largest peak RSS, and the number of runs; ``None`` when it did not
    run."""
    runs = [r for r in rows if r[0] == label or r[0].startswith(label + " (")]
    if not runs:
        return None
    peaks = [r[4] for r in runs if r[4] is not None]
    return (label, runs[0][1], float(np.median([r[2] for r in runs])), float(np.median([r[3] for r in runs])),
            max(peaks) if peaks else None, len(runs))


def _compact(store: str):
    from streamdp.storage.compact import compact

    return compact(store, show_progress=False, notes=False)


# ---------------------------------------------------------------- the table and the page


def _mb(peak) -> str:
    return "in process" if peak is None else f"{peak / 1e6:.0f} MB"


def table_of_steps(rows: list) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for label, n, wall, cpu, peak, note in rows:
        lines.append(f"| {label} | {n if isinstance(n, str) else f'{n:,}'} | {wall:.2f} | {cpu:.2f} | {_mb(peak)} "
                     f"| {note} |")
    return "\n".join(lines)


def table(res: dict) -> str:
    """The steps, then the targets: markdown."""
    rows = res["steps"].rows
    lines = table_of_steps(rows).splitlines()
    ing = median_row(rows, INGEST_BASE)
    app = [r for r in rows if r[0].startswith("append ")]
    whole = res["n_base"] + sum(res["sizes"])
    scale = whole / res["n_base"]  # the base's ingest scaled to the whole store's ratings
    w_app, c_app = sum(r[2] for r in app), sum(r[3] for r in app)
    fit_seg, fit_cmp = res["fit"]
    comp = next(r for r in rows if r[0] == "compact")
    peaks = [r[4] for r in app if r[4] is not None]
    lines += ["", "| target (issue 43) | measured | target | met |", "|---|---|---|---|"]

    def add(what, measured, target, ok):
        lines.append(f"| {what} | {measured} | {target} | {'yes' if ok else 'no'} |")

    add(f"all {len(app)} appends ({sum(res['sizes']):,} ratings) / ingesting the whole store ({whole:,}; the base's "
        "ingest x " + f"{scale:.4f}), wall", f"{w_app:.2f} s / {ing[2] * scale:.2f} s = {w_app / (ing[2] * scale):.3f}",
        "<= 0.1", w_app <= 0.1 * ing[2] * scale)
    add("the same, CPU seconds", f"{c_app:.2f} s / {ing[3] * scale:.2f} s = {c_app / (ing[3] * scale):.3f}",
        "<= 0.1", c_app <= 0.1 * ing[3] * scale)
    runs = res.get("fit_runs", 1)
    add(f"fit of the {res['n_segments']}-segment store / its compacted twin's (`train_seconds`"
        + (f", medians of {runs} alternated runs each)" if runs > 1 else ")"),
        f"{fit_seg:.2f} s / {fit_cmp:.2f} s = {fit_seg / fit_cmp:.3f}", "<= 1.2", fit_seg <= 1.2 * fit_cmp)
    add("seeded, the same model (item ids, factors, biases bit for bit)",
        "identical" if res["same"] else f"differ (largest factor difference {res['diff']:.3g})", "identical",
        res["same"])
    one = median_row(rows, ONE_APPEND)
    if one is not None:
        runs = "" if one[5] == 1 else f", medians of {one[5]} runs each"
        add(f"one append of all {one[1]:,} ratings / ingesting the whole store, wall (CPU){runs}",
            f"{one[2] / (ing[2] * scale):.3f} ({one[3] / (ing[3] * scale):.3f})", "<= 0.1",
            max(one[2] / ing[2], one[3] / ing[3]) <= 0.1 * scale)
        peaks.append(one[4]) if one[4] is not None else None
    if peaks:
        add("peak RSS of `ingest --append` (largest of the appends)", _mb(max(peaks)), "under --memory-limit "
            f"({res['limit']})", max(peaks) <= _size(res["limit"].upper().replace("B", "")))
        add("peak RSS of `compact` (no --memory-limit option: as it runs)", _mb(comp[4]), "(measured)", True)
    compiled = sorted(set(res["steps"].compiled))
    add("no timed step compiled a kernel (the warm-up took every path the steps take)",
        "none" if not compiled else ", ".join(compiled), "none", not compiled)
    return "\n".join(lines) + "\n"


def header(a, res: dict, seconds: float) -> str:
    return (f"`python bench/append.py {' '.join(a.argv)}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
            f"{res['n_ratings']:,} ratings after the appends (pairs rated twice kept once; {res['n_base']:,} ingested, then {len(res['sizes'])} "
            f"append(s) of {a.append_fraction / len(res['sizes']):.2%} each), {max(a.size // a.per_user, 10):,} users "
            f"(+1% new in the appends) x {a.items:,} items, Parquet files; `--memory-limit {a.memory_limit}`; "
            f"{os.cpu_count()} CPUs, load average {' / '.join(f'{x:.1f}' for x in os.getloadavg())} at the end "
            f"({seconds:.0f} s in all). " + ("All in this process (`--quick`): no peak RSS.\n" if a.quick else
                                             "Each step a child process (wall, CPU of the child, peak RSS of its "
                                             "tree: its own high-water mark, its descendants' polled), in the order "
                                             "run.\n"))


def write_section(path: str, text: str) -> None:
    """Put ``text`` under :data:`HEADING` in the page at ``path`` (replacing that section, or at the end; a page
    that does not exist yet is made with the section alone)."""
    try:
        with open(path) as f:
            old = f.read()
    except FileNotFoundError:
        old = ""
    section = "\n" + HEADING + "\n\n" + text.strip() + "\n"
    i = old.find("\n" + HEADING)
    if i >= 0:
        j = old.find("\n## ", i + 1)
        new = old[:i].rstrip("\n") + "\n" + section + (old[j:] if j >= 0 else "")
    else:
        new = old.rstrip("\n") + "\n" + section
    with open(path + ".tmp", "w") as f:
        f.write(new)
    os.replace(path + ".tmp", path)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    a = parse(argv)
    a.argv = argv
    root = a.dir or tempfile.mkdtemp(prefix="bench-append-")
    os.makedirs(root, exist_ok=True)
    t0 = time.perf_counter()
    if a.onto:
        steps = Steps(False)
        one_append(steps, a, root, a.onto)
        print(table_of_steps(steps.rows))
        return 0
    try:
        res = measure(a, root)
    finally:
        if a.dir is None or not a.keep:
            for name in os.listdir(root) if os.path.isdir(root) else ():
                p = os.path.join(root, name)
                shutil.rmtree(p, ignore_errors=True) if os.path.isdir(p) else os.remove(p)
            if a.dir is None:
                shutil.rmtree(root, ignore_errors=True)
    res["limit"] = a.memory_limit
    text = header(a, res, time.perf_counter() - t0) + "\n" + table(res)
    print("\n" + text)
    if a.write:
        write_section(a.write, text)
        print(f"written to {a.write}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
