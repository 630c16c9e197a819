"""The per-run driver of multi-pass methods: run directory, random families, checkpoints, per-user state.

Every iterative method (``sgd``/``sgld`` epochs, ``als``/``irls`` iterations) needs the
same machinery around its passes, written once here in :class:`Run` (also
:func:`sweep_stale_runs`, :func:`fingerprint`). Decisions a reader must know:

* **run directory**: ``--checkpoint DIR`` (kept, resumed from), else a private temporary
  directory ``STORE.state/<method>-XXXX`` (or under ``--state URL``, reachable by a
  cluster's workers) removed when the run ends; it holds private state; a killed run's
  directory is found by its owner record and removed by :func:`sweep_stale_runs`;
* **randomness**: one root entropy per run, saved with the checkpoint; every use draws
  from its own family ``(purpose, epoch)`` and per group (:meth:`Run.group_rng`), so
  results do not depend on scheduling or blocking and a resumed run continues bit for bit;
* **checkpoints**: after each epoch, atomically, with a fingerprint of the settings; the
  same settings resume, other settings are refused;
* **per-user state**: :meth:`Run.user_state` gives two arrays used alternately by epoch,
  so the last finished epoch's state is always intact; :meth:`Run.epochs` shows progress.

Design notes (each rule in full): docs/design-notes.md#streamdpstreamdriverpy.

Examples
--------
>>> import tempfile
>>> from types import SimpleNamespace
>>> store = SimpleNamespace(path=tempfile.mkdtemp() + "/s.zarr", n_users=10, block_users=4, checksum="x")
>>> with Run(store, method="demo", fingerprint="f", seed=3, rng_key=7) as run:
...     a = run.rng(1, 0).integers(1 << 30)
...     run.save(1, V=np.zeros(2))
>>> with Run(store, method="demo", fingerprint="f", seed=3, rng_key=7) as run:
...     bool(a == run.rng(1, 0).integers(1 << 30)), run.start
(True, 1)
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import tempfile

import numpy as np

from streamdp.errors import ParameterError
from streamdp.outputs import remove_dead_owned_dirs
from streamdp.owner import OWNER_FILE, current_owner, owner_status, write_owner_file
from streamdp.privacy import make_rng, spawn_rngs
from streamdp.progress import progress
from streamdp.stream.state import UserState, absolute_location, is_url, join, remove_tree, state_dir_for

__all__ = ["Run", "fingerprint", "sweep_stale_runs"]

CHECKPOINT_FILE = "checkpoint.npz"


def fingerprint(**parts) -> str:
    """A short hash of a run's settings (JSON of ``parts``, sorted keys, ``str`` for the rest).

    >>> fingerprint(method="als", eps=1.0) == fingerprint(eps=1.0, method="als")
    True
    """
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def sweep_stale_runs(store, state: str | None = None) -> list[str]:
    """Remove the temporary run directories under ``STORE.state/`` (or ``state``) whose owning process is gone.

    Only directories with an ``owner.json`` whose process is provably gone
    (:func:`streamdp.owner.owner_status`) are removed: a live run's, one of another
    host's, a ``--checkpoint`` directory and anything else are left alone. Returns
    the removed paths; ``STORE.state`` itself goes too when that empties it.
    """
    parent = absolute_location(state) if state is not None else state_dir_for(store)
    if is_url(parent):
        return _sweep_url(parent)
    removed = remove_dead_owned_dirs(parent)
    if removed:
        _remove_if_empty(parent)
    return removed


def _sweep_url(parent: str) -> list[str]:
    """:func:`sweep_stale_runs` under an fsspec URL: prefixes ``<method>-XXXX/`` with a dead owner's record."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(parent)
    try:
        names = [p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root, detail=False)]
    except (FileNotFoundError, OSError):
        return []
    removed = []
    for name in sorted(names):
        d = join(parent, name)
        owner = _read_json(join(d, OWNER_FILE))
        if owner is not None and owner_status(owner) == "gone":
            remove_tree(d)
            removed.append(d)
    return removed


def _read_json(url: str):
    import fsspec

    try:
        with fsspec.open(url, "r") as fh:
            d = json.load(fh)
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def _remove_if_empty(directory: str) -> None:
    try:
        os.rmdir(directory)  # only succeeds when nothing else is in it
    except OSError:
        pass


def _write_owner_url(directory: str) -> None:
    """``owner.json`` (:func:`streamdp.owner.current_owner`) under a URL prefix: one object put."""
    import fsspec

    with fsspec.open(join(directory, OWNER_FILE), "w") as fh:
        json.dump(current_owner(), fh)


