"""Enqueue from SQL (docs/enqueue-from-sql.md): SCHEMA.enqueue and SCHEMA.enqueue_many
apply the rules Python's Queue.enqueue applies, because both go through the database's
enqueue_jobs (Python's plain single job through its rules, enqueue_rule, in one INSERT:
tests/test_enqueue_statement.py). Identical input gives identical rows and identical
errors; a plain INSERT is refused naming the function; a trigger enqueues in its row's
transaction; a role that may only enqueue can do that and nothing else; bad input leaves
a Python caller's transaction usable."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from rota import (
    InvalidInput,
    PayloadError,
    Queue,
    SyncQueue,
    UnknownGroup,
    UnknownJobType,
    db,
)
from rota.checks import EARLIEST_DUE, LATEST_DUE
from rota.db import migrate, migrations
from rota.enqueue import batch_error, enqueue_error, enqueue_settings
from rota.job import DEFAULT_MAX_PAYLOAD_BYTES
from rota.settings import QueueSettings
from rota.store import Statements

Conn = psycopg.Connection[Any]


def sql_enqueue(conn: Conn, schema: str, type: Any, payload: Any, **args: Any) -> Any:
    """``SCHEMA.enqueue(type, payload, name => value, ...)``: the job's id, or None."""
    named = [sql.SQL("{} => {}").format(sql.Identifier(k), sql.Placeholder(k)) for k in args]
    query = sql.SQL("SELECT {}.enqueue({})").format(
        sql.Identifier(schema), sql.SQL(", ").join([sql.Placeholder("type"),
                                                    sql.Placeholder("payload"), *named]))
    row = conn.execute(query, {"type": type, "payload": payload, **args}).fetchone()
    assert row is not None
    return row[0]


def sql_enqueue_many(conn: Conn, schema: str, jobs: Any) -> list[int]:
    """``SCHEMA.enqueue_many(jobs)``: the ids created."""
    query = sql.SQL("SELECT * FROM {}.enqueue_many(%s)").format(sql.Identifier(schema))
    return [r[0] for r in conn.execute(query, [jobs]).fetchall()]


def as_python_error(exc: psycopg.Error) -> InvalidInput:
    """What Python raises for the same problem (docs/enqueue-from-sql.md, "Errors")."""
    return enqueue_error({"sqlstate": exc.sqlstate, "column": exc.diag.column_name,
                          "message": exc.diag.message_primary})


def rows(conn: Conn, schema: str, ids: list[int] | None = None) -> list[dict[str, Any]]:
    """Jobs of ``schema`` by id, without their id (the two paths number jobs apart)."""
    cur = conn.cursor(row_factory=dict_row)
    cur.execute(sql.SQL("SELECT * FROM {}.jobs {} ORDER BY id").format(
        sql.Identifier(schema), sql.SQL("WHERE id = ANY(%s)" if ids is not None else "")),
        [ids] if ids is not None else None)
    return [{k: v for k, v in r.items() if k != "id"} for r in cur.fetchall()]


def migrate_schema(url: str, schema: str) -> None:
    async def go() -> None:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
            await migrate(c, schema)

    asyncio.run(go())


def publish(conn: Conn, settings: QueueSettings) -> None:
    """Queue.publish_settings, on a sync connection."""
    conn.execute(Statements(settings.schema).sql("publish_settings"),
                 enqueue_settings(settings))


@pytest.fixture
def two_schemas(database_url: str, schema: str) -> Iterator[tuple[str, str]]:
    """This test's schema and a second one, both migrated, the second dropped after."""
    other = f"{schema}_sql"
    migrate_schema(database_url, schema)
    migrate_schema(database_url, other)
    yield schema, other
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(other)))


# -- the SQL functions ---------------------------------------------------------------------


