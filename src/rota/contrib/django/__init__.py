"""rota as a backend of Django's task framework (``django.tasks``, Django 6.0 and later,
Python 3.12 and later; docs/django.md)::

    INSTALLED_APPS = [..., "rota.contrib.django"]
    TASKS = {"default": {"BACKEND": "rota.contrib.django.RotaBackend"}}

Importing this package imports Django; ``import rota`` never does.
"""

from .backend import RotaBackend, RotaTask, RotaTaskResult, job_type
from .local import DummyBackend, ImmediateBackend

__all__ = ["DummyBackend", "ImmediateBackend", "RotaBackend", "RotaTask", "RotaTaskResult",
           "job_type"]
