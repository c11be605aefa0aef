"""``python manage.py rota_migrate``: rota's schema for the project's task backend, and
the groups view over its model (docs/django.md)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...migrate import migrate_backend
from ...worker import backend


class Command(BaseCommand):  # type: ignore[misc]
    help = ("Apply rota's migrations to the task backend's schema, and create the groups "
            "view over OPTIONS['GROUPS']['MODEL'] (run after `migrate`).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--backend", default="default",
                            help="The TASKS alias (default: default).")

    def handle(self, *args: Any, **options: Any) -> None:
        """Migrate the backend's schema and groups view; a groups model whose table
        does not exist yet is one line saying to run ``migrate`` first."""
        b = backend(options["backend"])
        try:
            view, applied = migrate_backend(b)
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from None
        if view is not None:
            self.stdout.write(f"groups view {view} over {b.config.groups['MODEL']}")  # type: ignore[index]
        self.stdout.write(f"schema {b.config.schema}: "
                          + (f"applied {applied}" if applied else "up to date"))
