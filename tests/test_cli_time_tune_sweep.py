"""``tune`` and ``sweep`` on a period of a store (``--since/--until/--window/--until-segment``), as ``train``
(issue 43 part 2): the same options, the same period read and counted, recorded as ``data_window``."""

from __future__ import annotations

import json
import os

import pytest

from streamdp.methods import base
from streamdp.workflows import sweep as sweep_module
from tests.test_cli_time import BAD_PERIODS, _log


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Two weeks of ratings (240 users in week 0, 160 in week 1; 20% held out) with the items and the rating range
    declared, so that a private run on so few users selects nothing."""
    from streamdp.workflows.api import ingest

    tmp = tmp_path_factory.mktemp("period")
    (tmp / "items.txt").write_text("".join(f"{i}\n" for i in range(25)))
    src = tmp / "log.csv"
    _log(tmp / "w0.csv", 0, 2400, 240, 0, 7)
    _log(tmp / "w1.csv", 1, 1600, 160, 7, 7, header=False)
    src.write_text((tmp / "w0.csv").read_text() + (tmp / "w1.csv").read_text())
    ingest(str(src), str(tmp / "s.zarr"), test_fraction=0.2, seed=1, rating_range="1,5", items=str(tmp / "items.txt"))
    return tmp, str(tmp / "s.zarr")


@pytest.fixture()
def counted(monkeypatch):
    """The exact user counts the runs' released counts were drawn around (train and tune: methods.base; sweep:
    its own, once for all its runs)."""
    seen = []

    def spy(real):
        def f(n, **kw):
            seen.append(int(n))
            return real(n, **kw)
        return f

    monkeypatch.setattr(base, "release_user_count", spy(base.release_user_count))
    monkeypatch.setattr(sweep_module, "release_user_count", spy(sweep_module.release_user_count))
    return seen


def _train(cli, store, out, *period):
    code, _, err, exc = cli.run("train", store, "--epsilon", "1", "--seed", "1", "--out", out, *period)
    assert code == 0, (err, exc)
    return json.load(open(os.path.join(out, "model.json")))["data_window"]


def test_tune_reads_and_counts_the_period_train_does(store, cli, counted, tmp_path):
    _, st = store
    period = ("--since", "2024-01-08")
    trained = _train(cli, st, str(tmp_path / "m"), *period)
    code, printed, err, exc = cli.run("tune", st, "--epsilon", "1", "--seed", "1", "--out", tmp_path / "t", *period)
    assert code == 0, (err, exc)
    assert "period: ratings from 2024-01-08T00:00:00Z to the end" in printed
    model = json.load(open(tmp_path / "t" / "model.json"))
    assert model["data_window"] == trained and trained["since_utc"] == "2024-01-08T00:00:00Z"
    assert json.load(open(tmp_path / "t" / "privacy.json"))["public_parameters"]["data_window"] == trained
    # the same users counted: week 1's (at most 160 of the 400), not the store's
    assert len(counted) == 2 and counted[0] == counted[1] <= 160


def test_sweep_reads_and_counts_the_period_train_does(store, cli, counted, tmp_path):
    _, st = store
    period = ("--window", "3d", "--until", "2024-01-05")
    trained = _train(cli, st, str(tmp_path / "m"), *period)
    out = tmp_path / "sw"
    code, printed, err, exc = cli.run("sweep", st, "--methods", "als", "--epsilons", "1", "--seed", "1", "--out", out,
                                      *period)
    assert code == 0, (err, exc)
    assert "period: ratings from 2024-01-02T00:00:00Z to 2024-01-05T00:00:00Z (--window 3d, ending at --until)" \
        in printed
    res = json.load(open(out / "results.json"))
    assert res["data_window"] == trained
    assert json.load(open(out / "models" / "als-eps1-r0" / "model.json"))["data_window"] == trained
    assert len(counted) == 2 and counted[0] == counted[1] < 240  # users of days 1..3 of week 0 only


@pytest.mark.parametrize("command", ["tune", "sweep"])
@pytest.mark.parametrize("args, needles", BAD_PERIODS + [
    (("--until-segment", "3"), ("--until-segment 3", "has 0 segment")),  # a store without appends
])
def test_bad_periods_are_one_line_errors_and_leave_nothing(store, cli, tmp_path, command, args, needles):
    _, st = store
    before = sorted(os.listdir(st))
    extra = ("--epsilon", "1") if command == "tune" else ("--methods", "als", "--epsilons", "1")
    cli.error(cli.run(command, st, *extra, "--out", tmp_path / "o", *args), *needles)
    assert not os.path.exists(tmp_path / "o")
    assert sorted(os.listdir(st)) == before  # nothing reserved


def test_the_python_apis_take_the_period(store, tmp_path):
    import streamdp
    from streamdp.errors import ParameterError, StoreError
    from streamdp.workflows.sweep import sweep

    _, st = store
    with pytest.raises(ParameterError, match="give one"):
        streamdp.tune(st, epsilon=1, out=str(tmp_path / "t"), since="2024-01-02", window="1d")
    with pytest.raises(StoreError, match="no training rating in the window"):
        sweep(st, methods="als", epsilons="1", out=str(tmp_path / "s"), until="2023-01-01")
    assert not os.listdir(tmp_path)
    res = sweep(st, methods="als", epsilons="1", out=str(tmp_path / "s"), until_segment=0, dry_run=True)
    assert res["data_window"] == {"until_segment": 0} and res["dry_run"]


def test_a_rehearsal_of_a_period_is_refused_in_one_line(store, cli, tmp_path):
    _, st = store
    cli.error(cli.run("sweep", st, "--rehearse", "--methods", "als", "--epsilons", "1", "--out", tmp_path / "r",
                      "--window", "7d"), "--window: a rehearsal is shaped by numbers released of the whole store")
    assert not os.path.exists(tmp_path / "r")
