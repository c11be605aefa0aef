"""The claim's upkeep service (docs/fast-claim.md, "The upkeep"): folds the served-count
changes into ``fair_groups``, renews head bounds, moves the served window's edge and
vacuums the bookkeeping tables, off the claim's path. Its SQL is ``upkeep.sql``
(``fair_fold``, ``fair_advance`` of ``bookkeeping.sql``), ``vacuum.sql`` and
``may_vacuum.sql``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from .. import statements
from ..checks import positive_seconds
from ..store import Store

log = logging.getLogger("rota.claim")


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
        horizon_every: how often the loop looks at the xmin horizon's age.
        held_after: a horizon older than this (seconds) is held: vacuum has been kept
            from the bookkeeping for at least one ``vacuum_every``, and the bookkeeping
            is vacuumed as soon as it moves again (:attr:`ClaimUpkeep.horizon_held`).

    Raises:
        InvalidInput: a value that is not a positive number of seconds, or is over
            1000 years (which would in effect turn off what it paces).
    """

    every: float = 0.02
    advance_every: float = 1.0
    vacuum_every: float = 10.0
    horizon_every: float = 2.0
    held_after: float = 15.0

    def __post_init__(self) -> None:
        for name in ("every", "advance_every", "vacuum_every", "horizon_every",
                     "held_after"):
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

    ``horizon_held`` (bool): whether the oldest transaction of the database that holds
    a snapshot or an xid (``sql/horizon_age.sql``, the ``seconds`` of
    ``rota_oldest_xmin_age_seconds``) was older than ``config.held_after`` when the
    loop last looked (every ``config.horizon_every`` while claims run). While it is,
    no dead row version of the bookkeeping can be vacuumed (the claim's walks start at
    their floors, past the entries of the folds' old versions: docs/operations.md,
    "Long transactions"), and once it moves again the next round vacuums what it kept.
    A role that cannot see other roles' sessions (no ``pg_read_all_stats``) sees only
    its own role's transactions.
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
        self.horizon_held = False
        self._horizon_looked = -1e9  # monotonic time of the last look at the horizon
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._vacuuming: asyncio.Task[int] | None = None  # a VACUUM beside the rounds
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
            self._vacuuming = None
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
        """Run the rounds still due, then stop the loop; a VACUUM still running is
        cancelled (it only frees space, and the next one does it)."""
        if self._bind() and self._due:
            await self._settle_rounds()
        if self._bind() and self._task is not None:
            self._stopping = True
            self._wake.set()
            try:
                await self._task
            finally:
                self._stopping = False
                self._task = None
        vacuuming, self._vacuuming = self._vacuuming, None
        if vacuuming is not None and not vacuuming.done():
            vacuuming.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await vacuuming

    def abandon(self) -> None:
        """Cancel the background loop without waiting for it (a queue closing while
        the database does not answer: docs/operations.md, "Network partitions and
        timeouts")."""
        for task in (self._task, self._vacuuming):
            if task is not None and not task.done():
                task.cancel()
        self._task = None
        self._vacuuming = None

    def request(self, job_type: str) -> None:
        """Ask for a round for ``job_type`` (a claim of that type just ran). A queue
        whose pool is not open (every call on the caller's connection, ``conn=``) keeps
        the round due: its loop, which runs on that pool, starts when the queue opens
        (:meth:`rota.Queue.open`), not before, so it never meets a closed pool."""
        self._due.add(job_type)
        self._seen.add(job_type)
        if self.store.pool.closed:
            return
        self.start()
        self._idle.clear()
        self._wake.set()

    async def settle(self) -> None:
        """Run the rounds that are due now and wait for them, and for a VACUUM under way
        beside them (tests, shutdown)."""
        if self._bind() and self._due:
            await self._settle_rounds()
        if self._vacuuming is not None:
            await asyncio.wait({self._vacuuming})  # done, failed or cancelled alike

    async def _settle_rounds(self) -> None:
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
        if self._vacuuming is not None:  # one VACUUM at a time
            await asyncio.wait({self._vacuuming})
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
            await self._maybe_look_at_horizon()
            self._vacuum_aside()

    async def _round(self, job_type: str, *, force_advance: bool = False) -> dict[str, int]:
        now = self._upkept[job_type] = time.monotonic()
        advance = (force_advance
                   or now - self._advanced.get(job_type, -1e9) >= self.config.advance_every)
        if advance:
            self._advanced[job_type] = now
        clock_offset, served_window = self._settings()
        row = await self.store.fetch_one("fair/upkeep", {
            "type": job_type, "advance": advance,
            "offset": clock_offset, "served_window": served_window,
        })
        folded = int(row[0] or 0) if row else 0
        advanced = 1 if row and row[1] else 0
        return {"folded": folded, "advanced": advanced}

    async def _maybe_look_at_horizon(self) -> None:
        """Every ``config.horizon_every``: set :attr:`horizon_held` from the age of the
        database's oldest transaction holding a snapshot or an xid. Best effort: a
        failed look leaves the flag as it was."""
        now = time.monotonic()
        if now - self._horizon_looked < self.config.horizon_every:
            return
        self._horizon_looked = now
        try:
            age, _ = await statements.horizon_age(self.store)
        except Exception:
            log.exception("looking at the xmin horizon failed")
            return
        held = age > self.config.held_after
        if self.horizon_held and not held:
            # What the pin kept is dead now: the next round vacuums it, rather than up to
            # vacuum_every later, while the claim's walk reads the index entries it left
            # at the front of the walk (bench/RESULTS.md, section 25).
            self._vacuumed = -1e9
        if held != self.horizon_held:
            log.info("the xmin horizon of %s's database is %s", self.store.schema,
                     f"held ({age:.1f} s): vacuum can remove no dead row version"
                     if held else "moving again")
        self.horizon_held = held

    def _vacuum_aside(self) -> None:
        """Every ``config.vacuum_every`` (and at once when the horizon moves again):
        a VACUUM as a task of its own, beside the rounds, one at a time. Vacuuming what
        a long pin kept (a million versions, six indexes) takes longer than the claims
        can go without a fold: run in the loop, it held the folds back, and the claims'
        unfolded groups piled up (bench/RESULTS.md, section 25)."""
        if self._vacuuming is not None and not self._vacuuming.done():
            return
        if time.monotonic() - self._vacuumed < self.config.vacuum_every:
            return
        self._vacuumed = started = time.monotonic()

        async def vacuum() -> int:
            try:
                return await self._vacuum()
            finally:
                # The next one vacuum_every after this one ends, not after it started
                # (unless the horizon moved meanwhile, which asks for one at once).
                if self._vacuumed == started:
                    self._vacuumed = time.monotonic()

        self._vacuuming = asyncio.get_running_loop().create_task(vacuum())

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
        database every autovacuum_naptime, by when a busy queue has left tens of
        thousands, slowing the walk (bench/RESULTS.md, "Planner notes").
        SKIP_LOCKED: never waits. A role that may not vacuum them is told once.

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
                    row = await self.store.fetch_one("fair/may_vacuum",
                                                     {"schema": self.store.schema}, conn=c)
                    self._vacuum_allowed = bool(row and row[0])
                if not self._vacuum_allowed:
                    # VACUUM would only warn and skip, every time.
                    self._vacuum_refused = True
                    log.info("not allowed to VACUUM %s's bookkeeping tables (not their "
                             "owner); autovacuum does it", self.store.schema)
                    return 0
                # Alone, never behind the settings prelude of a pooled connection: the
                # pipeline that carries it makes a transaction block, which VACUUM
                # refuses ("cannot be executed within a pipeline"). The client-side
                # deadline still bounds it.
                async with self.store.deadline():
                    await c.execute(self.store.sql("fair/vacuum"))
                return 1
        except Exception:
            log.exception("VACUUM of the claim bookkeeping failed")
            return 0


__all__ = ["ClaimUpkeep", "UpkeepConfig"]
