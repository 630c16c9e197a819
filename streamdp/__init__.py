"""streamdp: user-level differentially private recommender models, streamed from disk."""

__version__ = "0.1.0"

from streamdp.storage.store import open_store  # noqa: E402

__all__ = ["open_store", "__version__"]
