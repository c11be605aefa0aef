"""rota behind a real PgBouncer (docs/operations.md, "Poolers and failover"): in
transaction and session mode the queue finds the pooler at its first connection, sends
no startup options, applies its settings per transaction, prepares nothing on the
server and does its whole job (enqueue from Python and SQL, claim, complete, the runner
with rate limits and quotas, results and wait, the dashboard's reads, the worker and
`rota worker`); a refusal is one line at once; notifications that do not pass the
pooler are noticed at start, and listen_url brings the wake-ups back."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg import sql

from rota import (
    ConfigError,
    JobContext,
    Pipeline,
    Queue,
    Quota,
    RateLimit,
    Stage,
)
from rota.cli import cli
from rota.db import migrate, pooled_connection, refusal
from rota.errors import DatabaseRefused
from rota.web import queries
from rota.worker import Worker
from tests import pgbouncer, replicas
from tests.cli_app import build_pipeline
from tests.pgbouncer import PgBouncer

pytestmark = pytest.mark.skipif(not pgbouncer.available(),
                                reason="pgbouncer is not installed (.ci/run installs it)")

SETTINGS: dict[str, Any] = build_pipeline.queue_settings  # type: ignore[attr-defined]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def bouncers(database_url: str) -> Iterator[dict[str, PgBouncer]]:
    """One PgBouncer per pool mode for the module (each starts in milliseconds)."""
    made = {mode: PgBouncer(database_url, pool_mode=mode)
            for mode in ("transaction", "session", "statement")}
    try:
        yield made
    finally:
        for b in made.values():
            b.close()


@pytest.fixture(params=["transaction", "session"])
def bouncer(request: pytest.FixtureRequest, bouncers: dict[str, PgBouncer]) -> PgBouncer:
    return bouncers[request.param]


def _another_database(database_url: str) -> tuple[str, str]:
    """The test server's database and another one on the same server: ``postgres``, or
    ``template1`` where the tests run in ``postgres`` (the embedded server)."""
    name = psycopg.conninfo.conninfo_to_dict(database_url)["dbname"]
    return str(name), "template1" if name == "postgres" else "postgres"


@pytest.fixture
def transaction_bouncer(bouncers: dict[str, PgBouncer]) -> PgBouncer:
    return bouncers["transaction"]


@pytest.fixture
async def pooled_queue(bouncer: PgBouncer, schema: str) -> AsyncIterator[Queue]:
    """A migrated queue on this test's schema, through PgBouncer."""
    q = Queue(bouncer.url(), schema=schema, **SETTINGS)
    await q.open()
    await q.migrate()
    yield q
    await q.close()


async def settings_in_transaction(queue: Queue) -> tuple[Any, ...]:
    """statement_timeout and idle_in_transaction_session_timeout as a statement the
    store runs sees them (after the connection's prelude, in the same pipeline)."""
    async with queue.connection() as c:
        async with queue.store.settings_ahead(c):
            cur = await c.execute("SELECT current_setting('statement_timeout'), "
                                  "current_setting('idle_in_transaction_session_timeout')")
        row = await cur.fetchone()
    assert row is not None
    return tuple(row)


# -- pooled operation ---------------------------------------------------------------------


async def test_the_queue_finds_the_pooler_and_sets_its_settings_per_transaction(
    pooled_queue: Queue, bouncer: PgBouncer,
) -> None:
    setup = pooled_queue.connections
    assert (setup.pooled, setup.found_by) == (True, "the server refused startup options")
    params = psycopg.conninfo.conninfo_to_dict(str(pooled_queue.pool.conninfo))
    assert params["options"] == "" and params["keepalives_idle"] == "15"
    assert pooled_queue.pool.kwargs == {"autocommit": True, "prepare_threshold": None}
    assert await settings_in_transaction(pooled_queue) == ("5min", "5min")
    async with pooled_queue.connection() as c:
        assert c.prepare_threshold is None
        # Outside the store's statements the server's defaults apply: nothing rides on
        # the session.
        cur = await c.execute("SELECT current_setting('statement_timeout')")
        assert await cur.fetchone() == ("0",)


async def test_options_in_the_url_become_per_transaction_settings(
    transaction_bouncer: PgBouncer, schema: str,
) -> None:
    url = transaction_bouncer.url(options="-c statement_timeout=7s")
    assert pooled_connection(url)[1] == {
        "idle_in_transaction_session_timeout": "5min", "statement_timeout": "7s",
        "datestyle": "ISO"}
    async with Queue(url, schema=schema, pooled=True) as q:
        assert q.connections.found_by == "setting"
        assert await settings_in_transaction(q) == ("7s", "5min")


