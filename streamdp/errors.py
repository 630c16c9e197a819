"""Exceptions that the CLI turns into one-line messages and exit codes.

Library code raises these for problems caused by the user's input (files,
parameters, stores); anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class StreamdpError(Exception):
    """Base class of errors that are the user's to fix (exit code 2)."""

    exit_code = 2


class InputError(StreamdpError):
    """Malformed input file, bad rating, wrong format, empty input."""


class StoreError(StreamdpError):
    """A rating store that is missing, corrupt, or of another format version."""


class ParameterError(StreamdpError):
    """An impossible or inconsistent parameter (e.g. epsilon <= 0)."""


class BudgetExceededError(StreamdpError):
    """A release would take a store's privacy spend past its budget (exit code 3)."""

    exit_code = 3


class NotImplementedMethodError(StreamdpError):
    """A method that exists in the registry but is not finished."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with a message saying what was and was not released (exit code 130, like a shell).

    A ``KeyboardInterrupt`` still (so ``except Exception`` never swallows it); the
    CLI prints its message instead of the generic one.
    """

    exit_code = 130
