"""Thread budget: Dask workers x Numba threads x BLAS threads never exceed the cores.

Nothing here changes a global setting at import. :func:`thread_limits` is a context
manager that sets Numba's (thread-local) thread count and the BLAS/OpenMP pools
(through threadpoolctl) and restores both on exit, so a library call never leaves the
process configured differently from how it found it.
"""

from __future__ import annotations

import contextlib
import os

from streamdp.errors import ParameterError


def available_cores() -> int:
    """Cores this process may run on (the affinity mask when the OS exposes it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def thread_budget(workers: int | None, cores: int | None = None) -> tuple[int, int]:
    """``(workers, inner_threads)`` with ``workers * inner_threads <= cores``.

    ``workers`` defaults to all cores; every worker then runs its kernels (Numba,
    BLAS) single-threaded. Asking for more workers than cores is allowed (I/O bound
    stores) but the inner thread count stays 1.

    >>> thread_budget(None, cores=8)
    (8, 1)
    >>> thread_budget(2, cores=8)
    (2, 4)
    """
    cores = cores or available_cores()
    if workers is None:
        workers = cores
    workers = int(workers)
    if workers < 1:
        raise ParameterError(f"--workers must be >= 1, got {workers}")
    return workers, max(1, cores // workers)


@contextlib.contextmanager
def thread_limits(inner_threads: int):
    """Run the body with Numba and BLAS limited to ``inner_threads`` threads.

    Numba's setting is thread-local (restored in ``finally``); the BLAS limit is
    process-wide through threadpoolctl and restored on exit.
    """
    import numba

    n = max(1, min(int(inner_threads), numba.config.NUMBA_NUM_THREADS))
    old = numba.get_num_threads()
    numba.set_num_threads(n)
    try:
        with _controller().limit(limits=n):
            yield n
    finally:
        numba.set_num_threads(old)


_CONTROLLER: list = [None, -1]


def _controller():
    """threadpoolctl's view of the loaded BLAS/OpenMP pools, made again only when modules were imported since.

    Making one walks every loaded shared library (4-6 ms: it was 5% of a small store's training, called
    around every pass); a new pool can only arrive with a new import (or ctypes, which streamdp does not use).
    """
    import sys

    from threadpoolctl import ThreadpoolController

    if _CONTROLLER[0] is None or _CONTROLLER[1] != len(sys.modules):
        _CONTROLLER[:] = [ThreadpoolController(), len(sys.modules)]
    return _CONTROLLER[0]


@contextlib.contextmanager
def numba_threads(n: int):
    """Only Numba's thread-local thread count (cheap: used around every block task)."""
    import numba

    n = max(1, min(int(n), numba.config.NUMBA_NUM_THREADS))
    old = numba.get_num_threads()
    numba.set_num_threads(n)
    try:
        yield n
    finally:
        numba.set_num_threads(old)
