"""Jobs: ``rota enqueue``, and ``rota jobs`` to list them (``failed``: with their last
errors), to ``show`` one with its result and errors, and to ``retry`` or ``cancel``
one. The work is :mod:`rota.admin`'s."""

from __future__ import annotations

import asyncio
import json
import shlex
import sys
from collections.abc import Callable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any, TypeVar

import click
from rich.table import Table

from .. import admin
from ..checks import INT_MAX, MAX_ROW_ID, shown
from ..cost import counted_cost
from ..errors import UnknownGroup, first_line
from ..job import Job, too_deep
from ..queue import Queue
from ..results import JobResult, as_dict
from ..runner.source import pipeline_queue
from .app import Target, load_pipeline, open_queue
from .errors import CliConfigError, RotaCommand, RotaGroup, as_given, same_queue
from .options import WholeNumber, json_option, make_target, target_options, wants_json
from .output import (
    ABSENT,
    add_row,
    compact_table,
    console,
    emit_json,
    plan_label,
    safe_text,
    short,
    utc_time,
)

F = TypeVar("F", bound=Callable[..., Any])

#: A job's id (``jobs.id`` is a bigint).
JOB_ID = WholeNumber(1, MAX_ROW_ID)

#: The most a payload file or stdin is read (the queue refuses payloads over its
#: ``max_payload_bytes``, 1 MiB by default, anyway; this bounds the memory first).
MAX_PAYLOAD_INPUT = 64 * 1024 * 1024


# -- enqueue ----------------------------------------------------------------------------------


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
    """The payload as typed: numbers with a fraction or an exponent are read as Decimals
    (a float would round ``12345678901234567.89``), which the queue stores digit for
    digit (docs/design.md, "Enqueue"). An empty payload (nothing, or only white space,
    on stdin, in the file or as the argument) is said to be empty, not invalid JSON."""
    text = _read_payload_text(value)
    if not text.strip():
        where = (" from stdin" if value == "-" else f" from file {value[1:]!r}"
                 if value.startswith("@") else "")
        raise click.BadParameter(f"the payload{where} is empty (got {shown(text, 40)})"
                                 f": give a JSON value, for example {{}}")
    try:
        return json.loads(text, parse_float=Decimal)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}") from None
    except RecursionError:  # deeper than the queue would accept: say it as it does
        raise CliConfigError(as_given(too_deep(), ctx, param)) from None
    except ValueError as exc:  # an integer past Python's 4,300-digit conversion limit
        reason = first_line(exc).split(";")[0]  # not Python's advice to raise the limit
        raise click.BadParameter(f"cannot read the JSON: {reason}") from None


@click.command(cls=RotaCommand)
@target_options
@click.argument("job_type", metavar="TYPE")
@click.argument("payload", metavar="PAYLOAD_JSON", callback=_parse_payload)
@click.option("--group", "group_id", help="The group the job belongs to (must exist).")
@click.option("--dedupe-key", help="Skip if an open job has this key.")
@click.option("--run-after", callback=_parse_run_after, metavar="ISO8601",
              help="When it becomes due, with a time zone (default now).")
@click.option("--max-attempts", type=WholeNumber(1, INT_MAX), help="Override the default.")
@json_option
def enqueue(database_url: str | None, schema: str | None, app_spec: str | None,
            job_type: str, payload: Any, group_id: str | None, dedupe_key: str | None,
            run_after: datetime | None, max_attempts: int | None, as_json: bool) -> None:
    """Enqueue one job of TYPE with PAYLOAD_JSON.

    PAYLOAD_JSON is the JSON text itself, `-` to read it from stdin, or `@PATH` to read
    it from a file (for payloads longer than a command line allows)."""
    target = make_target(database_url, schema, app_spec)

    async def go() -> Any:
        async with open_queue(target) as queue:
            if target.app is not None:
                # Through the pipeline's queue, the stages' max_attempts apply.
                _, pipeline = await load_pipeline(target, queue)
                check_app_type(target, queue, pipeline, job_type)
                queue = pipeline_queue(pipeline, queue)
            try:
                return await queue.enqueue(job_type, payload, group_id=group_id,
                                           dedupe_key=dedupe_key, run_after=run_after,
                                           max_attempts=max_attempts)
            except UnknownGroup:
                raise unknown_group(queue, group_id) from None

    job = asyncio.run(go())
    if as_json:
        emit_json({"id": job.id if job else None, "duplicate": job is None})
    elif job is None:
        click.echo(safe_text(
            f"not enqueued: an open job already has dedupe key {dedupe_key!r}"))
    else:
        click.echo(safe_text(
            f"enqueued job {job.id} ({job.type}), due {utc_time(job.run_after)} UTC"))


