"""Public privacy parameters that follow from public ones (the default delta)."""

from __future__ import annotations

import math

__all__ = ["default_delta"]


def default_delta(n_users: int) -> float:
    """The default delta: the largest power of ten <= min(1e-6, 1 / (10 n_users)), public and below 1/n_users.

    >>> default_delta(943), default_delta(200_000)
    (1e-06, 1e-07)
    """
    return 10.0 ** math.floor(math.log10(min(1e-6, 1.0 / (10.0 * max(int(n_users), 1)))))
