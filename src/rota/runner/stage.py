"""Stages and the values a run reports: triggers, stop reasons, :class:`Stage` and
:class:`RunResult` (docs/design.md, "The runner")."""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime, timedelta
from typing import Literal, cast, get_args

from ..checks import positive_int, require_duration, require_text
from ..cost import check_mode
from ..errors import InvalidInput
from ..queue import GiveUpHook
from ..quota import Quota
from ..rates import RateLimit, check_stage_limits
from .context import JobContext, Outcome

Trigger = Literal["cron", "cli", "worker", "manual"]
StopReason = Literal["no_work", "time_budget", "quota_reserve", "quota_exhausted", "error",
                     "interrupted"]
TRIGGERS: tuple[str, ...] = get_args(Trigger)
STOP_REASONS: tuple[str, ...] = get_args(StopReason)
#: Stop reasons that are not incidents (docs/design.md, "The runner"); only ``error`` is.
HEALTHY_STOP_REASONS = frozenset(STOP_REASONS) - {"error"}

Handler = Callable[[JobContext], Awaitable[object]] | Callable[[JobContext], object]
BatchHandler = Callable[[list[JobContext]], Awaitable[None]]

__all__ = ["HEALTHY_STOP_REASONS", "STOP_REASONS", "TRIGGERS", "BatchHandler", "Handler",
           "Outcome", "RunResult", "Stage", "StopReason", "Trigger"]


