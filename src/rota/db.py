"""Database plumbing: the named SQL statements, schema migrations and connection
strings (the embedded PostgreSQL used when no server is configured is
:mod:`rota.embedded`, re-exported here)."""

from __future__ import annotations

import hashlib
import os
import re
import string
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any, NamedTuple

import psycopg
from psycopg import sql

from .checks import shown
from .embedded import EmbeddedServer as EmbeddedServer  # its home before embedded.py
from .errors import DatabaseUnavailable, InvalidInput, MigrationError, first_line
from .redact import redact

#: One part of a name rota puts in SQL (docs/operations.md, "Security"): ASCII letters,
#: digits and ``_``, not starting with a digit, at most 63 bytes (PostgreSQL's NAMEDATALEN
#: - 1, past which it truncates silently). No ``$`` (``$$`` would end the dollar-quoted
#: function bodies the schema's name is written into), no quote, dot, space or newline.
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def identifier(name: object, what: str = "schema", *, qualified: bool = False
               ) -> sql.Identifier:
    """The one check of every identifier rota accepts (a queue's schema, a groups
    relation), returning it quoted.

    A name is accepted only if it works everywhere rota writes it: in every statement, in
    ``rota migrate`` and in the ``rota schema`` script (inside dollar-quoted function
    bodies and string literals), and as the worker's notification channel. The whole
    string must match: letters ``A-Z a-z``, digits and ``_``, not starting with a digit,
    1 to 63 characters, not starting with ``pg_`` (PostgreSQL reserves it). With
    ``qualified`` (a relation), one dot may separate a schema from the name.

    Args:
        name: the name as given.
        what: what it names, for the message (``"schema"``, ``"groups relation"``).
        qualified: allow ``schema.name``.

    Raises:
        InvalidInput: the name is not a string or breaks a rule above; the message
            names ``what``, shows the name and says which rule.
    """
    if not isinstance(name, str):
        raise InvalidInput(f"{what} must be a string, got {shown(name)}",
                           argument=what)
    parts = name.split(".") if qualified else [name]
    rule = ("letters, digits and _, not starting with a digit, 1 to 63 characters"
            + (", optionally schema-qualified with one dot" if qualified else ""))
    if len(parts) > 2 or not all(_NAME.fullmatch(p) for p in parts):
        raise InvalidInput(f"{what} {name!r} is not a valid identifier ({rule})",
                           argument=what)
    if any(p[:3].lower() == "pg_" for p in parts):
        raise InvalidInput(f"{what} {name!r} is not a valid identifier: names starting with pg_ "
                           "are reserved by PostgreSQL", argument=what)
    return sql.Identifier(*parts)


@cache
def statement_text(name: str) -> str:
    """The text of the named statement: ``rota/sql/NAME.sql``, or for a name
    ``PACKAGE/NAME`` the file ``rota/PACKAGE/NAME.sql`` (the fair claim's statements
    live in its package, ``rota/fair/``)."""
    return _statement_file(name).read_text("utf-8")


def _statement_file(name: str) -> Traversable:
    package, _, base = name.rpartition("/")
    folder = resources.files("rota").joinpath(package or "sql")
    return folder.joinpath(f"{base}.sql")


def statement(name: str, schema: sql.Identifier, groups: sql.Identifier,
              **fragments: str) -> sql.Composed:
    """The named statement with ``{schema}`` and ``{groups}`` filled in, quoted, and
    each other placeholder ``{key}`` replaced by a named statement (itself filled in the
    same way): ``fragments[key]`` when given (a choice made at run time, such as the
    claim's pool), else the file ``KEY.sql`` beside the statement (a block shared by
    several statements, such as ``{fenced_claims}`` or the claim's ``{claim_head}``)."""
    text = statement_text(name)
    package = name.rpartition("/")[0]
    keys = {f for _, f, _, _ in string.Formatter().parse(text) if f}
    parts = {k: statement(fragments.get(k, f"{package}/{k}" if package else k), schema,
                          groups, **fragments)
             for k in keys - {"schema", "groups", name.rpartition("/")[2]}}
    return sql.SQL(text).format(schema=schema, groups=groups, **parts)


