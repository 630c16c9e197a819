"""streamdp: user-level differentially private recommender models, streamed from disk."""

__version__ = "0.1.0"

from streamdp.storage.store import open_store  # noqa: E402

__all__ = ["open_store", "load_model", "__version__"]


def __getattr__(name):
    # load_model pulls in the privacy ledger (dp-accounting): imported on first use only
    if name == "load_model":
        from streamdp.model import load_model

        return load_model
    raise AttributeError(f"module 'streamdp' has no attribute {name!r}")
