"""rota.admin on a real PostgreSQL: listing jobs with filters and keyset pages, retrying
and cancelling from every status, listing runs, queue depth, and missing migrations."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from rota import InvalidInput, Job, NaiveDatetimeError, Plan, Plans, Queue
from rota.admin import (
    MAX_LIST_LIMIT,
    DepthRow,
    RunRecord,
    cancel_job,
    depth,
    list_jobs,
    list_runs,
    missing_migrations,
    retry_job,
)
from rota.errors import InvalidTransition, JobNotFound
from tests.helpers import enqueue_jobs

PLANS = Plans([Plan("free", "Free", 0), Plan("team", "Team", 1), Plan("pro", "Pro", 2)])


async def sql(aconn: Any, queue: Queue, query: str, params: Any = None) -> list[Any]:
    cur = await aconn.execute(query.replace("{s}", f'"{queue.schema}"'), params)
    return await cur.fetchall() if cur.description else []


async def in_status(queue: Queue, status: str, job_type: str = "a",
                    dedupe_key: str | None = None) -> Job:
    """A job of ``job_type`` brought to ``status`` through the queue's own transitions."""
    job = await queue.enqueue(job_type, {}, max_attempts=1, dedupe_key=dedupe_key)
    assert job is not None
    if status == "pending":
        return job
    [claimed] = await queue.claim(job_type, 1)
    assert claimed.id == job.id
    if status == "done":
        assert await queue.complete(claimed)
    elif status == "failed":
        assert await queue.fail(claimed, "boom") == "failed"
    got = await queue.get_job(job.id)
    assert got is not None and got.status == status
    return got


# -- list_jobs ----------------------------------------------------------------------------


async def test_list_jobs_filters_by_status_type_group_and_id(
    make_queue: Any, aconn: Any,
) -> None:
    queue = await make_queue(plans=PLANS)
    await queue.upsert_group("g1", plan="pro")
    await queue.upsert_group("g2", plan=None)
    a1, a2 = await enqueue_jobs(queue, "a", 2)                      # 1, 2
    [b1] = await enqueue_jobs(queue, "b", 1, group_id="g1")         # 3
    [b2] = await enqueue_jobs(queue, "b", 1, group_id="g2")         # 4
    [a3] = await enqueue_jobs(queue, "a", 1, group_id="g1")         # 5
    [claimed] = await queue.claim("b", 1)                      # g1 (pro) goes first
    assert claimed.id == b1

    def ids(page: Any) -> list[int]:
        return [j.id for j in page.jobs]

    page = await list_jobs(queue)
    assert ids(page) == [a3, b2, b1, a2, a1] and page.next_before_id is None
    assert all(isinstance(j, Job) for j in page.jobs)
    assert page.jobs[-1].payload == {"i": 0} and page.jobs[-1].type == "a"
    assert page.group_plans == {"g1": "pro", "g2": None}
    assert ids(await list_jobs(queue, status="running")) == [b1]
    assert ids(await list_jobs(queue, status="pending")) == [a3, b2, a2, a1]
    assert ids(await list_jobs(queue, status="done")) == []
    assert ids(await list_jobs(queue, type="a")) == [a3, a2, a1]
    assert ids(await list_jobs(queue, group_id="g1")) == [a3, b1]
    assert ids(await list_jobs(queue, type="b", status="pending")) == [b2]
    assert ids(await list_jobs(queue, job_id=b2)) == [b2]
    assert ids(await list_jobs(queue, job_id=b2, type="a")) == []
    assert ids(await list_jobs(queue, job_id=999)) == []
    assert ids(await list_jobs(queue, before_id=b1)) == [a2, a1]
    assert ids(await list_jobs(queue, type="unknown")) == []
    # A group the groups relation does not hold has no plan either.
    await sql(aconn, queue, "DELETE FROM {s}.groups WHERE group_id = 'g2'")
    assert (await list_jobs(queue, group_id="g2")).group_plans == {"g2": None}


async def test_list_jobs_pages_cover_every_job_once_in_order(queue: Queue) -> None:
    all_ids = await enqueue_jobs(queue, "a", 23)
    await enqueue_jobs(queue, "b", 4)  # filtered out below
    pages, before = [], None
    while True:
        page = await list_jobs(queue, type="a", limit=5, before_id=before)
        pages.append([j.id for j in page.jobs])
        if page.next_before_id is None:
            break
        assert page.next_before_id == page.jobs[-1].id
        before = page.next_before_id
    assert [len(p) for p in pages] == [5, 5, 5, 5, 3]
    assert [i for p in pages for i in p] == sorted(all_ids, reverse=True)


