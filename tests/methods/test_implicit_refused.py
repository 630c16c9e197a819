"""Rating methods refuse an implicit store in one line naming ``--method ials`` (issue 29, item 2)."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from streamdp.cli import main
from streamdp.errors import ParameterError
from streamdp.methods import METHODS, load_builtin
from streamdp.methods.lowrank import LowRank
from streamdp.storage.ingest import ingest
from streamdp.workflows.training import prepare
from streamdp.workflows.tune import tune

load_builtin()
RATING_METHODS = sorted(n for n, c in METHODS.items() if not c.ACCEPTS_IMPLICIT) + ["lowrank"]


@pytest.fixture(scope="module")
def log_store(tmp_path_factory):
    d = tmp_path_factory.mktemp("implicit")
    rng = np.random.default_rng(0)
    p = d / "log.csv"
    p.write_text("user,item\n" + "".join(f"{u},{i}\n" for u, i in zip(rng.integers(0, 300, 3000),
                                                                       rng.integers(0, 50, 3000))))
    return ingest([str(p)], str(d / "s.zarr"), test_fraction=0.2, notes=False)


def test_every_rating_method_is_marked():
    assert {"als", "irls", "means", "oja", "fw", "svd", "sgd", "sgld", "public-private", "lowrank"} <= \
        set(RATING_METHODS)


@pytest.mark.parametrize("name", RATING_METHODS)
def test_prepare_refuses_an_implicit_store(log_store, tmp_path, name):
    with pytest.raises(ParameterError, match=rf"--method {name}: .* is an implicit store .* use --method ials"):
        prepare(log_store, method=LowRank if name == "lowrank" else name, out=str(tmp_path / "m"), epsilon=1.0, delta=1e-5)
    assert not (tmp_path / "m").exists()


def test_train_without_a_method_trains_ials_on_an_interaction_log(log_store, tmp_path):
    """The default method is ials on an implicit store (als would refuse it), and train says so; a rating store's
    default stays als."""
    from streamdp.workflows.training import default_method

    items = tmp_path / "items.txt"
    items.write_text("".join(f"{i}\n" for i in range(50)))  # declared: 300 users are too few to select them
    r = CliRunner().invoke(main, ["train", log_store.path, "--epsilon", "1", "--seed", "1", "--items", str(items),
                                  "--out", str(tmp_path / "m")])
    assert r.exit_code == 0, r.output
    assert "wrote " in r.output and ": ials " in r.output.splitlines()[0], r.output
    assert "method: ials, the default on an interaction log" in r.output
    assert default_method(log_store) == "ials"
    r = CliRunner().invoke(main, ["tune", log_store.path, "--epsilon", "1", "--seed", "1", "--items", str(items),
                                  "--grid", "rank=4", "--out", str(tmp_path / "t")])
    assert r.exit_code == 0 and ": ials " in r.output.splitlines()[0], r.output


def test_train_and_tune_refuse_in_one_line(log_store, tmp_path):
    r = CliRunner().invoke(main, ["train", log_store.path, "--method", "als", "--epsilon", "1",
                                  "--out", str(tmp_path / "m")])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "use --method ials" in r.stderr, r.stderr
    with pytest.raises(ParameterError, match="use --method ials"):
        tune(log_store, epsilon=1.0, method="als", out=str(tmp_path / "t"))
    r = CliRunner().invoke(main, ["sweep", log_store.path, "--methods", "als", "--epsilons", "1",
                                  "--out", str(tmp_path / "sw")])
    assert r.exit_code == 2 and "use --method ials" in r.stderr, r.stderr
    assert not any((tmp_path / n).exists() for n in ("m", "t", "sw"))


def test_sweep_refuses_an_implicit_store_for_any_method(log_store, tmp_path):
    """A sweep plots test RMSE, which an implicit store does not have (even for a method that trains on it)."""
    import streamdp.methods as registry
    from streamdp.workflows.sweep import sweep

    class Accepting(registry.get_method("means")):
        name = "means-accepting-implicit"
        ACCEPTS_IMPLICIT = True

    registry.METHODS[Accepting.name] = Accepting
    try:
        with pytest.raises(ParameterError, match="no test RMSE"):
            sweep(log_store, methods=[Accepting.name], epsilons=[1.0], out=str(tmp_path / "sw"))
    finally:
        del registry.METHODS[Accepting.name]
    assert not (tmp_path / "sw").exists()
