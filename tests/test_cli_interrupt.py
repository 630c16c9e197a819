"""Ctrl-C anywhere in the CLI: exit 130 and one line saying what was and was not released."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from click.testing import CliRunner

from streamdp.cli import main
from streamdp.privacy.budget import StoreBudget
from streamdp.serving.model import load_model
from streamdp.workflows import demo as demo_module
from tests.privacy.test_budget_settle import run_dirs, training, wait_for


@pytest.fixture
def store(tmp_path):
    from streamdp.storage.generate import generate_store

    p = tmp_path / "s.zarr"
    generate_store(str(p), n_users=1500, n_items=60, ratings_per_user=8, rank=3, seed=3, test_fraction=0.2,
                   show_progress=False)
    return p


def hidden(d):
    return sorted(n for n in os.listdir(d) if n.startswith("."))


def train_args(store, out):
    return ["train", str(store), "--epsilon", "1", "--delta", "1e-6", "--rank", "2", "--out", str(out)]


@pytest.mark.slow  # issue 41: a real SIGINT is test_sigint_exit_code_of_a_real_process, a real train interrupted is
# tests/adversarial/test_signals.py::test_sigterm_while_training_settles_like_ctrl_c (both by default)
def test_sigint_while_training(store, tmp_path):
    out = tmp_path / "model"
    with training(store, out) as (proc, entry):
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert err.splitlines() == [f"streamdp: interrupted before anything was released; the budget reservation "
                                f"{entry['id']} in {store / 'privacy_budget.json'} was marked failed"]
    (e,) = StoreBudget(store).show()["entries"]
    assert e["status"] == "failed" and e["reason"] == "interrupted (Ctrl-C)"
    assert not out.exists() and run_dirs(store) == [] and hidden(tmp_path) == []


def test_interrupt_during_evaluation(store, tmp_path, monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("streamdp.workflows.training.evaluate_model", interrupted)
    out = tmp_path / "model"
    r = CliRunner().invoke(main, train_args(store, out))
    assert r.exit_code == 130
    assert r.output.splitlines() == [f"streamdp: interrupted after the model was written to {out} and its budget "
                                     f"recorded; evaluation skipped"]
    (e,) = StoreBudget(store).show()["entries"]
    assert e["status"] == "complete" and load_model(out).info["budget_entry"] == e["id"]


@pytest.mark.parametrize("after_rename", [False, True])
def test_interrupt_while_writing_the_model(store, tmp_path, monkeypatch, after_rename):
    """Ctrl-C right before / right after the model's rename: the entry says exactly that."""
    import streamdp.serving.model

    real = streamdp.serving.model.install_dir

    def install_then_interrupt(tmp, dest, **kw):
        if after_rename:
            real(tmp, dest, **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(streamdp.serving.model, "install_dir", install_then_interrupt)
    out = tmp_path / "model"
    r = CliRunner().invoke(main, train_args(store, out))
    assert r.exit_code == 130
    (e,) = StoreBudget(store).show()["entries"]
    if after_rename:
        assert r.output.splitlines() == [f"streamdp: interrupted after the model was written to {out} and its "
                                         f"budget recorded"]
        assert e["status"] == "complete" and load_model(out).info["budget_entry"] == e["id"]
    else:
        assert r.output.splitlines() == [f"streamdp: interrupted before anything was released; the budget "
                                         f"reservation {e['id']} in {store / 'privacy_budget.json'} was marked "
                                         f"failed"]
        assert e["status"] == "failed" and e["stage"] == "writing" and not out.exists()
    assert hidden(tmp_path) == []


def test_interrupt_in_any_other_command(store, monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("streamdp.storage.info.store_summary", interrupted)
    r = CliRunner().invoke(main, ["info", str(store)])
    assert r.exit_code == 130 and r.output.splitlines() == [
        "streamdp: interrupted; nothing was released and nothing is left half-written (outputs are written all "
        "or nothing)"]
    assert "Aborted" not in r.output


def test_interrupted_demo(tmp_path, monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(demo_module, "DEMO_STORE", {**demo_module.DEMO_STORE, "n_users": 2000, "n_items": 50})
    monkeypatch.setattr("streamdp.workflows.training.evaluate_model", interrupted)  # train's evaluation
    monkeypatch.setattr("streamdp.workflows.demo.evaluate_model", interrupted)  # the demo's own evaluation
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    r = CliRunner().invoke(main, ["demo"])
    assert r.exit_code == 130
    assert r.output.splitlines()[-1] == ("streamdp: interrupted; the demo's temporary store and model were removed, "
                                         "nothing was kept")
    assert os.listdir(tmp_path) == []
    d = tmp_path / "d"
    r = CliRunner().invoke(main, ["demo", "--out", str(d)])
    assert r.exit_code == 130
    assert r.output.splitlines()[-1] == (f"streamdp: interrupted after the model was written to {d / 'model'} and "
                                         f"its budget recorded; evaluation skipped")
    assert json.loads((d / "model" / "model.json").read_text())["format"] == "streamdp-model"


def test_sigint_exit_code_of_a_real_process(tmp_path):
    """Not click's 'Aborted!' (exit 1): a subprocess interrupted while generating exits 130, leaving nothing."""
    out = tmp_path / "big.zarr"
    proc = subprocess.Popen([sys.executable, "-m", "streamdp.cli", "generate", "--out", str(out), "--users",
                             "50000000", "--items", "100", "--ratings-per-user", "2", "--workers", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: hidden(tmp_path) != [], "the temporary store", proc=proc)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.splitlines() == ["streamdp: interrupted; nothing was released and nothing is left half-written "
                                "(outputs are written all or nothing)"]
    assert os.listdir(tmp_path) == []
