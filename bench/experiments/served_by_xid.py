"""Experiment, not shipped: served-count deltas kept append-only, keyed by the writer's
transaction id, so a claim never reads the deltas already folded, however long the xmin
horizon is held (docs/operations.md, "Long transactions").

Today ``fair_served`` rows are updated in place by claims (``ON CONFLICT … DO UPDATE``)
and deleted by every fold (about every 20 ms). While a long transaction holds the
horizon, none of those versions can be removed, and the claim's ``served_delta`` (an
index range over the type) reads every one of them: after 60 s of a pinned horizon
(100,000 pending jobs, 2,000 groups), 26,691 of the claim's 43,212 buffer reads.

The variant:

- ``fair_served`` gets ``xid xid8 DEFAULT pg_current_xact_id()`` and an index on
  ``(type, xid)``; writers only INSERT (no unique key, no conflict, no row shared
  between sessions).
- ``fair_fold`` takes its type's row of ``fair_fold_lock`` (``FOR UPDATE SKIP LOCKED``: a
  lock, never a new row version), reads the mark (the newest ``fair_fold_mark`` row of
  the type), folds the deltas from the mark on, and inserts a new mark: the smaller of
  its first snapshot's xmin and the smallest xid of a delta it had to leave (a group a
  writer held). Every transaction with an xid below its snapshot's xmin had ended, so
  each delta below the new mark was visible to the fold and folded. Marks only grow
  (snapshot xmins do), so the newest is the largest; older marks are deleted and lie
  below it in the index, where ``max()`` never reads.
- The claim sums the deltas with ``xid >=`` the newest mark: one fold interval of them.

A transaction holding an xid (one that wrote and stays open) keeps snapshot xmins, and
so the mark, behind it: then the claim reads what it reads today. A read-only one (a
report, ``pg_dump``, REPEATABLE READ) does not.

Measured (`python -m bench.experiments.served_by_xid 60`, 2 cores shared by eight
developers, 2026-12-01 15:47 UTC): buffers read by a claim of 25 (median of 5 EXPLAIN
ANALYZE), before the pin and after 60 s of churn with it: today 1,201 and 43,212, the
variant 1,048 and 12,048 (``fair_served``'s part 26,691 -> 7). What still grows is the
walk of ``fair_groups_walk_idx`` (every fold writes a new entry for each folded group,
ahead of which the old ones stay), the special groups' row lookups, and
``jobs_pending_idx`` (claimed jobs' old entries at each group's front). With the
variant applied by ``served_by_xid_plugin`` (``PYTHONPATH=. pytest -p
bench.experiments.served_by_xid_plugin tests/test_oracle.py tests/test_fast_claim.py
tests/test_concurrency.py tests/test_claim_over_time.py tests/test_claim_ties.py
tests/test_claim_roles.py``), those 37 tests passed; ``served_by_xid_test.py`` checks the mark.

It rewrites the SQL of the layout before the fair package (``schema.sql``'s
functions and ``sql/claim.sql`` by text): port it as a migration, not from here.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import random
import re
import statistics
import sys
import time
from importlib import resources
from typing import Any

import psycopg
from psycopg import sql

ON_CONFLICT = "ON CONFLICT (type, group_id, shard) DO UPDATE SET n = fs.n + excluded.n"

SET_MARK = """CREATE FUNCTION {schema}.fair_set_mark(p_type text, p_old xid8, p_new xid8)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    m xid8;
BEGIN
    SELECT coalesce(least(p_new, min(f.xid)), p_new) INTO m FROM {schema}.fair_served f
    WHERE f.type = p_type AND f.xid >= p_old;
    IF m > p_old THEN
        INSERT INTO {schema}.fair_fold_mark (type, upto) VALUES (p_type, m);
        DELETE FROM {schema}.fair_fold_mark d WHERE d.type = p_type AND d.upto < m;
    END IF;
END
$$"""

FOLD_EDITS = (
    ("""    folded integer;
BEGIN
    SELECT array_agg(DISTINCT f.group_id) INTO gs
    FROM {schema}.fair_served f WHERE f.type = p_type;""",
     """    folded integer;
    mark xid8;
    new_mark xid8;