class Migration(NamedTuple):
    """One packaged migration, the file ``rota/migrations/NNN_NAME.sql``."""

    version: int
    name: str
    text: str

    @property
    def filename(self) -> str:
        return f"{self.version:03d}_{self.name}.sql"

    @property
    def sha256(self) -> str:
        """The SHA-256 of the file's text (hex), recorded when it is applied."""
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


@cache
def migrations() -> tuple[Migration, ...]:
    """The packaged migrations, in version order: the 0.1.0 baseline, then the deltas of
    later releases. Released files are never edited (``migrations/released.txt``)."""
    out = []
    for entry in resources.files("rota").joinpath("migrations").iterdir():
        m = re.match(r"^(\d{3})_(\w+)\.sql$", entry.name)
        if m:
            out.append(Migration(int(m.group(1)), m.group(2), entry.read_text("utf-8")))
    return tuple(sorted(out))


#: A line of schema.sql replaced by a file of the package (``-- @include fair/x.sql``).
_INCLUDE = re.compile(r"^-- @include (\S+)$", re.MULTILINE)


@cache
def schema_text() -> str:
    """``rota/schema.sql``: the current schema, with the ``{schema}`` placeholder, for
    fresh installs, each ``-- @include PATH`` line replaced by the file ``rota/PATH``
    (the fair claim's bookkeeping lives in its package, ``fair/bookkeeping.sql``). It
    equals every migration applied in order."""
    text = resources.files("rota").joinpath("schema.sql").read_text("utf-8")
    return _INCLUDE.sub(
        lambda m: resources.files("rota").joinpath(m.group(1)).read_text("utf-8").rstrip(),
        text)


_VERSION_TABLE = """CREATE TABLE IF NOT EXISTS {schema}.rota_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    sha256     text NOT NULL,  -- of the file applied: released files never change
    applied_at timestamptz NOT NULL DEFAULT now()
)"""


def _record(m: Migration, schema: sql.Identifier) -> sql.Composed:
    """The statement recording ``m`` as applied to ``schema``."""
    return sql.SQL(
        "INSERT INTO {}.rota_migrations (version, name, sha256) VALUES ({}, {}, {})"
    ).format(schema, sql.Literal(m.version), sql.Literal(m.name), sql.Literal(m.sha256))


def schema_sql(schema: str = "rota") -> str:
    """The full schema as one SQL script (``rota schema``), for teams that run their own
    migration tool: ``schema.sql``, then every packaged migration recorded as applied
    with its checksum in ``SCHEMA.rota_migrations``, as :func:`migrate` records a fresh
    install, so ``rota migrate`` can take over later.

    Raises:
        InvalidInput: ``schema`` is not a valid identifier.
    """
    ident = identifier(schema)
    quoted = ident.as_string(None)  # identifiers and literals render without a connection
    # CREATE SCHEMA only when it is missing: IF NOT EXISTS alone would need the CREATE
    # privilege on the database even for a schema that exists (a role owning only its
    # schema runs this script too; docs/operations.md, "Least privilege").
    create = sql.SQL(
        "DO $rota$ BEGIN\n"
        "    IF NOT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = {}) THEN\n"
        "        CREATE SCHEMA {};\n"
        "    END IF;\n"
        "END $rota$;").format(sql.Literal(schema), ident).as_string(None)
    parts = [
        create,
        _VERSION_TABLE.format(schema=quoted) + ";",
        schema_text().format(schema=quoted).strip(),
        "-- The schema above is every migration applied:",
    ]
    parts += [_record(m, ident).as_string(None) + ";" for m in migrations()]
    return "\n\n".join(parts) + "\n"


#: How many times a migration that lost the race to create an empty schema's objects is
#: retried (each retry then finds them and waits on the lock).
_CREATE_ATTEMPTS = 3

