"""A queue holding jobs in every state, for the dashboard's HTTP and browser tests:
due, later and paused pending jobs, running, done (an hour of them, waits by plan)
and failed jobs, runs of every stop reason, quota usage, and hostile text (``<script>``,
an ``onerror`` image) in a payload, an error, a group id and a run's error."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from psycopg import sql

from rota import Quota
from rota.queue import Queue

YOUTUBE = Quota("youtube", 10_000, reserve=1_000, reset_tz="America/Los_Angeles")
SCRIPT = "<script>window.__pwned = 1</script>"
IMG = '<img src=x onerror="window.__pwned = 2">'
EVIL_GROUP = f"evil{IMG}"

# Done jobs over the last hour with waits (due to done) by plan: pro fast, free slow.
_DONE_HOUR = """
INSERT INTO {jobs} (type, group_id, payload, status, attempts, max_attempts, run_after,
                    created_at, finished_at)
SELECT 'search', g.group_id, jsonb_build_object('n', i), 'done', 1, 3,
       f - g.wait * (0.5 + (i %% 10) / 10.0)::float8, f - g.wait - interval '1 minute', f
FROM generate_series(1, 40) i
CROSS JOIN (VALUES ('acme', interval '20 seconds'), ('globex', interval '90 seconds'),
                   ('initech', interval '4 minutes')) AS g(group_id, wait)
CROSS JOIN LATERAL (SELECT now() - (i * 89 %% 3540) * interval '1 second'
                           - interval '30 seconds' AS f) t
"""
_RUNS = """
INSERT INTO {runs} (id, trigger, stop_reason, jobs_done, jobs_failed, jobs_deferred,
                    quota_units, summary, error, started_at, finished_at, heartbeat_at)
SELECT gen_random_uuid(), 'cron', r.reason, 10 * i, i %% 3, i %% 2, 100 * i,
       jsonb_build_object('searches', i, 'quota.youtube', 100 * i),
       CASE WHEN r.reason = 'error' THEN %(error)s END,
       now() - i * interval '5 minutes', now() - i * interval '5 minutes'
       + (30 + i) * interval '1 second', now() - i * interval '5 minutes'
FROM (VALUES (1, 'no_work'), (2, 'time_budget'), (3, 'quota_reserve'),
             (4, 'quota_exhausted'), (5, 'error'), (6, 'time_budget'),
             (7, 'no_work'), (8, 'time_budget')) AS r(i, reason)
"""


@dataclass
class Seeded:
    failed_id: int
    cancel_id: int  # pending, with the hostile payload
    running_id: int
    done_id: int


async def seed(queue: Queue) -> Seeded:
    """Fill the queue's schema (freshly migrated) with jobs in every state."""
    for gid, plan, active in (("acme", "pro", True), ("globex", "standard", True),
                              ("initech", "free", True), ("paused-co", "standard", False),
                              (EVIL_GROUP, "free", True)):
        await queue.upsert_group(gid, plan=plan, active=active)
    later = await queue.now() + timedelta(hours=1)
    for i, gid in enumerate(("acme", "globex", "initech")):
        await queue.enqueue("search", {"q": f"query {i}"}, group_id=gid)
    for gid in ("acme", EVIL_GROUP):
        await queue.enqueue("search", {"q": "later"}, group_id=gid, run_after=later)
    for i in range(2):
        await queue.enqueue("search", {"q": f"paused {i}"}, group_id="paused-co")
    # enrich: two claimed (one completes, one stays running)
    for i in range(2):
        await queue.enqueue("enrich", {"creator": i}, group_id="acme")
    claimed = await queue.claim("enrich", 2)
    assert len(claimed) == 2
    await queue.complete(claimed[0])
    # draft: one fails for good with hostile error text; one pending with a hostile payload
    await queue.enqueue("draft", {"to": "someone"}, group_id="globex", max_attempts=1)
    [failing] = await queue.claim("draft", 1)
    assert await queue.fail(failing, f"TimeoutError: {SCRIPT}") == "failed"
    hostile = await queue.enqueue("draft", {"html": SCRIPT, "img": IMG,
                                            "note": "</pre><b>not bold</b>"},
                                  group_id="initech")
    assert hostile is not None
    async with queue.connection() as c:
        await c.execute(sql.SQL(_DONE_HOUR).format(jobs=queue.table("jobs")), {})
        await c.execute(sql.SQL(_RUNS).format(runs=queue.table("runs")),
                        {"error": f"RuntimeError: {SCRIPT}"})
    await YOUTUBE.spend(queue, 3_200)
    return Seeded(failed_id=failing.id, cancel_id=hostile.id, running_id=claimed[1].id,
                  done_id=claimed[0].id)


async def job_row(queue: Queue, job_id: int) -> dict[str, Any]:
    job = await queue.get_job(job_id)
    assert job is not None
    return {"status": job.status, "attempts": job.attempts, "last_error": job.last_error}
