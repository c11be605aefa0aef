"""A small app for the CLI, server and worker tests (``--app tests.cli_app:build_pipeline``):
``echo`` completes and counts, ``boom`` fails at once (one attempt)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from rota import JobContext, Pipeline, Plan, Plans, Queue, Stage

TEST_PLANS = Plans([
    Plan("free", "Free", 0, {"searches_per_day": 5}),
    Plan("team", "Team", 1, {"searches_per_day": 50}),
    Plan("pro", "Pro", 2, {"searches_per_day": 500, "draft_credits": 100}),
])


async def echo(ctx: JobContext) -> None:
    ctx.count("echoed")


async def boom(ctx: JobContext) -> None:
    raise RuntimeError(f"boom: {ctx.job.payload.get('why', 'no reason')}")


async def echo_gave_up(job: Any, conn: Any) -> None:
    # Written in the give-up transaction, so tests can see that it ran exactly once.
    await conn.execute("SELECT 1")


def build_pipeline(queue: Queue) -> Pipeline:
    return Pipeline(queue, [
        Stage("echo", 10, 2, echo, on_give_up=echo_gave_up),
        Stage("boom", 5, 1, boom, max_attempts=1),
    ])


build_pipeline.queue_settings = {  # type: ignore[attr-defined]
    "plans": TEST_PLANS, "types": ["echo", "boom"],
}


def not_callable_app() -> None:
    """Deliberately not a pipeline builder's shape: tests use it for a bad --app."""


def build_stages_only(queue: Queue) -> Pipeline:
    """The same stages on a queue that declares no types (any type may be enqueued in
    Python): `rota migrate --app` publishes the stage types for SQL."""
    return Pipeline(queue, [Stage("echo", 10, 2, echo), Stage("boom", 5, 1, boom)])


async def nap(ctx: JobContext) -> None:
    await asyncio.sleep(0.3)


def build_quick_stale(queue: Queue) -> Pipeline:
    """A 4 s stale window (a 3 s platform timeout, a heartbeat every second): for
    killing a worker and seeing its run marked without waiting 15 minutes."""
    return Pipeline(queue, [Stage("nap", handler=nap)],
                    platform_timeout=timedelta(seconds=3))


build_quick_stale.queue_settings = {  # type: ignore[attr-defined]
    "stale_after": timedelta(seconds=4)}


#: Plans for the caps test (docs/design.md, "Caps"): each owner of "capped" (the higher
#: priority, so its owners would take every slot) may have 2 jobs running at once;
#: "open" has no cap.
CAP_PLANS = Plans([Plan("open", "Open", 0), Plan("capped", "Capped", 1, max_running=2)])


async def hold(ctx: JobContext) -> None:
    await asyncio.sleep(1.0)


def build_capped(queue: Queue) -> Pipeline:
    """One stage, batches of 4 run 4 at a time, each job holding its slot 1 s; a 4 s
    stale window (a 3 s platform timeout), so a killed worker's slots come back soon."""
    return Pipeline(queue, [Stage("hold", 4, 4, hold)],
                    platform_timeout=timedelta(seconds=3))


build_capped.queue_settings = {  # type: ignore[attr-defined]
    "plans": CAP_PLANS, "stale_after": timedelta(seconds=4), "fair_by": "owner"}
