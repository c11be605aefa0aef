"""Job results (docs/design.md, "Results"): a handler's return value stored with the job,
every failed attempt's error kept with its traceback, queue.result and queue.wait (and
their sync forms), a value that cannot be stored failing the job, pruning with the job,
and where they show: `rota jobs show`, the dashboard's job page."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg import sql

from rota import (
    InvalidInput,
    JobContext,
    JobNotFound,
    JobResult,
    Maintenance,
    Pipeline,
    Queue,
    ResultError,
    Stage,
    SyncQueue,
    WaitTimeout,
    dashboard_app,
)
from rota.admin import show_job
from rota.cli import cli
from rota.job import encode_payload, printed_size
from rota.results import MAX_ERROR_CHARS, MAX_TRACEBACK_CHARS, encode_result, error_record

AConn = psycopg.AsyncConnection[Any]
HOUR = timedelta(hours=1)


async def run(pipeline: Pipeline) -> None:
    await pipeline.run(trigger="manual")


async def error_rows(aconn: AConn, queue: Queue) -> list[tuple[Any, ...]]:
    cur = await aconn.execute(sql.SQL("SELECT job_id, attempt, error FROM {} ORDER BY id")
                              .format(queue.table("job_errors")))
    return await cur.fetchall()


# -- the return value ---------------------------------------------------------------------


async def test_a_handlers_return_value_is_the_jobs_result(queue: Queue) -> None:
    async def handler(ctx: JobContext) -> dict[str, Any]:
        return {"sum": sum(ctx.job.payload["xs"]), "names": ["a", "é"], "none": None}

    job = await queue.enqueue("add", {"xs": [1, 2, 3]})
    pending = await queue.result(job.id)  # type: ignore[union-attr]
    assert (pending.status, pending.value, pending.errors, pending.started_at,
            pending.finished) == ("pending", None, [], None, False)
    await run(Pipeline(queue, [Stage("add", handler=handler)]))
    found = await queue.result(job.id)  # type: ignore[union-attr]
    assert isinstance(found, JobResult)
    assert (found.status, found.value, found.errors, found.finished) == (
        "done", {"sum": 6, "names": ["a", "é"], "none": None}, [], True)
    # The attempt's claim time, no later than the completion.
    assert found.job.finished_at is not None and found.started_at is not None
    assert found.started_at <= found.job.finished_at
    assert found.job.finished_at - found.started_at < timedelta(seconds=30)


async def test_none_stores_nothing_and_a_batch_handler_sets_each_result(
        queue: Queue, aconn: AConn) -> None:
    async def none(ctx: JobContext) -> None:
        return None

    async def batch(ctxs: list[JobContext]) -> None:
        for c in ctxs:
            c.result = c.job.payload["i"] * 10

    a = [await queue.enqueue("none", {"i": 1}), await queue.enqueue("batch", {"i": 2}),
         await queue.enqueue("batch", {"i": 3})]
    await run(Pipeline(queue, [Stage("none", handler=none),
                               Stage("batch", batch=5, batch_handler=batch)]))
    cur = await aconn.execute(sql.SQL("SELECT id, status, result FROM {} ORDER BY id")
                              .format(queue.table("jobs")))
    assert await cur.fetchall() == [(a[0].id, "done", None), (a[1].id, "done", 20),  # type: ignore[union-attr]
                                    (a[2].id, "done", 30)]  # type: ignore[union-attr]


async def test_ctx_complete_takes_a_result(queue: Queue) -> None:
    async def handler(ctx: JobContext) -> str:
        await ctx.complete(result=["kept"])
        return "ignored: the job is already completed"

    job = await queue.enqueue("t", {})
    await run(Pipeline(queue, [Stage("t", handler=handler)]))
    assert (await queue.result(job.id)).value == ["kept"]  # type: ignore[union-attr]


@pytest.mark.parametrize(("value", "message"), [
    ("x" * 200, "the return value is 202 bytes of JSON, larger than the maximum 100 "
                "(max_payload_bytes)"),
    (datetime(2030, 1, 1, tzinfo=UTC),
     "the return value is not JSON-serializable: Object of type datetime is not JSON "
     "serializable"),
    ({"v": float("nan")}, "the return value['v'] is nan, which JSON cannot represent"),
    ({"k": "a\x00b"}, "the return value['k'] contains a NUL character (\\u0000), which "
                      "PostgreSQL jsonb cannot store"),
], ids=["too-large", "datetime", "nan", "nul"])
async def test_a_result_that_cannot_be_stored_fails_the_job_saying_why(
        make_queue: Any, aconn: AConn, value: Any, message: str) -> None:
    queue = await make_queue(max_payload_bytes=100, max_attempts=3)

    async def handler(ctx: JobContext) -> Any:
        return value

    job = await queue.enqueue("t", {})
    assert job is not None
    await run(Pipeline(queue, [Stage("t", handler=handler)]))
    found = await queue.result(job.id)
    expected = f"ResultError: {message}"
    # Given up at once (it would not fit on a retry either), not lost, not done.
    assert (found.status, found.job.attempts, found.value, found.job.last_error) == (
        "failed", 1, None, expected)
    assert [(e.attempt, e.error) for e in found.errors] == [(1, expected)]
    assert await error_rows(aconn, queue) == [(job.id, 1, expected)]


async def test_a_result_and_a_payload_have_one_size_rule(make_queue: Any) -> None:
    """Both are counted as PostgreSQL's jsonb prints them, every digit of a number:
    [1e300] * 100 is 30,300 bytes (not the 700 Python writes), refused as a result as
    enqueue refuses it as a payload."""
    queue = await make_queue(max_payload_bytes=4096, max_attempts=3)
    value = [1e300] * 100
    with pytest.raises(InvalidInput) as refused:
        await queue.enqueue("t", value)
    assert str(refused.value) == "payload is 30300 bytes, larger than the maximum 4096"

    async def handler(ctx: JobContext) -> Any:
        return value

    job = await queue.enqueue("t", {})
    assert job is not None
    await run(Pipeline(queue, [Stage("t", handler=handler)]))
    found = await queue.result(job.id)
    assert (found.status, found.value, found.job.last_error) == (
        "failed", None, "ResultError: the return value is 30300 bytes of JSON, larger "
                        "than the maximum 4096 (max_payload_bytes)")


@pytest.mark.parametrize("value", [
    [1e300] * 100, 1e-300, -0.0, 0.0, 1.5e-7, 123.45, -1e16, 2**70, -(2**70), 0, True,
    None, "é\n\x01\"\\/\u2028", {"b": [1, {"c": None}], "a": "x"}, [], {}, [[], {}],
    Decimal("1.50E+1"), Decimal("0.00"), Decimal("-0.000"), Decimal("123.4500"),
    Decimal("-1E-3"), Decimal("12345678901234567.89"), Decimal("1E+2"),
], ids=repr)
async def test_printed_size_is_what_postgresql_prints(aconn: AConn, value: Any) -> None:
    """printed_size counts what octet_length(value::jsonb::text) does, for every kind of
    JSON value and every way of writing a number."""
    text = encode_payload(value)
    cur = await aconn.execute("SELECT octet_length(%s::jsonb::text)", [text])
    assert printed_size(value) == (await cur.fetchone())[0]  # type: ignore[index]


def test_a_result_nested_deeper_than_a_payload_may_be_is_refused() -> None:
    deep: Any = []
    for _ in range(300):
        deep = [deep]
    with pytest.raises(ResultError) as e:
        encode_result(deep, 10**6)
    assert str(e.value) == ("the return value is nested deeper than 256 levels, more "
                            "than can be read back")
    assert encode_result([[1]], 10) == "[[1]]"
    # Sized as a payload is, as PostgreSQL prints it: {"a": [1, 2]} is 13 bytes.
    assert encode_result({"a": [1, 2]}, 13) == '{"a":[1,2]}'
    with pytest.raises(ResultError, match=r"^the return value is 13 bytes of JSON, larger "
                                          r"than the maximum 12 \(max_payload_bytes\)$"):
        encode_result({"a": [1, 2]}, 12)


async def test_queue_complete_with_an_unstorable_result_fails_the_job(make_queue: Any) -> None:
    queue = await make_queue(max_payload_bytes=10)
    job = await queue.enqueue("t", {})
    [claimed] = await queue.claim("t", 1)
    with pytest.raises(ResultError) as e:
        await queue.complete(claimed, result="y" * 20)
    assert str(e.value) == (f"job {job.id}: the return value is 22 bytes of JSON, larger "
                            f"than the maximum 10 (max_payload_bytes)")
    found = await queue.result(job.id)
    assert (found.status, found.job.last_error) == ("failed", f"ResultError: {e.value}")


async def test_complete_many_refuses_an_unstorable_result_before_writing(
        make_queue: Any) -> None:
    queue = await make_queue(max_payload_bytes=10)
    for _ in range(2):
        await queue.enqueue("t", {})
    a, b = await queue.claim("t", 2)
    with pytest.raises(ResultError) as e:
        await queue.complete_many([a, b], results=[1, "z" * 20])
    assert str(e.value).startswith(f"job {b.id}: the return value is 22 bytes")
    assert [(await queue.result(j.id)).status for j in (a, b)] == ["running", "running"]
    with pytest.raises(InvalidInput, match=r"^complete_many: 1 results for 2 jobs$"):
        await queue.complete_many([a, b], results=[1])
    assert await queue.complete_many([a, b], results=[1, None]) == [True, True]
    assert [(await queue.result(j.id)).value for j in (a, b)] == [1, None]


# -- every attempt's error ----------------------------------------------------------------


async def test_every_failed_attempt_keeps_its_error_and_traceback(
        make_queue: Any, aconn: AConn) -> None:
    queue = await make_queue(max_attempts=3)

    async def handler(ctx: JobContext) -> None:
        raise ValueError(f"boom on attempt {ctx.job.attempts}")

    job = await queue.enqueue("t", {})
    assert job is not None
    pipeline = Pipeline(queue, [Stage("t", handler=handler)])
    runs = []
    for _ in range(3):
        runs.append(await pipeline.run(trigger="manual"))
        queue.clock_offset += HOUR  # past the backoff (2, 4 minutes)
    found = await queue.result(job.id)
    assert (found.status, found.job.attempts, found.value) == ("failed", 3, None)
    assert [(e.attempt, e.error, e.run_id) for e in found.errors] == [
        (i, f"ValueError: boom on attempt {i}", runs[i - 1].run_id) for i in (1, 2, 3)]
    for e in found.errors:
        assert e.traceback is not None
        assert e.traceback.startswith("Traceback (most recent call last):\n")
        assert e.traceback.endswith(f"ValueError: boom on attempt {e.attempt}\n")
        assert 'raise ValueError(f"boom on attempt {ctx.job.attempts}")' in e.traceback
        assert e.started_at is not None and e.started_at <= e.failed_at
    # Each attempt failed an hour of queue clock after the one before.
    gaps = [b.failed_at - a.failed_at for a, b in itertools.pairwise(found.errors)]
    assert all(HOUR <= g < HOUR + timedelta(minutes=1) for g in gaps), gaps
    assert found.job.last_error == "ValueError: boom on attempt 3"


async def test_errors_and_tracebacks_are_bounded(queue: Queue) -> None:
    async def handler(ctx: JobContext) -> None:
        raise RuntimeError("x" * 20_000)

    job = await queue.enqueue("t", {}, max_attempts=1)
    await run(Pipeline(queue, [Stage("t", handler=handler)]))
    [e] = (await queue.result(job.id)).errors  # type: ignore[union-attr]
    assert len(e.error) == MAX_ERROR_CHARS
    assert e.error == "RuntimeError: " + "x" * (MAX_ERROR_CHARS - 15) + "…"
    assert e.traceback is not None and len(e.traceback) == MAX_TRACEBACK_CHARS
    assert e.traceback.startswith("Traceback (most recent call last):\n")
    assert " characters left out) ...\n" in e.traceback
    assert e.traceback.endswith("x" * 100 + "\n")


async def test_an_error_is_cut_at_its_limit_after_escaping(queue: Queue, aconn: AConn) -> None:
    """A NUL is stored as two characters (\\0), so the cut comes after the escaping:
    "start" and 5,000 NULs keep exactly MAX_ERROR_CHARS characters, not 7,994."""
    async def handler(ctx: JobContext) -> None:
        raise ValueError("start" + "\x00" * 5_000)

    job = await queue.enqueue("t", {}, max_attempts=1)
    await run(Pipeline(queue, [Stage("t", handler=handler)]))
    found = await queue.result(job.id)  # type: ignore[union-attr]
    expected = "ValueError: start" + "\\0" * 1991 + "…"
    assert len(expected) == MAX_ERROR_CHARS == 4000
    assert [e.error for e in found.errors] == [expected]
    assert found.job.last_error == expected
    assert found.errors[0].traceback is not None
    assert found.errors[0].traceback.endswith("ValueError: start" + "\\0" * 5_000 + "\n")
    assert await error_rows(aconn, queue) == [(job.id, 1, expected)]
    # A traceback too is cut after escaping: 10,000 NULs print as 20,000 characters.
    try:
        raise ValueError("start" + "\x00" * 10_000)
    except ValueError as exc:
        text, _, trace = error_record(exc)
    assert text == expected
    assert trace is not None and len(trace) == MAX_TRACEBACK_CHARS
    assert trace.endswith("\\0" * 100 + "\n") and "\x00" not in trace


@pytest.mark.parametrize("length", [50_000, 200_000])
async def test_a_one_word_error_of_any_length_settles_at_once(
        queue: Queue, length: int) -> None:
    """Redaction scans a bounded text in linear time: a one-word message of 50,000 or
    200,000 characters (which took 11 s and minutes when a pattern was quadratic on the
    whole message) is stored cut, and the handler's failure is settled within the run
    at once (the bound only guards against quadratic time)."""
    word = "a" * length

    async def handler(ctx: JobContext) -> None:
        raise ValueError(word)

    job = await queue.enqueue("t", {}, max_attempts=1)
    started = time.perf_counter()
    text, kind, _ = error_record(ValueError(word))
    assert time.perf_counter() - started < 1.0
    assert (text, kind) == ("ValueError: " + "a" * (MAX_ERROR_CHARS - 13) + "…",
                            "builtins.ValueError")
    started = time.perf_counter()
    result = await Pipeline(queue, [Stage("t", handler=handler)]).run(trigger="manual")
    assert time.perf_counter() - started < 1.0
    assert (result.stop_reason, result.jobs_failed) == ("no_work", 1)
    found = await queue.result(job.id)  # type: ignore[union-attr]
    assert [e.error for e in found.errors] == [text]


async def test_a_timeout_and_a_stuck_job_keep_their_errors_without_a_traceback(
        make_queue: Any) -> None:
    queue = await make_queue(max_attempts=1)

    async def slow(ctx: JobContext) -> None:
        await asyncio.sleep(60)

    timed = await queue.enqueue("slow", {})
    await Pipeline(queue, [Stage("slow", handler=slow, timeout=timedelta(seconds=0.2))]
                   ).run(trigger="manual")
    [e] = (await queue.result(timed.id)).errors  # type: ignore[union-attr]
    assert (e.attempt, e.error, e.traceback) == (1, "timed out after 0.2 s", None)

    stuck = await queue.enqueue("stuck", {})
    await queue.claim("stuck", 1)
    queue.clock_offset += queue.stale_after + timedelta(minutes=1)
    assert [j.id for j in await queue.fail_stuck_jobs()] == [stuck.id]  # type: ignore[union-attr]
    [e] = (await queue.result(stuck.id)).errors  # type: ignore[union-attr]
    assert (e.attempt, e.error, e.traceback, e.started_at) == (
        1, "stuck: lock went stale on the last attempt (the process running it died)",
        None, None)


async def test_results_and_errors_are_pruned_with_their_jobs(
        make_queue: Any, aconn: AConn) -> None:
    queue = await make_queue(max_attempts=2)
    calls: dict[int, int] = {}

    async def handler(ctx: JobContext) -> str:
        calls[ctx.job.id] = calls.get(ctx.job.id, 0) + 1
        if ctx.job.payload["fail"] or calls[ctx.job.id] == 1:
            raise RuntimeError(f"attempt {ctx.job.attempts}")
        return "ok"

    done = await queue.enqueue("t", {"fail": False})
    failed = await queue.enqueue("t", {"fail": True})
    pipeline = Pipeline(queue, [Stage("t", handler=handler)])
    await pipeline.run(trigger="manual")
    queue.clock_offset += HOUR
    await pipeline.run(trigger="manual")
    assert (await queue.result(done.id)).value == "ok"  # type: ignore[union-attr]
    assert await error_rows(aconn, queue) == [
        (done.id, 1, "RuntimeError: attempt 1"), (failed.id, 1, "RuntimeError: attempt 1"),  # type: ignore[union-attr]
        (failed.id, 2, "RuntimeError: attempt 2")]  # type: ignore[union-attr]
    queue.clock_offset += timedelta(days=8)
    counters = await Maintenance(queue).run_once()
    assert counters["prune.jobs_deleted"] == 1
    with pytest.raises(JobNotFound):
        await queue.result(done.id)  # type: ignore[union-attr]
    # A failed job is kept, and so are its errors.
    assert await error_rows(aconn, queue) == [
        (failed.id, 1, "RuntimeError: attempt 1"), (failed.id, 2, "RuntimeError: attempt 2")]  # type: ignore[union-attr]


async def test_result_of_an_unknown_or_bad_id(queue: Queue) -> None:
    with pytest.raises(JobNotFound, match=r"^no job 424242$"):
        await queue.result(424242)
    for bad in (0, -1, True, "1"):
        with pytest.raises(InvalidInput, match=r"^job_id must be an int between 1 and"):
            await queue.result(bad)  # type: ignore[arg-type]


BAD_JOB_IDS = (0, -1, 2**63, True, 1.0, "1", None)


async def test_every_way_to_name_a_job_refuses_a_bad_id_in_one_line(
        queue: Queue, database_url: str) -> None:
    # Past the bigint, a bool and a float each used to reach the database: a raw
    # "bigint out of range" or "operator does not exist", or a silent None or a match.
    job = await queue.enqueue("t", {})
    assert job is not None
    sync = SyncQueue(schema=queue.schema)
    for bad in BAD_JOB_IDS:
        expected = f"^job_id must be an int between 1 and 9223372036854775807, got {bad!r}$"
        with pytest.raises(InvalidInput, match=expected):
            await queue.wait(bad, timeout=timedelta(seconds=1))  # type: ignore[arg-type]
        with pytest.raises(InvalidInput, match=expected):
            await queue.get_job(bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidInput, match=expected):
            await show_job(queue, bad)  # type: ignore[arg-type]
        with psycopg.connect(database_url) as conn:  # the caller's transaction
            with pytest.raises(InvalidInput, match=expected):
                sync.result(conn, bad)  # type: ignore[arg-type]
            with pytest.raises(InvalidInput, match=expected):
                sync.wait(conn, bad, timeout=timedelta(seconds=1))  # type: ignore[arg-type]
            # Refused before anything was sent: the transaction is still usable.
            assert sync.result(conn, job.id).status == "pending"
        with psycopg.connect(database_url, autocommit=True) as conn:
            with pytest.raises(InvalidInput, match=expected):
                sync.wait(conn, bad, timeout=timedelta(seconds=1))  # type: ignore[arg-type]
            assert conn.execute("SELECT pg_listening_channels()").fetchall() == []
    async with queue.connection() as c:
        cur = await c.execute(sql.SQL("SELECT count(*) FROM {}").format(
            queue.table("job_waiters")))
        assert await cur.fetchone() == (0,)


# -- waiting ------------------------------------------------------------------------------


async def test_wait_returns_when_the_job_is_done_woken_by_its_notification(
        queue: Queue) -> None:
    async def handler(ctx: JobContext) -> int:
        return 42

    job = await queue.enqueue("t", {})
    assert job is not None
    # Polling only every 5 minutes: only the notification can end the wait in time.
    waiter = asyncio.create_task(queue.wait(job.id, timeout=timedelta(seconds=20),
                                            poll_every=timedelta(minutes=5)))
    await asyncio.sleep(0.5)  # the waiter is listening and has read the job pending
    assert not waiter.done()
    await run(Pipeline(queue, [Stage("t", handler=handler)]))
    found = await asyncio.wait_for(waiter, 20)
    assert (found.status, found.value) == ("done", 42)


async def test_wait_returns_at_once_for_a_failed_job_and_times_out_on_a_pending_one(
        queue: Queue) -> None:
    job = await queue.enqueue("t", {}, max_attempts=1)
    assert job is not None
    with pytest.raises(WaitTimeout) as e:
        await queue.wait(job.id, timeout=timedelta(seconds=0.3))
    assert (str(e.value), e.value.job_id, e.value.status) == (
        f"job {job.id} is still pending after waiting 0.3 s", job.id, "pending")
    assert isinstance(e.value, TimeoutError)
    await queue.cancel_job(job.id)
    found = await queue.wait(job.id, timeout=timedelta(seconds=5))
    assert (found.status, found.job.last_error) == ("failed", "cancelled")
    with pytest.raises(InvalidInput):
        await queue.wait(job.id, timeout=timedelta(0))


async def test_wait_polls_for_a_job_settled_without_a_notification(make_queue: Any) -> None:
    queue = await make_queue(max_deferrals=0)
    job = await queue.enqueue("t", {})
    assert job is not None
    waiter = asyncio.create_task(queue.wait(job.id, timeout=timedelta(seconds=20),
                                            poll_every=timedelta(seconds=0.2)))
    await asyncio.sleep(0.3)
    [claimed] = await queue.claim("t", 1)
    await queue.defer(claimed)  # past max_deferrals: it gives up, and nothing notifies
    found = await asyncio.wait_for(waiter, 20)
    assert (found.status, found.job.last_error) == ("failed", "deferred more than 0 times")


async def test_a_settlement_notifies_only_for_jobs_someone_waits_for(
        queue: Queue, database_url: str, aconn: AConn) -> None:
    for _ in range(4):
        await queue.enqueue("t", {})
    jobs = await queue.claim("t", 4)
    add = sql.SQL("INSERT INTO {} (job_id, waiter) VALUES (%s, %s)").format(
        queue.table("job_waiters"))

    def ours(payload: str) -> bool:
        # The channel is shared by every schema of the database (tests run side by side).
        return payload.startswith(f"{queue.schema}:")

    for j in (jobs[0], jobs[1], jobs[3]):
        await aconn.execute(add, [j.id, uuid.uuid4()])
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as c:
        await c.execute("LISTEN rota_settled")
        await queue.complete_many(jobs[:3])       # one notification: the waited-for two
        await queue.fail(jobs[3], "no", give_up=True)
        notes = [n.payload async for n in c.notifies(timeout=2) if ours(n.payload)]
    assert notes == [f"{queue.schema}:{jobs[0].id},{jobs[1].id}",
                     f"{queue.schema}:{jobs[3].id}"]
    # Nobody waits: nothing is sent.
    await queue.enqueue("t", {})
    [lone] = await queue.claim("t", 1)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as c:
        await c.execute("LISTEN rota_settled")
        assert await queue.complete(lone)
        assert [n.payload async for n in c.notifies(timeout=1) if ours(n.payload)] == []


async def test_a_waiter_is_registered_only_while_it_waits(queue: Queue, aconn: AConn) -> None:
    job = await queue.enqueue("t", {})
    assert job is not None
    count = sql.SQL("SELECT job_id FROM {}").format(queue.table("job_waiters"))
    waiter = asyncio.create_task(queue.wait(job.id, timeout=timedelta(seconds=0.5)))
    await asyncio.sleep(0.3)
    assert await (await aconn.execute(count)).fetchall() == [(job.id,)]
    with pytest.raises(WaitTimeout):
        await waiter
    assert await (await aconn.execute(count)).fetchall() == []


async def test_sync_result_and_wait(queue: Queue, database_url: str) -> None:
    sync = SyncQueue(schema=queue.schema)

    async def handler(ctx: JobContext) -> dict[str, str]:
        return {"hello": ctx.job.payload["name"]}

    with psycopg.connect(database_url, autocommit=True) as conn:
        job = sync.enqueue(conn, "t", {"name": "ada"})
        assert job is not None
        assert sync.result(conn, job.id).status == "pending"
        waiting = asyncio.create_task(asyncio.to_thread(
            sync.wait, conn, job.id, timeout=timedelta(seconds=20),
            poll_every=timedelta(minutes=5)))
        await asyncio.sleep(0.5)
        await run(Pipeline(queue, [Stage("t", handler=handler)]))
        found = await asyncio.wait_for(waiting, 20)
        assert (found.status, found.value) == ("done", {"hello": "ada"})
        assert conn.execute("SELECT pg_listening_channels()").fetchall() == []
        with pytest.raises(JobNotFound):
            sync.result(conn, 999999)
    with psycopg.connect(database_url) as conn:  # in a transaction: polling
        with pytest.raises(WaitTimeout):
            pending = sync.enqueue(conn, "t", {"name": "x"})
            assert pending is not None
            sync.wait(conn, pending.id, timeout=timedelta(seconds=0.3),
                      poll_every=timedelta(seconds=0.1))
        conn.rollback()


# -- where results show -------------------------------------------------------------------


async def failed_then_done(queue: Queue) -> int:
    calls = 0

    async def handler(ctx: JobContext) -> dict[str, int]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise KeyError("missing <b>key</b>")
        return {"rows": 7}

    job = await queue.enqueue("t", {"p": 1}, max_attempts=2)
    assert job is not None
    pipeline = Pipeline(queue, [Stage("t", handler=handler)])
    await pipeline.run(trigger="manual")
    queue.clock_offset += HOUR
    await pipeline.run(trigger="manual")
    return job.id


async def test_rota_jobs_show_prints_the_result_and_each_attempts_traceback(
        queue: Queue, database_url: str) -> None:
    job_id = await failed_then_done(queue)
    env = {"DATABASE_URL": database_url, "ROTA_SCHEMA": queue.schema, "ROTA_APP": None,
           "COLUMNS": "200"}
    out = await asyncio.to_thread(CliRunner().invoke, cli, ["jobs", "show", str(job_id),
                                                            "--json"], env=env)
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert (data["id"], data["status"], data["result"], data["attempts"],
            data["payload"]) == (job_id, "done", {"rows": 7}, 2, {"p": 1})
    [e] = data["errors"]
    assert (e["attempt"], e["error"]) == (1, "KeyError: 'missing <b>key</b>'")
    assert e["traceback"].endswith("KeyError: 'missing <b>key</b>'\n")
    assert uuid.UUID(e["run_id"]) and data["started_at"] and data["finished_at"]
    text = await asyncio.to_thread(CliRunner().invoke, cli, ["jobs", "show", str(job_id)],
                                   env=env)
    assert text.exit_code == 0, text.output
    assert '{"rows": 7}' in text.stdout
    assert f"attempt 1 failed {e['failed_at'][:10]}" in text.stdout
    assert "KeyError: 'missing <b>key</b>'" in text.stdout
    assert "    Traceback (most recent call last):" in text.stdout
    missing = await asyncio.to_thread(CliRunner().invoke, cli, ["jobs", "show", "999999"],
                                      env=env)
    assert (missing.exit_code, missing.stderr) == (1, "error: no job 999999\n")
    assert (await show_job(queue, job_id)).value == {"rows": 7}


async def test_rota_jobs_show_says_the_cost_the_job_counts(
        queue: Queue, aconn: AConn, database_url: str) -> None:
    """The cost a job counts in its group's and owner's served counts (docs/design.md,
    "Cost"), which `rota jobs show` did not show: none while pending, the expected cost it
    was claimed with while running, what it was charged once done, none once failed."""
    env = {"DATABASE_URL": database_url, "ROTA_SCHEMA": queue.schema, "ROTA_APP": None,
           "COLUMNS": "200"}

    async def shown(job_id: int) -> tuple[Any, str]:
        data = await asyncio.to_thread(CliRunner().invoke, cli,
                                       ["jobs", "show", str(job_id), "--json"], env=env)
        text = await asyncio.to_thread(CliRunner().invoke, cli,
                                       ["jobs", "show", str(job_id)], env=env)
        assert data.exit_code == 0 and text.exit_code == 0, (data.output, text.output)
        [row] = [line for line in text.stdout.splitlines() if " cost " in line]
        return json.loads(data.stdout)["cost"], " ".join(row.strip("│ ").split())

    charged = await queue.enqueue("t", {})
    failing = await queue.enqueue("u", {}, max_attempts=1)
    assert charged is not None and failing is not None
    assert await shown(charged.id) == (None, "cost │ — (counted from its claim)")
    [running] = await queue.claim("t", 1)
    await aconn.execute(  # the expected cost a fold would have left (1 before any)
        sql.SQL("UPDATE {} SET cost = 2.125 WHERE id = %s").format(queue.table("jobs")),
        [running.id])
    assert await shown(charged.id) == (
        2.125, "cost │ 2.125 (expected; what it is charged replaces it when it completes)")
    running = await queue.get_job(running.id)  # type: ignore[assignment]
    assert await queue.complete(running, cost=Decimal("12.5"))
    assert await shown(charged.id) == (12.5, "cost │ 12.5 (charged)")
    [failed] = await queue.claim("u", 1)
    assert await queue.fail(failed, RuntimeError("no")) == "failed"
    assert await shown(failing.id) == (None, "cost │ — (a failed job is not charged)")


async def test_the_dashboards_job_page_shows_the_result_and_each_attempt(
        queue: Queue) -> None:
    import httpx

    job_id = await failed_then_done(queue)
    app = dashboard_app(queue, read_only=True)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://127.0.0.1") as c:
        page = (await c.get(f"/jobs/{job_id}")).text
    assert '<pre class="result">{\n  &#34;rows&#34;: 7\n}</pre>' in page
    assert "Attempt 1 · failed" in page
    assert ('<pre class="attempt-error">KeyError: &#39;missing &lt;b&gt;key&lt;/b&gt;&#39;'
            "</pre>") in page
    assert '<pre class="traceback">Traceback (most recent call last):' in page
