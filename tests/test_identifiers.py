"""Every identifier rota accepts works everywhere, or is refused (docs/operations.md,
"Security"): a queue's schema and a groups relation pass one check,
:func:`rota.db.identifier`, which matches the whole name. An accepted name migrates,
runs the queue's statements, and the `rota schema` script for it parses and applies; a
refused one raises InvalidInput with a clear message everywhere it can be given, before
anything reaches the database."""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from psycopg import sql

from rota import InvalidInput, Pipeline, Queue, Stage, SyncQueue, admin, db, maintain, schema_sql
from rota.cli import cli
from rota.db import identifier, migrate, migrations

#: The rule, written out independently of rota's own regular expression.
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_"
DIGITS = "0123456789"


def valid(name: str) -> bool:
    """Whether ``name`` follows the documented rule (docs/operations.md)."""
    return (0 < len(name) <= 63 and name[0] in LETTERS
            and all(c in LETTERS + DIGITS for c in name)
            and not name.lower().startswith("pg_"))


names = st.builds(
    lambda first, rest: first + rest,
    st.sampled_from(LETTERS), st.text(alphabet=LETTERS + DIGITS, max_size=62),
).filter(valid)

#: Near misses: a valid name with one character that breaks it somewhere.
BREAKERS = ["\n", "$$", "$", ".", " ", '"', "'", "-", ";", "\x00", "é", "{", "}", "%", "\t"]
near_misses = st.one_of(
    st.builds(lambda n, b, i: n[:i] + b + n[i:], names, st.sampled_from(BREAKERS),
              st.integers(0, 63)),
    st.builds(lambda n: "pg_" + n, names).filter(lambda n: len(n) <= 63),
    st.builds(lambda d, n: d + n, st.sampled_from(DIGITS), names),
    st.builds(lambda n: (n * 64)[:64], names),
    st.just(""),
)


# -- refused names ---------------------------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(name=st.one_of(near_misses, st.text(max_size=70), names))
def test_a_name_is_accepted_exactly_when_it_follows_the_rule(name: str) -> None:
    if valid(name):
        assert identifier(name) == sql.Identifier(name)
        return
    with pytest.raises(InvalidInput) as exc:
        identifier(name)
    message = str(exc.value)
    assert message.startswith(f"schema {name!r} is not a valid identifier")
    assert "\n" not in message  # repr() escapes it: the message stays one line


@pytest.mark.parametrize("name", ["rota\n", "x$$y", "a.b", "a$b", "1x", "pg_x", "PG_x",
                                  "x" * 64, "", "a b", "é", "a-b", 'a"b', "a'b"])
def test_a_refused_schema_is_refused_everywhere_it_can_be_given(
    database_url: str, name: str
) -> None:
    rule = f"schema {name!r} is not a valid identifier"
    for make in (lambda: Queue(database_url, schema=name), lambda: SyncQueue(schema=name),
                 lambda: schema_sql(name)):
        with pytest.raises(InvalidInput, match=f"^{re.escape(rule)}"):
            make()

    async def go() -> None:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as c:
            await migrate(c, name)

    with pytest.raises(InvalidInput, match=f"^{re.escape(rule)}"):
        asyncio.run(go())
    runner = CliRunner()
    # An empty --schema or ROTA_SCHEMA means "not given" (the default, rota), as an empty
    # environment variable usually does.
    # Said as it was given: the option, or the environment variable.
    for args, env, spelled in ((["schema", "--schema", name], {}, "--schema"),
                             (["migrate"], {"ROTA_SCHEMA": name}, "ROTA_SCHEMA"),
                             (["jobs"], {"ROTA_SCHEMA": name}, "ROTA_SCHEMA")) if name else ():
        result = runner.invoke(cli, args, env={"DATABASE_URL": database_url, "ROTA_APP": None,
                                               **env})
        assert result.exit_code == 2, (args, result.output)
        assert result.stdout == ""
        [line] = result.stderr.splitlines()
        assert line.startswith(f"error: {spelled}{rule.removeprefix('schema')}"), line
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s",
                            [name.replace("\x00", "")]).fetchone() == (0,)


