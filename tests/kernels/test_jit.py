"""streamdp.kernels.jit: kernels missing from Numba's cache are compiled by a helper process, then loaded here."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading

import numpy as np
import pytest
from numba import types

from streamdp.kernels import jit

PROBE = ("import numpy as np; from streamdp.kernels.hashing import splitmix64; "
         "from streamdp.memory import kernels_compiled_here; r = splitmix64(np.uint64(7)); "
         "print(int(r), kernels_compiled_here())")


def _run(code: str, cache, **env) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, NUMBA_CACHE_DIR=str(cache), **env),
                         capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_a_cold_cache_is_filled_by_the_helper_and_the_kernel_loaded_here(tmp_path):
    """The process that needs the kernel compiles nothing itself (Numba counts no cache miss), and gets the same
    result as a process that compiles it as Numba does."""
    helper = _run(PROBE, tmp_path / "helper")
    here = _run(PROBE, tmp_path / "here", STREAMDP_COMPILE="here")
    assert helper[0] == here[0] and helper[1] == "0" and here[1] == "1"
    assert [p.name.split("-")[0] for p in (tmp_path / "helper").rglob("*.nbi")] == ["hashing.splitmix64"]
    assert _run(PROBE, tmp_path / "helper") == [helper[0], "0"]  # warm: loaded, no helper needed


LOADS = ("import sys, numpy as np; from streamdp.kernels.ingest import remap_sort; "
         "from streamdp.memory import kernels_compiled_here; "
         "ip, it, r = np.array([0, 3]), np.array([2, 0, 1], np.int32), np.array([1, 2, 3], np.{dtype}); "
         "remap_sort(ip, it, r, np.array([2, 1, 0], np.int32), np.empty(0, np.int64)); "
         "print(it.tolist(), r.tolist(), kernels_compiled_here(), 'numba.np.arraymath' in sys.modules)")


def test_a_cached_kernel_loads_without_numbas_registries_and_a_compile_after_it_has_them(tmp_path):
    """A warm load skips Numba's refresh of its target context (0.22 s of every command's first kernel call): the
    kernel (which allocates, so needs Numba's runtime) gives what it gave where it was compiled, and Numba's
    implementations were never imported; a signature compiled after such a load still gets every registry."""
    f32, f64 = LOADS.format(dtype="float32"), LOADS.format(dtype="float64")
    cold = _run(f32, tmp_path, STREAMDP_COMPILE="here")
    assert cold == ["[0,", "1,", "2]", "[1.0,", "3.0,", "2.0]", "1", "True"]
    assert _run(f32, tmp_path) == cold[:6] + ["0", "False"]
    code = f32.replace("print(", "print(*remap_sort.signatures, ") + "; " + f64
    out = _run(code, tmp_path, STREAMDP_COMPILE="here")
    assert out[-8:] == cold[:6] + ["1", "True"]  # the float64 signature compiled here, after the float32 one loaded


def test_no_kernel_takes_an_array_as_a_default_argument():
    """Numba's cache never matches a signature whose omitted argument defaults to an array (the default is in the
    key, and two arrays do not compare as one value): ``remap_sort``'s default ``ts`` had every process compile it
    anew, and the helper answered that it compiled it but could not cache it, which left every later signature of the
    run to compile in its own process. So every kernel's arguments are given."""
    import importlib
    import inspect
    import pkgutil

    from numba.core.registry import CPUDispatcher

    import streamdp.kernels as kernels

    found = []
    for info in pkgutil.iter_modules(kernels.__path__):
        mod = importlib.import_module(f"streamdp.kernels.{info.name}")
        for name, v in vars(mod).items():
            if isinstance(v, CPUDispatcher) and v.py_func.__module__ == mod.__name__:
                found.append(name)
                for p in inspect.signature(v.py_func).parameters.values():
                    assert not isinstance(p.default, np.ndarray), \
                        f"{mod.__name__}.{name}: {p.name} defaults to an array"
    assert {"remap_sort", "group_dedup", "append_delta", "merge_rows"} <= set(found)


def _pipes():
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    return os.fdopen(r1, "rb"), os.fdopen(w1, "wb"), os.fdopen(r2, "rb"), os.fdopen(w2, "wb")


def _ask(to, back, message, wait: float = 60.0):
    """Send ``message`` to the server and read its answer, failing (never hanging the suite) without one."""
    import select

    body = pickle.dumps(message)
    to.write(jit._HEADER.pack(len(body)) + body)
    to.flush()
    assert select.select([back], [], [], wait)[0], "the helper did not answer"
    return jit._read_message(back)


