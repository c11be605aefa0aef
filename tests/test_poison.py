"""One bad job never stops the pipeline (docs/design.md, "Bad data belongs to its job"):
what enqueue accepts the claim can read; a row that cannot be turned into a Job (written
before the checks, or by hand) gives up on its own, named, while the run goes on; every
read path (claim, listing, job page) survives it; and nothing a handler counts can
leave the run unfinished."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg import sql
from psycopg.rows import dict_row

from rota import Job, JobContext, Pipeline, Queue, Stage
from rota.cli import cli
from rota.errors import UnreadableJob
from rota.job import MAX_PAYLOAD_DEPTH, Unreadable

AConn = psycopg.AsyncConnection[Any]


def nested(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


def rota_cli(url: str, schema: str, *args: str) -> Any:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False, env={
        "DATABASE_URL": url, "ROTA_SCHEMA": schema, "ROTA_APP": None, "COLUMNS": "250"})


async def count(aconn: AConn, queue: Queue, where: str = "true") -> int:
    cur = await aconn.execute(sql.SQL("SELECT count(*) FROM {} WHERE " + where)
                              .format(queue.table("jobs")))
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def insert_raw(aconn: AConn, queue: Queue, job_type: str, payload_sql: str,
                     created_at: str = "now()", run_after: str = "now()") -> int:
    """A row as an older version (or a hand-written INSERT) could leave it."""
    cur = await aconn.execute(sql.SQL(
        "INSERT INTO {} (type, payload, max_attempts, run_after, created_at) "
        "VALUES (%s, {}, 3, {}, {}) RETURNING id")
        .format(queue.table("jobs"), sql.SQL(payload_sql), sql.SQL(run_after),
                sql.SQL(created_at)), [job_type])
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def job_row(aconn: AConn, queue: Queue, job_id: int) -> dict[str, Any]:
    cur = aconn.cursor(row_factory=dict_row)  # the columns that always load
    await cur.execute(sql.SQL("SELECT id, status, attempts, give_up_pending, last_error "
                              "FROM {} WHERE id = %s").format(queue.table("jobs")), [job_id])
    row = await cur.fetchone()
    assert row is not None
    return row


# -- what enqueue accepts, the claim can read ----------------------------------------------


@pytest.mark.parametrize("depth", [973, 975], ids=["passed-enqueue", "committed-then-exit-2"])
def test_the_issue_payloads_are_refused_at_enqueue_and_nothing_is_written(
    database_url: str, migrated: str, depth: int
) -> None:
    """973 nested arrays passed `rota enqueue` (exit 0) and no claim could read them;
    975 exited 2 with the row already committed. Both now exit 2, nothing written."""
    result = rota_cli(database_url, migrated, "enqueue", "echo", nested(depth))
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == (f"error: PAYLOAD_JSON is nested deeper than {MAX_PAYLOAD_DEPTH} "
                             "levels (or contains itself), more than can be read back\n")
    with psycopg.connect(database_url) as conn:
        n = conn.execute(sql.SQL("SELECT count(*) FROM {}.jobs")
                         .format(sql.Identifier(migrated))).fetchone()
    assert n == (0,)


async def test_the_deepest_payload_enqueue_accepts_is_claimed_and_read_back(
    queue: Queue
) -> None:
    deepest: Any = 1
    for _ in range(MAX_PAYLOAD_DEPTH):
        deepest = [deepest]
    job = await queue.enqueue("t", deepest)
    assert job is not None and job.payload == deepest
    [claimed] = await queue.claim("t", 1)
    assert claimed.payload == deepest
    with pytest.raises(Exception, match=f"nested deeper than {MAX_PAYLOAD_DEPTH} levels"):
        await queue.enqueue("t", [deepest])


# -- a row that cannot be read gives up on its own --------------------------------------


POISON = {
    "deep-payload": (f"'{nested(3000)}'::jsonb", "now()",
                     "payload: RecursionError: maximum recursion depth exceeded"),
    "long-number": ("('{\"n\": ' || repeat('9', 5000) || '}')::jsonb", "now()",
                    "payload: ValueError: Exceeds the limit (4300 digits) for integer "
                    "string conversion"),
    "year-10193": ("'{}'::jsonb", "'10193-01-01 00:00:00+00'::timestamptz",
                   "created_at: DataError: timestamp too large (after year 10K)"),
}


@pytest.mark.parametrize("kind", list(POISON))
async def test_a_poison_row_fails_on_its_own_and_the_run_goes_on(
    queue: Queue, aconn: AConn, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: every run ended with stop_reason error, the job stayed pending at 0
    attempts forever, and the stages after it never ran. Now the claim gives the row
    up through the usual path (failed, its error text naming the column, its hook
    run), the run counts it failed, and the other jobs and the later stage run."""
    caplog.set_level(logging.CRITICAL, logger="rota.queue")
    payload_sql, created_at, error = POISON[kind]
    hooks: list[tuple[int, Any]] = []
    ran: list[str] = []

    async def handler(ctx: JobContext) -> None:
        ran.append(f"{ctx.job.type}:{ctx.job.payload['n']}")

    async def gave_up(job: Job, conn: AConn) -> None:
        hooks.append((job.id, job.payload))

    good = await queue.enqueue("first", {"n": 1})
    poison = await insert_raw(aconn, queue, "first", payload_sql, created_at)
    also_good = await queue.enqueue("first", {"n": 2})
    later = await queue.enqueue("second", {"n": 3})
    assert good and also_good and later
    pipeline = Pipeline(queue, [Stage("first", 10, 1, handler, on_give_up=gave_up),
                                Stage("second", 10, 1, handler)])
    result = await pipeline.run()
    assert (result.stop_reason, result.jobs_done, result.jobs_failed, result.error) == (
        "no_work", 3, 1, None)
    assert result.summary == {"unreadable": 1}
    assert sorted(ran) == ["first:1", "first:2", "second:3"]
    row = await job_row(aconn, queue, poison)
    assert (row["status"], row["attempts"], row["give_up_pending"]) == ("failed", 1, False)
    assert row["last_error"].startswith(f"job {poison} cannot be read: {error}")
    [(hook_id, hook_payload)] = hooks
    assert hook_id == poison
    if kind == "year-10193":
        assert hook_payload == {}
    else:
        assert isinstance(hook_payload, Unreadable)
        assert error.removeprefix("payload: ") in hook_payload.error
    assert (await pipeline.run()).stop_reason == "no_work"  # nothing left over


