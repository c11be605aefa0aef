"""The ``rota`` command (grows with the runner issue)."""

from __future__ import annotations

import asyncio
import os
import sys

import click

from . import db
from .errors import RotaError


def _url(url: str | None) -> str:
    value = url or os.environ.get("DATABASE_URL")
    if not value:
        raise click.UsageError("no database: pass --database-url or set DATABASE_URL")
    return db.check_conninfo(value)


@click.group()
def cli() -> None:
    """rota: fair, crash-safe background pipelines on PostgreSQL."""


@cli.command()
@click.option("--database-url", envvar="DATABASE_URL", help="PostgreSQL URL.")
@click.option("--schema", default="rota", show_default=True)
def migrate(database_url: str | None, schema: str) -> None:
    """Apply missing migrations (safe to run concurrently)."""
    import psycopg

    async def go() -> list[int]:
        async with await psycopg.AsyncConnection.connect(_url(database_url),
                                                         autocommit=True) as conn:
            return await db.migrate(conn, schema)

    try:
        applied = asyncio.run(go())
    except psycopg.OperationalError as exc:
        click.echo(f"error: database unreachable: {str(exc).strip().splitlines()[0]}", err=True)
        sys.exit(2)
    click.echo(f"applied {applied}" if applied else "up to date")


@cli.command()
@click.option("--schema", default="rota", show_default=True)
def schema(schema: str) -> None:
    """Print the schema SQL for your own migration tool."""
    click.echo(db.schema_sql(schema), nl=False)


@cli.command()
def demo() -> None:
    """Run the example pipeline end to end."""
    click.echo("rota demo: coming in the runner issue")


def main() -> None:
    try:
        cli()
    except RotaError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
