"""Enqueue's Python half (docs/design.md, "Enqueue"): the checks only Python can make
(a payload JSON cannot hold, a naive datetime, a value of the wrong Python type or with
a NUL character), the statement parameters with the queue's settings, and reading back
what the database's ``enqueue_jobs`` answered; the rules themselves (lengths, limits,
due-time range, declared types, groups, defaults) are the database's, which SQL
callers go through too.

:func:`enqueue` and :func:`enqueue_many` run the statements for :class:`rota.Queue`;
:class:`rota.SyncQueue` runs them on a sync connection with the same parameters. They
take what they need (the store, the settings, the tracer, a connection getter), not
the queue.
"""

from __future__ import annotations

import functools
import re
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg.pq import ExecStatus
from psycopg.rows import RowMaker
from psycopg.types.json import Jsonb

from . import statements as sql
from . import tracing
from .checks import require_aware, sendable_int, sendable_text
from .errors import InvalidInput, PayloadError, UnknownGroup, UnknownJobType
from .job import Job, encode_payload
from .settings import QueueSettings
from .store import AnyConn, Store

#: Opens the queue's pool if it is not open yet (:meth:`rota.Queue.open`).
Ready = Callable[[], Awaitable[None]]

TUPLES_OK = ExecStatus.TUPLES_OK

_ITEM_KEYS = frozenset({"type", "payload", "group_id", "dedupe_key", "run_after",
                        "max_attempts"})


def enqueue_settings(settings: QueueSettings) -> dict[str, Any]:
    """The settings enqueue applies, as the ``s_*`` parameters of the database's
    ``enqueue_jobs`` (and of ``sql/publish_settings.sql``, which writes them for the
    SQL entry points): declared types (sorted), default and per-type max_attempts,
    max_payload_bytes, the groups relation (``None``: rota's own) and the clock
    offset. Read at each call: a pipeline's queue
    (:meth:`QueueSettings.with_max_attempts_by_type`) adds its stages' max_attempts."""
    return {
        "s_types": settings.sorted_types,
        "s_max_attempts": settings.max_attempts,
        "s_max_attempts_by_type": Jsonb(dict(settings.max_attempts_by_type)),
        "s_max_payload_bytes": settings.max_payload_bytes,
        "s_groups": settings.groups_sql,
        "offset": settings.clock_offset,
    }


def enqueue_params(
    settings: QueueSettings,
    type: str,
    payload: Any,
    *,
    group_id: str | uuid.UUID | None = None,
    dedupe_key: str | None = None,
    run_after: datetime | None = None,
    max_attempts: int | None = None,
) -> dict[str, Any]:
    """One job's statement parameters, with the queue's settings. Its parameters
    are :meth:`rota.Queue.enqueue`'s but ``conn``; :meth:`rota.SyncQueue.enqueue`
    takes them after its ``conn``, from here.

    Only what Python alone can see is checked here (a payload JSON cannot hold, a
    naive datetime, a value of the wrong Python type or with a NUL character); the
    rules themselves (lengths, limits, due-time range, declared types, groups,
    defaults) are the database's (``enqueue_jobs`` and its ``enqueue_rule``), which
    SQL callers go through too (docs/design.md, "Enqueue").

    Raises:
        InvalidInput and subclasses: naming the argument; nothing was sent.
    """
    return {
        "type": sendable_text(type, "job type"),
        "payload": encode_payload(payload),
        "group_id": sendable_text(group_id, "group_id", allow_none=True),
        "dedupe_key": sendable_text(dedupe_key, "dedupe_key", allow_none=True),
        "run_after": None if run_after is None else require_aware(run_after,
                                                                  "run_after"),
        "max_attempts": (None if max_attempts is None
                         else sendable_int(max_attempts, "max_attempts")),
        **enqueue_settings(settings),
    }


