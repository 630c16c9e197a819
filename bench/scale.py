"""Training at scale: ``streamdp train``'s fit, evaluation, passes and peak RSS against the in-memory scipy pass.

    python bench/scale.py [--sizes 20M,100M] [--billion] [--memory-limit 1GB] [--workers N]
                          [--dask] [--overhead] [--repeats 3] [--fits 1] [--stores PATH,...] [--dir DIR]
                          [--out FILE]

For each size (ratings, train and test together; ``--billion`` adds 1B, for an idle
machine: about 10 minutes to generate and 10 to train on 2 cores) a store is
generated into a temporary directory under ``--dir`` (``streamdp generate``: 20k
items, 50 ratings per user, power law, 10% held out; removed at the end) or taken
from ``--stores``. Then, in the same run:

* **read rate**: every train block read and decompressed (``RatingStore.read_block``:
  chunk decompression, validation, CRC) on one thread, page cache warm: ratings/s.
  What a pass can never beat per core, beside what its kernels cost.
* **scipy pass**: ``A.T @ (A @ V)`` with scipy.sparse on the training matrix in
  memory, k 8, one thread, median of ``--repeats`` (the yardstick of issue 30). Stores
  over 100M training ratings use their first 100M ratings' blocks, the time scaled by
  the ratings (said in the row).
* **train**: ``streamdp train STORE --epsilon 1 --seed 0 --memory-limit LIMIT --json --lists own``
  (the default method, als, and its evaluation; ``--lists own``: without the ``ials`` lists part the default
  adds on stores of 5,000+ users, which streams the store again: docs/scale.md) in a child process whose peak RSS
  (the process tree: its own high-water mark, its descendants polled; ``bench.ingest.run_measured``) is taken;
  the child times every engine pass (``Engine.map_reduce``/``imap``/``foreach``) under its progress label. Printed per
  kind of pass: count, seconds and scipy-pass equivalents; in all: passes, the fit
  (``train_seconds``), checks + evaluation (``total_seconds`` minus the fit), peak RSS,
  and each as a ratio to the scipy pass. ``--fits N`` trains N times, the scipy pass measured
  again before each, and reports the run of the median ratio (all N ratios listed).
* **scheduling overhead** (``--overhead``): seconds per block of a pass whose
  blocks cost nothing (``fn`` returns 0, nothing read), wall and CPU, on the local
  engine (``Engine``: Dask's threaded scheduler), on Dask distributed in this process
  (``Engine(scheduler="dask")``) and on Dask's threaded scheduler running the local
  engine's pass graph (``streamdp.stream.engine.pass_graph`` under
  ``dask.threaded.get``, without the hand-over to a caller): what each engine adds to
  every block, whatever the method.
* ``--dask``: the same ``train`` again with ``--scheduler dask`` (Dask distributed in
  this process), its fit and seconds per fit pass against the thread pool's, and
  whether the two models' item factors are bit-identical (issue 30 item 4).

The machine these numbers come from is shared: only the ratios of one run mean much.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as a file: make ``bench`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.ingest import compiled_between, kernel_cache_state, run_measured, warm_shape  # noqa: E402

#: Items of the generated stores and ratings per user (issue 30's stores: 20k items, 2M users for 100M).
ITEMS, PER_USER = 20_000, 50
#: The scipy pass is measured on at most this many training ratings (beyond, it is scaled by the ratings).
SCIPY_CAP = 100_000_000


def _size(text: str) -> int:
    """``20M`` / ``1B`` / ``2.5e6`` -> an integer count."""
    t = text.strip().upper()
    mult = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9}.get(t[-1:], 1)
    return int(float(t[:-1] if t[-1:] in "KMBG" else t) * mult)


def _label(n: float) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"


# ---------------------------------------------------------------- the child: streamdp train with its passes timed


def child(log: str, argv: list[str]) -> int:
    """Run ``streamdp ARGV`` in this process with every engine pass timed into the JSON file ``log``."""
    import functools

    from streamdp.stream.engine import Engine

    passes: list[dict] = []

    def timed(name, orig, generator=False):
        if generator:
            @functools.wraps(orig)
            def gen(self, *a, desc="pass", **k):
                t, c = time.perf_counter(), time.process_time()
                try:
                    yield from orig(self, *a, desc=desc, **k)
                finally:
                    passes.append({"desc": desc, "seconds": time.perf_counter() - t, "cpu": time.process_time() - c,
                                   "blocks": self.n_blocks, "scheduler": self.scheduler_name})
            return gen

        @functools.wraps(orig)
        def run(self, *a, desc="pass", **k):
            t, c = time.perf_counter(), time.process_time()
            try:
                return orig(self, *a, desc=desc, **k)
            finally:
                passes.append({"desc": desc, "seconds": time.perf_counter() - t, "cpu": time.process_time() - c,
                               "blocks": self.n_blocks, "scheduler": self.scheduler_name})
        return run

    Engine.map_reduce = timed("map_reduce", Engine.map_reduce)
    Engine.foreach = timed("foreach", Engine.foreach)
    Engine.imap = timed("imap", Engine.imap, generator=True)
    from streamdp.cli import main

    try:
        main(args=argv, prog_name="streamdp")
        return 0
    except SystemExit as exc:
        return int(exc.code or 0)
    finally:
        with open(log, "w") as f:
            json.dump(passes, f)


def _kind(desc: str) -> str:
    """A pass's kind: its progress label without the iteration numbers (``als iteration 3/7`` -> ``als iteration``)."""
    return re.sub(r"\s*\d+/\d+$", "", desc).strip()


