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
from streamdp.storage.view import StoreView

__all__ = ["RetiredView"]


class RetiredView(StoreView):
    """``store`` with the rows of the users ``mask`` does not keep left out (see the module docstring)."""

    recounts = True

    def __init__(self, store: RatingStore, mask):  # noqa: D107 - a view of an opened store (or of a view)
        super().__init__(store)
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

    def _filter(self, blk: Block, split: str) -> Block:
        keep = self.kept(blk.first_user, blk.first_user + blk.n_users)
        if keep.all():
            return blk
        indptr, items, ratings = keep_rows(blk.indptr, blk.items, blk.ratings, keep.view(np.uint8))
        return blk._replace(indptr=indptr, items=items, ratings=ratings)

    # what a read does not change is the store's (StoreView): block_nnz an upper bound, ids, per-item arrays
    def user_counts(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        counts = np.array(self._inner.user_counts(start, stop), copy=True)
        counts[~self.kept(start, start + len(counts))] = 0
        return counts

    def array(self, name: str):
        return self._inner.array(name)

    def _spec_args(self) -> tuple:
        return (self._mask,)

    def _spec_key(self):
        return self._mask.key