def enqueue_many_params(settings: QueueSettings,
                    items: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """A batch's statement parameters: parallel arrays, one entry per job, checked as
    :func:`enqueue_params` checks one job, and the queue's settings.

    Raises:
        InvalidInput and subclasses: naming the first bad item (``item 3: ...``), or
            ``items`` that is not an iterable of mappings (a string, a mapping).
    """
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
        raise InvalidInput(f"items must be an iterable of mappings (one per job), "
                           f"got {type(items).__name__}")
    types: list[str | None] = []
    payloads: list[str] = []
    group_ids: list[str | None] = []
    dedupe_keys: list[str | None] = []
    run_afters: list[datetime | None] = []
    max_attempts: list[int | None] = []
    allowed = _ITEM_KEYS
    # The types and group ids found sendable so far: a batch repeats a few of them, and
    # a text's check depends on its characters alone.
    sendable: set[str] = set()
    for i, item in enumerate(items):
        if type(item) is not dict and not isinstance(item, Mapping):
            raise InvalidInput(f"item {i}: expected a mapping, got {type(item).__name__}")
        if not allowed.issuperset(item) or "type" not in item or "payload" not in item:
            extra = set(item) - allowed
            raise InvalidInput(
                f"item {i}: needs 'type' and 'payload', may have "
                f"'group_id', 'dedupe_key', 'run_after', 'max_attempts'; "
                f"unexpected {sorted(extra)}" if extra else
                f"item {i}: needs 'type' and 'payload'"
            )
        try:
            t = item["type"]
            if type(t) is not str or t not in sendable:
                t = sendable_text(t, "job type")
                assert t is not None  # None is refused
                sendable.add(t)
            g = item.get("group_id")
            if g is not None and (type(g) is not str or g not in sendable):
                g = sendable_text(g, "group_id")
                assert g is not None
                sendable.add(g)
            payload = encode_payload(item["payload"])
            key = item.get("dedupe_key")
            if key is not None:
                key = sendable_text(key, "dedupe_key")
            due = item.get("run_after")
            if due is not None:
                due = require_aware(due, "run_after")
            attempts = item.get("max_attempts")
            if attempts is not None:
                attempts = sendable_int(attempts, "max_attempts")
        except InvalidInput as exc:
            raise type(exc)(f"item {i}: {exc}") from None
        types.append(t)
        payloads.append(payload)
        group_ids.append(g)
        dedupe_keys.append(key)
        run_afters.append(due)
        max_attempts.append(attempts)
    return {
        "types": types,
        "payloads": payloads,
        "group_ids": group_ids,
        "dedupe_keys": dedupe_keys,
        "run_afters": run_afters,
        "max_attempts": max_attempts,
        **enqueue_settings(settings),
    }


#: What a row of the ``enqueue`` statement says: the problem ``enqueue_jobs`` found
#: (nothing written), or the job written.
Enqueued = tuple[Mapping[str, Any], None] | tuple[None, Job]


def enqueued_row(cursor: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]
                 ) -> RowMaker[Enqueued]:
    """The psycopg row factory of the ``enqueue`` statement, for the async and the sync
    path alike: each row as ``(problem, None)`` or ``(None, job)``, the job made
    straight from the tuple (:meth:`Job.row_maker`, lenient: it is written, so never an
    error after that) instead of through a dict of its columns. The maker is built once
    per set of column names (a schema), not per statement. Without rows to read (not a
    query), the maker raises as psycopg's own row factories' do.
    """
    res = cursor.pgresult
    if res is None or res.status != TUPLES_OK:
        return _no_rows
    return _enqueued_maker(tuple(map(res.fname, range(res.nfields))))


def _no_rows(values: Sequence[Any]) -> Enqueued:
    raise psycopg.InterfaceError("the cursor doesn't have a result")


@functools.lru_cache(maxsize=64)
def _enqueued_maker(columns: tuple[bytes | None, ...]) -> RowMaker[Enqueued]:
    names = [(c or b"").decode() for c in columns]
    problem_at = names.index("problem")
    make_job = Job.row_maker(names, lenient=True)

    def make(row: Sequence[Any]) -> Enqueued:
        problem = row[problem_at]
        return (problem, None) if problem is not None else (None, make_job(row))

    return make


