"""The Django app of rota's ``django.tasks`` backend: add ``"rota.contrib.django"`` to
``INSTALLED_APPS`` for the ``rota_worker`` and ``rota_migrate`` commands."""

from __future__ import annotations

from django.apps import AppConfig


class RotaConfig(AppConfig):
    """rota's Django app (label ``rota``): management commands only, no models."""

    name = "rota.contrib.django"
    label = "rota"
    verbose_name = "rota"
