"""Small versions of the regime suite (``bench/regimes.py``): the same properties on stores that train in seconds."""

from __future__ import annotations

import math

import pytest

from bench import regimes

def _small(name: str, **override) -> tuple:
    """A regime of ``bench/regimes.py`` at a size that trains in seconds."""
    desc, kw = regimes.REGIMES[name]
    return f"{desc} (small)", {**kw, **override}


SMALL = {
    "sparse-small": _small("sparse", users=6_000, items=300, ratings_per_user=1.3),
    "jokes-small": _small("jokes14", users=4_000, items=60, ratings_per_user=20),
}


@pytest.mark.slow  # two regimes x several epsilons and methods: the longest property run (about 50 s busy)
@pytest.mark.parametrize("name", [
    "sparse-small",
    "jokes-small",
])
def test_small_regimes_hold_the_properties(tmp_path, monkeypatch, name):
    """One seed at epsilon 1, 10 and inf for als and means (fixed seeds; the tolerances are bench/regimes.py's)."""
    monkeypatch.setattr(regimes, "REGIMES", SMALL)
    eps = [1.0, 10.0, math.inf]
    r = regimes.run_regime(name, str(tmp_path), eps, seeds=1, methods=("als", "means"))
    assert regimes.check(r, eps, 1) == []
    table = regimes.table([r], eps)
    assert name in table and "als-biases" in table
