"""Enqueueing from synchronous code (a Django or Flask view, a script) on a psycopg
sync connection. Runs the same statements and checks as :class:`rota.Queue`."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row, tuple_row

from .job import Job
from .settings import QueueSettings, enqueue_error, enqueued_job
from .store import Statements, configure_cursor


class SyncQueue:
    """Synchronous enqueue on a caller's ``psycopg.Connection``.

    Takes the same settings as :class:`rota.Queue` (``schema``, ``types``,
    ``max_attempts``…); build it once and pass your connection to each call, so the job
    is created if and only if your transaction commits. The queue's claim and runner
    side stays async. It runs the same statements through the same checks as
    :class:`rota.Queue` (its :class:`rota.settings.QueueSettings` and the store's
    :class:`rota.store.Statements`), so the two paths cannot drift.

    Raises:
        InvalidInput: a bad setting.
    """

    def __init__(self, **settings: Any) -> None:
        self.settings = QueueSettings(**settings)
        self.statements = Statements(self.settings.schema, self.settings.groups)

    @property
    def clock_offset(self) -> timedelta:
        """See :attr:`rota.Queue.clock_offset`."""
        return self.settings.clock_offset

    @clock_offset.setter
    def clock_offset(self, value: timedelta) -> None:
        self.settings.clock_offset = value

    def enqueue(
        self,
        conn: psycopg.Connection[Any],
        type: str,
        payload: Any,
        *,
        group_id: str | uuid.UUID | None = None,
        dedupe_key: str | None = None,
        run_after: datetime | None = None,
        max_attempts: int | None = None,
    ) -> Job | None:
        """As :meth:`rota.Queue.enqueue`, on ``conn``. Returns the job, or ``None`` for a
        duplicate of an open job. Raises the same errors."""
        params = self.settings.enqueue_params(
            type, payload, group_id=group_id, dedupe_key=dedupe_key, run_after=run_after,
            max_attempts=max_attempts)
        cur = conn.cursor(row_factory=dict_row)
        configure_cursor(cur)
        cur.execute(self.statements.sql("enqueue"), params)
        row = cur.fetchone()
        return enqueued_job(row)

    def enqueue_many(self, conn: psycopg.Connection[Any],
                     items: Iterable[Mapping[str, Any]]) -> int:
        """As :meth:`rota.Queue.enqueue_many`, on ``conn``. Returns how many were created."""
        params = self.settings.enqueue_many_params(items)
        if not params["types"]:
            return 0
        cur = conn.cursor(row_factory=tuple_row)
        configure_cursor(cur)
        row = cur.execute(self.statements.sql("enqueue_many"), params).fetchone()
        assert row is not None
        created, problem = row
        if problem is not None:
            raise enqueue_error(problem)
        return int(created)
