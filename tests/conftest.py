"""Shared fixtures: small generated stores, the path to ../shared/data, the in-process CLI of the hostile-input tests;
the default parallel run."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from click.testing import CliRunner

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("STREAMDP_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """Run on every core by default (``-n auto --dist worksteal``) when pytest-xdist is installed.

    It is set here, not in addopts, so that ``-p no:xdist`` (where ``-n`` is unknown) and a plain
    ``python -m pytest tests/x.py`` both keep working; an explicit ``-n`` (``-n 0``: serial) wins, and
    ``--pdb`` stays serial. worksteal hands out contiguous runs of tests (module fixtures are made
    once per worker, mostly) and rebalances when one worker runs out. The workers themselves (which
    also call this hook) are left alone.
    """
    if (not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput")
            or os.environ.get("PYTEST_XDIST_WORKER") or config.getoption("usepdb", False)):
        return
    if config.option.numprocesses is None:
        config.option.numprocesses = "auto"
    if config.option.dist == "no":
        config.option.dist = "worksteal"


def pytest_configure(config):
    """Give each xdist worker its share of the cores for BLAS (unless the environment already says).

    The workers (and the ``streamdp`` processes tests start) inherit the environment. Two
    workers each running OpenBLAS on every core spin against each other: the svd contract
    tests took 11.5 s of CPU with OpenBLAS's default threads against 4.8 s with one, under
    load (streamdp's engine limits BLAS inside its tasks, not around a method's final solve).
    """
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # a run started in the background of a shell without job control inherits Ctrl-C ignored (and so do the
        # xdist workers and the streamdp processes the tests start): the interrupt tests need Python's default
        signal.signal(signal.SIGINT, signal.default_int_handler)
    workers = config.getoption("numprocesses", None) if config.pluginmanager.hasplugin("xdist") else None
    if isinstance(workers, int) and workers > 1 and not hasattr(config, "workerinput"):
        share = str(max(1, (os.cpu_count() or 1) // workers))
        for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(name, share)


def shared_file(*parts: str) -> Path:
    """A file under ../shared/data, or skip the test with the reason."""
    p = SHARED_DATA.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"real data not available: {p} is absent (../shared/data is not part of the repo)")
    return p


@pytest.fixture(scope="session")
def small_store(tmp_path_factory):
    """A generated store with a 20% test split: 3000 users, 400 items, rank 4, several blocks."""
    from streamdp.storage.generate import generate_store

    path = tmp_path_factory.mktemp("stores") / "small.zarr"
    return generate_store(str(path), n_users=3000, n_items=400, ratings_per_user=30, rank=4, seed=7,
                          test_fraction=0.2, block_users=700)

class Cli:
    """``streamdp ARGS`` in process (:meth:`run`) and the check that a result is one error line (:meth:`error`)."""

    @staticmethod
    def run(*args):
        """``(exit code, stdout, stderr, exception)`` of ``streamdp ARGS``."""
        from streamdp.cli import main

        r = CliRunner().invoke(main, [str(a) for a in args])
        return r.exit_code, r.stdout, r.stderr, r.exception

    @staticmethod
    def error(res, *needles):
        """Assert that ``res`` (from :meth:`run`) is exit code 2 with one ``streamdp: error:`` line holding
        every one of ``needles``, and no traceback."""
        code, _, err, exc = res
        assert code == 2, (code, err, exc)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("streamdp: error: ") and "Traceback" not in err, err
        for n in needles:
            assert n in lines[0], (n, lines[0])


@pytest.fixture(scope="session")
def cli() -> Cli:
    return Cli()
