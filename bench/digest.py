"""What checking every block as it is read costs: a streaming pass with and without the check.

Usage::

    python bench/digest.py                      # 2M ratings
    python bench/digest.py --ratings 20000000 --repeats 7

Generates a store of ``--ratings`` training ratings (50 per user, 20k items, the
default block layout) in a temporary directory, then times, round-robin in the same
run, three ways of reading all of its blocks:

* ``unchecked``: the blocks validated (row pointers, item and rating ranges) but not
  checked against what was written (the reads of streamdp before the check);
* ``chunk crc``: what :meth:`RatingStore.read_block` does on a store written with
  ``block_crc32c``: a CRC32C of each chunk file as read (compressed), compared with
  the one recorded for the block;
* ``digest``: what it does on a store written with block digests only: blake2b of
  the decoded block, compared with ``block_digests``.

Each is timed two ways: a full streaming pass of the engine (``Engine.map_reduce``
over all blocks with a function that only counts, on the default workers: what every
pass of every method pays at least), and a plain loop reading the blocks one after
the other in one thread (no other work to hide the check behind: the worst case).
Each timing repeats its pass for ``--min-seconds`` (a pass of a 2M-rating store
is about 10 ms, less than the jitter of a shared machine); medians of ``--repeats``
rounds, the ratio is the median of the per-round ratios to ``unchecked``. The chunk-CRC pass must be within 5% of the unchecked one (exit code 1
otherwise).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as a file
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LIMIT = 1.05


def _store(path: str, mode: str):
    """The store opened to read its blocks in ``mode`` (bench only: switches the recorded checks off)."""
    from streamdp.storage.store import open_store

    st = open_store(path)
    sp = st._split("train")
    if sp["crc"] is None:
        raise SystemExit(f"{path}: no block_crc32c recorded (google-crc32c without its C implementation?)")
    if mode in ("unchecked", "digest"):
        sp["crc"] = None
    if mode == "unchecked":
        sp["digests"] = None
    return st


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ratings", type=float, default=2e6, help="training ratings of the generated store")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--workers", type=int, default=None, help="engine workers (default: all cores)")
    ap.add_argument("--min-seconds", type=float, default=0.5, help="each timing repeats its pass this long")
    a = ap.parse_args(argv)

    from streamdp.storage.generate import generate_store
    from streamdp.stream.engine import Engine

    d = tempfile.mkdtemp(prefix="streamdp-bench-digest-")
    try:
        n_users = max(1, int(a.ratings) // 50)
        t = time.perf_counter()
        s = generate_store(os.path.join(d, "s.zarr"), n_users=n_users, n_items=20_000, ratings_per_user=50, rank=4,
                           seed=0, show_progress=False)
        print(f"store: {s.n_ratings:,} ratings, {s.n_blocks} blocks of {s.block_users:,} users, "
              f"generated in {time.perf_counter() - t:.1f}s")
        modes = ("unchecked", "chunk crc", "digest")
        stores = {m: _store(s.path, m) for m in modes}
        engines = {m: Engine(stores[m], workers=a.workers) for m in modes}
        times = {(k, m): [] for k in ("pass", "loop") for m in modes}
        cpu = {(k, m): [] for k in ("pass", "loop") for m in modes}
        def one_pass(m):
            assert engines[m].map_reduce(lambda blk, b: blk.nnz, lambda x, y: x + y, 0) == s.n_ratings

        def one_loop(m):
            for b in range(stores[m].n_blocks):
                stores[m].read_block(b)

        t = time.perf_counter()
        for m in modes:  # warm up: page cache, thread pools, imports
            one_pass(m)
        # each timing repeats its pass for >= --min-seconds: a pass of a small store takes ~10 ms, shorter than
        # the jitter of a shared machine
        inner = max(1, int(a.min_seconds / max((time.perf_counter() - t) / len(modes), 1e-4)))
        for _ in range(a.repeats):
            for m in modes:
                for k, fn in (("pass", one_pass), ("loop", one_loop)):
                    t, c = time.perf_counter(), time.process_time()
                    for _ in range(inner):
                        fn(m)
                    times[k, m].append((time.perf_counter() - t) / inner)
                    cpu[k, m].append((time.process_time() - c) / inner)
        for e in engines.values():
            e.close()
        print(f"\n| {'read of all blocks':<42} | {'wall s':>7} | {'M ratings/s':>11} | {'vs unchecked':>12} | "
              f"{'CPU s':>7} | {'CPU vs unchecked':>16} |")
        print(f"|{'-' * 44}|{'-' * 9}|{'-' * 13}|{'-' * 14}|{'-' * 9}|{'-' * 18}|")
        ratio = {}
        for k, what in (("pass", f"engine pass, {engines['unchecked'].workers} workers"),
                        ("loop", "one thread, block after block")):
            for m in modes:
                med, cmed = statistics.median(times[k, m]), statistics.median(cpu[k, m])
                ratio[k, m] = statistics.median(x / y for x, y in zip(times[k, m], times[k, "unchecked"]))
                cr = statistics.median(x / y for x, y in zip(cpu[k, m], cpu[k, "unchecked"]))
                print(f"| {what + ': ' + m:<42} | {med:>7.4f} | {s.n_ratings / med / 1e6:>11.1f} | "
                      f"{ratio[k, m]:>11.3f}x | {cmed:>7.4f} | {cr:>15.3f}x |")
        ok = ratio["pass", "chunk crc"] <= LIMIT
        print(f"\nchunk-CRC check on a full streaming pass: {ratio['pass', 'chunk crc']:.3f}x the unchecked pass "
              f"({'within' if ok else 'NOT within'} {LIMIT - 1:.0%}); medians of {a.repeats} rounds of "
              f"{inner} passes")
        return 0 if ok else 1
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
