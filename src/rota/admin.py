"""Admin operations: create or update a group, list jobs, retry and cancel one, list
runs, queue depth.

These are what ``rota groups``, ``rota jobs``, ``rota runs`` and ``rota depth`` call, so a
program can do the same without the CLI. Each takes the :class:`rota.Queue` first (which
binds them as its methods) and runs its statements (:mod:`rota.statements`) on ``conn``
when given (inside the caller's transaction,
which decides when it commits) or else on a pooled connection.

Times are timezone-aware UTC instants on the queue's clock (the database's ``now()``
plus the queue's ``clock_offset``); durations are ``timedelta``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Protocol, get_args

import psycopg
from psycopg.pq import TransactionStatus

from . import statements as sql
from .checks import INT_MAX, require_aware, require_row_id, require_text
from .db import migrations
from .errors import ConfigError, InvalidInput, InvalidTransition, JobNotFound, UnreadableJob
from .job import Job, JobStatus, no_give_up_hook
from .results import JobResult, result
from .store import AnyConn, Store

if TYPE_CHECKING:
    from .plans import Plans


class AdminQueue(Protocol):
    """What the admin operations use of a :class:`rota.Queue` (which binds them as its
    methods: ``queue.list_jobs(...)``); typed by this protocol so that this module need
    not import the queue's, which imports this one."""

    @property
    def store(self) -> Store: ...
    @property
    def schema(self) -> str: ...
    @property
    def plans(self) -> Plans: ...
    @property
    def clock_offset(self) -> timedelta: ...
    @property
    def stale_after(self) -> timedelta: ...
    @property
    def external_groups(self) -> bool: ...
    def connection(self, conn: AnyConn | None = None
                   ) -> AbstractAsyncContextManager[AnyConn]: ...

#: The most rows one call of :func:`list_jobs` or :func:`list_runs` returns: a page is
#: read into memory whole (listing 1,000,000 jobs at once took 23 s and 3 GB).
MAX_LIST_LIMIT = 1000

JOB_STATUSES: tuple[str, ...] = get_args(JobStatus)

#: The largest cap of a group's own running jobs (``max_running``): what the groups
#: table's integer column holds (its check asks only for more than 0).
MAX_GROUP_RUNNING = INT_MAX

_ZERO_UUID = uuid.UUID(int=0)  # sorts before every run id: "before this instant" only


@dataclass(frozen=True)
class JobPage:
    """One page of :func:`list_jobs`, newest job first.

    Attributes:
        jobs: the jobs, by id descending.
        next_before_id: the cursor of the next page (pass it as ``before_id``), or
            ``None`` when this page is the last.
        group_plans: the plan id of each listed job's group, by group id; ``None`` for a
            group with no owner, or one the groups relation does not contain.
        unreadable: the rows of this page that could not be turned into a job (a value
            that cannot be loaded), by id descending, each naming the job and what
            could not be read; the rest of the page is listed as usual
            (docs/design.md, "Bad data belongs to its job").
    """

    jobs: list[Job]
    next_before_id: int | None
    group_plans: Mapping[str, str | None]
    unreadable: list[UnreadableJob] = field(default_factory=list)


@dataclass(frozen=True)
class RetryResult:
    """What :func:`retry_job` did.

    Attributes:
        job: the job as it is now: pending, due now, attempts and deferrals 0.
        give_up_hook_cancelled: the job's give-up hook was still owed and is not any
            more (the job has not given up; if it fails again, the hook is owed again).
    """

    job: Job
    give_up_hook_cancelled: bool


@dataclass(frozen=True)
class RunRecord:
    """One row of ``runs``: a pipeline run, its stop reason and counters.

    Attributes:
        id: the run's id (jobs it claimed carry it as ``run_id``).
        trigger: ``cron``, ``cli``, ``worker`` or ``manual``.
        stop_reason: why it stopped (``no_work``, ``time_budget``, ``quota_reserve``,
            ``quota_exhausted``, ``error``), ``None`` while unfinished (or killed,
            until maintenance marks it).
        jobs_done, jobs_failed, jobs_deferred: jobs the run finished each way.
        quota_units: allowance units the run spent.
        summary: the run's counters (``ctx.count``), by name.
        error: the error that stopped it, when ``stop_reason`` is ``error``.
        started_at, finished_at: UTC; ``finished_at`` is ``None`` while unfinished.
    """

    id: uuid.UUID
    trigger: str
    stop_reason: str | None
    jobs_done: int
    jobs_failed: int
    jobs_deferred: int
    quota_units: int
    summary: Mapping[str, Any]
    error: str | None
    started_at: datetime
    finished_at: datetime | None

    @property
    def duration(self) -> timedelta | None:
        """How long the run took; ``None`` while unfinished."""
        return None if self.finished_at is None else self.finished_at - self.started_at