async def test_enqueue_returns_the_id_and_null_for_an_open_duplicate(
    queue: Queue, database_url: str
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        first = sql_enqueue(conn, queue.schema, "search", Jsonb({"q": "boots"}),
                            dedupe_key="search:boots")
        assert isinstance(first, int)
        assert sql_enqueue(conn, queue.schema, "search", Jsonb({}),
                           dedupe_key="search:boots") is None
        ids = sql_enqueue_many(conn, queue.schema, Jsonb([
            {"type": "search", "payload": {"n": 1}, "dedupe_key": "search:boots"},
            {"type": "search", "payload": {"n": 2}, "dedupe_key": "b"},
            {"type": "search", "payload": {"n": 3}, "dedupe_key": "b"},
            {"type": "draft", "payload": None, "max_attempts": 5,
             "run_after": "2030-01-01T09:00:00+02:00"}]))
    assert len(ids) == 2 and ids == sorted(ids)
    job = await queue.get_job(ids[1])
    assert job is not None
    assert (job.type, job.payload, job.max_attempts, job.run_after) == (
        "draft", None, 5, datetime(2030, 1, 1, 7, tzinfo=UTC))
    claimed = await queue.claim("search", 5)
    assert [(j.id, j.payload) for j in claimed] == [(first, {"q": "boots"}), (ids[0], {"n": 2})]


async def test_the_sql_path_uses_the_published_settings_and_the_queue_clock(
    make_queue: Any, database_url: str
) -> None:
    queue = await make_queue(types=["search", "draft"], max_attempts=4,
                             max_attempts_by_type={"draft": 9}, max_payload_bytes=64)
    queue.clock_offset = timedelta(days=3)
    await queue.publish_settings()
    with psycopg.connect(database_url, autocommit=True) as conn:
        draft = sql_enqueue(conn, queue.schema, "draft", Jsonb({}))
        search = sql_enqueue(conn, queue.schema, "search", Jsonb({}), max_attempts=2)
        with pytest.raises(psycopg.errors.UndefinedObject,
                           match="unknown job type 'serach'; declared types: draft, search"):
            sql_enqueue(conn, queue.schema, "serach", Jsonb({}))
        with pytest.raises(psycopg.errors.ProgramLimitExceeded,
                           match="payload is 73 bytes, larger than the maximum 64"):
            sql_enqueue(conn, queue.schema, "draft", Jsonb({"s": "x" * 64}))
        db_now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    jobs = {j.type: j for j in [await queue.get_job(draft), await queue.get_job(search)]
            if j is not None}
    assert (jobs["draft"].max_attempts, jobs["search"].max_attempts) == (9, 2)
    # The queue's clock: now() + clock_offset, for created_at and the default run_after.
    assert jobs["draft"].created_at - db_now > timedelta(days=2, hours=23)
    assert jobs["draft"].run_after == jobs["draft"].created_at
    assert [j.id for j in await queue.claim("draft", 1)] == [draft]


async def test_publishing_writes_only_what_changed(make_queue: Any, aconn: Any) -> None:
    queue = await make_queue(types=["b", "a"], max_attempts_by_type={"a": 2})
    query = f'SELECT types, max_attempts_by_type, published_at FROM "{queue.schema}"' \
            ".enqueue_settings"
    before = await (await aconn.execute(query)).fetchone()
    assert before[:2] == (["a", "b"], {"a": 2})
    await queue.publish_settings()
    assert await (await aconn.execute(query)).fetchone() == before
    queue.max_attempts_by_type["b"] = 5  # a setting changed after it was published
    await queue.publish_settings()
    after = await (await aconn.execute(query)).fetchone()
    assert after[1] == {"a": 2, "b": 5} and after[2] > before[2]


def test_a_fresh_schema_has_settings_equal_to_pythons_defaults(
    database_url: str, migrated: str
) -> None:
    default = QueueSettings(schema=migrated)
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(sql.SQL(
            "SELECT types, max_attempts, max_attempts_by_type, max_payload_bytes, groups, "
            "clock_offset FROM {}.enqueue_settings").format(sql.Identifier(migrated))
        ).fetchall()
    assert row == [(None, default.max_attempts, {}, DEFAULT_MAX_PAYLOAD_BYTES, None,
                    timedelta(0))]


# -- the same rules, the same rows -----------------------------------------------------------


SETTINGS = {"types": ["a", "b", "c"], "max_attempts": 4, "max_attempts_by_type": {"b": 7},
            "max_payload_bytes": 1100}
OFFSET = timedelta(hours=3)

text_st = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                  max_size=8)
json_st = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**20), 10**20) | text_st
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text_st, inner, max_size=4),
    max_leaves=12)


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


