"""``bench/perfmap.py``: perf's map of the process names each compiled function, callees linked in included."""

from __future__ import annotations

import types

import numpy as np
from numba import njit

from bench import perfmap


@njit(cache=False, nogil=True)
def _inner(x):
    s = 0.0
    for v in x:
        s += v * v
    return s


@njit(cache=False, nogil=True)
def _outer(x):
    return _inner(x) + 1.0


def test_the_map_names_each_function_and_its_linked_callees(tmp_path):
    assert _outer(np.arange(4.0)) == 15.0
    mod = types.ModuleType("fake")
    mod._outer = _outer
    funcs = perfmap.compiled_functions([mod])
    names = [n for _, n in funcs]
    assert any(n.endswith("._outer@_outer") for n in names), names  # the dispatcher's entry point
    # what its library linked in besides the entry and its Python wrapper (``_inner``, unless LLVM inlined it, and
    # Numba's reference-count helpers)
    assert len([n for n in names if "_outer" not in n]) >= 1, names
    addrs = [a for a, _ in funcs]
    assert addrs == sorted(addrs) and len(set(addrs)) == len(addrs)
    path = perfmap.write_map(funcs, path=str(tmp_path / "perf.map"), dump=str(tmp_path / "code"))
    lines = open(path).read().splitlines()
    assert len(lines) == len(funcs)
    for line, (addr, name) in zip(lines, funcs):
        a, size, n = line.split(" ", 2)
        assert int(a, 16) == addr and n == name and 0 < int(size, 16) <= 1 << 16
    index = (tmp_path / "code" / "index.txt").read_text().splitlines()
    assert len(index) == len(funcs)
    a, size, _ = index[0].split(" ", 2)
    assert (tmp_path / "code" / f"{a}.bin").stat().st_size == int(size)


def test_readable_names():
    sym = "_ZN8streamdp7kernels6linalg17_solve_users_rowsB3v14B88c8tJTIeFIjxB2IKSgI4CrvQClYb5wB"
    assert perfmap._readable(sym) == "streamdp.kernels.linalg._solve_users_rows"
    assert perfmap._readable("cfunc._ZN7cpython8streamdp4_abcB2v1") == "cpython.streamdp._abc"
    assert perfmap._readable("NRT_incref") == "NRT_incref"
