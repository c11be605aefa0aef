"""The jobs UPDATE trigger reads each transition table once, whatever sizes came
before (docs/design.md, "The fair claim"): its statements have no parameters, so a
session plans them once, for the rows of its first call, and a join of old_rows to
new_rows planned for one row (a nested loop) compared every pair of a later
500-row claim. Plans are read with auto_explain (notices on this connection only)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from rota import Queue


def tuplestore_loops(node: dict[str, Any]) -> list[int]:
    """Actual loops of every transition-table scan in a plan."""
    found = [node["Actual Loops"]] if node["Node Type"] == "Named Tuplestore Scan" else []
    for child in node.get("Plans", []):
        found += tuplestore_loops(child)
    return found


async def explaining(conn: psycopg.AsyncConnection[Any]) -> list[dict[str, Any]]:
    """Turn auto_explain on for ``conn`` (every statement, nested ones too, analyzed, as
    JSON notices on this connection only); returns the list each plan is appended to
    from then on. Skips the test on a server without auto_explain (the embedded one;
    CI's has it)."""
    plans: list[dict[str, Any]] = []

    def keep(diag: psycopg.errors.Diagnostic) -> None:
        text = diag.message_primary or ""
        if text.startswith("duration:") and "plan:" in text:
            plans.append(json.loads(text.split("plan:", 1)[1]))

    try:
        await conn.execute("LOAD 'auto_explain'")
    except psycopg.errors.UndefinedFile:
        pytest.skip("this server has no auto_explain (the embedded one; CI's has)")
    for setting in ("SET auto_explain.log_min_duration = 0",
                    "SET auto_explain.log_analyze = on",
                    "SET auto_explain.log_nested_statements = on",
                    "SET auto_explain.log_format = json",
                    "SET auto_explain.log_level = notice"):
        await conn.execute(setting)
    conn.add_notice_handler(keep)
    return plans


async def test_a_large_claim_after_small_ones_reads_each_transition_table_once(
        queue: Queue, database_url: str) -> None:
    await queue.upsert_group("g", plan="free")
    await queue.enqueue_many([{"type": "t", "payload": {}, "group_id": "g"}
                              for _ in range(600)])
    conn = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
    try:
        plans = await explaining(conn)
        for _ in range(3):  # the session's first calls: one row each
            [job] = await queue.claim("t", 1, conn=conn)
            await queue.complete_many([job], conn=conn)
        plans.clear()
        jobs = await queue.claim("t", 500, conn=conn)
        assert len(jobs) == 500
        await queue.release(jobs, conn=conn)
    finally:
        await conn.close()
    trigger = [p for p in plans if "fair_served" in p.get("Query Text", "")
               or "old_rows" in p.get("Query Text", "")]
    assert trigger, "no plan of the trigger's statements was seen"
    loops = [n for p in trigger for n in tuplestore_loops(p["Plan"])]
    # Each scan read its table once, or was never reached (0: a branch cut short);
    # the join read new_rows once per old row (500).
    assert loops and max(loops) == 1


def tuplestore_scans(node: dict[str, Any]) -> int:
    """How many scans of a transition table a plan holds (each its own pass)."""
    own = 1 if node["Node Type"] == "Named Tuplestore Scan" else 0
    return own + sum(tuplestore_scans(child) for child in node.get("Plans", []))


async def test_a_batch_enqueue_into_bounded_groups_reads_the_inserted_jobs_once(
        queue: Queue, database_url: str) -> None:
    """The insert trigger's usual case (every job pending and due, into groups whose rows
    bound them) is one statement that groups the inserted jobs once: it used to count
    the distinct groups in a second pass and test for non-pending jobs in a third
    (bench/RESULTS.md, section 32). It locks each group's row (FOR KEY SHARE: xmax set)
    and changes none (xmin as it was)."""
    groups = [f"g{i}" for i in range(10)]
    for g in groups:
        await queue.upsert_group(g, plan="free")
    await queue.enqueue_many([{"type": "t", "payload": {}, "group_id": g} for g in groups])
    conn = await psycopg.AsyncConnection.connect(database_url, autocommit=True)

    fair_groups = sql.SQL("SELECT count(*), sum(xmin::text::bigint) FROM {}.fair_groups"
                          ).format(sql.Identifier(queue.schema))
    lockers = sql.SQL("SELECT count(*) FILTER (WHERE xmax::text <> '0') FROM {}.fair_groups"
                      ).format(sql.Identifier(queue.schema))
    try:
        plans = await explaining(conn)
        before = await (await conn.execute(fair_groups)).fetchone()
        created = await queue.enqueue_many(
            [{"type": "t", "payload": {"i": i}, "group_id": groups[i % 10]}
             for i in range(200)], conn=conn)
        after = await (await conn.execute(fair_groups)).fetchone()
        locked = await (await conn.execute(lockers)).fetchone()
    finally:
        await conn.close()
    assert created == 200
    trigger = [p for p in plans if "FROM inserted" in p.get("Query Text", "")
               and "fair_groups" in p.get("Query Text", "")]
    assert len(trigger) == 1, [p.get("Query Text") for p in plans]
    assert tuplestore_scans(trigger[0]["Plan"]) == 1
    # The trigger returned early: no other statement of the bookkeeping ran, and every
    # group's row is as it was (locked FOR KEY SHARE, which leaves xmin as it is).
    assert not [p for p in plans if "fair_note_pending" in p.get("Query Text", "")]
    assert after == before and before is not None and before[0] == 10
    assert locked == (10,)


async def test_an_insert_with_a_running_job_locks_no_group_row_before_the_steps(
        queue: Queue, database_url: str) -> None:
    """The insert trigger's usual statement takes no lock when a job with a group is
    inserted running or done (the steps take what that needs, edges first: the lock
    order of docs/fast-claim.md, "Writers"): its LockRows returns no row, and the
    steps keep the bookkeeping exact (verify finds nothing)."""
    await queue.upsert_group("g", plan="free")
    await queue.enqueue("t", {}, group_id="g")
    conn = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
    try:
        plans = await explaining(conn)
        await conn.execute(sql.SQL(
            "INSERT INTO {s}.jobs (type, group_id, payload, status, attempts,"
            " max_attempts, run_after, created_at, locked_at, claim_token)"
            " VALUES ('t', 'g', '{{}}', 'pending', 0, 3, now(), now(), NULL, NULL),"
            " ('t', 'g', '{{}}', 'running', 1, 3, now(), now(), now(),"
            "  gen_random_uuid())").format(
                s=sql.Identifier(queue.schema)))
    finally:
        await conn.close()
    [first] = [p for p in plans if "FROM inserted" in p.get("Query Text", "")
               and "FOR KEY SHARE OF fg" in p.get("Query Text", "")]

    def lock_rows(node: dict[str, Any]) -> list[int]:
        own = [node["Actual Rows"]] if node["Node Type"] == "LockRows" else []
        return own + [n for c in node.get("Plans", []) for n in lock_rows(c)]

    assert lock_rows(first["Plan"]) == [0]
    assert await queue.verify() == []  # the running job counted, the new one bounded


async def test_still_claimable_reads_the_row_as_last_committed(
        queue: Queue, aconn: psycopg.AsyncConnection[Any]) -> None:
    """The claim's lock step asks it before locking a candidate: pending and due, or
    running with a stale lock and attempts left, as committed now."""
    jobs = [await queue.enqueue("t", {"i": i}) for i in range(3)]
    ids = [j.id for j in jobs if j is not None]
    [claimed] = await queue.claim("t", 1)
    ask = sql.SQL("SELECT {}.fair_still_claimable(%s, now(), now() - %s)").format(
        sql.Identifier(queue.schema))

    async def claimable(job_id: int, stale_after: timedelta) -> bool:
        cur = await aconn.execute(ask, [job_id, stale_after])
        row = await cur.fetchone()
        assert row is not None
        return bool(row[0])

    other = next(i for i in ids if i != claimed.id)
    assert await claimable(other, timedelta(minutes=15)) is True      # pending, due
    assert await claimable(claimed.id, timedelta(minutes=15)) is False  # running, fresh
    assert await claimable(claimed.id, timedelta(0)) is True          # its lock is stale
    assert await claimable(10**12, timedelta(0)) is False             # no such job
