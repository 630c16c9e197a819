"""streamdp.memory: large arrays freed leave the process under unmap_large_frees."""

from __future__ import annotations

import subprocess
import sys

import pytest

from streamdp import memory

# A 20 MB array freed raises glibc's dynamic mmap threshold to its size, so that a 16 MB array
# allocated next comes from the heap and, freed, stays resident (the trim threshold is then 40 MB).
# With the threshold fixed, both are mappings of their own, unmapped when freed.
_SCRIPT = """
import sys, numpy as np
from streamdp.memory import current_rss, unmap_large_frees
if sys.argv[1] == "1":
    unmap_large_frees()
a = np.ones(20_000_000 // 8); del a
rss0 = current_rss()
b = np.ones(16_000_000 // 8); del b
print(current_rss() - rss0)
"""


def _retained(fixed: bool) -> int:
    return int(subprocess.run([sys.executable, "-c", _SCRIPT, "1" if fixed else "0"], capture_output=True, text=True,
                              check=True).stdout)


@pytest.mark.skipif(memory._LIBC is None or not hasattr(memory._LIBC, "mallopt"), reason="glibc only")
def test_unmap_large_frees_returns_a_freed_array():
    if _retained(False) < 12_000_000:  # glibc's default keeps the freed 16 MB resident, mostly: not always in the
        pytest.skip("glibc gave the freed array back by itself here (the heap could not grow in place)")  # suite
    assert _retained(True) < 2_000_000


@pytest.mark.skipif(memory._LIBC is None or not hasattr(memory._LIBC, "prctl"), reason="no prctl (not Linux glibc)")
def test_small_pages_turns_huge_pages_off_inside_and_restores_the_setting():
    """``small_pages`` (an append's): ``PR_GET_THP_DISABLE`` says 1 inside, what it said before once left, also
    when the block raises, and a process that had them off already keeps them off."""
    get = lambda: memory._LIBC.prctl(memory._PR_GET_THP_DISABLE, 0, 0, 0, 0)  # noqa: E731
    before = get()
    with memory.small_pages():
        assert get() == 1
        with memory.small_pages():  # nested: the outer block's setting stays
            assert get() == 1
        assert get() == 1
    assert get() == before
    with pytest.raises(RuntimeError), memory.small_pages():
        raise RuntimeError("boom")
    assert get() == before


def test_kernels_compiled_here_counts_compilations_not_cache_loads(tmp_path):
    """A cold cache (its own NUMBA_CACHE_DIR) compiles the kernel; a second process loads it and counts none
    (compiled here, as Numba does: ``STREAMDP_COMPILE=here``; the default's helper: tests/kernels/test_jit.py)."""
    import os
    import subprocess
    import sys

    code = ("import numpy as np; from streamdp.kernels.hashing import splitmix64; "
            "from streamdp.memory import kernels_compiled_here; splitmix64(np.uint64(7)); "
            "print(kernels_compiled_here())")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), STREAMDP_COMPILE="here")
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
            for _ in range(2)]
    assert [r.stdout.split() for r in runs] == [["1"], ["0"]]