# Mostly jobs that are written, and each rule broken now and then, at its edge.
job_st = st.fixed_dictionaries({
    "type": st.sampled_from(["a", "b", "c"] * 3 + ["zz", "", "a" * 512, "a" * 513]),
    "payload": st.one_of(json_st, json_st, json_st,
                         st.integers(1096, 1100).map(lambda n: "x" * n),  # 1,098 bytes on
                         st.sampled_from([nested(256), nested(257)])),
}, optional={
    "group_id": st.sampled_from([None, "g1", "g2", "nope", "", "g" * 512, "g" * 513]),
    "dedupe_key": st.sampled_from([None, "k1", "k2", "", "k" * 512, "k" * 513]),
    "run_after": st.sampled_from([EARLIEST_DUE, EARLIEST_DUE - timedelta(microseconds=1),
                                  LATEST_DUE, LATEST_DUE + timedelta(microseconds=1)])
    | st.datetimes(min_value=datetime(1, 1, 1), timezones=st.just(UTC)),
    "max_attempts": st.sampled_from([-1, 0, 1, 5]),
})


def outcome(conn: Conn, call: Callable[[], Any]) -> Any:
    """The result of ``call`` in a savepoint (an SQL error must not end the test's
    transaction), or its error as (class, message), psycopg's mapped to the class Python
    raises for it."""
    try:
        with conn.transaction():
            return call()
    except InvalidInput as exc:
        return type(exc).__name__, str(exc)
    except psycopg.Error as exc:
        mapped = as_python_error(exc)
        return type(mapped).__name__, str(mapped)


def as_json(item: dict[str, Any]) -> dict[str, Any]:
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in item.items()}


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(jobs=st.lists(job_st, min_size=1, max_size=3))
def test_python_and_sql_give_identical_rows_and_errors(
    database_url: str, two_schemas: tuple[str, str], jobs: list[dict[str, Any]]
) -> None:
    """Each job through Python (SyncQueue, schema A) and SQL (SCHEMA.enqueue, schema B)
    in one transaction, so now() is the same: the same outcome, the same row, every
    column but the id; then the batch both ways."""
    a, b = two_schemas
    python = SyncQueue(schema=a, **SETTINGS)
    python.clock_offset = OFFSET
    with psycopg.connect(database_url) as conn:
        for s in (a, b):
            conn.execute(sql.SQL("INSERT INTO {}.groups (group_id, plan) VALUES ('g1', NULL),"
                                 " ('g2', NULL)").format(sql.Identifier(s)))
        settings_b = QueueSettings(schema=b, **SETTINGS)
        settings_b.clock_offset = OFFSET
        publish(conn, settings_b)
        for job in jobs:
            args = {k: v for k, v in job.items() if k not in ("type", "payload")}
            py = outcome(conn, partial(python.enqueue, conn, job["type"], job["payload"],
                                       **args))
            via_sql = outcome(conn, partial(sql_enqueue, conn, b, job["type"],
                                            Jsonb(job["payload"]), **args))
            if isinstance(via_sql, int):
                [expected] = rows(conn, b, [via_sql])
                assert py is not None and not isinstance(py, tuple), (job, py)
                assert rows(conn, a, [py.id]) == [expected]
            else:
                assert (None if py is None else py if isinstance(py, tuple) else "row") \
                    == via_sql, job
        py_many = outcome(conn, lambda: python.enqueue_many(conn, jobs))
        sql_many = outcome(conn, lambda: len(sql_enqueue_many(
            conn, b, Jsonb([as_json(j) for j in jobs]))))
        if isinstance(sql_many, tuple) and sql_many[0] == "UnknownGroup":
            # The one message that differs: Python names the batch's first item with an
            # unknown group and its id, which the SQL function (migration 019, not to be
            # restated for a message) leaves out; the rest is the SQL function's text.
            sql_many = ("UnknownGroup", str(batch_error(
                {"sqlstate": "23503", "column": "group_id", "message": sql_many[1]},
                [j.get("group_id") for j in jobs])))
            assert sql_many[1].startswith("item "), sql_many
        assert py_many == sql_many, jobs
        assert rows(conn, a) == rows(conn, b)
        conn.rollback()


