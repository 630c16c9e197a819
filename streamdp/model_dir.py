"""What makes a directory a streamdp model: its ``model.json`` names the format; and which budget entry released it.

Read by :mod:`streamdp.serving.model` (writing and loading models) and by the store budget
(:mod:`streamdp.privacy.budget`, which settles a reservation by whether its model is
in place) without either importing the other.
"""

from __future__ import annotations

import json
import os


MODEL_FORMAT = "streamdp-model"
MODEL_FORMAT_VERSION = 1


def read_model_json(path, name: str = "model.json") -> dict | None:
    """``path/model.json`` (or another of the model's JSON files: ``privacy.json``) as a dict, or ``None`` (absent,
    unreadable, not an object)."""
    try:
        with open(os.path.join(path, name)) as f:
            info = json.load(f)
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def is_model_dir(path) -> bool:
    """Whether ``path`` is a streamdp model directory (its ``model.json`` names the format; any version)."""
    info = read_model_json(path)
    return info is not None and info.get("format") == MODEL_FORMAT


def model_budget_entry(path) -> str | None:
    """The id of the store-budget entry that released the model at ``path`` (``model.json``), if any."""
    info = read_model_json(path)
    entry = info.get("budget_entry") if info is not None and info.get("format") == MODEL_FORMAT else None
    return entry if isinstance(entry, str) else None
