"""rota's connection timeouts (docs/operations.md, "Network partitions and timeouts"):
added to the connections of the queue's own pool where the URL does not set them, one
setting at a time, so a worker cut off from the database gives its connections up in
bounded time. tools/chaos_hosts measures the give-up over a cut link."""

from __future__ import annotations

from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict

from rota import Queue
from rota.db import CLIENT_DEFAULTS, SESSION_DEFAULTS, with_connection_defaults


@pytest.fixture(autouse=True)
def _no_libpq_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PGOPTIONS", "PGCONNECT_TIMEOUT", "PGSERVICE"):
        monkeypatch.delenv(name, raising=False)


def options_of(conninfo: str) -> dict[str, str]:
    words = str(conninfo_to_dict(conninfo).get("options", "")).split()
    pairs = [w.split("=", 1) for w in words if w != "-c"]
    return {k: v for k, v in pairs}


def test_a_bare_url_gets_every_default() -> None:
    params = conninfo_to_dict(with_connection_defaults("postgresql://u@db.example/app"))
    for key, value in CLIENT_DEFAULTS.items():
        assert params[key] == value
    assert options_of(with_connection_defaults("postgresql://u@db.example/app")) \
        == SESSION_DEFAULTS
    assert params["host"] == "db.example" and params["dbname"] == "app"


def test_what_the_url_sets_wins_one_setting_at_a_time() -> None:
    url = ("postgresql://u@db/app?connect_timeout=3&keepalives_idle=60"
           "&options=-c%20statement_timeout%3D0%20--idle-in-transaction-session-timeout%3D1s")
    out = with_connection_defaults(url)
    params = conninfo_to_dict(out)
    assert params["connect_timeout"] == "3" and params["keepalives_idle"] == "60"
    assert params["tcp_user_timeout"] == CLIENT_DEFAULTS["tcp_user_timeout"]
    opts = str(params["options"])
    assert opts.startswith("-c statement_timeout=0 --idle-in-transaction-session-timeout=1s")
    assert "statement_timeout=5min" not in opts
    assert "idle_in_transaction_session_timeout" not in opts
    assert "-c tcp_keepalives_idle=15" in opts


def test_libpq_environment_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "2")
    monkeypatch.setenv("PGOPTIONS", "-c statement_timeout=1h")
    params = conninfo_to_dict(with_connection_defaults("host=db dbname=app"))
    assert "connect_timeout" not in params
    opts = options_of(with_connection_defaults("host=db dbname=app"))
    assert opts["statement_timeout"] == "1h"  # PGOPTIONS kept, not hidden by options=
    assert opts["idle_in_transaction_session_timeout"] == "5min"


def test_a_service_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    assert with_connection_defaults("service=prod") == "service=prod"
    monkeypatch.setenv("PGSERVICE", "prod")
    assert with_connection_defaults("dbname=app") == "dbname=app"


async def test_the_queue_pool_connects_with_them(database_url: str, schema: str) -> None:
    async with Queue(database_url + ("&" if "?" in database_url else "?")
                     + "options=-c%20statement_timeout%3D7s", schema=schema) as q:
        async with q.connection() as conn:
            cur = await conn.execute(
                "SELECT current_setting('statement_timeout'), "
                "current_setting('idle_in_transaction_session_timeout')")
            row: Any = await cur.fetchone()
    assert row == ("7s", "5min")
    assert conninfo_to_dict(str(q.pool.conninfo))["keepalives_count"] == "3"
