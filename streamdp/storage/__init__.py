"""The Zarr rating store: schema, reader, writer, ingest, generate."""

from streamdp.storage.store import Block, RatingStore, StoreInfo, open_store
from streamdp.storage import segments as _segments  # noqa: F401,E402 - installs the reader of segmented stores

__all__ = ["Block", "RatingStore", "StoreInfo", "open_store"]