async def test_a_pooler_that_drops_options_is_found_by_its_backend_pid(
    database_url: str, schema: str,
) -> None:
    with PgBouncer(database_url, extra={"ignore_startup_parameters": "options"}) as b:
        async with Queue(b.url(), schema=schema) as q:
            assert (q.connections.pooled, q.connections.found_by) == (
                True, "the backend process id differs")
            assert await settings_in_transaction(q) == ("5min", "5min")
    async with Queue(database_url, schema=schema) as direct:
        assert (direct.connections.pooled, direct.connections.found_by) == (
            False, "the backend process id matches")


async def test_enqueue_claim_complete_results_and_sql_enqueue_through_the_pooler(
    pooled_queue: Queue, schema: str,
) -> None:
    q = pooled_queue
    job = await q.enqueue("echo", {"n": 1})
    assert job is not None
    assert await q.enqueue_many([{"type": "echo", "payload": {"n": i}} for i in (2, 3)]) == 2
    async with q.connection() as c:
        cur = await c.execute(sql.SQL("SELECT {}.enqueue('echo', '{{\"n\": 4}}'::jsonb)")
                              .format(sql.Identifier(schema)))
        row = await cur.fetchone()
    assert row is not None
    # More claims than psycopg's prepare threshold (5): nothing is prepared on the server.
    claimed = []
    for _ in range(8):
        claimed += await q.claim("echo", 1)
    assert sorted(j.payload["n"] for j in claimed) == [1, 2, 3, 4]
    for j in claimed:
        assert await q.complete(j, result={"double": j.payload["n"] * 2})
    found = await q.result(job.id)
    assert (found.status, found.value) == ("done", {"double": 2})
    waited = await q.wait(row[0], timeout=timedelta(seconds=2))
    assert (waited.status, waited.value) == ("done", {"double": 8})


async def test_the_runner_with_rate_limits_and_quotas_through_the_pooler(
    pooled_queue: Queue,
) -> None:
    q = pooled_queue
    limit = RateLimit("api", 1000, timedelta(seconds=1))
    quota = Quota("calls", 5, reserve=0, reset_tz="UTC")
    done: list[int] = []

    async def call(ctx: JobContext) -> None:
        await ctx.spend(quota)
        async with ctx.connection() as c, c.transaction():
            await c.execute("SELECT 1")
        done.append(ctx.job.payload["n"])

    pipeline = Pipeline(q, [Stage("echo", 4, 2, call, rate_limits=limit)], quotas=[quota])
    await q.enqueue_many([{"type": "echo", "payload": {"n": i}} for i in range(7)])
    first = await pipeline.run(trigger="manual", time_budget=timedelta(seconds=10))
    assert (first.stop_reason, first.jobs_done, first.error) == ("quota_exhausted", 5, None)
    assert len(done) == 5
    assert (await quota.usage(q)).used == 5
    async with q.connection() as c:
        cur = await c.execute(sql.SQL("SELECT status, count(*) FROM {} GROUP BY 1 "
                                      "ORDER BY 1").format(q.table("jobs")))
        assert await cur.fetchall() == [("done", 5), ("pending", 2)]


async def test_the_dashboards_reads_through_the_pooler(pooled_queue: Queue) -> None:
    q = pooled_queue
    await q.enqueue_many([{"type": "echo", "payload": {}} for _ in range(3)])
    [j] = await q.claim("echo", 1)
    await q.complete(j)
    async with q.connection() as conn:
        types = await queries.job_types(q, conn)
        counts = await queries.status_counts(q, conn, types, cap=None)
    assert types == ["echo"]
    assert [(c.type, c.due, c.running, c.done_last_hour) for c in counts] == [("echo", 2, 0, 1)]