def enqueued_job(row: Enqueued | None) -> Job | None:
    """The job the ``enqueue`` statement returned (a row of :func:`enqueued_row`;
    ``None``: a duplicate of an open job), for the async and the sync path alike.

    Raises:
        InvalidInput and subclasses: what ``enqueue_jobs`` refused (nothing written).
    """
    if row is None:
        return None
    problem, job = row
    if problem is not None:
        raise enqueue_error(problem)
    return job


def enqueue_error(problem: Mapping[str, Any]) -> InvalidInput:
    """The exception for what the database's ``enqueue_jobs`` found wrong with the input
    (``{sqlstate, column, message}``; the SQL entry points raise the same SQLSTATE and
    message, docs/enqueue-from-sql.md, "Errors"), its ``argument`` the column when the
    message begins with it (``job type`` for ``type``)."""
    sqlstate, message = problem.get("sqlstate"), str(problem.get("message"))
    if sqlstate == "23503":
        return UnknownGroup(message)
    if sqlstate == "42704":
        return UnknownJobType(message)
    # The argument the message begins with, as Python's own checks name it.
    column = str(problem.get("column"))
    name = "job type" if column == "type" else column
    argument = name if message.startswith(name) else None
    if column == "payload":
        return PayloadError(message, argument=argument)
    return InvalidInput(message, argument=argument)


#: The group ids of ``enqueue_jobs``' unknown-group message, as PostgreSQL's
#: ``quote_literal`` writes them: ``'a'``, ``'it''s'``, ``E'back\\slash'``.
_QUOTED = re.compile(r"(E?)'((?:[^']|'')*)'")


def batch_error(problem: Mapping[str, Any], group_ids: Sequence[str | None]) -> InvalidInput:
    """The exception for what ``enqueue_jobs`` refused in a batch, naming the item as
    every other per-item problem does (``item 3: ...``, counted from 0, the database
    names the item of a broken rule itself): for unknown groups, which the database
    names without their items, the first item whose group is one of them, and its group
    id (the other unknown groups of the batch follow in parentheses).

    Args:
        problem: the database's problem (``{sqlstate, column, message}``).
        group_ids: the batch's group ids, one per item, in the order given.

    Returns:
        :func:`enqueue_error`'s exception, an :class:`UnknownGroup` naming the item
        (``item 1: unknown group 'nope': create it first ...``) when the message's
        groups can be read.
    """
    error = enqueue_error(problem)
    message = str(error)
    head = re.match(r"unknown groups? ", message)
    if not isinstance(error, UnknownGroup) or head is None:
        return error
    # The listed ids, read back exactly (an id may hold quotes or ", "), then what
    # follows the list: ": create it first ...", after " …" when more were left out.
    quoted: dict[str, str] = {}
    at = head.end()
    while (token := _QUOTED.match(message, at)) is not None:
        text = token.group(2).replace("''", "'")
        quoted[text.replace("\\\\", "\\") if token.group(1) else text] = token.group(0)
        at = token.end()
        if not message.startswith(", ", at):
            break
        at += 2
    listed, tail = message[head.end():at], message[at:]
    more = " …" if tail.startswith(" …") else ""  # more than the five listed
    tail = tail.removeprefix(more)
    others = (f" (unknown groups in the batch: {listed}{more})"
              if len(quoted) > 1 or more else "")
    for i, group_id in enumerate(group_ids):
        if group_id is not None and group_id in quoted:
            return UnknownGroup(f"item {i}: unknown group {quoted[group_id]}{others}{tail}")
    return error


def fast_params(params: Mapping[str, Any]) -> dict[str, Any] | None:
    """The parameters of ``sql/enqueue_fast.sql`` for one job's :func:`enqueue_params`
    (with its trace context), or ``None`` when the job must go through ``enqueue_jobs``
    (``sql/enqueue.sql``): it has a dedupe key (a statement that writes nothing could
    not tell a duplicate from a broken rule), or the queue checks groups against an
    application's relation (``s_groups``, named at run time)."""
    if params["dedupe_key"] is not None or params["s_groups"] is not None:
        return None
    return {k: v for k, v in params.items() if k not in _NOT_FAST}


