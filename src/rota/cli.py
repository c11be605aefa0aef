"""The ``rota`` command (click + rich): migrations, one-shot runs, the worker, the cron
server, and inspection of jobs, runs, queue depth and plans.

How an application describes its pipeline: an *app* import path ``module:attribute``
(``--app`` or ``ROTA_APP``; the current directory is importable, as with uvicorn) naming
a callable ``build(queue) -> Pipeline`` (or a zero-argument factory of pipelines, which
the cron server calls per request). The CLI builds the :class:`rota.Queue` itself from
``--database-url``/``DATABASE_URL`` and ``--schema``/``ROTA_SCHEMA``; an app that needs
other queue settings (its plans, job types, groups relation, stale window…) says so in
an optional ``queue_settings`` attribute on the callable: a mapping of
:class:`rota.Queue` keyword arguments, or a zero-argument callable returning one::

    def build_pipeline(queue: rota.Queue) -> rota.Pipeline:
        return rota.Pipeline(queue, [rota.Stage("send", 10, 5, send)])

    build_pipeline.queue_settings = {"plans": MY_PLANS, "types": ["send"]}

Exit codes: 0 success; 1 the command ran but reports a problem (a run that stopped with
``error``, a job that cannot be retried or cancelled, a database error other than the
ones below); 2 bad usage or flag values, a broken app or configuration (including a
``--budget`` not below the app's platform timeout), a malformed database URL, an
unreachable database, rota's tables missing, or a value the database cannot store
(SQLSTATE classes 22 "data exception" and 54 "program limit exceeded", for example a
dedupe key too long for its index). Each is one line on stderr: ``error: database
unreachable: …`` when no connection could be made or it was lost, ``error: database
error: …`` for any other error the database reported.

Text that comes from the database or the app (job types, errors, plan names…) is shown
literally: never read as rich markup, and control characters are printed escaped
(``\x1b``), so a job cannot drive the operator's terminal.
"""

from __future__ import annotations

import asyncio
import difflib
import importlib
import inspect
import json
import logging
import math
import os
import signal
import sys
import time
import unicodedata
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any, NoReturn, TypeVar

import click
import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg_pool import PoolTimeout
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from . import db
from .cli_dashboard import dashboard_command
from .errors import ConfigError, DatabaseUnavailable, InvalidInput, RotaError
from .plans import DEFAULT_PLANS, Plans
from .queue import Queue, QueueSettings
from .web import HEALTHY_STOP_REASONS, resolve_pipeline

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

#: Seconds the CLI waits for a database connection before calling it unreachable.
CONNECT_TIMEOUT = 10

#: The largest --budget and --idle-poll accepted: one day.
MAX_SECONDS = 86_400.0


# -- text from the database: literal, no terminal control -------------------------------


def _escape_char(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def safe_text(value: object) -> str:
    """``value`` as text a terminal shows literally: whitespace runs (newlines, tabs)
    become one space, and every other non-printable character (C0/C1 controls such as
    ESC, bidirectional overrides, other format characters) is written as its Python
    escape (``\\x1b``, ``\\u202e``). Rich markup is not involved: pass the result in
    a :class:`rich.text.Text`, as :func:`cell` does."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():
        return text
    text = " ".join(text.split())
    if text.isprintable():
        return text
    return "".join(
        ch if ch.isprintable() else " " if unicodedata.category(ch) == "Zs"
        else _escape_char(ch)
        for ch in text)


def cell(value: object, style: str = "") -> Text:
    """A table cell showing ``value`` literally (see :func:`safe_text`)."""
    return Text(safe_text(value), style=style)


def add_row(table: Table, *values: object, style: str | None = None) -> None:
    """Add a row whose cells are shown literally: never parsed as markup or emoji."""
    table.add_row(*(v if isinstance(v, Text) else cell(v) for v in values), style=style)


# -- errors: one line on stderr, a meaningful exit code ---------------------------------


class CliError(click.ClickException):
    """A failure the CLI reports as one line, ``error: …`` on stderr, exit code 1: the
    command ran and its outcome is a problem (a job that cannot be retried, say)."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(safe_text(message))

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.message}", err=True)


class CliConfigError(CliError):
    """Bad usage or configuration, a malformed URL or an unreachable database: exit 2."""

    exit_code = 2


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0].strip() if lines else type(exc).__name__


#: SQLSTATEs (besides class 08, "connection exception") that mean the server went away
#: or would not take the connection: shutdown, crash, starting up, too many connections.
_CONNECTION_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "53300"})

#: SQLSTATE classes of values the database cannot store: a bad flag value (exit 2).
_INPUT_SQLSTATE_CLASSES = ("22", "54")


def is_connection_failure(exc: BaseException) -> bool:
    """Whether a database error means no connection could be made or it was lost (as
    opposed to the database refusing a statement, for example a value too large for an
    index, which is an ``OperationalError`` in psycopg too)."""
    if isinstance(exc, PoolTimeout):
        return True
    if not isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in _CONNECTION_SQLSTATES


