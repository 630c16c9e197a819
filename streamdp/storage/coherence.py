"""Dense low-rank stores of controlled coherence, for ``streamdp lowrank``'s benchmark and tests.

Hardt & Roth's Gaussian measurements beat randomized response on matrices of low
*coherence* (no row carries much of the Frobenius norm; their Def. 5.1) and lose
that edge when a few rows dominate. :func:`generate_coherence_store` writes such
matrices as rating stores, block by block through
:class:`~streamdp.storage.writer.StoreWriter` (nothing ``n_users x n_items`` in
memory): every user rates every item, ratings are continuous in ``[-1, 1]``
(declared, midpoint 0, so ``streamdp lowrank``'s matrix is the ratings themselves),
and every row has L2 norm at most 1 (so ``--clip 1`` clips nothing).

The model, with ``r = rank``:

* **bulk rows**: ``a_i = eta (u_i V^T / sqrt(r) + noise g_i / sqrt(n_items)) / sqrt(1 + noise^2)``
  with ``V`` a random orthonormal ``n_items x r`` basis, ``u_i ~ N(0, I_r)`` and
  ``g_i ~ N(0, I)``: random factors, low coherence;
* **dominant rows** (``dominant_users`` of them, at random positions): unit-norm
  rows ``w_i V_D^T / ||w_i||`` in ``r_D = max(1, r // 2)`` directions ``V_D`` orthogonal
  to ``V``, their own part of the spectrum, so that the top left singular vectors
  of those directions sit on a few rows (high coherence);
* ``eta`` is set so that the dominant rows hold a share ``dominant_share`` of
  ``||A||_F^2``: ``eta^2 = d (1 - f) / (f (n_users - d))``; ``dominant_share = 0``
  (or ``dominant_users = 0``) gives the incoherent matrix with ``eta = 1``.

The best rank-``(r + r_D)`` approximation then misses only the ``noise`` part.
Deterministic in ``seed`` (each block has its own stream).

Examples
--------
>>> import os, tempfile
>>> s = generate_coherence_store(os.path.join(tempfile.mkdtemp(), "c.zarr"), n_users=300, n_items=20, rank=2,
...                              dominant_users=3, dominant_share=0.5, seed=1)
>>> s.n_ratings, float(s.rating_min), float(s.rating_max)
(6000, -1.0, 1.0)
"""

from __future__ import annotations

import math
import time

import numpy as np

from streamdp.errors import ParameterError
from streamdp.storage.store import RatingStore, open_store
from streamdp.storage.writer import StoreWriter

__all__ = ["generate_coherence_store", "coherence_basis"]


def coherence_basis(n_items: int, rank: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The bulk basis ``V`` (``n_items x rank``) and the dominant rows' basis ``V_D`` (orthogonal to ``V``)."""
    rd = max(1, rank // 2)
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0,)))
    if rank + rd > n_items:
        raise ParameterError(f"--rank {rank}: needs rank + rank // 2 <= n_items ({n_items})")
    B = np.linalg.qr(rng.standard_normal((n_items, rank + rd)))[0]
    return B[:, :rank], B[:, rank:]


def generate_coherence_store(out: str, *, n_users: int, n_items: int, rank: int = 5, dominant_users: int = 0,
                             dominant_share: float = 0.0, noise: float = 0.1, seed: int = 0,
                             block_users: int | None = None, force: bool = False) -> RatingStore:
    """Write the dense store described in the module docstring to ``out`` and return it opened."""
    d = int(dominant_users)
    f = float(dominant_share)
    if n_users < 1 or n_items < 1 or rank < 1:
        raise ParameterError("n_users, n_items and rank must be >= 1")
    if not 0 <= f < 1:
        raise ParameterError(f"dominant_share must be in [0, 1), got {f}")
    if not 0 <= d < n_users or (f > 0) != (d > 0):
        raise ParameterError(f"dominant_users must be in [1, n_users) with a dominant_share > 0 (or both 0), "
                             f"got {d} and {f}")
    if not noise >= 0:
        raise ParameterError(f"noise must be >= 0, got {noise}")
    V, VD = coherence_basis(n_items, rank, seed)
    eta = math.sqrt(d * (1.0 - f) / (f * (n_users - d))) if d else 1.0
    eta = min(eta, 1.0)
    master = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(1,)))
    dominant = np.zeros(n_users, bool)
    dominant[master.choice(n_users, size=d, replace=False)] = True
    bu = int(block_users or max(1, (1 << 20) // n_items))
    t0 = time.perf_counter()
    with StoreWriter(out, n_users=n_users, n_items=n_items, block_users=bu, force=force) as w:
        uid = w.create_array("user_ids", shape=(n_users,), dtype="int64", chunks=(bu,))
        ucnt = w.create_array("user_counts", shape=(n_users,), dtype="int64", chunks=(bu,))
        for b in range(w.n_blocks):
            first, end = b * bu, min((b + 1) * bu, n_users)
            nb = end - first
            rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(2, b)))
            U = rng.standard_normal((nb, rank))
            rows = (U @ V.T / math.sqrt(rank) + noise * rng.standard_normal((nb, n_items)) / math.sqrt(n_items))
            rows *= eta / math.sqrt(1.0 + noise * noise)
            dom = dominant[first:end]
            if dom.any():
                W = rng.standard_normal((int(dom.sum()), VD.shape[1]))
                W /= np.linalg.norm(W, axis=1, keepdims=True)
                rows[dom] = W @ VD.T
            norms = np.linalg.norm(rows, axis=1, keepdims=True)
            rows = rows / np.maximum(norms, 1.0)  # every row norm <= 1, so every entry in [-1, 1]
            ratings = np.clip(rows, -1.0, 1.0).astype(np.float32).ravel()
            indptr = np.arange(0, nb * n_items + 1, n_items, dtype=np.int64)
            items = np.tile(np.arange(n_items, dtype=np.int32), nb)
            w.write_block(b, indptr, items, ratings)
            uid[first:end] = np.arange(first, end, dtype=np.int64)
            ucnt[first:end] = n_items
        w.write_array("item_ids", np.arange(n_items, dtype=np.int64))
        w.write_array("item_counts", np.full(n_items, n_users, np.int64))
        w.finalize({"rating_min": -1.0, "rating_max": 1.0, "rating_range_source": "declared", "sources": [],
                    "created_with": "generate-coherence",
                    "params": dict(n_users=n_users, n_items=n_items, rank=rank, dominant_users=d,
                                   dominant_share=f, noise=noise, seed=seed, eta=eta),
                    "seconds": round(time.perf_counter() - t0, 3)})
    return open_store(out)