_NOT_FAST = frozenset({"dedupe_key", "s_groups"})


async def enqueue(store: Store, settings: QueueSettings, tracer: tracing.Tracer,
                  ready: Ready, type: str, payload: Any, *,
                  group_id: str | uuid.UUID | None = None, dedupe_key: str | None = None,
                  run_after: datetime | None = None, max_attempts: int | None = None,
                  conn: AnyConn | None = None) -> Job | None:
    """Enqueue one job in one statement under the database's rules, with the trace
    context of its enqueue span: a job without a dedupe key (on rota's own groups
    table) as one INSERT (``sql/enqueue_fast.sql``, :func:`fast_params`), and through
    ``enqueue_jobs`` (``sql/enqueue.sql``) otherwise or when that INSERT wrote nothing,
    which then says what was wrong (see :meth:`rota.Queue.enqueue`, whose
    arguments these are after the first four; ``ready`` is awaited first when ``conn``
    is ``None``: it opens the queue's pool if it is not yet).

    Returns:
        The new job, or ``None`` when an open job with ``dedupe_key`` exists.

    Raises:
        PayloadError, NaiveDatetimeError, UnknownJobType, InvalidInput: bad input,
            nothing written.
        UnknownGroup: ``group_id`` is not in the groups relation.
    """
    params = enqueue_params(settings, type, payload, group_id=group_id,
                            dedupe_key=dedupe_key, run_after=run_after,
                            max_attempts=max_attempts)
    with tracer.enqueue(params["type"], 1) as sending:
        params["trace_context"] = sending.trace_context
        if conn is None:
            await ready()
        # The store takes the pooled connection itself (or uses conn): one statement,
        # one round trip, its row read straight into the Job. The usual job takes the one
        # INSERT of sql/enqueue_fast.sql; when that writes nothing, enqueue_jobs says why.
        fast = fast_params(params)
        row = None if fast is None else await sql.enqueue_fast(
            store, **fast, row_factory=enqueued_row, conn=conn)
        if row is None:
            row = await sql.enqueue(store, **params, row_factory=enqueued_row, conn=conn)
        job = enqueued_job(row)
        sending.sent([job.id] if job is not None else [], 1 if job is not None else 0)
    return job


async def enqueue_many(store: Store, settings: QueueSettings, tracer: tracing.Tracer,
                       ready: Ready, items: Iterable[Mapping[str, Any]], *,
                       conn: AnyConn | None = None) -> int:
    """Enqueue a batch in one statement through the database's ``enqueue_jobs`` (see
    :meth:`rota.Queue.enqueue_many`); one enqueue span for the batch. ``ready`` is
    awaited first when ``conn`` is ``None`` (as for :func:`enqueue`).

    Returns:
        How many jobs were created (duplicates of open jobs, or of each other inside
        the batch, are skipped).

    Raises:
        InvalidInput and subclasses: naming the first bad item; nothing written.
        UnknownGroup: some group ids are unknown, naming the first item with one and
            its group id (:func:`batch_error`); nothing written.
    """
    params = enqueue_many_params(settings, items)
    if not params["types"]:
        return 0
    types = set(params["types"])
    with tracer.enqueue(types.pop() if len(types) == 1 else None,
                        len(params["types"])) as sending:
        params["trace_context"] = sending.trace_context
        params["count"] = len(params["types"])
        if conn is None:
            await ready()
        # One statement: on our own autocommit connection it is its own transaction;
        # on a caller's connection, the caller's transaction holds it.
        created, problem = await sql.enqueue_many(store, **params, conn=conn)
        if problem is not None:
            raise batch_error(problem, params["group_ids"])
        sending.sent([], int(created))
    return int(created)


__all__ = ["Enqueued", "Ready", "batch_error", "enqueue", "enqueue_error", "enqueue_many",
           "enqueue_many_params", "enqueue_params", "enqueue_settings", "enqueued_job",
           "enqueued_row", "fast_params"]
