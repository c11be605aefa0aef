"""CLI bad input beyond tests/test_cli.py: payloads, due times, integers and names that
the database could not hold, and more ways a DATABASE_URL can be wrong. Each is one line
on stderr, exit code 2, nothing on stdout, and nothing written."""

from __future__ import annotations

from pathlib import Path

import click
import psycopg
import pytest
from click.testing import CliRunner, Result
from psycopg import sql
from psycopg.conninfo import make_conninfo

from rota import DatabaseUnavailable, InvalidInput, Queue, admin
from rota.cli import cli
from rota.cli.errors import RotaCommand, RotaGroup, as_given
from rota.db import CONNINFO_CHOICES, check_conninfo

APP = "tests.cli_app:build_pipeline"


def rota(url: str, schema: str, *args: str, **env: str | None) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False, env={
        "DATABASE_URL": url, "ROTA_SCHEMA": schema, "ROTA_APP": None, "COLUMNS": "250",
        **env})


def one_line_error(result: Result, starts: str) -> None:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith(starts), line


def job_count(url: str, schema: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}.jobs")
                           .format(sql.Identifier(schema))).fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def migrated(database_url: str, schema: str) -> tuple[str, str]:
    assert rota(database_url, schema, "migrate").exit_code == 0
    return database_url, schema


@pytest.mark.parametrize(("args", "starts"), [
    (["enqueue", "echo", '{"s": "a\\u0000b"}'],
     "error: PAYLOAD_JSON['s'] contains a NUL character (\\u0000), which PostgreSQL jsonb"),
    (["enqueue", "echo", '{"s": "\\ud800"}'], "error: PAYLOAD_JSON['s'] contains a lone surrogate"),
    (["enqueue", "echo", '{"s": Infinity}'], "error: PAYLOAD_JSON['s'] is inf"),
    (["enqueue", "echo", '{"s": -1e99999}'],
     "error: PAYLOAD_JSON['s'] is a Decimal with 100000 digits before the point; at most 4300"),

    (["enqueue", "echo", '{"s": "' + "x" * (1024 * 1024) + '"}'],
     "error: PAYLOAD_JSON is 1048585 bytes, larger than the maximum 1048576"),
    (["enqueue", "echo", "{}", "--run-after", "9999-12-31T23:00:00+00:00"],
     "error: --run-after=9999-12-31T23:00:00+00:00 is out of range"),
    (["enqueue", "echo", "{}", "--run-after", "0001-01-01T00:00:00+00:00"],
     "error: --run-after=0001-01-01T00:00:00+00:00 is out of range"),
    (["enqueue", "echo", "{}", "--max-attempts", str(2**31)],
     "error: --max-attempts must be a whole number from 1 to 2,147,483,647, got "
     "2147483648"),
    (["enqueue", "", "{}"], "error: TYPE must be a non-empty string"),
    (["enqueue", "echo", "{}", "--dedupe-key", ""], "error: --dedupe-key must be a non-empty"),
    (["enqueue", "echo", "{}", "--group", ""], "error: --group must be a non-empty string"),
    (["jobs", "--schema", "x; drop table jobs"], "error: --schema 'x; drop table jobs' is not"),
], ids=["nul", "surrogate", "infinity", "huge-exponent", "oversize", "year-9999",
        "year-1", "max-attempts-overflow", "empty-type", "empty-dedupe-key", "empty-group",
        "schema-injection"])
def test_bad_values_are_one_line_exit_2_and_nothing_written(
    migrated: tuple[str, str], args: list[str], starts: str
) -> None:
    url, schema = migrated
    one_line_error(rota(url, schema, *args), starts)
    assert job_count(url, schema) == 0


def test_an_integer_python_cannot_read_is_refused_as_a_flag_value(
    migrated: tuple[str, str]
) -> None:
    url, schema = migrated
    result = rota(url, schema, "enqueue", "echo", '{"n": ' + "9" * 5000 + "}")
    assert (result.exit_code, result.stdout) == (2, "")
    assert ("Invalid value for 'PAYLOAD_JSON': cannot read the JSON: Exceeds the limit "
            "(4300 digits) for integer string conversion: value has 5000 digits"
            in result.stderr), result.stderr
    assert "set_int_max_str_digits" not in result.stderr
    assert job_count(url, schema) == 0