ENQUEUE_ONE = """
SELECT e.problem, (e.job).*
FROM {schema}.enqueue_jobs(
    %(types)s::text[], %(payloads)s::jsonb[], %(groups)s::text[], %(keys)s::text[],
    %(run_afters)s::timestamptz[], %(max_attempts)s::integer[], false,
    %(s_types)s::text[], %(s_max)s::integer, %(s_by_type)s::jsonb, %(s_bytes)s::integer,
    %(s_groups)s::regclass, %(offset)s::interval, ARRAY[NULL::jsonb]) AS e
"""


def enqueue_one(conn: Conn, schema: str, job: dict[str, Any], *,
                groups_relation: str | None) -> list[dict[str, Any]]:
    """``enqueue_jobs`` for one job with SETTINGS and the groups relation named (which
    takes the steps a batch takes) or not (rota's own table: one job without a dedupe
    key takes the single-job statement); its rows without the id."""
    cur = conn.cursor(row_factory=dict_row)
    cur.execute(sql.SQL(ENQUEUE_ONE).format(schema=sql.Identifier(schema)), {
        "types": [job["type"]], "payloads": [Jsonb(job["payload"])],
        "groups": [job.get("group_id")], "keys": [job.get("dedupe_key")],
        "run_afters": [job.get("run_after")], "max_attempts": [job.get("max_attempts")],
        "s_types": SETTINGS["types"], "s_max": SETTINGS["max_attempts"],
        "s_by_type": Jsonb(SETTINGS["max_attempts_by_type"]),
        "s_bytes": SETTINGS["max_payload_bytes"], "s_groups": groups_relation,
        "offset": OFFSET})
    return [{k: v for k, v in r.items() if k != "id"} for r in cur.fetchall()]


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(jobs=st.lists(job_st, min_size=1, max_size=4))
def test_the_single_job_statement_and_the_steps_give_the_same_rows_and_problems(
    database_url: str, two_schemas: tuple[str, str], jobs: list[dict[str, Any]]
) -> None:
    """Each job into schema A through the single-job statement (rota's groups table,
    s_groups null) and into schema B through the steps (the same table named as the
    groups relation), in one transaction, so now() is the same: the same problem, or the
    same row but its id; a repeated dedupe key is skipped both ways."""
    a, b = two_schemas
    with psycopg.connect(database_url) as conn:
        for s in (a, b):
            conn.execute(sql.SQL("INSERT INTO {}.groups (group_id, plan) VALUES ('g1', NULL),"
                                 " ('g2', NULL)").format(sql.Identifier(s)))
        for job in jobs:
            one = enqueue_one(conn, a, job, groups_relation=None)
            steps = enqueue_one(conn, b, job, groups_relation=f'"{b}".groups')
            assert one == steps, job
        conn.rollback()


