"""The cron endpoint: only the right bearer secret runs the pipeline; everything else is
refused without running anything, and the secret never comes back."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import sql

from rota import Queue
from rota.web import bearer_matches, cron_app
from tests.cli_app import build_pipeline

SECRET = "s3cret-Value_0123456789"


def client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://cron")


async def run_count(aconn: psycopg.AsyncConnection[Any], schema: str) -> int:
    cur = await aconn.execute(sql.SQL("SELECT count(*) FROM {}.runs").format(
        sql.Identifier(schema)))
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
async def queue(make_queue: Any) -> Queue:
    q: Queue = await make_queue(**build_pipeline.queue_settings)  # type: ignore[attr-defined]
    return q


@pytest.mark.parametrize("secret, header", [
    (SECRET, None),                                   # missing header
    (SECRET, "Bearer wrong-secret"),                  # wrong secret
    (SECRET, f"Bearer {SECRET}x"),                    # right prefix, longer
    (SECRET, f"Bearer {SECRET[:-1]}"),                # right prefix, shorter
    (SECRET, "Bearer "),                              # blank token
    (SECRET, "Bearer"),                               # scheme only
    (SECRET, "Bearer undefined"),
    (SECRET, "Bearer null"),
    (SECRET, f"Basic {SECRET}"),                      # wrong scheme
    (SECRET, SECRET),                                 # no scheme
    ("", "Bearer "),                                  # blank secret configured
    ("   ", "Bearer    "),
    (None, "Bearer None"),                            # no secret configured
    (None, "Bearer "),
    ("undefined", "Bearer undefined"),                # a placeholder is no secret
    ("null", "Bearer null"),
])
async def test_cron_refuses_without_the_right_secret(
    queue: Queue, aconn: psycopg.AsyncConnection[Any], schema: str,
    secret: str | None, header: str | None,
) -> None:
    await queue.enqueue("echo", {"n": 1})
    headers = {} if header is None else {"Authorization": header}
    async with client(cron_app(build_pipeline(queue), secret=secret)) as c:
        r = await c.get("/api/cron", headers=headers)
    assert r.status_code == 401
    assert r.json() == {"error": "unauthorized"}
    assert r.headers["www-authenticate"] == 'Bearer realm="rota"'
    assert await run_count(aconn, schema) == 0
    job = await queue.get_job(1)
    assert job is not None and job.status == "pending" and job.attempts == 0


async def test_cron_runs_the_pipeline_with_the_right_secret(
    queue: Queue, aconn: psycopg.AsyncConnection[Any], schema: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    pipeline = build_pipeline(queue)
    for n in range(3):
        await queue.enqueue("echo", {"n": n})
    # Through the pipeline's queue: boom's stage gives it max_attempts=1.
    await pipeline.queue.enqueue("boom", {"why": "test"})
    app = cron_app(pipeline, secret=f"  {SECRET}\n", time_budget=timedelta(seconds=30))
    async with client(app) as c:
        r = await c.get("/api/cron", headers={"Authorization": f"Bearer {SECRET}"})
        lower = await c.get("/api/cron", headers={"authorization": f"bearer  {SECRET} "})
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {"runId", "stopReason", "jobsDone", "jobsFailed", "units"}
    assert (body["stopReason"], body["jobsDone"], body["jobsFailed"], body["units"]) == (
        "no_work", 3, 1, 0)
    cur = await aconn.execute(sql.SQL(
        "SELECT id, trigger, stop_reason, jobs_done, jobs_failed FROM {}.runs "
        "ORDER BY started_at").format(sql.Identifier(schema)))
    rows = await cur.fetchall()
    assert rows[0] == (uuid.UUID(body["runId"]), "cron", "no_work", 3, 1)
    # The scheme is case-insensitive and surrounding blanks are ignored.
    assert lower.status_code == 200
    assert lower.json()["stopReason"] == "no_work" and lower.json()["jobsDone"] == 0
    assert len(rows) == 2
    assert SECRET not in r.text and SECRET not in str(r.headers)
    assert all(SECRET not in rec.getMessage() for rec in caplog.records)


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"])
async def test_cron_other_methods_get_405(
    queue: Queue, aconn: psycopg.AsyncConnection[Any], schema: str, method: str,
) -> None:
    async with client(cron_app(build_pipeline(queue), secret=SECRET)) as c:
        r = await c.request(method, "/api/cron", headers={"Authorization": f"Bearer {SECRET}"})
    assert r.status_code == 405
    assert r.headers["allow"] == "GET"
    assert await run_count(aconn, schema) == 0


async def test_cron_takes_a_pipeline_factory_called_per_request(queue: Queue) -> None:
    made: list[Any] = []

    async def factory() -> Any:
        made.append(build_pipeline(queue))
        return made[-1]

    async with client(cron_app(factory, secret=SECRET)) as c:
        for _ in range(2):
            r = await c.get("/api/cron", headers={"Authorization": f"Bearer {SECRET}"})
            assert r.status_code == 200 and r.json()["stopReason"] == "no_work"
    assert len(made) == 2 and made[0] is not made[1]


@dataclass
class FakeResult:
    stop_reason: str
    error: str | None = None
    run_id: uuid.UUID = field(default_factory=uuid.uuid4)
    jobs_done: int = 0
    jobs_failed: int = 0
    jobs_deferred: int = 0
    quota_units: int = 7
    summary: dict[str, Any] = field(default_factory=dict)


class FakePipeline:
    def __init__(self, result: FakeResult | Exception) -> None:
        self.result = result
        self.calls: list[tuple[str, timedelta]] = []

    async def run(self, *, trigger: str, time_budget: timedelta) -> FakeResult:
        self.calls.append((trigger, time_budget))
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


async def test_a_run_that_stops_with_error_answers_500_with_the_same_fields() -> None:
    result = FakeResult("error", "RuntimeError: the database refused a write")
    fake = FakePipeline(result)
    async with client(cron_app(fake, secret=SECRET, time_budget=timedelta(seconds=9))) as c:
        r = await c.get("/api/cron", headers={"Authorization": f"Bearer {SECRET}"})
    assert r.status_code == 500
    assert r.json() == {"runId": str(result.run_id), "stopReason": "error", "jobsDone": 0,
                        "jobsFailed": 0, "units": 7}
    assert fake.calls == [("cron", timedelta(seconds=9))]


async def test_a_run_that_cannot_start_answers_503_naming_only_the_error_type() -> None:
    fake = FakePipeline(psycopg.OperationalError(f"password {SECRET} rejected"))
    async with client(cron_app(fake, secret=SECRET)) as c:
        r = await c.get("/api/cron", headers={"Authorization": f"Bearer {SECRET}"})
    assert r.status_code == 503
    assert r.json() == {"error": "run failed: OperationalError"}


async def test_healthz_needs_no_secret_and_no_database() -> None:
    async with client(cron_app(FakePipeline(FakeResult("no_work")), secret=None)) as c:
        r = await c.get("/healthz")
        post = await c.post("/healthz")
    assert (r.status_code, r.json()) == (200, {"status": "ok"})
    assert post.status_code == 405


def test_bearer_matches_only_the_exact_secret() -> None:
    assert bearer_matches(f"Bearer {SECRET}", SECRET) is True
    assert bearer_matches(f"BEARER {SECRET}", SECRET) is True
    assert bearer_matches(f"Bearer {SECRET.upper()}", SECRET) is False
    assert bearer_matches("Bearer ünïcode", "ünïcode") is True
    assert bearer_matches("Bearer undefined", "undefined") is False
    assert bearer_matches("Bearer ", None) is False
    assert bearer_matches(None, SECRET) is False
    assert bearer_matches(f"Bearer {SECRET} extra", SECRET) is False


def test_a_budget_not_below_the_platform_timeout_is_refused_when_the_app_is_built(
    queue: Queue,
) -> None:
    from rota import ConfigError

    with pytest.raises(ConfigError, match=r"time_budget \(300 seconds\) must be shorter"):
        cron_app(build_pipeline(queue), secret=SECRET, time_budget=timedelta(seconds=300))
    # A factory is only called per request, so it cannot be checked here.
    cron_app(lambda: build_pipeline(queue), secret=SECRET, time_budget=timedelta(seconds=300))
    cron_app(build_pipeline(queue), secret=SECRET, time_budget=timedelta(seconds=299))