def unknown_group(queue: Queue, group_id: str | None) -> CliConfigError:
    """``--group`` names no group: how to create it from the command line (``rota
    groups set GROUP``), or where, when the queue reads the application's groups
    relation (which ``rota groups set`` does not write)."""
    if queue.external_groups:
        how = f"a row of the groups relation {queue.store.groups_ident.as_string(None)}"
    else:
        # The same --app and --schema, when given on the command line (from the
        # environment they are there for the next command too).
        gid = str(group_id)
        how = (f"rota groups set{same_queue()} {'-- ' if gid.startswith('-') else ''}"
               f"{shlex.quote(gid)}")
    return CliConfigError(f"unknown group {group_id!r} (--group): create it first "
                          f"({how}) or enqueue without --group")


def check_app_type(target: Target, queue: Queue, pipeline: Any, job_type: str) -> None:
    """Refuse to enqueue a type the app given (``--app``/``ROTA_APP``) would never run:
    none of its stages claims it, and the queue does not declare it (``types``, for jobs
    another process runs). Without an app any type may be enqueued.

    Raises:
        CliConfigError: ``job_type`` is unknown to the app (the message names its stage
            types); nothing is enqueued.
    """
    stage_types = [s.type for s in pipeline.stages]
    if job_type in stage_types or (queue.types is not None and job_type in queue.types):
        return
    extra = sorted(set(queue.types or ()) - set(stage_types))
    declared = f"; the queue also declares {', '.join(extra)}" if extra else ""
    raise CliConfigError(
        f"unknown job type {job_type!r}: {target.app_given_as} {target.app_spec!r} runs "
        f"the stage types {', '.join(stage_types)}{declared} (without --app/ROTA_APP any "
        "type may be enqueued)")


# -- jobs: list ---------------------------------------------------------------------------------


async def _page(target: Target, **filters: Any) -> admin.JobPage:
    async with open_queue(target) as queue:
        return await admin.list_jobs(queue, **filters)


def _json_rows(page: admin.JobPage) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = [{
        "id": j.id, "type": j.type, "group_id": j.group_id, "plan": _plan_of(page, j),
        "status": j.status, "attempts": j.attempts, "max_attempts": j.max_attempts,
        "deferrals": j.deferrals, "run_after": j.run_after, "locked_at": j.locked_at,
        "created_at": j.created_at, "finished_at": j.finished_at,
        "last_error": j.last_error, "dedupe_key": j.dedupe_key,
        "give_up_pending": j.give_up_pending,
    } for j in page.jobs]
    # A row that cannot be read is listed by id with what could not be read, in its
    # place: one bad row never hides the page (docs/design.md, "Bad data belongs to its job").
    rows += [{"id": u.job_id, "unreadable": u.problems} for u in page.unreadable]
    return sorted(rows, key=lambda r: -r["id"])


def _print_jobs(table: Table, page: admin.JobPage, columns: int,
                errors: list[tuple[int, str]]) -> None:
    """Print a listing as ``rota runs`` does, readable at 80 columns: the figures in
    ``table``, then each job's error (and each unreadable row's problems) in a second
    table, where the text has the width."""
    notes = compact_table()
    notes.add_column("job", no_wrap=True, justify="right")
    notes.add_column("last error", overflow="fold")
    for job_id, error in errors:
        if error:
            add_row(notes, job_id, error)
    for u in page.unreadable:
        detail = "; ".join(f"{k}: {v}" for k, v in u.problems.items())
        add_row(table, u.job_id, *(["?"] * (columns - 1)), style="red")
        add_row(notes, u.job_id, f"unreadable: {detail}", style="red")
    out = console()
    out.print(table)
    if notes.row_count:
        out.print()
        out.print(notes)


def _plan_of(page: admin.JobPage, job: Job) -> str | None:
    return None if job.group_id is None else page.group_plans.get(job.group_id)


def _next_page(page: admin.JobPage, as_json: bool) -> None:
    """Say how to get the next page: on stderr under --json, so stdout stays JSON."""
    if page.next_before_id is not None:
        click.echo(f"next page: --before {page.next_before_id}", err=as_json)


def _filters(f: F) -> F:
    f = click.option("--before", "before_id", type=JOB_ID, metavar="ID",
                     help="Only jobs older than job ID: the cursor of the next page, "
                          "which a page prints when there is one.")(f)
    f = click.option("--limit", "-n", type=WholeNumber(1, admin.MAX_LIST_LIMIT), default=50,
                     show_default=True, help="The most jobs shown.")(f)
    f = click.option("--group", "group_id", help="Only this group.")(f)
    f = click.option("--type", "job_type", help="Only this job type.")(f)
    return f


@click.group(cls=RotaGroup, invoke_without_command=True)
@target_options
@click.option("--status", type=click.Choice(admin.JOB_STATUSES),
              help="Only jobs with this status.")
