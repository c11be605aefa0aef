"""The ``rota-demo`` command (also ``python -m rota_demo``): the example pipeline end to
end (:mod:`rota_demo.driver`), and ``rota-demo pricing``, the example's pricing table."""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from rota.cli.errors import RotaGroup

from . import app as demo_app
from . import driver
from .pricing import pricing_rows


@click.group(cls=RotaGroup, invoke_without_command=True)
@click.option("--profile", type=click.Choice(sorted(driver.PROFILES)), default="default",
              show_default=True, help="How much to seed (short: for CI).")
@click.option("--database-url", envvar="DATABASE_URL",
              help="PostgreSQL URL (default: a throwaway embedded server).")
@click.option("--seed", type=int, default=1, show_default=True, help="Random seed.")
@click.option("--keep", is_flag=True, help="Keep the demo's schemas for inspection.")
@click.option("--dashboard", is_flag=True,
              help="After the report, serve rota's dashboard on the demo's data "
                   "(read-only, http://127.0.0.1:8080/) until Ctrl-C.")
@click.pass_context
def cli(ctx: click.Context, profile: str, database_url: str | None, seed: int,
        keep: bool, dashboard: bool) -> None:
    """Run the example pipeline end to end through the cron endpoint and report
    (exit status 1 when an invariant failed; 130 with "error: interrupted" after Ctrl-C
    or SIGTERM, its servers stopped and its schemas dropped)."""
    if ctx.invoked_subcommand is None:
        sys.exit(driver.run(database_url, profile, seed, keep, dashboard))


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def pricing(as_json: bool) -> None:
    """The pricing table, rendered from the same plans object that ranks the claim."""
    plans = demo_app.PLANS
    rows = pricing_rows(plans)
    if as_json:
        click.echo(json.dumps({
            "plans": [{"id": p.id, "name": p.name, "priority": p.priority} for p in plans],
            "rows": [{"label": label, "values": values} for label, values in rows],
        }, indent=2))
        return
    table = Table(title="plans")
    table.add_column("")
    for p in plans:
        table.add_column(Text(p.name), justify="center")
    for label, values in rows:
        table.add_row(Text(label), *(Text(v) for v in values))
    Console().print(table)


def main() -> None:
    """The ``rota-demo`` console script."""
    cli(prog_name="rota-demo")
