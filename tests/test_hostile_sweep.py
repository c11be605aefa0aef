"""The bad-input table, swept (tests/test_bad_input.py and tests/test_bad_input_table.py
have the first rows): every public entry point (the API, the CLI, the cron endpoint) is
fed a table of hostile values for every argument. Each is refused with a clear error
(``InvalidInput``; exit 2 and one line; 401/404/405), nothing is written, and nothing
raises anything else (docs/design.md, "Bad input")."""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import httpx
import psycopg
import pytest
from click.testing import CliRunner
from psycopg import sql

from rota import (
    Allowance,
    DeferJob,
    InvalidInput,
    JobContext,
    Maintenance,
    Pipeline,
    PruneDoneJobs,
    Queue,
    Quota,
    Stage,
    SyncQueue,
    Worker,
)
from rota.cli import cli
from rota.web import cron_app

AConn = psycopg.AsyncConnection[Any]

# -- the hostile values, by kind ---------------------------------------------------------------

LOOP: dict[str, Any] = {}
LOOP["self"] = LOOP


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


TEXT = {
    "empty": "", "nul": "a\x00b", "lone-surrogate": "a\ud800", "513-bytes": "é" * 256 + "x",
    "4-byte-chars": "𝄞" * 129, "int": 5, "bytes": b"abc", "bool": True, "list": ["a"],
    "float": 1.5,
}
COUNT = {
    "zero": 0, "negative": -1, "int4-overflow": 2**31, "bool": True, "float": 1.5,
    "str": "3", "nan": math.nan, "none": None, "huge": 10**40,
}
# A stage's batch may be None (the runner sizes the claims); every other bad count is
# refused.
OPTIONAL_COUNT = {k: v for k, v in COUNT.items() if v is not None}
ROW_ID = {"zero": 0, "negative": -5, "int8-overflow": 2**63, "bool": False, "float": 2.0,
          "str": "7", "uuid": uuid.UUID(int=1)}
DUE = {
    "naive": datetime(2030, 1, 1), "year-1": datetime(1, 1, 1, tzinfo=UTC),
    "year-9999-end": datetime(9999, 12, 31, 12, tzinfo=UTC), "str": "2030-01-01T00:00:00Z",
    "date": date(2030, 1, 1), "epoch-int": 1_900_000_000, "float": 1.5e9,
}
DURATION = {
    "zero": timedelta(0), "negative": timedelta(seconds=-1), "2000-years": timedelta(days=730_500),
    "max": timedelta.max, "int-seconds": 60, "float": 1.5, "str": "1 day", "nan": math.nan,
}
SIGNED_DURATION = {k: v for k, v in DURATION.items() if k not in ("zero", "negative")}
PAYLOAD = {
    "deep-973": nested(973), "deep-257": nested(257), "self-reference": LOOP,
    "nan": {"x": math.nan}, "infinity": [math.inf], "decimal-nan": Decimal("NaN"),
    "decimal-1e5000": Decimal("1e5000"), "decimal-1e-20000": Decimal("1e-20000"),
    "int-5000-digits": 10**5000, "set": {1, 2}, "bytes": b"\x00", "nul": "a\x00",
    "surrogate": "\udc80", "surrogate-key": {"\ud800": 1}, "int-key": {1: 2},
    "tuple-key": {(1,): 2}, "date": date(2030, 1, 1), "uuid": uuid.uuid4(), "object": object(),
    "oversize": "x" * (1024 * 1024),
}


def rows(kind: dict[str, Any], *names: str) -> list[Any]:
    return [pytest.param(name, value, id=f"{'/'.join(names)}={name}")
            for name, value in kind.items()]


async def nothing_written(aconn: AConn, schema: str) -> None:
    for table in ("jobs", "runs", "groups", "quota_usage"):
        cur = await aconn.execute(sql.SQL("SELECT count(*) FROM {}.{}")
                                  .format(sql.Identifier(schema), sql.Identifier(table)))
        assert await cur.fetchone() == (0,), table


async def noop(ctx: JobContext) -> None:
    pass


# -- the API -------------------------------------------------------------------------------------

Call = Callable[[Queue, Any], Awaitable[Any] | Any]