def _as_cli_error(exc: Exception) -> CliError | None:
    """Translate the exceptions a command can meet into one-line CLI errors."""
    if isinstance(exc, DatabaseUnavailable | ConfigError | InvalidInput):
        return CliConfigError(_first_line(exc))
    if isinstance(exc, psycopg.errors.UndefinedTable | psycopg.errors.InvalidSchemaName):
        return CliConfigError(
            f"rota's tables are missing ({_first_line(exc)}): run `rota migrate`")
    if is_connection_failure(exc):
        return CliConfigError(f"database unreachable: {_first_line(exc)}")
    if isinstance(exc, psycopg.Error):
        state = exc.sqlstate or ""
        cls = CliConfigError if state.startswith(_INPUT_SQLSTATE_CLASSES) else CliError
        code = f" (SQLSTATE {state})" if state else ""
        return cls(f"database error{code}: {_first_line(exc)}")
    if isinstance(exc, RotaError):
        return CliError(_first_line(exc))
    if isinstance(exc, RecursionError):
        return CliConfigError("input nested too deeply to handle")
    return None


class RotaGroup(click.Group):
    """A click group that turns rota and database errors into :class:`CliError`."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.exceptions.Exit:
            raise
        except Exception as exc:
            translated = _as_cli_error(exc)
            if translated is None:
                raise
            raise translated from None


# -- the app and the queue ----------------------------------------------------------------


def load_app(spec: str) -> Callable[..., Any]:
    """Import an app given as ``module:attribute`` (the attribute may be dotted).

    Returns:
        The callable named (``build(queue) -> Pipeline | factory``).

    Raises:
        CliError (exit 2): the spec is malformed, the module or attribute is missing, or
            the attribute is not callable.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name.strip() or not attr.strip():
        raise CliConfigError(f"app {spec!r} must look like module:attribute "
                       "(for example myapp.jobs:build_pipeline)")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise CliConfigError(
            f"cannot import app module {module_name!r}: {_first_line(exc)}") from None
    except Exception as exc:  # a SyntaxError, or the module raised while importing
        raise CliConfigError(f"cannot import app module {module_name!r}: "
                             f"{type(exc).__name__}: {_first_line(exc)}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CliConfigError(f"app module {module_name!r} has no attribute {attr!r}") from None
        except Exception as exc:  # a module-level __getattr__ that raised
            raise CliConfigError(f"app {spec!r}: {type(exc).__name__}: "
                                 f"{_first_line(exc)}") from None
    if inspect.isclass(obj):
        raise CliConfigError(f"app {spec!r} is a class: it must be a function that takes a "
                             "Queue and returns the pipeline")
    if not callable(obj):
        raise CliConfigError(f"app {spec!r} is not callable: it must take a Queue and return "
                             "the pipeline")
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):  # no signature to check (some builtins)
        return obj  # type: ignore[no-any-return]
    try:
        signature.bind(object())
    except TypeError:
        raise CliConfigError(f"app {spec!r} must take one argument, the Queue; its "
                             f"signature is {signature}") from None
    return obj  # type: ignore[no-any-return]


def _app_error(spec: str | None, exc: Exception) -> CliConfigError:
    return CliConfigError(f"app {spec!r} failed: {type(exc).__name__}: {_first_line(exc)}")


def _is_database_error(exc: Exception) -> bool:
    return isinstance(exc, psycopg.Error | PoolTimeout)


#: The keyword arguments rota.Queue takes besides the connection (its QueueSettings).
QUEUE_SETTING_NAMES = frozenset(
    name for name, p in inspect.signature(QueueSettings.__init__).parameters.items()
    if p.kind is inspect.Parameter.KEYWORD_ONLY)


@dataclass
class Target:
    """What a command works on: the database URL, schema and app, from flags or env."""

    database_url: str | None
    schema: str | None
    app_spec: str | None
    _app: Callable[..., Any] | None = field(default=None, repr=False)

    @property
    def app(self) -> Callable[..., Any] | None:
        if self._app is None and self.app_spec:
            self._app = load_app(self.app_spec)
        return self._app

    def require_app(self) -> Callable[..., Any]:
        app = self.app
        if app is None:
            raise CliConfigError("no app: pass --app module:attribute or set ROTA_APP")
        return app

    def url(self) -> str:
        if not self.database_url or not self.database_url.strip():
            raise CliConfigError("no database: pass --database-url or set DATABASE_URL")
        return db.check_conninfo(self.database_url)

    def queue_settings(self) -> dict[str, Any]:
        """The app's ``queue_settings`` with the schema from the flags applied.

        Raises:
            CliConfigError: ``queue_settings`` raised, is not a mapping, or has a key that
                is not a :class:`rota.Queue` setting.
        """
        raw: Any = getattr(self.app, "queue_settings", None) if self.app else None
        if callable(raw):
            try:
                raw = raw()
            except Exception as exc:
                raise CliConfigError(
                    f"app {self.app_spec!r}: queue_settings() failed: "
                    f"{type(exc).__name__}: {_first_line(exc)}") from None
        if raw is not None and not isinstance(raw, Mapping):
            raise CliConfigError("the app's queue_settings must be a mapping of Queue settings")
        settings = dict(raw or {})
        for key in settings:
            if key not in QUEUE_SETTING_NAMES:
                close = difflib.get_close_matches(str(key), QUEUE_SETTING_NAMES, n=1)
                hint = (f"did you mean {close[0]!r}?" if close else
                        f"the settings are {', '.join(sorted(QUEUE_SETTING_NAMES))}")
                raise CliConfigError(f"app {self.app_spec!r}: queue_settings has unknown key "
                                     f"{key!r} ({hint})")
        settings["schema"] = self.schema or settings.get("schema") or "rota"
        return settings

    def settings(self) -> QueueSettings:
        """Queue settings without a connection (plans, groups relation, SQL)."""
        return QueueSettings(**self.queue_settings())

    def plans(self) -> Plans:
        plans = self.queue_settings().get("plans", DEFAULT_PLANS)
        return plans if isinstance(plans, Plans) else DEFAULT_PLANS


