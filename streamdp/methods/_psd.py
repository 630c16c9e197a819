"""Projection of noisy symmetric matrices onto the PSD cone: shared by ``als`` and ``ials``' item solves."""

from __future__ import annotations

import numpy as np


def psd(M) -> np.ndarray:
    """Symmetric matrices with negative eigenvalues set to 0 (batched over leading axes).

    >>> psd(np.array([[1.0, 0.0], [0.0, -2.0]])).tolist()
    [[1.0, 0.0], [0.0, 0.0]]
    """
    M = (M + np.swapaxes(M, -1, -2)) / 2.0
    w, E = np.linalg.eigh(M)
    return (E * np.maximum(w, 0.0)[..., None, :]) @ np.swapaxes(E, -1, -2)
