"""Which process owns a budget reservation or a run directory, and whether it is gone.

A run that is killed (``kill -9``, power loss) cannot clean up after itself: its
budget reservation stays ``reserved`` and its run directory stays on disk. So both
record their owner, :func:`current_owner`::

    {"pid": 4242, "host": "node7", "boot_id": "6d1f...", "start_ticks": 918273, "started": "2026-..."}

and a later process asks :func:`owner_status`:

* ``"gone"``: the owner was on this host and is provably not running any more: the
  machine was rebooted since (another ``boot_id``), or no process has its pid, or the
  process with its pid started at another time (the pid was reused, ``start_ticks``
  from ``/proc/PID/stat`` differ), or it is a zombie (dead, not yet reaped);
* ``"alive"``: a process with that pid and start time is running;
* ``"unknown"``: it cannot be told from here (another host, or no owner recorded).

Only ``"gone"`` lets anyone act on an owner's leftovers.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket

from streamdp.jsonio import atomic_write_json

__all__ = ["OWNER_FILE", "current_owner", "owner_status", "describe_owner", "write_owner_file", "read_owner_file"]

#: Name of the owner record in a run directory.
OWNER_FILE = "owner.json"


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """``(state, start_ticks)`` of ``pid`` from ``/proc/PID/stat``, or None when there is no such process."""
    try:
        with open(f"/proc/{int(pid)}/stat") as fh:
            text = fh.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # "pid (comm) state ppid ..."; comm may hold spaces and parentheses: split after the last ')'
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[19])


def current_owner() -> dict:
    """The identity of this process: pid, host, boot id and start time (see the module docstring)."""
    pid = os.getpid()
    stat = _proc_stat(pid) if os.path.isdir("/proc/self") else None
    return {"pid": pid, "host": socket.gethostname(), "boot_id": _boot_id(),
            "start_ticks": stat[1] if stat else None,
            "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


def owner_status(owner: dict | None) -> str:
    """``"alive"``, ``"gone"`` or ``"unknown"`` for an owner record (see the module docstring).

    >>> owner_status(current_owner())
    'alive'
    >>> owner_status(None), owner_status({**current_owner(), "host": "elsewhere.invalid"})
    ('unknown', 'unknown')
    """
    if not isinstance(owner, dict) or not isinstance(owner.get("pid"), int):
        return "unknown"
    if owner.get("host") != socket.gethostname():
        return "unknown"
    boot = _boot_id()
    if owner.get("boot_id") and boot and owner["boot_id"] != boot:
        return "gone"
    pid = owner["pid"]
    if os.path.isdir("/proc/self"):
        stat = _proc_stat(pid)
        if stat is None or stat[0] in ("Z", "X"):
            return "gone"
        if owner.get("start_ticks") is not None and stat[1] != owner["start_ticks"]:
            return "gone"
        return "alive"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        pass
    return "alive"


def describe_owner(owner: dict | None) -> str:
    """``"pid 4242 on node7"`` (or ``"no recorded owner"``)."""
    if not isinstance(owner, dict):
        return "no recorded owner"
    return f"pid {owner.get('pid')} on {owner.get('host')}"


def write_owner_file(directory: str | os.PathLike) -> None:
    """Record this process as the owner of ``directory`` (``directory/owner.json``)."""
    atomic_write_json(os.path.join(directory, OWNER_FILE), current_owner())


def read_owner_file(directory: str | os.PathLike) -> dict | None:
    """The owner recorded in ``directory``, or None (none recorded, or unreadable)."""
    try:
        with open(os.path.join(directory, OWNER_FILE)) as fh:
            d = json.load(fh)
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None