async def preflight(url: str) -> None:
    """Connect once and disconnect, so an unreachable database is reported at once with
    libpq's reason instead of a pool timeout.

    Raises:
        psycopg.OperationalError: the database refused or could not be reached within
            :data:`CONNECT_TIMEOUT` seconds.
    """
    conn = await psycopg.AsyncConnection.connect(url, connect_timeout=CONNECT_TIMEOUT)
    await conn.close()


@asynccontextmanager
async def open_queue(target: Target) -> AsyncIterator[Queue]:
    """An open :class:`rota.Queue` for ``target``, closed on exit."""
    url = target.url()
    await preflight(url)
    queue = Queue(url, **target.queue_settings())
    try:
        await queue.open()
        yield queue
    finally:
        await queue.close()


async def build_pipeline(target: Target, queue: Queue) -> Any:
    """Call the app with the queue; returns what it returns (a pipeline or a factory).

    Raises:
        CliConfigError: the app raised (database errors pass through as they are).
    """
    app = target.require_app()
    try:
        made = app(queue)
        if inspect.isawaitable(made):
            made = await made
    except Exception as exc:
        if _is_database_error(exc):
            raise
        raise _app_error(target.app_spec, exc) from None
    return made


async def load_pipeline(target: Target, queue: Queue) -> tuple[Any, Any]:
    """The app's result (a pipeline or a factory) and a pipeline resolved from it.

    Raises:
        CliConfigError: the app or its factory raised or returned no pipeline.
    """
    made = await build_pipeline(target, queue)
    try:
        return made, await resolve_pipeline(made)
    except Exception as exc:
        if _is_database_error(exc):
            raise
        raise _app_error(target.app_spec, exc) from None


def check_budget(pipeline: Any, budget: float) -> None:
    """Refuse a budget that is not below the pipeline's platform timeout, before any
    run: the runner would refuse every run (and a worker would retry forever).

    Raises:
        CliConfigError: ``budget`` is not shorter than ``pipeline.platform_timeout``.
    """
    timeout = getattr(pipeline, "platform_timeout", None)
    if isinstance(timeout, timedelta) and _seconds(budget) >= timeout:
        raise CliConfigError(
            f"--budget {budget:g}s must be shorter than the app's platform timeout "
            f"({timeout.total_seconds():g}s): the time between them is for finishing "
            "the jobs in flight")


async def require_migrated(conn: psycopg.AsyncConnection[Any], schema: str) -> None:
    """Refuse to start a long-running mode on a schema that ``rota migrate`` has not
    brought up to date (it would otherwise retry its failing queries forever).

    Raises:
        CliConfigError: migrations are missing (the missing-tables error, translated by
            the CLI, when there are none at all).
    """
    cur = await conn.execute(sql.SQL("SELECT version FROM {}.rota_migrations").format(
        db.identifier(schema)))
    applied = {row[0] for row in await cur.fetchall()}
    missing = sorted({v for v, _, _ in db.migrations()} - applied)
    if missing:
        raise CliConfigError(f"schema {schema!r} lacks migrations {missing}: "
                             "run `rota migrate`")


def target_options(f: F) -> F:
    """``--database-url``, ``--schema`` and ``--app``, each with its environment variable."""
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
    return click.option("--json", "as_json", is_flag=True,
                        help="Print JSON for scripts instead of a table.")(f)


def _parent_params() -> dict[str, Any]:
    """The enclosing group's parameters (``rota jobs --database-url X failed``)."""
    ctx = click.get_current_context(silent=True)
    return dict(ctx.parent.params) if ctx is not None and ctx.parent is not None else {}


def _target(database_url: str | None, schema: str | None, app_spec: str | None) -> Target:
    parent = _parent_params()
    return Target(database_url or parent.get("database_url"), schema or parent.get("schema"),
                  app_spec or parent.get("app_spec"))


def _as_json(as_json: bool) -> bool:
    return as_json or bool(_parent_params().get("as_json"))


