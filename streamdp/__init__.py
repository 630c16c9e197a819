"""streamdp: user-level differentially private recommender models, streamed from disk.

The Python API (docs/python-api.md): :func:`ingest` (files, DataFrames, Arrow tables,
scipy.sparse matrices), :func:`train`, :func:`tune`, :func:`evaluate`, :func:`generate`,
:func:`load_model` and :func:`open_store`; a model's ``recommend``, ``recommend_user``,
``recommend_all``, ``similar_items`` and ``summary`` (:class:`streamdp.model.Model`).
"""

import sys
import types

from streamdp._version import __version__
from streamdp.storage import writer as _writer
from streamdp.storage.store import open_store

__all__ = ["open_store", "load_model", "ingest", "train", "tune", "evaluate", "generate", "__version__"]

#: The API functions of :mod:`streamdp.api`, loaded on first use.
_API = ("ingest", "train", "tune", "evaluate", "generate")


def _ledger_keeper():
    """Replacing a store carries its budget ledger over: the privacy layer's part, handed down to the writer."""
    from streamdp.privacy.budget import StoreBudget, carried_over

    return _writer.LedgerKeeper(carried_over=carried_over, ledger=StoreBudget)


_writer.install_ledger_keeper(_ledger_keeper)


def __getattr__(name):
    # these pull in the privacy ledger (dp-accounting) and the methods: imported on first use only
    if name == "load_model":
        from streamdp.model import load_model

        return load_model
    if name in _API:
        from streamdp import api

        return getattr(api, name)
    raise AttributeError(f"module 'streamdp' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """The package module: ``streamdp.tune`` and ``streamdp.evaluate`` stay the API functions.

    ``streamdp/tune.py`` and ``streamdp/evaluate.py`` are modules of the same names, and
    the import system sets a submodule, once loaded, as an attribute of its package,
    which would turn ``streamdp.evaluate(...)`` into "module is not callable" depending
    on what was imported before. The submodules stay importable by name
    (``from streamdp.evaluate import evaluate_model``, ``sys.modules``).
    """

    def __setattr__(self, name, value):
        if name in _API and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
