"""Test fixtures: a real PostgreSQL (DATABASE_URL, or an embedded throwaway server) and a
fresh schema per test, so tests run in parallel and never see each other's rows."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from rota import Queue
from rota.db import migrate, migrations
from rota.fair import Violation
from rota.store import Statements

ROOT = Path(__file__).resolve().parents[1]

# The Django project's tests need Django 6, hence Python 3.12+: `make test` runs them in
# a second virtualenv (.venv-django) with `pytest tests/django_project`; an interpreter
# without Django (this project's 3.11 .venv) leaves them to that run.
try:
    import django

    _HAS_DJANGO = django.VERSION >= (6,)
except ImportError:
    _HAS_DJANGO = False
collect_ignore = [] if _HAS_DJANGO else ["django_project"]


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """DATABASE_URL when set; otherwise one embedded server per test process."""
    url = os.environ.get("DATABASE_URL")
    if url:
        yield url
        return
    from rota.db import EmbeddedServer

    server = EmbeddedServer()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def schema(database_url: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A unique schema name for this test, dropped afterwards. Before it is dropped, the
    fair claim's bookkeeping in it must keep every invariant of its contract
    (src/rota/fair/verify.sql, what `rota verify` runs), after every test that touches a
    queue: a violation fails the test at teardown, naming each one. A test that breaks
    the bookkeeping on purpose says so with ``@pytest.mark.damages_bookkeeping``."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(database_url, autocommit=True) as conn:
        violations: list[str] = []
        if request.node.get_closest_marker("damages_bookkeeping") is None:
            violations = _violations(conn, name)
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
    if violations:
        pytest.fail("the fair claim's bookkeeping broke its contract: "
                    + "; ".join(violations), pytrace=False)


def _violations(conn: psycopg.Connection[Any], schema: str) -> list[str]:
    """The contract's violations in ``schema`` (none when it was never migrated, or not
    to the last migration: an upgrade test's schema may stop short of it)."""
    found = conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                         (f"{schema}.rota_migrations",)).fetchone()
    if not found or not found[0]:
        return []
    newest = conn.execute(sql.SQL("SELECT max(version) FROM {}.rota_migrations")
                          .format(sql.Identifier(schema))).fetchone()
    if newest is None or newest[0] != max(m.version for m in migrations()):
        return []
    rows = conn.execute(Statements(schema).sql("fair/verify")).fetchall()
    return [str(Violation(*r)) for r in rows]


@pytest.fixture
def migrated(database_url: str, schema: str) -> str:
    """This test's schema, migrated (for sync tests such as hypothesis properties)."""

    async def go() -> None:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as c:
            await migrate(c, schema)

    asyncio.run(go())
    return schema


@pytest.fixture(scope="session")
def queue_url(database_url: str) -> Iterator[str]:
    """The URL the ``make_queue`` and ``queue`` fixtures' queues connect to:
    ``database_url``, or with ``ROTA_TEST_POOLER=transaction`` (or ``session``) a
    PgBouncer in that mode in front of it, started for the session (the pooler leg of
    ``make test``; docs/operations.md, "Poolers and failover"). Tests' own connections
    stay direct."""
    mode = os.environ.get("ROTA_TEST_POOLER")
    if not mode:
        yield database_url
        return
    from tests.pgbouncer import PgBouncer

    with PgBouncer(database_url, pool_mode=mode) as bouncer:  # type: ignore[arg-type]
        yield bouncer.url()


@pytest.fixture
async def make_queue(queue_url: str, schema: str) -> AsyncIterator[Any]:
    """Factory for migrated queues on this test's schema (all closed at teardown)."""
    made: list[Queue] = []

    async def make(**settings: Any) -> Queue:
        q = Queue(queue_url, schema=schema, **settings)
        await q.open()
        await q.migrate()
        made.append(q)
        return q

    yield make
    for q in made:
        await q.close()


@pytest.fixture
async def queue(make_queue: Any) -> Queue:
    q: Queue = await make_queue()
    return q


@pytest.fixture
def fair_exact(schema: str) -> Iterator[None]:
    """Kept for the modules that name it: every test's schema is checked against the
    fair claim's contract at teardown (:func:`schema`)."""
    yield


@pytest.fixture
async def aconn(database_url: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A separate autocommit connection for assertions straight from the tables."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as c:
        yield c


# The GRANTs docs/enqueue-from-sql.md gives a role that may only enqueue.
ENQUEUE_ONLY_GRANTS = (
    "GRANT USAGE ON SCHEMA {schema} TO {role}",
    "GRANT EXECUTE ON FUNCTION {schema}.enqueue(text, jsonb, text, text, timestamptz,"
    " integer, jsonb), {schema}.enqueue_many(jsonb) TO {role}",
)


@pytest.fixture
def enqueue_only_role(database_url: str) -> Iterator[Any]:
    """Factory: a new role (no login) granted only what enqueueing into a schema needs;
    every role made is dropped afterwards (roles belong to the cluster, not the test's
    schema)."""
    made: list[str] = []

    def make(schema: str, grants: tuple[str, ...] = ENQUEUE_ONLY_GRANTS) -> str:
        role = f"rota_enq_{uuid.uuid4().hex[:10]}"
        made.append(role)
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
            for grant in grants:
                conn.execute(sql.SQL(grant).format(schema=sql.Identifier(schema),
                                                   role=sql.Identifier(role)))
        return role

    yield make
    with psycopg.connect(database_url, autocommit=True) as conn:
        for role in made:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def signals_as_from_a_terminal() -> None:
    """In a child before its exec: SIGINT and SIGQUIT back to their defaults. A shell
    that starts the suite in the background (``make test &``) starts it with both
    ignored, and a child inherits that: Python then never turns SIGINT into
    KeyboardInterrupt, and a test's Ctrl-C to a one-shot command went unheard (the
    command, as a user starts it from a terminal, is what the test is about)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


@pytest.fixture
def spawn() -> Iterator[Any]:
    """Factory: `python -m rota.cli ARGS` as a process with text pipes for its output, run
    in ``cwd`` (the repository by default), its SIGINT as from a terminal
    (:func:`signals_as_from_a_terminal`); any still running at teardown is killed."""
    procs: list[subprocess.Popen[str]] = []

    def start(args: list[str], env: dict[str, str],
              cwd: Path = ROOT) -> subprocess.Popen[str]:
        p = subprocess.Popen([sys.executable, "-m", "rota.cli", *args], cwd=cwd, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=signals_as_from_a_terminal)
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
