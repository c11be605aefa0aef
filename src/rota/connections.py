"""How the queue's own pool connects: directly to PostgreSQL or through a connection
pooler (PgBouncer, a managed platform's "pooled" URL), and where its one LISTEN
connection goes (docs/operations.md, "Poolers and failover").

Directly, rota's server settings ride on each connection's startup ``options``
(:func:`rota.db.with_connection_defaults`). Behind a pooler (``Queue(pooled=True)``, or
found at the first connection) nothing may outlive a transaction: a transaction pooler
hands each transaction to whichever server connection is free. So no ``options`` are
sent (PgBouncer refuses them: "unsupported startup parameter: options"), the settings
are applied per transaction ahead of each statement in the same pipeline
(:func:`rota.store.set_prelude`), and nothing is prepared on the server
(``prepare_threshold=None``: a prepared statement lives on one server connection). rota
holds no other session state: its advisory locks are transaction-scoped, it makes no
temporary table and runs no session ``SET``. LISTEN is the exception, and goes to
``listen_url`` when given (a direct connection); the worker checks at start that
notifications arrive (:mod:`rota.worker`).

The first connection, made before the pool opens, also reports at once a server or
pooler that refuses the connection for good (:func:`rota.db.refusal`), instead of the
pool's 30 s wait; only a database that does not answer is waited for.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from . import db
from .errors import ConfigError, DatabaseRefused, InvalidInput, first_line
from .redact import redact
from .store import AnyConn, configure_connection, listen_connect_args, set_prelude

log = logging.getLogger("rota.connections")

#: What PgBouncer answers a startup ``options`` with (and other poolers like it).
_OPTIONS_REFUSED = "unsupported startup parameter: options"


class ConnectionSetup:
    """The connection string of a queue's own pool and whether it goes through a pooler.

    Args:
        conninfo: the URL or conninfo string as given (checked by
            :func:`rota.db.check_conninfo`).
        pooled: ``True``: behind a connection pooler; ``False``: directly to the server;
            ``None``: found at the first connection (a pooler that refuses ``options``,
            or whose connection's backend process id is not the server's).
        listen_url: a direct connection to the same database for the worker's LISTEN
            and :meth:`rota.Queue.wait` (``None``: the pool's string).

    Raises:
        DatabaseUnavailable: a malformed string (password redacted).
        InvalidInput: ``pooled`` is not a bool or ``None``.
    """

    def __init__(self, conninfo: str, *, pooled: bool | None = None,
                 listen_url: str | None = None) -> None:
        if pooled is not None and not isinstance(pooled, bool):
            raise InvalidInput(f"pooled must be True, False or None, got {pooled!r}")
        self.url = db.check_conninfo(conninfo)
        self.listen_url = None if listen_url is None else db.check_conninfo(listen_url)
        #: Whether the pool goes through a pooler (``None``: not known yet).
        self.pooled: bool | None = None
        #: How that was decided: ``"setting"`` or what the first connection showed.
        self.found_by = "setting"
        self.conninfo = db.with_connection_defaults(conninfo)
        self._prelude: sql.Composed | None = None
        #: The check of each host of a multi-host URL (and of a multi-host
        #: ``listen_url``), started by the first connection: the warnings it logged.
        self.hosts_check: asyncio.Future[list[str]] | None = None
        if pooled is not None:
            self._decide(pooled, "setting")

    def _decide(self, pooled: bool, found_by: str) -> None:
        self.pooled, self.found_by = pooled, found_by
        if pooled:
            self.conninfo, settings = db.pooled_connection(self.url)
            self._prelude = db.transaction_settings(settings)
        else:
            self.conninfo = db.with_connection_defaults(self.url)
            self._prelude = None

    def kwargs(self) -> dict[str, Any]:
        """The pool's connection arguments: autocommit, and behind a pooler no
        server-side prepared statements."""
        if self.pooled:
            return {"autocommit": True, "prepare_threshold": None}
        return {"autocommit": True}

    async def configure(self, conn: AnyConn) -> None:
        """The pool's ``configure`` callback: rota's cursor setup
        (:func:`rota.store.configure_connection`) and, behind a pooler, the settings
        statement ahead of each statement."""
        await configure_connection(conn)
        if self._prelude is not None:
            set_prelude(conn, self._prelude)

    async def first_connection(self) -> None:
        """Connect once before the pool opens: report a refusal at once, find out
        whether a pooler is in between (when ``pooled`` is ``None``), and refuse a
        pooler in statement mode.

        A server that does not answer is left to the pool, which waits for it (its
        ``open`` timeout).

        With a multi-host URL (or ``listen_url``), each host is then tried on its own
        in the background, and each that cannot be connected to is logged as one
        warning.

        Raises:
            DatabaseRefused: the server or pooler refused the connection with a FATAL
                error no retry mends (one line naming it, within the connection's
                round trips).
            ConfigError: a pooler in statement mode (rota needs transactions).
        """
        try:
            conn = await psycopg.AsyncConnection.connect(self.conninfo, **self.kwargs())
        except psycopg.OperationalError as exc:
            cause = db.refusal(exc)
            if cause is None:
                return  # nothing answered: the pool waits for it
            if self.pooled is None and _OPTIONS_REFUSED in cause:
                self._decide(True, "the server refused startup options")
                log.info("a connection pooler refused rota's startup options: applying "
                         "rota's settings per transaction (pooled=True)")
                return await self.first_connection()
            raise DatabaseRefused(self._refused(cause)) from None
        # In the background: a host that does not answer takes 10 s. listen_url's too:
        # the worker's wake-ups fail over with it.
        urls = [(self.conninfo, "the database URL")]
        if self.listen_url is not None:
            urls.append((db.with_connection_defaults(self.listen_url), "listen_url"))
        multi = [(url, what, hosts) for url, what in urls if len(hosts := _hosts(url)) > 1]
        if multi:
            self.hosts_check = asyncio.ensure_future(_check_urls(multi))
        try:
            if self.pooled is None:
                cur = await conn.execute("SELECT pg_backend_pid()")
                row = await cur.fetchone()
                behind = row is not None and row[0] != conn.info.backend_pid
                self._decide(behind, "the backend process id differs" if behind
                             else "the backend process id matches")
                if behind:
                    log.info("a connection pooler is in between (its backend process id "
                             "is not the server's): applying rota's settings per "
                             "transaction (pooled=True)")
            if self.pooled:
                await _check_transactions(conn)
        finally:
            await conn.close()

    def _refused(self, cause: str) -> str:
        hint = ""
        if _OPTIONS_REFUSED in cause:
            hint = (" (a connection pooler: rota sends its settings as startup options "
                    "unless pooled=True, ROTA_POOLED=1)")
        return f"the database refused the connection: {cause}{hint}"

    def listen_args(self, pool_conninfo: str, pool_kwargs: dict[str, Any]
                    ) -> tuple[str, dict[str, Any]]:
        """The connection string and arguments of a LISTEN connection: ``listen_url``
        with rota's connection defaults when given, else the pool's; autocommit."""
        if self.listen_url is not None:
            return db.with_connection_defaults(self.listen_url), {"autocommit": True}
        return pool_conninfo, {**pool_kwargs, "autocommit": True}

    async def listen_target(self, pool: AsyncConnectionPool[Any], *,
                            through_pooler: bool = False
                            ) -> tuple[str, dict[str, Any]] | None:
        """Where a LISTEN connection goes (the worker's wake-ups, ``Queue.wait``):
        ``listen_url`` when given, else the connection string of ``pool``, an open pool;
        autocommit (docs/operations.md, "Poolers and failover").

        Args:
            pool: the queue's pool (its string and arguments are read from it).
            through_pooler: also when the pool goes through a connection pooler and no
                ``listen_url`` is given (the worker, which then checks that
                notifications arrive).

        Returns:
            ``(conninfo, kwargs)``, or ``None``: the pool goes through a pooler, no
            ``listen_url`` is given and ``through_pooler`` is false (poll instead).
        """
        if self.listen_url is None and self.pooled and not through_pooler:
            return None
        conninfo, kwargs = await listen_connect_args(pool)
        return self.listen_args(conninfo, kwargs)

    async def listener(self, pool: AsyncConnectionPool[Any], *,
                       through_pooler: bool = False) -> psycopg.AsyncConnection[Any] | None:
        """A new autocommit connection for LISTEN, where :meth:`listen_target` says
        (``None`` when it says to poll); the caller closes it.

        Raises:
            ConfigError: ``listen_url`` refused rota's startup options: it goes through
                a connection pooler (LISTEN needs the server itself).
            DatabaseRefused: ``listen_url`` refused the connection otherwise.
            psycopg.OperationalError: it could not be reached (or the pool's string,
                without ``listen_url``, refused it).
        """
        target = await self.listen_target(pool, through_pooler=through_pooler)
        if target is None:
            return None
        try:
            return await psycopg.AsyncConnection.connect(target[0], **target[1])
        except psycopg.OperationalError as exc:
            cause = db.refusal(exc)
            if cause is None or self.listen_url is None:
                raise  # the pool's own string: as any of its connections
            if "startup parameter" in cause:
                raise ConfigError(
                    f"listen_url goes through a connection pooler ({cause}): point it at "
                    "the server itself") from None
            raise DatabaseRefused(
                f"listen_url: the database refused the connection: {cause}") from None


def _hosts(conninfo: str) -> list[tuple[str, str]]:
    """The (host, port) pairs of a multi-host connection string, in order (one pair for
    a single host; libpq's rule: one port for all hosts, or one per host)."""
    params = psycopg.conninfo.conninfo_to_dict(conninfo)
    hosts = str(params.get("host") or params.get("hostaddr") or "").split(",")
    ports = str(params.get("port") or "").split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    return list(zip(hosts, ports, strict=False))


async def _check_urls(urls: list[tuple[str, str, list[tuple[str, str]]]]) -> list[str]:
    """:func:`_check_hosts` of each multi-host string, ``(conninfo, what, hosts)``, at
    once; every warning logged, in the order of ``urls``."""
    found = await asyncio.gather(*(_check_hosts(url, hosts, what)
                                   for url, what, hosts in urls))
    return [problem for problems in found for problem in problems]


async def _check_hosts(conninfo: str, hosts: list[tuple[str, str]],
                       what: str = "the database URL") -> list[str]:
    """Try each host of a multi-host connection string on its own (any role: a standby
    is fine) and log one warning per host that cannot be connected to, since a
    failover to it would fail (docs/operations.md, "Poolers and failover").

    Args:
        conninfo: the connection string.
        hosts: its (host, port) pairs (:func:`_hosts`).
        what: how the warning names the string (``the database URL``, ``listen_url``).

    Returns:
        The warnings logged.
    """
    async def one(i: int, host: str, port: str) -> str | None:
        kwargs: dict[str, Any] = {"host": host, "target_session_attrs": "any"}
        if port:
            kwargs["port"] = port
        kwargs.pop("hostaddr", None)
        try:
            conn = await psycopg.AsyncConnection.connect(
                psycopg.conninfo.make_conninfo(conninfo, hostaddr="", **kwargs))
        except psycopg.Error as exc:
            why = db.refusal(exc) or first_line(exc).rsplit("failed: ", 1)[-1]
            return (f"host {i} of {len(hosts)} of {what} ({host}:{port}) cannot "
                    f"be connected to: {why}; a failover to it would fail")
        await conn.close()
        return None

    found = await asyncio.gather(*(one(i, h, p) for i, (h, p) in enumerate(hosts, 1)))
    problems = [f for f in found if f is not None]
    for problem in problems:
        log.warning("%s", problem)
    return problems


async def _check_transactions(conn: AnyConn) -> None:
    """Refuse a pooler in statement mode, which refuses transaction blocks.

    Raises:
        ConfigError: one line naming the pooler's answer.
    """
    try:
        async with conn.transaction():
            await conn.execute("SELECT 1")
    except psycopg.Error as exc:
        text = first_line(exc)
        if "statement pooling" in text:
            raise ConfigError(
                f"the connection pooler refuses transactions ({redact(text)}): rota "
                "needs transaction or session pooling (PgBouncer: pool_mode = "
                "transaction)") from None
        raise


__all__ = ["ConnectionSetup"]
