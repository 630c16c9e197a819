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

__all__ = ["RangeView"]


class RangeView(RatingStore):
    """``store`` (a store or a view of one) with the rating range ``[lo, hi]``, selected privately."""

    def __init__(self, store: RatingStore, lo: float, hi: float):  # noqa: D107 - a view of an opened store
        self.__dict__.update(store.__dict__)
        self._range_inner = store
        self._range = (float(lo), float(hi))
        self.info = replace(store.info, rating_min=float(lo), rating_max=float(hi), rating_range_source="selected")

    # -- blocks: the training ratings clipped into the range -------------------------------
    def _clip(self, blk: Block, split: str) -> Block:
        if split != "train" or not blk.nnz:
            return blk
        lo, hi = np.float32(self._range[0]), np.float32(self._range[1])
        r = blk.ratings
        if r.min() >= lo and r.max() <= hi:
            return blk
        return Block(blk.first_user, blk.indptr, blk.items, np.clip(r, lo, hi))

    def read_block(self, b: int, split: str = "train") -> Block:
        return self._clip(self._range_inner.read_block(b, split), split)

    def read_block_unchecked(self, b: int, split: str = "train"):
        blk, ok = self._range_inner.read_block_unchecked(b, split)
        return self._clip(blk, split), ok

    # -- everything else is the inner store's (a catalogue view's items, a segmented store's users) --
    def block_user_counts(self, b: int, split: str = "train"):
        return self._range_inner.block_user_counts(b, split)

    def block_nnz(self, split: str = "train"):
        return self._range_inner.block_nnz(split)

    def block_digests(self, split: str = "train"):
        return self._range_inner.block_digests(split)

    def user_counts(self, start: int = 0, stop: int | None = None):
        return self._range_inner.user_counts(start, stop)

    def user_ids(self, start: int = 0, stop: int | None = None):
        return self._range_inner.user_ids(start, stop)

    def item_ids(self):
        return self._range_inner.item_ids()

    def item_names(self):
        return self._range_inner.item_names()

    def item_counts(self):
        return self._range_inner.item_counts()

    def train_item_stats(self):
        return self._range_inner.train_item_stats()  # the owner's exact sums (evaluate's baselines), never released

    def check_chunks(self) -> None:
        self._range_inner.check_chunks()

    def changed(self) -> bool:
        return self._range_inner.changed()

    def check_unchanged(self) -> None:
        self._range_inner.check_unchanged()

    def remote_view(self):
        """What a cluster worker applies to the store it opens by path to see this view (picklable)."""
        return _Spec(self._range_inner.remote_view(), self._range)


class _Spec:
    """The view to make on a worker: the inner view's spec (``None``: the store itself), then the range."""

    def __init__(self, inner, rng: tuple):
        self.inner, self.range = inner, rng
        self.key = ("RangeView", None if inner is None else inner.key, rng)

    def view(self, store: RatingStore) -> RangeView:
        return RangeView(store if self.inner is None else self.inner.view(store), *self.range)
