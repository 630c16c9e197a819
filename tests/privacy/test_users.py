"""The number of users: released with noise, declared, or exact (streamdp.privacy.users)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from streamdp.errors import ParameterError
from streamdp.methods import get_method
from streamdp.privacy.users import COUNT_SHARE, check_users_bound, release_user_count


def test_the_count_is_a_laplace_release_at_its_share_of_epsilon():
    c = release_user_count(5000, epsilon=2.0, seed=3)
    assert c.source == "released" and c.release.mechanism == "laplace" and c.release.sensitivity == 1.0
    assert math.isclose(c.release.scale, 1.0 / (COUNT_SHARE * 2.0)) and math.isclose(c.epsilon, COUNT_SHARE * 2.0)
    assert c.n == release_user_count(5000, epsilon=2.0, seed=3).n  # a seeded run draws the same count
    assert c.spent() == [c.release] and c.elsewhere().spent() == []
    draws = np.array([release_user_count(5000, epsilon=2.0).n for _ in range(4000)]) - 5000  # OS entropy
    assert abs(np.mean(np.abs(draws)) / c.release.scale - 1.0) < 0.06  # Laplace: E|x| = b


def test_a_declared_bound_costs_nothing_and_refuses_a_larger_store():
    c = release_user_count(5000, epsilon=2.0, users_bound=8000)
    assert (c.n, c.source, c.spent(), c.epsilon) == (8000, "declared", [], 0.0)
    with pytest.raises(ParameterError, match="--users-bound 4000: the store has more users"):
        release_user_count(5000, epsilon=2.0, users_bound=4000)
    for bad in (0, -3, 2.5, True, "12"):
        with pytest.raises(ParameterError, match="--users-bound"):
            check_users_bound(bad)


def test_the_count_is_at_least_one_and_exact_without_privacy():
    assert release_user_count(1, epsilon=0.01, seed=0).n >= 1
    assert (release_user_count(1234, epsilon=math.inf).n, release_user_count(1234, epsilon=math.inf).source) == (
        1234, "exact")


def test_a_method_plans_the_count_first_and_stays_within_epsilon(small_store):
    from streamdp.privacy import epsilon_of

    for name in ("als", "oja", "fw", "svd", "sgld", "means"):
        m = get_method(name)(epsilon=1.0, delta=1e-6, seed=1, **({"rank": 3} if name != "means" else {}))
        p = m.plan(small_store)
        assert p.entries[0]["release"].startswith("number of users"), name
        assert m.user_count(small_store).source == "released"
        assert epsilon_of(p.event, 1e-6).epsilon <= 1.0 + 1e-9, name
