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


def test_given_item_weights_and_biases_replace_the_power_law_and_the_bias_draw(tmp_path):
    """``item_weights`` / ``item_bias``: items numbered by descending weight with their biases, drawn in proportion to
    the weights; the item factors stay the seed's; bad arrays are one-line errors."""
    import pytest

    from streamdp.errors import ParameterError
    from streamdp.storage.generate import generate_store

    w = np.array([1.0, 8.0, 0.0, 3.0, 4.0])
    b = np.array([0.1, 0.2, 0.3, 0.4, 0.5])
    st = generate_store(str(tmp_path / "w.zarr"), n_users=4_000, n_items=5, ratings_per_user=1.5, seed=3,
                        item_weights=w, item_bias=b)
    base = generate_store(str(tmp_path / "d.zarr"), n_users=10, n_items=5, ratings_per_user=1.5, seed=3)
    assert st.array("truth/item_bias")[:].tolist() == pytest.approx([0.2, 0.5, 0.4, 0.1, 0.3])
    assert st.array("truth/item_weight")[:].tolist() == [8.0, 4.0, 3.0, 1.0, 0.0]
    np.testing.assert_array_equal(st.array("truth/item_factors")[:], base.array("truth/item_factors")[:])
    counts = st.array("item_counts")[:].astype(np.float64)
    assert np.all(np.diff(counts) < 0)  # the weight-0 item only where a user rates all five (distinct items)
    # shares towards 8/16, 4/16, 3/16, 1/16 (a user's items are distinct: her second draw flattens them)
    assert counts[0] / counts[3] > 4 and counts[1] / counts[3] > 2
    assert st.attrs["params"]["item_weights"] == "given" and "item_weights" not in base.attrs["params"]
    for kw, words in (({"item_weights": [1.0, 2.0]}, "item_weights: expected 5 finite numbers"),
                      ({"item_weights": [0.0] * 5}, "not all 0"),
                      ({"item_bias": [0.0, 0.0, 0.0, 0.0, np.nan]}, "item_bias: expected 5 finite"),
                      ({"item_bias": [0.0] * 5, "factors": "uniform"}, "without biases")):
        with pytest.raises(ParameterError, match=words):
            generate_store(str(tmp_path / "x.zarr"), n_users=10, n_items=5, seed=3, **kw)
    assert not (tmp_path / "x.zarr").exists()


def test_given_item_factors_are_the_truth_times_the_interaction_scale_in_the_weights_order(tmp_path):
    """``item_factors``: the truth's factors at interaction scale 1, reordered with ``item_weights``; the ratings
    spread by them (a given all-zero truth leaves only the noise); bad shapes are one-line errors."""
    import pytest

    from streamdp.errors import ParameterError
    from streamdp.storage.generate import generate_store

    F = np.arange(10, dtype=np.float64).reshape(5, 2) / 10.0
    w = np.array([1.0, 8.0, 2.0, 3.0, 4.0])
    st = generate_store(str(tmp_path / "f.zarr"), n_users=50, n_items=5, rank=2, seed=3, item_weights=w,
                        item_factors=F, interaction_scale=2.0)
    np.testing.assert_allclose(st.array("truth/item_factors")[:], 2.0 * F[[1, 4, 3, 2, 0]], rtol=1e-6)
    assert st.attrs["params"]["item_factors"] == "given"
    flat = generate_store(str(tmp_path / "z.zarr"), n_users=400, n_items=5, rank=2, seed=3, noise=0.0,
                          rating_step=0.0, rating_min=-10, rating_max=10, item_factors=np.zeros((5, 2)),
                          item_bias=np.zeros(5), global_mean=0.0)
    assert np.all(flat.read_block(0).ratings == 0.0)
    for kw, words in (({"item_factors": np.zeros((5, 3))}, "item_factors: expected 5 x 2"),
                      ({"item_factors": np.zeros((5, 2)), "factors": "uniform"}, "draws its own truth")):
        with pytest.raises(ParameterError, match=words):
            generate_store(str(tmp_path / "x.zarr"), n_users=10, n_items=5, rank=2, seed=3, **kw)
