"""The fast claim (docs/fast-claim.md): exact against the oracle however small its probe
starts, bookkeeping equal to a recount from `jobs` after concurrent churn and crashes, and
a scaled-down backlog with deferred, paused and stale jobs that the claim never reads."""

from __future__ import annotations

import asyncio
import random
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from rota import Queue
from rota.fair import FairClaim, UpkeepConfig

from . import test_oracle
from .helpers import fair_violations
from .oracle import oracle_ids
from .test_oracle import _check, oracle_examples

# After every test: the fair claim's bookkeeping keeps its contract (verify.sql).
pytestmark = pytest.mark.usefixtures("fair_exact")

async def recount(conn: Any, schema: str) -> list[str]:
    """Every way the bookkeeping disagrees with the jobs it summarizes, as the contract
    (src/rota/fair/verify.sql, `rota verify`) names them; empty when exact."""
    return [str(v) for v in await fair_violations(conn, schema)]


async def claim_equals_oracle(queue: Queue, url: str, type_: str, limit: int) -> None:
    """In a transaction rolled back afterwards: the claim takes the oracle's jobs."""
    async with await psycopg.AsyncConnection.connect(url) as conn:
        expected = await oracle_ids(queue, conn, type_, limit)
        got = [j.id for j in await queue.claim(type_, limit, conn=conn)]
        violations = await fair_violations(conn, queue.schema)
        await conn.rollback()
    assert [str(v) for v in violations] == []
    assert got == expected



