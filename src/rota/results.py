"""Job results (docs/design.md, "Results"): a handler's return value stored on the job
when it completes, every failed attempt's error (message and traceback, bounded) kept
beside it, and reading or waiting for them (:func:`result`, :func:`wait`, bound as
``queue.result`` and ``queue.wait``).

A return value goes through the payload encoder and limits (:func:`rota.job.encode_payload`,
``max_payload_bytes``, :data:`rota.job.MAX_PAYLOAD_DEPTH`); one that cannot be stored
fails the job at completion with an error that says why (:class:`ResultError`), so the
job is never left done without it, nor lost.

Waiting listens on the channel ``rota_settled`` and registers the waiter in
``job_waiters``: the statements that settle a job for good (complete, complete_many,
fail when attempts are used up, the stuck-job sweep, cancel) notify it with
``SCHEMA:ID[,ID…]`` (``SCHEMA:*`` for "look again") when a job they settle has a
waiter, so completions nobody waits for pay nothing; the waiter reads the job again at
least every ``poll_every`` in case a notification is missed (a connection through a
pooler that drops LISTEN, a job given up by its deferral cap, which does not notify).
"""

from __future__ import annotations

import asyncio
import time
import traceback as tb
import uuid
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, cast

import psycopg
from psycopg.rows import dict_row

from . import statements as sql
from .checks import require_duration, require_row_id, storable_text
from .cost import counted_cost
from .errors import JobNotFound, PayloadError, RotaError
from .job import MAX_PAYLOAD_DEPTH, Job, JobStatus, encode_payload, printed_size
from .store import AnyConn, Statements, Store, configure_cursor


class ResultReader(Protocol):
    """What :func:`result` uses of a :class:`rota.Queue` (which binds it as its method:
    ``queue.result(id)``); a protocol, so that this module need not import the queue's,
    which imports this one."""

    @property
    def store(self) -> Store: ...
    def connection(self, conn: AnyConn | None = None
                   ) -> AbstractAsyncContextManager[AnyConn]: ...


class ResultsQueue(ResultReader, Protocol):
    """What :func:`wait` uses of a :class:`rota.Queue` besides: its schema and where a
    LISTEN connection goes."""

    @property
    def schema(self) -> str: ...
    async def listener(self) -> psycopg.AsyncConnection[Any] | None: ...

#: The channel settled jobs are announced on (the payload names the schema).
SETTLED_CHANNEL = "rota_settled"
#: How much of an attempt's error message is kept (characters).
MAX_ERROR_CHARS = 4000
#: How much of an attempt's traceback is kept (characters): its first
#: ``TRACEBACK_HEAD_CHARS`` and its end, where the exception was raised.
MAX_TRACEBACK_CHARS = 16000
TRACEBACK_HEAD_CHARS = 2000
#: How often :func:`wait` reads the job again when no notification came.
DEFAULT_POLL_EVERY = timedelta(seconds=1)

FINISHED: tuple[JobStatus, ...] = ("done", "failed")


class ResultError(PayloadError):
    """A handler's return value cannot be stored: not JSON as payloads are
    (:func:`rota.job.encode_payload`), nested deeper than
    :data:`rota.job.MAX_PAYLOAD_DEPTH`, or larger than the queue's
    ``max_payload_bytes``. The job fails with this error's text rather than completing
    without its value."""


class WaitTimeout(RotaError, TimeoutError):
    """:func:`wait` gave up: the job was not done or failed within the timeout.

    Attributes:
        job_id: the job waited for.
        status: its status when the wait gave up.
        timeout: the timeout given.
    """

    def __init__(self, job_id: int, status: str, timeout: timedelta) -> None:
        super().__init__(f"job {job_id} is still {status} after waiting "
                         f"{timeout.total_seconds():g} s")
        self.job_id = job_id
        self.status = status
        self.timeout = timeout


class EncodedResult(str):
    """A return value already checked and encoded (JSON text): the runner checks a
    value when its handler returns, so the batch that completes it cannot fail on it."""

    __slots__ = ()


@dataclass(frozen=True)
class AttemptError:
    """One failed attempt of a job, as kept in ``job_errors``.

    Attributes:
        attempt: the attempt's number (1 for the first; a job retried by hand counts
            from 1 again).
        error: ``"Type: message"``, at most :data:`MAX_ERROR_CHARS` characters.
        error_type: the exception's class as ``module.qualname``
            (``"builtins.ValueError"``), or ``None`` for an error given as text.
        traceback: the formatted traceback, at most :data:`MAX_TRACEBACK_CHARS`
            characters (its start and its end), or ``None`` (a timeout, a stuck job,
            an error given as text).
        run_id: the run (worker) that ran the attempt, or ``None``.
        started_at: when the attempt was claimed (aware UTC, queue clock), or ``None``.
        failed_at: when it failed (aware UTC, queue clock).
        worker: the process that ran it, ``host:pid``, while its run is kept (runs are
            pruned after ``runs_retention``), else ``None``.
    """

    attempt: int
    error: str
    error_type: str | None
    traceback: str | None
    run_id: uuid.UUID | None
    started_at: datetime | None
    failed_at: datetime
    worker: str | None = None


