"""Django's own ``ImmediateBackend`` and ``DummyBackend`` taking rota's task options
(docs/django.md, "Tests and development"): a project switches ``TASKS`` to one of these
in tests or development without changing its tasks, whose ``@task(group=...,
max_attempts=...)`` Django's own backends would refuse (their task class has no such
fields). The options are accepted and checked as rota's backend checks them, then
ignored: these backends have no groups, retries or fair claim."""

from __future__ import annotations

from django.tasks.backends.dummy import DummyBackend as DjangoDummyBackend
from django.tasks.backends.immediate import ImmediateBackend as DjangoImmediateBackend
from django.tasks.base import Task

from .backend import RotaTask, check_group_option


class ImmediateBackend(DjangoImmediateBackend):  # type: ignore[misc]
    """Django's ``ImmediateBackend`` (a task runs at once, in the caller), with
    :class:`RotaTask` as its task class."""

    task_class = RotaTask

    def validate_task(self, task: Task) -> None:
        """Django's checks, then rota's ``group`` option's."""
        super().validate_task(task)
        check_group_option(task)


class DummyBackend(DjangoDummyBackend):  # type: ignore[misc]
    """Django's ``DummyBackend`` (tasks are kept, never run), with :class:`RotaTask` as
    its task class."""

    task_class = RotaTask

    def validate_task(self, task: Task) -> None:
        """Django's checks, then rota's ``group`` option's."""
        super().validate_task(task)
        check_group_option(task)
