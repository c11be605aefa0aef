"""Dashboard pages at scale: builds a queue's week of history (1,000,000 jobs by default)
and times every page of ``rota.dashboard_app`` and its ``/metrics``, the median of
several requests each, through the ASGI app in process (the whole request: auth,
queries, templates and SVG charts; no socket).

The data set is a live queue's, not a backlog: of N jobs, 88 % done and 2 % failed
over the last 7 days (so about N/190 finished in the last hour), 9 % pending (a fifth
of them due later: backoff, deferrals), 0.5 % running, over 10,000 groups in three
plans, 1 % of them paused, four job types; one run a minute for the week (about
10,080 runs, some ended in error) and a week of quota usage. Built with INSERT …
SELECT generate_series (a few minutes at 1,000,000), then VACUUM ANALYZE.

Usage: python -m bench.dashboard [N] [--reuse] [--backlog] (DATABASE_URL, default the
local test database; --reuse times the data set the last run built; --backlog makes all
N jobs pending, a queue that fell behind, where the pending counts cost most).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from typing import Any

import httpx
import psycopg
from psycopg import sql

from rota import Queue, Quota
from rota.db import migrate
from rota.web.dashboard import dashboard_app

from .scale import fold_bulk_load

SCHEMA = "bench_dashboard"
PLANS = ("free", "standard", "pro")
TYPES = ("search", "enrich", "score", "draft")
GROUPS = 10_000
REPS = 7
SECRET = "bench-dashboard-secret"
QUOTAS = [Quota("youtube", 10_000, reserve=1_000, reset_tz="America/Los_Angeles"),
          Quota("llm", 2_000_000, reserve=50_000, reset_tz="UTC")]

# One statement per status; {s} is the schema. %(n)s rows, i = 1..n.
_GROUPS = """
INSERT INTO {s}.groups (group_id, owner_id, plan, active)
SELECT 'g' || i, 'o' || (i / 3), (%(plans)s::text[])[1 + i %% 3], i %% 100 <> 7
FROM generate_series(0, %(groups)s - 1) i
"""
# The week's history, done and failed interleaved in the heap as a live table has them.
_HISTORY = """
INSERT INTO {s}.jobs (type, group_id, payload, status, attempts, max_attempts, deferrals,
                      run_after, created_at, finished_at, last_error)
SELECT (%(types)s::text[])[1 + i %% 4], 'g' || floor(random() * %(groups)s)::int,
       jsonb_build_object('n', i), CASE WHEN u < %(failed)s THEN 'failed' ELSE 'done' END,
       CASE WHEN u < %(failed)s THEN 3 ELSE 1 END, 3, (i %% 11 = 0)::int,
       c + w, c, least(c + w + random() * interval '30 seconds', now()),
       CASE WHEN u < %(failed)s THEN 'TimeoutError: upstream took too long (' || i || ')' END
FROM (SELECT i, random() AS u, random() * interval '2 minutes' AS w,
             now() - interval '7 days' + i * (interval '7 days' / %(n)s) AS c
      FROM generate_series(1, %(n)s) i) t
"""
# The last day's open jobs: a fifth due later (backoff, deferrals), the rest due.
_PENDING = """
INSERT INTO {s}.jobs (type, group_id, payload, max_attempts, attempts, run_after, created_at)
SELECT (%(types)s::text[])[1 + i %% 4], 'g' || (i %% %(groups)s), jsonb_build_object('n', i),
       3, (i %% 5 = 0)::int,
       CASE WHEN i %% 5 = 0 THEN now() + random() * interval '4 hours'
            ELSE c + random() * interval '1 minute' END,
       c
FROM (SELECT i, now() - interval '1 day' + i * (interval '1 day' / %(n)s) AS c
      FROM generate_series(1, %(n)s) i) t
"""
_RUNNING = """
INSERT INTO {s}.jobs (type, group_id, payload, status, attempts, max_attempts, run_after,
                      created_at, locked_at, claim_token)
SELECT (%(types)s::text[])[1 + i %% 4], 'g' || floor(random() * %(groups)s)::int,
       jsonb_build_object('n', i), 'running', 1, 3, now() - interval '5 minutes',
       now() - interval '6 minutes', now() - random() * interval '1 minute',
       gen_random_uuid()
FROM generate_series(1, %(n)s) i
"""
_RUNS = """
INSERT INTO {s}.runs (id, trigger, stop_reason, jobs_done, jobs_failed, jobs_deferred,
                      quota_units, summary, error, started_at, finished_at, heartbeat_at)
SELECT gen_random_uuid(), 'cron',
       (ARRAY['no_work', 'time_budget', 'quota_reserve', 'quota_exhausted',
              'error'])[1 + (i %% 97 = 0)::int * 4 + (i %% 97 <> 0)::int * (i %% 4)],
       90 + i %% 40, i %% 3, i %% 7, 100 * (i %% 5),
       jsonb_build_object('searches', i %% 9, 'quota.youtube', 100 * (i %% 5)),
       CASE WHEN i %% 97 = 0 THEN 'OperationalError: server closed the connection' END,
       s, s + (20 + i %% 200) * interval '1 second', s + interval '10 seconds'
