"""Ledger notes shared by methods."""

from __future__ import annotations


SEEDED_NOTE = "seeded run: reproducible, not private against whoever knows the seed"
#: A private release whose rating range is the store's observed one: only where no run selected it privately
#: (a method fitted directly, not through train or tune; public-private takes the public users' range instead).
OBSERVED_RANGE_NOTE = ("rating range observed from the data (its minimum and maximum, exact statistics), neither "
                       "declared nor selected privately: the guarantee does not cover them; train through train or "
                       "tune (which select it privately) or declare it at ingest (--rating-range)")


def seed_notes(method) -> list[str]:
    """The seeded-run note, when ``method`` has a seed (``ledger.privacy_warnings`` finds it by its words)."""
    return [SEEDED_NOTE] if method.seed is not None else []


def range_notes(rating_range_source: str, private: bool = True) -> list[str]:
    """The note of a private release on a rating range read off the data (neither declared nor selected privately:
    :mod:`streamdp.privacy.rating_range`); none for a non-private run, which claims nothing."""
    return [OBSERVED_RANGE_NOTE] if private and rating_range_source not in ("declared", "selected") else []


def joint_dp_notes(method, bounds: dict, what: str) -> list[str]:
    """The ledger notes of a joint-DP release (``fw``, ``svd``): what is released and why the per-user outputs are
    jointly DP (``what``), or non-private; a seeded run; a rating range that was not declared (``bounds``, the
    ledger's)."""
    notes = [f"joint DP: {what}, so the per-user outputs are (epsilon, delta)-jointly DP (Kearns et al. 2014)"
             if method.private else "non-private: --epsilon inf, no noise and no clipping"]
    return notes + seed_notes(method) + range_notes(bounds["rating_range_source"], method.private)
