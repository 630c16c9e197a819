"""streamdp demo: the README's main job runs end to end (on a smaller store here, for speed)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from streamdp.cli import main
from streamdp.workflows import demo


def test_demo_cli(tmp_path, monkeypatch):
    monkeypatch.setattr(demo, "DEMO_STORE", {**demo.DEMO_STORE, "n_users": 20_000, "n_items": 300})
    res = CliRunner().invoke(main, ["demo", "--out", str(tmp_path / "d"), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["guarantee"] == "user-level (epsilon, delta)-DP" and 0.99 <= d["epsilon"] <= 1.0
    assert d["n_ratings"] > 0 and d["rmse"] < d["baselines"]["global_mean"]["rmse"]
    assert (tmp_path / "d" / "model" / "privacy.json").exists()
    res = CliRunner().invoke(main, ["demo", "--out", str(tmp_path / "d"), "--force"])
    assert res.exit_code == 0 and "test RMSE" in res.output and "privacy spent: epsilon" in res.output
