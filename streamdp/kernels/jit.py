"""Numba's ``njit`` for streamdp's kernels, with their compilation done in a helper process.

A process that compiles a kernel keeps what LLVM made of it: after an ALS fit of a 2M-rating store that compiled
76 kernel signatures the process held 487 MB, against 288 MB with the same kernels loaded from Numba's cache (the
live C++ heap 220 against 59 MB: nothing ``malloc_trim`` can give back; :func:`streamdp.memory.kernels_compiled_here`).
On a cold cache (a fresh install, a new Numba, an edited kernel) that is about 200 MB the engine never planned for:
under ``--memory-limit 512MB`` the first run on such a store was refused after 26 s, where the same command run
again took 1.8 s and peaked at 324 MB.

So a kernel's signature that is not in the cache is compiled by a helper (``python -m streamdp.kernels.jit``,
started on the first such signature and kept for the next ones), which writes it into the cache; the process that
needs it then loads it from there, as it would on a warm cache: its memory is that of a warm run, and its results
the same bits (the same compiler, flags and machine code). The helper exits when it has been idle for
:data:`IDLE_SECONDS`, or once it holds :data:`RECYCLE_BYTES`, giving back what compiling held, and is started
again by the next signature to compile.
Anything that keeps the helper from doing it (a kernel that is not a module's attribute, a helper that cannot
start, a cache it could not write: then every later signature too) leaves the compilation here, as Numba does it:
never a different result, at worst one signature compiled twice.

``STREAMDP_COMPILE=here`` compiles in the process (Numba's own behaviour); the helper sets it for itself. Use it
as ``from streamdp.kernels.jit import njit``: the decorator takes Numba's arguments (every kernel passes
``cache=True, nogil=True``).
"""

from __future__ import annotations

import importlib
import os
import pickle
import select
import struct
import subprocess
import sys
import threading

import numba

#: The environment variable that chooses where kernels compile: ``helper`` (the default) or ``here``.
MODE_ENV = "STREAMDP_COMPILE"
#: Seconds the helper waits for another signature before it exits.
IDLE_SECONDS = 10.0
#: The helper's RSS past which it exits after answering (the next signature starts another): what LLVM keeps of
#: each compiled kernel accumulates. A cold default train of a 400,000-rating store: the peak RSS of its process tree
#: 810 MB with one helper, 675 MB recycled at 320 MB (36.1 s), 650 MB at 250 MB (38.5 s: more starts), 612 MB
#: compiling in the run's process (36.0 s), whose own peak is the one ``--memory-limit`` bounds.
RECYCLE_BYTES = 320_000_000
_HEADER = struct.Struct("<Q")


def njit(*args, **kwargs):
    """``numba.njit``, its dispatcher compiling cache misses in the helper (module docstring)."""
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return _hooked(numba.njit(args[0]))
    decorate = numba.njit(*args, **kwargs)
    return lambda fn: _hooked(decorate(fn))


def _hooked(dispatcher):
    """``dispatcher`` with its disk cache asking the helper for a signature it lacks, then looking again.

    The hook is the cache's ``load_overload``, which Numba's ``Dispatcher.compile`` calls before it compiles: so the
    helper is asked only after a real miss, inside whatever wraps ``compile`` (the test workers' lock per function,
    tests/conftest.py), and a signature the helper made is loaded as any cached one (Numba counts a hit)."""
    cache = getattr(dispatcher, "_cache", None)
    load = getattr(cache, "load_overload", None)
    if load is None or not hasattr(cache, "_cache_file"):
        return dispatcher  # no disk cache (cache=False): nothing a helper could hand over
    load = _without_refresh(cache, load)

    def load_overload(sig, target_context):
        got = load(sig, target_context)
        if got is None and isinstance(sig, tuple) and _helper_mode() and _HELPER.compile(dispatcher, sig):
            got = load(sig, target_context)
        return got

    cache.load_overload = load_overload
    return dispatcher