@pytest.mark.parametrize(("payload", "stdin", "file", "said"), [
    ("-", "", None, "the payload from stdin is empty (got '')"),
    ("-", " \n", None, "the payload from stdin is empty (got ' \\n')"),
    ("-", "\ufeff", None, "the payload from stdin is empty (got '')"),  # a BOM alone
    ("@", None, "", "the payload from file '{path}' is empty (got '')"),
    ("", None, None, "the payload is empty (got '')"),
], ids=["stdin", "stdin-blank", "stdin-bom", "file", "argument"])
def test_an_empty_payload_is_said_to_be_empty(
    migrated: tuple[str, str], tmp_path: Path, payload: str, stdin: str | None,
    file: str | None, said: str,
) -> None:
    """`rota enqueue t -` with nothing on stdin said "not valid JSON: Expecting value:
    line 1 column 1 (char 0)"."""
    url, schema = migrated
    path = tmp_path / "payload.json"
    if file is not None:
        path.write_text(file)
        payload = f"@{path}"
    result = CliRunner().invoke(cli, ["enqueue", "t", payload], input=stdin,
                                prog_name="rota", catch_exceptions=False, env={
                                    "DATABASE_URL": url, "ROTA_SCHEMA": schema,
                                    "ROTA_APP": None})
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", (
        f"error: Invalid value for 'PAYLOAD_JSON': {said.format(path=path)}: give a JSON "
        "value, for example {} (see 'rota enqueue --help')\n"))
    assert job_count(url, schema) == 0


def test_a_bad_schema_from_the_environment_is_refused_the_same_way(
    migrated: tuple[str, str]
) -> None:
    url, _ = migrated
    one_line_error(rota(url, "1bad", "jobs"),
                   "error: ROTA_SCHEMA '1bad' is not a valid identifier")


def test_a_bad_connection_option_is_one_line_exit_2(database_url: str, schema: str) -> None:
    result = rota(make_conninfo(database_url, sslmode="bogus"), schema, "jobs")
    one_line_error(result, "error: malformed database URL: sslmode must be one of disable, "
                           "allow, prefer, require, verify-ca, verify-full, got 'bogus'")


ACCEPTED_URLS = ("postgresql://[user@]host[:port][/dbname] or postgres://…, or libpq's "
                 "key=value form: host=… port=… dbname=…")
SSLMODES = "disable, allow, prefer, require, verify-ca, verify-full"


@pytest.mark.parametrize(("url", "said"), [
    ("localhost:5432/db", "malformed database URL 'localhost:5432/db': it has no "
     f"postgresql:// scheme and is not key=value text (rota needs {ACCEPTED_URLS})"),
    ("u:Pa55-Wd@localhost:5432/db", "malformed database URL 'u:***@localhost:5432/db': it "
     f"has no postgresql:// scheme and is not key=value text (rota needs {ACCEPTED_URLS})"),
    ("postgresql://x@127.0.0.1/test?sslmode=bogus",
     f"malformed database URL: sslmode must be one of {SSLMODES}, got 'bogus'"),
    ("postgresql://x:Pa55-Wd@127.0.0.1/test?sslmode=Require",
     f"malformed database URL: sslmode must be one of {SSLMODES}, got 'Require'"),
    ("host=127.0.0.1 password=Pa55-Wd sslmode=bogus",
     f"malformed database URL: sslmode must be one of {SSLMODES}, got 'bogus'"),
    ("postgresql://x@127.0.0.1/test?target_session_attrs=primary-only",
     "malformed database URL: target_session_attrs must be one of any, read-write, "
     "read-only, primary, standby, prefer-standby, got 'primary-only'"),
    ("postgresql://x@127.0.0.1/test?connect_timeout=10s",
     "malformed database URL: connect_timeout must be a whole number, got '10s'"),
], ids=["no-scheme", "no-scheme-password", "sslmode", "sslmode-case", "sslmode-key-value",
        "target-session-attrs", "connect-timeout"])
def test_a_url_libpq_would_refuse_says_what_and_what_is_accepted(
        schema: str, url: str, said: str) -> None:
    """libpq's text was all they got: `missing "=" after "localhost:5432/db" in connection
    info string`, and for a bad sslmode "database unreachable: connection is bad: invalid
    sslmode value" (a Queue's pool retried it for 30 s). Now one line from the CLI and
    the same error from Queue(...) at once, the password never shown."""
    result = rota(url, schema, "jobs")
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", f"error: {said}\n")
    with pytest.raises(DatabaseUnavailable) as raised:
        Queue(url)
    assert str(raised.value) == said
    assert "Pa55" not in result.stderr and "Pa55" not in str(raised.value)