@dataclass(frozen=True)
class JobResult:
    """A job's outcome as :func:`result` reads it.

    Attributes:
        job: the job row (status, attempts, payload, times…).
        value: the handler's return value once the job is done (``None`` before, and
            for a handler that returned ``None``), as JSON reads it back.
        errors: every failed attempt's error, oldest first.
        started_at: when the attempt that settled the job was claimed (aware UTC,
            queue clock); for a running job, when it was claimed (never a heartbeat's
            time); ``None`` for a pending job.
        worker: the process holding the job or having completed it (``host:pid``,
            while its run is kept), else ``None``.
        group_active: whether the job's group is active (``False``: paused, so a
            pending job waits for it); ``None`` without a group.
    """

    job: Job
    value: Any
    errors: list[AttemptError]
    started_at: datetime | None
    worker: str | None = None
    group_active: bool | None = None

    @property
    def status(self) -> JobStatus:
        """The job's status: ``pending``, ``running``, ``done`` or ``failed``."""
        return self.job.status

    @property
    def finished(self) -> bool:
        """Whether the job is done or failed (it will not run again by itself)."""
        return self.job.status in FINISHED


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists and objects deeper than ``limit`` (iteratively, so
    no recursion limit is met on the way)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list | tuple):
            if d + 1 > limit:
                return True
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return False


def encode_result(value: Any, max_bytes: int) -> EncodedResult | None:
    """Check and encode a handler's return value for ``jobs.result``.

    Args:
        value: what the handler returned; ``None`` stores nothing.
        max_bytes: the queue's ``max_payload_bytes`` (UTF-8 bytes of the JSON text).

    Returns:
        The JSON text, or ``None`` for ``None``.

    Raises:
        ResultError: the value cannot be stored (the message says why, as for a
            payload, but naming the return value).
    """
    if value is None:
        return None
    if isinstance(value, EncodedResult):
        return value
    try:
        if _depth_exceeds(value, MAX_PAYLOAD_DEPTH):
            raise ResultError(f"the return value is nested deeper than {MAX_PAYLOAD_DEPTH} "
                              f"levels, more than can be read back")
        text = encode_payload(value)
    except ResultError:
        raise
    except PayloadError as exc:
        message = str(exc).removeprefix("payload")
        raise ResultError(f"the return value{message}") from None
    # One size rule for payloads and results: the JSON text as PostgreSQL's jsonb prints
    # it (docs/design.md, "Enqueue"), a number digit for digit.
    if (size := printed_size(value)) > max_bytes:
        raise ResultError(f"the return value is {size} bytes of JSON, larger than the "
                          f"maximum {max_bytes} (max_payload_bytes)")
    return EncodedResult(text)


def error_record(error: BaseException | str) -> tuple[str, str | None, str | None]:
    """An attempt's error as ``(message, class, traceback)``, storable and bounded: the
    message ``"Type: message"`` cut at :data:`MAX_ERROR_CHARS`, the exception's class as
    ``module.qualname``, the traceback (an exception's own) cut to its first
    :data:`TRACEBACK_HEAD_CHARS` and its last characters, :data:`MAX_TRACEBACK_CHARS`
    in all; class and traceback are ``None`` for an error given as text."""
    if isinstance(error, str):
        return storable_text(error, MAX_ERROR_CHARS), None, None
    message = storable_text(f"{type(error).__name__}: {error}", MAX_ERROR_CHARS)
    trace: str | None = None
    if error.__traceback__ is not None:
        # Bounded before it is scanned, and again after escaping lengthened it.
        text = _keep_ends("".join(tb.format_exception(error)), 2 * MAX_TRACEBACK_CHARS)
        trace = _keep_ends(storable_text(text), MAX_TRACEBACK_CHARS)
    kind = type(error)
    return (message, storable_text(f"{kind.__module__}.{kind.__qualname__}"), trace)


def _keep_ends(trace: str, limit: int) -> str:
    """A traceback cut to its first :data:`TRACEBACK_HEAD_CHARS` and its last characters,
    ``limit`` in all, with a line saying how many were left out between them."""
    if len(trace) <= limit:
        return trace
    cut = len(trace) - limit
    marker = f"\n... ({cut} characters left out) ...\n"
    tail = limit - TRACEBACK_HEAD_CHARS - len(marker)
    return trace[:TRACEBACK_HEAD_CHARS] + marker + trace[-tail:]