async def test_a_poison_row_claimed_on_the_callers_connection_gives_up_with_it(
    queue: Queue, aconn: AConn, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.CRITICAL, logger="rota.queue")
    poison = await insert_raw(aconn, queue, "t", POISON["deep-payload"][0])
    good = await queue.enqueue("t", {"n": 1})
    assert good
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        jobs = await queue.claim("t", 5, conn=conn)
        await conn.commit()
    assert [j.id for j in jobs] == [good.id]
    row = await job_row(aconn, queue, poison)
    assert (row["status"], row["give_up_pending"]) == ("failed", True)  # hook owed


# -- every read path survives one unreadable row and names it ---------------------------


async def test_listings_and_the_job_page_name_an_unreadable_row_and_show_the_rest(
    queue: Queue, aconn: AConn, database_url: str
) -> None:
    """Before: get_job raised DataError and `rota jobs` exited 1 for the whole listing."""
    first = await queue.enqueue("t", {"n": 1})
    bad = await insert_raw(aconn, queue, "t", "'{}'::jsonb",
                           run_after="'10193-01-01 00:00:00+00'::timestamptz")
    last = await queue.enqueue("t", {"n": 2})
    assert first and last
    page = await queue.list_jobs()
    assert [j.id for j in page.jobs] == [last.id, first.id]
    [u] = page.unreadable
    assert u.job_id == bad and list(u.problems) == ["run_after"]
    assert u.problems["run_after"].startswith(
        "DataError: timestamp too large (after year 10K): '10193-01-01")
    with pytest.raises(UnreadableJob, match=f"^job {bad} cannot be read: run_after: "
                                            "DataError: timestamp too large"):
        await queue.get_job(bad)
    assert (await queue.get_job(first.id)) is not None

    listed = await asyncio.to_thread(rota_cli, database_url, queue.schema, "jobs", "--json")
    assert listed.exit_code == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [r["id"] for r in rows] == [last.id, bad, first.id]
    assert rows[1] == {"id": bad, "unreadable": u.problems}
    table = await asyncio.to_thread(rota_cli, database_url, queue.schema, "jobs")
    assert table.exit_code == 0 and "jobs (3 shown)" in table.stdout
    assert "unreadable: run_after: DataError: timestamp too large" in table.stdout
    # An admin action on it still works and answers without failing after writing.
    cancelled = await queue.cancel_job(bad)
    assert cancelled.status == "failed" and isinstance(cancelled.run_after, Unreadable)


# -- a counter or summary the runs row cannot store ----------------------------------------


async def test_counters_past_what_jsonb_holds_saturate_and_the_run_ends(
    queue: Queue, aconn: AConn
) -> None:
    async def handler(ctx: JobContext) -> None:
        ctx.count("huge_float", 1e308)
        ctx.count("huge_float", 1e308)  # inf, which jsonb refuses
        ctx.count("huge_int", 10**5000)  # more digits than JSON encoding allows

    await queue.enqueue("t", {})
    result = await Pipeline(queue, [Stage("t", 1, 1, handler)]).run()
    assert (result.stop_reason, result.jobs_done) == ("no_work", 1)
    assert result.summary == {"huge_float": 1.7976931348623157e308, "huge_int": 2**63 - 1}
    cur = await aconn.execute(sql.SQL("SELECT finished_at IS NOT NULL, summary FROM {} "
                                      "WHERE id = %s").format(queue.table("runs")),
                              [result.run_id])
    done, summary = await cur.fetchone()  # type: ignore[misc]
    assert done is True and summary["huge_int"] == 2**63 - 1
    # jsonb keeps the float as the decimal Python printed; it reads back equal in value.
    assert float(summary["huge_float"]) == 1.7976931348623157e308


