"""The chaos run: real worker processes, real SIGKILLs and a real PostgreSQL restart,
then proof that no work was lost, doubled or charged twice (``make chaos``).

What happens::

    python -m rota.chaos            # default profile: 5,000 jobs, 4 workers
    python -m rota.chaos --short    # the profile tests/test_chaos.py runs in `make test`

1. A fresh schema gets rota's tables, 9 groups over the three default plans, and the
   seed jobs; a few tables of the harness's own record what happens (see ``SETUP``).
2. ``workers`` OS processes (``python -m rota.chaos worker``) each run a
   :class:`rota.Pipeline` back to back (``pipeline.run(trigger="worker")``), with
   maintenance every few seconds. Durations are compressed by settings: a stale window
   of seconds, backoff of half a second, a platform timeout shorter than the stale
   window (as the Pipeline requires). Handlers sleep a random few milliseconds, raise
   an error about 5% of the time and ``DeferJob`` about 3% of the time.
3. A killer SIGKILLs a random worker every few seconds and starts a new one; once, a
   third of the way through, PostgreSQL itself is restarted (the embedded server with
   ``pg_ctl restart``; the machine's with ``pg_ctlcluster``).
4. When the work is nearly done the killing stops, the workers finish, are stopped, and
   the harness runs maintenance and drains what is left in-process, moving time with
   ``queue.clock_offset`` (stale locks, backoffs and deferrals are due at once).
5. Checks (each violation is printed; any makes the exit status 1):

   - every job is ``done`` or ``failed``, or ``pending`` with a due time (counted);
     nothing ``running``, and every done search has its two draft jobs (``lost``);
   - a side effect repeated in a later attempt only where the earlier attempt's run was
     killed or interrupted mid-handler; each repeat is explained (``duplicated``);
     the two stages that complete inside their own transaction never repeat;
   - no job's handler ran in two workers at once, and every stale reclaim took a job
     from a worker that was dead or whose run had ended;
   - every give-up hook ran exactly once (``hooks_missing``, ``hooks_doubled``);
   - each job's attempts equal its claims minus its deferrals (claims and deferrals are
     logged by a trigger in the claiming transaction itself);
   - every run a killed worker was in is in ``runs`` ended ``error``/``killed``, no run
     is left unfinished, no live run was marked killed, and runs that ended in another
     error did so because of the restart;
   - no worker process died on its own.

The last line is the summary::

    jobs=5000 kills=41 restarts=1 lost=0 duplicated=9 hooks_missing=0 hooks_doubled=0

Without ``--database-url`` (or ``DATABASE_URL``) an embedded server is started in a
temporary directory, so nothing else is disturbed by the restart.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

from .embedded import EmbeddedServer
from .errors import ConfigError, DatabaseUnavailable
from .job import DeferJob, Job
from .maintenance import Maintenance
from .queue import AnyConn, Queue
from .runner import JobContext, Pipeline, Stage

log = logging.getLogger("rota.chaos")

STAGES = ("draft", "enrich", "search")  # runner order: the work-generating stage last


@dataclass(frozen=True)
class Profile:
    """How big and how violent a chaos run is.

    Attributes:
        jobs: total jobs (seeded enrich and search jobs, plus two drafts per search).
        workers: worker processes running at any time (at least 2 runs overlap).
        kill_every: seconds between kills, drawn uniformly from this range.
        restart_at: fraction of jobs finished when PostgreSQL is restarted (once).
        stop_killing_at: fraction of jobs finished when the killing stops.
        deadline: seconds for the worker phase; what is open then is drained.
        error_rate, defer_rate: chance a handler raises an error / ``DeferJob``.
        latency_ms: a handler's random latency range (enrich sleeps it twice, once
            after its side effect, so kills land there too).
        stale_after, platform_timeout, heartbeat_every, time_budget, backoff_base:
            the compressed durations (seconds).
        maintain_every: seconds between a worker's maintenance passes (jittered).
    """

    jobs: int
    workers: int = 4
    kill_every: tuple[float, float] = (1.5, 3.0)
    restart_at: float = 0.35
    stop_killing_at: float = 0.97
    deadline: float = 240.0
    error_rate: float = 0.05
    defer_rate: float = 0.03
    latency_ms: tuple[float, float] = (1.0, 20.0)
    stale_after: float = 6.0
    platform_timeout: float = 5.0
    heartbeat_every: float = 1.0
    time_budget: float = 2.0
    backoff_base: float = 0.5
    maintain_every: float = 3.0

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> Profile:
        raw = json.loads(text)
        for k in ("kill_every", "latency_ms"):
            raw[k] = tuple(raw[k])
        return cls(**raw)


DEFAULT_PROFILE = Profile(jobs=5000)
SHORT_PROFILE = Profile(jobs=600, kill_every=(0.5, 1.0), latency_ms=(5.0, 60.0), deadline=40.0)

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
    same_attempt int NOT NULL DEFAULT 0,
    at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (job_id, attempt)
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
    run_id     uuid,
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
            new_token, old_locked, new_locked, attempts, deferred, run_id, app)
        VALUES (NEW.id, OLD.status, NEW.status, OLD.claim_token, NEW.claim_token,
            OLD.locked_at, NEW.locked_at, NEW.attempts, NEW.deferrals > OLD.deferrals,
            NEW.run_id, current_setting('application_name'));
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
ON CONFLICT (job_id, attempt) DO UPDATE
SET same_attempt = {schema}.chaos_effects.same_attempt + 1
"""

