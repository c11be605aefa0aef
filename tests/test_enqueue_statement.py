"""The single-job enqueue statement (docs/design.md, "Enqueue"): one job without a dedupe
key, into rota's groups table, is checked, its group looked up and the job inserted in
one statement of enqueue_jobs, and the steps a batch takes (the rules, the group check,
the insert) run only when it wrote nothing (tests/test_sql_enqueue.py checks that both
give the same rows and problems). A refused job writes nothing, not even an id; and the
jobs trigger's one statement still holds the groups' bookkeeping rows against the fold
until the enqueue commits (docs/fast-claim.md, "Writers: three protocols and one delta
rule")."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from rota import Queue, UnknownGroup, UnknownJobType


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
