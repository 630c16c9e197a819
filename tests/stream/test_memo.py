"""BlockMemo: per-block values kept within a byte budget, and ials's passes from it equal to its streamed passes."""

from __future__ import annotations

import numpy as np
import pytest

from streamdp.methods import get_method
from streamdp.stream.engine import Engine
from streamdp.stream.memo import BlockMemo


def test_memo_keeps_within_its_budget_and_never_a_stale_value():
    memo = BlockMemo(2, budget=100)
    assert memo.put(0, (np.zeros(8),)) and memo.get(0) is not None  # 64 bytes
    assert not memo.put(1, (np.zeros(8),))  # 128 > 100: not kept
    assert memo.get(1) is None and not memo.complete and memo.split() == "train"
    assert not memo.put(0, (np.zeros(13),))  # a block's new value that does not fit drops the old one
    assert memo.get(0) is None
    assert memo.put(0, (np.zeros(4),)) and memo.put(1, (np.zeros(4), np.zeros(2, np.int32)))
    assert memo.complete and memo.split() is None


def test_memo_within_the_engine_budget_only(small_store):
    with Engine(small_store, workers=1, memory_limit="2GB") as eng:
        assert BlockMemo.within(eng, 10 << 20) is not None
        assert BlockMemo.within(eng, 4 << 30) is None  # more than the limit


@pytest.mark.parametrize("epsilon", [float("inf"), 1.0])
def test_ials_from_the_memo_is_the_streamed_fit_bit_for_bit(small_store, monkeypatch, epsilon):
    """The memo holds what each pass derives again (the pairs, non-private the users' rows): the same model."""

    def fit():
        m = get_method("ials")(epsilon=epsilon, delta=1e-6, rank=4, seed=3, iters=3)
        with Engine(small_store, workers=2, memory_limit="2GB") as eng:
            return m.fit(small_store, eng).item_factors

    made, within = [], BlockMemo.within.__func__

    def spy(cls, *a, **k):
        made.append(within(cls, *a, **k))
        return made[-1]

    monkeypatch.setattr(BlockMemo, "within", classmethod(spy))
    kept = fit()
    assert made[0] is not None and made[0].complete  # every block from the memo after the first pass
    monkeypatch.setattr(BlockMemo, "within", classmethod(lambda cls, *a, **k: None))
    np.testing.assert_array_equal(kept, fit())
