"""Shared by the hostile-input tests: run ``streamdp`` in process and check a one-line error."""

from __future__ import annotations

import pytest
from click.testing import CliRunner


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
