"""Stopping rota's processes with real signals (docs/design.md, "Handler deadlines" and
"The runner"): the first SIGINT or SIGTERM to `rota run`, `rota worker` or `rota serve`
claims nothing more, lets the jobs in flight finish, hands the unstarted ones back as
they were, records the run as stopped `interrupted` and exits 0; a second one stops at
once (exit 130) and still hands every job back, its attempt returned. `rota dashboard`
exits 0 on SIGTERM. And the worker wakes at the due time as it stands after each run.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from rota.cli import cli
from rota.settings import default_time_budget
from tests.helpers import wait_for
from tests.test_cli import Rota

ROOT = Path(__file__).resolve().parents[1]

# One stage "slow" (a job sleeps its payload's seconds, one at a time), one "flaky"
# (its first attempt fails or defers, as its payload says; later ones are done) and one
# "blocking" (a sync handler: a thread sleeps its payload's seconds); each attempt's
# start is written to SCHEMA.starts. Platform timeout 60 s.
APP = """
import asyncio
import os
import time
from datetime import timedelta
import psycopg
from psycopg import sql
from rota import DeferJob, Pipeline, Stage

async def started(ctx):
    async with ctx.connection() as conn:
        await conn.execute(sql.SQL(
            "INSERT INTO {}.starts (job_id, attempt, at) VALUES (%s, %s, clock_timestamp())"
        ).format(sql.Identifier(ctx.queue.schema)), (ctx.job.id, ctx.job.attempts))

async def slow(ctx):
    await started(ctx)
    await asyncio.sleep(ctx.job.payload["seconds"])

async def flaky(ctx):
    await started(ctx)
    if ctx.job.attempts == 1 and ctx.job.deferrals == 0:
        if ctx.job.payload["first"] == "fail":
            raise RuntimeError("first attempt fails")
        raise DeferJob(timedelta(seconds=2))

def blocking(ctx):
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        conn.execute(sql.SQL(
            "INSERT INTO {}.starts (job_id, attempt, at) VALUES (%s, %s, clock_timestamp())"
        ).format(sql.Identifier(ctx.queue.schema)), (ctx.job.id, ctx.job.attempts))
    time.sleep(ctx.job.payload["seconds"])
    return "slept"

def build(queue):
    return Pipeline(queue, [Stage("slow", 5, 1, slow), Stage("flaky", 5, 1, flaky),
                            Stage("blocking", 1, 1, blocking)],
                    platform_timeout=timedelta(seconds=60))

build.queue_settings = {"types": ["slow", "flaky", "blocking"],
                        "stale_after": timedelta(seconds=120),
                        "backoff_base": timedelta(seconds=1)}
"""


@pytest.fixture
def rota(database_url: str, schema: str) -> Rota:
    r = Rota(database_url, schema)
    r("migrate")
    r.sql("CREATE TABLE {s}.starts (job_id bigint, attempt int, at timestamptz)")
    return r


@pytest.fixture
def env(rota: Rota, tmp_path: Path) -> dict[str, str]:
    (tmp_path / "stop_app.py").write_text(APP)
    return {**os.environ, "DATABASE_URL": rota.url, "ROTA_SCHEMA": rota.schema,
            "ROTA_APP": "stop_app:build", "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "src"), str(ROOT)])}


def enqueue_slow(rota: Rota, seconds: float, n: int = 1) -> None:
    for _ in range(n):
        rota("enqueue", "slow", json.dumps({"seconds": seconds}))


def one_running(rota: Rota, p: subprocess.Popen[str]) -> Any:
    def check() -> bool:
        assert p.poll() is None, p.communicate()
        return bool(rota.sql("SELECT count(*) FROM {s}.starts")[0][0] == 1)
    wait_for(check, what="a job running")


def wait_for_listening(rota: Rota, p: subprocess.Popen[str]) -> None:
    """Until the worker's listening connection is up."""
    def check() -> bool:
        assert p.poll() is None, p.communicate()
        return bool(rota.sql("SELECT count(*) FROM pg_stat_activity WHERE query = %s",
                             [f'LISTEN "{rota.schema}"'])[0][0])
    wait_for(check, what="the worker listening")


def jobs(rota: Rota) -> list[tuple[Any, ...]]:
    return rota.sql("SELECT status, attempts, count(*) FROM {s}.jobs GROUP BY 1, 2 ORDER BY 1, 2")


def runs(rota: Rota) -> list[tuple[Any, ...]]:
    return rota.sql("SELECT trigger, stop_reason, jobs_done, error, finished_at IS NOT NULL "
                    "FROM {s}.runs ORDER BY started_at")


