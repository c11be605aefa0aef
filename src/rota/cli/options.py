"""Options every command shares (``--database-url``, ``--schema``, ``--app``,
``--json``) and the ``seconds`` flag type."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

import click

from ..settings import FAIR_BY
from .app import Target
from .errors import CliConfigError, RotaCommand, given_as

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
