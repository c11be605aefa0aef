"""The multi-host harness: :class:`tools.chaos.harness.Harness` with its workers spread
over namespaced hosts as ``rota worker`` processes, and a scenario of faults on their
links instead of random kills: a long cut, a short cut, a slow and lossy link, one
SIGKILL and one PostgreSQL restart, each after a wave of new jobs so it finds the hosts
busy. The final drain and the checks are the chaos run's."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from contextlib import aclosing
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from rota import Pipeline, Queue

from ..chaos.checks import Cut, Kill
from ..chaos.harness import Harness, Proc
from ..chaos.workload import AnyConn, Handlers, make_queue
from . import app, schedules
from .net import ROOT, Network
from .probe import ProbeResult, measure
from .profile import HostsProfile
from .server import BridgePostgres

PROBE_HOST = "probe"


@dataclass
class Fault:
    """One fault as it happened: what, on which host, to which workers, when."""

    kind: str  # long_cut, short_cut, slow, kill, restart
    host: str
    workers: list[str]
    start: datetime
    end: datetime
    how: str = ""


@dataclass
class HostsOutcome:
    faults: list[Fault] = field(default_factory=list)
    probe: ProbeResult | None = None
    host_of: dict[str, str] = field(default_factory=dict)  # worker -> host


class HostsHarness(Harness):
    """One multi-host run against ``server`` reached over ``network``'s links."""

    server: BridgePostgres
    # After the restart, a worker whose pool held several connections can spend up to
    # the pool's 30 s timeout in psycopg_pool's getconn: each dead connection fails
    # rota's check and the pool waits 1, 2, 4, 8... s before trying the next one.
    stop_grace = 45.0

    def __init__(self, server: BridgePostgres, network: Network, profile: HostsProfile, *,
                 seed: int, quiet: bool, workdir: Path) -> None:
        super().__init__(server, profile.workload, seed=seed, quiet=quiet, workdir=workdir)
        self.network = network
        self.hosts_profile = profile
        self.hosts = [h for h in network.hosts if h != PROBE_HOST]
        self.hosts_out = HostsOutcome()
        self._wave = 0

    def make_pipeline(self, queue: Queue, handlers: Handlers) -> Pipeline:
        return app.make_pipeline(queue, handlers, self.profile)

    # -- setup -----------------------------------------------------------------------

    async def setup(self) -> int:
        total = await super().setup()
        async with await self.connect() as conn:
            await conn.execute(sql.SQL(schedules.SETUP).format(
                schema=sql.Identifier(self.schema)))
        return total

    async def connect(self) -> AnyConn:
        return await psycopg.AsyncConnection.connect(
            make_conninfo(self.server.url, application_name="chaos-harness"), autocommit=True)

    async def add_wave(self, n: int | None = None) -> None:
        """Enqueue a wave of jobs (a fifth of them searches, as the seeds)."""
        n = self.hosts_profile.wave if n is None else n
        self._wave += 1
        searches = n // 5
        kinds = ["search"] * searches + ["enrich"] * (n - searches)
        self.rng.shuffle(kinds)
        items = [{"type": kind, "payload": {"wave": self._wave, "i": i},
                  "group_id": None if i % 10 == 7 else f"g{self.rng.randrange(9)}"}
                 for i, kind in enumerate(kinds)]
        async with make_queue(self.server.url, self.schema, self.profile,
                              "chaos-harness") as queue:
            await queue.enqueue_many(items)
        self.out.seeded += len(items)

    # -- workers -----------------------------------------------------------------------

    def workers_on(self, host: str) -> list[str]:
        return sorted(n for n in self.procs if self.hosts_out.host_of[n] == host)

    def spawn(self, host: str | None = None) -> Proc:
        """Start one ``rota worker`` inside ``host`` (default: the one with fewest)."""
        if host is None:
            host = min(self.hosts, key=lambda h: (len(self.workers_on(h)), h))
        self._spawned += 1
        name = f"{host}w{self._spawned}"
        self.hosts_out.host_of[name] = host
        log_path = self.workdir / f"{name}.log"
        rota = Path(sys.executable).with_name("rota")
        command = [str(rota)] if rota.exists() else [sys.executable, "-m", "rota.cli"]
        url = make_conninfo(self.server.url, application_name=f"chaos-{name}")
        env = {**os.environ, app.ENV_PROFILE: self.profile.to_json(), app.ENV_WORKER: name,
               app.ENV_SEED: str(self.seed * 1000 + self._spawned),
               "PYTHONPATH": os.pathsep.join(
                   p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
        with open(log_path, "wb") as f:
            popen = self.network.spawn(
                host, [*command, "worker", "--app", "tools.chaos_hosts.app:app",
                       "--database-url", url, "--schema", self.schema,
                       "--budget", f"{self.profile.time_budget:g}", "--idle-poll", "0.5"],
                stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                cwd=ROOT)
        proc = Proc(name, popen, log_path)
        self.procs[name] = proc
        return proc

    def kill_on(self, host: str) -> Fault:
        """SIGKILL one worker of ``host`` (one that has been up long enough to be in a
        run) and start another there."""
        name = self.rng.choice(self.workers_on(host))
        proc = self.procs.pop(name)
        start = datetime.now(UTC)
        proc.popen.send_signal(signal.SIGKILL)
        proc.popen.wait()
        at = datetime.now(UTC)  # after its death: later than anything it wrote
        self.out.kills.append(Kill(name, proc.popen.pid, at))
        self.spawn(host)
        return Fault("kill", host, [name], start, at)

    # -- the faults ----------------------------------------------------------------------

    async def held_by(self, host: str) -> set[tuple[int, object]]:
        """The jobs ``host``'s workers hold now: ``(id, claim_token)``."""
        apps = [f"chaos-{n}" for n in self.workers_on(host)]
        async with await self.connect() as conn:
            cur = await conn.execute(sql.SQL(
                "SELECT j.id, j.claim_token FROM {s}.jobs j "
                "JOIN {s}.chaos_run_owner o ON o.run_id = j.run_id "
                "WHERE j.status = 'running' AND o.app = ANY(%s)").format(
                    s=sql.Identifier(self.schema)), [apps])
            return {(int(i), t) for i, t in await cur.fetchall()}

    def _cut_done(self, workers: list[str], start: datetime, seconds: float) -> datetime:
        end = datetime.now(UTC)
        # What was sent during the cut lands at the next retransmission: up to about
        # the cut's length later (exponential backoff), or not at all once the
        # connection gave up (30 s, rota's default).
        slack = timedelta(seconds=seconds + 1)
        self.out.cuts += [Cut(w, start, end, slack) for w in workers]
        return end

    async def cut(self, kind: str, host: str, seconds: float, *,
                  until_reclaimed: float | None = None) -> Fault:
        """Cut ``host`` off for ``seconds``, from a moment it holds running jobs (a cut
        that finds it idle is undone at once and tried again, after another wave). With
        ``until_reclaimed``, the cut lasts until another host has reclaimed one of the
        jobs it held, at most that many seconds: behind a backlog, stale jobs wait
        their turn in the fair order."""
        for attempt in range(3):
            await self.wave_until_busy(host)
            workers = self.workers_on(host)
            start = datetime.now(UTC)  # before the rule: what it catches is after this
            self.network.cut(host)
            held = await self.held_by(host)
            if held or attempt == 2:
                break
            self.network.heal(host)
            self._cut_done(workers, start, 1.0)
            self.say(f"{kind}: {host} was idle when cut; again")
        self.say(f"{kind}: {host} ({', '.join(workers)}) cut off holding {len(held)} jobs")
        t0 = time.monotonic()
        await asyncio.sleep(seconds)
        if until_reclaimed is not None:
            while time.monotonic() - t0 < until_reclaimed:
                if not held or await self.still_held(held) != held:
                    break
                await asyncio.sleep(0.2)
        self.network.heal(host)
        elapsed = time.monotonic() - t0
        self.say(f"{kind}: {host} back after {elapsed:.1f}s")
        return Fault(kind, host, workers, start, self._cut_done(workers, start, elapsed))

    async def still_held(self, claims: set[tuple[int, object]]) -> set[tuple[int, object]]:
        """Which of ``claims`` (``(id, claim_token)``) still hold their running job."""
        async with await self.connect() as conn:
            cur = await conn.execute(sql.SQL(
                "SELECT id, claim_token FROM {}.jobs WHERE status = 'running' "
                "AND id = ANY(%s)").format(sql.Identifier(self.schema)),
                [[i for i, _ in claims]])
            return claims & {(int(i), t) for i, t in await cur.fetchall()}

    async def slow(self, host: str) -> Fault:
        """Slow ``host``'s link, from a moment it holds running jobs (tried again after
        another wave when it was idle), with jobs arriving all along."""
        p = self.hosts_profile
        for attempt in range(3):
            if not self.network.has_netem(host):
                await asyncio.to_thread(self.network.start_delayer, host, p.slow_delay_ms)
            await self.wave_until_busy(host)
            workers = self.workers_on(host)
            start = datetime.now(UTC)
            how = self.network.slow(host, p.slow_delay_ms, p.slow_loss)
            if await self.held_by(host) or attempt == 2:
                break
            self.network.heal(host)
            self.say(f"slow: {host} was idle; again")
        self.say(f"slow: {host} +{p.slow_delay_ms:g} ms, {p.slow_loss:.0%} loss ({how}) "
                 f"for {p.slow_seconds:g}s")
        # Keep a backlog: the other hosts claim faster, and a slow host claims only
        # what is still there after its round trips.
        t0 = time.monotonic()
        while (left := p.slow_seconds - (time.monotonic() - t0)) > 0:
            await asyncio.sleep(min(2.0, left))
            if left > 2.0:
                await self.add_wave(max(p.wave // 2, 1))
        self.network.heal(host)
        end = datetime.now(UTC)
        self.out.cuts += [Cut(w, start, end, timedelta(seconds=2), kind="slow")
                          for w in workers]
        return Fault("slow", host, workers, start, end, how)

    async def wait_until(self, query: str, params: list[object], seconds: float) -> bool:
        """Poll ``query`` (its first column) until it is true, at most ``seconds``."""
        deadline = time.monotonic() + seconds
        async with await self.connect() as conn:
            while time.monotonic() < deadline:
                cur = await conn.execute(sql.SQL(query).format(
                    schema=sql.Identifier(self.schema)), params)
                row = await cur.fetchone()
                if row is not None and row[0]:
                    return True
                await asyncio.sleep(0.05)
        return False

    async def wave_until_busy(self, host: str | None, at_least: int = 3) -> None:
        """Enqueue waves (at most three) until ``host`` (any host: None) holds at least
        ``at_least`` running jobs, so the fault that follows meets work in flight."""
        workers = [f"chaos-{n}" for n in (self.workers_on(host) if host else self.procs)]
        # Behind a long backlog the fault would meet the same work everywhere, and a
        # cut host's stale jobs would wait their turn in the fair order.
        await self.wait_until("SELECT count(*) < %s FROM {schema}.jobs "
                              "WHERE status IN ('pending', 'running')",
                              [self.hosts_profile.wave], 60)
        for _ in range(3):
            await self.add_wave()
            if await self.wait_until(
                    "SELECT count(*) >= %s FROM {schema}.jobs j "
                    "JOIN {schema}.chaos_run_owner o ON o.run_id = j.run_id "
                    "WHERE j.status = 'running' AND o.app = ANY(%s)",
                    [at_least, workers], 8):
                return
        self.say(f"{host or 'no host'} never held {at_least} running jobs")

    async def scenario(self) -> None:
        """The faults, one after another, each after a wave of jobs and once a handler
        runs where it strikes."""
        p = self.hosts_profile
        faults = self.hosts_out.faults
        workers = [f"chaos-{n}" for n in self.procs]
        if not await self.wait_until(  # every worker started (Python, then the app)
                "SELECT count(DISTINCT app) = %s FROM {schema}.chaos_run_owner "
                "WHERE app = ANY(%s)", [len(workers), workers], 90):
            self.say("not every worker started a run within 90s")
        long_host, short_host, slow_host = self.hosts[0], self.hosts[1], self.hosts[2]
        kill_host = self.hosts[-1] if len(self.hosts) > 3 else slow_host

        faults.append(await self.cut("long_cut", long_host, p.long_cut,
                                     until_reclaimed=p.long_cut_max))
        await asyncio.sleep(p.pause)
        faults.append(await self.cut("short_cut", short_host, p.short_cut))
        await asyncio.sleep(p.pause)
        faults.append(await self.slow(slow_host))
        await asyncio.sleep(p.pause)
        await self.wave_until_busy(kill_host, at_least=1)
        faults.append(self.kill_on(kill_host))
        self.say(f"kill: {faults[-1].workers[0]} SIGKILLed on {kill_host}")
        # Its replacement first: `rota worker` refuses to start (exit 2) when the
        # database is unreachable, as it is for a moment during the restart.
        replacement = f"chaos-{max(self.procs, key=lambda n: self.procs[n].started)}"
        await self.wait_until("SELECT count(*) > 0 FROM {schema}.chaos_run_owner "
                              "WHERE app = %s", [replacement], 90)
        await asyncio.sleep(p.pause)
        await self.wave_until_busy(None)
        began = datetime.now(UTC)
        await self.restart()
        faults.append(Fault("restart", "db", [], began, datetime.now(UTC),
                            self.server.kind))

    async def probe(self) -> None:
        if PROBE_HOST in self.network.hosts:
            self.hosts_out.probe = await measure(self.network, PROBE_HOST, self.server.url,
                                                 self.server.url)

    # -- the worker phase --------------------------------------------------------------

    def progress_query(self) -> sql.Composed:
        # A job whose last attempt's run was cut off (by the restart, a kill or a cut)
        # stays running until the stuck-jobs sweep (`rota worker` runs it every
        # minute): counted apart, so the phase can end; the final drain sweeps it.
        return sql.SQL(
            "SELECT CASE WHEN status = 'running' AND attempts >= max_attempts "
            "AND locked_at < now() - {} THEN 'stuck' ELSE status END, count(*) "
            "FROM {} GROUP BY 1").format(
                sql.Literal(timedelta(seconds=self.profile.stale_after)),
                sql.Identifier(self.schema, "jobs"))

    async def worker_phase(self, total: int) -> None:
        p = self.hosts_profile
        for host in self.hosts:
            for _ in range(p.workers_per_host):
                self.spawn(host)
        start = time.monotonic()
        scenario = asyncio.create_task(self.scenario())
        probe = asyncio.create_task(self.probe())
        last_report = 0.0
        try:
            async with aclosing(self.watch(start, p.deadline)) as ticks:
                async for counts in ticks:
                    if scenario.done():
                        scenario.result()  # raise what it raised
                    open_jobs = counts.get("pending", 0) + counts.get("running", 0)
                    if time.monotonic() - last_report >= 5:
                        last_report = time.monotonic()
                        self.say(f"done={counts.get('done', 0)} "
                                 f"failed={counts.get('failed', 0)} open={open_jobs} "
                                 f"stuck={counts.get('stuck', 0)}")
                    if scenario.done() and probe.done() and counts and open_jobs == 0:
                        break
            await scenario
            await probe
        finally:
            for task in (scenario, probe):
                if not task.done():
                    task.cancel()
            await asyncio.gather(scenario, probe, return_exceptions=True)
            for name in list(self.network.hosts):
                self.network.heal(name)
            self.out.worker_phase_s = time.monotonic() - start
            await self.stop_workers()

    def reap_crashed(self) -> None:
        for name, proc in list(self.procs.items()):
            if proc.popen.poll() is not None:
                self.out.crashed.append(f"{name} exited {proc.popen.returncode}")
                del self.procs[name]
                self.spawn(self.hosts_out.host_of[name])


def seed_default() -> int:
    return random.SystemRandom().randrange(100_000)


def keep_logs(workdir: Path, ok: bool, keep: bool) -> str | None:
    if ok and not keep:
        shutil.rmtree(workdir, ignore_errors=True)
        return None
    return str(workdir)
