"""Progress bars: shown on a terminal, silent otherwise (pipes, CI, tests)."""

from __future__ import annotations

import sys

from tqdm.auto import tqdm


def progress(total=None, *, desc: str = "", unit: str = "it", enabled: bool | None = None, **kw):
    """A tqdm bar on stderr, disabled unless stderr is a TTY (or ``enabled`` says so)."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, file=sys.stderr,
                unit_scale=True, dynamic_ncols=True, leave=False, **kw)
