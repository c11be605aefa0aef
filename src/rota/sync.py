"""Enqueueing from synchronous code (a Django or Flask view, a script) on a psycopg
sync connection. Runs the same statements and checks as :class:`rota.Queue`."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Concatenate, ParamSpec, TypeVar

import psycopg
from psycopg.rows import tuple_row

from . import tracing
from .enqueue import (
    batch_error,
    enqueue_many_params,
    enqueue_params,
    enqueued_job,
    enqueued_row,
    fast_params,
)
from .job import Job
from .results import DEFAULT_POLL_EVERY, JobResult, sync_result, sync_wait
from .settings import QueueSettings, queue_settings
from .store import Statements, configure_cursor

P = ParamSpec("P")
R = TypeVar("R")


def _checked_by(
    params_of: Callable[Concatenate[QueueSettings, P], dict[str, Any]],
) -> Callable[[Callable[[SyncQueue, psycopg.Connection[Any], dict[str, Any]], R]],
              Callable[Concatenate[SyncQueue, psycopg.Connection[Any], P], R]]:
    """A :class:`SyncQueue` method from ``run(self, conn, params)``: it takes ``conn``,
    then the arguments of ``params_of`` (the :mod:`rota.enqueue` function that checks
    them and makes the statement's parameters for :class:`rota.Queue` too), and runs
    ``run`` with those parameters. Its signature (``help()``, :func:`inspect.signature`)
    shows those arguments; mypy checks calls against them."""
    def decorate(
        run: Callable[[SyncQueue, psycopg.Connection[Any], dict[str, Any]], R],
    ) -> Callable[Concatenate[SyncQueue, psycopg.Connection[Any], P], R]:
        @functools.wraps(run)
        def method(self: SyncQueue, conn: psycopg.Connection[Any], *args: P.args,
                   **kwargs: P.kwargs) -> R:
            params = params_of(self.settings, *args, **kwargs)
            with self.statements.noting_missing():
                return run(self, conn, params)

        own = inspect.signature(run)
        checked = list(inspect.signature(params_of).parameters.values())[1:]
        method.__signature__ = own.replace(  # type: ignore[attr-defined]
            parameters=[*list(own.parameters.values())[:2], *checked])
        # Concatenate makes self and conn positional-only for mypy; at run time conn
        # may still be passed by name, as before.
        return method  # type: ignore[return-value]
    return decorate


class SyncQueue:
    """Synchronous enqueue on a caller's ``psycopg.Connection``.

    Takes the same settings as :class:`rota.Queue` (``schema``, ``types``,
    ``max_attempts``…); build it once and pass your connection to each call, so the job
    is created if and only if your transaction commits. The queue's claim and runner
    side stays async. It runs the same statements through the same checks as
    :class:`rota.Queue` (its :class:`rota.settings.QueueSettings` and the store's
    :class:`rota.store.Statements`), so the two paths cannot drift.

    Each enqueue is traced as :class:`rota.Queue`'s is: the job keeps the trace context
    of its enqueue span, a child of the current span (a web request's), on
    ``tracer_provider`` (default the global one; docs/operations.md, "Traces").

    Raises:
        InvalidInput: a bad setting.
        UnknownSetting: a keyword argument that is not a setting (also a
            ``TypeError``); the message names the closest one.
    """

    def __init__(self, *, tracer_provider: Any = None, **settings: Any) -> None:
        self.settings = queue_settings("SyncQueue", settings, ("tracer_provider",))
        self.tracer = tracing.Tracer(tracer_provider)
        self.statements = Statements(self.settings.schema, self.settings.groups)

    @property
    def clock_offset(self) -> timedelta:
        """See :attr:`rota.Queue.clock_offset`."""
        return self.settings.clock_offset

    @clock_offset.setter
    def clock_offset(self, value: timedelta) -> None:
        self.settings.clock_offset = value

    @_checked_by(enqueue_params)
    def enqueue(self, conn: psycopg.Connection[Any], params: dict[str, Any]) -> Job | None:
        """As :meth:`rota.Queue.enqueue`, on ``conn``. Returns the job, or ``None`` for a
        duplicate of an open job. Raises the same errors."""
        with self.tracer.enqueue(params["type"], 1) as sending:
            params["trace_context"] = sending.trace_context
            cur = conn.cursor(row_factory=enqueued_row)
            configure_cursor(cur)
            # As Queue.enqueue: the one INSERT first when it applies, enqueue_jobs when it
            # does not or wrote nothing (rota.enqueue.fast_params).
            fast = fast_params(params)
            row = None
            if fast is not None:
                row = cur.execute(self.statements.sql("enqueue_fast"), fast).fetchone()
            if row is None:
                row = cur.execute(self.statements.sql("enqueue"), params).fetchone()
            job = enqueued_job(row)
            sending.sent([job.id] if job is not None else [], 1 if job is not None else 0)
        return job

    @_checked_by(enqueue_many_params)
    def enqueue_many(self, conn: psycopg.Connection[Any], params: dict[str, Any]) -> int:
        """As :meth:`rota.Queue.enqueue_many`, on ``conn``. Returns how many were created."""
        if not params["types"]:
            return 0
        types = set(params["types"])
        with self.tracer.enqueue(types.pop() if len(types) == 1 else None,
                                 len(params["types"])) as sending:
            params["trace_context"] = sending.trace_context
            params["count"] = len(params["types"])
            cur = conn.cursor(row_factory=tuple_row)
            configure_cursor(cur)
            row = cur.execute(self.statements.sql("enqueue_many"), params).fetchone()
            assert row is not None
            created, problem = row
            if problem is not None:
                raise batch_error(problem, params["group_ids"])
            sending.sent([], int(created))
        return int(created)

    def result(self, conn: psycopg.Connection[Any], job_id: int) -> JobResult:
        """As :meth:`rota.Queue.result`, on ``conn``: the job's status, return value and
        every attempt's error (docs/design.md, "Results").

        Raises:
            JobNotFound: no job has this id.
            InvalidInput: ``job_id`` is not a positive int.
        """
        with self.statements.noting_missing():
            return sync_result(self.statements, conn, job_id)

    def wait(self, conn: psycopg.Connection[Any], job_id: int, *, timeout: timedelta,
             poll_every: timedelta = DEFAULT_POLL_EVERY) -> JobResult:
        """As :meth:`rota.Queue.wait`, on ``conn``: returns the job's result once it is
        done or failed. With ``conn`` in autocommit mode it LISTENs for the job
        (UNLISTENing before it returns); inside a transaction it polls every
        ``poll_every`` (at read committed each read sees what committed; the
        transaction is left open, so a job enqueued in it is not seen by workers until
        the caller commits).

        Raises:
            WaitTimeout: still pending or running after ``timeout``.
            JobNotFound: no job has this id.
            InvalidInput: ``job_id`` is not a positive int, or ``timeout`` or
                ``poll_every`` is not a positive ``timedelta``.
        """
        with self.statements.noting_missing():
            return sync_wait(self.statements, conn, job_id, timeout=timeout,
                             poll_every=poll_every)

