"""The job row, the deferral signal, and the checks every value passes before it is
written (payloads, times, names)."""

from __future__ import annotations

import json
import math
import operator
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from .errors import InvalidInput, NaiveDatetimeError, PayloadError

JobStatus = Literal["pending", "running", "done", "failed"]
FailOutcome = Literal["retry", "failed", "lost"]

DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024

# Due times rota stores must load back in any session time zone (UTC-12 to UTC+14), so
# they keep a day clear of the ends of Python's datetime range.
EARLIEST_DUE = datetime(1, 1, 2, tzinfo=UTC)
LATEST_DUE = datetime(9999, 12, 30, tzinfo=UTC)


@dataclass(frozen=True)
class Job:
    """One row of ``jobs`` as it was when read (claim, enqueue, sweep).

    Times are timezone-aware UTC instants on the queue's clock (database ``now()`` plus
    the queue's ``clock_offset``). ``claim_token`` identifies the claim that handed the
    job out; complete/fail/defer are fenced by it, so a run that lost the job (its lock
    went stale and another run reclaimed it) cannot change it.
    """

    id: int
    type: str
    group_id: str | None
    payload: Any
    dedupe_key: str | None
    status: JobStatus
    attempts: int
    max_attempts: int
    deferrals: int
    run_after: datetime
    locked_at: datetime | None
    claim_token: uuid.UUID | None
    last_error: str | None
    run_id: uuid.UUID | None
    created_at: datetime
    finished_at: datetime | None
    give_up_pending: bool

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Job:
        """A job from a row of ``jobs`` (a mapping with at least every field's column)."""
        return cls(**{name: row[name] for name in _JOB_FIELDS})

    @classmethod
    def row_maker(cls, columns: Sequence[str]) -> Callable[[Sequence[Any]], Job]:
        """A fast maker of jobs from tuple rows whose columns are named ``columns`` (a
        cursor's description); the columns must include every field of Job.

        Raises:
            KeyError: a field's column is missing.
        """
        where = {name: i for i, name in enumerate(columns)}
        picks = operator.itemgetter(*(where[name] for name in _JOB_FIELDS))
        return lambda row: cls(*picks(row))


_JOB_FIELDS = tuple(f.name for f in fields(Job))


class DeferJob(Exception):
    """Raised by a handler when its work cannot happen *now* (DESIGN: deferral).

    The job goes back to pending with ``run_after = until`` (``None``: due at once) and
    the claim's attempt is handed back, so a deferral never counts as a failure.

    Args:
        until: timezone-aware instant when the job is due again, or ``None``.

    Raises:
        NaiveDatetimeError: ``until`` has no time zone.
        InvalidInput: ``until`` is outside the years 1-9999 (see :func:`require_due_time`).
    """

    def __init__(self, until: datetime | None = None, reason: str = "deferred") -> None:
        super().__init__(reason)
        self.until = require_due_time(until, "until") if until is not None else None
        self.reason = reason


def require_aware(value: datetime, name: str) -> datetime:
    """Return ``value`` if it is a timezone-aware datetime.

    Raises:
        NaiveDatetimeError: naive datetime (rota never guesses a time zone).
        InvalidInput: not a datetime at all.
    """
    if not isinstance(value, datetime):
        raise InvalidInput(f"{name} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
        raise NaiveDatetimeError(
            f"{name}={value.isoformat()} has no time zone; pass an aware datetime "
            f"(for example datetime.now(timezone.utc))"
        )
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
            f"{EARLIEST_DUE.date()} and {LATEST_DUE.date()} (UTC)")
    return value


def require_duration(value: timedelta, name: str, *, positive: bool = True) -> timedelta:
    """Return ``value`` if it is a ``timedelta`` (strictly positive when ``positive``)."""
    if not isinstance(value, timedelta):
        raise InvalidInput(f"{name} must be a datetime.timedelta, got {type(value).__name__}")
    if positive and value <= timedelta(0):
        raise InvalidInput(f"{name} must be positive, got {value}")
    return value


MAX_NAME_LENGTH = 512  # characters; keeps every key well inside a btree index row


def require_text(value: object, name: str, *, allow_none: bool = False) -> str | None:
    """Validate a short text value (job type, dedupe key, group id): non-empty, at most
    ``MAX_NAME_LENGTH`` characters, no NUL.

    Raises:
        InvalidInput: what was wrong with it.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, uuid.UUID):
        return str(value)
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"{name} must be a non-empty string, got {value!r}")
    if "\x00" in value:
        raise InvalidInput(f"{name} {value!r} contains a NUL character")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidInput(f"{name} is {len(value)} characters long; at most "
                           f"{MAX_NAME_LENGTH} are allowed")
    return value


def _check_strings(value: Any, path: str) -> None:
    if isinstance(value, str):
        if "\x00" in value:
            raise PayloadError(f"payload{path} contains a NUL character (\\u0000), "
                               f"which PostgreSQL jsonb cannot store")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise PayloadError(f"payload{path} contains a lone surrogate") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise PayloadError(
                    f"payload{path} has the {type(k).__name__} key {k!r}; JSON object keys "
                    f"are strings (JSON would turn it into {str(k)!r} silently)")
            _check_strings(k, f"{path} key")
            _check_strings(v, f"{path}[{k!r}]")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _check_strings(v, f"{path}[{i}]")
    elif isinstance(value, float) and not math.isfinite(value):
        raise PayloadError(f"payload{path} is {value}, which JSON cannot represent")


# One encoder for every payload: json.dumps with options builds a new one per call.
_ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"))


def encode_payload(payload: Any, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> str:
    """Serialize a payload to JSON text for the ``jsonb`` column.

    Payloads are plain JSON: dicts with string keys, lists (tuples are stored as lists),
    strings, finite numbers (ints of any size), booleans and None. Everything else is
    refused with :class:`~rota.errors.PayloadError` rather than silently converted:

    - ``Decimal`` and ``datetime``/``date`` values (and sets, bytes, UUIDs, other
      objects): encode them yourself, for example ``str(amount)`` for a Decimal (exact;
      a float would round it) and ``when.isoformat()`` for an aware datetime, and decode
      them in the handler;
    - dict keys that are not strings (JSON would turn ``1`` into ``"1"``);
    - NaN and Infinity (not JSON), NUL characters (jsonb cannot store ``\u0000``) and
      lone surrogates (not UTF-8), in values and in keys;
    - payloads larger than ``max_bytes``, counted in UTF-8 bytes of the JSON text.

    Numbers are stored as jsonb decimals, exactly as JSON prints them: a float written
    with an exponent comes back as that decimal, so ``1e20`` is read back as the int
    ``100000000000000000000`` (equal in value).

    Returns:
        The JSON text.

    Raises:
        PayloadError: not JSON-serializable, NaN/Infinity, NUL or lone surrogate, or
            larger than ``max_bytes`` UTF-8 bytes.
    """
    try:
        _check_strings(payload, "")
    except RecursionError:
        raise PayloadError("payload is nested too deeply (or contains itself)") from None
    try:
        text = _ENCODER.encode(payload)
    except RecursionError:
        raise PayloadError("payload is nested too deeply (or contains itself)") from None
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"payload is not JSON-serializable: {exc}") from None
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise PayloadError(f"payload is {size} bytes, larger than the maximum {max_bytes}")
    return text


def storable_text(text: str) -> str:
    """Make error text storable in a ``text`` column: NUL characters become ``\\0`` and
    lone surrogates are replaced."""
    return text.replace("\x00", "\\0").encode("utf-8", "replace").decode("utf-8")
