"""Checks every value passes before rota writes it or acts on it: times, durations,
short names, integers and error text. One definition each, used by the queue, the
runner, the settings and the CLI (docs/design.md, "Bad input"). Each error's message
begins with the ``name`` given, which it carries as its ``argument``
(:class:`rota.InvalidInput`)."""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .errors import InvalidInput, NaiveDatetimeError
from .redact import redact

# Due times rota stores must load back in any session time zone (UTC-12 to UTC+14), so
# they keep a day clear of the ends of Python's datetime range.
EARLIEST_DUE = datetime(1, 1, 2, tzinfo=UTC)
LATEST_DUE = datetime(9999, 12, 30, tzinfo=UTC)

# The ceiling of the integer columns (attempts, max_attempts, deferrals) and of sane
# claim sizes: a larger value is refused up front instead of failing in the database.
INT_MAX = 2**31 - 1

# The longest duration rota accepts (settings, the clock offset, budgets): now plus or
# minus it stays inside PostgreSQL's and Python's calendars (years 1026-3026 today), so
# no computed time leaves their range (docs/design.md, "Time").
MAX_DURATION = timedelta(days=365_250)

def require_aware(value: datetime, name: str) -> datetime:
    """Return ``value`` if it is a timezone-aware datetime.

    Raises:
        NaiveDatetimeError: naive datetime (rota never guesses a time zone).
        InvalidInput: not a datetime at all.
    """
    if not isinstance(value, datetime):
        raise InvalidInput(f"{name} must be a datetime, got {type(value).__name__}",
                           argument=name)
    if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
        raise NaiveDatetimeError(
            f"{name}={value.isoformat()} has no time zone; pass an aware datetime "
            f"(for example datetime.now(timezone.utc))", argument=name)
    return value


def require_due_time(value: datetime, name: str) -> datetime:
    """Return ``value`` if it is an aware datetime rota can store as a due time
    (``run_after``, a deferral's ``until``): between ``EARLIEST_DUE`` and ``LATEST_DUE``
    (a day inside the years 1-9999). Nearer the ends, PostgreSQL would store it but
    could not hand it back to a session in a time zone that pushes it past the range.

    Raises:
        NaiveDatetimeError: naive datetime.
        InvalidInput: not a datetime, or out of range.
    """
    require_aware(value, name)
    if not EARLIEST_DUE <= value <= LATEST_DUE:
        raise InvalidInput(
            f"{name}={value.isoformat()} is out of range: due times must lie between "
            f"{EARLIEST_DUE.date()} and {LATEST_DUE.date()} (UTC)", argument=name)
    return value


#: :data:`MAX_DURATION` in seconds, as errors say it.
MAX_DURATION_SECONDS = int(MAX_DURATION.total_seconds())


def seconds_text(value: timedelta) -> str:
    """A duration as every error message says it: in seconds, exactly (``-5 seconds``,
    ``0.25 seconds``, ``1 second``), not ``str(timedelta)``, which writes five seconds
    less than nothing as ``-1 day, 23:59:55``."""
    micros = value // timedelta(microseconds=1)
    whole, fraction = divmod(abs(micros), 1_000_000)
    text = ("-" if micros < 0 else "") + str(whole)
    if fraction:
        text += f".{fraction:06d}".rstrip("0")
    return f"{text} second{'' if abs(micros) == 1_000_000 else 's'}"


def require_duration(value: timedelta, name: str, *, positive: bool = True) -> timedelta:
    """Return ``value`` if it is a ``timedelta`` (strictly positive when ``positive``)
    no longer than :data:`MAX_DURATION` either way. A refused duration is said in
    seconds (:func:`seconds_text`): ``stale_after must be positive, got -5 seconds``.

    Raises:
        InvalidInput: not a timedelta, not positive when it must be, or too long.
    """
    if not isinstance(value, timedelta):
        raise InvalidInput(f"{name} must be a datetime.timedelta, got "
                           f"{shown(value)}", argument=name)
    if positive and value <= timedelta(0):
        raise InvalidInput(f"{name} must be positive, got {seconds_text(value)}",
                           argument=name)
    if abs(value) > MAX_DURATION:
        raise InvalidInput(f"{name} must be at most {MAX_DURATION_SECONDS} seconds (1000 "
                           f"years) either way, got {seconds_text(value)}", argument=name)
    return value