def train_measured(store: str, out: str, limit: str, workers: int | None, scheduler: str | None = None) -> dict:
    """``streamdp train`` in a child process: its JSON summary, wall seconds, peak RSS and timed passes."""
    log = out + ".passes.json"
    cmd = [sys.executable, os.path.abspath(__file__), "--child", log, "--", "train", store, "--epsilon", "1",
           "--seed", "0", "--out", out, "--memory-limit", limit, "--json", "--force", "--over-budget", "--lists", "own"]
    if workers:
        cmd += ["--workers", str(workers)]
    if scheduler:
        cmd += ["--scheduler", scheduler]
    cache = kernel_cache_state()
    wall, peak, _, cpu, stdout = run_measured(cmd, poll=0.05, with_cpu=True, with_stdout=True)
    with open(log) as f:
        passes = json.load(f)
    return {"wall": wall, "cpu": cpu, "peak": peak, "passes": passes, "summary": json.loads(stdout),
            "compiled": compiled_between(cache, kernel_cache_state())}


# ---------------------------------------------------------------- measurements in this process


def read_rate(store) -> tuple[float, float]:
    """``(wall, CPU)`` seconds of reading every train block on one thread (the second of two reads)."""
    for _ in range(2):
        t, c = time.perf_counter(), time.process_time()
        for b in range(store.n_blocks):
            store.read_block(b)
        dt, dc = time.perf_counter() - t, time.process_time() - c
    return dt, dc


def scipy_pass(store, repeats: int, k: int = 8) -> tuple[float, float, str]:
    """``(wall, CPU)`` seconds of one ``A.T @ (A @ V)`` over the store's training ratings (medians of ``repeats``,
    one thread) and a note when it was measured on a prefix of the blocks and scaled."""
    import numpy as np
    import scipy.sparse as sp
    from threadpoolctl import threadpool_limits

    blocks, nnz = [], 0
    for b in range(store.n_blocks):
        if nnz >= SCIPY_CAP:
            break
        blk = store.read_block(b)
        blocks.append(blk)
        nnz += blk.nnz
    offs = np.cumsum([0] + [bl.nnz for bl in blocks])
    indptr = np.concatenate([np.zeros(1, np.int64)] + [bl.indptr[1:] - bl.indptr[0] + o
                                                         for bl, o in zip(blocks, offs[:-1])])
    items = np.concatenate([bl.items for bl in blocks]).astype(np.int32)
    vals = np.concatenate([bl.ratings for bl in blocks]).astype(np.float64)
    del blocks
    A = sp.csr_matrix((vals, items, indptr), shape=(len(indptr) - 1, store.n_items))
    V = np.random.default_rng(0).standard_normal((store.n_items, k))
    ts, cs = [], []
    with threadpool_limits(1):
        for _ in range(repeats):
            t, c = time.perf_counter(), time.process_time()
            A.T @ (A @ V)
            ts.append(time.perf_counter() - t)
            cs.append(time.process_time() - c)
    scale = store.n_ratings / nnz
    return (statistics.median(ts) * scale, statistics.median(cs) * scale,
            f" (measured on {_label(nnz)} ratings, scaled)" if nnz < store.n_ratings else "")


