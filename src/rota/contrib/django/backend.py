"""rota as a backend of Django's task framework (``django.tasks``, Django 6.0 and later;
docs/django.md).

A task is enqueued as a rota job on Django's own database connection, inside whatever
transaction Django has open there, so it exists if and only if that transaction commits
(docs/design.md, "Enqueue": the caller's connection decides). Its job type is its queue
name and priority band (:func:`job_type`), its payload the task's path and arguments,
its group whatever the task's ``group`` names (:class:`RotaTask`), so the fair claim,
plans and quotas apply to Django tasks as to any job. Results are read from the job row
(:func:`rota.results.result`).
"""

from __future__ import annotations

import copy
import difflib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, transaction
from django.tasks import TaskResult, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TASK_REFRESH_ATTRS, Task, TaskError
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils import timezone
from django.utils.module_loading import import_string

from ...db import migrations
from ...errors import InvalidInput, JobNotFound, UnknownGroup
from ...job import Job
from ...results import JobResult
from ...settings import SETTING_NAMES
from ...sync import SyncQueue

#: Django's priority (-100..100) picks one of three job types per queue name: the
#: worker's pipeline lists them high first, and a pipeline's earlier stages win, so a
#: task of a higher band always runs before a lower one's; inside a band tasks run in
#: rota's fair order (plan, least-served group, oldest), not by the exact number
#: (docs/django.md, "Priority").
HIGH_SUFFIX = ":high"
LOW_SUFFIX = ":low"

#: OPTIONS keys the backend reads (anything else is refused, so a typo is not ignored).
OPTION_KEYS = frozenset({"DATABASE", "SCHEMA", "GROUPS", "QUEUE", "WORKER"})
#: QUEUE keys: the queue's settings but those OPTIONS sets (SCHEMA, GROUPS).
QUEUE_KEYS = tuple(name for name in SETTING_NAMES if name not in ("schema", "groups"))