FROM generate_series(1, 7 * 24 * 60) i,
     LATERAL (SELECT now() - i * interval '1 minute' AS s) t
"""
_USAGE = """
INSERT INTO {s}.quota_usage (quota, scope_key, period_start, units, updated_at)
SELECT q, '', date_trunc('day', now()) - d * interval '1 day', 100 * (d + 7), now()
FROM unnest(ARRAY['youtube', 'llm']) q, generate_series(0, 6) d
ON CONFLICT DO NOTHING
"""


async def build(url: str, schema: str = SCHEMA, size: int = 1_000_000, *,
                backlog: bool = False) -> None:
    """Create ``schema`` from scratch with ``size`` jobs (see the module docstring);
    ``backlog``: all of them pending instead (a queue that fell behind)."""
    s = sql.Identifier(schema)
    history, running = (0, 0) if backlog else (size * 90 // 100, size * 5 // 1000)
    params = {"plans": list(PLANS), "types": list(TYPES), "groups": GROUPS,
              "failed": 2 / 90}
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
        await c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(s))
        await migrate(c, schema)
        await c.execute(sql.SQL("SELECT setseed(0.42)"))
        for statement, n in ((_GROUPS, GROUPS), (_RUNS, 0), (_USAGE, 0),
                             (_HISTORY, history), (_PENDING, size - history - running),
                             (_RUNNING, running)):
            if n or statement in (_RUNS, _USAGE):
                await c.execute(sql.SQL(statement).format(s=s), {**params, "n": n})
        for t in TYPES:  # fold the bulk load's counts, as a running queue keeps them
            await fold_bulk_load(c, s, t)
        for t in ("jobs", "runs", "groups", "quota_usage", "fair_groups", "fair_served"):
            await c.execute(sql.SQL("VACUUM ANALYZE {}.{}").format(s, sql.Identifier(t)))


async def time_pages(url: str, schema: str = SCHEMA, reps: int = REPS) -> dict[str, float]:
    """Median milliseconds per page (after one warm-up request each)."""
    async with Queue(url, schema=schema) as queue:
        async with queue.connection() as c:
            ids = []
            for status in ("failed", "pending"):  # setup only, not timed
                cur = await c.execute(sql.SQL("SELECT max(id) FROM {} WHERE status = %s")
                                      .format(queue.table("jobs")), [status])
                row = await cur.fetchone()
                ids.append(row[0] if row and row[0] else 1)
        failed_id, pending_id = ids
        app = dashboard_app(queue, quotas=QUOTAS, secret=SECRET)
        pages = {
            "/": "/", "/fairness": "/fairness", "/runs": "/runs", "/quotas": "/quotas",
            "/jobs": "/jobs", "/jobs?status=failed": "/jobs?status=failed",
            "/jobs?type=enrich&status=pending": "/jobs?type=enrich&status=pending",
            "/jobs?group=g42": "/jobs?group=g42",
            "/jobs/{id} (failed)": f"/jobs/{failed_id}",
            "/jobs/{id} (pending)": f"/jobs/{pending_id}",
            "/metrics": "/metrics",
        }
        out: dict[str, float] = {}
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1",
                                     auth=("rota", SECRET)) as client:
            for label, path in pages.items():
                times = []
                for i in range(reps + 1):
                    t = time.perf_counter()
                    r = await client.get(path)
                    dt = (time.perf_counter() - t) * 1000
                    r.raise_for_status()
                    if i:
                        times.append(dt)
                out[label] = statistics.median(times)
        return out


def report(size: int, timings: dict[str, float]) -> str:
    width = max(len(k) for k in timings)
    lines = [f"dashboard pages at {size:,} jobs (median of {REPS} requests, ms; "
             f"budget 200 ms):",
             f"{'page':<{width}}  {'ms':>7}"]
    for page, ms in timings.items():
        lines.append(f"{page:<{width}}  {ms:7.1f}{'' if ms <= 200 else '  OVER BUDGET'}")
    return "\n".join(lines)


def main(url: str, size: int = 1_000_000, *, rebuild: bool = True,
         backlog: bool = False) -> dict[str, Any]:
    if rebuild:
        t = time.perf_counter()
        asyncio.run(build(url, SCHEMA, size, backlog=backlog))
        print(f"built {size:,} jobs in {time.perf_counter() - t:.0f} s", flush=True)
    timings = asyncio.run(time_pages(url, SCHEMA))
    print(report(size, timings))
    return {"jobs": size, "median_ms": timings}


if __name__ == "__main__":
    main(os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"),
         int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 1_000_000,
         rebuild="--reuse" not in sys.argv, backlog="--backlog" in sys.argv)