async def test_the_worker_polls_when_notifications_do_not_pass_and_wakes_with_listen_url(
    transaction_bouncer: PgBouncer, database_url: str, schema: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def pick_up(queue: Queue) -> tuple[Worker, float]:
        worker = Worker(build_pipeline(queue), idle_poll=timedelta(seconds=60),
                        maintain_every=None, rescue_every=None)
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run_forever(stop))
        try:
            for _ in range(50):
                await asyncio.sleep(0.1)
                if worker.notifications is not None:
                    break
            await asyncio.sleep(0.3)
            job = await queue.enqueue("echo", {})
            assert job is not None
            t0 = time.monotonic()
            found = await queue.wait(job.id, timeout=timedelta(seconds=5),
                                     poll_every=timedelta(milliseconds=20))
            assert found.status == "done"
            return worker, time.monotonic() - t0
        finally:
            stop.set()
            await asyncio.wait_for(task, 5)

    caplog.set_level("WARNING", logger="rota.worker")
    async with Queue(transaction_bouncer.url(), schema=schema, **SETTINGS) as q:
        await q.migrate()
        worker, took = await pick_up(q)
    assert worker.notifications is False
    # Polled: picked up within fallback_poll (1 s), not idle_poll (60 s).
    assert took < 1.5
    warnings = [r.getMessage() for r in caplog.records if r.name == "rota.worker"]
    assert warnings == [
        "notifications do not reach the worker within 1s (a transaction pooler?); set "
        "listen_url (ROTA_LISTEN_URL) to a direct connection for wake-ups at once; "
        "polling every 1s instead"]
    caplog.clear()
    async with Queue(transaction_bouncer.url(), listen_url=database_url, schema=schema,
                     **SETTINGS) as q:
        worker, took = await pick_up(q)
    assert worker.notifications is True
    assert took < 0.5
    assert [r for r in caplog.records if r.name == "rota.worker"] == []


async def test_a_listen_url_elsewhere_is_one_line(
    transaction_bouncer: PgBouncer, database_url: str, schema: str,
) -> None:
    from rota.worker import probe

    async def problem(listen_url: str) -> str | None:
        async with Queue(transaction_bouncer.url(), listen_url=listen_url,
                         schema=schema, **SETTINGS) as q:
            await q.migrate()
            conn = await q.listener()
            assert conn is not None
            try:
                return await probe(q, conn)
            finally:
                await conn.close()

    assert await problem(database_url) is None
    name, elsewhere = _another_database(database_url)
    other = psycopg.conninfo.make_conninfo(database_url, dbname=elsewhere)
    assert await problem(other) == (
        f"listen_url connects to database {elsewhere!r}, the queue to {name!r}: "
        "notifications of the queue's database do not reach it")
    # A pooler that drops startup options takes the connection; notifications do not
    # pass it.
    with PgBouncer(database_url, extra={"ignore_startup_parameters": "options"}) as b:
        assert await problem(b.url()) == (
            "listen_url goes through a connection pooler in transaction mode (its "
            "backend process id is not the server's): notifications do not reach it; "
            "point listen_url at the server itself")
    with pytest.raises(ConfigError) as caught:
        await problem(transaction_bouncer.url())
    assert str(caught.value) == (
        "listen_url goes through a connection pooler (unsupported startup parameter: "
        "options): point it at the server itself")


async def test_a_pooler_in_statement_mode_is_refused_at_start(
    bouncers: dict[str, PgBouncer], schema: str,
) -> None:
    with pytest.raises(ConfigError) as caught:
        await Queue(bouncers["statement"].url(), schema=schema).open()
    assert str(caught.value) == (
        "the connection pooler refuses transactions (transaction blocks not allowed in "
        "statement pooling mode): rota needs transaction or session pooling (PgBouncer: "
        "pool_mode = transaction)")


# -- refusals at once -----------------------------------------------------------------------


# Each case its own database name: PgBouncer holds clients of a database whose server
# login failed recently (server_login_retry), which is not a refusal.
@pytest.mark.parametrize(("where", "change", "cause"), [
    ("pooler", {"dbname": "rota_no_db_1"}, 'database "rota_no_db_1" does not exist'),
    ("pooler", {"user": "rota_nobody"}, '"trust" authentication failed'),
    ("server", {"dbname": "rota_no_db_2"}, 'database "rota_no_db_2" does not exist'),
    ("server", {"user": "rota_nobody"}, 'role "rota_nobody" does not exist'),
])
async def test_a_refusal_is_one_line_at_once(
    transaction_bouncer: PgBouncer, database_url: str, schema: str, where: str,
    change: dict[str, str], cause: str,
) -> None:
    base = transaction_bouncer.url() if where == "pooler" else database_url
    url = psycopg.conninfo.make_conninfo(base, **change)
    t0 = time.monotonic()
    with pytest.raises(DatabaseRefused) as caught:
        await Queue(url, schema=schema).open()
    assert time.monotonic() - t0 < 1.0
    assert str(caught.value) == f"the database refused the connection: {cause}"


