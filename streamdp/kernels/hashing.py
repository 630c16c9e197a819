"""splitmix64 (Steele, Lea and Flood 2014; Vigna's constants), the one hash the kernels key their draws with.

Public names: :func:`splitmix64` (the finalizer on one uint64, wrapping arithmetic) and :func:`unit_float` (its
top 53 bits as a float in [0, 1)). :data:`GOLDEN` is the generator's increment. The NumPy form over arrays, the
compiled kernels' reference, is :func:`streamdp.methods._selection.mix`.
"""

from __future__ import annotations

import numpy as np
from streamdp.kernels.jit import njit

#: splitmix64's increment (2^64 / the golden ratio).
GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True, nogil=True)
def splitmix64(x):
    """splitmix64's finalizer of the uint64 ``x`` (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@njit(cache=True, nogil=True)
def unit_float(z):
    """The top 53 bits of the uint64 ``z`` as a float uniform in [0, 1)."""
    return np.float64(z >> np.uint64(11)) * (1.0 / 9007199254740992.0)
