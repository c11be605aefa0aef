"""The queue: enqueue, claim, complete, fail, defer, stuck jobs and give-up hooks
(DESIGN rules 1-10 and "Where we go further")."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import operator
import select
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager, nullcontext
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any, cast

import psycopg
from psycopg.rows import dict_row, tuple_row
from psycopg.sql import Composed, Identifier
from psycopg_pool import AsyncConnectionPool

from . import db
from .errors import ConfigError, InvalidInput, UnknownGroup, UnknownJobType
from .job import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    FailOutcome,
    Job,
    encode_payload,
    require_due_time,
    require_duration,
    require_text,
    storable_text,
)
from .plans import DEFAULT_PLANS, Plans

log = logging.getLogger("rota.queue")

# How often a queue moves a type's served-window edge (fair_advance): the claim's exact
# edge correction then reads about this many seconds of completions.
ADVANCE_EVERY_S = 1.0
# Claim upkeep rounds per type at most this often (seconds): a round folds every
# completion since the last one, so a busy worker pays for one round per interval
# instead of one per claim.
UPKEEP_EVERY_S = 0.02
# The claim's bookkeeping tables are vacuumed by the upkeep this often (seconds).
VACUUM_EVERY_S = 10.0

GiveUpHook = Callable[[Job, psycopg.AsyncConnection[Any]], Awaitable[None]]
ClaimObserver = Callable[[str, float], None]  # (job type, seconds) after each claim
AnyConn = psycopg.AsyncConnection[Any]


class QueueSettings:
    """Settings and input checks shared by :class:`Queue` and the sync enqueuer.

    Args:
        schema: PostgreSQL schema holding rota's tables (validated, quoted).
        plans: the plans object that ranks the claim.
        groups: the relation the claim reads groups from: ``None`` for rota's own
            ``SCHEMA.groups`` table, or a (schema-qualified) table or view name with
            columns ``group_id text``, ``plan text`` and ``active boolean``, so an
            application can keep plan and pause state in its own tables.
        types: declared job types; when given, any other type is refused.
        max_attempts: attempts before a job gives up (claims count, deferrals don't).
        max_attempts_by_type: per-type overrides of ``max_attempts``.
        stale_after: a running job's lock older than this is stale (DESIGN rule 5).
        served_window: how far back the fair order counts served work (rule 6).
        backoff_base: failure backoff is ``backoff_base * 2**attempts`` (rule 7).
        max_deferrals: when set, a job deferred more often than this gives up.
        max_payload_bytes: largest payload accepted, in UTF-8 bytes of JSON.

    Raises:
        InvalidInput: a setting has the wrong type or range.
    """

    def __init__(
        self,
        *,
        schema: str = "rota",
        plans: Plans = DEFAULT_PLANS,
        groups: str | None = None,
        types: Iterable[str] | None = None,
        max_attempts: int = 3,
        max_attempts_by_type: Mapping[str, int] | None = None,
        stale_after: timedelta = timedelta(minutes=15),
        served_window: timedelta = timedelta(days=1),
        backoff_base: timedelta = timedelta(minutes=1),
        max_deferrals: int | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        self.schema = schema
        self._schema_ident = db.identifier(schema, "schema")
        self._groups_ident = (
            db.identifier(groups, "groups relation")
            if groups is not None
            else Identifier(schema, "groups")
        )
        self.external_groups = groups is not None
        if not isinstance(plans, Plans):
            raise InvalidInput("plans must be a rota.Plans")
        self.plans = plans
        self.types = frozenset(require_text(t, "job type") or "" for t in types) if types else None
        self.max_attempts = _positive_int(max_attempts, "max_attempts")
        self.max_attempts_by_type = {
            self.check_type(t): _positive_int(n, f"max_attempts for {t!r}")
            for t, n in (max_attempts_by_type or {}).items()
        }
        self.stale_after = require_duration(stale_after, "stale_after")
        self.served_window = require_duration(served_window, "served_window")
        self.backoff_base = require_duration(backoff_base, "backoff_base", positive=False)
        self.max_deferrals = (
            None if max_deferrals is None else _positive_int(max_deferrals, "max_deferrals", 0)
        )
        self.max_payload_bytes = _positive_int(max_payload_bytes, "max_payload_bytes")
        self.clock_offset = timedelta(0)

    @property
    def clock_offset(self) -> timedelta:
        """Added to the database's ``now()`` in every comparison and every timestamp the
        queue writes; tests and simulations move time forward with it. Datetimes passed
        in (``run_after``, ``until``) are absolute and are not shifted."""
        return self._clock_offset

    @clock_offset.setter
    def clock_offset(self, value: timedelta) -> None:
        self._clock_offset = require_duration(value, "clock_offset", positive=False)

    def sql(self, name: str, **fragments: str) -> Composed:
        """The named statement from ``rota/sql/`` for this queue's schema and groups
        (with named fragments filled in, see :func:`rota.db.statement`)."""
        return db.statement(name, self._schema_ident, self._groups_ident, **fragments)

    def claim_sql(self) -> Composed:
        """The claim for this queue: it walks fair_groups' copy of plan and active for
        rota's own groups table, and reads an application's groups relation live."""
        pool = "claim_pool_scan" if self.external_groups else "claim_pool_cached"
        return self.sql("claim", pool=pool)

    def table(self, name: str) -> Identifier:
        """A table of this queue's schema, quoted."""
        return Identifier(self.schema, name)

    def check_type(self, job_type: object) -> str:
        t = require_text(job_type, "job type")
        assert t is not None
        if self.types is not None and t not in self.types:
            raise UnknownJobType(
                f"unknown job type {t!r}; declared types: {', '.join(sorted(self.types))}"
            )
        return t

    def enqueue_params(
        self,
        job_type: str,
        payload: Any,
        *,
        group_id: str | uuid.UUID | None = None,
        dedupe_key: str | None = None,
        run_after: datetime | None = None,
        max_attempts: int | None = None,
    ) -> dict[str, Any]:
        """Check one job's fields and return the statement parameters."""
        t = self.check_type(job_type)
        return {
            "type": t,
            "payload": encode_payload(payload, self.max_payload_bytes),
            "group_id": require_text(group_id, "group_id", allow_none=True),
            "dedupe_key": require_text(dedupe_key, "dedupe_key", allow_none=True),
            "run_after": None if run_after is None else require_due_time(run_after,
                                                                         "run_after"),
            "max_attempts": (
                _positive_int(max_attempts, "max_attempts")
                if max_attempts is not None
                else self.max_attempts_by_type.get(t, self.max_attempts)
            ),
            "offset": self.clock_offset,
        }

    def enqueue_many_params(self, items: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
        """Check a batch and return the statement's parallel arrays (the same checks
        as :meth:`enqueue_params`, item by item).

        Raises:
            InvalidInput and subclasses: naming the first bad item (``item 3: ...``), or
                ``items`` that is not an iterable of mappings (a string, a mapping).
        """
        if isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
            raise InvalidInput(f"items must be an iterable of mappings (one per job), "
                               f"got {type(items).__name__}")
        types: list[str] = []
        payloads: list[str] = []
        group_ids: list[str | None] = []
        dedupe_keys: list[str | None] = []
        run_afters: list[datetime | None] = []
        max_attempts: list[int] = []
        allowed = _ITEM_KEYS
        max_bytes = self.max_payload_bytes
        known_types: dict[object, str] = {}  # a batch repeats a few types and groups
        known_groups: dict[object, str | None] = {None: None}
        for i, item in enumerate(items):
            if not isinstance(item, Mapping):
                raise InvalidInput(f"item {i}: expected a mapping, got {type(item).__name__}")
            if not allowed.issuperset(item) or "type" not in item or "payload" not in item:
                extra = set(item) - allowed
                raise InvalidInput(
                    f"item {i}: needs 'type' and 'payload', may have "
                    f"'group_id', 'dedupe_key', 'run_after', 'max_attempts'; "
                    f"unexpected {sorted(extra)}" if extra else
                    f"item {i}: needs 'type' and 'payload'"
                )
            try:
                raw_type = item["type"]
                t = known_types.get(raw_type) if isinstance(raw_type, str) else None
                if t is None:
                    t = known_types[raw_type] = self.check_type(raw_type)
                raw_group = item.get("group_id")
                if isinstance(raw_group, str) and raw_group in known_groups:
                    g = known_groups[raw_group]
                else:
                    g = require_text(raw_group, "group_id", allow_none=True)
                    if isinstance(raw_group, str):
                        known_groups[raw_group] = g
                payload = encode_payload(item["payload"], max_bytes)
                key = item.get("dedupe_key")
                if key is not None:
                    key = require_text(key, "dedupe_key")
                due = item.get("run_after")
                if due is not None:
                    due = require_due_time(due, "run_after")
                attempts = item.get("max_attempts")
                attempts = (_positive_int(attempts, "max_attempts") if attempts is not None
                            else self.max_attempts_by_type.get(t, self.max_attempts))
            except InvalidInput as exc:
                raise type(exc)(f"item {i}: {exc}") from None
            types.append(t)
            payloads.append(payload)
            group_ids.append(g)
            dedupe_keys.append(key)
            run_afters.append(due)
            max_attempts.append(attempts)
        return {
            "types": types,
            "payloads": payloads,
            "group_ids": group_ids,
            "dedupe_keys": dedupe_keys,
            "run_afters": run_afters,
            "max_attempts": max_attempts,
            "offset": self.clock_offset,
        }


def unknown_groups(missing: Sequence[str]) -> UnknownGroup:
    """The error for enqueueing into groups the groups relation does not know."""
    shown = ", ".join(repr(g) for g in missing[:5])
    return UnknownGroup(
        f"unknown group{'s' if len(missing) > 1 else ''} {shown}"
        f"{' …' if len(missing) > 5 else ''}: "
        f"create it first (queue.upsert_group) or enqueue without a group"
    )


_ITEM_KEYS = frozenset({"type", "payload", "group_id", "dedupe_key", "run_after",
                        "max_attempts"})


class Queue(QueueSettings):
    """A rota queue on one PostgreSQL database.

    Args:
        conninfo_or_pool: a libpq URL/conninfo string (rota opens its own pool on first
            use; close it with :meth:`close` or ``async with queue``) or an open
            ``psycopg_pool.AsyncConnectionPool`` the caller owns (autocommit or not).
        groups: see :class:`QueueSettings`; an application relation needs columns
            ``group_id text``, ``owner_id text``, ``plan text``, ``active boolean``.
        **settings: see :class:`QueueSettings` (schema, plans, groups, types,
            max_attempts, stale_after, served_window, backoff_base, max_deferrals,
            max_payload_bytes).

    Every method that takes ``conn`` runs on that connection instead of the pool, inside
    whatever transaction the caller has open, so the caller decides when it commits.
    """

    def __init__(self, conninfo_or_pool: str | AsyncConnectionPool[Any], **settings: Any):
        super().__init__(**settings)
        self._give_up_hooks: dict[str, GiveUpHook] = {}
        self.claim_observers: list[ClaimObserver] = []  # metrics (rota.web.metrics)
        self._probe: dict[str, tuple[int, int]] = {}  # claim probe sizes per type
        self._probe_calm: dict[str, int] = {}  # claims in a row that needed no retry
        self._advanced: dict[str, float] = {}  # monotonic time of the last edge move
        self._upkept: dict[str, float] = {}  # monotonic time of the last upkeep round
        self._hurry = asyncio.Event()  # settle(): run due upkeep rounds now
        self._vacuumed = time.monotonic()  # last VACUUM of the claim bookkeeping
        self._vacuum_refused = False
        self._vacuum_allowed = False  # the role may VACUUM them (checked once)
        self._upkeep_due: set[str] = set()  # types whose claim upkeep should run again
        self._upkeep_tasks: dict[str, asyncio.Task[None]] = {}
        if isinstance(conninfo_or_pool, str):
            self._pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                db.check_conninfo(conninfo_or_pool),
                open=False, min_size=1, max_size=10,
                kwargs={"autocommit": True}, check=check_idle_connection,
            )
            self._owns_pool = True
        elif isinstance(conninfo_or_pool, AsyncConnectionPool):
            self._pool = conninfo_or_pool
            self._owns_pool = False
        else:
            raise InvalidInput("Queue needs a connection string or an AsyncConnectionPool")

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def pool(self) -> AsyncConnectionPool[Any]:
        return self._pool

    async def open(self) -> None:
        """Open the queue's own pool (no-op for a caller's pool)."""
        if self._owns_pool and self._pool.closed:
            await self._pool.open(wait=True, timeout=30)

    async def close(self) -> None:
        await self.settle()
        if self._owns_pool and not self._pool.closed:
            await self._pool.close()

    async def __aenter__(self) -> Queue:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @asynccontextmanager
    async def connection(self, conn: AnyConn | None = None) -> AsyncIterator[AnyConn]:
        """Yield ``conn`` if given, else a pooled connection (committed on exit)."""
        if conn is not None:
            yield conn
            return
        await self.open()
        async with self._pool.connection() as c:
            yield c

    async def migrate(self) -> list[int]:
        """Apply missing migrations to this queue's schema; see :func:`rota.db.migrate`.

        Returns:
            The migration versions applied now (empty when up to date).
        """
        async with self.connection() as conn:
            return await db.migrate(conn, self.schema)

    async def now(self) -> datetime:
        """The queue's clock: database ``now()`` plus ``clock_offset`` (aware, UTC)."""
        row = await self._fetchone("db_now", {})
        assert row is not None
        return cast(datetime, row["now"])

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
                f"{self._groups_ident.as_string(None)}; change plan and status there"
            )
        gid = require_text(group_id, "group_id")
        owner = require_text(owner_id, "owner_id", allow_none=True)
        if plan is not None:
            self.plans[plan]
        if not isinstance(active, bool):
            raise InvalidInput("active must be a bool")
        async with self.connection(conn) as c:
            await c.execute(self.sql("upsert_group"), {"group_id": gid, "owner_id": owner,
                                                        "plan": plan, "active": active})

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
        """Enqueue one job with a single INSERT … ON CONFLICT DO NOTHING (DESIGN rule 1).

        Args:
            type: the job type (the stage that runs it).
            payload: JSON-serializable value (see :func:`rota.job.encode_payload`).
            group_id: the group it belongs to (text or UUID), or ``None``.
            dedupe_key: while a job with this key is pending or running, asking again
                creates nothing; after it is done or failed, a new job is created.
            run_after: aware datetime when it becomes claimable (years 1-9999, see
                :func:`rota.job.require_due_time`); default now (queue clock).
            max_attempts: override the queue's per-type setting.
            conn: the caller's connection; the job exists iff that transaction commits.

        Returns:
            The new job, or ``None`` when an open job with ``dedupe_key`` exists.

        Raises:
            PayloadError, NaiveDatetimeError, UnknownJobType, InvalidInput: bad input,
                nothing written.
            UnknownGroup: ``group_id`` is not in the groups relation.
        """
        params = self.enqueue_params(type, payload, group_id=group_id, dedupe_key=dedupe_key,
                                     run_after=run_after, max_attempts=max_attempts)
        async with self.connection(conn) as c:
            cur = c.cursor(row_factory=dict_row)
            await cur.execute(self.sql("enqueue"), params)
            row = await cur.fetchone()
            if row is not None:
                return Job.from_row(row)
            if params["group_id"] is not None:
                await self._check_groups(c, [params["group_id"]])
            return None

    async def enqueue_many(
        self, items: Iterable[Mapping[str, Any]], *, conn: AnyConn | None = None
    ) -> int:
        """Enqueue a batch in one INSERT over arrays.

        Args:
            items: mappings with ``type`` and ``payload`` and optionally ``group_id``,
                ``dedupe_key``, ``run_after``, ``max_attempts`` (as for :meth:`enqueue`).
            conn: the caller's connection (its transaction decides).

        Returns:
            How many jobs were created (duplicates of open jobs, or of each other inside
            the batch, are skipped).

        Raises:
            InvalidInput and subclasses: naming the first bad item; nothing written.
            UnknownGroup: some group ids are unknown; nothing written.
        """
        params = self.enqueue_many_params(items)
        if not params["types"]:
            return 0
        async with self.connection(conn) as c:
            # One statement: on our own autocommit connection it is its own transaction;
            # on a caller's connection, the caller's transaction holds it.
            cur = await c.execute(self.sql("enqueue_many"), params)
            row = await cur.fetchone()
        assert row is not None
        created, missing = row
        if missing:
            raise unknown_groups(missing)
        return int(created)

    async def _check_groups(self, conn: AnyConn, group_ids: Sequence[str]) -> None:
        cur = await conn.execute(self.sql("missing_groups"), {"group_ids": list(group_ids)})
        missing = [r[0] for r in await cur.fetchall()]
        if missing:
            raise unknown_groups(missing)

    # -- claim and transitions ---------------------------------------------------------

    async def claim(
        self,
        type: str,
        limit: int,
        *,
        run_id: uuid.UUID | None = None,
        conn: AnyConn | None = None,
    ) -> list[Job]:
        """Claim up to ``limit`` jobs of ``type`` in one transaction (DESIGN rules 3-6).

        Claimable: ``run_after <= now`` and pending, or running with a stale lock and
        attempts left, and the group active (or unknown to the groups relation). Order:
        plan priority desc, then the group's served count in the window plus the job's
        position in its group, then oldest. Rows are taken with FOR UPDATE SKIP LOCKED,
        so concurrent claimers never get the same job, and set running with
        ``attempts + 1``, ``locked_at = now``, ``run_id`` and a new ``claim_token``.

        Args:
            type: job type.
            limit: batch size, > 0.
            run_id: the ``runs`` row this claim belongs to, if any.

        Returns:
            The claimed jobs in fair order (possibly fewer than ``limit``, or none).

        Raises:
            InvalidInput: ``limit`` not in 1..2**31-1, or an unknown type.
        """
        t = self.check_type(type)
        if (not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0
                or limit > _INT_MAX):
            raise InvalidInput(f"limit must be a positive int (at most {_INT_MAX}), "
                               f"got {limit!r}")
        started = time.perf_counter()
        candidates = limit * 4 + 16
        params = {
            "type": t,
            "limit": limit,
            # Over-fetch fair candidates so a claimer that finds the head locked by a
            # concurrent claimer still fills its batch from the next ones in order.
            "candidates": candidates,
            "run_id": run_id,
            "offset": self.clock_offset,
            "stale_after": self.stale_after,
            "served_window": self.served_window,
            **self.plans.claim_params(),
        }
        groups, per = self._probe.get(t, self._probe_floor(limit))
        retried = False
        async with self.connection(conn) as c:
            cur = c.cursor(row_factory=tuple_row)  # whatever the caller's conn uses
            while True:
                # Settings and claim in one transaction, pipelined into one round trip:
                # our own on an autocommit connection; otherwise the caller's (psycopg
                # opens it if needed and the caller commits, as for every `conn=` call).
                tx = c.transaction() if c.autocommit else nullcontext()
                async with tx, c.pipeline():
                    await c.execute(self.sql("claim_settings"), prepare=True)
                    await cur.execute(self.claim_sql(),
                                      {**params, "probe_groups": groups, "probe_per": per},
                                      prepare=True)
                    rows = await cur.fetchall()
                retry = rows[0][-1] if len(rows) == 1 else None
                if retry is None:
                    break
                # The bound did not prove the probed jobs hold the best batch: read more
                # groups, or more jobs per group, and ask again (nothing was claimed).
                if "groups" in retry:
                    groups *= 2
                if "per" in retry:
                    per *= 2
                retried = True
        self._remember_probe(t, limit, groups, per, retried)
        for observe in self.claim_observers:
            observe(t, time.perf_counter() - started)
        if conn is None:
            self._schedule_upkeep(t)
        if not rows:
            return []
        # Tuple rows: the job's columns, then claim_order, then retry.
        assert cur.description is not None
        make = Job.row_maker([col.name for col in cur.description])
        rows.sort(key=operator.itemgetter(-2))
        return [make(r) for r in rows]

    # The smallest probe a claim starts from: groups and jobs per group (tests set it to
    # (1, 1) to drive every claim through the retries).
    probe_floor: tuple[int, int] | None = None

    def _probe_floor(self, limit: int) -> tuple[int, int]:
        return self.probe_floor or (limit * 2 + 8, 2)

    def _remember_probe(self, job_type: str, limit: int, groups: int, per: int,
                        retried: bool) -> None:
        """Start the next claim of this type from the probe sizes that sufficed, drifting
        back toward the smallest useful ones so one unusual claim does not stick: by an
        eighth after every 8 claims in a row that needed no retry (a retry costs a whole
        claim, a few more groups probed far less; jobs enqueued by one statement share
        created_at, and such ties make a too small probe retry)."""
        floor_groups, floor_per = self._probe_floor(limit)
        calm = 0 if retried else self._probe_calm.get(job_type, 0) + 1
        if calm >= 8:
            calm = 0
            groups -= max(1, groups // 8)
            per -= max(1, per // 8)
        self._probe_calm[job_type] = calm
        self._probe[job_type] = (max(floor_groups, groups), max(floor_per, per))

    def _schedule_upkeep(self, job_type: str) -> None:
        """Run the claim upkeep (claim_upkeep.sql) in a background task, off the claim's
        path: it only folds counts and renews bounds, which later claims use when they
        are there and do without (probing more) when not. At most one task per type and
        one round per ``UPKEEP_EVERY_S``; a claim made meanwhile asks for one more."""
        self._upkeep_due.add(job_type)
        task = self._upkeep_tasks.get(job_type)
        if task is None or task.done():
            self._upkeep_tasks[job_type] = asyncio.get_running_loop().create_task(
                self._upkeep(job_type))

    async def _upkeep(self, job_type: str) -> None:
        while job_type in self._upkeep_due:
            wait = self._upkept.get(job_type, -1e9) + UPKEEP_EVERY_S - time.monotonic()
            if wait > 0 and not self._hurry.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._hurry.wait(), wait)
            self._upkeep_due.discard(job_type)
            now = self._upkept[job_type] = time.monotonic()
            advance = now - self._advanced.get(job_type, -1e9) >= ADVANCE_EVERY_S
            if advance:
                self._advanced[job_type] = now
            try:
                async with self.connection() as c:
                    await c.execute(self.sql("claim_upkeep"), {
                        "type": job_type, "advance": advance,
                        "offset": self.clock_offset, "served_window": self.served_window,
                    }, prepare=True)
            except Exception:  # best effort: the claim is exact without it
                log.exception("claim upkeep for %r failed", job_type)
                return
            if now - self._vacuumed >= VACUUM_EVERY_S:
                self._vacuumed = now
                await self._vacuum_bookkeeping()

    async def _vacuum_bookkeeping(self) -> None:
        """VACUUM the claim's bookkeeping tables (small, rewritten all the time). Each
        fold leaves a dead row version and a dead walk-index entry per group, at the
        front of the walk where the least-served groups are; autovacuum looks at a
        database about once a minute (autovacuum_naptime), by when a busy queue had
        left tens of thousands, which tripled the walk's cost at 1,000,000 pending
        jobs. SKIP_LOCKED: never waits. A role that may not vacuum them is told once."""
        if self._vacuum_refused:
            return
        try:
            async with self.connection() as c:
                if not c.autocommit:  # a caller's pool: VACUUM cannot run in a transaction
                    self._vacuum_refused = True
                    log.info("the pool's connections are not autocommit: the claim "
                             "bookkeeping of %s is left to autovacuum", self.schema)
                    return
                if not self._vacuum_allowed:  # asked once: ownership does not change
                    cur = await c.execute(self.sql("may_vacuum_bookkeeping"),
                                          {"schema": self.schema})
                    row = await cur.fetchone()
                    self._vacuum_allowed = bool(row and row[0])
                if not self._vacuum_allowed:
                    # VACUUM would only warn and skip, every time.
                    self._vacuum_refused = True
                    log.info("not allowed to VACUUM %s's bookkeeping tables (not their "
                             "owner); autovacuum does it", self.schema)
                    return
                await c.execute(self.sql("vacuum_bookkeeping"))
        except Exception:
            log.exception("VACUUM of the claim bookkeeping failed")

    async def settle(self) -> None:
        """Run the claim upkeep that is due now and wait for it to finish (tests,
        shutdown)."""
        self._hurry.set()
        try:
            while tasks := [t for t in self._upkeep_tasks.values() if not t.done()]:
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            self._hurry.clear()

    async def complete(self, job: Job, *, conn: AnyConn | None = None) -> bool:
        """Mark a claimed job done, under its claim.

        Returns:
            ``True`` when done; ``False`` when this claim lost the job (it was reclaimed
            after a stale lock, failed as stuck, or is not running), and nothing changed.
        """
        async with self.connection(conn) as c:
            cur = await c.execute(self.sql("complete"), self._fence(job))
            return cur.rowcount == 1

    async def complete_many(self, jobs: Sequence[Job], *,
                            conn: AnyConn | None = None) -> list[bool]:
        """Mark claimed jobs done in one statement, each under its own claim (what
        :meth:`complete` does for one job, for a whole batch).

        Returns:
            One flag per job, in the order given: ``True`` when done, ``False`` when
            this claim lost that job (nothing changed for it). A job listed twice is
            completed once and gets the same flag both times.
        """
        batch = list(jobs)
        for j in batch:
            if not isinstance(j, Job):
                raise InvalidInput(f"expected a rota.Job, got {type(j).__name__}")
        # One order for every caller (type, group, fair_done shard), so two batches
        # counting into the same fair_done rows take their locks in the same order.
        fenced = sorted((j for j in batch if j.claim_token is not None),
                        key=lambda j: (j.type, j.group_id or "", j.id % 8, j.id))
        if not fenced:
            return [False] * len(batch)
        params = {"ids": [j.id for j in fenced],
                  "claim_tokens": [j.claim_token for j in fenced],
                  "offset": self.clock_offset}
        try:
            async with self.connection(conn) as c:
                cur = await c.execute(self.sql("complete_many"), params)
                done = {r[0] for r in await cur.fetchall()}
        except psycopg.errors.DeadlockDetected:
            if conn is not None:
                raise
            # Nothing was written (the statement was its own transaction): one by one.
            log.info("complete_many: deadlock detected, completing %d jobs one by one",
                     len(fenced))
            done = {j.id for j in fenced if await self.complete(j)}
        return [j.claim_token is not None and j.id in done for j in batch]

    async def fail(self, job: Job, error: BaseException | str, *,
                   conn: AnyConn | None = None) -> FailOutcome:
        """Record a failed attempt of a claimed job (DESIGN rule 7).

        With attempts left the job goes back to pending with
        ``run_after = now + backoff_base * 2**attempts``; with attempts used up it becomes
        ``failed`` (``finished_at`` set) and its give-up hook runs. The error text is kept
        in ``last_error`` (NUL characters escaped).

        Returns:
            ``"retry"``, ``"failed"``, or ``"lost"`` when this claim no longer holds the
            job (nothing changed).
        """
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        params = {**self._fence(job), "error": storable_text(text),
                  "backoff_base": self.backoff_base}
        async with self.connection(conn) as c:
            cur = await c.execute(self.sql("fail"), params)
            row = await cur.fetchone()
        if row is None:
            return "lost"
        if row[0] == "failed":
            if conn is None:
                await self.run_give_up_hooks([job.id])
            return "failed"
        return "retry"

    async def defer(
        self, jobs: Job | Iterable[Job], until: datetime | None = None, *,
        conn: AnyConn | None = None,
    ) -> int:
        """Put claimed jobs back without burning an attempt (DESIGN rule 8).

        Each job goes back to pending with ``run_after = until`` (``None``: now), its lock
        cleared, ``attempts`` decreased by one (undoing the claim) and ``deferrals``
        increased by one; ``last_error`` is untouched. Jobs this caller's claim no longer
        holds (never claimed, done, failed, reclaimed by another run) are left alone.
        With ``max_deferrals`` set, a job past it gives up instead.

        Returns:
            How many jobs were deferred.

        Raises:
            NaiveDatetimeError: ``until`` has no time zone.
            InvalidInput: ``until`` is out of range (see :func:`rota.job.require_due_time`).
        """
        batch = [jobs] if isinstance(jobs, Job) else list(jobs)
        if until is not None:
            require_due_time(until, "until")
        fenced = [j for j in batch if j.claim_token is not None]
        if not fenced:
            return 0
        params = {
            "ids": [j.id for j in fenced],
            "claim_tokens": [j.claim_token for j in fenced],
            "until": until,
            "max_deferrals": self.max_deferrals,
            "offset": self.clock_offset,
        }
        async with self.connection(conn) as c:
            cur = await c.execute(self.sql("defer"), params)
            rows = await cur.fetchall()
        gave_up = [r[0] for r in rows if r[1] == "failed"]
        if gave_up and conn is None:
            await self.run_give_up_hooks(gave_up)
        return sum(1 for r in rows if r[1] == "pending")

    async def release(self, jobs: Iterable[Job], *, conn: AnyConn | None = None) -> int:
        """Hand claimed jobs back as if they had never been claimed: pending again, the
        claim's attempt returned, the due time kept, no deferral counted (what a
        runner does with a prefetched batch its run ends before starting). Jobs this
        caller's claim no longer holds are left alone.

        Returns:
            How many jobs were released.

        Raises:
            InvalidInput: an item is not a :class:`rota.Job`.
        """
        batch = list(jobs)
        for j in batch:
            if not isinstance(j, Job):
                raise InvalidInput(f"expected a rota.Job, got {type(j).__name__}")
        fenced = [j for j in batch if j.claim_token is not None]
        if not fenced:
            return 0
        async with self.connection(conn) as c:
            cur = await c.execute(self.sql("release"), {
                "ids": [j.id for j in fenced],
                "claim_tokens": [j.claim_token for j in fenced]})
            return cur.rowcount

    async def fail_stuck_jobs(self) -> list[Job]:
        """Fail running jobs whose lock is stale and whose attempts are used up (DESIGN
        rule 9), then run their give-up hooks (and any others still owed).

        Returns:
            The jobs failed by this call, as they are now (status ``failed``).
        """
        async with self.connection() as c:
            cur = c.cursor(row_factory=dict_row)
            await cur.execute(self.sql("fail_stuck"), {"offset": self.clock_offset,
                                                       "stale_after": self.stale_after})
            rows = await cur.fetchall()
        stuck = sorted((Job.from_row(r) for r in rows), key=lambda j: j.id)
        await self.run_give_up_hooks()
        return stuck

    async def get_job(self, job_id: int, *, conn: AnyConn | None = None) -> Job | None:
        """Read one job by id, or ``None``."""
        row = await self._fetchone("get_job", {"id": job_id}, conn)
        return None if row is None else Job.from_row(row)

    # -- give-up hooks -----------------------------------------------------------------

    @property
    def give_up_hooks(self) -> Mapping[str, GiveUpHook]:
        """The give-up hooks registered on this queue, by job type (read-only view)."""
        return MappingProxyType(self._give_up_hooks)

    def on_give_up(self, job_type: str, hook: GiveUpHook) -> None:
        """Register ``async def hook(job, conn)`` for jobs of ``job_type`` that end failed
        by any path (fail, stuck, deferral cap) (DESIGN rule 10).

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
            cur = await c.execute(self.sql("give_up_owed"), {
                "types": list(self._give_up_hooks), "ids": list(ids) if ids else None,
                "limit": limit})
            owed = [r[0] for r in await cur.fetchall()]
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
            cur = c.cursor(row_factory=dict_row)
            await cur.execute(self.sql("give_up_lock"), {"id": job_id})
            row = await cur.fetchone()
            if row is None:  # already handled, or a concurrent sweeper has it
                return False
            job = Job.from_row(row)
            await self._give_up_hooks[job.type](job, c)
            await c.execute(self.sql("give_up_done"), {"id": job_id})
        return True

    # -- helpers -----------------------------------------------------------------------

    def _fence(self, job: Job) -> dict[str, Any]:
        if not isinstance(job, Job):
            raise InvalidInput(f"expected a rota.Job, got {type(job).__name__}")
        return {"id": job.id, "claim_token": job.claim_token, "offset": self.clock_offset}

    async def _fetchone(self, name: str, params: dict[str, Any],
                        conn: AnyConn | None = None) -> dict[str, Any] | None:
        async with self.connection(conn) as c:
            cur = c.cursor(row_factory=dict_row)
            await cur.execute(self.sql(name), {"offset": self.clock_offset, **params})
            row: dict[str, Any] | None = await cur.fetchone()
            return row


async def check_idle_connection(conn: AnyConn) -> None:
    """The check rota's own pools run when they hand out a connection.

    A connection the server closed while it sat idle in the pool (a database restart, an
    idle-session timeout, a terminated backend) has the server's last message or EOF
    waiting on its socket. Only such a connection pays a round trip (psycopg_pool's
    check, which raises, and the pool hands out a fresh connection instead); a healthy
    idle connection has nothing to read and costs nothing. Without it, the first use of
    each pooled connection after a restart fails, and a run's next statements fail one
    by one.

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


# The ceiling of the integer columns (attempts, max_attempts, deferrals) and of sane
# claim sizes: a larger value is refused up front instead of failing in the database.
_INT_MAX = 2**31 - 1


def _positive_int(value: object, name: str, minimum: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidInput(f"{name} must be an int >= {minimum}, got {value!r}")
    if value > _INT_MAX:
        raise InvalidInput(f"{name} must be at most {_INT_MAX}, got {value!r}")
    return value


__all__ = ["AnyConn", "GiveUpHook", "Queue", "QueueSettings"]
