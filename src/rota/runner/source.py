"""Where a run's pipeline comes from (docs/design.md, "Ways to run it"): a pipeline, or
a zero-argument factory of one, as the worker, the cron endpoint and the CLI accept
it. Here, not in :mod:`rota.web`, so that the library and the worker never import a
web framework unless a web app is asked for."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, Protocol, TypeAlias

from ..checks import seconds_text
from ..errors import ConfigError, InvalidInput
from ..queue import Queue
from .stage import Trigger


class RunnablePipeline(Protocol):
    """The part of ``rota.runner.Pipeline`` the endpoint, the worker and the CLI use."""

    async def run(self, *, trigger: Trigger, time_budget: timedelta) -> Any: ...


#: A pipeline, or a zero-argument callable that returns one (or an awaitable of one);
#: a factory is called once per run, so each run gets a fresh pipeline object.
PipelineSource: TypeAlias = (
    "RunnablePipeline | Callable[[], RunnablePipeline | Awaitable[RunnablePipeline]]"
)


async def resolve_pipeline(source: Any) -> Any:
    """Return the pipeline a :data:`PipelineSource` stands for.

    Anything with a ``run`` method is the pipeline itself; any other callable is a factory
    and is called (and awaited when it returns an awaitable).

    Raises:
        InvalidInput: ``source`` is neither, or the factory returned no pipeline.
    """
    if callable(getattr(source, "run", None)):
        return source
    if not callable(source):
        raise InvalidInput(
            f"expected a pipeline (an object with a run method) or a factory of one, "
            f"got {type(source).__name__}"
        )
    made = source()
    if inspect.isawaitable(made):
        made = await made
    if not callable(getattr(made, "run", None)):
        raise InvalidInput(
            f"the pipeline factory returned {type(made).__name__}, not a pipeline"
        )
    return made


def pipeline_queue(pipeline: Any, default: Queue) -> Queue:
    """The queue that works for an app: its pipeline's ``queue`` (a
    :class:`rota.Pipeline`'s carries its stages' ``max_attempts`` and give-up hooks:
    :meth:`rota.Queue.with_stage_rules`), or ``default`` when the pipeline has none (a
    factory not yet called, an object with only ``run``). What enqueues for the app, runs
    its give-up hooks or reports them goes through it (docs/design.md, "The runner").

    Args:
        pipeline: a pipeline, a factory of one, or ``None``.
        default: the queue to use otherwise (the one the app was given).

    Returns:
        A :class:`rota.Queue`.
    """
    found = getattr(pipeline, "queue", None)
    return found if isinstance(found, Queue) else default


def check_time_budget(pipeline: Any, time_budget: timedelta) -> None:
    """Refuse a budget the pipeline's runs would refuse: one not shorter than its
    ``platform_timeout`` (pipelines without one are not checked), so a long-running
    process fails at start instead of at every run.

    Raises:
        ConfigError: ``time_budget >= pipeline.platform_timeout``.
    """
    timeout = getattr(pipeline, "platform_timeout", None)
    if isinstance(timeout, timedelta) and time_budget >= timeout:
        raise ConfigError(f"time_budget ({seconds_text(time_budget)}) must be shorter than "
                          f"the platform timeout ({seconds_text(timeout)})")


__all__ = ["PipelineSource", "RunnablePipeline", "check_time_budget", "pipeline_queue",
           "resolve_pipeline"]
