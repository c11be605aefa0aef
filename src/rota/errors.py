"""rota's exceptions: one base class, :class:`RotaError`, with specific subclasses.

Bad input raises a subclass of both :class:`InvalidInput` and :class:`ValueError`, before
anything is written.
"""

from __future__ import annotations

from .redact import redact


class RotaError(Exception):
    """Base class of every error rota raises on purpose."""


class InvalidInput(RotaError, ValueError):
    """An argument was wrong; the message says which and why. Nothing was written.

    Attributes:
        argument: the argument the message is about, as the message begins by naming it
            (``group_id``, ``job type``, ``run_after``), or ``None`` when it begins
            otherwise. A caller that spells its arguments its own way (the CLI:
            ``--group``, ``TYPE``) rewords that beginning; the message itself speaks
            Python's terms.
    """

    def __init__(self, *args: object, argument: str | None = None) -> None:
        super().__init__(*args)
        self.argument = argument


class PayloadError(InvalidInput):
    """A job payload cannot be stored: not JSON-serializable, NaN/Infinity, a NUL
    character, a lone surrogate, or larger than the queue's ``max_payload_bytes``.
    Its ``argument`` is ``payload`` when the message begins with it (``payload['s']
    contains a NUL character``), unless given."""

    def __init__(self, *args: object, argument: str | None = None) -> None:
        if argument is None and args and str(args[0]).startswith("payload"):
            argument = "payload"
        super().__init__(*args, argument=argument)


class NaiveDatetimeError(InvalidInput):
    """A datetime without a time zone was passed where an instant is needed."""


class UnknownJobType(InvalidInput):
    """A job type that is empty, or not among the queue's declared ``types``."""


class UnknownPlan(InvalidInput):
    """A plan id that the queue's plans object does not contain."""


class UnknownSetting(InvalidInput, TypeError):
    """Keyword arguments that are not settings of :class:`rota.Queue` or
    :class:`rota.SyncQueue` (a misspelled ``fair_by``, say). The message names each, the
    setting closest to it, and every setting. Also a ``TypeError``, as Python's own
    error for an unexpected keyword argument is. Nothing was opened or written.

    Attributes:
        names: the unknown keywords, in alphabetical order (``argument`` is ``None``:
            the message begins with the class they were given to).
    """

    def __init__(self, message: str, names: list[str]) -> None:
        super().__init__(message)
        self.names = names


class UnknownGroup(InvalidInput):
    """A job names a group that the groups relation does not contain."""


class JobNotFound(InvalidInput):
    """No job has this id (it never existed, or was pruned).

    Attributes:
        job_id: the id asked for.
    """

    def __init__(self, job_id: int) -> None:
        super().__init__(f"no job {job_id}")
        self.job_id = job_id


class InvalidTransition(InvalidInput):
    """An admin action does not apply to the job as it is: retrying a job that has not
    failed, cancelling one that is not pending, or retrying while another open job holds
    its dedupe key. The message says what the status was; nothing was written.

    Attributes:
        job_id: the job's id.
        status: the job's status when the action was refused.
    """

    def __init__(self, message: str, *, job_id: int, status: str) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.status = status


class UnreadableJob(RotaError):
    """A stored job row that cannot be turned into a :class:`rota.Job`: a payload nested
    deeper than the JSON decoder goes or holding a number too long to convert, a time
    outside Python's years 1-9999 (rows written by older versions or by hand). The row
    is named, never skipped silently; the claim gives such a job up on its own
    (docs/design.md, "Bad data belongs to its job").

    Attributes:
        job_id: the row's id.
        problems: column name -> what went wrong reading it (one line each).
    """

    def __init__(self, job_id: int, problems: dict[str, str]) -> None:
        detail = "; ".join(f"{column}: {error}" for column, error in problems.items())
        super().__init__(f"job {job_id} cannot be read: {detail}")
        self.job_id = job_id
        self.problems = problems


class HandlerTimedOut(RotaError):
    """A sync handler (run in a thread, which cannot be cancelled) returned after its
    timeout: the job was overdue while the thread ran and fails once it has returned
    (docs/design.md, "Handler deadlines"). Its notes hold where the thread was when the
    timeout passed; its cause is what the thread raised, if anything."""


class AttemptLost(RotaError):
    """The type recorded for an attempt whose run stopped without settling it (killed,
    or cut off from the database): its lock went stale and the job was claimed again
    (docs/design.md, "Stale locks"). Never raised; named in the attempt's error."""


class ConfigError(RotaError):
    """The queue's settings are inconsistent (for example a stale window not longer
    than the platform timeout)."""


class MigrationError(RotaError):
    """The database schema could not be brought up to date."""


class DatabaseUnavailable(RotaError):
    """The database could not be reached, or its URL is malformed."""


class DatabaseRefused(DatabaseUnavailable):
    """The server, or a connection pooler in front of it, refused the connection with
    an error no retry mends: an unknown startup parameter, database or role, failed
    authentication (:func:`rota.db.refusal`). Raised at once, never after a wait."""


def first_line(exc: BaseException, *, with_type: bool = False) -> str:
    """An exception as one line, for logs and one-line error reports: the first line of
    its message (stripped, connection-string passwords replaced by ``***``), or its
    type's name when the message is empty.

    Args:
        exc: the exception.
        with_type: prefix the type's name (``KeyError: 'x'``).
    """
    lines = str(exc).strip().splitlines()
    if not lines:
        return type(exc).__name__
    line = redact(lines[0].strip())
    return f"{type(exc).__name__}: {line}" if with_type else line


class InvalidCharge(InvalidInput):
    """A job's cost cannot be charged: not a positive finite number (a bool, NaN,
    infinity, zero, a negative number, a string), or more than
    :data:`rota.cost.MAX_COST` units for one job (docs/design.md, "Cost"). Nothing was
    charged."""