async def test_a_full_last_page_says_there_is_no_next_page(queue: Queue) -> None:
    await enqueue_jobs(queue, "a", 10)
    first = await list_jobs(queue, limit=5)
    assert [j.id for j in first.jobs] == [10, 9, 8, 7, 6] and first.next_before_id == 6
    last = await list_jobs(queue, limit=5, before_id=first.next_before_id)
    assert [j.id for j in last.jobs] == [5, 4, 3, 2, 1] and last.next_before_id is None
    assert (await list_jobs(queue, limit=10)).next_before_id is None


async def test_jobs_enqueued_between_pages_neither_repeat_nor_shift_later_pages(
    queue: Queue,
) -> None:
    await enqueue_jobs(queue, "a", 6)
    first = await list_jobs(queue, limit=3)
    await enqueue_jobs(queue, "a", 5)  # ids 7-11: newer than every page already started
    second = await list_jobs(queue, limit=3, before_id=first.next_before_id)
    assert [j.id for j in first.jobs + second.jobs] == [6, 5, 4, 3, 2, 1]
    assert second.next_before_id is None


async def test_list_jobs_caps_its_limit_and_checks_its_filters(queue: Queue) -> None:
    await enqueue_jobs(queue, "a", 3)
    assert len((await list_jobs(queue, limit=MAX_LIST_LIMIT)).jobs) == 3
    assert MAX_LIST_LIMIT == 1000
    for bad in (0, -1, MAX_LIST_LIMIT + 1, 10**9, True, 2.0, "5", None):
        with pytest.raises(InvalidInput, match="limit must be"):
            await list_jobs(queue, limit=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="status must be one of pending, running, done, "
                                           "failed; got 'lost'"):
        await list_jobs(queue, status="lost")
    with pytest.raises(InvalidInput, match="type must be a non-empty string"):
        await list_jobs(queue, type="")
    with pytest.raises(InvalidInput, match="NUL"):
        await list_jobs(queue, group_id="a\x00b")
    for name in ("job_id", "before_id"):
        for bad_id in (0, -5, 2**63, True, "3"):
            with pytest.raises(InvalidInput, match=name):
                await list_jobs(queue, **{name: bad_id})


async def test_list_jobs_runs_in_the_callers_transaction(
    queue: Queue, database_url: str,
) -> None:
    async with await psycopg.AsyncConnection.connect(database_url) as c:
        job = await queue.enqueue("a", {}, conn=c)
        assert job is not None
        assert [j.id for j in (await list_jobs(queue, conn=c)).jobs] == [job.id]
        assert (await list_jobs(queue)).jobs == []  # not committed yet
        await c.rollback()


# -- retry_job ----------------------------------------------------------------------------


async def test_retry_puts_a_failed_job_back_to_pending_due_now(queue: Queue) -> None:
    async def hook(job: Job, conn: Any) -> None:
        pass

    queue.on_give_up("a", hook)
    failed = await in_status(queue, "failed")
    assert failed.give_up_pending is False  # its hook ran when it failed
    result = await retry_job(queue, failed.id)
    job = result.job
    assert (job.id, job.status, job.attempts, job.deferrals, job.finished_at,
            job.locked_at, job.claim_token, job.last_error, job.give_up_pending) == (
        failed.id, "pending", 0, 0, None, None, None, "boom", False)
    assert abs((job.run_after - await queue.now()).total_seconds()) < 5
    assert result.give_up_hook_cancelled is False
    assert await queue.get_job(failed.id) == job


async def test_retry_cancels_an_owed_give_up_hook(queue: Queue) -> None:
    failed = await in_status(queue, "failed")
    assert failed.give_up_pending is True  # no process has a hook for it yet
    result = await retry_job(queue, failed.id)
    assert result.give_up_hook_cancelled is True
    assert result.job.give_up_pending is False


async def test_retry_moves_due_now_on_the_queues_clock(queue: Queue) -> None:
    failed = await in_status(queue, "failed")
    queue.clock_offset = timedelta(days=3)
    job = (await retry_job(queue, failed.id)).job
    assert abs((job.run_after - await queue.now()).total_seconds()) < 5