def result_from_row(row: dict[str, Any]) -> JobResult:
    """A :class:`JobResult` from a row of ``get_result.sql``."""
    errors = [AttemptError(
        attempt=e["attempt"], error=e["error"], error_type=e["error_type"],
        traceback=e["traceback"],
        run_id=uuid.UUID(e["run_id"]) if e["run_id"] else None,
        started_at=_instant(e["started_at"]),
        failed_at=cast(datetime, _instant(e["failed_at"])), worker=e.get("worker"))
        for e in (row["errors"] or [])]
    # The claim sets started_at; a job claimed before it did (or pending) has locked_at.
    started = (row["started_at"] or row["locked_at"]) if row["status"] != "pending" else None
    return JobResult(job=Job.from_row(row, lenient=True), value=row["result"],
                     errors=errors, started_at=started, worker=row.get("run_worker"),
                     group_active=row.get("group_active"))


def _instant(text: str | None) -> datetime | None:
    # json_agg prints timestamptz in ISO 8601 with the session's offset.
    return None if text is None else datetime.fromisoformat(text).astimezone(UTC)


def as_dict(found: JobResult) -> dict[str, Any]:
    """A :class:`JobResult` as plain data (``rota jobs show ID --json``, the dashboard):
    the job's fields, ``cost`` (what it counts in its group's and owner's served counts:
    :func:`rota.cost.counted_cost`, a ``Decimal``, ``None`` while pending or once
    failed), ``result`` (its return value), ``started_at`` and ``errors`` (a list of
    each attempt's fields, oldest first). Times stay datetimes, ids UUIDs and the cost a
    ``Decimal``, for the caller's JSON encoder."""
    j = found.job
    return {
        "id": j.id, "type": j.type, "group_id": j.group_id, "status": j.status,
        "payload": j.payload, "dedupe_key": j.dedupe_key, "attempts": j.attempts,
        "max_attempts": j.max_attempts, "deferrals": j.deferrals,
        "cost": counted_cost(j.status, j.cost),
        "run_after": j.run_after, "created_at": j.created_at,
        "started_at": found.started_at, "finished_at": j.finished_at,
        "run_id": j.run_id, "last_error": j.last_error,
        "give_up_pending": j.give_up_pending, "result": found.value,
        "errors": [{"attempt": e.attempt, "error": e.error, "error_type": e.error_type,
                    "traceback": e.traceback,
                    "run_id": e.run_id, "started_at": e.started_at,
                    "failed_at": e.failed_at} for e in found.errors],
    }


def settled_ids(payload: str, schema: str) -> set[int] | None:
    """The job ids a ``rota_settled`` notification names for ``schema``: a set, ``None``
    for "any" (``SCHEMA:*``), or an empty set for another schema's."""
    name, _, ids = payload.partition(":")
    if name != schema:
        return set()
    if ids == "*":
        return None
    return {int(i) for i in ids.split(",") if i.isdigit()}


async def result(queue: ResultReader, job_id: int, *, conn: AnyConn | None = None) -> JobResult:
    """A job's status, return value and every attempt's error (docs/design.md,
    "Results").

    Args:
        job_id: the job.
        conn: the caller's connection.

    Returns:
        The :class:`JobResult`.

    Raises:
        JobNotFound: no job has this id (never existed, or pruned with its result).
        InvalidInput: ``job_id`` is not a positive int.
    """
    require_row_id(job_id)
    async with queue.connection(conn) as c:
        row = await sql.get_result(queue.store, id=job_id, conn=c)
    if row is None:
        raise JobNotFound(job_id)
    return result_from_row(row)


# The deadline is a duration the caller names (the rule "durations are timedelta"), not
# an asyncio.timeout around the call: it must end in WaitTimeout with the job's status.
async def wait(queue: ResultsQueue, job_id: int, *, timeout: timedelta,  # noqa: ASYNC109
               poll_every: timedelta = DEFAULT_POLL_EVERY) -> JobResult:
    """Wait until a job is done or failed and return its :class:`JobResult`.

    Listens on ``rota_settled`` on a connection of its own (opened like the worker's
    listening connection) and reads the job when a notification names it, and at least
    every ``poll_every`` (polling alone when listening is refused, or when the queue
    goes through a connection pooler and has no ``listen_url``: docs/operations.md,
    "Poolers and failover").

    Args:
        job_id: the job.
        timeout: how long to wait at most, a positive ``timedelta``.
        poll_every: the longest time between two reads of the job.

    Returns:
        The job's result, ``status`` ``done`` or ``failed``.

    Raises:
        WaitTimeout: the job was still pending or running after ``timeout``.
        JobNotFound: no job has this id.
        InvalidInput: ``job_id`` is not a positive int, or ``timeout`` or
            ``poll_every`` is not a positive ``timedelta``.
    """
    require_row_id(job_id)
    require_duration(timeout, "timeout")
    require_duration(poll_every, "poll_every")
    deadline = time.monotonic() + timeout.total_seconds()
    # Listening, then registered as a waiter, then reading the job: a settlement that
    # commits after the read finds the waiter and notifies; one whose statement began
    # before the registration committed is found by the next poll.
    listener = await _listen(queue)
    waiter = uuid.uuid4()
    try:
        if listener is not None:
            async with queue.connection() as c:
                await sql.waiter_add(queue.store, id=job_id, waiter=waiter, conn=c)
        while True:
            found = await result(queue, job_id)
            if found.finished:
                return found
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout(job_id, found.status, timeout)
            await _next_notice(listener, queue.schema, job_id,
                               min(left, poll_every.total_seconds()))
    finally:
        if listener is not None:
            await listener.close()
            async with queue.connection() as c:
                await sql.waiter_remove(queue.store, id=job_id, waiter=waiter, conn=c)


