"""Periodic schedules: ``rota schedules`` lists each of the app's schedules with its last
and next tick (docs/operations.md, "Periodic schedules")."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from rich.table import Table

from ..schedule import Scheduler, ScheduleStatus
from .app import load_pipeline, open_queue
from .errors import CliConfigError
from .options import make_target, target_command
from .output import add_row, cell, console, emit_json, utc_time


@target_command
def schedules(database_url: str | None, schema: str | None, app_spec: str | None,
              as_json: bool) -> None:
    """The app's schedules: cron, zone, last tick taken, next tick, and whether one is
    due now (the next run takes it). Rows left by schedules the app no longer declares
    are listed too. Needs --app."""
    target = make_target(database_url, schema, app_spec)
    target.require_app()

    async def go() -> list[ScheduleStatus]:
        async with open_queue(target) as queue:
            _, pipeline = await load_pipeline(target, queue)
            scheduler = getattr(pipeline, "scheduler", None)
            if not isinstance(scheduler, Scheduler):
                raise CliConfigError(f"{target.app_given_as} {target.app_spec!r} did not return a "
                                     "rota.Pipeline: it has no schedules to list")
            return await scheduler.status()

    rows = asyncio.run(go())
    if as_json:
        emit_json([_as_json(r) for r in rows])
        return
    table = Table(title=f"schedules ({len(rows)})")
    for col in ("name", "cron", "zone", "type", "missed", "last tick (UTC)",
                "next tick (UTC)", "next tick (local)", "due"):
        table.add_column(col, overflow="fold")
    for r in rows:
        s = r.schedule
        if s is None:
            add_row(table, r.name, cell("(not declared by the app)", "yellow"), "", "", "",
                    utc_time(r.last_tick), "—", "—", "")
            continue
        add_row(table, r.name, s.cron, s.tz, s.type, s.missed, utc_time(r.last_tick),
                utc_time(r.next_tick), _local(r.next_tick, s.zone),
                cell("due now", "bold") if r.due else "")
    console().print(table)


def _local(when: datetime | None, zone: Any) -> str:
    """An instant in the schedule's zone, with its UTC offset; ``—`` for none."""
    return "—" if when is None else when.astimezone(zone).strftime("%Y-%m-%d %H:%M %z")


def _as_json(r: ScheduleStatus) -> dict[str, Any]:
    s = r.schedule
    return {
        "name": r.name, "declared": s is not None,
        "cron": s.cron if s else None, "tz": s.tz if s else None,
        "type": s.type if s else None, "missed": s.missed if s else None,
        "last_tick": r.last_tick, "next_tick": r.next_tick, "due": r.due,
        "created_at": r.created_at,
    }
