"""Groups: ``rota groups set`` creates a group or changes its owner, plan, status or cap, and
``rota groups list`` lists them (docs/design.md, "Groups and plans"). The work is
:mod:`rota.admin`'s (:func:`~rota.admin.set_group`, :func:`~rota.admin.list_groups`)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import click
from click.core import ParameterSource
from rich.table import Table

from .. import admin
from ..cost import format_units
from .app import open_queue
from .errors import RotaGroup
from .options import WholeNumber, json_option, make_target, target_options, wants_json
from .output import ABSENT, add_row, console, emit_json, plan_label, safe_text


def _describe(row: admin.GroupRow) -> str:
    plan = row.plan if row.plan is not None else f"{ABSENT} (ranked as the middle plan)"
    return (f"owner {row.owner_id if row.owner_id is not None else ABSENT}, plan {plan}, "
            f"{'active' if row.active else 'paused'}"
            + (f", max running {row.max_running}" if row.max_running is not None else ""))


#: ``--max-running``: a group's cap, or ``none`` to clear it.
GROUP_CAP = WholeNumber(1, admin.MAX_GROUP_RUNNING, none=True)


@click.group(cls=RotaGroup)
@target_options
@json_option
def groups(database_url: str | None, schema: str | None, app_spec: str | None,
           as_json: bool) -> None:
    """Create or change groups (set) and list them (list).

    A group's plan ranks its jobs in the claim, its owner's allowances are what its jobs
    spend, and a paused group's jobs are not claimed. The plan ids are the app's
    (`--app`: its queue_settings' plans), else rota's default plans."""


@groups.command("set")
@target_options
@click.argument("group_id", metavar="GROUP")
@click.option("--owner", "owner_id", metavar="ID", help="The owner (customer) whose "
              "allowances the group's jobs spend, and whom --fair-by owner compares.")
@click.option("--no-owner", is_flag=True, help="Clear the owner.")
@click.option("--plan", metavar="PLAN", help="The plan id that ranks the group's jobs.")
@click.option("--no-plan", is_flag=True, help="Clear the plan (ranked as the middle plan).")
@click.option("--active", is_flag=True, help="Claim the group's jobs.")
@click.option("--paused", is_flag=True, help="Pause the group: its jobs are not claimed.")
@click.option("--max-running", "max_running", type=GROUP_CAP, metavar="N|none",
              help="At most N of the group's jobs (every type) running at once, across "
              "every worker (docs/design.md, \"Caps\"); none clears the cap. Rota's own "
              "groups table only.")
@json_option
def groups_set(database_url: str | None, schema: str | None, app_spec: str | None,
               group_id: str, owner_id: str | None, no_owner: bool, plan: str | None,
               no_plan: bool, active: bool, paused: bool, max_running: int | None,
               as_json: bool) -> None:
    """Create group GROUP, or change what is given of an existing one (the rest stays;
    a new group has no owner and no plan and is active unless told otherwise).
    Queued jobs are not rewritten: the change applies from the next claim."""
    for flag, value, clear in (("owner", owner_id, no_owner), ("plan", plan, no_plan)):
        if value is not None and clear:
            raise click.UsageError(f"--{flag} and --no-{flag} contradict each other")
    if active and paused:
        raise click.UsageError("--active and --paused contradict each other")
    target = make_target(database_url, schema, app_spec)
    as_json = wants_json(as_json)
    changes: dict[str, Any] = {}
    if owner_id is not None or no_owner:
        changes["owner_id"] = owner_id
    if plan is not None or no_plan:
        changes["plan"] = plan
    if active or paused:
        changes["active"] = active
    # None is both `none` and no --max-running: where it came from tells.
    ctx = click.get_current_context()
    if ctx.get_parameter_source("max_running") is not ParameterSource.DEFAULT:
        changes["max_running"] = max_running

    async def go() -> tuple[admin.GroupRow, bool]:
        async with open_queue(target) as queue:
            return await admin.set_group(queue, group_id, **changes)

    row, created = asyncio.run(go())
    if as_json:
        # What was set; its served cost is `rota groups list`'s.
        fields = {k: v for k, v in dataclasses.asdict(row).items()
                  if k not in ("served", "running", "owner_running")}
        emit_json({**fields, "created": created})
    else:
        click.echo(safe_text(f"{'created' if created else 'updated'} group "
                             f"{row.group_id!r}: {_describe(row)}"))


@groups.command("list")
@target_options
@click.option("--limit", type=WholeNumber(1, admin.MAX_LIST_LIMIT), default=50,
              show_default=True, help="The most groups shown.")
@click.option("--after", metavar="GROUP", help="Only groups whose id sorts after GROUP: "
              "the cursor of the next page, which a page prints when there is one.")
@json_option
def groups_list(database_url: str | None, schema: str | None, app_spec: str | None,
                limit: int, after: str | None, as_json: bool) -> None:
    """Groups in id order, with owner, plan and status (from the app's groups
    relation when its queue_settings name one), the cost served in the window, and the
    jobs running now (a fresh lock: within the stale window) against the group's own cap
    and the owner's (--app gives the plans; docs/design.md, "Cost" and "Caps")."""
    target = make_target(database_url, schema, app_spec)
    as_json = wants_json(as_json)

    async def go() -> list[admin.GroupRow]:
        async with open_queue(target) as queue:
            # One more than asked: whether there is a next page.
            return await admin.list_groups(queue, limit=min(limit + 1, admin.MAX_LIST_LIMIT),
                                           after=after)

    rows = asyncio.run(go())
    more = len(rows) > limit
    rows = rows[:limit]
    plans = target.plans()

    def cap(plan: str | None) -> int | None:
        """The plan's cap of an owner's running jobs (docs/design.md, "Caps")."""
        return plans[plan].max_running if plan is not None and plan in plans else None

    if as_json:
        emit_json([{**dataclasses.asdict(r), "cap": cap(r.plan)} for r in rows])
    else:
        table = Table(title=f"groups ({len(rows)} shown)")
        for col in ("group", "owner", "plan", "status", "served", "running"):
            table.add_column(col, overflow="fold", justify="right"
                             if col in ("served", "running") else "left")
        for r in rows:
            limit_ = cap(r.plan)
            running = (f"{r.running:,}" if r.max_running is None else
                       f"{r.running:,}/{r.max_running:,}")
            if limit_ is not None:
                running += f" (owner {r.owner_running:,}/{limit_:,})"
            add_row(table, r.group_id, ABSENT if r.owner_id is None else r.owner_id,
                    plan_label(plans, r.plan, with_id=True),
                    "active" if r.active else "paused", format_units(r.served), running)
        console().print(table)
    if more and rows:
        click.echo(safe_text(f"next page: --after {rows[-1].group_id}"), err=as_json)