@dataclass(frozen=True)
class DepthRow:
    """Open jobs of one type and plan (see :func:`depth`).

    Attributes:
        type: the job type (a pipeline's stage).
        plan: the plan id of the jobs' groups; ``None`` for jobs with no group or in a
            group with no owner.
        priority: the priority the claim ranks these jobs at (no plan: the middle
            plan's; a plan id the queue's plans do not know: the lowest plan's).
        due: pending jobs a claim could take now (due, group not paused).
        scheduled: pending jobs waiting for their ``run_after`` (backoff, deferral).
        paused: pending jobs in paused groups.
        running: claimed jobs.
        oldest_due_age: how long the longest-waiting due job has been due (since its
            ``run_after``, or since it was created if that is later); ``None`` when none
            is due.
    """

    type: str
    plan: str | None
    priority: int
    due: int
    scheduled: int
    paused: int
    running: int
    oldest_due_age: timedelta | None


async def upsert_group(
    queue: AdminQueue,
    group_id: str | uuid.UUID,
    *,
    plan: str | None,
    active: bool = True,
    owner_id: str | uuid.UUID | None = None,
    max_running: int | None = None,
    conn: AnyConn | None = None,
) -> None:
    """Create or update a group in rota's own groups table, every field as given. Takes
    effect at the next claim; queued jobs are not rewritten.

    Args:
        group_id: text or UUID.
        plan: a plan id from the queue's plans, or ``None`` for a group with no owner
            (ranked as the middle plan).
        active: ``False`` pauses the group: its jobs are not claimable.
        owner_id: the owner whose per-owner allowances (quotas) the group's jobs
            spend; ``None`` for none.
        max_running: at most this many of the group's jobs (every type) running at once
            with a fresh lock, across every worker; ``None`` for no cap
            (docs/design.md, "Caps").

    Raises:
        UnknownPlan: ``plan`` is not in the queue's plans.
        InvalidInput: ``max_running`` is not ``None`` or an int from 1 to
            :data:`MAX_GROUP_RUNNING`.
        ConfigError: the queue reads groups from an application relation instead.
    """
    _require_own_groups(queue)
    gid = require_text(group_id, "group_id")
    assert gid is not None
    await _write_group(queue, gid, owner_id=_checked_owner(owner_id),
                       plan=_checked_plan(queue, plan), active=_checked_active(active),
                       max_running=_checked_max_running(max_running), conn=conn)


def _checked_owner(owner_id: str | uuid.UUID | None) -> str | None:
    return require_text(owner_id, "owner_id", allow_none=True)


def _checked_plan(queue: AdminQueue, plan: str | None) -> str | None:
    if plan is not None:
        queue.plans[plan]
    return plan


def _checked_active(active: bool) -> bool:
    if not isinstance(active, bool):
        raise InvalidInput("active must be a bool", argument="active")
    return active


def _checked_max_running(max_running: int | None) -> int | None:
    if max_running is not None and (not isinstance(max_running, int)
                                    or isinstance(max_running, bool)
                                    or not 1 <= max_running <= MAX_GROUP_RUNNING):
        raise InvalidInput(f"max_running must be None or an int from 1 to "
                           f"{MAX_GROUP_RUNNING:,}, got {max_running!r}",
                           argument="max_running")
    return max_running


def _require_own_groups(queue: AdminQueue) -> None:
    if queue.external_groups:
        raise ConfigError(
            "this queue reads groups from the application's relation "
            f"{queue.store.groups_ident.as_string(None)}; change plan and status there"
        )


async def _write_group(queue: AdminQueue, group_id: str, *, owner_id: str | None,
                       plan: str | None, active: bool, max_running: int | None,
                       conn: AnyConn | None) -> None:
    """Write a group's row of rota's own groups table as given (checked by the
    caller)."""
    async with queue.connection(conn) as c:
        await sql.upsert_group(queue.store, group_id=group_id, owner_id=owner_id,
                               plan=plan, active=active, max_running=max_running, conn=c)