API_ARGS: dict[str, tuple[dict[str, Any], Call]] = {
    # enqueue's arguments, one at a time
    "enqueue.type": (TEXT, lambda q, v: q.enqueue(v, {})),
    "enqueue.payload": (PAYLOAD, lambda q, v: q.enqueue("t", v)),
    "enqueue.group_id": (TEXT, lambda q, v: q.enqueue("t", {}, group_id=v)),
    "enqueue.dedupe_key": (TEXT, lambda q, v: q.enqueue("t", {}, dedupe_key=v)),
    "enqueue.run_after": (DUE, lambda q, v: q.enqueue("t", {}, run_after=v)),
    "enqueue.max_attempts": (COUNT, lambda q, v: q.enqueue("t", {}, max_attempts=v)
                             if v is not None else q.enqueue("t", {}, max_attempts=0)),
    "enqueue_many.item.type": (TEXT, lambda q, v: q.enqueue_many(
        [{"type": "t", "payload": {}}, {"type": v, "payload": {}}])),
    "enqueue_many.item.payload": (PAYLOAD, lambda q, v: q.enqueue_many(
        [{"type": "t", "payload": v}])),
    "enqueue_many.item.group_id": (TEXT, lambda q, v: q.enqueue_many(
        [{"type": "t", "payload": {}, "group_id": v}])),
    "enqueue_many.item.dedupe_key": (TEXT, lambda q, v: q.enqueue_many(
        [{"type": "t", "payload": {}, "dedupe_key": v}])),
    "enqueue_many.item.run_after": (DUE, lambda q, v: q.enqueue_many(
        [{"type": "t", "payload": {}, "run_after": v}])),
    "enqueue_many.items": ({"str": "abc", "mapping": {"type": "t"}, "int": 5, "none": None,
                            "bytes": b"x", "list-of-str": ["t"]},
                           lambda q, v: q.enqueue_many(v)),
    # the claim and the transitions
    "claim.type": (TEXT, lambda q, v: q.claim(v, 1)),
    "claim.limit": (COUNT, lambda q, v: q.claim("t", v)),
    "complete.job": ({"none": None, "dict": {"id": 1}, "int": 1},
                     lambda q, v: q.complete(v)),
    "complete_many.jobs": ({"ints": [1], "dicts": [{"id": 1}]},
                           lambda q, v: q.complete_many(v)),
    "fail.job": ({"none": None, "int": 1}, lambda q, v: q.fail(v, "x")),
    "release.jobs": ({"ints": [1]}, lambda q, v: q.release(v)),
    "DeferJob.until": (DUE, lambda q, v: DeferJob(v)),
    # admin operations
    "get_job.job_id": (ROW_ID, lambda q, v: q.retry_job(v)),
    "cancel_job.job_id": (ROW_ID, lambda q, v: q.cancel_job(v)),
    "list_jobs.status": ({"unknown": "bogus", "upper": "PENDING", "int": 1},
                         lambda q, v: q.list_jobs(status=v)),
    "list_jobs.type": (TEXT, lambda q, v: q.list_jobs(type=v)),
    "list_jobs.group_id": (TEXT, lambda q, v: q.list_jobs(group_id=v)),
    "list_jobs.job_id": (ROW_ID, lambda q, v: q.list_jobs(job_id=v)),
    "list_jobs.before_id": (ROW_ID, lambda q, v: q.list_jobs(before_id=v)),
    "list_jobs.limit": ({**COUNT, "1001": 1001, "1000000": 1_000_000},
                        lambda q, v: q.list_jobs(limit=v)),
    "list_runs.limit": ({**COUNT, "1001": 1001}, lambda q, v: q.list_runs(limit=v)),
    "list_runs.before": ({k: v for k, v in DUE.items()
                          if k not in ("year-1", "year-9999-end")},
                         lambda q, v: q.list_runs(before=v)),
    "upsert_group.group_id": (TEXT, lambda q, v: q.upsert_group(v, plan=None)),
    "upsert_group.owner_id": (TEXT, lambda q, v: q.upsert_group("g", plan=None,
                                                                owner_id=v)),
    "upsert_group.plan": ({"unknown": "platinum", "int": 2},
                          lambda q, v: q.upsert_group("g", plan=v)),
    "upsert_group.active": ({"int": 1, "str": "yes", "none": None},
                            lambda q, v: q.upsert_group("g", plan=None, active=v)),
    # settings
    "Queue.stale_after": (DURATION, lambda q, v: Queue(q.pool, stale_after=v)),
    "Queue.served_window": (DURATION, lambda q, v: Queue(q.pool, served_window=v)),
    "Queue.backoff_base": ({k: v for k, v in DURATION.items() if k != "zero"},
                           lambda q, v: Queue(q.pool, backoff_base=v)),
    "Queue.max_backoff": (DURATION, lambda q, v: Queue(q.pool, max_backoff=v)),
    "Queue.max_attempts": (COUNT, lambda q, v: Queue(q.pool, max_attempts=v)),
    "Queue.max_deferrals": ({k: v for k, v in COUNT.items() if k not in ("zero", "none")},
                            lambda q, v: Queue(q.pool, max_deferrals=v)),
    "Queue.max_payload_bytes": (COUNT, lambda q, v: Queue(q.pool, max_payload_bytes=v)),
    "Queue.types": ({"item-" + k: [v] for k, v in TEXT.items()},
                    lambda q, v: Queue(q.pool, types=v)),
    "Queue.schema": ({"injection": "x; drop table jobs", "digit": "1abc", "long": "a" * 64,
                      "quote": 'a"b', "empty": ""}, lambda q, v: Queue(q.pool, schema=v)),
    "Queue.clock_offset": (SIGNED_DURATION, lambda q, v: setattr(q, "clock_offset", v)),
    "Stage.type": (TEXT, lambda q, v: Stage(v, 1, 1, noop)),
    "Stage.batch": (OPTIONAL_COUNT, lambda q, v: Stage("t", v, 1, noop)),
    "Stage.concurrency": (COUNT, lambda q, v: Stage("t", 1, v, noop)),
    "Stage.timeout": (DURATION, lambda q, v: Stage("t", 1, 1, noop, timeout=v)),
    "Stage.quota_cost": (COUNT, lambda q, v: Stage("t", 1, 1, noop, quota_cost=v)),
    "Pipeline.platform_timeout": (DURATION, lambda q, v: Pipeline(
        q, [Stage("t", 1, 1, noop)], platform_timeout=v)),
    "Pipeline.handler_timeout": (DURATION, lambda q, v: Pipeline(
        q, [Stage("t", 1, 1, noop)], handler_timeout=v)),
    "Pipeline.run.time_budget": (DURATION, lambda q, v: Pipeline(
        q, [Stage("t", 1, 1, noop)]).run(time_budget=v)),
    "Pipeline.run.trigger": ({"unknown": "api", "empty": "", "int": 1},
                             lambda q, v: Pipeline(q, [Stage("t", 1, 1, noop)]).run(v)),
    "Quota.name": (TEXT, lambda q, v: Quota(v, 10)),
    "Quota.daily_units": ({**{k: v for k, v in COUNT.items() if k != "int4-overflow"},
                           "int8-overflow": 2**63}, lambda q, v: Quota("api", v)),
    "Quota.reset_tz": ({"unknown": "Mars/Olympus", "empty": "", "path": "../etc/passwd",
                        "int": 1}, lambda q, v: Quota("api", 10, reset_tz=v)),
    "Allowance.limit_key": (TEXT, lambda q, v: Allowance("a", v)),
    "Worker.idle_poll": (DURATION, lambda q, v: Worker(lambda: None, idle_poll=v)),
    "Worker.rescue_every": (DURATION, lambda q, v: Worker(lambda: None, rescue_every=v)),
    "Worker.time_budget": (DURATION, lambda q, v: Worker(lambda: None, time_budget=v)),
    "PruneDoneJobs.runs_retention": (DURATION, lambda q, v: PruneDoneJobs(
        q, runs_retention=v)),
    "Maintenance.platform_timeout": (DURATION, lambda q, v: Maintenance(
        q, platform_timeout=v)),
    "cron_app.time_budget": (DURATION, lambda q, v: cron_app(
        Pipeline(q, [Stage("t", 1, 1, noop)]), secret="s", time_budget=v)),
}

