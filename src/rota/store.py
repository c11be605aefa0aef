"""The one data-access seam: every statement rota runs goes through a :class:`Store`.

A statement is a file ``rota/sql/NAME.sql``, or ``rota/fair/NAME.sql`` for the fair
claim's (named ``fair/NAME``) (one statement each, parameterized, ``{schema}`` and
``{groups}`` filled in with validated, quoted identifiers). The store
holds the queue's identifiers and its connection pool, and runs statements by name on
a pooled connection or on the caller's (``conn=``, inside the caller's transaction).
The queue, the claim, the runner, quotas, maintenance, the worker, the admin
operations and the web apps all call it; none of them holds SQL text
(docs/design.md, "Where things live").

Every cursor the store opens is set up by :func:`configure_cursor`, the one place that
decides how values cross the wire, so no call site can forget it:

- a ``timedelta`` is sent as an exact number of seconds (never days or months, which
  PostgreSQL adds by the calendar of the session's time zone: ``interval '1 day'`` is
  25 hours on the day a DST change ends) (docs/design.md, "Time");
- a ``timestamptz`` comes back in UTC whatever the session's TimeZone, so Python's
  arithmetic on it is absolute too (on a Europe/Berlin datetime Python adds by the
  wall clock);
- a ``jsonb`` or ``timestamptz`` value that cannot be loaded into Python (a payload
  nested deeper than the decoder goes, a year past 9999) becomes an
  :class:`~rota.job.Unreadable` in its place instead of failing the whole statement,
  so one bad row is named, not fatal (docs/design.md, "Bad data belongs to its job").

The single enqueue, the hot path, keeps one such cursor per connection of the queue's
own pool (:meth:`Store.hot_cursor`), so psycopg keeps what it learnt about the
statement's parameters and columns from one call to the next.

Behind a connection pooler (``Queue(pooled=...)``), rota's server settings
(:data:`rota.db.TRANSACTION_DEFAULTS`) cannot ride on the connection's startup: every
statement the store runs on a connection of the queue's own pool is preceded, in the
same pipeline, by the statement that sets them for its transaction only (no round trip
of its own; docs/operations.md, "Poolers and failover").

Every statement also has a deadline on the client's side (:data:`STATEMENT_DEADLINE`,
or a shorter one its caller passes): a server that stopped answering while the
connection stays open (a frozen server, a hung proxy or pooler: TCP stays up, so
keepalives and ``tcp_user_timeout`` never fire) would otherwise hold the caller
forever. At the deadline the statement is cancelled, its connection discarded, the
pool's idle connections replaced (they most likely go over the same silent link), and
:class:`StatementDeadline` raised (docs/operations.md, "Network partitions and
timeouts").

One piece (about 750 lines): how a value crosses the wire, how a statement is composed
and named, on which connection it runs and with which deadline, and what a missing
schema's error says are one seam's rules, which every statement meets together; split,
a statement could be run by a path that skips one of them. The statements themselves
are :mod:`rota.statements`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import re
import select
import struct
import weakref
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta, tzinfo
from functools import cache
from typing import Any, NamedTuple, TypeVar

import psycopg
from psycopg.abc import AdaptContext, Buffer
from psycopg.adapt import Dumper, Loader
from psycopg.pq import Format
from psycopg.rows import AsyncRowFactory, dict_row, tuple_row
from psycopg.sql import Composed, Identifier
from psycopg.types.json import JsonbLoader, JsonLoader
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from . import db
from .errors import ConfigError, first_line
from .job import Unreadable

AnyConn = psycopg.AsyncConnection[Any]
Params = Mapping[str, Any]
Row = TypeVar("Row")

log = logging.getLogger("rota.store")

#: A statement's client-side deadline unless its caller passes a shorter one: the
#: server's own ``statement_timeout`` (5 min, :data:`rota.db.SESSION_DEFAULTS`) and 15 s,
#: so a live server always answers first, with its own error.
STATEMENT_DEADLINE = timedelta(minutes=5, seconds=15)

_INTERVAL_OID = psycopg.postgres.types["interval"].oid
_TIMESTAMPTZ_OID = psycopg.postgres.types["timestamptz"].oid
_MICROSECOND = timedelta(microseconds=1)


class SecondsDumper(Dumper):
    """Sends a ``timedelta`` as an interval of seconds only (text format):
    ``timedelta(days=1)`` is ``86400.000000 seconds``, 24 hours in every time zone,
    where psycopg's default sends ``1 day``, which PostgreSQL adds by the calendar."""

    oid = _INTERVAL_OID

    def dump(self, obj: timedelta) -> Buffer:
        micros = obj // _MICROSECOND
        sign = "-" if micros < 0 else ""
        whole, fraction = divmod(abs(micros), 1_000_000)
        return f"{sign}{whole}.{fraction:06d} seconds".encode()


