"""Running the pipeline: ``rota run`` (once, within a budget), ``rota worker`` (back to
back, until a signal) and ``rota serve`` (the cron endpoint under uvicorn)."""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import sys
from datetime import timedelta
from typing import Any

import click
import psycopg
from rich.table import Table

from ..queue import Queue
from ..runner.stage import HEALTHY_STOP_REASONS
from ..settings import DEFAULT_PLATFORM_TIMEOUT
from .app import (
    CONNECT_TIMEOUT,
    check_listen_url,
    load_pipeline,
    open_queue,
    require_migrated,
    resolve_budget,
    run_async,
)
from .errors import CliConfigError, RotaCommand
from .listening import listen_socket, warn_short_secret
from .options import POSITIVE_SECONDS, WholeNumber, json_option, make_target, target_options
from .output import (
    add_row,
    console,
    emit_json,
    log_to_stderr,
    summary_text,
    with_progress,
)
from .serving import serve_until_signal


def _run_row(result: Any) -> dict[str, Any]:
    return {
        "runId": str(result.run_id),
        "stopReason": result.stop_reason,
        "jobsDone": result.jobs_done,
        "jobsFailed": result.jobs_failed,
        "jobsDeferred": result.jobs_deferred,
        "units": result.quota_units,
        "summary": dict(result.summary or {}),
        "error": result.error,
    }


#: The exit status after a second SIGINT or SIGTERM stopped a run at once (128 + SIGINT,
#: the shell's convention for "interrupted"); a first signal lets the run end and exits 0.
EXIT_STOPPED_AT_ONCE = 130
#: The exit status when a stopping process had to end at its platform timeout without
#: settling (the database stopped answering).
EXIT_AT_PLATFORM_TIMEOUT = 1

#: ``--budget``'s help, shared by run, worker and serve.
BUDGET_HELP = ("Each run's time budget: no new batch is claimed after it. Must be "
               "shorter than the app's platform timeout; default 11/15 of it (220 s of "
               "the default 300 s, 44 s of 60 s).")


class StopOnSignals:
    """The first SIGINT or SIGTERM is a stop request (``stop`` is set and ``message``
    printed to stderr), the second a stop at once (the task that created this, the
    command's main task, is cancelled). Installed before anything else, so a signal
    during start-up is a stop request too (docs/design.md, "Handler deadlines").

    Once :meth:`bound` has been given the app's platform timeout, the process also
    ends by then after the first signal (unless its run is over: :meth:`disarm`;
    closing the queue is bounded on its own), whatever the database does: a run whose
    database stopped answering cannot settle, and is left to maintenance (its jobs go
    stale, its run is marked killed) rather than outliving the platform timeout
    (docs/operations.md, "A database that stops answering")."""

    def __init__(self, stop: asyncio.Event, message: str) -> None:
        self.stop = stop
        self.message = message
        self.main_task = asyncio.current_task()
        self.loop = asyncio.get_running_loop()
        self.signalled_at: float | None = None
        self.platform_timeout: float | None = None
        self.armed: asyncio.TimerHandle | None = None
        self.disarmed = False
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.loop.add_signal_handler(sig, self._on_signal)

    def bound(self, platform_timeout: timedelta) -> None:
        """End the process at ``platform_timeout`` after the first signal."""
        self.platform_timeout = platform_timeout.total_seconds()
        if self.signalled_at is not None:
            self._arm()

    def _on_signal(self) -> None:
        if self.stop.is_set() and self.main_task is not None:
            self.main_task.cancel()
            return
        click.echo(self.message, err=True)
        self.stop.set()
        if self.signalled_at is None:
            self.signalled_at = self.loop.time()
            if self.platform_timeout is not None:
                self._arm()

    def disarm(self) -> None:
        """The run is over (closing the queue is bounded on its own): no exit at the
        platform timeout any more."""
        self.disarmed = True
        if self.armed is not None:
            self.armed.cancel()

    def _arm(self) -> None:
        assert self.signalled_at is not None and self.platform_timeout is not None
        if self.disarmed:
            return
        self.armed = self.loop.call_at(
            self.signalled_at + exit_before(self.platform_timeout),
            _exit_at_platform_timeout)


def exit_before(platform_timeout: float) -> float:
    """Seconds after the first signal at which a process that has not ended exits:
    just before the platform timeout (a second of 300 s, 2.5 % of a short one), so
    the exit is ours, not a SIGKILL; a run that settles ends before it, since its
    hard deadline leaves a reserve (docs/design.md, "Handler deadlines")."""
    return platform_timeout - min(1.0, platform_timeout * 0.025)


def _exit_at_platform_timeout() -> None:
    """End the process now: it is about to outlive its platform timeout."""
    click.echo("error: the run could not settle within the platform timeout (the "
               "database does not answer): exiting; maintenance marks the run killed "
               "and its jobs are retried when their locks go stale", err=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_AT_PLATFORM_TIMEOUT)


