"""Per-user held-out splits of a CSR block: random (shared by ``ingest`` and ``generate``), by time, by a mask."""

from __future__ import annotations

import numpy as np

from streamdp.errors import ParameterError
from streamdp.kernels.csr import hold_out_latest, split_holdout, split_masked


def check_fraction(fraction: float) -> float:
    if not (0.0 <= fraction < 1.0) or not np.isfinite(fraction):
        raise ParameterError(f"--test-fraction must be in [0, 1), got {fraction}")
    return float(fraction)


def block_seed(seed: int | None, block: int, purpose: int = 0) -> int:
    """A 32-bit seed for block ``block``, independent across blocks and purposes."""
    ss = np.random.SeedSequence(entropy=0 if seed is None else int(seed), spawn_key=(int(purpose), int(block)))
    return int(ss.generate_state(1, dtype=np.uint32)[0])


def _outputs(n: int, n_train: int, n_test: int):
    return (np.empty(n + 1, np.int64), np.empty(n_train, np.int32), np.empty(n_train, np.float32),
            np.empty(n + 1, np.int64), np.empty(n_test, np.int32), np.empty(n_test, np.float32))


def _with_times(split, indptr, items, ratings, times):
    """``split`` (a function of ``(indptr, items, ratings)`` that only moves ratings) also moving ``times``: it
    is run on each rating's position in place of its item, and items and times are gathered by the positions."""
    pos = np.arange(len(items), dtype=np.int32)
    items, times = np.asarray(items, np.int32), np.asarray(times, np.int64)
    return tuple((ip, items[p], r, times[p]) for ip, p, r in split(indptr, pos, ratings))


def split_by_mask(indptr, items, ratings, held, *, times=None):
    """``((indptr, items, ratings), (indptr, items, ratings))``: the ratings with ``held == 0``, then the others
    (with ``times``, each part also has its ratings' times, fourth)."""
    if times is not None:
        return _with_times(lambda ip, it, r: split_by_mask(ip, it, r, held), indptr, items, ratings, times)
    held = np.asarray(held, np.uint8)
    n_test = int(np.count_nonzero(held))
    tr_ip, tr_it, tr_r, te_ip, te_it, te_r = _outputs(len(indptr) - 1, len(items) - n_test, n_test)
    a, t = split_masked(np.asarray(indptr, np.int64), np.asarray(items, np.int32), np.asarray(ratings, np.float32),
                        np.asarray(held, np.uint8), tr_ip, tr_it, tr_r, te_ip, te_it, te_r)
    return (tr_ip, tr_it[:a], tr_r[:a]), (te_ip, te_it[:t], te_r[:t])


def latest_mask(indptr, ts, *, fraction: float = 0.0, last_n: int = 0) -> np.ndarray:
    """uint8 mask of each user's latest ratings (:func:`streamdp.kernels.csr.hold_out_latest`)."""
    held = np.zeros(len(ts), np.uint8)
    hold_out_latest(np.asarray(indptr, np.int64), np.asarray(ts, np.int64), float(fraction), int(last_n), held)
    return held


def split_block(indptr, items, ratings, fraction: float, seed: int, *, times=None):
    """Hold out about ``fraction`` of each user's ratings (at most all but one).

    Each user with ``n`` ratings gives ``floor(fraction * n + 1/2)`` of them (capped at
    ``n - 1``) to the test part, so the per-user test fraction is within one rating
    of ``fraction``. Returns ``((indptr, items, ratings), (indptr, items, ratings))``
    for train and test (with ``times``, four arrays each: the choice depends on no item, so it is the same).
    """
    if times is not None:
        return _with_times(lambda ip, it, r: split_block(ip, it, r, fraction, seed), indptr, items, ratings, times)
    n = len(indptr) - 1
    nnz = len(items)
    tr_ip, tr_it, tr_r, te_ip, te_it, te_r = _outputs(n, nnz, nnz)
    a, t = split_holdout(np.asarray(indptr, np.int64), np.asarray(items, np.int32), np.asarray(ratings, np.float32),
                         float(fraction), np.uint32(seed), tr_ip, tr_it, tr_r, te_ip, te_it, te_r)
    return (tr_ip, tr_it[:a], tr_r[:a]), (te_ip, te_it[:t], te_r[:t])
