"""Periodic schedules (docs/design.md, "Schedules").

A :class:`Schedule` names a cron expression in a time zone and the job each of its ticks
enqueues. A pipeline's schedules (``Pipeline(queue, stages, schedules=[...])``) are held
by a :class:`Scheduler`, which the run loop asks at the start of every run to enqueue
the ticks that are due, and the worker asks how long it may sleep before the next one.

Each tick is enqueued once across every worker on every host. The ``schedules`` table
keeps one row per schedule with the last tick taken; a tick is taken in one transaction
that locks that row, reads its ``last_tick`` as last committed, moves it to the tick and
enqueues the tick's job (dedupe key ``schedule:NAME:TICK``, the tick in UTC ISO 8601).
A worker asking for the same tick meanwhile waits on the lock, then finds it taken. The
dedupe index alone would not do: it covers open jobs only, so a late worker would
enqueue again a tick whose job had already finished.

Time is the queue's clock (database ``now()`` plus ``queue.clock_offset``); cron
expressions are parsed and iterated by cronsim, with Debian cron's rules for the
daylight-saving changes of the schedule's own zone.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import KW_ONLY, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, get_args
from zoneinfo import ZoneInfo

from cronsim import CronSim, CronSimError

from . import statements as sql
from .checks import positive_int, require_aware, require_duration, require_text, require_zone
from .errors import ConfigError, InvalidInput, PayloadError
from .job import Job, encode_payload
from .queue import Queue

#: What a run does with ticks that passed while no worker ran (see :class:`Schedule`).
Missed = Literal["latest", "all", "skip"]
MISSED_POLICIES: tuple[str, ...] = get_args(Missed)

#: ``missed="all"``: at most this many missed ticks are enqueued by default, the latest.
DEFAULT_MAX_CATCH_UP = 100
#: The largest ``max_catch_up`` accepted (one transaction enqueues them all).
MAX_CATCH_UP = 1000
#: ``missed="skip"``: a tick taken later than this after its instant is dropped.
DEFAULT_GRACE = timedelta(minutes=5)
#: Every scheduled job's dedupe key starts with this, then ``NAME:TICK``.
KEY_PREFIX = "schedule:"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_ALIASES = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# How far back, shortest first, the latest ticks before now are looked for: a frequent
# schedule finds them in the first window and a rare one reads a few ticks of a longer
# one, so a cursor months old never means iterating every minute since.
_LOOKBACK = (timedelta(hours=1), timedelta(days=1), timedelta(days=32),
             timedelta(days=366), timedelta(days=3660))


@dataclass(frozen=True)
class Schedule:
    """A periodic job: each tick of ``cron`` in zone ``tz`` enqueues one job of ``type``
    with ``payload`` (docs/design.md, "Schedules").

    Declare schedules on the pipeline, ``Pipeline(queue, stages, schedules=[...])``, so
    every way of running it (``rota run``, ``rota worker``, ``/api/cron``) enqueues them.
    A tick's job has ``dedupe_key`` ``schedule:NAME:TICK`` (:func:`scheduled_tick` reads
    the tick back) and ``run_after`` the tick.

    Args:
        name: unique per queue schema (the ``schedules`` table's key): 1-100 letters,
            digits, ``_``, ``-`` or ``.``, starting with a letter or digit. Renaming a
            schedule starts it afresh.
        cron: five fields, ``minute hour day-of-month month day-of-week`` (ranges,
            lists, steps, names, ``L``, ``LW``, ``#``), or ``@hourly``, ``@daily``
            (``@midnight``), ``@weekly``, ``@monthly``, ``@yearly`` (``@annually``).
            Day-of-month and day-of-week combine as Debian cron does (OR when neither
            starts with ``*``).
        type: the job type each tick enqueues; one of the pipeline's stages must run it.
        payload: the job's JSON payload (default ``{}``), the same for every tick.
        tz: the IANA zone the expression is read in (default ``"UTC"``). Across a
            daylight-saving change, a schedule with a fixed minute and hour runs once
            per day: a local time the spring change skips runs at the end of the gap
            (02:30 runs at 03:00), a local time the autumn change repeats runs at its
            first occurrence only. A schedule with ``*`` (or a step) in the minute or
            hour field follows elapsed time instead: hourly runs every real hour.
        missed: what a run does with ticks that passed while nothing ran:
            ``"latest"`` (default) enqueues only the latest of them; ``"all"`` enqueues
            each, oldest first, at most the latest ``max_catch_up``; ``"skip"``
            enqueues a tick only when it is taken at most ``grace`` after its instant
            and drops the older ones.
        max_catch_up: ``missed="all"`` only: 1..1000, default 100.
        grace: ``missed="skip"`` only: a positive ``timedelta``, default 5 minutes. Keep
            it above the time between runs (a worker's wake-up is prompt; a cron
            endpoint called every 10 minutes needs more than 10).

    A new schedule owes no tick from before it is first seen by a run (its row's
    ``created_at``).

    Raises:
        InvalidInput: a bad name, cron expression (not five fields, a field out of
            range, never fires), type, payload (:class:`rota.PayloadError`), unknown
            time zone, unknown policy, or an option of another policy.
    """

    name: str
    _: KW_ONLY
    cron: str
    type: str
    payload: Any = field(default_factory=dict)
    tz: str = "UTC"
    missed: Missed = "latest"
    max_catch_up: int | None = None
    grace: timedelta | None = None
    _zone: ZoneInfo = field(init=False, repr=False, compare=False)
    _expr: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise InvalidInput(
                f"schedule name {self.name!r} must be 1-100 letters, digits, '_', '-' or "
                f"'.', starting with a letter or digit")
        where = f"schedule {self.name!r}"
        require_text(self.type, f"{where}: type")
        object.__setattr__(self, "_zone", require_zone(self.tz, f"{where}: tz"))
        object.__setattr__(self, "_expr", _expression(self.cron, where))
        if self.missed not in MISSED_POLICIES:
            raise InvalidInput(f"{where}: missed must be one of "
                               f"{', '.join(map(repr, MISSED_POLICIES))}, got {self.missed!r}")
        if self.max_catch_up is not None and self.missed != "all":
            raise InvalidInput(f"{where}: max_catch_up applies to missed='all' only")
        if self.grace is not None and self.missed != "skip":
            raise InvalidInput(f"{where}: grace applies to missed='skip' only")
        if self.missed == "all":
            n = positive_int(DEFAULT_MAX_CATCH_UP if self.max_catch_up is None
                             else self.max_catch_up, f"{where}: max_catch_up")
            if n > MAX_CATCH_UP:
                raise InvalidInput(f"{where}: max_catch_up must be at most {MAX_CATCH_UP}, "
                                   f"got {n}")
            object.__setattr__(self, "max_catch_up", n)
        if self.missed == "skip":
            object.__setattr__(self, "grace", require_duration(
                DEFAULT_GRACE if self.grace is None else self.grace, f"{where}: grace"))
        try:
            encode_payload(self.payload)
        except InvalidInput as exc:
            raise type(exc)(f"{where}: {exc}") from None

    @property
    def zone(self) -> ZoneInfo:
        """The zone the expression is read in."""
        return self._zone

    def ticks(self, after: datetime, upto: datetime | None = None) -> Iterator[datetime]:
        """The schedule's ticks ``t`` with ``after < t <= upto`` (no end when ``upto`` is
        ``None``), ascending, as aware UTC datetimes (DST as the class describes).

        Raises:
            NaiveDatetimeError: ``after`` or ``upto`` has no time zone.
        """
        start = require_aware(after, "after")
        if upto is not None:
            require_aware(upto, "upto")
        it = CronSim(self._expr, start.astimezone(self._zone))
        last = start
        while True:
            try:
                tick = next(it).astimezone(UTC)
            except StopIteration:  # cronsim found no tick within 50 years
                return
            if tick <= last:
                # Started inside an autumn change's repeated hour, cronsim (which reads a
                # fixed-time schedule in local wall time) can name that hour's first
                # pass, already behind us.
                continue
            if upto is not None and tick > upto:
                return
            last = tick
            yield tick

    def next_tick(self, after: datetime) -> datetime | None:
        """The first tick strictly after ``after`` (aware UTC), or ``None`` if none comes
        within 50 years."""
        return next(self.ticks(after), None)

    def recent_ticks(self, after: datetime, upto: datetime, limit: int) -> list[datetime]:
        """The latest ``limit`` ticks ``t`` with ``after < t <= upto``, ascending."""
        for span in (*_LOOKBACK, None):
            start = after if span is None else max(after, upto - span)
            found = deque(self.ticks(start, upto), maxlen=limit)
            if len(found) == limit or start == after:
                return list(found)
        raise AssertionError("unreachable: the last window starts at after")

    def due(self, after: datetime, now: datetime) -> tuple[list[datetime], datetime | None]:
        """What taking this schedule's ticks at ``now`` means, under its ``missed``
        policy, when the last tick taken was ``after``.

        Returns:
            ``(ticks, cursor)``: the ticks to enqueue (ascending, possibly none) and the
            new last tick; ``([], None)`` when no tick lies in ``(after, now]``.
        """
        first = self.next_tick(after)
        if first is None or first > now:
            return [], None
        limit = self.max_catch_up if self.missed == "all" else 1
        assert limit is not None
        ticks = self.recent_ticks(after, now, limit)
        cursor = ticks[-1]
        if self.missed == "skip":
            assert self.grace is not None
            if now - cursor > self.grace:
                return [], cursor
        return ticks, cursor

    def dedupe_key(self, tick: datetime) -> str:
        """``schedule:NAME:TICK``, the tick in UTC ISO 8601
        (``schedule:nightly-digest:2025-03-30T01:00:00+00:00``)."""
        return f"{KEY_PREFIX}{self.name}:{require_aware(tick, 'tick').astimezone(UTC).isoformat()}"


def scheduled_tick(job: Job) -> datetime | None:
    """The tick a scheduled job was enqueued for (aware UTC), read from its dedupe key;
    ``None`` for a job no schedule enqueued. Unlike ``run_after``, it survives retries
    and deferrals: a nightly digest can ask which night it is for."""
    key = job.dedupe_key
    if not key or not key.startswith(KEY_PREFIX):
        return None
    _, sep, iso = key[len(KEY_PREFIX):].partition(":")
    try:
        tick = datetime.fromisoformat(iso) if sep else None
    except ValueError:
        return None
    return tick if tick is not None and tick.tzinfo is not None else None


@dataclass(frozen=True)
class ScheduleStatus:
    """One line of ``rota schedules``.

    Attributes:
        name: the schedule's name.
        schedule: the app's :class:`Schedule`, or ``None`` for a row left in the table by
            a schedule the app no longer declares.
        last_tick: the last tick taken (enqueued, or dropped by ``missed="skip"``), or
            ``None``.
        next_tick: the first tick after now (queue clock), or ``None``.
        due: a tick after ``last_tick`` (or after ``created_at``) has come and not been
            taken: the next run takes it under the schedule's ``missed`` policy.
        created_at: when a run first saw the schedule, or ``None`` (none has yet).
    """

    name: str
    schedule: Schedule | None
    last_tick: datetime | None
    next_tick: datetime | None
    due: bool
    created_at: datetime | None


class Scheduler:
    """A pipeline's schedules on its queue: enqueues due ticks and says when the next
    one is (docs/design.md, "Schedules"). The pipeline builds it; it has the shape of
    the maintenance services (``name``, ``run_once`` returning counters).

    Args:
        queue: the :class:`rota.Queue`.
        schedules: :class:`Schedule` objects with distinct names.

    Raises:
        InvalidInput: an item is not a :class:`Schedule`, a type the queue refuses
            (:class:`rota.UnknownJobType`), a payload over the queue's
            ``max_payload_bytes``.
        ConfigError: two schedules share a name.
    """

    name = "schedules"

    def __init__(self, queue: Queue, schedules: Iterable[Schedule] = ()) -> None:
        if not isinstance(queue, Queue):
            raise InvalidInput("Scheduler needs a rota.Queue")
        if isinstance(schedules, Schedule | str | bytes):
            raise InvalidInput("schedules must be a list of rota.Schedule")
        self.queue = queue
        self.schedules = tuple(schedules)
        self._by_name: dict[str, Schedule] = {}
        for s in self.schedules:
            if not isinstance(s, Schedule):
                raise InvalidInput(f"schedules must be rota.Schedule objects, got {s!r}")
            if self._by_name.setdefault(s.name, s) is not s:
                raise ConfigError(f"two schedules are named {s.name!r}")
            queue.check_type(s.type)
            try:
                size = len(encode_payload(s.payload).encode("utf-8"))
            except InvalidInput as exc:
                raise type(exc)(f"schedule {s.name!r}: {exc}") from None
            if size > queue.max_payload_bytes:  # the exact limit is enqueue's, at each tick
                raise PayloadError(f"schedule {s.name!r}: payload is about {size} bytes, "
                                   f"larger than the maximum {queue.max_payload_bytes}")

    async def run_once(self) -> dict[str, int]:
        """Take every due tick: one statement when none is due (the pipeline calls this
        at the start of each run).

        A schedule seen for the first time gets its row and owes ticks from now on. A
        schedule with ticks in ``(last tick, now]`` is taken in its own transaction:
        lock its row, recompute from the cursor as committed (another worker may have
        just taken them), move the cursor, enqueue the policy's ticks. A failure rolls
        the transaction back, cursor included, so the next run tries again.

        Returns:
            ``{"enqueued": jobs created, "skipped": schedules whose missed ticks were
            dropped (missed="skip")}``.
        """
        counters = {"enqueued": 0, "skipped": 0}
        now, state = await self._state()
        for schedule, after in state:
            if after is None or schedule.due(after, now)[1] is None:
                continue  # first seen just now, or nothing due: no lock taken
            enqueued, skipped = await self._take(schedule, now)
            counters["enqueued"] += enqueued
            counters["skipped"] += skipped
        return counters

    async def due_in(self) -> float | None:
        """Seconds from now (queue clock) to the earliest tick not yet taken: zero or
        less when one is due now; ``None`` without schedules (or ticks). The worker caps
        its idle sleep with it."""
        if not self.schedules:
            return None
        now, state = await self._state()
        ticks = [t for s, after in state if (t := s.next_tick(now if after is None
                                                                else after)) is not None]
        return min(ticks).timestamp() - now.timestamp() if ticks else None

    async def status(self) -> list[ScheduleStatus]:
        """The app's schedules (in declaration order), then rows of schedules it no
        longer declares (by name), with last and next ticks (``rota schedules``)."""
        q = self.queue
        async with q.connection() as c:
            rows = await sql.list_schedules(q.store, conn=c)
        now = await q.now()
        seen = {name: (last, created) for name, last, created, _ in rows}
        out = []
        for s in self.schedules:
            last, created = seen.pop(s.name, (None, None))
            first = None if created is None else s.next_tick(_cursor(last, created))
            out.append(ScheduleStatus(s.name, s, last, s.next_tick(now),
                                      first is not None and first <= now, created))
        out += [ScheduleStatus(name, None, last, None, False, created)
                for name, (last, created) in sorted(seen.items())]
        return out

    async def _state(self) -> tuple[datetime, list[tuple[Schedule, datetime | None]]]:
        """The queue's clock and each schedule's cursor (``None`` for one registered by
        this call: no tick is owed yet)."""
        q = self.queue
        async with q.connection() as c:
            rows = await sql.schedules_state(q.store, names=list(self._by_name),
                                             offset=q.clock_offset, conn=c)
            missing = [name for name, _, created, _ in rows if created is None]
            if missing:
                await sql.schedule_register(q.store, names=missing, offset=q.clock_offset,
                                            conn=c)
        now: datetime = rows[0][3]
        return now, [(self._by_name[name], None if created is None else _cursor(last, created))
                     for name, last, created, _ in rows]

    async def _take(self, schedule: Schedule, now: datetime) -> tuple[int, int]:
        """Take ``schedule``'s due ticks in one transaction; returns (jobs created,
        1 if its missed ticks were dropped else 0). Nothing when another worker took
        them first."""
        q = self.queue
        async with q.connection() as c, c.transaction():
            row = await sql.schedule_lock(q.store, name=schedule.name, conn=c)
            if row is None:  # its row was deleted meanwhile: the next run registers it
                return 0, 0
            # Recomputed under the lock, from the cursor as last committed: a worker
            # that read the state before another took the tick finds nothing due here.
            ticks, cursor = schedule.due(_cursor(*row), now)
            if cursor is None:
                return 0, 0
            await sql.schedule_advance(q.store, name=schedule.name, tick=cursor,
                                       offset=q.clock_offset, conn=c)
            if not ticks:
                return 0, 1
            created = await q.enqueue_many([
                {"type": schedule.type, "payload": schedule.payload,
                 "dedupe_key": schedule.dedupe_key(t), "run_after": t} for t in ticks],
                conn=c)
        return created, 0


def _cursor(last_tick: datetime | None, created_at: datetime) -> datetime:
    """The instant after which ticks are owed: the last tick taken, or just before the
    schedule was first seen (a tick at that very instant is owed)."""
    return last_tick if last_tick is not None else created_at - timedelta(microseconds=1)


def _expression(cron: object, where: str) -> str:
    """The five-field expression ``cron`` stands for (aliases expanded), checked.

    Raises:
        InvalidInput: not five fields, a field cronsim refuses, or one that never fires.
    """
    if not isinstance(cron, str):
        raise InvalidInput(f"{where}: cron must be a string, got {type(cron).__name__}")
    expr = _ALIASES.get(cron.strip().lower(), cron.strip())
    if len(expr.split()) != 5:
        raise InvalidInput(
            f"{where}: cron {cron!r} must have five fields (minute hour day-of-month "
            f"month day-of-week) or be one of {', '.join(_ALIASES)}")
    try:
        next(CronSim(expr, datetime(2000, 1, 1, tzinfo=UTC)))
    except CronSimError as exc:
        raise InvalidInput(f"{where}: cron {cron!r} is not valid: {exc}") from None
    except StopIteration:
        raise InvalidInput(f"{where}: cron {cron!r} never fires") from None
    return expr


__all__ = ["DEFAULT_GRACE", "DEFAULT_MAX_CATCH_UP", "KEY_PREFIX", "MISSED_POLICIES",
           "Missed", "Schedule", "ScheduleStatus", "Scheduler", "scheduled_tick"]
