"""The demo run (``rota-demo``): the example pipeline end to end, driven only through
``GET /api/cron``.

What it does:
1. Uses ``DATABASE_URL``, or starts a throwaway embedded PostgreSQL.
2. Migrates rota and the example application into fresh schemas of their own.
3. Serves the sample brand pages and a YouTube Data API stand-in on loopback.
4. Seeds campaigns across the three plans (one very large Pro campaign).
5. Starts ``rota serve`` (the cron endpoint) in its own process with a generated secret,
   and calls it over HTTP like a scheduler would: one call at a time, two overlapping
   calls, and one call to a second server process that is SIGKILLed halfway.
6. Runs ``rota maintain`` (stuck jobs, killed runs), then prints a report and checks
   that no job was lost. Exit status 1 when an invariant fails.

Durations are compressed by the app's ``fast`` profile (3 s budget, 6 s platform timeout,
8 s stale window, 1 s backoff), not by special code paths.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import click
import httpx
import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table

from rota import Queue, db

from . import app as demo_app
from . import customers
from .brief import pages_app
from .loopback import serve_in_thread
from .youtube import stand_in_app

# Wide when not a terminal, so logs (CI, `| tee`) keep whole table cells.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 130)


def say(text: str = "") -> None:
    """One line of the report, never broken by the console (a line too long for the
    terminal wraps there, not at a width rich guessed): the report keeps each line to
    one statement instead."""
    console.print(text, soft_wrap=True)


def num(value: int | float) -> str:
    """A count as the whole report writes counts: with thousands separators."""
    return f"{value:,}"


@dataclass
class DemoConfig:
    """One demo profile: how much to seed and how to drive it."""

    per_plan: dict[str, int]
    big_results: int
    queries: int
    prespent_units: int
    error_rate: float
    timeout_rate: float
    llm_failure_rate: float
    max_seconds: float
    kill_after: float = 1.5


PROFILES = {
    "default": DemoConfig({"pro": 8, "standard": 11, "free": 12}, big_results=50, queries=2,
                          prespent_units=3_000, error_rate=0.03, timeout_rate=0.01,
                          llm_failure_rate=0.3, max_seconds=240),
    "short": DemoConfig({"pro": 3, "standard": 3, "free": 4}, big_results=15, queries=2,
                        prespent_units=7_400, error_rate=0.03, timeout_rate=0.0,
                        llm_failure_rate=0.3, max_seconds=150),
}


@dataclass
class Run:
    label: str
    body: dict[str, Any] = field(default_factory=dict)
    status: int = 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def _database(url: str | None) -> Iterator[str]:
    if url:
        yield db.check_conninfo(url)
        return
    console.print("[dim]DATABASE_URL is not set: starting a throwaway PostgreSQL…[/dim]")
    server = db.EmbeddedServer()
    try:
        yield server.url
    finally:
        server.stop()


class Demo:
    def __init__(self, url: str, config: DemoConfig, seed: int) -> None:
        self.url = url
        self.config = config
        self.rng = random.Random(seed)
        tag = secrets.token_hex(4)  # not seeded: concurrent demos on one database never collide
        self.schema = f"rota_demo_{tag}"
        self.app_schema = f"rota_demo_app_{tag}"
        self.secret = secrets.token_urlsafe(32)
        self.env = {
            **os.environ,
            "DATABASE_URL": url,
            "ROTA_SCHEMA": self.schema,
            "ROTA_APP": "rota_demo.app:build_pipeline",
            "ROTA_DEMO_SCHEMA": self.app_schema,
            "ROTA_DEMO_PROFILE": "fast",
            "ROTA_DEMO_LLM_FAILURE_RATE": str(config.llm_failure_rate),
            "CRON_SECRET": self.secret,
        }
        self.runs: list[Run] = []
        self.servers: list[subprocess.Popen[bytes]] = []
        self.stops: list[Any] = []

    # -- setup ------------------------------------------------------------------------

    async def setup(self) -> Queue:
        os.environ["ROTA_DEMO_SCHEMA"] = self.app_schema
        os.environ["ROTA_DEMO_PROFILE"] = "fast"
        pages_url, stop_pages = serve_in_thread(pages_app())
        youtube_url, stop_youtube = serve_in_thread(stand_in_app(
            seed=7, error_rate=self.config.error_rate, timeout_rate=self.config.timeout_rate,
            timeout_delay=3.0))
        self.stops += [stop_pages, stop_youtube]
        self.youtube_url = youtube_url
        self.env["ROTA_DEMO_YOUTUBE_URL"] = f"{youtube_url}/youtube/v3"
        queue = Queue(self.url, schema=self.schema, **{
            k: v for k, v in demo_app.queue_settings().items() if k != "schema"})
        await queue.open()
        await queue.migrate()
        async with queue.connection() as conn:
            await demo_app.migrate_app(conn, self.app_schema)
            async with conn.transaction():
                self.campaigns = await demo_app.seed(
                    conn, queue, pages_url,
                    demo_app.SeedPlan(self.config.per_plan, self.config.big_results,
                                      self.config.queries), rng=self.rng)
        if self.config.prespent_units:
            await demo_app.YOUTUBE_QUOTA.spend(queue, self.config.prespent_units, use_reserve=True)
        say(f"seeded {len(self.campaigns)} campaigns "
            f"({', '.join(f'{n} {p}' for p, n in self.config.per_plan.items())}); "
            f"schemas {self.schema} / {self.app_schema}.")
        say(f"  YouTube quota: {num(self.config.prespent_units)} of "
            f"{num(demo_app.YOUTUBE_QUOTA.daily_units)} units spent earlier today")
        return queue

    def start_server(self) -> tuple[str, subprocess.Popen[bytes]]:
        port = _free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "rota.cli", "serve", "--host", "127.0.0.1",
             "--port", str(port), "--budget", "3"],
            env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            # Its own session: a Ctrl-C at the terminal reaches the demo alone, which
            # stops its servers in its cleanup instead of losing them mid-call.
            start_new_session=True)
        self.servers.append(proc)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise click.ClickException(f"rota serve exited with {proc.returncode}")
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    return base, proc
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise click.ClickException("rota serve did not start within 30 s")

    # -- driving ----------------------------------------------------------------------

    async def call(self, http: httpx.AsyncClient, base: str, label: str) -> Run:
        run = Run(label)
        self.runs.append(run)
        resp = await http.get(f"{base}/api/cron",
                              headers={"Authorization": f"Bearer {self.secret}"}, timeout=60)
        run.status = resp.status_code
        run.body = resp.json()
        return run

    async def kill_mid_run(self, http: httpx.AsyncClient) -> None:
        base, victim = self.start_server()
        task = asyncio.create_task(self.call(http, base, "killed"))
        await asyncio.sleep(self.config.kill_after)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        try:
            await task
        except httpx.HTTPError as exc:
            self.runs[-1].body = {"error": f"connection lost: {type(exc).__name__}"}
        say(f"  [red]SIGKILLed[/red] a cron invocation {self.config.kill_after} s into its "
            f"run (pid {victim.pid}).")

    async def counts(self, queue: Queue) -> dict[str, int]:
        """Jobs by state. ``running`` counts live locks only; a stale lock with attempts
        left is ``due`` (claimable again); one with attempts used up is ``stuck`` (for
        maintenance)."""
        async with queue.connection() as conn:
            cur = await conn.execute(sql.SQL("""
                SELECT count(*) FILTER (WHERE status = 'done'),
                       count(*) FILTER (WHERE status = 'failed'),
                       count(*) FILTER (WHERE status = 'running' AND NOT stale),
                       count(*) FILTER (WHERE (status = 'pending'
                                               AND run_after <= now() + interval '30 s')
                                           OR (status = 'running' AND stale
                                               AND attempts < max_attempts)),
                       count(*) FILTER (WHERE status = 'running' AND stale
                                          AND attempts >= max_attempts),
                       count(*) FILTER (WHERE status = 'pending'
                                          AND run_after > now() + interval '30 s'),
                       count(*)
                FROM (SELECT *, locked_at < now() - %s AS stale FROM {}.jobs) j
                """).format(sql.Identifier(self.schema)), [queue.stale_after])
            row = await cur.fetchone()
        assert row is not None
        return dict(zip(("done", "failed", "running", "due", "stuck", "later", "total"), row,
                        strict=True))

    async def drive(self, queue: Queue) -> None:
        base, _ = self.start_server()
        started = time.monotonic()
        events = {2: "kill", 3: "overlap"}
        async with httpx.AsyncClient() as http:
            with Progress(TextColumn("{task.description}"), BarColumn(),
                          TextColumn("{task.fields[detail]}"), console=console,
                          transient=False) as progress:
                bar = progress.add_task("jobs settled", total=1, detail="")
                n = 0
                while time.monotonic() - started < self.config.max_seconds:
                    n += 1
                    event = events.get(n)
                    if event == "overlap":
                        await asyncio.gather(self.call(http, base, "overlap A"),
                                             self.call(http, base, "overlap B"))
                    elif event == "kill":
                        await self.kill_mid_run(http)
                    else:
                        await self.call(http, base, "cron")
                    c = await self.counts(queue)
                    progress.update(bar, total=c["total"], completed=c["done"] + c["failed"],
                                    detail=f"{c['done']} done, {c['failed']} failed, "
                                           f"{c['running']} running, {c['due']} due, "
                                           f"{c['stuck']} stuck, "
                                           f"{c['later']} waiting for a reset")
                    last = self.runs[-1].body
                    # Done once nothing is due and the last run ended for want of work
                    # (not its budget, which a stage waiting for its rate limit may
                    # have spent sleeping).
                    if c["due"] == 0 and c["running"] == 0 and n > 3 and \
                            last.get("stopReason") != "time_budget":
                        break
                    if not last.get("jobsDone") and not last.get("jobsFailed"):
                        # Nothing was ready (retries backing off): a scheduler calls again
                        # a little later rather than at once.
                        await asyncio.sleep(1.0)
                    if c["due"] == 0 and c["running"] > 0:
                        await asyncio.sleep(1.0)  # the killed run's locks go stale

    def maintain(self) -> str:
        # A killed run is recognized once its last heartbeat is older than the stale
        # window (8 s in the fast profile; docs/design.md, "Maintenance").
        time.sleep(demo_app.profile().stale_after.total_seconds() + 0.5)
        out = subprocess.run([sys.executable, "-m", "rota.cli", "maintain", "--json"],
                             env=self.env, capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise click.ClickException(f"rota maintain failed: {out.stderr.strip()}")
        return out.stdout.strip()

    # -- report -----------------------------------------------------------------------

    def fairness_lines(self, waits: list[dict[str, Any]], medians: dict[str, float],
                       pending: list[dict[str, Any]]) -> list[str]:
        """What the fair claim did in this demo, in plain words and its own figures:
        plans in priority order, and within a plan the largest campaign beside the
        others (docs/design.md, "The fair claim")."""
        lines = ["fairness: each claim takes the highest plan first, then within a plan the "
                 "campaign served least, then the oldest job."]
        done = [p for p in ("pro", "standard", "free") if p in medians]
        if done:
            lines.append("  By plan: " + ", ".join(
                f"{p} jobs waited a median {medians[p]:.1f} s" for p in done) + ".")
        for plan in ("pro", "standard", "free"):
            if plan in medians or plan not in self.config.per_plan:
                continue
            left = {r["type"]: int(r["pending"]) for r in pending if r["plan"] == plan}
            what = ", ".join(f"{num(n)} {t}" for t, n in sorted(left.items())) or "none"
            lines.append(f"  No {plan} job was done: its campaigns' searches come after the "
                         f"higher plans' in each claim, and the YouTube quota was down to "
                         f"its reserve before their turn (runs stopped quota_reserve); "
                         f"{plan} jobs pending: {what}.")
        for plan in done:
            by_group: dict[str, list[float]] = {}
            for x in waits:
                if x["plan"] == plan and x["group_id"] is not None:
                    by_group.setdefault(x["group_id"], []).append(float(x["wait"]))
            if len(by_group) < 2:
                continue
            big = max(by_group, key=lambda g: len(by_group[g]))
            others = [w for g, ws in by_group.items() if g != big for w in ws]
            lines.append(
                f"  Within {plan}: the largest campaign ({num(len(by_group[big]))} jobs "
                f"done) waited a median {statistics.median(by_group[big]):.1f} s, the "
                f"{len(by_group) - 1} others ({num(len(others))} jobs) "
                f"{statistics.median(others):.1f} s: the least-served campaign goes first, "
                f"so a large one does not crowd out the small ones.")
        return lines

    async def report(self, queue: Queue, maintained: str) -> int:
        s, a = sql.Identifier(self.schema), sql.Identifier(self.app_schema)
        async with queue.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(sql.SQL(
                "SELECT id, trigger, stop_reason, jobs_done, jobs_failed, jobs_deferred,"
                " quota_units, error,"
                " round(extract(epoch FROM finished_at - started_at)::numeric, 1) AS seconds"
                " FROM {}.runs ORDER BY started_at").format(s))
            runs = await cur.fetchall()
            await cur.execute(sql.SQL(
                "SELECT coalesce(g.plan, 'none') AS plan, j.group_id,"
                " extract(epoch FROM j.finished_at - j.created_at) AS wait"
                " FROM {s}.jobs j LEFT JOIN {a}.campaign_groups g ON g.group_id = j.group_id"
                " WHERE j.status = 'done'").format(s=s, a=a))
            waits = await cur.fetchall()
            await cur.execute(sql.SQL(
                "SELECT coalesce(g.plan, 'none') AS plan, j.type, count(*) AS pending"
                " FROM {s}.jobs j LEFT JOIN {a}.campaign_groups g ON g.group_id = j.group_id"
                " WHERE j.status = 'pending' GROUP BY 1, 2").format(s=s, a=a))
            pending = await cur.fetchall()
            await cur.execute(sql.SQL(
                "SELECT type, count(*) FILTER (WHERE status = 'done') AS done,"
                " count(*) FILTER (WHERE status = 'failed') AS failed,"
                " count(*) FILTER (WHERE status = 'pending') AS pending,"
                " count(*) FILTER (WHERE status = 'running') AS running,"
                " sum(deferrals) AS deferrals FROM {}.jobs GROUP BY type ORDER BY type")
                .format(s))
            by_type = await cur.fetchall()
            await cur.execute(sql.SQL(
                "SELECT count(*) FILTER (WHERE kind = 'spend') AS spends,"
                " count(*) FILTER (WHERE kind = 'refund') AS refunds FROM {}.credit_ledger")
                .format(a))
            ledger = await cur.fetchone()
            await cur.execute(sql.SQL(
                "SELECT count(*) FILTER (WHERE status = 200) AS answered,"
                " count(*) FILTER (WHERE status = 429) AS refused,"
                " extract(epoch FROM max(at) FILTER (WHERE status = 200)"
                "   - min(at) FILTER (WHERE status = 200))::float8 AS busy_s,"
                " (SELECT max(n) FROM (SELECT count(*) OVER (ORDER BY at RANGE BETWEEN"
                "   CURRENT ROW AND interval '59.999999 s' FOLLOWING) AS n"
                "   FROM {a}.llm_requests WHERE status = 200) m) AS busiest_minute,"
                " (SELECT max(n) FROM (SELECT count(*) OVER (ORDER BY at RANGE BETWEEN"
                "   CURRENT ROW AND interval '9.999999 s' FOLLOWING) AS n"
                "   FROM {a}.llm_requests WHERE status = 200) m) AS busiest_10s"
                " FROM {a}.llm_requests").format(a=a))
            model_calls = await cur.fetchone()
            checks = await self.invariants(cur)
            checks.append(("the fair claim's bookkeeping matches the jobs (rota verify)",
                           not await queue.verify()))
            lost_jobs = await self.lost_jobs(cur, queue)
        async with httpx.AsyncClient() as http:
            usage = (await http.get(f"{self.youtube_url}/youtube/v3/_usage", timeout=5)).json()
        quota = await demo_app.YOUTUBE_QUOTA.usage(queue)

        t = Table(title="runs (each cron invocation's row)")
        for col in ("trigger", "stop reason", "done", "failed", "deferred", "quota units",
                    "seconds", "error"):
            t.add_column(col, justify="right" if col in (
                "done", "failed", "deferred", "quota units", "seconds") else "left")
        idle = 0  # consecutive runs that found nothing to do, shown as one row
        for i, r in enumerate(runs):
            if r["jobs_done"] == r["jobs_failed"] == r["jobs_deferred"] == 0 and not r["error"]:
                idle += 1
                nxt = runs[i + 1] if i + 1 < len(runs) else None
                if nxt is not None and nxt["stop_reason"] == r["stop_reason"] and \
                        nxt["jobs_done"] == nxt["jobs_failed"] == nxt["jobs_deferred"] == 0:
                    continue
                if idle > 1:
                    t.add_row(f"{r['trigger']} ×{idle}", str(r["stop_reason"]), "0", "0", "0",
                              "0", "", "(runs with nothing to do)")
                    idle = 0
                    continue
            idle = 0
            t.add_row(r["trigger"], str(r["stop_reason"] or "(unfinished)"),
                      num(r["jobs_done"]), num(r["jobs_failed"]), num(r["jobs_deferred"]),
                      num(r["quota_units"]),
                      "" if r["seconds"] is None else f"{r['seconds']:.1f}",
                      (r["error"] or "")[:40])
        console.print(t)
        overlapping = sum(1 for r in self.runs if r.label.startswith("overlap"))
        say(f"{len(runs)} runs, {overlapping} of them overlapping, 1 SIGKILLed.")
        say(f"quota units: YouTube Data API units a run spent (a search costs 100, a "
            f"channel or comments lookup 1; {num(demo_app.YOUTUBE_QUOTA.daily_units)} a "
            f"day).")
        say()

        t = Table(title="wait from enqueue to done, per plan (seconds)")
        for col in ("plan", "jobs done", "median", "longest"):
            t.add_column(col, justify="left" if col == "plan" else "right")
        medians: dict[str, float] = {}
        for plan in ("pro", "standard", "free"):
            w = [float(x["wait"]) for x in waits if x["plan"] == plan]
            if w:
                medians[plan] = statistics.median(w)
                t.add_row(plan, num(len(w)), f"{medians[plan]:.1f}", f"{max(w):.1f}")
        console.print(t)
        for line in self.fairness_lines(waits, medians, pending):
            say(line)
        say()

        t = Table(title="jobs per stage")
        for col in ("stage", "done", "failed", "pending", "running", "deferrals"):
            t.add_column(col, justify="left" if col == "stage" else "right")
        for r in by_type:
            t.add_row(r["type"], *(num(int(r[k])) for k in ("done", "failed", "pending",
                                                          "running", "deferrals")))
        console.print(t)
        totals = {k: sum(int(r[k]) for r in by_type) for k in ("done", "failed", "pending")}
        deferrals = sum(int(r["deferrals"]) for r in by_type)
        say(f"jobs: {num(totals['done'])} done, {num(totals['failed'])} failed, "
            f"{num(totals['pending'])} pending with a due time; {num(deferrals)} "
            f"deferral{'' if deferrals == 1 else 's'}.")
        say()
        say(f"YouTube quota, as rota counts it: {num(quota.used)} of {num(quota.limit or 0)} "
            f"units used today ({num(self.config.prespent_units)} before the demo; the "
            f"last {num(demo_app.YOUTUBE_QUOTA.reserve)} are a reserve no run spends).")
        say(f"  The stand-in API charged {num(usage['units'])} units and answered "
            f"{num(usage['quotaExceeded'])} quotaExceeded.")
        say(f"  It did not charge for {num(usage['injectedErrors'])} injected errors and "
            f"{num(usage['injectedTimeouts'])} timeouts: rota counts units before each "
            f"call, so failed calls count too.")
        assert model_calls is not None
        rpm = demo_app.llm_rpm()
        answered, busy = int(model_calls["answered"]), model_calls["busy_s"] or 0.0
        reached = (answered - 1) / busy * 60 if answered > 1 and busy > 0 else 0.0
        busiest = int(model_calls["busiest_10s"] or 0) * 6
        say(f"language model: the stand-in allows {num(rpm)} requests a minute, refilled "
            f"continuously, bursts of {max(rpm // 60, 1)}.")
        say(f"  {num(answered)} answered, {num(int(model_calls['refused']))} answered 429; "
            f"rate reached: {num(busiest)}/min over the busiest 10 s ({busiest / rpm:.0%} of "
            f"the limit), {num(round(reached))}/min over the {busy:.0f} s it was busy.")
        checks.append(("the language model never answered 429 (rota kept every worker "
                       "to its requests per minute)", int(model_calls["refused"]) == 0))
        assert ledger is not None
        say(f"draft credits: {num(ledger['spends'])} spent, {num(ledger['refunds'])} "
            f"refunded (drafts that gave up).")
        counters = json.loads(maintained)
        say("maintenance (rota maintain): " + ", ".join(
            f"{k}={num(v)}" for k, v in counters.items()))
        reasons = sorted({str(r["stop_reason"]) for r in runs})
        say(f"stop reasons seen: {', '.join(reasons)}")
        for j in lost_jobs:  # what a failed "no job left running" check is about
            say(f"  [red]left {j['status']}[/red]: job {j['id']} ({j['type']}), "
                          f"attempts {j['attempts']}/{j['max_attempts']}, lock "
                          f"{j['lock_age']} s old (stale after {j['stale_s']} s), "
                          f"run_after in {j['due_in']} s, row locked now: {j['row_locked']}, "
                          f"claimed by run {j['run_id']} ({j['run_stop']}, {j['run_error']})")
        failed = [name for name, ok in checks if not ok]
        for name, ok in checks:
            say(f"  [{'green' if ok else 'red'}]{'ok ' if ok else 'BAD'}[/] {name}")
        if failed:
            console.print(f"[red]invariants failed: {', '.join(failed)}[/red]")
            return 1
        console.print("[green]no job lost: every job is done, failed, or pending with a due "
                      "time[/green]")
        return 0

    async def lost_jobs(self, cur: Any, queue: Queue) -> list[dict[str, Any]]:
        """Jobs the first invariant counts, with what explains them (lock age, whether a
        transaction holds the row, the run that claimed them)."""
        s = sql.Identifier(self.schema)
        await cur.execute(sql.SQL(
            "SELECT j.id, j.type, j.status, j.attempts, j.max_attempts,"
            " round(extract(epoch FROM now() - j.locked_at)::numeric, 1) AS lock_age,"
            " extract(epoch FROM %s::interval)::int AS stale_s,"
            " round(extract(epoch FROM j.run_after - now())::numeric, 1) AS due_in,"
            " NOT EXISTS (SELECT 1 FROM (SELECT 1 FROM {s}.jobs x WHERE x.id = j.id"
            "   FOR UPDATE SKIP LOCKED) l) AS row_locked,"
            " j.run_id, r.stop_reason AS run_stop, r.error AS run_error"
            " FROM {s}.jobs j LEFT JOIN {s}.runs r ON r.id = j.run_id"
            " WHERE j.status = 'running' OR (j.status = 'pending' AND j.run_after IS NULL)"
            " ORDER BY j.id LIMIT 20").format(s=s), [queue.stale_after])
        rows: list[dict[str, Any]] = await cur.fetchall()
        return rows

    async def invariants(self, cur: Any) -> list[tuple[str, bool]]:
        s, a = sql.Identifier(self.schema), sql.Identifier(self.app_schema)

        async def one(query: str) -> Any:
            await cur.execute(sql.SQL(query).format(s=s, a=a))
            row = await cur.fetchone()
            return next(iter(row.values()))

        lost = await one("SELECT count(*) FROM {s}.jobs WHERE status = 'running'"
                         " OR (status = 'pending' AND run_after IS NULL)")
        orphans = await one(
            "SELECT count(*) FROM {a}.creators c WHERE NOT EXISTS (SELECT 1 FROM {s}.jobs j"
            " WHERE j.type = 'enrich' AND j.payload->>'campaign_id' = c.campaign_id::text"
            " AND j.payload->>'channel_id' = c.channel_id)")
        next_missing = await one(
            "SELECT count(*) FROM {s}.jobs j JOIN (VALUES ('enrich','score'),"
            " ('comments','rationale'), ('rationale','contacts'), ('contacts','draft'))"
            " AS n(stage, next) ON n.stage = j.type WHERE j.status = 'done'"
            " AND NOT EXISTS (SELECT 1 FROM {s}.jobs k WHERE k.type = n.next"
            " AND k.payload = j.payload)")
        double = await one(
            "SELECT count(*) FROM (SELECT s.job_id FROM {a}.credit_ledger s"
            " WHERE s.kind = 'spend' AND NOT EXISTS (SELECT 1 FROM {a}.credit_ledger r"
            " WHERE r.refund_of = s.id) GROUP BY 1 HAVING count(*) > 1) x")
        refunds_ok = await one(
            "SELECT NOT EXISTS (SELECT 1 FROM {s}.jobs j JOIN {a}.credit_ledger s"
            " ON s.job_id = j.id AND s.kind = 'spend'"
            " WHERE j.type = 'draft' AND j.status = 'failed' AND NOT EXISTS ("
            " SELECT 1 FROM {a}.credit_ledger r WHERE r.refund_of = s.id))")
        hooks_owed = await one("SELECT count(*) FROM {s}.jobs WHERE give_up_pending")
        unfinished = await one("SELECT count(*) FROM {s}.runs WHERE finished_at IS NULL")
        killed = await one("SELECT count(*) FROM {s}.runs WHERE error = 'killed'")
        return [
            ("no job left running or without a due time", lost == 0),
            ("every creator found has its enrich job", orphans == 0),
            ("every finished stage enqueued the next", next_missing == 0),
            ("no job holds two unrefunded credits", double == 0),
            ("every draft that gave up after spending was refunded", bool(refunds_ok)),
            ("no give-up hook still owed", hooks_owed == 0),
            ("every run finished or marked killed", unfinished == 0),
            ("the SIGKILLed run is visible as killed", killed >= 1),
        ]

    async def cleanup(self, queue: Queue, keep: bool) -> None:
        for proc in self.servers:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
        for stop in self.stops:
            stop()
        if not keep:
            async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
                for name in (self.schema, self.app_schema):
                    await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE")
                                       .format(sql.Identifier(name)))
        await queue.close()


DASHBOARD_PORT = 8080


async def _serve_dashboard(queue: Queue, sock: socket.socket) -> None:
    """Serve rota's dashboard on the demo's data, read-only on loopback (no secret
    needed there), on ``sock`` (bound before the demo ran) until Ctrl-C."""
    import uvicorn

    from rota import dashboard_app

    app = dashboard_app(queue, read_only=True, quotas=demo_app.QUOTAS)
    port = sock.getsockname()[1]
    console.print(f"dashboard on this demo's data: http://127.0.0.1:{port}/ "
                  f"(read-only; Ctrl-C ends it and cleans up)")
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    await server.serve(sockets=[sock])


async def _main(url: str, config: DemoConfig, seed: int, keep: bool,
                dashboard: socket.socket | None = None) -> int:
    demo = Demo(url, config, seed)
    started = time.monotonic()
    queue = Queue(url, schema=demo.schema)
    try:
        queue = await demo.setup()
        # SIGTERM unwinds like Ctrl-C, so the servers and the schemas are cleaned up.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        await demo.drive(queue)
        maintained = demo.maintain()
        code = await demo.report(queue, maintained)
        console.print(await customers.report(url, demo.schema), soft_wrap=True)
        console.print(f"demo took {time.monotonic() - started:.0f} s")
        if dashboard is not None:
            await _serve_dashboard(queue, dashboard)
        else:
            console.print(
                f"dashboard: http://127.0.0.1:{DASHBOARD_PORT}/ on a demo's data: "
                f"`make demo-dashboard` (.venv/bin/rota-demo --dashboard) runs the demo, "
                f"then serves it there until Ctrl-C", soft_wrap=True)
        return code
    finally:
        await demo.cleanup(queue, keep)


def run(database_url: str | None, profile: str, seed: int, keep: bool,
        dashboard: bool = False) -> int:
    """One demo run with the named profile, on ``database_url`` or a throwaway embedded
    server; with ``dashboard``, then rota's dashboard on its data (read-only, port
    8080 on loopback) until Ctrl-C. Returns the exit status (1 when an invariant
    failed).

    Raises:
        click.ClickException: the database is unreachable, a server the demo starts
            did not come up, or (with ``dashboard``) port 8080 is taken, which is found
            out before the demo runs.
    """
    sock = None
    if dashboard:
        from rota.cli.listening import listen_socket

        sock = listen_socket("127.0.0.1", DASHBOARD_PORT, port_option=None)
    with _database(database_url) as url:
        try:
            psycopg.connect(url, connect_timeout=5).close()
        except psycopg.OperationalError as exc:
            raise click.ClickException(f"database unreachable: {str(exc).strip()}") from None
        return asyncio.run(_main(url, PROFILES[profile], seed, keep, sock))
