"""The queue: enqueue, claim, complete, fail, defer, release, stuck jobs and give-up
hooks (docs/design.md, "The queue's rules"). A :class:`Queue` holds validated settings
(:class:`rota.settings.QueueSettings`), the store every statement runs through
(:class:`rota.store.Store`), the fair claim and its upkeep (:mod:`rota.fair`), and
the admin operations (:mod:`rota.admin`).

One piece (about 1,250 lines): every method is one transition of the job state machine
(docs/state-machine.md) under one claim fence, or a thin door to a package that owns its
rule (results, the fair claim's contract); they share the fence and the give-up path;
split, each part would import the rest. The runner's transitions (heartbeat,
postpone) are here too, so the runner issues no job statement of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import select
import time
import uuid
from collections import ChainMap
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    MutableMapping,
    Sequence,
)
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from types import MappingProxyType
from typing import Any, cast

import psycopg
from psycopg.sql import Composed, Identifier
from psycopg_pool import AsyncConnectionPool

from . import db, tracing
from .checks import (
    INT_MAX,
    LATEST_DUE,
    positive_int,
    require_due_time,
    require_row_id,
    require_text,
)
from .connections import ConnectionSetup
from .cost import charge_units, job_cost
from .errors import ConfigError, DatabaseRefused, InvalidInput, UnreadableJob, first_line
from .fair import ClaimUpkeep, FairClaim, RepairReport, UpkeepConfig, Violation
from .job import FailOutcome, Job, due_or_delay
from .job import no_give_up_hook as _no_give_up_hook
from .plans import Plans
from .results import ResultError, encode_result, error_record
from .settings import QueueSettings, enqueue_error, enqueued_job
from .store import AnyConn, Store, listen_connect_args

log = logging.getLogger("rota.queue")

#: How long :meth:`Queue.close` waits for the claim's upkeep to finish its due rounds
#: before it cancels them.
CLOSE_DEADLINE = timedelta(seconds=5)

GiveUpHook = Callable[[Job, AnyConn], Awaitable[None]]
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
        self.settings = QueueSettings(**settings)
        #: rota's spans (:mod:`rota.tracing`; no-ops without ``opentelemetry-api``).
        self.tracer = tracing.Tracer(tracer_provider)
        self._give_up_hooks: MutableMapping[str, GiveUpHook] = {}
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
            raise InvalidInput("Queue needs a connection string or an AsyncConnectionPool")
        #: How the queue's connections are made (docs/operations.md, "Poolers and
        #: failover"); shared by the queues :meth:`with_stage_rules` derives.
        self.connections = setup
        # Whether close() stops the upkeep and closes an own pool: not for a queue
        # derived by with_stage_rules, which shares them.
        self._closes_pool = True
        self.store = Store(self._pool, self.settings.schema, self.settings.groups)
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
        """Where a LISTEN connection goes (the worker's wake-ups, :meth:`wait`):
        ``listen_url`` when given, else the pool's connection string; autocommit
        (docs/operations.md, "Poolers and failover").

        Args:
            through_pooler: also when the pool goes through a connection pooler and no
                ``listen_url`` is given (the worker, which then checks that
                notifications arrive).

        Returns:
            ``(conninfo, kwargs)``, or ``None``: the pool goes through a pooler, no
            ``listen_url`` is given and ``through_pooler`` is false (poll instead).
        """
        await self.open()
        setup = self.connections
        if setup.listen_url is None and setup.pooled and not through_pooler:
            return None
        conninfo, kwargs = await listen_connect_args(self._pool)
        return setup.listen_args(conninfo, kwargs)

    async def listener(self, *, through_pooler: bool = False
                       ) -> psycopg.AsyncConnection[Any] | None:
        """A new autocommit connection for LISTEN, where
        :meth:`listen_connect_args` says (``None`` when it says to poll); the caller
        closes it.

        Raises:
            ConfigError: ``listen_url`` refused rota's startup options: it goes through
                a connection pooler (LISTEN needs the server itself).
            DatabaseRefused: ``listen_url`` refused the connection otherwise.
            psycopg.OperationalError: it could not be reached (or the pool's string,
                without ``listen_url``, refused it).
        """
        target = await self.listen_connect_args(through_pooler=through_pooler)
        if target is None:
            return None
        try:
            return await psycopg.AsyncConnection.connect(target[0], **target[1])
        except psycopg.OperationalError as exc:
            cause = db.refusal(exc)
            if cause is None or self.connections.listen_url is None:
                raise  # the pool's own string: as any of its connections
            if "startup parameter" in cause:
                raise ConfigError(
                    f"listen_url goes through a connection pooler ({cause}): point it at "
                    "the server itself") from None
            raise DatabaseRefused(
                f"listen_url: the database refused the connection: {cause}") from None

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
            row = await self.store.fetch_one("db_now", {"offset": self.clock_offset}, conn=c)
        assert row is not None
        return cast(datetime, row[0]).astimezone(UTC)

    # -- groups ------------------------------------------------------------------------

    async def upsert_group(
        self,
        group_id: str | uuid.UUID,
        *,
        plan: str | None,
        active: bool = True,
        owner_id: str | uuid.UUID | None = None,
        conn: AnyConn | None = None,
    ) -> None:
        """Create or update a group in rota's own groups table. Takes effect at the next
        claim; queued jobs are not rewritten.

        Args:
            group_id: text or UUID.
            plan: a plan id from the queue's plans, or ``None`` for a group with no owner
                (ranked as the middle plan).
            active: ``False`` pauses the group: its jobs are not claimable.
            owner_id: the owner whose per-owner allowances (quotas) the group's jobs
                spend; ``None`` for none.

        Raises:
            UnknownPlan: ``plan`` is not in the queue's plans.
            ConfigError: the queue reads groups from an application relation instead.
        """
        if self.external_groups:
            raise ConfigError(
                "this queue reads groups from the application's relation "
                f"{self.store.groups_ident.as_string(None)}; change plan and status there"
            )
        gid = require_text(group_id, "group_id")
        owner = require_text(owner_id, "owner_id", allow_none=True)
        if plan is not None:
            self.plans[plan]
        if not isinstance(active, bool):
            raise InvalidInput("active must be a bool")
        async with self.connection(conn) as c:
            await self.store.execute("upsert_group", {
                "group_id": gid, "owner_id": owner, "plan": plan, "active": active}, conn=c)

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
        """Enqueue one job through the database's ``enqueue_jobs``, the rules every
        caller shares, in one statement: checks, group check, INSERT … ON CONFLICT DO
        NOTHING (docs/design.md, "Enqueue"). The job keeps the W3C Trace Context of
        the enqueue's span (a child of the current span), so its handler's span
        continues the caller's trace (:mod:`rota.tracing`; docs/operations.md,
        "Traces").

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
        params = self.settings.enqueue_params(
            type, payload, group_id=group_id, dedupe_key=dedupe_key, run_after=run_after,
            max_attempts=max_attempts)
        with self.tracer.enqueue(params["type"], 1) as sending:
            params["trace_context"] = sending.trace_context
            async with self.connection(conn) as c:
                row = await self.store.fetch_dict("enqueue", params, conn=c)
            job = enqueued_job(row)
            sending.sent([job.id] if job is not None else [], 1 if job is not None else 0)
        return job

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
            UnknownGroup: some group ids are unknown; nothing written.
        """
        params = self.settings.enqueue_many_params(items)
        if not params["types"]:
            return 0
        types = set(params["types"])
        with self.tracer.enqueue(types.pop() if len(types) == 1 else None,
                                 len(params["types"])) as sending:
            params["trace_context"] = sending.trace_context
            params["count"] = len(params["types"])
            async with self.connection(conn) as c:
                # One statement: on our own autocommit connection it is its own
                # transaction; on a caller's connection, the caller's transaction holds it.
                row = await self.store.fetch_one("enqueue_many", params, conn=c)
            assert row is not None
            created, problem = row
            if problem is not None:
                raise enqueue_error(problem)
            sending.sent([], int(created))
        return int(created)

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
        params = self.settings.enqueue_settings()
        if types is not None:
            params["s_types"] = sorted({require_text(t, "job type") or "" for t in types})
        async with self.connection(conn) as c:
            await self.store.execute("publish_settings", params, conn=c)

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
        jobs: list[Job] = []
        for job in claimed:
            problems = job.problems
            if not problems:
                jobs.append(job)
                continue
            error = UnreadableJob(job.id, problems)
            log.error("%s; it gives up", error)
            await self._fail(job, str(error), give_up=True, conn=conn)
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
            async with self.connection(conn) as c:
                await self.store.execute("lost_attempts", {
                    "ids": [j.id for j in jobs],
                    "claim_tokens": [j.claim_token for j in jobs],
                    "offset": self.clock_offset}, conn=c)
        except Exception as exc:
            log.warning("could not record the lost attempts of jobs %s: %s",
                        [j.id for j in jobs], first_line(exc, with_type=True))

    async def settle(self) -> None:
        """Run the claim upkeep that is due now and wait for it to finish (tests,
        shutdown)."""
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
        """Mark a claimed job done, under its claim, keeping ``result`` (docs/design.md,
        "Results").

        Args:
            job: the claimed job.
            result: the handler's return value, stored on the job (read it back with
                :meth:`result`): JSON as a payload is (:func:`rota.job.encode_payload`),
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
            await self._fail(job, encoded, give_up=True, conn=conn)
            raise encoded
        params = {**self._fence(job), "result": encoded, "started_at": job.locked_at,
                  "cost": charged, "schema_name": self.schema}
        async with self.connection(conn) as c:
            if await self.store.execute("complete", params, conn=c) == 1:
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
        fenced = [j for j in jobs if j.claim_token is not None]
        if not fenced:
            return {}
        rows = await self.store.fetch_all("claim_states", {
            "ids": [j.id for j in fenced],
            "claim_tokens": [j.claim_token for j in fenced]}, conn=conn)
        return {r[0]: r[1] for r in rows}

    @tracing.settle_traced("complete")
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
            this claim lost that job (nothing changed for it). A job listed twice is
            completed once and gets the same flag both times.

        Raises:
            ResultError: a value cannot be stored; the message names its job and
                nothing was written (fail that job, complete the others).
            InvalidInput: ``results`` or ``costs`` does not have one value per job.
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
        charges = list(costs) if costs is not None else [None] * len(batch)
        if len(charges) != len(batch):
            raise InvalidInput(f"complete_many: {len(charges)} costs for "
                               f"{len(batch)} jobs")
        cost_by_id = {j.id: None if c is None else job_cost(charge_units(c))
                      for j, c in zip(batch, charges, strict=True)}
        encoded_by_id: dict[int, str | None] = {}
        for j, v in zip(batch, values, strict=True):
            e = self._encoded_result(j, v)
            if isinstance(e, ResultError):
                raise e
            encoded_by_id[j.id] = e
        # Job rows are locked in id order, the one order of every statement that locks
        # several jobs. The served-count changes a completion makes are new fair_served
        # rows of its own (the delta rule, fair/bookkeeping.sql), so two batches never
        # wait on each other's bookkeeping rows.
        fenced = sorted((j for j in batch if j.claim_token is not None),
                        key=lambda j: j.id)
        if not fenced:
            return [False] * len(batch)
        params = {"ids": [j.id for j in fenced],
                  "claim_tokens": [j.claim_token for j in fenced],
                  "results": [encoded_by_id[j.id] for j in fenced],
                  "started_ats": [j.locked_at for j in fenced],
                  "costs": [cost_by_id[j.id] for j in fenced],
                  "offset": self.clock_offset, "schema_name": self.schema}
        try:
            async with self.connection(conn) as c:
                done = {r[0] for r in await self.store.fetch_all("complete_many", params,
                                                                 conn=c)}
                if len(done) < len({j.id for j in fenced}):
                    # Lost, or done by this very claim before (a repeat): say which.
                    states = await self.claim_states(
                        [j for j in fenced if j.id not in done], conn=c)
                    done |= {i for i, status in states.items() if status == "done"}
        except psycopg.errors.DeadlockDetected:
            if conn is not None:
                raise
            # Nothing was written (the statement was its own transaction): one by one.
            log.info("complete_many: deadlock detected, completing %d jobs one by one",
                     len(fenced))
            done = {j.id for j in fenced
                    if await self.complete(j, result=encoded_by_id[j.id],
                                           cost=cost_by_id[j.id])}
        return [j.claim_token is not None and j.id in done for j in batch]

    @tracing.settle_traced("fail")
    async def fail(self, job: Job, error: BaseException | str, *, give_up: bool = False,
                   conn: AnyConn | None = None) -> FailOutcome:
        """Record a failed attempt of a claimed job (docs/design.md,
        "Fail and backoff").

        With attempts left the job goes back to pending with
        ``run_after = now + min(backoff_base * 2**attempts, max_backoff)``; with attempts
        used up it becomes ``failed`` (``finished_at`` set) and its give-up hook runs.
        ``give_up`` ends it failed whatever its attempts (a failure no retry can mend).
        The error text is kept in ``last_error`` (NUL characters escaped), and every
        attempt's error, with an exception's traceback, bounded, in ``job_errors``
        (:meth:`result`; docs/design.md, "Results"). Repeated
        under the same claim (a reply lost with the connection), it answers what the
        first one did (docs/design.md, "Settling twice").

        Returns:
            ``"retry"``, ``"failed"``, or ``"lost"`` when this claim no longer holds the
            job (nothing changed; also when this claim completed or deferred it).
        """
        return await self._fail(job, error, give_up=give_up, conn=conn)

    async def _fail(self, job: Job, error: BaseException | str, *, give_up: bool = False,
                    conn: AnyConn | None = None) -> FailOutcome:
        text, kind, trace = error_record(error)
        params = {**self._fence(job), "error": text, "error_type": kind, "traceback": trace,
                  "give_up": give_up, "started_at": job.locked_at,
                  "schema_name": self.schema,
                  "backoff_base": self.backoff_base, "max_backoff": self.max_backoff,
                  "latest_due": LATEST_DUE}
        async with self.connection(conn) as c:
            row = await self.store.fetch_one("fail", params, conn=c)
            if row is None:  # lost, or a repeat under this claim: say which
                status = (await self.claim_states([job], conn=c)).get(job.id)
                row = (status,) if status in ("pending", "failed") else None
        if row is None:
            return "lost"
        if row[0] == "failed":
            if conn is None:
                await self.run_give_up_hooks([job.id])
            return "failed"
        return "retry"

    @tracing.settle_traced("defer")
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
        params = {
            "ids": [j.id for j in fenced],
            "claim_tokens": [j.claim_token for j in fenced],
            "until": None if isinstance(checked, timedelta) else checked,
            "delay": delay,
            "max_deferrals": self.max_deferrals,
            "offset": self.clock_offset,
        }
        async with self.connection(conn) as c:
            rows = await self.store.fetch_all("defer", params, conn=c)
            if len(rows) < len({j.id for j in fenced}):
                # Lost, or deferred by this very claim before (a repeat): say which.
                seen = {r[0] for r in rows}
                states = await self.claim_states([j for j in fenced if j.id not in seen],
                                                 conn=c)
                rows += [(i, status) for i, status in states.items()
                         if status in ("pending", "failed")]
        gave_up = [r[0] for r in rows if r[1] == "failed"]
        if gave_up and conn is None:
            await self.run_give_up_hooks(gave_up)
        return sum(1 for r in rows if r[1] == "pending")

    @tracing.settle_traced("release")
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
        async with self.connection(conn) as c:
            return await self.store.execute("release", {
                "ids": [j.id for j in fenced],
                "claim_tokens": [j.claim_token for j in fenced],
                "not_before": not_before}, conn=c)

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
        async with self.connection(conn) as c:
            return await self.store.execute("restore_due", {
                "ids": [p[0] for p in pushed], "claim_tokens": [p[1] for p in pushed],
                "pushed": [p[2] for p in pushed], "asked": [p[3] for p in pushed],
                "offset": self.clock_offset}, conn=c)

    async def fail_stuck_jobs(self) -> list[Job]:
        """Fail running jobs whose lock is stale and whose attempts are used up (docs/design.md,
        "Stuck jobs"), then run their give-up hooks (and any others still owed).

        Returns:
            The jobs failed by this call, as they are now (status ``failed``).
        """
        async with self.connection() as c:
            rows = await self.store.fetch_dicts("fail_stuck", {
                "offset": self.clock_offset, "stale_after": self.stale_after,
                "schema_name": self.schema}, conn=c)
        stuck = sorted((Job.from_row(r, lenient=True) for r in rows), key=lambda j: j.id)
        await self.run_give_up_hooks()
        return stuck

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
            row = await self.store.fetch_dict("get_job", {"id": job_id}, conn=c)
        return None if row is None else Job.from_row(row)

    # -- give-up hooks -----------------------------------------------------------------

    @property
    def give_up_hooks(self) -> Mapping[str, GiveUpHook]:
        """The give-up hooks this queue runs, by job type (read-only view): those
        registered on it, and for a pipeline's queue (:meth:`with_stage_rules`) its
        stages' over those of the queue it came from."""
        return MappingProxyType(self._give_up_hooks)

    def on_give_up(self, job_type: str, hook: GiveUpHook) -> None:
        """Register ``async def hook(job, conn)`` for jobs of ``job_type`` that end failed
        by any path (fail, stuck, deferral cap) (docs/design.md,
        "Give-up hooks").

        The hook runs inside the transaction that records the give-up as handled, so
        what it writes through ``conn`` commits together with that record: exactly once,
        even if the process dies in between (the owed hook is found and run later by
        :meth:`run_give_up_hooks`, which maintenance calls). A hook that raises is rolled
        back and retried later, never doubled. Side effects outside ``conn`` are the
        hook's own to make idempotent.
        """
        self._give_up_hooks[self.check_type(job_type)] = hook

    async def run_give_up_hooks(self, ids: Sequence[int] | None = None, *,
                                limit: int = 1000) -> int:
        """Run owed give-up hooks (for ``ids`` only, when given) for the types this queue
        has hooks for; jobs of other types stay owed for a process that has them.

        Returns:
            How many hooks ran and were recorded.
        """
        if not self._give_up_hooks:
            return 0
        async with self.connection() as c:
            rows = await self.store.fetch_all("give_up_owed", {
                "types": list(self._give_up_hooks), "ids": list(ids) if ids else None,
                "limit": limit}, conn=c)
        owed = [r[0] for r in rows]
        ran = 0
        for job_id in owed:
            try:
                if await self._run_one_give_up(job_id):
                    ran += 1
            except Exception:
                log.exception("give-up hook for job %s raised; it stays owed", job_id)
        return ran

    async def _run_one_give_up(self, job_id: int) -> bool:
        async with self.connection() as c, c.transaction():
            row = await self.store.fetch_dict("give_up_lock", {"id": job_id}, conn=c)
            if row is None:  # already handled, or a concurrent sweeper has it
                return False
            # A row that cannot be read still gave up: its hook runs with the
            # Unreadable values in the job (docs/design.md, "Give-up hooks").
            job = Job.from_row(row, lenient=True)
            with self.tracer.give_up(job):
                await self._give_up_hooks[job.type](job, c)
            await self.store.execute("give_up_done", {"id": job_id}, conn=c)
        return True

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
        derived._give_up_hooks = ChainMap(
            {t: h for t, h in hooks.items() if h is not None}, self._give_up_hooks,
            {t: _no_give_up_hook for t, h in hooks.items() if h is None})
        derived._closes_pool = False
        return derived

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
        async with self.connection(conn) as c:
            return await self.store.execute("heartbeat", {
                "ids": [j.id for j in fenced],
                "claim_tokens": [j.claim_token for j in fenced],
                "offset": self.clock_offset}, conn=c)

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
        t = self.check_type(job_type)
        require_due_time(until, "until")
        async with self.connection(conn) as c:
            return await self.store.execute("postpone", {
                "type": t, "until": until, "offset": self.clock_offset,
                "stale_after": self.stale_after}, conn=c)

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
            row = await self.store.fetch_one("quota_blocked_work", {
                "type": t, "until": until}, conn=c)
        return row is not None and bool(row[0])

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

    # -- helpers -----------------------------------------------------------------------

    def _encoded_result(self, job: Job, value: Any) -> str | ResultError | None:
        """``value`` checked and encoded for ``jobs.result``, or the error saying why it
        cannot be stored (naming the job)."""
        try:
            return encode_result(value, self.max_payload_bytes)
        except ResultError as exc:
            return ResultError(f"job {job.id}: {exc}")

    def _fence(self, job: Job) -> dict[str, Any]:
        if not isinstance(job, Job):
            raise InvalidInput(f"expected a rota.Job, got {type(job).__name__}")
        return {"id": job.id, "claim_token": job.claim_token, "offset": self.clock_offset}

    # -- admin operations ----------------------------------------------------------------
    # rota.admin's functions take the queue first, so bound here they are its methods:
    # queue.list_jobs(status="failed") runs rota.admin.list_jobs(queue, status="failed").
    from . import admin as _admin

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


