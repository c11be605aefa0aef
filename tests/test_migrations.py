"""Migrations (docs/operations.md#migrations-and-upgrades): released files never change, a
fresh install (schema.sql) is the same schema as the migrations replayed in order, and
`migrate` refuses a schema whose recorded migrations are not the files it ships, once,
whoever runs it and however many at a time."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator
from importlib import resources
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg import sql

from rota import MigrationError, db, schema_sql
from rota.cli import cli
from rota.db import Migration, migrate, migrations

from .catalog import differences, snapshot

# -- released files never change ---------------------------------------------------------


def released() -> list[tuple[str, str, str]]:
    """The packaged manifest ``migrations/released.txt``: (release, file, sha256) rows."""
    text = resources.files("rota").joinpath("migrations", "released.txt").read_text("utf-8")
    rows = [line.split() for line in text.splitlines() if line.strip() and line[0] != "#"]
    assert all(len(r) == 3 for r in rows), rows
    return [(r[0], r[1], r[2]) for r in rows]


def manifest_problems(shipped: Iterable[Migration],
                      manifest: list[tuple[str, str, str]]) -> list[str]:
    """How the shipped migrations break the manifest (empty when they keep it): a released
    file missing or changed, or an unreleased one numbered before a released one."""
    by_file = {m.filename: m for m in shipped}
    problems = []
    for release, filename, sha in manifest:
        m = by_file.get(filename)
        if m is None:
            problems.append(f"{filename} (released in {release}) is missing")
        elif m.sha256 != sha:
            problems.append(f"{filename} (released in {release}) was edited: "
                            f"sha256 {m.sha256}, released {sha}")
    last = max((int(f[:3]) for _, f, _ in manifest), default=0)
    problems += [f"{m.filename} is not released but comes before a released migration"
                 for m in by_file.values()
                 if m.filename not in {f for _, f, _ in manifest} and m.version < last]
    return problems


def test_released_migrations_are_the_files_shipped() -> None:
    manifest = released()
    assert [f for _, f, _ in manifest] == sorted(f for _, f, _ in manifest)
    assert manifest[0][:2] == ("0.1.0", "001_baseline.sql")
    assert manifest_problems(migrations(), manifest) == []


def test_the_manifest_check_notices_an_edited_or_missing_released_file() -> None:
    first, *rest = migrations()
    edited = first._replace(text=first.text + "\n-- a comment added after the release\n")
    assert manifest_problems([edited, *rest], released()) == [
        f"001_baseline.sql (released in 0.1.0) was edited: sha256 {edited.sha256}, "
        f"released {first.sha256}"]
    assert manifest_problems(rest, released()) == [
        "001_baseline.sql (released in 0.1.0) is missing"]


# -- schema.sql equals the migrations replayed ------------------------------------------


@pytest.fixture
def new_schema(database_url: str) -> Iterator[Callable[[], str]]:
    """Factory of fresh schema names, all dropped afterwards."""
    made: list[str] = []

    def make() -> str:
        made.append(f"t_{uuid.uuid4().hex[:12]}")
        return made[-1]

    yield make
    with psycopg.connect(database_url, autocommit=True) as conn:
        for name in made:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE")
                         .format(sql.Identifier(name)))


def run_migrate(url: str, schema: str) -> list[int]:
    async def go() -> list[int]:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
            return await migrate(c, schema)

    return asyncio.run(go())


def replay(conn: psycopg.Connection[Any], schema: str, files: Iterable[Migration]) -> None:
    """Build ``schema`` by applying ``files`` in order, as upgrades apply them."""
    ident = sql.Identifier(schema)
    with conn.transaction():
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(ident))
        for m in files:
            conn.execute(m.text.format(schema=ident.as_string(conn)).encode())


def schema_only(catalog: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """A snapshot without rota_migrations, which records migrations rather than being
    made by them."""
    return {kind: {k: v for k, v in objs.items() if not k.startswith("rota_migrations")}
            for kind, objs in catalog.items()}


def test_fresh_install_is_the_migrations_replayed_in_order(
    database_url: str, new_schema: Callable[[], str]
) -> None:
    fresh, replayed = new_schema(), new_schema()
    assert run_migrate(database_url, fresh) == [m.version for m in migrations()]
    with psycopg.connect(database_url, autocommit=True) as conn:
        replay(conn, replayed, migrations())
        a, b = schema_only(snapshot(conn, fresh)), snapshot(conn, replayed)
    assert differences(a, b, "schema.sql", "migrations") == []
    # The comparison reads every kind of object, so an empty result means something.
    assert {kind: len(objs) > 0 for kind, objs in a.items()} == dict.fromkeys(a, True)


# Edits to a migration that the replay must notice, one per kind of catalog object; the
# baseline is released, so its text is fixed and these anchors stay valid.
EDITS = [
    ("index", "CREATE INDEX jobs_failed_idx ON {schema}.jobs (type, id)",
     "CREATE INDEX jobs_failed_idx ON {schema}.jobs (id)", "index jobs_failed_idx"),
    ("column default", "head_until timestamptz NOT NULL DEFAULT 'infinity'",
     "head_until timestamptz NOT NULL", "column fair_groups.head_until"),
    # A column no later migration changes (017 changes fair_served.n's type itself).
    ("column type", "    deferrals        integer NOT NULL DEFAULT 0,",
     "    deferrals        bigint NOT NULL DEFAULT 0,", "column jobs.deferrals"),
    ("table option", "WITH (fillfactor = 70,", "WITH (fillfactor = 80,",
     "relation fair_groups"),
    ("constraint", "CHECK (attempts >= 0)", "CHECK (attempts >= 1)",
     "constraint jobs.jobs_attempts_check"),
    # A function no later migration replaces.
    ("function body", "PERFORM pg_notify(TG_TABLE_SCHEMA, 'insert');",
     "PERFORM pg_notify(TG_TABLE_SCHEMA, 'inserted');", "function notify_jobs_inserted()"),
    ("trigger", "AFTER INSERT OR UPDATE OR DELETE ON {schema}.groups",
     "AFTER INSERT OR UPDATE ON {schema}.groups", "trigger groups.groups_fair_changed"),
]


@pytest.mark.parametrize(("old", "new", "reported"), [e[1:] for e in EDITS],
                         ids=[e[0] for e in EDITS])
def test_the_replay_notices_an_edited_migration(
    database_url: str, new_schema: Callable[[], str], old: str, new: str, reported: str
) -> None:
    fresh, edited = new_schema(), new_schema()
    first, *rest = migrations()
    assert first.text.count(old) == 1
    run_migrate(database_url, fresh)
    with psycopg.connect(database_url, autocommit=True) as conn:
        replay(conn, edited, [first._replace(text=first.text.replace(old, new)), *rest])
        found = differences(schema_only(snapshot(conn, fresh)), snapshot(conn, edited))
    assert [d.split(":")[0].removesuffix(" differs") for d in found] == [reported], found


def test_the_replay_notices_a_missing_migration(
    database_url: str, new_schema: Callable[[], str]
) -> None:
    fresh, short = new_schema(), new_schema()
    run_migrate(database_url, fresh)
    with psycopg.connect(database_url, autocommit=True) as conn:
        replay(conn, short, migrations()[:-1])
        found = differences(schema_only(snapshot(conn, fresh)), snapshot(conn, short))
    assert found  # what the missing migration makes or changes


def test_the_schema_script_is_a_fresh_install(
    database_url: str, new_schema: Callable[[], str]
) -> None:
    by_migrate, by_script = new_schema(), new_schema()
    run_migrate(database_url, by_migrate)
    recorded = sql.SQL("SELECT version, name, sha256 FROM {}.rota_migrations ORDER BY 1")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(schema_sql(by_script).encode())
        assert differences(snapshot(conn, by_migrate), snapshot(conn, by_script)) == []
        for s in (by_migrate, by_script):
            rows = conn.execute(recorded.format(sql.Identifier(s))).fetchall()
            assert rows == [(m.version, m.name, m.sha256) for m in migrations()]
    assert run_migrate(database_url, by_script) == []  # rota migrate takes over


# -- what migrate refuses ----------------------------------------------------------------


def cli_migrate(url: str, schema: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["migrate", "--database-url", url, "--schema", schema],
                                env={"ROTA_APP": None})
    return result.exit_code, result.stdout, result.stderr


def refused(url: str, schema: str, message: str) -> None:
    """migrate raises ``message``; `rota migrate` prints it as one line and exits 2."""
    with pytest.raises(MigrationError) as exc:
        run_migrate(url, schema)
    assert str(exc.value) == message
    assert cli_migrate(url, schema) == (2, "", f"error: {message}\n")


@pytest.mark.parametrize(("tamper", "message"), [
    pytest.param("UPDATE {}.rota_migrations SET sha256 = repeat('ab', 32) WHERE version = 1",
                 'migration 001_baseline.sql was changed after it was applied to schema '
                 '"{schema}": recorded sha256 abababababab…, shipped {shipped}…',
                 id="a-migration-changed-after-it-was-applied"),
    pytest.param("INSERT INTO {}.rota_migrations (version, name, sha256) "
                 "VALUES (999, 'later', repeat('0', 64))",
                 'schema "{schema}" records migration 999_later.sql, which this rota does not '
                 "ship (a newer rota migrated it): upgrade rota",
                 id="migrated-by-a-newer-rota"),
])
def test_migrate_refuses_a_schema_whose_record_differs_from_what_it_ships(
    database_url: str, schema: str, tamper: str, message: str
) -> None:
    """A migrated schema whose rota_migrations row was then changed (``tamper``)."""
    run_migrate(database_url, schema)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL(tamper).format(sql.Identifier(schema)))
    shipped = migrations()[0].sha256
    refused(database_url, schema, message.format(schema=schema, shipped=shipped[:12]))


def test_migrate_refuses_a_schema_of_a_pre_release_rota(
    database_url: str, schema: str
) -> None:
    ident = sql.Identifier(schema)
    with psycopg.connect(database_url, autocommit=True) as conn:  # as rota made it then
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(ident))
        conn.execute(sql.SQL(
            "CREATE TABLE {}.rota_migrations (version integer PRIMARY KEY, name text NOT "
            "NULL, applied_at timestamptz NOT NULL DEFAULT now())").format(ident))
        conn.execute(sql.SQL("INSERT INTO {}.rota_migrations (version, name) "
                             "VALUES (1, 'core'), (14, 'running_in_served')").format(ident))
    refused(database_url, schema,
            f'schema "{schema}" was migrated by a pre-release rota (rota_migrations has no '
            "checksums); no release existed before 0.1.0, so there is no upgrade: recreate "
            "the schema (drop it, then run rota migrate)")


# -- upgrades: the missing migrations, once --------------------------------------------


def test_an_upgrade_applies_only_the_new_migration_and_a_failed_one_keeps_nothing(
    database_url: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run_migrate(database_url, schema) == [m.version for m in migrations()]
    last = migrations()[-1].version
    broken = Migration(last + 1, "broken", "CREATE INDEX jobs_x ON {schema}.jobs (id);\n"
                                           "SELECT 1 / 0;\n")
    monkeypatch.setattr(db, "migrations", lambda: (*migrations(), broken))
    with pytest.raises(MigrationError) as exc:
        run_migrate(database_url, schema)
    assert str(exc.value) == (f'migrating schema "{schema}" failed (applying '
                              f"{broken.filename}): division by zero")
    fixed = broken._replace(name="index", text="CREATE INDEX jobs_x ON {schema}.jobs (id);\n")
    monkeypatch.setattr(db, "migrations", lambda: (*migrations(), fixed))
    assert run_migrate(database_url, schema) == [fixed.version]
    assert run_migrate(database_url, schema) == []
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(sql.SQL("SELECT version, name, sha256 FROM {}.rota_migrations "
                                    "ORDER BY 1").format(sql.Identifier(schema))).fetchall()
    assert rows[-1] == (fixed.version, "index", fixed.sha256)


def test_migrate_twice_applies_once(database_url: str, schema: str) -> None:
    assert run_migrate(database_url, schema) == [m.version for m in migrations()]
    assert run_migrate(database_url, schema) == []


async def test_concurrent_migrators_apply_each_version_once(
    database_url: str, schema: str, aconn: Any
) -> None:
    async def one() -> list[int]:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as c:
            return await migrate(c, schema)

    results = await asyncio.gather(*(one() for _ in range(4)))
    versions = [m.version for m in migrations()]
    assert sorted(results, key=len) == [[], [], [], versions]
    cur = await aconn.execute(
        sql.SQL("SELECT version FROM {}.rota_migrations ORDER BY version")
        .format(sql.Identifier(schema)))
    assert [r[0] for r in await cur.fetchall()] == versions


def test_concurrent_migrate_processes(database_url: str, schema: str) -> None:
    cmd = [sys.executable, "-m", "rota.cli", "migrate", "--schema", schema,
           "--database-url", database_url]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], outs
    assert sum(o[0].startswith("applied") for o in outs) == 1