@pytest.mark.parametrize("groups", ["a.b.c", "app.", ".groups", "app.pg_x", "app.x$$y",
                                    "app.groups\n", "app. groups"])
def test_a_refused_groups_relation_is_refused(database_url: str, groups: str) -> None:
    for make in (lambda: Queue(database_url, groups=groups),
                 lambda: SyncQueue(groups=groups)):
        with pytest.raises(InvalidInput, match=f"^groups relation {re.escape(repr(groups))} "
                                               "is not a valid identifier"):
            make()


# -- accepted names work everywhere ----------------------------------------------------


async def echo(ctx: Any) -> None:
    ctx.count("echoed")


async def exercise(url: str, schema: str, groups: str | None) -> None:
    """Run the queue's statements on ``schema``: enqueue (with its notification), the
    claim through a pipeline run, completion, maintenance and the admin reads."""
    async with Queue(url, schema=schema, groups=groups) as queue:
        if groups is None:
            await queue.upsert_group("g1", plan=None)
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as listen:
            await listen.execute(sql.SQL("LISTEN {}").format(sql.Identifier(schema)))
            await queue.enqueue("echo", {"n": 1}, group_id="g1", dedupe_key=str(groups))
            await queue.enqueue_many([{"type": "echo", "payload": {"n": 2}}])
            notes = [n async for n in listen.notifies(timeout=5, stop_after=1)]
            assert notes and {n.channel for n in notes} == {schema}, notes
        result = await Pipeline(queue, [Stage("echo", 10, 2, echo)]).run(
            trigger="manual", time_budget=timedelta(seconds=30))
        assert (result.stop_reason, result.jobs_done) == ("no_work", 2), result
        await maintain(queue)
        assert await admin.missing_migrations(queue) == []
        assert {j.status for j in (await admin.list_jobs(queue)).jobs} == {"done"}
        assert await admin.depth(queue) == []


def absent(conn: psycopg.Connection[Any], *schemas: str) -> bool:
    row = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = ANY(%s)",
                       [list(schemas)]).fetchone()
    return row == (0,)


def drop(conn: psycopg.Connection[Any], *schemas: str) -> None:
    for s in schemas:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(s)))


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(schema=names, app_schema=names, relation=names)
def test_an_accepted_name_migrates_runs_and_its_schema_script_applies(
    database_url: str, schema: str, app_schema: str, relation: str
) -> None:
    assume(schema != app_schema)
    with psycopg.connect(database_url, autocommit=True) as conn:
        # Names other tests (or PostgreSQL) use are not ours to create or drop.
        assume(absent(conn, schema, app_schema))
        try:
            # rota migrate, then every kind of statement, with rota's groups table.
            assert asyncio.run(_migrate(database_url, schema)) == [
                m.version for m in migrations()]
            asyncio.run(exercise(database_url, schema, None))
            # An application's groups relation with a generated, qualified name.
            ident = sql.Identifier(app_schema, relation)
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(app_schema)))
            conn.execute(sql.SQL("CREATE TABLE {} (group_id text PRIMARY KEY, owner_id text, "
                                 "plan text, active boolean NOT NULL)").format(ident))
            conn.execute(sql.SQL("INSERT INTO {} VALUES ('g1', NULL, NULL, true)")
                         .format(ident))
            asyncio.run(exercise(database_url, schema, f"{app_schema}.{relation}"))
            drop(conn, schema)
            # `rota schema` prints a script that parses and applies; rota migrate takes over.
            script = CliRunner().invoke(cli, ["schema", "--schema", schema])
            assert script.exit_code == 0, script.output
            conn.execute(script.stdout.encode())
            assert asyncio.run(_migrate(database_url, schema)) == []
            asyncio.run(exercise(database_url, schema, None))
        finally:
            drop(conn, schema, app_schema)


async def _migrate(url: str, schema: str) -> list[int]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
        return await migrate(c, schema)


def test_the_rule_is_the_one_in_the_docs() -> None:
    """The docs and the message state the same rule the check applies."""
    with pytest.raises(InvalidInput) as exc:
        db.identifier("x$y")
    assert "letters, digits and _, not starting with a digit, 1 to 63 characters" in str(
        exc.value)
