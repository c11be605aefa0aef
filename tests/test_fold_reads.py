"""What the fold reads (src/rota/fair/bookkeeping.sql, fair_fold; docs/fast-claim.md,
"The upkeep"): the rows of fair_groups and fair_owners it folds by their keys or ctids,
never the tables whole, whatever the planner's statistics; and a group's jobs from the
group's head bound on, so that the entries of the jobs claimed before the last fold,
which a long transaction keeps from vacuum, are not read again at every fold."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from rota import Queue

from .test_fair_contract import run


@pytest.fixture
def queue(queue: Queue) -> Queue:
    """The queue with its upkeep run only by the test: a claim notes its type instead of
    starting the background loop, so each fold below is the test's own."""
    queue.upkeep.request = queue.upkeep._seen.add  # type: ignore[method-assign]
    return queue


async def fold_counting(database_url: str, queue: Queue, counts: str,
                        *params: Any) -> tuple[Any, ...]:
    """One fold of type t in a transaction of its own, then ``counts`` (a query of the
    transaction's statistics, {s}: the schema) in the same transaction, on a new
    connection (a backend's counts not yet sent to the statistics, at most once a
    second, add up across its transactions). Returns the fold's result, then the
    counts."""
    async with await psycopg.AsyncConnection.connect(database_url) as c:
        folded = await run(c, queue, "SELECT {s}.fair_fold('t', now())")
        rows = await run(c, queue, counts, *params)
        await c.commit()
    return folded[0] + rows[0]


async def test_the_fold_reaches_rows_by_key_not_by_reading_the_tables(
        queue: Queue, aconn: Any, database_url: str) -> None:
    # 400 groups, each with a row and an owner row; a claim of 40 touches 40 of them.
    await run(aconn, queue, "INSERT INTO {s}.groups (group_id)"
              " SELECT 'g' || lpad(i::text, 3, '0') FROM generate_series(0, 399) i")
    await queue.enqueue_many([{"type": "t", "payload": {}, "group_id": f"g{i:03}"}
                              for i in range(400) for _ in range(2)])
    await run(aconn, queue, "SELECT {s}.fair_fold('t', now())")  # the owners' rows made
    jobs = await queue.claim("t", 40)
    assert len({j.group_id for j in jobs}) == 40
    # The owners the next fold computes again: the 40 groups' own, and those named by a
    # change it could not yet take in (one newer than the oldest transaction then
    # running, another test's too, waits for a later fold).
    [(owners,)] = await run(
        aconn, queue, "SELECT count(*) FROM (SELECT plan_key, unit FROM {s}.fair_groups"
        " WHERE group_id = ANY (%s) UNION SELECT plan_key, unit FROM {s}.fair_owner_changes)"
        " u", [j.group_id for j in jobs])
    # Statistics as a busy server has them: the tables analyzed (a planner that knows
    # fair_groups is 400 rows on a few pages read it whole with a seq scan and joined it
    # to the 40 groups, each version a long transaction keeps included).
    await run(aconn, queue, "ANALYZE {s}.fair_groups")
    await run(aconn, queue, "ANALYZE {s}.fair_owners")
    table = ("(SELECT {} FROM pg_stat_xact_user_tables"
             " WHERE schemaname = %s AND relname = '{}')")
    counts = await fold_counting(
        database_url, queue,
        "SELECT " + ", ".join(table.format(c, t) for c, t in [
            ("seq_scan", "fair_groups"), ("seq_scan", "fair_owners"),
            ("n_tup_upd", "fair_groups"), ("n_tup_upd", "fair_owners"),
            ("n_tup_ins", "fair_owners")]),
        *[queue.schema] * 5)
    # The 40 groups folded and their owners' rows moved on (40 when no change was left),
    # each row reached by its key or ctid: neither table read whole.
    assert counts == (40, 0, 0, 40, owners, 0)