HOOK = """
INSERT INTO {schema}.chaos_hooks (job_id, worker) VALUES (%(job_id)s, %(worker)s)
ON CONFLICT (job_id) DO UPDATE SET runs = {schema}.chaos_hooks.runs + 1
"""


class InjectedError(Exception):
    """The ~5% of handler calls that fail on purpose (before any side effect)."""


class LostJob(Exception):
    """A transactional handler found its claim lost: roll its writes back."""


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
    """

    def __init__(self, schema: str, worker: str, profile: Profile, seed: int) -> None:
        self.schema = sql.Identifier(schema)
        self.worker = worker
        self.profile = profile
        self.rng = random.Random(seed)
        self._pending: set[asyncio.Future[None]] = set()  # end records being written

    def q(self, text: str) -> sql.Composed:
        return sql.SQL(text).format(schema=self.schema)

    def stages(self) -> list[Stage]:
        return [
            Stage("draft", 5, 3, self.tracked(self._draft), max_attempts=2,
                  on_give_up=self.refund),
            Stage("enrich", 10, 4, self.tracked(self._enrich), on_give_up=self.refund),
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
            except asyncio.CancelledError:  # the run ended in error around it
                outcome = "cancelled"
                raise
            finally:
                # The moment it stopped, written when the database can take it: a run
                # cut off by the restart cancels its handlers, and the write must
                # neither be lost to that cancellation nor make the end look later.
                ended = datetime.now(UTC)
                end = asyncio.ensure_future(self._record_end(ctx, key, outcome, ended))
                self._pending.add(end)
                end.add_done_callback(self._pending.discard)
                await asyncio.shield(end)

        return handler

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


# -- a worker process ---------------------------------------------------------------


async def worker_main(url: str, schema: str, name: str, profile: Profile, seed: int) -> int:
    """One worker process: pipeline runs back to back until SIGTERM, maintenance every
    few seconds. A run that raises (its row could not even be written: the database is
    down) is logged and the next one starts after a short pause."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, _dump_tasks)  # the harness asks when stuck
    rng = random.Random(seed)
    queue = make_queue(url, schema, profile, f"chaos-{name}")
    pipeline = make_pipeline(queue, Handlers(schema, name, profile, seed), profile)
    maintenance = make_maintenance(queue, profile)
    budget = timedelta(seconds=profile.time_budget)
    next_maintenance = time.monotonic() + rng.uniform(0, profile.maintain_every)
    runs = raised = 0
    try:
        while not stop.is_set():
            maintain = time.monotonic() >= next_maintenance
            if maintain:
                next_maintenance = time.monotonic() + profile.maintain_every * rng.uniform(
                    0.7, 1.3)
            try:
                result = await pipeline.run(trigger="worker", time_budget=budget,
                                            maintenance=maintenance if maintain else None)
            except Exception as exc:
                raised += 1
                log.error("chaos-worker: run raised %s: %s", type(exc).__name__,
                          str(exc).strip().splitlines()[0] if str(exc).strip() else "")
                await asyncio.sleep(0.2)
                continue
            runs += 1
            if result.stop_reason == "error":
                log.warning("chaos-worker: run %s ended in error: %s", result.run_id,
                            result.error)
            elif result.stop_reason == "no_work":
                await asyncio.sleep(rng.uniform(0.05, 0.15))
    finally:
        await queue.close()
    print(json.dumps({"worker": name, "runs": runs, "raised": raised}), flush=True)
    return 0


def _dump_tasks() -> None:
    for task in asyncio.all_tasks():
        print(f"--- task {task.get_name()}", file=sys.stderr)
        task.print_stack(file=sys.stderr)
    sys.stderr.flush()


# -- the database and its restart ---------------------------------------------------


class Server(Protocol):
    url: str
    kind: str

    def restart(self) -> None: ...

    def stop(self) -> None: ...


class EmbeddedPostgres:
    """A private server (:class:`rota.embedded.EmbeddedServer`, its owner's alone, gone
    with this process however it ends); restarted by its watchdog with a fast shutdown
    on the same data directory and socket."""

    kind = "embedded"

    def __init__(self) -> None:
        try:
            self._server = EmbeddedServer()
        except DatabaseUnavailable as exc:
            raise DatabaseUnavailable(
                f"the chaos run needs a server it may restart: {exc} (or pass "
                "--database-url)") from None
        self.url = self._server.url

    def restart(self) -> None:
        self._server.restart()

    def stop(self) -> None:
        self._server.stop()