@click.option("--id", "job_id", type=JOB_ID, metavar="ID",
              help="Only the job with this id.")
@_filters
@json_option
@click.pass_context
def jobs(ctx: click.Context, database_url: str | None, schema: str | None,
         app_spec: str | None, status: str | None, job_id: int | None,
         job_type: str | None, group_id: str | None, limit: int, before_id: int | None,
         as_json: bool) -> None:
    """List jobs, newest first (or: jobs failed / jobs show ID / jobs retry ID /
    jobs cancel ID)."""
    if ctx.invoked_subcommand is not None:
        return
    target = make_target(database_url, schema, app_spec)
    page = asyncio.run(_page(target, status=status, job_id=job_id, type=job_type,
                             group_id=group_id, limit=limit, before_id=before_id))
    if as_json:
        emit_json(_json_rows(page))
        _next_page(page, as_json)
        return
    plans = target.plans()
    table = compact_table(f"jobs ({len(page.jobs) + len(page.unreadable)} shown)")
    for col in ("id", "type", "group", "plan", "status", "attempts", "deferrals",
                "run after (UTC)"):
        table.add_column(col, overflow="fold", justify="right" if col in (
            "id", "attempts", "deferrals") else "left")
    for j in page.jobs:
        add_row(table, j.id, j.type, j.group_id or ABSENT,
                plan_label(plans, _plan_of(page, j)), j.status,
                f"{j.attempts}/{j.max_attempts}", j.deferrals, utc_time(j.run_after))
    _print_jobs(table, page, 8, [(j.id, short(j.last_error)) for j in page.jobs])
    _next_page(page, as_json)


@jobs.command("failed")
@target_options
@_filters
@json_option
def jobs_failed(database_url: str | None, schema: str | None, app_spec: str | None,
                job_type: str | None, group_id: str | None, limit: int,
                before_id: int | None, as_json: bool) -> None:
    """Failed jobs with their last errors, newest first.

    The give-up hook column: `owed` (not yet run), `ran`, `none` (the type has no
    hook), `not owed` (handled; pass --app to tell `ran` from `none`)."""
    target = make_target(database_url, schema, app_spec)
    as_json = wants_json(as_json)

    async def go() -> tuple[admin.JobPage, dict[str, Any]]:
        async with open_queue(target) as queue:
            hooks: Mapping[str, Any] = {}
            if target.app is not None:
                _, pipeline = await load_pipeline(target, queue)
                hooks = pipeline_queue(pipeline, queue).give_up_hooks  # the app's
            return (await admin.list_jobs(queue, status="failed", type=job_type,
                                          group_id=group_id, limit=limit,
                                          before_id=before_id),
                    dict(hooks))

    page, hooks = asyncio.run(go())

    def hook_state(j: Job) -> str:
        return admin.give_up_hook_state(j.type, j.status, j.give_up_pending, hooks)

    if as_json:
        rows = _json_rows(page)
        states = {j.id: hook_state(j) for j in page.jobs}
        for row in rows:
            if row["id"] in states:
                row["give_up_hook"] = states[row["id"]]
        emit_json(rows)
        _next_page(page, as_json)
        return
    table = compact_table(f"failed jobs ({len(page.jobs) + len(page.unreadable)} shown)")
    for col in ("id", "type", "group", "attempts", "finished (UTC)", "give-up hook"):
        table.add_column(col, overflow="fold", justify="right" if col in (
            "id", "attempts") else "left")
    for j in page.jobs:
        add_row(table, j.id, j.type, j.group_id or ABSENT, f"{j.attempts}/{j.max_attempts}",
                utc_time(j.finished_at), hook_state(j))
    _print_jobs(table, page, 6, [(j.id, j.last_error or "") for j in page.jobs])
    _next_page(page, as_json)


# -- jobs: retry, cancel -------------------------------------------------------------------------


def _job_command(name: str) -> Callable[[Callable[..., Any]], click.Command]:
    """``rota jobs NAME ID``: a command on one job, with the target options and ``--json``."""
    def decorate(f: Callable[..., Any]) -> click.Command:
        f = click.argument("job_id", type=JOB_ID, metavar="ID")(json_option(f))
        return jobs.command(name)(target_options(f))
    return decorate


