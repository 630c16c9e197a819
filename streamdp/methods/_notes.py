"""Ledger notes shared by methods."""

from __future__ import annotations


def joint_dp_notes(method, bounds: dict, what: str) -> list[str]:
    """The ledger notes of a joint-DP release (``fw``, ``svd``): what is released and why the per-user outputs are
    jointly DP (``what``), or non-private; a seeded run; a rating range that was not declared (``bounds``, the
    ledger's)."""
    notes = [f"joint DP: {what}, so the per-user outputs are (epsilon, delta)-jointly DP (Kearns et al. 2014)"
             if method.private else "non-private: --epsilon inf, no noise and no clipping"]
    if method.seed is not None:
        notes.append("seeded run: reproducible, not private against whoever knows the seed")
    if bounds["rating_range_source"] != "declared":
        notes.append("rating range was observed from the data, not declared; declare it at ingest for an exact "
                     "guarantee")
    return notes
