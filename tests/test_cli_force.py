"""``--force`` replaces only streamdp's own outputs: a store (ingest, generate), a model (train), both (demo).

Anything else at ``--out`` is a one-line error (exit 2) and is left exactly as it was;
nothing hidden is left beside it either way.
"""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from streamdp.cli import main
from streamdp.privacy.budget import StoreBudget
from streamdp.workflows import demo as demo_module

SMALL = ["--users", "300", "--items", "20", "--ratings-per-user", "5", "--rank", "2"]


def cli(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    return r.exit_code, r.output


def snapshot(path):
    """Everything at ``path``: file contents by relative path (a file itself as '.')."""
    path = str(path)
    if os.path.isfile(path):
        return {".": open(path, "rb").read()}
    out = {}
    for root, dirs, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, path)] = open(p, "rb").read()
    return out


def hidden(d):
    return sorted(n for n in os.listdir(d) if n.startswith("."))


def foreign_targets(tmp_path):
    """A file, a directory with content, an empty directory and a symlink to a directory: none of them ours."""
    f = tmp_path / "notes.txt"
    f.write_text("precious\n")
    d = tmp_path / "photos"
    d.mkdir()
    (d / "cat.jpg").write_bytes(b"\xff\xd8 cat")
    e = tmp_path / "empty"
    e.mkdir()
    link = tmp_path / "link"
    link.symlink_to(d)
    return [f, d, e, link]


@pytest.fixture
def store(tmp_path):
    s = tmp_path / "s.zarr"
    assert cli("generate", "--out", s, *SMALL, "--test-fraction", "0.2")[0] == 0
    return s


def test_generate_and_ingest_force_refuse_what_is_not_a_store(tmp_path):
    data = tmp_path / "r.data"
    data.write_text("1\t10\t4\t100\n2\t10\t3\t101\n2\t11\t5\t102\n")
    for target in foreign_targets(tmp_path):
        before = snapshot(target)
        for args in (["generate", "--out", target, *SMALL, "--force"], ["ingest", data, "--out", target, "--force"]):
            code, out = cli(*args)
            assert code == 2, (args, out)
            lines = out.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith(f"streamdp: error: {target}: exists and is ")
            assert "--force replaces only a rating store" in lines[0] and "Traceback" not in out
            assert snapshot(target) == before
    assert (tmp_path / "link").is_symlink()
    assert hidden(tmp_path) == []


def test_train_force_refuses_what_is_not_a_model(store, tmp_path):
    for target in foreign_targets(tmp_path) + [store]:  # a store is not a model either
        before = snapshot(target)
        code, out = cli("train", store, "--epsilon", "1", "--rank", "2", "--out", target, "--force")
        assert code == 2, out
        assert out.strip().splitlines() == [f"streamdp: error: {target}: exists and is "
                                            + ("a symbolic link" if target.name == "link" else
                                               "not a streamdp model")
                                            + "; --force replaces only a model, so it was left untouched"]
        assert snapshot(target) == before
    # nothing was reserved: the check comes before the budget
    assert StoreBudget(store).show()["entries"] == []
    assert hidden(tmp_path) == []


def test_force_replaces_our_own_and_leaves_nothing_hidden(store, tmp_path):
    m = tmp_path / "m"
    common = ["--epsilon", "1", "--rank", "2", "--out", m]
    assert cli("train", store, *common)[0] == 0
    code, out = cli("train", store, *common)
    assert code == 2 and "already exists (use --force" in out
    assert cli("train", store, *common, "--force")[0] == 0
    assert json.loads((m / "model.json").read_text())["budget_entry"] == StoreBudget(store).show()["entries"][-1]["id"]
    assert cli("generate", "--out", store, *SMALL, "--seed", "5", "--force")[0] == 0
    assert hidden(tmp_path) == [] and hidden(store) == []


def test_demo_refuses_existing_outputs_without_force(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "model").mkdir()
    (d / "model" / "mine.txt").write_text("not a model")
    before = snapshot(d)
    code, out = cli("demo", "--out", d)
    assert code == 2 and out.strip().splitlines() == [
        f"streamdp: error: {d / 'model'}: already exists (use --force to overwrite a streamdp model)"]
    code, out = cli("demo", "--out", d, "--force")
    assert code == 2 and out.strip().splitlines() == [
        f"streamdp: error: {d / 'model'}: exists and is not a streamdp model; --force replaces only a model, "
        f"so it was left untouched"]
    assert snapshot(d) == before  # the checks come first: no store was generated either
    (tmp_path / "f").write_text("x")
    code, out = cli("demo", "--out", tmp_path / "f")
    assert code == 2 and "is not a directory" in out and (tmp_path / "f").read_text() == "x"


def test_demo_force_replaces_its_own_and_keeps_the_ledger(tmp_path, monkeypatch):
    monkeypatch.setattr(demo_module, "DEMO_STORE", {**demo_module.DEMO_STORE, "n_users": 3000, "n_items": 60})
    d = tmp_path / "d"
    assert cli("demo", "--out", d, "--json")[0] == 0
    code, out = cli("demo", "--out", d)
    assert code == 2 and "already exists" in out
    code, out = cli("demo", "--out", d, "--force", "--json")
    assert code == 0, out
    res = json.loads(out)
    assert res["store"] == str(d / "ratings.zarr") and res["model"] == str(d / "model")
    s = StoreBudget(d / "ratings.zarr").show()
    assert [e["status"] for e in s["entries"]] == ["complete", "complete"] and len(s["history"]) == 1
    assert hidden(d) == [] and sorted(os.listdir(d)) == ["model", "ratings.zarr"]


def test_demo_without_out_prints_no_temporary_paths(tmp_path, monkeypatch):
    monkeypatch.setattr(demo_module, "DEMO_STORE", {**demo_module.DEMO_STORE, "n_users": 3000, "n_items": 60})
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    code, out = cli("demo")
    assert code == 0, out
    assert str(tmp_path) not in out and "streamdp-demo-" not in out
    assert "generated a temporary store" in out and "--out DIR keeps it" in out
    code, out = cli("demo", "--json")
    res = json.loads(out)
    assert res["store"] is None and res["model"] is None
    assert os.listdir(tmp_path) == []  # the temporary directory is gone