# -- output ---------------------------------------------------------------------------------


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return float(value)
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def _json_escape(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def emit_json(data: Any) -> None:
    """Print ``data`` as JSON. Non-ASCII text stays readable, but non-printable
    characters (which JSON may carry raw inside strings: C1 controls, bidirectional
    overrides) are written as ``\\uXXXX`` escapes, so the output cannot drive a
    terminal either."""
    text = json.dumps(data, default=_json_default, indent=2, ensure_ascii=False)
    if not text.replace("\n", "").isprintable():
        text = "".join(ch if ch == "\n" or ch.isprintable() else _json_escape(ch)
                       for ch in text)
    click.echo(text)


#: Width of tables written to something that is not a terminal (a file, a pipe, a log
#: collector), where rich would otherwise assume 80 columns and cut values.
PIPE_WIDTH = 160


def console() -> Console:
    """The console tables go to: the terminal's width on a terminal; otherwise
    ``COLUMNS`` when set, else :data:`PIPE_WIDTH` columns."""
    out = Console(highlight=False, emoji=False, markup=False)
    if not out.is_terminal and not os.environ.get("COLUMNS"):
        out = Console(highlight=False, emoji=False, markup=False, width=PIPE_WIDTH)
    return out


def _time(value: datetime | None) -> str:
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _short(text: str | None, width: int = 60) -> str:
    if not text:
        return ""
    line = safe_text(text)
    return line if len(line) <= width else line[: width - 1] + "…"


def _age(seconds: float | None) -> str:
    """A duration for a table: ``42s``, ``17m``, ``5h``, ``3d``."""
    if seconds is None:
        return "—"
    seconds = max(seconds, 0.0)
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= 2 * size:
            return f"{seconds // size:.0f}{unit}"
    return f"{seconds:.0f}s"


async def with_progress(work: Awaitable[T], label: str, total: float | None = None) -> T:
    """Await ``work`` while a rich progress display on stderr shows the time spent (a bar
    against ``total`` seconds when given). Plain await when stderr is not a terminal."""
    task = asyncio.ensure_future(work)
    err = Console(stderr=True)
    if not err.is_terminal:
        return await task
    columns: list[str | ProgressColumn] = [SpinnerColumn(), TextColumn(label)]
    if total:
        columns += [BarColumn(), TimeElapsedColumn(), TextColumn(f"of {total:g}s budget")]
    else:
        columns += [TimeElapsedColumn()]
    with Progress(*columns, console=err, transient=True) as progress:
        bar = progress.add_task(label, total=total)
        start = time.monotonic()
        while not task.done():
            await asyncio.wait([task], timeout=0.2)
            progress.update(bar, completed=min(time.monotonic() - start, total or 0.0))
    return task.result()


def _run_row(result: Any) -> dict[str, Any]:
    return {
        "runId": str(result.run_id),
        "stopReason": result.stop_reason,
        "jobsDone": result.jobs_done,
        "jobsFailed": result.jobs_failed,
        "jobsDeferred": result.jobs_deferred,
        "units": result.quota_units,
        "summary": dict(result.summary or {}),
        "error": result.error,
    }


def _summary_text(summary: Mapping[str, Any] | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted((summary or {}).items()))


def _seconds(value: float) -> timedelta:
    return timedelta(seconds=value)


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


# -- commands -----------------------------------------------------------------------------


@click.group(cls=RotaGroup)
@click.version_option(package_name="rota", prog_name="rota")
def cli() -> None:
    """rota: fair, crash-safe background pipelines on PostgreSQL."""


@cli.command()
@target_options
@json_option
def migrate(database_url: str | None, schema: str | None, app_spec: str | None,
            as_json: bool) -> None:
    """Apply missing migrations (safe to run concurrently)."""
    target = _target(database_url, schema, app_spec)

    async def go() -> list[int]:
        url = target.url()
        settings = target.settings()
        async with await psycopg.AsyncConnection.connect(
                url, autocommit=True, connect_timeout=CONNECT_TIMEOUT) as conn:
            return await with_progress(db.migrate(conn, settings.schema), "migrating")

    applied = asyncio.run(go())
    if as_json:
        emit_json({"applied": applied})
    else:
        click.echo(f"applied {applied}" if applied else "up to date")


@cli.command()
@click.option("--schema", envvar="ROTA_SCHEMA", default="rota",
              help="Schema of rota's tables [env ROTA_SCHEMA; when neither is given: rota].")
def schema(schema: str) -> None:
    """Print the schema SQL for your own migration tool."""
    click.echo(db.schema_sql(schema), nl=False)


@cli.command()
@target_options
@click.option("--budget", type=POSITIVE_SECONDS, default=220.0, show_default=True,
              metavar="SECONDS",
              help="Time budget: no new batch is claimed after it. Must be shorter than "
                   "the app's platform timeout (300 s unless the app says otherwise).")
@json_option
def run(database_url: str | None, schema: str | None, app_spec: str | None,
        budget: float, as_json: bool) -> None:
    """Run the pipeline once within the budget (for a CronJob or a systemd timer).

    Exits 1 when the run stopped with `error`; 2 when it could not start (bad app or
    budget, database unreachable)."""
    target = _target(database_url, schema, app_spec)
    target.require_app()

    async def go() -> Any:
        async with open_queue(target) as queue:
            _, pipeline = await load_pipeline(target, queue)
            check_budget(pipeline, budget)
            return await with_progress(
                pipeline.run(trigger="cli", time_budget=_seconds(budget)),
                "running the pipeline", budget)

    result = asyncio.run(go())
    row = _run_row(result)
    if as_json:
        emit_json(row)
    else:
        table = Table(title="run", show_header=False)
        for key in ("runId", "stopReason", "jobsDone", "jobsFailed", "jobsDeferred", "units"):
            add_row(table, key, row[key])
        add_row(table, "summary", _summary_text(row["summary"]))
        if row["error"]:
            add_row(table, "error", row["error"])
        console().print(table)
    if result.stop_reason not in HEALTHY_STOP_REASONS:
        sys.exit(1)


@cli.command()
@target_options
@click.option("--budget", type=POSITIVE_SECONDS, default=220.0, show_default=True,
              metavar="SECONDS", help="Each run's time budget (shorter than the app's "
                                      "platform timeout).")
@click.option("--idle-poll", type=POSITIVE_SECONDS, default=5.0, show_default=True,
              metavar="SECONDS", help="Longest sleep without asking the database.")
@click.option("--no-maintenance", is_flag=True, help="Do not run daily maintenance.")
def worker(database_url: str | None, schema: str | None, app_spec: str | None,
           budget: float, idle_poll: float, no_maintenance: bool) -> None:
    """Run the pipeline back to back; sleep until the next job is due, wake on enqueue.

    On SIGINT or SIGTERM it lets the current run finish (at most its budget, plus the
    jobs in flight) and then exits 0, starting no new run or maintenance. A second
    signal stops at once (exit 130): the current run's unstarted jobs are deferred
    back, and its jobs in flight are failed (the claim already counted the attempt),
    so they are retried after their backoff, or give up if it was their last attempt.

    Exits 2 at start, before looping, when the app or its settings are wrong, the
    budget is not below the app's platform timeout, the database is unreachable or its
    schema is not migrated."""
    from .worker import Worker

    target = _target(database_url, schema, app_spec)
    target.require_app()
    _log_to_stderr()

    def report(result: Any) -> None:
        click.echo(safe_text(
            f"run {result.run_id} stopped {result.stop_reason}: "
            f"done={result.jobs_done} failed={result.jobs_failed} "
            f"deferred={result.jobs_deferred} units={result.quota_units}"))

    async def go() -> None:
        stop = asyncio.Event()
        main_task = asyncio.current_task()
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            if stop.is_set() and main_task is not None:
                main_task.cancel()
            else:
                click.echo("stopping after the current run (signal again to stop now)",
                           err=True)
                stop.set()

        # Installed first, so a signal during start-up is a stop request too.
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        async with open_queue(target) as queue:
            async with queue.connection() as conn:
                await require_migrated(conn, queue.schema)
            _, pipeline = await load_pipeline(target, queue)
            check_budget(pipeline, budget)
            w = Worker(pipeline, queue=queue, idle_poll=_seconds(idle_poll),
                       time_budget=_seconds(budget),
                       maintain_every=None if no_maintenance else timedelta(days=1),
                       on_run=report)
            if stop.is_set():
                return
            click.echo(f"worker listening on schema {queue.schema!r}", err=True)
            await w.run_forever(stop)

    try:
        asyncio.run(go())
    except asyncio.CancelledError:
        sys.exit(130)
    click.echo("worker stopped", err=True)


@cli.command()
@target_options
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--budget", type=POSITIVE_SECONDS, default=220.0, show_default=True,
              metavar="SECONDS", help="Each cron run's time budget (shorter than the "
                                      "app's platform timeout).")
