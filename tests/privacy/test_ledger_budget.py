"""privacy.json ledgers and the per-store budget (refusal, failed runs, CLI)."""

from __future__ import annotations

import functools
import json
import math
import os
import threading

import pytest
from click.testing import CliRunner

from streamdp.cli import main
from streamdp.errors import BudgetExceededError, ParameterError, StoreError
from streamdp.privacy import (
    GUARANTEE_JOINT_DP,
    GUARANTEE_NONE,
    GUARANTEE_USER_DP,
    Ledger,
    calibrate_gaussian,
    epsilon_of,
    gaussian_event,
    huber_event,
)
from streamdp.privacy.budget import BUDGET_FILE, StoreBudget


@functools.lru_cache(maxsize=None)
def _z(eps, delta):
    return calibrate_gaussian(eps, delta, 2)


def _ledger(eps, delta=1e-6, method="demo", seeded=False):
    z = _z(eps, delta)
    ev = gaussian_event(z, 2)
    return Ledger(method=method, guarantee=GUARANTEE_USER_DP, epsilon=eps, delta=delta, events=[ev],
                  accounting=epsilon_of(ev, delta), bounds={"tau": 50, "L": 1.0}, seeded=seeded,
                  store_checksum="blake2b:abc")


@pytest.fixture
def store(tmp_path):
    p = tmp_path / "s.zarr"
    p.mkdir()
    (p / "zarr.json").write_text('{"attributes": {"streamdp": {"checksum": "blake2b:abc"}}}')
    return p


def test_ledger_roundtrip_and_recompute(tmp_path):
    led = _ledger(1.0, seeded=True)
    path = led.write(tmp_path)
    d = json.loads(path.read_text())  # strict JSON
    assert d["guarantee"] == GUARANTEE_USER_DP and d["seeded"] is True and "NOT private" in d["seed_note"]
    assert d["neighbouring_relation"].startswith("add/remove one user")
    assert d["accountant"]["version"] and d["accounting"]["epsilon_rdp"] >= d["accounting"]["epsilon"]
    assert d["events"][0]["event"]["name"] == "GaussianDpEvent" and "store_checksum" not in d  # a hash of the data is never released
    back = Ledger.read(tmp_path)
    assert back.to_dict() == led.to_dict()
    assert back.recompute().epsilon == pytest.approx(led.accounting.epsilon, rel=1e-9)
    assert back.recompute().epsilon <= 1.0
    assert [p.name for p in tmp_path.iterdir()] == ["privacy.json"]  # no temp file left


def test_non_private_ledger(tmp_path):
    led = Ledger(method="als", guarantee=GUARANTEE_NONE, epsilon=math.inf, delta=1e-6,
                 events=[gaussian_event(0.0, 3)], accounting=epsilon_of(gaussian_event(0.0, 3), 1e-6))
    led.write(tmp_path)
    text = (tmp_path / "privacy.json").read_text()
    assert '"epsilon": "inf"' in text and "Infinity" not in text
    back = Ledger.read(tmp_path)
    assert math.isinf(back.epsilon) and math.isinf(back.accounting.epsilon)
    assert back.events[0]["event"]["noise_multiplier"] == 0.0


def test_ledger_rejects_bad_claims(tmp_path):
    with pytest.raises(ParameterError, match="guarantee"):
        Ledger(method="x", guarantee="sort of private", epsilon=1.0, delta=1e-6)
    Ledger(method="sgld", guarantee="approximate: SGLD, exact only for an exact posterior sample",
           epsilon=1.0, delta=1e-6)
    with pytest.raises(ParameterError, match="exceeds"):
        Ledger(method="x", guarantee=GUARANTEE_JOINT_DP, epsilon=0.5, delta=1e-6, events=[gaussian_event(1.0)],
               accounting=epsilon_of(gaussian_event(1.0), 1e-6))
    with pytest.raises(ParameterError, match="non-private"):
        Ledger(method="x", guarantee=GUARANTEE_NONE, epsilon=1.0, delta=1e-6)
    (tmp_path / "privacy.json").write_text("{not json")
    with pytest.raises(StoreError, match="line 1"):
        Ledger.read(tmp_path)


def test_budget_two_releases_second_refused(store):
    """Budget 1.3: a 1.0 release fits, a second one (together ~1.45 by PLD) exceeds it -> refused."""
    b = StoreBudget(store)
    b.set(1.3, 1e-6)
    attrs_before = (store / "zarr.json").read_text()
    first = b.reserve(_ledger(1.0, method="first"))
    b.complete(first)
    with pytest.raises(BudgetExceededError) as exc:
        b.reserve(_ledger(1.0, method="second"))
    assert exc.value.exit_code == 3 and "--over-budget" in str(exc.value)
    s = b.show()
    assert [e["method"] for e in s["entries"]] == ["first"] and s["entries"][0]["status"] == "complete"
    assert s["spent"]["n_releases"] == 1 and s["spent"]["epsilon"] <= 1.0 and s["within_budget"]
    assert (store / "zarr.json").read_text() == attrs_before  # the store's attrs are untouched
    # explicitly over budget: recorded and flagged
    b.complete(b.reserve(_ledger(1.0, method="second"), over_budget=True))
    s = b.show()
    assert s["entries"][-1]["over_budget"] and not s["within_budget"]
    # the accountant composes the two releases: less than basic composition
    assert s["spent"]["epsilon"] < s["spent"]["epsilon_basic"] == pytest.approx(2.0)


