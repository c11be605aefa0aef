"""Typed functions for rota's statements: one function per file ``rota/sql/NAME.sql``,
named after it, taking exactly the statement's placeholders as keyword arguments and
returning its answer typed (as River's generated queries and oban-py's query module
do). A mistyped statement name is an ``AttributeError`` (and a mypy error), a missing
or extra parameter a ``TypeError`` at the call (and a mypy error), not a ``KeyError``
from psycopg in production; ``tests/test_statements.py`` checks that each function's
parameters are its statement's placeholders.

Every function runs through the :class:`rota.store.Store` it is given (the one
data-access seam: docs/design.md, "Where things live"), on ``conn`` when given (inside
the caller's transaction), else on a pooled connection. The fair claim's statements
(``rota/fair/*.sql``) are its package's own (:mod:`rota.fair`); the sync paths
(:class:`rota.SyncQueue`, the sync result reads and waits of :mod:`rota.results`,
the Django backend) compose the same statements by name on a sync cursor.

One piece (about 900 lines): one short function per statement file, in the order of
the rules they serve; its length is the number of statements. Split by rule, a caller
and ``tests/test_statements.py`` would have to know which module holds which
statement.

Units: ``offset`` is the queue's clock offset (a ``timedelta`` added to the database's
``now()``: docs/design.md, "Time"); every ``timedelta`` is sent as exact seconds.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from psycopg.rows import AsyncRowFactory

from .store import AnyConn, Row, Store

# -- fenced transitions of claimed jobs (docs/design.md, "Fencing", "Settling twice") --


async def complete(store: Store, *, id: int, claim_token: uuid.UUID | None,
                   offset: timedelta, result: str | None, started_at: datetime | None,
                   cost: Decimal | None, schema_name: str,
                   conn: AnyConn | None = None) -> int:
    """``sql/complete.sql``: mark one job done under its claim, keeping ``result``
    (encoded JSON text, or ``None``) and ``started_at`` (its claim time), charging
    ``cost`` (checked; ``None``: 1; docs/design.md, "Cost"); notifies waiters
    (``schema_name`` names the channel's payload).

    Returns:
        1 when done now, 0 when the claim matched nothing (lost, or a repeat).
    """
    return await store.execute("complete", {
        "id": id, "claim_token": claim_token, "offset": offset, "result": result,
        "started_at": started_at, "cost": cost, "schema_name": schema_name}, conn=conn)


async def complete_many(store: Store, *, ids: Sequence[int],
                        claim_tokens: Sequence[uuid.UUID | None],
                        results: Sequence[str | None],
                        started_ats: Sequence[datetime | None],
                        costs: Sequence[Decimal | None], offset: timedelta,
                        schema_name: str,
                        conn: AnyConn | None = None) -> set[tuple[int, uuid.UUID]]:
    """``sql/complete_many.sql``: mark jobs done, each under its own claim (parallel
    arrays, in id order: the one lock order), each charged its cost (``None``: 1).

    Returns:
        ``(id, claim_token)`` of each job done now, with the claim it was done under
        (a job listed under two claims is done under the one that holds it).
    """
    rows = await store.fetch_all("complete_many", {
        "ids": list(ids), "claim_tokens": list(claim_tokens), "results": list(results),
        "started_ats": list(started_ats), "costs": list(costs), "offset": offset,
        "schema_name": schema_name}, conn=conn)
    return {(r[0], r[1]) for r in rows}


async def claim_states(store: Store, *, ids: Sequence[int],
                       claim_tokens: Sequence[uuid.UUID | None],
                       conn: AnyConn | None = None) -> dict[tuple[int, uuid.UUID], str]:
    """``sql/claim_states.sql``: the status each job's claim left it in.

    Returns:
        ``(id, claim_token)`` -> status, for the rows that still carry that claim's
        token (a row carries one: of a job listed under two claims, at most one is
        answered).
    """
    rows = await store.fetch_all("claim_states", {
        "ids": list(ids), "claim_tokens": list(claim_tokens)}, conn=conn)
    return {(r[0], r[1]): r[2] for r in rows}


async def fail(store: Store, *, id: int, claim_token: uuid.UUID | None, offset: timedelta,
               error: str, error_type: str | None, traceback: str | None, give_up: bool,
               started_at: datetime | None, schema_name: str, backoff_base: timedelta,
               max_backoff: timedelta, latest_due: datetime,
               conn: AnyConn | None = None) -> str | None:
    """``sql/fail.sql``: record a failed attempt under its claim (docs/design.md, "Fail
    and backoff"): ``error`` kept, the backoff ``min(backoff_base * 2**attempts,
    max_backoff)`` capped at ``latest_due``.

    Returns:
        The job's status now (``"pending"`` or ``"failed"``), or ``None`` when the
        claim matched nothing.
    """
    row = await store.fetch_one("fail", {
        "id": id, "claim_token": claim_token, "offset": offset, "error": error,
        "error_type": error_type, "traceback": traceback, "give_up": give_up,
        "started_at": started_at, "schema_name": schema_name,
        "backoff_base": backoff_base, "max_backoff": max_backoff,
        "latest_due": latest_due}, conn=conn)
    return None if row is None else str(row[0])


async def defer(store: Store, *, ids: Sequence[int],
                claim_tokens: Sequence[uuid.UUID | None], until: datetime | None,
                delay: timedelta, max_deferrals: int | None, offset: timedelta,
                conn: AnyConn | None = None) -> list[tuple[int, str]]:
    """``sql/defer.sql``: defer jobs under their claims to ``until`` (``None``: ``delay``
    after the queue's clock), giving up past ``max_deferrals`` (docs/design.md,
    "Defer").

    Returns:
        ``(id, status)`` per job the claims matched (``pending``, or ``failed``).
    """
    rows = await store.fetch_all("defer", {
        "ids": list(ids), "claim_tokens": list(claim_tokens), "until": until,
        "delay": delay, "max_deferrals": max_deferrals, "offset": offset}, conn=conn)
    return [(r[0], r[1]) for r in rows]


async def release(store: Store, *, ids: Sequence[int],
                  claim_tokens: Sequence[uuid.UUID | None], not_before: datetime | None,
                  conn: AnyConn | None = None) -> int:
    """``sql/release.sql``: hand jobs back as if never claimed, not due before
    ``not_before`` when given (docs/design.md, "Defer").

    Returns:
        How many were released.
    """
    return await store.execute("release", {
        "ids": list(ids), "claim_tokens": list(claim_tokens),
        "not_before": not_before}, conn=conn)


async def restore_due(store: Store, *, ids: Sequence[int],
                      claim_tokens: Sequence[uuid.UUID | None],
                      pushed: Sequence[datetime], asked: Sequence[datetime | None],
                      offset: timedelta, conn: AnyConn | None = None) -> int:
    """``sql/restore_due.sql``: jobs whose due time a run pushed to ``pushed`` are due at
    ``asked`` again (``None``: now) (docs/design.md, "Defer").

    Returns:
        How many are due sooner.
    """
    return await store.execute("restore_due", {
        "ids": list(ids), "claim_tokens": list(claim_tokens), "pushed": list(pushed),
        "asked": list(asked), "offset": offset}, conn=conn)


async def heartbeat(store: Store, *, ids: Sequence[int],
                    claim_tokens: Sequence[uuid.UUID | None], offset: timedelta,
                    conn: AnyConn | None = None) -> int:
    """``sql/heartbeat.sql``: refresh the locks of jobs under their claims
    (docs/design.md, "Stale locks").

    Returns:
        How many locks were refreshed.
    """
    return await store.execute("heartbeat", {
        "ids": list(ids), "claim_tokens": list(claim_tokens), "offset": offset},
        conn=conn)


async def postpone(store: Store, *, type: str, until: datetime, offset: timedelta,
                   stale_after: timedelta, conn: AnyConn | None = None) -> int:
    """``sql/postpone.sql``: the claimable jobs of ``type`` wait until ``until`` (a
    quota's reset: docs/design.md, "Quotas").

    Returns:
        How many were postponed.
    """
    return await store.execute("postpone", {
        "type": type, "until": until, "offset": offset, "stale_after": stale_after},
        conn=conn)


async def lost_attempts(store: Store, *, ids: Sequence[int],
                        claim_tokens: Sequence[uuid.UUID | None], offset: timedelta,
                        conn: AnyConn | None = None) -> int:
    """``sql/lost_attempts.sql``: give the attempt before these claims an error when it
    left none (docs/design.md, "Stale locks").

    Returns:
        How many errors were recorded.
    """
    return await store.execute("lost_attempts", {
        "ids": list(ids), "claim_tokens": list(claim_tokens), "offset": offset},
        conn=conn)


async def fail_stuck(store: Store, *, offset: timedelta, stale_after: timedelta,
                     schema_name: str, conn: AnyConn | None = None) -> list[dict[str, Any]]:
    """``sql/fail_stuck.sql``: fail running jobs whose lock is stale and whose attempts
    are used up (docs/design.md, "Stuck jobs").

    Returns:
        The failed jobs' rows (values that cannot be loaded are ``Unreadable``).
    """
    return await store.fetch_dicts("fail_stuck", {
        "offset": offset, "stale_after": stale_after, "schema_name": schema_name},
        conn=conn)


# -- give-up hooks (docs/design.md, "Give-up hooks") ----------------------------------


async def give_up_owed(store: Store, *, types: Sequence[str], ids: Sequence[int] | None,
                       limit: int, conn: AnyConn | None = None) -> list[int]:
    """``sql/give_up_owed.sql``: ids of jobs of ``types`` whose hook is owed (``ids``
    only, when given), at most ``limit``."""
    rows = await store.fetch_all("give_up_owed", {
        "types": list(types), "ids": None if ids is None else list(ids), "limit": limit},
        conn=conn)
    return [r[0] for r in rows]


async def give_up_lock(store: Store, *, id: int,
                       conn: AnyConn | None = None) -> dict[str, Any] | None:
    """``sql/give_up_lock.sql``: lock a job whose hook is owed (skipping one another
    sweeper holds).

    Returns:
        Its row, or ``None`` (handled already, or locked elsewhere).
    """
    return await store.fetch_dict("give_up_lock", {"id": id}, conn=conn)


async def give_up_done(store: Store, *, id: int, conn: AnyConn | None = None) -> int:
    """``sql/give_up_done.sql``: record the job's hook as run.

    Returns:
        1 when recorded.
    """
    return await store.execute("give_up_done", {"id": id}, conn=conn)


# -- enqueue (docs/design.md, "Enqueue") ------------------------------------------------


async def enqueue(store: Store, *, type: str, payload: str, group_id: str | None,
                  dedupe_key: str | None, run_after: datetime | None,
                  max_attempts: int | None, s_types: list[str] | None,
                  s_max_attempts: int, s_max_attempts_by_type: Any,
                  s_max_payload_bytes: int, s_groups: str | None, offset: timedelta,
                  trace_context: Any, row_factory: AsyncRowFactory[Row],
                  conn: AnyConn | None = None) -> Row | None:
    """``sql/enqueue.sql``: one job through the database's ``enqueue_jobs`` (the
    parameters of :func:`rota.enqueue.enqueue_params`, and the trace context).

    Returns:
        The row (the job's columns and ``problem``) as ``row_factory`` makes it
        (:func:`rota.enqueue.enqueued_row`), or ``None`` for a duplicate.
    """
    return await store.fetch_first("enqueue", {
        "type": type, "payload": payload, "group_id": group_id, "dedupe_key": dedupe_key,
        "run_after": run_after, "max_attempts": max_attempts, "s_types": s_types,
        "s_max_attempts": s_max_attempts, "s_max_attempts_by_type": s_max_attempts_by_type,
        "s_max_payload_bytes": s_max_payload_bytes, "s_groups": s_groups,
        "offset": offset, "trace_context": trace_context}, row_factory, conn=conn)


async def enqueue_fast(store: Store, *, type: str, payload: str, group_id: str | None,
                       run_after: datetime | None, max_attempts: int | None,
                       s_types: list[str] | None, s_max_attempts: int,
                       s_max_attempts_by_type: Any, s_max_payload_bytes: int,
                       offset: timedelta, trace_context: Any,
                       row_factory: AsyncRowFactory[Row],
                       conn: AnyConn | None = None) -> Row | None:
    """``sql/enqueue_fast.sql``: one job without a dedupe key into rota's own groups
    table as one INSERT under the rules of ``enqueue_jobs`` (the parameters of
    :func:`enqueue` but ``dedupe_key`` and ``s_groups``).

    Returns:
        The job's row as ``row_factory`` makes it (``problem`` null), or ``None``: nothing
        was written (a broken rule, an unknown group), and :func:`enqueue` says why.
    """
    return await store.fetch_first("enqueue_fast", {
        "type": type, "payload": payload, "group_id": group_id, "run_after": run_after,
        "max_attempts": max_attempts, "s_types": s_types, "s_max_attempts": s_max_attempts,
        "s_max_attempts_by_type": s_max_attempts_by_type,
        "s_max_payload_bytes": s_max_payload_bytes, "offset": offset,
        "trace_context": trace_context}, row_factory, conn=conn)


async def enqueue_many(store: Store, *, types: list[str | None], payloads: list[str],
                       group_ids: list[str | None], dedupe_keys: list[str | None],
                       run_afters: list[datetime | None], max_attempts: list[int | None],
                       s_types: list[str] | None, s_max_attempts: int,
                       s_max_attempts_by_type: Any, s_max_payload_bytes: int,
                       s_groups: str | None, offset: timedelta, trace_context: Any,
                       count: int, conn: AnyConn | None = None
                       ) -> tuple[int, Mapping[str, Any] | None]:
    """``sql/enqueue_many.sql``: a batch through the database's ``enqueue_jobs``
    (parallel arrays, :func:`rota.enqueue.enqueue_many_params`).

    Returns:
        ``(created, problem)``: how many jobs were created, and what the database
        refused (``None``: nothing).
    """
    row = await store.fetch_one("enqueue_many", {
        "types": types, "payloads": payloads, "group_ids": group_ids,
        "dedupe_keys": dedupe_keys, "run_afters": run_afters, "max_attempts": max_attempts,
        "s_types": s_types, "s_max_attempts": s_max_attempts,
        "s_max_attempts_by_type": s_max_attempts_by_type,
        "s_max_payload_bytes": s_max_payload_bytes, "s_groups": s_groups,
        "offset": offset, "trace_context": trace_context, "count": count}, conn=conn)
    assert row is not None
    return int(row[0]), row[1]


async def publish_settings(store: Store, *, s_types: list[str] | None,
                           s_max_attempts: int, s_max_attempts_by_type: Any,
                           s_max_payload_bytes: int, s_groups: str | None,
                           offset: timedelta, conn: AnyConn | None = None) -> int:
    """``sql/publish_settings.sql``: write the enqueue settings the SQL entry points
    read (docs/enqueue-from-sql.md, "Settings").

    Returns:
        1 when they changed, 0 when already published.
    """
    return await store.execute("publish_settings", {
        "s_types": s_types, "s_max_attempts": s_max_attempts,
        "s_max_attempts_by_type": s_max_attempts_by_type,
        "s_max_payload_bytes": s_max_payload_bytes, "s_groups": s_groups,
        "offset": offset}, conn=conn)


# -- the queue's reads and groups -------------------------------------------------------


async def db_now(store: Store, *, offset: timedelta, conn: AnyConn | None = None) -> datetime:
    """``sql/db_now.sql``: the queue's clock, the database's ``now()`` plus ``offset``."""
    row = await store.fetch_one("db_now", {"offset": offset}, conn=conn)
    assert row is not None
    now: datetime = row[0]
    return now


async def get_job(store: Store, *, id: int,
                  conn: AnyConn | None = None) -> dict[str, Any] | None:
    """``sql/get_job.sql``: one job's row by id, or ``None``."""
    return await store.fetch_dict("get_job", {"id": id}, conn=conn)


async def quota_blocked_work(store: Store, *, type: str, until: datetime,
                             conn: AnyConn | None = None) -> bool:
    """``sql/quota_blocked_work.sql``: whether a pending job of ``type`` is due by
    ``until``."""
    row = await store.fetch_one("quota_blocked_work", {"type": type, "until": until},
                                conn=conn)
    return row is not None and bool(row[0])


async def upsert_group(store: Store, *, group_id: str, owner_id: str | None,
                       plan: str | None, active: bool, max_running: int | None,
                       conn: AnyConn | None = None) -> int:
    """``sql/upsert_group.sql``: create or update a group in rota's own groups table.

    Returns:
        The row count (1).
    """
    return await store.execute("upsert_group", {
        "group_id": group_id, "owner_id": owner_id, "plan": plan, "active": active,
        "max_running": max_running}, conn=conn)


# -- the runner's runs row and rate waits -------------------------------------------------


async def run_start(store: Store, *, id: uuid.UUID, trigger: str, offset: timedelta,
                    worker: str, conn: AnyConn | None = None) -> datetime:
    """``sql/run_start.sql``: write a run's row (docs/design.md, "The runner").

    Returns:
        Its ``started_at`` on the queue's clock.
    """
    row = await store.fetch_one("run_start", {
        "id": id, "trigger": trigger, "offset": offset, "worker": worker}, conn=conn)
    assert row is not None
    started_at: datetime = row[0]
    return started_at


async def run_save(store: Store, *, id: uuid.UUID, jobs_done: int, jobs_failed: int,
                   jobs_deferred: int, quota_units: int, summary: str, final: bool,
                   stop_reason: str | None, error: str | None, offset: timedelta,
                   conn: AnyConn | None = None) -> datetime | None:
    """``sql/run_save.sql``: save a run's counters (``summary``: JSON text), and with
    ``final`` its end.

    Returns:
        ``finished_at`` when ``final``, else ``None``.
    """
    row = await store.fetch_one("run_save", {
        "id": id, "jobs_done": jobs_done, "jobs_failed": jobs_failed,
        "jobs_deferred": jobs_deferred, "quota_units": quota_units, "summary": summary,
        "final": final, "stop_reason": stop_reason, "error": error, "offset": offset},
        conn=conn)
    return None if row is None else row[0]


async def rate_wait_note(store: Store, *, ids: Sequence[int], name: str, key: str,
                         until: datetime, offset: timedelta,
                         conn: AnyConn | None = None) -> int:
    """``sql/rate_wait_note.sql``: note jobs deferred for a rate limit's units until
    ``until`` (docs/design.md, "Rates").

    Returns:
        The row count.
    """
    return await store.execute("rate_wait_note", {
        "ids": list(ids), "name": name, "key": key, "until": until, "offset": offset},
        conn=conn)


# -- rate limits (docs/design.md, "Rates") ----------------------------------------------


async def rate_take(store: Store, *, name: str, key: str, units: int, limit: int,
                    per: timedelta, burst: int, emission: timedelta,
                    max_wait: timedelta | None, offset: timedelta,
                    conn: AnyConn | None = None) -> tuple[bool, datetime, float]:
    """``sql/rate_take.sql``: take ``units`` from bucket ``(name, key)`` (``max_wait``:
    the longest reservation; ``None``: after the fact, always granted).

    Returns:
        ``(granted, at, wait_seconds)``: when the units are (or would be) the taker's.
    """
    row = await store.fetch_one("rate_take", {
        "name": name, "key": key, "units": units, "limit": limit, "per": per,
        "burst": burst, "emission": emission, "max_wait": max_wait, "offset": offset},
        conn=conn)
    assert row is not None
    return bool(row[0]), row[1], float(row[2])


async def rate_backoff(store: Store, *, name: str, key: str, wait: timedelta, limit: int,
                       per: timedelta, burst: int, emission: timedelta, offset: timedelta,
                       conn: AnyConn | None = None) -> datetime:
    """``sql/rate_backoff.sql``: empty bucket ``(name, key)`` for ``wait``.

    Returns:
        When the backoff ends.
    """
    row = await store.fetch_one("rate_backoff", {
        "name": name, "key": key, "wait": wait, "limit": limit, "per": per,
        "burst": burst, "emission": emission, "offset": offset}, conn=conn)
    assert row is not None
    until: datetime = row[0]
    return until


async def rate_peek(store: Store, *, name: str, key: str, offset: timedelta,
                    conn: AnyConn | None = None) -> tuple[datetime, datetime | None]:
    """``sql/rate_peek.sql``: bucket ``(name, key)`` without taking from it.

    Returns:
        ``(now, tat)``: the queue's clock and the bucket's theoretical arrival time
        (``None``: no row yet).
    """
    row = await store.fetch_one("rate_peek", {"name": name, "key": key, "offset": offset},
                                conn=conn)
    assert row is not None
    return row[0], row[1]


async def rate_list(store: Store, *, name: str | None, limit: int, offset: timedelta,
                    conn: AnyConn | None = None) -> list[dict[str, Any]]:
    """``sql/rate_list.sql``: the buckets (of limit ``name`` only, when given), at most
    ``limit`` rows."""
    return await store.fetch_dicts("rate_list", {
        "name": name, "limit": limit, "offset": offset}, conn=conn)


# -- quotas (docs/design.md, "Quotas") ----------------------------------------------------


async def quota_used(store: Store, *, quota: str, scope_key: str, period_start: datetime,
                     conn: AnyConn | None = None) -> int:
    """``sql/quota_used.sql``: units of ``quota`` spent by ``scope_key`` in the period
    starting ``period_start``."""
    row = await store.fetch_one("quota_used", {
        "quota": quota, "scope_key": scope_key, "period_start": period_start}, conn=conn)
    assert row is not None
    return int(row[0])


async def quota_spend(store: Store, *, quota: str, scope_key: str, period_start: datetime,
                      units: int, limit: int, offset: timedelta,
                      conn: AnyConn | None = None) -> int | None:
    """``sql/quota_spend.sql``: spend ``units`` atomically if they fit under ``limit``.

    Returns:
        The units used now, or ``None`` when they did not fit (nothing spent).
    """
    row = await store.fetch_one("quota_spend", {
        "quota": quota, "scope_key": scope_key, "period_start": period_start,
        "units": units, "limit": limit, "offset": offset}, conn=conn)
    return None if row is None else int(row[0])


async def quota_exhaust(store: Store, *, quota: str, scope_key: str,
                        period_start: datetime, limit: int, offset: timedelta,
                        conn: AnyConn | None = None) -> int:
    """``sql/quota_exhaust.sql``: record ``quota`` as used up (``limit``) for the
    period."""
    return await store.execute("quota_exhaust", {
        "quota": quota, "scope_key": scope_key, "period_start": period_start,
        "limit": limit, "offset": offset}, conn=conn)


async def group_owner(store: Store, *, group_id: str,
                      conn: AnyConn | None = None) -> dict[str, Any] | None:
    """``sql/group_owner.sql``: a group's ``owner_id`` and ``plan``, or ``None``."""
    return await store.fetch_dict("group_owner", {"group_id": group_id}, conn=conn)


# -- schedules (docs/design.md, "Schedules") ----------------------------------------------


async def list_schedules(store: Store, *,
                         conn: AnyConn | None = None) -> list[tuple[Any, ...]]:
    """``sql/list_schedules.sql``: every stored schedule, ``(name, last tick, created,
    ...)``."""
    return await store.fetch_all("list_schedules", {}, conn=conn)


async def schedules_state(store: Store, *, names: Sequence[str], offset: timedelta,
                          conn: AnyConn | None = None) -> list[tuple[Any, ...]]:
    """``sql/schedules_state.sql``: ``(name, last tick, created, now)`` per name
    (``created`` ``None``: not registered yet)."""
    return await store.fetch_all("schedules_state", {
        "names": list(names), "offset": offset}, conn=conn)


async def schedule_register(store: Store, *, names: Sequence[str], offset: timedelta,
                            conn: AnyConn | None = None) -> int:
    """``sql/schedule_register.sql``: register schedules by name (idempotent)."""
    return await store.execute("schedule_register", {
        "names": list(names), "offset": offset}, conn=conn)


async def schedule_lock(store: Store, *, name: str,
                        conn: AnyConn | None = None) -> tuple[Any, ...] | None:
    """``sql/schedule_lock.sql``: lock a schedule's row; its ``(last tick, created)``,
    or ``None`` when it was deleted."""
    return await store.fetch_one("schedule_lock", {"name": name}, conn=conn)


async def schedule_advance(store: Store, *, name: str, tick: datetime, offset: timedelta,
                           conn: AnyConn | None = None) -> int:
    """``sql/schedule_advance.sql``: move a schedule's cursor to ``tick``."""
    return await store.execute("schedule_advance", {
        "name": name, "tick": tick, "offset": offset}, conn=conn)


# -- the worker and maintenance (docs/design.md, "Maintenance") ---------------------------


async def next_due(store: Store, *, types: Sequence[str] | None, offset: timedelta,
                   stale_after: timedelta, conn: AnyConn | None = None,
                   deadline: float | None = None) -> float | None:
    """``sql/next_due.sql``: seconds until the next job of ``types`` (``None``: any) is
    claimable, or ``None`` when none is waiting (``deadline``: seconds, see
    :meth:`rota.store.Store.deadline`)."""
    row = await store.fetch_one("next_due", {
        "types": None if types is None else list(types), "offset": offset,
        "stale_after": stale_after}, conn=conn, deadline=deadline)
    return None if row is None or row[0] is None else float(row[0])


async def notify_probe(store: Store, *, token: str,
                       conn: AnyConn | None = None) -> tuple[Any, ...] | None:
    """``sql/notify_probe.sql``: send ``token`` on the worker's probe channel.

    Returns:
        ``(None, database name)`` as the server that sent it saw it.
    """
    return await store.fetch_one("notify_probe", {"token": token}, conn=conn)


async def killed_runs(store: Store, *, stale_after: timedelta, offset: timedelta,
                      conn: AnyConn | None = None) -> list[tuple[Any, ...]]:
    """``sql/killed_runs.sql``: mark unfinished runs silent for ``stale_after`` killed.

    Returns:
        One row per run marked.
    """
    return await store.fetch_all("killed_runs", {
        "stale_after": stale_after, "offset": offset}, conn=conn)


async def killed_runs_next(store: Store, *, stale_after: timedelta, offset: timedelta,
                           conn: AnyConn | None = None) -> float | None:
    """``sql/killed_runs_next.sql``: seconds until the next unfinished run is due to be
    marked killed, or ``None``."""
    row = await store.fetch_one("killed_runs_next", {
        "stale_after": stale_after, "offset": offset}, conn=conn)
    return None if row is None or row[0] is None else float(row[0])


async def prune_done(store: Store, *, retention: timedelta, batch_size: int,
                     offset: timedelta, conn: AnyConn | None = None) -> int:
    """``sql/prune_done.sql``: delete up to ``batch_size`` done jobs finished more than
    ``retention`` ago. Returns how many."""
    return await store.execute("prune_done", {
        "retention": retention, "batch_size": batch_size, "offset": offset}, conn=conn)


async def prune_runs(store: Store, *, retention: timedelta, batch_size: int,
                     offset: timedelta, conn: AnyConn | None = None) -> int:
    """``sql/prune_runs.sql``: delete up to ``batch_size`` finished runs started more
    than ``retention`` ago. Returns how many."""
    return await store.execute("prune_runs", {
        "retention": retention, "batch_size": batch_size, "offset": offset}, conn=conn)


async def prune_quota_usage(store: Store, *, retention: timedelta, offset: timedelta,
                            conn: AnyConn | None = None) -> int:
    """``sql/prune_quota_usage.sql``: delete quota usage rows of periods that began
    more than ``retention`` ago. Returns how many."""
    return await store.execute("prune_quota_usage", {
        "retention": retention, "offset": offset}, conn=conn)


# -- admin operations (rota.admin: rota jobs, rota runs, rota groups, the dashboard) -----


async def list_jobs(store: Store, *, status: str | None, type: str | None,
                    group_id: str | None, job_id: int | None, before_id: int | None,
                    limit: int, conn: AnyConn | None = None) -> list[dict[str, Any]]:
    """``sql/list_jobs.sql``: jobs, newest first, filtered (``None``: any), before
    ``before_id`` (a keyset page), at most ``limit``."""
    return await store.fetch_dicts("list_jobs", {
        "status": status, "type": type, "group_id": group_id, "job_id": job_id,
        "before_id": before_id, "limit": limit}, conn=conn)


async def retry_job(store: Store, *, id: int, offset: timedelta, channel: str,
                    conn: AnyConn | None = None) -> dict[str, Any] | None:
    """``sql/retry_job.sql``: a failed job pending again, its owed hook cancelled
    (``channel``: the schema, for the wake-up notification).

    Returns:
        Its row (with ``hook_cancelled``), or ``None`` when it is not failed.

    Raises:
        psycopg.errors.UniqueViolation: an open job holds its dedupe key.
    """
    return await store.fetch_dict("retry_job", {
        "id": id, "offset": offset, "channel": channel}, conn=conn)


async def cancel_job(store: Store, *, id: int, offset: timedelta, schema_name: str,
                     conn: AnyConn | None = None) -> dict[str, Any] | None:
    """``sql/cancel_job.sql``: a pending job failed as cancelled.

    Returns:
        Its row, or ``None`` when it is not pending.
    """
    return await store.fetch_dict("cancel_job", {
        "id": id, "offset": offset, "schema_name": schema_name}, conn=conn)


async def list_runs(store: Store, *, before_at: datetime | None, before_id: uuid.UUID,
                    limit: int, conn: AnyConn | None = None) -> list[dict[str, Any]]:
    """``sql/list_runs.sql``: runs, newest first, before ``(before_at, before_id)``
    (a keyset page), at most ``limit``."""
    return await store.fetch_dicts("list_runs", {
        "before_at": before_at, "before_id": before_id, "limit": limit}, conn=conn)


async def queue_depth(store: Store, *, offset: timedelta,
                      conn: AnyConn | None = None) -> list[dict[str, Any]]:
    """``sql/queue_depth.sql``: open jobs per type and plan."""
    return await store.fetch_dicts("queue_depth", {"offset": offset}, conn=conn)


async def applied_migrations(store: Store, *, conn: AnyConn | None = None) -> set[int]:
    """``sql/applied_migrations.sql``: the migration versions applied to the schema."""
    return {row[0] for row in await store.fetch_all("applied_migrations", {}, conn=conn)}


async def group_get(store: Store, *, group_id: str,
                    conn: AnyConn | None = None) -> dict[str, Any] | None:
    """``sql/group_get.sql``: a group of rota's own table, or ``None``."""
    return await store.fetch_dict("group_get", {"group_id": group_id}, conn=conn)


# -- results (docs/design.md, "Results") -------------------------------------------------


async def get_result(store: Store, *, id: int,
                     conn: AnyConn | None = None) -> dict[str, Any] | None:
    """``sql/get_result.sql``: a job's status, result and errors, or ``None``."""
    return await store.fetch_dict("get_result", {"id": id}, conn=conn)


async def waiter_add(store: Store, *, id: int, waiter: uuid.UUID,
                     conn: AnyConn | None = None) -> int:
    """``sql/waiter_add.sql``: register ``waiter`` for job ``id``'s settlement."""
    return await store.execute("waiter_add", {"id": id, "waiter": waiter}, conn=conn)


async def waiter_remove(store: Store, *, id: int, waiter: uuid.UUID,
                        conn: AnyConn | None = None) -> int:
    """``sql/waiter_remove.sql``: unregister ``waiter``."""
    return await store.execute("waiter_remove", {"id": id, "waiter": waiter}, conn=conn)


# -- the claim's upkeep (docs/fast-claim.md) ---------------------------------------------


async def horizon_age(store: Store, *,
                      conn: AnyConn | None = None) -> tuple[float, int]:
    """``sql/horizon_age.sql``: the xmin horizon's age.

    Returns:
        ``(seconds, transactions)``: seconds since the oldest transaction holding a
        snapshot or an xid began (0 when none), and how many transactions hold one.
    """
    row = await store.fetch_one("horizon_age", {}, conn=conn)
    if row is None:
        return 0.0, 0
    return (0.0 if row[0] is None else float(row[0])), (0 if row[1] is None else int(row[1]))


# -- the dashboard's read-only queries (rota.web.queries; docs/operations.md) ------------
# Each returns its rows as dicts keyed by column name.


async def dashboard_types(store: Store, *, conn: AnyConn | None = None
                          ) -> list[dict[str, Any]]:
    """``sql/dashboard_types.sql``: the job types that have jobs (``type``)."""
    return await store.fetch_dicts("dashboard_types", {}, conn=conn)


async def dashboard_published_types(store: Store, *, conn: AnyConn | None = None
                                    ) -> list[dict[str, Any]]:
    """``sql/dashboard_published_types.sql``: the types the SQL entry points accept
    (``types``; ``None``: any)."""
    return await store.fetch_dicts("dashboard_published_types", {}, conn=conn)


async def dashboard_status_counts(store: Store, *, types: Sequence[str], cap: int | None,
                                  offset: timedelta, conn: AnyConn | None = None
                                  ) -> list[dict[str, Any]]:
    """``sql/dashboard_status_counts.sql``: jobs per type and status (pending read up to
    ``cap``; ``None``: all)."""
    return await store.fetch_dicts("dashboard_status_counts", {
        "types": list(types), "cap": cap, "offset": offset}, conn=conn)


async def dashboard_throughput(store: Store, *, types: Sequence[str], failed_per_type: int,
                               offset: timedelta, conn: AnyConn | None = None
                               ) -> list[dict[str, Any]]:
    """``sql/dashboard_throughput.sql``: jobs done and failed per minute of the last
    hour (at most ``failed_per_type`` failures read per type)."""
    return await store.fetch_dicts("dashboard_throughput", {
        "types": list(types), "failed_per_type": failed_per_type, "offset": offset},
        conn=conn)


async def dashboard_waits(store: Store, *, types: Sequence[str], per_type: int,
                          offset: timedelta, conn: AnyConn | None = None
                          ) -> list[dict[str, Any]]:
    """``sql/dashboard_waits.sql``: waits from due to start per plan (``per_type`` jobs
    read per type)."""
    return await store.fetch_dicts("dashboard_waits", {
        "types": list(types), "per_type": per_type, "offset": offset}, conn=conn)


async def dashboard_groups_served(store: Store, *, types: Sequence[str], limit: int,
                                  offset: timedelta, conn: AnyConn | None = None
                                  ) -> list[dict[str, Any]]:
    """``sql/dashboard_groups_served.sql``: the groups with due work and what the fair
    claim counts for them, at most ``limit``."""
    return await store.fetch_dicts("dashboard_groups_served", {
        "types": list(types), "limit": limit, "offset": offset}, conn=conn)


async def dashboard_owners_served(store: Store, *, types: Sequence[str], limit: int,
                                  offset: timedelta, conn: AnyConn | None = None
                                  ) -> list[dict[str, Any]]:
    """``sql/dashboard_owners_served.sql``: as :func:`dashboard_groups_served`, per
    owner (``fair_by="owner"``)."""
    return await store.fetch_dicts("dashboard_owners_served", {
        "types": list(types), "limit": limit, "offset": offset}, conn=conn)


async def dashboard_owners_running(store: Store, *, offset: timedelta,
                                   stale_after: timedelta,
                                   conn: AnyConn | None = None) -> list[dict[str, Any]]:
    """``sql/dashboard_owners_running.sql``: each owner's running jobs with a fresh lock
    (every type): rows ``owner_id, own, plan, running`` (docs/design.md, "Caps")."""
    return await store.fetch_dicts("dashboard_owners_running", {
        "offset": offset, "stale_after": stale_after}, conn=conn)


async def dashboard_group_owners(store: Store, *, ids: Sequence[str],
                                 conn: AnyConn | None = None) -> list[dict[str, Any]]:
    """``sql/dashboard_group_owners.sql``: the owner of each group of ``ids``."""
    return await store.fetch_dicts("dashboard_group_owners", {"ids": list(ids)}, conn=conn)


async def dashboard_groups_paused(store: Store, *, types: Sequence[str], limit: int,
                                  conn: AnyConn | None = None) -> list[dict[str, Any]]:
    """``sql/dashboard_groups_paused.sql``: paused groups with work, at most ``limit``
    (each row carries the ``total``)."""
    return await store.fetch_dicts("dashboard_groups_paused", {
        "types": list(types), "limit": limit}, conn=conn)


async def dashboard_runs(store: Store, *, before_started: datetime | None,
                         before_id: uuid.UUID | None, limit: int, offset: timedelta,
                         conn: AnyConn | None = None) -> list[dict[str, Any]]:
    """``sql/dashboard_runs.sql``: runs, newest first, before ``(before_started,
    before_id)`` (a keyset page), at most ``limit``."""
    return await store.fetch_dicts("dashboard_runs", {
        "before_started": before_started, "before_id": before_id, "limit": limit,
        "offset": offset}, conn=conn)


async def dashboard_id_range(store: Store, *, conn: AnyConn | None = None
                             ) -> list[dict[str, Any]]:
    """``sql/dashboard_id_range.sql``: the lowest and highest job ids (``low``,
    ``high``)."""
    return await store.fetch_dicts("dashboard_id_range", {}, conn=conn)


async def dashboard_jobs(store: Store, *, before: int, low: int, type: str | None,
                         status: str | None, group_id: str | None,
                         run_id: uuid.UUID | None, limit: int,
                         conn: AnyConn | None = None) -> list[dict[str, Any]]:
    """``sql/dashboard_jobs.sql``: jobs among ids in ``[low, before)`` matching the
    filters (``None``: any), newest first, at most ``limit``."""
    return await store.fetch_dicts("dashboard_jobs", {
        "before": before, "low": low, "type": type, "status": status,
        "group_id": group_id, "run_id": run_id, "limit": limit}, conn=conn)


async def dashboard_run(store: Store, *, id: uuid.UUID, offset: timedelta,
                        conn: AnyConn | None = None) -> list[dict[str, Any]]:
    """``sql/dashboard_run.sql``: one run (no row: unknown)."""
    return await store.fetch_dicts("dashboard_run", {"id": id, "offset": offset},
                                   conn=conn)


async def dashboard_job(store: Store, *, id: int,
                        conn: AnyConn | None = None) -> list[dict[str, Any]]:
    """``sql/dashboard_job.sql``: one job (no row: unknown)."""
    return await store.fetch_dicts("dashboard_job", {"id": id}, conn=conn)


async def dashboard_quota_names(store: Store, *, offset: timedelta,
                                conn: AnyConn | None = None) -> list[dict[str, Any]]:
    """``sql/dashboard_quota_names.sql``: shared quotas with recent usage rows."""
    return await store.fetch_dicts("dashboard_quota_names", {"offset": offset}, conn=conn)


async def dashboard_quota_usage(store: Store, *, quotas: Sequence[str],
                                period_starts: Sequence[datetime],
                                conn: AnyConn | None = None) -> list[dict[str, Any]]:
    """``sql/dashboard_quota_usage.sql``: units used of each quota in its period
    (parallel arrays)."""
    return await store.fetch_dicts("dashboard_quota_usage", {
        "quotas": list(quotas), "period_starts": list(period_starts)}, conn=conn)


async def dashboard_allowance_usage(store: Store, *, quotas: Sequence[str],
                                    period_starts: Sequence[datetime],
                                    conn: AnyConn | None = None) -> list[dict[str, Any]]:
    """``sql/dashboard_allowance_usage.sql``: per allowance, the owners that spent, the
    units used and the most one owner used, in its period (parallel arrays)."""
    return await store.fetch_dicts("dashboard_allowance_usage", {
        "quotas": list(quotas), "period_starts": list(period_starts)}, conn=conn)


async def dashboard_metrics_finished(store: Store, *, types: Sequence[str],
                                     since: datetime, until: datetime,
                                     failed_per_type: int, conn: AnyConn | None = None
                                     ) -> list[dict[str, Any]]:
    """``sql/dashboard_metrics_finished.sql``: jobs finished in ``(since, until]`` per
    type, plan and status."""
    return await store.fetch_dicts("dashboard_metrics_finished", {
        "types": list(types), "since": since, "until": until,
        "failed_per_type": failed_per_type}, conn=conn)


async def dashboard_metrics_runs(store: Store, *, conn: AnyConn | None = None
                                 ) -> list[dict[str, Any]]:
    """``sql/dashboard_metrics_runs.sql``: finished runs by stop reason (``n``)."""
    return await store.fetch_dicts("dashboard_metrics_runs", {}, conn=conn)