# -- rota run ------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_run_stopped_by_a_signal_lets_its_job_finish_and_hands_the_rest_back(
    rota: Rota, env: dict[str, str], spawn: Any, sig: signal.Signals,
) -> None:
    """The issue's case: a signal 1.5 s into a 4 s job failed it, burned its attempt and
    exited 1 (SIGINT) or killed the process with the job left running (SIGTERM)."""
    enqueue_slow(rota, 2.5, 3)
    p = spawn(["run", "--json"], env)
    one_running(rota, p)
    time.sleep(0.5)
    p.send_signal(sig)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert "stopping: no more jobs are claimed" in err and "Aborted" not in err
    assert json.loads(out)["stopReason"] == "interrupted"
    assert runs(rota) == [("cli", "interrupted", 1, None, True)]
    # The job in flight finished; the two unstarted went back as they were.
    assert jobs(rota) == [("done", 1, 1), ("pending", 0, 2)]
    assert rota.sql("SELECT count(*) FROM {s}.starts") == [(1,)]


def test_a_second_signal_stops_run_at_once_and_hands_the_job_in_flight_back(
    rota: Rota, env: dict[str, str], spawn: Any,
) -> None:
    enqueue_slow(rota, 30, 2)
    p = spawn(["run", "--json"], env)
    one_running(rota, p)
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    time.sleep(0.3)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    assert (p.returncode, out) == (130, ""), err
    assert time.monotonic() - t0 < 10  # not the 30 s job
    assert "stopped at once: the jobs in flight were handed back" in err
    # No attempt burned, no failure recorded.
    assert jobs(rota) == [("pending", 0, 2)]
    assert rota.sql("SELECT count(*) FROM {s}.jobs WHERE last_error IS NOT NULL") == [(0,)]
    assert runs(rota) == [("cli", "interrupted", 0, None, True)]
    [(summary,)] = rota.sql("SELECT summary FROM {s}.runs")
    # The job in flight counts as interrupted, the unstarted one as released: each once.
    assert summary == {"interrupted": 1, "released": 1}


