"""The queue, rota's facade (docs/design.md, "The queue's rules"). A :class:`Queue`
holds validated settings (:class:`rota.settings.QueueSettings`), the store every
statement runs through (:class:`rota.store.Store`), the fair claim and its upkeep
(:mod:`rota.fair`), and exposes enqueue, the claim, and each job transition and
give-up hook operation as a method.

The rules live in modules that take what they need, not the queue, so none imports it
back: the fenced transitions in :mod:`rota.transitions`, the give-up hooks in
:mod:`rota.give_up`, the admin operations in :mod:`rota.admin`, results in
:mod:`rota.results`, the pool's health check in :mod:`rota.store`.

One piece (about 840 lines, most of them docstrings): the public methods a user calls
on a queue are here, each a few lines handing over to the module that keeps its rule,
with the documentation of its arguments, errors and rule; split, a user would look for
``queue.complete`` in two places. What is left to move out is the claim's entry
(validation, tracing, the observers) and ``with_stage_rules``.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
import uuid
from collections.abc import (
    AsyncIterator,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
from psycopg.sql import Composed, Identifier
from psycopg_pool import AsyncConnectionPool

from . import db, tracing
from . import enqueue as _enqueue
from . import statements as sql
from .checks import (
    INT_MAX,
    positive_int,
    require_due_time,
    require_row_id,
    require_text,
)
from .connections import ConnectionSetup
from .errors import ConfigError, InvalidInput, UnreadableJob
from .fair import ClaimUpkeep, FairClaim, RepairReport, UpkeepConfig, Violation
from .give_up import GiveUpHook, GiveUpHooks
from .job import FailOutcome, Job
from .plans import Plans
from .settings import queue_settings
from .store import AnyConn, IdleConnectionCheck, Store
from .transitions import Transitions

log = logging.getLogger("rota.queue")

#: How long :meth:`Queue.close` waits for the claim's upkeep to finish its due rounds
#: before it cancels them.
CLOSE_DEADLINE = timedelta(seconds=5)

ClaimObserver = Callable[[str, float], None]  # (job type, seconds) after each claim


def _setting(name: str, doc: str) -> Any:
    """A read-only property of :class:`Queue` that reads ``queue.settings.NAME``."""
    return property(lambda self: getattr(self.settings, name), doc=doc)


class Queue:
    """A rota queue on one PostgreSQL database.

    Args:
        conninfo_or_pool: a libpq URL/conninfo string (rota opens its own pool on first
            use; close it with :meth:`close` or ``async with queue``) or an open
            ``psycopg_pool.AsyncConnectionPool`` the caller owns (autocommit or not).
            rota's own pool adds the timeouts the string does not set
            (:func:`rota.db.with_connection_defaults`).
        pooled: whether the string goes through a connection pooler such as PgBouncer
            (``None``: found at the first connection; see
            :class:`rota.connections.ConnectionSetup` and docs/operations.md, "Poolers
            and failover"). Pooled, rota sends no startup ``options``, applies its
            settings per transaction and prepares nothing on the server. Only for a
            connection string.
        listen_url: a direct connection string to the same database for the one LISTEN
            connection of a worker (and of :meth:`wait`): notifications do not pass a
            transaction pooler. ``None``: the pool's string.
        tracer_provider: the OpenTelemetry ``TracerProvider`` rota's spans go to
            (docs/operations.md, "Traces"); default the global one. Ignored without
            ``opentelemetry-api``.
        **settings: see :class:`rota.settings.QueueSettings` (schema, plans, groups,
            types, max_attempts, max_attempts_by_type, stale_after, served_window, fair_by,
            backoff_base, max_backoff, max_deferrals, max_payload_bytes); an application ``groups``
            relation needs columns ``group_id text``, ``owner_id text``, ``plan text``,
            ``active boolean``.

    Every method that takes ``conn`` runs on that connection instead of the pool, inside
    whatever transaction the caller has open, so the caller decides when it commits.

    Raises:
        InvalidInput: a bad setting, neither a string nor a pool, or ``pooled`` with a
            pool.
        UnknownSetting: a keyword argument that is not a setting (also a
            ``TypeError``); the message names the closest one.
        DatabaseUnavailable: a malformed connection string (password redacted).
    """

    schema = _setting("schema", "The schema holding rota's tables.")
    plans: Plans = _setting("plans", "The plans that rank the claim.")
    external_groups = _setting("external_groups",
                               "Whether groups come from an application relation.")
    types = _setting("types", "The declared job types, or None for any.")
    max_attempts = _setting("max_attempts", "Attempts before a job gives up.")
    max_attempts_by_type = _setting("max_attempts_by_type", "Per-type max_attempts.")
    stale_after: timedelta = _setting("stale_after", "A lock older than this is stale.")
    served_window: timedelta = _setting("served_window",
                                        "How far back the fair order counts work.")
    fair_by: str = _setting("fair_by", "What the fair claim compares: group or owner.")
    backoff_base: timedelta = _setting("backoff_base", "The failure backoff's base.")
    max_backoff: timedelta = _setting("max_backoff", "The failure backoff's ceiling.")
    max_deferrals = _setting("max_deferrals", "Deferrals before a job gives up, or None.")
    max_payload_bytes = _setting("max_payload_bytes", "Largest payload, UTF-8 bytes.")

    def __init__(self, conninfo_or_pool: str | AsyncConnectionPool[Any], *,
                 pooled: bool | None = None, listen_url: str | None = None,
                 tracer_provider: Any = None, **settings: Any):
        self.settings = queue_settings("Queue", settings,
                                       ("pooled", "listen_url", "tracer_provider"))
        #: rota's spans (:mod:`rota.tracing`; no-ops without ``opentelemetry-api``).
        self.tracer = tracing.Tracer(tracer_provider)
        self.claim_observers: list[ClaimObserver] = []  # metrics (rota.web.metrics)
        if isinstance(conninfo_or_pool, str):
            setup = ConnectionSetup(conninfo_or_pool, pooled=pooled, listen_url=listen_url)
            check = IdleConnectionCheck()
            # Set again when it opens: the first connection may find a pooler between.
            self._pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                setup.conninfo, open=False, min_size=1, max_size=10,
                kwargs=setup.kwargs(), check=check, configure=setup.configure,
            )
            check.pool = self._pool
            self._owns_pool = True
        elif isinstance(conninfo_or_pool, AsyncConnectionPool):
            if pooled is not None:
                raise InvalidInput(
                    "pooled= is for a connection string; a pool you pass is used as you "
                    "built it (behind a pooler: kwargs prepare_threshold=None, no options)")
            setup = ConnectionSetup("", pooled=False, listen_url=listen_url)
            self._pool = conninfo_or_pool
            self._owns_pool = False
        else:
            # Not the value itself: a connection string in the wrong type may hold a
            # password.
            raise InvalidInput(f"Queue needs a connection string or an AsyncConnectionPool, "
                               f"got {type(conninfo_or_pool).__name__}")
        #: How the queue's connections are made (docs/operations.md, "Poolers and
        #: failover"); shared by the queues :meth:`with_stage_rules` derives.
        self.connections = setup
        # Whether close() stops the upkeep and closes an own pool: not for a queue
        # derived by with_stage_rules, which shares them.
        self._closes_pool = True
        self.store = Store(self._pool, self.settings.schema, self.settings.groups)
        #: The give-up hooks by type (docs/design.md, "Give-up hooks").
        self.hooks = GiveUpHooks(self.store, self.connection, self.tracer)
        #: The fenced job transitions (docs/design.md, "Fencing").
        self.transitions = Transitions(self.store, self.settings, self.connection,
                                       self.hooks)
        self.upkeep = ClaimUpkeep(
            self.store, lambda: (self.clock_offset, self.served_window), UpkeepConfig())
        self.fair_claim = FairClaim(self.store, self.upkeep)

    @property
    def clock_offset(self) -> timedelta:
        """Added to the database's ``now()`` in every comparison and every timestamp the
        queue writes; tests and simulations move time forward with it (docs/design.md,
        "Time"). Datetimes passed in (``run_after``, ``until``) are absolute."""
        return self.settings.clock_offset

    @clock_offset.setter
    def clock_offset(self, value: timedelta) -> None:
        self.settings.clock_offset = value

    def sql(self, name: str, **fragments: str) -> Composed:
        """The named statement for this queue (see :meth:`rota.store.Statements.sql`)."""
        return self.store.sql(name, **fragments)

    def table(self, name: str) -> Identifier:
        """A table of this queue's schema, quoted."""
        return self.store.table(name)

    def check_type(self, job_type: object) -> str:
        """See :meth:`rota.settings.QueueSettings.check_type`."""
        return self.settings.check_type(job_type)

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def pool(self) -> AsyncConnectionPool[Any]:
        """The connection pool statements run on (the queue's own or the caller's)."""
        return self._pool

    @property
    def owns_pool(self) -> bool:
        """Whether the pool is the queue's own (opened from a connection string), which
        a pipeline may grow to what its stages need; a caller's pool is never resized.
        A pipeline's queue (:meth:`with_stage_rules`) answers as the queue it came
        from."""
        return self._owns_pool

    async def open(self) -> None:
        """Open the queue's own pool (no-op for a caller's pool) and start the claim's
        upkeep service.

        Its first connection finds out whether a connection pooler is in between
        (``pooled=None``) and reports a refusal at once; a database that does not
        answer is waited for, 30 s at most (docs/operations.md, "Poolers and
        failover").

        Raises:
            DatabaseRefused: the server or a pooler refused the connection (an unknown
                startup parameter, database or role, failed authentication).
            ConfigError: a pooler in statement mode.
            psycopg_pool.PoolTimeout: no connection within 30 s.
        """
        if self._owns_pool and self._pool.closed:
            # A refusal is reported at once; only a database that does not answer is
            # waited for (docs/operations.md, "Poolers and failover").
            await self.connections.first_connection()
            self._pool.conninfo = self.connections.conninfo
            self._pool.kwargs = self.connections.kwargs()
            await self._pool.open(wait=True, timeout=30)
        self.upkeep.start()

    async def close(self) -> None:
        """Stop the claim's upkeep (after its due rounds) and close the queue's own
        pool, within about :data:`CLOSE_DEADLINE` and a second whatever the database
        does (docs/operations.md, "Network partitions and timeouts"): upkeep still
        waiting for the database then is cancelled and left to end in the background
        (psycopg cancels its statement and discards its connection within 10 s), and
        the pool closes without waiting for connections in use. A queue made by
        :meth:`with_stage_rules` (a pipeline's) closes nothing: what it uses is the
        queue's it came from, which closes them."""
        if not self._closes_pool:
            return
        stopping = asyncio.ensure_future(self.upkeep.stop())
        try:
            done, _ = await asyncio.wait({stopping}, timeout=CLOSE_DEADLINE.total_seconds())
        except asyncio.CancelledError:
            stopping.cancel()
            raise
        if stopping in done:
            stopping.result()
        else:
            # Cancelled, not waited for: psycopg's cancellation of a statement over a
            # silent link takes up to 10 s more, and then closes its connection.
            log.warning("closing the queue: the claim's upkeep got no answer from the "
                        "database within %g s; cancelled", CLOSE_DEADLINE.total_seconds())
            stopping.cancel()
            stopping.add_done_callback(_retrieve)
            self.upkeep.abandon()
        if self._owns_pool and not self._pool.closed:
            # Its background workers only connect (and a connection attempt to a
            # server that does not answer lasts connect_timeout): a second for them.
            await self._pool.close(timeout=1.0)

    async def __aenter__(self) -> Queue:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @asynccontextmanager
    async def connection(self, conn: AnyConn | None = None) -> AsyncIterator[AnyConn]:
        """Yield ``conn`` if given, else a pooled connection (committed on exit)."""
        if conn is None:
            await self.open()
        async with self.store.connection(conn) as c:
            yield c

    async def listen_connect_args(self, *, through_pooler: bool = False
                                  ) -> tuple[str, dict[str, Any]] | None:
        """Where a LISTEN connection goes (the worker's wake-ups, :meth:`wait`); see
        :meth:`rota.connections.ConnectionSetup.listen_target`.

        Returns:
            ``(conninfo, kwargs)``, or ``None``: poll instead.
        """
        await self.open()
        return await self.connections.listen_target(self._pool,
                                                    through_pooler=through_pooler)

    async def listener(self, *, through_pooler: bool = False
                       ) -> psycopg.AsyncConnection[Any] | None:
        """A new autocommit connection for LISTEN (``None``: poll instead); the caller
        closes it. See :meth:`rota.connections.ConnectionSetup.listener`.

        Raises:
            ConfigError: ``listen_url`` goes through a connection pooler.
            DatabaseRefused: ``listen_url`` refused the connection otherwise.
            psycopg.OperationalError: it could not be reached.
        """
        await self.open()
        return await self.connections.listener(self._pool, through_pooler=through_pooler)

    async def migrate(self) -> list[int]:
        """Apply missing migrations to this queue's schema (see :func:`rota.db.migrate`),
        then publish its enqueue settings for the SQL entry points
        (:meth:`publish_settings`).

        Returns:
            The migration versions applied now (empty when up to date).
        """
        async with self.connection() as conn:
            applied = await db.migrate(conn, self.schema)
            await self.publish_settings(conn=conn)
        return applied

    async def now(self) -> datetime:
        """The queue's clock: database ``now()`` plus ``clock_offset`` (aware, UTC)."""
        async with self.connection() as c:
            now = await sql.db_now(self.store, offset=self.clock_offset, conn=c)
        return now.astimezone(UTC)

    # -- enqueue -----------------------------------------------------------------------

    async def enqueue(
        self,
        type: str,
        payload: Any,
        *,
        group_id: str | uuid.UUID | None = None,
        dedupe_key: str | None = None,
        run_after: datetime | None = None,
        max_attempts: int | None = None,
        conn: AnyConn | None = None,
    ) -> Job | None:
        """Enqueue one job under the rules every caller shares (the database's
        ``enqueue_jobs``), in one statement: checks, group check, INSERT … ON CONFLICT
        DO NOTHING (docs/design.md, "Enqueue"). A job without a dedupe key is that
        INSERT alone (``sql/enqueue_fast.sql``, the rules' ``enqueue_rule``); when it
        writes nothing, ``enqueue_jobs`` runs and says what was wrong. The job keeps
        the W3C Trace Context of the enqueue's span (a child of the current span), so
        its handler's span continues the caller's trace (:mod:`rota.tracing`;
        docs/operations.md, "Traces").

        Args:
            type: the job type (the stage that runs it).
            payload: JSON-serializable value (see :func:`rota.job.encode_payload`), at
                most ``max_payload_bytes`` as PostgreSQL prints it and 256 levels deep.
            group_id: the group it belongs to (text or UUID), or ``None``.
            dedupe_key: while a job with this key is pending or running, asking again
                creates nothing; after it is done or failed, a new job is created.
            run_after: aware datetime when it becomes claimable (0001-01-02 to
                9999-12-30 UTC, see :func:`rota.checks.require_due_time`); default now
                (queue clock).
            max_attempts: override the queue's per-type setting.
            conn: the caller's connection; the job exists iff that transaction commits.
                Bad input leaves that transaction usable.

        Returns:
            The new job, or ``None`` when an open job with ``dedupe_key`` exists.

        Raises:
            PayloadError, NaiveDatetimeError, UnknownJobType, InvalidInput: bad input,
                nothing written.
            UnknownGroup: ``group_id`` is not in the groups relation.
        """
        return await _enqueue.enqueue(
            self.store, self.settings, self.tracer, self.open, type, payload,
            group_id=group_id, dedupe_key=dedupe_key, run_after=run_after,
            max_attempts=max_attempts, conn=conn)

    async def enqueue_many(
        self, items: Iterable[Mapping[str, Any]], *, conn: AnyConn | None = None
    ) -> int:
        """Enqueue a batch in one statement through the database's ``enqueue_jobs`` (the
        rules of :meth:`enqueue`, item by item, then one group check and one INSERT over
        arrays). One enqueue span for the batch: every job keeps its trace context.

        Args:
            items: mappings with ``type`` and ``payload`` and optionally ``group_id``,
                ``dedupe_key``, ``run_after``, ``max_attempts`` (as for :meth:`enqueue`).
            conn: the caller's connection (its transaction decides; bad input leaves it
                usable).

        Returns:
            How many jobs were created (duplicates of open jobs, or of each other inside
            the batch, are skipped).

        Raises:
            InvalidInput and subclasses: naming the first bad item; nothing written.
            UnknownGroup: some group ids are unknown: names the first item with one,
                and its group id (``item 1: unknown group 'nope': create it first
                ...``); nothing written.
        """
        return await _enqueue.enqueue_many(self.store, self.settings, self.tracer,
                                           self.open, items, conn=conn)

    async def publish_settings(self, *, conn: AnyConn | None = None,
                               types: Iterable[str] | None = None) -> None:
        """Write this queue's enqueue settings (declared types, max_attempts and its
        per-type values, including a pipeline's stages', max_payload_bytes, the groups
        relation, the clock offset) where the SQL entry points ``SCHEMA.enqueue`` and
        ``SCHEMA.enqueue_many`` read them (docs/enqueue-from-sql.md, "Settings").
        :meth:`migrate` and ``rota migrate --app`` call it; call it again after changing
        a setting. Writes nothing when they are already published.

        Args:
            conn: run on this connection (inside its transaction).
            types: the job types the SQL entry points accept, instead of the queue's
                declared ``types`` (``None``: any type): ``rota migrate --app``
                publishes the app's stage types and the declared ones, so a type no
                stage runs is refused as ``rota enqueue --app`` refuses it.

        Raises:
            InvalidInput: a type is not a valid name.
        """
        params = _enqueue.enqueue_settings(self.settings)
        if types is not None:
            params["s_types"] = sorted({require_text(t, "job type") or "" for t in types})
        async with self.connection(conn) as c:
            await sql.publish_settings(self.store, **params, conn=c)

    # -- claim and transitions ---------------------------------------------------------

    async def claim(
        self,
        type: str,
        limit: int,
        *,
        run_id: uuid.UUID | None = None,
        conn: AnyConn | None = None,
        unreadable: list[UnreadableJob] | None = None,
    ) -> list[Job]:
        """Claim up to ``limit`` jobs of ``type`` in one transaction (docs/design.md,
        "Claim" and "The fair claim").

        Claimable: ``run_after <= now`` and pending, or running with a stale lock and
        attempts left, and the group active (or unknown to the groups relation). Order:
        plan priority desc, then the group's served count in the window plus the job's
        position in its group (divided by the plan's weight), then oldest, then id; with
        ``fair_by="owner"`` the owner's served count plus the job's position among its
        owner's jobs (divided by the weight) comes before the group's. Rows are taken
        with FOR UPDATE SKIP LOCKED, so concurrent claimers never get the same job, and
        set running with
        ``attempts + 1``, ``locked_at = now``, ``run_id`` and a new ``claim_token``.

        Args:
            type: job type.
            limit: batch size, 1..2**31-1.
            run_id: the ``runs`` row this claim belongs to, if any.
            conn: the caller's connection (the claim commits with its transaction).
            unreadable: a list that receives one :class:`UnreadableJob` (its ``job_id``
                and ``problems``) per claimed row that could not be read (the runner
                counts them).

        A claimed job whose row cannot be turned into a :class:`Job` (a payload nested
        deeper than the decoder goes, a time past year 9999: rows from before the
        checks, or written by hand) is not returned: it gives up at once through the
        usual path (``failed``, the error text naming what could not be read, its
        give-up hook owed), and the claim goes on with the others (docs/design.md,
        "Bad data belongs to its job"). On the caller's connection its give-up
        commits with the caller's transaction and the hook runs later (maintenance).

        Returns:
            The claimed jobs in fair order (possibly fewer than ``limit``, or none).

        Raises:
            InvalidInput: ``limit`` not in 1..2**31-1, or an unknown type.
        """
        t = self.check_type(type)
        if (not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0
                or limit > INT_MAX):
            raise InvalidInput(f"limit must be a positive int (at most {INT_MAX}), "
                               f"got {limit!r}")
        if conn is None:
            await self.open()
        started = time.perf_counter()
        with self.tracer.claim(t, limit) as claiming:
            retries = self.fair_claim.retries.get(t, 0)
            claimed = await self.fair_claim.claim(
                t, limit, plans=self.plans, clock_offset=self.clock_offset,
                stale_after=self.stale_after, served_window=self.served_window,
                run_id=run_id, fair_by=self.fair_by, conn=conn)
            claiming.claimed(len(claimed), self.fair_claim.retries.get(t, 0) - retries)
        for observe in self.claim_observers:
            observe(t, time.perf_counter() - started)
        return await self.transitions.after_claim(claimed, unreadable, conn=conn)

    async def run_upkeep(self) -> None:
        """Run the claim's upkeep that is due now (its fold and horizon rounds,
        docs/fast-claim.md) and wait for it to finish, and for a VACUUM of the
        bookkeeping under way beside it (tests, shutdown). Not to be confused with
        settling a job (complete, fail, defer, release)."""
        await self.upkeep.settle()

    async def verify(self) -> list[Violation]:
        """Check the fair claim's bookkeeping against the jobs table: every invariant of
        docs/fast-claim.md ("The contract") in one read-only statement, safe on a live
        queue (``rota verify``).

        Returns:
            The :class:`rota.fair.Violation` list (type, group, invariant, expected,
            found), by type, group and invariant; empty when the bookkeeping is exact.
        """
        return await self.fair_claim.verify()

    async def repair_bookkeeping(self) -> RepairReport:
        """Rebuild the fair claim's bookkeeping from the jobs table in one transaction
        (``rota verify --repair``): writers of jobs wait for it, claims stay exact.

        Returns:
            A :class:`rota.fair.RepairReport`: the violations found, the rows written.

        Raises:
            RepairFailed: the rebuilt bookkeeping still broke an invariant (nothing
                kept).
        """
        return await self.fair_claim.repair(self.clock_offset)

    async def oldest_due_probe(self, types: Sequence[str], k: int, *,
                               conn: AnyConn | None = None) -> list[dict[str, Any]]:
        """The dashboard's probe for the longest-waiting due jobs, through the claim's
        bookkeeping (:meth:`rota.fair.FairClaim.oldest_due`)."""
        return await self.fair_claim.oldest_due(types, k, clock_offset=self.clock_offset,
                                                conn=conn)

    @tracing.settle_traced("complete")
    async def complete(self, job: Job, *, result: Any = None,
                       cost: Decimal | float | int | None = None,
                       conn: AnyConn | None = None) -> bool:
        """Mark a claimed job done, under its claim, keeping ``result`` (its return
        value, JSON as a payload is; docs/design.md, "Results") and charging ``cost``
        (positive units, 6 places, at most :data:`rota.cost.MAX_COST`; ``None``: 1;
        docs/design.md, "Cost"). Repeated under the same claim it answers the same
        (docs/design.md, "Settling twice"). See
        :meth:`rota.transitions.Transitions.complete`.

        Returns:
            ``True`` when done by this claim (now or before); ``False`` when this claim
            lost the job, and nothing changed.

        Raises:
            ResultError: ``result`` cannot be stored; the job was failed (given up).
            InvalidCharge: ``cost`` is not a positive number within the limit; nothing
                was written.
        """
        return await self.transitions.complete(job, result=result, cost=cost, conn=conn)

    async def claim_states(self, jobs: Sequence[Job], *,
                           conn: AnyConn | None = None) -> dict[int, str]:
        """What became of jobs under the claims that handed them out (docs/design.md,
        "Settling twice"); see :meth:`rota.transitions.Transitions.claim_states`.

        Returns:
            Job id -> status (``running``, ``done``, ``pending``, ``failed``) for the
            jobs whose row still carries their claim's token; a job missing was lost.
        """
        return await self.transitions.claim_states(jobs, conn=conn)

    @tracing.settle_traced("complete")
    async def complete_many(self, jobs: Sequence[Job], *,
                            results: Sequence[Any] | None = None,
                            costs: Sequence[Decimal | float | int | None] | None = None,
                            conn: AnyConn | None = None) -> list[bool]:
        """Mark claimed jobs done in one statement, each under its own claim (what
        :meth:`complete` does for one job, for a whole batch; ``costs``: one cost per
        job, as :meth:`complete`'s ``cost``, or ``None`` for 1 each); see
        :meth:`rota.transitions.Transitions.complete_many`.

        Returns:
            One flag per job, in the order given (``False``: this claim lost it).

        Raises:
            ResultError: a value cannot be stored; nothing was written.
            InvalidInput: ``results`` or ``costs`` does not have one value per job, or
                a job is listed twice under one claim with results or costs the
                database would store differently; nothing was written.
            InvalidCharge: a cost is not a positive number within the limit; nothing
                was written.
        """
        return await self.transitions.complete_many(jobs, results=results, costs=costs,
                                                    conn=conn)

    @tracing.settle_traced("fail")
    async def fail(self, job: Job, error: BaseException | str, *, give_up: bool = False,
                   conn: AnyConn | None = None) -> FailOutcome:
        """Record a failed attempt of a claimed job: retried after
        ``min(backoff_base * 2**attempts, max_backoff)``, or ``failed`` with its give-up
        hook once attempts are used up (``give_up``: at once) (docs/design.md, "Fail and
        backoff"); see :meth:`rota.transitions.Transitions.fail`.

        Returns:
            ``"retry"``, ``"failed"``, or ``"lost"`` (this claim no longer holds it).
        """
        return await self.transitions.fail(job, error, give_up=give_up, conn=conn)

    @tracing.settle_traced("defer")
    async def defer(
        self, jobs: Job | Iterable[Job], until: datetime | timedelta | None = None, *,
        conn: AnyConn | None = None,
    ) -> int:
        """Put claimed jobs back without burning an attempt, due at ``until`` (an aware
        instant, a ``timedelta`` from the queue's clock, ``None``: now), a deferral
        counted (docs/design.md, "Defer"); see :meth:`rota.transitions.Transitions.defer`.

        Returns:
            How many jobs were deferred.

        Raises:
            NaiveDatetimeError: ``until`` has no time zone.
            InvalidInput: ``until`` is out of range or of another type.
        """
        return await self.transitions.defer(jobs, until, conn=conn)

    @tracing.settle_traced("release")
    async def release(self, jobs: Iterable[Job], *, not_before: datetime | None = None,
                      conn: AnyConn | None = None) -> int:
        """Hand claimed jobs back as if never claimed: attempt returned, no deferral
        counted, due time kept (or not before ``not_before``) (docs/design.md, "Defer");
        see :meth:`rota.transitions.Transitions.release`.

        Returns:
            How many jobs were released.

        Raises:
            InvalidInput: an item is not a :class:`rota.Job`, or a bad ``not_before``.
        """
        return await self.transitions.release(jobs, not_before=not_before, conn=conn)

    async def restore_due_times(
        self, pushed: Sequence[tuple[int, uuid.UUID | None, datetime, datetime | None]], *,
        conn: AnyConn | None = None,
    ) -> int:
        """Make jobs whose due time a run pushed to its budget's end due as asked again,
        once the run ended sooner (docs/design.md, "Defer"); see
        :meth:`rota.transitions.Transitions.restore_due_times`.

        Returns:
            How many jobs are due sooner.

        Raises:
            NaiveDatetimeError, InvalidInput: a bad entry; nothing changed.
        """
        return await self.transitions.restore_due_times(pushed, conn=conn)

    async def fail_stuck_jobs(self) -> list[Job]:
        """Fail running jobs whose lock is stale and whose attempts are used up, then run
        their give-up hooks (docs/design.md, "Stuck jobs").

        Returns:
            The jobs failed by this call, as they are now (status ``failed``).
        """
        return await self.transitions.fail_stuck_jobs()

    async def get_job(self, job_id: int, *, conn: AnyConn | None = None) -> Job | None:
        """Read one job by id, or ``None``.

        Raises:
            InvalidInput: ``job_id`` is not a positive int.
            UnreadableJob: the row holds a value that cannot be loaded; the error names
                the job and each such column (docs/design.md, "Bad data belongs to its
                job").
        """
        require_row_id(job_id)
        async with self.connection(conn) as c:
            row = await sql.get_job(self.store, id=job_id, conn=c)
        return None if row is None else Job.from_row(row)

    # -- give-up hooks -----------------------------------------------------------------

    @property
    def give_up_hooks(self) -> Mapping[str, GiveUpHook]:
        """The give-up hooks this queue runs, by job type (read-only view): those
        registered on it, and for a pipeline's queue (:meth:`with_stage_rules`) its
        stages' over those of the queue it came from."""
        return self.hooks.view

    def on_give_up(self, job_type: str, hook: GiveUpHook) -> None:
        """Register ``async def hook(job, conn)`` for jobs of ``job_type`` that end failed
        by any path (fail, stuck, deferral cap) (docs/design.md, "Give-up hooks").

        The hook runs inside the transaction that records the give-up as handled, so
        what it writes through ``conn`` commits together with that record: exactly once,
        even if the process dies in between (the owed hook is found and run later by
        :meth:`run_give_up_hooks`, which maintenance calls). A hook that raises is rolled
        back and retried later, never doubled. Side effects outside ``conn`` are the
        hook's own to make idempotent.

        Raises:
            UnknownJobType, InvalidInput: a bad type.
        """
        self.hooks.register(self.check_type(job_type), hook)

    async def run_give_up_hooks(self, ids: Sequence[int] | None = None, *,
                                limit: int = 1000) -> int:
        """Run owed give-up hooks (for ``ids`` only, when given) for the types this queue
        has hooks for; jobs of other types stay owed for a process that has them.

        Returns:
            How many hooks ran and were recorded.
        """
        return await self.hooks.run(ids, limit=limit)

    # -- what a pipeline asks of the queue ---------------------------------------------
    # The runner (rota.runner) issues no job statement of its own: each transition it
    # makes is one of these, or one of the transitions above (docs/design.md, "The
    # runner").

    def with_stage_rules(self, max_attempts_by_type: Mapping[str, int],
                         give_up_hooks: Mapping[str, GiveUpHook | None]) -> Queue:
        """A queue for a pipeline: this queue with the per-type rules of its stages
        (their ``max_attempts`` and ``on_give_up``) laid over its own; this queue is
        left exactly as it was (docs/design.md, "The runner"). :class:`rota.Pipeline`
        calls it and keeps the result as ``pipeline.queue``.

        The new queue shares this one's pool, store, claim upkeep, tracer, claim
        observers and settings, clock included (moving either's ``clock_offset`` moves
        both), and reads this queue's ``max_attempts_by_type`` and give-up hooks live,
        under the stages'. Its :meth:`close` closes nothing: the pool and the upkeep are
        this queue's, so close this one. Enqueueing through it gives a stage's type the
        stage's ``max_attempts``; enqueueing through this queue does not (it keeps its
        own settings). Two pipelines on one queue each keep their own rules.

        Args:
            max_attempts_by_type: type -> attempts for jobs enqueued through the new
                queue; a type for which this queue has a different per-type value
                (its ``max_attempts_by_type`` setting) is refused.
            give_up_hooks: type -> its give-up hook, over any this queue has; or
                ``None``: the type has no hook of its own, so this queue's runs if it
                has one, and otherwise a no-op does, so its give-ups are recorded as
                handled instead of owed forever.

        Returns:
            The new :class:`Queue`.

        Raises:
            ConfigError: a ``max_attempts`` that conflicts with this queue's per-type
                setting.
            InvalidInput, UnknownJobType: a bad type or count.
        """
        attempts = {self.check_type(t): positive_int(n, f"max_attempts for {t!r}")
                    for t, n in max_attempts_by_type.items()}
        for t, n in attempts.items():
            current = self.max_attempts_by_type.get(t)
            if current is not None and current != n:
                raise ConfigError(f"stage {t!r}: max_attempts {n} conflicts with the "
                                  f"queue's max_attempts_by_type {current}")
        hooks = {self.check_type(t): h for t, h in give_up_hooks.items()}
        derived = copy.copy(self)  # shares the pool, store, upkeep, tracer, observers
        derived.settings = self.settings.with_max_attempts_by_type(attempts)
        # Lookup order: the stage's hook, this queue's (live), then the no-op.
        derived.hooks = self.hooks.over(hooks)
        derived.transitions = Transitions(self.store, derived.settings, self.connection,
                                          derived.hooks)
        derived._closes_pool = False
        return derived

    async def heartbeat(self, jobs: Sequence[Job], *, conn: AnyConn | None = None) -> int:
        """Refresh the locks of claimed jobs a live run still holds, fenced by each
        job's claim (docs/design.md, "Stale locks").

        Returns:
            How many locks were refreshed.
        """
        return await self.transitions.heartbeat(jobs, conn=conn)

    async def postpone(self, job_type: str, until: datetime, *,
                       conn: AnyConn | None = None) -> int:
        """Make the claimable jobs of ``job_type`` wait until ``until`` (a quota's reset;
        docs/design.md, "Quotas"); see :meth:`rota.transitions.Transitions.postpone`.

        Returns:
            How many jobs were postponed.

        Raises:
            NaiveDatetimeError: ``until`` has no time zone.
        """
        return await self.transitions.postpone(job_type, until, conn=conn)

    async def has_pending_by(self, job_type: str, until: datetime, *,
                             conn: AnyConn | None = None) -> bool:
        """Whether a pending job of ``job_type`` is due by ``until`` (work left waiting
        for a quota's reset, which makes a run's stop reason a quota one).

        Raises:
            NaiveDatetimeError: ``until`` has no time zone.
        """
        t = self.check_type(job_type)
        require_due_time(until, "until")
        async with self.connection(conn) as c:
            return await sql.quota_blocked_work(self.store, type=t, until=until, conn=c)

    async def ensure_pool_size(self, connections: int) -> bool:
        """Grow the queue's own pool to at least ``connections`` (what a pipeline's
        stages need: docs/design.md, "Connections"); a caller's pool is never resized.

        Returns:
            Whether the pool was grown now.
        """
        pool = self._pool
        if not self._owns_pool or pool.max_size >= connections:
            return False
        await pool.resize(pool.min_size, connections)
        return True

    # -- admin operations ----------------------------------------------------------------
    # rota.admin's functions take the queue first, so bound here they are its methods:
    # queue.list_jobs(status="failed") runs rota.admin.list_jobs(queue, status="failed").
    from . import admin as _admin

    upsert_group = _admin.upsert_group
    list_jobs = _admin.list_jobs
    retry_job = _admin.retry_job
    cancel_job = _admin.cancel_job
    list_runs = _admin.list_runs
    depth = _admin.depth
    del _admin

    # Results (docs/design.md, "Results"): queue.result(job_id), queue.wait(job_id, ...).
    from . import results as _results

    result = _results.result
    wait = _results.wait
    del _results


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Read an abandoned task's outcome, so asyncio does not log it as never
    retrieved."""
    if not task.cancelled():
        task.exception()


__all__ = ["AnyConn", "GiveUpHook", "Queue"]
