"""streamdp: user-level differentially private recommender models, streamed from disk."""

from streamdp._version import __version__
from streamdp.storage.store import open_store

__all__ = ["open_store", "load_model", "train", "generate", "__version__"]


def __getattr__(name):
    # these pull in the privacy ledger (dp-accounting) and the methods: imported on first use only
    if name == "load_model":
        from streamdp.model import load_model

        return load_model
    if name in ("train", "generate"):
        from streamdp import api

        return getattr(api, name)
    raise AttributeError(f"module 'streamdp' has no attribute {name!r}")
