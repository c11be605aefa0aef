"""A schema that was never migrated, and a groups relation that does not exist: the
database's error is raised as it is (the worker and the CLI tell them apart by type), with
a note that says what to do (docs/design.md, "Bad input")."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from rota import Queue, SyncQueue


def migrate_note(schema: str) -> str:
    return (f"rota: is the schema {schema!r} migrated? `rota migrate --schema {schema}`, "
            "`await queue.migrate()` or, with Django, `python manage.py migrate` "
            "creates and updates rota's tables (docs/operations.md, \"Migrations and "
            'upgrades")')


def groups_note(relation: str) -> str:
    return (f"rota: the groups relation {relation!r} the queue was given (groups=, "
            "Django's OPTIONS['GROUPS']) does not exist: create it (README.md, \"Groups "
            'from your own tables"), or leave it unset for rota\'s own table')


async def test_a_schema_never_migrated_says_to_migrate(database_url: str, schema: str,
                                                       aconn: Any) -> None:
    """Before, the Python API raised psycopg's error alone (`relation "….jobs" does not
    exist`), which names neither rota nor `rota migrate`."""
    queue = Queue(database_url, schema=schema)
    await queue.open()
    try:
        calls = [
            (lambda: queue.enqueue("t", {}), psycopg.errors.UndefinedTable),
            (lambda: queue.enqueue("t", {}, dedupe_key="k"), psycopg.errors.InvalidSchemaName),
            (lambda: queue.claim("t", 1), psycopg.errors.UndefinedTable),
            (lambda: queue.enqueue("t", {}, conn=aconn), psycopg.errors.UndefinedTable),
        ]
        for call, kind in calls:
            with pytest.raises(kind) as raised:
                await call()
            assert raised.value.__notes__ == [migrate_note(schema)]
            await aconn.rollback()
    finally:
        await queue.close()
    with psycopg.connect(database_url) as conn:
        with pytest.raises(psycopg.errors.UndefinedTable) as raised_sync:
            SyncQueue(schema=schema).enqueue(conn, "t", {})
        assert raised_sync.value.__notes__ == [migrate_note(schema)]


async def test_a_groups_relation_that_does_not_exist_is_named(make_queue: Any,
                                                              database_url: str,
                                                              schema: str) -> None:
    """Before, a `groups=` relation that does not exist was accepted, and the first
    enqueue into a group or claim raised psycopg's error alone."""
    relation = f"public.{schema}_no_view"
    queue = await make_queue(groups=relation)
    for call in (lambda: queue.enqueue("t", {}, group_id="g"), lambda: queue.claim("t", 1)):
        with pytest.raises(psycopg.errors.UndefinedTable) as raised:
            await call()
        assert str(raised.value).splitlines()[0] == (
            f'relation "{relation}" does not exist')
        assert raised.value.__notes__ == [groups_note(relation)]
    with psycopg.connect(database_url) as conn:
        with pytest.raises(psycopg.errors.UndefinedTable) as raised_sync:
            SyncQueue(schema=schema, groups=relation).enqueue(conn, "t", {}, group_id="g")
        assert raised_sync.value.__notes__ == [groups_note(relation)]


async def test_a_note_is_added_once(database_url: str, schema: str) -> None:
    """An error that passes through two of the queue's connection blocks (a claim's
    retry, a statement inside another) is noted once."""
    queue = Queue(database_url, schema=schema)
    error = psycopg.errors.UndefinedTable(f'relation "{schema}.jobs" does not exist')
    queue.store.note_missing(error)
    queue.store.note_missing(error)
    assert error.__notes__ == [migrate_note(schema)]


async def test_an_applications_own_missing_table_gets_no_note(queue: Queue) -> None:
    """A handler's or an application's statement on the queue's connection
    (`queue.connection()`, `ctx.connection()`) that names its own missing table or
    function is not about rota: no note blames rota's schema."""
    for statement, kind in (("SELECT * FROM app_orders_typo", psycopg.errors.UndefinedTable),
                            ("SELECT app_missing_fn()", psycopg.errors.UndefinedFunction)):
        with pytest.raises(kind) as raised:
            async with queue.connection() as c:
                await c.execute(statement)
        assert getattr(raised.value, "__notes__", None) is None


async def test_a_groups_relation_in_a_schema_that_does_not_exist(make_queue: Any,
                                                                 schema: str) -> None:
    """PostgreSQL says the schema is missing, not the relation: the note still names the
    groups relation, not rota's schema (which is migrated)."""
    relation = f"{schema}_nowhere.groups"
    queue = await make_queue(groups=relation)
    with pytest.raises(psycopg.errors.InvalidSchemaName) as raised:
        await queue.enqueue("t", {}, group_id="g")
    assert str(raised.value).splitlines()[0] == f'schema "{schema}_nowhere" does not exist'
    assert raised.value.__notes__ == [groups_note(relation)]


def test_a_sync_result_on_a_schema_never_migrated(database_url: str, schema: str) -> None:
    with psycopg.connect(database_url) as conn:
        with pytest.raises(psycopg.errors.UndefinedTable) as raised:
            SyncQueue(schema=schema).result(conn, 1)
    assert raised.value.__notes__ == [migrate_note(schema)]