@pytest.mark.parametrize(("action", "status", "rule"), [
    *(pytest.param(retry_job, status, "only a failed job can be retried",
                   id=f"retry-{status}") for status in ("pending", "running", "done")),
    *(pytest.param(cancel_job, status, "only a pending job can be cancelled",
                   id=f"cancel-{status}") for status in ("running", "done", "failed")),
])
async def test_retry_and_cancel_refuse_a_job_in_another_status(
    queue: Queue, action: Any, status: str, rule: str,
) -> None:
    """Retry takes only a failed job, cancel only a pending one; any other is untouched."""
    job = await in_status(queue, status)
    with pytest.raises(InvalidTransition) as caught:
        await action(queue, job.id)
    assert str(caught.value) == f"job {job.id} is {status}; {rule}"
    assert (caught.value.job_id, caught.value.status) == (job.id, status)
    assert await queue.get_job(job.id) == job  # untouched


async def test_retry_and_cancel_of_a_missing_job_raise_job_not_found(queue: Queue) -> None:
    for action in (retry_job, cancel_job):
        with pytest.raises(JobNotFound, match="^no job 42$") as caught:
            await action(queue, 42)
        assert caught.value.job_id == 42
        assert isinstance(caught.value, InvalidInput)
        for bad in (0, -1, True, "1", 2**63):
            with pytest.raises(InvalidInput, match="job_id must be"):
                await action(queue, bad)  # type: ignore[arg-type]


async def test_retry_refuses_while_another_open_job_holds_the_dedupe_key(
    queue: Queue, aconn: Any,
) -> None:
    failed = await in_status(queue, "failed", dedupe_key="k")
    dup = await queue.enqueue("a", {}, dedupe_key="k")
    assert dup is not None
    with pytest.raises(InvalidTransition) as caught:
        await retry_job(queue, failed.id)
    assert str(caught.value) == f"job {failed.id}: another open job holds dedupe key 'k'"
    assert caught.value.status == "failed"
    await sql(aconn, queue, "UPDATE {s}.jobs SET status = 'done' WHERE id = %s", [dup.id])
    assert (await retry_job(queue, failed.id)).job.status == "pending"


async def test_a_duplicate_committed_during_the_retry_is_refused_cleanly(
    queue: Queue, database_url: str,
) -> None:
    """The retry's guard cannot see a duplicate not committed yet; the unique index
    makes the retry wait for it and then refuse, and the retry says why."""
    failed = await in_status(queue, "failed", dedupe_key="k")
    async with await psycopg.AsyncConnection.connect(database_url) as other:
        assert await queue.enqueue("a", {}, dedupe_key="k", conn=other) is not None
        retry = asyncio.create_task(retry_job(queue, failed.id))
        await asyncio.sleep(0.5)  # the retry now waits on the open duplicate's index entry
        assert not retry.done()
        await other.commit()
        with pytest.raises(InvalidTransition, match="another open job holds dedupe key 'k'"):
            await retry
    assert (await queue.get_job(failed.id)) == failed


async def test_a_refused_retry_leaves_the_callers_transaction_usable(
    queue: Queue, database_url: str,
) -> None:
    failed = await in_status(queue, "failed", dedupe_key="k")
    async with await psycopg.AsyncConnection.connect(database_url) as holder:
        assert await queue.enqueue("a", {}, dedupe_key="k", conn=holder) is not None
        async with await psycopg.AsyncConnection.connect(database_url) as c:
            await c.execute("SELECT 1")  # the caller's transaction is open
            retry = asyncio.create_task(retry_job(queue, failed.id, conn=c))
            await asyncio.sleep(0.5)
            await holder.commit()
            with pytest.raises(InvalidTransition, match="dedupe key 'k'"):
                await retry
            assert await (await c.execute("SELECT 2")).fetchone() == (2,)


async def test_a_refused_retry_that_aborted_the_callers_transaction_still_says_why(
    queue: Queue, database_url: str,
) -> None:
    """The retry began the caller's transaction and the duplicate aborted it: the job
    cannot be read back for its key, but the refusal still names the reason."""
    failed = await in_status(queue, "failed", dedupe_key="k")
    async with await psycopg.AsyncConnection.connect(database_url) as holder:
        assert await queue.enqueue("a", {}, dedupe_key="k", conn=holder) is not None
        async with await psycopg.AsyncConnection.connect(database_url) as c:
            retry = asyncio.create_task(retry_job(queue, failed.id, conn=c))
            await asyncio.sleep(0.5)
            await holder.commit()
            with pytest.raises(InvalidTransition) as caught:
                await retry
            assert str(caught.value) == (
                f"job {failed.id}: another open job holds its dedupe key")
            await c.rollback()
    assert await queue.get_job(failed.id) == failed


