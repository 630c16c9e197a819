"""Issue 23: sgld's defaults (tight posterior scale, c = half the rating range), the temperature label, and
``--tiering auto|on|off`` with its rule from public parameters."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from streamdp.kernels import sgd as K
from streamdp.methods import get_method
from streamdp.privacy.users import UserCount
from streamdp.stream.engine import Engine
from streamdp.workflows.training import train


def _settings(store, **opts):
    return get_method("sgld")(epsilon=10.0, delta=1e-6, rank=4, **opts).settings(store)


def _sample(store, **opts):
    # a declared number of users: the sample has the whole epsilon (streamdp.privacy.users)
    return get_method("sgld")(epsilon=10.0, delta=1e-6, rank=4, users=UserCount(store.n_users, "declared"),
                              **opts).plan(store).releases


def test_default_bound_is_half_the_range_and_the_scale_tight(small_store):
    """Defaults: c = (r_max - r_min) / 2 = 2 on 1..5 (kappa -2), B = tau c^2, s = epsilon / B (add/remove)."""
    s, sample = _settings(small_store, tau=20), _sample(small_store, tau=20)
    assert s.clip == 2.0 and s.kappa == -2.0 and s.bound == sample.bound == 20 * 2.0 ** 2
    assert s.posterior_scale == sample.posterior_scale == "tight"
    assert sample.scale == pytest.approx(10.0 / s.bound, rel=1e-3) and sample.scale <= 10.0 / s.bound
    # Liu et al.'s constants stay available and give their B = tau (4 + 1)^2 and s = epsilon / (4B)
    p = _sample(small_store, tau=20, kappa=1.0, posterior_scale="paper")
    assert p.bound == 20 * 25.0 and p.scale == pytest.approx(10.0 / (4 * 20 * 25.0), rel=1e-3)


def test_kappa_may_be_negative_but_c_must_stay_positive(small_store):
    from streamdp.errors import ParameterError

    assert _settings(small_store, tau=20, kappa=-3.5).clip == 0.5
    with pytest.raises(ParameterError, match=r"^--kappa must be > -\(r_max - r_min\) = -4 .*got -4"):
        _settings(small_store, tau=20, kappa=-4.0)


def test_temperature_is_labelled_not_the_dp_target(small_store, tmp_path):
    """T != 1 samples exp(-s F / T): the ledger claims epsilon / T and says it is not --epsilon's DP target."""
    train(small_store, method="sgld", out=str(tmp_path / "hot"), epsilon=2.0, delta=1e-6, rank=4, seed=1, epochs=1,
          tau=20, temperature=0.5, workers=1, users_bound=small_store.n_users)
    led = json.load(open(tmp_path / "hot" / "privacy.json"))
    assert led["bounds"]["target"].startswith("not the DP target of --epsilon 2: temperature 0.5")
    assert "epsilon / T = 4" in led["bounds"]["target"]
    assert "not the DP target of --epsilon 2" in led["guarantee"] and led["epsilon"] == pytest.approx(4.0)
    assert any("not the DP target" in n for n in led["notes"])
    train(small_store, method="sgld", out=str(tmp_path / "t1"), epsilon=2.0, delta=1e-6, rank=4, seed=1, epochs=1,
          tau=20, workers=1)
    led = json.load(open(tmp_path / "t1" / "privacy.json"))
    assert led["bounds"]["target"].startswith("the epsilon-DP target") and "not the DP target" not in led["guarantee"]


def test_tiering_rule_from_method_rank_items_workers_and_l3():
    """sgld tiers only when the item state (k float32 + bias + clock per item) exceeds the running workers'
    share of the L3 cache; sgd never (measured: docs/sgld.md)."""
    share = 16 * 2**20  # this machine: 32 MiB L3 shared by 2 CPUs, with 2 workers
    assert [K.tiering_pays(k, 17_770, l3_bytes=share) for k in (16, 64, 256, 512)] == [False, False, True, True]
    assert not any(K.tiering_pays(k, 17_770, noisy=False, l3_bytes=share) for k in (16, 64, 256, 512))
    assert K.tiering_pays(16, 500_000, l3_bytes=share)  # 38 MB of item rows
    assert not K.tiering_pays(512, 17_770, l3_bytes=64 * 2**20)
    per_item = 4 * 100 + 12
    assert not K.tiering_pays(100, share // per_item, l3_bytes=share)
    assert K.tiering_pays(100, share // per_item + 1, l3_bytes=share)
    l3 = K._l3_share_bytes()
    assert 0 < l3 <= max(K._cache_bytes(3, 16 * 2**20), 16 * 2**20)
    assert K._l3_share_bytes(workers=1) >= K._l3_share_bytes(workers=2) >= l3  # fewer workers: a larger share


@pytest.mark.parametrize("method", ["sgd", "sgld"])
def test_tiering_auto_on_off(small_store, monkeypatch, method):
    """auto is decided in fit, with the engine's number of workers; on/off are settings."""
    eps = float("inf") if method == "sgd" else 10.0
    seen = []

    def fake(k, n_items, *, noisy=True, workers=1, l3_bytes=None):
        seen.append((k, n_items, noisy, workers))
        return True

    monkeypatch.setattr(K, "tiering_pays", fake)
    m = get_method(method)
    assert m(epsilon=eps, delta=1e-6, rank=4).settings(small_store).tiering is None  # auto is the default
    assert m(epsilon=eps, delta=1e-6, rank=4, tiering="off").settings(small_store).tiering is False
    assert m(epsilon=eps, delta=1e-6, rank=4, tiering="on").settings(small_store).tiering is True
    with Engine(small_store, workers=2, memory_limit="4GB") as engine:
        fitted = m(epsilon=eps, delta=1e-6, rank=4, seed=0, epochs=1, tau=20).fit(small_store, engine)
    assert seen == [(4, small_store.n_items, method == "sgld", 2)]
    assert fitted.model_info["parameters"]["tiering"] is True


def test_cli_tiering_choice(small_store, tmp_path):
    from streamdp.cli import main

    r = CliRunner().invoke(main, ["train", str(small_store.path), "--method", "sgld", "--epsilon", "1", "--delta",
                                  "1e-6", "--out", str(tmp_path / "m"), "--tiering", "yes"])
    assert r.exit_code == 2 and "--tiering" in r.output and "auto" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "m").exists()
    r = CliRunner().invoke(main, ["train", "--method", "sgld", "--help"])
    assert "--tiering [auto|on|off]" in r.output
    r = CliRunner().invoke(main, ["train", str(small_store.path), "--method", "sgld", "--epsilon", "1", "--delta",
                                  "1e-6", "--out", str(tmp_path / "m"), "--tiering", "on", "--epochs", "1",
                                  "--rank", "4", "--tau", "20", "--seed", "1", "--workers", "1"])
    assert r.exit_code == 0, r.output
    assert json.load(open(tmp_path / "m" / "model.json"))["parameters"]["tiering"] is True
