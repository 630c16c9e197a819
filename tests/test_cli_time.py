"""``train --since/--until/--window/--until-segment`` and ``evaluate --segment`` from the CLI (issue 43 part 2)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

DAY = 86400
T0 = 1704067200  # 2024-01-01T00:00:00Z


def _log(path, seed: int, n: int, users: int, day0: int, days: int, header=True):
    rng = np.random.default_rng(seed)
    rows = zip(rng.integers(0, users, n), rng.integers(0, 25, n), rng.integers(1, 6, n),
               T0 + day0 * DAY + rng.integers(0, days * DAY, n))
    path.write_text(("user,item,rating,timestamp\n" if header else "") + "".join(f"{u},{i},{r},{t}\n"
                                                                                 for u, i, r, t in rows))
    return str(path)


@pytest.fixture()
def weeks(tmp_path, cli):
    """A store of week 0 (120 users, 20% held out) with week 1 appended as segment 1 (users 100..139)."""
    store = str(tmp_path / "s.zarr")
    cli.run("ingest", _log(tmp_path / "w0.csv", 0, 1500, 120, 0, 7), "--out", store, "--test-fraction", "0.2",
            "--seed", "1")
    code, _, err, _ = cli.run("ingest", _log(tmp_path / "w1.csv", 1, 500, 40, 7, 7),
                              "--append", store)
    assert code == 0, err
    return tmp_path, store


def _train(cli, store, out, *extra):
    return cli.run("train", store, "--method", "als", "--epsilon", "inf", "--yes", "--seed", "1", "--out", out,
                   "--iters", "2", "--ranking-users", "50", *extra)


def test_train_since_and_window_record_the_period_and_count_only_its_users(weeks, cli):
    tmp, store = weeks
    out = str(tmp / "m")
    code, printed, err, exc = _train(cli, store, out, "--since", "2024-01-08")
    assert code == 0, (err, exc)
    assert "period: ratings from 2024-01-08T00:00:00Z to the end" in printed
    model = json.load(open(os.path.join(out, "model.json")))
    assert model["data_window"]["since_utc"] == "2024-01-08T00:00:00Z" and model["data_window"]["until"] is None
    privacy = json.load(open(os.path.join(out, "privacy.json")))
    assert privacy["public_parameters"]["data_window"] == model["data_window"]
    # week 1 is users 0..39 of the second log: only they rated since 2024-01-08 (a non-private run's exact count)
    assert model["n_users"] <= 40

    code, _, err, exc = _train(cli, store, str(tmp / "m2"), "--window", "3d", "--until", "2024-01-05")
    assert code == 0, (err, exc)
    w = json.load(open(tmp / "m2" / "model.json"))["data_window"]
    assert (w["since_utc"], w["until_utc"], w["window"], w["ends_at"]) == (
        "2024-01-02T00:00:00Z", "2024-01-05T00:00:00Z", "3d", "--until")
    assert json.load(open(tmp / "m2" / "model.json"))["n_users"] <= 120


#: Periods refused in one line by every command that takes them (train, tune, sweep: tests/test_cli_time_tune_sweep.py).
BAD_PERIODS = [
    (("--since", "2024-02-30"), ("--since '2024-02-30': not an ISO date",)),
    (("--window", "90x"), ("--window '90x'",)),
    (("--since", "2024-01-02", "--window", "1d"), ("give one",)),
    (("--since", "2024-01-05", "--until", "2024-01-02"), ("is not before --until",)),
    (("--since", "2030-01-01"), ("no training rating in the window",)),
]


@pytest.mark.parametrize("args, needles", BAD_PERIODS + [
    (("--until-segment", "3"), ("--until-segment 3", "has 1 segment")),
])
def test_bad_periods_are_one_line_errors_and_leave_nothing(weeks, cli, args, needles):
    tmp, store = weeks
    cli.error(_train(cli, store, str(tmp / "m"), *args), *needles)
    assert not os.path.exists(tmp / "m")
    assert not [n for n in os.listdir(store) if n.startswith("privacy_budget")]  # nothing reserved


def test_a_store_without_times_refuses_a_period_with_one_line(tmp_path, cli):
    src = tmp_path / "a.csv"
    src.write_text("user,item,rating\n" + "".join(f"{u},{u % 7},{1 + u % 5}\n" for u in range(60)))
    cli.run("ingest", str(src), "--out", str(tmp_path / "s.zarr"))
    cli.error(_train(cli, str(tmp_path / "s.zarr"), str(tmp_path / "m"), "--window", "90d"),
              "keeps no rating times")
    assert not os.path.exists(tmp_path / "m")


def test_evaluate_segment_last_scores_on_the_last_segments_ratings_only(weeks, cli):
    from streamdp.storage.store import open_store

    tmp, store = weeks
    st = open_store(store)
    seg = st.segments[-1]
    n_future = seg.info.n_ratings + seg.info.n_test
    code, _, err, exc = _train(cli, store, str(tmp / "past"), "--until-segment", "0")
    assert code == 0, (err, exc)
    assert json.load(open(tmp / "past" / "model.json"))["data_window"] == {"until_segment": 0}
    code, out, err, exc = cli.run("evaluate", str(tmp / "past"), store, "--segment", "last", "--json",
                                  "--ranking-users", "50")
    assert code == 0, (err, exc)
    ev = json.loads(out)
    assert ev["n_ratings"] == n_future and ev["segment"]["number"] == 1
    assert ev["store_matches_model"] is True
    # the store's own test split is another set of ratings
    code, out, _, _ = cli.run("evaluate", str(tmp / "past"), store, "--json", "--allow-other-store",
                              "--ranking-users", "50")
    assert json.loads(out)["n_ratings"] == st.n_test != n_future
    # a model trained on the whole store has seen the segment: refused
    assert _train(cli, store, str(tmp / "all"))[0] == 0
    cli.error(cli.run("evaluate", str(tmp / "all"), store, "--segment", "1"), "was not trained on the store before "
              "segment 1")
    cli.error(cli.run("evaluate", str(tmp / "past"), store, "--segment", "2"), "has segments 1..1")


def test_the_python_api_takes_the_period_and_the_segment(weeks):
    import streamdp

    tmp, store = weeks
    m = streamdp.train(store, method="als", epsilon=float("inf"), allow_nonprivate=True, seed=1, iters=2,
                       out=str(tmp / "api"), until_segment=0, ranking_users=50, evaluate=False)
    assert m.info["data_window"] == {"until_segment": 0}
    ev = streamdp.evaluate(str(tmp / "api"), store, segment="last", ranking_users=50)
    assert ev["segment"]["number"] == 1 and ev["store_matches_model"] is True


def test_a_checkpoint_resumes_only_a_run_of_the_same_period(weeks, cli):
    tmp, store = weeks
    ck, items = str(tmp / "ck"), tmp / "items.txt"
    items.write_text("".join(f"{i}\n" for i in range(25)))

    def private(out, since):
        return cli.run("train", store, "--epsilon", "5", "--items", items, "--seed", "1", "--out", out, "--iters",
                       "2", "--since", since, "--checkpoint", ck, "--ranking-users", "50")

    code, _, err, exc = private(str(tmp / "m1"), "2024-01-03")
    assert code == 0, (err, exc)
    cli.error(private(str(tmp / "m2"), "2024-01-05"), "a checkpoint of a different run")
