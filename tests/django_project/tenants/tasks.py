"""The project's tasks."""

from django.dispatch import receiver
from django.tasks import task
from django.tasks.signals import task_finished, task_started

from .models import Ran


@task(group="tenant")
def record(tenant: str, label: str) -> dict[str, object]:
    """Record that it ran; return what it did."""
    Ran.objects.create(tenant=tenant, label=label)
    return {"tenant": tenant, "label": label,
            "runs": Ran.objects.filter(tenant=tenant, label=label).count()}


@task(group="tenant", takes_context=True, max_attempts=3)
def flaky(context, tenant: str) -> None:  # type: ignore[no-untyped-def]
    """Fails on every attempt, naming it."""
    raise ValueError(f"attempt {context.attempt} for {tenant}")


@task(group=lambda tenant, label: tenant, queue_name="bands")
async def banded(tenant: str, label: str) -> str:
    """An async task that records the order it ran in."""
    from asgiref.sync import sync_to_async

    await sync_to_async(Ran.objects.create)(tenant=tenant, label=label)
    return label


@task(group="tenant", queue_name="fair")
def fair(tenant: str, i: int) -> int:
    Ran.objects.create(tenant=tenant, label=f"fair{i}")
    return i


@task()
def plain(x: int) -> int:
    return x * 2


@task()
def unstorable(kind: str) -> object:
    """Returns what cannot be a job's result: a set, or a string over the limit."""
    return {1, 2} if kind == "set" else "x" * 2_000_000


@task()
def nap(seconds: float) -> str:
    """Sleeps (a sync task, in a thread), for stopping a worker mid-task."""
    import time

    time.sleep(seconds)
    return "rested"


@task()
async def anap(seconds: float) -> str:
    """Sleeps on the worker's event loop (an async task: cancelled by a hard stop)."""
    import asyncio

    await asyncio.sleep(seconds)
    return "rested"


@task(takes_context=True, max_attempts=2)
def introspect(context) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """Fails its first attempt; the second returns what its TaskContext says."""
    result = context.task_result
    if context.attempt == 1:
        raise LookupError("first attempt")
    return {"worker_ids": result.worker_ids,
            "errors": [e.exception_class_path for e in result.errors],
            "started_at": result.started_at.isoformat(),
            "last_attempted_at": result.last_attempted_at.isoformat()}


@task(backend="short", queue_name="slow", takes_context=True)
def stubborn(context, label: str, seconds: float) -> int:  # type: ignore[no-untyped-def]
    """A sync task that writes one row per execution as it starts ("LABEL ATTEMPT"),
    then, on its first attempt only, sleeps ``seconds``."""
    import time

    Ran.objects.create(tenant="stubborn", label=f"{label} {context.attempt}")
    if context.attempt == 1:
        time.sleep(seconds)
    return int(context.attempt)


@receiver(task_started)
@receiver(task_finished)
def note_signal(sender, task_result, **kwargs) -> None:  # type: ignore[no-untyped-def]
    """Django's task signals reach the project's receivers (for `plain`, `flaky` and
    `introspect` only)."""
    if task_result.task.name in ("plain", "flaky", "introspect"):
        Ran.objects.create(tenant="signals",
                           label=f"{task_result.task.name} {task_result.status}")
