"""``generate --timestamps``: a time order for a generated store (issue 43: the replay of weekly refreshes)."""

from __future__ import annotations

import numpy as np
import pytest

from streamdp.errors import ParameterError
from streamdp.storage.generate import generate_store
from streamdp.storage.timegen import DAY, START


def _all(st, split="train"):
    out = [st.read_block_times(b, split) for b in range(st.n_blocks)]
    users = np.concatenate([np.repeat(np.arange(blk.n_users), np.diff(blk.indptr)) + blk.first_user
                            for blk, _ in out])
    return (users, np.concatenate([blk.items for blk, _ in out]), np.concatenate([blk.ratings for blk, _ in out]),
            np.concatenate([t for _, t in out]))


def test_generated_times_follow_arrivals_and_leave_the_default_store_unchanged(tmp_path):
    kw = dict(n_users=600, n_items=80, ratings_per_user=12, rank=3, seed=3, test_fraction=0.2, block_users=150)
    plain = generate_store(str(tmp_path / "p.zarr"), **kw)
    timed = generate_store(str(tmp_path / "t.zarr"), timestamps=70, **kw)
    assert not plain.has_times and "timestamps" not in plain.attrs["params"]
    for split in ("train", "test"):  # no drift: the same ratings, with times beside them
        assert [blk.ratings.tolist() for blk in plain.blocks(split)] == [blk.ratings.tolist()
                                                                         for blk in timed.blocks(split)]
    assert timed.checksum != plain.checksum  # the times are content: the checksum covers them
    assert timed.attrs["params"]["timestamps"] == 70.0 and timed.has_times
    for split in ("train", "test"):
        u, i, r, t = _all(timed, split)
        assert (t >= START).all() and (t < START + 70 * DAY).all()
        assert (t >= START + np.floor(70 * DAY * u / 600)).all()  # nobody rates before arriving
    appears = np.asarray(timed.array("truth/item_appears")[...])
    assert 0 < (appears > START).mean() < 0.5  # some items appear during the span
    u, i, _, t = _all(timed)
    assert (t >= appears[i]).all()  # nobody rates an item before it appears
    assert np.median(t[u < 150]) < np.median(t[u >= 450])  # the first users come first


def test_taste_drift_moves_ratings_with_time_and_options_are_checked(tmp_path):
    kw = dict(n_users=800, n_items=20, ratings_per_user=15, rank=2, seed=1, block_users=400)
    st = generate_store(str(tmp_path / "d.zarr"), timestamps=100, taste_drift=3.0, **kw)
    base = generate_store(str(tmp_path / "b.zarr"), timestamps=100, **kw)
    _, i, r, t = _all(st)
    _, i0, r0, _ = _all(base)
    np.testing.assert_array_equal(i, i0)
    late = t > START + 50 * DAY
    shift = r.astype(float) - r0
    # per item, the ratings' change grows with time in the item's direction: late minus early has that sign
    gaps = [shift[late & (i == k)].mean() - shift[~late & (i == k)].mean() for k in range(5)]
    assert max(abs(g) for g in gaps) > 0.5
    with pytest.raises(ParameterError, match="--taste-drift: only with --timestamps"):
        generate_store(str(tmp_path / "x.zarr"), taste_drift=1.0, **kw)
    with pytest.raises(ParameterError, match="--timestamps must be a positive number of days"):
        generate_store(str(tmp_path / "x.zarr"), timestamps=0, **kw)