def stop_arg(pipeline: Any, stop: asyncio.Event) -> dict[str, Any]:
    """``stop=`` for a pipeline whose ``run`` takes it (a :class:`rota.Pipeline` does);
    an app's own object may not."""
    if "stop" in inspect.signature(pipeline.run).parameters:
        return {"stop": stop}
    return {}


@click.command(cls=RotaCommand)
@target_options
@click.option("--budget", type=POSITIVE_SECONDS, default=None, metavar="SECONDS",
              help=BUDGET_HELP)
@json_option
def run(database_url: str | None, schema: str | None, app_spec: str | None,
        budget: float | None, as_json: bool) -> None:
    """Run the pipeline once within the budget (for a CronJob or a systemd timer).

    The run ends before the app's platform timeout whatever its handlers do (each is
    cancelled at its deadline). On SIGINT (Ctrl-C) or SIGTERM it claims nothing more,
    lets the jobs in flight finish (each within its handler deadline), hands its
    unstarted jobs back as they were, records the run as stopped `interrupted` and
    exits 0. A second signal stops at once (exit 130): the jobs in flight are handed
    back too, their attempt returned. Exits 1 when the run stopped with `error`; 2
    when it could not start (bad app or budget, database unreachable)."""
    target = make_target(database_url, schema, app_spec)
    target.require_app()

    async def go() -> Any:
        stop = asyncio.Event()
        signals = StopOnSignals(stop, "stopping: no more jobs are claimed; the jobs in "
                                      "flight finish (signal again to stop now)")
        async with open_queue(target) as queue:
            _, pipeline = await load_pipeline(target, queue)
            seconds = resolve_budget(pipeline, budget)
            signals.bound(getattr(pipeline, "platform_timeout", DEFAULT_PLATFORM_TIMEOUT))
            result = await with_progress(
                pipeline.run(trigger="cli", time_budget=timedelta(seconds=seconds),
                             **stop_arg(pipeline, stop)),
                "running the pipeline", seconds)
            signals.disarm()
            return result

    try:
        result = run_async(go())
    except asyncio.CancelledError:
        click.echo("stopped at once: the jobs in flight were handed back", err=True)
        sys.exit(EXIT_STOPPED_AT_ONCE)
    row = _run_row(result)
    if as_json:
        emit_json(row)
    else:
        table = Table(title="run", show_header=False)
        for key in ("runId", "stopReason", "jobsDone", "jobsFailed", "jobsDeferred", "units"):
            add_row(table, key, row[key])
        add_row(table, "summary", summary_text(row["summary"]))
        if row["error"]:
            add_row(table, "error", row["error"])
        console().print(table)
    if result.stop_reason not in HEALTHY_STOP_REASONS:
        sys.exit(1)


@click.command(cls=RotaCommand)
@target_options
@click.option("--budget", type=POSITIVE_SECONDS, default=None, metavar="SECONDS",
              help=BUDGET_HELP)
@click.option("--idle-poll", type=POSITIVE_SECONDS, default=5.0, show_default=True,
              metavar="SECONDS", help="Longest sleep without asking the database.")
@click.option("--no-maintenance", is_flag=True,
              help="Do not run maintenance: neither the daily run nor the stuck-job "
                   "rescue every minute.")
@click.option("--listen-url", envvar="ROTA_LISTEN_URL", metavar="URL", default=None,
              help="A direct connection to the same database for the worker's LISTEN, "
                   "when DATABASE_URL goes through a transaction pooler "
                   "[env ROTA_LISTEN_URL].")
def worker(database_url: str | None, schema: str | None, app_spec: str | None,
           budget: float | None, idle_poll: float, no_maintenance: bool,
           listen_url: str | None) -> None:
    """Run the pipeline back to back; sleep until the next job is due, wake on enqueue.

    On SIGINT or SIGTERM the current run claims nothing more, lets the jobs in flight
    finish (each within its handler deadline, so within the platform timeout), hands
    its unstarted jobs back as they were, records the run as stopped `interrupted`,
    and the worker exits 0, starting no new run or maintenance. A second signal stops
    at once (exit 130): the current run's jobs in flight are handed back too, their
    attempt returned, and run again by the next worker.

    Between runs it fails stuck jobs every minute, and marks a killed run (a SIGKILLed
    worker's) as soon as its last heartbeat is older than the stale window; full
    maintenance (pruning too) runs daily. Each run is logged once, to stderr.

    Behind a transaction pooler (PgBouncer), notifications do not reach the worker:
    give --listen-url a direct connection, or it polls every second (it says so once
    at start). ROTA_POOLED=1 says DATABASE_URL goes through a pooler (by default the
    first connection finds out).

    Exits 2 at start, before looping, when the app or its settings are wrong, the
    budget is not below the app's platform timeout, the database is unreachable or
    refuses the connection, its schema is not migrated, or notifications sent on it do
    not reach --listen-url."""
    from ..worker import Worker

    if listen_url is not None and not listen_url.strip():
        raise CliConfigError("--listen-url is empty: give a URL, or leave it out")
    target = make_target(database_url, schema, app_spec)
    target.listen_url = listen_url
    target.require_app()
    log_to_stderr()

    async def go() -> None:
        stop = asyncio.Event()
        signals = StopOnSignals(stop, "stopping after the current run (signal again to "
                                      "stop now)")
        async with open_queue(target) as queue:
            await require_migrated(queue)
            if queue.connections.listen_url is not None:
                await check_listen_url(queue)
            _, pipeline = await load_pipeline(target, queue)
            seconds = resolve_budget(pipeline, budget)
            signals.bound(getattr(pipeline, "platform_timeout", DEFAULT_PLATFORM_TIMEOUT))
            w = Worker(pipeline, queue=queue, idle_poll=timedelta(seconds=idle_poll),
                       time_budget=timedelta(seconds=seconds),
                       maintain_every=None if no_maintenance else timedelta(days=1),
                       rescue_every=None if no_maintenance else timedelta(minutes=1))
            if stop.is_set():
                return
            click.echo(f"worker listening on schema {queue.schema!r}", err=True)
            await w.run_forever(stop)
            signals.disarm()

    try:
        run_async(go())
    except asyncio.CancelledError:
        click.echo("worker stopped at once: the current run's jobs in flight were "
                   "handed back", err=True)
        sys.exit(EXIT_STOPPED_AT_ONCE)
    click.echo("worker stopped", err=True)