async def test_bad_input_leaves_the_callers_transaction_usable(
    queue: Queue, database_url: str
) -> None:
    async with await psycopg.AsyncConnection.connect(database_url) as c:
        kept = await queue.enqueue("t", {"n": 1}, conn=c)
        with pytest.raises(UnknownGroup, match="^unknown group 'nope': create it first"):
            await queue.enqueue("t", {}, group_id="nope", conn=c)
        with pytest.raises(PayloadError, match="nested deeper than 256 levels"):
            await queue.enqueue_many([{"type": "t", "payload": nested(257)}], conn=c)
        with pytest.raises(InvalidInput,
                           match="^item 1: dedupe_key is 600 bytes long in UTF-8 \\(600 "):
            await queue.enqueue_many([{"type": "t", "payload": {}},
                                      {"type": "t", "payload": {}, "dedupe_key": "k" * 600}],
                                     conn=c)
        assert await queue.enqueue("t", {"n": 2}, conn=c) is not None
        await c.commit()
    assert kept is not None
    assert [j.payload for j in await queue.claim("t", 5)] == [{"n": 1}, {"n": 2}]


async def test_sql_errors_carry_the_sqlstate_and_the_argument(
    make_queue: Any, database_url: str
) -> None:
    queue = await make_queue(types=["t"])
    cases: list[tuple[dict[str, Any], type[psycopg.Error], str, type[InvalidInput], str]] = [
        ({"type": ""}, psycopg.errors.InvalidParameterValue, "type", InvalidInput,
         "job type must be a non-empty string, got ''"),
        ({"type": "x"}, psycopg.errors.UndefinedObject, "type", UnknownJobType,
         "unknown job type 'x'; declared types: t"),
        ({"payload": None}, psycopg.errors.InvalidParameterValue, "payload", PayloadError,
         "payload must be a JSON value, got NULL (a JSON null is 'null'::jsonb)"),
        ({"group_id": "nope"}, psycopg.errors.ForeignKeyViolation, "group_id", UnknownGroup,
         "unknown group 'nope': create it first (a row of the groups relation; "
         "queue.upsert_group in Python) or enqueue without a group"),
        ({"run_after": datetime(9999, 12, 31, 23, tzinfo=UTC)},
         psycopg.errors.InvalidParameterValue, "run_after", InvalidInput,
         "run_after=9999-12-31T23:00:00+00:00 is out of range: due times must lie between "
         "0001-01-02 and 9999-12-30 (UTC)"),
        ({"max_attempts": 0}, psycopg.errors.InvalidParameterValue, "max_attempts",
         InvalidInput, "max_attempts must be an int >= 1, got 0"),
    ]
    with psycopg.connect(database_url, autocommit=True) as conn:
        for args, error, column, python_error, message in cases:
            call = {"type": "t", "payload": Jsonb({}), **args}
            with pytest.raises(error) as exc:
                sql_enqueue(conn, queue.schema, **call)
            assert (exc.value.diag.column_name, exc.value.diag.message_primary) == (
                column, message)
            assert type(as_python_error(exc.value)) is python_error
            if args.get("payload", 0) is not None:  # Python's None is JSON null
                python_args = {k: v for k, v in args.items() if k != "type"}
                with pytest.raises(python_error) as py_exc:
                    await queue.enqueue(args.get("type", "t"), {}, **python_args)
                assert str(py_exc.value) == message