@oracle_examples(120)
def test_claim_is_exact_when_every_probe_starts_at_one_group_and_one_job(
    database_url: str, migrated: str, groups: list[tuple[Any, bool]],
    jobs: list[dict[str, Any]], limit: int, offset_s: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every bound check that can fail does, so each retry path is compared with the oracle.
    monkeypatch.setattr(FairClaim, "probe_floor", (1, 1))
    asyncio.run(_check(database_url, migrated, groups, jobs, limit, offset_s))


@oracle_examples(60, offsets=(0, 90_000))
def test_claim_reading_an_application_view_is_exact(
    database_url: str, migrated: str, groups: list[tuple[Any, bool]],
    jobs: list[dict[str, Any]], limit: int, offset_s: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def with_view() -> None:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as c:
            await c.execute(sql.SQL(
                "CREATE OR REPLACE VIEW {s}.app_groups AS SELECT * FROM {s}.groups"
            ).format(s=sql.Identifier(migrated)))

    asyncio.run(with_view())

    class ViewQueue(Queue):
        def __init__(self, url: Any, **kw: Any) -> None:
            super().__init__(url, groups=f"{kw['schema']}.app_groups", **kw)

    monkeypatch.setattr(test_oracle, "Queue", ViewQueue)
    monkeypatch.setattr(FairClaim, "probe_floor", (1, 1))
    asyncio.run(_check(database_url, migrated, groups, jobs, limit, offset_s))


@pytest.mark.parametrize("fair_by", ["group", "owner"])
async def test_concurrent_churn_and_crashes_leave_bookkeeping_equal_to_a_recount(
    make_queue: Any, database_url: str, aconn: Any, schema: str, fair_by: str
) -> None:
    queue: Queue = await make_queue(stale_after=timedelta(minutes=15), fair_by=fair_by)
    # Owners of several groups (A: big, g0, g3; B: g1, g4), and g2, g5 without one.
    owners = ["A", "B", None]
    for g in range(6):
        await queue.upsert_group(f"g{g}", plan=["free", "standard", "pro"][g % 3],
                                 owner_id=owners[g % 3])
    rnd = random.Random(7)

    async def producer(n: int) -> None:
        for i in range(n):
            if i % 5 == 0:
                await queue.enqueue_many(
                    [{"type": "t", "payload": {"i": i, "k": k},
                      "group_id": rnd.choice(["big", "big", "g1", None])} for k in range(7)])
            else:
                await queue.enqueue("t", {"i": i}, group_id=rnd.choice(
                    ["big", "big", "big", "g0", "g2", "g3", "g4", "g5", None]))

    async def worker(w: int) -> None:
        q: Queue = await make_queue(fair_by=fair_by)
        for _ in range(40):
            batch = await q.claim("t", rnd.randint(1, 6))
            for j in batch:
                r = rnd.random()
                if r < 0.6:  # charging a cost (docs/design.md, "Cost")
                    await q.complete(j, cost=rnd.choice([1, 1, 0.5, 2.25, 100]))
                elif r < 0.75:
                    await q.fail(j, "boom")
                elif r < 0.9:
                    await q.defer(j, await q.now() + timedelta(seconds=rnd.randint(0, 3)))
                # else: left running, as a crashed worker leaves it
            await asyncio.sleep(0)

    async def crasher() -> None:
        # A claim and a completion inside transactions whose backends are killed.
        for _ in range(3):
            c = await psycopg.AsyncConnection.connect(database_url)
            claimed = await queue.claim("t", 3, conn=c)
            for j in claimed[:1]:
                await queue.complete(j, conn=c)
            await queue.enqueue("t", {"doomed": True}, group_id="big", conn=c)
            await aconn.execute("SELECT pg_terminate_backend(%s)", [c.info.backend_pid])
            with pytest.raises(psycopg.OperationalError):
                await c.execute("SELECT 1")
            await c.close()
            await asyncio.sleep(0.01)

    async def operator() -> None:
        for k in range(10):
            await queue.upsert_group("big", plan=["pro", "free"][k % 2], active=k % 3 != 1,
                                     owner_id=["A", "B"][k % 2])
            await asyncio.sleep(0.01)
        await queue.upsert_group("big", plan="pro", active=True, owner_id="A")

    await queue.upsert_group("big", plan="pro", owner_id="A")
    await producer(30)
    await asyncio.gather(producer(120), producer(120), operator(), crasher(),
                         *(worker(w) for w in range(8)), return_exceptions=False)
    queue.clock_offset = timedelta(minutes=20)  # the left-running jobs go stale
    await queue.fail_stuck_jobs()
    await asyncio.gather(*(worker(w) for w in range(4)))
    await queue.run_upkeep()
    assert await recount(aconn, schema) == []
    # The edge moves, deltas fold, groups empty out: still exact, still the oracle's order.
    await aconn.execute(sql.SQL("SELECT {s}.fair_advance('t', now()), {s}.fair_fold('t', now())")
                        .format(s=sql.Identifier(schema)))
    assert await recount(aconn, schema) == []
    for limit in (1, 5, 25):
        await claim_equals_oracle(queue, database_url, "t", limit)
    queue.clock_offset = timedelta(days=2)  # everything served has left the window
    await claim_equals_oracle(queue, database_url, "t", 10)


async def test_plan_change_and_pause_reach_the_walk_without_touching_jobs(
    queue: Queue, aconn: Any, schema: str
) -> None:
    await queue.upsert_group("a", plan="free")
    await queue.upsert_group("b", plan="free")
    a = [await queue.enqueue("t", {"n": i}, group_id="a") for i in range(3)]
    b = [await queue.enqueue("t", {"n": i}, group_id="b") for i in range(3)]
    cur = await aconn.execute(sql.SQL("SELECT max(xmin::text::bigint) FROM {}.jobs")
                              .format(sql.Identifier(schema)))
    before = (await cur.fetchone())[0]
    await queue.upsert_group("b", plan="pro")
    await queue.upsert_group("a", plan="free", active=False)
    cur = await aconn.execute(sql.SQL("SELECT max(xmin::text::bigint) FROM {}.jobs")
                              .format(sql.Identifier(schema)))
    assert (await cur.fetchone())[0] == before  # no job row was rewritten
    assert [j.id for j in await queue.claim("t", 10)] == [j.id for j in b if j]
    await queue.upsert_group("a", plan="free", active=True)
    assert [j.id for j in await queue.claim("t", 10)] == [j.id for j in a if j]
    assert await recount(aconn, schema) == []


async def test_scaled_down_backlog_with_deferred_paused_and_stale_jobs(
    queue: Queue, aconn: Any, database_url: str, schema: str,
) -> None:
    """20,000 ready jobs over 400 groups with 4,000 done in the window, plus 5,000 jobs
    deferred a month, a paused group's 5,000 jobs and 300 stale running jobs: the claim
    matches the oracle and never needs to probe more than its starting number of groups
    (so its cost does not depend on any of those). The walk is cut to 59 of a plan's
    133 folded groups, whose served counts differ."""
    s = sql.Identifier(schema)
    await aconn.execute(sql.SQL(
        "INSERT INTO {s}.groups (group_id, plan) "
        "SELECT 'g' || i, (ARRAY['free','standard','pro'])[1 + i % 3] "
        "FROM generate_series(0, 399) i;"
        "INSERT INTO {s}.groups (group_id, plan, active) VALUES ('paused', 'pro', false);"
        "INSERT INTO {s}.jobs (type, group_id, payload, max_attempts, run_after, created_at)"
        " SELECT 't', 'g' || (i % 400), '{{}}', 3, now() - interval '1 hour',"
        " now() - interval '1 hour' + i * interval '1 ms' FROM generate_series(1, 20000) i;"
        "INSERT INTO {s}.jobs (type, group_id, payload, status, attempts, max_attempts,"
        " run_after, created_at, finished_at)"
        " SELECT 't', 'g' || ((i * 7919) % 400), '{{}}', 'done', 1, 3, now() - interval '1 day',"
        " now() - interval '1 day', now() - (i % 80000) * interval '1 second'"
        " FROM generate_series(1, 4000) i;"
        "INSERT INTO {s}.jobs (type, group_id, payload, max_attempts, run_after, created_at)"
        " SELECT 't', 'g' || (i % 400), '{{}}', 3, now() + interval '30 days',"
        " now() - interval '2 hours' FROM generate_series(1, 5000) i;"
        "INSERT INTO {s}.jobs (type, group_id, payload, max_attempts, run_after, created_at)"
        " SELECT 't', 'paused', '{{}}', 3, now() - interval '2 hours', now() - interval '3 hours'"
        " FROM generate_series(1, 5000) i;"
        "INSERT INTO {s}.jobs (type, group_id, payload, status, attempts, max_attempts,"
        " run_after, created_at, locked_at, claim_token)"
        " SELECT 't', 'g' || (i % 400), '{{}}', 'running', 3, 3, now() - interval '3 hours',"
        " now() - interval '3 hours', now() - interval '2 hours', gen_random_uuid()"
        " FROM generate_series(1, 300) i;"
    ).format(s=s))
    await aconn.execute(sql.SQL(
        # The edge row, as a type's first completion makes it (these jobs were loaded as
        # done), then the edge moved.
        "INSERT INTO {s}.fair_edge (type, edge) VALUES ('t', '-infinity')"
        " ON CONFLICT DO NOTHING;"
        "SELECT {s}.fair_advance('t', now() - interval '1 day'), {s}.fair_fold('t', now());"
        " ANALYZE {s}.jobs; ANALYZE {s}.fair_groups").format(s=s))
    assert await recount(aconn, schema) == []
    for _ in range(8):
        await claim_equals_oracle(queue, database_url, "t", 25)
        batch = await queue.claim("t", 25)
        assert len(batch) == 25
        for j in batch:
            assert await queue.complete(j)
        await queue.run_upkeep()
    # no claim needed a wider probe
    assert queue.fair_claim._probe["t", "group"] == queue.fair_claim._floor(25)
    assert await recount(aconn, schema) == []


async def test_claim_on_the_callers_connection_commits_only_with_the_caller(
    queue: Queue, database_url: str
) -> None:
    job = await queue.enqueue("t", {})
    assert job
    async with await psycopg.AsyncConnection.connect(database_url) as c:  # not autocommit
        [got] = await queue.claim("t", 1, conn=c)
        assert got.id == job.id
        await c.rollback()
    again = await queue.get_job(job.id)
    assert again is not None and again.status == "pending" and again.attempts == 0


# The tables the upkeep's VACUUM keeps small (src/rota/fair/vacuum.sql).
BOOKKEEPING = ("fair_groups", "fair_served", "fair_fold_mark", "fair_owners",
               "fair_owner_changes")


async def _vacuum_count(aconn: Any, schema: str, table: str = "fair_groups") -> int:
    await aconn.execute("SELECT pg_stat_clear_snapshot()")
    cur = await aconn.execute(
        "SELECT pg_stat_get_vacuum_count(c.oid) FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = %s", (schema, table))
    row = await cur.fetchone()
    return int(row[0])


async def _claim_complete_settle(queue: Queue) -> None:
    await queue.upsert_group("a", plan="free")
    await queue.enqueue_many([{"type": "t", "payload": {}, "group_id": "a"}] * 5)
    jobs = await queue.claim("t", 5)
    assert len(jobs) == 5
    assert await queue.complete_many(jobs) == [True] * 5
    await queue.claim("t", 5)  # a second round of upkeep after the completions
    await queue.run_upkeep()


async def test_upkeep_vacuums_the_bookkeeping_tables(
    queue: Queue, aconn: Any, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every table a fold rewrites is vacuumed by the upkeep, the owners' rows and
    their change records included (their dead entries slow the owner walk)."""
    queue.upkeep.config = UpkeepConfig(vacuum_every=1e-6)
    assert [await _vacuum_count(aconn, schema, t) for t in BOOKKEEPING] == [0] * 5
    await _claim_complete_settle(queue)
    for _ in range(50):  # the statistics reach other sessions shortly after
        if min([await _vacuum_count(aconn, schema, t) for t in BOOKKEEPING]) > 0:
            break
        await asyncio.sleep(0.1)
    assert [min(1, await _vacuum_count(aconn, schema, t)) for t in BOOKKEEPING] == [1] * 5
    assert queue.upkeep._vacuum_refused is False
    assert await recount(aconn, schema) == []


async def test_a_long_vacuum_does_not_hold_the_folds_back(queue: Queue, aconn: Any,
                                                          schema: str) -> None:
    """The upkeep's VACUUM runs beside its rounds: vacuuming what a long pin kept can
    take longer than claims can go without a fold (bench/RESULTS.md, section 25)."""
    queue.upkeep.config = UpkeepConfig(vacuum_every=1e-6)
    started, release = asyncio.Event(), asyncio.Event()
    vacuums = []

    async def slow_vacuum() -> int:  # a VACUUM that takes as long as the test says
        vacuums.append(1)
        started.set()
        await release.wait()
        return 1

    queue.upkeep._vacuum = slow_vacuum  # type: ignore[method-assign]
    await queue.upsert_group("a", plan="free")
    await queue.enqueue_many([{"type": "t", "payload": {}, "group_id": "a"}] * 6)
    await queue.complete_many(await queue.claim("t", 2))
    await asyncio.wait_for(started.wait(), 5)
    await queue.complete_many(await queue.claim("t", 2))  # while the VACUUM runs
    # The rounds still run: the deltas of both claims and their completions are folded.
    queue.upkeep.request("t")

    async def unfolded() -> int:
        cur = await aconn.execute(sql.SQL("SELECT count(*) FROM {}.fair_served")
                                  .format(sql.Identifier(schema)))
        row = await cur.fetchone()
        return int(row[0])

    for _ in range(50):
        if await unfolded() == 0:
            break
        await asyncio.sleep(0.1)
    assert await unfolded() == 0
    assert vacuums == [1]  # one VACUUM at a time
    release.set()
    await queue.run_upkeep()  # waits for the VACUUM too
    assert await recount(aconn, schema) == []


async def test_a_role_that_does_not_own_the_bookkeeping_never_tries_to_vacuum_it(
    make_queue: Any, aconn: Any, database_url: str, schema: str,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    await make_queue()  # migrated by the owner
    role = f"r_{schema}"
    s, r = sql.Identifier(schema), sql.Identifier(role)
    await aconn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(r))
    try:
        await aconn.execute(sql.SQL(
            "GRANT USAGE ON SCHEMA {s} TO {r}; GRANT ALL ON ALL TABLES IN SCHEMA {s} TO {r};"
            " GRANT ALL ON ALL SEQUENCES IN SCHEMA {s} TO {r};"
            " GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {s} TO {r}").format(s=s, r=r))
        caplog.set_level("INFO", logger="rota.claim")
        queue = Queue(psycopg.conninfo.make_conninfo(database_url, user=role), schema=schema)
        queue.upkeep.config = UpkeepConfig(vacuum_every=1e-6)
        async with queue:
            await _claim_complete_settle(queue)
            assert queue.upkeep._vacuum_refused is True
        assert [m for m in caplog.messages if "not allowed to VACUUM" in m] == [
            f"not allowed to VACUUM {schema}'s bookkeeping tables (not their owner); "
            "autovacuum does it"]
        await asyncio.sleep(0.5)
        assert await _vacuum_count(aconn, schema) == 0
    finally:
        await aconn.execute(sql.SQL("DROP OWNED BY {}").format(r))
        await aconn.execute(sql.SQL("DROP ROLE {}").format(r))


async def test_a_queue_never_opened_keeps_its_upkeep_until_it_opens(
    database_url: str, migrated: str, aconn: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Every call on the caller's connection, the queue's own pool never opened: the
    claim's upkeep stays due instead of running on the closed pool (it logged
    PoolClosed tracebacks), and runs once the queue opens."""
    queue = Queue(database_url, schema=migrated)
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        await queue.upsert_group("g", plan="pro", conn=conn)
        await queue.enqueue("t", {}, group_id="g", conn=conn)
        assert len(await queue.claim("t", 1, conn=conn)) == 1
        await conn.commit()
    assert queue.upkeep._task is None
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    async with queue:
        await queue.run_upkeep()  # the round kept due runs on the opened pool
        cur = await aconn.execute(sql.SQL("SELECT count(*) FROM {}.fair_served")
                                  .format(sql.Identifier(migrated)))
        assert await cur.fetchone() == (0,)  # folded


async def test_a_claim_sent_further_by_a_concurrent_claimers_locks_leaves_the_probe_as_it_was(
    queue: Queue, database_url: str
) -> None:
    """A worker holds the first 100 jobs of the fair order (its claim not committed yet);
    a claim of 25 beside it finds its candidates held, reads further ("held" retries)
    and takes the next 25 in order. The wider probe was for that claim only: the next
    claim starts from the smallest probe again, and a claim of 100 did not size the claim
    of 25 either (two claimers at once probed every group once they did:
    bench/RESULTS.md, section 17)."""
    for g in range(120):
        await queue.upsert_group(f"g{g:03d}", plan="free")
    await queue.enqueue_many([{"type": "t", "payload": {}, "group_id": f"g{g:03d}"}
                              for _ in range(3) for g in range(120)])
    fair = queue.fair_claim
    async with await psycopg.AsyncConnection.connect(database_url) as worker:
        held = await queue.claim("t", 100, conn=worker)
        assert len(held) == 100
        expected = await oracle_ids(queue, worker, "t", 25)  # the order after them
        got = await queue.claim("t", 25)
        assert [j.id for j in got] == expected
        assert not {j.id for j in got} & {j.id for j in held}
        assert fair.retries.get("t", 0) > 0  # it did read further
        assert fair._probe["t", "group"] == fair._floor(25)
        assert fair._start(("t", "group"), 25) == fair._floor(25)
        await worker.rollback()


def test_a_probe_that_sufficed_for_one_limit_is_scaled_to_another() -> None:
    """What a claim needed beyond its floor carries over in proportion to the limit."""
    fair = FairClaim.__new__(FairClaim)
    fair._probe, fair._probe_limit = {}, {}
    fair._probe_calm = {}
    fair._remember(("t", "group"), 100, fair._floor(100), retried=False)
    assert fair._start(("t", "group"), 25) == fair._floor(25)
    fair._remember(("t", "group"), 100, (416, 6, 2), retried=True)
    assert fair._start(("t", "group"), 100) == (416, 6, 2)
    assert fair._start(("t", "group"), 25) == (58 + 52, 2 + 1, 2)


@pytest.mark.parametrize("fair_by", ["group", "owner"])
async def test_a_group_the_order_takes_many_jobs_from_is_probed_that_deep_at_once(
    make_queue: Any, database_url: str, fair_by: str
) -> None:
    """One owner (and group) served 0 beside twenty served 30 each: the claim of 25 takes
    all 25 from it. Each probed group is read as deep as the order will take from it
    (docs/fast-claim.md, "The probe"), so the claim needs no retry and its probe stays at
    its floor; with one depth for every group, the floor of 2 jobs a group was cut and the
    claim read again (bench/RESULTS.md, sections 18 and 21)."""
    queue = await make_queue(fair_by=fair_by)
    for i in range(20):
        await queue.upsert_group(f"g{i:02d}", plan="free", owner_id=f"o{i:02d}")
    await queue.upsert_group("lo", plan="free", owner_id="lo")
    await queue.enqueue_many([{"type": "t", "payload": {}, "group_id": f"g{i:02d}"}
                              for i in range(20) for _ in range(30)])
    served = await queue.claim("t", 600)
    assert len(served) == 600
    await queue.complete_many(served)  # cost 1 each: 30 served a group and owner
    await queue.enqueue_many([{"type": "t", "payload": {}, "group_id": f"g{i:02d}"}
                              for i in range(20) for _ in range(5)])
    await queue.enqueue_many([{"type": "t", "payload": {}, "group_id": "lo"}
                              for _ in range(30)])
    fair = queue.fair_claim
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cur = await conn.execute(sql.SQL("SELECT id FROM {}.jobs WHERE group_id = 'lo' "
                                         "ORDER BY id LIMIT 25")
                                 .format(sql.Identifier(queue.schema)))
        lo = [r[0] for r in await cur.fetchall()]
        expected = await oracle_ids(queue, conn, "t", 25)
        got = await queue.claim("t", 25, conn=conn)
        await conn.rollback()
    assert expected == lo
    assert [j.id for j in got] == expected
    assert fair.retries.get("t", 0) == 0
    assert fair._probe["t", fair_by] == fair._floor(25, fair_by)