@pytest.mark.parametrize("entry", list(API_ARGS))
async def test_every_api_argument_refuses_hostile_values(
    queue: Queue, aconn: AConn, entry: str
) -> None:
    """Each value of the argument's table: InvalidInput with a one-line message naming
    what was wrong; nothing written. (One test per argument, its values in a loop: a
    schema per test costs more than all the calls.)"""
    kind, call = API_ARGS[entry]
    wrong: dict[str, str] = {}
    for name, value in kind.items():
        try:
            result = call(queue, value)
            if asyncio.iscoroutine(result):
                await result
        except InvalidInput as exc:
            message = str(exc)
            if not message or "\n" in message.strip():
                wrong[name] = f"message {message!r}"
        except Exception as exc:
            wrong[name] = f"raised {type(exc).__name__}: {exc}"
        else:
            wrong[name] = "accepted"
    assert wrong == {}
    await nothing_written(aconn, queue.schema)


async def test_sync_enqueue_refuses_the_same_payloads(
    queue: Queue, aconn: AConn, database_url: str
) -> None:
    def sync() -> list[str]:
        refused = []
        with psycopg.connect(database_url) as conn:
            for name, value in PAYLOAD.items():
                try:
                    SyncQueue(schema=queue.schema).enqueue(conn, "t", value)
                except InvalidInput:
                    refused.append(name)
        return refused

    assert await asyncio.to_thread(sync) == list(PAYLOAD)
    await nothing_written(aconn, queue.schema)


