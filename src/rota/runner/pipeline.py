"""The pipeline (docs/design.md, "The runner"): an ordered list of :class:`Stage`
objects on one queue, checked once, and its runs.

A :class:`Pipeline` holds the configuration and puts together the runner's three parts,
each its own module so it can be read and tested alone:

- :mod:`.loop` (:class:`~.loop.RunLoop`): which stage next, the time budget, the hard
  deadline, the stop reason;
- :mod:`.batch` (:class:`~.batch.BatchRunner`): one claimed batch's handlers, their
  concurrency and deadlines, and settling every job;
- :mod:`.recording` (:class:`~.recording.RunRecorder`): the ``runs`` row and the
  heartbeat.

Handlers get a :class:`JobContext`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from datetime import timedelta

from ..checks import require_duration, seconds_text
from ..errors import ConfigError, InvalidInput
from ..maintenance import Maintainer, check_pipeline_maintenance
from ..queue import GiveUpHook, Queue
from ..quota import Allowance, Quota
from ..rates import RateLimit
from ..schedule import Schedule, Scheduler
from ..settings import DEFAULT_PLATFORM_TIMEOUT, DEFAULT_TIME_BUDGET
from .batch import BatchRunner
from .batching import BatchSize
from .loop import RunLoop, RunOverran, handler_slots
from .rates import collect_limits
from .recording import RunRecorder
from .stage import TRIGGERS, RunResult, Stage, Trigger

#: Connections the runner itself needs beside its handlers' (docs/design.md,
#: "Connections"): the claim (or the prefetch) and the completions it overlaps; the
#: heartbeat and the claim upkeep take turns on them briefly.
RUNNER_CONNECTIONS = 2
# The part of the platform timeout kept for settling after the last handlers are cut
# (failing them, handing back the unstarted, recording the end): a tenth, at least a
# second, but never more than a quarter nor more than 30 s (30 s of 300 s).
_SETTLE_RESERVE_SHARE = 0.1
_SETTLE_RESERVE_MIN = timedelta(seconds=1)
_SETTLE_RESERVE_MAX = timedelta(seconds=30)


class Pipeline:
    """An ordered list of stages run against one queue (docs/design.md, "The runner").

    Args:
        queue: the :class:`rota.Queue`.
        stages: in runner order: earlier stages win (put work-generating stages last).
        quotas: quotas and allowances handlers may name in ``ctx.spend("name", n)``
            (stages' quotas are added automatically).
        rate_limits: rate limits handlers may name in ``ctx.take("name", n)`` (stages'
            limits are added automatically; docs/design.md, "Rates").
        platform_timeout: how long the platform lets one invocation live (default 300 s).
            The queue's stale window must be longer, so a lock only looks stale when its
            holder is dead; runs' budgets must be shorter.
        heartbeat_every: how often a run refreshes the locks of the jobs it holds and
            saves its progress (default a third of ``platform_timeout``); at most half
            the platform timeout, so a live run never looks killed or stale.
        schedules: :class:`rota.Schedule` objects: each run starts by enqueueing their
            due ticks, once across every worker (docs/design.md, "Schedules"); a
            :class:`rota.Worker` wakes in time for the next one. Each one's type must be
            one of the stages'.
        handler_timeout: how long one handler call may run in stages that set no
            ``timeout`` (default half the platform timeout); shorter than the platform
            timeout (docs/design.md, "Handler deadlines").

    The pipeline's pool must hold a connection per concurrent handler plus
    ``RUNNER_CONNECTIONS`` for the runner (docs/design.md, "Connections"): the queue's
    own pool is grown to that at the start of a run; a caller's pool that is smaller is
    refused here.

    The queue given is never changed. The stages' ``max_attempts`` and ``on_give_up``
    are the rules of the pipeline's own queue, :attr:`queue`
    (:meth:`rota.Queue.with_stage_rules`: the same pool, store, settings and clock, with
    the stages' per-type rules over the given queue's). Everything the pipeline does
    goes through it (claims, settling, schedules, handlers' ``ctx.queue``), so enqueue
    through ``pipeline.queue`` for a stage's ``max_attempts``, and give it to
    :func:`rota.maintain` for the stages' give-up hooks (:class:`rota.Worker` and the
    CLI's ``--app`` do so themselves). Two pipelines on one queue each keep their own
    rules. Close the queue given, not this one (it closes nothing).

    Attributes:
        queue: the pipeline's queue (above).

    Raises:
        ConfigError: ``queue.stale_after <= platform_timeout`` ("the stale window is safe
            by construction"), duplicate stage types or quota names, a stage's
            ``max_attempts`` that conflicts with the queue's per-type setting, a bad
            heartbeat interval, two schedules with one name, a schedule whose type no
            stage runs, a handler timeout not shorter than the platform timeout, or a
            caller's pool too small for the stages' concurrency.
        UnknownJobType: a stage's type is not among the queue's declared types.
    """

    def __init__(
        self,
        queue: Queue,
        stages: Sequence[Stage],
        *,
        quotas: Iterable[Quota | Allowance] = (),
        rate_limits: Iterable[RateLimit] = (),
        platform_timeout: timedelta = DEFAULT_PLATFORM_TIMEOUT,
        heartbeat_every: timedelta | None = None,
        schedules: Iterable[Schedule] = (),
        handler_timeout: timedelta | None = None,
    ) -> None:
        if not isinstance(queue, Queue):
            raise InvalidInput("Pipeline needs a rota.Queue")
        self.stages = tuple(stages)
        if not self.stages or not all(isinstance(s, Stage) for s in self.stages):
            raise InvalidInput("Pipeline needs a non-empty sequence of rota.Stage")
        self.platform_timeout = require_duration(platform_timeout, "platform_timeout")
        if queue.stale_after <= self.platform_timeout:
            raise ConfigError(
                f"the queue's stale window ({seconds_text(queue.stale_after)}) must be longer "
                f"than the platform timeout ({seconds_text(self.platform_timeout)}): "
                f"otherwise a live run's jobs look stale and are claimed twice")
        self.heartbeat_every = require_duration(
            heartbeat_every if heartbeat_every is not None else self.platform_timeout / 3,
            "heartbeat_every")
        if self.heartbeat_every * 2 > self.platform_timeout:
            raise ConfigError(f"heartbeat_every ({seconds_text(self.heartbeat_every)}) must be "
                              f"at most half the platform timeout "
                              f"({seconds_text(self.platform_timeout)})")
        self.settle_reserve = min(
            max(self.platform_timeout * _SETTLE_RESERVE_SHARE, _SETTLE_RESERVE_MIN),
            self.platform_timeout / 4, _SETTLE_RESERVE_MAX)
        self.handler_timeout = require_duration(
            handler_timeout if handler_timeout is not None else self.platform_timeout / 2,
            "handler_timeout")
        for name, limit in [("handler_timeout", self.handler_timeout),
                            *((f"stage {s.type!r}: timeout", s.timeout)
                              for s in self.stages if s.timeout is not None)]:
            if limit >= self.platform_timeout:
                raise ConfigError(f"{name} ({seconds_text(limit)}) must be shorter than the "
                                  f"platform timeout "
                                  f"({seconds_text(self.platform_timeout)})")
        types = [queue.check_type(s.type) for s in self.stages]
        if len(set(types)) != len(types):
            raise ConfigError(f"duplicate stage types in {types}")
        self._quotas: dict[str, Quota | Allowance] = {}
        for q in [*(s.quota for s in self.stages if s.quota is not None), *quotas]:
            if not isinstance(q, Quota | Allowance):
                raise InvalidInput(f"quotas must be rota.Quota or rota.Allowance, got {q!r}")
            if self._quotas.setdefault(q.name, q) != q:
                raise ConfigError(f"two different quotas are named {q.name!r}")
        self._rate_limits = collect_limits(self.stages, rate_limits)
        # Handlers holding a connection while the runner needs one to settle their jobs
        # would wait on each other until the pool times out, and each timeout cost a
        # job an attempt (6 of 8 jobs at concurrency = pool size).
        widest = max(self.stages, key=handler_slots)
        self.connections_needed = handler_slots(widest) + RUNNER_CONNECTIONS
        if not queue.owns_pool and queue.pool.max_size < self.connections_needed:
            raise ConfigError(
                f"stage {widest.type!r}: concurrency {handler_slots(widest)} needs a pool "
                f"of at least {self.connections_needed} connections (one per handler and "
                f"{RUNNER_CONNECTIONS} for the runner); the queue's pool has max_size "
                f"{queue.pool.max_size}: raise it or lower the concurrency")
        # The stages' per-type rules are the pipeline's own queue's; the caller's queue
        # is left as it was (docs/design.md, "The runner").
        hooks: dict[str, GiveUpHook | None] = {s.type: s.on_give_up for s in self.stages}
        self.queue = queue = queue.with_stage_rules(
            {s.type: s.max_attempts for s in self.stages if s.max_attempts is not None},
            hooks)
        self.scheduler = Scheduler(queue, schedules)
        for sched in self.scheduler.schedules:
            if sched.type not in types:
                raise ConfigError(f"schedule {sched.name!r} enqueues {sched.type!r}, which "
                                  f"no stage of this pipeline runs")
        # Claim sizes of the stages whose batch the runner chooses, kept across runs.
        self._sizes: dict[str, BatchSize] = {}
        self.recorder = RunRecorder(queue, self.heartbeat_every)
        self.batches = BatchRunner(queue, self.handler_timeout, self.quota,
                                   self.rate_limit)
        self.loop = RunLoop(
            queue, self.stages, scheduler=self.scheduler, batches=self.batches,
            recorder=self.recorder, hard_limit=self.platform_timeout - self.settle_reserve,
            settle_reserve=self.settle_reserve, sizes=self._sizes,
            connections=self.connections_needed)

    def quota(self, name: str) -> Quota | Allowance:
        """The quota or allowance called ``name``.

        Raises:
            ConfigError: no such quota was given to the pipeline.
        """
        try:
            return self._quotas[name]
        except KeyError:
            raise ConfigError(f"unknown quota {name!r}; known: "
                              f"{', '.join(sorted(self._quotas)) or 'none'}") from None

    def rate_limit(self, name: str) -> RateLimit:
        """The rate limit called ``name``.

        Raises:
            ConfigError: no such limit was given to the pipeline or its stages.
        """
        try:
            return self._rate_limits[name]
        except KeyError:
            raise ConfigError(f"unknown rate limit {name!r}; known: "
                              f"{', '.join(sorted(self._rate_limits)) or 'none'}") from None

    @property
    def rate_limits(self) -> tuple[RateLimit, ...]:
        """The pipeline's rate limits (its stages' and those given to it)."""
        return tuple(self._rate_limits.values())

    def batch_size(self, stage: Stage) -> int:
        """The size of ``stage``'s next claim: its ``batch``, or when that is ``None``
        the size the runner has settled on (:class:`~rota.runner.batching.BatchSize`)."""
        return self.loop.batch_size(stage)

    async def run(
        self,
        trigger: Trigger = "cron",
        time_budget: timedelta = DEFAULT_TIME_BUDGET,
        *,
        maintenance: Maintainer | None = None,
        stop: asyncio.Event | None = None,
    ) -> RunResult:
        """Run the pipeline once, inside ``time_budget`` (docs/design.md, "The runner").

        The loop claims one batch from the first stage that has work (and is not
        blocked by its quota), runs it with the stage's concurrency (its free slots
        refilled with more claims of its stage where that claim is the loop's next
        anyway: docs/design.md, "Refill"), then starts again from the top. After
        the budget (or once ``stop`` is set) no batch is claimed; jobs in flight
        finish within their handler timeout; claimed jobs not yet started are handed
        back as they were (attempts and deferrals unchanged). No
        database transaction is open while a handler runs. Every handler is cancelled
        by the run's hard deadline, the platform timeout less a reserve for settling,
        so the run ends before the platform timeout (docs/design.md, "Handler
        deadlines"). Jobs whose handlers return
        are completed in batches, and a batch's completions are written while the next
        batch is being claimed (the claim counts them as served either way: running
        and done jobs both count).

        The ``runs`` row is written when the run starts, saved after a batch at most
        once a second (``SAVE_EVERY_S``) and at every heartbeat, and completed at the
        end, also when the run ends in error.

        Args:
            trigger: ``cron``, ``cli``, ``worker`` or ``manual``.
            time_budget: wall-clock time for claiming, shorter than the platform timeout
                (default 220 s of 300 s; the gap is for finishing what is in flight).
            maintenance: run this first (for example a :class:`rota.Maintenance`, built
                on ``pipeline.queue``); its counters land in the summary as
                ``maintenance.*``.
            stop: an event that ends the budget early when set (a SIGTERM to the
                process): nothing more is claimed, what is in flight finishes, and the
                run stops ``interrupted``.

        After maintenance, the pipeline's schedules enqueue their due ticks
        (:meth:`rota.schedule.Scheduler.run_once`; non-zero counters land in the summary
        as ``schedules.*``).

        Returns:
            The :class:`RunResult`. Errors of the run itself (the database refused a
            write, a bug) do not raise: they end the run with ``stop_reason="error"``
            and the error text. Handler errors are job failures, not run errors.

        Raises:
            InvalidInput: unknown trigger.
            ConfigError: ``time_budget`` not shorter than the platform timeout; a
                :class:`rota.Maintenance` built on another queue than ``pipeline.queue``.
            psycopg.Error, psycopg_pool.PoolTimeout: the run's row could not be written
                at its start, or its end not within a few seconds of retrying (the
                database is down; maintenance later marks such a run "killed").
            asyncio.CancelledError: the run was cancelled; it is recorded as ended in
                error ("cancelled") when the database allows, its unstarted jobs are
                deferred and its jobs in flight failed (retried later). Cancelled
                once ``stop`` was set (a second signal), it is recorded as
                ``interrupted`` and its jobs in flight are handed back, their attempt
                returned.
        """
        if trigger not in TRIGGERS:
            raise InvalidInput(f"trigger must be one of {', '.join(TRIGGERS)}, got {trigger!r}")
        require_duration(time_budget, "time_budget")
        if time_budget >= self.platform_timeout:
            raise ConfigError(f"time_budget ({seconds_text(time_budget)}) must be shorter than "
                              f"the platform timeout "
                              f"({seconds_text(self.platform_timeout)})")
        check_pipeline_maintenance(maintenance, self.queue)
        with self.queue.tracer.run(trigger) as trace:
            result = await self.loop.run(trigger, time_budget, maintenance=maintenance,
                                         stop=stop, trace=trace)
            trace.ended(result.stop_reason, {
                "jobs_done": result.jobs_done, "jobs_failed": result.jobs_failed,
                "jobs_deferred": result.jobs_deferred, "quota_units": result.quota_units,
            }, result.error)
        return result


__all__ = ["RUNNER_CONNECTIONS", "Pipeline", "RunOverran"]