async def list_jobs(
    queue: AdminQueue,
    *,
    status: str | None = None,
    type: str | None = None,
    group_id: str | uuid.UUID | None = None,
    job_id: int | None = None,
    before_id: int | None = None,
    limit: int = 50,
    conn: AnyConn | None = None,
) -> JobPage:
    """A page of jobs, newest first (by id), with the filters given (``None``: any).

    Pages are keyset-paginated: pass a page's ``next_before_id`` as ``before_id`` to get
    the next one. Pages never repeat or skip a job, even while jobs are enqueued (new
    jobs have higher ids, so they appear only on a first page).

    Args:
        status: ``pending``, ``running``, ``done`` or ``failed``.
        type: a job type.
        group_id: a group id.
        job_id: one job's id.
        before_id: only jobs with a smaller id (the cursor).
        limit: the most jobs on the page, 1 to :data:`MAX_LIST_LIMIT`.
        conn: the caller's connection.

    Returns:
        A :class:`JobPage`: the jobs (with their payloads) and the next page's cursor;
        rows that cannot be read are named in its ``unreadable``.

    Raises:
        InvalidInput: an unknown status, an empty or over-long type or group id, an id
            that is not a positive int, or a limit outside 1 to ``MAX_LIST_LIMIT``.
    """
    if status is not None and status not in JOB_STATUSES:
        raise InvalidInput(f"status must be one of {', '.join(JOB_STATUSES)}; got {status!r}",
                           argument="status")
    checked_type = require_text(type, "type", allow_none=True)
    checked_group = require_text(group_id, "group_id", allow_none=True)
    checked_id = None if job_id is None else require_row_id(job_id, "job_id")
    before = None if before_id is None else require_row_id(before_id, "before_id")
    async with queue.connection(conn) as c:
        rows = await sql.list_jobs(
            queue.store, status=status, type=checked_type, group_id=checked_group,
            job_id=checked_id, before_id=before,
            limit=_limit(limit) + 1,  # one more: is there another page?
            conn=c)
    rows, more = rows[:limit], len(rows) > limit
    jobs: list[Job] = []
    unreadable: list[UnreadableJob] = []
    for r in rows:
        try:
            jobs.append(Job.from_row(r))
        except UnreadableJob as exc:
            unreadable.append(exc)
    return JobPage(
        jobs=jobs,
        next_before_id=rows[-1]["id"] if more else None,
        group_plans={r["group_id"]: r["plan"] for r in rows if r["group_id"] is not None},
        unreadable=unreadable,
    )


async def retry_job(queue: AdminQueue, job_id: int, *, conn: AnyConn | None = None) -> RetryResult:
    """Put a failed job back to pending, due now, with attempts and deferrals reset, as if
    newly enqueued (its ``last_error`` stays as history). A give-up hook still owed for
    it is cancelled: the job has not given up any more. Sleeping workers are woken.

    Args:
        job_id: the job.
        conn: the caller's connection (the retry holds iff its transaction commits).

    Returns:
        A :class:`RetryResult`: the job as it is now, and whether an owed give-up hook
        was cancelled.

    Raises:
        JobNotFound: no job has this id.
        InvalidTransition: the job is not failed (the message says what it is), or
            another open job holds its dedupe key (retry it once that one is done).
        InvalidInput: ``job_id`` is not a positive int.
    """
    job_id = require_row_id(job_id, "job_id")
    async with queue.connection(conn) as c:
        try:
            async with _savepoint(c):
                row = await sql.retry_job(queue.store, id=job_id,
                                          offset=queue.clock_offset, channel=queue.schema,
                                          conn=c)
        except psycopg.errors.UniqueViolation:  # an open duplicate appeared meanwhile
            row = None
        if row is not None:
            # Written: the answer must not fail now (docs/design.md, "Bad data belongs to its job").
            return RetryResult(Job.from_row(row, lenient=True), bool(row["hook_cancelled"]))
        if c.info.transaction_status == TransactionStatus.INERROR:  # cannot read it back
            raise InvalidTransition(f"job {job_id}: another open job holds its dedupe key",
                                    job_id=job_id, status="failed")
        job = await _lenient_job(queue, job_id, c)
    if job is None:
        raise JobNotFound(job_id)
    if job.status != "failed":
        raise InvalidTransition(
            f"job {job_id} is {job.status}; only a failed job can be retried",
            job_id=job_id, status=job.status)
    raise InvalidTransition(
        f"job {job_id}: another open job holds dedupe key {job.dedupe_key!r}",
        job_id=job_id, status=job.status)