def unknown_keys(unknown: Sequence[str]) -> str:
    """``unknown`` QUEUE keys said for a settings file: each with the key closest to it,
    or the OPTIONS key that sets it (``schema``, ``groups``), then every QUEUE key when
    one has neither."""
    parts = []
    for key in unknown:
        close = difflib.get_close_matches(key, QUEUE_KEYS, n=1)
        parts.append(f"{key!r} (set OPTIONS[{key.upper()!r}] instead)"
                     if key in ("schema", "groups") else
                     f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
    listed = all(p.endswith(")") for p in parts)
    return ", ".join(parts) + ("" if listed else f"; its keys are {', '.join(QUEUE_KEYS)}")
#: WORKER keys (docs/django.md, "Settings"): counts, and durations in seconds.
WORKER_COUNTS = frozenset({"concurrency", "batch"})
WORKER_SECONDS = frozenset({"time_budget", "platform_timeout", "handler_timeout",
                            "heartbeat_every"})
GROUPS_KEYS = frozenset({"MODEL", "GROUP_ID", "PLAN", "ACTIVE", "OWNER_ID", "VIEW"})

_STATUS = {"pending": TaskResultStatus.READY, "running": TaskResultStatus.RUNNING,
           "done": TaskResultStatus.SUCCESSFUL, "failed": TaskResultStatus.FAILED}


def job_type(queue_name: str, priority: int) -> str:
    """The rota job type of a task on ``queue_name`` with Django ``priority``:
    ``QUEUE:high`` for 1..100, ``QUEUE`` for 0, ``QUEUE:low`` for -100..-1."""
    if priority > 0:
        return queue_name + HIGH_SUFFIX
    if priority < 0:
        return queue_name + LOW_SUFFIX
    return queue_name


def job_types(queue_name: str) -> list[str]:
    """A queue's three job types, high band first (the worker's stage order)."""
    return [queue_name + HIGH_SUFFIX, queue_name, queue_name + LOW_SUFFIX]


@dataclass(frozen=True, slots=True, kw_only=True)
class RotaTask(Task):  # type: ignore[misc]
    """The backend's task class: Django's :class:`~django.tasks.Task` plus what rota
    adds, given to ``@task(...)`` (Django 6.1 passes a backend's task options through).

    Attributes:
        group: the group each enqueued job runs for (docs/design.md, "The fair claim"):
            the name of one of the task's arguments (``group="tenant_id"``: that
            argument's value, as text), or a callable taking the task's arguments and
            returning the group id (``None``: no group); ``None`` for no group.
        max_attempts: attempts before the task ends FAILED (default: the queue's
            ``max_attempts``); failed attempts are retried with rota's backoff.
    """

    group: str | Callable[..., Any] | None = None
    max_attempts: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RotaTaskResult(TaskResult):  # type: ignore[misc]
    """Django's :class:`~django.tasks.TaskResult` plus why a ``READY`` task waits.

    Attributes:
        waiting: ``None``, or for a ``READY`` task of a paused group (its ``ACTIVE``
            field is false: docs/django.md, "Groups from a Django model") why it
            waits, its status staying ``READY``.
    """

    waiting: str | None = None

    def refresh(self) -> None:
        """Read the job row again (Django's attributes, and ``waiting``)."""
        self._copy(self.task.get_backend().get_result(self.id))

    async def arefresh(self) -> None:
        """:meth:`refresh` from async code."""
        self._copy(await self.task.get_backend().aget_result(self.id))

    def _copy(self, fresh: TaskResult) -> None:
        for name in (*TASK_REFRESH_ATTRS, "waiting"):
            object.__setattr__(self, name, getattr(fresh, name, None))


@dataclass(frozen=True)
class BackendConfig:
    """The backend's validated OPTIONS.

    Attributes:
        database: the Django database alias jobs are enqueued on (``DATABASE``,
            default ``"default"``); it must be PostgreSQL (psycopg 3).
        schema: rota's schema (``SCHEMA``, default ``"rota"``).
        groups: ``GROUPS``: ``{"MODEL": "app.Model", "GROUP_ID": field, "PLAN": field,
            "ACTIVE": field, "OWNER_ID": field, "VIEW": name}`` (only ``MODEL`` and
            ``GROUP_ID`` required): ``rota_migrate`` creates the view ``VIEW``
            (default ``rota_groups``) over the model's table, which rota reads as its
            groups relation; ``None``: rota's own groups table.
        queue: ``QUEUE``: more :class:`rota.Queue` settings (``plans``,
            ``max_attempts``, ``backoff_base``, …).
        worker: ``WORKER``: ``concurrency``, ``batch``, and in seconds
            ``time_budget``, ``platform_timeout``, ``handler_timeout`` and
            ``heartbeat_every`` for ``rota_worker`` (rota's :class:`rota.Pipeline`
            settings; docs/design.md, "Handler deadlines"); the stale window is the
            queue's ``stale_after`` (``QUEUE``), longer than ``platform_timeout``.
    """

    database: str
    schema: str
    groups: Mapping[str, str | None] | None
    queue: Mapping[str, Any]
    worker: Mapping[str, Any]

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> BackendConfig:
        unknown = set(options) - OPTION_KEYS
        if unknown:
            raise ImproperlyConfigured(
                f"rota: unknown TASKS OPTIONS {sorted(unknown)}; known: {sorted(OPTION_KEYS)}")
        groups = options.get("GROUPS")
        if groups is not None:
            bad = set(groups) - GROUPS_KEYS
            if bad or "MODEL" not in groups or "GROUP_ID" not in groups:
                raise ImproperlyConfigured(
                    "rota: OPTIONS['GROUPS'] needs MODEL and GROUP_ID (and may name PLAN, "
                    f"ACTIVE, OWNER_ID, VIEW); got {sorted(groups)}")
        worker = dict(options.get("WORKER", {}))
        unknown = set(worker) - WORKER_COUNTS - WORKER_SECONDS
        if unknown:
            raise ImproperlyConfigured(
                f"rota: unknown OPTIONS['WORKER'] keys {sorted(unknown)}; known: "
                f"{sorted(WORKER_COUNTS | WORKER_SECONDS)}")
        for key, value in worker.items():
            if value is None and key == "batch":
                continue
            kind = int if key in WORKER_COUNTS else (int, float)
            if isinstance(value, bool) or not isinstance(value, kind) or not value > 0:
                what = "a whole number" if key in WORKER_COUNTS else "a number of seconds"
                raise ImproperlyConfigured(
                    f"rota: OPTIONS['WORKER'][{key!r}] must be {what} above 0, got "
                    f"{value!r}")
        return cls(database=options.get("DATABASE", "default"),
                   schema=options.get("SCHEMA", "rota"), groups=groups,
                   queue=dict(options.get("QUEUE", {})), worker=worker)

    def seconds(self, key: str) -> timedelta | None:
        """A ``WORKER`` duration (``time_budget``, ``platform_timeout``, …), or None."""
        value = self.worker.get(key)
        return None if value is None else timedelta(seconds=float(value))

    @property
    def groups_view(self) -> str | None:
        """The groups relation rota reads (the view ``rota_migrate`` makes), or None."""
        if self.groups is None:
            return None
        return self.groups.get("VIEW") or "rota_groups"

    def queue_settings(self) -> dict[str, Any]:
        """Keyword arguments for :class:`rota.Queue` and :class:`rota.SyncQueue`."""
        return {**self.queue, "schema": self.schema, "groups": self.groups_view}


class RotaBackend(BaseTaskBackend):  # type: ignore[misc]
    """A ``django.tasks`` backend that enqueues rota jobs (docs/django.md)::

        TASKS = {"default": {"BACKEND": "rota.contrib.django.RotaBackend",
                             "QUEUES": ["default", "emails"],
                             "OPTIONS": {"SCHEMA": "rota"}}}

    Supports ``run_after`` (defer), priority (three bands: :func:`job_type`), async
    tasks, ``get_result``/``aget_result`` and ``refresh()``, and the task options of
    :class:`RotaTask` (``group``, ``max_attempts``).

    Raises:
        ImproperlyConfigured: an unknown option, or (when used) a database alias that
            is not PostgreSQL through psycopg 3.
    """

    task_class = RotaTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: Mapping[str, Any]) -> None:
        super().__init__(alias, params)
        self.config = BackendConfig.from_options(self.options)
        unknown = sorted(str(key) for key in self.config.queue if key not in QUEUE_KEYS)
        if unknown:  # said in the settings' own terms, not SyncQueue's
            raise ImproperlyConfigured(
                f"rota: TASKS[{alias!r}]['OPTIONS']['QUEUE'] has unknown keys: "
                + unknown_keys(unknown))
        try:
            self.sync_queue = SyncQueue(**self.config.queue_settings())
        except (InvalidInput, TypeError) as exc:  # a bad value
            raise ImproperlyConfigured(
                f"rota: TASKS[{alias!r}]['OPTIONS'] (SCHEMA, QUEUE): {exc}") from None

    # -- the connection ------------------------------------------------------------------

    def database(self) -> Any:
        """Django's database wrapper for the configured alias, checked to be PostgreSQL
        through psycopg 3 (without connecting: safe in async code).

        Raises:
            ImproperlyConfigured: it is not.
        """
        wrapper = connections[self.config.database]
        if wrapper.vendor != "postgresql":
            raise ImproperlyConfigured(
                f"rota's task backend needs a PostgreSQL database: DATABASES"
                f"[{self.config.database!r}] is {wrapper.vendor} (set OPTIONS['DATABASE'] "
                f"to a PostgreSQL alias)")
        from django.db.backends.postgresql.psycopg_any import is_psycopg3

        if not is_psycopg3:
            raise ImproperlyConfigured(
                "rota's task backend needs psycopg 3 (Django's PostgreSQL backend is "
                "using psycopg2); pip install 'psycopg[binary]'")
        return wrapper

    def connection(self) -> psycopg.Connection[Any]:
        """Django's own psycopg connection for the configured alias (opened if needed),
        in whatever transaction Django has open on it.

        Raises:
            ImproperlyConfigured: the alias is not PostgreSQL, or not psycopg 3.
        """
        wrapper = self.database()
        wrapper.ensure_connection()
        raw = wrapper.connection
        if not isinstance(raw, psycopg.Connection):
            raise ImproperlyConfigured(
                "rota's task backend needs psycopg 3 (Django's PostgreSQL backend is "
                f"using {type(raw).__module__}); pip install 'psycopg[binary]'")
        return raw

    # -- system checks -------------------------------------------------------------------

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """Django's system checks of this backend (``manage.py check``; Django runs them
        before every command): its database is PostgreSQL through psycopg 3
        (``rota.E001``), without connecting. That rota's schema is migrated is a
        database check (:func:`schema_check`)."""
        try:
            self.database()
        except ImproperlyConfigured as exc:
            return [checks.Error(str(exc), obj=f"TASKS[{self.alias!r}]", id="rota.E001",
                                 hint="Point OPTIONS['DATABASE'] at a PostgreSQL alias.")]
        return []

    def missing_migrations(self) -> list[int] | None:
        """rota's migrations not applied to the backend's schema (on Django's
        connection), ascending; ``None`` when the schema has none at all.

        Raises:
            ImproperlyConfigured: the database is not PostgreSQL through psycopg 3.
            psycopg.Error: the database could not be read.
        """
        conn = self.connection()
        statement = self.sync_queue.statements.sql("applied_migrations")
        with conn.cursor() as cur:
            found = cur.execute("SELECT to_regclass(%s) IS NOT NULL", [
                f'"{self.config.schema}".rota_migrations']).fetchone()
            if not found or not found[0]:
                return None
            applied = {row[0] for row in cur.execute(statement).fetchall()}
        return sorted({m.version for m in migrations()} - applied)

    # -- enqueue -------------------------------------------------------------------------

    def enqueue(self, task: Task, args: Sequence[Any],
                kwargs: Mapping[str, Any]) -> TaskResult:
        """Enqueue ``task`` as one rota job on Django's connection: inside
        ``transaction.atomic()`` it commits or rolls back with the block.

        Raises:
            InvalidTask: the task is not valid for this backend (Django's checks).
            rota.PayloadError: the arguments are not JSON as payloads are.
            rota.UnknownGroup: the group is not in the groups relation.
        """
        self.validate_task(task)
        run_after = task.run_after
        if run_after is not None and timezone.is_naive(run_after):
            run_after = timezone.make_aware(run_after)  # USE_TZ = False: local time
        payload = {"task": task.module_path, "args": list(args), "kwargs": dict(kwargs),
                   "queue_name": task.queue_name, "priority": task.priority}
        if run_after is not None:
            payload["run_after"] = run_after.isoformat()
        group_id = group_of(task, args, kwargs)
        try:
            job = self.sync_queue.enqueue(
                self.connection(), job_type(task.queue_name, task.priority), payload,
                group_id=group_id, run_after=run_after,
                max_attempts=getattr(task, "max_attempts", None))
        except UnknownGroup as exc:
            groups = self.config.groups
            if groups is None:
                raise
            # The hint names the model: rota's groups are its rows here.
            raise UnknownGroup(
                f"unknown group {group_id!r}: no {groups['MODEL']} has "
                f"{groups['GROUP_ID']}={group_id!r} (rota's groups are {groups['MODEL']} "
                f"rows: OPTIONS['GROUPS']); create it first, or enqueue without a "
                f"group") from exc
        assert job is not None  # no dedupe key: never a duplicate
        result = RotaTaskResult(
            task=task, id=str(job.id), status=TaskResultStatus.READY,
            enqueued_at=job.created_at, started_at=None, last_attempted_at=None,
            finished_at=None, args=list(args), kwargs=dict(kwargs), backend=self.alias,
            errors=[], worker_ids=[])
        # Django's signal says the task exists: sent once the enqueue commits (at once
        # in autocommit), never for one rolled back with its transaction.
        transaction.on_commit(lambda: task_enqueued.send(type(self), task_result=result),
                              using=self.config.database)
        return result

    def validate_task(self, task: Task) -> None:
        """Django's checks, then the group option's (:func:`check_group_option`)."""
        super().validate_task(task)
        check_group_option(task)

    # -- results -------------------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult:
        """The task's result from its job row (status, times, return value, every
        attempt's error with its traceback, the runs that ran it).

        Raises:
            TaskResultDoesNotExist: no job has this id (or it was pruned).
        """
        try:
            job_id = int(result_id)
        except (TypeError, ValueError):
            raise TaskResultDoesNotExist(result_id) from None
        if not 1 <= job_id < 2**63:
            raise TaskResultDoesNotExist(result_id)
        try:
            found = self.sync_queue.result(self.connection(), job_id)
        except JobNotFound:
            raise TaskResultDoesNotExist(result_id) from None
        return task_result(found, self.alias, self.config.groups)


