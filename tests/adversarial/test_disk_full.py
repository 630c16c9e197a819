"""A disk that fills up (ENOSPC), a quota (EDQUOT), a read-only file system (EROFS): one line, nothing left.

Fault injection without privileges: :func:`full_disk` replaces ``open`` (``builtins``
and ``io``: Zarr's chunk writes, ``model.json``, the ledger's ``os.fdopen``) and, for
ingest's spill files, ``pyarrow.OSFile`` with files that raise ``OSError(errno)`` once
the process has written ``after`` bytes in total (from Zarr's I/O threads too).
Every case checks: exit 2, one line on stderr naming the destination and the cause, no
traceback, nothing at the destination (or the replaced one intact), no temporary
directory left. Before this was built each of them was a traceback (exit 1).

``test_real_tmpfs`` repeats the main cases on a real 2 MB tmpfs when the tests run as
root and may mount one (``-m slow``).
"""

from __future__ import annotations

import builtins
import errno
import io
import os
import subprocess
import sys
import threading

import pyarrow as pa
import pytest
from click.testing import CliRunner

from streamdp.cli import main
from streamdp.storage.store import open_store

SMALL = ["--users", "3000", "--items", "200", "--ratings-per-user", "20", "--seed", "1"]


class _FullFile:
    """A writable file that raises ``OSError(code)`` once its process has written more than the budget."""

    def __init__(self, f, budget):
        self._f, self._budget = f, budget

    def write(self, data):
        n = memoryview(data).nbytes if not isinstance(data, str) else len(data.encode())
        self._budget.take(n)
        return self._f.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()

    def __iter__(self):
        return iter(self._f)

    def __getattr__(self, name):
        return getattr(self._f, name)


class _Budget:
    def __init__(self, after: int, code: int):
        self.left, self.code, self.lock, self.tripped = after, code, threading.Lock(), 0

    def take(self, n: int) -> None:
        with self.lock:
            if n > self.left:
                self.tripped += 1
                raise OSError(self.code, os.strerror(self.code))
            self.left -= n


@pytest.fixture
def full_disk(monkeypatch):
    """``full_disk(after, code=ENOSPC)``: from now on, writes fail once ``after`` bytes were written."""

    def arm(after: int, code: int = errno.ENOSPC) -> _Budget:
        budget = _Budget(after, code)
        real_open, real_osfile = io.open, pa.OSFile

        def failing_open(file, mode="r", *args, **kwargs):
            f = real_open(file, mode, *args, **kwargs)
            # Numba's cache (``__pycache__``, written on a cold cache as kernels compile) is
            # not an output of ours: counting it made the first test of a clean clone fail
            # before any destination existed ("a write failed", no path: right, but not this case).
            if isinstance(file, (str, os.PathLike)) and "__pycache__" in os.fspath(file):
                return f
            return _FullFile(f, budget) if any(c in mode for c in "wax+") else f

        def failing_osfile(path, mode="r"):
            return failing_open(path, mode + ("b" if "b" not in mode else "")) if "w" in mode else \
                real_osfile(path, mode)

        monkeypatch.setattr(builtins, "open", failing_open)
        monkeypatch.setattr(io, "open", failing_open)
        monkeypatch.setattr(pa, "OSFile", failing_osfile)
        return budget

    return arm