async def show_job(queue: AdminQueue, job_id: int, *,
                   conn: AnyConn | None = None) -> JobResult:
    """One job with its return value and every failed attempt's error, message and
    traceback (``rota jobs show ID``; docs/design.md, "Results"). The same as
    ``queue.result(job_id)``.

    Raises:
        JobNotFound: no job has this id.
        InvalidInput: ``job_id`` is not a positive int.
    """
    return await result(queue, require_row_id(job_id, "job_id"), conn=conn)


async def cancel_job(queue: AdminQueue, job_id: int, *, conn: AnyConn | None = None) -> Job:
    """Cancel a pending job: it ends failed, with ``last_error`` ``'cancelled'``. It has
    given up like any failed job, so its give-up hook is owed: run it now with
    ``pipeline.queue.run_give_up_hooks([job.id])`` (after the cancel commits; the
    pipeline's queue has its stages' hooks), or maintenance runs it later. A running
    job cannot be cancelled: it belongs to the run that claimed it.

    Args:
        job_id: the job.
        conn: the caller's connection (the cancel holds iff its transaction commits).

    Returns:
        The job as it is now (``failed``, ``give_up_pending`` true).

    Raises:
        JobNotFound: no job has this id.
        InvalidTransition: the job is not pending (the message says what it is).
        InvalidInput: ``job_id`` is not a positive int.
    """
    job_id = require_row_id(job_id, "job_id")
    async with queue.connection(conn) as c:
        row = await sql.cancel_job(queue.store, id=job_id, offset=queue.clock_offset,
                                   schema_name=queue.schema, conn=c)
        if row is not None:
            return Job.from_row(row, lenient=True)  # written: the answer must not fail
        job = await _lenient_job(queue, job_id, c)
    if job is None:
        raise JobNotFound(job_id)
    raise InvalidTransition(f"job {job_id} is {job.status}; only a pending job can be cancelled",
                            job_id=job_id, status=job.status)


async def list_runs(
    queue: AdminQueue,
    *,
    limit: int = 20,
    before: datetime | RunRecord | None = None,
    conn: AnyConn | None = None,
) -> list[RunRecord]:
    """The last runs, newest first (by start time, then id).

    Args:
        limit: the most runs returned, 1 to :data:`MAX_LIST_LIMIT`.
        before: an aware datetime: only runs started before it; or the last
            :class:`RunRecord` of the previous page: only runs after it in this order
            (pages then never repeat or skip a run).
        conn: the caller's connection.

    Returns:
        The runs, at most ``limit``.

    Raises:
        InvalidInput: ``limit`` out of range, or ``before`` neither an aware datetime nor
            a :class:`RunRecord`.
        NaiveDatetimeError: ``before`` has no time zone.
    """
    before_at: datetime | None
    if isinstance(before, RunRecord):
        before_at, before_id = before.started_at, before.id
    else:
        before_at = None if before is None else require_aware(before, "before")
        before_id = _ZERO_UUID
    page = _limit(limit)
    async with queue.connection(conn) as c:
        rows = await sql.list_runs(queue.store, before_at=before_at, before_id=before_id,
                                   limit=page, conn=c)
    return [RunRecord(**row) for row in rows]


async def depth(queue: AdminQueue, *, conn: AnyConn | None = None) -> list[DepthRow]:
    """Open jobs (pending and running) per type and plan, as the claim would serve them.

    Reads only the pending and running jobs (their partial indexes), never the done and
    failed history.

    Args:
        conn: the caller's connection.

    Returns:
        One :class:`DepthRow` per type and plan that has open jobs, ordered by type, then
        priority (highest first), then plan id.
    """
    async with queue.connection(conn) as c:
        rows = await sql.queue_depth(queue.store, offset=queue.clock_offset, conn=c)
    out = [DepthRow(
        type=r["type"], plan=r["plan"], priority=_claim_priority(queue.plans, r["plan"]),
        due=r["due"], scheduled=r["scheduled"], paused=r["paused"], running=r["running"],
        oldest_due_age=(None if r["oldest_due_seconds"] is None
                        else timedelta(seconds=r["oldest_due_seconds"])),
    ) for r in rows]
    out.sort(key=lambda d: (d.type, -d.priority, d.plan or ""))
    return out


