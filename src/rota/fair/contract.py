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
    """One broken invariant of the claim's bookkeeping, for one group or one owner's row.

    Attributes:
        type: the job type.
        group_id: the group; for ``owner_served`` and ``owner_floor``, which concern an
            owner's row rather than one group, the owner's unit and plan key as text
            (``g:g1 'p:pro'``).
        invariant: ``served``, ``row``, ``ready_lb``, ``head``, ``plan``, ``active``,
            ``fair_plans``, ``mark``, ``owner_id`` or ``floor`` (a group's bookkeeping),
            or ``owner_served``, ``owner_bound``, ``changes_mark`` or ``owner_floor``
            (an owner's) (``verify.sql`` states each).
        expected: the value the jobs say it should have, as text (timestamps in UTC).
        found: the value kept, as text.
        plan_key: for an owner's invariant, the plan key of the owner's row
            (``p:PLAN``, ``''`` for no plan; docs/fast-claim.md, "The owner level");
            ``None`` for a group's.
        unit: for an owner's invariant, the owner's unit (``o:OWNER``, ``g:GROUP`` for a
            group without an owner, ``-`` for the jobs without a group); ``None`` for a
            group's.
    """

    type: str
    group_id: str
    invariant: str
    expected: str
    found: str
    plan_key: str | None = None
    unit: str | None = None

    @property
    def group(self) -> str | None:
        """The group the violation concerns; ``None`` for ``owner_served`` and
        ``owner_floor``, which concern an owner's row (its ``group_id`` names the owner
        instead)."""
        return None if self.invariant in ("owner_served", "owner_floor") else self.group_id

    def __str__(self) -> str:
        """``type 't' group 'g1': served expected 2, found 7``; an owner's invariant
        names the owner's row, ``type 't' owner 'g:g1' plan 'p:pro': owner_served
        expected 7, found 2`` (and the group, when one is concerned)."""
        group = f" group {self.group!r}" if self.group is not None else ""
        owner = (f" owner {self.unit!r} plan {self.plan_key!r}"
                 if self.unit is not None else "")
        return (f"type {self.type!r}{group}{owner}: {self.invariant} "
                f"expected {self.expected}, found {self.found}")

    def as_dict(self) -> dict[str, str | None]:
        """The fields as a dict (``rota verify --json``): ``plan_key`` and ``unit`` are
        ``None`` for a group's invariant."""
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
