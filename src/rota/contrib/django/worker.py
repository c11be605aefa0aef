"""Running Django tasks with rota's runner (``python manage.py rota_worker``;
docs/django.md): a pipeline with three stages per queue name (its priority bands, high
first: earlier stages win), whose handler imports the task and calls it, returning its
value as the job's result (docs/design.md, "Results")."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterable
from datetime import timedelta
from inspect import iscoroutinefunction
from traceback import format_exception
from typing import Any

from django.db import connections
from django.tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
from django.tasks.base import TaskError
from django.tasks.signals import task_finished, task_started
from django.utils import timezone
from django.utils.json import normalize_json
from django.utils.module_loading import import_string
from psycopg.conninfo import make_conninfo

from ...job import DeferJob
from ...queue import Queue
from ...quota import QuotaExhausted
from ...rates import RateLimited
from ...results import EncodedResult, ResultError, encode_result
from ...runner import JobContext, Pipeline, Stage
from ...runner.recording import worker_id
from ...settings import default_time_budget
from ...worker import Worker
from .backend import RotaBackend, job_types, task_result

#: The keys of Django's connection parameters that are not libpq's.
_NOT_LIBPQ = frozenset({"cursor_factory", "context", "pool", "server_side_binding",
                        "assume_role", "isolation_level", "prepare_threshold"})


def backend(alias: str = "default") -> RotaBackend:
    """The ``TASKS[alias]`` backend, checked to be rota's.

    Raises:
        TypeError: that backend is not :class:`RotaBackend`.
    """
    found = task_backends[alias]
    if not isinstance(found, RotaBackend):
        raise TypeError(f"TASKS[{alias!r}] is {type(found).__name__}, not rota's "
                        f"RotaBackend")
    return found


def rota_backends() -> list[RotaBackend]:
    """Every ``TASKS`` backend that is rota's."""
    return [b for b in task_backends.all() if isinstance(b, RotaBackend)]


def conninfo(b: RotaBackend) -> str:
    """A libpq connection string for the backend's Django database (its NAME, USER,
    PASSWORD, HOST, PORT and libpq OPTIONS, such as ``options`` and ``sslmode``)."""
    wrapper = b.database()  # refuses a database that is not PostgreSQL, psycopg 3
    params = {k: v for k, v in wrapper.get_connection_params().items()
              if k not in _NOT_LIBPQ and isinstance(v, str | int)}
    return make_conninfo("", **params)


def make_queue(b: RotaBackend, **overrides: Any) -> Queue:
    """A :class:`rota.Queue` on the backend's database and schema, with its settings
    (``OPTIONS['QUEUE']``, the groups view); ``overrides`` win (tests pass
    ``clock_offset``)."""
    offset = overrides.pop("clock_offset", None)
    queue = Queue(conninfo(b), **{**b.config.queue_settings(), **overrides})
    if offset is not None:
        queue.clock_offset = offset
    return queue


async def run_task(ctx: JobContext) -> Any:
    """The handler of every Django task: import it, call it with its arguments (a
    :class:`~django.tasks.TaskContext` first when it ``takes_context``, whose
    ``task_result`` has this attempt's number, every earlier attempt's error and each
    attempt's worker, ``host:pid``), and return its value, JSON-normalized as Django's
    own backends do. A sync task runs in a thread of its own, which rota never cuts
    (docs/django.md, "Sync tasks"), its Django connections closed when it returns.
    Django's ``task_started`` is sent for each attempt, ``task_finished`` when the task
    ends (SUCCESSFUL, or FAILED with no attempt left), not for an attempt that will be
    retried."""
    payload = ctx.job.payload
    task = import_string(payload["task"])
    args = list(payload.get("args", []))
    kwargs = dict(payload.get("kwargs", {}))
    if ctx.job.attempts > 1:  # the earlier attempts' errors and workers, as stored
        result = task_result(await ctx.queue.result(ctx.job.id), task.backend)
        object.__setattr__(result, "status", TaskResultStatus.RUNNING)
    else:
        result = TaskResult(
            task=task, id=str(ctx.job.id), status=TaskResultStatus.RUNNING,
            enqueued_at=ctx.job.created_at, started_at=ctx.job.locked_at,
            last_attempted_at=ctx.job.locked_at, finished_at=None, args=args,
            kwargs=kwargs, backend=task.backend, errors=[], worker_ids=[worker_id()])
    if task.takes_context:
        args = [TaskContext(task_result=result), *args]
    await task_started.asend(sender=RotaBackend, task_result=result)
    try:
        if iscoroutinefunction(task.func):
            returned = await task.func(*args, **kwargs)
        else:
            # A thread of its own, which rota never cuts: the job stays this worker's
            # until it returns (docs/design.md, "Handler deadlines").
            returned = await ctx.to_thread(_call_sync, task.func, args, kwargs)
    except Exception as exc:
        # Retried with backoff while attempts are left (a DeferJob or a quota's reset
        # is no failure): task_finished only when the task ends.
        if (ctx.job.attempts >= ctx.job.max_attempts
                and not isinstance(exc, DeferJob | QuotaExhausted | RateLimited)):
            await _finished_failed(result, exc)
        raise
    try:
        value, encoded = _storable(returned, ctx.queue.max_payload_bytes)
    except ResultError as exc:
        # A value that cannot be stored fails the task for good, as a handler's does
        # (docs/design.md, "Results"): it would not fit on a retry either.
        await _finished_failed(result, exc)
        await ctx.fail(exc, give_up=True)
        return None
    object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
    object.__setattr__(result, "finished_at", timezone.now())
    object.__setattr__(result, "_return_value", value)
    await task_finished.asend(sender=RotaBackend, task_result=result)
    return encoded


