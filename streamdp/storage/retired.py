"""A store seen without some of its users: :class:`RetiredView`, the rows of users a release leaves out.

A store with a per-user privacy budget (:mod:`streamdp.privacy.filter`) retires a user
whose next release would cross her cap: she is left out of that release and of every
later one. The view makes the store look as if her ratings were gone: every block read
through it has her row empty (a Numba kernel, :func:`streamdp.kernels.csr.keep_rows`, one
pass a block), while the user indices, ``n_users`` and the per-item arrays stay the
store's (as :class:`~streamdp.storage.catalogue.CatalogueView` keeps the user side).

Which users it keeps is asked of ``mask``, an object with ``keep(lo, hi)`` (a boolean
array for users ``lo .. hi - 1``), ``key`` (hashable, naming the mask) and picklable: a
cluster worker applies the same view (:meth:`RetiredView.remote_view`). The mask is
read one block's users at a time; nothing of size ``n_users`` is held.
:meth:`RetiredView.use` swaps the mask (a release reads its pre-fit statistics with the
users retired before it left out, then fits with those it retires itself left out too).
"""

from __future__ import annotations

import numpy as np

from streamdp.kernels.csr import keep_rows
from streamdp.storage.store import Block, RatingStore

__all__ = ["RetiredView"]


class RetiredView(RatingStore):
    """``store`` with the rows of the users ``mask`` does not keep left out (see the module docstring)."""

    def __init__(self, store: RatingStore, mask):  # noqa: D107 - a view of an opened store (or of a view)
        self.__dict__.update(store.__dict__)
        self._inner = store
        self._mask = mask

    def use(self, mask) -> None:
        """Read through ``mask`` from now on (views made of this one see the change)."""
        self._mask = mask

    @property
    def mask(self):
        return self._mask

    def kept(self, lo: int, hi: int) -> np.ndarray:
        """Which of users ``lo .. hi - 1`` the view keeps (a boolean array)."""
        return np.asarray(self._mask.keep(lo, hi), dtype=bool)

    def _filter(self, blk: Block) -> Block:
        keep = self.kept(blk.first_user, blk.first_user + blk.n_users)
        if keep.all():
            return blk
        indptr, items, ratings = keep_rows(blk.indptr, blk.items, blk.ratings, keep.view(np.uint8))
        return blk._replace(indptr=indptr, items=items, ratings=ratings)

    def read_block(self, b: int, split: str = "train") -> Block:
        return self._filter(self._inner.read_block(b, split))

    def read_block_unchecked(self, b: int, split: str = "train"):
        blk, ok = self._inner.read_block_unchecked(b, split)
        return self._filter(blk), ok

    def block_user_counts(self, b: int, split: str = "train") -> np.ndarray:
        return np.diff(self.read_block(b, split).indptr)

    # what a read does not change is the store's: block_nnz an upper bound (memory planning), ids, per-item arrays
    def block_nnz(self, split: str = "train") -> np.ndarray:
        return self._inner.block_nnz(split)

    def block_digests(self, split: str = "train"):
        return self._inner.block_digests(split)

    def user_counts(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        counts = np.array(self._inner.user_counts(start, stop), copy=True)
        counts[~self.kept(start, start + len(counts))] = 0
        return counts

    def user_ids(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        return self._inner.user_ids(start, stop)

    def item_ids(self) -> np.ndarray:
        return self._inner.item_ids()

    def item_names(self):
        return self._inner.item_names()

    def item_counts(self) -> np.ndarray:
        return self._inner.item_counts()

    def train_item_stats(self):
        return self._inner.train_item_stats()

    def check_chunks(self) -> None:
        self._inner.check_chunks()

    def array(self, name: str):
        return self._inner.array(name)

    def remote_view(self):
        """What a cluster worker applies to the store it opens by path to see this view (picklable)."""
        return _Spec(self._inner.remote_view(), self._mask)


class _Spec:
    """The view to apply on a worker: ``spec.view(store)`` (the inner view's first, when there is one)."""

    def __init__(self, inner, mask):
        self.inner, self.mask = inner, mask
        self.key = ("retired", None if inner is None else inner.key, mask.key)

    def view(self, store: RatingStore) -> RetiredView:
        return RetiredView(store if self.inner is None else self.inner.view(store), self.mask)