@_job_command("show")
def jobs_show(database_url: str | None, schema: str | None, app_spec: str | None,
              job_id: int, as_json: bool) -> None:
    """Job ID with its cost, its return value and every failed attempt's error and
    traceback. The cost is what the job counts in its group's served count: the expected
    cost while it runs, what it was charged once done (docs/design.md, "Cost")."""
    target = make_target(database_url, schema, app_spec)
    as_json = wants_json(as_json)

    async def go() -> JobResult:
        async with open_queue(target) as queue:
            return await admin.show_job(queue, job_id)

    found = asyncio.run(go())
    if as_json:
        emit_json(as_dict(found))
        return
    j = found.job
    out = console()
    table = Table(title=f"job {j.id}", show_header=False)
    table.add_column("field")
    table.add_column("value", overflow="fold")
    for name, value in [
            ("type", j.type), ("group", j.group_id or ABSENT), ("status", j.status),
            ("attempts", f"{j.attempts}/{j.max_attempts}"), ("deferrals", j.deferrals),
            ("cost", _cost_text(j)),
            ("enqueued (UTC)", utc_time(j.created_at)),
            ("run after (UTC)", utc_time(j.run_after)),
            ("started (UTC)", utc_time(found.started_at)),
            ("finished (UTC)", utc_time(j.finished_at)),
            ("run", j.run_id or "—"),
            ("payload", json.dumps(j.payload, ensure_ascii=False, default=str)),
            ("result", "—" if found.value is None
             else json.dumps(found.value, ensure_ascii=False))]:
        add_row(table, name, value)
    out.print(table)
    if not found.errors:
        click.echo("no failed attempts")
    for e in found.errors:
        click.echo(safe_text(f"attempt {e.attempt} failed {utc_time(e.failed_at)} UTC "
                             f"(run {e.run_id or '—'}): {e.error}"))
        if e.traceback:
            # A traceback's lines, each shown literally (no terminal control).
            for line in e.traceback.rstrip("\n").split("\n"):
                click.echo("    " + safe_text(line))


def _cost_text(job: Job) -> str:
    """A job's cost for ``rota jobs show``: what it counts in its group's and owner's
    served counts (:func:`rota.cost.counted_cost`; docs/design.md, "Cost"), exactly,
    with what that figure is."""
    cost = counted_cost(job.status, job.cost)
    if cost is None:
        return f"{ABSENT} (counted from its claim)" if job.status == "pending" else \
            f"{ABSENT} (a failed job is not charged)"
    units = f"{cost.normalize():f}"
    if job.status == "running":
        return f"{units} (expected; what it is charged replaces it when it completes)"
    return f"{units} (charged)"


@_job_command("retry")
def jobs_retry(database_url: str | None, schema: str | None, app_spec: str | None,
               job_id: int, as_json: bool) -> None:
    """Put failed job ID back to pending, due now, with attempts reset.

    A give-up hook still owed for it is cancelled: the job has not given up any more."""
    target = make_target(database_url, schema, app_spec)
    as_json = wants_json(as_json)

    async def go() -> admin.RetryResult:
        async with open_queue(target) as queue:
            return await admin.retry_job(queue, job_id)

    result = asyncio.run(go())
    if as_json:
        emit_json({"id": job_id, "status": result.job.status,
                   "giveUpHookCancelled": result.give_up_hook_cancelled})
    else:
        note = "; its owed give-up hook is cancelled" if result.give_up_hook_cancelled else ""
        click.echo(safe_text(
            f"job {job_id} ({result.job.type}) is pending again, due now{note}"))


@_job_command("cancel")
def jobs_cancel(database_url: str | None, schema: str | None, app_spec: str | None,
                job_id: int, as_json: bool) -> None:
    """Cancel pending job ID: it ends failed ('cancelled') and its give-up hook is owed
    (run now when --app registers one, else by the next maintenance; with --app, a type
    whose stage has no hook is said to have none)."""
    target = make_target(database_url, schema, app_spec)
    as_json = wants_json(as_json)

    async def go() -> tuple[Job, str | None]:
        async with open_queue(target) as queue:
            job = await admin.cancel_job(queue, job_id)
            if target.app is None:
                return job, None
            _, pipeline = await load_pipeline(target, queue)
            # The pipeline's queue runs the app's give-up hooks; a stage without one
            # has a no-op, whose give-up is recorded as handled: "none", not "ran".
            hooks = pipeline_queue(pipeline, queue)
            ran = await hooks.run_give_up_hooks([job_id])
            return job, admin.give_up_hook_state(job.type, "failed", not ran,
                                                 hooks.give_up_hooks)

    job, state = asyncio.run(go())
    if as_json:
        emit_json({"id": job_id, "status": job.status, "giveUpHookRan": state == "ran",
                   "giveUpHook": state or "owed"})
    else:
        hook = {"ran": "its give-up hook ran",
                "none": "its type has no give-up hook",
                "owed": "its give-up hook is owed"}.get(
                    state or "", "its give-up hook, if the app has one, is owed (run with "
                    "--app, by `rota maintain --app` or by a worker)")
        click.echo(safe_text(f"job {job_id} ({job.type}) cancelled; {hook}"))