def test_the_helper_compiles_into_the_cache_answers_errors_and_exits_when_idle(tmp_path, monkeypatch):
    from streamdp.kernels import hashing

    monkeypatch.setenv(jit.MODE_ENV, "here")
    req_r, req_w, rep_r, rep_w = _pipes()
    # no RSS cap here: a test worker's own RSS may be past the helper's (it answered once and left: a hang)
    server = threading.Thread(target=jit.serve, args=(req_r, rep_w, 5.0, 1 << 62), daemon=True)
    server.start()
    sig = (types.uint64,)
    assert _ask(req_w, rep_r, ("streamdp.kernels.hashing", "splitmix64", sig)) == "ok"
    assert sig in hashing.splitmix64.overloads
    cache = hashing.splitmix64._cache
    assert cache._index_key(sig, hashing.splitmix64.targetctx.codegen()) in cache._cache_file._load_index()
    reply = _ask(req_w, rep_r, ("streamdp.kernels.hashing", "no_such_kernel", sig))
    assert reply.startswith("AttributeError")
    req_w.close()  # end of input: the helper returns
    server.join(10)
    assert not server.is_alive()
    req_r, req_w, rep_r, rep_w = _pipes()
    full = threading.Thread(target=jit.serve, args=(req_r, rep_w, 5.0, 0), daemon=True)  # past its cap: one answer
    full.start()
    assert _ask(req_w, rep_r, ("streamdp.kernels.hashing", "splitmix64", sig)) == "ok"
    full.join(10)
    assert not full.is_alive()
    idle = threading.Thread(target=jit.serve, args=(*_pipes()[::3], 0.05), daemon=True)  # nothing asked: it exits
    idle.start()
    idle.join(10)
    assert not idle.is_alive()


def test_what_the_helper_cannot_reach_compiles_here(monkeypatch):
    """A kernel that is no module's attribute (made in a function) is compiled in the process, as Numba does."""
    monkeypatch.delenv(jit.MODE_ENV, raising=False)

    def make():
        @jit.njit(cache=False, nogil=True)
        def twice(x):
            return 2 * x
        return twice

    twice = make()
    assert twice is not None and twice(np.int64(4)) == 8  # no disk cache: not hooked, Numba's own
    started = []
    monkeypatch.setattr(jit._HELPER, "_start", lambda: started.append(1))
    assert jit._HELPER.compile(twice, (types.int64,)) is False and not started


@pytest.mark.parametrize("mode,helps", [("here", False), ("helper", True), (None, True)])
def test_the_mode(monkeypatch, mode, helps):
    if mode is None:
        monkeypatch.delenv(jit.MODE_ENV, raising=False)
    else:
        monkeypatch.setenv(jit.MODE_ENV, mode)
    assert jit._helper_mode() is helps


TRAIN = r"""
import sys
from streamdp.cli import main
try:
    main(sys.argv[1:])
except SystemExit as e:
    assert not e.code, e.code
print(next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) * 1024)
"""


@pytest.mark.slow  # two cold compilations of the ALS kernels: about 45 s
def test_a_cold_cache_run_peaks_as_a_warm_one_and_trains_the_same_model(tmp_path):
    """Compiling the kernels here held ~200 MB more than running them (streamdp.memory.kernels_compiled_here):
    measured 477 against 268 MB for this fit. The helper keeps it out of the process, and the model is the same."""
    from streamdp import load_model

    store = tmp_path / "s.zarr"
    subprocess.run([sys.executable, "-m", "streamdp", "generate", "--out", str(store), "--users", "20000",
                    "--items", "500", "--ratings-per-user", "20", "--seed", "1"], check=True, capture_output=True)
    peak = {}
    for mode in ("here", "helper"):
        out = subprocess.run(
            [sys.executable, "-c", TRAIN, "train", str(store), "--method", "als", "--epsilon", "1", "--seed", "1",
             "--out", str(tmp_path / mode)], capture_output=True, text=True, check=True,
            env=dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / f"cache-{mode}"), STREAMDP_COMPILE=mode))
        peak[mode] = int(out.stdout.split()[-1])
    assert peak["helper"] < peak["here"] - 100e6, peak
    a, b = load_model(str(tmp_path / "here")), load_model(str(tmp_path / "helper"))
    assert np.array_equal(a.item_factors, b.item_factors) and np.array_equal(a.item_bias, b.item_bias)


def test_a_helper_that_could_not_cache_leaves_compiling_here(monkeypatch):
    """An answer other than "ok" (a cache it could not write) turns the helper off for the process."""
    from streamdp.kernels import hashing

    class Pipe:
        def __init__(self, reply=b""):
            self.sent, self.reply = b"", reply

        def write(self, b):
            self.sent += b

        def flush(self):
            pass

        def read(self, n):
            got, self.reply = self.reply[:n], self.reply[n:]
            return got

    body = pickle.dumps("compiled but not cached")
    proc = type("P", (), {"stdin": Pipe(), "stdout": Pipe(jit._HEADER.pack(len(body)) + body),
                          "poll": lambda self: None})()
    helper = jit._Helper()
    monkeypatch.setattr(helper, "_start", lambda: proc)
    assert helper.compile(hashing.splitmix64, (types.uint64,)) is False and helper._broken
    assert pickle.loads(proc.stdin.sent[jit._HEADER.size:]) == ("streamdp.kernels.hashing", "splitmix64",
                                                                 (types.uint64,))
    assert helper.compile(hashing.splitmix64, (types.uint64,)) is False  # off: not asked again


def test_a_forked_child_starts_its_own_helper():
    """The parent's helper pipe is not shared with a forked child (two writers would interleave requests)."""
    jit._HELPER._proc = object()  # as if a helper were running here
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports by its exit code
            os._exit(0 if jit._HELPER._proc is None and not jit._HELPER._broken else 1)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0
    finally:
        jit._HELPER._proc = None
