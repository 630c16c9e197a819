"""The base of every view of a store: :class:`StoreView`, and :class:`ViewSpec`, how a cluster worker makes it.

A view (a catalogue, a time window, a selected rating range, retired users left out, tune's held-out split) is
read like any store. It starts as a copy of the store's attributes (its info, paths, caches), reads its blocks
from the store (or the view) beneath it through :meth:`StoreView._filter`, and asks that store everything else:
a view overrides only what it changes. Views stack: a view of a view reads through both.

Public names: :class:`StoreView`, :class:`ViewSpec`.
"""

from __future__ import annotations

import numpy as np

from streamdp.storage.store import Block, RatingStore

__all__ = ["StoreView", "ViewSpec"]


class StoreView(RatingStore):
    """``store`` (an opened store or a view of one) read through :meth:`_filter`; everything else is its.

    A subclass defines ``_filter`` (what it changes in a block read), :meth:`_spec_args` (its constructor's
    arguments after the store, picklable) and, when those are not hashable, :meth:`_spec_key`.
    """

    #: Whether ``_filter`` changes which ratings a row holds: each user's count is then counted off the blocks read.
    recounts = False

    def __init__(self, store: RatingStore):  # noqa: D107 - a view of an opened store (or of a view)
        self.__dict__.update(store.__dict__)
        self._inner = store

    def _filter(self, blk: Block, split: str) -> Block:
        return blk

    def read_block(self, b: int, split: str = "train") -> Block:
        return self._filter(self._inner.read_block(b, split), split)

    def read_block_unchecked(self, b: int, split: str = "train"):
        blk, ok = self._inner.read_block_unchecked(b, split)
        return self._filter(blk, split), ok

    def block_user_counts(self, b: int, split: str = "train") -> np.ndarray:
        if self.recounts:
            return np.diff(self.read_block(b, split).indptr)
        return self._inner.block_user_counts(b, split)

    # block_nnz stays the inner store's: an upper bound where a view drops ratings, what memory planning needs;
    # the user side and the items are the inner store's (a segmented store merges them: storage/segments.py)
    def block_nnz(self, split: str = "train") -> np.ndarray:
        return self._inner.block_nnz(split)

    def block_digests(self, split: str = "train"):
        return self._inner.block_digests(split)

    def user_counts(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        return self._inner.user_counts(start, stop)

    def user_ids(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        return self._inner.user_ids(start, stop)

    def item_ids(self) -> np.ndarray:
        return self._inner.item_ids()

    def item_names(self) -> np.ndarray | None:
        return self._inner.item_names()

    def item_counts(self) -> np.ndarray:
        return self._inner.item_counts()

    def train_item_stats(self):
        return self._inner.train_item_stats()

    def check_chunks(self) -> None:
        self._inner.check_chunks()

    def read_ahead(self) -> None:
        self._inner.read_ahead()

    def changed(self) -> bool:
        return self._inner.changed()

    def check_unchanged(self) -> None:
        self._inner.check_unchanged()

    # -- on a cluster worker -------------------------------------------------------------
    def _spec_args(self) -> tuple:
        """The arguments after the store that make this view again (picklable)."""
        raise NotImplementedError(f"{type(self).__name__}: a view names the arguments that make it again")

    def _spec_key(self):
        """What tells this view from another of the same store and class (hashable): its arguments by default."""
        return self._spec_args()

    def remote_view(self):
        """What a cluster worker applies to the store it opens by path to see this view (picklable)."""
        return ViewSpec(type(self), self._inner.remote_view(), self._spec_args(), self._spec_key())


class ViewSpec:
    """How a cluster worker makes a view of the store it opens (:meth:`RatingStore.remote_view`):
    ``make(inner view or store, *args)``; equal keys share one view per process (:mod:`streamdp.stream.engine`).

    ``make`` is a class or a module-level function, ``inner`` the spec of the view beneath (``None``: the store
    itself), ``key`` hashable (default: ``args``).
    """

    def __init__(self, make, inner, args: tuple, key=None):  # noqa: D107 - picklable: a class, a spec, values
        self.make, self.inner, self.args = make, inner, args
        self.key = (make.__name__, None if inner is None else inner.key, args if key is None else key)

    def view(self, store: RatingStore) -> RatingStore:
        return self.make(store if self.inner is None else self.inner.view(store), *self.args)
