"""The chaos pipeline: four stages whose handlers fail, defer and write side effects
at random (one, ``runaway``, also overruns its deadline or ignores its cancellation),
and the harness's own tables and triggers that record every claim, settle, deferral,
handler run and give-up hook as it happens."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from rota import DeferJob, Job, JobContext, Maintenance, Pipeline, Queue, Stage

from .profile import Profile

AnyConn = psycopg.AsyncConnection[Any]

STAGES = ("draft", "enrich", "runaway", "search")  # runner order: the work-generating stage last


# The harness's own tables, in the chaos schema next to rota's. Triggers log every
# claim, settle and deferral in the transaction that makes it, and which connection
# (application_name: the worker) started each run, so the checks need no cooperation
# from the code under test.
SETUP = """
CREATE TABLE {schema}.chaos_handler_runs (
    job_id      bigint NOT NULL,
    claim_token uuid NOT NULL,
    attempt     int NOT NULL,
    stage       text NOT NULL,
    worker      text NOT NULL,
    run_id      uuid NOT NULL,
    starts      int NOT NULL DEFAULT 1,
    started_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at    timestamptz,
    outcome     text,
    PRIMARY KEY (job_id, claim_token)
);
CREATE TABLE {schema}.chaos_effects (
    job_id       bigint NOT NULL,
    attempt      int NOT NULL,
    claim_token  uuid NOT NULL,
    stage        text NOT NULL,
    worker       text NOT NULL,
    same_claim   int NOT NULL DEFAULT 0,
    at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- By claim, not attempt: a job handed back after its start (its run's end cut the
    -- handler) gets its attempt back, so two claims can carry the same attempt number.
    PRIMARY KEY (job_id, claim_token)
);
CREATE TABLE {schema}.chaos_hooks (
    job_id bigint PRIMARY KEY,
    runs   int NOT NULL DEFAULT 1,
    worker text NOT NULL,
    at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE {schema}.chaos_log (
    id         bigserial PRIMARY KEY,
    job_id     bigint NOT NULL,
    old_status text NOT NULL,
    new_status text NOT NULL,
    old_token  uuid,
    new_token  uuid,
    old_locked timestamptz,
    new_locked timestamptz,
    attempts   int NOT NULL,
    deferred   boolean NOT NULL,
    released   boolean NOT NULL,  -- handed back, the claim's attempt returned: unstarted,
                                  -- or started and cut by its run's end or a stop
    run_id     uuid,
    last_error text,
    app        text NOT NULL,
    at         timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE {schema}.chaos_run_owner (
    run_id uuid PRIMARY KEY,
    app    text NOT NULL
);
CREATE FUNCTION {schema}.chaos_log_job() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IS DISTINCT FROM OLD.status
       OR NEW.claim_token IS DISTINCT FROM OLD.claim_token
       OR NEW.deferrals <> OLD.deferrals THEN
        INSERT INTO {schema}.chaos_log (job_id, old_status, new_status, old_token,
            new_token, old_locked, new_locked, attempts, deferred, released, run_id,
            last_error, app)
        VALUES (NEW.id, OLD.status, NEW.status, OLD.claim_token, NEW.claim_token,
            OLD.locked_at, NEW.locked_at, NEW.attempts, NEW.deferrals > OLD.deferrals,
            OLD.status = 'running' AND NEW.status = 'pending'
                AND NEW.attempts < OLD.attempts AND NEW.deferrals = OLD.deferrals,
            NEW.run_id, NEW.last_error, current_setting('application_name'));
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER chaos_log_job AFTER UPDATE ON {schema}.jobs
    FOR EACH ROW EXECUTE FUNCTION {schema}.chaos_log_job();
CREATE FUNCTION {schema}.chaos_own_run() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.chaos_run_owner VALUES (NEW.id, current_setting('application_name'));
    RETURN NULL;
END
$$;
CREATE TRIGGER chaos_own_run AFTER INSERT ON {schema}.runs
    FOR EACH ROW EXECUTE FUNCTION {schema}.chaos_own_run();
"""

HANDLER_START = """
INSERT INTO {schema}.chaos_handler_runs (job_id, claim_token, attempt, stage, worker, run_id)
VALUES (%(job_id)s, %(claim_token)s, %(attempt)s, %(stage)s, %(worker)s, %(run_id)s)
ON CONFLICT (job_id, claim_token) DO UPDATE
SET starts = {schema}.chaos_handler_runs.starts + 1
"""

HANDLER_END = """
UPDATE {schema}.chaos_handler_runs
SET ended_at = %(ended)s, outcome = %(outcome)s
WHERE job_id = %(job_id)s AND claim_token = %(claim_token)s
"""

EFFECT = """
INSERT INTO {schema}.chaos_effects (job_id, attempt, claim_token, stage, worker)
VALUES (%(job_id)s, %(attempt)s, %(claim_token)s, %(stage)s, %(worker)s)
ON CONFLICT (job_id, claim_token) DO UPDATE
SET same_claim = {schema}.chaos_effects.same_claim + 1
"""

HOOK = """
INSERT INTO {schema}.chaos_hooks (job_id, worker) VALUES (%(job_id)s, %(worker)s)
ON CONFLICT (job_id) DO UPDATE SET runs = {schema}.chaos_hooks.runs + 1
"""


class InjectedError(Exception):
    """The ~5% of handler calls that fail on purpose (before any side effect)."""


class LostJob(Exception):
    """A transactional handler found its claim lost: roll its writes back."""


def cut_at_deadline(ctx: JobContext) -> bool:
    """Whether a handler cancelled now was cut at its deadline (the stage's timeout or
    the run's hard deadline, on the event loop's monotonic clock) rather than cancelled
    by its run ending in error around it."""
    return ctx.deadline is not None and time.monotonic() >= ctx.deadline - 0.05


# -- the application the workers run ------------------------------------------------


class Handlers:
    """The chaos pipeline's handlers. Every call logs its start (one row per claim)
    and its end; errors and deferrals happen before the side effect, so only a run
    interrupted between the side effect and completion can repeat one.

    - ``enrich`` writes its side effect on its own (like a call to a third-party API),
      sleeps again, and returns: the runner completes the job. A kill in between
      repeats the effect in the next attempt (at-least-once).
    - ``draft`` writes its effect and completes the job in one transaction
      (``ctx.complete(conn=...)``): exactly once, whatever is killed.
    - ``search`` enqueues two draft jobs, writes its effect and completes, in one
      transaction: the drafts exist if and only if the search is done.
    - ``runaway`` is ``enrich`` with a short timeout (``profile.runaway_timeout``), but
      about ``hang_rate`` of its calls sleep an hour and ``ignore_cancel_rate`` swallow
      their cancellation in a loop (bounded: they give up a second after the platform
      timeout, so the worker can still stop), both before the effect. A handler cut at
      its deadline records the outcome ``timed_out`` at the cut; one that ignores the
      cut records ``ignored_cancel`` at the first cancellation (the runner abandons it
      at the run's hard deadline; the checks take that as its end).
    """

    def __init__(self, schema: str, worker: str, profile: Profile, seed: int) -> None:
        self.schema = sql.Identifier(schema)
        self.worker = worker
        self.profile = profile
        self.rng = random.Random(seed)
        self._pending: set[asyncio.Future[None]] = set()  # end records being written
        self._ended_early: set[Any] = set()  # claims whose end a runaway recorded itself

    def q(self, text: str) -> sql.Composed:
        return sql.SQL(text).format(schema=self.schema)

    def stages(self) -> list[Stage]:
        return [
            Stage("draft", 5, 3, self.tracked(self._draft), max_attempts=2,
                  on_give_up=self.refund),
            Stage("enrich", 10, 4, self.tracked(self._enrich), on_give_up=self.refund),
            Stage("runaway", 4, 2, self.tracked(self._runaway), max_attempts=3,
                  on_give_up=self.refund,
                  timeout=timedelta(seconds=self.profile.runaway_timeout)),
            Stage("search", 2, 2, self.tracked(self._search), on_give_up=self.refund),
        ]

    def tracked(self, effect: Callable[[JobContext], Awaitable[None]]
                ) -> Callable[[JobContext], Awaitable[None]]:
        async def handler(ctx: JobContext) -> None:
            job = ctx.job
            key = {"job_id": job.id, "claim_token": job.claim_token}
            async with ctx.connection() as conn:
                await conn.execute(self.q(HANDLER_START), {
                    **key, "attempt": job.attempts, "stage": job.type,
                    "worker": self.worker, "run_id": ctx.run_id})
            outcome = "error"
            try:
                await self._sleep()
                roll = self.rng.random()
                if roll < self.profile.defer_rate:
                    outcome = "deferred"
                    wake = timedelta(seconds=self.rng.uniform(0.2, 2.0))
                    raise DeferJob(await ctx.queue.now() + wake, "chaos deferral")
                if roll < self.profile.defer_rate + self.profile.error_rate:
                    raise InjectedError("injected handler error")
                await effect(ctx)
                outcome = "done"
            except LostJob:
                outcome = "lost"
                raise
            except asyncio.CancelledError:
                # Cut at its deadline: a legitimate end, at the cut. Otherwise the run
                # ended in error around it.
                outcome = "timed_out" if cut_at_deadline(ctx) else "cancelled"
                raise
            finally:
                if job.claim_token in self._ended_early:  # a runaway said when it was cut
                    self._ended_early.discard(job.claim_token)
                else:
                    # The moment it stopped, written when the database can take it: a
                    # run cut off by the restart cancels its handlers, and the write must
                    # neither be lost to that cancellation nor make the end look later.
                    await asyncio.shield(self._end(ctx, key, outcome))

        return handler

    def _end(self, ctx: JobContext, key: dict[str, Any], outcome: str) -> asyncio.Future[None]:
        """Record a handler's end as of now, in a task of its own (kept referenced)."""
        ended = datetime.now(UTC)
        end = asyncio.ensure_future(self._record_end(ctx, key, outcome, ended))
        self._pending.add(end)
        end.add_done_callback(self._pending.discard)
        return end

    async def _record_end(self, ctx: JobContext, key: dict[str, Any], outcome: str,
                          ended: datetime) -> None:
        # The end must be known for the overlap check, so it waits out a database
        # restart (seconds); a kill leaves it unrecorded, and the kill time stands in.
        deadline = time.monotonic() + 30
        while True:
            try:
                async with ctx.connection() as conn:
                    await conn.execute(self.q(HANDLER_END),
                                       {**key, "outcome": outcome, "ended": ended})
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

    async def _sleep(self) -> None:
        lo, hi = self.profile.latency_ms
        await asyncio.sleep(self.rng.uniform(lo, hi) / 1000)

    def _effect_params(self, ctx: JobContext) -> dict[str, Any]:
        job = ctx.job
        return {"job_id": job.id, "attempt": job.attempts, "claim_token": job.claim_token,
                "stage": job.type, "worker": self.worker}

    async def _enrich(self, ctx: JobContext) -> None:
        async with ctx.connection() as conn:
            await conn.execute(self.q(EFFECT), self._effect_params(ctx))
        await self._sleep()
        ctx.count("channels_enriched")

    async def _runaway(self, ctx: JobContext) -> None:
        roll = self.rng.random()
        if roll < self.profile.hang_rate:
            await asyncio.sleep(3600)  # cut at the stage's timeout
        elif roll < self.profile.hang_rate + self.profile.ignore_cancel_rate:
            await self._ignore_cancellation(ctx)
        await self._enrich(ctx)

    async def _ignore_cancellation(self, ctx: JobContext) -> None:
        """Swallow every cancellation until a second after the platform timeout (the
        runner abandons the job at its run's hard deadline; asyncio.run's cancellation
        at the worker's exit is swallowed too, so the bound lets the process stop), then
        let the last one through. The end is recorded at the first cancellation."""
        job = ctx.job
        key = {"job_id": job.id, "claim_token": job.claim_token}
        until = time.monotonic() + self.profile.platform_timeout + 1
        cancelled = False
        while (left := until - time.monotonic()) > 0:
            try:
                await asyncio.sleep(left)
            except asyncio.CancelledError:
                if not cancelled:
                    cancelled = True
                    self._ended_early.add(job.claim_token)
                    self._end(ctx, key, "ignored_cancel")
        if cancelled:
            raise asyncio.CancelledError

    async def _draft(self, ctx: JobContext) -> None:
        async with ctx.connection() as conn, conn.transaction():
            await conn.execute(self.q(EFFECT), self._effect_params(ctx))
            if not await ctx.complete(conn=conn):
                raise LostJob(f"job {ctx.job.id} was reclaimed")
        ctx.count("drafts_written")

    async def _search(self, ctx: JobContext) -> None:
        job = ctx.job
        async with ctx.connection() as conn, conn.transaction():
            await ctx.queue.enqueue_many([
                {"type": "draft", "payload": {"search": job.id, "n": n},
                 "group_id": job.group_id, "dedupe_key": f"draft:{job.id}:{n}"}
                for n in range(2)], conn=conn)
            await conn.execute(self.q(EFFECT), self._effect_params(ctx))
            if not await ctx.complete(conn=conn):
                raise LostJob(f"job {job.id} was reclaimed")
        ctx.count("searches")

    async def refund(self, job: Job, conn: AnyConn) -> None:
        """The give-up hook: one row per job, a second call counted, never hidden."""
        await conn.execute(self.q(HOOK), {"job_id": job.id, "worker": self.worker})


def make_queue(url: str, schema: str, profile: Profile, app: str) -> Queue:
    """A queue with the profile's compressed durations; its connections carry ``app``
    as application_name, so triggers can tell which process did what."""
    return Queue(make_conninfo(url, application_name=app), schema=schema,
                 stale_after=timedelta(seconds=profile.stale_after),
                 backoff_base=timedelta(seconds=profile.backoff_base))


def make_pipeline(queue: Queue, handlers: Handlers, profile: Profile) -> Pipeline:
    return Pipeline(queue, handlers.stages(),
                    platform_timeout=timedelta(seconds=profile.platform_timeout),
                    heartbeat_every=timedelta(seconds=profile.heartbeat_every))


def make_maintenance(queue: Queue, profile: Profile) -> Maintenance:
    return Maintenance(queue, platform_timeout=timedelta(seconds=profile.platform_timeout))