async def test_a_retry_in_a_rolled_back_transaction_leaves_the_job_failed(
    queue: Queue, database_url: str,
) -> None:
    failed = await in_status(queue, "failed")
    async with await psycopg.AsyncConnection.connect(database_url) as c:
        assert (await retry_job(queue, failed.id, conn=c)).job.status == "pending"
        await c.rollback()
    assert await queue.get_job(failed.id) == failed


async def test_a_retried_job_wakes_listeners(queue: Queue, database_url: str) -> None:
    failed = await in_status(queue, "failed")
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as c:
        await c.execute(f'LISTEN "{queue.schema}"')
        await retry_job(queue, failed.id)
        notify = await anext(c.notifies(timeout=5))
    assert (notify.channel, notify.payload) == (queue.schema, "retry")


# -- cancel_job ---------------------------------------------------------------------------


async def test_cancel_fails_a_pending_job_and_owes_its_give_up_hook(queue: Queue) -> None:
    pending = await in_status(queue, "pending")
    job = await cancel_job(queue, pending.id)
    assert (job.id, job.status, job.last_error, job.give_up_pending, job.attempts,
            job.locked_at) == (pending.id, "failed", "cancelled", True, 0, None)
    assert job.finished_at is not None
    assert abs((job.finished_at - await queue.now()).total_seconds()) < 5
    assert await queue.get_job(pending.id) == job
    ran: list[int] = []

    async def hook(j: Job, conn: Any) -> None:
        ran.append(j.id)

    queue.on_give_up("a", hook)
    assert await queue.run_give_up_hooks([job.id]) == 1
    assert ran == [job.id]


async def test_the_queue_exposes_the_admin_operations_as_methods(queue: Queue) -> None:
    [a, b] = await enqueue_jobs(queue, "a", 2)
    assert [j.id for j in (await queue.list_jobs(limit=1)).jobs] == [b]
    assert (await queue.cancel_job(a)).status == "failed"
    assert (await queue.retry_job(a)).job.status == "pending"
    assert await queue.list_runs() == []
    assert [(d.type, d.due) for d in await queue.depth()] == [("a", 2)]


# -- list_runs ----------------------------------------------------------------------------

T0 = datetime(2030, 1, 1, tzinfo=UTC)


async def insert_run(aconn: Any, queue: Queue, run_id: uuid.UUID, started_min: int,
                     finished_min: int | None = None, **cols: Any) -> None:
    values = {"id": run_id, "trigger": "cron", "started_at": T0 + timedelta(minutes=started_min),
              "finished_at": None if finished_min is None
              else T0 + timedelta(minutes=finished_min), **cols}
    names = ", ".join(values)
    marks = ", ".join(f"%({k})s" for k in values)
    await sql(aconn, queue, f"INSERT INTO {{s}}.runs ({names}) VALUES ({marks})", values)


async def test_list_runs_newest_first_with_every_column(queue: Queue, aconn: Any) -> None:
    r1, r2 = uuid.uuid4(), uuid.uuid4()
    await insert_run(aconn, queue, r1, 0, 2, stop_reason="no_work", jobs_done=3,
                     jobs_failed=1, jobs_deferred=2, quota_units=7,
                     summary=psycopg.types.json.Jsonb({"echoed": 3}))
    await insert_run(aconn, queue, r2, 5, None)
    runs = await list_runs(queue)
    assert runs == [
        RunRecord(id=r2, trigger="cron", stop_reason=None, jobs_done=0, jobs_failed=0,
                  jobs_deferred=0, quota_units=0, summary={}, error=None,
                  started_at=T0 + timedelta(minutes=5), finished_at=None),
        RunRecord(id=r1, trigger="cron", stop_reason="no_work", jobs_done=3, jobs_failed=1,
                  jobs_deferred=2, quota_units=7, summary={"echoed": 3}, error=None,
                  started_at=T0, finished_at=T0 + timedelta(minutes=2)),
    ]
    assert runs[0].duration is None and runs[1].duration == timedelta(minutes=2)
    assert [r.id for r in await list_runs(queue, limit=1)] == [r2]
    assert [r.id for r in await list_runs(queue, before=T0 + timedelta(minutes=5))] == [r1]
    assert await list_runs(queue, before=T0) == []