async def test_refused_options_without_pooled_name_the_setting(
    transaction_bouncer: PgBouncer, schema: str,
) -> None:
    t0 = time.monotonic()
    with pytest.raises(DatabaseRefused) as caught:
        await Queue(transaction_bouncer.url(), schema=schema, pooled=False).open()
    assert time.monotonic() - t0 < 1.0
    assert str(caught.value) == (
        "the database refused the connection: unsupported startup parameter: options "
        "(a connection pooler: rota sends its settings as startup options unless "
        "pooled=True, ROTA_POOLED=1)")


async def test_only_a_database_that_does_not_answer_is_waited_for() -> None:
    with pytest.raises(psycopg.OperationalError) as caught:
        await psycopg.AsyncConnection.connect("postgresql://rota@127.0.0.1:1/rota")
    assert refusal(caught.value) is None
    starting = psycopg.OperationalError(
        'connection to server at "db", port 5432 failed: FATAL:  the database system is '
        'starting up')
    assert refusal(starting) is None


def test_the_cli_reports_a_refusal_in_one_line_at_once(
    transaction_bouncer: PgBouncer, schema: str,
) -> None:
    url = transaction_bouncer.url(dbname="rota_no_db_3")
    t0 = time.monotonic()
    result = CliRunner().invoke(cli, ["depth"], env={"DATABASE_URL": url,
                                                     "ROTA_SCHEMA": schema})
    assert time.monotonic() - t0 < 1.0
    assert result.exit_code == 2
    assert result.stderr == (
        'error: the database refused the connection: database "rota_no_db_3" does not '
        'exist\n')
    bad = CliRunner().invoke(cli, ["depth"], env={"DATABASE_URL": transaction_bouncer.url(),
                                                  "ROTA_POOLED": "2"})
    assert (bad.exit_code, bad.stderr) == (
        2, "error: ROTA_POOLED must be 1, 0 or auto, got '2'\n")


# -- rota worker through the pooler -----------------------------------------------------------


def worker_process(url: str, schema: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "DATABASE_URL": url, "ROTA_SCHEMA": schema,
           "ROTA_APP": "tests.cli_app:build_pipeline", "PYTHONPATH": ROOT}
    env.pop("ROTA_LISTEN_URL", None)
    return subprocess.Popen([sys.executable, "-m", "rota.cli", "worker", "--idle-poll",
                             "60", "--no-maintenance", *args], cwd=ROOT, env=env,
                            stderr=subprocess.PIPE, text=True)


