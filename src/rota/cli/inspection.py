"""The schema and the state of the queue: ``rota migrate``, ``rota schema``, ``rota runs``,
``rota depth`` and ``rota maintain``."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping

import click
import psycopg
from rich.table import Table

from .. import admin, db
from ..runner.source import pipeline_queue
from .app import CONNECT_TIMEOUT, load_pipeline, open_queue
from .errors import RotaCommand
from .options import WholeNumber, json_option, make_target, target_command, target_options
from .output import (
    add_row,
    age,
    cell,
    compact_table,
    console,
    emit_json,
    plan_label,
    short,
    summary_text,
    utc_time,
    with_progress,
)


@target_command
def migrate(database_url: str | None, schema: str | None, app_spec: str | None,
            as_json: bool) -> None:
    """Apply missing migrations (safe to run concurrently). With an app, then publish
    its queue settings (its stages' max_attempts included) for the SQL functions
    enqueue and enqueue_many, which then accept only the types its stages run or its
    queue declares."""
    target = make_target(database_url, schema, app_spec)

    async def go() -> list[int]:
        url = target.url()
        settings = target.settings()
        async with await psycopg.AsyncConnection.connect(
                url, autocommit=True, connect_timeout=CONNECT_TIMEOUT) as conn:
            applied = await with_progress(db.migrate(conn, settings.schema), "migrating")
        if target.app is not None:
            async with open_queue(target) as queue:
                # The pipeline's queue carries its stages' max_attempts.
                _, pipeline = await load_pipeline(target, queue)
                # And its stage types: SQL refuses a type no stage runs, as
                # `rota enqueue --app` does (docs/enqueue-from-sql.md, "Settings").
                types = {s.type for s in pipeline.stages} | set(queue.types or ())
                await pipeline_queue(pipeline, queue).publish_settings(types=types)
        return applied

    applied = asyncio.run(go())
    if as_json:
        emit_json({"applied": applied})
    else:
        click.echo(f"applied {applied}" if applied else "up to date")


@click.command(cls=RotaCommand)
@click.option("--schema", envvar="ROTA_SCHEMA", default="rota",
              help="Schema of rota's tables [env ROTA_SCHEMA; when neither is given: rota].")
def schema(schema: str) -> None:
    """Print the schema SQL for your own migration tool."""
    click.echo(db.schema_sql(schema), nl=False)


@click.command(cls=RotaCommand)
@target_options
@click.option("--limit", "-n", type=WholeNumber(1, admin.MAX_LIST_LIMIT), default=20,
              show_default=True)
@json_option
def runs(database_url: str | None, schema: str | None, app_spec: str | None,
         limit: int, as_json: bool) -> None:
    """The last runs with their stop reasons and summaries."""
    target = make_target(database_url, schema, app_spec)

    async def go() -> list[admin.RunRecord]:
        async with open_queue(target) as queue:
            return await admin.list_runs(queue, limit=limit)

    records = asyncio.run(go())
    if as_json:
        emit_json([{**dataclasses.asdict(r), "duration_seconds": (
            None if r.duration is None else round(r.duration.total_seconds(), 3))}
            for r in records])
        return
    # One table of figures (fits 80 columns), then one of what each run counted and its
    # error, which need the width.
    table = compact_table(f"runs ({len(records)} shown)")
    for col in ("run", "trigger", "started (UTC)", "secs", "stop reason", "done",
                "failed", "deferred", "units"):
        table.add_column(col, no_wrap=True, justify="right" if col in (
            "secs", "done", "failed", "deferred", "units") else "left")
    notes = compact_table()
    notes.add_column("run", no_wrap=True)
    notes.add_column("summary / error", overflow="fold")
    for r in records:
        reason = r.stop_reason or "unfinished"
        style = "red" if reason == "error" else ("yellow" if reason == "unfinished" else "")
        secs = "—" if r.duration is None else f"{r.duration.total_seconds():.1f}"
        started = utc_time(r.started_at)[5:]  # runs are kept 30 days: no year needed
        add_row(table, str(r.id)[:8], r.trigger, started, secs, cell(reason, style),
                r.jobs_done, r.jobs_failed, r.jobs_deferred, r.quota_units)
        note = summary_text(r.summary)
        if r.error:
            error = f"error: {short(r.error)}"
            note = f"{note}; {error}" if note else error
        if note:
            add_row(notes, str(r.id)[:8], note)
    out = console()
    out.print(table)
    if notes.row_count:
        out.print()
        out.print(notes)


@target_command
def maintain(database_url: str | None, schema: str | None, app_spec: str | None,
             as_json: bool) -> None:
    """Fail stuck jobs (running their give-up hooks), mark killed runs, prune old done
    jobs. With --app, the app's give-up hooks run too."""
    from ..maintenance import maintain as run_maintenance
    from ..settings import DEFAULT_PLATFORM_TIMEOUT

    target = make_target(database_url, schema, app_spec)

    async def go() -> Mapping[str, int]:
        async with open_queue(target) as queue:
            platform_timeout = DEFAULT_PLATFORM_TIMEOUT
            if target.app is not None:
                # The pipeline's queue runs the app's give-up hooks.
                _, pipeline = await load_pipeline(target, queue)
                platform_timeout = getattr(pipeline, "platform_timeout", platform_timeout)
                queue = pipeline_queue(pipeline, queue)
            return await with_progress(
                run_maintenance(queue, platform_timeout=platform_timeout), "maintenance")

    counters = dict(asyncio.run(go()))
    if as_json:
        emit_json(counters)
        return
    table = Table(title="maintenance")
    table.add_column("task")
    table.add_column("count", justify="right")
    for key, value in counters.items():
        add_row(table, key, value)
    console().print(table)


@target_command
def depth(database_url: str | None, schema: str | None, app_spec: str | None,
          as_json: bool) -> None:
    """Queue depth per stage (job type) and plan: due, scheduled, paused, running."""
    target = make_target(database_url, schema, app_spec)

    async def go() -> tuple[list[admin.DepthRow], list[str]]:
        async with open_queue(target) as queue:
            order: list[str] = []
            if target.app is not None:
                _, pipeline = await load_pipeline(target, queue)
                order = [s.type for s in getattr(pipeline, "stages", ())]
            return await admin.depth(queue), order

    rows, order = asyncio.run(go())
    rank = {t: i for i, t in enumerate(order)}
    rows.sort(key=lambda r: (rank.get(r.type, len(rank)), r.type, -r.priority, r.plan or ""))
    plans = target.plans()
    names = {r.plan: plans[r.plan].name if r.plan is not None and r.plan in plans
             else r.plan for r in rows}
    if as_json:
        emit_json([{
            "type": r.type, "plan": r.plan, "due": r.due, "scheduled": r.scheduled,
            "paused": r.paused, "running": r.running,
            "oldest_due_seconds": (None if r.oldest_due_age is None
                                   else r.oldest_due_age.total_seconds()),
            "priority": r.priority, "plan_name": names[r.plan],
        } for r in rows])
        return
    table = Table(title="queue depth")
    for col in ("stage", "plan", "priority", "due", "scheduled", "paused", "running",
                "oldest due"):
        table.add_column(col, justify="left" if col in ("stage", "plan") else "right")
    for r in rows:
        add_row(table, r.type, plan_label(plans, r.plan), r.priority, r.due, r.scheduled,
                r.paused, r.running, age(r.oldest_due_age))
    totals = [sum(getattr(r, key) for r in rows)
              for key in ("due", "scheduled", "paused", "running")]
    add_row(table, "total", "", "", *totals, "", style="bold")
    console().print(table)
