"""A database that stops answering (docs/operations.md, "Network partitions and
timeouts"): connections that stay open but go silent (a frozen server, a hung proxy:
TCP stays up, so no keepalive fires), and a server that is gone. Every wait on the
database is bounded on the client's side: a worker notices a silent link, logs it once,
reconnects and goes on; one SIGTERM ends it whatever the database does; and
``Queue.close()`` returns. Through :class:`tests.proxy.SilentProxy`, never by stopping
the shared server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from rota import JobContext, Pipeline, Queue, Stage, Worker
from rota.queue import CLOSE_DEADLINE
from rota.store import StatementDeadline
from tests.helpers import wait_for
from tests.proxy import SilentProxy

ROOT = Path(__file__).resolve().parents[1]
APP = "tests.cli_app:build_pipeline"


@pytest.fixture
def proxy(database_url: str) -> Iterator[SilentProxy]:
    p = SilentProxy(database_url)
    yield p
    p.stop()


async def test_a_statement_over_a_silent_link_meets_its_deadline(
    proxy: SilentProxy, schema: str, make_queue: Any,
) -> None:
    await make_queue()
    queue = Queue(proxy.url, schema=schema)
    async with queue:
        assert await queue.store.fetch_one("next_due", {
            "types": None, "offset": timedelta(0), "stale_after": queue.stale_after}) \
            == (None,)
        proxy.freeze(new="silent")
        t0 = time.monotonic()
        with pytest.raises(StatementDeadline, match=(
                r"the database did not answer within 1 s \(client-side deadline\): the "
                r"statement was cancelled and its connection discarded")):
            await queue.store.fetch_one("next_due", {
                "types": None, "offset": timedelta(0), "stale_after": queue.stale_after},
                deadline=1.0)
        # The deadline, then psycopg's cancellation (5 s to ask, 5 s for the answer).
        assert time.monotonic() - t0 < 1 + 10 + 1
        # The connection that went silent was discarded, not handed out again.
        assert queue.pool.get_stats().get("connections_lost", 0) + \
            queue.pool.get_stats().get("returns_bad", 0) >= 1


async def test_queue_close_returns_with_an_upkeep_query_in_flight_over_a_silent_link(
    proxy: SilentProxy, schema: str, make_queue: Any,
) -> None:
    """The issue's case: close() waited forever for the claim's upkeep."""
    await make_queue()
    queue = Queue(proxy.url, schema=schema, types=["t"])
    await queue.open()
    await queue.enqueue("t", {})
    assert len(await queue.claim("t", 1)) == 1  # the claim asks upkeep for a round
    await queue.upkeep.settle()
    proxy.freeze(new="silent")
    queue.upkeep.request("t")  # a round over the silent link: close() hurries it
    t0 = time.monotonic()
    await asyncio.wait_for(queue.close(), 60)
    # The deadline for upkeep, a second for the pool's workers (not psycopg's up to
    # 10 s of cancelling the statement: that goes on in the background).
    assert time.monotonic() - t0 < CLOSE_DEADLINE.total_seconds() + 1 + 1


async def test_a_worker_whose_connections_go_silent_reconnects_and_runs_new_jobs(
    proxy: SilentProxy, schema: str, make_queue: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    """The issue's case: after its connections went silent (new ones working), a worker
    never picked up a job enqueued over a healthy connection: its LISTEN connection and
    its look at the database waited forever on the silent sockets."""
    caplog.set_level(logging.INFO)
    direct = await make_queue(types=["t"])
    done: list[int] = []

    async def handler(ctx: JobContext) -> None:
        done.append(ctx.job.id)

    queue = Queue(proxy.url, schema=schema, types=["t"])
    async with queue:
        pipeline = Pipeline(queue, [Stage("t", 5, 1, handler)],
                            platform_timeout=timedelta(seconds=60))
        worker = Worker(pipeline, idle_poll=timedelta(seconds=30), maintain_every=None,
                        rescue_every=None)
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run_forever(stop))
        await asyncio.wait_for(worker.listening.wait(), 15)
        first = await direct.enqueue("t", {})
        assert first is not None
        await _until(lambda: first.id in done, 15)
        first_pid = worker.listen_pid
        await asyncio.sleep(0.5)  # idle, asleep on its 30 s idle poll

        proxy.freeze()  # what is open goes silent; new connections work
        t0 = time.monotonic()
        second = await direct.enqueue("t", {})  # its notification is lost
        assert second is not None
        await _until(lambda: second.id in done, 40)
        # Noticed within 10 s (a check every 5 s, 5 s for its answer), reconnected,
        # then the look at the database meets its 5 s deadline over the silent pooled
        # connection (and psycopg's cancellation) and is asked again on a new one.
        assert time.monotonic() - t0 < 30
        assert worker.listen_pid not in (None, first_pid)
        stop.set()
        await asyncio.wait_for(task, 15)
    lost = [r.getMessage() for r in caplog.records if "listening connection lost" in r.getMessage()]
    assert len(lost) == 1 and "TimeoutError: no answer within 5 s" in lost[0], lost
    assert [r.getMessage() for r in caplog.records
            if r.getMessage() == "listening connection back"] == ["listening connection back"]
    assert len([r for r in caplog.records
                if r.getMessage().startswith("cannot reach the database")]) <= 1


async def _until(check: Any, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


# -- one SIGTERM ends `rota worker`, whatever the database does ------------------------


@pytest.fixture
def worker_process(proxy: SilentProxy, migrated: str, database_url: str,
                   spawn: Any) -> subprocess.Popen[str]:
    """`rota worker` (the test app, platform timeout 300 s) through the proxy, idle
    and listening."""
    env = {**os.environ, "DATABASE_URL": proxy.url, "ROTA_SCHEMA": migrated,
           "ROTA_APP": APP, "PYTHONUNBUFFERED": "1"}
    p: subprocess.Popen[str] = spawn(["worker", "--no-maintenance"], env)

    def listening() -> bool:
        assert p.poll() is None, p.communicate()
        with psycopg.connect(database_url, autocommit=True) as conn:
            return bool(conn.execute("SELECT count(*) FROM pg_stat_activity WHERE query = %s",
                                     [f'LISTEN "{migrated}"']).fetchone()[0])  # type: ignore[index]

    wait_for(listening, what="the worker listening")
    return p


@pytest.mark.parametrize("how", ["silent", "down"])
def test_one_sigterm_stops_an_idle_worker_whatever_the_database_does(
    proxy: SilentProxy, worker_process: subprocess.Popen[str], how: str,
) -> None:
    """The issue's cases: with its connections silent, an idle worker ignored one
    SIGTERM for minutes; with the database down, one SIGTERM took 27-28 s (the
    pool's timeout)."""
    p = worker_process
    if how == "silent":
        proxy.freeze(new="silent")
    else:
        proxy.close()
    time.sleep(7)  # its liveness check is waiting for an answer, or has given up
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    elapsed = time.monotonic() - t0
    assert p.returncode == 0, err
    assert "worker stopped" in err
    # Nothing is held by an idle worker: it stops waiting for the database at once;
    # closing the pool and the claim's upkeep is bounded too.
    assert elapsed < 5, (elapsed, err)
    assert err.count("listening connection lost") <= 1, err


SLOW_APP = """
import asyncio
import contextlib
from datetime import timedelta
from rota import Pipeline, Stage

async def slow(ctx):
    await asyncio.sleep(3)

def build(queue):
    return Pipeline(queue, [Stage("slow", 1, 1, slow)],
                    platform_timeout=timedelta(seconds=20))

build.queue_settings = {"types": ["slow"], "stale_after": timedelta(seconds=60)}
"""


def slow_app_env(proxy: SilentProxy, schema: str, tmp_path: Path,
                 **extra: str) -> dict[str, str]:
    """The environment of a rota command on SLOW_APP (written to ``tmp_path``) whose
    database link is ``proxy``."""
    return {**os.environ, "DATABASE_URL": proxy.url, "ROTA_SCHEMA": schema,
            "ROTA_APP": "slow_app:build", "PYTHONUNBUFFERED": "1", **extra,
            "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "src"), str(ROOT)])}


def sigterm_over_a_silent_link(p: subprocess.Popen[str], proxy: SilentProxy,
                               database_url: str, schema: str) -> tuple[float, str]:
    """Once the job runs, the link goes silent and ``p`` gets one SIGTERM; returns the
    seconds until ``p`` ended and its stderr."""
    def running() -> bool:
        assert p.poll() is None, p.communicate()
        with psycopg.connect(database_url, autocommit=True) as conn:
            row = conn.execute(f'SELECT status FROM "{schema}".jobs').fetchone()
        return row is not None and row[0] == "running"

    wait_for(running, what="the job running")
    proxy.freeze(new="silent")
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    return time.monotonic() - t0, err


def test_one_sigterm_ends_a_worker_mid_run_within_the_platform_timeout(
    proxy: SilentProxy, migrated: str, database_url: str, spawn: Any, tmp_path: Path,
) -> None:
    """The link goes silent while a job runs (its completion, the hand-back and the
    run's end cannot be written), then SIGTERM: the process still ends before the
    app's platform timeout (20 s) after the signal, exit 1, and says why; the job's
    lock goes stale and maintenance recovers it as after a crash."""
    (tmp_path / "slow_app.py").write_text(SLOW_APP)
    subprocess.run([sys.executable, "-m", "rota.cli", "enqueue", "slow", "{}"], check=True,
                   capture_output=True, timeout=60, cwd=ROOT,
                   env={**os.environ, "DATABASE_URL": database_url, "ROTA_SCHEMA": migrated})
    p = spawn(["worker", "--no-maintenance"], slow_app_env(proxy, migrated, tmp_path))
    elapsed, err = sigterm_over_a_silent_link(p, proxy, database_url, migrated)
    assert elapsed < 20, (elapsed, err)
    assert p.returncode == 1, err
    assert "error: the run could not settle within the platform timeout" in err
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert conn.execute(f'SELECT status, attempts FROM "{migrated}".jobs').fetchall() \
            == [("running", 1)]


def test_one_sigterm_ends_serve_mid_run_within_the_platform_timeout(
    proxy: SilentProxy, migrated: str, database_url: str, spawn: Any, tmp_path: Path,
) -> None:
    """`rota serve` as `rota worker` above: a cron run in flight over a link that went
    silent cannot settle; one SIGTERM still ends the process before the platform
    timeout (20 s), exit 1, saying why."""
    import threading

    import httpx

    from tests.test_stopping import _up, free_port

    (tmp_path / "slow_app.py").write_text(SLOW_APP)
    subprocess.run([sys.executable, "-m", "rota.cli", "enqueue", "slow", "{}"], check=True,
                   capture_output=True, timeout=60, cwd=ROOT,
                   env={**os.environ, "DATABASE_URL": database_url, "ROTA_SCHEMA": migrated})
    port = free_port()
    p = spawn(["serve", "--port", str(port)],
              slow_app_env(proxy, migrated, tmp_path, CRON_SECRET="s" * 32))
    wait_for(lambda: _up(f"http://127.0.0.1:{port}"), what="the server")

    def call() -> None:
        with contextlib.suppress(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/api/cron", timeout=60,
                      headers={"Authorization": "Bearer " + "s" * 32})

    threading.Thread(target=call, daemon=True).start()
    elapsed, err = sigterm_over_a_silent_link(p, proxy, database_url, migrated)
    # 19.5 s: the platform timeout less its 2.5 % margin.
    assert 19 < elapsed < 20, (elapsed, err)
    assert p.returncode == 1, err
    assert "error: the run could not settle within the platform timeout" in err
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert conn.execute(f'SELECT status, attempts FROM "{migrated}".jobs').fetchall() \
            == [("running", 1)]