@pytest.mark.parametrize(("jobs", "message"), [
    ({"type": "t"}, "jobs must be a JSON array of objects (one per job), got object"),
    ([{"type": "t", "payload": {}}, 5], "item 1: expected an object, got number"),
    ([{"type": "t"}], "item 0: needs 'type' and 'payload'"),
    ([{"type": "t", "payload": {}, "prio": 1, "at": 2}],
     "item 0: needs 'type' and 'payload', may have 'group_id', 'dedupe_key', 'run_after', "
     "'max_attempts', 'trace_context'; unexpected ['at', 'prio']"),
    ([{"type": 5, "payload": {}}], "item 0: job type must be a non-empty string, got 5"),
    ([{"type": "t", "payload": {}, "group_id": 7}],
     "item 0: group_id must be a non-empty string, got 7"),
    ([{"type": "t", "payload": {}, "run_after": "2030-01-01T09:00"}],
     "item 0: run_after must be an ISO 8601 time with its UTC offset "
     "(2030-01-01T09:00:00Z), got \"2030-01-01T09:00\""),
    ([{"type": "t", "payload": {}, "max_attempts": 2.5}],
     "item 0: max_attempts must be an int >= 1, got 2.5"),
    ([{"type": "t", "payload": {}}, {"type": "t", "payload": {}, "max_attempts": 0}],
     "item 1: max_attempts must be an int >= 1, got 0"),
], ids=["not-an-array", "not-an-object", "no-payload", "unknown-keys", "type-not-text",
        "group-not-text", "naive-time", "fractional-attempts", "no-attempts"])
async def test_enqueue_many_names_the_bad_item(
    queue: Queue, database_url: str, aconn: Any, jobs: Any, message: str
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as exc:
            sql_enqueue_many(conn, queue.schema, Jsonb(jobs))
    assert exc.value.diag.message_primary == message
    cur = await aconn.execute(f'SELECT count(*) FROM "{queue.schema}".jobs')
    assert (await cur.fetchone())[0] == 0


# -- plain INSERT, NOTIFY, triggers, privileges --------------------------------------------


def test_a_plain_insert_is_refused_naming_the_function(database_url: str,
                                                       migrated: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.FeatureNotSupported) as exc:
            conn.execute(sql.SQL("INSERT INTO {}.jobs (type, payload) VALUES ('t', '{{}}')")
                         .format(sql.Identifier(migrated)))
        assert exc.value.diag.message_primary == (
            f'jobs are enqueued with "{migrated}".enqueue(type, payload, ...) or '
            f'"{migrated}".enqueue_many(jobs), which apply the queue\'s checks and defaults; '
            f'a plain INSERT INTO "{migrated}".jobs must give max_attempts, run_after and '
            "created_at itself")
        assert exc.value.diag.message_hint == (
            f'SELECT "{migrated}".enqueue(\'my_type\', \'{{"key": "value"}}\');')
        # A statement that gives every column (a fixture, a data migration) works.
        conn.execute(sql.SQL("INSERT INTO {}.jobs (type, payload, max_attempts, run_after, "
                             "created_at) VALUES ('t', '{{}}', 1, now(), now())")
                     .format(sql.Identifier(migrated)))


def test_sql_enqueue_wakes_listeners_at_commit_only(database_url: str, migrated: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as listener, \
            psycopg.connect(database_url) as conn:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(migrated)))
        sql_enqueue(conn, migrated, "t", Jsonb({}))
        conn.rollback()
        assert list(listener.notifies(timeout=0.5)) == []
        sql_enqueue_many(conn, migrated, Jsonb([{"type": "t", "payload": 1}] * 3))
        conn.commit()
        got = list(listener.notifies(timeout=5, stop_after=1))
    assert [(n.channel, n.payload) for n in got] == [(migrated, "insert")]


# The docs' trigger example (docs/enqueue-from-sql.md, "From a trigger"), for an
# application schema APP and rota's schema ROTA.
TRIGGER_EXAMPLE = """
CREATE TABLE {app}.campaigns (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    owner_id text NOT NULL,
    plan     text NOT NULL,
    brief    text NOT NULL,
    paused   boolean NOT NULL DEFAULT false
);
-- rota's groups relation: each campaign is a group.
CREATE VIEW {app}.campaign_groups AS
    SELECT id::text AS group_id, owner_id, plan, NOT paused AS active FROM {app}.campaigns;

-- A new campaign's first job, in the transaction that inserts the campaign.
CREATE FUNCTION {app}.plan_new_campaign() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {rota}.enqueue('plan_campaign',
                           jsonb_build_object('campaign_id', NEW.id, 'brief', NEW.brief),
                           group_id => NEW.id::text,
                           dedupe_key => 'plan_campaign:' || NEW.id);
    RETURN NULL;
END
$$;
CREATE TRIGGER campaigns_plan_new AFTER INSERT ON {app}.campaigns
    FOR EACH ROW EXECUTE FUNCTION {app}.plan_new_campaign();
"""


