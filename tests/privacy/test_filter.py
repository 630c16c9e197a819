"""The per-user lifetime cap: an individual Renyi filter (streamdp/privacy/filter.py) on a store's releases."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pandas as pd
import pytest
import zarr
from dp_accounting.rdp import rdp_privacy_accountant as dp_rdp

from streamdp.errors import Interrupted, ParameterError, StoreError
from streamdp.kernels.csr import keep_rows
from streamdp.privacy import GUARANTEE_USER_DP, Ledger, gaussian_event
from streamdp.privacy.budget import StoreBudget
from streamdp.privacy.events import event_to_dict
from streamdp.privacy.filter import FILTER_DIR, FilterRequest, advance, current, filter_parameters
from streamdp.workflows import training
from streamdp.workflows.api import ingest

#: The cap and each release's epsilon: two releases fit under it, a third does not (checked in the scenario).
CAP, EPS = "3,1e-3", 2.5
N_OLD, N_NEW, N_ITEMS = 40, 15, 12


def _frame(users, seed):
    rng = np.random.default_rng(seed)
    rows = [(u, i, float(rng.integers(1, 6))) for u in users for i in rng.choice(N_ITEMS, 5, replace=False)]
    return pd.DataFrame(rows, columns=["user", "item", "rating"])


def _store(tmp, name="s.zarr", user_budget=CAP):
    items = tmp / "items.txt"
    items.write_text("\n".join(str(i) for i in range(N_ITEMS)) + "\n")
    return ingest(_frame(range(N_OLD), 0), str(tmp / name), items=str(items), rating_range="1,5",
                  user_budget=user_budget)


def _train(store, out, seed=1, **kw):
    return training.train(store, method="als", out=str(out), epsilon=EPS, seed=seed, users_bound=100,
                          evaluate_test=False, **kw)


def _state(store):
    """``(rdp, retired)`` of the store's current generation, and its user_budget."""
    d = StoreBudget(store)._load()
    gen = current(d["entries"])
    g = zarr.open_group(f"{store}/{FILTER_DIR}/{gen}", mode="r")
    return g["rdp"][:], g["retired"][:], d["user_budget"]


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    """Two trains, an append of new users, a third train: what each left behind."""
    tmp = tmp_path_factory.mktemp("filter")
    s = _store(tmp)
    out = {"store": s.path, "states": [], "models": []}
    for k in (1, 2):
        _train(s.path, tmp / f"m{k}", seed=k)
        out["states"].append(_state(s.path))
        out["models"].append(tmp / f"m{k}")
    ingest(_frame(range(1000, 1000 + N_NEW), 1), s.path, append=True)
    out["summary"] = _train(s.path, tmp / "m3", seed=3)
    out["states"].append(_state(s.path))
    out["models"].append(tmp / "m3")
    return out


def test_the_filter_retires_exactly_the_users_whose_next_release_crosses_the_cap(scenario):
    (r1, t1, ub), (r2, t2, _), (r3, t3, _) = scenario["states"]
    r = json.loads((scenario["models"][0] / "privacy.json").read_text())["individual_privacy"]["release_rdp"]
    bound = ub["bound"]
    assert 2 * r <= bound < 3 * r  # the cap fits two releases, not three
    assert np.array_equal(r1, np.full(N_OLD, r)) and not t1.any()
    assert np.allclose(r2, 2 * r) and not t2.any()
    # the third: every old user would cross her cap (2r + r > B): retired, charged nothing more
    assert t3[:N_OLD].all() and np.array_equal(r3[:N_OLD], r2)
    assert scenario["summary"]["user_filter"] == {"participants": N_NEW, "retired_now": N_OLD,
                                                  "retired_total": N_OLD}


def test_users_appended_start_at_zero_and_take_part(scenario):
    r3, t3, _ = scenario["states"][2]
    r = json.loads((scenario["models"][2] / "privacy.json").read_text())["individual_privacy"]["release_rdp"]
    assert len(r3) == N_OLD + N_NEW
    assert np.array_equal(r3[N_OLD:], np.full(N_NEW, r)) and not t3[N_OLD:].any()


