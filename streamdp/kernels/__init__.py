"""Numba kernels on raw arrays only (no objects, no I/O)."""
