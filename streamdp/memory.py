"""Memory budget: parsing ``--memory-limit`` and measuring what a process uses.

What a training process holds before its first block (measured, docs/scale.md "Process footprint"):
the interpreter and its imports (NumPy, SciPy, Zarr, Numba, dp-accounting: ~190 MB), what planning
leaves behind (the accountant's PLD arrays, freed but kept by the C allocator until
:func:`release_freed_memory`), and, from the first kernel call on, Numba's code loaded from its cache
(:data:`KERNEL_CODE_BYTES`). The engine sizes its window of blocks from that baseline
(:meth:`streamdp.stream.engine.Engine.blocks_in_flight`). :class:`BufferPool`: a pass's per-block
scratch arrays, reused from block to block instead of mapped afresh.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import re
import sys
import threading

import numpy as np
import psutil

from streamdp.errors import ParameterError

_UNITS = {"": 1, "B": 1, "K": 1e3, "KB": 1e3, "M": 1e6, "MB": 1e6, "G": 1e9, "GB": 1e9, "T": 1e12, "TB": 1e12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}

#: Fraction of the machine's available memory used when no ``--memory-limit`` is given.
DEFAULT_FRACTION = 0.5


def parse_size(text: str | int | float, *, name: str = "--memory-limit") -> int:
    """Parse ``"512MB"``, ``"2GiB"``, ``"1.5G"`` or a number of bytes.

    >>> parse_size("256MB")
    256000000
    >>> parse_size("1GiB")
    1073741824
    """
    if isinstance(text, (int, float)):
        value = int(text)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
        if not m or m.group(2).upper() not in _UNITS:
            raise ParameterError(f"{name}: cannot parse size {text!r} (use e.g. 512MB, 2GB, 1GiB)")
        value = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if value <= 0:
        raise ParameterError(f"{name}: must be positive, got {text!r}")
    return value


def default_memory_limit() -> int:
    """A safe share of the memory available now."""
    return int(psutil.virtual_memory().available * DEFAULT_FRACTION)


def resolve_memory_limit(text: str | None) -> int:
    """``--memory-limit`` value in bytes, or the default when ``None``."""
    return default_memory_limit() if text in (None, "") else parse_size(text)


#: Resident memory the first call of a Numba kernel adds, from its cache or compiled: LLVM's code generator, the
#: kernel's machine code and, for a compilation, Numba's target context (the implementations of every NumPy and
#: Python operation it registers: a kernel loaded from the cache skips it, :mod:`streamdp.kernels.jit`). Measured
#: 43-48 MB (x86-64 Linux, Numba 0.60: about 31 MB of it libllvmlite's pages) with the context; Numba 0.68, a
#: cached kernel: 36.5 MB without it, 65.6 MB with it. Each further kernel adds under 1 MB. Reserved by the
#: engine until it is paid.
KERNEL_CODE_BYTES = 50_000_000


def kernel_code_loaded() -> bool:
    """Whether this process has paid :data:`KERNEL_CODE_BYTES`: Numba's array implementations are loaded, as every
    compilation and every kernel loaded from the cache that allocates an array loads them. A process that has loaded
    only kernels that allocate nothing counts as not yet having paid, and the engine keeps the reserve (the safe
    side)."""
    return "numba.np.arrayobj" in sys.modules


def kernels_compiled_here() -> int:
    """How many kernel signatures this process compiled rather than loaded from Numba's cache (streamdp's own).

    On a cold cache (a fresh install, a new Numba, edited kernels) a run compiles its kernels and keeps what LLVM
    made of them: after a 2M-rating ALS fit that compiled 76 signatures the process held 487 MB, against 288 MB
    with the kernels loaded from the cache (x86-64 Linux, Numba 0.68; the live C++ heap 220 against 59 MB, so not
    memory ``malloc_trim`` can return). Kernels therefore compile in a helper process (:mod:`streamdp.kernels.jit`)
    and this counts none; it counts those compiled here anyway (``STREAMDP_COMPILE=here``, or a helper that could
    not do it), whose memory the engine names when it runs out of room
    (:meth:`~streamdp.stream.engine.Engine.blocks_in_flight`): the cache keeps them, so the next run does not hold it.
    """
    from numba.core.registry import CPUDispatcher

    n = 0
    for name, mod in list(sys.modules.items()):
        if name.startswith("streamdp.") and mod is not None:
            for v in list(vars(mod).values()):
                if isinstance(v, CPUDispatcher):
                    n += sum(getattr(v, "_cache_misses", {}).values())
    return n


def current_rss() -> int:
    """Resident set size of this process in bytes."""
    return psutil.Process().memory_info().rss


def _libc():
    """The C library's symbols as this process has them loaded (``dlopen(NULL)``), or ``None`` without
    ``malloc_trim`` (not glibc). Not ``ctypes.util.find_library("c")``, which forks ``ldconfig -p`` at every
    import: a fork of the whole process, in every command."""
    try:
        lib = ctypes.CDLL(None)
    except OSError:  # pragma: no cover - no C library to load: nothing to trim
        return None
    return lib if hasattr(lib, "malloc_trim") else None


_LIBC = _libc()


def release_freed_memory() -> None:
    """Give the memory that was freed back to the system (glibc's ``malloc_trim``; a no-op elsewhere).

    glibc keeps freed small and mid-sized allocations (NumPy arrays under its dynamic mmap threshold,
    up to 32 MB) in its heaps, so after planning (the accountant's PLD arrays) or a pass the process's
    RSS stays at its high-water mark. Measured: 7 MB after planning an ALS run on a small store.
    """
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


#: ``mallopt`` parameter number of glibc's mmap threshold (``M_MMAP_THRESHOLD`` in malloc.h).
_M_MMAP_THRESHOLD = -3
#: Allocations of this size or more get their own mapping under :func:`unmap_large_frees`. Above Blosc's
#: scratch: each decompression of a chunk of our stores (512 KB Blosc blocks) allocates just over 1 MB
#: (twice its block) and frees it; at exactly 1 MB every chunk read mapped it afresh and faulted in the pages
#: the decompressor wrote (measured: 130 page faults per items chunk, a third of a 100M-rating ALS fit's
#: 2.0-2.1M faults; at 2 MB the fit took 0.75-0.84M, 4.5-4.9 s of system CPU against 8.9-10.2 s, its
#: peak RSS up by 25-45 MB, docs/scale.md; a threshold of 1.02 MB already kept the faults at 0.79M).
LARGE_ALLOCATION = 2 << 20


def unmap_large_frees(threshold: int = LARGE_ALLOCATION) -> None:
    """Have glibc give every allocation of ``threshold`` bytes or more its own mapping, unmapped when freed
    (``mallopt(M_MMAP_THRESHOLD)``; a no-op elsewhere). Process-wide and kept: it only moves where large
    blocks come from.

    By default glibc raises its mmap threshold to the size of each large block freed (up to 32 MB) and its
    trim threshold to twice that, so that NumPy arrays of a few MB are then carved from the heaps, and every
    thread's arena keeps up to 64 MB of freed heap resident, which :func:`release_freed_memory` between
    passes does not win back (fragments between live blocks). A process whose threads allocate and free
    arrays of a few MB in turn (ingest: parse batches, partition chunks, partitions, blocks) then grows by
    hundreds of MB of freed memory. Measured on a 20M-rating ingest at ``--memory-limit 256MB``: 301 MB
    freed but resident in glibc's arenas at the end, peak RSS 539 MB; with this, 53 MB and 385 MB. Setting
    the threshold turns the dynamic adjustment off for the rest of the process; a mapping per large block
    costs its page faults once, which the block's first write pays anyway.
    """
    if _LIBC is not None and hasattr(_LIBC, "mallopt"):
        _LIBC.mallopt(_M_MMAP_THRESHOLD, int(threshold))


#: ``prctl`` options (linux/prctl.h): whether the process's anonymous memory may be backed by transparent huge pages.
_PR_SET_THP_DISABLE, _PR_GET_THP_DISABLE = 41, 42


@contextlib.contextmanager
def small_pages():
    """Anonymous memory mapped inside the block backed by 4 KB pages, not transparent huge pages (Linux's
    ``prctl(PR_SET_THP_DISABLE)``, process-wide, restored on exit; a no-op elsewhere or where the kernel refuses).

    With the kernel's ``transparent_hugepage`` set to ``always`` (as on this project's hosts), the first touch of
    fresh anonymous memory zeroes a whole 2 MB page: a process that maps many short-lived buffers and touches them
    in part (Arrow's mimalloc pool, Blosc's scratch, file reads into new buffers, per-block arrays) pays for memory
    it never uses. An append of 1% onto a 100M-rating store spent a tenth of its CPU in the kernel's
    ``clear_page`` (``perf``), nearly all under ``do_huge_pmd_anonymous_page``; with small pages its system time
    fell from 0.6-1.0 s to 0.5-0.7 s and its wall time by 0.2-0.3 s of 2.1-2.5 s (alternated runs; a 100M-rating
    ingest, whose buffers are large and written whole, was unchanged, so it keeps the default; a 100M-rating ALS fit,
    whose passes reuse their arrays, is faster on huge pages: 5.9-6.1 s against 6.1-6.7 s on small ones, three
    alternated pairs). Memory already mapped keeps its pages; nothing changes but where the kernel's page faults
    spend their time.
    """
    lib = _LIBC if _LIBC is not None and hasattr(_LIBC, "prctl") else None
    was = lib.prctl(_PR_GET_THP_DISABLE, 0, 0, 0, 0) if lib is not None else -1
    changed = was == 0 and lib.prctl(_PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0
    try:
        yield
    finally:
        if changed:
            lib.prctl(_PR_SET_THP_DISABLE, 0, 0, 0, 0)


@contextlib.contextmanager
def frozen_collector():
    """Leave the objects alive on entry out of the cyclic garbage collector's full collections.

    A full collection traverses every tracked object while holding the GIL. A training process holds about
    190,000 (its imports, and Numba's registries once a kernel has run), so each one took 0.07-0.10 s; two
    fell inside a 100M-rating ALS fit, each stalling both workers at the start of a pass (measured: the pass's
    first read 0.11-0.16 s after its start against 0.01 s). ``gc.freeze()`` moves those objects into the
    permanent generation: the collections of the run traverse only what it creates (one of 0.02 s in that fit).
    The young generations are collected first, so that recent garbage is not frozen. On exit ``gc.unfreeze()``
    gives the objects back to the oldest generation, so that nothing a library caller's run leaves behind
    stays out of reach; where objects were frozen already on entry (the command line freezes its imports,
    :func:`streamdp.cli.run`), they stay frozen, with what this entry froze, for the rest of the process.
    """
    if not gc.isenabled():
        yield
        return
    outer = gc.get_freeze_count() > 0
    gc.collect(1)
    gc.freeze()
    try:
        yield
    finally:
        if not outer:
            gc.unfreeze()


def format_size(n: float) -> str:
    """``format_size(2.5e9) == '2.5 GB'``

    >>> format_size(2.5e9)
    '2.5 GB'
    """
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n}"


class BufferPool:
    """Scratch arrays for a pass's per-block work, reused from one block to the next.

    ``with pool.take() as buf: x = buf("resid", n, np.float64)`` gives ``n`` elements (contents
    left over from an earlier block) of a set of named arrays that no other holder of the pool
    uses until the ``with`` ends; each array grows to the largest size asked of it. A pass holds
    at most as many sets as blocks it computes at once (its workers), each about the size of the
    per-block temporaries it replaces, which the engine's per-rating budget already counts.

    Why: under :func:`unmap_large_frees` (a run whose window the memory limit bounds) every array
    of :data:`LARGE_ALLOCATION` or more is a fresh mapping, paid in page faults as it is first written, and
    unmapped when freed. Measured on 1M-rating blocks of the 100M store, one thread (busy
    machine): an als iteration's training copy, clipped ratings and residuals took 11-12 ns of
    CPU per rating mapped per block; the one compiled pass that replaced them
    (:func:`~streamdp.kernels.als.training_residuals`) 2.4 ns into reused arrays. Nothing taken
    from a pool may outlive its ``with`` (return copies). A pool pickles empty (a cluster's
    workers start their own).
    """

    def __init__(self):
        self._free: list[dict] = []
        self._lock = threading.Lock()

    def __getstate__(self):
        return {"buffers": "not pickled"}  # not empty: an empty state would skip __setstate__

    def __setstate__(self, state):
        self.__init__()

    @contextlib.contextmanager
    def take(self):
        with self._lock:
            bufs = self._free.pop() if self._free else {}
        try:
            yield lambda name, n, dtype: _buffer(bufs, name, int(n), np.dtype(dtype))
        finally:
            with self._lock:
                self._free.append(bufs)


def _buffer(bufs: dict, name: str, n: int, dtype) -> np.ndarray:
    buf = bufs.get(name)
    if buf is None or buf.dtype != dtype or len(buf) < n:
        buf = bufs[name] = np.empty(n, dtype)
    return buf[:n]
