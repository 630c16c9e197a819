"""A store seen through a rating range selected privately: :class:`RangeView`.

A private run on a store whose rating range was not declared at ingest reads it through this view
(:mod:`streamdp.privacy.rating_range` selects the range): ``rating_min``, ``rating_max`` and
``rating_range_source`` (``"selected"``) are the selected range's, and every training rating outside it is
clipped into it as the block is read (post-processing of the released range: each user's ratings are mapped
by a public function). Methods clip and scale their noise to ``store.rating_min``/``rating_max`` and read
blocks like any store's, so none of them needs to know. The test split (the owner's evaluation, never
released) is read as it is. Public names: :class:`RangeView`.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from streamdp.storage.store import Block, RatingStore
from streamdp.storage.view import StoreView

__all__ = ["RangeView"]


class RangeView(StoreView):
    """``store`` (a store or a view of one) with the rating range ``[lo, hi]``, selected privately; all but its
    training ratings is the inner store's (a catalogue view's items, a segmented store's users)."""

    def __init__(self, store: RatingStore, lo: float, hi: float):  # noqa: D107 - a view of an opened store
        super().__init__(store)
        self._range_inner = store  # the store without its selected range (serving/evaluate.py reads it)
        self._range = (float(lo), float(hi))
        self.info = replace(store.info, rating_min=float(lo), rating_max=float(hi), rating_range_source="selected")

    def _filter(self, blk: Block, split: str) -> Block:
        """The training ratings clipped into the range."""
        if split != "train" or not blk.nnz:
            return blk
        lo, hi = np.float32(self._range[0]), np.float32(self._range[1])
        r = blk.ratings
        if r.min() >= lo and r.max() <= hi:
            return blk
        return Block(blk.first_user, blk.indptr, blk.items, np.clip(r, lo, hi))

    # train_item_stats stays the inner store's: the owner's exact sums (evaluate's baselines), never released
    def _spec_args(self) -> tuple:
        return self._range
