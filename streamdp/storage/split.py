"""Per-user held-out split of a CSR block, shared by ``ingest`` and ``generate``."""

from __future__ import annotations

import numpy as np

from streamdp.errors import ParameterError
from streamdp.kernels.csr import split_holdout


def check_fraction(fraction: float) -> float:
    if not (0.0 <= fraction < 1.0) or not np.isfinite(fraction):
        raise ParameterError(f"--test-fraction must be in [0, 1), got {fraction}")
    return float(fraction)


def block_seed(seed: int | None, block: int, purpose: int = 0) -> int:
    """A 32-bit seed for block ``block``, independent across blocks and purposes."""
    ss = np.random.SeedSequence(entropy=0 if seed is None else int(seed), spawn_key=(int(purpose), int(block)))
    return int(ss.generate_state(1, dtype=np.uint32)[0])


def split_block(indptr, items, ratings, fraction: float, seed: int):
    """Hold out about ``fraction`` of each user's ratings (at most all but one).

    Each user with ``n`` ratings gives ``floor(fraction * n + 1/2)`` of them (capped at
    ``n - 1``) to the test part, so the per-user test fraction is within one rating
    of ``fraction``. Returns ``((indptr, items, ratings), (indptr, items, ratings))``
    for train and test.
    """
    n = len(indptr) - 1
    nnz = len(items)
    tr_ip = np.empty(n + 1, np.int64)
    te_ip = np.empty(n + 1, np.int64)
    tr_it = np.empty(nnz, np.int32)
    te_it = np.empty(nnz, np.int32)
    tr_r = np.empty(nnz, np.float32)
    te_r = np.empty(nnz, np.float32)
    a, t = split_holdout(np.asarray(indptr, np.int64), np.asarray(items, np.int32), np.asarray(ratings, np.float32),
                         float(fraction), np.uint32(seed), tr_ip, tr_it, tr_r, te_ip, te_it, te_r)
    return (tr_ip, tr_it[:a], tr_r[:a]), (te_ip, te_it[:t], te_r[:t])