async def test_the_fold_reads_a_groups_jobs_from_its_head_bound(
        queue: Queue, aconn: Any, database_url: str) -> None:
    await queue.upsert_group("g", plan=None)
    # 320 jobs of one group in one statement: one run_after, so their entries of
    # jobs_pending_ready_idx share posting lists, which no scan marks dead while a
    # transaction that saw them is open.
    await queue.enqueue_many([{"type": "t", "payload": {}, "group_id": "g"}
                              for _ in range(320)])
    await run(aconn, queue, "SELECT {s}.fair_fold('t', now())")
    reads = ("SELECT pg_stat_get_xact_tuples_returned(%s::regclass)"
             "     + pg_stat_get_xact_tuples_returned(%s::regclass)")
    names = [f'"{queue.schema}".jobs_pending_idx', f'"{queue.schema}".jobs_pending_ready_idx']
    async with await psycopg.AsyncConnection.connect(database_url) as pin:
        # A long transaction holds the horizon: nothing the claims below leave is dead
        # to every snapshot, so index scans return every entry they pass.
        await pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await pin.execute("SELECT count(*) FROM pg_class")
        for _ in range(30):  # claimed and done ten at a time, a fold after each
            await queue.complete_many(await queue.claim("t", 10))
            await run(aconn, queue, "SELECT {s}.fair_fold('t', now())")
        await queue.complete_many(await queue.claim("t", 10))
        # The last fold reads from the bound the one before set (the 301st job): the 10
        # jobs claimed since and the first one left, 11 entries. Reading from the start
        # of the group, as it did, it passed all 310 jobs claimed (three scans, 951).
        assert await fold_counting(database_url, queue, reads, *names) == (1, 11)
        await pin.execute("ROLLBACK")
    left = await run(aconn, queue, "SELECT min(id), count(*) FROM {s}.jobs"
                     " WHERE status = 'pending'")
    assert left[0][1] == 10
    rows = await run(aconn, queue, "SELECT head_id, ready_lb::text, head_until::text"
                     " FROM {s}.fair_groups WHERE group_id = 'g'")
    # The bound is the first job left; ready_lb '-infinity' (a job is due now).
    assert rows == [(left[0][0], "-infinity", "infinity")]
    assert [j.id for j in await queue.claim("t", 1)] == [left[0][0]]


async def test_a_job_deferred_before_the_bound_is_read_once_the_bound_runs_out(
        queue: Queue, aconn: Any) -> None:
    await queue.upsert_group("g", plan=None)
    # g's first job is deferred an hour, its second is due now: the fold's bound is the
    # second job until the first comes due (head_until), then reads from the start.
    now = (await run(aconn, queue, "SELECT now()"))[0][0]
    first = await queue.enqueue("t", {"n": 1}, group_id="g",
                                run_after=now + timedelta(hours=1))
    second = await queue.enqueue("t", {"n": 2}, group_id="g")
    assert first is not None and second is not None
    await queue.upkeep.run_once()
    rows = await run(aconn, queue, "SELECT head_id, head_until = %s FROM {s}.fair_groups"
                     " WHERE group_id = 'g'", first.run_after)
    assert rows == [(second.id, True)]
    queue.clock_offset = timedelta(hours=1, seconds=1)
    await run(aconn, queue, "SELECT {s}.fair_fold('t', now() + interval '3601 s')")
    rows = await run(aconn, queue, "SELECT head_id, head_until::text FROM {s}.fair_groups"
                     " WHERE group_id = 'g'")
    assert rows == [(first.id, "infinity")]
    assert [j.id for j in await queue.claim("t", 2)] == [first.id, second.id]


