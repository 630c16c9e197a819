"""Mechanisms, contribution bounding, accountant wrappers, the ledger. Imports nothing from methods or kernels."""
