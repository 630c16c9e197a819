"""streamdp's benchmarks: runnable scripts (``python bench/<name>.py``) and one entry point, ``python -m bench``."""

import os


def shared_data(*parts: str) -> str:
    """A path under the real data sets (``../shared/data`` beside the repository, or ``$STREAMDP_SHARED_DATA``, as
    the tests read it); whether it exists is the caller's to check (a bench skips, and says so, when not)."""
    root = os.environ.get("STREAMDP_SHARED_DATA") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                                                  "..", "shared", "data")
    return os.path.normpath(os.path.join(root, *parts))