def run(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    return r.exit_code, r.stdout, r.stderr, r.exception


def leftovers(directory) -> list[str]:
    """Hidden temporary directories (or anything else hidden) left in ``directory``."""
    return sorted(n for n in os.listdir(directory) if n.startswith("."))


def assert_one_line_error(code, err, exc, path, reason="No space left on device"):
    assert code == 2, (code, err, exc)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("streamdp: error: "), err
    assert "Traceback" not in err and str(path) in lines[0] and reason in lines[0], err
    assert "nothing was written" in lines[0], err


# --------------------------------------------------------------------------------------
# stores: generate and ingest
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("code,reason", [(errno.ENOSPC, "No space left on device"),
                                         (errno.EDQUOT, "Disk quota exceeded"),
                                         (errno.EROFS, "Read-only file system")])
def test_generate_on_a_full_disk(tmp_path, full_disk, code, reason):
    out = tmp_path / "s.zarr"
    budget = full_disk(50_000, code)
    c, _, err, exc = run("generate", "--out", out, *SMALL)
    assert budget.tripped
    assert_one_line_error(c, err, exc, out, reason)
    assert not out.exists() and leftovers(tmp_path) == []


def _ratings_csv(path, n_users=400, n_items=60):
    with open(path, "w") as f:
        f.write("user,item,rating\n")
        f.writelines(f"{u},{i},{1 + (u * 7 + i) % 5}\n" for u in range(n_users) for i in range(0, n_items, 1 + u % 3))
    return path


@pytest.mark.parametrize("after", [2_000, 60_000], ids=["spill", "store"])
def test_ingest_on_a_full_disk(tmp_path, full_disk, after):
    """Fails while spilling the parsed input (pyarrow) or while writing the store (Zarr)."""
    src = _ratings_csv(tmp_path / "r.csv")
    out = tmp_path / "s.zarr"
    budget = full_disk(after)
    c, _, err, exc = run("ingest", src, "--out", out, "--test-fraction", "0.2")
    assert budget.tripped
    assert_one_line_error(c, err, exc, out)
    assert not out.exists() and leftovers(tmp_path) == []


def test_force_over_a_store_on_a_full_disk_keeps_the_old_store(tmp_path, full_disk):
    out = tmp_path / "s.zarr"
    assert run("generate", "--out", out, *SMALL)[0] == 0
    before = open_store(out).checksum
    full_disk(50_000)
    c, _, err, exc = run("generate", "--out", out, *SMALL[:-1], "2", "--force")
    assert_one_line_error(c, err, exc, out)
    assert open_store(out).checksum == before and leftovers(tmp_path) == []


# --------------------------------------------------------------------------------------
# models and ledgers
# --------------------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path):
    out = tmp_path / "s.zarr"
    assert run("generate", "--out", out, *SMALL, "--test-fraction", "0.2")[0] == 0
    return out


def test_train_on_a_full_disk(tmp_path, store, full_disk, monkeypatch):
    """The model write fails (its factors, model.json or ledger): one line naming the model, nothing there."""
    import streamdp.serving.model as model_mod
    import streamdp.workflows.training  # noqa: F401
    from streamdp.methods import load_builtin

    # every module that imports save_model by name is loaded before the patch: one first imported during the run
    # would bind the patched function for good (and fill the disk of every later test in this process)
    load_builtin()
    real_save = model_mod.save_model

    def save_on_full_disk(*args, **kwargs):  # the disk fills up just as the model is written
        full_disk(200)
        return real_save(*args, **kwargs)

    monkeypatch.setattr(model_mod, "save_model", save_on_full_disk)
    for mod in list(sys.modules.values()):  # methods import save_model by name
        if getattr(mod, "save_model", None) is real_save and mod is not model_mod:
            monkeypatch.setattr(mod, "save_model", save_on_full_disk)
    out = tmp_path / "model"
    c, _, err, exc = run("train", store, "--epsilon", "1", "--method", "means", "--out", out, "--seed", "0")
    assert_one_line_error(c, err, exc, out)
    assert not out.exists() and leftovers(tmp_path) == []


def test_ledger_write_on_a_full_disk(store, full_disk):
    """``budget --set`` on a full disk names the ledger file and leaves it as it was."""
    ledger = store / "privacy_budget.json"
    assert run("budget", store, "--set", "4,1e-5")[0] == 0
    before = ledger.read_text()
    full_disk(0)
    c, _, err, exc = run("budget", store, "--set", "2,1e-5")
    assert_one_line_error(c, err, exc, ledger)
    assert ledger.read_text() == before
    assert [n for n in os.listdir(store) if n.endswith(".tmp")] == []


def test_other_os_errors_keep_their_traceback(tmp_path, monkeypatch):
    """Only a full, over-quota or read-only disk is turned into one line: any other OSError is a bug."""
    import streamdp.storage.generate as gen

    def broken(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(gen, "StoreWriter", broken)
    c, _, _, exc = run("generate", "--out", tmp_path / "s.zarr", *SMALL)
    assert c == 1 and isinstance(exc, OSError) and exc.errno == errno.EIO


# --------------------------------------------------------------------------------------
# a real full file system (root only)
# --------------------------------------------------------------------------------------


@pytest.fixture
def tiny_tmpfs(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


@pytest.mark.slow
def test_real_tmpfs(tmp_path, tiny_tmpfs):
    """The same on a real 2 MB file system, through the installed command (real errnos from pyarrow and Zarr)."""
    env = {**os.environ, "STREAMDP_PROGRESS": "0"}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "streamdp", *map(str, args)], capture_output=True, text=True,
                              env=env, timeout=300)

    src = _ratings_csv(tmp_path / "big.csv", n_users=40_000, n_items=60)
    for args in (["generate", "--out", tiny_tmpfs / "g.zarr", "--users", "100000", "--items", "500",
                  "--ratings-per-user", "30"],
                 ["ingest", src, "--out", tiny_tmpfs / "i.zarr"]):
        r = cli(*args)
        assert_one_line_error(r.returncode, r.stderr, None, args[args.index("--out") + 1])
        assert os.listdir(tiny_tmpfs) == []
    # a ledger on a store that fits, then a full disk
    assert cli("generate", "--out", tiny_tmpfs / "s.zarr", "--users", "200", "--items", "50").returncode == 0
    fd = os.open(tiny_tmpfs / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    r = cli("budget", tiny_tmpfs / "s.zarr", "--set", "3,1e-5")
    assert_one_line_error(r.returncode, r.stderr, None, tiny_tmpfs / "s.zarr" / "privacy_budget.json")
    assert not (tiny_tmpfs / "s.zarr" / "privacy_budget.json").exists()


def test_train_whose_budget_reservation_hits_a_full_disk(tmp_path, store, full_disk):
    """The first write of a run is its reservation in the store's ledger (a store's first: its release key, which
    the reservation records): nothing is trained or written."""
    full_disk(0)
    out = tmp_path / "model"
    c, _, err, exc = run("train", store, "--epsilon", "1", "--method", "means", "--out", out, "--seed", "0")
    assert_one_line_error(c, err, exc, store / "release_key")
    assert not out.exists() and leftovers(tmp_path) == []


def test_a_full_disk_outside_any_output_claims_nothing(monkeypatch):
    import streamdp.outputs as outputs
    from streamdp.outputs import describe_no_space

    monkeypatch.setattr(outputs, "_PENDING", {})  # no output of ours being written in this process

    msg = describe_no_space(OSError(errno.ENOSPC, "No space left on device"))
    assert msg.startswith("a write failed: No space left on device (ENOSPC)") and "nothing was written" not in msg
    assert describe_no_space(OSError(errno.EIO, "Input/output error")) is None
    assert describe_no_space(ValueError("not an OSError")) is None


def test_ingest_budget_on_a_full_disk_says_the_store_was_written(tmp_path, monkeypatch):
    """``ingest --budget``: the store is in place when its ledger write fails; the line says so and how to finish."""
    from streamdp.privacy.budget import StoreBudget

    def full(self, *args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(StoreBudget, "set", full)
    src = _ratings_csv(tmp_path / "r.csv", n_users=50)
    out = tmp_path / "s.zarr"
    c, _, err, exc = run("ingest", src, "--out", out, "--budget", "2,1e-5")
    assert c == 2 and len(err.strip().splitlines()) == 1, (err, exc)
    assert "the store was written but its budget was not set: No space left on device" in err
    assert f"streamdp budget {out} --set 2,1e-05" in err
    assert open_store(out).n_users == 50 and leftovers(tmp_path) == []


def test_a_failed_flush_then_a_failed_close_names_the_file(monkeypatch):
    """What a real full disk does to ``with open(...)``: the flush fails (no file named), then the close again
    (the file named): the line names the file (found on a real tmpfs, see test_real_tmpfs)."""
    import streamdp.outputs as outputs

    monkeypatch.setattr(outputs, "_PENDING", {})
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise OSError(errno.ENOSPC, "No space left on device", "/s.zarr/privacy_budget.json")
    except OSError as exc:
        msg = outputs.describe_no_space(exc)
    assert msg.startswith("/s.zarr/privacy_budget.json: cannot write: No space left on device"), msg
    assert "could not be updated either" not in msg


# --------------------------------------------------------------------------------------
# a file past the size limit (EFBIG: ulimit -f)
# --------------------------------------------------------------------------------------


def test_ingest_past_the_file_size_limit_is_one_line(tmp_path):
    """``ulimit -f`` during ingest: pyarrow's spill write fails with EFBIG (was a pyarrow traceback)."""
    import resource
    import subprocess
    import sys

    src = tmp_path / "r.csv"
    src.write_text("user,item,rating\n" + "".join(f"{u},{i},{1 + (u + i) % 5}\n" for u in range(6000)
                                                    for i in range(0, 200, 7)))
    limit = 512 << 10  # bytes: the CSV (~1.5 MB) is read, the spill of its parsed columns is larger

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    r = subprocess.run([sys.executable, "-m", "streamdp.cli", "ingest", str(src), "--out", str(tmp_path / "s.zarr")],
                       capture_output=True, text=True, preexec_fn=small_files, timeout=300)
    assert_one_line_error(r.returncode, r.stderr, None, tmp_path / "s.zarr", reason="File too large (EFBIG)")
    assert r.stdout == ""
    assert sorted(os.listdir(tmp_path)) == ["r.csv"]  # no store, no temporary directory
