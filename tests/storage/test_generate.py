"""``streamdp generate``'s options that shape users' rating levels."""

from __future__ import annotations

import numpy as np


def test_activity_bias_moves_levels_with_activity(tmp_path):
    """``activity_bias`` a: a user of n ratings is shifted by a log(n / mean) (same seed, same users and items)."""
    import streamdp

    def user_means(**kw):
        st = streamdp.generate(str(tmp_path / f"a{len(kw)}.zarr"), users=3_000, items=100, ratings_per_user=2,
                               seed=2, **kw)
        blk = st.read_block(0, "train")
        cnt = np.diff(blk.indptr)
        return cnt, np.add.reduceat(blk.ratings.astype(np.float64), blk.indptr[:-1]) / cnt

    cnt, base = user_means()
    _, shifted = user_means(activity_bias=-1.0)
    heavy, light = cnt >= 8, cnt == 1
    # one-off raters move up by log 2 = 0.69, those of 8 or more down by at least log 4 (rounding, clipping blunt both)
    assert np.mean(shifted[light] - base[light]) > 0.4
    assert np.mean(shifted[heavy] - base[heavy]) < -0.6
