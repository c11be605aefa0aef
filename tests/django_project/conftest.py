"""The Django project's tests run on Python 3.12+ with Django 6 (`make test` runs them in
.venv-django): one schema per test process for the project's tables (and one for
rota's), migrated by Django's `migrate` and `rota_migrate`, dropped at the end."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

HERE = Path(__file__).resolve().parent
# DATABASE_URL, or (as the main suite does) an embedded throwaway server of this process.
_SERVER: Any = None
if not os.environ.get("DATABASE_URL"):
    from rota.db import EmbeddedServer

    _SERVER = EmbeddedServer()
URL = os.environ.get("DATABASE_URL") or _SERVER.url
SCHEMA = f"dj_{uuid.uuid4().hex[:10]}"

os.environ["DATABASE_URL"] = URL
os.environ["ROTA_DJANGO_SCHEMA"] = SCHEMA
os.environ["DJANGO_SETTINGS_MODULE"] = "djproject.settings"
os.environ["ROTA_DJANGO_WITH_LITE"] = "1"  # this process only: see manage()
sys.path.insert(0, str(HERE))

import django  # noqa: E402  (after the settings' environment above)

django.setup()  # before the test modules import models


@pytest.fixture(scope="session", autouse=True)
def django_project() -> Iterator[str]:
    """Django set up on this process's schema, migrated (Django's apps, then rota's
    schema and the tenants groups view)."""
    from django.core.management import call_command

    with psycopg.connect(URL, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(SCHEMA)))
    try:
        call_command("migrate", verbosity=0)
        call_command("rota_migrate", verbosity=0)
        yield SCHEMA
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(URL, autocommit=True) as conn:
            for s in (SCHEMA, f"{SCHEMA}_rota"):
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE")
                             .format(sql.Identifier(s)))
        if _SERVER is not None:
            _SERVER.stop()
