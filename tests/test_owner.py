"""streamdp.owner: a process identity that tells a live owner from a dead one (and a reused pid)."""

from __future__ import annotations

import subprocess
import sys

from streamdp.owner import current_owner, describe_owner, owner_status, read_owner_file, write_owner_file


def test_owner_status(tmp_path):
    me = current_owner()
    assert owner_status(me) == "alive" and describe_owner(me).startswith("pid ")
    p = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = {**me, "pid": int(p.stdout)}
    assert owner_status(dead) == "gone"
    assert owner_status({**me, "start_ticks": me["start_ticks"] + 1}) == "gone"  # pid reused by another process
    assert owner_status({**me, "boot_id": "another-boot"}) == "gone"
    assert owner_status({**me, "host": "elsewhere.invalid"}) == "unknown"
    assert owner_status(None) == owner_status({"pid": "x"}) == "unknown"
    write_owner_file(tmp_path)
    assert read_owner_file(tmp_path)["pid"] == me["pid"]
    assert read_owner_file(tmp_path / "missing") is None
