"""A per-user budget and a training period joined (issue 43 part 4): a release costs a user nothing if she
contributed no rating to it (outside its window, or not yet a user of the store as of a segment)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

from streamdp.methods import base
from streamdp.privacy.accountant import rdp_epsilon
from streamdp.privacy.budget import StoreBudget
from streamdp.privacy.filter import FILTER_DIR, current
from streamdp.storage.store import open_store

DAY = 86400
T0 = 1704067200  # 2024-01-01T00:00:00Z
#: users who rate in week 1 only, in week 2 only, and in both
EARLY, LATE, BOTH = range(12), range(12, 24), range(24, 30)
CAP, EPS = "5,1e-3", 3.7  # two releases fit under the cap, a third does not (checked below)


def _log(path, users_weeks, seed=0):
    rng = np.random.default_rng(seed)
    lines = ["user,item,rating,timestamp"]
    for users, week in users_weeks:
        for u in users:
            for i in rng.choice(12, 5, replace=False):
                lines.append(f"{u},{i},{rng.integers(1, 6)},{T0 + week * 7 * DAY + int(rng.integers(0, 7 * DAY))}")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _spend(store):
    """``(rdp, retired)`` by external user id, from the store's current generation."""
    gen = current(StoreBudget(store)._load()["entries"])
    g = zarr.open_group(f"{store}/{FILTER_DIR}/{gen}", mode="r")
    ids = [int(u) for u in open_store(store).user_ids()]
    rdp, ret = g["rdp"][:], g["retired"][:]
    return {u: (float(rdp[k]), bool(ret[k])) for k, u in enumerate(ids)}


@pytest.fixture()
def counted(monkeypatch):
    """The exact user counts the runs' released counts were drawn around."""
    seen, real = [], base.release_user_count

    def spy(n, **kw):
        seen.append(int(n))
        return real(n, **kw)

    monkeypatch.setattr(base, "release_user_count", spy)
    return seen


def test_disjoint_windows_charge_each_user_for_her_own_window_only(tmp_path, cli, counted):
    (tmp_path / "items.txt").write_text("\n".join(str(i) for i in range(12)) + "\n")
    store = str(tmp_path / "s.zarr")
    code, _, err, exc = cli.run("ingest", _log(tmp_path / "log.csv", [(EARLY, 0), (BOTH, 0), (LATE, 1), (BOTH, 1)]),
                                "--out", store, "--items", tmp_path / "items.txt", "--rating-range", "1,5",
                                "--user-budget", CAP)
    assert code == 0, (err, exc)

    def train(name, *period):
        code, _, err, exc = cli.run("train", store, "--method", "als", "--epsilon", EPS, "--seed", "1",
                                          "--iters", "2", "--out", tmp_path / name, *period)
        assert code == 0, (err, exc)
        return json.loads((tmp_path / name / "privacy.json").read_text())["individual_privacy"]

    p1 = train("m1", "--since", "2024-01-01", "--until", "2024-01-08")
    after1 = _spend(store)
    p2 = train("m2", "--since", "2024-01-08", "--until", "2024-01-15")
    after2 = _spend(store)
    r, bound = p1["release_rdp"], p1["bound_rdp"]
    assert p2["release_rdp"] == r and 2 * r <= bound < 3 * r
    # the released counts counted the users of each window only (12 + 6 each)
    assert counted == [18, 18]
    for u in EARLY:
        assert after1[u] == (r, False) and after2[u] == (r, False)
    for u in LATE:
        assert after1[u] == (0.0, False) and after2[u] == (r, False)
    for u in BOTH:
        assert after1[u] == (r, False) and after2[u] == pytest.approx((2 * r, False))

    # both weeks, twice (the window and the retired users' views stacked): the users of both windows can afford
    # the count (charged first) but not the rest of a third release: counted, then retired; the fourth release
    # counts the 24 users of the window who are kept, and retires them in turn
    first = train("m3", "--since", "2024-01-01", "--until", "2024-01-15")["stages_rdp"][0]
    after3 = _spend(store)
    train("m4", "--since", "2024-01-01", "--until", "2024-01-15")
    after4 = _spend(store)
    assert counted == [18, 18, 30, 24]
    for u in (*EARLY, *LATE):
        assert after3[u] == pytest.approx((2 * r, False)) and after4[u] == pytest.approx((2 * r + first, True))
    for u in BOTH:
        assert after3[u] == pytest.approx((2 * r + first, True)) and after4[u] == after3[u]
    assert max(v for v, _ in after4.values()) <= bound
    # every user's lifetime loss, converted by dp-accounting at the cap's order and delta, is within the cap
    worst = rdp_epsilon(p1["alpha"], max(v for v, _ in after4.values()), p1["cap"]["delta"])
    assert worst <= p1["cap"]["epsilon"] == 5.0


def test_a_window_whose_every_user_is_retired_is_refused_in_one_line(tmp_path, cli):
    (tmp_path / "items.txt").write_text("\n".join(str(i) for i in range(12)) + "\n")
    store = str(tmp_path / "s.zarr")
    code, _, err, exc = cli.run("ingest", _log(tmp_path / "log.csv", [(EARLY, 0), (LATE, 1)]), "--out", store,
                                "--items", tmp_path / "items.txt", "--rating-range", "1,5", "--user-budget", CAP)
    assert code == 0, (err, exc)
    args = ("train", store, "--method", "als", "--epsilon", EPS, "--seed", "1", "--iters", "2",
            "--since", "2024-01-01", "--until", "2024-01-08")
    for k in (1, 2, 3):  # the third: counted (the count is affordable), then retired
        code, _, err, exc = cli.run(*args, "--out", tmp_path / f"m{k}")
        assert code == 0, (err, exc)
    cli.error(cli.run(*args, "--out", tmp_path / "m4"), "every user with a rating in the period has reached")
    assert not (tmp_path / "m4").exists()
    late = _spend(store)
    assert all(late[u] == (0.0, False) for u in LATE)  # never charged: no rating in the window