@dataclass(frozen=True)
class Stage:
    """A job type and how the runner handles it (docs/design.md, "Vocabulary").

    Args:
        type: the job type this stage claims.
        batch: jobs claimed at once, > 0; ``None`` (the default) lets the runner size
            each claim: from ``concurrency``, growing up to 1,000 (to what 0.1 s
            handles at the last batch's pace, 2 to 8 times) while the backlog fills
            the claims and a batch's handlers finish within 0.1 s, halving (not
            below ``concurrency``) while a batch takes over a second
            (:class:`~rota.runner.batching.BatchSize`; docs/design.md, "Batch size").
            Give a number to fix it (a ``batch_handler`` for an API that takes at most
            N items, a quota's ``quota_cost`` per claim).
        concurrency: how many of the batch's jobs run at the same time, > 0 (for a
            ``handler``; a ``batch_handler`` is one call for the whole batch).
        handler: ``async def handler(ctx: JobContext)``, run once per job, or a
            sync ``def handler(ctx)``, run in a thread of its own
            (:meth:`JobContext.to_thread`: a thread cannot be cancelled, so its job is
            held, its lock kept fresh, until the thread returns; past its timeout it is
            overdue and fails once the thread returns; docs/design.md, "Handler
            deadlines"); a sync handler reads ``ctx.job`` but cannot await
            ``ctx``'s methods. It returns to complete the job (what it returns is
            stored as the job's result, JSON as payloads are: docs/design.md,
            "Results"), raises
            ``DeferJob(until)`` to defer it,
            lets :class:`~rota.quota.QuotaExhausted` through to defer it to the
            quota's reset, and raises anything else to fail it (retry with backoff,
            then failed). It may also settle the job itself with ``ctx.complete()``,
            ``ctx.fail()`` or ``ctx.defer()``.
        batch_handler: ``async def batch_handler(ctxs: list[JobContext]) -> None``,
            instead of ``handler``: one call for the whole claimed batch (for an API
            that takes many items in one request). It settles jobs one by one through
            their contexts; jobs it leaves unsettled are completed when it returns
            (each with its ``ctx.result`` as the job's result),
            or all deferred/failed as above when it raises.
        max_attempts: attempts for jobs of this type; the pipeline sets it as the
            queue's per-type setting, so it applies to jobs enqueued from then on.
        quota: the shared quota this stage spends. Before each claim the runner checks
            it: when spending ``quota_cost`` would dip into the reserve (or cannot be
            paid at all), the stage is skipped for the rest of the run and its pending
            jobs wait for the reset.
        quota_cost: units one job (one batch call, for a ``batch_handler``) typically
            spends of ``quota``, > 0. Handlers spend actual units with ``ctx.spend``.
        rate_limits: a :class:`rota.RateLimit` or a sequence of them this stage's jobs
            each take one unit of, in order, before the handler starts (one per job of
            a ``batch_handler``'s batch too), shared by every worker through the
            database (docs/design.md, "Rates"). A job whose units are not there within
            the limit's ``max_wait`` is deferred to the moment they will be (no attempt
            burned, counted as deferred), and the run moves on to other stages.
            Handlers spend more with ``ctx.take``.
        on_give_up: a give-up hook for this type (see :meth:`rota.Queue.on_give_up`).
            Without one (and none registered on the queue), the pipeline registers a
            no-op, so this type's give-ups are recorded as handled, not owed forever.
        prefetch: claim the next batch while this one runs (default off). For stages
            whose handlers wait on I/O (an API call) with a backlog: the claim
            overlaps the batch's handlers (``make bench``: 1.3-1.45x jobs/s with 5 ms
            handlers, batch and concurrency 100; nothing for no-op handlers, bound by
            the database). Only the pipeline's first stage not skipped in the
            run prefetches (earlier stages win, so no later stage may run ahead of them),
            never a stage with a ``quota`` (its check comes before each claim). The
            prefetched jobs are held like the running batch (heartbeats keep their
            locks); when the run ends before starting them (budget, error) they are
            handed back untouched (:meth:`rota.Queue.release`). Leave it off when
            several workers share a stage of long handlers: a prefetched batch waits,
            held, while another worker could run it.
        refill: while a batch runs, feed its free slots with more claims of this stage
            instead of waiting for its slowest handler (default on; docs/design.md,
            "Refill"): once the batch's jobs have all started, one handler has run 20 ms
            and 4 times the batch's mean, and half its slots are free (or one has been
            free for 20 ms), one claim for them, no larger than the loop's own claim of
            the stage. Only for a ``handler`` with
            ``concurrency`` > 1 whose claim came back full, and only where that claim
            is the loop's next anyway (as ``prefetch``: the pipeline's first stage, or
            one whose earlier stages are all quota-skipped; no ``quota``, no
            ``rate_limits``); never after the budget, nor
            once a claim comes back short. Work of 50 ms and 5 s jobs, 20 s at full
            use of 16 slots: 22.0 s refilled, 26.3 s without
            (``bench/experiments/refill_mixed.py``). Turn it off to run each claim to
            its end before the next (a batch then waits for its slowest handler).
        timeout: how long one handler call (one ``batch_handler`` call) may run, a
            positive ``timedelta`` shorter than the pipeline's platform timeout;
            ``None`` for the pipeline's ``handler_timeout`` (by default half the
            platform timeout). At it the handler is cancelled and its jobs fail
            ("timed out after N s"), retried with backoff; the run's own end (the
            platform timeout less a reserve for settling) cuts it shorter when it comes
            first (docs/design.md, "Handler deadlines"). A sync handler's thread is
            not cut: its job is overdue and fails once the thread returns.
        cost: what a completed job is charged in its group's and owner's served counts
            (docs/design.md, "Cost"): ``"units"`` (the default), what its handler
            charged with ``ctx.charge(units)``, 1 when it charged nothing; or
            ``"seconds"``, the handler's measured run time in seconds (of the
            ``batch_handler`` call, shared evenly by its jobs), plus what it charged.

    Raises:
        InvalidInput: bad sizes, not exactly one of ``handler`` and ``batch_handler``,
            a ``batch_handler`` that is not ``async def``, a timeout that is not a
            positive ``timedelta``, a ``cost`` that is not ``"units"`` or
            ``"seconds"``.
    """

    type: str
    batch: int | None = None
    concurrency: int = 1
    handler: Handler | None = None
    _: KW_ONLY
    batch_handler: BatchHandler | None = None
    max_attempts: int | None = None
    quota: Quota | None = None
    quota_cost: int = 1
    rate_limits: RateLimit | tuple[RateLimit, ...] = ()
    on_give_up: GiveUpHook | None = None
    prefetch: bool = False
    refill: bool = True
    timeout: timedelta | None = None
    cost: str = "units"
    #: Whether ``handler`` is a sync function, run in a thread (set from it).
    sync: bool = field(init=False, repr=False, compare=False, default=False)

    def __post_init__(self) -> None:
        require_text(self.type, "stage type")
        for name in ("concurrency", "quota_cost"):
            positive_int(getattr(self, name), f"stage {self.type!r}: {name}")
        if self.batch is not None:
            positive_int(self.batch, f"stage {self.type!r}: batch")
        if self.max_attempts is not None:
            positive_int(self.max_attempts, f"stage {self.type!r}: max_attempts")
        if (self.handler is None) == (self.batch_handler is None):
            raise InvalidInput(
                f"stage {self.type!r}: give exactly one of handler and batch_handler")
        if self.batch_handler is not None and not _is_async(self.batch_handler):
            raise InvalidInput(f"stage {self.type!r}: batch_handler must be an async def "
                               f"(a sync handler runs as handler=, one job per call)")
        object.__setattr__(self, "sync",
                           self.handler is not None and not _is_async(self.handler))
        for flag in ("prefetch", "refill"):
            if not isinstance(getattr(self, flag), bool):
                raise InvalidInput(f"stage {self.type!r}: {flag} must be True or False, "
                                   f"got {getattr(self, flag)!r}")
        if self.timeout is not None:
            require_duration(self.timeout, f"stage {self.type!r}: timeout")
        object.__setattr__(self, "rate_limits",
                           check_stage_limits(self.type, self.rate_limits))
        try:
            check_mode(self.cost)
        except InvalidInput as e:
            raise type(e)(f"stage {self.type!r}: {e}") from None
        if self.quota is not None and not isinstance(self.quota, Quota):
            raise InvalidInput(f"stage {self.type!r}: quota must be a rota.Quota "
                               f"(per-owner allowances are spent by handlers)")

    def call(self, ctx: JobContext) -> Awaitable[object]:
        """The handler's call for one job: awaited as it is, or, for a sync handler,
        run in a thread (:meth:`JobContext.to_thread`)."""
        assert self.handler is not None
        if self.sync:
            return _threaded(self.handler, ctx)
        return cast("Awaitable[object]", self.handler(ctx))

    @property
    def limits(self) -> tuple[RateLimit, ...]:
        """``rate_limits`` as a tuple (one limit given alone is made one)."""
        limits = self.rate_limits
        return (limits,) if isinstance(limits, RateLimit) else limits


