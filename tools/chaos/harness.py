"""The chaos harness: sets up the schema and the jobs, spawns the worker processes,
SIGKILLs them at random and restarts PostgreSQL once, then drains what is left in
this process and hands the record to the checks."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from .checks import Kill, Outcome, Report, check
from .profile import Profile
from .servers import Server
from .workload import SETUP, AnyConn, Handlers, make_maintenance, make_pipeline, make_queue

if TYPE_CHECKING:
    from rota import Pipeline, Queue

# Workers are started as ``python -m tools.chaos worker``: the repository's root must be
# importable in them whatever directory the harness was started from.
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    started: float = field(default_factory=time.monotonic)



class Harness:
    """Runs one chaos run against ``server`` in a fresh schema."""

    #: Seconds a worker may take to stop on SIGTERM beyond its run's time budget.
    stop_grace = 20.0

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

    def make_pipeline(self, queue: Queue, handlers: Handlers) -> Pipeline:
        """The pipeline the workers run (the multi-host run adds a stage to it)."""
        return make_pipeline(queue, handlers, self.profile)

    def say(self, text: str) -> None:
        if not self.quiet:
            print(f"[{time.monotonic() - self.t0:6.1f}s] {text}", flush=True)

    # -- setup -----------------------------------------------------------------------

    async def setup(self) -> int:
        """Migrate, create the harness tables and groups, seed the jobs. Returns the
        number of jobs the run will have (seeds plus two drafts per search)."""
        p = self.profile
        async with make_queue(self.server.url, self.schema, p, "chaos-setup") as queue:
            self.make_pipeline(queue, Handlers(self.schema, "setup", p, 0))  # per-type attempts
            await queue.migrate()
            async with queue.connection() as conn:
                await conn.execute(sql.SQL(SETUP).format(schema=sql.Identifier(self.schema)))
            plans = [plan.id for plan in queue.plans]
            for i in range(9):
                await queue.upsert_group(f"g{i}", plan=plans[i % len(plans)],
                                         owner_id=f"owner{i % 5}")
            searches = p.jobs // 5
            runaways = round(p.jobs * p.runaway_share)
            enriches = p.jobs - 3 * searches - runaways
            kinds = ["search"] * searches + ["enrich"] * enriches + ["runaway"] * runaways
            self.rng.shuffle(kinds)
            items = [{"type": kind, "payload": {"i": i},
                      "group_id": None if i % 10 == 7 else f"g{self.rng.randrange(9)}"}
                     for i, kind in enumerate(kinds)]
            self.out.seeded = len(items)
            for start in range(0, len(items), 1000):
                await queue.enqueue_many(items[start:start + 1000])
            async with queue.connection() as conn:
                self.out.poison = await self.poison(conn)
            self.out.seeded += len(self.out.poison)
        return enriches + runaways + searches + 2 * searches + len(self.out.poison)

    async def poison(self, conn: AnyConn) -> list[int]:
        """Rows no Job can be made of, inserted by SQL (bypassing enqueue, so every
        column is given): payloads nested 3,000 deep (valid jsonb, deeper than Python's
        json will go) and created_at in year 10193 (valid timestamptz, past Python's
        datetime). Each must fail alone ("job N cannot be read: ...")."""
        deep = "[" * 3000 + "1" + "]" * 3000
        rows: list[tuple[str, str]] = []
        for n in range(self.profile.poison):
            if n % 2 == 0:
                rows.append((deep, "now()"))
            else:  # run_after stays now(): a run_after in 10193 would never be due
                rows.append(('{"poison": "year 10193"}', "'10193-06-01 00:00:00+00'"))
        ids: list[int] = []
        for n, (payload, created) in enumerate(rows):
            cur = await conn.execute(sql.SQL(
                "INSERT INTO {} (type, group_id, payload, max_attempts, run_after, created_at)"
                " VALUES (%s, %s, %s::jsonb, 3, now(), " + created + ") RETURNING id"
            ).format(sql.Identifier(self.schema, "jobs")),
                ("runaway" if n == 3 else "enrich", f"g{n % 9}", payload))
            row = await cur.fetchone()
            assert row is not None
            ids.append(int(row[0]))
        return ids

    # -- workers -----------------------------------------------------------------------

    def spawn(self) -> Proc:
        self._spawned += 1
        name = f"w{self._spawned}"
        log_path = self.workdir / f"{name}.log"
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        with open(log_path, "wb") as f:
            popen = subprocess.Popen(
                [sys.executable, "-m", "tools.chaos", "worker", "--database-url",
                 self.server.url, "--schema", self.schema, "--name", name,
                 "--profile", self.profile.to_json(),
                 "--seed", str(self.seed * 1000 + self._spawned)],
                stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONPATH": path})
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

    def kill_workers(self) -> None:
        """Kill every worker still running and reap it (an interrupted run leaves no
        workers behind)."""
        for proc in self.procs.values():
            proc.popen.kill()
            proc.popen.wait()

    async def stop_workers(self) -> None:
        for proc in self.procs.values():
            proc.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.profile.time_budget + self.stop_grace
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
                if proc.popen.returncode == -signal.SIGTERM:
                    # SIGTERM's default action: it came before the worker installed its
                    # handler (worker_main's first step), so before its first run, while
                    # Python was still starting. Stopped as asked, not crashed.
                    self.out.stopped_starting.append(name)
                elif proc.popen.returncode != 0:
                    self.out.crashed.append(f"{name} exited {proc.popen.returncode}")
        self.procs.clear()

    # -- the worker phase --------------------------------------------------------------

    def progress_query(self) -> sql.Composed:
        """Job counts by status (the multi-host run counts stuck jobs apart)."""
        return sql.SQL("SELECT status, count(*) FROM {} GROUP BY 1").format(
            sql.Identifier(self.schema, "jobs"))

    async def progress(self, conn: AnyConn | None) -> tuple[AnyConn | None, dict[str, int]]:
        """Job counts by status (reconnecting after a restart; empty while down)."""
        try:
            if conn is None or conn.closed:
                conn = await psycopg.AsyncConnection.connect(
                    make_conninfo(self.server.url, application_name="chaos-monitor"),
                    autocommit=True, connect_timeout=2)
            cur = await conn.execute(self.progress_query())
            return conn, {str(s): int(n) for s, n in await cur.fetchall()}
        except (psycopg.Error, OSError):
            if conn is not None:
                await conn.close()
            return None, {}

    async def watch(self, start: float, deadline: float) -> AsyncGenerator[dict[str, int], None]:
        """Every 0.2 s until ``deadline`` seconds after ``start``: reaps crashed workers
        and yields the job counts by status (the last ones read while the server is
        down). Says so when the deadline passes; closes its connection when it ends."""
        conn: AnyConn | None = None
        counts: dict[str, int] = {}
        try:
            while time.monotonic() - start < deadline:
                await asyncio.sleep(0.2)
                self.reap_crashed()
                conn, now_counts = await self.progress(conn)
                counts = now_counts or counts
                yield counts
            self.say("worker phase deadline reached; draining the rest")
        finally:
            if conn is not None:
                await conn.close()

    async def worker_phase(self, total: int) -> None:
        p = self.profile
        for _ in range(p.workers):
            self.spawn()
        start = time.monotonic()
        next_kill = start + self.rng.uniform(*p.kill_every)
        killing = True
        restart_task: asyncio.Task[None] | None = None
        last_report = 0.0
        try:
            async with aclosing(self.watch(start, p.deadline)) as ticks:
                async for counts in ticks:
                    finished = counts.get("done", 0) + counts.get("failed", 0)
                    open_jobs = counts.get("pending", 0) + counts.get("running", 0)
                    if (killing and finished >= p.stop_killing_at * total
                            and self.out.restarts):
                        killing = False
                        self.say(f"killing stops: {finished}/{total} finished")
                    if killing and time.monotonic() >= next_kill:
                        self.kill_one()
                        next_kill = time.monotonic() + self.rng.uniform(*p.kill_every)
                    if restart_task is None and finished >= p.restart_at * total:
                        restart_task = asyncio.create_task(self.restart())
                    if time.monotonic() - last_report >= 5:
                        last_report = time.monotonic()
                        self.say(f"done={counts.get('done', 0)} "
                                 f"failed={counts.get('failed', 0)} open={open_jobs} "
                                 f"kills={len(self.out.kills)} "
                                 f"restarts={len(self.out.restarts)}")
                    # Nothing open: nothing can make more (a search makes its drafts
                    # only when it completes), so the work is over (a failed search
                    # has none).
                    if not killing and counts and open_jobs == 0:
                        break
            if restart_task is None:
                restart_task = asyncio.create_task(self.restart())
            await restart_task
        finally:
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
            pipeline = self.make_pipeline(queue, Handlers(self.schema, "final", p, self.seed))
            maintenance = make_maintenance(pipeline.queue, p)
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
