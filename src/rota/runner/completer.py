"""Completing a batch's jobs in group commits (docs/design.md, "The runner").

The batching only: what a group commit sends is the settler's
(:meth:`rota.runner.settle.Settler.complete_many`), the one path that settles a job.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from .. import tracing
from ..checks import storable_text
from ..results import MAX_ERROR_CHARS
from .context import RunState

log = logging.getLogger("rota.runner")
T = TypeVar("T")


class Completer(Generic[T]):
    """Completes the jobs whose handlers returned normally, in batches: one statement
    for whatever has finished since the previous one was sent (group commit). A lone
    job is completed at once, as before; jobs that finish while a statement is in
    flight go together in the next one, so a batch of fast handlers costs one or two
    statements instead of one per job.

    Args:
        send: completes a group (``Settler.complete_many``: one ``complete_many``
            statement, sent again across a dropped connection, docs/design.md,
            "Settling twice"); what it raises, :meth:`wait` raises.
        run: the run (completions go under its span).
    """

    def __init__(self, send: Callable[[list[T]], Awaitable[None]], run: RunState) -> None:
        self.send = send
        self.run = run
        self.pending: list[T] = []
        self.task: asyncio.Task[None] | None = None

    def add(self, items: list[T]) -> None:
        """Hand jobs over to be completed in the next group."""
        if not items:
            return
        self.pending.extend(items)
        if self.task is None or self.task.done():
            if self.task is not None and (self.task.cancelled()
                                          or self.task.exception() is not None):
                return  # a failed flush: wait() raises it; these stay unsettled
            self.task = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        # Under the run's span: the task was started from a handler's, and the
        # completions serve many handlers (rota.tracing).
        with tracing.current(self.run.trace.span):
            while self.pending:
                batch, self.pending = self.pending, []
                await self.send(batch)

    async def wait(self) -> None:
        """Wait until every job handed over is completed (or found lost).

        Raises:
            Whatever completing raised (the jobs not completed stay unsettled).
        """
        while self.task is not None:
            task = self.task
            await task
            if task is self.task and not self.pending:
                return
            if task is self.task:  # added after the task ended
                self.task = asyncio.get_running_loop().create_task(self._flush())

    async def wait_quietly(self) -> None:
        """Wait for the group in flight, if any, raising nothing (a batch's end: what
        it failed to complete stays unsettled and is handed back or failed)."""
        if self.task is not None:
            await asyncio.gather(self.task, return_exceptions=True)


def error_text(exc: BaseException) -> str:
    """One error as storable text (a NUL or a lone surrogate in an exception's message
    would make the runs row unwritable), cut as a job's error is (docs/design.md,
    "Results")."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return storable_text(f"{type(exc).__name__}: {exc}", MAX_ERROR_CHARS)
