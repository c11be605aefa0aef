"""Rate limits shared by every worker process and host (docs/design.md, "Rates").

A :class:`RateLimit` allows ``limit`` units per ``per`` (a language model's 500 requests
a minute, a third-party API's 20 calls a second), optionally per key (the model name, the
job's owner). Its state is one row of ``rate_buckets`` per (limit, key), spent by the
schema's ``rate_take`` function under that row's lock, so every process on every host
draws from one bucket.

The bucket is a generic cell rate algorithm (a token bucket kept as one instant): a unit
refills every ``per / limit`` (the *emission interval*, rounded up to the microsecond),
the bucket holds at most ``burst`` units, and a take of ``n`` units succeeds once the
bucket holds ``n``. With the default ``burst=1`` takes are evenly spaced, so any interval
of length ``per`` sees at most ``limit`` units taken; ``burst=b`` lets ``b`` units go at
once after a quiet spell, and an interval of ``per`` then sees at most
``limit + b - 1``. Units spent after the fact (``after=True``) are always granted and
may drive the bucket below zero; later takers wait until it has refilled. A backoff
(the provider answered 429 with a Retry-After) empties the bucket until then.

A take that would have to wait is a *reservation* when the wait is at most
``max_wait``: the units are the taker's at the instant returned, and no later taker can
have them; the caller waits until then. Otherwise it is refused with
:class:`RateLimited`, which says when the units will be there; the runner defers the job
to that moment (no attempt burned). "Now" is the database's clock plus the queue's
``clock_offset``, read after the bucket's lock is held.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from . import statements as sql
from .checks import (
    positive_int,
    require_duration,
    require_duration_or_seconds,
    require_text,
    seconds_text,
)
from .errors import ConfigError, InvalidInput, RotaError

if TYPE_CHECKING:
    from .job import Job
    from .queue import AnyConn, Queue

#: The key of an unkeyed limit's bucket.
NO_KEY = ""
#: How long, by default, a taker waits for units reserved for it (``RateLimit.max_wait``).
DEFAULT_MAX_WAIT = timedelta(seconds=1)

KeyFunction = Callable[["Job"], "str | None"]


class RateLimitUnreachable(ConfigError):
    """A take that can never be granted as the limit is configured: the job's own units
    of the limit, taken earlier in the same attempt (its stage's, or the handler's),
    keep the bucket below what it asks for until after ``max_wait``, so every attempt
    would spend them again and be deferred, forever (docs/design.md, "Rates"). Raised
    by ``ctx.take`` instead of :class:`RateLimited`: the job fails (retried with backoff,
    then failed), rather than spending the shared budget on deferrals.

    Attributes:
        limit: the limit's name.
        stage: the stage's job type.
    """

    def __init__(self, message: str, limit: str, stage: str) -> None:
        super().__init__(message)
        self.limit = limit
        self.stage = stage


class RateLimited(RotaError):
    """A rate limit has no units for this take within its wait; nothing was taken.

    Raised by :meth:`RateLimit.take` and ``ctx.take``; a handler lets it propagate and
    the runner defers the job to ``free_at`` (no attempt burned; docs/design.md,
    "Rates").

    Attributes:
        limit: the limit's name.
        key: the bucket's key (``""`` for an unkeyed limit).
        units: the units asked for.
        free_at: aware UTC instant (the queue's clock) when the units will be there, if
            nobody else takes them first.
    """

    def __init__(self, limit: str, key: str, units: int, free_at: datetime) -> None:
        who = f" for {key!r}" if key else ""
        super().__init__(f"rate limit {limit!r}{who} has no {units} unit(s) before "
                         f"{free_at.isoformat()}")
        self.limit = limit
        self.key = key
        self.units = units
        self.free_at = free_at


@dataclass(frozen=True)
class Grant:
    """Units taken: ``at`` (aware UTC, the queue's clock) is when they are the taker's,
    ``wait`` how long after the take that is (zero when they were there)."""

    at: datetime
    wait: timedelta


@dataclass(frozen=True)
class RateLimit:
    """A rate limit enforced across every worker through PostgreSQL (docs/design.md,
    "Rates").

    Args:
        name: unique name; the key of its bucket rows (``"openai-requests"``).
        limit: units allowed per ``per``, an int > 0.
        per: the period, a positive ``timedelta`` (``timedelta(minutes=1)``).
        key: ``None`` for one bucket shared by all, or a function of the
            :class:`rota.Job` giving its bucket's key (the model name, the owner);
            returning ``None`` means the limit does not apply to that job.
        burst: units a full bucket can give at once, an int in ``1..limit`` (default 1:
            evenly spaced takes, so no interval of ``per`` sees more than ``limit``).
            A take of more units than ``burst`` can only be spent after the fact.
        max_wait: the longest a taker waits for units reserved for it (default 1 s); a
            take whose units are further away is refused (:class:`RateLimited`) and the
            job deferred. Zero: never wait.

    Raises:
        InvalidInput: a bad name, limit, period, burst, key or wait.
    """

    name: str
    limit: int
    per: timedelta
    key: KeyFunction | None = None
    burst: int = 1
    max_wait: timedelta = DEFAULT_MAX_WAIT

    def __post_init__(self) -> None:
        require_text(self.name, "rate limit name")
        positive_int(self.limit, f"rate limit {self.name!r}: limit")
        require_duration(self.per, f"rate limit {self.name!r}: per")
        positive_int(self.burst, f"rate limit {self.name!r}: burst")
        if self.burst > self.limit:
            raise InvalidInput(f"rate limit {self.name!r}: burst {self.burst} must be at "
                               f"most limit {self.limit}")
        if self.key is not None and not callable(self.key):
            raise InvalidInput(f"rate limit {self.name!r}: key must be a function of the "
                               f"job or None, got {self.key!r}")
        require_duration(self.max_wait, f"rate limit {self.name!r}: max_wait",
                         positive=False)
        if self.max_wait < timedelta(0):
            raise InvalidInput(f"rate limit {self.name!r}: max_wait must not be negative, "
                               f"got {seconds_text(self.max_wait)}")
        if self.per < self.limit * timedelta(microseconds=1):
            raise InvalidInput(f"rate limit {self.name!r}: {self.limit} per "
                               f"{seconds_text(self.per)} is more than one unit a "
                               f"microsecond")

    @property
    def emission(self) -> timedelta:
        """The emission interval: one unit refills every ``per / limit``, rounded up to
        the microsecond (rounding down would allow more than ``limit`` per ``per``)."""
        us = self.per // timedelta(microseconds=1)
        return timedelta(microseconds=math.ceil(us / self.limit))

    def key_for(self, job: Job) -> str | None:
        """The bucket key ``job`` spends from: ``""`` for an unkeyed limit, the key
        function's answer otherwise (``None``: the limit does not apply to the job).

        Raises:
            InvalidInput: the key function returned something that is not a name.
        """
        if self.key is None:
            return NO_KEY
        value = self.key(job)
        return require_text(value, f"rate limit {self.name!r}: key", allow_none=True)

    def _params(self, queue: Queue, key: str) -> dict[str, Any]:
        return {"name": self.name, "key": key, "limit": self.limit, "per": self.per,
                "burst": self.burst, "emission": self.emission,
                "offset": queue.clock_offset}

    async def take(self, queue: Queue, units: int = 1, *, key: str = NO_KEY,
                   after: bool = False, max_wait: timedelta | None = None,
                   conn: AnyConn | None = None) -> Grant:
        """Take ``units`` from the bucket ``key``, atomically in the database; committed
        at once on the queue's own connection (units spent on a call stay spent).

        Args:
            queue: whose database and clock to use.
            units: int > 0 (at most ``burst`` unless ``after``).
            key: the bucket (``""`` for an unkeyed limit; see :meth:`key_for`).
            after: spend units already used (a model's tokens, known once it answered):
                always granted now, and the bucket may go below zero; later takers wait
                until it refills.
            max_wait: the longest wait for reserved units (default ``self.max_wait``), a
                ``timedelta`` from zero to 1000 years.
            conn: a connection to run on (autocommit expected: the bucket's row stays
                locked until its transaction ends).

        Returns:
            The :class:`Grant`: wait ``grant.wait`` before using the units.

        Raises:
            RateLimited: the units are not there within ``max_wait`` (nothing taken).
            InvalidInput: bad units, key or ``max_wait``, or more units than ``burst``
                before the fact.
        """
        positive_int(units, f"rate limit {self.name!r}: units")
        if key != NO_KEY:
            require_text(key, "rate limit key")
        if not after and units > self.burst:
            raise InvalidInput(
                f"rate limit {self.name!r}: {units} units can never be there at once "
                f"(burst {self.burst}); raise burst or spend them after=True")
        wait = None if after else (self.max_wait if max_wait is None else max_wait)
        if wait is not None:
            require_duration(wait, "max_wait", positive=False)
            if wait < timedelta(0):  # as RateLimit(max_wait=) refuses it
                raise InvalidInput(f"rate limit {self.name!r}: max_wait must not be "
                                   f"negative, got {seconds_text(wait)}")
        async with queue.connection(conn) as c:
            granted, at, wait_s = await sql.rate_take(
                queue.store, **self._params(queue, key), units=units, max_wait=wait,
                conn=c)
        at = at.astimezone(UTC)
        if not granted:
            raise RateLimited(self.name, key, units, at)
        return Grant(at, timedelta(seconds=max(float(wait_s), 0.0)))

    async def backoff(self, queue: Queue, wait: timedelta | float, *,
                      key: str = NO_KEY) -> datetime:
        """Hold every taker of bucket ``key`` off for ``wait`` (a 429's Retry-After):
        no unit is granted before then, and the bucket refills at its rate from there.
        A backoff never shortens one already in force.

        Args:
            wait: a positive ``timedelta``, or seconds (a Retry-After header's number),
                at most 1000 years.

        Returns:
            The aware UTC instant (queue clock) the backoff ends.

        Raises:
            InvalidInput: ``wait`` is not a positive duration.
        """
        wait = require_duration_or_seconds(wait, "backoff")
        if key != NO_KEY:
            require_text(key, "rate limit key")
        async with queue.connection() as c:
            until = await sql.rate_backoff(queue.store, **self._params(queue, key),
                                           wait=wait, conn=c)
        return until.astimezone(UTC)

    async def peek(self, queue: Queue, key: str = NO_KEY) -> Peek:
        """The bucket without taking from it (see :class:`Peek`)."""
        async with queue.connection() as c:
            at, tat = await sql.rate_peek(queue.store, name=self.name, key=key,
                                          offset=queue.clock_offset, conn=c)
        now = at.astimezone(UTC)
        base = now if tat is None else max(tat.astimezone(UTC), now)
        return Peek(now, base - (self.burst - 1) * self.emission, base, self)


@dataclass(frozen=True)
class Peek:
    """A bucket seen at ``now`` (aware UTC, the queue's clock): ``free_at`` is when one
    unit is there (at or before ``now``: now), ``full_at`` when it is full again."""

    now: datetime
    free_at: datetime
    full_at: datetime
    limit: RateLimit

    def reservable(self, within: timedelta) -> int:
        """How many one-unit takes, one after another, would be granted at or before
        ``now + within`` if nobody else took any (0: none)."""
        room = self.now + within - self.free_at
        if room < timedelta(0):
            return 0
        return room // self.limit.emission + 1


@dataclass(frozen=True)
class RateState:
    """A bucket as ``rota limits`` and the dashboard show it.

    Attributes:
        name, key: the limit and bucket (``key`` ``""``: unkeyed).
        limit, per_s, burst: its settings as last taken with.
        now: the queue's clock when read (aware UTC).
        window_start: start of the current fixed window of ``per`` (epoch-aligned).
        window_units: units taken in the current window.
        prev_units: units taken in the window before it.
        available: units a take could have now (negative: owed by after-the-fact
            spends or a backoff).
        next_free: when the next unit is there (``now`` when one is).
        taken, refused: units ever taken, takes ever refused.
        backoff_until: the last backoff's end, if any.
        waiting: jobs deferred for its units and not due yet.
        next_wake: the earliest of their due times.
    """

    name: str
    key: str
    limit: int
    per_s: float
    burst: int
    now: datetime
    window_start: datetime | None
    window_units: int
    prev_units: int
    available: float
    next_free: datetime
    taken: int
    refused: int
    backoff_until: datetime | None
    waiting: int
    next_wake: datetime | None

    def as_json(self) -> dict[str, Any]:
        """The state as JSON-ready values (instants as ISO 8601 strings)."""
        def iso(v: datetime | None) -> str | None:
            return None if v is None else v.isoformat()
        return {"name": self.name, "key": self.key, "limit": self.limit,
                "per_seconds": self.per_s, "burst": self.burst, "now": iso(self.now),
                "window_start": iso(self.window_start),
                "window_units": self.window_units, "prev_units": self.prev_units,
                "available": round(self.available, 3), "next_free": iso(self.next_free),
                "taken": self.taken, "refused": self.refused,
                "backoff_until": iso(self.backoff_until), "waiting": self.waiting,
                "next_wake": iso(self.next_wake)}


async def note_rate_waits(queue: Queue, ids: list[int], refused: RateLimited) -> None:
    """Note jobs deferred for ``refused``'s units (``rate_waits``: the dashboard's
    waiting jobs, one row per job, its latest wait), committed at once.

    Args:
        queue: whose database and clock to use.
        ids: the deferred jobs' ids.
        refused: the refusal that deferred them (its limit, key and ``free_at``).
    """
    async with queue.connection() as conn:
        await sql.rate_wait_note(queue.store, ids=ids, name=refused.limit, key=refused.key,
                                 until=refused.free_at, offset=queue.clock_offset,
                                 conn=conn)


async def rate_states(queue: Queue, name: str | None = None, *, limit: int = 1000,
                      conn: AnyConn | None = None) -> list[RateState]:
    """Every bucket (or those of limit ``name``) read from the database, with no need of
    the application's :class:`RateLimit` objects: each bucket keeps the settings it was
    last taken with.

    Args:
        name: only this limit's buckets.
        limit: at most this many buckets (by name, then key).

    Raises:
        InvalidInput: a bad name or limit.
    """
    if name is not None:
        require_text(name, "rate limit name")
    positive_int(limit, "limit")
    async with queue.connection(conn) as c:
        rows = await sql.rate_list(queue.store, name=name, limit=limit,
                                   offset=queue.clock_offset, conn=c)
    out = []
    for r in rows:
        now = r["now"].astimezone(UTC)
        emission = timedelta(seconds=r["emission_s"])
        tat = now if r["tat"] is None else r["tat"].astimezone(UTC)
        base = max(tat, now)
        available = r["burst"] - (base - now) / emission
        next_free = max(base - (r["burst"] - 1) * emission, now)
        ws = r["window_start"]
        out.append(RateState(
            r["name"], r["key"], int(r["limit_units"]), float(r["per_s"]), int(r["burst"]),
            now, None if ws is None else ws.astimezone(UTC),
            int(r["window_units"]), int(r["prev_units"]), available, next_free,
            int(r["taken"]), int(r["refused"]),
            None if r["backoff_until"] is None else r["backoff_until"].astimezone(UTC),
            int(r["waiting"]),
            None if r["next_wake"] is None else r["next_wake"].astimezone(UTC)))
    return out

def check_stage_limits(stage_type: str, limits: object) -> tuple[RateLimit, ...]:
    """A stage's ``rate_limits`` as a tuple: one :class:`RateLimit` or a sequence of
    them, with distinct names.

    Raises:
        InvalidInput: anything else.
    """
    if isinstance(limits, RateLimit):
        return (limits,)
    if isinstance(limits, str | bytes) or not isinstance(limits, Iterable):
        raise InvalidInput(f"stage {stage_type!r}: rate_limits must be a rota.RateLimit "
                           f"or a sequence of them, got {limits!r}")
    out = tuple(limits)
    for lim in out:
        if not isinstance(lim, RateLimit):
            raise InvalidInput(f"stage {stage_type!r}: rate_limits must be rota.RateLimit, "
                               f"got {lim!r}")
    if len({lim.name for lim in out}) != len(out):
        raise InvalidInput(f"stage {stage_type!r}: two rate limits share a name")
    return out


__all__ = ["DEFAULT_MAX_WAIT", "NO_KEY", "Grant", "Peek", "RateLimit", "RateLimited",
           "RateState", "check_stage_limits", "note_rate_waits", "rate_states"]
