"""The demo's example of fairness between customers (demo/rota_demo/customers.py), on
the demo's own tables: exact positions under both orders, and nothing left behind."""

from __future__ import annotations

import os
from typing import Any

import psycopg
import pytest
from psycopg import sql

from rota import Queue
from rota_demo import app as demo_app
from rota_demo import customers


@pytest.fixture
async def demo_schemas(database_url: str, schema: str,
                       monkeypatch: pytest.MonkeyPatch) -> Any:
    app = f"{schema}_app"
    monkeypatch.setenv("ROTA_DEMO_SCHEMA", app)
    queue = Queue(database_url, schema=schema)
    await queue.open()
    await queue.migrate()
    async with queue.connection() as conn:
        await demo_app.migrate_app(conn, app)
    yield schema, app
    await queue.close()
    with psycopg.connect(database_url, autocommit=True) as c:
        c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(app)))


async def test_the_small_customer_waits_behind_every_campaign_by_group_not_by_owner(
        database_url: str, demo_schemas: tuple[str, str]) -> None:
    schema, app = demo_schemas
    assert os.environ["ROTA_DEMO_SCHEMA"] == app
    # 10 campaigns of 10 jobs against 1 of 10, claims of 10: by campaign the small
    # customer gets one job per round of 11 (its last is the 110th of 110); by customer
    # they alternate (its last is the 20th).
    assert await customers.small_customers_last_job(database_url, schema, "group") == 110
    assert await customers.small_customers_last_job(database_url, schema, "owner") == 20
    text = await customers.report(database_url, schema)
    assert "position 110 of 110 when the claim compares campaigns" in text
    assert "and at 20 when it compares customers first" in text
    with psycopg.connect(database_url) as c:  # rolled back: nothing left
        assert c.execute(sql.SQL("SELECT count(*) FROM {}.jobs").format(
            sql.Identifier(schema))).fetchone() == (0,)
        assert c.execute(sql.SQL("SELECT count(*) FROM {}.campaigns").format(
            sql.Identifier(app))).fetchone() == (0,)
