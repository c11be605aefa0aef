"""The cron endpoint's security, beyond tests/test_web.py: with no usable secret
configured, the placeholder tokens a misconfigured client sends (``Bearer undefined``,
``Bearer null``) are refused too; the token is only ever read from the Authorization
header; the comparison is constant-time; and the secret appears in no response and no
log record, refused or not."""

from __future__ import annotations

import ast
import inspect
import logging
import textwrap
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import sql

from rota import Queue
from rota.web import bearer_matches, cron_app
from tests.cli_app import build_pipeline

SECRET = "cr0n-S3cret_for-tests_7f3a"


def client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://cron")


@pytest.fixture
async def queue(make_queue: Any) -> Queue:
    q: Queue = await make_queue(**build_pipeline.queue_settings)  # type: ignore[attr-defined]
    await q.enqueue("echo", {"n": 1})
    return q


async def nothing_ran(aconn: psycopg.AsyncConnection[Any], queue: Queue) -> bool:
    cur = await aconn.execute(sql.SQL("SELECT (SELECT count(*) FROM {}) = 0 AND "
                                      "(SELECT count(*) FROM {} WHERE status <> 'pending') = 0")
                              .format(queue.table("runs"), queue.table("jobs")))
    row = await cur.fetchone()
    return bool(row and row[0])


def all_logged(caplog: pytest.LogCaptureFixture) -> str:
    """Every server-side log record as it would be written, exception included (the
    test's own HTTP client, httpx, logs the URL it requested: not the server's)."""
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    return "\n".join(formatter.format(r) for r in caplog.records
                     if not r.name.startswith(("httpx", "httpcore")))


@pytest.mark.parametrize("configured", [None, "", "   ", "undefined", "null", "None"])
@pytest.mark.parametrize("header", ["Bearer undefined", "Bearer null", "Bearer None",
                                    "Bearer none", "Bearer ", "bearer undefined", ""])
async def test_no_usable_secret_refuses_the_placeholder_tokens(
    queue: Queue, aconn: psycopg.AsyncConnection[Any], configured: str | None, header: str
) -> None:
    async with client(cron_app(build_pipeline(queue), secret=configured)) as c:
        r = await c.get("/api/cron", headers={"Authorization": header} if header else {})
    assert (r.status_code, r.json()) == (401, {"error": "unauthorized"})
    assert await nothing_ran(aconn, queue)


async def test_no_usable_secret_is_warned_about_when_the_app_is_built(
    queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="rota.web")
    cron_app(build_pipeline(queue), secret="undefined")
    assert [r.getMessage() for r in caplog.records] == [
        "no usable cron secret is configured: /api/cron refuses every request"]


@pytest.mark.parametrize(("path", "headers"), [
    (f"/api/cron?secret={SECRET}", {}),
    (f"/api/cron?token={SECRET}", {}),
    (f"/api/cron?access_token={SECRET}", {}),
    ("/api/cron", {"Cookie": f"CRON_SECRET={SECRET}"}),
    ("/api/cron", {"X-Cron-Secret": SECRET}),
    ("/api/cron", {"Proxy-Authorization": f"Bearer {SECRET}"}),
    ("/api/cron", {"Authorization": f"Token {SECRET}"}),
    ("/api/cron", {"Authorization": f"Bearer {SECRET.upper()}"}),
    ("/api/cron", {"Authorization": f"Bearer {SECRET} {SECRET}"}),
    ("/api/cron", {"Authorization": "Bearer " + "x" * 65536}),
], ids=["query-secret", "query-token", "query-access-token", "cookie", "custom-header",
        "proxy-authorization", "token-scheme", "wrong-case", "repeated", "64k-token"])
async def test_the_secret_anywhere_but_the_authorization_header_is_refused(
    queue: Queue, aconn: psycopg.AsyncConnection[Any], caplog: pytest.LogCaptureFixture,
    path: str, headers: dict[str, str],
) -> None:
    caplog.set_level(logging.DEBUG)
    async with client(cron_app(build_pipeline(queue), secret=SECRET)) as c:
        r = await c.get(path, headers=headers)
    assert (r.status_code, r.json()) == (401, {"error": "unauthorized"})
    assert SECRET not in r.text and SECRET not in str(r.headers)
    assert SECRET not in all_logged(caplog)
    assert await nothing_ran(aconn, queue)


async def test_the_secret_is_in_no_log_record_or_response_of_a_run(
    queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with client(cron_app(build_pipeline(queue), secret=SECRET)) as c:
        ok = await c.get("/api/cron", headers={"Authorization": f"Bearer {SECRET}"})
        post = await c.post("/api/cron", headers={"Authorization": f"Bearer {SECRET}"})
    assert ok.status_code == 200 and ok.json()["jobsDone"] == 1
    assert post.status_code == 405
    for r in (ok, post):
        assert SECRET not in r.text and SECRET not in str(r.headers)
    assert caplog.records  # the run and the refusal were logged, without the secret
    assert SECRET not in all_logged(caplog)


def test_the_token_is_compared_in_constant_time_only() -> None:
    """bearer_matches compares the token with hmac.compare_digest and nowhere else with
    == (an early-exit comparison leaks, by its timing, how much of a guess was right)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(bearer_matches)))
    digests = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
               and isinstance(n.func, ast.Attribute) and n.func.attr == "compare_digest"]
    assert len(digests) == 1
    secret_names = {"token", "expected", "secret"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(isinstance(op, ast.Eq | ast.NotEq)
                                                 for op in node.ops):
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            assert not names & secret_names, ast.unparse(node)
    assert bearer_matches(f"Bearer {SECRET}", SECRET) is True
    assert bearer_matches(f"Bearer {SECRET[:-1]}!", SECRET) is False


@pytest.mark.parametrize("values", [
    [f"Bearer {SECRET}", "Bearer wrong"],
    ["Bearer wrong", f"Bearer {SECRET}"],
    [f"Bearer {SECRET}", f"Bearer {SECRET}"],
    [f"Bearer {SECRET}", ""],
], ids=["right-then-wrong", "wrong-then-right", "right-twice", "right-then-empty"])
async def test_more_than_one_authorization_header_is_refused(
    queue: Queue, aconn: psycopg.AsyncConnection[Any], caplog: pytest.LogCaptureFixture,
    values: list[str],
) -> None:
    """Exactly one credential: a proxy or framework in front may read another of the
    headers than the endpoint does, so two are refused, whatever they hold."""
    caplog.set_level(logging.DEBUG)
    async with client(cron_app(build_pipeline(queue), secret=SECRET)) as c:
        r = await c.get("/api/cron", headers=[("Authorization", v) for v in values])
    assert (r.status_code, r.json()) == (400, {"error": "more than one Authorization header"})
    assert SECRET not in r.text and SECRET not in all_logged(caplog)
    assert await nothing_ran(aconn, queue)


async def test_two_credentials_folded_into_one_header_are_refused(
    queue: Queue, aconn: psycopg.AsyncConnection[Any]
) -> None:
    """A proxy may fold repeated headers into one, comma-separated: not a credential."""
    async with client(cron_app(build_pipeline(queue), secret=SECRET)) as c:
        r = await c.get("/api/cron", headers={"Authorization": f"Bearer {SECRET}, Bearer x"})
    assert (r.status_code, r.json()) == (401, {"error": "unauthorized"})
    assert await nothing_ran(aconn, queue)