def wait_done(database_url: str, schema: str, job_id: int, seconds: float) -> float:
    """Seconds from the job's creation to its finish, polled until done."""
    deadline = time.monotonic() + seconds
    with psycopg.connect(database_url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(sql.SQL(
                "SELECT status, extract(epoch FROM finished_at - created_at) FROM {}.jobs "
                "WHERE id = %s").format(sql.Identifier(schema)), [job_id]).fetchone()
            if row is not None and row[0] == "done":
                return float(row[1])
            time.sleep(0.05)
    raise AssertionError(f"job {job_id} not done within {seconds}s")


@pytest.mark.parametrize("listen", [False, True])
def test_rota_worker_through_the_pooler(
    transaction_bouncer: PgBouncer, database_url: str, schema: str, listen: bool,
) -> None:
    async def prepare() -> None:
        async with await psycopg.AsyncConnection.connect(database_url,
                                                         autocommit=True) as c:
            await migrate(c, schema)

    asyncio.run(prepare())
    proc = worker_process(transaction_bouncer.url(), schema,
                          *(["--listen-url", database_url] if listen else []))
    try:
        time.sleep(2.0)  # started, and its check of notifications done
        with psycopg.connect(database_url, autocommit=True) as conn:
            cur = conn.execute(sql.SQL("SELECT {}.enqueue('echo', '{{}}'::jsonb)")
                               .format(sql.Identifier(schema)))
            row = cur.fetchone()
        assert row is not None
        took = wait_done(database_url, schema, row[0], 5)
        # Woken (its idle poll is 60 s: a second is a wake-up even on 2 busy cores,
        # where 0.87 s was seen), or polled every fallback_poll (1 s).
        assert took < (1.0 if listen else 1.5)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    warned = [line for line in err.splitlines() if "notifications do not reach" in line]
    assert len(warned) == (0 if listen else 1), err


def test_rota_worker_refuses_a_listen_url_on_another_database(
    transaction_bouncer: PgBouncer, database_url: str, schema: str,
) -> None:
    CliRunner().invoke(cli, ["migrate"], env={"DATABASE_URL": database_url,
                                              "ROTA_SCHEMA": schema})
    name, elsewhere = _another_database(database_url)
    other = psycopg.conninfo.make_conninfo(database_url, dbname=elsewhere)
    proc = worker_process(transaction_bouncer.url(), schema, "--listen-url", other)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 2
    # The pooler found (an INFO line), then the one error line.
    assert err.splitlines()[-1] == (
        f"error: listen_url connects to database {elsewhere!r}, the queue to {name!r}: "
        "notifications of the queue's database do not reach it")
    assert [line for line in err.splitlines() if "error" in line] == err.splitlines()[-1:]


async def test_a_multi_host_url_with_a_bad_host_is_one_warning_at_start(
    database_url: str, schema: str, caplog: pytest.LogCaptureFixture,
) -> None:
    params = psycopg.conninfo.conninfo_to_dict(database_url)
    url = psycopg.conninfo.make_conninfo(
        database_url, host=f"{params['host']},127.0.0.1", port=f"{params['port']},1")
    caplog.set_level("WARNING", logger="rota.connections")
    async with Queue(url, schema=schema) as q:
        assert q.connections.hosts_check is not None
        problems = await asyncio.wait_for(q.connections.hosts_check, 5)
    expected = ("host 2 of 2 of the database URL (127.0.0.1:1) cannot be connected to: "
                "Connection refused; a failover to it would fail")
    assert problems == [expected]
    assert [r.getMessage() for r in caplog.records] == [expected]


async def test_a_multi_host_listen_url_with_a_bad_host_is_one_warning_at_start(
    database_url: str, schema: str, caplog: pytest.LogCaptureFixture,
) -> None:
    params = psycopg.conninfo.conninfo_to_dict(database_url)
    listen_url = psycopg.conninfo.make_conninfo(
        database_url, host=f"127.0.0.1,{params['host']}", port=f"1,{params['port']}")
    caplog.set_level("WARNING", logger="rota.connections")
    async with Queue(database_url, listen_url=listen_url, schema=schema) as q:
        assert q.connections.hosts_check is not None
        problems = await asyncio.wait_for(q.connections.hosts_check, 5)
    expected = ("host 1 of 2 of listen_url (127.0.0.1:1) cannot be connected to: "
                "Connection refused; a failover to it would fail")
    assert problems == [expected]
    assert [r.getMessage() for r in caplog.records] == [expected]


async def test_a_listen_url_through_a_session_pooler_is_one_warning(
    transaction_bouncer: PgBouncer, database_url: str, schema: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Notifications pass a session pooler (the LISTEN keeps its server connection), so
    the worker listens; but only while the pooler keeps the session: a warning."""
    from rota.worker import probe

    caplog.set_level("WARNING", logger="rota.worker")
    with PgBouncer(database_url, pool_mode="session",
                   extra={"ignore_startup_parameters": "options"}) as session:
        async with Queue(transaction_bouncer.url(), listen_url=session.url(),
                         schema=schema, **SETTINGS) as q:
            await q.migrate()
            conn = await q.listener()
            assert conn is not None
            try:
                assert await probe(q, conn) is None
            finally:
                await conn.close()
    assert [r.getMessage() for r in caplog.records if r.name == "rota.worker"] == [
        "listen_url goes through a connection pooler (its backend process id is not the "
        "server's): wake-ups last only while the pooler keeps the session; point "
        "listen_url at the server itself"]


def test_rota_worker_refuses_a_pooler_in_statement_mode_in_one_line(
    bouncers: dict[str, PgBouncer], schema: str,
) -> None:
    proc = worker_process(bouncers["statement"].url(), schema)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 2
    # The pooler found (an INFO line), then the one error line.
    assert err.splitlines()[-1] == (
        "error: the connection pooler refuses transactions (transaction blocks not "
        "allowed in statement pooling mode): rota needs transaction or session pooling "
        "(PgBouncer: pool_mode = transaction)")
    assert [line for line in err.splitlines() if "error" in line] == err.splitlines()[-1:]


async def test_through_a_session_pooler_notifications_arrive(
    bouncers: dict[str, PgBouncer], schema: str,
) -> None:
    async with Queue(bouncers["session"].url(), schema=schema, **SETTINGS) as q:
        await q.migrate()
        worker = Worker(build_pipeline(q), idle_poll=timedelta(seconds=60),
                        maintain_every=None, rescue_every=None)
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run_forever(stop))
        try:
            await asyncio.wait_for(worker.listening.wait(), 10)
            assert worker.notifications is True
            job = await q.enqueue("echo", {})
            assert job is not None
            t0 = time.monotonic()
            found = await q.wait(job.id, timeout=timedelta(seconds=5),
                                 poll_every=timedelta(milliseconds=20))
            assert found.status == "done"
            assert time.monotonic() - t0 < 0.5  # woken, not polled (60 s)
        finally:
            stop.set()
            await asyncio.wait_for(task, 5)


def test_the_cli_with_rota_pooled_0_names_the_setting(
    transaction_bouncer: PgBouncer, schema: str,
) -> None:
    result = CliRunner().invoke(cli, ["depth"], env={
        "DATABASE_URL": transaction_bouncer.url(), "ROTA_SCHEMA": schema,
        "ROTA_POOLED": "0"})
    assert (result.exit_code, result.stderr) == (2, (
        "error: the database refused the connection: unsupported startup parameter: "
        "options (a connection pooler: rota sends its settings as startup options unless "
        "pooled=True, ROTA_POOLED=1)\n"))


# -- a server restart behind the pooler ---------------------------------------------------


@pytest.mark.skipif(not replicas.available(),
                    reason="the PostgreSQL server binaries are not installed")
@pytest.mark.parametrize("listen", [False, True])
async def test_a_worker_goes_on_through_the_pooler_after_a_server_restart(
    listen: bool,
) -> None:
    """The server behind the pooler restarts (a fast shutdown: every server connection
    ends, then 2 s down, during which the pooler's logins fail) while a worker runs
    through it, polling or woken through ``listen_url``: the worker's next jobs are
    done within 8 s of the restart, by the same worker without a restart of its own.
    PgBouncer configured as docs/operations.md, "Poolers and failover",
    says (``server_login_retry``; its default, 15 s, fails this test)."""
    with replicas.LoneServer() as server, PgBouncer(server.url) as bouncer:
        async with Queue(bouncer.url(), listen_url=server.url if listen else None,
                         schema="restart", **SETTINGS) as q:
            await q.migrate()
            worker = Worker(build_pipeline(q), idle_poll=timedelta(seconds=60),
                            maintain_every=None, rescue_every=None)
            stop = asyncio.Event()
            task = asyncio.create_task(worker.run_forever(stop))

            async def done_within(seconds: float, n: int) -> None:
                """Wait until ``n`` echo jobs enqueued now (directly) are done; fail
                after ``seconds``."""
                t0 = time.monotonic()
                async with await psycopg.AsyncConnection.connect(
                        server.url, autocommit=True) as c:
                    ids = []
                    for _ in range(n):
                        cur = await c.execute("SELECT restart.enqueue('echo', '{}')")
                        ids += [row[0] for row in await cur.fetchall()]
                    while True:
                        cur = await c.execute("SELECT count(*) FROM restart.jobs WHERE "
                                              "id = ANY(%s) AND status <> 'done'", [ids])
                        left = await cur.fetchone()
                        if left == (0,):
                            return
                        assert time.monotonic() - t0 < seconds, (
                            f"{left} of {n} jobs not done within {seconds} s\n"
                            f"{bouncer.log()[-3000:]}\n{server.log()}")
                        await asyncio.sleep(0.05)

            try:
                for _ in range(100):  # its check of notifications done
                    if worker.notifications is not None:
                        break
                    await asyncio.sleep(0.1)
                assert worker.notifications is listen
                await done_within(8, 3)
                await asyncio.to_thread(server.restart, 2.0)
                await done_within(8, 10)
                # The same worker (a run under way may even have gone on across the
                # restart: its connections to the pooler stayed up).
                assert not task.done()
            finally:
                stop.set()
                await asyncio.wait_for(task, 10)


async def test_the_claim_upkeep_vacuums_through_the_pooler(pooled_queue: Queue) -> None:
    """VACUUM cannot run in a transaction block: behind a pooler it goes alone, not
    after the per-transaction settings in one pipeline."""
    q = pooled_queue
    await q.upsert_group("a", plan="free")
    await q.enqueue_many([{"type": "echo", "payload": {}, "group_id": "a"}] * 3)
    assert await q.complete_many(await q.claim("echo", 3)) == [True] * 3
    await q.run_upkeep()  # the upkeep the claim asked for, done before this one
    counters = await q.upkeep.run_once()
    assert counters["vacuumed"] == 1
    assert q.upkeep._vacuum_refused is False