def test_every_accepted_value_of_a_checked_option_is_accepted() -> None:
    """The values rota checks are libpq's own (a value libpq takes is never refused)."""
    for name, values in CONNINFO_CHOICES.items():
        for value in values:
            assert check_conninfo(make_conninfo("host=127.0.0.1", **{name: value}))
    for value in ("TLSv1.2", "tlsv1.3", ""):
        assert check_conninfo(f"host=127.0.0.1 ssl_min_protocol_version='{value}'")
    for value in (" 5 ", "-1", "+3"):
        assert check_conninfo(make_conninfo("host=127.0.0.1", connect_timeout=value))


@pytest.mark.parametrize("url", [
    "postgresql://postgres@no-such-host.invalid:5432/test",
    "mysql://root@localhost/db",
    "postgresql://postgres@127.0.0.1:1/test?connect_timeout=5",
], ids=["unresolvable-host", "other-database", "closed-port"])
def test_wrong_database_urls_are_one_line_exit_2(schema: str, url: str) -> None:
    result = rota(url, schema, "enqueue", "echo", "{}")
    assert result.exit_code == 2 and result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith(("error: database unreachable: ", "error: malformed database URL",
                            "error: not a PostgreSQL URL"))


def test_the_database_password_never_appears_in_the_error(schema: str) -> None:
    secret = "pa55-Word-ZZ"
    result = rota(f"postgresql://rota:{secret}@127.0.0.1:1/rota?connect_timeout=5", schema,
                  "jobs")
    one_line_error(result, "error: database unreachable: ")
    assert secret not in result.stderr


@pytest.mark.parametrize("args", [
    ["migrate", "--schema", ""],
    ["depth", "--schema", ""],
    ["migrate", "--database-url", ""],
    ["jobs", "--schema", "", "failed"],
])
def test_an_empty_option_is_refused_not_taken_for_the_default(
        database_url: str, args: list[str]) -> None:
    """`--schema "$UNSET"` used to fall back to the default schema, rota, and migrate it."""
    result = rota(database_url, "", *args, ROTA_SCHEMA=None)
    option = args[args.index("") - 1]
    one_line_error(result, f"error: {option} is empty: give a value, or leave the option "
                           f"out for the default")


BIG_ID = str(2**63)
IDENTIFIER_RULE = "(letters, digits and _, not starting with a digit, 1 to 63 characters)"


@pytest.mark.parametrize(("args", "env", "error"), [
    (["groups", "set", ""], {}, "GROUP must be a non-empty string, got ''"),
    (["groups", "set", "g", "--owner", ""], {}, "--owner must be a non-empty string, got ''"),
    (["groups", "list", "--after", ""], {}, "--after must be a non-empty string, got ''"),
    (["enqueue", "", "{}"], {}, "TYPE must be a non-empty string, got ''"),
    (["enqueue", "echo", "{}", "--group", ""], {},
     "--group must be a non-empty string, got ''"),
    (["enqueue", "echo", "{}", "--run-after", "9999-12-31T23:00:00+00:00"], {},
     "--run-after=9999-12-31T23:00:00+00:00 is out of range: due times must lie between "
     "0001-01-02 and 9999-12-30 (UTC)"),
    (["enqueue", "echo", "[" * 300 + "]" * 300], {},
     "PAYLOAD_JSON is nested deeper than 256 levels (or contains itself), more than can be "
     "read back"),
    (["jobs", "--type", ""], {}, "--type must be a non-empty string, got ''"),
    (["jobs", "failed", "--group", ""], {}, "--group must be a non-empty string, got ''"),
    (["limits", "--name", ""], {}, "--name must be a non-empty string, got ''"),
    (["jobs", "--schema", "1bad", "failed"], {"ROTA_SCHEMA": None},
     f"--schema '1bad' is not a valid identifier {IDENTIFIER_RULE}"),
    (["depth"], {"ROTA_SCHEMA": "1bad"},
     f"ROTA_SCHEMA '1bad' is not a valid identifier {IDENTIFIER_RULE}"),
], ids=["group-argument", "owner", "after", "type-argument", "group-option",
        "run-after", "payload", "type-option", "failed-group", "limit-name",
        "schema-of-the-group", "schema-from-env"])
def test_what_the_api_refuses_is_said_in_the_command_line_s_terms(
    migrated: tuple[str, str], args: list[str], env: dict[str, str | None], error: str
) -> None:
    """The API's messages name Python's arguments (``max_running must be None or an
    int``, ``group_id must be a non-empty string``): the CLI says the option or argument
    as it was given (``--max-running``, ``GROUP``, ``ROTA_SCHEMA``) and ``none`` for
    ``None``. Still one line, exit 2, nothing written."""
    url, schema = migrated
    result = rota(url, schema, *args, **env)
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", f"error: {error}\n")
    assert job_count(url, schema) == 0
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute(sql.SQL("SELECT count(*) FROM {}.groups")
                            .format(sql.Identifier(schema))).fetchone() == (0,)


