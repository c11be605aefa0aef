"""The single-job enqueue statements (docs/design.md, "Enqueue"): one job without a dedupe
key, into rota's groups table, is checked, its group looked up and the job inserted in
one INSERT (sql/enqueue_fast.sql from Python, enqueue_jobs' first statement from SQL),
and enqueue_jobs' steps (the rules, the group check, the insert) run only when it wrote
nothing (here and in tests/test_sql_enqueue.py: both give the same rows and problems).
A refused job writes nothing, not even an id; and the jobs trigger's one statement
still holds the groups' bookkeeping rows against the fold until the enqueue commits
(docs/fast-claim.md, "Writers: three protocols and one delta rule")."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from rota import Queue, UnknownGroup, UnknownJobType
from rota.enqueue import enqueue_params, enqueued_row, fast_params


async def test_a_refused_job_writes_nothing_and_takes_no_id(
        make_queue: Any, aconn: Any) -> None:
    queue: Queue = await make_queue(types=["t"])
    await queue.upsert_group("g", plan=None)
    first = await queue.enqueue("t", {"n": 1}, group_id="g")
    with pytest.raises(UnknownGroup, match="^unknown group 'nope': create it first"):
        await queue.enqueue("t", {}, group_id="nope")
    with pytest.raises(UnknownJobType, match="^unknown job type 'u'; declared types: t$"):
        await queue.enqueue("u", {}, group_id="g")
    second = await queue.enqueue("t", {"n": 2}, group_id="g")
    assert first is not None and second is not None
    assert second.id == first.id + 1
    cur = await aconn.execute(sql.SQL("SELECT payload FROM {}.jobs ORDER BY id")
                              .format(sql.Identifier(queue.schema)))
    assert await cur.fetchall() == [({"n": 1},), ({"n": 2},)]


async def test_a_duplicate_of_an_open_job_is_skipped_and_a_later_one_created(
        queue: Queue) -> None:
    await queue.upsert_group("g", plan=None)
    first = await queue.enqueue("t", {"n": 1}, group_id="g", dedupe_key="k")
    assert await queue.enqueue("t", {"n": 2}, group_id="g", dedupe_key="k") is None
    [claimed] = await queue.claim("t", 1)
    assert first is not None and claimed.id == first.id
    await queue.complete(claimed)
    again = await queue.enqueue("t", {"n": 3}, group_id="g", dedupe_key="k")
    assert again is not None and again.payload == {"n": 3}


LOCKED_BY_THE_FOLD = """
SELECT fg.group_id FROM {}.fair_groups fg WHERE fg.type = 't' ORDER BY fg.group_id
FOR UPDATE SKIP LOCKED
"""


@pytest.mark.parametrize("batch", [False, True], ids=["one-job", "batch"])
async def test_an_open_enqueue_holds_its_groups_rows_against_the_fold(
        queue: Queue, database_url: str, aconn: Any, batch: bool) -> None:
    """The head-bound protocol: an enqueue into groups whose rows already bound its jobs
    only locks those rows (FOR KEY SHARE), and fair_fold's FOR UPDATE SKIP LOCKED passes
    them over until the enqueue commits."""
    for g in ("g1", "g2", "g3"):
        await queue.upsert_group(g, plan=None)
        await queue.enqueue("t", {}, group_id=g)
    locked_by_the_fold = sql.SQL(LOCKED_BY_THE_FOLD).format(sql.Identifier(queue.schema))
    async with await psycopg.AsyncConnection.connect(database_url) as writer:
        if batch:
            await queue.enqueue_many([{"type": "t", "payload": {}, "group_id": g}
                                      for g in ("g3", "g1", "g3", None)], conn=writer)
        else:
            await queue.enqueue("t", {}, group_id="g1", conn=writer)
        async with aconn.transaction():
            cur = await aconn.execute(locked_by_the_fold)
            assert await cur.fetchall() == ([("g2",)] if batch else [("g2",), ("g3",)])
        await writer.commit()
    async with aconn.transaction():
        cur = await aconn.execute(locked_by_the_fold)
        assert await cur.fetchall() == [("g1",), ("g2",), ("g3",)]
    assert await queue.verify() == []


async def test_a_job_due_later_or_in_a_new_group_is_noted_by_the_steps(
        queue: Queue, aconn: Any) -> None:
    """The trigger's one statement returns only when every row bounds its jobs; a job
    due later (or in a group with no row yet) goes through the steps that lower the
    bounds or make the row."""
    await queue.upsert_group("g1", plan=None)
    await queue.upsert_group("g2", plan=None)
    first = await queue.enqueue("t", {}, group_id="g1")
    assert first is not None
    later = await queue.enqueue("t", {}, group_id="g1",
                                run_after=first.run_after + timedelta(hours=1))
    fresh = await queue.enqueue("t", {}, group_id="g2")
    assert later is not None and fresh is not None
    cur = await aconn.execute(sql.SQL(
        "SELECT group_id, head_lb, head_id, ready_lb FROM {}.fair_groups WHERE type = 't' "
        "ORDER BY group_id").format(sql.Identifier(queue.schema)))
    assert await cur.fetchall() == [
        ("g1", first.created_at, first.id, first.run_after),
        ("g2", fresh.created_at, fresh.id, fresh.run_after)]
    assert await queue.verify() == []


async def test_jobs_bounded_only_by_created_at_and_id_together_keep_the_row_as_it_is(
        queue: Queue, database_url: str, aconn: Any) -> None:
    """The trigger's one statement tests a group's new jobs against (their earliest
    created_at, their smallest id); jobs that the row bounds only taken together, one at
    the row's created_at with a larger id and one later with a smaller id, go to the
    steps, which find them bounded: the row is left as it is."""
    await queue.upsert_group("g", plan=None)
    first = await queue.enqueue("t", {}, group_id="g")
    assert first is not None
    insert = sql.SQL(
        "INSERT INTO {}.jobs (id, type, group_id, payload, max_attempts, run_after, "
        "created_at) OVERRIDING SYSTEM VALUE VALUES "
        "(%(id)s + 5, 't', 'g', '{{}}', 3, %(at)s, %(at)s), "
        "(%(id)s - 1000, 't', 'g', '{{}}', 3, %(at)s, %(at)s + interval '1 second')"
    ).format(sql.Identifier(queue.schema))
    async with await psycopg.AsyncConnection.connect(database_url) as writer:
        await writer.execute(insert, {"id": first.id, "at": first.created_at})
        await writer.commit()
    rows = sql.SQL("SELECT head_lb, head_id, head_until = 'infinity', ready_lb "
                   "FROM {}.fair_groups WHERE type = 't'").format(sql.Identifier(queue.schema))
    cur = await aconn.execute(rows)
    assert await cur.fetchall() == [(first.created_at, first.id, True, first.run_after)]
    assert await queue.verify() == []


async def test_the_job_enqueue_returns_is_its_row_field_for_field(
        make_queue: Any, aconn: Any) -> None:
    """The enqueue's row is read straight into the Job (rota.enqueue.enqueued_row): on
    the queue's own pool (its kept cursor, twice), on a caller's connection and through
    SyncQueue, each job equals the row as a new cursor reads it (get_job), every
    field."""
    from rota import SyncQueue

    queue: Queue = await make_queue()
    await queue.upsert_group("g", plan=None)
    made = [await queue.enqueue("t", {"n": 1}, group_id="g", max_attempts=7),
            await queue.enqueue("t", [1.5, "é"], dedupe_key="k")]
    async with queue.connection() as c:
        made.append(await queue.enqueue("u", "text", conn=c))
    sync = SyncQueue(schema=queue.schema)
    with psycopg.connect(aconn.info.dsn, autocommit=True) as c:
        made.append(sync.enqueue(c, "t", None, group_id="g"))
    for job in made:
        assert job is not None
        assert job == await queue.get_job(job.id)
    assert [(j.type, j.payload, j.group_id, j.dedupe_key, j.max_attempts, j.status)
            for j in made if j is not None] == [
        ("t", {"n": 1}, "g", None, 7, "pending"), ("t", [1.5, "é"], None, "k", 3, "pending"),
        ("u", "text", None, None, 3, "pending"), ("t", None, "g", None, 3, "pending")]


TRACE = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


def _nested(depth: int) -> Any:
    """A list nested ``depth`` levels down."""
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


async def test_the_one_insert_writes_the_row_enqueue_jobs_writes_and_refuses_what_it_refuses(
        make_queue: Any, aconn: Any) -> None:
    """sql/enqueue_fast.sql restates enqueue_jobs' defaults and calls its rules: for each
    input both statements run in one transaction (the same now()), and the rows they
    write are equal column for column but the id; what enqueue_jobs refuses, the one
    INSERT does not write (no row: Queue.enqueue then runs enqueue_jobs for the
    problem)."""
    queue: Queue = await make_queue(types=["t", "u"], max_attempts=4)
    queue.clock_offset = timedelta(hours=2)
    await queue.upsert_group("g", plan=None)
    due = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    written = [
        dict(type="t", payload={"n": 1}),
        dict(type="t", payload=[1, "é"], group_id="g", max_attempts=7),
        dict(type="u", payload=None, group_id="g", run_after=due),
        dict(type="t", payload="by type"),  # max_attempts from the type's setting
        dict(type="t", payload={}, trace=TRACE),
        dict(type="t", payload={}, trace=None, null_trace=True),  # JSON null: none
    ]
    # (max_attempts, due at enqueue, trace_context) each row must have.
    expected = [(4, None, None), (7, None, None), (4, due, None), (9, None, None),
                (4, None, TRACE), (4, None, None)]
    refused = [
        (dict(type="v", payload={}), "42704"),                  # undeclared type
        (dict(type="t", payload={}, group_id="nope"), "23503"),  # unknown group
        (dict(type="t", payload={}, group_id=""), "22023"),      # empty group id
        (dict(type="t", payload={}, max_attempts=0), "22023"),
        (dict(type="t", payload={}, trace={"traceparent": "x"}), "22023"),
        (dict(type="t", payload=["x" * 2_000_000]), "54000"),   # larger than allowed
        (dict(type="t", payload=_nested(300)), "54000"),           # nested too deep
        (dict(type="t", payload={}, run_after=datetime(1, 1, 1, tzinfo=UTC)),
         "22023"),                                              # due time out of range
        (dict(type="t" * 513, payload={}), "22023"),            # type too long
        (dict(type="t", payload={}, group_id="g" * 513), "22023"),  # group id too long
    ]
    fast_sql, steps_sql = queue.store.sql("enqueue_fast"), queue.store.sql("enqueue")

    def params(given: dict[str, Any]) -> dict[str, Any]:
        given = dict(given)
        trace = given.pop("trace", None)
        null_trace = given.pop("null_trace", False)
        p = enqueue_params(queue.settings, **given)
        # As the enqueue span hands it over: JSON text, or None.
        p["trace_context"] = "null" if null_trace else (
            None if trace is None else json.dumps(trace))
        p["s_max_attempts_by_type"] = Jsonb({"t": 9} if given["payload"] == "by type"
                                            else {})
        return p

    async with aconn.transaction(force_rollback=True):
        now = (await (await aconn.execute("SELECT now()")).fetchone())[0]
        for given, (attempts, at, trace) in zip(written, expected, strict=True):
            p = params(given)
            fast = fast_params(p)
            assert fast is not None
            one = await (await aconn.cursor(row_factory=enqueued_row).execute(
                fast_sql, fast)).fetchone()
            steps = await (await aconn.cursor(row_factory=enqueued_row).execute(
                steps_sql, p)).fetchone()
            assert one is not None and steps is not None
            (no_problem, a), (none, b) = one, steps
            assert no_problem is None and none is None and a is not None and b is not None
            assert b.id == a.id + 1
            assert {**vars(a), "id": 0} == {**vars(b), "id": 0}
            assert (a.max_attempts, a.created_at, a.trace_context, a.status) == (
                attempts, now + timedelta(hours=2), trace, "pending")
            assert a.run_after == (a.created_at if at is None else at)
        for given, sqlstate in refused:
            p = params(given)
            fast = fast_params(p)
            assert fast is not None
            cur = await aconn.cursor(row_factory=enqueued_row).execute(fast_sql, fast)
            assert await cur.fetchone() is None
            steps = await (await aconn.cursor(row_factory=enqueued_row).execute(
                steps_sql, p)).fetchone()
            assert steps is not None and steps[0] is not None
            assert (steps[0]["sqlstate"], steps[1]) == (sqlstate, None)
        count = sql.SQL("SELECT count(*) FROM {}.jobs").format(sql.Identifier(queue.schema))
        assert await (await aconn.execute(count)).fetchone() == (2 * len(written),)
    # A dedupe key, or an application's groups relation, takes enqueue_jobs alone.
    keyed = enqueue_params(queue.settings, "t", {}, dedupe_key="k")
    assert fast_params({**keyed, "trace_context": None}) is None
    assert fast_params({**enqueue_params(queue.settings, "t", {}), "trace_context": None,
                        "s_groups": "app.customers"}) is None


async def test_a_plain_job_is_sent_as_the_one_insert_and_the_rest_through_enqueue_jobs(
        make_queue: Any, aconn: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Which statements a single enqueue sends, recorded by name: a plain job (no dedupe
    key, rota's own groups table) is sql/enqueue_fast.sql alone, on the queue's pool, on
    a caller's connection and through SyncQueue; a refused one is that statement, then
    sql/enqueue.sql (enqueue_jobs, which says why); a job with a dedupe key is
    sql/enqueue.sql alone."""
    from rota import SyncQueue
    from rota import statements as sql_module

    queue: Queue = await make_queue(types=["t"])
    await queue.upsert_group("g", plan=None)
    sent: list[str] = []
    for name in ("enqueue", "enqueue_fast"):
        original = getattr(sql_module, name)

        async def recording(*args: Any, _name: str = name, _original: Any = original,
                            **kwargs: Any) -> Any:
            sent.append(_name)
            return await _original(*args, **kwargs)

        monkeypatch.setattr(sql_module, name, recording)
    assert await queue.enqueue("t", {}, group_id="g") is not None
    async with queue.connection() as c:
        assert await queue.enqueue("t", {}, conn=c) is not None
    assert sent == ["enqueue_fast", "enqueue_fast"]
    sent.clear()
    with pytest.raises(UnknownGroup):
        await queue.enqueue("t", {}, group_id="nope")
    assert sent == ["enqueue_fast", "enqueue"]
    sent.clear()
    assert await queue.enqueue("t", {}, group_id="g", dedupe_key="k") is not None
    assert await queue.enqueue("t", {}, group_id="g", dedupe_key="k") is None
    assert sent == ["enqueue", "enqueue"]

    sync = SyncQueue(schema=queue.schema, types=["t"])
    named: list[str] = []
    statement = sync.statements.sql
    monkeypatch.setattr(sync.statements, "sql",
                        lambda name, **kw: named.append(name) or statement(name, **kw))
    with psycopg.connect(aconn.info.dsn, autocommit=True) as c:
        assert sync.enqueue(c, "t", {}, group_id="g") is not None
        with pytest.raises(UnknownGroup):
            sync.enqueue(c, "t", {}, group_id="nope")
        assert sync.enqueue(c, "t", {}, dedupe_key="j") is not None
    assert named == ["enqueue_fast", "enqueue_fast", "enqueue", "enqueue"]