@click.option("--metrics", is_flag=True, help="Also serve GET /metrics (Prometheus; "
              "credential ROTA_DASHBOARD_SECRET, needed unless --host is loopback).")
def serve(database_url: str | None, schema: str | None, app_spec: str | None,
          host: str, port: int, budget: float, metrics: bool) -> None:
    """Serve GET /api/cron under uvicorn (the secret comes from CRON_SECRET).

    Exits 2 at start when the app or its settings are wrong, the budget is not below
    the app's platform timeout, the database is unreachable or its schema is not
    migrated."""
    import uvicorn

    from .web import cron_app, usable_secret

    target = _target(database_url, schema, app_spec)
    target.require_app()
    url = target.url()
    queue = Queue(url, **target.queue_settings())

    async def check() -> Any:
        async with await psycopg.AsyncConnection.connect(
                url, autocommit=True, connect_timeout=CONNECT_TIMEOUT) as conn:
            await require_migrated(conn, queue.schema)
        # A factory is called once here, so a broken one is refused now rather than
        # on every cron request.
        made, pipeline = await load_pipeline(target, queue)
        check_budget(pipeline, budget)
        return made

    made = asyncio.run(check())
    secret = os.environ.get("CRON_SECRET")
    if usable_secret(secret) is None:
        click.echo("warning: CRON_SECRET is not set: /api/cron will refuse every request",
                   err=True)
    app = cron_app(made, secret=secret, time_budget=_seconds(budget), queue=queue)
    if metrics:
        from .web.metrics import mount_metrics
        mount_metrics(app, queue, pipeline=made, host=host,
                      secret=os.environ.get("ROTA_DASHBOARD_SECRET"))
    uvicorn.run(app, host=host, port=port, log_level="info")


def _parse_run_after(ctx: click.Context, param: click.Parameter,
                     value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an ISO 8601 time "
                                 "(for example 2030-01-01T09:00:00+00:00)") from None
    if when.tzinfo is None:
        raise click.BadParameter(f"{value!r} has no time zone (add +00:00 or Z)")
    return when


#: The most a payload file or stdin is read (the queue refuses payloads over its
#: ``max_payload_bytes``, 1 MiB by default, anyway; this bounds the memory first).
MAX_PAYLOAD_INPUT = 64 * 1024 * 1024


def _read_payload_text(value: str) -> str:
    """PAYLOAD_JSON itself, or the text of ``-`` (stdin) or ``@PATH`` (a file)."""
    if value != "-" and not value.startswith("@"):
        return value
    where = "stdin" if value == "-" else f"file {value[1:]!r}"
    data: bytes
    try:
        if value == "-":
            data = sys.stdin.buffer.read(MAX_PAYLOAD_INPUT + 1)
        else:
            with open(value[1:], "rb") as f:
                data = f.read(MAX_PAYLOAD_INPUT + 1)
    except OSError as exc:
        raise click.BadParameter(
            f"cannot read the payload from {where}: {exc.strerror or exc}") from None
    if len(data) > MAX_PAYLOAD_INPUT:
        raise click.BadParameter(f"the payload from {where} is larger than "
                                 f"{MAX_PAYLOAD_INPUT // (1024 * 1024)} MiB")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise click.BadParameter(f"the payload from {where} is not UTF-8: {exc}") from None


