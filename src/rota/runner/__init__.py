"""The pipeline runner (docs/design.md, "The runner").

- :mod:`.context`: :class:`JobContext` (what a handler gets) and a run's state;
- :mod:`.stage`: :class:`Stage`, triggers, stop reasons, :class:`RunResult`;
- :mod:`.batching`: the claim size a stage's batch grows and shrinks to;
- :mod:`.completer`: grouping finished jobs' completions into one statement;
- :mod:`.settle`: settling a job, the one path: how a handler call ended to what
  happens to its jobs (:func:`~.settle.decide`), carried out by the
  :class:`~.settle.Settler`, the only runner code calling the queue's job transitions;
- :mod:`.rates`: the runner's side of rate limits;
- the three parts of a run: :mod:`.recording` (the ``runs`` row and the heartbeat),
  :mod:`.batch` (one batch's handlers, concurrency, deadlines, settling) and
  :mod:`.loop` (which stage next, the budget, the stop reason);
- :mod:`.pipeline`: :class:`Pipeline`, the stages' configuration, which puts the three
  together.

Each module imports only those listed before it.
"""

from ..maintenance import Maintainer
from ..settings import DEFAULT_PLATFORM_TIMEOUT, DEFAULT_TIME_BUDGET
from .context import JobContext
from .pipeline import Pipeline
from .stage import (
    STOP_REASONS,
    TRIGGERS,
    BatchHandler,
    Handler,
    RunResult,
    Stage,
    StopReason,
    Trigger,
)

__all__ = [
    "DEFAULT_PLATFORM_TIMEOUT",
    "DEFAULT_TIME_BUDGET",
    "STOP_REASONS",
    "TRIGGERS",
    "BatchHandler",
    "Handler",
    "JobContext",
    "Maintainer",
    "Pipeline",
    "RunResult",
    "Stage",
    "StopReason",
    "Trigger",
]
