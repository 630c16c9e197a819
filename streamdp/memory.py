"""Memory budget: parsing ``--memory-limit`` and measuring what a process uses."""

from __future__ import annotations

import re

import psutil

from streamdp.errors import ParameterError

_UNITS = {"": 1, "B": 1, "K": 1e3, "KB": 1e3, "M": 1e6, "MB": 1e6, "G": 1e9, "GB": 1e9, "T": 1e12, "TB": 1e12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}

#: Fraction of the machine's available memory used when no ``--memory-limit`` is given.
DEFAULT_FRACTION = 0.5


def parse_size(text: str | int | float, *, name: str = "--memory-limit") -> int:
    """Parse ``"512MB"``, ``"2GiB"``, ``"1.5G"`` or a number of bytes.

    >>> parse_size("256MB")
    256000000
    >>> parse_size("1GiB")
    1073741824
    """
    if isinstance(text, (int, float)):
        value = int(text)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
        if not m or m.group(2).upper() not in _UNITS:
            raise ParameterError(f"{name}: cannot parse size {text!r} (use e.g. 512MB, 2GB, 1GiB)")
        value = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if value <= 0:
        raise ParameterError(f"{name}: must be positive, got {text!r}")
    return value


def default_memory_limit() -> int:
    """A safe share of the memory available now."""
    return int(psutil.virtual_memory().available * DEFAULT_FRACTION)


def resolve_memory_limit(text: str | None) -> int:
    """``--memory-limit`` value in bytes, or the default when ``None``."""
    return default_memory_limit() if text in (None, "") else parse_size(text)


def current_rss() -> int:
    """Resident set size of this process in bytes."""
    return psutil.Process().memory_info().rss


def format_size(n: float) -> str:
    """``format_size(2.5e9) == '2.5 GB'``

    >>> format_size(2.5e9)
    '2.5 GB'
    """
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n}"