def test_privacy_json_states_the_per_user_guarantee_of_dp_accounting(scenario):
    for m in scenario["models"]:
        ind = json.loads((m / "privacy.json").read_text())["individual_privacy"]
        g = ind["per_user_guarantee"]
        eps, _ = dp_rdp.compute_epsilon([ind["alpha"]], [ind["bound_rdp"]], g["delta"])
        assert g["epsilon"] == eps and g["epsilon"] <= ind["cap"]["epsilon"] and g["delta"] == 1e-3
        assert "retired_now" not in json.dumps(ind)  # exact counts of users stay with the owner


def test_budget_shows_the_distribution_of_the_users_spend(scenario, cli):
    code, out, err, _ = cli.run("budget", scenario["store"])
    assert code == 0, err
    assert f"users            {N_OLD + N_NEW}, {N_OLD} retired" in out
    assert "users' spend     epsilon at delta=0.001: min " in out and "share of the bound spent" in out
    assert sum(int(line.split()[-1]) for line in out.splitlines() if "epsilon <= " in line) == N_OLD + N_NEW
    code, out, err, _ = cli.run("budget", scenario["store"], "--json")
    users = json.loads(out)["users"]
    assert users["retired"] == N_OLD and set(users["quantiles"]) == {"0", "0.5", "0.9", "0.99", "1"}
    assert users["quantiles"]["1"] >= users["quantiles"]["0"] > 0


def test_a_failed_or_interrupted_train_spends_nothing_on_anyone(tmp_path, monkeypatch):
    s = _store(tmp_path)
    _train(s.path, tmp_path / "m1")
    before = _state(s.path)
    for exc, raised in ((RuntimeError("disk on fire"), RuntimeError), (KeyboardInterrupt(), Interrupted)):
        def boom(*a, **k):
            raise exc

        with monkeypatch.context() as mp:
            mp.setattr(training, "check_local_solve", boom)
            with pytest.raises(raised):
                _train(s.path, tmp_path / "m2")
        after = _state(s.path)
        assert np.array_equal(after[0], before[0]) and np.array_equal(after[1], before[1])
    _train(s.path, tmp_path / "m2")  # the next release goes on from the last one that counted
    assert np.allclose(_state(s.path)[0], 2 * before[0])


def test_another_release_in_between_is_refused(tmp_path):
    s = _store(tmp_path)
    b = StoreBudget(s.path)
    led = Ledger(method="demo", guarantee=GUARANTEE_USER_DP, epsilon=1.0, delta=1e-6, events=[gaussian_event(8.0)])
    b.reserve(led, user_filter=FilterRequest(generation=None, n_users=N_OLD))
    with pytest.raises(StoreError, match="another release"):  # made from the generation before that one
        b.reserve(led, user_filter=FilterRequest(generation=None, n_users=N_OLD))
    with pytest.raises(ParameterError, match="only `streamdp train`"):  # a release that cannot leave users out
        b.reserve(led)


def test_the_charge_is_staged_and_counted_from_the_carried_spend(tmp_path):
    """advance on a hand-built ledger: a user who can afford the first stage only is charged it and retired."""
    store = tmp_path / "s"
    store.mkdir()
    ub = {**filter_parameters(3.0, 1e-3), "carried_rdp": 0.0, "carried_users": 0}
    ev = [event_to_dict(gaussian_event(2.0))]
    r = ub["alpha"] / 8.0
    entries = []
    spent = []
    for k in range(8):
        e = {"id": f"e{k}", "status": "complete", "events": ev}
        e["user_filter"] = advance(store, ub, entries, e, FilterRequest(current(entries), 3, stages=[0.01]))
        entries.append(e)
        spent.append(e["user_filter"])
    g = zarr.open_group(str(store / FILTER_DIR / current(entries)), mode="r")
    k = math.floor(ub["bound"] / r)  # releases that fit
    first = ub["bound"] - k * r >= 0.01  # then the first stage alone
    assert np.allclose(g["rdp"][:], k * r + (0.01 if first else 0.0)) and g["retired"][:].all()
    assert [x["participants"] for x in spent] == [3] * k + [0] * (8 - k)
    assert [x["retired_now"] for x in spent] == [0] * k + [3] + [0] * (7 - k)


