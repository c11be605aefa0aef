"""The uncapped claim's question "is any group capped?" (cap_guard_on.sql; docs/design.md,
"Caps") and the capped claim's gate on the groups at their cap (cap_prelude_group_on.sql)
cost one index probe whatever the statistics say: each reads the smallest cap through
groups_capped_idx (max_running, where set), never the groups table whole. Asked as
`EXISTS (... WHERE max_running IS NOT NULL)` on a groups table never analyzed, the
planner read all of it at every claim (10,000 groups: 70 pages, 0.6 ms a claim)."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from rota import Queue

from .test_horizon_held import generic_plan
from .test_settle_plans import nodes


def groups_reads(plan: dict[str, Any]) -> list[str]:
    """How the plan reads the groups table: one entry per node naming it."""
    return [f"{n['Node Type']} {n.get('Index Name', '')}".strip() for n in nodes(plan)
            if n.get("Relation Name") == "groups"]


async def test_the_claims_question_about_group_caps_is_one_index_probe_without_statistics(
    queue: Queue, aconn: Any, schema: str, database_url: str,
) -> None:
    groups = queue.table("groups")
    await aconn.execute(sql.SQL(
        "INSERT INTO {} (group_id, plan) SELECT 'g' || i, 'free' FROM generate_series(1, 5000) i"
    ).format(groups))
    await queue.enqueue_many([{"type": "t", "payload": {}, "group_id": f"g{i}"}
                              for i in range(1, 201)])
    # No statistics of the groups table at all, as on a server whose autovacuum is off
    # and that never ran ANALYZE since the groups were written.
    await aconn.execute("DELETE FROM pg_statistic WHERE starelid = %s::regclass",
                        [f"{schema}.groups"])
    await queue.claim("t", 5)  # warms the connections
    plan = await generic_plan(queue, database_url, 25)
    reads = groups_reads(plan)
    # The guard's probe, and no read of the whole table (the special groups' rows, if
    # any, are probes of groups_pkey).
    assert "Index Only Scan groups_capped_idx" in reads, reads
    assert not any(r.startswith(("Seq Scan", "Bitmap")) for r in reads), reads
    # With a group capped, the capped statement's gate on the groups at their cap is
    # one probe of the same index, and the claim honours the cap.
    await queue.upsert_group("g1", plan="free", max_running=1)
    await aconn.execute("DELETE FROM pg_statistic WHERE starelid = %s::regclass",
                        [f"{schema}.groups"])
    claimed = await queue.claim("t", 10)
    assert queue.fair_claim.group_capped
    assert [j.group_id for j in claimed].count("g1") <= 1
    async with await psycopg.AsyncConnection.connect(str(queue.pool.conninfo)) as c:
        cur = await c.execute(sql.SQL(
            "EXPLAIN (FORMAT JSON) SELECT (SELECT min(g.max_running) FROM {} g) IS NOT NULL"
        ).format(groups))
        row = await cur.fetchone()
    assert row is not None
    assert groups_reads(row[0][0]["Plan"]) == ["Index Only Scan groups_capped_idx"]
