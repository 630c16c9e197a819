"""Accountant wrapper: PLD vs RDP, parallel composition, pure-DP events, CLI vs dp-accounting."""

from __future__ import annotations

import json
import math

import dp_accounting
import pytest
from click.testing import CliRunner
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant

from streamdp.cli import main
from streamdp.errors import ParameterError
from streamdp.privacy import (
    check_privacy_params,
    compose,
    epsilon_of,
    event_from_dict,
    event_to_dict,
    gaussian_event,
    huber_event,
    laplace_event,
    parallel,
)


@pytest.mark.parametrize("z,count,delta", [(1.0, 1, 1e-5), (2.0, 100, 1e-6), (5.0, 1000, 1e-8), (0.8, 10, 1e-3)])
def test_pld_below_rdp_within_known_gap(z, count, delta):
    """PLD is tight and RDP an upper bound: 0 <= rdp - pld, and RDP is within 25% of PLD for Gaussians.

    (The RDP-to-(eps, delta) conversion loses at most a log(1/delta)/(alpha-1)-type term; over
    these cases the measured gap is 3-15%.)
    """
    r = epsilon_of(gaussian_event(z, count), delta)
    assert r.epsilon <= r.epsilon_rdp * (1 + 1e-6)
    assert r.epsilon_rdp <= 1.25 * r.epsilon


def test_matches_dp_accounting_directly():
    ev = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(1.3), 12)  # (50: 4 s of direct PLD)
    pld = PLDAccountant(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE, value_discretization_interval=1e-4)
    rdp = RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    r = epsilon_of(gaussian_event(1.3, 12), 1e-6)
    assert r.epsilon == pytest.approx(pld.compose(ev).get_epsilon(1e-6), rel=2e-4)
    assert r.epsilon_rdp == pytest.approx(rdp.compose(ev).get_epsilon(1e-6), rel=1e-12)
    lap = epsilon_of(laplace_event(2.0, 3), 1e-6)
    direct = PLDAccountant(value_discretization_interval=1e-4).compose(dp_accounting.LaplaceDpEvent(2.0), 3)
    assert lap.epsilon == pytest.approx(direct.get_epsilon(1e-6), rel=1e-4)
    assert lap.epsilon <= 1.5 + 1e-4  # basic composition of three 0.5-DP releases bounds it


def test_parallel_composition_costs_one_step():
    """A pass over 200 disjoint user blocks (each user in one step) costs what one step costs."""
    one = epsilon_of(gaussian_event(3.0), 1e-6)
    blocks = parallel([gaussian_event(3.0)] * 200)
    assert blocks == gaussian_event(3.0)
    assert epsilon_of(blocks, 1e-6).epsilon == one.epsilon
    # two passes of the same parallel step cost two steps, not 400
    two = epsilon_of(compose([blocks, blocks]), 1e-6).epsilon
    assert two == pytest.approx(epsilon_of(gaussian_event(3.0, 2), 1e-6).epsilon, rel=1e-3)
    assert two < epsilon_of(gaussian_event(3.0, 400), 1e-6).epsilon / 5
    # blocks with different noise: the least noisy dominates
    assert parallel([gaussian_event(3.0), gaussian_event(2.0)]) == gaussian_event(2.0)
    assert parallel([huber_event(0.1), huber_event(0.3)]) == huber_event(0.3)
    with pytest.raises(ParameterError, match="differ in kind"):
        parallel([gaussian_event(3.0), huber_event(0.3)])


def test_pure_dp_event_accounting():
    """One eps-DP release: PLD epsilon <= eps, and -> eps as delta -> 0; k releases <= k eps (basic)."""
    r = epsilon_of(huber_event(0.7), 1e-12)
    assert r.epsilon == pytest.approx(0.7, abs=1e-3) and r.epsilon <= 0.7 + 1e-4
    assert r.epsilon_rdp >= r.epsilon - 1e-3
    k = epsilon_of(huber_event(0.1, 100), 1e-6)
    assert k.epsilon < 10.0  # advanced composition beats basic
    # Laplace(b) with sensitivity 1 is 1/b pure DP: generic pure-DP accounting is never tighter
    lap = epsilon_of(laplace_event(10.0, 100), 1e-6).epsilon
    assert lap <= k.epsilon + 1e-3
    # mixed composition is supported by both accountants
    m = epsilon_of(compose([gaussian_event(2.0, 5), huber_event(0.2, 3)]), 1e-6)
    assert m.epsilon > epsilon_of(gaussian_event(2.0, 5), 1e-6).epsilon
    assert math.isfinite(m.epsilon_rdp)


def test_non_private_event_is_infinite():
    r = epsilon_of(gaussian_event(0.0, 3), 1e-6)
    assert math.isinf(r.epsilon) and math.isinf(r.epsilon_rdp)