def check_group_option(task: Task) -> None:
    """A task's ``group`` option names an argument of its function, or is callable.

    Raises:
        InvalidTask: it is neither.
    """
    group = getattr(task, "group", None)
    if isinstance(group, str):
        params = inspect.signature(task.func).parameters
        if group not in params:
            raise InvalidTask(f"group={group!r} is not an argument of "
                              f"{task.module_path} (its arguments: {list(params)})")
    elif group is not None and not callable(group):
        raise InvalidTask(f"group must be an argument name or a callable, got {group!r}")


def group_of(task: Task, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
    """The group a call of ``task`` runs for (see :class:`RotaTask`), as text."""
    group = getattr(task, "group", None)
    if group is None:
        return None
    if callable(group):
        value = group(*args, **kwargs)
    else:
        sig = inspect.signature(task.func)
        call_args = [None, *args] if task.takes_context else list(args)
        bound = sig.bind_partial(*call_args, **kwargs)
        bound.apply_defaults()
        value = bound.arguments.get(group)
    return None if value is None else str(value)


def task_result(found: JobResult, alias: str,
                groups: Mapping[str, str | None] | None = None) -> RotaTaskResult:
    """A Django :class:`~django.tasks.TaskResult` from a rota job's result: its task as
    enqueued (queue name, priority, ``run_after``, even once that queue is no longer in
    ``QUEUES``), each attempt's error and worker (``host:pid``), ``started_at`` the
    first attempt's claim and ``last_attempted_at`` the latest's, and why a ``READY``
    task of a paused group waits (``waiting``; ``groups``: the backend's ``GROUPS``).

    Raises:
        TaskResultDoesNotExist: the job is not a Django task (rota's own job type), or
            its task can no longer be imported.
    """
    job = found.job
    payload = job.payload
    path = payload.get("task") if isinstance(payload, dict) else None
    if not isinstance(path, str):
        raise TaskResultDoesNotExist(f"job {job.id} is not a Django task")
    try:
        task = import_string(path)
    except ImportError as exc:
        raise TaskResultDoesNotExist(f"job {job.id}: its task {path!r} cannot be imported "
                                     f"({exc})") from None
    if not isinstance(task, Task):
        raise TaskResultDoesNotExist(f"job {job.id}: {path!r} is not a Django task")
    band_queue, band = queue_and_priority(job)
    # As enqueued, without Django's validation of today's settings: a queue removed
    # from QUEUES since still names its tasks' results.
    task = copy.copy(task)
    run_after = payload.get("run_after")
    for name, value in (("queue_name", payload.get("queue_name", band_queue)),
                        ("priority", payload.get("priority", band)),
                        ("run_after", None if run_after is None
                         else datetime.fromisoformat(run_after))):
        object.__setattr__(task, name, value)
    starts = [e.started_at for e in found.errors if e.started_at is not None]
    last_attempt = found.started_at
    if job.status == "pending" and found.errors:
        last_attempt = found.errors[-1].started_at
    waiting = None
    if job.status == "pending" and found.group_active is False:
        field = f"{groups['MODEL']}.{groups.get('ACTIVE')}" if groups else "active"
        waiting = (f"paused: its group {job.group_id!r} is not active ({field} is false); "
                   f"it runs once the group is active again")
    result = RotaTaskResult(
        waiting=waiting,
        task=task, id=str(job.id), status=_STATUS[job.status], enqueued_at=job.created_at,
        started_at=starts[0] if starts else found.started_at,
        last_attempted_at=last_attempt, finished_at=job.finished_at,
        args=payload.get("args", []), kwargs=payload.get("kwargs", {}), backend=alias,
        errors=[TaskError(exception_class_path=e.error_type or "builtins.Exception",
                          traceback=e.traceback or e.error) for e in found.errors],
        worker_ids=worker_ids(found))
    if job.status == "done":
        object.__setattr__(result, "_return_value", found.value)
    return result


def worker_ids(found: JobResult) -> list[str]:
    """One entry per attempt (Django counts attempts as ``len(worker_ids)``): the
    worker (``host:pid``) of each failed attempt, then the one holding or having
    completed the job; a run's id when its row was pruned; ``"unknown"`` for an attempt
    with neither (its process died and nothing recorded it)."""
    job = found.job
    ids = [e.worker or (str(e.run_id) if e.run_id else "unknown") for e in found.errors]
    if job.status in ("running", "done") and job.run_id is not None:
        ids.append(found.worker or str(job.run_id))
    missing = job.attempts - len(ids)
    return ["unknown"] * missing + ids if missing > 0 else ids


def queue_and_priority(job: Job) -> tuple[str, int]:
    """A job's Django queue name and priority band (1, 0 or -1) from its type."""
    if job.type.endswith(HIGH_SUFFIX):
        return job.type.removesuffix(HIGH_SUFFIX), 1
    if job.type.endswith(LOW_SUFFIX):
        return job.type.removesuffix(LOW_SUFFIX), -1
    return job.type, 0


def schema_check(app_configs: Any = None, databases: Any = None,
                 **kwargs: Any) -> list[checks.CheckMessage]:
    """Django's database check (``manage.py check --database default``, the test
    runner, ``migrate``) that each rota backend's schema is migrated: a warning
    (``rota.W001``), not an error, because ``migrate`` runs it before it has applied
    rota's schema itself (``post_migrate``: docs/django.md, "Settings")."""
    from django.tasks import task_backends

    found: list[checks.CheckMessage] = []
    for b in task_backends.all():
        if not isinstance(b, RotaBackend) or not databases \
                or b.config.database not in databases or b.check():
            continue
        try:
            missing = b.missing_migrations()
        except psycopg.Error as exc:
            found.append(checks.Warning(
                f"rota: cannot read schema {b.config.schema!r}: {str(exc).strip()}",
                obj=f"TASKS[{b.alias!r}]", id="rota.W002"))
            continue
        if missing is None or missing:
            what = "is missing" if missing is None else f"lacks migrations {missing}"
            found.append(checks.Warning(
                f"rota: schema {b.config.schema!r} {what}",
                hint="Run `python manage.py migrate` (it applies rota's schema too) or "
                     "`python manage.py rota_migrate`.",
                obj=f"TASKS[{b.alias!r}]", id="rota.W001"))
    return found
