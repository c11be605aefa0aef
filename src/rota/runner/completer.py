"""Completing a batch's jobs in group commits (docs/design.md, "The runner")."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable

from .. import tracing
from ..checks import storable_text
from ..queue import Queue
from ..results import MAX_ERROR_CHARS, ResultError, encode_result
from .context import JobContext, RunState, retrying

log = logging.getLogger("rota.runner")


class Completer:
    """Completes the jobs whose handlers returned normally, in batches: one
    ``complete_many`` statement for whatever has finished since the previous one was
    sent (group commit). A lone job is completed at once, as before; jobs that finish
    while a statement is in flight go together in the next one, so a batch of fast
    handlers costs one or two statements instead of one per job. A statement whose
    connection fails is sent again (docs/design.md, "Settling twice")."""

    def __init__(self, queue: Queue, run: RunState) -> None:
        self.queue = queue
        self.run = run
        self.pending: list[JobContext] = []
        self.task: asyncio.Task[None] | None = None

    def add(self, ctxs: list[JobContext]) -> None:
        if not ctxs:
            return
        self.pending.extend(ctxs)
        if self.task is None or self.task.done():
            if self.task is not None and (self.task.cancelled()
                                          or self.task.exception() is not None):
                return  # a failed flush: wait() raises it; these stay unsettled
            self.task = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        # Under the run's span: the task was started from a handler's, and the
        # completions serve many handlers (rota.tracing).
        with tracing.current(self.run.trace.span):
            await self._flush_pending()

    async def _flush_pending(self) -> None:
        while self.pending:
            batch, self.pending = self.pending, []
            oks = await retrying(
                functools.partial(self.queue.complete_many, [c.job for c in batch],
                                  results=[c.result for c in batch]),
                self.run, "complete")
            for c, ok in zip(batch, oks, strict=True):
                c._settle("done" if ok else "lost")

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
        if self.task is not None:
            await asyncio.gather(self.task, return_exceptions=True)


async def with_results(ctxs: list[JobContext], value: object) -> list[JobContext]:
    """The jobs of a handler call that returned normally, ready to complete: a
    one-job handler's return value becomes its job's result (a batch handler sets
    ``ctx.result`` itself), each checked and encoded now, so the batch that completes
    them cannot fail on one. A job whose value cannot be stored fails (given up: the
    value would not fit on a retry either) with the error saying why (docs/design.md,
    "Results")."""
    if len(ctxs) == 1 and value is not None:
        ctxs[0].result = value
    ready = []
    for ctx in ctxs:
        if ctx.settled:
            continue
        if ctx.result is not None:
            try:
                ctx.result = encode_result(ctx.result, ctx.queue.max_payload_bytes)
            except ResultError as exc:
                log.info("job %s: %s", ctx.job.id, exc)
                await ctx.fail(exc, give_up=True)
                continue
        ready.append(ctx)
    return ready


async def settle_all(ctxs: list[JobContext],
                      settle: Callable[[JobContext], Awaitable[object]]) -> int:
    n = 0
    for ctx in ctxs:
        if not ctx.settled:
            await settle(ctx)
            n += 1
    return n


def error_text(exc: BaseException) -> str:
    """One error as storable text (a NUL or a lone surrogate in an exception's message
    would make the runs row unwritable), cut as a job's error is (docs/design.md,
    "Results")."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return storable_text(f"{type(exc).__name__}: {exc}", MAX_ERROR_CHARS)

