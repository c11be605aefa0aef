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
from datetime import datetime

from ..errors import ConfigError, InvalidInput
from ..queue import Queue
from ..rates import NO_KEY, RateLimit, RateLimited
from .context import JobContext, RunState, retrying
from .stage import Stage

log = logging.getLogger("rota.runner")

#: From this many deferrals on, a job deferred for a rate is reported as deferred again
#: and again (a warning naming the limit and the stage, the counter
#: ``rate.NAME.repeated``; docs/design.md, "Rates").
REPEATED_DEFERRALS = 10


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
            _wait_until(run, stage, peek.free_at - lim.max_wait, peek.free_at, peek.now)
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


def _wait_until(run: RunState, stage: Stage, look_at: datetime, free_at: datetime,
                now: datetime) -> None:
    """Mark ``stage`` waiting until ``look_at`` (queue clock) in this run."""
    mono = time.monotonic() + max((look_at - now).total_seconds(), 0.0)
    old = run.rate_waits.get(stage.type)
    if old is None or old[0] < mono:
        run.rate_waits[stage.type] = (mono, free_at)


async def take_for_job(queue: Queue, run: RunState, stage: Stage,
                       ctx: JobContext) -> bool:
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
            grant = await lim.take(queue, 1, key=key)
        except RateLimited as exc:
            await defer_for_rate(queue, run, stage, [ctx], exc, lim)
            return False
        ctx.rate_grants[lim.name] = grant
        ctx.rate_taken.setdefault(lim.name, []).append((grant.at, 1))
        wait = max(wait, grant.wait.total_seconds())
    if wait > 0:
        await asyncio.sleep(wait)
    return True


async def defer_for_rate(queue: Queue, run: RunState, stage: Stage,
                         ctxs: list[JobContext], exc: RateLimited,
                         lim: RateLimit | None = None) -> int:
    """Defer jobs whose rate-limit units are not there to ``exc.free_at`` (no attempt
    burned, a deferral counted: docs/design.md, "Defer"), note them as waiting for the
    limit, and, for an unkeyed limit of the stage, mark the stage waiting in this run.
    Unlike ``ctx.defer``, the time is not pushed past the run's budget: the units are
    there at ``free_at``, so this run may run the job then. Returns how many were
    deferred."""
    todo = [c for c in ctxs if not c.settled]
    if not todo:
        return 0
    jobs = [c.job for c in todo]
    n = await retrying(lambda: queue.defer(jobs, exc.free_at), run, "defer")
    states: dict[int, str] | None = None
    if n < len(jobs):  # some gave up (max_deferrals) or were lost: ask which
        states = await retrying(lambda: queue.claim_states(jobs), run, "defer")
    deferred = []
    for c in todo:
        state = "pending" if states is None else states.get(c.job.id, "lost")
        if state == "pending":
            c._settle("deferred")
            deferred.append(c.job.id)
        else:
            c._settle("failed" if state == "failed" else "lost")
    if deferred:
        async with queue.connection() as conn:
            await queue.store.execute("rate_wait_note", {
                "ids": deferred, "name": exc.limit, "key": exc.key,
                "until": exc.free_at, "offset": queue.clock_offset}, conn=conn)
    run.add("rate_deferred", len(deferred))
    run.add(f"rate.{exc.limit}.deferred", len(deferred))
    again = [(c.job.id, c.job.deferrals + 1) for c in todo
             if c.job.id in deferred and c.job.deferrals + 1 >= REPEATED_DEFERRALS]
    if again:
        # Deferred for a rate again and again: the units never reach this job (a
        # limit too small for the stage's traffic, a key every job shares, another
        # stage spending them first). Said, counted and shown in the run's summary
        # (docs/design.md, "Rates").
        run.add(f"rate.{exc.limit}.repeated", len(again))
        log.warning("stage %r: job(s) %s deferred for rate limit %r again (deferrals: %s); "
                    "its units keep going elsewhere: check the limit's size and who "
                    "takes it (rota limits)", stage.type, [i for i, _ in again],
                    exc.limit, [n for _, n in again])
    if exc.key == NO_KEY and (lim is None or lim in stage.limits):
        limit = lim or next((x for x in stage.limits if x.name == exc.limit), None)
        if limit is not None:
            now = await queue.now()
            _wait_until(run, stage, exc.free_at - limit.max_wait, exc.free_at, now)
    log.debug("job(s) %s wait for rate limit %r until %s", deferred, exc.limit,
              exc.free_at.isoformat())
    return n


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
            run.add("rate_postponed", await queue.postpone(stage.type, free_at))
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


__all__ = ["claim_room", "collect_limits", "defer_for_rate",
           "take_for_job", "wait_for_units", "waiting"]
