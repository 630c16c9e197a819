"""The shared run driver: random families, checkpoints, per-user state, cleanup."""

import os
from types import SimpleNamespace

import numpy as np
import pytest

from streamdp.errors import ParameterError
from streamdp.privacy import spawn_rngs
from streamdp.stream.driver import Run, fingerprint


def _store(tmp_path):
    return SimpleNamespace(path=str(tmp_path / "s.zarr"), n_users=10, block_users=4, checksum="x")


def test_random_families_are_independent_and_reproducible(tmp_path):
    st = _store(tmp_path)
    with Run(st, method="t", fingerprint="f", seed=9, rng_key=3) as a, \
            Run(st, method="t", fingerprint="f", seed=9, rng_key=4) as b:
        x = a.rng(1, 2).standard_normal(4)
        assert np.array_equal(x, Run.rng(a, 1, 2).standard_normal(4))
        assert not np.array_equal(x, a.rng(1, 3).standard_normal(4))      # another epoch
        assert not np.array_equal(x, b.rng(1, 2).standard_normal(4))      # another method's key
        # a group's stream is the group-th child of the family, whatever the other groups
        fam = (3 << 24) | (5 << 16) | 1
        ref = spawn_rngs(9, 4, key=fam)[3].standard_normal(3)
        assert np.array_equal(a.group_rng(5, 1, 3).standard_normal(3), ref)


def test_checkpoint_resume_and_refusal(tmp_path):
    st = _store(tmp_path)
    ck = str(tmp_path / "run")
    with Run(st, method="t", fingerprint=fingerprint(a=1), seed=None, rng_key=1, checkpoint=ck) as r:
        entropy = r.entropy
        states = r.user_state("u", 3)
        states[1].write(2, np.ones((2, 3), np.float32))
        r.save(1, V=np.arange(3.0))
    with Run(st, method="t", fingerprint=fingerprint(a=1), seed=None, rng_key=1, checkpoint=ck) as r:
        assert r.start == 2 and r.entropy == entropy and r.checkpoint["V"].tolist() == [0, 1, 2]
        assert r.user_state("u", 3)[1].read(2).tolist() == [[1, 1, 1], [1, 1, 1]]
    with pytest.raises(ParameterError, match="different run"):
        Run(st, method="t", fingerprint=fingerprint(a=2), seed=None, rng_key=1, checkpoint=ck)
    assert os.path.exists(os.path.join(ck, "checkpoint.npz"))  # a named run directory is kept


def test_temporary_run_directory_and_empty_state_folder_are_removed(tmp_path):
    st = _store(tmp_path)
    with Run(st, method="t", fingerprint="f", seed=1, rng_key=1) as r:
        r.user_state("u", 2)[0].write(0, np.zeros((4, 2), np.float32))
        d = r.dir
        assert os.path.isdir(d) and d.startswith(st.path + ".state")
    assert not os.path.exists(d) and not os.path.exists(st.path + ".state")
    with pytest.raises(RuntimeError):
        with Run(st, method="t", fingerprint="f", seed=1, rng_key=1) as r:
            d = r.dir
            raise RuntimeError
    assert not os.path.exists(d)


def test_an_interrupt_while_the_run_is_being_opened_removes_its_directory(tmp_path, monkeypatch):
    """A signal that lands after owner.json is written but before the caller's ``with`` begins (the CLI's handler
    raises KeyboardInterrupt wherever the main thread is) leaves no run directory behind: seen under load in
    tests/adversarial/test_signals.py, which signals as soon as owner.json appears."""
    st = _store(tmp_path)

    def interrupted(self):
        assert os.path.exists(os.path.join(self.dir, "owner.json"))  # the window the test signals into
        raise KeyboardInterrupt

    monkeypatch.setattr(Run, "_load", interrupted)
    with pytest.raises(KeyboardInterrupt):
        Run(st, method="t", fingerprint="f", seed=1, rng_key=1)
    assert not os.path.exists(st.path + ".state")