def _parse_payload(ctx: click.Context, param: click.Parameter, value: str) -> Any:
    text = _read_payload_text(value)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}") from None
    except RecursionError:
        raise click.BadParameter("JSON nested too deeply") from None


@cli.command()
@target_options
@click.argument("job_type", metavar="TYPE")
@click.argument("payload", metavar="PAYLOAD_JSON", callback=_parse_payload)
@click.option("--group", "group_id", help="The group the job belongs to (must exist).")
@click.option("--dedupe-key", help="Skip if an open job has this key.")
@click.option("--run-after", callback=_parse_run_after, metavar="ISO8601",
              help="When it becomes due, with a time zone (default now).")
@click.option("--max-attempts", type=click.IntRange(min=1), help="Override the default.")
@json_option
def enqueue(database_url: str | None, schema: str | None, app_spec: str | None,
            job_type: str, payload: Any, group_id: str | None, dedupe_key: str | None,
            run_after: datetime | None, max_attempts: int | None, as_json: bool) -> None:
    """Enqueue one job of TYPE with PAYLOAD_JSON.

    PAYLOAD_JSON is the JSON text itself, `-` to read it from stdin, or `@PATH` to read
    it from a file (for payloads longer than a command line allows)."""
    target = _target(database_url, schema, app_spec)

    async def go() -> Any:
        async with open_queue(target) as queue:
            if target.app is not None:
                # The stages' settings (max_attempts) apply to what is enqueued.
                await build_pipeline(target, queue)
            try:
                return await queue.enqueue(job_type, payload, group_id=group_id,
                                           dedupe_key=dedupe_key, run_after=run_after,
                                           max_attempts=max_attempts)
            except RecursionError:
                raise CliConfigError("payload nested too deeply to store") from None

    job = asyncio.run(go())
    if as_json:
        emit_json({"id": job.id if job else None, "duplicate": job is None})
    elif job is None:
        click.echo(safe_text(
            f"not enqueued: an open job already has dedupe key {dedupe_key!r}"))
    else:
        click.echo(safe_text(
            f"enqueued job {job.id} ({job.type}), due {_time(job.run_after)} UTC"))


# -- jobs ---------------------------------------------------------------------------------

STATUSES = click.Choice(["pending", "running", "done", "failed"])


async def _list_jobs(target: Target, status: str | None, job_type: str | None,
                     group_id: str | None, limit: int) -> list[dict[str, Any]]:
    async with open_queue(target) as queue, queue.connection() as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(queue.sql("list_jobs"), {
            "status": status, "type": job_type, "group_id": group_id, "limit": limit})
        return await cur.fetchall()


def _filters(f: F) -> F:
    f = click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)(f)
    f = click.option("--group", "group_id", help="Only this group.")(f)
    f = click.option("--type", "job_type", help="Only this job type.")(f)
    return f


@cli.group(cls=RotaGroup, invoke_without_command=True)
@target_options
@click.option("--status", type=STATUSES, help="Only jobs with this status.")
@_filters
@json_option
@click.pass_context
def jobs(ctx: click.Context, database_url: str | None, schema: str | None,
         app_spec: str | None, status: str | None, job_type: str | None,
         group_id: str | None, limit: int, as_json: bool) -> None:
    """List jobs, newest first (or: jobs failed / jobs retry ID / jobs cancel ID)."""
    if ctx.invoked_subcommand is not None:
        return
    target = _target(database_url, schema, app_spec)
    rows = asyncio.run(_list_jobs(target, status, job_type, group_id, limit))
    if as_json:
        emit_json(rows)
        return
    plans = target.plans()
    table = Table(title=f"jobs ({len(rows)} shown)")
    for col in ("id", "type", "group", "plan", "status", "attempts", "deferrals",
                "run after (UTC)", "last error"):
        table.add_column(col, overflow="fold")
    for r in rows:
        add_row(table, r["id"], r["type"], r["group_id"] or "—",
                _plan_name(plans, r["plan"], r["group_id"]), r["status"],
                f"{r['attempts']}/{r['max_attempts']}", r["deferrals"],
                _time(r["run_after"]), _short(r["last_error"]))
    console().print(table)


@jobs.command("failed")
@target_options
@_filters
@json_option
def jobs_failed(database_url: str | None, schema: str | None, app_spec: str | None,
                job_type: str | None, group_id: str | None, limit: int,
                as_json: bool) -> None:
    """Failed jobs with their last errors, newest first."""
    target = _target(database_url, schema, app_spec)
    as_json = _as_json(as_json)
    rows = asyncio.run(_list_jobs(target, "failed", job_type, group_id, limit))
    if as_json:
        emit_json(rows)
        return
    table = Table(title=f"failed jobs ({len(rows)} shown)")
    for col in ("id", "type", "group", "attempts", "finished (UTC)", "give-up hook",
                "last error"):
        table.add_column(col, overflow="fold")
    for r in rows:
        add_row(table, r["id"], r["type"], r["group_id"] or "—",
                f"{r['attempts']}/{r['max_attempts']}", _time(r["finished_at"]),
                "owed" if r["give_up_pending"] else "ran", r["last_error"] or "")
    console().print(table)


