"""The fair claim (docs/design.md, "The fair claim"; docs/fast-claim.md for how it stays
exact without reading the backlog).

:class:`FairClaim` runs the claim statement (``claim.sql`` with its fragments) and sizes
its probe: how many least-served groups, and how many jobs per group, it reads before it
can prove it holds the best batch. It is also the one door to the bookkeeping tables for
the rest of rota: the dashboard's oldest-due probe (``oldest_due.sql``), the contract
check (``verify.sql``) and the rebuild (``repair.sql``).
"""

from __future__ import annotations

import operator
import time
import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from psycopg.rows import tuple_row

from ..checks import positive_int, positive_seconds
from ..job import Job
from ..plans import Plans
from ..store import AnyConn, RawStatement, Store, prelude
from . import contract
from .contract import RepairReport, Violation
from .upkeep import ClaimUpkeep

#: The claim's placeholders that a plan cap fills (each ``fair/NAME_on.sql``; without a
#: cap, ``fair/NAME.sql``, which is nothing).
CAP_FRAGMENTS = ("cap_prelude", "cap_filter_group", "cap_filter_owner", "cap_filter_unit",
                 "cap_filter_pool", "cap_filter_scan", "cap_tail")


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
        # Probe sizes that sufficed (groups, per, spread), per type and order.
        self._probe: dict[tuple[str, str], tuple[int, int, int]] = {}
        self._probe_calm: dict[tuple[str, str], int] = {}  # claims in a row with no retry
        self._probe_limit: dict[tuple[str, str], int] = {}  # the limit _probe was for
        # Claim statements re-run because the probe could not prove the batch, per type
        # (tests and bench/ check that ties and locked candidates do not make it grow).
        self.retries: dict[str, int] = {}
        # When the uncapped statement's guard (cap_guard_on.sql) last saw a capped group
        # of rota's own groups table (monotonic seconds; None: never or long ago).
        self._group_capped_at: float | None = None
        self._group_cap_recheck = 60.0

    @property
    def group_cap_recheck(self) -> float:
        """Seconds a queue that saw a capped group keeps to the capped statement before
        it asks again whether any group is still capped (:attr:`group_capped`); 60 by
        default, 0 to ask at every claim.

        Raises:
            InvalidInput: (when set) not a finite number of seconds, 0 or more.
        """
        return self._group_cap_recheck

    @group_cap_recheck.setter
    def group_cap_recheck(self, seconds: float) -> None:
        self._group_cap_recheck = positive_seconds(seconds, "group_cap_recheck", zero=True)

    @property
    def group_capped(self) -> bool:
        """Whether claims run the capped statement for the groups' own caps
        (groups.max_running, rota's own groups table; docs/design.md, "Caps"): from
        when the uncapped statement's guard saw a capped group (retry ``"caps"``), for
        :attr:`group_cap_recheck` seconds; then the next claim runs the uncapped
        statement again, whose guard sends it back at once while any group is capped.
        So a queue whose groups' caps were all removed stops paying for the capped
        statement within a minute, at the price of one statement that claims nothing a
        minute while caps stay."""
        at = self._group_capped_at
        if at is None:
            return False
        if time.monotonic() - at < self.group_cap_recheck:
            return True
        self._group_capped_at = None
        return False

    @group_capped.setter
    def group_capped(self, value: bool) -> None:
        self._group_capped_at = time.monotonic() if value else None

    def statement(self, fair_by: str = "group", capped: bool = False) -> RawStatement:
        """The claim for ``fair_by`` (``"group"`` or ``"owner"``; docs/design.md, "The
        fair claim"). By group it walks fair_groups' copy of plan and active for rota's
        own groups table (through fair_groups_walk_idx, from each plan's walk floor),
        and reads an application's groups relation live. By owner it walks the owners'
        rows (``fair_owners``) for rota's own groups table, and reads every group of the
        type with its owner, live, from an application's relation
        (``claim_pool_owner.sql``).
        ``capped`` (a plan sets ``max_running``, or a group of rota's own groups table
        does: :attr:`group_capped`) adds the caps (docs/design.md, "Caps": the
        ``cap_*_on.sql`` fragments, with the groups' own caps on rota's own groups table);
        without it the statement has none of them, and on rota's own groups table asks
        whether a group is capped (``cap_guard_on.sql``: retry ``"caps"``)."""
        caps = {name: f"fair/{name}_on" for name in CAP_FRAGMENTS} if capped else {}
        if not capped and not self.store.external_groups:
            # Group caps (rota's own groups table only; the store reads them where the
            # capped statement has placeholders): the uncapped one asks whether any is set.
            caps["cap_guard"] = "fair/cap_guard_on"
        if fair_by == "owner":
            if self.store.external_groups:
                return self.store.raw("fair/claim", pool="fair/claim_pool_owner",
                                      claim_order="fair/claim_order_owner",
                                      owner_walk="fair/claim_owner_walk_scan", **caps)
            return self.store.raw("fair/claim", pool="fair/claim_pool_owner_cached",
                                  claim_order="fair/claim_order_owner",
                                  owner_walk="fair/claim_owner_walk_cached", **caps)
        if self.store.external_groups:
            pool = "fair/claim_pool_scan"
        else:
            pool = "fair/claim_pool_cached"
        return self.store.raw("fair/claim", pool=pool, claim_order="fair/claim_order_group",
                              **caps)

    async def claim(self, job_type: str, limit: int, *, plans: Plans,
                    clock_offset: timedelta, stale_after: timedelta,
                    served_window: timedelta, run_id: uuid.UUID | None = None,
                    fair_by: str = "group", conn: AnyConn | None = None) -> list[Job]:
        """Claim up to ``limit`` jobs of ``job_type``; see :meth:`rota.Queue.claim`
        (``fair_by``: ``"group"`` or ``"owner"``, the queue's setting).

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
        groups, per, spread = self._start((job_type, fair_by), limit)
        # The sizes the proof needed: a retry because a concurrent claimer held
        # candidates ("held") reads further for this claim only. Remembered, it made
        # every later claim probe every group while two claimers ran flat out
        # (bench/RESULTS.md, section 17).
        needed: tuple[int, ...] = (groups, per, spread)
        retried = False
        statement = self.statement(fair_by, plans.capped or self.group_capped)
        async with self.store.deadline(), self.store.connection(conn) as c:
            while True:
                # Times are loaded guarded (a small cost a value): a value that cannot be
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
                    ahead = prelude(c)  # rota's settings behind a pooler
                    if ahead is not None:
                        await c.execute(ahead)
                    await c.execute(self.store.sql("fair/claim_settings"), prepare=True)
                    await cur.execute(statement.text, statement.params(
                        {**params, "probe_groups": groups, "probe_per": per,
                         "probe_spread": spread, "candidates": candidates}), prepare=True)
                # Read after the pipeline's Sync: its results came back with it, in the
                # one round trip.
                rows = await cur.fetchall()
                retry = rows[0][-1] if len(rows) == 1 else None
                if retry is None:
                    break
                if "caps" in retry:
                    # A group is capped (cap_guard_on.sql): the capped statement, from
                    # now on, with the same probe (the uncapped one proved nothing).
                    self.group_capped = True
                    statement = self.statement(fair_by, True)
                    continue
                # The bound did not prove the probed jobs hold the best batch (or a
                # concurrent claimer holds candidates and more may be claimable): read
                # more groups, more jobs per group or more candidates, and ask again
                # (nothing was claimed).
                if "groups" in retry:
                    groups *= 2
                if "per" in retry:
                    per *= 2
                if "spread" in retry:  # fair_by "owner": more groups of each owner
                    spread *= 2
                if "cand" in retry:
                    candidates *= 2
                if "held" not in retry:  # the proof's own need, doubled from its sizes
                    needed = tuple(n * 2 if reason in retry else n for n, reason in
                                   zip(needed, ("groups", "per", "spread"), strict=True))
                    retried = True
                self.retries[job_type] = self.retries.get(job_type, 0) + 1
        self._remember((job_type, fair_by), limit, (needed[0], needed[1], needed[2]), retried)
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

    async def oldest_due(self, types: Sequence[str], k: int, *, clock_offset: timedelta,
                         conn: AnyConn | None = None) -> list[dict[str, Any]]:
        """Probe the ``k`` groups of each type whose due jobs may have waited longest, as
        the head bounds say (``oldest_due.sql``, for the dashboard and the metrics).

        Returns:
            Rows ``type, group_id, plan, due_since, next_bound, now`` (see the
            statement's header for when the answer is exact).
        """
        return await self.store.fetch_dicts("fair/oldest_due", {
            "types": list(types), "k": k, "offset": clock_offset}, conn=conn)

    async def verify(self) -> list[Violation]:
        """Check the bookkeeping against ``jobs`` (``verify.sql``, one read-only
        statement); see :func:`rota.fair.contract.verify`.

        Returns:
            Every violation, by type, group and invariant; empty when exact.
        """
        return await contract.verify(self.store)

    async def repair(self, clock_offset: timedelta) -> RepairReport:
        """Rebuild the bookkeeping from ``jobs`` in one transaction; see
        :func:`rota.fair.contract.repair` (arguments, locks, errors)."""
        report = await contract.repair(self.store, clock_offset)
        self._probe.clear()  # sizes that sufficed on the old rows say nothing now
        self._probe_limit.clear()
        return report

    def _floor(self, limit: int, fair_by: str = "group") -> tuple[int, int, int]:
        """The smallest probe: groups (owners, by owner), jobs per group, and groups per
        owner (by owner only). By owner, a batch of ``limit`` takes about one job from
        each of as many owners while their served counts tie, so it starts from
        ``limit + 8`` owners (fewer made owners tied on their served counts need a
        wider walk again and again), one group each and one job a group (with the next
        one, its bound): each probed group costs an index scan of its jobs, and the
        claim's own sizing (the owners' shares, the groups' water level) reads more
        where the order will take more (bench/RESULTS.md, sections 16 and 27)."""
        if self.probe_floor:
            return (*self.probe_floor, 1)
        if fair_by == "owner":
            return (limit + 8, 1, 1)
        return (limit * 2 + 8, 2, 2)

    def _start(self, key: tuple[str, str], limit: int) -> tuple[int, int, int]:
        """The probe a claim of ``limit`` starts from: the sizes that sufficed last
        (:meth:`_remember`), their groups scaled to this limit when they were for
        another one (a worker's claims of 100 made a claim of 25 beside it probe 208
        groups, where 58 suffice; bench/RESULTS.md, section 17): what that claim needed
        beyond its floor, in proportion; never below the floor."""
        floor = self._floor(limit, key[1])
        sizes = self._probe.get(key)
        if sizes is None:
            return floor
        was = self._probe_limit.get(key, limit)
        if was != limit:  # what that claim needed beyond its floor, scaled to this limit
            g, p, s = (f + -(-max(0, n - w) * limit // was) for n, w, f in
                       zip(sizes, self._floor(was, key[1]), floor, strict=True))
            sizes = (g, p, s)
        return (max(floor[0], sizes[0]), max(floor[1], sizes[1]), max(floor[2], sizes[2]))

    def _remember(self, key: tuple[str, str], limit: int, sizes: tuple[int, int, int],
                  retried: bool) -> None:
        """Start the next claim of this type (and order) from the probe sizes that
        sufficed, drifting back toward the smallest useful ones so one unusual claim does
        not stick: by an eighth after every 8 claims in a row that needed no retry (a
        retry costs a whole claim, a few more groups probed far less)."""
        calm = 0 if retried else self._probe_calm.get(key, 0) + 1
        if calm >= 8:
            calm = 0
            sizes = (sizes[0] - max(1, sizes[0] // 8), sizes[1] - max(1, sizes[1] // 8),
                     sizes[2] - max(1, sizes[2] // 8))
        self._probe_calm[key] = calm
        self._probe_limit[key] = limit
        floor = self._floor(limit, key[1])
        self._probe[key] = (max(floor[0], sizes[0]), max(floor[1], sizes[1]),
                            max(floor[2], sizes[2]))


__all__ = ["FairClaim"]
