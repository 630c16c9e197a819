"""streamdp's benchmarks: runnable scripts (``python bench/<name>.py``) and one entry point, ``python -m bench``."""

import os


def shared_data(*parts: str) -> str:
    """A path under the real data sets (``../shared/data`` beside the repository, or ``$STREAMDP_SHARED_DATA``, as
    the tests read it); whether it exists is the caller's to check (a bench skips, and says so, when not)."""
    root = os.environ.get("STREAMDP_SHARED_DATA") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                                                  "..", "shared", "data")
    return os.path.normpath(os.path.join(root, *parts))


def declared_items(ratings: str, out_dir: str) -> str | None:
    """The item list a benchmark or test on a real set declares (``ingest --items``), as its owner would.

    The peers it is held against (scikit-surprise, ``implicit``, the exact chart) see every item, so the
    comparison declares the catalogue rather than selecting it privately: MovieLens' ``u.item`` where it sits
    beside the ratings, otherwise every item id in the file's second column (written to ``out_dir``);
    ``None`` when the file's second column is not integer ids: its ingest then says what is wrong with it.
    """
    beside = os.path.join(os.path.dirname(ratings), "u.item")
    if os.path.exists(beside):
        return beside
    import numpy as np

    try:
        ids = np.unique(np.loadtxt(ratings, usecols=1, dtype=np.int64, ndmin=1))
    except ValueError:
        return None
    out = os.path.join(out_dir, os.path.basename(os.path.dirname(ratings)) + ".items")
    np.savetxt(out, ids, fmt="%d")
    return out
