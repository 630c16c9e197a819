"""Sparse-times-dense products on CSR user blocks: the sketches ``A_b X`` and ``A_b^T Y``.

The randomized range finder and the streamed truncated SVD of
:mod:`streamdp.methods.lowrank` need the two halves of :func:`streamdp.kernels.linalg.gram_apply`
separately, because something happens between them (the sketch is clipped and
noised, or noise rows are added to it):

* :func:`csr_matmul`: ``out = A X`` (one dense row per user, written);
* :func:`csr_t_matmul`: ``out += A^T Y`` (accumulated into an item-side matrix).

Both take a block's raw CSR arrays. A row range ``u0:u1`` of a block is
``indptr[u0:u1 + 1]`` with the same ``items``/``values`` (the row pointers are
positions in those arrays). No ``fastmath``. SciPy references are below and
checked in ``tests/kernels/test_sketch.py``.
"""

from __future__ import annotations

import numpy as np
from streamdp.kernels.jit import njit


@njit(cache=True, nogil=True)
def csr_matmul(indptr, items, values, X, out):
    """``out[u] = sum_{p in row u} values[p] X[items[p]]``: ``out = A X`` for the rows of ``indptr`` (written).

    ``X`` is ``(n_items, k)`` float64, ``out`` ``(len(indptr) - 1, k)`` float64.
    """
    k = X.shape[1]
    for u in range(len(indptr) - 1):
        for d in range(k):
            out[u, d] = 0.0
        for p in range(indptr[u], indptr[u + 1]):
            j = items[p]
            x = values[p]
            for d in range(k):
                out[u, d] += x * X[j, d]


@njit(cache=True, nogil=True)
def csr_t_matmul(indptr, items, values, Y, out):
    """``out[items[p]] += values[p] Y[u]`` for the rating slots ``p`` of row ``u``: ``out += A^T Y`` (accumulated).

    ``Y`` is ``(len(indptr) - 1, k)`` float64, ``out`` ``(n_items, k)`` float64.
    """
    k = Y.shape[1]
    for u in range(len(indptr) - 1):
        for p in range(indptr[u], indptr[u + 1]):
            j = items[p]
            x = values[p]
            for d in range(k):
                out[j, d] += x * Y[u, d]


# -- SciPy references (tests) ----------------------------------------------------------------------------------------
def _csr(indptr, items, values, n_items):
    import scipy.sparse as sp

    indptr = np.asarray(indptr, np.int64)
    base = int(indptr[0]) if len(indptr) else 0
    return sp.csr_matrix((np.asarray(values, np.float64)[base:indptr[-1]], np.asarray(items)[base:indptr[-1]],
                          indptr - base), shape=(len(indptr) - 1, n_items))


def csr_matmul_reference(indptr, items, values, X):
    """SciPy reference of :func:`csr_matmul`: ``A @ X``."""
    return _csr(indptr, items, values, X.shape[0]) @ X


def csr_t_matmul_reference(indptr, items, values, Y, n_items):
    """SciPy reference of :func:`csr_t_matmul` (without the accumulation): ``A.T @ Y``."""
    return _csr(indptr, items, values, n_items).T @ Y