def _refuse(job: Any, job_id: int, action: str) -> NoReturn:
    if job is None:
        raise CliError(f"no job {job_id}")
    if action == "retry":
        if job.status != "failed":
            raise CliError(f"job {job_id} is {job.status}; only a failed job can be retried")
        raise CliError(f"job {job_id}: another open job holds dedupe key {job.dedupe_key!r}")
    raise CliError(f"job {job_id} is {job.status}; only a pending job can be cancelled")


@jobs.command("retry")
@target_options
@click.argument("job_id", type=click.IntRange(min=1), metavar="ID")
@json_option
def jobs_retry(database_url: str | None, schema: str | None, app_spec: str | None,
               job_id: int, as_json: bool) -> None:
    """Put failed job ID back to pending, due now, with attempts reset.

    A give-up hook still owed for it is cancelled: the job has not given up any more."""
    target = _target(database_url, schema, app_spec)
    as_json = _as_json(as_json)

    async def go() -> tuple[dict[str, Any] | None, Any]:
        async with open_queue(target) as queue, queue.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            try:
                await cur.execute(queue.sql("retry_job"), {
                    "id": job_id, "offset": queue.clock_offset, "channel": queue.schema})
            except psycopg.errors.UniqueViolation:  # an open duplicate appeared meanwhile
                return None, await queue.get_job(job_id)
            row = await cur.fetchone()
            return row, (None if row else await queue.get_job(job_id))

    row, job = asyncio.run(go())
    if row is None:
        _refuse(job, job_id, "retry")
    if as_json:
        emit_json({"id": job_id, "status": row["status"],
                   "giveUpHookCancelled": row["hook_cancelled"]})
    else:
        note = "; its owed give-up hook is cancelled" if row["hook_cancelled"] else ""
        click.echo(safe_text(f"job {job_id} ({row['type']}) is pending again, due now{note}"))


@jobs.command("cancel")
@target_options
@click.argument("job_id", type=click.IntRange(min=1), metavar="ID")
@json_option
def jobs_cancel(database_url: str | None, schema: str | None, app_spec: str | None,
                job_id: int, as_json: bool) -> None:
    """Cancel pending job ID: it ends failed ('cancelled') and its give-up hook is owed
    (run now when --app registers one, else by the next maintenance)."""
    target = _target(database_url, schema, app_spec)
    as_json = _as_json(as_json)

    async def go() -> tuple[dict[str, Any] | None, Any, int]:
        async with open_queue(target) as queue:
            async with queue.connection() as conn:
                cur = conn.cursor(row_factory=dict_row)
                await cur.execute(queue.sql("cancel_job"), {
                    "id": job_id, "offset": queue.clock_offset})
                row = await cur.fetchone()
            if row is None:
                return None, await queue.get_job(job_id), 0
            ran = 0
            if target.app is not None:
                await build_pipeline(target, queue)  # registers the app's give-up hooks
                ran = await queue.run_give_up_hooks([job_id])
            return row, None, ran

    row, job, ran = asyncio.run(go())
    if row is None:
        _refuse(job, job_id, "cancel")
    if as_json:
        emit_json({"id": job_id, "status": "failed", "giveUpHookRan": bool(ran)})
    else:
        hook = "its give-up hook ran" if ran else "its give-up hook is owed"
        click.echo(safe_text(f"job {job_id} ({row['type']}) cancelled; {hook}"))


# -- runs, maintenance, depth, pricing --------------------------------------------------------


@cli.command()
@target_options
@click.option("--limit", "-n", type=click.IntRange(min=1), default=20, show_default=True)
@json_option
def runs(database_url: str | None, schema: str | None, app_spec: str | None,
         limit: int, as_json: bool) -> None:
    """The last runs with their stop reasons and summaries."""
    target = _target(database_url, schema, app_spec)

    async def go() -> list[dict[str, Any]]:
        async with open_queue(target) as queue, queue.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(queue.sql("list_runs"), {"limit": limit})
            return await cur.fetchall()

    rows = asyncio.run(go())
    for r in rows:
        end = r["finished_at"]
        r["duration_seconds"] = (
            None if end is None else round((end - r["started_at"]).total_seconds(), 3))
    if as_json:
        emit_json(rows)
        return
    table = Table(title=f"runs ({len(rows)} shown)")
    for col in ("run", "trigger", "started (UTC)", "secs", "stop reason", "done", "failed",
                "deferred", "units", "summary / error"):
        table.add_column(col, overflow="fold")
    for r in rows:
        reason = r["stop_reason"] or "unfinished"
        style = "red" if reason == "error" else ("yellow" if reason == "unfinished" else "")
        note = _summary_text(r["summary"])
        if r["error"]:
            error = f"error: {_short(r['error'])}"
            note = f"{note}; {error}" if note else error
        secs = "—" if r["duration_seconds"] is None else f"{r['duration_seconds']:.1f}"
        add_row(table, str(r["id"])[:8], r["trigger"], _time(r["started_at"]), secs,
                cell(reason, style), r["jobs_done"], r["jobs_failed"], r["jobs_deferred"],
                r["quota_units"], note)
    console().print(table)


