"""The coherence family of ``streamdp lowrank``'s benchmark: rows of norm <= 1, dominant rows hold their share."""

import numpy as np
import pytest

from streamdp.errors import ParameterError
from streamdp.storage.coherence import generate_coherence_store


def _dense(st):
    A = np.zeros((st.n_users, st.n_items))
    for blk in st.blocks():
        rows = np.repeat(np.arange(blk.n_users), np.diff(blk.indptr)) + blk.first_user
        A[rows, blk.items] = blk.ratings
    return A


def test_low_coherence_and_dominant_rows(tmp_path):
    lo = generate_coherence_store(str(tmp_path / "lo.zarr"), n_users=2000, n_items=40, rank=3, seed=1,
                                  block_users=300)
    hi = generate_coherence_store(str(tmp_path / "hi.zarr"), n_users=2000, n_items=40, rank=3, dominant_users=10,
                                  dominant_share=0.6, seed=1, block_users=300)
    for st in (lo, hi):
        A = _dense(st)
        assert st.n_ratings == 2000 * 40 and st.n_blocks == 7
        assert np.linalg.norm(A, axis=1).max() <= 1.0 + 1e-6
        assert float(st.rating_min) == -1.0 and st.attrs["rating_range_source"] == "declared"
    A_lo, A_hi = _dense(lo), _dense(hi)
    mu0 = [2000 * (A * A).sum(1).max() / (A * A).sum() for A in (A_lo, A_hi)]
    assert mu0[0] < 3 and mu0[1] > 100
    norms = (A_hi * A_hi).sum(1)
    top = np.sort(norms)[::-1]
    assert top[:10].sum() / norms.sum() == pytest.approx(0.6, abs=0.03)


def test_deterministic_in_seed(tmp_path):
    a = generate_coherence_store(str(tmp_path / "a.zarr"), n_users=100, n_items=10, rank=2, seed=3)
    b = generate_coherence_store(str(tmp_path / "b.zarr"), n_users=100, n_items=10, rank=2, seed=3)
    assert a.checksum == b.checksum


def test_bad_parameters(tmp_path):
    with pytest.raises(ParameterError, match="dominant_users"):
        generate_coherence_store(str(tmp_path / "x.zarr"), n_users=100, n_items=10, dominant_users=5)
    with pytest.raises(ParameterError, match="dominant_share"):
        generate_coherence_store(str(tmp_path / "x.zarr"), n_users=100, n_items=10, dominant_users=5,
                                 dominant_share=1.0)
    assert not (tmp_path / "x.zarr").exists()
