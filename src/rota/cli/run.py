"""Running the pipeline: ``rota run`` (once, within a budget), ``rota worker`` (back to
back, until a signal) and ``rota serve`` (the cron endpoint under uvicorn)."""

from __future__ import annotations

import asyncio
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
    check_budget,
    load_pipeline,
    open_queue,
    require_migrated,
    run_async,
)
from .options import POSITIVE_SECONDS, json_option, make_target, target_options
from .output import (
    add_row,
    console,
    emit_json,
    log_to_stderr,
    safe_text,
    summary_text,
    with_progress,
)


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


@click.command()
@target_options
@click.option("--budget", type=POSITIVE_SECONDS, default=220.0, show_default=True,
              metavar="SECONDS",
              help="Time budget: no new batch is claimed after it. Must be shorter than "
                   "the app's platform timeout (300 s unless the app says otherwise).")
@json_option
def run(database_url: str | None, schema: str | None, app_spec: str | None,
        budget: float, as_json: bool) -> None:
    """Run the pipeline once within the budget (for a CronJob or a systemd timer).

    The run ends before the app's platform timeout whatever its handlers do (each is
    cancelled at its deadline). Exits 1 when the run stopped with `error`; 2 when it
    could not start (bad app or budget, database unreachable)."""
    target = make_target(database_url, schema, app_spec)
    target.require_app()

    async def go() -> Any:
        async with open_queue(target) as queue:
            _, pipeline = await load_pipeline(target, queue)
            check_budget(pipeline, budget)
            return await with_progress(
                pipeline.run(trigger="cli", time_budget=timedelta(seconds=budget)),
                "running the pipeline", budget)

    result = run_async(go())
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


@click.command()
@target_options
@click.option("--budget", type=POSITIVE_SECONDS, default=220.0, show_default=True,
              metavar="SECONDS", help="Each run's time budget (shorter than the app's "
                                      "platform timeout).")
@click.option("--idle-poll", type=POSITIVE_SECONDS, default=5.0, show_default=True,
              metavar="SECONDS", help="Longest sleep without asking the database.")
@click.option("--no-maintenance", is_flag=True,
              help="Do not run maintenance: neither the daily run nor the stuck-job "
                   "rescue every minute.")
def worker(database_url: str | None, schema: str | None, app_spec: str | None,
           budget: float, idle_poll: float, no_maintenance: bool) -> None:
    """Run the pipeline back to back; sleep until the next job is due, wake on enqueue.

    On SIGINT or SIGTERM the current run claims nothing more, lets the jobs in flight
    finish (each within its handler deadline, so within the platform timeout), hands
    its unstarted jobs back as they were, and the worker exits 0, starting no new run
    or maintenance. A second signal stops at once (exit 130): the current run's
    unstarted jobs are handed back, and its jobs in flight are failed (the claim
    already counted the attempt), so they are retried after their backoff, or give up
    if it was their last attempt.

    Between runs it fails stuck jobs every minute; full maintenance (killed runs,
    pruning) runs daily.

    Exits 2 at start, before looping, when the app or its settings are wrong, the
    budget is not below the app's platform timeout, the database is unreachable or its
    schema is not migrated."""
    from ..worker import Worker

    target = make_target(database_url, schema, app_spec)
    target.require_app()
    log_to_stderr()

    def report(result: Any) -> None:
        click.echo(safe_text(
            f"run {result.run_id} stopped {result.stop_reason}: "
            f"done={result.jobs_done} failed={result.jobs_failed} "
            f"deferred={result.jobs_deferred} units={result.quota_units}"))

    async def go() -> None:
        stop = asyncio.Event()
        main_task = asyncio.current_task()
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            if stop.is_set() and main_task is not None:
                main_task.cancel()
            else:
                click.echo("stopping after the current run (signal again to stop now)",
                           err=True)
                stop.set()

        # Installed first, so a signal during start-up is a stop request too.
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        async with open_queue(target) as queue:
            await require_migrated(queue)
            _, pipeline = await load_pipeline(target, queue)
            check_budget(pipeline, budget)
            w = Worker(pipeline, queue=queue, idle_poll=timedelta(seconds=idle_poll),
                       time_budget=timedelta(seconds=budget),
                       maintain_every=None if no_maintenance else timedelta(days=1),
                       rescue_every=None if no_maintenance else timedelta(minutes=1),
                       on_run=report)
            if stop.is_set():
                return
            click.echo(f"worker listening on schema {queue.schema!r}", err=True)
            await w.run_forever(stop)

    try:
        run_async(go())
    except asyncio.CancelledError:
        sys.exit(130)
    click.echo("worker stopped", err=True)


@click.command()
@target_options
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--budget", type=POSITIVE_SECONDS, default=220.0, show_default=True,
              metavar="SECONDS", help="Each cron run's time budget (shorter than the "
                                      "app's platform timeout).")
@click.option("--metrics", is_flag=True, help="Also serve GET /metrics (Prometheus; "
              "credential ROTA_DASHBOARD_SECRET, needed unless --host is loopback).")
def serve(database_url: str | None, schema: str | None, app_spec: str | None,
          host: str, port: int, budget: float, metrics: bool) -> None:
    """Serve GET /api/cron under uvicorn (the secret comes from CRON_SECRET).

    rota's own log lines (refused requests, run outcomes) go to stderr with uvicorn's.
    On SIGTERM it stops taking requests and exits once the run in flight has ended,
    which it does before the app's platform timeout.

    Exits 2 at start when the app or its settings are wrong, the budget is not below
    the app's platform timeout, the database is unreachable or its schema is not
    migrated."""
    import uvicorn

    from ..web import cron_app, usable_secret

    target = make_target(database_url, schema, app_spec)
    target.require_app()
    url = target.url()
    queue = Queue(url, **target.queue_settings())

    async def check() -> tuple[Any, Any]:
        async with await psycopg.AsyncConnection.connect(
                url, autocommit=True, connect_timeout=CONNECT_TIMEOUT) as conn:
            await require_migrated(queue, conn)
        # A factory is called once here, so a broken one is refused now rather than
        # on every cron request.
        made, pipeline = await load_pipeline(target, queue)
        check_budget(pipeline, budget)
        return made, pipeline

    made, pipeline = asyncio.run(check())
    log_to_stderr()
    secret = os.environ.get("CRON_SECRET")
    if usable_secret(secret) is None:
        click.echo("warning: CRON_SECRET is not set: /api/cron will refuse every request",
                   err=True)
    app = cron_app(made, secret=secret, time_budget=timedelta(seconds=budget), queue=queue)
    if metrics:
        from ..web.metrics import mount_metrics
        mount_metrics(app, queue, pipeline=made, host=host,
                      secret=os.environ.get("ROTA_DASHBOARD_SECRET"))
    platform_timeout = getattr(pipeline, "platform_timeout", DEFAULT_PLATFORM_TIMEOUT)
    # A run in flight ends before its platform timeout; uvicorn waits no longer for it.
    uvicorn.run(app, host=host, port=port, log_level="info",
                timeout_graceful_shutdown=max(1, int(platform_timeout.total_seconds())))
