"""The fair claim's contract, executable (docs/fast-claim.md, "The contract"): every
invariant of the bookkeeping recounted from ``jobs`` (``verify.sql``), and the rebuild
of the bookkeeping from ``jobs`` (``repair_lock.sql``, ``repair_clear.sql``,
``repair.sql``) for an operator who finds a violation or restores a backup.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from datetime import timedelta

import psycopg

from ..errors import RotaError
from ..store import AnyConn, Store

log = logging.getLogger("rota.claim")

#: Times the rebuild is tried when PostgreSQL picks it as a deadlock's victim (a
#: transaction that changed a group's plan and then enqueues, waiting on its lock).
REPAIR_ATTEMPTS = 3


@dataclass(frozen=True)
class Violation:
    """One broken invariant of the claim's bookkeeping, for one group.

    Attributes:
        type: the job type.
        group_id: the group.
        invariant: ``served``, ``row``, ``ready_lb``, ``head``, ``plan``, ``active`` or
            ``fair_plans`` or ``mark`` (``verify.sql`` states each).
        expected: the value the jobs say it should have, as text (timestamps in UTC).
        found: the value kept, as text.
    """

    type: str
    group_id: str
    invariant: str
    expected: str
    found: str

    def __str__(self) -> str:
        return (f"type {self.type!r} group {self.group_id!r}: {self.invariant} "
                f"expected {self.expected}, found {self.found}")

    def as_dict(self) -> dict[str, str]:
        """The fields as a dict (``rota verify --json``)."""
        return asdict(self)


@dataclass(frozen=True)
class RepairReport:
    """What :func:`repair` did.

    Attributes:
        found: the violations the bookkeeping had when the rebuild took its locks.
        groups: the ``fair_groups`` rows written.
    """

    found: list[Violation]
    groups: int


class RepairFailed(RotaError):
    """The rebuilt bookkeeping still broke an invariant (nothing was kept)."""


async def _violations(store: Store, conn: AnyConn) -> list[Violation]:
    rows = await store.fetch_all("fair/verify", {}, conn=conn)
    return [Violation(*r) for r in rows]


async def verify(store: Store) -> list[Violation]:
    """Check every invariant of the bookkeeping against ``jobs`` in one read-only
    statement (one snapshot, on a pooled connection; no lock beyond a plain read).

    Returns:
        The violations, by type, group and invariant; empty when exact.
    """
    async with store.connection() as c, c.transaction():
        await store.execute("fair/verify_settings", {}, conn=c)
        return await _violations(store, c)


async def repair(store: Store, clock_offset: timedelta) -> RepairReport:
    """Rebuild the bookkeeping from ``jobs`` in one transaction: lock ``jobs`` and the
    bookkeeping tables (writers of jobs wait until it commits; claims then read the
    rebuilt rows, so they stay exact), note the violations, clear and rebuild, check
    again, commit.

    Args:
        store: the queue's store.
        clock_offset: the queue's clock offset (head bounds are "ready now" on it).

    Returns:
        A :class:`RepairReport`.

    Raises:
        RepairFailed: the rebuild still broke an invariant (rolled back).
        psycopg.errors.DeadlockDetected: chosen as a deadlock's victim
            :data:`REPAIR_ATTEMPTS` times.
    """
    for attempt in range(1, REPAIR_ATTEMPTS + 1):
        try:
            async with store.connection() as c, c.transaction():
                await store.execute("fair/verify_settings", {}, conn=c)
                await store.execute("fair/repair_lock", {}, conn=c)
                found = await _violations(store, c)
                await store.execute("fair/repair_clear", {}, conn=c)
                row = await store.fetch_one("fair/repair", {"offset": clock_offset},
                                            conn=c)
                left = await _violations(store, c)
                if left:
                    raise RepairFailed("the rebuilt bookkeeping breaks "
                                       + "; ".join(str(v) for v in left[:5]))
            return RepairReport(found=found, groups=int(row[0]) if row else 0)
        except psycopg.errors.DeadlockDetected:
            if attempt == REPAIR_ATTEMPTS:
                raise
            log.info("the bookkeeping rebuild was a deadlock's victim; trying again")
    raise AssertionError("unreachable: the last attempt returns or raises")


__all__ = ["RepairFailed", "RepairReport", "Violation", "repair", "verify"]