def _storable(returned: Any, max_bytes: int) -> tuple[Any, EncodedResult | None]:
    """A task's return value JSON-normalized as Django's own backends do, and as the
    job's result will store it.

    Raises:
        ResultError: it is not JSON (a set, an object) or too large to store.
    """
    try:
        value = normalize_json(returned)
    except (TypeError, ValueError) as exc:
        raise ResultError(f"the return value is not JSON-serializable: {exc}") from None
    return value, encode_result(value, max_bytes)


async def _finished_failed(result: TaskResult, exc: BaseException) -> None:
    """Record ``exc`` as this attempt's error on ``result`` and send ``task_finished``."""
    object.__setattr__(result, "status", TaskResultStatus.FAILED)
    object.__setattr__(result, "finished_at", timezone.now())
    result.errors.append(TaskError(
        exception_class_path=f"{type(exc).__module__}.{type(exc).__qualname__}",
        traceback="".join(format_exception(exc))))
    await task_finished.asend(sender=RotaBackend, task_result=result)


def _call_sync(func: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """A sync task's call in its own thread, which ends with it: Django's connections
    of that thread are closed when it returns."""
    try:
        return func(*args, **kwargs)
    finally:
        connections.close_all()


def make_pipeline(b: RotaBackend, queue: Queue, *, queue_names: Iterable[str] | None = None,
                  concurrency: int | None = None, batch: int | None = None) -> Pipeline:
    """The pipeline that runs the backend's tasks: for each queue name (default: the
    backend's ``QUEUES``) its three priority bands, high first.

    Args:
        concurrency: tasks of one stage run at once (default ``WORKER['concurrency']``
            or 4).
        batch: jobs claimed at once (default ``WORKER['batch']``, else the runner sizes
            it).
    """
    names = sorted(queue_names if queue_names is not None else b.queues)
    conc = concurrency or int(b.config.worker.get("concurrency", 4))
    size = batch if batch is not None else b.config.worker.get("batch")
    stages = [Stage(t, size, conc, run_task) for name in names for t in job_types(name)]
    # rota's own defaults (300 s, half of it, a third of it) when not set: one place.
    timing: dict[str, Any] = {
        k: v for k in ("platform_timeout", "handler_timeout", "heartbeat_every")
        if (v := b.config.seconds(k)) is not None}
    return Pipeline(queue, stages, **timing)


async def run_worker(b: RotaBackend, *, queue_names: Iterable[str] | None = None,
                     concurrency: int | None = None, batch: int | None = None,
                     once: bool = False, clock_offset: timedelta | None = None,
                     time_budget: timedelta | None = None) -> None:
    """Run the backend's tasks: with ``once``, one run until no work is left (or the
    budget ends); otherwise a :class:`rota.Worker` (LISTEN/NOTIFY, time budgets, stop
    reasons, maintenance). Either way, on SIGTERM or SIGINT the run in flight claims
    nothing more, finishes its jobs and is recorded ``interrupted``; a second signal
    stops at once, handing the jobs in flight back (this coroutine is then cancelled:
    :class:`asyncio.CancelledError`)."""
    extra = {} if clock_offset is None else {"clock_offset": clock_offset}
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()

    def on_signal() -> None:
        if stop.is_set() and main is not None:
            main.cancel()  # a second signal: stop now
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    async with make_queue(b, **extra) as queue:
        pipeline = make_pipeline(b, queue, queue_names=queue_names,
                                 concurrency=concurrency, batch=batch)
        budget = (time_budget or b.config.seconds("time_budget")
                  or default_time_budget(pipeline.platform_timeout))
        if once:
            await pipeline.run(trigger="cli", time_budget=budget, stop=stop)
            return
        await Worker(pipeline, time_budget=budget).run_forever(stop)
