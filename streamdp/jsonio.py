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
