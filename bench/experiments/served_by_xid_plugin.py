"""pytest plugin: every migrated test schema gets the served_by_xid variant, and claims
use its statement (``-p bench.experiments.served_by_xid_plugin``)."""

from __future__ import annotations

from typing import Any

import rota.db as db

from .served_by_xid import ddl, patch_claim

patch_claim()
_migrate = db.migrate


async def migrate(conn: Any, schema: str = "rota") -> list[int]:
    applied = await _migrate(conn, schema)
    cur = await conn.execute("SELECT to_regclass(%s)", [f'"{schema}".fair_fold_lock'])
    row = await cur.fetchone()
    if row is None or row[0] is None:
        await conn.execute(ddl(schema))
    return applied


db.migrate = migrate  # type: ignore[assignment]