class SecondsBinaryDumper(Dumper):
    """The binary form of :class:`SecondsDumper`: microseconds, zero days, zero months."""

    oid = _INTERVAL_OID
    format = Format.BINARY

    def dump(self, obj: timedelta) -> Buffer:
        return struct.pack("!qii", obj // _MICROSECOND, 0, 0)


def _load_json(data: str | bytes) -> Any:
    """``json.loads``, or an :class:`Unreadable` for text Python cannot load (nested
    past the recursion limit, a number past the int conversion limit)."""
    try:
        return json.loads(data)
    except (RecursionError, ValueError) as exc:
        return Unreadable(first_line(exc, with_type=True),
                          _start(data))


def _start(data: str | bytes | Buffer) -> str:
    """The first 80 characters of a stored value, for naming it."""
    text = data if isinstance(data, str) else bytes(data[:320]).decode("utf-8", "replace")
    return text[:80]


class _PayloadJsonLoader(JsonLoader):
    _loads = staticmethod(_load_json)


class _PayloadJsonbLoader(JsonbLoader):
    _loads = staticmethod(_load_json)


class _GuardedLoader(Loader):
    """Wraps a timestamptz loader (``base``): a value it cannot load (psycopg's
    ``DataError`` for a timestamp after year 9999) becomes an :class:`Unreadable`, and
    with ``to_utc`` a loaded value is turned to UTC."""

    base: type[Loader]
    to_utc: bool

    def __init__(self, oid: int, context: AdaptContext | None = None):
        super().__init__(oid, context)
        self._load = self.base(oid, context).load

    def load(self, data: Buffer) -> Any:
        try:
            value = self._load(data)
        except (psycopg.DataError, ValueError, OverflowError) as exc:
            return Unreadable(first_line(exc, with_type=True), _start(data))
        if self.to_utc and isinstance(value, datetime):
            try:
                return value.astimezone(UTC)
            except OverflowError as exc:  # a day from the end of Python's calendar
                return Unreadable(first_line(exc, with_type=True), _start(data))
        return value


@cache
def _guarded(base: type[Loader], to_utc: bool) -> type[Loader]:
    return type(f"Guarded{base.__name__}", (_GuardedLoader,),
                {"base": base, "to_utc": to_utc})


# The sessions' TimeZone settings seen, and whether each adds like UTC.
_UTC_ZONES: dict[bytes, bool] = {}


def _is_utc(zone: tzinfo) -> bool:
    """Whether datetimes in ``zone`` add like UTC ones (no offset, ever)."""
    return all(zone.utcoffset(datetime(2000, month, 1)) == timedelta(0)
               for month in (1, 7))


# What a schema that was never migrated, or a groups relation that does not exist,
# raises: Statements.note_missing says what to do about it.
MISSING = (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedFunction,
            psycopg.errors.InvalidSchemaName)


# Connections of rota's own pools, set up once when made (configure_connection): their
# cursors inherit the setup instead of paying for it (about 40 µs a cursor).
_CONFIGURED: weakref.WeakSet[Any] = weakref.WeakSet()


# Connections of rota's own pools behind a connection pooler, and the statement that
# sets rota's server settings for the transaction (rota.db.transaction_settings).
_PRELUDES: weakref.WeakKeyDictionary[Any, Composed] = weakref.WeakKeyDictionary()


def set_prelude(conn: AnyConn, statement: Composed) -> None:
    """Have the store run ``statement`` ahead of each of its statements on ``conn``, in
    the same pipeline (a connection of the queue's own pool behind a pooler)."""
    _PRELUDES[conn] = statement


def prelude(conn: AnyConn) -> Composed | None:
    """The statement that goes ahead of each statement on ``conn`` (see
    :func:`set_prelude`), or ``None``."""
    return _PRELUDES.get(conn)


def _register(adapters: Any) -> None:
    adapters.register_dumper(timedelta, SecondsDumper)
    adapters.register_dumper(timedelta, SecondsBinaryDumper)
    adapters.register_loader("json", _PayloadJsonLoader)
    adapters.register_loader("jsonb", _PayloadJsonbLoader)


async def configure_connection(conn: AnyConn) -> None:
    """Set up a connection of rota's own pool (its ``configure`` callback) the way
    :func:`configure_cursor` sets up each cursor, once for all its cursors. A caller's
    connections are never changed: their cursors are set up one by one."""
    _register(conn.adapters)
    _CONFIGURED.add(conn)


def configure_cursor(cursor: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any], *,
                     guard_times: bool = True) -> None:
    """Set up a cursor the way every rota statement runs (see the module's docstring):
    timedeltas sent as exact seconds, timestamptz values loaded in UTC, and json/jsonb
    (and, with ``guard_times``, timestamptz) values that cannot be loaded turned into
    :class:`Unreadable`. Only the cursor is changed, never its connection.

    Args:
        cursor: a sync or async psycopg cursor (its adapters are its own copy).
        guard_times: also guard timestamptz loading (about 0.25 µs a value; the claim's
            hot path does without in a UTC session, and retries with it when a value
            fails).

    Raises:
        ConfigError: the connection's DateStyle is not ISO (psycopg reads times only
            as ISO text), on a caller's connection or one whose URL sets it: nothing
            has been sent.
    """
    conn = cursor.connection
    style = conn.pgconn.parameter_status(b"DateStyle") or b"ISO"
    if not style.startswith(b"ISO") and conn not in _PRELUDES:
        # psycopg reads times only as ISO text: the statement would run (and commit)
        # and its rows then fail to load. Said before anything is sent instead. (Behind
        # a pooler rota's own connections set DateStyle in each transaction, ahead of
        # the statement.)
        raise ConfigError(
            f"the connection's DateStyle is {style.decode(errors='replace')!r}, and rota "
            "reads times only as ISO: run SET DateStyle TO ISO on it (or remove the "
            "setting that changes it: the URL's options, the role's or the database's "
            "DateStyle)")
    adapters = cursor.adapters
    if conn not in _CONFIGURED:
        _register(adapters)
    zone = conn.pgconn.parameter_status(b"TimeZone") or b"UTC"
    utc = _UTC_ZONES.get(zone)
    if utc is None:
        utc = _UTC_ZONES[zone] = _is_utc(conn.info.timezone)
    to_utc = not utc
    if guard_times or to_utc:
        base = adapters.get_loader(_TIMESTAMPTZ_OID, Format.TEXT)
        if base is not None and not issubclass(base, _GuardedLoader):
            adapters.register_loader(_TIMESTAMPTZ_OID, _guarded(base, to_utc))