async def missing_migrations(queue: AdminQueue, *, conn: AnyConn | None = None) -> list[int]:
    """The packaged migrations not yet applied to the queue's schema (``rota migrate``
    applies them). Long-running modes check this at start, rather than retry failing
    queries forever.

    Returns:
        Their versions, ascending; empty when the schema is up to date.

    Raises:
        psycopg.errors.UndefinedTable: the schema has no migrations at all.
    """
    async with queue.connection(conn) as c:
        applied = await sql.applied_migrations(queue.store, conn=c)
    return sorted({version for version, _, _ in migrations()} - applied)


async def _lenient_job(queue: AdminQueue, job_id: int, conn: AnyConn) -> Job | None:
    """One job as it is, values that cannot be loaded left as ``Unreadable`` (for an
    admin action's error message, which only needs its status and dedupe key)."""
    row = await sql.get_job(queue.store, id=job_id, conn=conn)
    return None if row is None else Job.from_row(row, lenient=True)


def _claim_priority(plans: Plans, plan_id: str | None) -> int:
    # As the claim ranks (fair/claim.sql): no plan ranks as the middle plan, an unknown
    # plan id as the lowest.
    if plan_id is None:
        return plans.middle.priority
    return plans[plan_id].priority if plan_id in plans else plans.lowest.priority


def _savepoint(conn: AnyConn) -> AbstractAsyncContextManager[Any]:
    """A savepoint inside the caller's open transaction, so a refused statement leaves it
    usable; nothing on an autocommit connection, where the statement is its own."""
    if conn.info.transaction_status == TransactionStatus.INTRANS:
        return conn.transaction()
    return nullcontext()


def _limit(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"limit must be an int, got {type(value).__name__}",
                           argument="limit")
    if not 1 <= value <= MAX_LIST_LIMIT:
        raise InvalidInput(f"limit must be between 1 and {MAX_LIST_LIMIT}, got {value}",
                           argument="limit")
    return value


@dataclass(frozen=True)
class GroupRow:
    """A group as the claim reads it (docs/design.md, "Groups and plans").

    Attributes:
        group_id: the group's id.
        owner_id: whose plan and allowances apply; ``None`` for none.
        plan: a plan id (``None``: no owner, ranked as the middle plan).
        active: ``False`` when paused (its jobs are not claimable).
        served: the cost charged to it in the served window, all types summed: its
            running jobs at their expected cost and its done jobs at what they were
            charged (docs/design.md, "Cost"), as the fair claim's bookkeeping holds it
            (the edge's correction, about the last second's completions, aside).
        running: its jobs running now with a fresh lock, every type.
        owner_running: its owner's (every group of the owner on its plan; a group
            without an owner is its own), what the plan's ``max_running`` caps
            (docs/design.md, "Caps").
        max_running: the group's own cap of its running jobs (every type), ``None`` for
            none; always ``None`` for an application's groups relation.
    """

    group_id: str
    owner_id: str | None
    plan: str | None
    active: bool
    served: Decimal = Decimal(0)
    running: int = 0
    owner_running: int = 0
    max_running: int | None = None


#: ``set_group``'s default for a field left out: keep what the group has.
KEEP: Any = object()


#: A new group's fields that :func:`set_group` is not given.
_NEW_GROUP: dict[str, Any] = {"owner_id": None, "plan": None, "active": True,
                              "max_running": None}

#: :func:`set_group`'s check of each field given (the queue's plans for ``plan``).
_SET_GROUP_CHECKS: dict[str, Callable[[AdminQueue, Any], Any]] = {
    "owner_id": lambda _, v: _checked_owner(v),
    "plan": _checked_plan,
    "active": lambda _, v: _checked_active(v),
    "max_running": lambda _, v: _checked_max_running(v),
}


