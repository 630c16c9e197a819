"""``bench/refresh.py``: a replay of weekly appends and refreshes on a tiny generated store, end to end."""

from __future__ import annotations

import pytest

from bench import refresh


@pytest.mark.slow  # a bench smoke run (7 s warm, more from a cold cache); the argument check below is its guard
def test_refresh_quick_prints_the_table_and_b_stops_when_its_budget_runs_out(tmp_path, capsys):
    out = tmp_path / "t.md"
    # a store budget of 1: one release at epsilon 1 fits, the second does not
    assert refresh.main(["--quick", "--users", "200", "--weeks", "2", "--first-weeks", "1", "--budget", "1",
                         "--ranking-users", "50", "--out", str(out)]) == 0
    text = out.read_text()
    assert text in capsys.readouterr().out
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    assert lines[0] == "| " + " | ".join(refresh.COLUMNS) + " |"
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:]]
    assert [r[0] for r in rows] == ["1", "2"]  # weeks 1 and 2 scored as the future of the store before them
    assert not rows[0][4].startswith("stopped") and rows[1][4].startswith("stopped: budget spent")
    assert "(b) stopped at week 2" in text
    for r in rows:
        for c in (2, 3, 5, 6, 7):
            assert 0 <= float(r[c]) < 5
        assert r[8].endswith("%") and float(r[11]) > 0
        assert float(r[10].removesuffix(" (compiling)")) > 0  # full fit seconds, marked when they compiled
    assert not list(tmp_path.glob("bench-refresh-*"))


def test_a_fit_that_compiled_is_marked():
    row = {"week": 3, "new ratings": 10, "a": (0.1, 1.0), "b": (0.1, 1.0), "b_note": "", "c": (0.2, 0.9),
           "c_note": "", "retired": 0.0, "c_s": 0.5, "c_warm": True, "full_s": 1.0, "c_compiled": True,
           "full_compiled": False}
    cells = [c.strip() for c in refresh.table([row]).splitlines()[2].strip("|").split("|")]
    assert cells[9:] == ["0.50 (compiling)", "1.00", "0.50"]


def test_bad_arguments_are_refused_before_anything_is_made(tmp_path):
    with pytest.raises(SystemExit) as e:
        refresh.main(["--quick", "--weeks", "0", "--dir", str(tmp_path / "w")])
    assert e.value.code == 2 and not (tmp_path / "w").exists()


def test_a_training_seed_of_its_own_replays_the_same_log_and_is_said():
    a = refresh.parse(["--quick", "--seed", "3", "--train-seed", "5"])
    assert (a.seed, a.train_seed) == (3, 5)
    assert "log seed 3, training seed 5" in refresh.header(a, None, 1.0)
    b = refresh.parse(["--quick", "--seed", "3"])
    assert b.train_seed == 3 and "training seed" not in refresh.header(b, None, 1.0)


def test_method_default_trains_as_train_without_method(monkeypatch, tmp_path):
    """``--method default`` names no method: ``train`` then runs its default (als with its lists part)."""
    import types

    import streamdp.workflows.api as api

    seen = {}

    def fake_train(store, *, method, **kw):
        seen["method"] = method
        return types.SimpleNamespace(summary={"train_seconds": 0.1})

    monkeypatch.setattr(api, "train", fake_train)
    a = refresh.parse(["--quick", "--method", "default"])
    r = refresh.Replay.__new__(refresh.Replay)
    r.args, r.root, r.stores = a, str(tmp_path), {"B": "b.zarr"}
    r._train("b", "B", 0)
    assert seen["method"] is None and "--method default" in refresh.header(a, None, 1.0)


def test_the_verdict_names_the_weeks_below_the_trained_once_model_and_the_ratio_to_the_full_retrain():
    def row(week, a, b, c, retired=0.0):
        return {"week": week, "a": (a, 1.0), "b": (b, 1.0), "c": (c, 1.0), "retired": retired}

    text = refresh.verdict([row(4, 0.10, 0.10, 0.10), row(5, 0.12, 0.14, 0.11), row(6, 0.10, 0.16, 0.15, 0.25)])
    assert text.startswith("(c) at least (a) in 2 of 3 weeks (below: 5 (-0.0100));")
    assert "0.900x the full retrain's" in text and "25.0% of (c)'s users retired" in text
    assert "below" not in refresh.verdict([row(4, 0.1, 0.1, 0.1)])


def test_als_replays_warm_started_refreshes_by_default_and_auto_is_asked_for():
    a = refresh.parse([])
    assert (a.select, a.iters, a.weeks, a.ranking_users) == ("off", 4, 20, "all")
    assert refresh.parse(["--select", "auto"]).select == "auto"
    assert refresh.parse(["--method", "ials"]).select is None
    with pytest.raises(SystemExit):
        refresh.parse(["--ranking-users", "0"])


def test_the_verdict_holds_the_refresh_to_the_exact_chart_when_every_week_has_it():
    def row(week, c, chart):
        return {"week": week, "a": (0.1, 1.0), "b": (0.2, 1.0), "c": (c, 1.0), "retired": 0.0, "chart": chart}

    text = refresh.verdict([row(5, 0.3, 0.1), row(6, 0.05, 0.1)])
    assert "(c)'s average 1.750x the exact most-popular chart's (non-private, 0.1000), below it in 1 of 2 weeks" in text
    assert "chart" not in refresh.verdict([row(5, 0.3, None), row(6, 0.05, 0.1)])


def test_the_window_is_sized_by_the_users_it_holds_unless_given():
    assert refresh.parse([]).window_weeks is None and refresh.parse([]).window_users == refresh.WINDOW_USERS
    assert refresh.parse(["--window-weeks", "4"]).window_weeks == 4
    # 10 new users a week, each active 2 weeks: 4 weeks hold 50 users (the first 4 weeks' 40 when the replay starts)
    weeks = [set(range(10 * w - 10, 10 * w + 10)) - set(range(-10, 0)) for w in range(12)]
    assert refresh.window_weeks(weeks, 4, 8, want=30) == 4
    assert refresh.window_weeks(weeks, 4, 8, want=60) == 8  # 8 weeks hold 90 users once there are that many
    assert refresh.window_weeks(weeks, 4, 8, want=1000) == 12  # never that many: every week there is
