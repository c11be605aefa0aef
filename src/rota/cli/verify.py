"""``rota verify``: check the fair claim's bookkeeping against the jobs table (every
invariant of docs/fast-claim.md, "The contract", in one read-only statement, safe on a
live queue), and with ``--repair`` rebuild it from the jobs table in one transaction.

Exit codes: 0 the bookkeeping is exact (after the repair, with ``--repair``); 1 it
broke an invariant (each violation printed: type, group, owner, invariant, expected,
found; the owner, its unit and plan, for the owners' invariants).
"""

from __future__ import annotations

import asyncio
import sys

import click
from rich.table import Table

from ..fair import RepairReport, Violation
from .app import open_queue
from .errors import RotaCommand
from .options import json_option, make_target, target_options
from .output import ABSENT, add_row, console, emit_json, with_progress


@click.command(cls=RotaCommand)
@target_options
@click.option("--repair", is_flag=True,
              help="Rebuild the bookkeeping from the jobs table in one transaction "
                   "(writers of jobs wait for it; claims stay exact).")
@json_option
def verify(database_url: str | None, schema: str | None, app_spec: str | None,
           repair: bool, as_json: bool) -> None:
    """Check the fair claim's bookkeeping against the jobs table (read-only; exit 1
    with each violation printed); --repair rebuilds it."""
    target = make_target(database_url, schema, app_spec)

    async def go() -> tuple[list[Violation], RepairReport | None]:
        async with open_queue(target) as queue:
            if repair:
                report = await with_progress(queue.repair_bookkeeping(), "rebuilding")
                return await queue.verify(), report
            return await with_progress(queue.verify(), "verifying"), None

    violations, report = asyncio.run(go())
    if as_json:
        out: dict[str, object] = {"violations": [v.as_dict() for v in violations]}
        if report is not None:
            out["repaired"] = {"found": [v.as_dict() for v in report.found],
                               "groups": report.groups}
        emit_json(out)
    else:
        if report is not None:
            _print(report.found, "violations before the rebuild")
            click.echo(f"rebuilt: {report.groups} group rows")
        _print(violations, "violations")
    if violations:
        sys.exit(1)


def _owner(v: Violation) -> str:
    """The owner's row an owner's invariant concerns, ``unit g:g1, plan pro`` (its unit
    as the bookkeeping keys it, docs/fast-claim.md, "The owner level"); ``—`` for a
    group's invariant."""
    if v.unit is None:
        return ABSENT
    plan = v.plan_key.removeprefix("p:") if v.plan_key else ABSENT
    return f"unit {v.unit}, plan {plan}"


def _print(violations: list[Violation], title: str) -> None:
    if not violations:
        click.echo(f"{title}: none")
        return
    table = Table(title=f"{title} ({len(violations)})")
    for col in ("type", "group", "owner", "invariant", "expected", "found"):
        table.add_column(col, overflow="fold")
    for v in violations:
        add_row(table, v.type, ABSENT if v.group is None else v.group, _owner(v),
                v.invariant, v.expected, v.found)
    console().print(table)