def overhead(store, workers: int | None, repeats: int = 5) -> dict:
    """``{engine: (wall, cpu)}`` seconds per block of an empty pass over ``store``'s blocks (median of ``repeats``)."""
    import concurrent.futures as cf

    import dask.threaded

    from streamdp.stream.engine import Engine, dask_session, pass_graph

    n = store.n_blocks
    out = {}

    def timed(f):
        ws, cs = [], []
        for _ in range(repeats + 1):  # the first is a warm-up
            t, c = time.perf_counter(), time.process_time()
            f()
            ws.append(time.perf_counter() - t)
            cs.append(time.process_time() - c)
        return statistics.median(ws[1:]) / n, statistics.median(cs[1:]) / n

    with dask_session("dask", workers) as client:
        for name, sch in (("local engine (Dask threaded scheduler)", None),
                          ("Dask distributed in this process", client)):
            with Engine(store, workers=workers, scheduler=sch, memory_limit="4GB") as eng:
                out[name] = timed(lambda: eng.map_reduce(lambda blk, b: 0, lambda a, x: a, 0, split=None,
                                                         show=False))
                w, window = eng.workers, eng.in_flight
    def graph():  # the local engine's pass graph with nothing to read, compute or hand over
        return pass_graph(range(n), window, lambda b, gate: b, lambda blk, b, *prev: 0, lambda i, b, part, prev: part)

    with cf.ThreadPoolExecutor(w) as pool:
        out["its pass graph alone (no hand-over)"] = timed(
            lambda: dask.threaded.get(*graph(), pool=pool, num_workers=w))
    return out