async def test_a_counter_name_that_cannot_be_stored_fails_that_job_only(
    queue: Queue
) -> None:
    async def handler(ctx: JobContext) -> None:
        ctx.count("lone \udc80 surrogate" if ctx.job.payload["bad"] else "fine")

    bad = await queue.enqueue("t", {"bad": True})
    assert bad
    await queue.enqueue("t", {"bad": False})
    result = await Pipeline(queue, [Stage("t", 5, 1, handler)]).run()
    assert (result.stop_reason, result.jobs_done) == ("no_work", 1)
    assert result.summary == {"fine": 1, "retries": 1}
    job = await queue.get_job(bad.id)
    assert job is not None and job.last_error is not None
    assert job.last_error.startswith("InvalidInput: counter name")
    assert "lone surrogate" in job.last_error


async def test_summary_names_from_maintenance_are_made_storable(
    queue: Queue, aconn: AConn, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.CRITICAL, logger="rota.runner")

    class Odd:
        name = "odd"

        async def run_once(self) -> dict[str, int]:
            return {"nul\x00name": 1, "lone\ud800": 2}

    async def handler(ctx: JobContext) -> None:
        pass

    result = await Pipeline(queue, [Stage("t", 1, 1, handler)]).run(maintenance=Odd())
    assert result.stop_reason == "no_work"
    cur = await aconn.execute(sql.SQL("SELECT stop_reason, summary FROM {} WHERE id = %s")
                              .format(queue.table("runs")), [result.run_id])
    assert await cur.fetchone() == ("no_work", {"maintenance.nul\\0name": 1,
                                                "maintenance.lone?": 2})


async def test_a_summary_the_row_refuses_still_records_the_end(
    queue: Queue, aconn: AConn, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever the row refuses (here: a summary made unstorable on purpose), the run
    records its end rather than stay unfinished until marked killed."""
    caplog.set_level(logging.CRITICAL, logger="rota.runner")
    from rota.runner import context

    real = context.RunState.save_params

    def unstorable(self: context.RunState) -> dict[str, Any]:
        params = real(self)
        if self.summary != {"summary_unstorable": 1}:
            params["summary"] = '{"n": "\\u0000"}'  # jsonb refuses \u0000
        return params

    monkeypatch.setattr(context.RunState, "save_params", unstorable)

    async def handler(ctx: JobContext) -> None:
        ctx.count("n")

    await queue.enqueue("t", {})
    result = await Pipeline(queue, [Stage("t", 1, 1, handler)]).run(
        time_budget=timedelta(seconds=5))
    assert (result.stop_reason, result.jobs_done, result.error) == ("no_work", 1, None)
    assert result.summary == {"summary_unstorable": 1}
    cur = await aconn.execute(sql.SQL("SELECT stop_reason, finished_at IS NOT NULL, summary "
                                      "FROM {} WHERE id = %s").format(queue.table("runs")),
                              [result.run_id])
    assert await cur.fetchone() == ("no_work", True, {"summary_unstorable": 1})


async def test_a_poison_row_given_up_by_a_claim_then_cut_off_still_counts(
    queue: Queue, aconn: AConn, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture
) -> None:
    """The claim gives a poison row up (committed), then its next statement gets no
    answer (here: the record of a reclaimed job's lost attempt, held in pg_sleep) until
    the run's hard deadline cuts the loop. The row was failed by this run, so the run's
    summary counts it: it was lost with the cut claim (a multi-host chaos run counted 3
    unreadable jobs of 5 failed, two of them by a run cut off from the database)."""
    caplog.set_level(logging.CRITICAL, logger="rota")
    from rota import transitions

    async def no_answer(self: transitions.Transitions, jobs: list[Job],
                        conn: AConn | None) -> None:
        async with self.connect(conn) as c:
            await c.execute("SELECT pg_sleep(60)")

    monkeypatch.setattr(transitions.Transitions, "_record_lost_attempts", no_answer)
    poison = await insert_raw(aconn, queue, "t", POISON["deep-payload"][0])
    retried = await queue.enqueue("t", {"n": 1})
    assert retried is not None
    await aconn.execute(sql.SQL("UPDATE {} SET attempts = 1 WHERE id = %s")
                        .format(queue.table("jobs")), [retried.id])

    async def handler(ctx: JobContext) -> None:
        pass

    # A platform timeout of 4 s: the hard deadline is 3 s in, the cut a quarter of the
    # 1 s settle reserve after it.
    result = await Pipeline(queue, [Stage("t", 10, 1, handler)],
                            platform_timeout=timedelta(seconds=4)).run(
        time_budget=timedelta(seconds=3))
    assert (result.stop_reason, result.jobs_failed, result.summary.get("unreadable")) == (
        "error", 1, 1)
    assert result.error is not None and "RunOverran" in result.error
    assert (await job_row(aconn, queue, poison))["status"] == "failed"
    cur = await aconn.execute(sql.SQL("SELECT summary->'unreadable' FROM {} WHERE id = %s")
                              .format(queue.table("runs")), [result.run_id])
    assert await cur.fetchone() == (1,)