def is_connection_failure(exc: BaseException) -> bool:
    """Whether a database error means no connection could be had or it was lost (the
    server went away, a pool timeout), as opposed to the database refusing a statement
    (a value too large for an index is an ``OperationalError`` in psycopg too). A
    statement that met a connection failure may or may not have committed. A server
    turned read-only (``ReadOnlySqlTransaction``, SQLSTATE 25006) is not one: the
    statement was refused, and :meth:`Store.connection` replaces the connections."""
    if isinstance(exc, PoolTimeout):
        return True
    if not isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in _CONNECTION_SQLSTATES


#: SQLSTATEs (besides class 08, "connection exception") that mean the server went away
#: or would not take the connection: shutdown, crash, starting up, too many connections.
_CONNECTION_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "53300"})


class StatementDeadline(psycopg.OperationalError):
    """A statement got no answer within its client-side deadline: it was cancelled and
    its connection discarded. A connection failure (:func:`is_connection_failure`):
    the statement may or may not have committed."""


async def listen_connect_args(pool: AsyncConnectionPool[Any]) -> tuple[str, dict[str, Any]]:
    """A pool's conninfo and connection arguments (either may be given to the pool as a
    callable, sync or async), with autocommit on: for a LISTENing connection of its own
    beside the pool (the worker's wake-ups, :func:`rota.results.wait`)."""
    conninfo: Any = pool.conninfo
    kwargs: Any = pool.kwargs
    if callable(conninfo):
        conninfo = conninfo()
        if inspect.isawaitable(conninfo):
            conninfo = await conninfo
    if callable(kwargs):
        kwargs = kwargs()
        if inspect.isawaitable(kwargs):
            kwargs = await kwargs
    return str(conninfo), {**(kwargs or {}), "autocommit": True}


