"""streamdp.outputs: atomic install that replaces only our own; Ctrl-C deferred over the swap."""

from __future__ import annotations

import os
import signal

import pytest

from streamdp.errors import StoreError
from streamdp.outputs import deferred_interrupts, install_dir


def _ours(path):
    return os.path.exists(os.path.join(path, "OURS"))


def _finished(tmp_path, name, content):
    d = tmp_path / name
    d.mkdir()
    (d / "OURS").write_text(content)
    return d


def test_install_replaces_only_ours(tmp_path):
    dest = tmp_path / "out"
    install_dir(str(_finished(tmp_path, ".t1", "1")), str(dest), force=False, what="thing", is_ours=_ours)
    assert (dest / "OURS").read_text() == "1"
    t2 = _finished(tmp_path, ".t2", "2")
    with pytest.raises(StoreError, match="already exists"):
        install_dir(str(t2), str(dest), force=False, what="thing", is_ours=_ours)
    install_dir(str(t2), str(dest), force=True, what="thing", is_ours=_ours)
    assert (dest / "OURS").read_text() == "2" and sorted(os.listdir(tmp_path)) == ["out"]
    (dest / "OURS").unlink()  # now it is not ours
    t3 = _finished(tmp_path, ".t3", "3")
    with pytest.raises(StoreError, match="not a streamdp thing; --force replaces only a thing"):
        install_dir(str(t3), str(dest), force=True, what="thing", is_ours=_ours)
    assert os.listdir(dest) == [] and t3.exists()  # untouched; the caller removes its temp


def test_install_restores_the_old_one_when_the_swap_fails(tmp_path, monkeypatch):
    dest = _finished(tmp_path, "out", "old")
    new = _finished(tmp_path, ".new", "new")
    real = os.rename

    def rename(src, dst):
        if str(src) == str(new):
            raise OSError("disk trouble")
        return real(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError, match="disk trouble"):
        install_dir(str(new), str(dest), force=True, what="thing", is_ours=_ours)
    assert (dest / "OURS").read_text() == "old" and sorted(os.listdir(tmp_path)) == [".new", "out"]


def test_deferred_interrupts_hold_ctrl_c_until_the_block_ends():
    done = []
    with pytest.raises(KeyboardInterrupt):
        with deferred_interrupts():
            os.kill(os.getpid(), signal.SIGINT)
            done.append("finished")
    assert done == ["finished"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_interrupts_at_safe_points_resend_ctrl_c_raised_in_a_finalizer():
    """Raised in a __del__, a KeyboardInterrupt would be printed as 'Exception ignored' and lost."""
    import time

    from streamdp.outputs import interrupts_at_safe_points

    class Finalized:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # the handler runs here, inside the finalizer
                pass

    with pytest.raises(KeyboardInterrupt):
        with interrupts_at_safe_points():
            Finalized()  # collected at once
            time.sleep(5)  # the re-sent Ctrl-C interrupts this
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