def measure(size: int, path: str, tmp: str, args, generated: float | None) -> dict:
    """Every figure of one store."""
    from streamdp.storage.store import open_store

    st = open_store(path)
    r_sec, r_cpu = read_rate(st)
    sp_sec, sp_cpu, sp_note = scipy_pass(st, args.repeats)
    out = os.path.join(tmp, "model")
    res = {"size": size, "path": path, "n_ratings": st.n_ratings, "n_test": st.info.n_test,
           "users": st.n_users, "blocks": st.n_blocks, "generated": generated, "read_seconds": r_sec,
           "read_cpu": r_cpu, "scipy": sp_sec, "scipy_cpu": sp_cpu, "scipy_note": sp_note}
    if args.overhead:
        res["overhead"] = overhead(st, args.workers)
    # --fits N: the scipy pass measured again before each fit after the first, each fit taken against the yardstick
    # measured beside it; the run of the median ratio is the one reported (a shared host's load comes and goes)
    runs = []
    for i in range(max(1, args.fits)):
        if i:
            sp_sec, sp_cpu, sp_note = scipy_pass(st, args.repeats)
        t = train_measured(path, out, args.memory_limit, args.workers)
        runs.append((t["summary"]["train_seconds"] / sp_sec, t, sp_sec, sp_cpu))
    _, res["threads"], res["scipy"], res["scipy_cpu"] = sorted(runs, key=lambda x: x[0])[(len(runs) - 1) // 2]
    res["fit_ratios"] = [x[0] for x in runs]
    if args.dask:
        out2 = os.path.join(tmp, "model-dask")
        run2 = train_measured(path, out2, args.memory_limit, args.workers, scheduler="dask")
        res.update(dask=run2, dask_identical=_same_factors(out, out2))
        shutil.rmtree(out2, ignore_errors=True)
    return res


def _fit_passes(run: dict) -> list[float]:
    """Seconds of each pass of the fit (every pass before the evaluation's)."""
    return [p["seconds"] for p in run["passes"] if not p["desc"].startswith("evaluate")]


def _same_factors(a: str, b: str) -> bool:
    import numpy as np

    from streamdp.serving.model import load_model

    return bool(np.array_equal(load_model(a).item_factors, load_model(b).item_factors))


# ---------------------------------------------------------------- the tables


def tables(results: list[dict], args) -> str:
    lines = ["| store | passes | fit | fit / scipy pass: wall, CPU | checks + evaluation | in all | peak RSS | "
             "scipy pass (k 8, 1 thread): wall, CPU | read + decompress, 1 thread: CPU rate, in scipy passes |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        t = r["threads"]
        fit, total = t["summary"]["train_seconds"], t["summary"]["total_seconds"]
        fit_cpu = sum(p["cpu"] for p in t["passes"] if not p["desc"].startswith("evaluate"))
        rest = total - fit
        lines.append(
            f"| {_label(r['n_ratings'] + r['n_test'])} ({r['users']:,} users, {r['blocks']} blocks) | "
            f"{len(_fit_passes(t))} | {fit:.1f} s | {fit / r['scipy']:.1f}, {fit_cpu / r['scipy_cpu']:.1f} | "
            f"{rest:.1f} s = {rest / fit:.2f}x the fit | {total:.1f} s | {t['peak'] / 1e6:.0f} MB | "
            f"{r['scipy']:.2f} s, {r['scipy_cpu']:.2f} s{r['scipy_note']} | "
            f"{r['n_ratings'] / r['read_cpu'] / 1e6:.0f}M ratings/s, {r['read_cpu'] / r['scipy_cpu']:.2f} |")
    for r in results:
        if r["threads"].get("compiled"):
            lines.append(f"\n{_label(r['n_ratings'] + r['n_test'])}: the fit compiled {len(r['threads']['compiled'])} "
                         "kernel(s) while timed (the warm-up missed their path; its seconds include compiling): "
                         + ", ".join(r["threads"]["compiled"]))
    for r in results:
        if len(r.get("fit_ratios", ())) > 1:
            lines.append(f"\n{_label(r['n_ratings'] + r['n_test'])}: {len(r['fit_ratios'])} fits, each against the scipy "
                         f"pass measured before it: fit / scipy pass " + ", ".join(f"{x:.1f}" for x in r["fit_ratios"])
                         + f" (the median's run above and below)")
    out = ["\n".join(lines)]
    for r in results:
        kinds: dict = collections.OrderedDict()
        for p in r["threads"]["passes"]:
            kinds.setdefault(_kind(p["desc"]), []).append((p["seconds"], p["cpu"]))
        rows = [f"Passes of `train` on {_label(r['n_ratings'] + r['n_test'])} (memory limit {args.memory_limit}):",
                "", "| pass | count | seconds | each | CPU seconds | scipy passes: wall, CPU |",
                "|---|---|---|---|---|---|"]
        for k, v in kinds.items():
            w, c = sum(x for x, _ in v), sum(y for _, y in v)
            rows.append(f"| {k} | {len(v)} | {w:.2f} | {statistics.median(x for x, _ in v):.2f} | {c:.2f} | "
                        f"{w / r['scipy']:.2f}, {c / r['scipy_cpu']:.2f} |")
        out.append("\n".join(rows))
    if args.overhead:
        rows = ["What an engine adds to every block (an empty pass; seconds per block):", "",
                "| store | engine | wall per block | CPU per block | CPU per pass, in scipy passes |",
                "|---|---|---|---|---|"]
        for r in results:
            for name, (w, c) in r["overhead"].items():
                rows.append(f"| {_label(r['n_ratings'] + r['n_test'])} | {name} | {w * 1e3:.2f} ms | "
                            f"{c * 1e3:.2f} ms | {c * r['blocks'] / r['scipy_cpu']:.3f} |")
        out.append("\n".join(rows))
    if args.dask:
        rows = ["Thread pool against Dask in this process (`--scheduler dask`), same run:", "",
                "| store | fit, threads | fit, dask | dask / threads: wall, CPU of the fit's passes | "
                "per fit pass (median), threads / dask | bit-identical |", "|---|---|---|---|---|---|"]
        for r in results:
            ft, fd = r["threads"]["summary"]["train_seconds"], r["dask"]["summary"]["train_seconds"]
            mt, md = statistics.median(_fit_passes(r["threads"])), statistics.median(_fit_passes(r["dask"]))
            ct, cd = (sum(p["cpu"] for p in r[e]["passes"] if not p["desc"].startswith("evaluate"))
                      for e in ("threads", "dask"))
            rows.append(f"| {_label(r['n_ratings'] + r['n_test'])} | {ft:.1f} s | {fd:.1f} s | {fd / ft:.3f}, "
                        f"{cd / ct:.3f} | {mt:.2f} s / {md:.2f} s | {r['dask_identical']} |")
        out.append("\n".join(rows))
    return "\n\n".join(out)


def generate(size: int, dest: str) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "streamdp", "generate", "--out", dest, "--users",
                    str(max(size // PER_USER, 100)), "--items", str(ITEMS), "--ratings-per-user", str(PER_USER),
                    "--test-fraction", "0.1", "--seed", "1"], check=True, capture_output=True)
    return time.perf_counter() - t


def warm_up(tmp: str, args, first) -> None:
    """Compile the kernels into their cache first, on a store shaped like the first measured one (``first``: a size
    or a store's path), so that no row pays for it: its users per item and ratings per user, at most 200,000
    users. A 2,000 x 500 store took other paths than a 20M one (no factors, no parameter selection) and left their
    kernels to the first row's fit (bench/append.py's warm-up says which); the rows say any kernel a fit compiled."""
    if isinstance(first, str):
        from streamdp.storage.store import open_store

        st = open_store(first)
        users, items, per_user = st.n_users, st.n_items, max(int((st.n_ratings + st.info.n_test) / st.n_users), 1)
    else:
        users, items, per_user = max(first // PER_USER, 100), ITEMS, PER_USER
    n, n_items = warm_shape(users, items, min_items=100)
    subprocess.run([sys.executable, "-m", "streamdp", "generate", "--out", f"{tmp}/warm.zarr", "--users", str(n),
                    "--items", str(n_items), "--ratings-per-user", str(per_user),
                    "--test-fraction", "0.1", "--seed", "1"], check=True, capture_output=True)
    train_measured(f"{tmp}/warm.zarr", f"{tmp}/m0", args.memory_limit, args.workers)
    shutil.rmtree(f"{tmp}/warm.zarr", ignore_errors=True)


def run(sizes: list[int], args, stores: list[str] | None = None) -> str:
    """Measure every size (or every store of ``stores``); the markdown tables."""
    tmp = tempfile.mkdtemp(prefix="bench-scale-", dir=args.dir)
    results = []
    try:
        warm_up(tmp, args, stores[0] if stores else sizes[0])
        for i, size in enumerate(stores or sizes):
            if stores:
                path, gen = size, None
            else:
                path = os.path.join(tmp, f"s{i}.zarr")
                gen = generate(size, path)
            r = measure(size, path, tmp, args, gen)
            results.append(r)
            t = r["threads"]
            print(f"{_label(r['n_ratings'] + r['n_test'])}: fit {t['summary']['train_seconds']:.1f}s, train in all "
                  f"{t['summary']['total_seconds']:.1f}s, peak {t['peak'] / 1e6:.0f} MB, scipy pass {r['scipy']:.2f}s"
                  + (f", generated in {gen:.0f}s" if gen else ""), file=sys.stderr, flush=True)
            if not stores:
                shutil.rmtree(path, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return tables(results, args)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="20M,100M", help="ratings of the generated stores (train and test)")
    ap.add_argument("--billion", action="store_true", help="also 1B ratings (an idle machine: ~20 minutes)")
    ap.add_argument("--stores", default=None, help="measure these stores (comma-separated) instead of generating")
    ap.add_argument("--memory-limit", default="1GB")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=3, help="repeats of the scipy pass (median)")
    ap.add_argument("--fits", type=int, default=1,
                    help="train this many times, each against a scipy pass measured before it; the median's run is "
                         "reported (default 1)")
    ap.add_argument("--overhead", action="store_true", help="also the engines' scheduling overhead per block")
    ap.add_argument("--dask", action="store_true", help="also train with --scheduler dask, side by side")
    ap.add_argument("--dir", default=None, help="where the temporary stores go (default: the system's tmp)")
    ap.add_argument("--out", default=None, help="also write the tables to this file")
    return ap


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(argv[1], argv[3:])
    a = parser().parse_args(argv)
    sizes = [_size(s) for s in a.sizes.split(",") if s.strip()] + ([10 ** 9] if a.billion else [])
    stores = [s for s in a.stores.split(",") if s] if a.stores else None
    text = run(sizes, a, stores)
    print("\n" + text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
