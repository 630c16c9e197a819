"""Putting an output directory (a store, a model) in place: atomically, and replacing only our own.

Every writer builds its output in a hidden temporary directory beside the
destination and calls :func:`install_dir` to rename it into place, so a failed or
interrupted run leaves nothing at the destination. ``--force`` replaces an existing
destination only if it is the same kind of streamdp output (``is_ours``: a rating
store for ``ingest``/``generate``, a model for ``train``); anything else there (a
file, a symlink, a foreign directory) is an error and is left untouched.

The swap of an existing destination (rename it aside, rename the new one in, delete
the old one) runs with Ctrl-C deferred (:func:`deferred_interrupts`), so it is never
cut in half and leaves nothing hidden behind. The same deferral guards every step
that must not be cut off in the middle (Zarr writes into a temporary directory,
ledger updates, waiting for a pass's worker threads); :func:`interrupts_at_safe_points`
keeps Ctrl-C out of finalizers and llvmlite, where a ``KeyboardInterrupt`` is lost
or leaves a lock held.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
from typing import Callable

from streamdp.errors import StoreError

__all__ = ["check_destination", "install_dir", "deferred_interrupts", "interrupts_at_safe_points"]


def check_destination(path: str | os.PathLike, force: bool, *, what: str, is_ours: Callable[[str], bool]) -> None:
    """Refuse an existing ``path`` unless ``force`` and ``is_ours(path)`` (a ``what``, e.g. "rating store").

    >>> import tempfile, os
    >>> f = os.path.join(tempfile.mkdtemp(), "notes.txt"); _ = open(f, "w").write("mine")
    >>> try:
    ...     check_destination(f, True, what="rating store", is_ours=os.path.isdir)
    ... except StoreError as exc:
    ...     print(str(exc).split(": ", 1)[1])
    exists and is not a streamdp rating store; --force replaces only a rating store, so it was left untouched
    >>> open(f).read()
    'mine'
    """
    path = str(path)
    if not os.path.lexists(path):
        return
    if not force:
        raise StoreError(f"{path}: already exists (use --force to overwrite a streamdp {what})")
    if os.path.islink(path) or not os.path.isdir(path) or not is_ours(path):
        kind = "a symbolic link" if os.path.islink(path) else "not a streamdp " + what
        raise StoreError(f"{path}: exists and is {kind}; --force replaces only a {what}, so it was left untouched")


def install_dir(tmp: str, dest: str, *, force: bool, what: str, is_ours: Callable[[str], bool]) -> None:
    """Rename the finished directory ``tmp`` to ``dest``, replacing an existing ``dest`` of ours if ``force``.

    ``dest`` is checked again here (:func:`check_destination`), right before the
    swap. On an error ``tmp`` is left for the caller to remove and ``dest`` is as it
    was.
    """
    with deferred_interrupts():
        if not os.path.lexists(dest):
            os.rename(tmp, dest)
            return
        check_destination(dest, force, what=what, is_ours=is_ours)
        trash = tmp + ".old"
        os.rename(dest, trash)
        try:
            os.rename(tmp, dest)
        except BaseException:
            os.rename(trash, dest)
            raise
        shutil.rmtree(trash)


#: Re-delivery delay of a Ctrl-C that arrived at an unsafe point (see :func:`interrupts_at_safe_points`).
_REDELIVER_SECONDS = 0.05


def _unsafe_point(frame) -> bool:
    """Whether the main thread is inside a finalizer or inside llvmlite (Numba's LLVM binding)."""
    while frame is not None:
        if frame.f_code.co_name == "__del__" or str(frame.f_globals.get("__name__", "")).startswith("llvmlite"):
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def interrupts_at_safe_points():
    """Ctrl-C raises ``KeyboardInterrupt`` as usual, except where that would do harm: there it is re-sent later.

    Raised inside a finalizer (``__del__``) a ``KeyboardInterrupt`` is printed as
    "Exception ignored" and lost; raised inside llvmlite (which Numba calls when it
    compiles or loads a cached kernel, also from the finalizers of its objects) it
    can leave llvmlite's global lock held, and the next kernel call in any thread
    waits forever. At such a point the signal is sent again 50 ms later. Used by the
    CLI around every command (main thread only).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if _unsafe_point(frame):
            t = threading.Timer(_REDELIVER_SECONDS, os.kill, (os.getpid(), signal.SIGINT))
            t.daemon = True
            t.start()
            return
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def deferred_interrupts():
    """Hold Ctrl-C (SIGINT) until the block has finished, then raise it (``KeyboardInterrupt``).

    For short steps that must not be cut in half (a rename pair, a ledger update).
    Outside the main thread (where signals cannot be handled) it does nothing. If
    the block raises, that exception propagates and a held Ctrl-C is dropped.

    >>> with deferred_interrupts():
    ...     pass
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if held:
        if callable(previous):
            previous(signal.SIGINT, None)  # the default handler raises KeyboardInterrupt
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt
