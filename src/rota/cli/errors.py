"""Errors: one line on stderr (``error: …``) and a meaningful exit code (see the exit
codes in :mod:`rota.cli`)."""

from __future__ import annotations

import re
import shlex
from typing import Any

import click
import psycopg
from click.core import ParameterSource
from psycopg_pool import PoolTimeout

from .. import errors as rota_errors
from ..db import refusal
from ..errors import first_line
from ..redact import redact
from ..store import MISSING, is_connection_failure
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


def same_queue(ctx: click.Context | None = None) -> str:
    """The options a suggested command needs to act on the same queue as this one: each
    of ``--app`` and ``--schema`` given on this command line, as ``" --app X --schema
    Y"`` (shell-quoted; ``""`` when neither was). Values from the environment reach the
    next command by themselves; ``--database-url`` is never repeated (it may hold a
    password).

    Args:
        ctx: the command's context; by default the current one (none: ``""``).
    """
    ctx = ctx if ctx is not None else click.get_current_context(silent=True)
    parts = []
    for name, flag in (("app_spec", "--app"), ("schema", "--schema")):
        given = _taken(ctx, name, (ParameterSource.COMMANDLINE,))
        if given is not None:
            parts.append(f" {flag} {shlex.quote(str(given[0].params[name]))}")
    return "".join(parts)


def as_cli_error(exc: Exception, ctx: click.Context | None = None) -> CliError | None:
    """Translate the exceptions a command can meet into one-line CLI errors (``None``:
    not one of them, let it raise); ``ctx``, the command's context (by default the
    current one), for the options a suggested command repeats (:func:`same_queue`)."""
    # The action's outcome (a job that cannot be retried, say): exit 1.
    if isinstance(exc, rota_errors.JobNotFound | rota_errors.InvalidTransition):
        return CliError(first_line(exc))
    # Bad configuration or input, or no database to act on: exit 2.
    if isinstance(exc, rota_errors.DatabaseUnavailable | rota_errors.ConfigError
                  | rota_errors.InvalidInput | rota_errors.MigrationError):
        return CliConfigError(first_line(exc))
    if isinstance(exc, MISSING):
        return CliConfigError(
            f"rota's tables are missing ({first_line(exc)}): run `rota migrate"
            f"{same_queue(ctx)}`")
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


#: The arguments the API names otherwise than the CLI's parameters that take them
#: (``rota enqueue TYPE``, ``rota jobs --type``, ``rota limits --name``); every other
#: CLI parameter is named as the API's argument it is passed to (``group_id``,
#: ``max_running``, ``schema``…).
CLI_PARAMETER_OF = {"job type": "job_type", "type": "job_type", "rate limit name": "name"}

#: Python's ``None`` and ``an int`` outside quoted text (a value as given, ``'None'``,
#: stays as it is).
_PYTHON_TERMS = re.compile(
    r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|\bNone\b|\ban int\b")

#: Python's terms as the CLI says them (``--max-running none``, a whole number).
_CLI_TERMS = {"None": "none", "an int": "a whole number"}


#: Where a parameter's value came from when the user gave it (not its default).
_FROM_THE_USER = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT,
                  ParameterSource.PROMPT)


def _spelled(ctx: click.Context | None, param: click.Parameter) -> str:
    """How the user gave ``param``: its environment variable when it came from there
    (``ROTA_SCHEMA``), else the option (its long form, ``--max-running``) or the
    argument's metavar (``GROUP``)."""
    assert param.name is not None
    if (ctx is not None and param.envvar
            and ctx.get_parameter_source(param.name) is ParameterSource.ENVIRONMENT):
        return param.envvar if isinstance(param.envvar, str) else param.envvar[0]
    if isinstance(param, click.Argument):
        return param.human_readable_name
    return next((o for o in param.opts if o.startswith("--")), param.opts[0])


def _taken(ctx: click.Context | None, name: str,
           sources: tuple[ParameterSource, ...] = _FROM_THE_USER,
           ) -> tuple[click.Context, click.Parameter] | None:
    """The innermost context whose parameter called ``name`` took its value from one of
    ``sources`` (``rota jobs --app X failed``: the group's), with that parameter;
    ``None`` when none did (a default, or no such parameter)."""
    at = ctx
    while at is not None:
        for param in at.command.params:
            if param.name == name and at.get_parameter_source(name) in sources:
                return at, param
        at = at.parent
    return None


def given_as(ctx: click.Context | None, name: str) -> str | None:
    """How the user gave the parameter called ``name`` (``app_spec``): ``--app``, or
    ``ROTA_APP`` when it came from the environment; the innermost context that took it
    from the user counts (``rota jobs --app X failed``). ``None``: not given (a
    default, or no such parameter)."""
    given = _taken(ctx, name)
    return None if given is None else _spelled(*given)


def in_cli_terms(exc: rota_errors.InvalidInput, ctx: click.Context) -> str | None:
    """The message of ``exc`` as the command line would say it: the argument it begins
    with (:attr:`rota.InvalidInput.argument`) spelled as the user gave it, ``--group``,
    ``GROUP`` or ``ROTA_SCHEMA`` for ``group_id`` or ``schema``, and Python's ``None``
    and ``an int`` as the CLI writes them, ``none`` (``--max-running none``) and ``a
    whole number``.

    Args:
        exc: what the API raised for a value the command passed it.
        ctx: the command's context; its parents' parameters count too (``rota jobs
            --schema X failed``), the innermost one the user gave first.

    Returns:
        The reworded message; ``None`` when the message names no argument, or one no
        parameter of the command took from the user, on the command line or from the
        environment (a default, or a value from the app): then the API's message
        stands.
    """
    message = first_line(exc)
    argument = exc.argument
    if argument is None or not message.startswith(argument):
        return None
    given = _taken(ctx, CLI_PARAMETER_OF.get(argument, argument))
    return None if given is None else as_given(exc, *given)