@click.command(cls=RotaCommand)
@target_options
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=WholeNumber(0, 65535), default=8000, show_default=True)
@click.option("--budget", type=POSITIVE_SECONDS, default=None, metavar="SECONDS",
              help=BUDGET_HELP)
@click.option("--metrics", is_flag=True, help="Also serve GET /metrics (Prometheus; "
              "credential ROTA_DASHBOARD_SECRET, needed unless --host is loopback).")
def serve(database_url: str | None, schema: str | None, app_spec: str | None,
          host: str, port: int, budget: float | None, metrics: bool) -> None:
    """Serve GET /api/cron under uvicorn (the secret comes from CRON_SECRET).

    rota's own log lines (refused requests, run outcomes) go to stderr with uvicorn's.
    On SIGINT or SIGTERM it stops taking requests; the run in flight claims nothing
    more, lets its jobs in flight finish, hands its unstarted jobs back and stops
    `interrupted`, before the app's platform timeout; then it exits 0. A second signal
    stops the run at once: the jobs in flight are handed back too, the request is
    answered 503, and it exits 0.

    Exits 2 at start when the app or its settings are wrong, the budget is not below
    the app's platform timeout, the database is unreachable or its schema is not
    migrated, or CRON_SECRET is not set (every request would be refused)."""
    from ..web import cron_app, usable_secret

    target = make_target(database_url, schema, app_spec)
    target.require_app()
    url = target.url()
    queue = Queue(url, **target.queue_kwargs())

    async def check() -> tuple[Any, Any, float]:
        async with await psycopg.AsyncConnection.connect(
                url, autocommit=True, connect_timeout=CONNECT_TIMEOUT) as conn:
            await require_migrated(queue, conn)
        # A factory is called once here, so a broken one is refused now rather than
        # on every cron request.
        made, pipeline = await load_pipeline(target, queue)
        return made, pipeline, resolve_budget(pipeline, budget)

    made, pipeline, seconds = asyncio.run(check())
    secret = os.environ.get("CRON_SECRET")
    if usable_secret(secret) is None:
        # It would answer 401 to every request: refused, as `rota dashboard` refuses to
        # start without its secret.
        raise CliConfigError(
            "CRON_SECRET is not set: /api/cron would refuse every request (make one with "
            "python -c 'import secrets; print(secrets.token_urlsafe(32))')")
    log_to_stderr()
    warn_short_secret("CRON_SECRET", usable_secret(secret))
    if metrics:
        warn_short_secret("ROTA_DASHBOARD_SECRET",
                          usable_secret(os.environ.get("ROTA_DASHBOARD_SECRET")))
    stop, stop_now = asyncio.Event(), asyncio.Event()
    app = cron_app(made, secret=secret, time_budget=timedelta(seconds=seconds), queue=queue,
                   stop=stop, stop_now=stop_now)
    if metrics:
        from ..web.metrics import mount_metrics
        mount_metrics(app, queue, pipeline=made, host=host,
                      secret=os.environ.get("ROTA_DASHBOARD_SECRET"))
    platform_timeout = getattr(pipeline, "platform_timeout", DEFAULT_PLATFORM_TIMEOUT)
    # A run in flight ends before its platform timeout; uvicorn waits no longer for it,
    # and the process ends just before it whatever the database does (as `rota run`).
    timeout_s = platform_timeout.total_seconds()
    serve_until_signal(app, host=host, port=port, sock=listen_socket(host, port),
                       graceful_seconds=timeout_s, on_stop=stop.set,
                       on_stop_now=stop_now.set,
                       exit_after=(exit_before(timeout_s), _exit_at_platform_timeout))
