"""The job row, the deferral signal and the payload encoding (docs/design.md,
"Vocabulary" and "Bad data belongs to its job")."""

from __future__ import annotations

import json
import math
import operator
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Literal

from .checks import require_due_time, require_duration, seconds_text
from .errors import InvalidInput, PayloadError, UnreadableJob

JobStatus = Literal["pending", "running", "done", "failed"]
FailOutcome = Literal["retry", "failed", "lost"]

DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024

#: The deepest nesting of lists and objects a payload may have. Reading a payload back
#: (at the claim, in listings) recurses once per level inside whatever stack the reader
#: already has: 973 levels passed enqueue and failed every claim with RecursionError.
#: 256 leaves the decoder three quarters of Python's default recursion limit
#: (docs/design.md, "Bad data belongs to its job").
MAX_PAYLOAD_DEPTH = 256

#: Digits before the decimal point of a number Python reads back as an int (its
#: int-to-string conversion limit) and digits after it that PostgreSQL's numeric holds.
MAX_INT_DIGITS = 4300
MAX_FRACTION_DIGITS = 16383


@dataclass(frozen=True)
class Unreadable:
    """A stored value rota could not load into Python, in place of the value: a payload
    nested deeper than the JSON decoder goes or with a number too long to convert, a
    time outside Python's years 1-9999. Rows holding one are named, never skipped
    (:class:`rota.errors.UnreadableJob`).

    Attributes:
        error: what went wrong, one line (``RecursionError: ...``).
        stored: the start of the stored text (at most 80 characters).
    """

    error: str
    stored: str


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
    #: The W3C Trace Context of the span that enqueued the job (``{"traceparent": ...,
    #: "tracestate": ...}``), or ``None``; its handler's span continues that trace
    #: (:mod:`rota.tracing`).
    trace_context: Mapping[str, str] | None = None
    #: What the job counts in its group's and owner's served counts (docs/design.md,
    #: "Cost"): 1 while pending; while running, its type's expected cost; once done,
    #: what its handler charged (1 when nothing).
    cost: Decimal = Decimal(1)

    @classmethod
    def from_row(cls, row: Mapping[str, Any], *, lenient: bool = False) -> Job:
        """A job from a row of ``jobs`` (a mapping with at least every field's column).

        Args:
            row: the row, as read through :class:`rota.store.Store` (whose loaders put
                an :class:`Unreadable` where a value could not be loaded).
            lenient: keep :class:`Unreadable` values in the job instead of raising (for
                a row already written, such as a give-up hook's job, which must still
                run; the hook sees ``job.payload`` as an ``Unreadable``).

        Raises:
            UnreadableJob: a value could not be loaded (not with ``lenient``).
        """
        job = cls(**{name: row[name] for name in _JOB_FIELDS})
        if not lenient:
            _check_readable(job.id, [row[name] for name in _LOADED_FIELDS])
        return job

    @classmethod
    def row_maker(cls, columns: Sequence[str], *,
                  lenient: bool = False) -> Callable[[Sequence[Any]], Job]:
        """A fast maker of jobs from tuple rows whose columns are named ``columns`` (a
        cursor's description); the columns must include every field of Job. The maker
        raises :class:`~rota.errors.UnreadableJob` for a row holding an
        :class:`Unreadable` value, unless ``lenient`` (then see :attr:`problems`).

        Raises:
            KeyError: a field's column is missing.
        """
        where = {name: i for i, name in enumerate(columns)}
        picks = operator.itemgetter(*(where[name] for name in _JOB_FIELDS))
        if lenient:
            return lambda row: cls(*picks(row))
        loaded = operator.itemgetter(*(where[name] for name in _LOADED_FIELDS))
        id_at = where["id"]

        def make(row: Sequence[Any]) -> Job:
            _check_readable(row[id_at], loaded(row))
            return cls(*picks(row))

        return make

    @property
    def problems(self) -> dict[str, str]:
        """The fields that could not be loaded (a job made with ``lenient``), by name,
        with what went wrong; empty for a readable job."""
        return {name: v.error for name in _LOADED_FIELDS
                if type(v := getattr(self, name)) is Unreadable}


_JOB_FIELDS = tuple(f.name for f in fields(Job))
# The columns whose loading can fail (jsonb and timestamptz); the rest are ids, text,
# integers and booleans, which always load.
_LOADED_FIELDS = ("payload", "run_after", "locked_at", "created_at", "finished_at")


def _check_readable(job_id: int, values: Sequence[Any]) -> None:
    for v in values:
        if type(v) is Unreadable:
            raise UnreadableJob(job_id, {
                name: u.error for name, u in zip(_LOADED_FIELDS, values, strict=True)
                if type(u) is Unreadable})