async def test_list_runs_pages_through_runs_started_at_the_same_instant(
    queue: Queue, aconn: Any,
) -> None:
    ids = [uuid.uuid4() for _ in range(7)]
    for i, run_id in enumerate(ids):
        await insert_run(aconn, queue, run_id, 0 if i < 4 else 1)  # four share one start
    seen: list[uuid.UUID] = []
    page = await list_runs(queue, limit=3)
    while page:
        seen += [r.id for r in page]
        page = await list_runs(queue, limit=3, before=page[-1])
    expected = (sorted(ids[4:], reverse=True) + sorted(ids[:4], reverse=True))
    assert seen == expected


async def test_list_runs_checks_its_arguments(queue: Queue) -> None:
    for bad in (0, MAX_LIST_LIMIT + 1, True):
        with pytest.raises(InvalidInput, match="limit must be"):
            await list_runs(queue, limit=bad)
    with pytest.raises(NaiveDatetimeError):
        await list_runs(queue, before=datetime(2030, 1, 1))
    with pytest.raises(InvalidInput, match="before must be a datetime"):
        await list_runs(queue, before="yesterday")  # type: ignore[arg-type]


# -- depth --------------------------------------------------------------------------------


async def test_depth_counts_open_jobs_per_type_and_plan(make_queue: Any, aconn: Any) -> None:
    queue = await make_queue(plans=PLANS)
    await queue.upsert_group("f", plan="free")
    await queue.upsert_group("p", plan="pro")
    await queue.upsert_group("off", plan="pro", active=False)
    await sql(aconn, queue, "INSERT INTO {s}.groups (group_id, plan) VALUES ('x', 'gone')")
    for group in ("f", "f", "p", "off", "x"):
        await queue.enqueue("echo", {}, group_id=group)
    await queue.enqueue("boom", {})
    await queue.enqueue("boom", {}, run_after=datetime(2040, 1, 1, tzinfo=UTC))
    await queue.enqueue("boom", {})
    await queue.claim("boom", 1)
    done = await in_status(queue, "done", "other")  # done and failed are not open
    await sql(aconn, queue, "UPDATE {s}.jobs SET run_after = now() - interval '2 hours', "
                            "created_at = now() - interval '3 hours' WHERE group_id = 'p'")
    rows = await depth(queue)
    assert [(r.type, r.plan, r.priority, r.due, r.scheduled, r.paused, r.running)
            for r in rows] == [
        ("boom", None, 1, 1, 1, 0, 1),      # no group: the middle plan's priority
        ("echo", "pro", 2, 1, 0, 1, 0),
        ("echo", "free", 0, 2, 0, 0, 0),
        ("echo", "gone", 0, 1, 0, 0, 0),    # a plan the queue does not know: the lowest
    ]
    assert all(isinstance(r, DepthRow) for r in rows)
    pro = rows[1].oldest_due_age
    assert pro is not None and abs(pro - timedelta(hours=2)) < timedelta(minutes=1)
    assert done.status == "done"


async def test_depth_age_is_none_when_nothing_is_due_and_follows_the_clock(
    queue: Queue,
) -> None:
    await queue.enqueue("a", {}, run_after=datetime(2040, 1, 1, tzinfo=UTC))
    [row] = await depth(queue)
    assert (row.due, row.scheduled, row.oldest_due_age) == (0, 1, None)
    queue.clock_offset = datetime(2040, 1, 1, 1, tzinfo=UTC) - await queue.now()
    [row] = await depth(queue)
    assert (row.due, row.scheduled) == (1, 0)
    assert row.oldest_due_age is not None
    assert abs(row.oldest_due_age - timedelta(hours=1)) < timedelta(seconds=5)


# -- missing_migrations ---------------------------------------------------------------------


async def test_missing_migrations_lists_what_migrate_would_apply(
    queue: Queue, aconn: Any,
) -> None:
    assert await missing_migrations(queue) == []
    await sql(aconn, queue, "DELETE FROM {s}.rota_migrations WHERE version = 1")
    assert await missing_migrations(queue) == [1]


async def test_missing_migrations_on_an_empty_schema_is_the_missing_table(
    database_url: str,
) -> None:
    async with Queue(database_url, schema=f"t_{uuid.uuid4().hex[:12]}") as queue:
        with pytest.raises(psycopg.errors.UndefinedTable):
            await missing_migrations(queue)
