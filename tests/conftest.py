"""Shared fixtures: small generated stores, the path to ../shared/data, the in-process CLI of the hostile-input tests;
the default parallel run; the PLD epsilons shared by the test processes (``STREAMDP_TEST_FRESH_PLD=1``: not)."""

from __future__ import annotations

import hashlib
import os
import signal
import sqlite3
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("STREAMDP_SHARED_DATA", REPO.parent / "shared" / "data"))

if sys.dont_write_bytecode and not sys.pycache_prefix:
    # PYTHONDONTWRITEBYTECODE=1 (set on our CI machines) made every run, in every xdist worker, rewrite the asserts
    # of ~300 test modules and compile them and the package again: 6 s of each worker's start (10.6 s to collect
    # against 4.8 s with the bytecode kept). It is kept, but out of the source tree (whose __pycache__ the setting
    # keeps clean): under pytest's own cache directory, where pytest's rewritten modules go too.
    sys.pycache_prefix = str(REPO / ".pytest_cache" / "pycache")
    sys.dont_write_bytecode = False


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """Run on every core and one worker more by default (``-n CORES+1 --dist worksteal``) when pytest-xdist is
    installed: part of the suite waits on the processes it starts, on fsync and on sleeps, and a third worker on
    2 cores fills those waits (the warm default run: 208 s with 2 workers, 196 s with 3, the same CPU).

    It is set here, not in addopts, so that ``-p no:xdist`` (where ``-n`` is unknown) and a plain
    ``python -m pytest tests/x.py`` both keep working; an explicit ``-n`` (``-n 0``: serial) wins, and
    ``--pdb`` stays serial. worksteal hands out contiguous runs of tests (module fixtures are made
    once per worker, mostly) and rebalances when one worker runs out. The workers themselves (which
    also call this hook) are left alone.
    """
    if (not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput")
            or os.environ.get("PYTEST_XDIST_WORKER") or config.getoption("usepdb", False)):
        return
    if config.option.numprocesses is None:
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):  # pragma: no cover - not Linux
            cores = os.cpu_count() or 1
        config.option.numprocesses = cores + 1
    if config.option.dist == "no":
        config.option.dist = "worksteal"