def require_duration_or_seconds(value: object, name: str) -> timedelta:
    """Return ``value`` as a positive ``timedelta`` no longer than :data:`MAX_DURATION`:
    a ``timedelta``, or a number of seconds (an HTTP Retry-After header's), checked
    against the bound before it is converted, since ``timedelta(seconds=1e15)`` raises
    ``OverflowError`` rather than saying what was wrong.

    Raises:
        InvalidInput: not a timedelta or a finite positive number, or too long.
    """
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value) or value <= 0:
            raise InvalidInput(f"{name} must be a positive number of seconds, got {value!r}",
                               argument=name)
        if value > MAX_DURATION_SECONDS:
            raise InvalidInput(f"{name} must be at most {MAX_DURATION_SECONDS} seconds (1000 "
                               f"years) either way, got {value!r} seconds", argument=name)
        value = timedelta(seconds=value)
    return require_duration(value, name)  # type: ignore[arg-type]


# UTF-8 bytes, not characters: a job type and a group id share index rows
# (jobs_pending_idx, the claim's bookkeeping), whose btree entries hold at most about
# 2,700 bytes; 512 four-byte characters each overflowed them (ProgramLimitExceeded).
MAX_NAME_BYTES = 512


def require_text(value: object, name: str, *, allow_none: bool = False) -> str | None:
    """Validate a short text value (job type, dedupe key, group id, owner id, counter
    and quota names): a non-empty ``str`` (or a UUID, as text) of at most
    :data:`MAX_NAME_BYTES` UTF-8 bytes, with no NUL and no lone surrogate (neither can
    be stored in a ``text`` column) (docs/design.md, "Bad input").

    Returns:
        The text, or ``None`` when ``value`` is ``None`` and ``allow_none``.

    Raises:
        InvalidInput: what was wrong with it.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, uuid.UUID):
        return str(value)
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"{name} must be a non-empty string, got {value!r}", argument=name)
    if "\x00" in value:
        raise InvalidInput(f"{name} {value!r} contains a NUL character", argument=name)
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidInput(f"{name} {value!r} contains a lone surrogate, which is not "
                           f"UTF-8 text", argument=name) from None
    if size > MAX_NAME_BYTES:
        raise InvalidInput(f"{name} is {size} bytes long in UTF-8 ({len(value)} "
                           f"characters); at most {MAX_NAME_BYTES} bytes are allowed",
                           argument=name)
    return value




def require_zone(value: object, name: str) -> ZoneInfo:
    """Return the IANA time zone named ``value`` (``"Europe/Paris"``).

    Raises:
        InvalidInput: not a non-empty string, or no such zone in the tz database.
    """
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"{name} must be a time zone name, got {value!r}", argument=name)
    try:
        return ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInput(f"{name}: unknown time zone {value!r} (use an IANA name such as "
                           f"'Europe/Paris' or 'UTC')", argument=name) from None


def sendable_text(value: object, name: str, *, allow_none: bool = False) -> str | None:
    """Check what only Python can see about a text argument of enqueue before it goes to
    the database: that it is a string (a UUID is turned into one) without NUL characters
    or lone surrogates, which PostgreSQL text cannot hold. Whether it is empty or too
    long is the database's rule, checked once for every caller (docs/design.md,
    "Enqueue").

    Raises:
        InvalidInput: not a string, or it holds a NUL character or a lone surrogate.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, uuid.UUID):
        return str(value)
    if not isinstance(value, str):
        raise InvalidInput(f"{name} must be a non-empty string, got {value!r}", argument=name)
    if "\x00" in value:
        raise InvalidInput(f"{name} {value!r} contains a NUL character", argument=name)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"{name} {value!r} contains a lone surrogate, which is not "
                           f"UTF-8 text", argument=name) from None
    return value


