"""Shared parts of the subspace methods (``oja``, ``fw``, ``svd``, ``lowrank``).

Clipped residual rows of a block (:func:`residual_values`), one noisy pass of
subspace iteration over the stream (:func:`power_pass`), the sign convention of
released eigenvectors (:func:`canonical_signs`) and the item factors a user's local
ridge solve reads (:func:`scaled_factors`, ridge :data:`DEFAULT_RIDGE`). All are
post-processing of released values or per-block computations before a release;
none adds noise itself (a pass adds its ``release``'s).
"""

from __future__ import annotations

import math

import numpy as np

from streamdp.kernels.linalg import gram_apply, residuals
from streamdp.privacy.bounding import clip_rows
from streamdp.stream.engine import add_into as _add

#: Default ridge of the local user solve (see :mod:`streamdp.serving.local`).
DEFAULT_RIDGE = 1.0


def scaled_factors(V: np.ndarray, sv: np.ndarray, weight: np.ndarray | None = None,
                   weight_sigma: float = 0.0) -> np.ndarray:
    """Item factors for the local solve: ``V diag(w) / (p_j + p0)``, rows of mean squared norm 1.

    ``w = sv / max(sv)`` shrinks directions with small private singular values so
    the local ridge solve trusts them less. ``p_j`` is item ``j``'s relative
    private weight ``C_j / mean(C)`` (the bias release): the top singular vectors
    of the zero-filled matrix ``A`` are those of ``D_p Y^T Y D_p`` (item ``j`` is
    observed with probability ``p_j``, and with the same ``1/sqrt(n_i)`` user
    weights the clipping puts on ``A``'s rows), so ``V_j / p_j`` estimates the
    factor of item ``j`` itself; without this popular items dominate every
    prediction. ``p0 = 0.05 + 3 sigma_C / mean(C)`` keeps rare items (whose ``C_j``
    and ``V_j`` are mostly noise) from blowing up. Post-processing only.
    The overall scale (rows of mean squared norm 1) makes the ridge dimensionless.

    >>> V = np.linalg.qr(np.random.default_rng(0).normal(size=(50, 3)))[0]
    >>> Q = scaled_factors(V, np.array([3., 2., 1.]))
    >>> round(float((Q ** 2).sum(axis=1).mean()), 6)
    1.0
    """
    n = V.shape[0]
    top = float(np.max(sv)) if len(sv) else 0.0
    w = sv / top if top > 0 else np.ones_like(sv)
    Q = V * np.maximum(w, 1e-3)
    if weight is not None:
        c = np.maximum(np.asarray(weight, np.float64), 0.0)
        mean = float(c.mean()) if c.mean() > 0 else 1.0
        Q = Q / (c / mean + 0.05 + 3.0 * weight_sigma / mean)[:, None]
    norm = float(np.sum(Q * Q))
    return Q * math.sqrt(n / norm) if norm > 0 else Q


def residual_values(mu, bias, L, lo, hi):
    """Clipped residual rows of a block: ``clip_rows(r - mu - b, L)`` as float64."""
    bias = np.ascontiguousarray(bias, dtype=np.float64)

    def values(block):
        r = np.clip(block.ratings, np.float32(lo), np.float32(hi))
        v = np.empty(block.nnz, np.float64)
        residuals(block.items, r, float(mu), bias, v)
        return clip_rows(block.indptr, v, L)

    return values


def power_pass(engine, V, values_of, rng, release, desc="oja pass", extra=0):
    """One pass of noisy subspace iteration: ``QR(A^T A V + G)``; returns ``(V_new, V^T Y)``.

    ``release`` is the pass's noisy release (``None``: non-private). ``extra``: bytes
    ``values_of`` allocates per block beyond one float64 per rating (for the memory budget).
    """
    n, k = V.shape
    Vc = np.ascontiguousarray(V)

    def fn(block, b):
        out = np.zeros((n, k))
        gram_apply(block.indptr, block.items, values_of(block), Vc, out)
        return out

    Y = engine.map_reduce(fn, _add, np.zeros((n, k)), extra_per_block=8 * n * k + int(extra), desc=desc)
    if release is not None:
        Y = release.add(Y, rng)
    return np.linalg.qr(Y)[0], V.T @ Y


def canonical_signs(V: np.ndarray) -> np.ndarray:
    """``V`` with each column's sign chosen so that its largest-magnitude entry is positive.

    Eigenvectors are defined up to sign; fixing it makes the release independent of
    the order of floating-point sums (streamed == in-memory). Post-processing.

    >>> canonical_signs(np.array([[0.6, 0.1], [-0.8, -0.9]])).tolist()
    [[-0.6, -0.1], [0.8, 0.9]]
    """
    idx = np.argmax(np.abs(V), axis=0)
    sign = np.where(V[idx, np.arange(V.shape[1])] < 0, -1.0, 1.0)
    return V * sign