#: What losing that race raises: the winner's uncommitted catalog rows hold a unique index.
_CREATE_RACE = (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateSchema,
                psycopg.errors.DuplicateTable)

_LOCK_VERSIONS = "LOCK TABLE {}.rota_migrations IN SHARE ROW EXCLUSIVE MODE"


async def migrate(conn: psycopg.AsyncConnection[Any], schema: str = "rota") -> list[int]:
    """Bring ``schema`` up to date, once, in one transaction.

    An empty schema (no migration recorded) gets ``schema.sql`` and every packaged
    migration recorded as applied, with its checksum. Otherwise each recorded migration's
    checksum is checked against the packaged file, then the missing migrations are
    applied in version order.

    Concurrent migrators serialize on a lock of the schema's ``rota_migrations`` table,
    which only a role that may write that table can take (an advisory lock can be taken,
    and held, by any role of the database). The schema and that table are created only
    when missing, so migrating an existing schema needs no CREATE privilege on the
    database (docs/operations.md, "Least privilege"). Two first migrations of an empty
    schema race to create them: the loser's transaction fails on the winner's catalog
    rows and is retried; it then waits on the lock, finds every version recorded and
    applies nothing.

    Returns:
        The versions applied (or recorded by a fresh install) by this call; empty when
        the schema was up to date.

    Raises:
        InvalidInput: ``schema`` is not a valid identifier.
        MigrationError: one line, and nothing of this call is kept: a recorded migration
            differs from the packaged file (it was edited after it was applied), the
            schema records a migration this rota does not ship, it was migrated by a
            pre-release rota (no checksums), the role may not create the schema or
            write ``rota_migrations``, or a statement failed.
    """
    ident = identifier(schema)
    quoted = ident.as_string(conn)
    shipped = migrations()
    for attempt in range(1, _CREATE_ATTEMPTS + 1):
        step = "creating the schema and rota_migrations"
        try:
            async with conn.transaction():
                # Migrations are the one long statement rota runs: not cut by its default
                # statement_timeout (with_connection_defaults).
                await conn.execute("SET LOCAL statement_timeout = 0")
                await _create_missing(conn, ident, schema)
                step = "locking rota_migrations"
                await conn.execute(sql.SQL(_LOCK_VERSIONS).format(ident))
                step = "reading its migrations"
                cur = await conn.execute(
                    sql.SQL("SELECT version, name, sha256 FROM {}.rota_migrations")
                    .format(ident))
                recorded = {v: (name, sha) for v, name, sha in await cur.fetchall()}
                _check_recorded(recorded, shipped, schema)
                if recorded:
                    todo = [m for m in shipped if m.version not in recorded]
                    for m in todo:
                        step = f"applying {m.filename}"
                        await conn.execute(m.text.format(schema=quoted).encode())
                else:  # a fresh install: schema.sql is every migration applied
                    todo = list(shipped)
                    step = "installing schema.sql"
                    await conn.execute(schema_text().format(schema=quoted).encode())
                for m in todo:
                    await conn.execute(_record(m, ident))
            return [m.version for m in todo]
        except psycopg.Error as exc:
            lost_race = isinstance(exc, _CREATE_RACE) and step.startswith("creating")
            if not lost_race or attempt == _CREATE_ATTEMPTS:
                raise MigrationError(
                    f'migrating schema "{schema}" failed ({step}): {exc}') from exc
    raise AssertionError("unreachable: the last attempt returns or raises")