async def test_a_handlers_counters_refuse_hostile_names_and_values(
    queue: Queue, aconn: AConn
) -> None:
    refused: list[str] = []

    async def handler(ctx: JobContext) -> None:
        for name, value in TEXT.items():
            try:
                ctx.count(value)
            except InvalidInput:
                refused.append(f"name={name}")
        for name, n in {"nan": math.nan, "inf": math.inf, "str": "1", "bool": True,
                        "none": None, "decimal": Decimal(1)}.items():
            try:
                ctx.count("c", n)
            except InvalidInput:
                refused.append(f"n={name}")

    await queue.enqueue("t", {})
    result = await Pipeline(queue, [Stage("t", 1, 1, handler)]).run()
    assert (result.stop_reason, result.jobs_done, result.summary) == ("no_work", 1, {})
    assert refused == [*(f"name={k}" for k in TEXT),
                       "n=nan", "n=inf", "n=str", "n=bool", "n=none", "n=decimal"]


# -- the CLI ---------------------------------------------------------------------------------------

APP = "tests.cli_app:build_pipeline"

CLI_CASES: dict[str, list[str]] = {
    # enqueue: each argument
    "enqueue TYPE=empty": ["enqueue", "", "{}"],
    "enqueue TYPE=nul": ["enqueue", "a\x00b", "{}"],
    "enqueue TYPE=surrogate": ["enqueue", "a\udc80", "{}"],
    "enqueue TYPE=513-bytes": ["enqueue", "é" * 256 + "x", "{}"],
    "enqueue PAYLOAD=empty": ["enqueue", "t", ""],
    "enqueue PAYLOAD=truncated": ["enqueue", "t", '{"a": '],
    "enqueue PAYLOAD=nan": ["enqueue", "t", "NaN"],
    "enqueue PAYLOAD=deep-973": ["enqueue", "t", "[" * 973 + "]" * 973],
    "enqueue PAYLOAD=deep-100000": ["enqueue", "t", "[" * 100_000 + "]" * 100_000],
    "enqueue PAYLOAD=1e99999": ["enqueue", "t", "1e99999"],
    "enqueue PAYLOAD=5000-digits": ["enqueue", "t", "9" * 5000],
    "enqueue PAYLOAD=nul": ["enqueue", "t", '"\\u0000"'],
    "enqueue PAYLOAD=surrogate": ["enqueue", "t", '"\\ud800"'],
    "enqueue PAYLOAD=missing-file": ["enqueue", "t", "@/nonexistent/payload.json"],
    "enqueue PAYLOAD=oversize": ["enqueue", "t", '"' + "x" * (1024 * 1024) + '"'],
    "enqueue --group=empty": ["enqueue", "t", "{}", "--group", ""],
    "enqueue --group=surrogate": ["enqueue", "t", "{}", "--group", "\udcff"],
    "enqueue --group=4-byte-chars": ["enqueue", "t", "{}", "--group", "𝄞" * 129],
    "enqueue --dedupe-key=nul": ["enqueue", "t", "{}", "--dedupe-key", "k\x00"],
    "enqueue --dedupe-key=513-bytes": ["enqueue", "t", "{}", "--dedupe-key", "é" * 257],
    "enqueue --run-after=words": ["enqueue", "t", "{}", "--run-after", "tomorrow"],
    "enqueue --run-after=naive": ["enqueue", "t", "{}", "--run-after", "2030-01-01T00:00:00"],
    "enqueue --run-after=year-1": ["enqueue", "t", "{}", "--run-after",
                                   "0001-01-01T00:00:00+00:00"],
    "enqueue --run-after=year-9999": ["enqueue", "t", "{}", "--run-after",
                                      "9999-12-31T23:00:00+00:00"],
    "enqueue --max-attempts=0": ["enqueue", "t", "{}", "--max-attempts", "0"],
    "enqueue --max-attempts=int4-overflow": ["enqueue", "t", "{}", "--max-attempts",
                                             str(2**31)],
    "enqueue --max-attempts=float": ["enqueue", "t", "{}", "--max-attempts", "1.5"],
    # jobs: each filter
    "jobs --limit=0": ["jobs", "--limit", "0"],
    "jobs --limit=1000000": ["jobs", "--limit", "1000000", "--json"],
    "jobs --before=0": ["jobs", "--before", "0"],
    "jobs --before=int8-overflow": ["jobs", "--before", str(2**63)],
    "jobs --id=word": ["jobs", "--id", "seven"],
    "jobs --id=int8-overflow": ["jobs", "--id", str(2**64)],
    "jobs --status=unknown": ["jobs", "--status", "bogus"],
    "jobs --type=surrogate": ["jobs", "--type", "\udc80"],
    "jobs --group=513-bytes": ["jobs", "--group", "é" * 257],
    "jobs failed --limit=1001": ["jobs", "failed", "--limit", "1001"],
    "jobs retry ID=0": ["jobs", "retry", "0"],
    "jobs retry ID=int8-overflow": ["jobs", "retry", str(2**63)],
    "jobs cancel ID=word": ["jobs", "cancel", "x"],
    "runs -n=0": ["runs", "-n", "0"],
    "runs -n=1001": ["runs", "-n", "1001"],
    # running: budgets and intervals
    "run --budget=0": ["run", "--app", APP, "--budget", "0"],
    "run --budget=nan": ["run", "--app", APP, "--budget", "nan"],
    "run --budget=300": ["run", "--app", APP, "--budget", "300"],
    "run --budget=1e308": ["run", "--app", APP, "--budget", "1e308"],
    "worker --idle-poll=-1": ["worker", "--app", APP, "--idle-poll", "-1"],
    "worker --budget=inf": ["worker", "--app", APP, "--budget", "inf"],
    "serve --port=65536": ["serve", "--app", APP, "--port", "65536"],
    "serve --budget=word": ["serve", "--app", APP, "--budget", "soon"],
    # the target
    "--schema=injection": ["jobs", "--schema", "x; drop table jobs"],
    "--schema=digit": ["jobs", "--schema", "1bad"],
    "--schema=64-chars": ["jobs", "--schema", "s" * 64],
    "--app=malformed": ["run", "--app", "no-colon"],
    "--app=missing": ["run", "--app", "no_such_module_x:build"],
    "--database-url=other": ["jobs", "--database-url", "mysql://root@localhost/db"],
    "--database-url=bad-option": ["jobs", "--database-url",
                                  "postgresql://x@127.0.0.1/db?sslmode=bogus"],
}