BEGIN
    INSERT INTO {schema}.fair_fold_lock (type) VALUES (p_type) ON CONFLICT (type) DO NOTHING;
    PERFORM 1 FROM {schema}.fair_fold_lock l WHERE l.type = p_type FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    mark := coalesce((SELECT max(m.upto) FROM {schema}.fair_fold_mark m
                      WHERE m.type = p_type), '0');
    new_mark := pg_snapshot_xmin(pg_current_snapshot());
    SELECT array_agg(DISTINCT f.group_id) INTO gs
    FROM {schema}.fair_served f WHERE f.type = p_type AND f.xid >= mark;"""),
    ("""    IF gs IS NULL THEN
        RETURN 0;
    END IF;""",
     """    IF gs IS NULL THEN
        PERFORM {schema}.fair_set_mark(p_type, mark, new_mark);
        RETURN 0;
    END IF;"""),
    ("""            WHERE f.type = p_type
            FOR UPDATE OF f SKIP LOCKED))""",
     """            WHERE f.type = p_type AND f.xid >= mark
            FOR UPDATE OF f))"""),
    ("""    GET DIAGNOSTICS folded = ROW_COUNT;""",
     """    GET DIAGNOSTICS folded = ROW_COUNT;
    PERFORM {schema}.fair_set_mark(p_type, mark, new_mark);"""),
)

CLAIM_EDIT = ("""    FROM {schema}.fair_served f
    WHERE f.type = %(type)s
    GROUP BY f.group_id""", """    FROM {schema}.fair_served f
    WHERE f.type = %(type)s
      AND f.xid >= coalesce((SELECT max(m.upto) FROM {schema}.fair_fold_mark m
                             WHERE m.type = %(type)s), '0')
    GROUP BY f.group_id""")


def _function(schema_sql: str, name: str) -> str:
    start = schema_sql.index(f"CREATE FUNCTION {{schema}}.{name}(")
    end = schema_sql.index("$$;", schema_sql.index("$$", start) + 2) + 3
    return schema_sql[start:end].replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


def _edit(text: str, old: str, new: str) -> str:
    if old not in text:
        raise RuntimeError("the SQL changed since this experiment was written: port it")
    return text.replace(old, new)


def ddl(schema: str) -> str:
    """The variant for a migrated ``schema`` (several statements, no parameters)."""
    source = resources.files("rota").joinpath("schema.sql").read_text("utf-8")
    out = [
        "ALTER TABLE {schema}.fair_served ADD COLUMN xid xid8 NOT NULL "
        "DEFAULT pg_current_xact_id()",
        "ALTER TABLE {schema}.fair_served DROP CONSTRAINT fair_served_pkey",
        "CREATE INDEX fair_served_xid_idx ON {schema}.fair_served (type, xid)",
        "CREATE TABLE {schema}.fair_fold_lock (type text PRIMARY KEY)",
        "CREATE TABLE {schema}.fair_fold_mark (type text NOT NULL, upto xid8 NOT NULL)",
        "CREATE INDEX fair_fold_mark_idx ON {schema}.fair_fold_mark (type, upto)",
        SET_MARK,
    ]
    for name in ("fair_count_served", "fair_jobs_update", "fair_advance"):
        out.append(_edit(_function(source, name), ON_CONFLICT, ""))
    fold = _function(source, "fair_fold")
    for old, new in FOLD_EDITS:
        fold = _edit(fold, old, new)
    out.append(fold)
    quoted = sql.Identifier(schema).as_string(None)
    return ";\n".join(s.replace("{schema}", quoted) for s in out)


def patch_claim() -> None:
    """Make this process's queues claim with the variant's ``served_delta``."""
    import rota.db as db

    real = db.statement_text
    text = _edit(real("claim"), *CLAIM_EDIT)

    @functools.cache
    def patched(name: str) -> str:
        return text if name == "claim" else real(name)

    db.statement_text = patched  # type: ignore[assignment]


# -- the A/B: buffers the claim reads, before and after a pinned horizon ---------------

SCHEMA = "bench_served_by_xid"


def _buffers(plan: str) -> int:
    m = re.search(r"Buffers: shared hit=(\d+)", plan)
    return int(m.group(1)) if m else -1


def _scan_buffers(plan: str, index: str) -> int:
    lines, total = plan.split("\n"), 0
    for i, line in enumerate(lines):
        if index in line and "Scan" in line:
            for after in lines[i + 1:i + 6]:
                m = re.search(r"Buffers: shared hit=(\d+)", after)
                if m:
                    total += int(m.group(1))
                    break
    return total


async def _variant(url: str, variant: str, seconds: float) -> dict[str, Any]:
    from rota import Queue

    from ..claim_latency import explain
    from ..pinned import _replacements
    from ..scale import build

    groups = 2_000
    await build(url, SCHEMA, pending=100_000, groups=groups, done=20_000)
    if variant == "variant":
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
            await c.execute(ddl(SCHEMA))
    rng = random.Random(1)

    async def churn(queue: Queue, secs: float) -> float:
        end, times = time.monotonic() + secs, []
        while time.monotonic() < end:
            for limit in (100, 25):
                t = time.perf_counter()
                jobs = await queue.claim("t", limit)
                if limit == 25:
                    times.append((time.perf_counter() - t) * 1000)
                if jobs:
                    await queue.complete_many(jobs)
                await queue.enqueue_many(_replacements(len(jobs) or limit, groups, rng))
        return statistics.median(times[-50:])

    async def reads(queue: Queue, conn: Any) -> dict[str, Any]:
        plans = [(await explain(queue, conn)).split("-- the post")[0] for _ in range(5)]
        return {"claim_buffers": statistics.median(_buffers(p) for p in plans),
                "fair_served_buffers": _scan_buffers(plans[-1], "fair_served")}

    out: dict[str, Any] = {}
    async with (Queue(url, schema=SCHEMA) as queue,
                await psycopg.AsyncConnection.connect(url, autocommit=True) as conn,
                await psycopg.AsyncConnection.connect(url) as holder):
        out["before_p50_ms"] = await churn(queue, 15)
        out["before"] = await reads(queue, conn)
        await holder.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
        await holder.execute(sql.SQL("SELECT count(*) FROM {}.groups").format(
            sql.Identifier(SCHEMA)))
        out["pinned_p50_ms"] = await churn(queue, seconds)
        out["pinned"] = await reads(queue, conn)
        await holder.rollback()
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(SCHEMA)))
    return out


if __name__ == "__main__":
    which = sys.argv[2] if len(sys.argv) > 2 else None
    secs = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    database = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
    if which is None:  # each variant in a process of its own (the claim text is patched)
        import subprocess

        for v in ("today", "variant"):
            subprocess.run([sys.executable, "-m", "bench.experiments.served_by_xid",
                            str(secs), v], check=True)
    else:
        if which == "variant":
            patch_claim()
        print(which, json.dumps(asyncio.run(_variant(database, which, secs))), flush=True)
