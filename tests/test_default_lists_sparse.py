"""The default ``train --epsilon 1`` model's lists on sparse data (most users with one rating) hold the exact chart.

Issue 42, part 5: measured on generated stores shaped like its 72,000-user product set (docs/ranking.md, the
default's lists on sparse data); the default releases item biases only there, and its list score (the predicted
rating plus the released counts' term) lists at or above the exact chart. These tests keep it so.
"""

from __future__ import annotations

import numpy as np
import pytest


def _lists_and_chart(path: str, seeds) -> tuple[list, float]:
    """``([Recall@10 of the default model over every user, per seed], the exact chart's)`` at epsilon 1."""
    import streamdp
    from streamdp.serving.evaluate import evaluate_model
    from streamdp.storage.store import open_store

    st = open_store(path)
    out, chart = [], None
    for seed in seeds:
        model = streamdp.train(st, epsilon=1.0, seed=seed, workers=1, evaluate=False)
        r = evaluate_model(model, st, workers=1, baselines=False, ranking_users="all")["ranking"]
        out.append(r["recall"])
        chart = r["baselines"]["popularity"]["recall"]
    return out, chart


def test_default_lists_hold_the_chart_where_most_users_have_one_rating(tmp_path):
    """A small sparse store (8,000 users x 300 items, 1.4 ratings a user, about 80% with one); one seed: a cheap
    guard of the slow test below (measured 0.4487 against the chart's 0.4423; seeds 1-5 0.4423-0.4487). Its 156
    users with a relevant held-out rating make one hit 0.006: hence 0.98x."""
    import streamdp

    path = str(tmp_path / "sparse.zarr")
    streamdp.generate(path, users=8000, items=300, ratings_per_user=1.4, seed=3, test_fraction=0.2)
    (rec,), chart = _lists_and_chart(path, [1])
    assert rec >= 0.98 * chart, (rec, chart)


@pytest.mark.slow
def test_default_lists_hold_the_chart_on_the_product_shape(tmp_path):
    """docs/ranking.md's product shape (72,000 x 2,400, 86% of users with one rating); seeds 1-3, mean. Measured
    0.1587 / 0.1581 / 0.1560 against the exact chart's 0.1539 (1.024x; RMSE 1.0091 / 1.0085 / 1.0121); asserted: at least the exact chart, less a standard error's worth (0.995x)."""
    import streamdp

    path = str(tmp_path / "p.zarr")
    streamdp.generate(path, users=72000, items=2400, ratings_per_user=1.4, user_exponent=1.3, item_exponent=0.75,
                      user_bias_std=0.4, activity_bias=-0.3, seed=5, test_fraction=0.2)
    recs, chart = _lists_and_chart(path, [1, 2, 3])
    assert np.mean(recs) >= 0.995 * chart, (recs, chart)