class RawStatement(NamedTuple):
    """A statement in PostgreSQL's own placeholders: ``text`` with ``$1``, ``$2``, … in
    place of ``%(name)s``, and ``names``, the parameter each stands for, in order."""

    text: str
    names: tuple[str, ...]

    @classmethod
    def of(cls, composed: Composed) -> RawStatement:
        """Convert a composed statement (``%(name)s`` placeholders, ``%%`` for a percent
        sign, as psycopg reads them)."""
        names: list[str] = []

        def number(m: re.Match[str]) -> str:
            if m.group(0) == "%%":
                return "%"
            if m.group(1) not in names:
                names.append(m.group(1))
            return f"${names.index(m.group(1)) + 1}"

        return cls(_PLACEHOLDER.sub(number, composed.as_string(None)), tuple(names))

    def params(self, values: Mapping[str, Any]) -> list[Any]:
        """The values in placeholder order.

        Raises:
            KeyError: a placeholder's value is missing.
        """
        return [values[n] for n in self.names]


_PLACEHOLDER = re.compile(r"%%|%\((\w+)\)s")


class Statements:
    """The named statements of one queue: its schema and its groups relation.

    Args:
        schema: the schema holding rota's tables (validated by :func:`rota.db.identifier`).
        groups: ``None`` for rota's own ``SCHEMA.groups``, or an application's table or
            view (``"app.campaign_groups"``), validated the same way.

    Raises:
        InvalidInput: a name is not a valid identifier.
    """

    def __init__(self, schema: str, groups: str | None = None) -> None:
        self.schema = schema
        self.schema_ident = db.identifier(schema, "schema")
        self.groups = groups  # as given: None for rota's own table
        self.groups_ident = (
            db.identifier(groups, "groups relation", qualified=True) if groups is not None
            else Identifier(schema, "groups"))
        self.external_groups = groups is not None
        # Rota's own groups table has the groups' own caps (groups.max_running;
        # docs/design.md, "Caps"): these placeholders read them wherever a statement has
        # one. An application's relation has none: the files of the same names say so.
        self._own_fragments = {} if self.external_groups else {
            "group_cap": "fair/group_cap_on", "cap_prelude_group": "fair/cap_prelude_group_on"}
        self._composed: dict[tuple[str, tuple[tuple[str, str], ...]], Composed] = {}
        self._raw: dict[tuple[str, tuple[tuple[str, str], ...]], RawStatement] = {}

    def missing_note(self, exc: BaseException) -> str | None:
        """What :meth:`note_missing` would add to ``exc``: the note when ``exc`` is a
        :data:`MISSING` error about this queue's schema or groups relation, else
        ``None``."""
        if not isinstance(exc, MISSING):
            return None
        said = str(exc).split("\n", 1)[0]
        schema, groups = self.schema, self.groups
        # What PostgreSQL prints: relation "s.t" / "t", function s.f(…), schema "s".
        missing_schema = re.fullmatch(r'schema "(.*)" does not exist', said)
        if missing_schema is not None:
            about_groups = (groups is not None and "." in groups
                            and missing_schema.group(1) == groups.rsplit(".", 1)[0]
                            and missing_schema.group(1) != schema)
            about_rota = missing_schema.group(1) == schema
        else:
            about_groups = groups is not None and f'"{groups}"' in said
            about_rota = any(name in said for name in
                             (f'"{schema}.', f" {schema}.", f'"{schema}".'))
        if about_groups:
            return (f"rota: the groups relation {groups!r} the queue was given "
                    "(groups=, Django's OPTIONS['GROUPS']) does not exist: create it "
                    "(README.md, \"Groups from your own tables\"), or leave it unset for "
                    "rota's own table")
        if about_rota:
            return (f"rota: is the schema {schema!r} migrated? `rota migrate --schema "
                    f"{schema}`, `await queue.migrate()` or, with Django, `python "
                    "manage.py migrate` creates and updates rota's tables "
                    "(docs/operations.md, \"Migrations and upgrades\")")
        return None

    def note_missing(self, exc: psycopg.Error) -> None:
        """Add a note to ``exc`` (``exc.__notes__``, printed under its traceback) saying
        what to do, when it is about what this queue needs and is missing: its groups
        relation (``groups=``), or rota's schema or one of its tables or functions
        (``rota migrate``, :meth:`rota.Queue.migrate`, Django's ``migrate``). An
        error about anything else (an application's own table, in a handler's
        connection) gets none. The exception's type and message are kept: the worker
        and the CLI tell these errors apart by type.

        Args:
            exc: an ``UndefinedTable``, ``UndefinedFunction`` or ``InvalidSchemaName``
                (:data:`MISSING`) raised by a statement on this queue's connection.
        """
        note = self.missing_note(exc)
        if note is not None and note not in getattr(exc, "__notes__", ()):
            exc.add_note(note)

    @contextlib.contextmanager
    def noting_missing(self) -> Iterator[None]:
        """Run the block, adding :meth:`note_missing`'s note to a :data:`MISSING` error
        it raises (the synchronous paths: :class:`rota.SyncQueue`)."""
        try:
            yield
        except MISSING as exc:
            self.note_missing(exc)
            raise

    def sql(self, name: str, **fragments: str) -> Composed:
        """The statement ``NAME`` (``rota/sql/NAME.sql``; ``fair/X``: ``rota/fair/X.sql``)
        for this schema and groups relation, each
        ``{key}`` placeholder of ``fragments`` replaced by that named statement (composed
        once per queue and kept); on rota's own groups table the groups' caps are read
        where a statement has a placeholder for them (``group_cap``,
        ``cap_prelude_group``)."""
        key = (name, tuple(sorted(fragments.items())))
        found = self._composed.get(key)
        if found is None:
            found = self._composed[key] = db.statement(
                name, self.schema_ident, self.groups_ident,
                **{**self._own_fragments, **fragments})
        return found

    def raw(self, name: str, **fragments: str) -> RawStatement:
        """:meth:`sql` with its ``%(name)s`` placeholders turned into PostgreSQL's ``$n``
        once, for a statement on the hot path too long for psycopg's cache of converted
        queries (4 KB): psycopg then sends it as it is (``AsyncRawCursor``) instead of
        parsing its text on every call (0.2 ms for the claim's 17 KB)."""
        key = (name, tuple(sorted(fragments.items())))
        found = self._raw.get(key)
        if found is None:
            found = self._raw[key] = RawStatement.of(self.sql(name, **fragments))
        return found

    def table(self, name: str) -> Identifier:
        """A table of this queue's schema, quoted."""
        return Identifier(self.schema, name)


