"""Method options, declared once: one frozen dataclass per method, from which the flags and help are generated.

A method declares its options as the fields of a :class:`MethodOptions` subclass
(``field = option("help", default=..., minimum=...)``); the field's annotation is
its type (``int``, ``float``, ``str``, ``bool``, or ``Literal["a", "b"]`` for a
choice) and its default is the value the method uses. ``Method.OPTIONS`` (the
:class:`Option` records) is derived from that class, so the help text shows the
very defaults the code reads and cannot drift. A field whose default depends on
the store or the privacy target is declared ``None`` with a ``default_text``
saying how it is derived; the method derives it when it plans. The CLI builds
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

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from streamdp.errors import ParameterError

__all__ = ["MethodOptions", "Option", "merge_options", "option", "option_help"]


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


_OPTION = "streamdp.option"


def option(help: str, *, default: Any = None, default_text: str = "", minimum: float | None = None,
           maximum: float | None = None, exclusive_minimum: bool = False, metavar: str | None = None,
           allow_inf: bool = False):
    """A field of a :class:`MethodOptions` class: its help, default and bounds (see :class:`Option`).

    The field's type is its annotation. ``default=None`` means "derived": the method
    computes it when it plans, and ``default_text`` says how.
    """
    spec = dict(help=help, default=default, default_text=default_text, minimum=minimum, maximum=maximum,
                exclusive_minimum=exclusive_minimum, metavar=metavar, allow_inf=allow_inf)
    return field(default=default, metadata={_OPTION: spec})


def _option_type(hint):
    """``int``/``float``/``str``/``bool`` or a tuple of choices, from a field annotation."""
    if typing.get_origin(hint) is Literal:
        return tuple(typing.get_args(hint))
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if args:  # X | None
        return _option_type(args[0])
    if hint in (int, float, str, bool):
        return hint
    raise TypeError(f"option type {hint!r}: use int, float, str, bool or Literal[...]")


@dataclass(frozen=True)
class MethodOptions:
    """Base of a method's options: a frozen dataclass whose fields are its flags.

    Build one with :meth:`build` from what the user gave (values converted and checked
    by the declared :class:`Option`, a one-line error naming the flag); fields not given
    keep their declared default. ``given`` names the fields the user set (some derived
    defaults depend on whether another option was given).

    >>> @dataclass(frozen=True)
    ... class Demo(MethodOptions):
    ...     epochs: int = option("passes over the data", default=20, minimum=1)
    ...     scheme: Literal["a", "b"] = option("a choice", default="a")
    >>> o = Demo.build({"epochs": "3"})
    >>> o.epochs, o.scheme, o.is_given("epochs"), o.is_given("scheme")
    (3, 'a', True, False)
    >>> [x.flag for x in Demo.declared()]
    ['--epochs', '--scheme']
    >>> Demo.build({"epochs": 0})
    Traceback (most recent call last):
    ...
    streamdp.errors.ParameterError: --epochs must be >= 1, got 0
    """

    given: frozenset = field(default=frozenset(), repr=False, compare=False)

    #: The method name, for the "not an option of --method X" error (set by the method class).
    method_name: ClassVar[str] = ""

    @classmethod
    def declared(cls) -> tuple:
        """The :class:`Option` records of the fields, in declaration order (the CLI's flags and help)."""
        cache = cls.__dict__.get("_declared")
        if cache is not None:
            return cache
        hints = typing.get_type_hints(cls, include_extras=False)
        out = []
        for f in dataclasses.fields(cls):
            spec = f.metadata.get(_OPTION)
            if spec is None:
                continue
            out.append(Option(f.name, _option_type(hints[f.name]), **spec))
        out = tuple(out)
        type.__setattr__(cls, "_declared", out)
        return out

    @classmethod
    def build(cls, given: dict, *, method: str = ""):
        """The options from what the user gave (``None`` values count as not given)."""
        declared = {o.name: o for o in cls.declared()}
        unknown = sorted(k for k, v in given.items() if k not in declared and v is not None)
        if unknown:
            opts = ", ".join("--" + u.replace("_", "-") for u in unknown)
            raise ParameterError(f"{opts}: not an option of --method {method or cls.method_name}")
        values = {k: declared[k].check(v) for k, v in given.items() if v is not None}
        return cls(**values, given=frozenset(values))

    def is_given(self, name: str) -> bool:
        """Whether the user set ``name`` (rather than its default)."""
        return name in self.given

    def user_values(self) -> dict:
        """``{name: value}`` of the options the user gave (to rebuild the same method with changes)."""
        return {k: getattr(self, k) for k in sorted(self.given)}