async def set_group(queue: AdminQueue, group_id: str, *, owner_id: str | None = KEEP,
                    plan: str | None = KEEP, active: bool = KEEP,
                    max_running: int | None = KEEP) -> tuple[GroupRow, bool]:
    """Create a group, or change the fields given of an existing one (the others stay):
    one transaction, the row locked while it is read and written. A new group gets
    ``plan=None``, ``owner_id=None``, ``active=True`` and ``max_running=None`` for what
    is left out. Only the values given are checked: a group whose stored plan is not
    among the queue's plans (one since removed, or another app's) can still be paused,
    given an owner or a cap, its plan kept as it is.

    Args:
        group_id: the group's id.
        owner_id, plan, active, max_running: the new values (:data:`KEEP`:
            unchanged); ``None`` clears the owner, the plan or the cap.

    Returns:
        The group as written, and whether it was created.

    Raises:
        UnknownPlan: ``plan`` (given) is not in the queue's plans.
        ConfigError: the queue reads groups from an application relation.
        InvalidInput: an id that is not text, or a bad ``max_running``.
    """
    _require_own_groups(queue)
    gid = require_text(group_id, "group_id")
    assert gid is not None
    given = {"owner_id": owner_id, "plan": plan, "active": active,
             "max_running": max_running}
    # Only what is given is checked: a plan kept is written back as it is, known to
    # this queue's plans or not (the claim ranks an unknown plan id as the lowest).
    changes = {name: _SET_GROUP_CHECKS[name](queue, value)
               for name, value in given.items() if value is not KEEP}
    async with queue.connection() as c, c.transaction():
        old = await sql.group_get(queue.store, group_id=gid, conn=c)
        row = GroupRow(**{**_NEW_GROUP, **(old or {}), **changes, "group_id": gid})
        await _write_group(queue, gid, owner_id=row.owner_id, plan=row.plan,
                           active=row.active, max_running=row.max_running, conn=c)
    return row, old is None


async def list_groups(queue: AdminQueue, *, limit: int = 50, after: str | None = None,
                      conn: AnyConn | None = None) -> list[GroupRow]:
    """Groups in ``group_id`` order, from rota's groups table or the application's
    groups relation (whichever the queue reads).

    Args:
        limit: the most groups returned, 1 to :data:`MAX_LIST_LIMIT`.
        after: only groups whose id sorts after it (the last id of the previous page).
        conn: the caller's connection.

    Raises:
        InvalidInput: ``limit`` out of range.
    """
    # The fair package's statement: it reads the served costs from the bookkeeping.
    params = {"limit": _limit(limit), "after": require_text(after, "after", allow_none=True),
              "offset": queue.clock_offset, "stale_after": queue.stale_after}
    async with queue.connection(conn) as c:
        rows = await queue.store.fetch_dicts("fair/list_groups", params, conn=c)
    return [GroupRow(**row) for row in rows]


def summary_items(summary: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """A run's counters as ``rota runs`` and the dashboard show them: sorted by name,
    a float to at most two decimals (``rate_waited_s`` ``7.88``, not
    ``7.8759999999999994``), and a maintenance counter only when it is not zero (a
    worker's maintenance run holds six, mostly zero; ``--json`` has them all)."""
    return [(k, _counter(v)) for k, v in sorted((summary or {}).items())
            if not (k.startswith("maintenance.") and v == 0)]


def _counter(value: object) -> str:
    if isinstance(value, float):
        text = f"{value:.2f}".rstrip("0").rstrip(".")
        return "0" if text == "-0" else text
    return str(value)


def give_up_hook_state(job_type: str, status: str, give_up_pending: bool,
                       hooks: Mapping[str, object]) -> str:
    """What a job's give-up hook did, as ``rota jobs`` and the dashboard both say it
    (docs/design.md, "Give-up hooks"): one answer for every view.

    Args:
        job_type, status, give_up_pending: the job's columns.
        hooks: the give-up hooks of the process asking, by job type
            (``pipeline.queue.give_up_hooks``: the app's, its stages' included; empty
            without an app).

    Returns:
        ``owed`` (failed, its hook not yet run), ``ran`` (given up, and its type has a
        hook: a give-up is only recorded as handled once the hook has committed),
        ``none`` (given up; its type has no hook), ``not owed`` (given up, handled, and
        this process does not know the type's hooks: pass ``--app``), or ``—`` (it has
        not given up).
    """
    if give_up_pending:
        return "owed"
    if status != "failed":
        return "—"
    hook = hooks.get(job_type)
    if hook is None:
        return "not owed"
    return "none" if hook is no_give_up_hook else "ran"


__all__ = [
    "JOB_STATUSES",
    "KEEP",
    "MAX_LIST_LIMIT",
    "DepthRow",
    "GroupRow",
    "JobPage",
    "RetryResult",
    "RunRecord",
    "cancel_job",
    "depth",
    "give_up_hook_state",
    "list_groups",
    "list_jobs",
    "list_runs",
    "missing_migrations",
    "retry_job",
    "set_group",
    "show_job",
    "summary_items",
]
