"""The YouTube Data API v3's rules that the client and the stand-in share: its
endpoints' quota costs, the daily quota and its day (midnight to midnight Pacific)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, date, datetime
from typing import Final
from zoneinfo import ZoneInfo

from rota import NaiveDatetimeError
from rota.quota import next_local_midnight

DEFAULT_BASE_URL: Final = "https://www.googleapis.com/youtube/v3"
#: Path prefix under which the stand-in answers; a client's base URL for a stand-in served at
#: ``http://127.0.0.1:PORT`` is ``http://127.0.0.1:PORT/youtube/v3``.
STAND_IN_PREFIX: Final = "/youtube/v3"
#: Quota units per call of each endpoint (YouTube Data API v3 rules).
UNIT_COST: Final[Mapping[str, int]] = {"search": 100, "channels": 1, "commentThreads": 1}
#: The YouTube Data API's quota day runs midnight to midnight in this zone.
PACIFIC: Final = ZoneInfo("America/Los_Angeles")
#: The default daily quota of a YouTube Data API project.
DAILY_UNITS: Final = 10_000
#: At most this many ids in one channels.list call.
MAX_IDS_PER_CALL: Final = 50


def utcnow() -> datetime:
    """The default clock of the client and the stand-in."""
    return datetime.now(UTC)


def require_aware(value: datetime, what: str) -> datetime:
    """``value``, or ``ValueError`` naming ``what`` when it is naive."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be an aware datetime, got naive {value!r}")
    return value


def quota_day(now: datetime, tz: ZoneInfo = PACIFIC) -> date:
    """The quota day (a calendar date in ``tz``) that the instant ``now`` falls in.

    ``now`` must be aware (``ValueError`` otherwise).
    """
    return require_aware(now, "now").astimezone(tz).date()


def next_reset(now: datetime, tz: ZoneInfo = PACIFIC) -> datetime:
    """The next quota reset strictly after ``now``: the next midnight in ``tz``.

    DST-correct (the instant is computed from the local calendar date, so the day before a
    DST change is 23 or 25 hours long). ``now`` must be aware (``ValueError`` otherwise).
    Returns an aware datetime in UTC, so arithmetic on it is plain elapsed time.
    """
    try:
        return next_local_midnight(now, tz)
    except NaiveDatetimeError as exc:
        raise ValueError(str(exc)) from None
