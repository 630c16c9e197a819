"""Helpers for method tests: an in-memory (single-block) copy of a store."""

from __future__ import annotations

import numpy as np
import pytest


def one_block_copy(store, path: str):
    """The same ratings as ``store`` in ONE user block: a method run on it holds all data in memory at once."""
    from streamdp.storage.store import open_store
    from streamdp.storage.writer import StoreWriter

    splits = ("train", "test") if store.has_test else ("train",)
    with StoreWriter(path, n_users=store.n_users, n_items=store.n_items, block_users=store.n_users,
                     splits=splits) as w:
        for split in splits:
            parts = [store.read_block(b, split) for b in range(store.n_blocks)]
            ip = np.concatenate([[0]] + [p.indptr[1:] + off for p, off in
                                         zip(parts, np.cumsum([0] + [p.nnz for p in parts[:-1]]))])
            w.write_block(0, ip, np.concatenate([p.items for p in parts]), np.concatenate([p.ratings for p in parts]),
                          split=split)
        w.write_array("user_ids", store.user_ids())
        w.write_array("item_ids", store.item_ids())
        w.write_array("user_counts", store.user_counts())
        w.write_array("item_counts", store.item_counts())
        keep = {k: v for k, v in store.attrs.items()
                if k in ("rating_min", "rating_max", "rating_range_source", "sources", "created_with", "params")}
        w.finalize(keep)
    return open_store(path)


@pytest.fixture(scope="session")
def small_store_in_memory(small_store, tmp_path_factory):
    """``small_store`` as a single block."""
    return one_block_copy(small_store, str(tmp_path_factory.mktemp("stores") / "small_one_block.zarr"))


@pytest.fixture
def interrupted_after_checkpoint(monkeypatch):
    """``with interrupted_after_checkpoint(n): fit(...)``: the fit raises KeyboardInterrupt right after saving
    checkpoint ``n`` (as a Ctrl-C there would), and the block asserts that it did; ``Run.save`` is restored after."""
    import contextlib

    import streamdp.stream.driver as drv

    real_save = drv.Run.save

    @contextlib.contextmanager
    def interrupted(epoch: int):
        def save_then_stop(self, e, **arrays):
            real_save(self, e, **arrays)
            if e == epoch:
                raise KeyboardInterrupt

        monkeypatch.setattr(drv.Run, "save", save_then_stop)
        try:
            with pytest.raises(KeyboardInterrupt):
                yield
        finally:
            monkeypatch.setattr(drv.Run, "save", real_save)

    return interrupted