async def test_a_trigger_enqueues_a_new_campaigns_first_job_in_its_transaction(
    make_queue: Any, database_url: str, schema: str, enqueue_only_role: Any
) -> None:
    app = f"{schema}_app"
    ident = sql.Identifier
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(ident(app)))
        conn.execute(sql.SQL(TRIGGER_EXAMPLE).format(app=ident(app), rota=ident(schema)))
    try:
        queue = await make_queue(groups=f"{app}.campaign_groups", types=["plan_campaign"])
        role = enqueue_only_role(schema)  # the application's role may only enqueue
        with psycopg.connect(database_url) as conn:
            conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {app} TO {role}; "
                                 "GRANT SELECT, INSERT ON {app}.campaigns TO {role}")
                         .format(app=ident(app), role=ident(role)))
            conn.commit()
            conn.execute(sql.SQL("SET ROLE {}").format(ident(role)))
            insert = sql.SQL("INSERT INTO {}.campaigns (owner_id, plan, brief) "
                             "VALUES ('u1', 'free', %s) RETURNING id").format(ident(app))
            kept = conn.execute(insert, ["boots"]).fetchone()[0]  # type: ignore[index]
            conn.commit()
            conn.execute(insert, ["rolled back"])
            conn.rollback()
        jobs = await queue.claim("plan_campaign", 10)
        assert [(j.group_id, j.payload, j.dedupe_key) for j in jobs] == [
            (str(kept), {"campaign_id": kept, "brief": "boots"}, f"plan_campaign:{kept}")]
        assert jobs[0].max_attempts == queue.max_attempts
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(ident(app)))


def test_a_role_that_may_only_enqueue(database_url: str, migrated: str,
                                      enqueue_only_role: Any) -> None:
    role = enqueue_only_role(migrated)
    s = sql.Identifier(migrated)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
        job_id = sql_enqueue(conn, migrated, "t", Jsonb({"n": 1}), dedupe_key="k")
        assert sql_enqueue(conn, migrated, "t", Jsonb({}), dedupe_key="k") is None
        assert len(sql_enqueue_many(conn, migrated, Jsonb([{"type": "t", "payload": 2}]))) == 1
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            sql_enqueue(conn, migrated, "t", Jsonb({}), group_id="nope")
        refused = [
            "SELECT * FROM {s}.jobs",
            "INSERT INTO {s}.jobs (type, payload, max_attempts, run_after, created_at) "
            "VALUES ('t', '{{}}', 1, now(), now())",
            "UPDATE {s}.enqueue_settings SET max_payload_bytes = 1",
            "SELECT * FROM {s}.groups",
            # The rules without the definer: the role has no right to write jobs.
            "SELECT * FROM {s}.enqueue_jobs(ARRAY['t'], ARRAY['{{}}'::jsonb], ARRAY[NULL],"
            " ARRAY[NULL], ARRAY[NULL::timestamptz], ARRAY[NULL::int], false, NULL, 3,"
            " '{{}}', 100, NULL, '0')",
        ]
        for statement in refused:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql.SQL(statement).format(s=s))
        conn.execute("RESET ROLE")
        [(n,)] = conn.execute(sql.SQL("SELECT count(*) FROM {}.jobs").format(s)).fetchall()
        assert n == 2 and job_id is not None