class Run:
    """One run of a multi-pass method (see the module docstring).

    Parameters
    ----------
    store : RatingStore
        The store trained on (its path places the default run directory).
    method : str
        Method name (prefix of a temporary run directory).
    fingerprint : str
        Hash of everything that must match for a resume (:func:`fingerprint`).
    seed : int or None
        Root entropy of the run's randomness; ``None`` draws 63 bits from the OS.
    rng_key : int
        The method's key: its random families never coincide with another method's.
    checkpoint : str, optional
        ``--checkpoint DIR``: kept and resumed from; default a temporary directory.
    state : str, optional
        ``--state URL``: the root of the temporary run directory (default ``STORE.state``).
    """

    def __init__(self, store, *, method: str, fingerprint: str, seed: int | None, rng_key: int,
                 checkpoint: str | None = None, state: str | None = None):
        self.store = store
        self.method = method
        self.fingerprint = str(fingerprint)
        self.rng_key = int(rng_key)
        self.own_dir = checkpoint is None
        self.url = False
        self._keep_parent = state is not None  # a --state directory is the user's: kept, even when empty
        if checkpoint is None:
            parent = absolute_location(state) if state is not None else absolute_location(state_dir_for(store))
            if is_url(parent):
                self.url = True
                self.dir = join(parent, f"{method}-{secrets.token_hex(6)}")
                try:
                    _write_owner_url(self.dir)
                except BaseException:
                    self.close()
                    raise
            else:
                try:
                    os.makedirs(parent, exist_ok=True)
                except OSError as exc:
                    raise ParameterError(f"--state {parent}: cannot create the state directory "
                                         f"({exc.strerror})") from None
                self.dir = tempfile.mkdtemp(prefix=f"{method}-", dir=parent)
                try:
                    write_owner_file(self.dir)
                except BaseException:
                    self.close()
                    raise
        else:
            self.dir = str(checkpoint)
            try:
                os.makedirs(self.dir, exist_ok=True)
            except OSError as exc:
                raise ParameterError(f"--checkpoint {self.dir}: cannot create the run directory "
                                     f"({exc.strerror})") from None
        self._states: dict[str, list[UserState]] = {}
        # from here on a failure or a Ctrl-C/SIGTERM (the CLI's handler raises wherever the main thread is) must
        # not leave the directory made above behind: the caller's ``with`` has not begun, so nothing else would
        # remove it (seen under load: a signal sent as soon as owner.json appeared landed here)
        try:
            self.path = join(self.dir, CHECKPOINT_FILE)
            self.checkpoint = self._load()
            if self.checkpoint is not None:
                self.entropy = int(self.checkpoint["entropy"])
                self.start = int(self.checkpoint["epoch"]) + 1
                self.run_id = str(self.checkpoint["run_id"])
            else:
                self.entropy = int(seed) if seed is not None else secrets.randbits(63)
                self.start = 1
                self.run_id = self.fingerprint + "-" + secrets.token_hex(4)
        except BaseException:
            self.close()
            raise

    # -- randomness ----------------------------------------------------------------------
    def _family(self, purpose: int, epoch: int) -> int:
        return (self.rng_key << 24) | (int(purpose) << 16) | int(epoch)

    def rng(self, purpose: int, epoch: int) -> np.random.Generator:
        """The one generator of ``(purpose, epoch)``: independent of scheduling and of resumes."""
        return spawn_rngs(self.entropy, 1, key=self._family(purpose, epoch))[0]

    def group_rng(self, purpose: int, epoch: int, group: int) -> np.random.Generator:
        """Generator of global user group ``group``: ``spawn_rngs(entropy, n, key=family)[group]``.

        Built directly from its ``SeedSequence`` (the ``group``-th child of the
        family) instead of spawning all ``n`` streams.
        """
        return make_rng(np.random.SeedSequence(self.entropy, spawn_key=(self._family(purpose, epoch), int(group))))

    # -- checkpoints ---------------------------------------------------------------------
    def _load(self):
        if self.url or not os.path.exists(self.path):  # a run directory under a URL is always a new one
            return None
        try:
            with np.load(self.path) as z:
                d = {k: z[k] for k in z.files}
        except (OSError, ValueError) as exc:
            raise ParameterError(f"{self.path}: unreadable checkpoint ({exc}); use another --checkpoint "
                                 f"directory") from None
        if str(d.get("fp")) != self.fingerprint:
            raise ParameterError(f"{self.path}: a checkpoint of a different run (settings, store or seed differ); "
                                 f"use another --checkpoint directory")
        return d

    def save(self, epoch: int, **arrays) -> None:
        """Write the checkpoint of finished ``epoch`` atomically (temp file + rename)."""
        if self.url:
            return  # a temporary run directory is never resumed (its checkpoint would only cost a write)
        tmp = self.path + ".tmp.npz"
        np.savez(tmp, fp=self.fingerprint, epoch=int(epoch), entropy=self.entropy, run_id=self.run_id,
                 **{k: np.asarray(v) for k, v in arrays.items()})
        os.replace(tmp, self.path)

    # -- per-user state ------------------------------------------------------------------
    def user_state(self, name: str, k: int, dtype=np.float32) -> list[UserState]:
        """Two alternating ``(n_users, k)`` arrays on disk; ``[e % 2]`` is written by epoch ``e``.

        On a resumed run the existing arrays are opened (their shape is checked).
        """
        if name not in self._states:
            st = self.store
            mode = "a" if self.checkpoint is not None else "w"
            self._states[name] = [UserState(self.dir, f"{name}_{i}", st.n_users, k, st.block_users, dtype,
                                            mode=mode) for i in range(2)]
        return self._states[name]

    def epochs(self, last: int, *, desc: str | None = None):
        """Yield the epochs ``start..last`` with a progress line on a terminal."""
        with progress(total=last, initial=self.start - 1, desc=desc or self.method, unit="epoch") as bar:
            for e in range(self.start, last + 1):
                yield e
                bar.update(1)

    # -- lifecycle -----------------------------------------------------------------------
    def close(self) -> None:
        """Remove a temporary run directory (and an empty ``STORE.state`` folder); keep a named one."""
        if not self.own_dir:
            return
        if self.url:
            remove_tree(self.dir)
            return
        shutil.rmtree(self.dir, ignore_errors=True)
        if not self._keep_parent:
            _remove_if_empty(os.path.dirname(self.dir))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
