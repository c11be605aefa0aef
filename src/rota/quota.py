"""Quotas: rationed daily allowances of units (docs/design.md, "Quotas").

Two kinds share one mechanism, a usage row per (quota, scope, period) spent with one
atomic statement:

- :class:`Quota`: a shared allowance, such as the YouTube Data API's 10,000 units a day
  that reset at midnight Pacific time, with a reserve that a run will not spend into.
- :class:`Allowance`: a per-owner allowance whose daily limit comes from the owner's
  plan (``plan.limits["searches_per_day"]``), keyed by the owner of the job's group.

A period begins at local midnight in the quota's time zone and ends at the next local
midnight, so a period is 23 or 25 hours long on the days the clocks change. "Now" is
always the queue's clock (database ``now()`` plus ``queue.clock_offset``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from typing import TYPE_CHECKING, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from . import statements as sql
from .checks import require_aware, require_text
from .errors import ConfigError, InvalidInput, RotaError

if TYPE_CHECKING:
    from .queue import AnyConn, Queue

BlockReason = Literal["exhausted", "reserve"]

SHARED_SCOPE = ""  # the scope key of a shared quota's usage rows


class QuotaExhausted(RotaError):
    """Units of a quota cannot be spent before its next reset.

    Raised by :meth:`Quota.spend`, :meth:`Allowance.spend` and ``ctx.spend``; a handler
    may let it propagate: the runner then defers the job to ``resets_at`` (no attempt
    burned) and, for a shared quota, skips the stages that need it for the rest of the
    run.

    Attributes:
        quota: the quota's name.
        scope_key: ``""`` for a shared quota, the owner id for an allowance.
        resets_at: aware UTC instant of the next reset (next local midnight).
        reason: ``"exhausted"`` (the units are gone, or the provider said so) or
            ``"reserve"`` (what is left is the reserve a run does not spend into).
        remaining: units left in the period (including the reserve), when known.
    """

    def __init__(self, quota: str, scope_key: str, resets_at: datetime,
                 reason: BlockReason = "exhausted", remaining: int | None = None) -> None:
        who = f" for {scope_key!r}" if scope_key else ""
        left = f", {remaining} left" if remaining is not None else ""
        what = "down to its reserve" if reason == "reserve" else "exhausted"
        super().__init__(f"quota {quota!r}{who} is {what}{left}; "
                         f"resets at {resets_at.isoformat()}")
        self.quota = quota
        self.scope_key = scope_key
        self.resets_at = resets_at
        self.reason: BlockReason = reason
        self.remaining = remaining


@dataclass(frozen=True)
class Usage:
    """A quota's state in the current period.

    Attributes:
        used: units spent in the period.
        limit: the period's limit in units (``None``: unlimited).
        remaining: ``limit - used``, never below 0 (``None``: unlimited).
        period_start: aware UTC instant the period began (local midnight).
        resets_at: aware UTC instant it ends (the next local midnight).
    """

    used: int
    limit: int | None
    remaining: int | None
    period_start: datetime
    resets_at: datetime


class _Daily:
    """The period arithmetic shared by quotas and allowances (one place for the rule
    "resets at local midnight in the quota's time zone")."""

    name: str
    reset_tz: str

    def _check_name_tz(self) -> ZoneInfo:
        require_text(self.name, "quota name")
        if not isinstance(self.reset_tz, str) or not self.reset_tz:
            raise InvalidInput(f"reset_tz must be a time zone name, got {self.reset_tz!r}")
        try:
            return ZoneInfo(self.reset_tz)
        except (ZoneInfoNotFoundError, ValueError):
            raise InvalidInput(
                f"unknown time zone {self.reset_tz!r} (use an IANA name such as "
                f"'America/Los_Angeles')") from None

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.reset_tz)

    def period_start(self, now: datetime) -> datetime:
        """The instant the period containing ``now`` began: local midnight of ``now``'s
        date in ``reset_tz``, as an aware UTC datetime.

        Raises:
            NaiveDatetimeError: ``now`` has no time zone.
        """
        local = require_aware(now, "now").astimezone(self.zone)
        return _local_midnight(local.date(), self.zone)

    def next_reset(self, now: datetime) -> datetime:
        """The instant the period containing ``now`` ends: the next local midnight in
        ``reset_tz`` (DST-correct: 23 hours after the spring change's midnight, 25 after
        the autumn one's), as an aware UTC datetime.

        Raises:
            NaiveDatetimeError: ``now`` has no time zone.
        """
        return next_local_midnight(now, self.zone)

    async def _used(self, queue: Queue, scope_key: str, period_start: datetime,
                    conn: AnyConn | None = None) -> int:
        async with queue.connection(conn) as c:
            return await sql.quota_used(queue.store, quota=self.name, scope_key=scope_key,
                                        period_start=period_start, conn=c)

    async def _spend(self, queue: Queue, scope_key: str, units: int, limit: int,
                     full_limit: int) -> int:
        """Spend atomically against ``limit``; returns units left (of ``full_limit``)."""
        _check_units(units)
        async with queue.connection() as c:
            now = await _queue_now(queue, c)
            start = self.period_start(now)
            spent = await sql.quota_spend(
                queue.store, quota=self.name, scope_key=scope_key, period_start=start,
                units=units, limit=limit, offset=queue.clock_offset, conn=c)
            if spent is not None:
                return max(full_limit - spent, 0)
            used = await self._used(queue, scope_key, start, c)
        remaining = max(full_limit - used, 0)
        reason: BlockReason = "exhausted" if remaining < units else "reserve"
        raise QuotaExhausted(self.name, scope_key, self.next_reset(now), reason, remaining)

    async def _exhaust(self, queue: Queue, scope_key: str, limit: int) -> QuotaExhausted:
        async with queue.connection() as c:
            now = await _queue_now(queue, c)
            await sql.quota_exhaust(queue.store, quota=self.name, scope_key=scope_key,
                                    period_start=self.period_start(now), limit=limit,
                                    offset=queue.clock_offset, conn=c)
        return QuotaExhausted(self.name, scope_key, self.next_reset(now), "exhausted", 0)


@dataclass(frozen=True)
class Quota(_Daily):
    """A shared daily allowance of units (for example a third-party API's).

    Args:
        name: unique name; the key of its usage rows (``"youtube"``).
        daily_units: units available per period, > 0 (the YouTube Data API: 10,000).
        reserve: units a pipeline run will not spend into, >= 0 and < ``daily_units``:
            a stage needing this quota is skipped once spending its ``quota_cost``
            would leave less than this (docs/design.md, "Quotas").
        reset_tz: IANA time zone whose local midnight resets it
            (``"America/Los_Angeles"`` for the YouTube Data API).

    Raises:
        InvalidInput: bad name, units, reserve or unknown time zone.
    """

    name: str
    daily_units: int
    reserve: int = 0
    reset_tz: str = "UTC"

    def __post_init__(self) -> None:
        self._check_name_tz()
        _check_int(self.daily_units, "daily_units", 1)
        _check_int(self.reserve, "reserve", 0)
        if self.reserve >= self.daily_units:
            raise InvalidInput(
                f"quota {self.name!r}: reserve {self.reserve} must be less than "
                f"daily_units {self.daily_units}")

    async def usage(self, queue: Queue, *, conn: AnyConn | None = None) -> Usage:
        """This period's usage, on the queue's clock."""
        async with queue.connection(conn) as c:
            now = await _queue_now(queue, c)
            start = self.period_start(now)
            used = await self._used(queue, SHARED_SCOPE, start, c)
        return Usage(used, self.daily_units, max(self.daily_units - used, 0), start,
                     self.next_reset(now))

    def blocked(self, remaining: int, cost: int) -> BlockReason | None:
        """Why a stage costing ``cost`` units per job cannot proceed with ``remaining``
        units left: ``"exhausted"`` when even the reserve cannot pay for it,
        ``"reserve"`` when paying would dip into the reserve, else ``None``."""
        if remaining < cost:
            return "exhausted"
        if remaining - cost < self.reserve:
            return "reserve"
        return None

    async def spend(self, queue: Queue, units: int, *, use_reserve: bool = False) -> int:
        """Spend ``units`` of this period's allowance, atomically in the database (one
        INSERT … ON CONFLICT DO UPDATE … WHERE used + units <= limit; concurrent
        spenders never exceed the limit). Commits at once, on its own connection: units
        spent on a third-party call stay spent whatever the caller's transaction does.

        Args:
            queue: whose database and clock to use.
            units: int > 0.
            use_reserve: spend into the reserve too (for interactive work outside the
                runner; pipeline runs never do).

        Returns:
            Units left in the period afterwards (including the reserve).

        Raises:
            QuotaExhausted: not enough units left (nothing was spent).
            InvalidInput: ``units`` is not a positive int.
        """
        limit = self.daily_units if use_reserve else self.daily_units - self.reserve
        return await self._spend(queue, SHARED_SCOPE, units, limit, self.daily_units)

    async def exhaust(self, queue: Queue) -> QuotaExhausted:
        """Record the quota as used up until its reset (the provider answered "quota
        exceeded" even though our count had units left), and return the error to raise.
        """
        return await self._exhaust(queue, SHARED_SCOPE, self.daily_units)


@dataclass(frozen=True)
class Allowance(_Daily):
    """A per-owner daily allowance whose limit comes from the owner's plan.

    The job's group gives the owner (``owner_id``) and plan (``plan``) in the queue's
    groups relation; the daily limit is ``plan.limits[limit_key]`` (``None`` there means
    unlimited; a plan id the plans object does not know, or an owner with no plan, counts
    as the lowest plan). A job with no group, or whose group has no owner, spends
    nothing.

    Args:
        name: unique name; the key of its usage rows (``"searches"``).
        limit_key: the key in each plan's ``limits`` (``"searches_per_day"``).
        reset_tz: IANA time zone whose local midnight resets it.

    Raises:
        InvalidInput: bad name, key or unknown time zone.
    """

    name: str
    limit_key: str
    reset_tz: str = "UTC"

    def __post_init__(self) -> None:
        self._check_name_tz()
        require_text(self.limit_key, "limit_key")

    def limit_for(self, queue: Queue, plan_id: str | None) -> int | None:
        """The daily limit for an owner on ``plan_id`` (``None``: unlimited).

        Raises:
            ConfigError: the plan has no ``limit_key`` entry, or it is not an int >= 0.
        """
        plan = (queue.plans[plan_id] if plan_id is not None and plan_id in queue.plans
                else queue.plans.lowest)
        if self.limit_key not in plan.limits:
            raise ConfigError(
                f"allowance {self.name!r}: plan {plan.id!r} has no limit "
                f"{self.limit_key!r} (set it, or None for unlimited)")
        value = plan.limits[self.limit_key]
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"plan {plan.id!r}: limit {self.limit_key!r} must be an int "
                              f">= 0 or None, got {value!r}")
        return value

    async def owner(self, queue: Queue, group_id: str | None) -> tuple[str | None, int | None]:
        """The owner id and daily limit that apply to jobs of ``group_id``:
        ``(None, None)`` when there is no group or no owner."""
        if group_id is None:
            return None, None
        async with queue.connection() as c:
            row = await sql.group_owner(queue.store, group_id=group_id, conn=c)
        if row is None or row["owner_id"] is None:
            return None, None
        return str(row["owner_id"]), self.limit_for(queue, row["plan"])

    async def usage(self, queue: Queue, owner_id: str, plan_id: str | None) -> Usage:
        """This period's usage by ``owner_id`` on ``plan_id``, on the queue's clock."""
        owner = require_text(owner_id, "owner_id") or ""
        limit = self.limit_for(queue, plan_id)
        async with queue.connection() as c:
            now = await _queue_now(queue, c)
            start = self.period_start(now)
            used = await self._used(queue, owner, start, c)
        remaining = None if limit is None else max(limit - used, 0)
        return Usage(used, limit, remaining, start, self.next_reset(now))

    async def spend(self, queue: Queue, group_id: str | uuid.UUID | None,
                    units: int = 1) -> int | None:
        """Spend ``units`` of the allowance of the owner of ``group_id``, atomically.

        Returns:
            Units the owner has left in the period, or ``None`` when no limit applies
            (no group, no owner, or an unlimited plan; nothing is recorded then).

        Raises:
            QuotaExhausted: the owner's allowance is spent (``scope_key`` is the owner).
            ConfigError: the owner's plan has no ``limit_key``.
            InvalidInput: ``units`` is not a positive int.
        """
        _check_units(units)
        gid = require_text(group_id, "group_id", allow_none=True)
        owner, limit = await self.owner(queue, gid)
        if owner is None or limit is None:
            return None
        return await self._spend(queue, owner, units, limit, limit)

    async def exhaust(self, queue: Queue, group_id: str | uuid.UUID | None
                      ) -> QuotaExhausted | None:
        """Record the owner's allowance as used up until the reset; returns the error to
        raise, or ``None`` when no limit applies."""
        owner, limit = await self.owner(queue, require_text(group_id, "group_id",
                                                            allow_none=True))
        if owner is None or limit is None:
            return None
        return await self._exhaust(queue, owner, limit)


def next_local_midnight(now: datetime, zone: ZoneInfo) -> datetime:
    """The first local midnight in ``zone`` strictly after the instant ``now``, as an aware
    UTC datetime: the reset rule of every daily quota (DST-correct: the day before a
    change is 23 or 25 hours long).

    Raises:
        NaiveDatetimeError: ``now`` has no time zone.
    """
    local = require_aware(now, "now").astimezone(zone)
    return _local_midnight(local.date() + timedelta(days=1), zone)


def _local_midnight(day: Any, zone: ZoneInfo) -> datetime:
    # fold=0 picks the first of an ambiguous midnight; a skipped midnight (a zone whose
    # clocks jump at 00:00) resolves to the instant the day actually began.
    return datetime.combine(day, time(0), tzinfo=zone).astimezone(UTC)


async def _queue_now(queue: Queue, conn: AnyConn) -> datetime:
    return await sql.db_now(queue.store, offset=queue.clock_offset, conn=conn)


# Usage rows count units in a bigint.
_MAX_UNITS = 2**63 - 1


def _check_int(value: object, name: str, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidInput(f"{name} must be an int >= {minimum}, got {value!r}")
    if value > _MAX_UNITS:
        raise InvalidInput(f"{name} must be at most {_MAX_UNITS}, got {value!r}")


def _check_units(units: object) -> None:
    _check_int(units, "units", 1)


__all__ = ["Allowance", "BlockReason", "Quota", "QuotaExhausted", "Usage"]