async def _create_missing(conn: psycopg.AsyncConnection[Any], ident: sql.Identifier,
                          schema: str) -> None:
    """Create the schema and its version table when they are missing (and only then:
    ``CREATE ... IF NOT EXISTS`` checks the CREATE privilege even when the object
    exists).

    Raises:
        MigrationError: the version table predates checksums: a pre-release rota made it.
        psycopg.errors.UniqueViolation (or DuplicateSchema, DuplicateTable): another
            migrator created one of them first, in a transaction not yet committed.
    """
    table = sql.SQL("{}.rota_migrations").format(ident).as_string(conn)
    cur = await conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %(s)s), "
        "to_regclass(%(t)s) IS NOT NULL, EXISTS (SELECT 1 FROM pg_attribute "
        "WHERE attrelid = to_regclass(%(t)s) AND attname = 'sha256' AND NOT attisdropped)",
        {"s": schema, "t": table})
    row = await cur.fetchone()
    assert row is not None
    schema_exists, table_exists, has_checksums = row
    if table_exists and not has_checksums:
        raise MigrationError(
            f'schema "{schema}" was migrated by a pre-release rota (rota_migrations has '
            "no checksums); no release existed before 0.1.0, so there is no upgrade: "
            "recreate the schema (drop it, then run rota migrate)")
    if not schema_exists:
        await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
    if not table_exists:
        await conn.execute(sql.SQL(_VERSION_TABLE).format(schema=ident))


def _check_recorded(recorded: dict[int, tuple[str, str]], shipped: tuple[Migration, ...],
                    schema: str) -> None:
    """Refuse a schema whose recorded migrations are not the packaged files.

    Raises:
        MigrationError: a recorded version is not shipped, or its checksum differs.
    """
    by_version = {m.version: m for m in shipped}
    for version, (name, sha) in sorted(recorded.items()):
        m = by_version.get(version)
        if m is None:
            raise MigrationError(
                f'schema "{schema}" records migration {version:03d}_{name}.sql, which this '
                "rota does not ship (a newer rota migrated it): upgrade rota")
        if sha != m.sha256:
            raise MigrationError(
                f'migration {m.filename} was changed after it was applied to schema '
                f'"{schema}": recorded sha256 {sha[:12]}…, shipped {m.sha256[:12]}…')


def check_conninfo(conninfo: str) -> str:
    """Validate a libpq connection string or URL without connecting.

    Accepted: ``postgresql://[user[:password]@][host][:port][/dbname][?param=value…]``
    (or ``postgres://…``), or libpq's key=value form (``host=… port=… dbname=…``).
    Refuses a URL of another scheme (``mysql://…``, which libpq would misread as
    key=value text), a string that is neither (``localhost:5432/db``: no scheme), what
    libpq cannot parse, a port that is not a number from 1 to 65535 (a URL's password
    with no ``@`` after it is read as the port), a URL whose user name or password holds
    an unencoded ``@`` or ``/`` (libpq would read the rest of the password as the host,
    the port or the database name, where connection errors would show it), and a value
    libpq would refuse only when connecting (:data:`CONNINFO_CHOICES`,
    :data:`CONNINFO_INTEGERS`: ``sslmode=bogus``), which a pool would retry until its
    timeout.

    Returns:
        ``conninfo``, unchanged.

    Raises:
        DatabaseUnavailable: one line saying why, with the password replaced by ``***``
            (docs/operations.md, "Secrets").
    """
    scheme = re.match(r"\s*([A-Za-z][A-Za-z0-9+.\-]*)://", conninfo)
    if scheme and scheme.group(1) not in ("postgresql", "postgres"):
        # libpq would read it as key=value text and say `missing "="`.
        raise DatabaseUnavailable(
            f"not a PostgreSQL URL: {redact(conninfo, conninfo)!r} (rota needs "
            f"{_ACCEPTED_FORMS})")
    if not scheme and conninfo.strip() and not _CONNINFO_KEYWORD.match(conninfo):
        # libpq would say `missing "=" after "localhost:5432/db" in connection info string`.
        raise DatabaseUnavailable(
            f"malformed database URL {redact(conninfo, conninfo)!r}: it has no "
            f"postgresql:// scheme and is not key=value text (rota needs "
            f"{_ACCEPTED_FORMS})")
    try:
        params = psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError as exc:
        raise DatabaseUnavailable(
            f"malformed database URL: {redact(first_line(exc), conninfo)}") from None
    _check_values(params, conninfo)
    ports = str(params.get("port") or "").split(",")
    if any(p.strip() and not p.strip().isdigit() for p in ports):
        # Not echoed: ``postgresql://u:PASSWORD/db`` (no @) reads the password as the port.
        raise DatabaseUnavailable(
            "malformed database URL: its port is not a number (in a URL, user:password "
            "needs an @ before the host)")
    if any(p.strip() and not 1 <= int(p) <= 65535 for p in ports):
        # Not echoed either: a password of digits before a missing @ is read as the port.
        hint = " (in a URL, user:password needs an @ before the host)" if scheme else ""
        raise DatabaseUnavailable(
            f"malformed database URL: its port is not between 1 and 65535{hint}")
    if _splits_userinfo(conninfo):
        raise DatabaseUnavailable(
            f"malformed database URL {redact(conninfo, conninfo)!r}: an @ or / in its user "
            "name or password must be percent-encoded (%40, %2F)")
    return conninfo


