"""Errors: one line on stderr (``error: …``) and a meaningful exit code (see the exit
codes in :mod:`rota.cli`)."""

from __future__ import annotations

from typing import Any

import click
import psycopg
from psycopg_pool import PoolTimeout

from .. import errors as rota_errors
from ..db import refusal
from ..errors import first_line
from ..redact import redact
from ..store import is_connection_failure
from .output import safe_text


class CliError(click.ClickException):
    """A failure the CLI reports as one line, ``error: …`` on stderr, exit code 1: the
    command ran and its outcome is a problem (a job that cannot be retried, say).
    Connection-string passwords in the message are replaced by ``***``."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(safe_text(redact(message)))

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.message}", err=True)


class CliConfigError(CliError):
    """Bad usage or configuration, a malformed URL or an unreachable database: exit 2."""

    exit_code = 2


#: The exit status of a command stopped by SIGINT (Ctrl-C): 128 + SIGINT, as a shell
#: reports it, and as ``rota run`` exits after a second signal.
EXIT_INTERRUPTED = 130


class CliInterrupted(CliError):
    """SIGINT (Ctrl-C) stopped a command: ``error: interrupted``, exit 130. Not click's
    ``Aborted!`` with exit 1, which ``rota verify`` (violations), ``rota run`` (a run
    that ended in error) and the job commands (an action refused) use for their own
    outcome: a monitoring job must not read an interrupted check as a violation."""

    exit_code = EXIT_INTERRUPTED

    def __init__(self) -> None:
        super().__init__("interrupted")


#: SQLSTATE classes of values the database cannot store: a bad flag value (exit 2).
_INPUT_SQLSTATE_CLASSES = ("22", "54")


def as_cli_error(exc: Exception) -> CliError | None:
    """Translate the exceptions a command can meet into one-line CLI errors (``None``:
    not one of them, let it raise)."""
    # The action's outcome (a job that cannot be retried, say): exit 1.
    if isinstance(exc, rota_errors.JobNotFound | rota_errors.InvalidTransition):
        return CliError(first_line(exc))
    # Bad configuration or input, or no database to act on: exit 2.
    if isinstance(exc, rota_errors.DatabaseUnavailable | rota_errors.ConfigError
                  | rota_errors.InvalidInput | rota_errors.MigrationError):
        return CliConfigError(first_line(exc))
    if isinstance(exc, psycopg.errors.UndefinedTable | psycopg.errors.InvalidSchemaName):
        return CliConfigError(
            f"rota's tables are missing ({first_line(exc)}): run `rota migrate`")
    refused = refusal(exc)
    if refused is not None:  # a FATAL no retry mends: said at once, not as unreachable
        return CliConfigError(f"the database refused the connection: {refused}")
    if is_connection_failure(exc):
        return CliConfigError(f"database unreachable: {first_line(exc)}")
    if isinstance(exc, psycopg.Error):
        state = exc.sqlstate or ""
        cls = CliConfigError if state.startswith(_INPUT_SQLSTATE_CLASSES) else CliError
        code = f" (SQLSTATE {state})" if state else ""
        return cls(f"database error{code}: {first_line(exc)}")
    if isinstance(exc, rota_errors.RotaError):
        return CliError(first_line(exc))
    if isinstance(exc, RecursionError):
        return CliConfigError("input nested too deeply to handle")
    return None


def is_database_error(exc: Exception) -> bool:
    """Whether ``exc`` came from the database or the pool (and is reported as such)."""
    return isinstance(exc, psycopg.Error | PoolTimeout)


class CliUsageError(click.UsageError):
    """Click's usage error (an unknown option or command, a bad flag value) as one line,
    like every other error of the command: ``error: MESSAGE (see 'rota jobs --help')``,
    exit 2, instead of click's usage, hint, blank line and ``Error:`` line."""

    def __init__(self, error: click.UsageError) -> None:
        super().__init__(error.format_message(), error.ctx)

    def show(self, file: Any = None) -> None:
        message = " ".join(self.message.split())
        hint = f" (see '{self.ctx.command_path} --help')" if self.ctx is not None else ""
        click.echo(safe_text(f"error: {message}{hint}"), err=True)


class RotaGroup(click.Group):
    """A click group that turns rota and database errors into :class:`CliError`, and
    click's usage errors into one line (:class:`CliUsageError`)."""

    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra: Any) -> click.Context:
        """Parse the group's own options; a usage error says so in one line."""
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as exc:
            raise exc if isinstance(exc, CliUsageError) else CliUsageError(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.exceptions.Exit:
            raise
        except click.UsageError as exc:
            raise exc if isinstance(exc, CliUsageError) else CliUsageError(exc) from None
        except KeyboardInterrupt:
            # What had not committed is rolled back with the connection (a rebuild of
            # the bookkeeping, a migration and each statement are one transaction).
            raise CliInterrupted() from None
        except Exception as exc:
            translated = as_cli_error(exc)
            if translated is None:
                raise
            raise translated from None