def pytest_configure(config):
    """Give each xdist worker its share of the cores for BLAS (unless the environment already says).

    The workers (and the ``streamdp`` processes tests start) inherit the environment. Two
    workers each running OpenBLAS on every core spin against each other: the svd contract
    tests took 11.5 s of CPU with OpenBLAS's default threads against 4.8 s with one, under
    load (streamdp's engine limits BLAS inside its tasks, not around a method's final solve).
    """
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # a run started in the background of a shell without job control inherits Ctrl-C ignored (and so do the
        # xdist workers and the streamdp processes the tests start): the interrupt tests need Python's default
        signal.signal(signal.SIGINT, signal.default_int_handler)
    workers = config.getoption("numprocesses", None) if config.pluginmanager.hasplugin("xdist") else None
    if isinstance(workers, int) and workers > 1 and not hasattr(config, "workerinput"):
        share = str(max(1, (os.cpu_count() or 1) // workers))
        for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(name, share)
    if not os.environ.get("STREAMDP_TEST_FRESH_PLD"):
        _share_pld_epsilons(config)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _compile_once_across_workers()


def _compile_once_across_workers() -> None:
    """Have the xdist workers compile each Numba function one at a time, so that the ones that come second load
    what the first wrote to the cache instead of compiling it again.

    On a cold cache the workers start on the same kinds of tests and race: the last cold run compiled the
    selection's kernel twice and ``synth_block`` three times, 33 s of its 256 s of compile CPU. A worker about to
    compile a function takes a file lock named after it (``fcntl.flock``, held while it compiles); Numba's own
    ``Dispatcher.compile`` looks in its cache first, so a worker that waited finds the other's result there. The
    lock is taken inside Numba's own (one compile at a time in a process), and a function compiling its callees
    takes their locks inside its own, in the order of the call graph, which has no cycles: no two workers can
    wait on each other. Only the test workers do this, not streamdp or the processes the tests start.
    """
    try:
        import fcntl

        from numba.core.compiler_lock import global_compiler_lock
        from numba.core.dispatcher import Dispatcher
    except ImportError:  # pragma: no cover - not POSIX, or another Numba
        return
    compile_ = getattr(Dispatcher, "compile", None)
    if compile_ is None or getattr(compile_, "_streamdp_once", False):
        return
    locks = Path(os.environ.get("TMPDIR", "/tmp")) / f"streamdp-numba-locks-{os.getuid()}"
    locks.mkdir(exist_ok=True)
    held: set[str] = set()  # the locks this process holds (a function may be compiled inside its own compile)

    def compile_once(self, sig):
        name = f"{getattr(self.py_func, '__module__', '')}.{getattr(self.py_func, '__qualname__', '')}"
        if name in held:
            return compile_(self, sig)
        with global_compiler_lock, open(locks / hashlib.sha1(name.encode()).hexdigest()[:24], "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            held.add(name)
            try:
                return compile_(self, sig)
            finally:
                held.discard(name)
                fcntl.flock(f, fcntl.LOCK_UN)

    compile_once._streamdp_once = True
    Dispatcher.compile = compile_once


class _SharedPLDEpsilons(dict):
    """:data:`streamdp.privacy.accountant._PLD_EPSILONS` (the process's remembered PLD epsilons), backed by one
    SQLite file that every xdist worker, and the next run, reads and adds to.

    A PLD epsilon is a pure function of its key (the event's ``repr``, the grid, delta): the accountant's
    docstring. Most of what the suite spent was PLD calibration of the same small releases, in both workers
    and again in every run. The file's table is named by a hash of the accountant's source and the
    dp-accounting and numpy versions, so a change to either computes afresh; a value is stored as its
    ``repr`` (exact, inf included). Only the test processes use it: the ``streamdp`` processes tests start,
    and streamdp itself, compute as before. A test's own threads may calibrate too (two budget reservations
    racing): the connection is shared across threads, one statement at a time (SQLite's default refused it in
    any thread but the one that opened it, and the racing test failed whenever it was first to need its epsilon).
    """

    def __init__(self, path: Path, table: str):
        super().__init__()
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, timeout=60, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._table = table
        self._db.execute(f"CREATE TABLE IF NOT EXISTS {table} (key TEXT PRIMARY KEY, eps TEXT)")

    def get(self, key, default=None):
        eps = super().get(key)
        if eps is None:
            with self._lock:
                row = self._db.execute(f"SELECT eps FROM {self._table} WHERE key = ?", (repr(key),)).fetchone()
            if row is None:
                return default
            eps = float(row[0])
            super().__setitem__(key, eps)
        return eps

    def __setitem__(self, key, eps):
        super().__setitem__(key, eps)
        with self._lock:
            self._db.execute(f"INSERT OR IGNORE INTO {self._table} VALUES (?, ?)", (repr(key), repr(float(eps))))


def _share_pld_epsilons(config) -> None:
    """Install :class:`_SharedPLDEpsilons` in this test process (the file under pytest's cache directory)."""
    from importlib.metadata import version

    try:
        import numpy

        from streamdp.privacy import accountant
    except ImportError:
        return
    if not isinstance(getattr(accountant, "_PLD_EPSILONS", None), dict):
        return
    stamp = "|".join([Path(accountant.__file__).read_text(), version("dp-accounting"),
                        numpy.__version__])
    table = "pld_" + hashlib.sha256(stamp.encode()).hexdigest()[:16]
    where = Path(str(config.rootpath)) / ".pytest_cache"
    try:
        where.mkdir(exist_ok=True)
        accountant._PLD_EPSILONS = _SharedPLDEpsilons(where / "streamdp-pld-epsilons.sqlite", table)
    except (OSError, sqlite3.Error):  # a read-only checkout: each process remembers its own, as streamdp does
        pass


#: A small process that runs its arguments (under an address-space limit when one is given, killed past a timeout
#: when one is given) and writes their peak RSS (``ru_maxrss``, KiB) to the file named first.
_RSS_LAUNCHER = """
import os, resource, subprocess, sys, time
path, limit, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
if limit:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
p, t0 = subprocess.Popen(sys.argv[4:]), time.monotonic()
while True:
    pid, status, usage = os.wait4(p.pid, os.WNOHANG)
    if pid:
        break
    if timeout and time.monotonic() - t0 > timeout:
        p.kill()
        pid, status, usage = os.wait4(p.pid, 0)
        break
    time.sleep(0.02)
open(path, "w").write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def peak_rss(cmd: list, *, as_limit: int = 0, timeout: float = 0, **popen) -> tuple[int, str, str, int]:
    """Run ``cmd``: ``(returncode, stdout, stderr, peak RSS in bytes)``, the peak by ``wait4`` in a small launcher
    (which sets ``as_limit``, an address-space limit, and kills ``cmd`` past ``timeout`` seconds, when given).

    Not by ``wait4`` here: a child spawned by this (large) test worker has the worker's address space until it
    execs, and Linux counts that space's high-water mark into the child's ``ru_maxrss`` (an ials test "peaked" at
    709 MiB, the worker's RSS after the slow tests before it, where the run itself takes 370). The launcher is a
    bare interpreter of ~10 MB, which is all its own child can inherit.
    """
    import subprocess
    import tempfile

    fd, f = tempfile.mkstemp(prefix="maxrss-", suffix=".txt")
    os.close(fd)
    try:
        p = subprocess.run([sys.executable, "-c", _RSS_LAUNCHER, f, str(int(as_limit)), str(float(timeout)),
                            *map(str, cmd)], capture_output=True, **popen)
        return p.returncode, p.stdout.decode(), p.stderr.decode(), int(Path(f).read_text() or 0) * 1024
    finally:
        os.remove(f)


def flat(d: dict, prefix: str = "") -> dict:
    """A nested dict's leaves by dotted path (``{"a": {"b": 1}} -> {"a.b": 1}``; an empty dict is a leaf)."""
    out = {}
    for k, v in d.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flat(v, path + "."))
        else:
            out[path] = v
    return out


def shared_file(*parts: str) -> Path:
    """A file under ../shared/data, or skip the test with the reason."""
    p = SHARED_DATA.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"real data not available: {p} is absent (../shared/data is not part of the repo)")
    return p


def real_store(tmp_path, name: str, *, seed: int = 0, **kw):
    """``ml-100k`` or ``filmtrust`` ingested with a 20% per-user split and its items declared
    (:func:`bench.declared_items`: the peers these tests compare with see every item); skips when absent."""
    from bench import declared_items
    from streamdp.storage.ingest import ingest

    parts, rr = {"ml-100k": (("ml-100k", "u.data"), (1, 5)), "filmtrust": (("filmtrust", "ratings.txt"), (0.5, 4))}[name]
    path = str(shared_file(*parts))
    return ingest([path], str(tmp_path / f"{name}.zarr"), test_fraction=0.2, seed=seed, rating_range=rr,
                  items=declared_items(path, str(tmp_path)), **kw)


@pytest.fixture(scope="session")
def small_store(tmp_path_factory):
    """A generated store with a 20% test split: 3000 users, 400 items, rank 4, several blocks."""
    from streamdp.storage.generate import generate_store

    path = tmp_path_factory.mktemp("stores") / "small.zarr"
    return generate_store(str(path), n_users=3000, n_items=400, ratings_per_user=30, rank=4, seed=7,
                          test_fraction=0.2, block_users=700)

class Cli:
    """``streamdp ARGS`` in process (:meth:`run`) and the check that a result is one error line (:meth:`error`)."""

    @staticmethod
    def run(*args):
        """``(exit code, stdout, stderr, exception)`` of ``streamdp ARGS``."""
        from streamdp.cli import main

        r = CliRunner().invoke(main, [str(a) for a in args])
        return r.exit_code, r.stdout, r.stderr, r.exception

    @staticmethod
    def error(res, *needles):
        """Assert that ``res`` (from :meth:`run`) is exit code 2 with one ``streamdp: error:`` line holding
        every one of ``needles``, and no traceback."""
        code, _, err, exc = res
        assert code == 2, (code, err, exc)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("streamdp: error: ") and "Traceback" not in err, err
        for n in needles:
            assert n in lines[0], (n, lines[0])


@pytest.fixture(scope="session")
def cli() -> Cli:
    return Cli()