class DeferJob(Exception):
    """Raised by a handler when its work cannot happen *now* (docs/design.md, "Defer";
    River's and Oban's *snooze*).

    The job goes back to pending, due at ``until``, and the claim's attempt is handed
    back, so a deferral never counts as a failure.

    Args:
        until: when the job is due again: a timezone-aware instant, a non-negative
            ``timedelta`` counted from the queue's clock at the deferral (``DeferJob(
            timedelta(seconds=30))``: in 30 s), or ``None``: at once.
        reason: a short text for logs (default ``"deferred"``).

    Raises:
        NaiveDatetimeError: ``until`` is a datetime with no time zone.
        InvalidInput: ``until`` is outside the years 1-9999 (see :func:`require_due_time`),
            a negative or over-long ``timedelta``, or of another type.
    """

    def __init__(self, until: datetime | timedelta | None = None,
                 reason: str = "deferred") -> None:
        super().__init__(reason)
        self.until = due_or_delay(until, "until")
        self.reason = reason


def due_or_delay(value: datetime | timedelta | None, name: str) -> datetime | timedelta | None:
    """Check a deferral's due time: an aware instant in range, a non-negative
    ``timedelta`` (from the queue's clock), or ``None``; returns it unchanged.

    Raises:
        NaiveDatetimeError, InvalidInput: as :class:`DeferJob` says.
    """
    if value is None:
        return None
    if isinstance(value, timedelta):
        if value < timedelta(0):
            raise InvalidInput(f"{name} must not be a negative timedelta, got "
                               f"{seconds_text(value)}")
        return require_duration(value, name, positive=False)
    if not isinstance(value, datetime):
        raise InvalidInput(f"{name} must be an aware datetime, a timedelta or None, "
                           f"got {type(value).__name__}")
    return require_due_time(value, name)


def too_deep() -> PayloadError:
    """The error for a payload nested deeper than :data:`MAX_PAYLOAD_DEPTH` (the CLI
    raises it too, for JSON text its parser could not even read)."""
    return PayloadError(f"payload is nested deeper than {MAX_PAYLOAD_DEPTH} levels "
                        f"(or contains itself), more than can be read back")


def _check_value(value: Any, path: str, depth: int) -> bool:
    """Refuse what JSON or jsonb cannot hold exactly; returns whether a Decimal is in it
    (encoded by :func:`_encode_exact`)."""
    if isinstance(value, str):
        if "\x00" in value:
            raise PayloadError(f"payload{path} contains a NUL character (\\u0000), "
                               f"which PostgreSQL jsonb cannot store")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise PayloadError(f"payload{path} contains a lone surrogate") from None
        return False
    if isinstance(value, dict | list | tuple):
        # The depth limit (MAX_PAYLOAD_DEPTH) is enqueue_jobs' rule, checked in the
        # database for every caller in one order with the others (docs/design.md,
        # "Enqueue"); here only Python's own recursion limit can stop the walk.
        exact = False
        if isinstance(value, dict):
            for k, v in value.items():
                if not isinstance(k, str):
                    raise PayloadError(
                        f"payload{path} has the {type(k).__name__} key {k!r}; JSON object "
                        f"keys are strings (JSON would turn it into {str(k)!r} silently)")
                _check_value(k, f"{path} key", depth + 1)
                exact |= _check_value(v, f"{path}[{k!r}]", depth + 1)
        else:
            for i, v in enumerate(value):
                exact |= _check_value(v, f"{path}[{i}]", depth + 1)
        return exact
    if isinstance(value, float) and not math.isfinite(value):
        raise PayloadError(f"payload{path} is {value}, which JSON cannot represent")
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise PayloadError(f"payload{path} is Decimal({str(value)!r}), which JSON "
                               f"cannot represent")
        exponent = value.as_tuple().exponent
        assert isinstance(exponent, int)
        if value and value.adjusted() >= MAX_INT_DIGITS:
            raise PayloadError(f"payload{path} is a Decimal with {value.adjusted() + 1} "
                               f"digits before the point; at most {MAX_INT_DIGITS} can be "
                               f"read back")
        if -exponent > MAX_FRACTION_DIGITS:
            raise PayloadError(f"payload{path} is a Decimal with {-exponent} digits after "
                               f"the point; PostgreSQL stores at most {MAX_FRACTION_DIGITS}")
        return True
    return False


# One encoder for every payload: json.dumps with options builds a new one per call.
_ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"))


def _plain(value: Any) -> bool:
    """Whether ``value`` is plain JSON that :func:`_check_value` would let through
    without a remark: exactly a str (no NUL, no lone surrogate), an int, a bool, None,
    a finite float, or a dict (str keys) or list or tuple of such values. It builds no
    path for an error message, so it costs a fraction of the walk that does; anything
    else (a Decimal, a subclass, a value to refuse) is left to that walk."""
    t = type(value)
    if t is str:
        return "\x00" not in value and (value.isascii() or _utf8(value))
    if t is dict:
        for k, v in value.items():
            if (type(k) is not str or "\x00" in k or not (k.isascii() or _utf8(k))
                    or not _plain(v)):
                return False
        return True
    if t is list or t is tuple:
        for v in value:
            if not _plain(v):
                return False
        return True
    if t is int or t is bool or value is None:
        return True
    if t is float:
        return math.isfinite(value)
    return False


