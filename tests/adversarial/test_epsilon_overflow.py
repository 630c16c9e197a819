"""An epsilon that overflows a float is an error naming its flag; only the literal ``inf`` is a non-private run.

Before: ``--epsilon 1e309`` (and ``1e400``) parsed to ``inf`` through click's ``float`` and
trained a **non-private** model with exit code 0; so did ``streamdp.train(..., epsilon="1e309")``,
``sweep --epsilons 1e309``, ``budget --set 1e309,1e-6`` and the other commands that take an epsilon.
"""

from __future__ import annotations

import math

import pytest
from click.testing import CliRunner

from streamdp.cli import main
from streamdp.errors import ParameterError


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from streamdp.storage.generate import generate_store

    path = tmp_path_factory.mktemp("eps") / "s.zarr"
    generate_store(str(path), n_users=120, n_items=30, ratings_per_user=6, rank=2, seed=3, test_fraction=0.2)
    return path


def one_line_error(args, *needles):
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("streamdp: error: "), r.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return r


@pytest.mark.parametrize("text", ["1e309", "1e400", "-1e309", "9" * 400])
def test_overflowing_epsilon_is_refused_by_every_command(store, tmp_path, text):
    flag = f"--epsilon {text}: overflows a float"
    one_line_error(["train", store, "--epsilon", text, "--out", tmp_path / "m"], flag)
    one_line_error(["train", store, "--method", "oja", "--epsilon", text, "--out", tmp_path / "m"], flag)
    one_line_error(["tune", store, "--epsilon", text, "--out", tmp_path / "t"], flag)
    one_line_error(["lowrank", store, "--rank", "2", "--epsilon", text, "--out", tmp_path / "l"], flag)
    one_line_error(["demo", "--epsilon", text], flag)
    one_line_error(["privacy", "calibrate", "--epsilon", text], flag)
    one_line_error(["sweep", store, "--epsilons", f"1,{text}", "--out", tmp_path / "sw"], f"--epsilons {text}")
    one_line_error(["budget", store, "--set", f"{text},1e-6"], f"--set {text}")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written
    from streamdp.privacy.budget import StoreBudget

    assert StoreBudget(str(store)).show().get("budget") is None  # the budget was not set


@pytest.mark.parametrize("text", ["inf", "INF", "Infinity", "+inf"])
def test_the_literal_inf_still_trains_without_noise(store, tmp_path, text):
    r = CliRunner().invoke(main, ["train", str(store), "--epsilon", text, "--yes", "--out", str(tmp_path / "m"), "--seed",
                                  "1", "--json"])
    assert r.exit_code == 0, (r.output, r.exception)
    assert '"guarantee": "non-private"' in r.stdout


def test_python_api_parses_strings_strictly(store, tmp_path):
    import streamdp
    from streamdp.workflows import api

    with pytest.raises(ParameterError, match=r"--epsilon 1e309: overflows"):
        streamdp.train(str(store), epsilon="1e309", out=str(tmp_path / "m"))
    with pytest.raises(ParameterError, match=r"--epsilon 1e309: overflows"):
        api.tune(str(store), epsilon="1e309", out=str(tmp_path / "t"))
    from streamdp.methods import get_method

    with pytest.raises(ParameterError, match="overflows"):
        get_method("als")(epsilon="1e400", delta=1e-6)
    with pytest.raises(ParameterError, match="--budget 1e309"):
        api.ingest([], str(tmp_path / "s.zarr"), budget="1e309,1e-6")
    assert not (tmp_path / "m").exists() and not (tmp_path / "t").exists()


def test_parse_epsilon():
    from streamdp.privacy.accountant import parse_epsilon

    assert parse_epsilon("0.5") == 0.5 and parse_epsilon(" inf ") == math.inf and parse_epsilon(math.inf) == math.inf
    assert parse_epsilon("1e308") == 1e308
    for bad in ("1e309", "-1e999", "x", "", True):
        with pytest.raises(ParameterError):
            parse_epsilon(bad)
