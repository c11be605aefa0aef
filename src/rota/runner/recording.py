"""Recording a run (docs/design.md, "The runner"): its ``runs`` row, written when the
run starts, saved as it goes and completed at its end, and the heartbeat that keeps
the locks of the jobs it holds fresh.

The run loop (:mod:`.loop`) decides what a run does; :class:`RunRecorder` only writes
down what its :class:`~rota.runner.context.RunState` says. The runs row is this
module's: no other part of the runner writes it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from datetime import datetime, timedelta

import psycopg

from .. import statements as sql
from ..errors import first_line
from ..queue import Queue
from ..store import is_connection_failure
from .context import RunState
from .stage import StopReason

log = logging.getLogger("rota.runner")

# Waits between attempts to record a run's end after a connection failure (about 7 s in
# all: a fast restart of PostgreSQL takes well under that).
END_RETRY_DELAYS = (0.1, 0.4, 1.0, 2.0, 4.0)
#: Between batches the runs row is saved at most this often (seconds); the heartbeat and
#: the end of the run save it too. A save per batch cost a commit per 25 jobs.
SAVE_EVERY_S = 1.0
#: How long :meth:`RunRecorder.stop_heartbeat` waits for a cancelled heartbeat to end
#: before it cancels it again (seconds).
HEARTBEAT_RECANCEL_S = 0.05
#: What a run's summary becomes when the runs row refuses it, so its end is recorded.
UNSTORABLE = {"summary_unstorable": 1}


def worker_id() -> str:
    """This process as a run records it: ``host:pid`` (the same for every run of one
    worker; the pid read each time, so a forked child names itself)."""
    return f"{socket.gethostname()}:{os.getpid()}"


class RunRecorder:
    """Writes one pipeline's runs rows and keeps its runs' locks fresh.

    Args:
        queue: the :class:`rota.Queue` (its clock dates the row; its
            :meth:`~rota.Queue.heartbeat` refreshes the locks).
        heartbeat_every: how often :meth:`heartbeat` refreshes the locks and saves the
            row (a positive ``timedelta``, at most half the platform timeout: the
            pipeline checks it).
    """

    def __init__(self, queue: Queue, heartbeat_every: timedelta) -> None:
        self.queue = queue
        self.heartbeat_every = heartbeat_every

    async def start(self, run: RunState) -> datetime:
        """Write the run's row (``finished_at`` empty, so a run that is killed stays
        visibly unfinished until maintenance marks it).

        Returns:
            ``started_at``, aware, on the queue's clock.

        Raises:
            psycopg.Error, psycopg_pool.PoolTimeout: the row could not be written.
        """
        q = self.queue
        async with q.connection() as c:
            return await sql.run_start(q.store, id=run.id, trigger=run.trigger,
                                       offset=q.clock_offset, worker=worker_id(), conn=c)

    async def heartbeat(self, run: RunState) -> None:
        """Every ``heartbeat_every`` until cancelled, refresh the locks of the jobs the
        run holds (its running handlers' and a prefetched batch's) and save its
        progress. A failed beat is logged and the next one tried."""
        while True:
            await asyncio.sleep(self.heartbeat_every.total_seconds())
            try:
                # A handler past its deadline is not covered: if it ignores its
                # cancellation, its job goes stale like a dead run's; a sync handler's
                # thread, which cannot be cancelled, is covered while it runs, so no
                # other worker starts the job meanwhile (docs/design.md, "Handler
                # deadlines").
                now = time.monotonic()
                held = [c.job for c in list(run.held.values()) if not c.abandoned and (
                    c.deadline is None or now < c.deadline or c.in_thread)]
                prefetched = run.prefetched[1] if run.prefetched is not None else None
                if prefetched is not None and prefetched.done() \
                        and not prefetched.cancelled() and prefetched.exception() is None:
                    held += prefetched.result()
                if held:
                    await self.queue.heartbeat(held)
                await self.save(run)
            except Exception:
                log.exception("run %s: heartbeat failed", run.id)

    @staticmethod
    async def stop_heartbeat(task: asyncio.Task[None]) -> None:
        """Cancel a :meth:`heartbeat` task and wait until it has ended.

        One ``cancel()`` may not end it: on Python 3.11, ``asyncio.wait_for`` returns a
        result that arrived together with a cancellation and drops the cancellation,
        and psycopg_pool waits for a connection through it. A beat cancelled just as
        the pool hands it a connection (a pool refilling after a cut link or a
        restart) so goes on beating, and a run awaiting it never recorded its end:
        the worker hung until its platform timeout after a stop request and exited 1,
        its run later marked killed. So it is cancelled again until it ends (each beat
        is bounded by the statement deadline; the sleep between beats ends at once)."""
        while not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=HEARTBEAT_RECANCEL_S)
        if not task.cancelled():
            task.exception()  # retrieved: a heartbeat logs its own failures

    async def save(self, run: RunState, *, final: bool = False,
                   stop_reason: StopReason | None = None,
                   error: str | None = None) -> datetime | None:
        """Save the run's counters (``final``: and its end, with ``stop_reason`` and
        ``error``).

        Returns:
            ``finished_at`` (aware) when ``final``, else ``None``.

        Raises:
            psycopg.Error: the row refused the values or the connection failed.
        """
        q = self.queue
        run.saved_at = time.monotonic()
        async with q.connection() as c:
            return await sql.run_save(q.store, **run.save_params(), final=final,
                                      stop_reason=stop_reason, error=error,
                                      offset=q.clock_offset, conn=c)

    async def save_progress(self, run: RunState) -> None:
        """Save the run's counters after a batch, at most every ``SAVE_EVERY_S``. A
        save the row refuses is logged, not fatal: the run's end is recorded anyway
        (:meth:`save_end`).

        Raises:
            psycopg.Error: the connection failed (the run ends in error).
        """
        if time.monotonic() - run.saved_at >= SAVE_EVERY_S and not run.ended:
            try:
                await self.save(run)
            except psycopg.Error as exc:
                if is_connection_failure(exc):
                    raise
                log.error("run %s: could not save its progress: %s", run.id,
                          first_line(exc, with_type=True))

    async def save_end(self, run: RunState, stop: StopReason, error: str | None) -> datetime:
        """Record the run's end, retrying for a few seconds when the connection fails.

        A run cut off by a database restart ends in error, and the first statement after
        it may run on another connection the restart killed (or find the server still
        starting): the run records how it ended as soon as the database answers again,
        rather than raising and leaving its row to be marked "killed" later.

        Returns:
            ``finished_at``, aware, on the queue's clock.

        Raises:
            psycopg.OperationalError: the database stayed unreachable.
            psycopg.Error: the row refused even the end without the summary.
        """
        for delay in (*END_RETRY_DELAYS, None):
            try:
                finished_at = await self.save(run, final=True, stop_reason=stop,
                                              error=error)
            except psycopg.Error as exc:
                if not is_connection_failure(exc):
                    # The row refuses what the run reports: record the end without the
                    # summary rather than leave the run unfinished (docs/design.md,
                    # "Bad data belongs to its job").
                    log.error("run %s: its summary cannot be stored (%s); recording the "
                              "end without it", run.id, first_line(exc, with_type=True))
                    if run.summary == UNSTORABLE or delay is None:
                        raise
                    run.summary = dict(UNSTORABLE)
                    continue
                if delay is None:
                    raise
                log.warning("run %s: could not record its end yet; retrying", run.id)
                await asyncio.sleep(delay)
            else:
                assert finished_at is not None, "the run's row disappeared"
                run.ended = True
                return finished_at
        raise AssertionError("unreachable")

    async def finish_quietly(self, run: RunState, stop: StopReason,
                             error: str | None) -> None:
        """Record the run's end once, logging instead of raising (a cancelled run)."""
        try:
            await self.save(run, final=True, stop_reason=stop, error=error)
            run.ended = True
        except Exception:
            log.exception("run %s: could not record its end", run.id)
