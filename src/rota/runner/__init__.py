"""The pipeline runner (docs/design.md, "The runner").

- :mod:`.stage`: :class:`Stage`, triggers, stop reasons, :class:`RunResult`;
- :mod:`.context`: :class:`JobContext` (what a handler gets) and a run's state;
- :mod:`.completer`: completing finished jobs in group commits;
- :mod:`.pipeline`: :class:`Pipeline` and its run loop.
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
