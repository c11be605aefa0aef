"""``python manage.py rota_migrate``: rota's schema for the project's task backend, and
the groups view over its model (docs/django.md)."""

from __future__ import annotations

import asyncio
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from ...groups import create_view
from ...worker import backend, make_queue


class Command(BaseCommand):  # type: ignore[misc]
    help = ("Apply rota's migrations to the task backend's schema, and create the groups "
            "view over OPTIONS['GROUPS']['MODEL'] (run after `migrate`).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--backend", default="default",
                            help="The TASKS alias (default: default).")

    def handle(self, *args: Any, **options: Any) -> None:
        b = backend(options["backend"])
        view = create_view(b)
        if view is not None:
            self.stdout.write(f"groups view {view} over {b.config.groups['MODEL']}")  # type: ignore[index]

        async def go() -> list[int]:
            async with make_queue(b) as queue:
                return await queue.migrate()

        applied = asyncio.run(go())
        self.stdout.write(f"schema {b.config.schema}: "
                          + (f"applied {applied}" if applied else "up to date"))