#: The forms of a connection string rota accepts, as its errors say them.
_ACCEPTED_FORMS = ("postgresql://[user@]host[:port][/dbname] or postgres://…, or libpq's "
                   "key=value form: host=… port=… dbname=…")

#: The start of libpq's key=value form: a keyword, then ``=``.
_CONNINFO_KEYWORD = re.compile(r"\s*[A-Za-z_][A-Za-z0-9_]*\s*=")

#: libpq parameters that take one of a few words, which libpq checks only when it
#: connects: a pool would retry the same refusal until its timeout (30 s), and the
#: error would be libpq's. Case counts, as in libpq.
CONNINFO_CHOICES: dict[str, tuple[str, ...]] = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "gssencmode": ("disable", "prefer", "require"),
    "channel_binding": ("disable", "prefer", "require"),
    "sslnegotiation": ("postgres", "direct"),
    "sslcertmode": ("disable", "allow", "require"),
    "target_session_attrs": ("any", "read-write", "read-only", "primary", "standby",
                             "prefer-standby"),
    "load_balance_hosts": ("disable", "random"),
}
#: The same for the TLS versions (any case, or empty for none, as libpq reads them).
_TLS_VERSIONS = ("TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3")
#: libpq parameters that take a whole number, checked when it connects as well.
CONNINFO_INTEGERS = ("connect_timeout", "keepalives", "keepalives_idle",
                     "keepalives_interval", "keepalives_count", "tcp_user_timeout")
_INTEGER = re.compile(r"\s*[-+]?[0-9]+\s*")


def _check_values(params: dict[str, Any], conninfo: str) -> None:
    """Refuse a value of :data:`CONNINFO_CHOICES`, a TLS version or
    :data:`CONNINFO_INTEGERS` that libpq would refuse when connecting.

    Raises:
        DatabaseUnavailable: ``malformed database URL: sslmode must be one of …, got
            'bogus'`` (the connection string's password never shown).
    """
    problem = None
    for name, value in params.items():
        value = str(value)
        if name in CONNINFO_CHOICES and value not in CONNINFO_CHOICES[name]:
            problem = f"{name} must be one of {', '.join(CONNINFO_CHOICES[name])}"
        elif (name in ("ssl_min_protocol_version", "ssl_max_protocol_version") and value
              and value.lower() not in (v.lower() for v in _TLS_VERSIONS)):
            problem = f"{name} must be one of {', '.join(_TLS_VERSIONS)}"
        elif name in CONNINFO_INTEGERS and not _INTEGER.fullmatch(value):
            problem = f"{name} must be a whole number"
        if problem is not None:
            raise DatabaseUnavailable(redact(
                f"malformed database URL: {problem}, got {shown(value, 40)}",
                conninfo))


def _splits_userinfo(conninfo: str) -> bool:
    """Whether libpq would cut a URL's userinfo short: it ends the userinfo at the first
    ``@`` (or finds none before a ``/``), so another ``@`` before the query means a
    password (or user name) with an unencoded ``@`` or ``/``."""
    uri = re.match(r"postgres(?:ql)?://", conninfo)  # libpq's two URI prefixes
    if uri is None:
        return False
    stop = re.compile(r"[@/]").search(conninfo, uri.end())
    rest = conninfo[stop.end() if stop and stop.group() == "@" else uri.end():]
    return "@" in rest.split("?", 1)[0]