class ClusterPostgres:
    """The machine's server (Debian/Ubuntu postgresql-common): restarted with
    ``pg_ctlcluster --skip-systemctl-redirect VERSION NAME restart`` (fast mode)."""

    kind = "pg_ctlcluster"

    def __init__(self, url: str, version: str, name: str) -> None:
        self.url = url
        self.version = version
        self.name = name

    @classmethod
    def detect(cls, url: str) -> ClusterPostgres:
        """The local cluster listening on the URL's port.

        Raises:
            ConfigError: the URL is not a local server, or no local cluster matches.
        """
        params = conninfo_to_dict(url)
        host = str(params.get("host") or "localhost")
        port = str(params.get("port") or "5432")
        if host not in ("localhost", "127.0.0.1", "::1") and not host.startswith("/"):
            raise ConfigError(f"cannot restart the server at {host!r}: the chaos run "
                              f"restarts only a local cluster (or run without a URL)")
        try:
            out = subprocess.run(["pg_lsclusters", "--no-header"], check=True,
                                 capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            raise ConfigError(f"cannot list local clusters (pg_lsclusters): {exc}") from None
        for line in out.splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[2] == port and parts[3].startswith("online"):
                return cls(url, parts[0], parts[1])
        raise ConfigError(f"no online local cluster on port {port} (pg_lsclusters)")

    def restart(self) -> None:
        subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", "--mode", "fast",
                        self.version, self.name, "restart"], check=True,
                       capture_output=True, timeout=120)

    def stop(self) -> None:
        pass


# -- the harness --------------------------------------------------------------------


@dataclass
class Kill:
    worker: str
    pid: int
    at: datetime


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    started: float = field(default_factory=time.monotonic)


@dataclass
class Outcome:
    """Everything the checks need from the run, besides the database."""

    kills: list[Kill] = field(default_factory=list)
    restarts: list[tuple[datetime, datetime]] = field(default_factory=list)
    crashed: list[str] = field(default_factory=list)
    forced_stops: list[str] = field(default_factory=list)
    runs_raised: int = 0
    seeded: int = 0
    worker_phase_s: float = 0.0
    drain_rounds: int = 0


