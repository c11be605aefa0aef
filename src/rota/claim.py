"""The fair claim and its upkeep (docs/design.md, "The fair claim";
docs/fast-claim.md for how it stays exact without reading the backlog).

- :class:`FairClaim` runs the claim statement (``sql/claim.sql``) and sizes its probe:
  how many least-served groups, and how many jobs per group, it reads before it can
  prove it holds the best batch.
- :class:`ClaimUpkeep` is the claim's maintenance service, in the shape of every
  maintenance task (:mod:`rota.maintenance`): validated settings, ``run_once()``
  returning counters, and ``start()``/``stop()`` for its background loop. It folds
  completions into the served counts, renews head bounds, moves the served window's
  edge and vacuums the bookkeeping tables, off the claim's path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import operator
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from psycopg.rows import tuple_row

from .checks import positive_int, positive_seconds
from .job import Job
from .plans import Plans
from .store import AnyConn, RawStatement, Store

log = logging.getLogger("rota.claim")


class FairClaim:
    """Claims jobs of one queue in fair order, one statement per claim.

    Args:
        store: the queue's store.
        upkeep: told after every claim that the type's bookkeeping wants a round.
    """

    # The smallest probe a claim starts from: groups and jobs per group (tests set it to
    # (1, 1) to drive every claim through the retries).
    probe_floor: tuple[int, int] | None = None

    def __init__(self, store: Store, upkeep: ClaimUpkeep) -> None:
        self.store = store
        self.upkeep = upkeep
        self._probe: dict[str, tuple[int, int]] = {}  # probe sizes that sufficed, per type
        self._probe_calm: dict[str, int] = {}  # claims in a row that needed no retry
        # Claim statements re-run because the probe could not prove the batch, per type
        # (tests and bench/ check that ties and locked candidates do not make it grow).
        self.retries: dict[str, int] = {}

    def statement(self) -> RawStatement:
        """The claim: it walks fair_groups' copy of plan and active for rota's own groups
        table, and reads an application's groups relation live."""
        pool = "claim_pool_scan" if self.store.external_groups else "claim_pool_cached"
        return self.store.raw("claim", pool=pool)

    async def claim(self, job_type: str, limit: int, *, plans: Plans,
                    clock_offset: timedelta, stale_after: timedelta,
                    served_window: timedelta, run_id: uuid.UUID | None = None,
                    conn: AnyConn | None = None) -> list[Job]:
        """Claim up to ``limit`` jobs of ``job_type``; see :meth:`rota.Queue.claim`.

        Returns:
            The claimed jobs in fair order, made leniently: a row holding a value that
            could not be loaded is claimed like the others and has it as an
            :class:`~rota.job.Unreadable` (see :attr:`rota.Job.problems`).

        Raises:
            InvalidInput: ``limit`` is not an int in 1..2**31-1.
        """
        positive_int(limit, "limit")
        # Over-fetch fair candidates so a claimer that finds the head locked by a
        # concurrent claimer usually fills its batch from the next ones in order (when
        # not, the statement says "cand" and the claim reads on).
        candidates = limit * 4 + 16
        params = {
            "type": job_type,
            "limit": limit,
            "run_id": run_id,
            "offset": clock_offset,
            "stale_after": stale_after,
            "served_window": served_window,
            **plans.claim_params(),
        }
        groups, per = self._probe.get(job_type, self._floor(limit))
        retried = False
        statement = self.statement()
        async with self.store.deadline(), self.store.connection(conn) as c:
            while True:
                # Times are loaded guarded (about 0.25 µs a value): a value that cannot be
                # loaded becomes Unreadable on its job, so no client-side error can come
                # between the claim and its commit.
                cur = self.store.cursor(c, tuple_row, guard_times=True, raw=True)
                # Settings and claim pipelined into one round trip. On our own autocommit
                # connection they form one implicit transaction, committed by the
                # pipeline's Sync (no BEGIN and COMMIT round trips: a claim was 4 round
                # trips, now 1); on the caller's connection they join its transaction
                # (psycopg opens it if needed and the caller commits, as for every
                # `conn=` call). A claim cancelled after it was sent may commit with no
                # one to run its jobs: they come back as stale locks (docs/design.md,
                # "Claim").
                async with c.pipeline():
                    await c.execute(self.store.sql("claim_settings"), prepare=True)
                    await cur.execute(statement.text, statement.params(
                        {**params, "probe_groups": groups, "probe_per": per,
                         "candidates": candidates}), prepare=True)
                # Read after the pipeline's Sync: its results came back with it, in the
                # one round trip.
                rows = await cur.fetchall()
                retry = rows[0][-1] if len(rows) == 1 else None
                if retry is None:
                    break
                # The bound did not prove the probed jobs hold the best batch (or a
                # concurrent claimer holds candidates and more may be claimable): read
                # more groups, more jobs per group or more candidates, and ask again
                # (nothing was claimed).
                if "groups" in retry:
                    groups *= 2
                if "per" in retry:
                    per *= 2
                if "cand" in retry:
                    candidates *= 2
                retried = True
                self.retries[job_type] = self.retries.get(job_type, 0) + 1
        self._remember(job_type, limit, groups, per, retried)
        # A claim on the caller's connection asks for upkeep too: an application that
        # always claims inside its own transaction would otherwise never fold.
        self.upkeep.request(job_type)
        if not rows:
            return []
        # Tuple rows: the job's columns, then claim_order, then retry.
        assert cur.description is not None
        make = Job.row_maker([col.name for col in cur.description], lenient=True)
        rows.sort(key=operator.itemgetter(-2))
        return [make(r) for r in rows]

    def _floor(self, limit: int) -> tuple[int, int]:
        return self.probe_floor or (limit * 2 + 8, 2)

    def _remember(self, job_type: str, limit: int, groups: int, per: int,
                  retried: bool) -> None:
        """Start the next claim of this type from the probe sizes that sufficed, drifting
        back toward the smallest useful ones so one unusual claim does not stick: by an
        eighth after every 8 claims in a row that needed no retry (a retry costs a whole
        claim, a few more groups probed far less)."""
        floor_groups, floor_per = self._floor(limit)
        calm = 0 if retried else self._probe_calm.get(job_type, 0) + 1
        if calm >= 8:
            calm = 0
            groups -= max(1, groups // 8)
            per -= max(1, per // 8)
        self._probe_calm[job_type] = calm
        self._probe[job_type] = (max(floor_groups, groups), max(floor_per, per))


@dataclass(frozen=True)
class UpkeepConfig:
    """Settings of :class:`ClaimUpkeep` (seconds).

    Args:
        every: a type's upkeep rounds run at most this often; a round folds every
            completion since the last one, so a busy worker pays one round per interval
            instead of one per claim.
        advance_every: how often the served window's edge moves (``fair_advance``); the
            claim's exact edge correction then reads about this many seconds of
            completions.
        vacuum_every: how often the bookkeeping tables are vacuumed.

    Raises:
        InvalidInput: a value that is not a positive number.
    """

    every: float = 0.02
    advance_every: float = 1.0
    vacuum_every: float = 10.0

    def __post_init__(self) -> None:
        for name in ("every", "advance_every", "vacuum_every"):
            positive_seconds(getattr(self, name), f"UpkeepConfig.{name}")


class ClaimUpkeep:
    """The claim's upkeep service: folds, bound renewals, edge moves and VACUUM.

    The claim stays exact without it (it probes further when bounds are old); upkeep
    keeps the probe small. Claims call :meth:`request`; the background loop started by
    :meth:`start` (the queue starts it on open and stops it on close) runs a round for
    each requested type at most every ``config.every`` seconds. :meth:`run_once` runs a
    round for every type now.

    Args:
        store: the queue's store.
        settings: a zero-argument callable returning ``(clock_offset, served_window)``
            as they are now (tests move the clock while the queue runs).
        config: :class:`UpkeepConfig`.

    Counters (``run_once``): ``folded`` (groups whose counts were folded), ``advanced``
    (types whose window edge moved), ``vacuumed`` (0 or 1).
    """

    name = "claim_upkeep"

    def __init__(self, store: Store, settings: Any,
                 config: UpkeepConfig | None = None) -> None:
        self.store = store
        self.config = config or UpkeepConfig()
        self._settings = settings
        self._due: set[str] = set()  # types whose upkeep should run again
        self._seen: set[str] = set()  # every type ever claimed by this queue
        self._upkept: dict[str, float] = {}  # monotonic time of the last round per type
        self._advanced: dict[str, float] = {}  # monotonic time of the last edge move
        self._vacuumed = time.monotonic()
        self._vacuum_refused = False
        self._vacuum_allowed = False  # the role may VACUUM them (checked once)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._new_events()

    def _new_events(self) -> None:
        self._wake = asyncio.Event()
        self._hurry = asyncio.Event()  # settle(): run due rounds now
        self._idle = asyncio.Event()
        self._idle.set()

    def _bind(self) -> bool:
        """Bind to the running event loop; returns whether the loop task is alive. A
        queue used from a new event loop (``asyncio.run`` per call) gets a new task and
        new events there: the old loop's task can never run again."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop = loop
            self._task = None
            self._new_events()
            if self._due:
                self._idle.clear()
        return self._task is not None and not self._task.done()

    # -- the service ---------------------------------------------------------------

    def start(self) -> None:
        """Start the background loop on the running event loop (idempotent)."""
        if not self._bind():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Run the rounds still due, then stop the loop."""
        await self.settle()
        if self._bind() and self._task is not None:
            self._stopping = True
            self._wake.set()
            try:
                await self._task
            finally:
                self._stopping = False
                self._task = None

    def abandon(self) -> None:
        """Cancel the background loop without waiting for it (a queue closing while
        the database does not answer: docs/operations.md, "Network partitions and
        timeouts")."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = None

    def request(self, job_type: str) -> None:
        """Ask for a round for ``job_type`` (a claim of that type just ran)."""
        self._due.add(job_type)
        self._seen.add(job_type)
        self.start()
        self._idle.clear()
        self._wake.set()

    async def settle(self) -> None:
        """Run the rounds that are due now and wait for them (tests, shutdown)."""
        if not self._bind() or not self._due:
            return
        assert self._task is not None
        self._hurry.set()
        self._wake.set()
        idle = asyncio.ensure_future(self._idle.wait())
        try:  # the loop task never ends on its own; if it did, waiting would never end
            await asyncio.wait([idle, self._task], return_when=asyncio.FIRST_COMPLETED)
        finally:
            idle.cancel()
            self._hurry.clear()

    async def run_once(self) -> dict[str, int]:
        """One round for every type this queue has claimed, and a VACUUM when due.

        Returns:
            Counters ``folded``, ``advanced``, ``vacuumed``.
        """
        totals = {"folded": 0, "advanced": 0, "vacuumed": 0}
        for job_type in sorted(self._seen):
            counts = await self._round(job_type, force_advance=True)
            totals["folded"] += counts["folded"]
            totals["advanced"] += counts["advanced"]
        totals["vacuumed"] = await self._maybe_vacuum(force=True)
        return totals

    async def _run(self) -> None:
        # Stopped by a flag, not by cancel(): Python 3.11's wait primitives can swallow a
        # cancellation that lands as they finish, which left a stopping queue hanging.
        while not self._stopping:
            if not self._due:
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            now = time.monotonic()
            ready = [t for t in self._due
                     if self._hurry.is_set()
                     or now - self._upkept.get(t, -1e9) >= self.config.every]
            if not ready:
                wait = min(self._upkept.get(t, -1e9) + self.config.every - now
                           for t in self._due)
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(wait, 0.0)):
                        await self._wake.wait()
                continue
            for job_type in ready:
                self._due.discard(job_type)
                try:
                    await self._round(job_type)
                except Exception:  # best effort: the claim is exact without it
                    log.exception("claim upkeep for %r failed", job_type)
            await self._maybe_vacuum()

    async def _round(self, job_type: str, *, force_advance: bool = False) -> dict[str, int]:
        now = self._upkept[job_type] = time.monotonic()
        advance = (force_advance
                   or now - self._advanced.get(job_type, -1e9) >= self.config.advance_every)
        if advance:
            self._advanced[job_type] = now
        clock_offset, served_window = self._settings()
        row = await self.store.fetch_one("claim_upkeep", {
            "type": job_type, "advance": advance,
            "offset": clock_offset, "served_window": served_window,
        })
        folded = int(row[0] or 0) if row else 0
        advanced = 1 if row and row[1] else 0
        return {"folded": folded, "advanced": advanced}

    async def _maybe_vacuum(self, *, force: bool = False) -> int:
        now = time.monotonic()
        if not force and now - self._vacuumed < self.config.vacuum_every:
            return 0
        self._vacuumed = now
        return await self._vacuum()

    async def _vacuum(self) -> int:
        """VACUUM the claim's bookkeeping tables (small, rewritten all the time). Each
        fold leaves a dead row version and a dead walk-index entry per group, at the
        front of the walk where the least-served groups are; autovacuum looks at a
        database about once a minute (autovacuum_naptime), by when a busy queue had
        left tens of thousands, which tripled the walk's cost at 1,000,000 pending
        jobs. SKIP_LOCKED: never waits. A role that may not vacuum them is told once.

        Returns:
            1 when it vacuumed, else 0.
        """
        if self._vacuum_refused:
            return 0
        try:
            async with self.store.connection() as c:
                if not c.autocommit:  # a caller's pool: VACUUM cannot run in a transaction
                    self._vacuum_refused = True
                    log.info("the pool's connections are not autocommit: the claim "
                             "bookkeeping of %s is left to autovacuum", self.store.schema)
                    return 0
                if not self._vacuum_allowed:  # asked once: ownership does not change
                    row = await self.store.fetch_one("may_vacuum_bookkeeping",
                                                     {"schema": self.store.schema}, conn=c)
                    self._vacuum_allowed = bool(row and row[0])
                if not self._vacuum_allowed:
                    # VACUUM would only warn and skip, every time.
                    self._vacuum_refused = True
                    log.info("not allowed to VACUUM %s's bookkeeping tables (not their "
                             "owner); autovacuum does it", self.store.schema)
                    return 0
                await self.store.execute("vacuum_bookkeeping", {}, conn=c)
                return 1
        except Exception:
            log.exception("VACUUM of the claim bookkeeping failed")
            return 0


__all__ = ["ClaimUpkeep", "FairClaim", "UpkeepConfig"]
