"""The runner's side of rate limits (docs/design.md, "Rates"): a look at a stage's
buckets before its claim, a take of one unit per job before its handler starts, the
deferral of a job whose units are not there, and the run's wait for the earliest moment
a rate-limited stage can go on.

Kept apart from the run loop, which calls these few functions at its hook points.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

from ..errors import ConfigError, InvalidInput
from ..queue import Queue
from ..rates import RateLimit, RateLimited
from .context import JobContext, RunState
from .settle import REPEATED_DEFERRALS, Settler, wait_until
from .stage import Stage

log = logging.getLogger("rota.runner")

def collect_limits(stages: Iterable[Stage], given: Iterable[RateLimit]
                   ) -> dict[str, RateLimit]:
    """The pipeline's rate limits by name: its stages' and those given to it.

    Raises:
        InvalidInput: something that is not a :class:`RateLimit`.
        ConfigError: two different limits share a name.
    """
    out: dict[str, RateLimit] = {}
    for lim in [*(r for s in stages for r in s.limits), *given]:
        if not isinstance(lim, RateLimit):
            raise InvalidInput(f"rate_limits must be rota.RateLimit, got {lim!r}")
        if out.setdefault(lim.name, lim) != lim:
            raise ConfigError(f"two different rate limits are named {lim.name!r}")
    return out


async def claim_room(queue: Queue, run: RunState, stage: Stage) -> int | None:
    """Before claiming a batch of ``stage``: how many of its jobs its unkeyed limits
    could let start within their ``max_wait`` (``None``: no unkeyed limit, no cap).

    When that is none, the stage is marked waiting in ``run`` until its units come
    within reach, and 0 is returned: the loop moves on to other stages rather than
    claiming jobs only to defer them."""
    room: int | None = None
    for lim in stage.limits:
        if lim.key is not None:
            continue  # keyed: each job's bucket is known once it is claimed
        peek = await lim.peek(queue)
        n = peek.reservable(lim.max_wait)
        if n == 0:
            wait_until(run, stage, peek.free_at - lim.max_wait, peek.free_at, peek.now)
            return 0
        room = n if room is None else min(room, n)
    return room


def waiting(run: RunState, stage: Stage) -> bool:
    """Whether ``stage`` waits for its rate limits' units in this run (skip it now)."""
    entry = run.rate_waits.get(stage.type)
    if entry is None:
        return False
    if time.monotonic() >= entry[0]:
        del run.rate_waits[stage.type]
        return False
    return True


async def take_for_job(settler: Settler, stage: Stage, ctx: JobContext) -> bool:
    """Take one unit of each of ``stage``'s rate limits for ``ctx``'s job, in the order
    declared, and wait until the last is the job's (at most ``max_wait`` each). When a
    limit has none within its wait, the job is deferred to the moment they will be
    there (no attempt burned) and ``False`` returned: the handler does not start. A unit
    already taken of an earlier limit stays spent. A key function that raises fails the
    job as its handler would (retried with backoff), not the run."""
    wait = 0.0
    for lim in stage.limits:
        try:
            key = lim.key_for(ctx.job)
        except Exception as exc:
            log.info("job %s: rate limit %r: its key function raised %s", ctx.job.id,
                     lim.name, type(exc).__name__)
            ctx.started = True
            await ctx.fail(exc)
            return False
        if key is None:
            continue
        try:
            grant = await lim.take(settler.queue, 1, key=key)
        except RateLimited as exc:
            await settler.defer_for_rate(stage, [ctx], exc, lim)
            return False
        ctx.rate_grants[lim.name] = grant
        ctx.rate_taken.setdefault(lim.name, []).append((grant.at, 1))
        wait = max(wait, grant.wait.total_seconds())
    if wait > 0:
        await asyncio.sleep(wait)
    return True


async def wait_for_units(queue: Queue, run: RunState, stages: Iterable[Stage]) -> bool:
    """When a pass of the loop found no work: if a stage waits for its rate limits and
    has jobs due, sleep until the earliest such stage may go on and return ``True`` (the
    loop goes round again). A wait that would outlast the run's budget is not slept:
    those stages' pending jobs are moved to the moment their units are there (so a
    worker sleeps until then, docs/design.md, "Rates") and ``False`` is returned.
    Stages with no due jobs are dropped from the waits."""
    soonest: float | None = None
    for stage in stages:
        entry = run.rate_waits.get(stage.type)
        if entry is None:
            continue
        look_at, free_at = entry
        if not await queue.has_pending_by(stage.type, await queue.now()):
            del run.rate_waits[stage.type]
            continue
        if look_at >= run.deadline:
            # No run claims the type before then: its jobs (a dead run's stale ones
            # too) wait as pending, as for a quota's reset.
            await Settler(queue, run).postpone(stage.type, free_at, "rate_postponed",
                                               count_none=True)
            continue
        soonest = look_at if soonest is None else min(soonest, look_at)
    if soonest is None:
        return False
    delay = max(soonest - time.monotonic(), 0.0)
    if run.stop is not None:
        try:
            await asyncio.wait_for(run.stop.wait(), timeout=delay)
        except TimeoutError:
            pass
    else:
        await asyncio.sleep(delay)
    run.add("rate_waited_s", round(delay, 3))
    return True


__all__ = ["REPEATED_DEFERRALS", "claim_room", "collect_limits", "take_for_job",
           "wait_for_units", "waiting"]