def sendable_int(value: object, name: str) -> int:
    """Check that an integer argument of enqueue is an int (not a bool) that fits the
    database's integer; whether it is at least 1 is the database's rule (docs/design.md,
    "Enqueue").

    Raises:
        InvalidInput: not an int, or outside the 32-bit range.
    """
    if not isinstance(value, int) or isinstance(value, bool) or value < -INT_MAX - 1:
        raise InvalidInput(f"{name} must be an int >= 1, got {value!r}", argument=name)
    if value > INT_MAX:
        raise InvalidInput(f"{name} must be at most {INT_MAX}, got {value!r}", argument=name)
    return value


def storable_text(text: str, limit: int | None = None) -> str:
    """Make error text storable in a ``text`` column (``jobs.last_error``,
    ``runs.error``): connection-string passwords become ``***`` (docs/operations.md,
    "Secrets"), NUL characters ``\\0``, and lone surrogates are replaced.

    Args:
        text: the text.
        limit: at most this many characters are kept, counted after escaping (a NUL
            takes two), the last one ``…`` when the text was cut; the text is cut to
            twice the limit before it is scanned, so a long one costs no more than a
            short one (docs/design.md, "Results").
    """
    if limit is not None:
        text = cut_text(text, 2 * limit)
    text = (redact(text).replace("\x00", "\\0")
            .encode("utf-8", "replace").decode("utf-8"))
    return text if limit is None else cut_text(text, limit)


def cut_text(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters, else its first ``limit - 1`` and
    ``…``."""
    if len(text) <= limit:
        return text
    return text[:limit - 1] + "…"


def shown(value: object, limit: int = 80) -> str:
    """A value as an error says what it got: its ``repr``, cut to ``limit`` characters
    (:func:`cut_text`)."""
    return cut_text(repr(value), limit)


def positive_int(value: object, name: str, minimum: int = 1) -> int:
    """Return ``value`` if it is an int (not a bool) in ``minimum..INT_MAX``.

    Raises:
        InvalidInput: not an int, or out of that range (the message names ``name``).
    """
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidInput(f"{name} must be an int >= {minimum}, got {value!r}", argument=name)
    if value > INT_MAX:
        raise InvalidInput(f"{name} must be at most {INT_MAX}, got {value!r}", argument=name)
    return value


#: The largest row id (``jobs.id`` is a bigint).
MAX_ROW_ID = 2**63 - 1


def require_row_id(value: object, name: str = "job_id") -> int:
    """Return ``value`` if it is an int (not a bool) in ``1..MAX_ROW_ID``: a job id every
    entry point checks before sending it, so a bad one is a one-line
    :class:`InvalidInput` instead of the database's type or range error (which would
    also abort the caller's transaction) (docs/design.md, "Bad input").

    Raises:
        InvalidInput: not an int, or out of that range (the message names ``name``).
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ROW_ID:
        raise InvalidInput(f"{name} must be an int between 1 and {MAX_ROW_ID}, "
                           f"got {value!r}", argument=name)
    return value


def positive_seconds(value: object, name: str, *, zero: bool = False) -> float:
    """Return ``value`` as float seconds if it is a finite number > 0 (or >= 0 with
    ``zero``; not a bool), at most :data:`MAX_DURATION` (a larger interval would in
    effect turn off what it paces).

    Raises:
        InvalidInput: not a number, not finite, not positive (negative with ``zero``),
            or over 1000 years.
    """
    if (not isinstance(value, int | float) or isinstance(value, bool)
            or not math.isfinite(value) or value < 0 or (value == 0 and not zero)):
        kind = "a number of seconds, 0 or more" if zero else "a positive number of seconds"
        raise InvalidInput(f"{name} must be {kind}, got {value!r}", argument=name)
    if value > MAX_DURATION_SECONDS:
        raise InvalidInput(f"{name} must be at most {MAX_DURATION_SECONDS} "
                           f"seconds (1000 years), got {value!r}", argument=name)
    return float(value)