#: libpq parameters rota adds to the connections of its own pool (docs/operations.md,
#: "Network partitions and timeouts"): a worker cut off from the database gives a
#: connection up in bounded time instead of the kernel's 15 minutes or more. A
#: connection attempt waits at most 10 s; an idle connection whose peer is gone is
#: dropped after about 30 s of silence (15 s, then 3 probes 5 s apart); one with
#: unacknowledged data after 30 s.
CLIENT_DEFAULTS: dict[str, str] = {
    "connect_timeout": "10",
    "keepalives": "1",
    "keepalives_idle": "15",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "30000",
}

#: Server settings rota asks for in ``options`` (``-c name=value``) on the same
#: connections: the server drops the sessions of a cut-off worker after the same 30 s,
#: idle or with a reply unacknowledged (freeing their connection slots), a transaction
#: left open releases its row locks after 5 minutes (within the default stale window),
#: and no statement runs longer.
SESSION_DEFAULTS: dict[str, str] = {
    "tcp_keepalives_idle": "15",
    "tcp_keepalives_interval": "5",
    "tcp_keepalives_count": "3",
    "tcp_user_timeout": "30000",
    "idle_in_transaction_session_timeout": "5min",
    "statement_timeout": "5min",
    # Times come back as ISO text, the only form psycopg reads: a database or role whose
    # DateStyle is another (German, SQL, Postgres) does not reach rota's connections.
    "datestyle": "ISO",
}

_OPTION_NAME = re.compile(r"(?:^|\s)(?:-c\s*|--)([A-Za-z0-9_.-]+)=")


def with_connection_defaults(conninfo: str) -> str:
    """``conninfo`` with :data:`CLIENT_DEFAULTS` and :data:`SESSION_DEFAULTS` added where
    it does not set them itself. What the URL sets always wins, one setting at a time
    (its own ``options`` are kept and only the settings they do not name are appended);
    so does libpq's environment (``PGCONNECT_TIMEOUT``, and ``PGOPTIONS``, which is
    merged in since an ``options`` parameter would hide it). A URL naming a connection
    service (``service=``, or ``PGSERVICE``) is returned as it is: the service file may
    set any of these, and parameters added here would override it.

    Raises:
        DatabaseUnavailable: the string cannot be parsed.
    """
    params = psycopg.conninfo.conninfo_to_dict(check_conninfo(conninfo))
    if params.get("service") or os.environ.get("PGSERVICE"):
        return conninfo
    added = {k: v for k, v in CLIENT_DEFAULTS.items() if k not in params}
    if os.environ.get("PGCONNECT_TIMEOUT"):
        added.pop("connect_timeout", None)
    options = str(params["options"] if "options" in params
                  else os.environ.get("PGOPTIONS", "")).strip()
    named = {m.lower().replace("-", "_") for m in _OPTION_NAME.findall(options)}
    extra = [f"-c {k}={v}" for k, v in SESSION_DEFAULTS.items() if k not in named]
    if extra:
        added["options"] = " ".join([options, *extra] if options else extra)
    return psycopg.conninfo.make_conninfo(conninfo, **added) if added else conninfo


#: The server settings of :data:`SESSION_DEFAULTS` that behind a connection pooler are
#: applied per transaction instead (docs/operations.md, "Poolers and failover"): a
#: pooler refuses the startup ``options`` (PgBouncer: "unsupported startup parameter:
#: options") or drops them, and a session ``SET`` would follow the server connection to
#: another client. The ``tcp_*`` ones are left out: the server's socket is the
#: pooler's, whose own keepalive settings bound it.
TRANSACTION_DEFAULTS: dict[str, str] = {
    "idle_in_transaction_session_timeout": SESSION_DEFAULTS[
        "idle_in_transaction_session_timeout"],
    "statement_timeout": SESSION_DEFAULTS["statement_timeout"],
    "datestyle": SESSION_DEFAULTS["datestyle"],
}

