"""Prometheus metrics: the exposition parsed with prometheus_client's own parser, with
exact values, before and after jobs finish; counters add each scrape's interval once;
claims are timed through Queue.claim_observers; group ids never become label values;
each app has its own registry; `rota serve --metrics` needs the credential."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import httpx
import psycopg
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql

from rota import ConfigError, Queue, Quota, cron_app, dashboard_app
from rota.cli import cli
from rota.web.metrics import MetricsEndpoint, mount_metrics

SECRET = "metrics-S3cret_for_tests"
YT = Quota("youtube", 10_000, reserve=1_000, reset_tz="America/Los_Angeles")


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample, keyed by name and sorted labels."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name, tuple(sorted(s.labels.items()))] = s.value
    return out


def only(values: dict[Any, float], prefix: str) -> dict[Any, float]:
    return {k: v for k, v in values.items() if k[0].startswith(prefix)}


async def scrape(app: Any) -> dict[Any, float]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://127.0.0.1",
                                 headers={"Authorization": f"Bearer {SECRET}"}) as c:
        r = await c.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=")
    return samples(r.text)


async def test_gauges_and_counters_have_exact_values(queue: Queue) -> None:
    await queue.upsert_group("g-pro", plan="pro")
    await queue.upsert_group("g-free", plan="free")
    await queue.upsert_group("g-paused", plan="free", active=False)
    for gid in ("g-pro", "g-pro", "g-pro", "g-free"):
        await queue.enqueue("search", {}, group_id=gid)
    await queue.enqueue("search", {}, group_id="g-paused")
    await queue.enqueue("search", {}, run_after=await queue.now() + timedelta(hours=1))
    await queue.enqueue("draft", {}, group_id="g-free", max_attempts=1)
    await YT.spend(queue, 2_500)
    async with queue.connection() as c:  # two finished runs and one still running
        await c.execute(sql.SQL(
            "INSERT INTO {} (id, trigger, stop_reason, started_at, finished_at) VALUES "
            "(gen_random_uuid(), 'cron', 'no_work', now(), now()),"
            "(gen_random_uuid(), 'cron', 'error', now(), now()),"
            "(gen_random_uuid(), 'cron', NULL, now(), NULL)").format(queue.table("runs")))
    app = dashboard_app(queue, secret=SECRET, quotas=[YT])

    first = await scrape(app)
    assert only(first, "rota_jobs") == {
        ("rota_jobs", (("status", "failed"), ("type", "draft"))): 0,
        ("rota_jobs", (("status", "pending"), ("type", "draft"))): 1,
        ("rota_jobs", (("status", "running"), ("type", "draft"))): 0,
        ("rota_jobs", (("status", "failed"), ("type", "search"))): 0,
        ("rota_jobs", (("status", "pending"), ("type", "search"))): 6,
        ("rota_jobs", (("status", "running"), ("type", "search"))): 0,
    }
    assert only(first, "rota_runs") == {
        ("rota_runs_total", (("stop_reason", "error"),)): 1,
        ("rota_runs_total", (("stop_reason", "no_work"),)): 1,
    }
    assert only(first, "rota_quota") == {
        ("rota_quota_units_used", (("quota", "youtube"),)): 2_500,
        ("rota_quota_units_remaining", (("quota", "youtube"),)): 7_500,
        ("rota_quota_units_limit", (("quota", "youtube"),)): 10_000,
    }
    ages = only(first, "rota_oldest_pending_age_seconds")
    assert set(ages) == {("rota_oldest_pending_age_seconds", (("type", "draft"),)),
                         ("rota_oldest_pending_age_seconds", (("type", "search"),))}
    assert all(0 <= v < 60 for v in ages.values())

    # 3 done (2 pro, 1 free), 1 failed for good (free).
    jobs = await queue.claim("search", 3)
    assert len(jobs) == 3
    for j in jobs:
        assert await queue.complete(j, cost=2.5)  # docs/design.md, "Cost"
    [d] = await queue.claim("draft", 1)
    assert await queue.fail(d, "boom") == "failed"
    plans = {j.group_id: 0 for j in jobs}
    for j in jobs:
        plans[j.group_id] += 1
    queue.clock_offset = timedelta(seconds=10)  # past the counters' settle window
    second = await scrape(app)
    want_done = {("rota_jobs_completed_total",
                  (("plan", {"g-pro": "pro", "g-free": "free"}[g]), ("type", "search"))): n
                 for g, n in plans.items()}
    assert only(second, "rota_jobs_completed") == want_done
    assert only(second, "rota_jobs_cost") == {
        ("rota_jobs_cost_charged_total", labels): n * 2.5
        for (_, labels), n in want_done.items()}
    assert only(second, "rota_jobs_failed") == {
        ("rota_jobs_failed_total", (("plan", "free"), ("type", "draft"))): 1}
    assert second["rota_jobs", (("status", "failed"), ("type", "draft"))] == 1
    assert second["rota_jobs", (("status", "pending"), ("type", "search"))] == 3
    # A scrape adds only what finished since the last one.
    queue.clock_offset = timedelta(seconds=20)
    third = await scrape(app)
    assert only(third, "rota_jobs_completed") == want_done
    assert only(third, "rota_jobs_failed") == only(second, "rota_jobs_failed")


async def test_claims_are_timed_per_type_and_groups_are_never_labels(queue: Queue) -> None:
    groups = [f"tenant-{i}" for i in range(5)]
    for g in groups:
        await queue.upsert_group(g, plan="standard")
        await queue.enqueue("search", {}, group_id=g)
    endpoint = MetricsEndpoint(queue)
    for _ in range(3):
        await queue.claim("search", 1)
    await queue.claim("other", 1)
    values = samples((await endpoint.render()).decode())
    assert values["rota_claim_duration_seconds_count", (("type", "search"),)] == 3
    assert values["rota_claim_duration_seconds_count", (("type", "other"),)] == 1
    assert values["rota_claim_duration_seconds_bucket", (("le", "+Inf"), ("type", "search"))] == 3
    assert 0 < values["rota_claim_duration_seconds_sum", (("type", "search"),)] < 30
    labels = {v for _, lbls in values for _, v in lbls}
    assert not labels & set(groups)
    endpoint.close()
    await queue.claim("search", 1)
    assert samples((await endpoint.render()).decode())[
        "rota_claim_duration_seconds_count", (("type", "search"),)] == 3


async def test_a_transaction_held_open_shows_as_the_xmin_horizons_age(
    queue: Queue, database_url: str
) -> None:
    """A REPEATABLE READ transaction that has read holds the horizon: after 1.1 s and
    five transactions committed elsewhere, the gauges say at least that. (The database
    is shared with other tests, whose transactions can only make them larger.)"""
    endpoint = MetricsEndpoint(queue)
    async with (await psycopg.AsyncConnection.connect(database_url) as holder,
                await psycopg.AsyncConnection.connect(database_url, autocommit=True) as other):
        await holder.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
        await holder.execute(sql.SQL("SELECT count(*) FROM {}").format(queue.table("jobs")))
        for _ in range(5):  # each its own transaction, each given an xid
            await other.execute("SELECT txid_current()")
        await asyncio.sleep(1.1)
        held = samples((await endpoint.render()).decode())
        await holder.rollback()
    endpoint.close()
    assert held["rota_oldest_xmin_age_seconds", ()] >= 1.1
    assert held["rota_oldest_xmin_age_transactions", ()] >= 5


async def test_each_app_has_its_own_registry(queue: Queue) -> None:
    a, b = MetricsEndpoint(queue), MetricsEndpoint(queue)
    assert a.registry is not b.registry
    await queue.claim("search", 1)
    for e in (a, b):
        text = (await e.render()).decode()
        assert samples(text)["rota_claim_duration_seconds_count", (("type", "search"),)] == 1
        e.close()
    assert queue.claim_observers == []


async def test_serve_metrics_needs_the_credential(queue: Queue) -> None:
    with pytest.raises(ConfigError):
        mount_metrics(cron_app(lambda: None, secret="x"), queue, secret=None, host="0.0.0.0")
    app = cron_app(lambda: None, secret="cron")
    mount_metrics(app, queue, secret=SECRET, host="0.0.0.0")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        assert (await c.get("/metrics")).status_code == 401
        assert (await c.get("/metrics", headers={"Authorization": "Bearer cron"})
                ).status_code == 401
        two = [("Authorization", f"Bearer {SECRET}")] * 2
        assert (await c.get("/metrics", headers=two)).status_code == 400
        ok = await c.get("/metrics", headers={"Authorization": f"Bearer {SECRET}"})
        assert ok.status_code == 200 and "rota_claim_duration_seconds" in ok.text
    loopback = cron_app(lambda: None, secret="cron")
    mount_metrics(loopback, queue, secret=None, host="127.0.0.1")
    transport = httpx.ASGITransport(app=loopback)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        assert (await c.get("/metrics")).status_code == 200
    async with httpx.AsyncClient(transport=transport, base_url="http://10.1.2.3") as c:
        assert (await c.get("/metrics")).status_code == 403


def test_rota_serve_metrics_refuses_to_start_without_a_credential_off_loopback(
        database_url: str, migrated: str) -> None:
    env = {"DATABASE_URL": database_url, "ROTA_SCHEMA": migrated, "CRON_SECRET": "cron",
           "ROTA_DASHBOARD_SECRET": ""}
    result = CliRunner().invoke(cli, ["serve", "--app", "tests.cli_app:build_pipeline",
                                      "--host", "0.0.0.0", "--metrics"], env=env)
    assert result.exit_code == 2, result.output
    assert "--metrics needs ROTA_DASHBOARD_SECRET" in result.output
