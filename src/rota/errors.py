"""rota's exceptions: one base class, :class:`RotaError`, with specific subclasses.

Bad input raises a subclass of both :class:`InvalidInput` and :class:`ValueError`, before
anything is written.
"""

from __future__ import annotations


class RotaError(Exception):
    """Base class of every error rota raises on purpose."""


class InvalidInput(RotaError, ValueError):
    """An argument was wrong; the message says which and why. Nothing was written."""


class PayloadError(InvalidInput):
    """A job payload cannot be stored: not JSON-serializable, NaN/Infinity, a NUL
    character, a lone surrogate, or larger than the queue's ``max_payload_bytes``."""


class NaiveDatetimeError(InvalidInput):
    """A datetime without a time zone was passed where an instant is needed."""


class UnknownJobType(InvalidInput):
    """A job type that is empty, or not among the queue's declared ``types``."""


class UnknownPlan(InvalidInput):
    """A plan id that the queue's plans object does not contain."""


class UnknownGroup(InvalidInput):
    """A job names a group that the groups relation does not contain."""


class ConfigError(RotaError):
    """The queue's settings are inconsistent (for example a stale window not longer
    than the platform timeout)."""


class MigrationError(RotaError):
    """The database schema could not be brought up to date."""


class DatabaseUnavailable(RotaError):
    """The database could not be reached, or its URL is malformed."""


def first_line(exc: BaseException) -> str:
    """An exception as one line for logs and the CLI: its type and the first line of
    its message (``"OperationalError: connection refused"``)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