def _without_refresh(cache, load):
    """The cache's ``load_overload`` without its refresh of the target context: what a kernel loaded from the cache
    needs is Numba's runtime (NRT, started here), not the registries of every implementation Numba can lower.

    Numba refreshes the target context before every cache lookup, and the first refresh of a process imports and
    registers all of them (``numba.np.arraymath`` imports ``scipy.linalg``, which imports ``numpy.f2py``; 1,000
    typing templates): 0.22 s of the first kernel call of every command, against 0.026 s for the load itself (a 1%
    append onto a 100M store took 1.3 s in all). A compilation, here or in the helper, refreshes both contexts
    itself (``numba.core.compiler.compile_extra``), so nothing that is compiled misses a registry. A Numba without
    the private ``_load_overload`` gets its own ``load_overload``."""
    inner = getattr(cache, "_load_overload", None)
    guard = getattr(cache, "_guard_against_spurious_io_errors", None)
    try:
        from numba.core.runtime import rtsys
    except ImportError:  # another Numba's layout
        rtsys = None
    if inner is None or guard is None or rtsys is None or not hasattr(rtsys, "initialize"):
        return load

    def load_overload(sig, target_context):
        rtsys.initialize(target_context)  # what the refresh did first: idempotent
        with guard():
            return inner(sig, target_context)
        return None  # the guard swallowed an error (Windows: a cache file another process holds)

    return load_overload


def _helper_mode() -> bool:
    return os.environ.get(MODE_ENV, "helper") != "here"


class _Helper:
    """The client side: one helper process at a time, one signature at a time (a lock)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._proc = None
        self._broken = False  # the helper could not start or answer: compile here from now on

    def compile(self, dispatcher, sig) -> bool:
        """Have the helper compile ``sig`` into the cache; whether it says it did."""
        module, name = dispatcher.py_func.__module__, dispatcher.py_func.__qualname__
        if getattr(sys.modules.get(module), name, None) is not dispatcher:
            return False  # not reachable by name in another process
        try:
            payload = pickle.dumps((module, name, sig), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            return False
        with self._lock:
            for _ in range(2):  # a helper that has just exited idle: start another once
                if self._broken:
                    return False
                proc = self._proc if self._proc is not None and self._proc.poll() is None else self._start()
                if proc is None:
                    return False
                try:
                    proc.stdin.write(_HEADER.pack(len(payload)) + payload)
                    proc.stdin.flush()
                    reply = _read_message(proc.stdout)
                except (OSError, EOFError, pickle.UnpicklingError):
                    self._proc = None
                    _reap(proc)
                    continue
                if reply != "ok":  # it could not (a cache it cannot write, say): from now on, compile here
                    self._broken = True
                return reply == "ok"
            return False

    def _start(self):
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # streamdp's parent
        env = dict(os.environ, **{MODE_ENV: "here"})
        env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        try:
            self._proc = subprocess.Popen([sys.executable, "-m", "streamdp.kernels.jit"], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, env=env, close_fds=True)
        except OSError:
            self._broken, self._proc = True, None
        return self._proc


def _reap(proc) -> None:
    """Collect a helper that left (idle, past its cap): no process of ours is left a zombie."""
    try:
        proc.stdin.close()
        proc.wait(timeout=5)
    except Exception:  # still going after its pipe closed: it ends with it; nothing to wait for here
        pass


_HELPER = _Helper()
# a forked child must not share the parent's helper (two writers on one pipe): its first signature starts its own
if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=lambda: _HELPER.__init__())


def _read_message(stream):
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        raise EOFError("the compile helper closed its pipe")
    (n,) = _HEADER.unpack(head)
    body = stream.read(n)
    if len(body) < n:
        raise EOFError("the compile helper closed its pipe")
    return pickle.loads(body)


def serve(requests=None, replies=None, idle: float = IDLE_SECONDS, recycle: int = RECYCLE_BYTES) -> None:
    """The helper: compile each ``(module, name, signature)`` read from ``requests`` into the cache and answer
    ``"ok"`` (or the error's text); return at end of input, after ``idle`` seconds without a request, or once its
    RSS is past ``recycle`` bytes (after the answer)."""
    from streamdp.memory import current_rss

    requests = requests or sys.stdin.buffer
    replies = replies or sys.stdout.buffer
    while True:
        ready, _, _ = select.select([requests], [], [], idle)
        if not ready:
            return
        try:
            module, name, sig = _read_message(requests)
        except EOFError:
            return
        try:
            kernel = getattr(importlib.import_module(module), name)
            kernel.compile(sig)
            cache = kernel._cache
            stored = cache._index_key(sig, kernel.targetctx.codegen()) in cache._cache_file._load_index()
            reply = "ok" if stored else "compiled but not cached (no cache directory it could write?)"
        except BaseException as e:  # noqa: BLE001 - said to the client, which compiles it itself
            reply = f"{type(e).__name__}: {e}"
        body = pickle.dumps(reply)
        replies.write(_HEADER.pack(len(body)) + body)
        replies.flush()
        if current_rss() > recycle:
            return


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the run's to handle: the helper ends with its pipe
    os.environ[MODE_ENV] = "here"
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")  # the replies' own descriptor: a print cannot corrupt them
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin.buffer, out)
