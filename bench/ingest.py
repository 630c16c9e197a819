"""Benchmark ``streamdp ingest`` against an in-memory pyarrow baseline, and ``generate``.

Usage::

    python bench/ingest.py                  # 20M ratings
    python bench/ingest.py --ratings 5000000 --memory-limit 512MB

Writes a synthetic MovieLens-latest style CSV (``userId,movieId,rating,timestamp``,
power-law items, some duplicated pairs) to a temporary directory, then in the same
run times, each in a fresh subprocess with its peak RSS (its own high-water mark, its descendants' polled by
psutil: :func:`run_measured`):

* ``streamdp ingest CSV --out STORE --memory-limit M``;
* the baseline: ``pyarrow.csv.read_csv`` of the whole file, a stable sort by user,
  ``numpy.savez`` of the sorted columns (what one would write without streamdp);
* ``streamdp generate`` of about the same number of ratings (``ratings / 100`` users x 100
  ratings on average, 20k items).

Prints ratings/s and peak RSS of each and the ratios ingest/baseline. Each timing
is the median of ``--repeat`` runs (default 1: the runs are long); the CPU seconds
(user + system) of each child are printed too, a steadier measure on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

BASELINE = r"""
import sys, numpy as np, pyarrow.csv as c
t = c.read_csv(sys.argv[1])
u = t.column("userId").to_numpy(); i = t.column("movieId").to_numpy()
r = t.column("rating").to_numpy().astype(np.float32); ts = t.column("timestamp").to_numpy()
del t
o = np.argsort(u, kind="stable")
np.savez(sys.argv[2], users=u[o], items=i[o].astype(np.int32), ratings=r[o], timestamps=ts[o])
"""


def _synthetic_tables(n_ratings: int, n_users: int | None, n_items: int, seed: int, chunk: int):
    """``userId,movieId,rating,timestamp`` tables of ``chunk`` rows, ``n_ratings`` in all (power-law items,
    non-contiguous ids, ratings 0.5..5 by halves)."""
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    n_users = n_users or max(1, n_ratings // 100)
    w = np.arange(1, n_items + 1, dtype=np.float64) ** -0.9
    cdf = np.cumsum(w) / w.sum()
    item_ids = rng.permutation(n_items).astype(np.int64) * 7 + 1  # non-contiguous original ids
    done = 0
    while done < n_ratings:
        n = min(chunk, n_ratings - done)
        u = rng.integers(0, n_users, n) * 3 + 11
        i = item_ids[np.minimum(np.searchsorted(cdf, rng.random(n)), n_items - 1)]
        r = rng.integers(1, 11, n) / 2.0
        t = rng.integers(800_000_000, 1_600_000_000, n)
        yield pa.table({"userId": u, "movieId": i, "rating": r, "timestamp": t})
        done += n


def write_synthetic_csv(path: str, n_ratings: int, *, n_users: int | None = None, n_items: int = 20_000,
                        seed: int = 0, chunk: int = 2_000_000, dup_fraction: float = 0.001) -> int:
    """Write a ``userId,movieId,rating,timestamp`` CSV of ``n_ratings`` rows in chunks; returns its size."""
    import pyarrow.csv as pacsv

    wr = None
    for t in _synthetic_tables(n_ratings, n_users, n_items, seed, chunk):
        wr = wr or pacsv.CSVWriter(path, t.schema, write_options=pacsv.WriteOptions(include_header=True))
        wr.write_table(t)
    wr.close()
    return os.path.getsize(path)


def write_synthetic_parquet(path: str, n_ratings: int, *, n_users: int | None = None, n_items: int = 20_000,
                            seed: int = 0, chunk: int = 2_000_000, row_group: int = 1 << 20) -> int:
    """The same ratings as :func:`write_synthetic_csv` into a Parquet file of ``row_group``-row groups."""
    import pyarrow.parquet as pq

    wr = None
    for t in _synthetic_tables(n_ratings, n_users, n_items, seed, chunk):
        wr = wr or pq.ParquetWriter(path, t.schema)
        wr.write_table(t, row_group_size=row_group)
    wr.close()
    return os.path.getsize(path)


def _children_cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def kernel_cache_state() -> dict[str, int]:
    """The Numba cache's index files (``*.nbi``) of streamdp's kernels and their change times (ns).

    A kernel compiled for a new signature rewrites its index, so two states taken around a timed step tell whether
    the step paid for a compilation (:func:`compiled_between`): a warm-up that misses a kernel the step uses (a
    small store takes other paths than a big one) is then said, not hidden in the step's seconds. The cache is
    ``NUMBA_CACHE_DIR`` when set, else each package directory's ``__pycache__`` (Numba's default).
    """
    import glob

    import streamdp

    root = os.environ.get("NUMBA_CACHE_DIR") or os.path.dirname(os.path.abspath(streamdp.__file__))
    return {f: os.stat(f).st_mtime_ns for f in glob.glob(os.path.join(root, "**", "*.nbi"), recursive=True)}


#: The most users a warm-up store gets (:func:`warm_shape`): 10M ratings at 50 a user, a few seconds to make.
WARM_USERS = 200_000


def warm_shape(users: int, items: int, min_items: int = 10) -> tuple[int, int]:
    """``(users, items)`` of a warm-up store for a measured one of ``users`` x ``items``: at most
    :data:`WARM_USERS` users and as many users per item. The paths a fit takes follow those (below some users per
    item the ALS fits no factors, with few users it skips its parameter selection), so a warm-up of another shape
    leaves kernels to the first timed step (:func:`compiled_between` says which)."""
    n = min(users, WARM_USERS)
    return n, max(items * n // max(users, 1), min_items)


def compiled_between(before: dict[str, int], after: dict[str, int]) -> list[str]:
    """The kernels (``module.function``) whose cache index was written between two :func:`kernel_cache_state`."""
    return sorted(os.path.basename(f).split("-")[0] for f, t in after.items() if before.get(f) != t)


def _high_water(pid: int) -> int:
    """The peak RSS of process ``pid`` so far (Linux: ``VmHWM`` of ``/proc/PID/status``), in bytes; 0 where the
    system does not say."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def run_measured(cmd: list[str], poll: float = 0.02, with_cpu: bool = False, with_stdout: bool = False,
                 tree_poll: float = 0.25):
    """Run ``cmd``; return (seconds, peak RSS bytes of the child tree, stderr[, CPU seconds][, stdout]).

    The seconds end when the child is reaped (a blocking ``wait4``; a loop polling it every ``poll`` seconds added
    up to that much to each measure, and one reading its output first waited for any process that held it, such as
    an idle kernel compiler). The peak is the larger of the child's own high-water mark as last read (``VmHWM``,
    every ``poll`` seconds: a spike between two reads is not missed, only one in the child's last ``poll``
    seconds) and its tree's RSS summed at each read, its descendants listed every ``tree_poll`` seconds (listing
    them reads every process of the machine, 0.7 ms: every 20 ms that took 4% of a core beside the measured
    command, and made a 1% append onto a 100M store, 1.05 s on 1.4 cores of a 2-core machine, 5% slower). Not
    the kernel's ``ru_maxrss`` of the reaped child: it counts the parent's pages the child held before its
    ``exec`` (every command measured from a 383 MB bench process reported 383 MB).

    The child may write Python's bytecode cache (``PYTHONDONTWRITEBYTECODE`` left out of its environment), as an
    installed package's modules are compiled once: where the variable is set (this project's sandbox sets it) and
    the sources have no fresh cache (a clean clone, any edit), every child compiled streamdp's modules again, 50-70
    ms of a 1.0 s append's imports, 0.36 against 0.41-0.43 s. A bench's warm-up run writes the cache."""
    import psutil

    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    c0 = _children_cpu()
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc = psutil.Process(p.pid)
    peak, stop, got = [0], threading.Event(), {}

    def sample():
        kids, relist = [], 0.0
        while True:
            try:
                if time.perf_counter() >= relist:
                    kids, relist = proc.children(recursive=True), time.perf_counter() + tree_poll
                rss = proc.memory_info().rss
                for k in kids:
                    try:
                        rss += k.memory_info().rss
                    except psutil.Error:
                        pass
                peak[0] = max(peak[0], rss, _high_water(p.pid))
            except psutil.Error:
                pass
            if stop.wait(poll):
                return

    def drain(name, stream):
        got[name] = stream.read()

    threads = [threading.Thread(target=sample, daemon=True),
               threading.Thread(target=drain, args=("out", p.stdout), daemon=True),
               threading.Thread(target=drain, args=("err", p.stderr), daemon=True)]
    for t in threads:
        t.start()
    _, status, _usage = os.wait4(p.pid, 0)
    dt = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    stop.set()
    for t in threads:
        t.join()
    p.stdout.close()
    p.stderr.close()
    out, err = got.get("out", b""), got.get("err", b"")
    if p.returncode != 0:
        raise SystemExit(f"command failed ({p.returncode}): {' '.join(cmd)}\n{err.decode()}")
    res = (dt, peak[0], err.decode()) + ((_children_cpu() - c0,) if with_cpu else ()) + \
        ((out.decode(),) if with_stdout else ())
    return res


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ratings", type=int, default=20_000_000)
    ap.add_argument("--memory-limit", default="256MB")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--dir", default=None, help="Work directory (default: a temporary one, removed).")
    a = ap.parse_args(argv)
    d = a.dir or tempfile.mkdtemp(prefix="streamdp-bench-")
    try:
        csv = os.path.join(d, "ratings.csv")
        t0 = time.perf_counter()
        size = write_synthetic_csv(csv, a.ratings)
        print(f"input: {a.ratings:,} ratings, {size / 1e6:.0f} MB CSV (written in {time.perf_counter() - t0:.1f}s)")
        exe = [sys.executable, "-m", "streamdp.cli"]
        # warm the Numba cache so that compile time is not timed
        small = os.path.join(d, "small.csv")
        write_synthetic_csv(small, 1000)
        subprocess.run(exe + ["ingest", small, "--out", os.path.join(d, "small.zarr"), "--force"], check=True,
                       capture_output=True)
        rows = []
        runs = {"ingest": [], "baseline": [], "generate": []}
        for _ in range(a.repeat):
            runs["ingest"].append(run_measured(exe + ["ingest", csv, "--out", os.path.join(d, "s.zarr"), "--force",
                                                      "--memory-limit", a.memory_limit], with_cpu=True))
            runs["baseline"].append(run_measured([sys.executable, "-c", BASELINE, csv, os.path.join(d, "b.npz")],
                                                 with_cpu=True))
            n_users = max(1, a.ratings // 100)
            runs["generate"].append(run_measured(exe + ["generate", "--out", os.path.join(d, "g.zarr"), "--force",
                                                        "--users", str(n_users), "--items", "20000",
                                                        "--ratings-per-user", "100"], with_cpu=True))
        from streamdp import open_store

        n_gen = open_store(os.path.join(d, "g.zarr")).n_ratings
        n_ing = open_store(os.path.join(d, "s.zarr")).n_ratings
        for name, rs in runs.items():
            sec = statistics.median(r[0] for r in rs)
            rss = statistics.median(r[1] for r in rs)
            cpu = statistics.median(r[3] for r in rs)
            n = n_gen if name == "generate" else a.ratings
            rows.append((name, n, sec, n / sec, rss, cpu))
        print(f"{'':10s} {'ratings':>12s} {'seconds':>9s} {'ratings/s':>12s} {'peak RSS':>10s} {'CPU s':>8s}")
        for name, n, sec, rate, rss, cpu in rows:
            print(f"{name:10s} {n:12,d} {sec:9.2f} {rate / 1e6:10.2f}M {rss / 1e6:8.0f}MB {cpu:8.1f}")
        ing, base = rows[0], rows[1]
        print(f"ingest/baseline: speed {ing[3] / base[3]:.2f}x (target >= 1), peak RSS {ing[4] / base[4]:.2f}x "
              f"(target <= 0.25), CPU time {ing[5] / base[5]:.2f}x; ingest kept {n_ing:,} ratings after "
              f"de-duplication")
        print(f"(load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; wall-clock "
              f"ratios are unreliable on a busy machine, CPU-time ratios less so)")
        # the store records the seconds generate_store itself took (after interpreter start and imports,
        # which cost ~2 s whatever the size and dominate small runs)
        gen_inner = open_store(os.path.join(d, "g.zarr")).attrs.get("seconds")
        inner = f", {n_gen / gen_inner / 1e6:.2f}M ratings/s inside generate_store ({gen_inner:.1f}s)" if gen_inner \
            else ""
        print(f"generate: {rows[2][3] / 1e6:.2f}M ratings/s for the whole command{inner} (target >= 5M/s)")
    finally:
        if a.dir is None:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