@cli.command()
@target_options
@json_option
def maintain(database_url: str | None, schema: str | None, app_spec: str | None,
             as_json: bool) -> None:
    """Fail stuck jobs (running their give-up hooks), mark killed runs, prune old done
    jobs. With --app, the app's give-up hooks run too."""
    from .maintenance import maintain as run_maintenance
    from .runner import DEFAULT_PLATFORM_TIMEOUT

    target = _target(database_url, schema, app_spec)

    async def go() -> Mapping[str, int]:
        async with open_queue(target) as queue:
            platform_timeout = DEFAULT_PLATFORM_TIMEOUT
            if target.app is not None:
                # Building the pipeline registers the app's give-up hooks.
                _, pipeline = await load_pipeline(target, queue)
                platform_timeout = getattr(pipeline, "platform_timeout", platform_timeout)
            return await with_progress(
                run_maintenance(queue, platform_timeout=platform_timeout), "maintenance")

    counters = dict(asyncio.run(go()))
    if as_json:
        emit_json(counters)
        return
    table = Table(title="maintenance")
    table.add_column("task")
    table.add_column("count", justify="right")
    for key, value in counters.items():
        add_row(table, key, value)
    console().print(table)


def _plan_name(plans: Plans, plan_id: str | None, group_id: str | None) -> str:
    if plan_id is None:
        return "—" if group_id is None else "(no owner)"
    return plans[plan_id].name if plan_id in plans else f"{plan_id} (unknown)"


def _plan_priority(plans: Plans, plan_id: str | None) -> int:
    # Mirrors the claim's ranking (sql/claim.sql): no plan ranks as the middle plan, an
    # unknown plan id as the lowest.
    if plan_id is None:
        return plans.middle.priority
    return plans[plan_id].priority if plan_id in plans else plans.lowest.priority


@cli.command()
@target_options
@json_option
def depth(database_url: str | None, schema: str | None, app_spec: str | None,
          as_json: bool) -> None:
    """Queue depth per stage (job type) and plan: due, scheduled, paused, running."""
    target = _target(database_url, schema, app_spec)

    async def go() -> tuple[list[dict[str, Any]], list[str]]:
        async with open_queue(target) as queue:
            order: list[str] = []
            if target.app is not None:
                _, pipeline = await load_pipeline(target, queue)
                order = [s.type for s in getattr(pipeline, "stages", ())]
            async with queue.connection() as conn:
                cur = conn.cursor(row_factory=dict_row)
                await cur.execute(queue.sql("queue_depth"), {"offset": queue.clock_offset})
                return await cur.fetchall(), order

    rows, order = asyncio.run(go())
    plans = target.plans()
    for r in rows:
        r["priority"] = _plan_priority(plans, r["plan"])
        r["plan_name"] = (plans[r["plan"]].name if r["plan"] in plans
                          else r["plan"] if r["plan"] is not None else None)
    rank = {t: i for i, t in enumerate(order)}
    rows.sort(key=lambda r: (rank.get(r["type"], len(rank)), r["type"], -r["priority"],
                             r["plan"] or ""))
    if as_json:
        emit_json(rows)
        return
    table = Table(title="queue depth")
    for col in ("stage", "plan", "priority", "due", "scheduled", "paused", "running",
                "oldest due"):
        table.add_column(col, justify="left" if col in ("stage", "plan") else "right")
    totals = [0, 0, 0, 0]
    for r in rows:
        add_row(table, r["type"], r["plan_name"] or "(none)", r["priority"], r["due"],
                r["scheduled"], r["paused"], r["running"], _age(r["oldest_due_seconds"]))
        for i, key in enumerate(("due", "scheduled", "paused", "running")):
            totals[i] += r[key]
    add_row(table, "total", "", "", *totals, "", style="bold")
    console().print(table)


@cli.command()
@click.option("--app", "app_spec", envvar="ROTA_APP", metavar="MODULE:ATTR",
              help="Read the plans from this app's queue_settings [env ROTA_APP].")
@json_option
def pricing(app_spec: str | None, as_json: bool) -> None:
    """The pricing table, rendered from the same plans object that ranks the claim."""
    plans = Target(None, None, app_spec).plans()
    rows = plans.pricing_rows()
    if as_json:
        emit_json({
            "plans": [{"id": p.id, "name": p.name, "priority": p.priority} for p in plans],
            "rows": [{"label": label, "values": values} for label, values in rows],
        })
        return
    table = Table(title="plans")
    table.add_column("")
    for p in plans:
        table.add_column(cell(p.name), justify="center")
    for label, values in rows:
        add_row(table, label, *values)
    console().print(table)


@cli.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def demo(args: Sequence[str]) -> None:
    """Run the example pipeline end to end (arguments go to the demo)."""
    try:
        module = importlib.import_module("rota.demo.main")
    except ModuleNotFoundError as exc:
        if exc.name not in ("rota.demo", "rota.demo.main"):
            raise
        click.echo("rota demo: coming soon")
        return
    entry = module.main
    if isinstance(entry, click.Command):
        entry.main(args=list(args), prog_name="rota demo")
        return
    code = entry(list(args)) if inspect.signature(entry).parameters else entry()
    if isinstance(code, int) and code:
        sys.exit(code)


class SafeFormatter(logging.Formatter):
    """A log formatter whose lines cannot drive a terminal: each line of a record
    (a traceback keeps its lines) has its control characters escaped, as
    :func:`safe_text` does for tables (errors carry text from jobs)."""

    def format(self, record: logging.LogRecord) -> str:
        return "\n".join(safe_text(line) for line in super().format(record).split("\n"))


def _log_to_stderr() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(SafeFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])


cli.add_command(dashboard_command())


def main() -> None:
    """The ``rota`` console script."""
    cli(prog_name="rota")


if __name__ == "__main__":
    main()
