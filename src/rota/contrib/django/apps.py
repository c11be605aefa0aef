"""The Django app of rota's ``django.tasks`` backend: add ``"rota.contrib.django"`` to
``INSTALLED_APPS`` for the ``rota_worker`` and ``rota_migrate`` commands, rota's system
checks, and rota's schema applied by ``migrate`` (docs/django.md, "Settings")."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core import checks
from django.db.models.signals import post_migrate


class RotaConfig(AppConfig):
    """rota's Django app (label ``rota``): management commands, checks, no models."""

    name = "rota.contrib.django"
    label = "rota"
    verbose_name = "rota"

    def ready(self) -> None:
        from .backend import schema_check

        checks.register(schema_check, checks.Tags.database)
        post_migrate.connect(apply_schema, dispatch_uid="rota.apply_schema")


def apply_schema(sender: AppConfig, using: str = "default", apps: Any = None,
                 **kwargs: Any) -> None:
    """After ``migrate`` (Django sends ``post_migrate`` once per app; this acts on the
    last), bring rota's schema and groups view up to date on the database it migrated,
    for each rota backend on it: so ``migrate`` alone sets a project up, and Django's
    test runner's test database gets rota's schema (docs/django.md, "Settings")."""
    from django.apps import apps as global_apps

    if "plan" not in kwargs:  # a flush (TransactionTestCase), not a migrate: nothing to do
        return
    configs = [c for c in global_apps.get_app_configs() if c.models_module is not None]
    if not configs or sender is not configs[-1]:
        return
    from .migrate import migrate_backend
    from .worker import rota_backends

    for b in rota_backends():
        if b.config.database == using:
            migrate_backend(b)