def _utf8(text: str) -> bool:
    """Whether ``text`` is UTF-8 text (no lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _encode_exact(value: Any) -> str:
    """JSON text for a payload holding Decimals (checked by :func:`_check_value`), each
    written digit for digit (``str(Decimal)`` is a JSON number for a finite Decimal),
    which the C encoder cannot do."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{_ENCODER.encode(k)}:{_encode_exact(v)}"
                              for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_encode_exact(v) for v in value) + "]"
    return _ENCODER.encode(value)


def printed_size(value: Any) -> int:
    """UTF-8 bytes of ``value``'s JSON text as PostgreSQL's jsonb prints it: the size
    ``max_payload_bytes`` limits, for payloads (``enqueue_jobs`` counts
    ``octet_length(payload::text)``) and results alike (docs/design.md, "Enqueue").

    jsonb prints a space after each ``:`` and ``,``, and a number as ``numeric`` does:
    every digit, never an exponent (``1e300`` is 301 characters, not 6), with as many
    decimals as the number was written with (``1.50e1`` is ``15.0``) and no sign on zero.
    ``value`` is a payload :func:`encode_payload` accepts, nested at most
    :data:`MAX_PAYLOAD_DEPTH` deep.
    """
    if value is None or value is True:
        return 4
    if value is False:
        return 5
    if isinstance(value, str):
        return len(_ENCODER.encode(value).encode("utf-8"))
    if isinstance(value, int):
        return len(str(int(value)))
    if isinstance(value, float):
        return _numeric_size(Decimal(repr(float(value))))
    if isinstance(value, Decimal):
        return _numeric_size(value)
    if isinstance(value, dict):
        return 2 + max(len(value) - 1, 0) * 2 + sum(
            printed_size(k) + 2 + printed_size(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return 2 + max(len(value) - 1, 0) * 2 + sum(printed_size(v) for v in value)
    raise PayloadError(f"payload is not JSON-serializable: {type(value).__name__}")


def _numeric_size(number: Decimal) -> int:
    """Characters of ``number`` as PostgreSQL's ``numeric`` prints it."""
    sign, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)  # finite: checked by _check_value
    scale = max(-exponent, 0)
    zero = not any(digits)
    whole = 1 if zero else max(len(digits) + exponent, 1)
    return (sign and not zero) + whole + (scale + 1 if scale else 0)


def encode_payload(payload: Any) -> str:
    """Serialize a payload to JSON text for the ``jsonb`` column.

    Payloads are plain JSON: dicts with string keys, lists (tuples are stored as lists),
    strings, finite numbers, booleans and None. Numbers are stored exactly as given:
    ints of any size (up to Python's 4,300 digits), floats as Python prints them, and
    ``Decimal`` values digit for digit (``Decimal("12345678901234567.89")`` is stored
    as that number; the CLI reads JSON numbers as Decimals for this reason). Everything
    else is refused with :class:`~rota.errors.PayloadError` rather than silently
    converted:

    - ``datetime``/``date`` values (and sets, bytes, UUIDs, other objects): encode them
      yourself, for example ``when.isoformat()`` for an aware datetime, and decode them
      in the handler;
    - dict keys that are not strings (JSON would turn ``1`` into ``"1"``);
    - NaN and Infinity (float or Decimal: not JSON), NUL characters (jsonb cannot store
      ``\u0000``) and lone surrogates (not UTF-8), in values and in keys;
    - Decimals with more than 4,300 digits before the point or 16,383 after it.

    The queue's size limit (``max_payload_bytes``) and its depth limit
    (:data:`MAX_PAYLOAD_DEPTH` lists and objects: what enqueue accepts, the claim can
    read back) are rules of the database's ``enqueue_jobs``, which every caller goes
    through (docs/design.md, "Enqueue").

    Reading a payload back gives Python's JSON types: a stored decimal comes back as a
    float (``str(amount)`` in the payload keeps it exact end to end), and a float
    written with an exponent comes back as that decimal, so ``1e20`` is read back as
    the int ``100000000000000000000`` (equal in value).

    Returns:
        The JSON text.

    Raises:
        PayloadError: not JSON-serializable, NaN/Infinity, NUL or lone surrogate, or
            nested too deeply.
    """
    try:
        plain = _plain(payload)
    except RecursionError:
        plain = False  # the walk below says why
    if plain:
        exact = False
    else:
        try:
            exact = _check_value(payload, "", 0)
        except RecursionError:
            raise too_deep() from None
    try:
        text = _encode_exact(payload) if exact else _ENCODER.encode(payload)
    except RecursionError:
        raise too_deep() from None
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"payload is not JSON-serializable: {exc}") from None
    return text


async def no_give_up_hook(job: Job, conn: object) -> None:
    """The give-up hook of a job type that declares none (a pipeline registers it for
    each stage without ``on_give_up``): the give-up is recorded as handled instead of
    owed forever, and :func:`rota.admin.give_up_hook_state` reports it as ``none``."""