class Store(Statements):
    """Runs the named statements of one queue on its pool or a caller's connection.

    Args:
        pool: the ``AsyncConnectionPool`` statements run on when no ``conn`` is given.
        schema, groups: see :class:`Statements`.
    """

    def __init__(self, pool: AsyncConnectionPool[Any], schema: str,
                 groups: str | None = None) -> None:
        super().__init__(schema, groups)
        self.pool = pool
        # hot_cursor's cursors: (connection, statement, row factory) -> (the session's
        # TimeZone, client encoding and DateStyle, the cursor, the statement's bytes).
        self._hot: dict[tuple[AnyConn, str, Any], tuple[Any, Any, bytes]] = {}

    @asynccontextmanager
    async def connection(self, conn: AnyConn | None = None) -> AsyncIterator[AnyConn]:
        """Yield ``conn`` if given (the caller's transaction decides), else a pooled
        connection (committed when the block exits). A pooled connection whose block
        raised ``ReadOnlySqlTransaction`` (SQLSTATE 25006) is closed and the pool's
        others replaced. A :data:`MISSING` error the block raises about rota's schema or
        the groups relation gets a note (:meth:`Statements.note_missing`)."""
        try:
            if conn is not None:
                yield conn
                return
            async with self.pool.connection() as c:
                try:
                    yield c
                except psycopg.errors.ReadOnlySqlTransaction:
                    # The server turned read-only under open connections (a failover
                    # that keeps sockets open): these connections go to a server that
                    # can no longer write. Closed, the pool drops this one; the others
                    # are replaced, so new connections find the writable server (a
                    # multi-host URL's target_session_attrs=read-write;
                    # docs/operations.md, "Poolers and failover").
                    await c.close()
                    await self.discard_idle()
                    raise
        except MISSING as exc:
            self.note_missing(exc)
            raise

    @asynccontextmanager
    async def deadline(self, seconds: float | None = None) -> AsyncIterator[None]:
        """Bound the statements of the block on the client's side (see the module's
        docstring).

        Args:
            seconds: the deadline; ``None`` for :data:`STATEMENT_DEADLINE`.

        Raises:
            StatementDeadline: the block was still waiting for the database at the
                deadline. Its statement was cancelled (psycopg asks the server to
                cancel it and, when that gets no answer within 5 s either, closes the
                connection, so this comes at most about 10 s after the deadline) and
                the pool's idle connections are being replaced.
        """
        limit = STATEMENT_DEADLINE.total_seconds() if seconds is None else seconds
        timer = asyncio.timeout(limit)
        try:
            async with timer:
                yield
        except TimeoutError:
            if not timer.expired():
                raise
            await self.discard_idle()
            raise StatementDeadline(
                f"the database did not answer within {limit:g} s (client-side deadline): "
                f"the statement was cancelled and its connection discarded") from None

    async def discard_idle(self) -> None:
        """Replace the pool's idle connections, and its busy ones as they come back
        (after a statement met its deadline, the rest most likely share its silent
        link). Closing a connection sends no more than a Terminate message, so this
        never waits on the network."""
        try:
            await self.pool.drain()
        except Exception as exc:  # the pool is closed or closing: nothing to replace
            log.debug("could not drain the pool: %s", first_line(exc, with_type=True))

    @staticmethod
    def cursor(conn: AnyConn, row_factory: AsyncRowFactory[Row], *,
               guard_times: bool = True, raw: bool = False) -> psycopg.AsyncCursor[Row]:
        """A cursor on ``conn`` set up by :func:`configure_cursor`: every statement rota
        runs goes through one (docs/design.md, "Time" and "Bad data belongs to its
        job").

        Args:
            conn: the connection (rota's pooled one, or a caller's: only the cursor is
                set up, never the connection).
            row_factory: psycopg's row factory (``tuple_row``, ``dict_row``).
            guard_times: also turn timestamptz values that cannot be loaded into
                :class:`~rota.job.Unreadable` (for rows of ``jobs``).
            raw: a cursor for :meth:`raw` statements (``$n`` placeholders, a list of
                values), which psycopg sends without parsing them.

        Returns:
            The cursor.
        """
        cur = (psycopg.AsyncRawCursor(conn, row_factory=row_factory) if raw
               else conn.cursor(row_factory=row_factory))
        configure_cursor(cur, guard_times=guard_times)
        return cur

    @staticmethod
    @asynccontextmanager
    async def settings_ahead(conn: AnyConn) -> AsyncIterator[None]:
        """Send the block's statements after ``conn``'s prelude (:func:`set_prelude`) in
        one pipeline, so they run in the transaction it configures and their results
        come back in the one round trip; a plain block when ``conn`` has none."""
        statement = _PRELUDES.get(conn)
        if statement is None:
            yield
            return
        async with conn.pipeline():
            await conn.execute(statement)
            yield

    # Each method below runs its statement within a client-side deadline (taking the
    # pool's connection included): ``deadline`` seconds, or STATEMENT_DEADLINE; it
    # raises StatementDeadline at it (see :meth:`deadline`).

    async def execute(self, name: str, params: Params, *, conn: AnyConn | None = None,
                      prepare: bool | None = None, deadline: float | None = None) -> int:
        """Run the statement; return its row count (rows written, or -1)."""
        async with self.deadline(deadline), self.connection(conn) as c:
            cur = self.cursor(c, tuple_row, guard_times=False)
            async with self.settings_ahead(c):
                await cur.execute(self.sql(name), params, prepare=prepare)
            return cur.rowcount

    async def fetch_one(self, name: str, params: Params, *, conn: AnyConn | None = None,
                        deadline: float | None = None) -> tuple[Any, ...] | None:
        """Run the statement; return its first row as a tuple, or ``None`` (for
        statements whose times are the clock's: see :meth:`fetch_dicts` for rows)."""
        async with self.deadline(deadline), self.connection(conn) as c:
            cur = self.cursor(c, tuple_row, guard_times=False)
            async with self.settings_ahead(c):
                await cur.execute(self.sql(name), params)
            return await cur.fetchone()

    async def fetch_all(self, name: str, params: Params, *, conn: AnyConn | None = None,
                        deadline: float | None = None) -> list[tuple[Any, ...]]:
        """Run the statement; return every row as a tuple (ids, statuses, counts)."""
        async with self.deadline(deadline), self.connection(conn) as c:
            cur = self.cursor(c, tuple_row, guard_times=False)
            async with self.settings_ahead(c):
                await cur.execute(self.sql(name), params)
            return await cur.fetchall()

    async def fetch_dicts(self, name: str, params: Params, *, conn: AnyConn | None = None,
                          deadline: float | None = None) -> list[dict[str, Any]]:
        """Run the statement; return every row as a dict keyed by column name (a value
        that could not be loaded is an :class:`~rota.job.Unreadable`)."""
        async with self.deadline(deadline), self.connection(conn) as c:
            cur = self.cursor(c, dict_row)
            async with self.settings_ahead(c):
                await cur.execute(self.sql(name), params)
            return await cur.fetchall()

    async def fetch_dict(self, name: str, params: Params, *, conn: AnyConn | None = None,
                         deadline: float | None = None) -> dict[str, Any] | None:
        """Run the statement; return its first row as a dict, or ``None``."""
        rows = await self.fetch_dicts(name, params, conn=conn, deadline=deadline)
        return rows[0] if rows else None

    async def fetch_first(self, name: str, params: Params, row_factory: AsyncRowFactory[Row],
                          *, conn: AnyConn | None = None,
                          deadline: float | None = None) -> Row | None:
        """Run the statement; return its first row as ``row_factory`` makes it (values
        that could not be loaded are :class:`~rota.job.Unreadable`, as for
        :meth:`fetch_dicts`), or ``None``. For a statement on the hot path (the single
        enqueue): a row factory that reads only what it needs, no layer that costs an
        await when there is no prelude, and on a connection the store takes from the
        queue's own pool, a cursor kept for the statement (:meth:`hot_cursor`)."""
        async with self.deadline(deadline), self.connection(conn) as c:
            query: bytes | Composed
            if conn is None and c in _CONFIGURED:
                cur, query = self.hot_cursor(c, name, row_factory)
            else:
                cur, query = self.cursor(c, row_factory), self.sql(name)
            if c in _PRELUDES:
                async with self.settings_ahead(c):
                    await cur.execute(query, params)
            else:
                await cur.execute(query, params)
            return await cur.fetchone()

    def hot_cursor(self, conn: AnyConn, name: str, row_factory: AsyncRowFactory[Row]
                   ) -> tuple[psycopg.AsyncCursor[Row], bytes]:
        """A cursor set up as :meth:`cursor` sets one up, kept for statement ``name`` on
        ``conn``, and the statement's text as bytes: psycopg then keeps what it learnt
        running it (the parameters' dumpers, the columns' loaders) instead of finding
        them again for a new cursor at each call (about 60 of the single enqueue's 540
        Python calls). Made again when the session's TimeZone, client encoding or
        DateStyle changed (:func:`configure_cursor` set the cursor up for them).

        Only for a connection of the queue's own pool (set up by
        :func:`configure_connection`) that the store took from the pool for this
        statement alone: no other task can use the cursor meanwhile, and nobody else
        changes the connection's adapters."""
        pgconn = conn.pgconn
        session = (pgconn.parameter_status(b"TimeZone"),
                   pgconn.parameter_status(b"client_encoding"),
                   pgconn.parameter_status(b"DateStyle"))
        key = (conn, name, row_factory)
        found = self._hot.get(key)
        if found is not None and found[0] == session:
            return found[1], found[2]
        if found is None:  # a new connection: forget the closed ones
            for k in [k for k in self._hot if k[0].closed]:
                del self._hot[k]
        cur = self.cursor(conn, row_factory)
        query = self.sql(name).as_bytes(cur)
        self._hot[key] = (session, cur, query)
        return cur, query



