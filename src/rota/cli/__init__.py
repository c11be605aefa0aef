"""The ``rota`` command (click + rich): migrations, one-shot runs, the worker, the cron
server, and inspection of jobs, runs, queue depth and schedules. One module per command
group: :mod:`.run` (run, worker, serve), :mod:`.jobs` (enqueue, jobs),
:mod:`.inspection` (migrate, schema, runs, depth, maintain), :mod:`.schedules`
(schedules), :mod:`.groups` (groups set, groups list), :mod:`.verify` (verify),
:mod:`.limits` (limits); :mod:`.app` loads the app and opens the queue, :mod:`.output`
prints, :mod:`.errors` turns failures into one line and an exit code. The commands only
parse, call the library (:mod:`rota.admin`, :class:`rota.Queue`, :func:`rota.maintain`,
:class:`rota.Scheduler`, :func:`rota.rates.rate_states`) and print.

How an application describes its pipeline: an *app* import path ``module:attribute``
(``--app`` or ``ROTA_APP``; the current directory is importable, as with uvicorn) naming
a callable ``build(queue) -> Pipeline`` (or a zero-argument factory of pipelines, which
the cron server calls per request). The CLI builds the :class:`rota.Queue` itself from
``--database-url``/``DATABASE_URL`` and ``--schema``/``ROTA_SCHEMA``; an app that needs
other queue settings (its plans, job types, groups relation, stale window…) says so in
an optional ``queue_settings`` attribute on the callable: a mapping of
:class:`rota.Queue` keyword arguments, or a zero-argument callable returning one::

    def build_pipeline(queue: rota.Queue) -> rota.Pipeline:
        return rota.Pipeline(queue, [rota.Stage("send", 10, 5, send)])

    build_pipeline.queue_settings = {"plans": MY_PLANS, "types": ["send"]}

Exit codes: 0 success; 1 the command ran but reports a problem (a run that stopped with
``error``, a job that cannot be retried or cancelled, a database error other than the
ones below); 2 bad usage or flag values, a broken app or configuration (including a
``--budget`` not below the app's platform timeout), a malformed database URL, an
unreachable database, rota's tables missing, a schema `rota migrate` refuses or fails
to migrate, or a value the database cannot store
(SQLSTATE classes 22 "data exception" and 54 "program limit exceeded", for example a
dedupe key too long for its index); 130 SIGINT (Ctrl-C) stopped a one-shot command
(``error: interrupted``; ``rota run``, ``worker``, ``serve`` and ``dashboard`` take a
first signal as a stop request instead, see :mod:`.run`). Each is one line on stderr:
``error: database unreachable: …`` when no connection could be made or it was lost,
``error: database error: …`` for any other error the database reported. A value the
library refuses is named as the user gave it (``--group``, ``GROUP``, ``ROTA_SCHEMA``;
``none`` for Python's ``None``): :func:`.errors.in_cli_terms`.

Text that comes from the database or the app (job types, errors, plan names…) is shown
literally: never read as rich markup, and control characters are printed escaped
(``\\x1b``), so a job cannot drive the operator's terminal.
"""

from __future__ import annotations

import click

from . import dashboard, groups, inspection, jobs, limits, run, schedules, verify
from .errors import CliConfigError, CliError, RotaGroup, as_cli_error
from .output import safe_text, with_progress

_as_cli_error = as_cli_error  # its name before cli/ was a package


@click.group(cls=RotaGroup)
@click.version_option(package_name="rota", prog_name="rota")
def cli() -> None:
    """rota: fair, crash-safe background pipelines on PostgreSQL."""


for _command in (inspection.migrate, inspection.schema, run.run, run.worker, run.serve,
                 jobs.enqueue, jobs.jobs, inspection.runs, inspection.maintain,
                 inspection.depth, schedules.schedules, dashboard.dashboard,
                 groups.groups):
    cli.add_command(_command)
cli.add_command(limits.limits)  # rate limits (docs/design.md, "Rates")

# The fair claim's contract (rota verify [--repair]).
cli.add_command(verify.verify)


def main() -> None:
    """The ``rota`` console script."""
    cli(prog_name="rota")


__all__ = ["CliConfigError", "CliError", "cli", "main", "safe_text", "with_progress"]