class IdleConnectionCheck:
    """The check rota's own pools run when they hand out a connection
    (``AsyncConnectionPool(check=...)``; set :attr:`pool` to that pool).

    A connection the server closed while it sat idle in the pool (a database restart, an
    idle-session timeout, a terminated backend) has the server's last message or EOF
    waiting on its socket. Only such a connection pays a round trip (psycopg_pool's
    check, which raises, and the pool hands out a fresh connection instead); a healthy
    idle connection has nothing to read and costs nothing. Without it, the first use of
    each pooled connection after a restart fails, and a run's next statements fail one
    by one.

    When one idle connection turns out closed, the pool's other idle connections most
    likely went with it (a restart closes them all): the pool is drained, so they are
    replaced at once in the background. psycopg_pool waits after each failed check
    before it tries the next connection, and the wait doubles (1 s, 2 s, 4 s, ...):
    checked one by one, ten dead connections would hold the caller for minutes (past
    the pool's 30 s timeout), so a run cut off by a restart could not record its end
    within its platform timeout (docs/design.md, "Connections").

    Raises:
        psycopg.OperationalError: the connection is closed or broken.
    """

    def __init__(self) -> None:
        #: The pool drained when a connection fails the check (``None``: none is).
        self.pool: AsyncConnectionPool[Any] | None = None

    async def __call__(self, conn: AnyConn) -> None:
        try:
            await check_idle_connection(conn)
        except Exception:
            if self.pool is not None:
                with contextlib.suppress(Exception):  # closed or closing: nothing to do
                    await self.pool.drain()
            raise


async def check_idle_connection(conn: AnyConn) -> None:
    """Whether one idle connection still works: a connection with nothing to read costs
    nothing, one with something to read (the server's goodbye, EOF) a round trip
    (see :class:`IdleConnectionCheck`).

    Raises:
        psycopg.OperationalError: the connection is closed or broken.
    """
    if conn.closed:
        raise psycopg.OperationalError("the connection is closed")
    if _has_input(conn.fileno()):
        await AsyncConnectionPool.check_connection(conn)


def _has_input(fd: int) -> bool:
    """Whether ``fd`` has something to read (or hung up), without waiting. poll() where
    there is one: select() refuses descriptors above 1023, which a busy server has."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    readable, _, _ = select.select([fd], [], [], 0)
    return bool(readable)


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Read an abandoned task's outcome, so asyncio does not log it as never
    retrieved."""
    if not task.cancelled():
        task.exception()


__all__ = ["AnyConn", "GiveUpHook", "Queue"]