async def test_a_fold_making_a_missing_row_never_deadlocks_with_a_writer(
        queue: Queue, aconn: Any, database_url: str) -> None:
    """The fold makes the rows of groups with deltas and no row before it locks any row:
    making one waits for a writer's uncommitted insert of the same row, and that writer
    may go on to wait for a row the fold would hold (found by a colleague's review: with
    the rows made after the locks, one of the two was aborted as a deadlock)."""
    for g in ("a", "b"):
        await queue.upsert_group(g, plan=None)
    await queue.enqueue("t", {}, group_id="a")
    await run(aconn, queue, "SELECT {s}.fair_fold('t', now())")
    await queue.claim("t", 1)  # a has a row and a delta
    # b has a delta and no row: a running job written straight into jobs.
    await run(aconn, queue, "INSERT INTO {s}.jobs (type, group_id, payload, status,"
              " max_attempts, run_after, created_at, locked_at, attempts)"
              " VALUES ('t', 'b', '{{}}', 'running', 3, now(), now(), now(), 1)")
    assert await run(aconn, queue, "SELECT group_id FROM {s}.fair_groups"
                     " ORDER BY group_id") == [("a",)]
    async with await psycopg.AsyncConnection.connect(database_url) as writer, \
            await psycopg.AsyncConnection.connect(database_url, autocommit=True) as folder:
        await run(writer, queue, "SET statement_timeout = '10s'")
        await run(writer, queue, "SELECT {s}.enqueue('t', '{{}}', group_id => 'b')")
        fold = asyncio.ensure_future(run(folder, queue, "SELECT {s}.fair_fold('t', now())"))
        await asyncio.sleep(0.5)  # the fold waits for the writer's row of b
        assert not fold.done()
        await run(writer, queue, "SELECT {s}.enqueue('t', '{{}}', group_id => 'a')")
        await writer.commit()
        assert await asyncio.wait_for(fold, 10) == [(2,)]
    assert await queue.verify() == []


async def test_the_fold_keeps_generic_plans_whose_shape_no_argument_changes(
        queue: Queue, database_url: str) -> None:
    """fair_fold runs with settings that make each statement's plan the same for any
    argument (no seq scan, no sort, no JIT), and keeps its generic plans: custom plans
    were made again at every fold, a quarter of its time (bench/RESULTS.md, section
    32). The settings are the function's own, restored after each call."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as c:
        [(config,)] = await run(
            c, queue, "SELECT p.proconfig FROM pg_proc p WHERE p.oid = "
            "to_regprocedure(%s)", f"{queue.schema}.fair_fold(text, timestamptz)")
        assert config == ["enable_seqscan=off", "enable_sort=off", "jit=off",
                          "plan_cache_mode=force_generic_plan"]
        await run(c, queue, "SELECT {s}.fair_fold('t', now())")
        [(mode,)] = await run(c, queue, "SELECT current_setting('plan_cache_mode')")
        assert mode == "auto"


def fold_group_scans(plans: list[dict[str, Any]]) -> list[float]:
    """The planner's row estimates of the fold's scan of its groups' arrays (the
    ``unnest(gs, heads, …) AS g`` of the statement that moves the deltas), in the order
    the plans came."""
    found: list[float] = []

    def walk(node: dict[str, Any]) -> None:
        if node.get("Node Type") == "Function Scan" and node.get("Alias") == "g":
            found.append(node["Plan Rows"])
        for child in node.get("Plans", []):
            walk(child)

    for plan in plans:
        walk(plan["Plan"])
    return found


async def test_a_fold_of_many_groups_plans_for_their_number(
        queue: Queue, aconn: Any, database_url: str) -> None:
    """A generic plan takes an array for 10 rows: a fold of a bulk load of 10,000 groups
    joined its moved deltas to its groups in a nested loop, 20 s where a custom plan
    took 0.8 s (bench/RESULTS.md, section 33). Past 200 groups the fold plans for its
    arrays; below, it keeps its generic plans."""
    from .test_trigger_plans import explaining

    await run(aconn, queue, "INSERT INTO {s}.groups (group_id)"
              " SELECT 'g' || lpad(i::text, 3, '0') FROM generate_series(0, 299) i")
    await queue.enqueue_many([{"type": "t", "payload": {}, "group_id": f"g{i:03}"}
                              for i in range(300) for _ in range(2)])
    await run(aconn, queue, "SELECT {s}.fair_fold('t', now())")
    estimates = []
    for claim in (5, 295):  # 5 groups' deltas, then the other 295's
        assert len({j.group_id for j in await queue.claim("t", claim)}) == claim
        async with await psycopg.AsyncConnection.connect(database_url,
                                                         autocommit=True) as c:
            plans = await explaining(c)
            await run(c, queue, "SELECT {s}.fair_fold('t', now())")
            # The switch is the call's own: the session's setting is as it was.
            [(mode,)] = await run(c, queue, "SELECT current_setting('plan_cache_mode')")
            estimates.append((fold_group_scans(plans), mode))
    assert estimates == [([10.0], "auto"), ([295.0], "auto")]
