"""Queue settings and the checks that turn one job's fields into statement
parameters, shared by :class:`rota.Queue` and :class:`rota.SyncQueue` so both paths
apply the same rules (docs/design.md, "Enqueue" and "Settings")."""

from __future__ import annotations

import copy
import difflib
import inspect
from collections import ChainMap
from collections.abc import Iterable, Mapping, MutableMapping
from datetime import timedelta
from typing import Any

from . import db
from .checks import (
    positive_int,
    require_duration,
    require_text,
    seconds_text,
    shown,
)
from .errors import InvalidInput, UnknownJobType, UnknownSetting
from .job import DEFAULT_MAX_PAYLOAD_BYTES
from .plans import DEFAULT_PLANS, Plans

# A pipeline's defaults (docs/design.md, "The runner"): the platform kills an
# invocation after DEFAULT_PLATFORM_TIMEOUT; a run stops claiming after its budget.
DEFAULT_PLATFORM_TIMEOUT = timedelta(seconds=300)
DEFAULT_TIME_BUDGET = timedelta(seconds=220)


_MICROSECOND = timedelta(microseconds=1)


def default_time_budget(platform_timeout: timedelta) -> timedelta:
    """The time budget of a run when none is given: the share of ``platform_timeout``
    that :data:`DEFAULT_TIME_BUDGET` is of :data:`DEFAULT_PLATFORM_TIMEOUT` (11/15:
    220 s of 300 s, 44 s of 60 s), so an app with a short platform timeout gets a budget
    it accepts and keeps the same share for finishing what is in flight
    (docs/design.md, "Handler deadlines").

    Args:
        platform_timeout: the pipeline's platform timeout, positive.

    Returns:
        The budget, rounded down to whole milliseconds.
    """
    # Whole microseconds (timedelta // timedelta), so 300 s gives exactly 220 s.
    exact = platform_timeout * (DEFAULT_TIME_BUDGET // _MICROSECOND) \
        // (DEFAULT_PLATFORM_TIMEOUT // _MICROSECOND)
    return timedelta(milliseconds=exact // timedelta(milliseconds=1))

# The failure backoff's ceiling (docs/design.md, "Fail and backoff"): River caps its
# retry backoff too; an hour keeps a job with many attempts retrying within the day.
DEFAULT_MAX_BACKOFF = timedelta(hours=1)


#: The fair claim's orders (docs/design.md, "The fair claim"): by group (the default) or
#: by owner, then group.
FAIR_BY = ("group", "owner")


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
        types: declared job types, an iterable of at least one name (not one ``str``);
            when given, any other type is refused; ``None``: any type.
        max_attempts: attempts before a job gives up (claims count, deferrals don't).
        max_attempts_by_type: per-type overrides of ``max_attempts``, a mapping of job
            type to a positive int.
        stale_after: a running job's lock older than this is stale (docs/design.md, "Stale locks").
        served_window: how far back the fair order counts served work
            (docs/design.md, "The fair claim").
        fair_by: what the fair claim compares after plan priority (docs/design.md,
            "The fair claim"): ``"group"`` (the default: the least-served group) or
            ``"owner"`` (the least-served owner, the sum over its groups, then the
            least-served group within it).
        backoff_base: failure backoff is ``backoff_base * 2**attempts`` (docs/design.md,
            "Fail and backoff").
        max_backoff: the longest failure backoff (default 1 hour): the doubling stops
            there, so a job with many attempts is retried hourly instead of in year
            10193. At least ``backoff_base``.
        max_deferrals: when set, a job deferred more often than this gives up.
        max_payload_bytes: largest payload accepted, in UTF-8 bytes of JSON.

    Raises:
        InvalidInput: a setting has the wrong type or range; the message names it and
            ends with what was given (``got …``; a duration in seconds).
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
        fair_by: str = "group",
        backoff_base: timedelta = timedelta(minutes=1),
        max_backoff: timedelta = DEFAULT_MAX_BACKOFF,
        max_deferrals: int | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        db.identifier(schema, "schema")
        # The groups relation as SQL text, quoted ("App"."groups"): the database's
        # enqueue rules cast it to regclass, which would fold an unquoted name to lower case.
        self._groups_sql = (None if groups is None else
                            db.identifier(groups, "groups relation", qualified=True)
                            .as_string(None))
        self.schema = schema
        self.groups = groups
        self.external_groups = groups is not None
        if not isinstance(plans, Plans):
            raise InvalidInput(f"plans must be a rota.Plans (Plans([Plan(...), ...])), got "
                               f"{shown(plans)}", argument="plans")
        self.plans = plans
        if types is not None and (isinstance(types, str | bytes)
                                  or not isinstance(types, Iterable)):
            # A str is iterable: types="send" would declare the types s, e, n and d.
            raise InvalidInput(f"types must be a list of job types (or None for any), got "
                               f"{shown(types)}", argument="types")
        declared = None if types is None else [require_text(t, "job type") or "" for t in types]
        if declared == []:
            # An empty list read as None: every type allowed, where it said none.
            raise InvalidInput("types must name at least one job type (or be None for "
                               "any), got []", argument="types")
        self.types = None if declared is None else frozenset(declared)
        self._sorted_types = sorted(self.types) if self.types is not None else None
        self.max_attempts = positive_int(max_attempts, "max_attempts")
        if max_attempts_by_type is not None and not isinstance(max_attempts_by_type, Mapping):
            raise InvalidInput(f"max_attempts_by_type must be a mapping of job type to "
                               f"attempts (or None), got "
                               f"{shown(max_attempts_by_type)}",
                               argument="max_attempts_by_type")
        self.max_attempts_by_type: MutableMapping[str, int] = {
            self.check_type(t): positive_int(n, f"max_attempts for {t!r}")
            for t, n in (max_attempts_by_type or {}).items()
        }
        self.stale_after = require_duration(stale_after, "stale_after")
        self.served_window = require_duration(served_window, "served_window")
        if fair_by not in FAIR_BY:
            raise InvalidInput(f"fair_by must be one of {', '.join(map(repr, FAIR_BY))}, "
                               f"got {fair_by!r}", argument="fair_by")
        self.fair_by: str = fair_by
        self.backoff_base = require_duration(backoff_base, "backoff_base", positive=False)
        if self.backoff_base < timedelta(0):
            raise InvalidInput(f"backoff_base must not be negative, got "
                               f"{seconds_text(backoff_base)}", argument="backoff_base")
        self.max_backoff = require_duration(max_backoff, "max_backoff")
        if self.max_backoff < self.backoff_base:
            raise InvalidInput(f"max_backoff ({seconds_text(max_backoff)}) must not be "
                               f"shorter than backoff_base ({seconds_text(backoff_base)})")
        self.max_deferrals = (
            None if max_deferrals is None else positive_int(max_deferrals, "max_deferrals", 0)
        )
        self.max_payload_bytes = positive_int(max_payload_bytes, "max_payload_bytes")
        self._clock = _Clock()

    @property
    def clock_offset(self) -> timedelta:
        """Added to the database's ``now()`` in every comparison and every timestamp the
        queue writes; tests and simulations move time forward with it. Datetimes passed
        in (``run_after``, ``until``) are absolute and are not shifted. Shared with the
        settings :meth:`with_max_attempts_by_type` derives: one clock per queue."""
        return self._clock.offset

    @clock_offset.setter
    def clock_offset(self, value: timedelta) -> None:
        self._clock.offset = require_duration(value, "clock_offset", positive=False)

    def with_max_attempts_by_type(self, overrides: Mapping[str, int]) -> QueueSettings:
        """These settings with per-type ``max_attempts`` laid over this object's
        (a pipeline's stages': docs/design.md, "The runner"); this object is unchanged.

        The result shares this object's clock (moving either moves both) and reads this
        object's ``max_attempts_by_type`` live, under ``overrides``; every other setting
        is the same value.

        Args:
            overrides: type -> attempts, already checked (:meth:`check_type`,
                positive ints).

        Returns:
            A new :class:`QueueSettings`.
        """
        derived = copy.copy(self)
        derived.max_attempts_by_type = ChainMap(dict(overrides), self.max_attempts_by_type)
        return derived

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

    @property
    def sorted_types(self) -> list[str] | None:
        """The declared job types, sorted (``None``: any type)."""
        return self._sorted_types

    @property
    def groups_sql(self) -> str | None:
        """The groups relation as quoted SQL text (``"App"."groups"``), or ``None`` for
        rota's own: the database's enqueue rules cast it to regclass."""
        return self._groups_sql


class _Clock:
    """The clock offset one queue's settings, and the settings derived from them,
    share."""

    __slots__ = ("offset",)

    def __init__(self) -> None:
        self.offset = timedelta(0)


#: The names of :class:`QueueSettings`' keyword arguments, in its signature's order.
SETTING_NAMES: tuple[str, ...] = tuple(inspect.signature(QueueSettings).parameters)


def queue_settings(caller: str, settings: Mapping[str, Any],
                   own: Iterable[str] = ()) -> QueueSettings:
    """The :class:`QueueSettings` of ``caller``'s keyword arguments, after checking
    that each is a setting.

    Args:
        caller: the class the keywords were given to (``"Queue"``), for the message.
        settings: the keyword arguments that are meant to be settings.
        own: the caller's keyword arguments that are not settings (``Queue``'s
            ``pooled``), offered with them when a name is misspelled.

    Returns:
        The settings, validated.

    Raises:
        UnknownSetting: keywords that are neither settings nor ``own``; the message
            names each (in alphabetical order, as its ``names``), the name closest to
            it, and every name (``Queue got an unknown setting 'fairby'
            (did you mean 'fair_by'?); its keyword arguments are ...``).
        InvalidInput: a setting with a wrong value (:class:`QueueSettings`).
    """
    unknown = sorted(name for name in settings if name not in SETTING_NAMES)
    if unknown:
        names = [*own, *SETTING_NAMES]

        def said(name: str) -> str:
            close = difflib.get_close_matches(name, names, n=1)
            return f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name)

        which = (f"an unknown setting {said(unknown[0])}" if len(unknown) == 1 else
                 f"unknown settings {', '.join(map(said, unknown[:-1]))} and "
                 f"{said(unknown[-1])}")
        raise UnknownSetting(f"{caller} got {which}; its keyword arguments are "
                             f"{', '.join(names)}", unknown)
    return QueueSettings(**settings)
