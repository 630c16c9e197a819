"""Progress bars for long passes: on stderr when it is a terminal, silent otherwise.

``--json`` output and pipes stay clean: a bar is drawn only when stderr is a TTY
and progress was not turned off (:func:`quiet`, which the CLI uses for ``--json``,
or ``STREAMDP_PROGRESS=0`` in the environment).

>>> with progress(total=3, desc="demo") as bar:
...     bar.update(3)
"""

from __future__ import annotations

import contextlib
import os
import sys

__all__ = ["progress", "quiet", "enabled"]

_quiet_depth = 0


def enabled() -> bool:
    """Whether a progress bar would be drawn now."""
    if _quiet_depth > 0 or os.environ.get("STREAMDP_PROGRESS", "1") == "0":
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


@contextlib.contextmanager
def quiet():
    """No progress bars inside the block (e.g. under ``--json``)."""
    global _quiet_depth
    _quiet_depth += 1
    try:
        yield
    finally:
        _quiet_depth -= 1


class _Silent:
    def update(self, n=1):
        pass

    def set_postfix_str(self, s, refresh=True):
        pass

    def close(self):
        pass


@contextlib.contextmanager
def progress(*, total: int, desc: str, unit: str = "block", initial: int = 0):
    """A tqdm bar on stderr (or a silent stand-in) for ``total`` steps."""
    if not enabled():
        yield _Silent()
        return
    from tqdm import tqdm

    bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, file=sys.stderr, leave=False,
               dynamic_ncols=True)
    try:
        yield bar
    finally:
        bar.close()