def _is_async(handler: Callable[..., object]) -> bool:
    """Whether ``handler`` is an ``async def`` (or an object whose ``__call__`` is)."""
    return (inspect.iscoroutinefunction(handler)
            or inspect.iscoroutinefunction(type(handler).__call__))


async def _threaded(handler: Callable[[JobContext], object], ctx: JobContext) -> object:
    """A sync handler's call in its own thread; a callable that returns an awaitable
    (``lambda ctx: work(ctx)``) has it awaited here, on the event loop."""
    value = await ctx.to_thread(handler, ctx)
    if inspect.isawaitable(value):
        return await value
    return value


@dataclass(frozen=True)
class RunResult:
    """What one run did; the same values as its ``runs`` row.

    Attributes:
        run_id: the ``runs`` row's id.
        trigger: ``cron``, ``cli``, ``worker`` or ``manual``.
        stop_reason: ``no_work``, ``time_budget``, ``quota_reserve``,
            ``quota_exhausted`` (healthy) or ``error`` (an incident; see ``error``).
        jobs_done: jobs completed.
        jobs_failed: jobs that ended ``failed`` (gave up) in this run; failed attempts
            that will be retried are counted in ``summary["retries"]``.
        jobs_deferred: jobs deferred without burning an attempt (``DeferJob``, quota
            resets). Claimed jobs the run ends before starting are handed back as they
            were, counted in ``summary["released"]``, not here.
        quota_units: units of shared quotas spent through ``ctx.spend``.
        summary: counters: the handlers' (``ctx.count``), ``quota.NAME`` and
            ``allowance.NAME`` units, the runner's (``retries``, ``lost``,
            ``released``, ``timed_out``, ``cut_by_run``, ``interrupted``,
            ``unreadable``, ``pool_timeouts``,
            ``postponed``, ``quota_deferred``, ``prefetch_released``, and for rate
            limits ``rate_deferred``, ``rate.NAME.deferred``, ``rate_postponed``,
            ``rate_waited_s``) and
            ``maintenance.*`` when it ran. Every count is of what committed.
        error: the error text when ``stop_reason == "error"``.
        started_at, finished_at: aware instants on the queue's clock.
    """

    run_id: uuid.UUID
    trigger: str
    stop_reason: StopReason
    jobs_done: int
    jobs_failed: int
    jobs_deferred: int
    quota_units: int
    summary: dict[str, int | float]
    error: str | None
    started_at: datetime
    finished_at: datetime