def test_event_dict_roundtrip():
    e = compose([gaussian_event(1.0, 3), laplace_event(2.0), huber_event(0.4, 2)])
    d = event_to_dict(e)
    json.dumps(d)
    assert event_from_dict(json.loads(json.dumps(d))) == e
    with pytest.raises(ParameterError, match="unknown privacy event"):
        event_from_dict({"name": "NoSuchEvent"})


@pytest.mark.parametrize("eps,delta,n,msg", [
    (0.0, 1e-6, None, "epsilon"), (-1.0, 1e-6, None, "epsilon"), (float("nan"), 1e-6, None, "epsilon"),
    (1.0, 0.0, None, "delta"), (1.0, 1.0, None, "delta"), (1.0, -1e-3, None, "delta"),
    (1.0, 1e-3, 10_000, "1/n_users"),
])
def test_invalid_privacy_parameters(eps, delta, n, msg):
    with pytest.raises(ParameterError, match=msg):
        check_privacy_params(eps, delta, n_users=n)


def test_valid_and_non_private_parameters():
    check_privacy_params(float("inf"), 1e-6)
    check_privacy_params(0.05, 1e-10, n_users=10**6)


@pytest.mark.parametrize("call,msg", [
    (lambda: gaussian_event(-1.0), "noise_multiplier"),
    (lambda: laplace_event(-2.0), "b_over_sensitivity"),
    (lambda: huber_event(-0.1), "epsilon"),
    (lambda: gaussian_event(1.0, 0), "count"),
    (lambda: epsilon_of(gaussian_event(1.0), 0.0), "delta"),
])
def test_invalid_event_parameters(call, msg):
    with pytest.raises(ParameterError, match=msg):
        call()


def test_cli_epsilon_matches_dp_accounting():
    """`streamdp privacy epsilon --noise-multiplier 1 --count 1000 --delta 1e-5` == dp-accounting."""
    res = CliRunner().invoke(main, ["privacy", "epsilon", "--noise-multiplier", "1", "--count", "1000",
                                    "--delta", "1e-5", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    ev = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(1.0), 1000)
    # same grid as the CLI used (dp-accounting's default 1e-4 grid takes ~30 s here and agrees to 1e-6)
    vdi = out["value_discretization_interval"]
    pld = PLDAccountant(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
                        value_discretization_interval=vdi).compose(ev).get_epsilon(1e-5)
    rdp = RdpAccountant().compose(ev).get_epsilon(1e-5)
    assert out["epsilon"] == pytest.approx(pld, rel=1e-12)
    assert out["epsilon_rdp"] == pytest.approx(rdp, rel=1e-12)
    assert 633.0 < out["epsilon"] < 635.0 and out["epsilon"] < out["epsilon_rdp"]
    text = CliRunner().invoke(main, ["privacy", "epsilon", "--noise-multiplier", "1", "--count", "1000",
                                     "--delta", "1e-5"])
    assert text.exit_code == 0 and f"{out['epsilon']:.6g}" in text.output and "RDP" in text.output


@pytest.mark.parametrize("args,msg", [
    (["epsilon", "--noise-multiplier", "-1", "--delta", "1e-5"], "noise_multiplier"),
    (["epsilon", "--noise-multiplier", "1", "--delta", "1"], "delta"),
    (["epsilon", "--noise-multiplier", "1", "--delta", "1e-5", "--count", "0"], "count"),
    (["calibrate", "--epsilon", "0", "--delta", "1e-5"], "epsilon"),
    (["calibrate", "--epsilon", "1", "--delta", "0"], "delta"),
])
def test_cli_invalid_parameters_one_line_exit_2(args, msg):
    res = CliRunner().invoke(main, ["privacy", *args])
    assert res.exit_code == 2
    err = res.stderr if hasattr(res, "stderr") else res.output
    assert err.startswith("streamdp: error:") and msg in err and "Traceback" not in err


def test_pure_epsilon_on_the_grid_and_overflow_guard():
    """An eps-DP release is reported as eps (not eps + a grid width); absurd epsilons are inf in both."""
    for e in (0.37, 5.0, 20.0):
        r = epsilon_of(huber_event(e), 1e-12)
        assert e - 1e-6 <= r.epsilon <= e * (1 + 1e-9)
    # 10^4 tiny pure-DP releases: exact on the grid, so advanced composition shows (basic would say 1.0)
    many = epsilon_of(huber_event(1e-4, 10_000), 1e-10)
    assert 0.0 < many.epsilon < 0.1 and many.epsilon <= many.epsilon_rdp
    big = epsilon_of(huber_event(800.0), 1e-6)
    assert math.isinf(big.epsilon) and math.isinf(big.epsilon_rdp)