def test_run_needs_no_budget_for_an_app_with_a_short_platform_timeout(
    rota: Rota, env: dict[str, str],
) -> None:
    """The issue's case: with no --budget, the 220 s default was refused for an app
    whose platform timeout is under 220 s; the default is now 11/15 of it."""
    assert default_time_budget(timedelta(seconds=60)) == timedelta(seconds=44)
    assert default_time_budget(timedelta(seconds=300)) == timedelta(seconds=220)
    assert default_time_budget(timedelta(seconds=1)) == timedelta(milliseconds=733)
    out = subprocess.run([sys.executable, "-m", "rota.cli", "run", "--json"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["stopReason"] == "no_work"
    for command in ("run", "worker", "serve"):
        text = " ".join(CliRunner().invoke(cli, [command, "--help"]).stdout.split())
        assert "default 11/15 of it (220 s of the default 300 s, 44 s of 60 s)" in text


# -- rota worker ---------------------------------------------------------------------------


def test_worker_stopped_by_sigterm_records_interrupted_and_logs_each_run_once(
    rota: Rota, env: dict[str, str], spawn: Any,
) -> None:
    enqueue_slow(rota, 2, 2)
    p = spawn(["worker", "--idle-poll", "30", "--no-maintenance"], env)
    one_running(rota, p)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert runs(rota) == [("worker", "interrupted", 1, None, True)]
    assert jobs(rota) == [("done", 1, 1), ("pending", 0, 1)]
    # One line for the run, not an INFO line and a plain one.
    logged = [line for line in (out + err).splitlines() if " stopped " in line]
    assert len(logged) == 1 and "INFO rota.runner: run " in logged[0], out + err
    assert logged[0].endswith("(worker) stopped interrupted: 1 done, 0 failed, 0 deferred")


def test_a_second_signal_stops_the_worker_at_once_and_hands_the_job_back(
    rota: Rota, env: dict[str, str], spawn: Any,
) -> None:
    enqueue_slow(rota, 30)
    p = spawn(["worker", "--no-maintenance"], env)
    one_running(rota, p)
    p.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    assert err.rstrip().endswith("worker stopped at once: the current run's jobs in flight "
                                 "were handed back"), err
    assert jobs(rota) == [("pending", 0, 1)]
    assert runs(rota) == [("worker", "interrupted", 0, None, True)]
    assert rota.sql("SELECT summary FROM {s}.runs") == [({"interrupted": 1},)]


def test_a_second_signal_waits_for_a_sync_handler_and_its_job_runs_once(
    rota: Rota, env: dict[str, str], spawn: Any,
) -> None:
    # A thread cannot be cancelled (docs/design.md, "Handler deadlines"): the worker
    # waits for it (within the platform timeout) and completes its job with what it
    # returned, rather than hand it back while the thread goes on.
    rota("enqueue", "blocking", json.dumps({"seconds": 3}))
    p = spawn(["worker", "--no-maintenance"], env)
    one_running(rota, p)
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    assert 2 < time.monotonic() - t0 < 10
    assert jobs(rota) == [("done", 1, 1)]
    assert rota.sql("SELECT result FROM {s}.jobs") == [("slept",)]
    assert rota.sql("SELECT count(*) FROM {s}.starts") == [(1,)]  # ran once
    assert runs(rota) == [("worker", "interrupted", 1, None, True)]


@pytest.mark.parametrize("first", ["fail", "defer"])
def test_worker_wakes_at_the_due_time_after_a_retry_or_a_deferral(
    rota: Rota, env: dict[str, str], spawn: Any, first: str,
) -> None:
    """The issue's case: a job failed into a 2 s backoff ran 5 s after failing, and 30 s
    after with --idle-poll 30: the worker slept on the due time it read before the run.
    It now asks again after each run, and the second attempt starts when it is due."""
    p = spawn(["worker", "--idle-poll", "30", "--no-maintenance"], env)
    wait_for_listening(rota, p)
    time.sleep(0.5)  # idle, asleep on its idle poll
    rota("enqueue", "flaky", json.dumps({"first": first}))
    wait_for(lambda: rota.sql("SELECT count(*) FROM {s}.starts")[0][0] == 2, timeout=15,
             what="the second attempt")
    [(first_at, second_at, due, attempts, deferrals)] = rota.sql(
        "SELECT min(at), max(at), j.run_after, j.attempts, j.deferrals "
        "FROM {s}.starts JOIN {s}.jobs j ON j.id = job_id GROUP BY 3, 4, 5")
    # A failure counts its attempt and backs off 2 s (base 1 s * 2**1); a deferral by
    # timedelta(seconds=2) hands the attempt back. Either way the job was due 2 s after
    # the first attempt started (it failed or deferred at once), and the second attempt
    # started within 100 ms of that due time, not at the next idle poll (30 s).
    assert (attempts, deferrals) == ((2, 0) if first == "fail" else (1, 1))
    assert timedelta(seconds=2) <= due - first_at < timedelta(seconds=2.5)
    assert timedelta(0) <= second_at - due <= timedelta(milliseconds=100), second_at - due
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=30)
    assert p.returncode == 0


# -- rota serve, rota dashboard ------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_stopped_by_sigterm_ends_the_run_in_flight_and_exits_0(
    rota: Rota, env: dict[str, str], spawn: Any,
) -> None:
    enqueue_slow(rota, 2, 3)
    port = free_port()
    p = spawn(["serve", "--port", str(port)], {**env, "CRON_SECRET": "s" * 32})
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: _up(base), what="the server")
    with httpx.Client() as client:
        import threading
        answer: dict[str, Any] = {}

        def call() -> None:
            r = client.get(f"{base}/api/cron", timeout=60,
                           headers={"Authorization": "Bearer " + "s" * 32})
            answer.update(status=r.status_code, body=r.json())

        t = threading.Thread(target=call)
        t.start()
        one_running(rota, p)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=30)
        t.join(10)
    assert p.returncode == 0, err
    assert (answer["status"], answer["body"]["stopReason"]) == (200, "interrupted")
    assert runs(rota) == [("cron", "interrupted", 1, None, True)]
    assert jobs(rota) == [("done", 1, 1), ("pending", 0, 2)]


def _up(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_dashboard_exits_0_on_a_signal(
    rota: Rota, env: dict[str, str], spawn: Any, sig: signal.Signals,
) -> None:
    port = free_port()
    p = spawn(["dashboard", "--read-only", "--port", str(port)],
              {k: v for k, v in env.items() if k != "ROTA_DASHBOARD_SECRET"})

    def up() -> bool:
        assert p.poll() is None, p.communicate()
        try:
            return httpx.get(f"http://127.0.0.1:{port}/", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(up, what="the dashboard")
    p.send_signal(sig)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert "Aborted" not in err


def test_a_second_signal_stops_serve_at_once_and_hands_the_job_back(
    rota: Rota, env: dict[str, str], spawn: Any,
) -> None:
    enqueue_slow(rota, 30)
    port = free_port()
    p = spawn(["serve", "--port", str(port)], {**env, "CRON_SECRET": "s" * 32})
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: _up(base), what="the server")
    import threading

    answer: dict[str, Any] = {}

    def call() -> None:
        r = httpx.get(f"{base}/api/cron", timeout=60,
                      headers={"Authorization": "Bearer " + "s" * 32})
        answer.update(status=r.status_code, body=r.json())

    t = threading.Thread(target=call)
    t.start()
    one_running(rota, p)
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    t.join(10)
    assert time.monotonic() - t0 < 10, err  # not the 30 s job
    assert p.returncode == 0, err
    assert answer == {"status": 503, "body": {"error": "stopped at once"}}
    assert jobs(rota) == [("pending", 0, 1)]
    assert runs(rota) == [("cron", "interrupted", 0, None, True)], err
    assert rota.sql("SELECT summary FROM {s}.runs") == [({"interrupted": 1},)]
