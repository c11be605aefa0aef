"""Queue settings and the checks that turn one job's fields into statement
parameters, shared by :class:`rota.Queue` and :class:`rota.SyncQueue` so both paths
apply the same rules (docs/design.md, "Enqueue" and "Settings")."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from . import db
from .checks import positive_int, require_due_time, require_duration, require_text
from .errors import InvalidInput, UnknownGroup, UnknownJobType
from .job import DEFAULT_MAX_PAYLOAD_BYTES, encode_payload
from .plans import DEFAULT_PLANS, Plans

# A pipeline's defaults (docs/design.md, "The runner"): the platform kills an
# invocation after DEFAULT_PLATFORM_TIMEOUT; a run stops claiming after its budget.
DEFAULT_PLATFORM_TIMEOUT = timedelta(seconds=300)
DEFAULT_TIME_BUDGET = timedelta(seconds=220)
# The failure backoff's ceiling (docs/design.md, "Fail and backoff"): River caps its
# retry backoff too; an hour keeps a job with many attempts retrying within the day.
DEFAULT_MAX_BACKOFF = timedelta(hours=1)


class QueueSettings:
    """Validated settings and input checks shared by :class:`rota.Queue` and
    :class:`rota.SyncQueue` (each holds one; neither inherits from it).

    Args:
        schema: PostgreSQL schema holding rota's tables (validated, quoted).
        plans: the plans object that ranks the claim.
        groups: the relation the claim reads groups from: ``None`` for rota's own
            ``SCHEMA.groups`` table, or a (schema-qualified) table or view name with
            columns ``group_id text``, ``plan text`` and ``active boolean``, so an
            application can keep plan and pause state in its own tables.
        types: declared job types; when given, any other type is refused.
        max_attempts: attempts before a job gives up (claims count, deferrals don't).
        max_attempts_by_type: per-type overrides of ``max_attempts``.
        stale_after: a running job's lock older than this is stale (docs/design.md, "Stale locks").
        served_window: how far back the fair order counts served work
            (docs/design.md, "The fair claim").
        backoff_base: failure backoff is ``backoff_base * 2**attempts`` (docs/design.md,
            "Fail and backoff").
        max_backoff: the longest failure backoff (default 1 hour): the doubling stops
            there, so a job with many attempts is retried hourly instead of in year
            10193. At least ``backoff_base``.
        max_deferrals: when set, a job deferred more often than this gives up.
        max_payload_bytes: largest payload accepted, in UTF-8 bytes of JSON.

    Raises:
        InvalidInput: a setting has the wrong type or range.
    """

    def __init__(
        self,
        *,
        schema: str = "rota",
        plans: Plans = DEFAULT_PLANS,
        groups: str | None = None,
        types: Iterable[str] | None = None,
        max_attempts: int = 3,
        max_attempts_by_type: Mapping[str, int] | None = None,
        stale_after: timedelta = timedelta(minutes=15),
        served_window: timedelta = timedelta(days=1),
        backoff_base: timedelta = timedelta(minutes=1),
        max_backoff: timedelta = DEFAULT_MAX_BACKOFF,
        max_deferrals: int | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        db.identifier(schema, "schema")
        if groups is not None:
            db.identifier(groups, "groups relation")
        self.schema = schema
        self.groups = groups
        self.external_groups = groups is not None
        if not isinstance(plans, Plans):
            raise InvalidInput("plans must be a rota.Plans")
        self.plans = plans
        self.types = frozenset(require_text(t, "job type") or "" for t in types) if types else None
        self.max_attempts = positive_int(max_attempts, "max_attempts")
        self.max_attempts_by_type = {
            self.check_type(t): positive_int(n, f"max_attempts for {t!r}")
            for t, n in (max_attempts_by_type or {}).items()
        }
        self.stale_after = require_duration(stale_after, "stale_after")
        self.served_window = require_duration(served_window, "served_window")
        self.backoff_base = require_duration(backoff_base, "backoff_base", positive=False)
        if self.backoff_base < timedelta(0):
            raise InvalidInput(f"backoff_base must not be negative, got {backoff_base}")
        self.max_backoff = require_duration(max_backoff, "max_backoff")
        if self.max_backoff < self.backoff_base:
            raise InvalidInput(f"max_backoff ({max_backoff}) must not be shorter than "
                               f"backoff_base ({backoff_base})")
        self.max_deferrals = (
            None if max_deferrals is None else positive_int(max_deferrals, "max_deferrals", 0)
        )
        self.max_payload_bytes = positive_int(max_payload_bytes, "max_payload_bytes")
        self.clock_offset = timedelta(0)

    @property
    def clock_offset(self) -> timedelta:
        """Added to the database's ``now()`` in every comparison and every timestamp the
        queue writes; tests and simulations move time forward with it. Datetimes passed
        in (``run_after``, ``until``) are absolute and are not shifted."""
        return self._clock_offset

    @clock_offset.setter
    def clock_offset(self, value: timedelta) -> None:
        self._clock_offset = require_duration(value, "clock_offset", positive=False)

    def check_type(self, job_type: object) -> str:
        """Return ``job_type`` if it is a valid job type for this queue.

        Raises:
            InvalidInput: not a short non-empty string.
            UnknownJobType: ``types`` was given and does not contain it.
        """
        t = require_text(job_type, "job type")
        assert t is not None
        if self.types is not None and t not in self.types:
            raise UnknownJobType(
                f"unknown job type {t!r}; declared types: {', '.join(sorted(self.types))}"
            )
        return t

    def enqueue_params(
        self,
        job_type: str,
        payload: Any,
        *,
        group_id: str | uuid.UUID | None = None,
        dedupe_key: str | None = None,
        run_after: datetime | None = None,
        max_attempts: int | None = None,
    ) -> dict[str, Any]:
        """Check one job's fields and return the statement parameters."""
        t = self.check_type(job_type)
        return {
            "type": t,
            "payload": encode_payload(payload, self.max_payload_bytes),
            "group_id": require_text(group_id, "group_id", allow_none=True),
            "dedupe_key": require_text(dedupe_key, "dedupe_key", allow_none=True),
            "run_after": None if run_after is None else require_due_time(run_after,
                                                                         "run_after"),
            "max_attempts": (
                positive_int(max_attempts, "max_attempts")
                if max_attempts is not None
                else self.max_attempts_by_type.get(t, self.max_attempts)
            ),
            "offset": self.clock_offset,
        }

    def enqueue_many_params(self, items: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
        """Check a batch and return the statement's parallel arrays (the same checks
        as :meth:`enqueue_params`, item by item).

        Raises:
            InvalidInput and subclasses: naming the first bad item (``item 3: ...``), or
                ``items`` that is not an iterable of mappings (a string, a mapping).
        """
        if isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
            raise InvalidInput(f"items must be an iterable of mappings (one per job), "
                               f"got {type(items).__name__}")
        types: list[str] = []
        payloads: list[str] = []
        group_ids: list[str | None] = []
        dedupe_keys: list[str | None] = []
        run_afters: list[datetime | None] = []
        max_attempts: list[int] = []
        allowed = _ITEM_KEYS
        max_bytes = self.max_payload_bytes
        known_types: dict[object, str] = {}  # a batch repeats a few types and groups
        known_groups: dict[object, str | None] = {None: None}
        for i, item in enumerate(items):
            if not isinstance(item, Mapping):
                raise InvalidInput(f"item {i}: expected a mapping, got {type(item).__name__}")
            if not allowed.issuperset(item) or "type" not in item or "payload" not in item:
                extra = set(item) - allowed
                raise InvalidInput(
                    f"item {i}: needs 'type' and 'payload', may have "
                    f"'group_id', 'dedupe_key', 'run_after', 'max_attempts'; "
                    f"unexpected {sorted(extra)}" if extra else
                    f"item {i}: needs 'type' and 'payload'"
                )
            try:
                raw_type = item["type"]
                t = known_types.get(raw_type) if isinstance(raw_type, str) else None
                if t is None:
                    t = known_types[raw_type] = self.check_type(raw_type)
                raw_group = item.get("group_id")
                if isinstance(raw_group, str) and raw_group in known_groups:
                    g = known_groups[raw_group]
                else:
                    g = require_text(raw_group, "group_id", allow_none=True)
                    if isinstance(raw_group, str):
                        known_groups[raw_group] = g
                payload = encode_payload(item["payload"], max_bytes)
                key = item.get("dedupe_key")
                if key is not None:
                    key = require_text(key, "dedupe_key")
                due = item.get("run_after")
                if due is not None:
                    due = require_due_time(due, "run_after")
                attempts = item.get("max_attempts")
                attempts = (positive_int(attempts, "max_attempts") if attempts is not None
                            else self.max_attempts_by_type.get(t, self.max_attempts))
            except InvalidInput as exc:
                raise type(exc)(f"item {i}: {exc}") from None
            types.append(t)
            payloads.append(payload)
            group_ids.append(g)
            dedupe_keys.append(key)
            run_afters.append(due)
            max_attempts.append(attempts)
        return {
            "types": types,
            "payloads": payloads,
            "group_ids": group_ids,
            "dedupe_keys": dedupe_keys,
            "run_afters": run_afters,
            "max_attempts": max_attempts,
            "offset": self.clock_offset,
        }


def unknown_groups(missing: Sequence[str]) -> UnknownGroup:
    """The error for enqueueing into groups the groups relation does not know."""
    shown = ", ".join(repr(g) for g in missing[:5])
    return UnknownGroup(
        f"unknown group{'s' if len(missing) > 1 else ''} {shown}"
        f"{' …' if len(missing) > 5 else ''}: "
        f"create it first (queue.upsert_group) or enqueue without a group"
    )


_ITEM_KEYS = frozenset({"type", "payload", "group_id", "dedupe_key", "run_after",
                        "max_attempts"})


