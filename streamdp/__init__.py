"""streamdp: user-level differentially private recommender models, streamed from disk.

The Python API (docs/python-api.md): :func:`ingest` (files, DataFrames, Arrow tables,
scipy.sparse matrices), :func:`train`, :func:`tune`, :func:`evaluate`, :func:`generate`,
:func:`load_model` and :func:`open_store`; a model's ``recommend``, ``recommend_user``,
``recommend_all``, ``similar_items`` and ``summary`` (:class:`streamdp.serving.model.Model`).
"""

from streamdp._version import __version__
from streamdp.storage import writer as _writer
from streamdp.storage.store import open_store

__all__ = ["open_store", "load_model", "ingest", "train", "tune", "evaluate", "generate", "__version__"]

#: The API functions of :mod:`streamdp.workflows.api`, loaded on first use.
_API = ("ingest", "train", "tune", "evaluate", "generate")


def _ledger_keeper():
    """Replacing a store carries its budget ledger over: the privacy layer's part, handed down to the writer."""
    from streamdp.privacy.budget import StoreBudget, carried_over

    return _writer.LedgerKeeper(carried_over=carried_over, ledger=StoreBudget)


_writer.install_ledger_keeper(_ledger_keeper)


def __getattr__(name):
    # these pull in the privacy ledger (dp-accounting) and the methods: imported on first use only
    if name == "load_model":
        from streamdp.serving.model import load_model

        return load_model
    if name in _API:
        from streamdp.workflows import api

        return getattr(api, name)
    raise AttributeError(f"module 'streamdp' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
