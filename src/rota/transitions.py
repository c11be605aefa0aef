"""The fenced transitions of claimed jobs (docs/design.md, "Fencing", "Settling twice",
"Fail and backoff", "Defer", "Stuck jobs"): complete, fail, defer, release, the
runner's heartbeat and postponement, restoring pushed due times, failing stuck jobs,
and reading what a claim left (``claim_states``).

Every transition after a claim is guarded by the claim's ``claim_token``; one that
matches nothing reads ``claim_states`` once to tell a repeat under the same claim from
a lost claim. :class:`Transitions` takes what it needs (the store, the settings, a way
to get a connection, the give-up hooks), not the :class:`rota.Queue`, which holds one
and exposes each transition as a method of the same name (with its span). Each
statement is called through its typed function (:mod:`rota.statements`).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg

from . import statements as sql
from .checks import LATEST_DUE, require_due_time, require_row_id
from .cost import charge_units, job_cost
from .errors import InvalidInput, UnreadableJob, first_line
from .give_up import Connect, GiveUpHooks
from .job import FailOutcome, Job, due_or_delay
from .results import ResultError, encode_result, error_record
from .settings import QueueSettings
from .store import AnyConn, Store

log = logging.getLogger("rota.queue")


class Transitions:
    """A queue's fenced job transitions.

    Args:
        store: runs the statements.
        settings: the queue's settings (its clock offset, backoff, stale window,
            deferral cap, payload limit), read live.
        connect: gives a connection (``connect(None)``: one of the queue's pool,
            committed on exit; ``connect(conn)``: ``conn``).
        hooks: the give-up hooks run when a transition on the pool gives a job up.
    """

    def __init__(self, store: Store, settings: QueueSettings, connect: Connect,
                 hooks: GiveUpHooks) -> None:
        self.store = store
        self.settings = settings
        self.connect = connect
        self.hooks = hooks

    async def after_claim(self, claimed: list[Job], unreadable: list[UnreadableJob] | None,
                          *, conn: AnyConn | None = None) -> list[Job]:
        """What a claim does with the rows it took: one that cannot be turned into a
        :class:`Job` gives up at once through the usual path (its error naming what
        could not be read; docs/design.md, "Bad data belongs to its job"); the attempt
        before this claim of a job claimed again gets an error when it left none
        (docs/design.md, "Stale locks").

        Args:
            claimed: the claimed jobs, in claim order.
            unreadable: receives an :class:`UnreadableJob` per row given up, if given.
            conn: the claim's connection (the caller's, if it gave one).

        Returns:
            The readable jobs, in claim order.
        """
        jobs: list[Job] = []
        for job in claimed:
            problems = job.problems
            if not problems:
                jobs.append(job)
                continue
            error = UnreadableJob(job.id, problems)
            log.error("%s; it gives up", error)
            await self.fail(job, str(error), give_up=True, conn=conn)
            if unreadable is not None:
                unreadable.append(error)
        if any(j.attempts > 1 for j in jobs):
            await self._record_lost_attempts([j for j in jobs if j.attempts > 1], conn)
        return jobs

    async def _record_lost_attempts(self, jobs: list[Job], conn: AnyConn | None) -> None:
        """Give the attempt before this claim an error when it left none: its run was
        killed or cut off and its lock went stale (docs/design.md, "Stale locks").
        A failure here is logged, never raised: the claim has committed, and its jobs
        must reach the caller."""
        try:
            async with self.connect(conn) as c:
                await sql.lost_attempts(
                    self.store, ids=[j.id for j in jobs],
                    claim_tokens=[j.claim_token for j in jobs],
                    offset=self.settings.clock_offset, conn=c)
        except Exception as exc:
            log.warning("could not record the lost attempts of jobs %s: %s",
                        [j.id for j in jobs], first_line(exc, with_type=True))

    async def complete(self, job: Job, *, result: Any = None,
                       cost: Decimal | float | int | None = None,
                       conn: AnyConn | None = None) -> bool:
        """Mark a claimed job done, under its claim, keeping ``result`` (docs/design.md,
        "Results").

        Args:
            job: the claimed job.
            result: the handler's return value, stored on the job (read it back with
                :meth:`rota.Queue.result`): JSON as a payload is (:func:`rota.job.encode_payload`),
                at most ``max_payload_bytes``; ``None`` stores nothing.
            cost: what the job is charged in its group's and owner's served counts
                (docs/design.md, "Cost"): positive units, rounded to 6 places, at most
                :data:`rota.cost.MAX_COST`; ``None`` charges 1.
            conn: the caller's connection.

        Repeating it under the same claim is harmless and answers the same: a complete
        whose reply was lost with the connection, asked again, finds the job "already
        done by this claim" (docs/design.md, "Settling twice").

        Returns:
            ``True`` when done by this claim (now or before); ``False`` when this claim
            lost the job (it was reclaimed after a stale lock, failed as stuck, or
            settled otherwise), and nothing changed.

        Raises:
            ResultError: ``result`` cannot be stored; the job was failed with that
                error (given up at once: the value would not fit on a retry either)
                rather than completed without it or lost.
            InvalidCharge: ``cost`` is not a positive number within the limit; nothing
                was written.
        """
        charged = None if cost is None else job_cost(charge_units(cost))
        encoded = self._encoded_result(job, result)
        if isinstance(encoded, ResultError):
            await self.fail(job, encoded, give_up=True, conn=conn)
            raise encoded
        self._check(job)
        async with self.connect(conn) as c:
            if await sql.complete(self.store, id=job.id, claim_token=job.claim_token,
                                  offset=self.settings.clock_offset, result=encoded,
                                  started_at=job.locked_at, cost=charged,
                                  schema_name=self.settings.schema, conn=c) == 1:
                return True
            states = await self.claim_states([job], conn=c)
        return states.get(job.id) == "done"

    async def claim_states(self, jobs: Sequence[Job], *,
                           conn: AnyConn | None = None) -> dict[int, str]:
        """What became of jobs under the claims that handed them out (docs/design.md,
        "Settling twice"): for each job whose row still carries its claim's token, the
        status that claim left it in (``running``: still held; ``done``, ``pending``,
        ``failed``: how it was settled). A job missing from the answer was lost by its
        claim.

        Args:
            jobs: claimed jobs (those without a ``claim_token`` are left out).
            conn: the caller's connection.

        Returns:
            Job id -> status, for the jobs this claim still answers for.
        """
        return {i: status for (i, _), status in
                (await self._claim_states(jobs, conn=conn)).items()}

    async def _claim_states(self, jobs: Sequence[Job], *, conn: AnyConn | None = None
                            ) -> dict[tuple[int, uuid.UUID], str]:
        """:meth:`claim_states` by claim: ``(id, claim_token) -> status``, so a job
        listed under two claims (one lost, one holding it) is answered for the holding
        one only."""
        fenced = [j for j in jobs if j.claim_token is not None]
        if not fenced:
            return {}
        return await sql.claim_states(self.store, ids=[j.id for j in fenced],
                                      claim_tokens=[j.claim_token for j in fenced],
                                      conn=conn)

    async def complete_many(self, jobs: Sequence[Job], *,
                            results: Sequence[Any] | None = None,
                            costs: Sequence[Decimal | float | int | None] | None = None,
                            conn: AnyConn | None = None) -> list[bool]:
        """Mark claimed jobs done in one statement, each under its own claim (what
        :meth:`complete` does for one job, for a whole batch).

        Args:
            jobs: the claimed jobs.
            results: one return value per job, in the same order (as
                :meth:`complete`'s ``result``), or ``None`` for none at all.
            costs: one cost per job, in the same order (as :meth:`complete`'s
                ``cost``; ``None`` in it charges that job 1), or ``None`` for 1 each.
            conn: the caller's connection.

        Returns:
            One flag per job, in the order given: ``True`` when done, ``False`` when
            this claim lost that job (nothing changed for it). A job listed twice
            under one claim is completed once and gets the same flag both times.

        Raises:
            ResultError: a value cannot be stored; the message names its job and
                nothing was written (fail that job, complete the others).
            InvalidInput: ``results`` or ``costs`` does not have one value per job, or
                a job is listed twice under one claim with results or costs the
                database would store differently; nothing was written.
            InvalidCharge: a cost is not a positive number within the limit; nothing
                was written.
        """
        batch = list(jobs)
        for j in batch:
            if not isinstance(j, Job):
                raise InvalidInput(f"expected a rota.Job, got {type(j).__name__}")
        values = list(results) if results is not None else [None] * len(batch)
        if len(values) != len(batch):
            raise InvalidInput(f"complete_many: {len(values)} results for "
                               f"{len(batch)} jobs")
        if isinstance(costs, (str, bytes)):
            raise InvalidInput(f"complete_many: costs must be a sequence of numbers "
                               f"(one a job), got {type(costs).__name__}")
        charges = list(costs) if costs is not None else [None] * len(batch)
        if len(charges) != len(batch):
            raise InvalidInput(f"complete_many: {len(charges)} costs for "
                               f"{len(batch)} jobs")
        # By claim: a job listed twice under one claim must say the same both times (it
        # is completed once); listed under a lost claim and the one holding it, each
        # listing keeps its own values (only the holder's are written). "The same" is
        # what the database would store: equal jsonb (key order, 1 and 1.0, -0.0 and 0
        # alike) and equal charged cost (no cost charges 1). A job with no claim is
        # never written, so never refused.
        # (id, claim) -> (charged cost or None, encoded result, result as given)
        listed: dict[tuple[int, uuid.UUID | None], tuple[Decimal | None, str | None, Any]] = {}
        for j, v, charge in zip(batch, values, charges, strict=True):
            cost = None if charge is None else job_cost(charge_units(charge))
            e = self._encoded_result(j, v)
            if isinstance(e, ResultError):
                raise e
            key = (j.id, j.claim_token)
            if key in listed and j.claim_token is not None:
                was_cost, was_e, _ = listed[key]
                if (was_cost or ONE) != (cost or ONE):
                    raise _listed_twice(j.id, "costs")
                if _stored_json(was_e) != _stored_json(e):
                    raise _listed_twice(j.id, "results")
            listed[key] = (cost, e, v)
        # Job rows are locked in id order, the one order of every statement that locks
        # several jobs. The served-count changes a completion makes are new fair_served
        # rows of its own (the delta rule, fair/bookkeeping.sql), so two batches never
        # wait on each other's bookkeeping rows.
        fenced = sorted((j for j in batch if j.claim_token is not None),
                        key=lambda j: j.id)
        if not fenced:
            return [False] * len(batch)
        try:
            async with self.connect(conn) as c:
                done = await sql.complete_many(
                    self.store, ids=[j.id for j in fenced],
                    claim_tokens=[j.claim_token for j in fenced],
                    results=[listed[j.id, j.claim_token][1] for j in fenced],
                    started_ats=[j.locked_at for j in fenced],
                    costs=[listed[j.id, j.claim_token][0] for j in fenced],
                    offset=self.settings.clock_offset, schema_name=self.settings.schema,
                    conn=c)
                rest = [j for j in fenced if (j.id, j.claim_token) not in done]
                if rest:
                    # Lost, or done by this very claim before (a repeat): say which, by
                    # claim (the same job may be listed under a lost claim and the one
                    # holding it).
                    states = await self._claim_states(rest, conn=c)
                    done |= {k for k, status in states.items() if status == "done"}
        except psycopg.errors.DeadlockDetected:
            if conn is not None:
                raise
            # Nothing was written (the statement was its own transaction): one by one.
            log.info("complete_many: deadlock detected, completing %d jobs one by one",
                     len(fenced))
            done = {(j.id, j.claim_token) for j in fenced if j.claim_token is not None
                    # The value as given: complete encodes it (the encoded text
                    # given again would be stored as a JSON string).
                    if await self.complete(j, result=listed[j.id, j.claim_token][2],
                                           cost=listed[j.id, j.claim_token][0])}
        return [j.claim_token is not None and (j.id, j.claim_token) in done for j in batch]

    async def fail(self, job: Job, error: BaseException | str, *, give_up: bool = False,
                   conn: AnyConn | None = None) -> FailOutcome:
        """Record a failed attempt of a claimed job (docs/design.md,
        "Fail and backoff").

        With attempts left the job goes back to pending with
        ``run_after = now + min(backoff_base * 2**attempts, max_backoff)``; with attempts
        used up it becomes ``failed`` (``finished_at`` set) and its give-up hook runs
        (on the pool; on ``conn``, the hook stays owed for maintenance). ``give_up``
        ends it failed whatever its attempts (a failure no retry can mend). The error
        text is kept in ``last_error`` (NUL characters escaped), and every attempt's
        error, with an exception's traceback, bounded, in ``job_errors``
        (docs/design.md, "Results"). Repeated under the same claim (a reply lost with
        the connection), it answers what the first one did (docs/design.md, "Settling
        twice").

        Returns:
            ``"retry"``, ``"failed"``, or ``"lost"`` when this claim no longer holds the
            job (nothing changed; also when this claim completed or deferred it).
        """
        text, kind, trace = error_record(error)
        self._check(job)
        settings = self.settings
        async with self.connect(conn) as c:
            status = await sql.fail(
                self.store, id=job.id, claim_token=job.claim_token,
                offset=settings.clock_offset, error=text, error_type=kind, traceback=trace,
                give_up=give_up, started_at=job.locked_at, schema_name=settings.schema,
                backoff_base=settings.backoff_base, max_backoff=settings.max_backoff,
                latest_due=LATEST_DUE, conn=c)
            if status is None:  # lost, or a repeat under this claim: say which
                status = (await self.claim_states([job], conn=c)).get(job.id)
        if status not in ("pending", "failed"):
            return "lost"
        if status == "failed":
            if conn is None:
                await self.hooks.run([job.id])
            return "failed"
        return "retry"

    async def defer(
        self, jobs: Job | Iterable[Job], until: datetime | timedelta | None = None, *,
        conn: AnyConn | None = None,
    ) -> int:
        """Put claimed jobs back without burning an attempt (docs/design.md,
        "Defer").

        Each job goes back to pending with ``run_after = until`` (an aware instant; a
        ``timedelta``: that long after the queue's clock now; ``None``: now), its lock
        cleared, ``attempts`` decreased by one (undoing the claim) and ``deferrals``
        increased by one; ``last_error`` is untouched. Jobs this caller's claim no longer
        holds (never claimed, done, failed, reclaimed by another run) are left alone.
        With ``max_deferrals`` set, a job past it gives up instead. Repeated under the
        same claims, it counts the jobs those claims deferred (docs/design.md,
        "Settling twice").

        Returns:
            How many jobs were deferred.

        Raises:
            NaiveDatetimeError: ``until`` has no time zone.
            InvalidInput: ``until`` is out of range (see :func:`rota.checks.require_due_time`),
                a negative ``timedelta`` or one longer than 1000 years
                (:data:`rota.checks.MAX_DURATION`), or neither a datetime nor a
                timedelta.
        """
        batch = [jobs] if isinstance(jobs, Job) else list(jobs)
        checked = due_or_delay(until, "until")
        # A delay is at most 1000 years (MAX_DURATION): the statement adds it to the
        # queue's clock, which this process never reads on its own.
        delay = checked if isinstance(checked, timedelta) else timedelta(0)
        fenced = [j for j in batch if j.claim_token is not None]
        if not fenced:
            return 0
        async with self.connect(conn) as c:
            rows = await sql.defer(
                self.store, ids=[j.id for j in fenced],
                claim_tokens=[j.claim_token for j in fenced],
                until=None if isinstance(checked, timedelta) else checked, delay=delay,
                max_deferrals=self.settings.max_deferrals,
                offset=self.settings.clock_offset, conn=c)
            if len(rows) < len({j.id for j in fenced}):
                # Lost, or deferred by this very claim before (a repeat): say which.
                seen = {r[0] for r in rows}
                states = await self.claim_states([j for j in fenced if j.id not in seen],
                                                 conn=c)
                rows += [(i, status) for i, status in states.items()
                         if status in ("pending", "failed")]
        gave_up = [r[0] for r in rows if r[1] == "failed"]
        if gave_up and conn is None:
            await self.hooks.run(gave_up)
        return sum(1 for r in rows if r[1] == "pending")

    async def release(self, jobs: Iterable[Job], *, not_before: datetime | None = None,
                      conn: AnyConn | None = None) -> int:
        """Hand claimed jobs back as if they had never been claimed: pending again, the
        claim's attempt returned, no deferral counted, the due time kept (what a runner
        does with jobs its run ends before starting: docs/design.md, "Defer"). Jobs
        this caller's claim no longer holds are left alone.

        Args:
            jobs: the claimed jobs.
            not_before: an aware instant the jobs are not due before (a due time
                already later is kept); ``None`` keeps each job's due time.
            conn: the caller's connection.

        Returns:
            How many jobs were released.

        Raises:
            InvalidInput: an item is not a :class:`rota.Job`, or ``not_before`` is not
                an aware datetime in range.
        """
        batch = list(jobs)
        for j in batch:
            if not isinstance(j, Job):
                raise InvalidInput(f"expected a rota.Job, got {type(j).__name__}")
        if not_before is not None:
            require_due_time(not_before, "not_before")
        fenced = [j for j in batch if j.claim_token is not None]
        if not fenced:
            return 0
        async with self.connect(conn) as c:
            return await sql.release(
                self.store, ids=[j.id for j in fenced],
                claim_tokens=[j.claim_token for j in fenced], not_before=not_before,
                conn=c)

    async def restore_due_times(
        self, pushed: Sequence[tuple[int, uuid.UUID | None, datetime, datetime | None]], *,
        conn: AnyConn | None = None,
    ) -> int:
        """Undo the push of due times a run made so it would not claim jobs again (a
        deferral or a hand-back due before its budget's end is due at that end), once
        the run has ended sooner: each job is due at the time asked for again, or now
        when that has passed (docs/design.md, "Defer").

        Args:
            pushed: ``(job id, claim token left on the row or None, the pushed due time,
                the due time asked for or None: now)`` per job.
            conn: the caller's connection.

        Returns:
            How many jobs are due sooner; a job claimed, moved or retried since its
            push is left alone and not counted.

        Raises:
            NaiveDatetimeError: a due time has no time zone.
            InvalidInput: a bad job id, claim token or due time; nothing changed.
        """
        for job_id, token, at, asked in pushed:
            require_row_id(job_id)
            if token is not None and not isinstance(token, uuid.UUID):
                raise InvalidInput(f"claim token of job {job_id} must be a UUID or None, "
                                   f"got {type(token).__name__}")
            require_due_time(at, "pushed")
            if asked is not None:
                require_due_time(asked, "asked")
        if not pushed:
            return 0
        async with self.connect(conn) as c:
            return await sql.restore_due(
                self.store, ids=[p[0] for p in pushed], claim_tokens=[p[1] for p in pushed],
                pushed=[p[2] for p in pushed], asked=[p[3] for p in pushed],
                offset=self.settings.clock_offset, conn=c)

    async def fail_stuck_jobs(self) -> list[Job]:
        """Fail running jobs whose lock is stale and whose attempts are used up (docs/design.md,
        "Stuck jobs"), then run their give-up hooks (and any others still owed).

        Returns:
            The jobs failed by this call, as they are now (status ``failed``).
        """
        async with self.connect(None) as c:
            rows = await sql.fail_stuck(
                self.store, offset=self.settings.clock_offset,
                stale_after=self.settings.stale_after, schema_name=self.settings.schema,
                conn=c)
        stuck = sorted((Job.from_row(r, lenient=True) for r in rows), key=lambda j: j.id)
        await self.hooks.run()
        return stuck

    async def heartbeat(self, jobs: Sequence[Job], *, conn: AnyConn | None = None) -> int:
        """Refresh the locks of claimed jobs a live run still holds (``locked_at`` =
        now), so they never look stale while it lives ("the stale window is safe by
        construction": docs/design.md, "Stale locks"). Fenced by each job's claim: a job
        this claim lost is not touched.

        Returns:
            How many locks were refreshed.
        """
        fenced = [j for j in jobs if j.claim_token is not None]
        if not fenced:
            return 0
        async with self.connect(conn) as c:
            return await sql.heartbeat(
                self.store, ids=[j.id for j in fenced],
                claim_tokens=[j.claim_token for j in fenced],
                offset=self.settings.clock_offset, conn=c)

    async def postpone(self, job_type: str, until: datetime, *,
                       conn: AnyConn | None = None) -> int:
        """Make the claimable jobs of ``job_type`` wait until ``until`` (a quota's
        reset, when a run skips the type's stage): pending jobs due earlier get
        ``run_after = until`` (attempts and deferrals untouched), and running jobs whose
        lock went stale with attempts left (a dead run's) go back to pending at
        ``until``, their lost claim fenced (docs/design.md, "Quotas").

        Returns:
            How many jobs were postponed.

        Raises:
            NaiveDatetimeError: ``until`` has no time zone.
        """
        t = self.settings.check_type(job_type)
        require_due_time(until, "until")
        async with self.connect(conn) as c:
            return await sql.postpone(
                self.store, type=t, until=until, offset=self.settings.clock_offset,
                stale_after=self.settings.stale_after, conn=c)

    def _encoded_result(self, job: Job, value: Any) -> str | ResultError | None:
        """``value`` checked and encoded for ``jobs.result``, or the error saying why it
        cannot be stored (naming the job)."""
        try:
            return encode_result(value, self.settings.max_payload_bytes)
        except ResultError as exc:
            return ResultError(f"job {job.id}: {exc}")

    @staticmethod
    def _check(job: Job) -> None:
        if not isinstance(job, Job):
            raise InvalidInput(f"expected a rota.Job, got {type(job).__name__}")


#: What a completion with no cost charges (docs/design.md, "Cost").
ONE = job_cost(1)


def _listed_twice(job_id: int, what: str) -> InvalidInput:
    return InvalidInput(
        f"complete_many: job {job_id} is listed twice under the same claim with "
        f"different {what}; list it once (nothing was written)")


def _stored_json(text: str | None) -> Any:
    """A comparable form of a JSON text as jsonb stores it: objects by key, whatever
    their order (the last of a repeated key, as jsonb keeps it), numbers by value (1,
    1.0 and 1e0 alike, -0.0 as 0), and true, false and null apart from numbers.
    ``None`` (no result) is its own form."""
    if text is None:
        return None
    return _stored(json.loads(text, parse_float=Decimal, parse_int=Decimal))


def _stored(value: Any) -> Any:
    if isinstance(value, dict):
        return ("object", frozenset((k, _stored(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("array", tuple(_stored(v) for v in value))
    if isinstance(value, Decimal):
        return ("number", value)
    return (type(value).__name__, value)  # str, bool, None: equal only to their kind

__all__ = ["Transitions"]
