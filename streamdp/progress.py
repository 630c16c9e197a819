"""Progress bars for long work: on stderr when it is a terminal, silent otherwise.

One module for every bar (ingest, generate, verify, the stream engine's passes and
the run driver's epochs). ``--json`` output and pipes stay clean: a bar is drawn
only when stderr is a TTY and progress was not turned off (:func:`quiet`, which the
CLI enters under ``--json``, or ``STREAMDP_PROGRESS=0`` in the environment). A
caller may force it either way with ``show=True/False`` (``generate_store(...,
show_progress=False)``).

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
    """Whether a progress bar would be drawn now (stderr is a TTY, not :func:`quiet`, no ``STREAMDP_PROGRESS=0``)."""
    if _quiet_depth > 0 or os.environ.get("STREAMDP_PROGRESS", "1") == "0":
        return False
    return _stderr_is_terminal()


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
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


def progress(total=None, *, desc: str = "", unit: str = "it", show: bool | None = None, initial: int = 0,
             unit_scale: bool = False, **kw):
    """A tqdm bar on stderr for ``total`` steps (``None``: unknown), a no-op one unless shown.

    ``show`` forces the bar on or off; by default it is shown when :func:`enabled`.
    ``unit_scale`` writes large counts as 1.2M (for ratings; blocks and epochs are
    counted exactly). Use it as a context manager (the bar is removed when the block ends).
    """
    from tqdm import tqdm

    if show is None:
        show = enabled()
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, disable=not show, file=sys.stderr,
                unit_scale=unit_scale, dynamic_ncols=True, leave=False, **kw)
