"""The app and the queue a command works on: loading ``module:attribute``, the
:class:`Target` (database URL, schema, app) and opening a queue for it, building the
app's pipeline, and the checks long-running modes make before they start."""

from __future__ import annotations

import asyncio
import difflib
import importlib
import inspect
import os
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import psycopg

from .. import admin, db
from ..checks import shown
from ..errors import ConfigError, InvalidInput, first_line
from ..plans import DEFAULT_PLANS, Plans
from ..queue import AnyConn, Queue
from ..runner.source import check_time_budget, resolve_pipeline
from ..settings import DEFAULT_PLATFORM_TIMEOUT, SETTING_NAMES, QueueSettings, default_time_budget
from .errors import CliConfigError, is_database_error, same_queue

#: Seconds the CLI waits for a database connection before calling it unreachable.
CONNECT_TIMEOUT = 10
#: Seconds tasks still running after a command's work are given to stop when cancelled.
LEFTOVER_GRACE = 0.25

T = TypeVar("T")


def run_async(main: Coroutine[Any, Any, T], *, grace: float = LEFTOVER_GRACE) -> T:
    """Run a long-running command's coroutine (``rota run``, ``rota worker``) like
    ``asyncio.run``, except at the end: tasks still running are cancelled and given
    ``grace`` seconds, then left behind, so the process exits. ``asyncio.run`` waits for
    them without limit, and a handler that ignores its cancellation (which the run
    already cut and settled: docs/design.md, "Handler deadlines") would hold the
    process past its platform timeout.

    Returns:
        What ``main`` returned.

    Raises:
        What ``main`` raised (``asyncio.CancelledError`` when it was cancelled).
    """
    loop = asyncio.new_event_loop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        try:
            leftover = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in leftover:
                task.cancel()
            if leftover:
                loop.run_until_complete(asyncio.wait(leftover, timeout=grace))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def load_app(spec: str, given_as: str = "app") -> Callable[..., Any]:
    """Import an app given as ``module:attribute`` (the attribute may be dotted).

    Args:
        spec: ``module:attribute``.
        given_as: how the messages name it: ``--app``, ``ROTA_APP`` (where the user
            gave it), or ``app``.

    Returns:
        The callable named (``build(queue) -> Pipeline | factory``).

    Raises:
        CliConfigError: the spec is malformed, the module or attribute is missing, or
            the attribute is not callable.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name.strip() or not attr.strip():
        raise CliConfigError(f"{given_as} {spec!r} must look like module:attribute "
                             "(for example myapp.jobs:build_pipeline)")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise CliConfigError(
            f"cannot import app module {module_name!r}: {first_line(exc)}") from None
    except Exception as exc:  # a SyntaxError, or the module raised while importing
        raise CliConfigError(f"cannot import app module {module_name!r}: "
                             f"{first_line(exc, with_type=True)}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CliConfigError(f"app module {module_name!r} has no attribute {attr!r}") from None
        except Exception as exc:  # a module-level __getattr__ that raised
            raise CliConfigError(
                f"{given_as} {spec!r}: {first_line(exc, with_type=True)}") from None
    if inspect.isclass(obj):
        raise CliConfigError(f"{given_as} {spec!r} is a class: it must be a function that takes a "
                             "Queue and returns the pipeline")
    if not callable(obj):
        raise CliConfigError(f"{given_as} {spec!r} is not callable: it must take a Queue "
                             "and return the pipeline")
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):  # no signature to check (some builtins)
        return obj  # type: ignore[no-any-return]
    try:
        signature.bind(object())
    except TypeError:
        raise CliConfigError(f"{given_as} {spec!r} must take one argument, the Queue; its "
                             f"signature is {signature}") from None
    return obj  # type: ignore[no-any-return]


def app_error(target: Target, exc: Exception) -> CliConfigError:
    """The one-line error for an app (or its factory) that raised."""
    return CliConfigError(f"{target.app_given_as} {target.app_spec!r} failed: "
                          f"{first_line(exc, with_type=True)}")


@dataclass
class Target:
    """What a command works on: the database URL, schema and app, from flags or env."""

    database_url: str | None
    schema: str | None
    app_spec: str | None
    _app: Callable[..., Any] | None = field(default=None, repr=False)
    fair_by: str | None = None  # --fair-by / ROTA_FAIR_BY, over the app's setting
    #: ``--listen-url`` (``rota worker``); else ``ROTA_LISTEN_URL``.
    listen_url: str | None = field(default=None, repr=False)
    #: How messages name the app: ``--app`` or ``ROTA_APP``, as the user gave it.
    app_given_as: str = "app"

    @property
    def app(self) -> Callable[..., Any] | None:
        if self._app is None and self.app_spec:
            self._app = load_app(self.app_spec, self.app_given_as)
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
        """The app's ``queue_settings`` with the schema and ``--fair-by`` from the flags
        applied, checked as :class:`rota.Queue` checks them.

        Raises:
            CliConfigError: ``queue_settings`` raised, is not a mapping, has a key that
                is not a :class:`rota.Queue` setting, or a value the queue refuses; the
                message names the app as the source (``--app 'myapp:build':
                queue_settings: stale_after must be positive, got -5 seconds``).
            InvalidInput: the schema given by ``--schema`` or ``ROTA_SCHEMA`` is not a
                valid identifier (the CLI names the option as the user gave it).
        """
        raw: Any = getattr(self.app, "queue_settings", None) if self.app else None
        source = f"{self.app_given_as} {self.app_spec!r}"
        if callable(raw):
            try:
                raw = raw()
            except Exception as exc:
                raise CliConfigError(
                    f"{source}: queue_settings() failed: "
                    f"{first_line(exc, with_type=True)}") from None
        if raw is not None and not isinstance(raw, Mapping):
            raise CliConfigError(f"{source}: queue_settings must be a mapping of Queue "
                                 f"settings (a dict), got {shown(raw)}")
        settings = dict(raw or {})
        for key in settings:
            if key not in SETTING_NAMES:
                close = difflib.get_close_matches(str(key), SETTING_NAMES, n=1)
                hint = (f"did you mean {close[0]!r}?" if close else
                        f"the settings are {', '.join(sorted(SETTING_NAMES))}")
                raise CliConfigError(f"{source}: queue_settings has unknown key {key!r} "
                                     f"({hint})")
        settings["schema"] = self.schema or settings.get("schema") or "rota"
        if self.fair_by is not None:
            settings["fair_by"] = self.fair_by
        if raw is not None:
            try:
                QueueSettings(**settings)
            except InvalidInput as exc:
                if exc.argument == "schema" and self.schema:
                    raise  # the flag's, checked first: said as the user gave it
                raise CliConfigError(f"{source}: queue_settings: {first_line(exc)}") from None
        return settings

    def queue_kwargs(self) -> dict[str, Any]:
        """:meth:`queue_settings` with how the queue connects: ``pooled`` from
        ``ROTA_POOLED`` (:func:`pooled_from_env`) and ``listen_url`` from
        ``ROTA_LISTEN_URL`` (or ``--listen-url``: :attr:`listen_url`).

        Raises:
            CliConfigError: a bad ``queue_settings`` or ``ROTA_POOLED``.
        """
        listen_url = self.listen_url or os.environ.get("ROTA_LISTEN_URL") or None
        return {**self.queue_settings(), "pooled": pooled_from_env(),
                "listen_url": None if listen_url is None else db.check_conninfo(listen_url)}

    def settings(self) -> QueueSettings:
        """Queue settings without a connection (plans, groups relation, SQL)."""
        return QueueSettings(**self.queue_settings())

    def plans(self) -> Plans:
        plans = self.queue_settings().get("plans", DEFAULT_PLANS)
        return plans if isinstance(plans, Plans) else DEFAULT_PLANS


_POOLED_VALUES = {"1": True, "true": True, "yes": True, "on": True,
                  "0": False, "false": False, "no": False, "off": False,
                  "auto": None, "": None}


def pooled_from_env() -> bool | None:
    """``ROTA_POOLED``: ``1`` (``true``, ``yes``, ``on``) when ``DATABASE_URL`` goes
    through a connection pooler, ``0`` (``false``, ``no``, ``off``) when it does not,
    unset or ``auto`` to find out at the first connection (docs/operations.md, "Poolers
    and failover").

    Raises:
        CliConfigError: any other value.
    """
    raw = os.environ.get("ROTA_POOLED", "")
    value = raw.strip().lower()
    if value not in _POOLED_VALUES:
        raise CliConfigError(f"ROTA_POOLED must be 1, 0 or auto, got {raw!r}")
    return _POOLED_VALUES[value]


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
    kwargs = target.queue_kwargs()  # bad settings first: they need no database
    await preflight(url)
    queue = Queue(url, **kwargs)
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
        if is_database_error(exc):
            raise
        raise app_error(target, exc) from None
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
        if is_database_error(exc):
            raise
        raise app_error(target, exc) from None


def resolve_budget(pipeline: Any, budget: float | None) -> float:
    """The ``--budget`` in seconds, checked (:func:`check_budget`), or when it is
    ``None`` the app's default: 11/15 of its platform timeout (220 s of 300 s:
    :func:`rota.settings.default_time_budget`)."""
    if budget is None:
        timeout = getattr(pipeline, "platform_timeout", DEFAULT_PLATFORM_TIMEOUT)
        return default_time_budget(timeout).total_seconds()
    check_budget(pipeline, budget)
    return budget


def check_budget(pipeline: Any, budget: float) -> None:
    """Refuse a ``--budget`` (seconds) that is not below the pipeline's platform timeout,
    before any run: the runner would refuse every run (and a worker would retry forever).

    Raises:
        CliConfigError: ``budget`` is not shorter than ``pipeline.platform_timeout``.
    """
    try:
        check_time_budget(pipeline, timedelta(seconds=budget))
    except ConfigError:
        timeout = pipeline.platform_timeout.total_seconds()
        raise CliConfigError(
            f"--budget {budget:g}s must be shorter than the app's platform timeout "
            f"({timeout:g}s): the time between them is for finishing the jobs in flight"
        ) from None


async def check_listen_url(queue: Queue) -> None:
    """Refuse a ``listen_url`` that notifications sent on the queue's database do not
    reach (another database, a transaction pooler), before the worker starts
    (:func:`rota.worker.probe`).

    Raises:
        CliConfigError: one line saying why.
        ConfigError: ``listen_url`` goes through a pooler that refuses startup options.
        DatabaseRefused, psycopg.OperationalError: it refused the connection, or cannot
            be reached.
    """
    from ..worker import probe

    conn = await queue.listener()
    assert conn is not None  # listen_url is set
    try:
        problem = await probe(queue, conn)
    finally:
        await conn.close()
    if problem is not None:
        raise CliConfigError(problem)


async def require_migrated(queue: Queue, conn: AnyConn | None = None) -> None:
    """Refuse to start a long-running mode on a schema that ``rota migrate`` has not
    brought up to date (it would otherwise retry its failing queries forever).

    Raises:
        CliConfigError: migrations are missing (the missing-tables error, translated by
            the CLI, when there are none at all).
    """
    missing = await admin.missing_migrations(queue, conn=conn)
    if missing:
        raise CliConfigError(f"schema {queue.schema!r} lacks migrations {missing}: "
                             f"run `rota migrate{same_queue()}`")
