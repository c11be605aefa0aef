"""CLI bad input beyond tests/test_cli.py: payloads, due times, integers and names that
the database could not hold, and more ways a DATABASE_URL can be wrong. Each is one line
on stderr, exit code 2, nothing on stdout, and nothing written."""

from __future__ import annotations

import psycopg
import pytest
from click.testing import CliRunner, Result
from psycopg import sql
from psycopg.conninfo import make_conninfo

from rota.cli import cli

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
     "error: payload['s'] contains a NUL character (\\u0000), which PostgreSQL jsonb"),
    (["enqueue", "echo", '{"s": "\\ud800"}'], "error: payload['s'] contains a lone surrogate"),
    (["enqueue", "echo", '{"s": Infinity}'], "error: payload['s'] is inf"),
    (["enqueue", "echo", '{"s": -1e99999}'],
     "error: payload['s'] is a Decimal with 100000 digits before the point; at most 4300"),

    (["enqueue", "echo", '{"s": "' + "x" * (1024 * 1024) + '"}'],
     "error: payload is 1048585 bytes, larger than the maximum 1048576"),
    (["enqueue", "echo", "{}", "--run-after", "9999-12-31T23:00:00+00:00"],
     "error: run_after=9999-12-31T23:00:00+00:00 is out of range"),
    (["enqueue", "echo", "{}", "--run-after", "0001-01-01T00:00:00+00:00"],
     "error: run_after=0001-01-01T00:00:00+00:00 is out of range"),
    (["enqueue", "echo", "{}", "--max-attempts", str(2**31)],
     "error: max_attempts must be at most 2147483647"),
    (["enqueue", "", "{}"], "error: job type must be a non-empty string"),
    (["enqueue", "echo", "{}", "--dedupe-key", ""], "error: dedupe_key must be a non-empty"),
    (["enqueue", "echo", "{}", "--group", ""], "error: group_id must be a non-empty string"),
    (["jobs", "--schema", "x; drop table jobs"], "error: schema 'x; drop table jobs' is not"),
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


def test_a_bad_schema_from_the_environment_is_refused_the_same_way(
    migrated: tuple[str, str]
) -> None:
    url, _ = migrated
    one_line_error(rota(url, "1bad", "jobs"), "error: schema '1bad' is not a valid identifier")


def test_a_bad_connection_option_is_one_line_exit_2(database_url: str, schema: str) -> None:
    result = rota(make_conninfo(database_url, sslmode="bogus"), schema, "jobs")
    one_line_error(result, 'error: database unreachable: connection is bad: invalid sslmode')


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