def test_filter_parameters_convert_through_dp_accounting():
    p = filter_parameters(5.0, 1e-6)
    orders = [a for a in dp_rdp.DEFAULT_RDP_ORDERS if a > 1.01]
    assert p["alpha"] in orders and p["epsilon_guarantee"] <= 5.0
    assert p["epsilon_guarantee"] == dp_rdp.compute_epsilon([p["alpha"]], [p["bound"]], 1e-6)[0]
    for a in orders:  # the order where most Gaussian releases fit: B(alpha) / alpha largest
        b = 5.0 - (dp_rdp.compute_epsilon([a], [5.0], 1e-6)[0] - 5.0)
        assert b / a <= p["bound"] / p["alpha"] * (1 + 1e-9)


def test_keep_rows_empties_the_rows_of_users_left_out():
    indptr = np.array([0, 2, 3, 6], np.int64)
    items = np.array([1, 2, 0, 3, 4, 5], np.int32)
    ratings = np.arange(6, dtype=np.float32)
    ip, it, ra = keep_rows(indptr, items, ratings, np.array([1, 0, 1], np.uint8))
    assert ip.tolist() == [0, 2, 2, 5] and it.tolist() == [1, 2, 3, 4, 5] and ra.tolist() == [0, 1, 3, 4, 5]


@pytest.mark.parametrize("args, needle", [
    (("--set-user", "0"), "--set-user: expected a positive number"),
    (("--set-user", "-1,1e-6"), "--set-user: expected a positive number"),
    (("--set-user", "2,0.1"), "--set-user: delta: must be below 1/n_users"),
    (("--set-user", "inf"), "--set-user: a cap must be finite"),
    (("--set-user", "1,2,3"), "--set-user: expected EPSILON[,DELTA]"),
    (("--set-user", "0.001,1e-6"), "too small a cap"),
])
def test_bad_caps_are_one_line_errors(tmp_path, cli, args, needle):
    s = _store(tmp_path, user_budget=None)
    cli.error(cli.run("budget", s.path, *args), needle)


def test_ingest_refuses_a_bad_cap_before_writing(tmp_path, cli):
    f = tmp_path / "r.csv"
    _frame(range(5), 0).to_csv(f, index=False)
    cli.error(cli.run("ingest", f, "--out", tmp_path / "s.zarr", "--user-budget", "1,0.5"),
              "--user-budget: delta: must be below 1/n_users")
    assert not (tmp_path / "s.zarr").exists()


def test_a_cap_is_set_once(tmp_path, cli):
    s = _store(tmp_path)
    assert cli.run("budget", s.path, "--set-user", CAP)[0] == 0  # the same again: nothing changes
    assert cli.run("budget", s.path, "--set-user", "4,1e-3")[0] == 0  # no release under it yet: replaced
    _train(s.path, tmp_path / "m1")
    cli.error(cli.run("budget", s.path, "--set-user", "5,1e-3"), "cannot be changed")
    shutil.rmtree(tmp_path / "m1")


def test_compaction_keeps_the_users_spend_and_replacing_the_data_is_refused(tmp_path, cli):
    from streamdp.storage.compact import compact

    s = _store(tmp_path)
    _train(s.path, tmp_path / "m1")
    ingest(_frame(range(1000, 1000 + N_NEW), 1), s.path, append=True)
    before = _state(s.path)
    compact(s.path)
    after = _state(s.path)
    assert np.array_equal(before[0], after[0]) and np.array_equal(before[1], after[1])
    f = tmp_path / "r.csv"
    _frame(range(5), 0).to_csv(f, index=False)
    cli.error(cli.run("ingest", f, "--out", s.path, "--force"), "has a per-user budget", "--append")
    assert np.array_equal(_state(s.path)[0], before[0])  # the store as it was


def test_a_cluster_worker_reads_the_same_view(scenario):
    """The view's spec (what a Dask worker applies to the store it opens) leaves out the same users."""
    from streamdp.privacy.filter import FilterMask
    from streamdp.storage.catalogue import CatalogueView
    from streamdp.storage.retired import RetiredView
    from streamdp.storage.store import open_store

    st = open_store(scenario["store"])
    d = StoreBudget(st.path)._load()
    view = CatalogueView(RetiredView(st, FilterMask(st.path, d["user_budget"], current(d["entries"]))),
                         st.item_ids()[:6])
    remote = view.remote_view().view(open_store(scenario["store"]))
    for b in range(st.n_blocks):
        mine, theirs = view.read_block(b), remote.read_block(b)
        assert np.array_equal(mine.indptr, theirs.indptr) and np.array_equal(mine.items, theirs.items)
    assert view.read_block(0).indptr[N_OLD] == 0  # the retired users' rows are empty


