"""Options every command shares (``--database-url``, ``--schema``, ``--app``,
``--json``) and the ``seconds`` and whole number flag types."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any, TypeVar

import click

from ..checks import cut_text
from ..settings import FAIR_BY
from .app import Target
from .errors import CliConfigError, RotaCommand, ValueRefused, given_as

F = TypeVar("F", bound=Callable[..., Any])

#: The largest --budget and --idle-poll accepted: one day.
MAX_SECONDS = 86_400.0


def _keep_fair_by(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    """Keep ``--fair-by`` in the context's meta (shared with the group's context), so
    :func:`make_target` applies it without every command taking it as an argument."""
    if value is not None:
        ctx.meta[FAIR_BY_KEY] = value


#: Where ``--fair-by`` is kept in the click context's meta.
FAIR_BY_KEY = "rota.fair_by"


def target_options(f: F) -> F:
    """``--database-url``, ``--schema``, ``--app`` and ``--fair-by``, each with its
    environment variable."""
    f = click.option("--fair-by", type=click.Choice(FAIR_BY), envvar="ROTA_FAIR_BY",
                     default=None, expose_value=False, callback=_keep_fair_by,
                     is_eager=True,
                     help="What the fair claim compares after plan priority: the "
                          "least-served group, or the least-served owner then group "
                          "[env ROTA_FAIR_BY; default: the app's, else group] "
                          "(docs/design.md, \"The fair claim\").")(f)
    f = click.option("--app", "app_spec", envvar="ROTA_APP", metavar="MODULE:ATTR",
                     help="The app: a callable taking a Queue and returning the pipeline "
                          "[env ROTA_APP].")(f)
    f = click.option("--schema", envvar="ROTA_SCHEMA", default=None,
                     help="Schema of rota's tables [env ROTA_SCHEMA; default: the app's, "
                          "else rota].")(f)
    f = click.option("--database-url", envvar="DATABASE_URL", metavar="URL",
                     help="PostgreSQL URL or conninfo [env DATABASE_URL].")(f)
    return f


def json_option(f: F) -> F:
    """``--json``: print JSON for scripts instead of a table."""
    return click.option("--json", "as_json", is_flag=True,
                        help="Print JSON for scripts instead of a table.")(f)


def target_command(f: Callable[..., Any]) -> click.Command:
    """A command on the target that can print JSON: ``f`` with :func:`target_options`
    and :func:`json_option`, named after it."""
    return click.command(cls=RotaCommand)(target_options(json_option(f)))


def _parent_params() -> dict[str, Any]:
    """The enclosing group's parameters (``rota jobs --database-url X failed``)."""
    ctx = click.get_current_context(silent=True)
    return dict(ctx.parent.params) if ctx is not None and ctx.parent is not None else {}


def make_target(database_url: str | None, schema: str | None,
                app_spec: str | None) -> Target:
    """The target from a command's options, falling back to its group's.

    Raises:
        CliConfigError: an option given as an empty string (``--schema "$UNSET"`` would
            otherwise fall back to the default schema and write there).
    """
    parent = _parent_params()
    given = {"database-url": (database_url, parent.get("database_url")),
             "schema": (schema, parent.get("schema")), "app": (app_spec, parent.get("app_spec"))}
    for name, values in given.items():
        if "" in values:
            raise CliConfigError(f"--{name} is empty: give a value, or leave the option "
                                 f"out for the default")
    url, schema_, app = (mine if mine is not None else theirs
                         for mine, theirs in given.values())
    ctx = click.get_current_context(silent=True)
    fair_by = ctx.meta.get(FAIR_BY_KEY) if ctx is not None else None
    return Target(url, schema_, app, fair_by=fair_by,
                  app_given_as=given_as(ctx, "app_spec") or "app")


def wants_json(as_json: bool) -> bool:
    """``--json`` given to the command or to its group."""
    return as_json or bool(_parent_params().get("as_json"))


class Seconds(click.ParamType):  # type: ignore[type-arg]
    """A positive, finite number of seconds, at most ``maximum`` (``nan``, ``inf`` and
    ``1e308`` are refused as flag values, not met later as tracebacks)."""

    name = "seconds"

    def __init__(self, maximum: float = MAX_SECONDS) -> None:
        self.maximum = maximum

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(seconds) or seconds <= 0:
            self.fail(f"{value!r} is not a positive, finite number of seconds", param, ctx)
        if seconds > self.maximum:
            self.fail(f"{value!r} is more than {self.maximum:g} seconds (one day)",
                      param, ctx)
        return seconds


POSITIVE_SECONDS = Seconds()


#: A whole number as typed: digits, a sign allowed (``-1`` is refused by its range,
#: not taken for something else); no ``1_000``, ``1e3`` or ``0x10``.
_WHOLE_NUMBER = re.compile(r"[+-]?[0-9]+")


class WholeNumber(click.ParamType):  # type: ignore[type-arg]
    """A whole number from ``minimum`` to ``maximum`` (an id, a limit, a count, a
    port), refused in rota's words with the parameter as it was given: ``--limit must
    be a whole number from 1 to 1,000, got 0``, ``ID must be … got 'abc'`` (not
    click's ``0 is not in the range 1<=x<=1000`` or ``'abc' is not a valid integer
    range``).

    Args:
        minimum, maximum: the range, both included.
        none: ``none`` is accepted too (converted to ``None``: clears a setting), and
            said so in the message.
    """

    name = "integer"

    def __init__(self, minimum: int, maximum: int, *, none: bool = False) -> None:
        self.minimum, self.maximum, self.none = minimum, maximum, none

    @property
    def expected(self) -> str:
        """What the parameter must be (``must be a whole number from 1 to 1,000``)."""
        return (f"must be {'none or ' if self.none else ''}a whole number from "
                f"{self.minimum:,} to {self.maximum:,}")

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> int | None:
        if isinstance(value, int) and not isinstance(value, bool):  # a default
            number: int | None = value
        else:
            text = str(value).strip()
            if self.none and text.lower() == "none":
                return None
            # At most 30 digits are read: more is out of range (and Python reads no
            # more than 4,300).
            number = (int(text) if _WHOLE_NUMBER.fullmatch(text) and len(text) <= 30
                      else None)
            if number is None and not _WHOLE_NUMBER.fullmatch(text):
                raise ValueRefused(f"{self.expected}, got {cut_text(str(value), 40)!r}",
                                   ctx, param)
        if number is None or not self.minimum <= number <= self.maximum:
            raise ValueRefused(f"{self.expected}, got {cut_text(str(value).strip(), 40)}",
                               ctx, param)
        return number

    def __repr__(self) -> str:
        return f"WholeNumber({self.minimum}, {self.maximum})"
