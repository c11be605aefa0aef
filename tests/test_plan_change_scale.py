"""Changing many groups' plans at once reads fair_groups by group, not whole
(docs/design.md, "The fair claim"): each changed group's rows of every type are found
through fair_groups_group_idx, so N changes are not N scans of the table."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from rota import Queue

N = 1000


def index_conds(node: dict[str, Any]) -> set[tuple[str, str]]:
    """(index, condition) of every index a plan node and its children read."""
    found = {(node["Index Name"], node["Index Cond"])} if "Index Name" in node else set()
    for child in node.get("Plans", []):
        found |= index_conds(child)
    return found


async def test_a_plan_change_reads_fair_groups_by_group(
        queue: Queue, aconn: psycopg.AsyncConnection[Any]) -> None:
    s = sql.Identifier(queue.schema)
    await aconn.execute(sql.SQL(
        "INSERT INTO {s}.groups (group_id, owner_id, plan, active) "
        "SELECT 'g' || i, 'o' || i, 'free', true FROM generate_series(1, %s) i").format(s=s),
        [N])
    await aconn.commit()
    await queue.enqueue_many([{"type": t, "payload": {}, "group_id": f"g{i}"}
                              for t in ("a", "b") for i in range(1, N + 1)])
    await aconn.execute(sql.SQL("ANALYZE {s}.fair_groups").format(s=s))
    await aconn.commit()
    cur = await aconn.execute(sql.SQL("SELECT count(*) FROM {s}.fair_groups").format(s=s))
    assert await cur.fetchone() == (2 * N,)
    await aconn.commit()
    # The statement the groups trigger runs for each changed group finds the group's
    # rows through fair_groups_group_idx (without it: the whole primary key, whose
    # leading column is the type, once per changed group).
    cur = await aconn.execute(sql.SQL(
        "EXPLAIN (FORMAT JSON) UPDATE {s}.fair_groups SET plan = 'pro', active = true "
        "WHERE group_id = 'g7' AND (plan IS DISTINCT FROM 'pro' OR active IS DISTINCT "
        "FROM true)").format(s=s))
    [[plan]] = await cur.fetchall()
    assert index_conds(plan[0]["Plan"]) == {("fair_groups_group_idx",
                                             "(group_id = 'g7'::text)")}
    await aconn.rollback()
    # One statement changes every group's plan; the trigger updates each group's two
    # fair_groups rows.
    await aconn.execute(sql.SQL("UPDATE {s}.groups SET plan = 'pro'").format(s=s))
    await aconn.commit()
    cur = await aconn.execute(sql.SQL(
        "SELECT plan, count(*) FROM {s}.fair_groups GROUP BY plan").format(s=s))
    assert await cur.fetchall() == [("pro", 2 * N)]
