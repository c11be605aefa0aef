"""Periodic schedules across the hosts: every tick must fire exactly once, whatever is
cut, killed or restarted (``schedule_ticks`` and ``schedule_fired`` of the summary).

The workers' pipeline declares one schedule, ``chaos-minute`` (cron ``* * * * *``,
``missed="all"``), whose ticks enqueue ``tick`` jobs. The ``tick`` handler records the
tick in ``chaos_schedule_fires`` and completes its job in the same transaction, so a
tick's row exists once per completed tick job, however often its handler ran. The
checks compare the rows with the ticks the schedule owed: every tick after the
schedule's ``created_at`` up to its ``last_tick`` (rota's ``schedules`` table), using
the schedule's own ``ticks()``.

A tick taken while the workers run is owed; so is one taken by the final drain, whose
runs move the queue's clock forward (``missed="all"`` owes each tick passed).
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime

from psycopg import sql

from rota import JobContext, Schedule, Stage, scheduled_tick

from ..chaos.workload import AnyConn, Handlers, LostJob

NAME = "chaos-minute"
CRON = "* * * * *"
TYPE = "tick"

SETUP = """
CREATE TABLE {schema}.chaos_schedule_fires (
    id      bigserial PRIMARY KEY,
    tick    timestamptz NOT NULL,
    job_id  bigint NOT NULL,
    worker  text NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

FIRE = """
INSERT INTO {schema}.chaos_schedule_fires (tick, job_id, worker)
VALUES (%(tick)s, %(job_id)s, %(worker)s)
"""


SCHEDULE = Schedule(NAME, cron=CRON, type=TYPE, missed="all")


def stages(handlers: Handlers) -> list[Stage]:
    """The ``tick`` stage (put first: earlier stages win)."""

    async def fire(ctx: JobContext) -> None:
        async with ctx.connection() as conn, conn.transaction():
            await conn.execute(handlers.q(FIRE), {"tick": scheduled_tick(ctx.job),
                                                  "job_id": ctx.job.id,
                                                  "worker": handlers.worker})
            if not await ctx.complete(conn=conn):
                raise LostJob(f"tick job {ctx.job.id} was reclaimed")

    return [Stage(TYPE, 5, 1, fire, on_give_up=handlers.refund)]


async def count(conn: AnyConn, schema: str) -> tuple[int, int, list[str]]:
    """``(ticks owed, ticks fired exactly once, violations)`` from the tables."""
    s = sql.Identifier(schema)
    cur = await conn.execute(sql.SQL("SELECT created_at, last_tick FROM {}.schedules "
                                     "WHERE name = %s").format(s), [NAME])
    row = await cur.fetchone()
    if row is None:
        return 0, 0, [f"schedule {NAME} was never seen by a run"]
    created_at, last_tick = row
    owed: list[datetime] = ([] if last_tick is None
                            else list(SCHEDULE.ticks(created_at, last_tick)))
    cur = await conn.execute(sql.SQL("SELECT tick FROM {}.chaos_schedule_fires")
                             .format(s))
    fires = Counter(r[0] for r in await cur.fetchall())
    cur = await conn.execute(sql.SQL("SELECT dedupe_key, count(*) FROM {}.jobs "
                                     "WHERE type = %s GROUP BY 1").format(s), [TYPE])
    jobs = {str(k): int(n) for k, n in await cur.fetchall()}
    violations = []
    for tick in owed:
        if fires[tick] != 1:
            violations.append(f"schedule tick {tick:%F %T} fired {fires[tick]} times")
    for tick in set(fires) - set(owed):
        violations.append(f"schedule tick {tick:%F %T} fired but was not owed")
    for key, n in jobs.items():
        if n != 1:
            violations.append(f"{key}: {n} jobs")
    return len(owed), sum(1 for tick in owed if fires[tick] == 1), violations