async def test_the_api_keeps_python_s_terms(queue: Queue) -> None:
    with pytest.raises(InvalidInput) as raised:
        await admin.set_group(queue, "g", max_running=0)
    assert (str(raised.value), raised.value.argument) == (
        "max_running must be None or an int from 1 to 2,147,483,647, got 0", "max_running")
    with pytest.raises(InvalidInput) as raised:
        await queue.enqueue("t", {}, group_id="")
    assert (str(raised.value), raised.value.argument) == (
        "group_id must be a non-empty string, got ''", "group_id")


BIG = "9,223,372,036,854,775,807"


@pytest.mark.parametrize(("args", "error"), [
    (["runs", "-n", "0"], "--limit must be a whole number from 1 to 1,000, got 0"),
    (["jobs", "-n", "0"], "--limit must be a whole number from 1 to 1,000, got 0"),
    (["jobs", "--limit", "1001"], "--limit must be a whole number from 1 to 1,000, got 1001"),
    (["limits", "-n", "0"], "--limit must be a whole number from 1 to 10,000, got 0"),
    (["jobs", "show", "abc"], f"ID must be a whole number from 1 to {BIG}, got 'abc'"),
    (["jobs", "show", "0"], f"ID must be a whole number from 1 to {BIG}, got 0"),
    (["jobs", "retry", BIG_ID], f"ID must be a whole number from 1 to {BIG}, got {BIG_ID}"),
    (["jobs", "--id", BIG_ID], f"--id must be a whole number from 1 to {BIG}, got {BIG_ID}"),
    (["jobs", "--before", "0"], f"--before must be a whole number from 1 to {BIG}, got 0"),
    (["enqueue", "echo", "{}", "--max-attempts", "0"],
     "--max-attempts must be a whole number from 1 to 2,147,483,647, got 0"),
    (["enqueue", "echo", "{}", "--max-attempts", "3000000000"],
     "--max-attempts must be a whole number from 1 to 2,147,483,647, got 3000000000"),
    (["enqueue", "echo", "{}", "--max-attempts", "2.5"],
     "--max-attempts must be a whole number from 1 to 2,147,483,647, got '2.5'"),
    (["groups", "set", "g", "--max-running", "0"],
     "--max-running must be none or a whole number from 1 to 2,147,483,647, got 0"),
    (["groups", "set", "g", "--max-running", "2147483648"],
     "--max-running must be none or a whole number from 1 to 2,147,483,647, got 2147483648"),
    (["serve", "--port", "70000"], "--port must be a whole number from 0 to 65,535, got 70000"),
], ids=["runs-limit", "jobs-n", "jobs-limit", "limits-limit", "id-not-a-number", "id-zero",
        "id-too-big", "id-option", "before", "max-attempts-zero", "max-attempts-too-big",
        "max-attempts-fraction", "max-running-zero", "max-running-too-big", "port"])
def test_whole_numbers_are_refused_in_one_wording(
    migrated: tuple[str, str], args: list[str], error: str
) -> None:
    """click said "0 is not in the range 1<=x<=1000" or "'abc' is not a valid integer
    range" and the API "must be at most 2147483647" for the same kind of value: every
    integer option or argument now says its range as a whole number, named as given
    (still a usage error, naming the command's help)."""
    url, schema = migrated
    result = CliRunner().invoke(cli, args, prog_name="rota", env={
        "DATABASE_URL": url, "ROTA_SCHEMA": schema, "ROTA_APP": None})
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr.startswith(f"error: {error} (see 'rota "), result.stderr
    assert result.stderr.endswith(" --help')\n") and result.stderr.count("\n") == 1
    assert job_count(url, schema) == 0


@pytest.mark.parametrize("args", [["jobs", "show", "-1"], ["jobs", "retry", "-5"],
                                  ["jobs", "cancel", "1", "-2"]])
def test_a_negative_id_is_refused_as_an_id(migrated: tuple[str, str], args: list[str]) -> None:
    """`rota jobs show -1` said "No such option '-1'"."""
    url, schema = migrated
    result = CliRunner().invoke(cli, args, prog_name="rota", env={
        "DATABASE_URL": url, "ROTA_SCHEMA": schema, "ROTA_APP": None})
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", (
        f"error: ID must be a whole number from 1 to {BIG}, got {args[-1]} "
        f"(see 'rota jobs {args[1]} --help')\n"))


