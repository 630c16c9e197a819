"""The Zarr rating store: schema, reader, writer, ingest, generate."""

from streamdp.storage.store import Block, RatingStore, StoreInfo, open_store

__all__ = ["Block", "RatingStore", "StoreInfo", "open_store"]
