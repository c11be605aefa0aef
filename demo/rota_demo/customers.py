"""Fair between customers, shown on the demo's own tables (docs/design.md, "The fair
claim"): a customer who owns many campaigns against one who owns one, claimed by group
(the queue's default) and by owner (``fair_by="owner"``).

Everything happens in transactions that are rolled back: the demo's data is untouched.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from rota import Queue

from . import app as demo_app

#: The example's job type: no stage runs it, and its rows never commit.
EXAMPLE_TYPE = "fairness-example"


@dataclass(frozen=True)
class Example:
    """The example's size: the big customer's campaigns, jobs per campaign (both
    customers), and the claim size."""

    campaigns: int = 10
    per_campaign: int = 10
    claim: int = 10


async def small_customers_last_job(url: str, schema: str, fair_by: str,
                                   example: Example = Example()) -> int:
    """Where the small customer's last job is claimed, counting every job handed out,
    when the big customer (``example.campaigns`` campaigns) queued first, both on Pro.

    Args:
        url: the demo's database; schema: its rota schema (the app's tables in
            ``demo_app.app_schema()``, their ``campaign_groups`` view as groups).
        fair_by: ``"group"`` or ``"owner"``.

    Returns:
        The 1-based claim position of the small customer's last job.
    """
    app = sql.Identifier(demo_app.app_schema())
    queue = Queue(url, schema=schema, plans=demo_app.PLANS, fair_by=fair_by,
                  groups=f"{demo_app.app_schema()}.campaign_groups")
    async with await psycopg.AsyncConnection.connect(url) as conn:
        try:
            owners: list[tuple[str, int]] = [("big", example.campaigns), ("small", 1)]
            tag = uuid.uuid4().hex[:8]
            jobs: list[dict[str, Any]] = []
            for name, campaigns in owners:
                user = f"example-{name}-{tag}"
                await conn.execute(sql.SQL(
                    "INSERT INTO {}.users (id, email) VALUES (%s, %s)").format(app),
                    [user, f"{user}@example.com"])
                await conn.execute(sql.SQL(
                    "INSERT INTO {}.subscriptions (user_id, plan) VALUES (%s, 'pro')")
                    .format(app), [user])
                for _ in range(campaigns):
                    cid = uuid.uuid4()
                    await conn.execute(sql.SQL(
                        "INSERT INTO {}.campaigns (id, user_id, brand_url)"
                        " VALUES (%s, %s, 'https://example.com')").format(app), [cid, user])
                    jobs += [{"type": EXAMPLE_TYPE, "group_id": str(cid),
                              "payload": {"owner": name}}] * example.per_campaign
            await queue.enqueue_many(jobs, conn=conn)
            order: list[str] = []
            while claimed := await queue.claim(EXAMPLE_TYPE, example.claim, conn=conn):
                order += [j.payload["owner"] for j in claimed]
                await queue.complete_many(claimed, conn=conn)
            return max(i + 1 for i, owner in enumerate(order) if owner == "small")
        finally:
            await conn.rollback()


async def report(url: str, schema: str, example: Example = Example()) -> str:
    """The example as a paragraph for the demo's report."""
    by_group = await small_customers_last_job(url, schema, "group", example)
    by_owner = await small_customers_last_job(url, schema, "owner", example)
    big = example.campaigns * example.per_campaign
    total = big + example.per_campaign
    return (
        f"Fair between customers: one Pro customer owns {example.campaigns} campaigns "
        f"({big:,} jobs), another owns 1 ({example.per_campaign:,} jobs, queued after). "
        f"Claimed {example.claim:,} at a time, the small customer's last job goes out "
        f"at position {by_group:,} of {total:,} when the claim compares campaigns (the "
        f"default, fair_by=\"group\"), and at {by_owner:,} when it compares customers "
        f"first (fair_by=\"owner\"). Choose \"owner\" when a customer has several groups.")