def test_without_the_grant_a_role_cannot_enqueue(database_url: str, migrated: str) -> None:
    """The functions run as their owner, so EXECUTE is revoked from PUBLIC: a role with
    only USAGE on the schema cannot call them."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows_ = conn.execute(sql.SQL(
            "SELECT p.proname, p.prosecdef, p.proconfig, "
            "has_function_privilege('public', p.oid, 'EXECUTE') "
            "FROM pg_proc p WHERE p.pronamespace = {}::regnamespace "
            "AND p.proname IN ('enqueue', 'enqueue_many') ORDER BY 1").format(
                sql.Literal(migrated))).fetchall()
    assert rows_ == [(name, True, ["search_path=pg_catalog, pg_temp"], False)
                     for name in ("enqueue", "enqueue_many")]


async def test_a_released_schema_upgrades_and_keeps_its_jobs(
    database_url: str, schema: str, make_queue: Any
) -> None:
    """A schema as 0.1.0 left it (the baseline alone, with a job) gets migration 003 and
    the SQL functions; its job is untouched and still claimable."""
    baseline = migrations()[0]
    ident = sql.Identifier(schema)
    with psycopg.connect(database_url, autocommit=True) as conn:
        quoted = ident.as_string(conn)
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(ident))
        conn.execute(baseline.text.format(schema=quoted).encode())
        conn.execute(db._VERSION_TABLE.format(schema=quoted).encode())
        conn.execute(db._record(baseline, ident))
        conn.execute(sql.SQL("INSERT INTO {}.jobs (type, payload, max_attempts, run_after, "
                             "created_at) VALUES ('t', '{{\"old\": true}}', 3, now(), now())")
                     .format(ident))
    queue = await make_queue(max_attempts=6)
    with psycopg.connect(database_url, autocommit=True) as conn:
        versions = conn.execute(sql.SQL("SELECT version FROM {}.rota_migrations ORDER BY 1")
                                .format(ident)).fetchall()
        new = sql_enqueue(conn, schema, "t", Jsonb({"new": True}))
    assert versions == [(m.version,) for m in migrations()]
    jobs = await queue.claim("t", 5)
    assert [(j.payload, j.max_attempts) for j in jobs] == [({"old": True}, 3), ({"new": True}, 6)]
    assert jobs[1].id == new


async def test_the_sql_path_refuses_an_unqualified_groups_relation(
    make_queue: Any, database_url: str
) -> None:
    """Published before it existed, the name could not be recorded with its schema; the
    definer functions would look an unqualified name up in the caller's pg_temp too."""
    queue = await make_queue(groups="campaign_groups_not_yet")
    with psycopg.connect(database_url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState,
                           match="the groups relation '\"campaign_groups_not_yet\"' in .* is "
                                 "not schema-qualified: create it, then publish"):
            sql_enqueue(conn, queue.schema, "t", Jsonb({}), group_id="g")


def test_rota_migrate_with_an_app_publishes_its_settings_and_its_stages(
    database_url: str, schema: str
) -> None:
    from click.testing import CliRunner

    from rota.cli import cli

    def published() -> list[tuple[Any, ...]]:
        with psycopg.connect(database_url, autocommit=True) as conn:
            return conn.execute(sql.SQL(
                "SELECT types, max_attempts_by_type FROM {}.enqueue_settings").format(
                    sql.Identifier(schema))).fetchall()

    args = ["migrate", "--database-url", database_url, "--schema", schema]
    assert CliRunner().invoke(cli, args, env={"ROTA_APP": None}).exit_code == 0
    assert published() == [(None, {})]  # without an app: the defaults, untouched
    result = CliRunner().invoke(cli, [*args, "--app", "tests.cli_app:build_pipeline"],
                                env={"ROTA_APP": None})
    assert (result.exit_code, result.stdout) == (0, "up to date\n"), result.stderr
    # The app's declared types, and Stage("boom", ..., max_attempts=1) from its pipeline.
    assert published() == [(["boom", "echo"], {"boom": 1})]
