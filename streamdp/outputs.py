"""Putting an output directory (a store, a model) in place: atomically, and replacing only our own.

Every writer builds its output in a hidden temporary directory beside the
destination and calls :func:`install_dir` to rename it into place, so a failed or
interrupted run leaves nothing at the destination. ``--force`` replaces an existing
destination only if it is the same kind of streamdp output (``is_ours``: a rating
store for ``ingest``/``generate``, a model for ``train``); anything else there (a
file, a symlink, a foreign directory) is an error and is left untouched.

The swap of an existing destination (rename it aside, rename the new one in, delete
the old one) runs with Ctrl-C and SIGTERM deferred (:func:`deferred_interrupts`), so
it is never cut in half and leaves nothing hidden behind. The same deferral guards
every step that must not be cut off in the middle (Zarr writes into a temporary
directory, ledger updates, waiting for a pass's worker threads);
:func:`interrupts_at_safe_points` turns SIGTERM into the same interrupt as Ctrl-C,
raises it once, and keeps it out of finalizers and llvmlite, where a
``KeyboardInterrupt`` is lost or leaves a lock held.

Temporary directories (:func:`owned_temp_dir`) are named ``.DEST.<kind>-<hex>`` beside
their destination and record their owner (``owner.json``, :mod:`streamdp.owner`) from
the moment they exist; :func:`install_dir` removes that record right before the
rename, so it never reaches an output. A run killed with ``kill -9`` (or a power loss)
cannot remove its temporary directory, so the next :func:`owned_temp_dir` beside the
same destination (the next ``ingest``, ``generate`` or ``train`` writing there) removes
those whose owner is provably gone (:func:`sweep_dead_temp_dirs`) and says so on
stderr. A live run's, another host's and ownerless ones (left by a version that did not
record owners: their process cannot be told dead) are left alone.

A write that fails because the file system is full, over quota or read-only
(:data:`NO_SPACE_ERRNOS`) is a user's problem, not a bug: the writers remove their
temporary directory and raise :func:`no_space_error` (one line naming the destination);
the CLI turns any other such ``OSError`` that reaches it into the same line
(:func:`describe_no_space`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import signal
import sys
import threading
import time
import uuid
from typing import Callable

from streamdp.errors import StoreError
from streamdp.owner import OWNER_FILE, owner_status, read_owner_file, write_owner_file

__all__ = ["check_destination", "install_dir", "deferred_interrupts", "interrupts_at_safe_points", "interrupt_signal",
           "interrupt_exit_code", "INTERRUPT_SIGNALS",
           "owned_temp_dir", "sweep_dead_temp_dirs", "remove_temp_dir", "NO_SPACE_ERRNOS", "is_no_space",
           "no_space_error", "no_space_reason", "describe_no_space", "note"]


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
        _drop_owner(tmp)
        if not os.path.lexists(dest):
            os.rename(tmp, dest)
            _PENDING.pop(os.path.abspath(tmp), None)
            return
        check_destination(dest, force, what=what, is_ours=is_ours)
        trash = tmp + ".old"
        os.rename(dest, trash)
        try:
            os.rename(tmp, dest)
        except BaseException:
            os.rename(trash, dest)
            raise
        _PENDING.pop(os.path.abspath(tmp), None)
        try:  # a kill -9 while a large old output is being deleted leaves it to the next run's sweep
            write_owner_file(trash)
        except OSError:
            pass
        shutil.rmtree(trash)


# ---------------------------------------------------------------------------------------
# temporary directories with an owner, and the sweep of dead runs' leftovers
# ---------------------------------------------------------------------------------------

#: Kinds of temporary directories beside a destination: ``tmp`` (the output being built), ``ingest`` (spills).
TEMP_KINDS = ("tmp", "ingest")
#: Temporary directories of this process not yet installed or removed: absolute path -> destination.
_PENDING: dict[str, str] = {}


def _temp_name_re(dest: str) -> re.Pattern:
    """Names of the temporary directories beside ``dest`` (also the ``.old`` of an interrupted swap)."""
    base = re.escape(os.path.basename(dest))
    return re.compile(rf"\.{base}\.(?:{'|'.join(TEMP_KINDS)})-[0-9a-f]{{8,32}}(?:\.old)?")


def _drop_owner(directory: str) -> None:
    try:
        os.remove(os.path.join(directory, OWNER_FILE))
    except FileNotFoundError:
        pass


def note(message: str) -> None:
    """One line on stderr, ``note: MESSAGE`` (like the CLI's notes)."""
    sys.stderr.write(f"note: {message}\n")
    sys.stderr.flush()


def sweep_dead_temp_dirs(dest: str | os.PathLike) -> list[str]:
    """Remove the temporary directories beside ``dest`` whose owning process is gone; return their paths.

    Only ``.DEST.tmp-<hex>``, ``.DEST.ingest-<hex>`` (and ``.old`` of a swap) whose
    ``owner.json`` says a process that is provably gone (:func:`streamdp.owner.owner_status`)
    are removed: a live run's, another host's (cannot be told) and those without an
    owner record are left alone.

    >>> import tempfile, json, socket
    >>> d = tempfile.mkdtemp(); dead = os.path.join(d, ".s.zarr.tmp-0123456789ab"); os.mkdir(dead)
    >>> gone = {"pid": 2**22 + 1, "host": socket.gethostname()}  # above Linux's largest pid: no such process
    >>> _ = open(os.path.join(dead, "owner.json"), "w").write(json.dumps(gone))
    >>> live = os.path.join(d, ".s.zarr.ingest-00000000"); os.mkdir(live); write_owner_file(live)
    >>> [os.path.basename(p) for p in sweep_dead_temp_dirs(os.path.join(d, "s.zarr"))], os.path.isdir(live)
    (['.s.zarr.tmp-0123456789ab'], True)
    """
    dest = os.path.abspath(os.fspath(dest))
    pattern = _temp_name_re(dest)
    return remove_dead_owned_dirs(os.path.dirname(dest) or ".",
                                  lambda name, d: pattern.fullmatch(name) is not None and d not in _PENDING)


def remove_dead_owned_dirs(parent: str, candidate=lambda name, path: True) -> list[str]:
    """Remove the directories in ``parent`` (``candidate(name, path)`` true) whose ``owner.json`` owner is gone.

    A live owner's, another host's (cannot be told), one without an owner record and
    symbolic links are left alone. Returns the removed paths.
    """
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        return []
    removed = []
    for name in names:
        d = os.path.join(parent, name)
        if os.path.islink(d) or not os.path.isdir(d) or not candidate(name, d):
            continue
        if owner_status(read_owner_file(d)) == "gone":
            shutil.rmtree(d, ignore_errors=True)
            if not os.path.lexists(d):
                removed.append(d)
    return removed


def owned_temp_dir(dest: str | os.PathLike, kind: str = "tmp") -> str:
    """Create a hidden temporary directory ``.DEST.<kind>-<hex>`` beside ``dest`` owned by this process.

    Its ``owner.json`` (:func:`streamdp.owner.write_owner_file`) lets a later run tell
    whether it was left by a dead process; :func:`install_dir` removes it before the
    rename. First the temporary directories of dead runs beside ``dest`` are removed
    (:func:`sweep_dead_temp_dirs`) and a note saying which is printed on stderr.

    Decision: the note is printed here, by the library, rather than returned: the
    writers that call this (``StoreWriter``, ``ingest``, ``save_model``) return a
    store or a model path, and the housekeeping is a fact about the file system that
    the user should see from the CLI and the Python API alike.
    """
    if kind not in TEMP_KINDS:
        raise ValueError(f"kind must be one of {TEMP_KINDS}, got {kind!r}")
    dest = os.path.abspath(os.fspath(dest)).rstrip(os.sep) or os.sep
    parent = os.path.dirname(dest) or "."
    os.makedirs(parent, exist_ok=True)
    removed = sweep_dead_temp_dirs(dest)
    if removed:
        many = len(removed) > 1
        note(f"removed {len(removed)} temporary director{'ies' if many else 'y'} left by "
              f"{'processes that are' if many else 'a process that is'} gone: {', '.join(removed)}")
    for old in [t for t in _PENDING if not os.path.lexists(t)]:  # earlier failures, already reported
        del _PENDING[old]
    tmp = os.path.join(parent, f".{os.path.basename(dest)}.{kind}-{uuid.uuid4().hex[:12]}")
    os.mkdir(tmp)
    _PENDING[tmp] = dest
    try:
        write_owner_file(tmp)
    except BaseException:
        remove_temp_dir(tmp)
        raise
    return tmp


#: How long :func:`remove_temp_dir` watches for a temporary directory recreated by late writes.
_SETTLE_SECONDS = 0.2


def remove_temp_dir(tmp: str, *, settle: bool = False) -> None:
    """Remove a temporary directory (idempotent, never raises).

    ``settle``: after an error in a Zarr write, other chunk writes of the same call may
    still be running on Zarr's I/O threads (``asyncio.gather`` does not wait for them),
    and one of them can recreate the directory (``mkdir(parents=True)``) after it was
    removed; it is then removed again, for up to :data:`_SETTLE_SECONDS`.
    """
    shutil.rmtree(tmp, ignore_errors=True)
    if settle:
        end = time.monotonic() + _SETTLE_SECONDS
        while time.monotonic() < end:
            time.sleep(0.02)
            if os.path.lexists(tmp):
                shutil.rmtree(tmp, ignore_errors=True)
    _PENDING.pop(os.path.abspath(tmp), None)


# ---------------------------------------------------------------------------------------
# full disks: one line, not a traceback
# ---------------------------------------------------------------------------------------

#: errno values that mean the file system takes no more data: full, over quota, read-only, or a file past the
#: largest size allowed (EFBIG: `ulimit -f`, or the file system's own limit).
NO_SPACE_ERRNOS = frozenset(e for e in (errno.ENOSPC, getattr(errno, "EDQUOT", None), errno.EROFS, errno.EFBIG)
                            if e is not None)

_ERRNO_IN_TEXT = re.compile(r"\[errno (\d+)\]", re.IGNORECASE)


def _errno_of(exc: BaseException) -> int | None:
    """The errno of an ``OSError``; pyarrow's I/O errors may carry it only in their text."""
    if not isinstance(exc, OSError):
        return None
    if exc.errno is not None:
        return exc.errno
    m = _ERRNO_IN_TEXT.search(str(exc))
    return int(m.group(1)) if m else None


def is_no_space(exc: BaseException) -> bool:
    """Whether ``exc`` is an ``OSError`` of a full, over-quota or read-only file system.

    >>> is_no_space(OSError(errno.ENOSPC, "No space left on device")), is_no_space(OSError(errno.EIO, "I/O"))
    (True, False)
    """
    return _errno_of(exc) in NO_SPACE_ERRNOS


def no_space_reason(exc: OSError) -> str:
    """``No space left on device (ENOSPC)``: the reason of a failed write, for a message."""
    e = _errno_of(exc)
    return f"{os.strerror(e)} ({errno.errorcode.get(e, e)})" if e is not None else str(exc)


def no_space_error(exc: OSError, dest: str | os.PathLike) -> StoreError:
    """The one-line error for a write to ``dest`` that failed with ``exc`` (see :func:`is_no_space`).

    To be raised after the writer has removed its temporary files.

    >>> print(no_space_error(OSError(errno.ENOSPC, "No space left on device"), "/data/r.zarr"))
    ... # doctest: +NORMALIZE_WHITESPACE
    /data/r.zarr: cannot write: No space left on device (ENOSPC); nothing was written there and the temporary
    files were removed (outputs are written all or nothing)
    """
    return StoreError(f"{os.fspath(dest)}: cannot write: {no_space_reason(exc)}; nothing was written there and "
                      f"the temporary files were removed (outputs are written all or nothing)")


def _no_space_target(exc: OSError) -> str | None:
    """The destination a failed write belongs to (see :func:`describe_no_space`)."""
    name = getattr(exc, "filename", None)
    if name:
        name = os.path.abspath(os.fspath(name))
        for tmp, d in _PENDING.items():
            if name == tmp or name.startswith(tmp + os.sep):
                return d
        return name
    return next(reversed(_PENDING.values())) if _PENDING else None


def describe_no_space(exc: BaseException) -> str | None:
    """The one-line message for an ``OSError`` of a full/over-quota/read-only file system, else None.

    Names the destination whose temporary directory the failed file was in (or, when
    the error names no file, the destination this process was writing); a file outside
    any temporary directory (a ledger's ``privacy_budget.json``) is named itself. Every
    writer replaces its file or directory atomically, so nothing is half-written. When
    handling the first failure failed too for want of space (a run that records the
    failed write in the store's ledger, on the same full disk), the first failure is
    the error and the later file is named as left as it was.

    >>> first = OSError(errno.ENOSPC, "No space left on device", "/m/.model.tmp-x/model.json")
    >>> try:
    ...     try:
    ...         raise first
    ...     except OSError:
    ...         raise OSError(errno.ENOSPC, "No space left on device", "/s.zarr/privacy_budget.json")
    ... except OSError as exc:
    ...     print(describe_no_space(exc))  # doctest: +ELLIPSIS +NORMALIZE_WHITESPACE
    /m/.model.tmp-x/model.json: cannot write: ... (outputs are written all or nothing);
    /s.zarr/privacy_budget.json could not be updated either and was left as it was
    """
    chain, e, seen = [], exc, set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if is_no_space(e):
            chain.append(e)
        e = e.__cause__ or e.__context__
    if not chain:
        return None
    targets = [(_no_space_target(e), e) for e in reversed(chain)]  # the first failure first
    named = [(t, e) for t, e in targets if t is not None]
    if not named:  # no file named and no output of ours being written: claim nothing about what is left
        return (f"a write failed: {no_space_reason(chain[-1])}; free some space (or use a writable place) and run "
                f"it again")
    dest, first = named[0]
    later = []
    for t, _ in named[1:]:
        if t != dest and t not in later:
            later.append(t)
    also = f"; {', '.join(later)} could not be updated either and was left as it was" if later else ""
    return (f"{dest}: cannot write: {no_space_reason(first)}; nothing was written there and the temporary files "
            f"were removed (outputs are written all or nothing){also}")


#: Re-delivery delay of a Ctrl-C that arrived at an unsafe point (see :func:`interrupts_at_safe_points`).
_REDELIVER_SECONDS = 0.05

#: The signals that interrupt a command: Ctrl-C, and ``kill``'s default (how a supervisor, ``timeout`` or a
#: batch system stops a process). Both are held by :func:`deferred_interrupts` and taken at safe points.
INTERRUPT_SIGNALS = (signal.SIGINT, signal.SIGTERM)

#: The interrupt signal delivered to the command running under :func:`interrupts_at_safe_points` (the first).
_DELIVERED: list[int] = []


def interrupt_signal() -> int | None:
    """The signal (SIGINT or SIGTERM) that interrupted the running command, or None."""
    return _DELIVERED[0] if _DELIVERED else None


def interrupt_exit_code(default: int = 130) -> int:
    """``128 + signal`` of the interrupt that was delivered (130 for SIGINT, 143 for SIGTERM), else ``default``.

    Decision: SIGTERM exits 143, not 130, as a shell reports a process stopped by it, so whoever sent it
    (a supervisor, ``timeout``, a batch system) sees its own signal; the process settles exactly as on Ctrl-C.
    """
    sig = interrupt_signal()
    return 128 + int(sig) if sig is not None else default


def _unsafe_point(frame) -> bool:
    """Whether the main thread is inside a finalizer or inside llvmlite (Numba's LLVM binding)."""
    while frame is not None:
        if frame.f_code.co_name == "__del__" or str(frame.f_globals.get("__name__", "")).startswith("llvmlite"):
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def interrupts_at_safe_points(*, ignore_after_exit: bool = False):
    """Ctrl-C and SIGTERM raise ``KeyboardInterrupt``, once, and not where that would do harm.

    Raised inside a finalizer (``__del__``) a ``KeyboardInterrupt`` is printed as
    "Exception ignored" and lost; raised inside llvmlite (which Numba calls when it
    compiles or loads a cached kernel, also from the finalizers of its objects) it
    can leave llvmlite's global lock held, and the next kernel call in any thread
    waits forever. At such a point the signal is sent again 50 ms later.

    SIGTERM is taken like Ctrl-C (its default, dying on the spot, left a budget
    reservation unsettled and temporary directories behind); :func:`interrupt_exit_code`
    tells the CLI which one came. Only the first is raised: from then on SIGINT and
    SIGTERM are ignored (``SIG_IGN``) while the command unwinds, settles its budget entry
    and removes its temporary files (a second ``KeyboardInterrupt`` there left the entry
    ``reserved`` under a message saying nothing was released). With ``ignore_after_exit``
    (the CLI, whose process exits next) they stay ignored after the block: Python keeps
    ``SIG_IGN`` during its shutdown, where it gives signals with Python handlers their
    default action back (a burst of Ctrl-C outlasting a quick settlement killed the
    process after its line, or printed a traceback). Without it the handlers in place
    before are restored. ``kill -9`` remains for a process that must stop at once. Used
    by the CLI around every command (main thread only).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _DELIVERED.clear()

    def handler(signum, frame):
        if _DELIVERED:
            return  # already on the way out (a re-sent signal, or one held by deferred_interrupts)
        if _unsafe_point(frame):
            t = threading.Timer(_REDELIVER_SECONDS, os.kill, (os.getpid(), signum))
            t.daemon = True
            t.start()
            return
        _DELIVERED.append(signum)
        for s in INTERRUPT_SIGNALS:  # settle once: the later ones are dropped by the OS
            signal.signal(s, signal.SIG_IGN)
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, handler) for s in INTERRUPT_SIGNALS}
    try:
        yield
    finally:
        if not (_DELIVERED and ignore_after_exit):
            for s, p in previous.items():
                signal.signal(s, p if p is not None else signal.SIG_DFL)


@contextlib.contextmanager
def deferred_interrupts():
    """Hold Ctrl-C and SIGTERM until the block has finished, then deliver the first of them.

    For short steps that must not be cut in half (a rename pair, a ledger update).
    Outside the main thread (where signals cannot be handled) it does nothing. If
    the block raises, that exception propagates and a held signal is dropped. A held
    signal goes to the handler that was in place (the CLI's raises ``KeyboardInterrupt``);
    Python's default for SIGINT raises ``KeyboardInterrupt``, the default for SIGTERM
    ends the process (re-sent to itself once the block is done).

    >>> with deferred_interrupts():
    ...     pass
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = []
    previous = {s: signal.signal(s, lambda signum, frame: held.append(signum)) for s in INTERRUPT_SIGNALS}
    try:
        yield
    finally:
        for s, p in previous.items():
            signal.signal(s, p if p is not None else signal.SIG_DFL)
    if held:
        sig = held[0]
        p = previous[sig]
        if callable(p):
            p(sig, None)  # the CLI's handler, or Python's default SIGINT handler: raises KeyboardInterrupt
        elif p in (signal.SIG_DFL, None):
            if sig == signal.SIGINT:
                raise KeyboardInterrupt
            os.kill(os.getpid(), sig)  # its default action, now that the block is done