async def _listen(queue: ResultsQueue) -> psycopg.AsyncConnection[Any] | None:
    """A connection LISTENing on ``rota_settled``, or ``None`` (then polling alone)."""
    try:
        # None behind a pooler without listen_url: notifications do not pass it.
        conn = await queue.listener()
    except (psycopg.Error, OSError, RotaError):
        return None
    if conn is None:
        return None
    try:
        await conn.execute(f"LISTEN {SETTLED_CHANNEL}")
    except psycopg.Error:
        await conn.close()
        return None
    return conn


async def _next_notice(listener: psycopg.AsyncConnection[Any] | None, schema: str,
                       job_id: int, seconds: float) -> None:
    """Return when a notification names ``job_id`` (or any job of ``schema``), or after
    ``seconds``."""
    if listener is None:
        await asyncio.sleep(seconds)
        return
    end = time.monotonic() + seconds
    try:
        while (left := end - time.monotonic()) > 0:
            async for note in listener.notifies(timeout=left):
                ids = settled_ids(note.payload, schema)
                if ids is None or job_id in ids:
                    return
    except psycopg.Error:
        await asyncio.sleep(max(end - time.monotonic(), 0))


def sync_result(queue_statements: Statements, conn: psycopg.Connection[Any],
                job_id: int) -> JobResult:
    """:func:`result` on a sync connection (see :meth:`rota.SyncQueue.result`)."""
    require_row_id(job_id)
    cur = conn.cursor(row_factory=dict_row)
    configure_cursor(cur)
    row = cur.execute(queue_statements.sql("get_result"), {"id": job_id}).fetchone()
    if row is None:
        raise JobNotFound(job_id)
    return result_from_row(row)


def sync_wait(queue_statements: Statements, conn: psycopg.Connection[Any], job_id: int, *,
              timeout: timedelta, poll_every: timedelta = DEFAULT_POLL_EVERY) -> JobResult:
    """:func:`wait` on a sync connection (see :meth:`rota.SyncQueue.wait`): it listens
    when ``conn`` is in autocommit mode (a transaction would hold notifications back
    until it ends) and polls otherwise, reading inside the caller's transaction (at
    read committed each read sees what committed before it; the transaction is never
    ended here)."""
    require_row_id(job_id)
    require_duration(timeout, "timeout")
    require_duration(poll_every, "poll_every")
    deadline = time.monotonic() + timeout.total_seconds()
    listening = conn.autocommit
    waiter = {"id": job_id, "waiter": uuid.uuid4()}
    schema = queue_statements.schema
    try:
        if listening:  # as :func:`wait` does: listening, registered, then reading
            conn.execute(f"LISTEN {SETTLED_CHANNEL}")
            conn.execute(queue_statements.sql("waiter_add"), waiter)
        while True:
            # Inside the caller's transaction (read committed), each read sees what
            # committed before it; the caller's transaction is never ended here.
            found = sync_result(queue_statements, conn, job_id)
            if found.finished:
                return found
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout(job_id, found.status, timeout)
            step = min(left, poll_every.total_seconds())
            if not listening:
                time.sleep(step)
                continue
            end = time.monotonic() + step
            while (rest := end - time.monotonic()) > 0:
                hit = False
                for note in conn.notifies(timeout=rest, stop_after=1):
                    ids = settled_ids(note.payload, schema)
                    hit = ids is None or job_id in ids
                if hit:
                    break
    finally:
        if listening and not conn.closed:
            conn.execute(f"UNLISTEN {SETTLED_CHANNEL}")
            conn.execute(queue_statements.sql("waiter_remove"), waiter)


__all__ = ["AttemptError", "EncodedResult", "JobResult", "ResultError", "WaitTimeout",
           "as_dict", "encode_result", "error_record", "result", "wait"]
