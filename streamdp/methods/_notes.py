"""Ledger notes shared by methods."""

from __future__ import annotations


SEEDED_NOTE = "seeded run: reproducible, not private against whoever knows the seed"
OBSERVED_RANGE_NOTE = "rating range was observed from the data, not declared; declare it at ingest for an exact guarantee"


def seed_notes(method) -> list[str]:
    """The seeded-run note, when ``method`` has a seed (``ledger.privacy_warnings`` finds it by its words)."""
    return [SEEDED_NOTE] if method.seed is not None else []


def range_notes(rating_range_source: str) -> list[str]:
    """The note of a rating range that was not declared at ingest (the guarantee assumes the declared range)."""
    return [OBSERVED_RANGE_NOTE] if rating_range_source != "declared" else []


def joint_dp_notes(method, bounds: dict, what: str) -> list[str]:
    """The ledger notes of a joint-DP release (``fw``, ``svd``): what is released and why the per-user outputs are
    jointly DP (``what``), or non-private; a seeded run; a rating range that was not declared (``bounds``, the
    ledger's)."""
    notes = [f"joint DP: {what}, so the per-user outputs are (epsilon, delta)-jointly DP (Kearns et al. 2014)"
             if method.private else "non-private: --epsilon inf, no noise and no clipping"]
    return notes + seed_notes(method) + range_notes(bounds["rating_range_source"])
