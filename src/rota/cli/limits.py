"""Rate limits: ``rota limits`` lists every bucket with its settings, the units taken in
its current window, what a take could have now, the next free moment and the jobs
waiting for it (docs/design.md, "Rates"; docs/operations.md, "Rate limits")."""

from __future__ import annotations

import asyncio

import click

from ..rates import RateState, rate_states
from .app import open_queue
from .errors import RotaCommand
from .options import WholeNumber, json_option, make_target, target_options
from .output import add_row, cell, compact_table, console, emit_json


@click.command(cls=RotaCommand)
@target_options
@click.option("--name", default=None, help="Only this limit's buckets.")
@click.option("--limit", "-n", type=WholeNumber(1, 10_000), default=1000,
              show_default=True, help="At most this many buckets.")
@json_option
def limits(database_url: str | None, schema: str | None, app_spec: str | None,
           name: str | None, limit: int, as_json: bool) -> None:
    """Rate limits: each bucket (limit and key) as every worker shares it: limit per
    period and burst, units taken in the current window (and the one before), units
    available now (negative: owed by units spent after the fact, or a backoff), the
    next free moment, and the jobs deferred waiting for it. Read from the database:
    no app needed."""
    target = make_target(database_url, schema, app_spec)

    async def go() -> list[RateState]:
        async with open_queue(target) as queue:
            return await rate_states(queue, name, limit=limit)

    rows = asyncio.run(go())
    if as_json:
        emit_json([r.as_json() for r in rows])
        return
    if not rows:
        # A limit has a bucket (per key) from its first take on.
        console().print(f"no bucket of rate limit {name!r} yet: a limit has one once a "
                        f"unit of it is taken" if name is not None
                        else "no rate-limit buckets yet: a limit has one once a unit of "
                             "it is taken")
        return
    # Fits 80 columns: the rate as "500/1m", the next free unit as a wait ("in 1.2s"),
    # the key column only when a limit is keyed; --json has the lifetime totals and
    # every instant.
    table = compact_table(f"rate limits ({len(rows)} bucket{'' if len(rows) == 1 else 's'})")
    keyed = any(r.key for r in rows)
    columns = ["limit", *(["key"] if keyed else []), "rate", "burst", "used", "before",
               "avail", "next free", "waiting"]
    for col in columns:
        table.add_column(col, overflow="fold", justify="left" if col in (
            "limit", "key", "rate", "next free") else "right")
    for r in rows:
        wait = (r.next_free - r.now).total_seconds()
        free = "now" if wait <= 0 else f"in {_wait(wait)}"
        available = f"{r.available:.1f}" if abs(r.available) < 10 else f"{r.available:.0f}"
        add_row(table, r.name, *([r.key or "—"] if keyed else []),
                f"{r.limit}/{_period(r.per_s)}", r.burst, r.window_units, r.prev_units,
                cell(available, "red" if r.available < 0 else ""), free, r.waiting)
    out = console()
    out.print(table)
    out.print("used, before: units taken in this window of the period and the one before. "
              "avail: units a take could have now (below 0: owed). --json: every bucket's "
              "totals and instants.")


def _wait(seconds: float) -> str:
    """A wait, rounded: ``0.4s``, ``12.3s``, ``5m``, ``2h``."""
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.0f}h"


def _period(seconds: float) -> str:
    """A period in the largest whole unit: ``1s``, ``1m``, ``1h``, else seconds."""
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
