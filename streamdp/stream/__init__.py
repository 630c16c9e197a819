"""The block scheduler: memory budget, Dask, prefetch, per-user state on disk."""
