"""The job row, the deferral signal and the payload encoding (docs/design.md, "Jobs")."""

from __future__ import annotations

import json
import math
import operator
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, Literal

from .checks import require_due_time
from .errors import PayloadError

JobStatus = Literal["pending", "running", "done", "failed"]
FailOutcome = Literal["retry", "failed", "lost"]

DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024

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
    """Raised by a handler when its work cannot happen *now* (docs/design.md, "Defer").

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


def encode_payload(payload: Any) -> str:
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
      lone surrogates (not UTF-8), in values and in keys.

    The queue's limits on what JSON it stores (``max_payload_bytes``, how deeply it may
    nest) are rules of the database's ``enqueue_jobs``, which every caller goes through
    (docs/design.md, "Enqueue").

    Numbers are stored as jsonb decimals, exactly as JSON prints them: a float written
    with an exponent comes back as that decimal, so ``1e20`` is read back as the int
    ``100000000000000000000`` (equal in value).

    Returns:
        The JSON text.

    Raises:
        PayloadError: not JSON-serializable (or nested past Python's recursion limit),
            NaN/Infinity, NUL or lone surrogate.
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
    return text