def test_the_store_as_of_a_segment_charges_its_users_only_and_keeps_the_later_users_spend(tmp_path, cli):
    (tmp_path / "items.txt").write_text("\n".join(str(i) for i in range(12)) + "\n")
    store = str(tmp_path / "s.zarr")
    code, _, err, exc = cli.run("ingest", _log(tmp_path / "w0.csv", [(EARLY, 0)]), "--out", store,
                                "--items", tmp_path / "items.txt", "--rating-range", "1,5", "--user-budget", CAP)
    assert code == 0, (err, exc)
    code, _, err, exc = cli.run("ingest", _log(tmp_path / "w1.csv", [(LATE, 1)], seed=1), "--append", store)
    assert code == 0, (err, exc)
    args = ("train", store, "--method", "als", "--epsilon", EPS, "--seed", "1", "--iters", "2")
    for k, extra in ((1, ()), (2, ("--until-segment", "0"))):
        code, _, err, exc = cli.run(*args, *extra, "--out", tmp_path / f"m{k}")
        assert code == 0, (err, exc)
    r = json.loads((tmp_path / "m1" / "privacy.json").read_text())["individual_privacy"]["release_rdp"]
    spend = _spend(store)
    assert all(spend[u] == pytest.approx((2 * r, False)) for u in EARLY)
    assert all(spend[u] == pytest.approx((r, False)) for u in LATE)  # not yet users as of segment 0


def test_who_contributes_to_a_window_is_read_once_and_the_same_without_the_cache(tmp_path, cli, monkeypatch):
    from streamdp.storage import timeline

    store = str(tmp_path / "s.zarr")
    code, _, err, exc = cli.run("ingest", _log(tmp_path / "log.csv", [(EARLY, 0), (BOTH, 0), (LATE, 1)]), "--out",
                                store, "--block-users", "7")
    assert code == 0, (err, exc)
    reads = []
    real = timeline.TimeWindowView.block_user_counts
    monkeypatch.setattr(timeline.TimeWindowView, "block_user_counts",
                        lambda self, b, split="train": reads.append(b) or real(self, b, split))

    def who(cache_bytes):
        monkeypatch.setattr(timeline, "CONTRIBUTED_CACHE", cache_bytes)
        view = timeline.time_window(open_store(store), since="2024-01-01", until="2024-01-08")
        reads.clear()
        n = view.n_contributors()
        mask = np.concatenate([timeline.contributors(view)(lo, lo + 10) for lo in range(0, view.n_users, 10)])
        return n, mask, len(reads), view.n_blocks

    n, mask, n_reads, n_blocks = who(timeline.CONTRIBUTED_CACHE)
    assert n_blocks > 2 and n_reads == n_blocks  # one pass: the count and the filter's masks share it
    n0, mask0, n_reads0, _ = who(0)
    assert n_reads0 > n_blocks and n == n0 == int(mask.sum()) == 18 and np.array_equal(mask, mask0)


def test_a_sweep_of_a_window_charges_its_users_only_and_tune_stays_refused(tmp_path, cli):
    (tmp_path / "items.txt").write_text("\n".join(str(i) for i in range(12)) + "\n")
    store = str(tmp_path / "s.zarr")
    code, _, err, exc = cli.run("ingest", _log(tmp_path / "log.csv", [(EARLY, 0), (LATE, 1)]), "--out", store,
                                "--items", tmp_path / "items.txt", "--rating-range", "1,5", "--user-budget", CAP,
                                "--test-fraction", "0.2", "--seed", "1")
    assert code == 0, (err, exc)
    args = ("sweep", store, "--methods", "als", "--epsilons", EPS, "--seed", "1", "--since", "2024-01-08")
    # one count shared by the runs cannot be charged to each run's users: declared instead
    cli.error(cli.run(*args, "--out", tmp_path / "sw"), "has a per-user budget: give --users-bound")
    # what train refuses of any point, refused before anything is released
    cli.error(cli.run("sweep", store, "--methods", "als", "--epsilons", f"{EPS},inf", "--yes", "--users-bound",
                      "100", "--out", tmp_path / "sw"), "--epsilons inf", "per-user budget")
    assert not (tmp_path / "sw").exists() and not StoreBudget(store).entries()
    code, _, err, exc = cli.run(*args, "--users-bound", "100", "--out", tmp_path / "sw")
    assert code == 0, (err, exc)
    model = tmp_path / "sw" / "models" / f"als-eps{EPS:g}-r0"
    p = json.loads((model / "privacy.json").read_text())["individual_privacy"]
    assert p["stages_rdp"] == [p["release_rdp"]]  # a declared count: no count stage before the rest
    spend = _spend(store)
    assert all(spend[u] == (0.0, False) for u in EARLY)  # no rating in the window: charged nothing
    assert all(spend[u] == pytest.approx((p["release_rdp"], False)) for u in LATE)
    assert json.loads((tmp_path / "sw" / "results.json").read_text())["data_window"]["since_utc"] == \
        "2024-01-08T00:00:00Z"
    # tune still releases from no store with a per-user budget, a period or not
    cli.error(cli.run("tune", store, "--epsilon", EPS, "--since", "2024-01-08", "--out", tmp_path / "t"),
              "only `streamdp train` releases from such a store")
    assert not (tmp_path / "t").exists()
