"""Training methods: one module per method and a name registry, the ``--method`` names of ``streamdp train``.

Each method is a small class (see :class:`streamdp.methods.base.Method`) registered
under its ``--method`` name with :func:`register`. Method modules import only the
shared parts (``base``, ``options`` and ``_*.py``), never each other. Training one
(plan, budget, fit, ledger, save) is :func:`streamdp.workflows.training.train`.
"""

from __future__ import annotations

import importlib
import pkgutil

from streamdp.errors import ParameterError
from streamdp.methods.base import Fitted, Method, Plan

__all__ = ["METHODS", "register", "get_method", "load_builtin", "method_modules", "Method", "Fitted", "Plan"]

#: ``--method`` name -> method class.
METHODS: dict[str, type[Method]] = {}


def register(cls: type[Method]) -> type[Method]:
    """Class decorator adding ``cls`` to :data:`METHODS` under ``cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    if cls.name in METHODS and METHODS[cls.name] is not cls:
        raise ValueError(f"method name {cls.name!r} is already registered")
    METHODS[cls.name] = cls
    return cls


def get_method(name: str) -> type[Method]:
    """The class registered as ``name`` (``ParameterError`` listing the choices otherwise)."""
    load_builtin()
    try:
        return METHODS[name]
    except KeyError:
        raise ParameterError(f"--method: unknown method {name!r} (choose from {', '.join(sorted(METHODS))})") \
            from None


def method_modules() -> list[str]:
    """The method modules of this package: every ``streamdp/methods/<name>.py`` but the shared parts
    (``_*.py``, ``base``, ``options``). A new method is a new module here; nothing else lists it."""
    return sorted(f"{__name__}.{m.name}" for m in pkgutil.iter_modules(__path__)
                  if not m.ispkg and not m.name.startswith("_") and m.name not in ("base", "options"))


def load_builtin() -> dict[str, type[Method]]:
    """Import the method modules (which registers their classes) and return :data:`METHODS`."""
    for mod in method_modules():
        importlib.import_module(mod)
    return METHODS