@pytest.mark.parametrize("args", [pytest.param(v, id=k) for k, v in CLI_CASES.items()])
def test_every_cli_argument_refuses_hostile_values(
    database_url: str, migrated: str, args: list[str]
) -> None:
    result = CliRunner().invoke(cli, args, catch_exceptions=False, env={
        "DATABASE_URL": database_url, "ROTA_SCHEMA": migrated, "ROTA_APP": None,
        "COLUMNS": "250"})
    assert (result.exit_code, result.stdout) == (2, ""), (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and result.stderr.strip()
    with psycopg.connect(database_url) as conn:
        for table in ("jobs", "runs"):
            n = conn.execute(sql.SQL("SELECT count(*) FROM {}.{}").format(
                sql.Identifier(migrated), sql.Identifier(table))).fetchone()
            assert n == (0,), table


# -- the cron endpoint -----------------------------------------------------------------------

SECRET = "sweep-S3cret_value-0123"

CRON_CASES: dict[str, tuple[str, str, dict[str, Any], int]] = {
    # method, path, headers, expected status
    "no-header": ("GET", "/api/cron", {}, 401),
    "empty": ("GET", "/api/cron", {"Authorization": ""}, 401),
    "scheme-only": ("GET", "/api/cron", {"Authorization": "Bearer"}, 401),
    "basic": ("GET", "/api/cron", {"Authorization": f"Basic {SECRET}"}, 401),
    "prefix": ("GET", "/api/cron", {"Authorization": f"Bearer {SECRET[:-1]}"}, 401),
    "suffix": ("GET", "/api/cron", {"Authorization": f"Bearer {SECRET}0"}, 401),
    "doubled": ("GET", "/api/cron", {"Authorization": f"Bearer {SECRET}{SECRET}"}, 401),
    "64-kib-token": ("GET", "/api/cron", {"Authorization": "Bearer " + "a" * 65536}, 401),
    "utf8-token": ("GET", "/api/cron", {"Authorization": "Bearer é€😀".encode()}, 401),
    "latin1-token": ("GET", "/api/cron", {"Authorization": "Bearer \xe9".encode("latin-1")},
                     401),
    "control-chars": ("GET", "/api/cron", {"Authorization": "Bearer \x7f\x01"}, 401),
    "undefined": ("GET", "/api/cron", {"Authorization": "Bearer undefined"}, 401),
    "in-query": ("GET", f"/api/cron?token={SECRET}&budget=1e308", {}, 401),
    "in-cookie": ("GET", "/api/cron", {"Cookie": f"token={SECRET}"}, 401),
    "post": ("POST", "/api/cron", {"Authorization": f"Bearer {SECRET}"}, 405),
    "put": ("PUT", "/api/cron", {"Authorization": f"Bearer {SECRET}"}, 405),
    "delete": ("DELETE", "/api/cron", {"Authorization": f"Bearer {SECRET}"}, 405),
    "head": ("HEAD", "/api/cron", {"Authorization": f"Bearer {SECRET}"}, 405),
    "options": ("OPTIONS", "/api/cron", {"Authorization": f"Bearer {SECRET}"}, 405),
    # Starlette redirects to /api/cron, which still needs the secret.
    "trailing-slash": ("GET", "/api/cron/", {}, 307),
    "upper-case-path": ("GET", "/API/CRON", {"Authorization": f"Bearer {SECRET}"}, 404),
    "encoded-nul": ("GET", "/api/cron%00", {"Authorization": f"Bearer {SECRET}"}, 404),
    "dot-segments": ("GET", "/api/../api/cron/x", {"Authorization": f"Bearer {SECRET}"},
                     404),
}


async def test_the_cron_endpoint_refuses_hostile_requests_and_runs_nothing(
    queue: Queue, aconn: AConn
) -> None:
    await queue.enqueue("t", {})
    app = cron_app(Pipeline(queue, [Stage("t", 1, 1, noop)]), secret=SECRET,
                   time_budget=timedelta(seconds=5))
    got: dict[str, int] = {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://cron") as client:
        for case, (method, path, headers, _) in CRON_CASES.items():
            r = await client.request(method, path, headers=headers)
            assert SECRET not in r.text, case
            got[case] = r.status_code
    assert got == {case: status for case, (_, _, _, status) in CRON_CASES.items()}
    cur = await aconn.execute(sql.SQL("SELECT (SELECT count(*) FROM {}), "
                                      "(SELECT count(*) FROM {} WHERE status <> 'pending')")
                              .format(queue.table("runs"), queue.table("jobs")))
    assert await cur.fetchone() == (0, 0)
