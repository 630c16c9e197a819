"""Strict JSON out: non-finite floats as strings, and files replaced atomically (the ledgers, owner files, results)."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path


def encode_json(obj):
    """Replace non-finite floats by the strings ``"inf"``, ``"-inf"``, ``"nan"`` (strict JSON)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: encode_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [encode_json(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "shape", None) == ():
        return encode_json(obj.item())
    return obj


def json_default(o):
    """``json.dumps``'s ``default`` of every ``--json`` output: NumPy scalars and arrays as Python numbers and lists."""
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def as_printed(obj):
    """``obj`` as ``--json`` prints it, read back: plain Python numbers, lists and dicts (NumPy scalars converted).

    >>> import numpy as np
    >>> as_printed({"rmse": np.float64(0.5), "n": np.int64(3), "v": np.arange(2)})
    {'rmse': 0.5, 'n': 3, 'v': [0, 1]}
    """
    return json.loads(json.dumps(obj, default=json_default))


def atomic_write_json(path: str | os.PathLike, obj, *, dumps=None) -> None:
    """Write ``obj`` as JSON to ``path`` via a temporary file in the same directory and ``os.replace``.

    ``dumps``: makes the text of ``obj`` (default: strict JSON indented by 2)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            if dumps is None:
                json.dump(encode_json(obj), fh, indent=2, allow_nan=False)
            else:
                fh.write(dumps(obj))
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError) and exc.filename is None:  # a failed write names no file: name it (full disk)
            exc.filename = str(path)
        raise
