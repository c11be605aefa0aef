"""Bringing a rota backend's database up to date (docs/django.md, "Settings"): rota's
schema, then the groups view over ``OPTIONS['GROUPS']``' model. ``rota_migrate`` runs
it, and so does ``migrate`` (``post_migrate``), after the project's own tables exist."""

from __future__ import annotations

import asyncio

import psycopg
from django.core.exceptions import ImproperlyConfigured

from .backend import RotaBackend
from .groups import create_view
from .worker import make_queue


def migrate_backend(b: RotaBackend) -> tuple[str | None, list[int]]:
    """Apply rota's migrations to the backend's schema, then create (or replace) its
    groups view.

    Returns:
        The groups view's name (``None`` without ``GROUPS``) and the migration versions
        applied (empty: up to date).

    Raises:
        ImproperlyConfigured: the groups model's table does not exist yet (``migrate``
            has not run), or a bad ``GROUPS`` option.
        rota.MigrationError: rota's schema could not be migrated.
    """

    async def go() -> list[int]:
        async with make_queue(b) as queue:
            return await queue.migrate()

    applied = asyncio.run(go())
    try:
        view = create_view(b)
    except psycopg.errors.UndefinedTable:
        model = b.config.groups["MODEL"] if b.config.groups else "?"
        raise ImproperlyConfigured(
            f"the table of {model} (OPTIONS['GROUPS']['MODEL']) does not exist yet: run "
            f"`python manage.py migrate` first (it applies rota's schema too)") from None
    return view, applied