def test_the_state_streams_by_blocks_and_charges_contributors_only(tmp_path, monkeypatch):
    """Blocks of 7 users in chunks of 4 give what one block gives; a user who did not contribute (the hook a time
    window fills) is charged nothing; users present when the cap was set start at the releases before it."""
    from streamdp.privacy import filter as flt

    ub = {**filter_parameters(3.0, 1e-3), "carried_rdp": 0.25, "carried_users": 30}
    ev = [event_to_dict(gaussian_event(2.0))]
    results = []
    for block, chunk in ((1 << 20, 1 << 16), (7, 4)):
        monkeypatch.setattr(flt, "BLOCK", block)
        monkeypatch.setattr(flt, "CHUNK", chunk)
        store = tmp_path / f"s{block}"
        store.mkdir()
        e = {"id": "e0", "status": "complete", "events": ev}
        rec = advance(store, ub, [], e, FilterRequest(None, 50, contributors=lambda lo, hi: np.arange(lo, hi) % 2 == 0))
        g = zarr.open_group(str(store / FILTER_DIR / "e0"), mode="r")
        dist = flt.distribution(store, ub, [{**e, "user_filter": rec}], 50)
        results.append((g["rdp"][:], g["retired"][:], rec["participants"], dist))
    (a, ra, pa, da), (b, rb, pb, db) = results
    assert np.array_equal(a, b) and np.array_equal(ra, rb) and pa == pb == 25 and da == db
    r = ub["alpha"] / 8.0
    expect = np.where(np.arange(50) < 30, 0.25, 0.0) + np.where(np.arange(50) % 2 == 0, r, 0.0)
    assert np.allclose(a, expect) and not ra.any()


def test_releases_before_the_cap_are_charged_to_the_users_then(tmp_path, cli):
    s = _store(tmp_path, user_budget=None)
    b = StoreBudget(s.path)
    led = Ledger(method="demo", guarantee=GUARANTEE_USER_DP, epsilon=1.0, delta=1e-6, events=[gaussian_event(8.0)])
    b.complete(b.reserve(led))
    assert cli.run("budget", s.path, "--set-user", CAP)[0] == 0
    ub = b.user_budget()
    assert ub["carried_rdp"] == pytest.approx(ub["alpha"] / 128) and ub["carried_users"] == N_OLD
    ingest(_frame(range(1000, 1000 + N_NEW), 1), s.path, append=True)
    _train(s.path, tmp_path / "m1")
    rdp, retired, _ = _state(s.path)
    r = json.loads((tmp_path / "m1" / "privacy.json").read_text())["individual_privacy"]["release_rdp"]
    assert np.allclose(rdp[:N_OLD], ub["carried_rdp"] + r) and np.allclose(rdp[N_OLD:], r) and not retired.any()


@pytest.mark.parametrize("undeclared", ["items", "rating_range"])
def test_a_private_selection_is_refused_on_a_capped_store(tmp_path, cli, undeclared):
    """The catalogue's and the rating range's private selections each end in a ``(0, delta)`` threshold event,
    which no Renyi filter charges: on a store with a per-user cap both must be declared, said in one line."""
    items = tmp_path / "items.txt"
    items.write_text("\n".join(str(i) for i in range(N_ITEMS)) + "\n")
    kw = {"items": str(items), "rating_range": "1,5"}
    kw.pop(undeclared)
    s = ingest(_frame(range(N_OLD), 0), str(tmp_path / "s.zarr"), user_budget=CAP, **kw)
    cli.error(cli.run("train", s.path, "--epsilon", str(EPS), "--out", tmp_path / "m", "--users-bound", "100"),
              "per-user budget", "--rating-range" if undeclared == "rating_range" else "--items")
    assert not (tmp_path / "m").exists()


def test_a_cap_delta_no_longer_below_one_over_the_users_is_warned_of():
    """Appends may add users until the cap's delta is no longer below 1/n_users (set once, it cannot change): train
    warns, naming both; below it, nothing is said."""
    ub = {"delta": 1e-3}
    assert training.cap_delta_warning(FilterRequest(generation=None, n_users=999, user_budget=ub)) is None
    w = training.cap_delta_warning(FilterRequest(generation=None, n_users=1000, user_budget=ub))
    assert "delta=0.001 is no longer below 1/n_users (1,000 users now" in w
