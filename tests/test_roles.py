"""Roles (docs/operations.md, "Security"): rota works as a non-superuser role that owns
only its schema, and as a worker role with exactly the grants the docs list; other
roles of the database can neither stall `rota migrate` nor make a worker do work or
busy-loop by flooding its notification channel."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from click.testing import CliRunner, Result
from psycopg import sql
from psycopg.conninfo import make_conninfo

from rota import Queue, maintain
from rota.cli import cli
from rota.db import migrate, migrations
from rota.web import cron_app
from rota.worker import Worker
from tests.cli_app import build_pipeline

SETTINGS: dict[str, Any] = build_pipeline.queue_settings  # type: ignore[attr-defined]
APP = "tests.cli_app:build_pipeline"
OPERATIONS = Path(__file__).parent.parent / "docs" / "operations.md"


def documented_sql(first_line: str) -> str:
    """The ```sql block of docs/operations.md whose first line is ``first_line``."""
    blocks = re.findall(r"```sql\n(.*?)```", OPERATIONS.read_text("utf-8"), re.S)
    [block] = [b for b in blocks if b.startswith(first_line)]
    return block


@dataclass
class Roles:
    """A schema owned by a migrating role, and a worker role, with their URLs."""

    schema: str
    owner: str
    worker: str
    owner_url: str
    worker_url: str
    admin_url: str

    def named(self, text: str) -> str:
        """Documented SQL with the docs' names replaced by this test's."""
        for doc_name, name in (("rota_app", self.owner), ("rota_worker", self.worker),
                               ("app_q", self.schema)):
            text = re.sub(rf"\b{doc_name}\b", name, text)
        return text.replace("'change me'", "'pw'")


def as_role(url: str, role: str) -> str:
    return make_conninfo(url, user=role, password="pw")


@pytest.fixture
def roles(database_url: str) -> Iterator[Roles]:
    """The migrating role and its schema, made as docs/operations.md says; the worker role
    exists without grants. Both roles are dropped afterwards (roles are cluster-wide)."""
    tag = uuid.uuid4().hex[:10]
    r = Roles(f"app_q_{tag}", f"rota_app_{tag}", f"rota_worker_{tag}", "", "",
              database_url)
    r.owner_url, r.worker_url = as_role(database_url, r.owner), as_role(database_url, r.worker)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(r.named(documented_sql("-- migrating role")).encode())
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'pw'")
                     .format(sql.Identifier(r.worker)))
    try:
        yield r
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE")
                         .format(sql.Identifier(r.schema)))
            for role in (r.worker, r.owner):
                conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
                conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def rota(url: str, schema: str, *args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env={
        "DATABASE_URL": url, "ROTA_SCHEMA": schema, "ROTA_APP": None, "COLUMNS": "250"})


def grant_worker(r: Roles) -> None:
    """The worker role's grants, exactly as documented, run by the migrating role (its
    CREATE ROLE line is the fixture's: the migrating role may not create roles)."""
    grants = r.named(documented_sql("-- worker role"))
    grants = "\n".join(line for line in grants.splitlines()
                       if not line.startswith("CREATE ROLE"))
    with psycopg.connect(r.owner_url, autocommit=True) as conn:
        conn.execute(grants.encode())


async def works_as(url: str, schema: str) -> None:
    """Everything but migrate, on this connection string: enqueue, a run, maintenance,
    a worker woken by the enqueue's notification, and the cron endpoint."""
    async with Queue(url, schema=schema, **SETTINGS) as queue:
        await queue.upsert_group("g", plan=None)
        await queue.enqueue("echo", {"n": 1}, group_id="g")
        result = await build_pipeline(queue).run(trigger="manual",
                                                 time_budget=timedelta(seconds=30))
        assert (result.stop_reason, result.jobs_done) == ("no_work", 1), result
        # The claim's upkeep folds as this role: its writes (the walk floors among them)
        # need nothing the grants leave out.
        await queue.run_upkeep()
        async with await psycopg.AsyncConnection.connect(url) as conn:
            cur = await conn.execute(sql.SQL(
                "SELECT level, plan_key, served_n::text FROM {}.fair_walk_floor"
                " ORDER BY level").format(sql.Identifier(schema)))
            # g's job is done: no group of the plan has a head ('Infinity').
            assert await cur.fetchall() == [("group", "", "Infinity"),
                                            ("owner", "", "Infinity")]
        counters = await maintain(queue)
        assert counters and all(isinstance(v, int) for v in counters.values())

        ran = asyncio.Event()
        worker = Worker(build_pipeline(queue), queue=queue, maintain_every=None,
                        idle_poll=timedelta(seconds=30), on_run=lambda _: ran.set())
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run_forever(stop))
        await asyncio.wait_for(worker.listening.wait(), 10)
        await asyncio.sleep(0.3)
        await queue.enqueue("echo", {"n": 2})  # a 30 s poll: only the NOTIFY wakes it
        await asyncio.wait_for(ran.wait(), 10)
        stop.set()
        await asyncio.wait_for(task, 10)
        assert worker.runs == 1 and worker.last_result.jobs_done == 1

        await queue.enqueue("echo", {"n": 3})
        app = cron_app(build_pipeline(queue), secret="s3cret-for-roles")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://cron") as c:
            r = await c.get("/api/cron", headers={"Authorization": "Bearer s3cret-for-roles"})
        assert (r.status_code, r.json()["jobsDone"]) == (200, 1), r.text


def test_a_role_that_owns_only_its_schema_migrates_and_runs_everything(roles: Roles) -> None:
    with psycopg.connect(roles.owner_url) as conn:  # it really is that little
        row = conn.execute("SELECT rolsuper, rolcreaterole, has_database_privilege("
                           "current_database(), 'CREATE') FROM pg_roles "
                           "WHERE rolname = current_user").fetchone()
    assert row == (False, False, False)
    first = rota(roles.owner_url, roles.schema, "migrate")
    assert (first.exit_code, first.stdout) == (0, f"applied {[m.version for m in migrations()]}\n")
    again = rota(roles.owner_url, roles.schema, "migrate")
    assert (again.exit_code, again.stdout) == (0, "up to date\n"), again.output
    run = rota(roles.owner_url, roles.schema, "run", "--app", APP, "--json")
    assert run.exit_code == 0, run.output
    asyncio.run(works_as(roles.owner_url, roles.schema))


def test_a_role_that_owns_only_its_schema_applies_the_rota_schema_script(
    roles: Roles
) -> None:
    script = CliRunner().invoke(cli, ["schema", "--schema", roles.schema])
    assert script.exit_code == 0
    with psycopg.connect(roles.owner_url, autocommit=True) as conn:
        conn.execute(script.stdout.encode())
    again = rota(roles.owner_url, roles.schema, "migrate")
    assert (again.exit_code, again.stdout) == (0, "up to date\n"), again.output


def test_a_role_that_owns_only_its_schema_cannot_create_another(roles: Roles) -> None:
    other = f"{roles.schema}_other"
    result = rota(roles.owner_url, other, "migrate")
    assert result.exit_code == 2
    assert result.stderr.startswith(f'error: migrating schema "{other}" failed (creating the '
                                    "schema and rota_migrations): permission denied for "
                                    "database"), result.stderr


def test_a_worker_role_with_the_documented_grants_runs_everything_but_migrate(
    roles: Roles
) -> None:
    assert rota(roles.owner_url, roles.schema, "migrate").exit_code == 0
    grant_worker(roles)
    asyncio.run(works_as(roles.worker_url, roles.schema))
    run = rota(roles.worker_url, roles.schema, "run", "--app", APP, "--json")
    assert run.exit_code == 0, run.output
    maintained = rota(roles.worker_url, roles.schema, "maintain", "--json")
    assert maintained.exit_code == 0, maintained.output

    refused = rota(roles.worker_url, roles.schema, "migrate")
    assert refused.exit_code == 2
    assert refused.stderr == (f'error: migrating schema "{roles.schema}" failed (locking '
                              f"rota_migrations): permission denied for table "
                              "rota_migrations\n")
    s = sql.Identifier(roles.schema)
    with psycopg.connect(roles.worker_url) as conn:
        for change in ("CREATE TABLE {}.x (id int)", "ALTER TABLE {}.jobs ADD COLUMN x int",
                       "DROP FUNCTION {}.notify_jobs_inserted() CASCADE",
                       "UPDATE {}.rota_migrations SET sha256 = ''", "TRUNCATE {}.jobs",
                       "LOCK TABLE {}.rota_migrations IN SHARE ROW EXCLUSIVE MODE"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql.SQL(change).format(s))
            conn.rollback()


def test_the_worker_grants_cover_tables_a_later_migration_adds(roles: Roles) -> None:
    assert rota(roles.owner_url, roles.schema, "migrate").exit_code == 0
    grant_worker(roles)
    s = sql.Identifier(roles.schema)
    with psycopg.connect(roles.owner_url, autocommit=True) as conn:  # as a migration would
        conn.execute(sql.SQL("CREATE TABLE {}.later (id int)").format(s))
    with psycopg.connect(roles.worker_url, autocommit=True) as conn:
        conn.execute(sql.SQL("INSERT INTO {}.later VALUES (1)").format(s))
        assert conn.execute(sql.SQL("SELECT count(*) FROM {}.later").format(s)).fetchone() == (1,)


# -- other roles cannot stall migrate -------------------------------------------------


def test_no_other_role_can_hold_the_migration_lock(roles: Roles) -> None:
    """migrate serializes on a lock of rota_migrations: a role without write grants on
    it cannot take it, so holding the old advisory lock (any role can) or reading the
    table in an open transaction (the worker can) does not stall a migration."""
    assert rota(roles.owner_url, roles.schema, "migrate").exit_code == 0
    grant_worker(roles)
    stranger = as_role(roles.admin_url, roles.worker)  # USAGE and SELECT, no more
    with psycopg.connect(stranger) as held:
        held.execute("SELECT pg_advisory_lock(hashtext('rota.migrate'), hashtext(%s))",
                     [roles.schema])
        held.execute(sql.SQL("SELECT count(*) FROM {}.rota_migrations")
                     .format(sql.Identifier(roles.schema)))  # ACCESS SHARE, held open
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            held.execute(sql.SQL("LOCK TABLE {}.rota_migrations IN SHARE ROW EXCLUSIVE MODE")
                         .format(sql.Identifier(roles.schema)))
        held.rollback()
        held.execute("SELECT pg_advisory_lock(hashtext('rota.migrate'), hashtext(%s))",
                     [roles.schema])
        held.execute(sql.SQL("SELECT count(*) FROM {}.rota_migrations")
                     .format(sql.Identifier(roles.schema)))
        t0 = time.monotonic()
        result = rota(make_conninfo(roles.owner_url, options="-c lock_timeout=5s"),
                      roles.schema, "migrate")
        assert (result.exit_code, result.stdout) == (0, "up to date\n"), result.output
        assert time.monotonic() - t0 < 5


async def test_four_first_migrations_of_an_empty_owned_schema_apply_it_once(
    roles: Roles
) -> None:
    async def one() -> list[int]:
        async with await psycopg.AsyncConnection.connect(roles.owner_url,
                                                         autocommit=True) as c:
            return await migrate(c, roles.schema)

    results = await asyncio.gather(*(one() for _ in range(4)))
    assert sorted(results, key=len) == [[], [], [], [m.version for m in migrations()]]


# -- other roles cannot make a worker work or spin ------------------------------------


async def test_a_notify_flood_from_another_role_wakes_the_worker_a_bounded_number_of_times(
    roles: Roles, database_url: str
) -> None:
    """Any role may NOTIFY the queue's channel: the worker takes it as a hint, looks at
    the table at most once per wake_interval, and runs nothing that is not due."""
    async with Queue(roles.owner_url, schema=roles.schema, **SETTINGS) as queue:
        await queue.migrate()
        later = await queue.enqueue("echo", {"n": 1}, run_after=await queue.now()
                                    + timedelta(hours=1))
        assert later is not None
        worker = Worker(build_pipeline(queue), queue=queue, maintain_every=None,
                        idle_poll=timedelta(seconds=30))
        looks = 0
        next_due = worker._next_due

        async def counted(*args: Any) -> float | None:
            nonlocal looks
            looks += 1
            return await next_due(*args)

        worker._next_due = counted  # type: ignore[method-assign]
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run_forever(stop))
        await asyncio.wait_for(worker.listening.wait(), 10)
        await asyncio.sleep(0.3)
        looks_before = looks
        # The stranger has no grant at all: only CONNECT, which PUBLIC has.
        stranger = as_role(database_url, roles.worker)
        seconds, sent = 2.0, 0
        async with await psycopg.AsyncConnection.connect(stranger, autocommit=True) as c:
            t0 = time.monotonic()
            while time.monotonic() - t0 < seconds:
                await c.execute("SELECT pg_notify(%s, p) FROM unnest(%s::text[]) p", [
                    roles.schema, [f'{{"id": {later.id}, "run": true, "n": {sent + i}}}'
                                   for i in range(200)]])
                sent += 200
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        stop.set()
        await asyncio.wait_for(task, 10)
    woken = looks - looks_before
    assert sent >= 1000
    # At most one look per wake_interval (0.2 s) of flood, plus the edges.
    assert 1 <= woken <= seconds / worker.wake_interval.total_seconds() + 3, woken
    assert worker.runs == 0
    with psycopg.connect(database_url) as conn:
        row = conn.execute(sql.SQL("SELECT status, attempts, (SELECT count(*) FROM {}.runs) "
                                   "FROM {}.jobs WHERE id = %s").format(
            sql.Identifier(roles.schema), sql.Identifier(roles.schema)), [later.id]).fetchone()
    assert row == ("pending", 0, 0), row