class Harness:
    """Runs one chaos run against ``server`` in a fresh schema."""

    def __init__(self, server: Server, profile: Profile, *, seed: int, quiet: bool,
                 workdir: Path) -> None:
        self.server = server
        self.profile = profile
        self.seed = seed
        self.rng = random.Random(seed)
        self.quiet = quiet
        self.workdir = workdir
        self.schema = f"chaos_{uuid.uuid4().hex[:10]}"
        self.out = Outcome()
        self.procs: dict[str, Proc] = {}
        self._spawned = 0
        self.t0 = time.monotonic()

    def say(self, text: str) -> None:
        if not self.quiet:
            print(f"[{time.monotonic() - self.t0:6.1f}s] {text}", flush=True)

    # -- setup -----------------------------------------------------------------------

    async def setup(self) -> int:
        """Migrate, create the harness tables and groups, seed the jobs. Returns the
        number of jobs the run will have (seeds plus two drafts per search)."""
        p = self.profile
        async with make_queue(self.server.url, self.schema, p, "chaos-setup") as queue:
            make_pipeline(queue, Handlers(self.schema, "setup", p, 0), p)  # per-type attempts
            await queue.migrate()
            async with queue.connection() as conn:
                await conn.execute(sql.SQL(SETUP).format(schema=sql.Identifier(self.schema)))
            plans = [plan.id for plan in queue.plans]
            for i in range(9):
                await queue.upsert_group(f"g{i}", plan=plans[i % len(plans)],
                                         owner_id=f"owner{i % 5}")
            searches = p.jobs // 5
            enriches = p.jobs - 3 * searches
            kinds = ["search"] * searches + ["enrich"] * enriches
            self.rng.shuffle(kinds)
            items = [{"type": kind, "payload": {"i": i},
                      "group_id": None if i % 10 == 7 else f"g{self.rng.randrange(9)}"}
                     for i, kind in enumerate(kinds)]
            self.out.seeded = len(items)
            for start in range(0, len(items), 1000):
                await queue.enqueue_many(items[start:start + 1000])
        return enriches + searches + 2 * searches

    # -- workers -----------------------------------------------------------------------

    def spawn(self) -> Proc:
        self._spawned += 1
        name = f"w{self._spawned}"
        log_path = self.workdir / f"{name}.log"
        with open(log_path, "wb") as f:
            popen = subprocess.Popen(
                [sys.executable, "-m", "rota.chaos", "worker", "--database-url",
                 self.server.url, "--schema", self.schema, "--name", name,
                 "--profile", self.profile.to_json(),
                 "--seed", str(self.seed * 1000 + self._spawned)],
                stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        proc = Proc(name, popen, log_path)
        self.procs[name] = proc
        return proc

    def kill_one(self) -> None:
        # Prefer a worker that has been up long enough to be inside a run (a new one
        # spends most of its first second starting Python).
        grown = [n for n, p in self.procs.items() if time.monotonic() - p.started > 1.5]
        name = self.rng.choice(sorted(grown or self.procs))
        proc = self.procs.pop(name)
        proc.popen.send_signal(signal.SIGKILL)
        proc.popen.wait()
        at = datetime.now(UTC)  # after its death: later than anything it wrote
        self.out.kills.append(Kill(name, proc.popen.pid, at))
        self.spawn()

    def reap_crashed(self) -> None:
        for name, proc in list(self.procs.items()):
            if proc.popen.poll() is not None:
                self.out.crashed.append(f"{name} exited {proc.popen.returncode}")
                del self.procs[name]
                self.spawn()

    async def stop_workers(self) -> None:
        for proc in self.procs.values():
            proc.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.profile.time_budget + 20
        for name, proc in self.procs.items():
            try:
                await asyncio.to_thread(proc.popen.wait, max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.popen.send_signal(signal.SIGUSR1)  # its task stacks, into its log
                await asyncio.sleep(1)
                proc.popen.kill()
                proc.popen.wait()
                self.out.forced_stops.append(name)
            else:
                if proc.popen.returncode != 0:
                    self.out.crashed.append(f"{name} exited {proc.popen.returncode}")
        self.procs.clear()

    # -- the worker phase --------------------------------------------------------------

    async def progress(self, conn: AnyConn | None) -> tuple[AnyConn | None, dict[str, int]]:
        """Job counts by status (reconnecting after a restart; empty while down)."""
        try:
            if conn is None or conn.closed:
                conn = await psycopg.AsyncConnection.connect(
                    make_conninfo(self.server.url, application_name="chaos-monitor"),
                    autocommit=True, connect_timeout=2)
            cur = await conn.execute(sql.SQL("SELECT status, count(*) FROM {} GROUP BY 1")
                                     .format(sql.Identifier(self.schema, "jobs")))
            return conn, {str(s): int(n) for s, n in await cur.fetchall()}
        except (psycopg.Error, OSError):
            if conn is not None:
                await conn.close()
            return None, {}

    async def worker_phase(self, total: int) -> None:
        p = self.profile
        for _ in range(p.workers):
            self.spawn()
        start = time.monotonic()
        next_kill = start + self.rng.uniform(*p.kill_every)
        killing = True
        restart_task: asyncio.Task[None] | None = None
        conn: AnyConn | None = None
        last_report = 0.0
        counts: dict[str, int] = {}
        try:
            while time.monotonic() - start < p.deadline:
                await asyncio.sleep(0.2)
                self.reap_crashed()
                conn, now_counts = await self.progress(conn)
                counts = now_counts or counts
                finished = counts.get("done", 0) + counts.get("failed", 0)
                open_jobs = counts.get("pending", 0) + counts.get("running", 0)
                if killing and finished >= p.stop_killing_at * total and self.out.restarts:
                    killing = False
                    self.say(f"killing stops: {finished}/{total} finished")
                if killing and time.monotonic() >= next_kill:
                    self.kill_one()
                    next_kill = time.monotonic() + self.rng.uniform(*p.kill_every)
                if restart_task is None and finished >= p.restart_at * total:
                    restart_task = asyncio.create_task(self.restart())
                if time.monotonic() - last_report >= 5:
                    last_report = time.monotonic()
                    self.say(f"done={counts.get('done', 0)} failed={counts.get('failed', 0)} "
                             f"open={open_jobs} kills={len(self.out.kills)} "
                             f"restarts={len(self.out.restarts)}")
                # Nothing open: nothing can make more (a search makes its drafts only
                # when it completes), so the work is over (a failed search has none).
                if not killing and counts and open_jobs == 0:
                    break
            else:
                self.say("worker phase deadline reached; draining the rest")
            if restart_task is None:
                restart_task = asyncio.create_task(self.restart())
            await restart_task
        finally:
            if conn is not None:
                await conn.close()
            self.out.worker_phase_s = time.monotonic() - start
            await self.stop_workers()
        self.out.runs_raised = sum(
            proc_log.read_text(errors="replace").count("chaos-worker: run raised")
            for proc_log in self.workdir.glob("w*.log"))

    async def restart(self) -> None:
        began = datetime.now(UTC)
        self.say(f"restarting PostgreSQL ({self.server.kind})")
        await asyncio.to_thread(self.server.restart)
        ended = datetime.now(UTC)
        self.out.restarts.append((began, ended))
        self.say(f"PostgreSQL is back after {(ended - began).total_seconds():.1f}s")

    # -- the final drain ---------------------------------------------------------------

    async def drain(self) -> None:
        """Maintenance, then runs in this process until nothing is open, moving the
        queue's clock past stale locks, backoffs and deferrals instead of sleeping."""
        p = self.profile
        async with make_queue(self.server.url, self.schema, p, "chaos-final") as queue:
            pipeline = make_pipeline(queue, Handlers(self.schema, "final", p, self.seed), p)
            maintenance = make_maintenance(queue, p)
            queue.clock_offset = timedelta(seconds=p.stale_after + p.platform_timeout + 1)
            for rounds in range(1, 200):
                self.out.drain_rounds = rounds
                await maintenance.run_once()
                await pipeline.run(trigger="manual", time_budget=timedelta(seconds=4))
                async with queue.connection() as conn:
                    cur = await conn.execute(queue.sql("next_due"), {
                        "types": None, "offset": queue.clock_offset,
                        "stale_after": queue.stale_after})
                    row = await cur.fetchone()
                    cur = await conn.execute(sql.SQL(
                        "SELECT count(*) FROM {} WHERE status = 'running'"
                        " AND attempts >= max_attempts").format(queue.table("jobs")))
                    stuck = await cur.fetchone()
                due_in = None if row is None or row[0] is None else float(row[0])
                if due_in is None and (stuck is None or stuck[0] == 0):
                    break
                # Jump to the next due time; stuck jobs need their lock to go stale.
                step = p.stale_after if due_in is None else max(due_in, 0.0)
                queue.clock_offset += timedelta(seconds=step + 0.01)
            await maintenance.run_once()

    # -- the whole run ---------------------------------------------------------------

    async def run(self) -> Report:
        total = await self.setup()
        self.say(f"schema {self.schema}: {total} jobs, {self.profile.workers} workers, "
                 f"server {self.server.kind}")
        await self.worker_phase(total)
        self.say(f"worker phase over after {self.out.worker_phase_s:.1f}s; draining")
        await self.drain()
        async with await psycopg.AsyncConnection.connect(self.server.url,
                                                         autocommit=True) as conn:
            return await check(conn, self.schema, self.profile, self.out)

    async def drop_schema(self) -> None:
        async with await psycopg.AsyncConnection.connect(self.server.url,
                                                         autocommit=True) as conn:
            await conn.execute(sql.SQL("DROP SCHEMA {} CASCADE")
                               .format(sql.Identifier(self.schema)))


# -- the checks ---------------------------------------------------------------------


@dataclass
class Report:
    """What the checks found: figures for the summary line, notes that explain them,
    and violations (any makes the run fail)."""

    jobs: int = 0
    kills: int = 0
    restarts: int = 0
    lost: int = 0
    duplicated: int = 0
    hooks_missing: int = 0
    hooks_doubled: int = 0
    figures: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"jobs={self.jobs} kills={self.kills} restarts={self.restarts} "
                f"lost={self.lost} duplicated={self.duplicated} "
                f"hooks_missing={self.hooks_missing} hooks_doubled={self.hooks_doubled}")

    @property
    def ok(self) -> bool:
        return not self.violations and self.lost == 0 and self.hooks_missing == 0 \
            and self.hooks_doubled == 0


async def _rows(conn: AnyConn, schema: str, query: str) -> list[dict[str, Any]]:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(sql.SQL(query).format(schema=sql.Identifier(schema)))
    return await cur.fetchall()


async def check(conn: AnyConn, schema: str, profile: Profile, out: Outcome) -> Report:
    """Check the run's invariants from the tables (see the module docstring)."""
    r = Report(kills=len(out.kills), restarts=len(out.restarts))
    jobs = {j["id"]: j for j in await _rows(conn, schema, "SELECT * FROM {schema}.jobs")}
    log_rows = await _rows(conn, schema, "SELECT * FROM {schema}.chaos_log ORDER BY id")
    handler_runs = await _rows(conn, schema, "SELECT * FROM {schema}.chaos_handler_runs")
    effects = await _rows(conn, schema, "SELECT * FROM {schema}.chaos_effects")
    hooks = {h["job_id"]: h
             for h in await _rows(conn, schema, "SELECT * FROM {schema}.chaos_hooks")}
    runs = {x["id"]: x for x in await _rows(conn, schema, """
        SELECT r.*, o.app FROM {schema}.runs r
        LEFT JOIN {schema}.chaos_run_owner o ON o.run_id = r.id""")}
    r.jobs = len(jobs)
    status = Counter(j["status"] for j in jobs.values())
    r.figures["status"] = dict(status)
    killed_at: dict[str, datetime] = {f"chaos-{k.worker}": k.at for k in out.kills}
    kill_of = {k.worker: k for k in out.kills}
    # A run cut off by the restart was going when the server went down (or started
    # while the pools were reconnecting); it may record its end seconds later, once
    # psycopg_pool's reconnect backoff (1 s, 2 s, 4 s...) brings a connection back.
    restart_window = ((out.restarts[0][0], out.restarts[0][1]
                       + timedelta(seconds=profile.stale_after)) if out.restarts else None)

    def across_restart(run: dict[str, Any]) -> bool:
        return (restart_window is not None and run["started_at"] <= restart_window[1]
                and run["finished_at"] is not None and run["finished_at"] >= restart_window[0])

    # 1. Nothing lost: no job running; pending only with a due time; every done search
    #    has its two drafts (created in the search's own completing transaction).
    running = [j for j in jobs.values() if j["status"] == "running"]
    pending = [j for j in jobs.values() if j["status"] == "pending"]
    r.figures["pending_with_due_time"] = len(pending)
    for j in running:
        r.violations.append(f"job {j['id']} ({j['type']}) is still running after the drain")
    drafts_of: Counter[int] = Counter(
        int(j["payload"]["search"]) for j in jobs.values() if j["type"] == "draft")
    missing_drafts = 0
    for j in jobs.values():
        if j["type"] != "search":
            continue
        want = 2 if j["status"] == "done" else 0
        if drafts_of[j["id"]] != want:
            missing_drafts += abs(want - drafts_of[j["id"]])
            r.violations.append(f"search {j['id']} is {j['status']} with "
                                f"{drafts_of[j['id']]} draft jobs (expected {want})")
    r.lost = len(running) + missing_drafts
    done_searches = sum(1 for j in jobs.values()
                        if j["type"] == "search" and j["status"] == "done")
    if r.jobs != out.seeded + 2 * done_searches:
        r.violations.append(f"{r.jobs} jobs, expected {out.seeded} seeded + 2 drafts for "
                            f"each of {done_searches} done searches")

    # 2. Attempts = claims - deferrals, from the trigger's log of every claim.
    claims: dict[int, list[dict[str, Any]]] = defaultdict(list)
    deferrals: Counter[int] = Counter()
    by_token: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for row in log_rows:
        if row["new_token"] is not None and row["new_token"] != row["old_token"]:
            claims[row["job_id"]].append(row)
        if row["deferred"]:
            deferrals[row["job_id"]] += 1
        if row["old_token"] is not None:
            by_token[row["old_token"]].append(row)  # what became of a claim
    mismatched = 0
    for j in jobs.values():
        n_claims, n_defers = len(claims[j["id"]]), deferrals[j["id"]]
        if j["attempts"] != n_claims - n_defers or j["deferrals"] != n_defers:
            mismatched += 1
            if mismatched <= 10:
                r.violations.append(
                    f"job {j['id']}: attempts {j['attempts']} != claims {n_claims} - "
                    f"deferrals {n_defers} (deferrals column {j['deferrals']})")
    r.figures["claims"] = sum(len(c) for c in claims.values())
    r.figures["deferrals"] = sum(deferrals.values())
    if mismatched > 10:
        r.violations.append(f"... {mismatched} jobs in all with attempts != claims - deferrals")

    # 3. One worker at a time: handler runs of a job never overlap, and every stale
    #    reclaim took the job from a dead worker or a run that had ended.
    claim_of = {row["new_token"]: row for rows in claims.values() for row in rows}
    handler_of = {h["claim_token"]: h for h in handler_runs}

    def holder_gone(token: Any, at: datetime) -> str | None:
        """Why the claim ``token`` could no longer be running at ``at`` (or None)."""
        h = handler_of.get(token)
        c = claim_of.get(token)
        app = str(c["app"]) if c is not None else None
        if app in killed_at and killed_at[app] <= at:
            return f"{app.removeprefix('chaos-')} SIGKILLed"
        if h is not None and h["ended_at"] is not None and h["ended_at"] <= at:
            run = runs.get(c["run_id"]) if c is not None else None
            if run is not None and run["stop_reason"] == "error":
                return f"its run ended in error ({run['error']})"
            return "its handler had returned and the release did not land"
        if c is not None:
            run = runs.get(c["run_id"])
            if run is not None and run["finished_at"] is not None \
                    and run["finished_at"] <= at:
                return f"its run had ended ({run['stop_reason']}: {run['error']})"
        return None

    stale_reclaims = 0
    by_job_handlers: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for h in handler_runs:
        by_job_handlers[h["job_id"]].append(h)
        if h["starts"] != 1:
            r.violations.append(f"job {h['job_id']}: one claim's handler started "
                                f"{h['starts']} times")
    for job_id, rows in claims.items():
        for row in rows:
            if row["old_status"] != "running":
                continue
            stale_reclaims += 1
            gone = holder_gone(row["old_token"], row["at"])
            stale_for = row["new_locked"] - row["old_locked"]
            if stale_for < timedelta(seconds=profile.stale_after):
                r.violations.append(f"job {job_id}: reclaimed after {stale_for}, inside "
                                    f"the stale window")
            if gone is None:
                r.violations.append(f"job {job_id}: reclaimed from a live holder "
                                    f"(claim {row['old_token']})")
    r.figures["stale_reclaims"] = stale_reclaims
    overlaps = 0
    for job_id, rows in by_job_handlers.items():
        rows.sort(key=lambda h: h["started_at"])
        for a, b in itertools.pairwise(rows):
            end = a["ended_at"]
            if end is None:
                k = kill_of.get(str(a["worker"]))
                end = k.at if k is not None else None
            if end is None or end > b["started_at"]:
                overlaps += 1
                c = claim_of.get(b["claim_token"])
                how = ("a stale reclaim" if c is not None and c["old_status"] == "running"
                       else f"a claim from {c['old_status']}" if c is not None else "?")
                r.violations.append(
                    f"job {job_id}: handler of attempt {b['attempt']} ({b['worker']}, "
                    f"{how}) started at {b['started_at']:%T.%f} while attempt "
                    f"{a['attempt']} ({a['worker']}, started {a['started_at']:%T.%f}, "
                    f"outcome {a['outcome']}) had not ended")
    r.figures["overlaps"] = overlaps

    # 4. Side effects repeated in a later attempt, each explained by the earlier
    #    attempt's fate: its worker killed, or its run cut off mid-handler.
    effects_of: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in effects:
        effects_of[e["job_id"]].append(e)
        if e["same_attempt"]:
            r.violations.append(f"job {e['job_id']}: attempt {e['attempt']} wrote its "
                                f"effect {e['same_attempt'] + 1} times")
    reasons: Counter[str] = Counter()
    for job_id, es in sorted(effects_of.items()):
        es.sort(key=lambda e: e["at"])
        for a, b in itertools.pairwise(es):
            r.duplicated += 1
            why = explain_repeat(a, by_token.get(a["claim_token"], []), handler_of, runs,
                                 killed_at)
            if a["stage"] != "enrich":
                r.violations.append(f"job {job_id} ({a['stage']}): a transactional effect "
                                    f"repeated")
            if why is None:
                r.violations.append(f"job {job_id}: effect of attempt {a['attempt']} "
                                    f"repeated in attempt {b['attempt']}, unexplained")
                continue
            reasons[why.split(":")[0]] += 1
            r.notes.append(f"repeat: job {job_id} ({a['stage']}) attempt {a['attempt']} -> "
                           f"{b['attempt']}: {why}")
    r.figures["repeats_by_reason"] = dict(reasons)
    for j in jobs.values():
        if j["status"] == "done" and j["type"] in STAGES and not effects_of.get(j["id"]):
            r.violations.append(f"job {j['id']} is done without its side effect")

    # 5. Give-up hooks: exactly once per failed job, none for any other.
    for j in jobs.values():
        hook = hooks.get(j["id"])
        if j["status"] == "failed":
            if hook is None or j["give_up_pending"]:
                r.hooks_missing += 1
                r.violations.append(f"failed job {j['id']} has no give-up hook run")
            elif hook["runs"] != 1:
                r.hooks_doubled += 1
                r.violations.append(f"job {j['id']}: give-up hook ran {hook['runs']} times")
        elif hook is not None:
            r.hooks_doubled += 1
            r.violations.append(f"job {j['id']} is {j['status']} but its hook ran")
    fail_reasons = Counter(str(j["last_error"]).split(":")[0] for j in jobs.values()
                           if j["status"] == "failed")
    r.figures["failed_by"] = dict(fail_reasons)

    # 6. Runs: every run a killed worker was in ended error/killed; nothing unfinished;
    #    no live run marked killed; other errors only around the restart.
    # A killed worker's last run was going when it died (unless it had finished and the
    # worker was between runs, or it died before its first): that run must be marked
    # error/killed (ending at its last sign of life), and it is the only one marked.
    runs_of: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for x in runs.values():
        runs_of[str(x["app"])].append(x)
    killed_runs = 0
    kills_idle = 0
    for k in out.kills:
        mine = sorted(runs_of.get(f"chaos-{k.worker}", []), key=lambda x: x["started_at"])
        for x in mine[:-1]:
            if x["error"] == "killed":
                r.violations.append(f"run {x['id']} of {k.worker} was marked killed, but "
                                    f"{k.worker} went on to start another run")
        last = mine[-1] if mine else None
        if last is not None and last["error"] == "killed":
            killed_runs += 1
        elif last is None or (last["finished_at"] is not None
                              and last["finished_at"] <= k.at):
            kills_idle += 1  # before its first run, or between two runs
        else:
            r.violations.append(f"run {last['id']} of killed {k.worker} ended "
                                f"{last['stop_reason']} ({last['error']}), not error/killed")
    r.figures["kills_between_runs"] = kills_idle
    r.figures["killed_runs"] = killed_runs
    error_runs: Counter[str] = Counter()
    for x in runs.values():
        if x["finished_at"] is None or x["stop_reason"] is None:
            r.violations.append(f"run {x['id']} ({x['app']}) never finished")
        elif x["error"] == "killed" and x["app"] not in killed_at:
            r.violations.append(f"run {x['id']} of live {x['app']} was marked killed")
        elif x["stop_reason"] == "error" and x["error"] != "killed":
            error_runs[str(x["error"]).split(":")[0]] += 1
            if not across_restart(x):
                r.violations.append(f"run {x['id']} ended in error away from the restart: "
                                    f"{x['error']}")
    r.figures["runs"] = len(runs)
    if out.restarts:  # runs going when PostgreSQL came back up, and how they ended
        down, up = out.restarts[0]
        across = Counter("killed" if x["error"] == "killed" else str(x["stop_reason"])
                         for x in runs.values()
                         if x["started_at"] <= up and x["finished_at"] is not None
                         and x["finished_at"] >= up)
        r.figures["restart_seconds"] = round((up - down).total_seconds(), 2)
        r.figures["runs_across_restart"] = dict(across)
    r.figures["runs_ended_error_by_restart"] = dict(error_runs)
    r.figures["runs_raised"] = out.runs_raised
    for crashed in out.crashed:
        r.violations.append(f"worker {crashed} on its own")
    for name in out.forced_stops:
        r.violations.append(f"worker {name} did not stop on SIGTERM")
    if not out.restarts:
        r.violations.append("PostgreSQL was never restarted")
    if not out.kills:
        r.violations.append("no worker was killed")
    return r


def explain_repeat(effect: dict[str, Any], after: list[dict[str, Any]],
                   handler_of: dict[Any, dict[str, Any]], runs: dict[Any, dict[str, Any]],
                   killed_at: dict[str, datetime]) -> str | None:
    """Why the attempt that wrote ``effect`` did not complete its job, or ``None``.
    ``after`` is the log of what became of that claim (its next transition)."""
    token = effect["claim_token"]
    h = handler_of.get(token)
    app = f"chaos-{effect['worker']}"
    nxt = after[0] if after else None
    if nxt is not None and nxt["new_status"] == "done":
        return None  # completed: the repeat cannot be explained by this attempt
    if app in killed_at and killed_at[app] >= effect["at"]:
        where = "mid-handler" if h is None or h["ended_at"] is None else \
            "after its handler returned"
        return (f"killed: {effect['worker']} was SIGKILLed {where}, after the effect and "
                f"before the completion landed")
    run = runs.get(h["run_id"]) if h is not None else None
    if run is not None and run["stop_reason"] == "error" and run["error"] != "killed":
        return f"restart: its run was cut off by the database restart ({run['error']})"
    return None


# -- command line -------------------------------------------------------------------


def print_report(r: Report, *, verbose: bool) -> None:
    for key, value in r.figures.items():
        print(f"  {key}: {value}")
    notes = r.notes if verbose else r.notes[:20]
    for note in notes:
        print(f"  {note}")
    if len(notes) < len(r.notes):
        print(f"  ... {len(r.notes) - len(notes)} more repeats (--verbose lists them)")
    for v in r.violations[:50]:
        print(f"  VIOLATION: {v}")
    if len(r.violations) > 50:
        print(f"  ... {len(r.violations) - 50} more violations")
    print(r.summary(), flush=True)


async def harness_main(args: argparse.Namespace) -> int:
    profile = SHORT_PROFILE if args.short else DEFAULT_PROFILE
    if args.jobs is not None:
        profile = replace(profile, jobs=args.jobs)
    if args.workers is not None:
        profile = replace(profile, workers=args.workers)
    if profile.workers < 2:
        raise ConfigError("the chaos run needs at least 2 workers (overlapping runs)")
    url = None if args.embedded else (
        args.database_url if args.database_url is not None else os.environ.get("DATABASE_URL"))
    server: Server = ClusterPostgres.detect(url) if url else EmbeddedPostgres()
    workdir = Path(tempfile.mkdtemp(prefix="rota-chaos-"))
    started = time.monotonic()
    harness = Harness(server, profile, seed=args.seed, quiet=args.quiet, workdir=workdir)
    try:
        report = await harness.run()
        if not args.keep:
            await harness.drop_schema()
    finally:
        for proc in harness.procs.values():  # interrupted: leave no workers behind
            proc.popen.kill()
            proc.popen.wait()
        server.stop()
    report.figures["seconds"] = round(time.monotonic() - started, 1)
    if report.ok and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        report.figures["worker_logs"] = str(workdir)
    print_report(report, verbose=args.verbose)
    return 0 if report.ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rota.chaos [--short]`` (and, internally, ``... worker``)."""
    parser = argparse.ArgumentParser(prog="python -m rota.chaos", description=__doc__.split(
        "\n")[0] if __doc__ else None)
    parser.add_argument("--short", action="store_true", help="the short profile (CI)")
    parser.add_argument("--jobs", type=int, help="override the profile's job count")
    parser.add_argument("--workers", type=int, help="override the profile's worker count")
    parser.add_argument("--database-url", help="a local server to use and restart "
                        "(default DATABASE_URL; unset: an embedded server)")
    parser.add_argument("--embedded", action="store_true", help="use a private embedded "
                        "server even when DATABASE_URL is set (tests: restarting a shared "
                        "server would break what runs beside them)")
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    parser.add_argument("--quiet", action="store_true", help="print only the report")
    parser.add_argument("--verbose", action="store_true", help="list every repeat")
    parser.add_argument("--keep", action="store_true", help="keep the schema and logs")
    sub = parser.add_subparsers(dest="command")
    w = sub.add_parser("worker", help="internal: one worker process")
    w.add_argument("--database-url", required=True)
    w.add_argument("--schema", required=True)
    w.add_argument("--name", required=True)
    w.add_argument("--profile", required=True)
    w.add_argument("--seed", type=int, required=True)
    args = parser.parse_args(argv)
    if args.command == "worker":
        logging.basicConfig(level=logging.WARNING,
                            format="%(asctime)s %(name)s %(levelname)s %(message)s")
        return asyncio.run(worker_main(args.database_url, args.schema, args.name,
                                       Profile.from_json(args.profile), args.seed))
    logging.basicConfig(level=logging.ERROR, format="%(name)s %(levelname)s %(message)s")
    print(f"seed={args.seed}", flush=True)
    return asyncio.run(harness_main(args))


if __name__ == "__main__":
    sys.exit(main())