def as_given(exc: rota_errors.InvalidInput, ctx: click.Context,
             param: click.Parameter) -> str:
    """The message of ``exc``, about the value ``param`` took, in the command line's
    terms (see :func:`in_cli_terms`); for a parameter's own callback, which runs before
    the command (``rota enqueue``'s PAYLOAD_JSON, read as the queue would read it).

    Returns:
        The message, its argument spelled as the user gave ``param``, ``None`` as
        ``none`` and ``an int`` as ``a whole number``; the message as it is when it
        does not begin with its argument.
    """
    message = first_line(exc)
    argument = exc.argument
    if argument is None or not message.startswith(argument):
        return message
    rest = _PYTHON_TERMS.sub(lambda m: _CLI_TERMS.get(m.group(0), m.group(0)),
                             message[len(argument):])
    return _spelled(ctx, param) + rest


def _in_cli_terms_error(exc: Exception, ctx: click.Context) -> CliError | None:
    """``exc`` reworded by :func:`in_cli_terms` as a usage error (exit 2), or ``None``."""
    if not isinstance(exc, rota_errors.InvalidInput):
        return None
    message = in_cli_terms(exc, ctx)
    return None if message is None else CliConfigError(message)


class ValueRefused(click.BadParameter):
    """A value one of rota's parameter types refuses, its message reading on from the
    parameter's name (``must be a whole number from 1 to 1,000, got 0``): said with the
    parameter as the user gave it, ``--limit must be …``, ``ID must be …`` or
    ``ROTA_X must be …`` (:func:`usage_message`), as :func:`in_cli_terms` says what the
    API refuses."""


def usage_message(error: click.UsageError) -> str:
    """click's usage error as the command says it: a value one of rota's types refused
    (:class:`ValueRefused`) after the parameter as the user gave it; another refused
    value (click's ``Invalid value for …``) naming its environment variable when it
    came from there (``'ROTA_FAIR_BY'``, not ``'--fair-by'``); anything else as click
    says it."""
    if isinstance(error, click.BadParameter) and error.param is not None \
            and error.param.name is not None and error.param_hint is None:
        spelled = _spelled(error.ctx, error.param)
        if isinstance(error, ValueRefused):
            return f"{spelled} {error.message}"
        if spelled == error.param.envvar or (error.param.envvar is not None
                                             and spelled in error.param.envvar):
            return f"Invalid value for '{spelled}': {error.message}"
    return error.format_message()


#: A negative whole number, which click's parser takes for an option (``-1``).
_NEGATIVE_NUMBER = re.compile(r"-[0-9]+")


class RotaCommand(click.Command):
    """A ``rota`` command: what the API refuses of the values it was given is said in
    the command line's terms (:func:`in_cli_terms`), exit 2, nothing written. Every
    command of ``rota`` is one (or a :class:`RotaGroup`)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """Parse the command line; a negative number where the command takes a number
        as an argument (``rota jobs show -1``) is refused as that argument's value, not
        as an unknown option ``-1``."""
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            if _NEGATIVE_NUMBER.fullmatch(exc.option_name):
                for param in self.params:
                    if isinstance(param, click.Argument) and not isinstance(
                            param.type, click.types.StringParamType):
                        # Its type refuses it in its own words (or takes it: then
                        # the option stands, as click would have it).
                        param.type.convert(exc.option_name, param, ctx)
                        break
            raise

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; an :class:`rota.InvalidInput` naming one of its parameters
        becomes a :class:`CliConfigError` in its terms, and missing tables the error
        that suggests `rota migrate` for the same queue (others go on to the group)."""
        try:
            return super().invoke(ctx)
        except rota_errors.InvalidInput as exc:
            translated = _in_cli_terms_error(exc, ctx)
            if translated is None:
                raise
            raise translated from None
        except MISSING as exc:
            # Here, where the command's own options are known: the `rota migrate` it
            # suggests names the same queue (same_queue).
            raise as_cli_error(exc, ctx) or exc from None


def is_database_error(exc: Exception) -> bool:
    """Whether ``exc`` came from the database or the pool (and is reported as such)."""
    return isinstance(exc, psycopg.Error | PoolTimeout)


class CliUsageError(click.UsageError):
    """Click's usage error (an unknown option or command, a bad flag value) as one line,
    like every other error of the command: ``error: MESSAGE (see 'rota jobs --help')``,
    exit 2, instead of click's usage, hint, blank line and ``Error:`` line."""

    def __init__(self, error: click.UsageError) -> None:
        super().__init__(usage_message(error), error.ctx)

    def show(self, file: Any = None) -> None:
        message = " ".join(self.message.split())
        hint = f" (see '{self.ctx.command_path} --help')" if self.ctx is not None else ""
        click.echo(safe_text(f"error: {message}{hint}"), err=True)


class RotaGroup(click.Group):
    """A click group that turns rota and database errors into :class:`CliError` (what
    the API refuses of its own parameters' values in the command line's terms, as
    :class:`RotaCommand` does), and click's usage errors into one line
    (:class:`CliUsageError`). Its subcommands are :class:`RotaCommand`."""

    command_class = RotaCommand

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
            translated = _in_cli_terms_error(exc, ctx) or as_cli_error(exc, ctx)
            if translated is None:
                raise
            raise translated from None