def test_budget_failed_runs_do_not_count(store):
    b = StoreBudget(store)
    b.set(1.2, 1e-6)
    with pytest.raises(RuntimeError):
        with b.release(_ledger(1.0, method="crashes")):
            raise RuntimeError("disk full")
    e = b.show()["entries"][0]
    assert e["status"] == "failed" and "disk full" in e["reason"]
    with b.release(_ledger(1.0, method="works")) as entry:  # fits: the failed one released nothing
        assert b.show()["entries"][-1]["status"] == "reserved"  # recorded before the model is written
    assert b.show()["entries"][-1]["id"] == entry and b.show()["entries"][-1]["status"] == "complete"
    with pytest.raises(ParameterError, match="already complete"):
        b.fail(entry, "late")
    with pytest.raises(ParameterError, match="no budget entry"):
        b.complete("nope")


def test_budget_composes_mixed_events_and_non_private(store):
    b = StoreBudget(store)
    b.set(3.0, 1e-6)
    led = Ledger(method="huber-als", guarantee=GUARANTEE_USER_DP, epsilon=1.0, delta=0.0,
                 events=[huber_event(0.5, 2)])
    b.complete(b.reserve(led))
    s = b.show()["spent"]
    assert s["accountant"] == "pld" and s["epsilon"] <= 1.0 + 1e-6
    nonpriv = Ledger(method="als", guarantee=GUARANTEE_NONE, epsilon=math.inf, delta=1e-6,
                     events=[gaussian_event(0.0)])
    with pytest.raises(BudgetExceededError):
        b.reserve(nonpriv)
    # a bare (epsilon, delta) claim without events falls back to basic composition
    bare = Ledger(method="sgld", guarantee="approximate: SGLD", epsilon=1.5, delta=1e-7)
    b.complete(b.reserve(bare))
    s = b.show()["spent"]
    assert s["accountant"].startswith("basic") and s["epsilon"] == pytest.approx(2.5)


def test_budget_concurrent_reservations_serialize(store):
    """8 threads race to reserve 0.5 each against a budget that fits 3 (composition under the lock)."""
    b = StoreBudget(store)
    b.set(1.3, 1e-6)
    led = _ledger(0.5)
    results = []

    def go():
        try:
            results.append(StoreBudget(store).reserve(led))
        except BudgetExceededError:
            results.append(None)

    ts = [threading.Thread(target=go) for _ in range(8)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    ok = [r for r in results if r]
    s = b.show()
    assert len(s["entries"]) == len(ok) and s["within_budget"]
    assert len(ok) >= 2  # 0.5-DP Gaussians compose to < 1.3 for at least two (basic composition would say 2)
    assert not [p for p in os.listdir(store) if p.endswith(".tmp")]


def test_budget_cli_set_show_json(store):
    r = CliRunner().invoke(main, ["budget", str(store)])
    assert r.exit_code == 0 and "none set" in r.output
    r = CliRunner().invoke(main, ["budget", str(store), "--set", "2,1e-6", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["budget"]["epsilon"] == 2.0 and d["spent"]["n_releases"] == 0
    StoreBudget(store).complete(StoreBudget(store).reserve(_ledger(1.0)))
    r = CliRunner().invoke(main, ["budget", str(store)])
    assert r.exit_code == 0 and "complete" in r.output and "remaining" in r.output
    for bad in ["2", "a,b", "0,1e-6", "1,2"]:
        r = CliRunner().invoke(main, ["budget", str(store), "--set", bad])
        assert r.exit_code == 2 and "streamdp: error:" in r.output
    r = CliRunner().invoke(main, ["budget", str(store.parent / "missing.zarr")])
    assert r.exit_code == 2 and "does not exist" in r.output
    assert (store / BUDGET_FILE).exists()


def test_train_refuses_second_release_with_exit_3(tmp_path):
    """End to end: `streamdp train` twice against a budget that fits one model; the second exits 3,
    writes no model, and the budget ledger shows the first release only."""
    from streamdp.storage.generate import generate_store

    s = str(tmp_path / "s.zarr")
    generate_store(s, n_users=1500, n_items=60, ratings_per_user=8, rank=3, seed=3, test_fraction=0.0)
    run = CliRunner()
    assert run.invoke(main, ["budget", s, "--set", "1.3,1e-6"]).exit_code == 0
    common = ["--method", "oja", "--epsilon", "1", "--delta", "1e-6", "--rank", "2", "--seed", "1"]
    r1 = run.invoke(main, ["train", s, *common, "--out", str(tmp_path / "m1")])
    assert r1.exit_code == 0, r1.output
    r2 = run.invoke(main, ["train", s, *common, "--out", str(tmp_path / "m2")])
    assert r2.exit_code == 3, r2.output
    assert "streamdp: error:" in r2.output and "budget" in r2.output and "Traceback" not in r2.output
    assert not (tmp_path / "m2").exists()
    d = json.loads(run.invoke(main, ["budget", s, "--json"]).output)
    assert len(d["entries"]) == 1 and d["entries"][0]["status"] == "complete"
    assert d["spent"]["epsilon"] <= 1.0
    led = Ledger.read(tmp_path / "m1")
    assert led.recompute().epsilon <= 1.0 and led.seeded
    # --over-budget releases it anyway, and the ledger records that it did
    r3 = run.invoke(main, ["train", s, *common, "--out", str(tmp_path / "m3"), "--over-budget"])
    assert r3.exit_code == 0, r3.output
    d = json.loads(run.invoke(main, ["budget", s, "--json"]).output)
    assert [e["over_budget"] for e in d["entries"]] == [False, True] and not d["within_budget"]