class IdleConnectionCheck:
    """The check rota's own pools run when they hand out a connection
    (``AsyncConnectionPool(check=...)``; set :attr:`pool` to that pool).

    A connection the server closed while it sat idle in the pool (a database restart, an
    idle-session timeout, a terminated backend) has the server's last message or EOF
    waiting on its socket. Only such a connection pays a round trip (psycopg_pool's
    check, which raises, and the pool hands out a fresh connection instead); a healthy
    idle connection has nothing to read and costs nothing. Without it, the first use of
    each pooled connection after a restart fails, and a run's next statements fail one
    by one.

    When one idle connection turns out closed, the pool's other idle connections most
    likely went with it (a restart closes them all): the pool is drained, so they are
    replaced at once in the background. psycopg_pool waits after each failed check
    before it tries the next connection, and the wait doubles (1 s, 2 s, 4 s, ...):
    checked one by one, ten dead connections would hold the caller for minutes (past
    the pool's 30 s timeout), so a run cut off by a restart could not record its end
    within its platform timeout (docs/design.md, "Connections").

    Raises:
        psycopg.OperationalError: the connection is closed or broken.
    """

    def __init__(self) -> None:
        #: The pool drained when a connection fails the check (``None``: none is).
        self.pool: AsyncConnectionPool[Any] | None = None

    async def __call__(self, conn: AnyConn) -> None:
        try:
            await check_idle_connection(conn)
        except Exception:
            if self.pool is not None:
                with contextlib.suppress(Exception):  # closed or closing: nothing to do
                    await self.pool.drain()
            raise


async def check_idle_connection(conn: AnyConn) -> None:
    """Whether one idle connection still works: a connection with nothing to read costs
    nothing, one with something to read (the server's goodbye, EOF) a round trip
    (see :class:`IdleConnectionCheck`).

    Raises:
        psycopg.OperationalError: the connection is closed or broken.
    """
    if conn.closed:
        raise psycopg.OperationalError("the connection is closed")
    if _has_input(conn.fileno()):
        await AsyncConnectionPool.check_connection(conn)


def _has_input(fd: int) -> bool:
    """Whether ``fd`` has something to read (or hung up), without waiting. poll() where
    there is one: select() refuses descriptors above 1023, which a busy server has."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    readable, _, _ = select.select([fd], [], [], 0)
    return bool(readable)


__all__ = ["STATEMENT_DEADLINE", "AnyConn", "IdleConnectionCheck", "SecondsBinaryDumper",
           "SecondsDumper", "StatementDeadline", "Statements", "Store",
           "check_idle_connection", "configure_connection",
           "configure_cursor", "is_connection_failure", "listen_connect_args", "prelude",
           "set_prelude"]