_OPTION_PAIR = re.compile(r"(?:^|\s)(?:-c\s*|--)([A-Za-z0-9_.-]+)=((?:\\.|\S)*)")


def pooled_connection(conninfo: str) -> tuple[str, dict[str, str]]:
    """``conninfo`` for a connection pooler, and the server settings to apply in each
    transaction instead of at startup.

    The string gets :data:`CLIENT_DEFAULTS` where it does not set them (as
    :func:`with_connection_defaults`) and an empty ``options``, so that neither its own
    ``options`` nor ``PGOPTIONS`` is sent (libpq sends no empty parameter). The
    settings are :data:`TRANSACTION_DEFAULTS` with every ``-c name=value`` (or
    ``--name=value``) of the URL's ``options`` (else ``PGOPTIONS``) laid over them:
    what the URL sets still wins. A URL naming a connection service is returned as it
    is, with :data:`TRANSACTION_DEFAULTS`.

    Returns:
        ``(conninfo, {setting: value})``.

    Raises:
        DatabaseUnavailable: the string cannot be parsed.
    """
    params = psycopg.conninfo.conninfo_to_dict(check_conninfo(conninfo))
    if params.get("service") or os.environ.get("PGSERVICE"):
        return conninfo, dict(TRANSACTION_DEFAULTS)
    added: dict[str, str] = {k: v for k, v in CLIENT_DEFAULTS.items() if k not in params}
    if os.environ.get("PGCONNECT_TIMEOUT"):
        added.pop("connect_timeout", None)
    options = str(params["options"] if "options" in params
                  else os.environ.get("PGOPTIONS", ""))
    settings = dict(TRANSACTION_DEFAULTS)
    for name, value in _OPTION_PAIR.findall(options):
        settings[name.lower().replace("-", "_")] = re.sub(r"\\(.)", r"\1", value)
    added["options"] = ""
    return psycopg.conninfo.make_conninfo(conninfo, **added), settings


def transaction_settings(settings: dict[str, str]) -> sql.Composed:
    """The statement applying ``settings`` to the current transaction only
    (``set_config(name, value, true)``, as ``SET LOCAL``), sent ahead of a statement in
    the same pipeline, so it costs no round trip of its own."""
    calls = [sql.SQL("set_config({}, {}, true)").format(sql.Literal(k), sql.Literal(v))
             for k, v in settings.items()]
    return sql.SQL("SELECT ") + sql.SQL(", ").join(calls)


#: What a server (or pooler) says when it refuses a connection: libpq quotes its
#: ErrorResponse after the severity, ``FATAL:  database "x" does not exist``.
_FATAL = re.compile(r"\bFATAL:\s+(.*)")

#: FATAL answers that pass: a server starting, stopping or in recovery (a failover in
#: progress), full, or a pooler that cannot reach its server. These wait like a server
#: that does not answer at all.
_TRANSIENT = re.compile(
    r"starting up|shutting down|in recovery mode|not yet accepting connections"
    r"|too many clients|connection slots are reserved|no more connections allowed"
    r"|cannot connect to server|server login has been failing|is paused"
    r"|terminating connection", re.IGNORECASE)


def refusal(exc: BaseException) -> str | None:
    """Why the server or a pooler refused a connection, when no retry will mend it:
    the text of the FATAL error it answered with (an unknown startup parameter,
    database or role, failed authentication), on one line with passwords redacted.

    Returns:
        That text, or ``None`` for any other failure: nothing answered (refused, timed
        out, unresolvable) or a FATAL that passes (the server starting up, shutting
        down or full, a pooler that cannot reach it), which the pool waits out.
    """
    if not isinstance(exc, psycopg.OperationalError):
        return None
    found = _FATAL.findall(str(exc))
    if not found or _TRANSIENT.search(found[-1]):
        return None
    return redact(found[-1].strip())