def test_an_unknown_group_says_how_to_create_it(migrated: tuple[str, str]) -> None:
    """The API's hint (queue.upsert_group in Python) said as the command line's: the
    option, and the command that creates the group (with the --schema given)."""
    url, schema = migrated
    result = rota(url, schema, "enqueue", "echo", "{}", "--group", "nosuch")
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", (
        "error: unknown group 'nosuch' (--group): create it first (rota groups set nosuch) "
        "or enqueue without --group\n"))
    result = rota(url, "", "enqueue", "echo", "{}", "--group", "-it's", "--schema", schema,
                  ROTA_SCHEMA=None)
    assert result.stderr == (
        f"error: unknown group \"-it's\" (--group): create it first (rota groups set "
        f"--schema {schema} -- '-it'\"'\"'s') or enqueue without --group\n")
    assert job_count(url, schema) == 0
    # As said: the group is created, then the job is enqueued in it.
    assert rota(url, schema, "groups", "set", "nosuch").exit_code == 0
    assert rota(url, schema, "enqueue", "echo", "{}", "--group", "nosuch").exit_code == 0
    assert job_count(url, schema) == 1


def test_a_suggested_command_acts_on_the_same_queue(migrated: tuple[str, str]) -> None:
    """A command the CLI suggests repeats the --app and --schema given on the command
    line: `rota groups set nosuch` without the --app that named the queue went to
    another schema, and `run rota migrate` without --schema migrated schema rota."""
    url, schema = migrated
    result = rota(url, schema, "enqueue", "--app", APP, "echo", "{}", "--group", "nosuch")
    assert (result.exit_code, result.stderr) == (2, (
        "error: unknown group 'nosuch' (--group): create it first (rota groups set --app "
        f"{APP} nosuch) or enqueue without --group\n"))
    result = rota(url, "", "jobs", "--schema", f"{schema}_none", ROTA_SCHEMA=None)
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", (
        f"error: rota's tables are missing (relation \"{schema}_none.jobs\" does not "
        f"exist): run `rota migrate --schema {schema}_none`\n"))
    # From the environment, the next command has it too: nothing repeated.
    result = rota(url, f"{schema}_none", "jobs")
    assert result.stderr.endswith(": run `rota migrate`\n"), result.stderr


@pytest.mark.parametrize(("args", "env", "named"), [
    (["depth"], {"ROTA_APP": "bad"}, "ROTA_APP"),
    (["depth", "--app", "bad"], {}, "--app"),
    (["jobs", "--app", "bad", "failed"], {}, "--app"),
], ids=["environment", "option", "option-of-the-group"])
def test_a_bad_app_is_named_as_it_was_given(
    migrated: tuple[str, str], args: list[str], env: dict[str, str], named: str
) -> None:
    """ROTA_APP=bad said "app 'bad' must look like …", not where 'bad' came from."""
    url, schema = migrated
    result = rota(url, schema, *args, **env)
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", (
        f"error: {named} 'bad' must look like module:attribute (for example "
        "myapp.jobs:build_pipeline)\n"))


def test_the_api_s_int_is_said_as_a_whole_number() -> None:
    command = cli.commands["groups"].commands["set"]  # type: ignore[attr-defined]
    [param] = [p for p in command.params if p.name == "max_running"]
    exc = InvalidInput("max_running must be None or an int from 1 to 9, got 'an int'",
                       argument="max_running")
    assert as_given(exc, click.Context(command), param) == (
        "--max-running must be none or a whole number from 1 to 9, got 'an int'")


def test_only_python_s_none_is_spelled_none() -> None:
    """A value given as None (quoted in the message) stays as it was given."""
    command = cli.commands["groups"].commands["set"]  # type: ignore[attr-defined]
    [param] = [p for p in command.params if p.name == "max_running"]
    exc = InvalidInput("max_running must be None, not 'None' or \"None\"",
                       argument="max_running")
    assert as_given(exc, click.Context(command), param) == (
        "--max-running must be none, not 'None' or \"None\"")


def test_every_command_says_the_api_s_refusals_in_its_own_terms() -> None:
    """Every command is a RotaCommand (or a RotaGroup, whose commands are), so a command
    added later rewords the API's errors too."""
    def commands(group: click.Group) -> list[click.Command]:
        found: list[click.Command] = []
        for command in group.commands.values():
            found.append(command)
            if isinstance(command, click.Group):
                found += commands(command)
        return found

    everything = commands(cli)
    assert len(everything) > 20
    assert [c.name for c in everything
            if not isinstance(c, RotaCommand | RotaGroup)] == []
