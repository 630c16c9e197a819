"""Method options, declared once: the schema from which ``streamdp train``'s flags are generated.

Each method lists its own :class:`Option` objects in ``OPTIONS``. The CLI builds
one ``--flag`` per option name over all registered methods (:func:`cli_options`);
its help says which method reads it and what it means there, method by method
(``[sgd] ... ; [sgld] ...``), so one flag never silently means two things. A
method receives only the options the user gave; :meth:`Option.check` converts and
validates them at the edge, with a one-line error naming the flag.

This module imports nothing heavy, so ``streamdp --help`` stays fast: the train
command loads the methods (and their option lists) only when it is invoked or
asked for its help.

Examples
--------
>>> o = Option("epochs", int, "Passes over the data.", default=20, minimum=1)
>>> o.flag, o.check(3)
('--epochs', 3)
>>> o.check(0)
Traceback (most recent call last):
...
streamdp.errors.ParameterError: --epochs must be >= 1, got 0
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from streamdp.errors import ParameterError

__all__ = ["Option", "merge_options", "option_help"]


@dataclass(frozen=True)
class Option:
    """One method option.

    Parameters
    ----------
    name : str
        Python keyword (``step_users``); the flag is ``--step-users``.
    type : type or tuple of str
        ``int``, ``float``, ``str``, ``bool`` (an on/off flag pair ``--x/--no-x``), or a
        tuple of allowed strings (a choice).
    help : str
        What the option means for this method (one line).
    default : object
        The value used when the option is not given, for the help text; ``None``
        means "derived" and ``default_text`` says how.
    default_text : str
        How the default is derived, when it is not a constant.
    minimum, maximum : float, optional
        Inclusive bounds for numbers (``exclusive_minimum`` for ``> minimum``).
    metavar : str, optional
    """

    name: str
    type: Any
    help: str
    default: Any = None
    default_text: str = ""
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    metavar: str | None = None
    allow_inf: bool = False
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def is_choice(self) -> bool:
        return isinstance(self.type, tuple)

    def describe(self) -> str:
        """The help line with its default."""
        if self.default_text:
            return f"{self.help} (default: {self.default_text})"
        if self.default is not None:
            d = self.default
            if self.type is bool:
                d = "on" if d else "off"
            return f"{self.help} (default {d})"
        return self.help

    def check(self, value):
        """``value`` converted to the option's type and checked; ``ParameterError`` naming the flag otherwise."""
        if value is None:
            return None
        if self.is_choice:
            v = str(value)
            if v not in self.type:
                raise ParameterError(f"{self.flag}: expected one of {', '.join(self.type)}, got {value!r}")
            return v
        if self.type is bool:
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ParameterError(f"{self.flag}: expected on/off, got {value!r}")
            return bool(value)
        if self.type is str:
            return str(value)
        try:
            if self.type is int:
                f = float(value)
                if isinstance(value, bool) or not f.is_integer():
                    raise ValueError
                v = int(f)
            else:
                v = float(value)
        except (TypeError, ValueError, OverflowError):
            kind = "an integer" if self.type is int else "a number"
            raise ParameterError(f"{self.flag} must be {kind}, got {value!r}") from None
        if isinstance(v, float) and (math.isnan(v) or (math.isinf(v) and not self.allow_inf)):
            raise ParameterError(f"{self.flag} must be a finite number, got {value!r}")
        if self.minimum is not None:
            if self.exclusive_minimum and not v > self.minimum:
                raise ParameterError(f"{self.flag} must be > {self.minimum:g}, got {value}")
            if not self.exclusive_minimum and v < self.minimum:
                raise ParameterError(f"{self.flag} must be >= {self.minimum:g}, got {value}")
        if self.maximum is not None and v > self.maximum:
            raise ParameterError(f"{self.flag} must be <= {self.maximum:g}, got {value}")
        return v


def _kind(o: Option):
    return ("choice" if o.is_choice else o.type)


def merge_options(methods: dict) -> dict[str, dict]:
    """``name -> {"kind", "choices", "by_method": {method: Option}}`` over ``methods`` (name -> class).

    Raises ``ValueError`` when two methods declare the same name with different
    kinds (an int in one and a choice in another would make one flag mean two
    things to the parser); the registry tests call this on every registered method.

    >>> class A: OPTIONS = (Option("tau", int, "ratings kept per user", default=100),)
    >>> class B: OPTIONS = (Option("tau", int, "ratings kept per user, per epoch"),)
    >>> sorted(merge_options({"a": A, "b": B})["tau"]["by_method"])
    ['a', 'b']
    """
    out: dict[str, dict] = {}
    for mname in sorted(methods):
        for o in getattr(methods[mname], "OPTIONS", ()):
            if not isinstance(o, Option):
                raise ValueError(f"method {mname}: OPTIONS must hold Option objects, got {o!r}")
            slot = out.setdefault(o.name, {"kind": _kind(o), "choices": [], "by_method": {}})
            if slot["kind"] != _kind(o):
                raise ValueError(f"option {o.flag}: method {mname} declares it as {_kind(o)}, another as "
                                 f"{slot['kind']}")
            if o.is_choice:
                slot["choices"] += [c for c in o.type if c not in slot["choices"]]
            slot["by_method"][mname] = o
    return out


def option_help(by_method: dict) -> str:
    """One help text for a flag: each meaning once, prefixed by the methods that read it that way.

    >>> o1 = Option("eta", float, "learning rate", default=0.005)
    >>> option_help({"sgd": o1, "sgld": o1})
    '[sgd/sgld] learning rate (default 0.005)'
    """
    groups: dict[str, list[str]] = {}
    for m, o in by_method.items():
        groups.setdefault(o.describe(), []).append(m)
    return "; ".join(f"[{'/'.join(ms)}] {text}" for text, ms in groups.items())
