"""Progress bars: drawn on a terminal's stderr during train/evaluate/ingest; never under --json."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from streamdp.cli import main


@pytest.fixture
def terminal(monkeypatch):
    """As if stderr were a terminal (the test run's is not); quiet() and STREAMDP_PROGRESS still apply."""
    monkeypatch.delenv("STREAMDP_PROGRESS", raising=False)
    monkeypatch.setattr("streamdp.progress._stderr_is_terminal", lambda: True)


def test_train_and_evaluate_draw_bars_on_a_terminal(small_store, tmp_path, terminal):
    runner = CliRunner()
    out = str(tmp_path / "m")
    res = runner.invoke(main, ["train", small_store.path, "--method", "als", "--epsilon", "inf", "--yes", "--iters", "2",
                               "--out", out])
    assert res.exit_code == 0, res.output
    assert "als iteration 2/2" in res.stderr and "evaluate" in res.stderr and "block" in res.stderr
    assert "\r" not in res.stdout
    res = runner.invoke(main, ["evaluate", out, small_store.path])
    assert res.exit_code == 0 and "evaluate" in res.stderr and res.stdout.startswith("als ")


def test_json_output_stays_one_object_and_draws_no_bar(small_store, tmp_path, terminal):
    runner = CliRunner()
    out = str(tmp_path / "m")
    res = runner.invoke(main, ["train", small_store.path, "--method", "als", "--epsilon", "inf", "--yes", "--iters", "2",
                               "--out", out, "--json"])
    assert res.exit_code == 0, res.output
    assert isinstance(json.loads(res.stdout), dict) and res.stdout.count("\n") == 1
    assert "block" not in res.stderr and "\r" not in res.stderr
    res = runner.invoke(main, ["evaluate", out, small_store.path, "--json"])
    assert res.exit_code == 0 and isinstance(json.loads(res.stdout), dict) and res.stderr == ""


def test_ingest_json_draws_no_bar(tmp_path, terminal):
    src = tmp_path / "r.csv"
    src.write_text("user,item,rating\n" + "".join(f"{u},{i},{1 + (u + i) % 5}\n" for u in range(30)
                                                   for i in range(5)))
    res = CliRunner().invoke(main, ["ingest", str(src), "--out", str(tmp_path / "s.zarr"), "--json"])
    assert res.exit_code == 0, res.output
    assert isinstance(json.loads(res.stdout), dict) and res.stderr == ""
    res = CliRunner().invoke(main, ["ingest", str(src), "--out", str(tmp_path / "t.zarr")])
    assert res.exit_code == 0 and "write" in res.stderr  # the same ingest on a terminal shows its bars
