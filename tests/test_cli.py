"""The `rota` command against a real database: each command, its --json output, and
one-line errors with exit code 2 for an unreachable database, a malformed URL and bad
flag values."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from click.testing import CliRunner, Result
from psycopg import sql

from rota.cli import cli
from rota.db import migrations
from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parents[1]
APP = "tests.cli_app:build_pipeline"
UNREACHABLE = "postgresql://rota@127.0.0.1:1/rota?connect_timeout=5"
#: The forms of a database URL rota's errors say it accepts.
ACCEPTED_URLS = ("postgresql://[user@]host[:port][/dbname] or postgres://…, or libpq's "
                 "key=value form: host=… port=… dbname=…")


class Rota:
    """Runs `rota …` in process with this test's database and schema in the environment."""

    def __init__(self, database_url: str, schema: str) -> None:
        self.url = database_url
        self.schema = schema
        self.env = {"DATABASE_URL": database_url, "ROTA_SCHEMA": schema, "ROTA_APP": None,
                    "COLUMNS": "250", "FORCE_COLOR": None}

    def __call__(self, *args: str, ok: bool = True, **env: str | None) -> Result:
        result = CliRunner().invoke(cli, list(args), env={**self.env, **env},
                                    catch_exceptions=False)
        if ok:
            assert result.exit_code == 0, (result.stdout, result.stderr)
        return result

    def json(self, *args: str, **env: str | None) -> Any:
        return json.loads(self(*args, "--json", **env).stdout)

    def sql(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            cur = conn.execute(sql.SQL(query).format(s=sql.Identifier(self.schema)), params)
            return cur.fetchall() if cur.description else []


@pytest.fixture
def rota(database_url: str, schema: str) -> Rota:
    r = Rota(database_url, schema)
    r("migrate")
    return r


def one_line_error(result: Result, starts: str) -> None:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(starts), lines[0]
    assert result.stdout == ""


# -- migrate, schema ------------------------------------------------------------------------


def test_migrate_applies_once_then_is_up_to_date(database_url: str, schema: str) -> None:
    r = Rota(database_url, schema)
    versions = [v for v, _, _ in migrations()]
    assert r("migrate").stdout == f"applied {versions}\n"
    assert r("migrate").stdout == "up to date\n"
    assert r.json("migrate") == {"applied": []}
    assert r.sql("SELECT version FROM {s}.rota_migrations ORDER BY 1") == [(v,) for v in versions]


def test_schema_prints_the_sql_with_the_notify_trigger(schema: str) -> None:
    out = CliRunner().invoke(cli, ["schema", "--schema", schema]).stdout
    # CREATE SCHEMA only when missing, so a role owning only its schema runs it too.
    assert out.startswith("DO $rota$") and f'CREATE SCHEMA "{schema}";' in out
    assert f'AFTER INSERT ON "{schema}".jobs' in out
    assert "INSERT INTO" in out and ".rota_migrations (version, name, sha256)" in out


# -- enqueue, jobs ----------------------------------------------------------------------------


def test_enqueue_then_list_and_filter_jobs(rota: Rota) -> None:
    rota.sql("INSERT INTO {s}.groups (group_id, owner_id, plan) VALUES ('g1', 'o1', 'pro')")
    out = rota("enqueue", "echo", '{"n": 1}').stdout
    assert out.startswith("enqueued job 1 (echo), due ")
    assert rota.json("enqueue", "echo", '{"n": 2}', "--group", "g1",
                     "--dedupe-key", "k") == {"id": 2, "duplicate": False}
    assert rota.json("enqueue", "echo", '{"n": 3}', "--dedupe-key", "k") == {
        "id": None, "duplicate": True}
    assert rota("enqueue", "echo", "{}", "--dedupe-key", "k").stdout == (
        "not enqueued: an open job already has dedupe key 'k'\n")
    # A skipped duplicate still uses up an identity value, so the next id is 5.
    assert rota.json("enqueue", "boom", "[1, 2]", "--run-after",
                     "2030-01-01T09:00:00Z", "--max-attempts", "5")["id"] == 5

    listed = rota.json("jobs")
    assert [(j["id"], j["type"], j["group_id"], j["plan"], j["status"], j["attempts"],
             j["max_attempts"]) for j in listed] == [
        (5, "boom", None, None, "pending", 0, 5),
        (2, "echo", "g1", "pro", "pending", 0, 3),
        (1, "echo", None, None, "pending", 0, 3),
    ]
    assert listed[0]["run_after"] == "2030-01-01T09:00:00+00:00"
    assert [j["id"] for j in rota.json("jobs", "--type", "echo")] == [2, 1]
    assert [j["id"] for j in rota.json("jobs", "--group", "g1")] == [2]
    assert [j["id"] for j in rota.json("jobs", "--limit", "1")] == [5]
    assert [j["id"] for j in rota.json("jobs", "-n", "2")] == [5, 2]  # as `rota runs -n`
    assert rota.json("jobs", "--status", "done") == []

    table = rota("jobs").stdout
    assert "jobs (3 shown)" in table and "2030-01-01 09:00:00" in table
    assert re.search(r"^ *2 echo +g1 +Pro +pending +0/3 +0 \d{4}-", table, re.M), table


def test_jobs_pages_with_before_and_filters_by_id(rota: Rota) -> None:
    rota.sql("INSERT INTO {s}.groups (group_id, owner_id, plan) VALUES ('g1', 'o1', 'pro')")
    for n in range(7):
        rota("enqueue", "echo", "{}", *(["--group", "g1"] if n % 2 else []))
    first = rota("jobs", "--limit", "3", "--json")
    assert [j["id"] for j in json.loads(first.stdout)] == [7, 6, 5]
    assert first.stderr == "next page: --before 5\n"  # stdout stays JSON
    second = rota("jobs", "--limit", "3", "--before", "5", "--json")
    assert [j["id"] for j in json.loads(second.stdout)] == [4, 3, 2]
    last = rota("jobs", "--limit", "3", "--before", "2", "--json")
    assert [j["id"] for j in json.loads(last.stdout)] == [1] and last.stderr == ""
    table = rota("jobs", "--limit", "3", "--before", "5").stdout
    assert "jobs (3 shown)" in table and table.endswith("next page: --before 2\n")
    assert "next page" not in rota("jobs", "--limit", "7").stdout
    assert [j["id"] for j in rota.json("jobs", "--group", "g1", "--before", "6")] == [4, 2]
    assert [(j["id"], j["plan"]) for j in rota.json("jobs", "--id", "6")] == [(6, "pro")]
    assert rota.json("jobs", "--id", "6", "--type", "other") == []
    rota("jobs", "cancel", "3")
    rota("jobs", "cancel", "1")
    out = rota("jobs", "failed", "--limit", "1")
    assert "failed jobs (1 shown)" in out.stdout and "next page: --before 3" in out.stdout
    assert [j["id"] for j in rota.json("jobs", "failed", "--before", "3")] == [1]


@pytest.mark.parametrize("args", [
    ["jobs", "--limit", "1001"], ["jobs", "failed", "--limit", "5000"],
    ["runs", "-n", "1001"], ["jobs", "--before", "0"], ["jobs", "--id", "0"],
], ids=lambda a: " ".join(a))
def test_listings_are_capped_at_1000_rows(rota: Rota, args: list[str]) -> None:
    result = rota(*args, ok=False)
    assert result.exit_code == 2 and result.stdout == ""
    assert " must be a whole number from 1 to " in result.stderr
    assert rota("jobs", "--limit", "1000").exit_code == 0


@pytest.mark.parametrize("args, message", [
    (["enqueue", "echo", "{not json"], "Invalid value for 'PAYLOAD_JSON': not valid JSON"),
    (["enqueue", "echo", "{}", "--run-after", "2030-01-01T09:00:00"], "has no time zone"),
    (["enqueue", "echo", "{}", "--run-after", "tomorrow"], "is not an ISO 8601 time"),
    (["enqueue", "echo", "{}", "--max-attempts", "0"], "--max-attempts must be a whole"),
    (["jobs", "--status", "lost"], "Invalid value for '--status'"),
    (["jobs", "--limit", "0"], "--limit must be a whole number"),
    (["jobs", "retry", "abc"], "ID must be a whole number"),
    (["run", "--app", APP, "--budget", "0"], "Invalid value for '--budget'"),
    (["worker", "--app", APP, "--idle-poll", "-1"], "Invalid value for '--idle-poll'"),
    (["serve", "--app", APP, "--port", "70000"], "--port must be a whole number"),
])
def test_bad_flag_values_exit_2(rota: Rota, args: list[str], message: str) -> None:
    result = rota(*args, ok=False)
    assert result.exit_code == 2
    assert message in result.stderr
    assert rota.sql("SELECT count(*) FROM {s}.jobs") == [(0,)]


@pytest.mark.parametrize("args, starts", [
    (["enqueue", "echo", "{}", "--group", "nope"], "error: unknown group 'nope'"),
    (["enqueue", "echo", '{"x": NaN}'], "error: PAYLOAD_JSON['x'] is nan"),
    (["enqueue", "other", "{}", "--app", APP], "error: unknown job type 'other'"),
    (["run"], "error: no app: pass --app module:attribute or set ROTA_APP"),
    (["run", "--app", "tests.cli_app"], "error: --app 'tests.cli_app' must look like"),
    (["run", "--app", "tests.nope:build"], "error: cannot import app module 'tests.nope'"),
    (["run", "--app", "tests.cli_app:nope"], "error: app module 'tests.cli_app' has no"),
    (["run", "--app", "tests.cli_app:TEST_PLANS"],
     "error: --app 'tests.cli_app:TEST_PLANS' is"),
    (["run", "--app", "tests.cli_app:not_callable_app"],
     "error: --app 'tests.cli_app:not_callable_app' must take one argument, the Queue"),
])
def test_bad_input_is_one_line_and_exit_2(rota: Rota, args: list[str], starts: str) -> None:
    one_line_error(rota(*args, ok=False), starts)


def test_jobs_failed_shows_last_errors_and_retry_puts_them_back(rota: Rota) -> None:
    rota("enqueue", "boom", '{"why": "no disk"}', "--app", APP)
    rota("enqueue", "echo", "{}", "--app", APP)
    assert rota.json("run", "--app", APP, "--budget", "10")["jobsFailed"] == 1
    failed = rota.json("jobs", "failed")
    # boom's stage has no give-up hook, so it owes none.
    assert [(j["id"], j["status"], j["attempts"], j["last_error"], j["give_up_pending"])
            for j in failed] == [(1, "failed", 1, "RuntimeError: boom: no disk", False)]
    assert "RuntimeError: boom: no disk" in rota("jobs", "failed").stdout
    assert rota.json("jobs", "failed", "--type", "echo") == []

    assert rota("jobs", "retry", "1").stdout == "job 1 (boom) is pending again, due now\n"
    assert rota.sql("SELECT status, attempts, deferrals, finished_at, last_error, "
                    "give_up_pending FROM {s}.jobs WHERE id = 1") == [
        ("pending", 0, 0, None, "RuntimeError: boom: no disk", False)]
    result = rota("jobs", "retry", "1", ok=False)
    assert (result.exit_code, result.stderr) == (
        1, "error: job 1 is pending; only a failed job can be retried\n")
    result = rota("jobs", "retry", "99", ok=False)
    assert (result.exit_code, result.stderr) == (1, "error: no job 99\n")
    # Failed again, retried again: the job is run again from a clean slate.
    assert rota.json("run", "--app", APP, "--budget", "10")["jobsFailed"] == 1
    assert rota.json("jobs", "retry", "1") == {
        "id": 1, "status": "pending", "giveUpHookCancelled": False}
    # A job whose give-up hook is still owed has it cancelled by the retry.
    rota.sql("UPDATE {s}.jobs SET status = 'failed', give_up_pending = true WHERE id = 1")
    assert rota("jobs", "retry", "1").stdout == (
        "job 1 (boom) is pending again, due now; its owed give-up hook is cancelled\n")


def test_retry_refuses_while_a_duplicate_is_open(rota: Rota) -> None:
    rota("enqueue", "echo", "{}", "--dedupe-key", "d")
    rota("jobs", "cancel", "1")
    rota("enqueue", "echo", "{}", "--dedupe-key", "d")
    result = rota("jobs", "retry", "1", ok=False)
    assert (result.exit_code, result.stderr) == (
        1, "error: job 1: another open job holds dedupe key 'd'\n")
    rota.sql("UPDATE {s}.jobs SET status = 'done' WHERE id = 2")
    assert rota.json("jobs", "retry", "1")["status"] == "pending"


def test_with_an_app_enqueue_and_migrate_apply_the_stages_max_attempts(rota: Rota) -> None:
    """The app's boom stage says max_attempts=1: `rota enqueue --app` enqueues through
    the app's pipeline's queue, which has it; `rota migrate --app` publishes it for the
    SQL functions (docs/design.md, "The runner")."""
    assert rota.json("enqueue", "boom", "{}", "--app", APP)["id"] == 1
    assert rota.json("enqueue", "boom", "{}")["id"] == 2  # no app: the queue's default
    assert rota.sql("SELECT id, max_attempts FROM {s}.jobs ORDER BY id") == [(1, 1), (2, 3)]
    assert rota.sql("SELECT max_attempts_by_type FROM {s}.enqueue_settings") == [({},)]
    rota("migrate", "--app", APP)
    assert rota.sql("SELECT max_attempts_by_type FROM {s}.enqueue_settings") == [
        ({"boom": 1},)]


def test_cancel_with_an_app_says_when_the_type_has_no_give_up_hook(rota: Rota) -> None:
    """The app's boom stage declares no on_give_up: cancelling one of its jobs said "its
    give-up hook ran" (the no-op standing in for it had)."""
    rota("enqueue", "boom", "{}")
    rota("enqueue", "boom", "{}")
    rota("enqueue", "echo", "{}")
    assert rota("jobs", "cancel", "1", "--app", APP).stdout == (
        "job 1 (boom) cancelled; its type has no give-up hook\n")
    assert rota.json("jobs", "cancel", "2", "--app", APP) == {
        "id": 2, "status": "failed", "giveUpHookRan": False, "giveUpHook": "none"}
    assert rota("jobs", "cancel", "3", "--app", APP).stdout == (
        "job 3 (echo) cancelled; its give-up hook ran\n")
    assert rota.sql("SELECT id, give_up_pending FROM {s}.jobs ORDER BY id") == [
        (1, False), (2, False), (3, False)]


def test_migrate_with_an_app_publishes_its_stage_types_for_sql(rota: Rota) -> None:
    """SQL enqueue of a type no stage runs was accepted after `rota migrate --app`, and
    the job waited forever; the app's stage types are now published, and SQL refuses
    another type as `rota enqueue --app` does (docs/enqueue-from-sql.md, "Settings")."""
    app = "tests.cli_app:build_stages_only"
    rota("migrate")
    assert rota.sql("SELECT {s}.enqueue('nosuchtype', '{{}}')") == [(1,)]  # any type
    rota("migrate", "--app", app)
    assert rota.sql("SELECT types FROM {s}.enqueue_settings") == [(["boom", "echo"],)]
    with pytest.raises(psycopg.errors.UndefinedObject) as refused:
        rota.sql("SELECT {s}.enqueue('nosuchtype', '{{}}')")
    assert refused.value.diag.message_primary == (
        "unknown job type 'nosuchtype'; declared types: boom, echo")
    assert rota.sql("SELECT {s}.enqueue('echo', '{{}}')") == [(2,)]
    result = rota("enqueue", "nosuchtype", "{}", "--app", app, ok=False)
    assert (result.exit_code, result.stderr) == (2, (
        "error: unknown job type 'nosuchtype': --app 'tests.cli_app:build_stages_only' runs "
        "the stage types echo, boom (without --app/ROTA_APP any type may be enqueued)\n"))
    # The app's queue declares types: those are published with the stage types.
    rota("migrate", "--app", APP)
    assert rota.sql("SELECT types FROM {s}.enqueue_settings") == [(["boom", "echo"],)]


def test_cancel_fails_a_pending_job_and_runs_its_give_up_hook_once(rota: Rota) -> None:
    rota("enqueue", "echo", "{}")
    rota("enqueue", "echo", "{}")
    assert rota("jobs", "cancel", "1").stdout == (
        "job 1 (echo) cancelled; its give-up hook, if the app has one, is owed (run with "
        "--app, by `rota maintain --app` or by a worker)\n")
    assert rota.json("jobs", "cancel", "2", "--app", APP) == {
        "id": 2, "status": "failed", "giveUpHookRan": True, "giveUpHook": "ran"}
    assert rota.sql("SELECT id, status, last_error, give_up_pending, finished_at IS NOT NULL "
                    "FROM {s}.jobs ORDER BY id") == [
        (1, "failed", "cancelled", True, True), (2, "failed", "cancelled", False, True)]
    result = rota("jobs", "cancel", "2", ok=False)
    assert (result.exit_code, result.stderr) == (
        1, "error: job 2 is failed; only a pending job can be cancelled\n")
    rota.sql("INSERT INTO {s}.jobs (type, payload, status, attempts, max_attempts, "
             "run_after, created_at, locked_at) "
             "VALUES ('echo', '{{}}', 'running', 1, 3, now(), now(), now())")
    result = rota("jobs", "cancel", "3", ok=False)
    assert result.stderr == "error: job 3 is running; only a pending job can be cancelled\n"
    # The owed hook runs at the next maintenance of a process that has it.
    rota("maintain", "--app", APP)
    assert rota.sql("SELECT count(*) FROM {s}.jobs WHERE give_up_pending") == [(0,)]


# -- run, runs, maintain, depth ----------------------------------------------------------------


def test_run_once_then_runs_lists_it(rota: Rota) -> None:
    for n in range(3):
        rota("enqueue", "echo", json.dumps({"n": n}))
    result = rota.json("run", "--app", APP, "--budget", "10")
    assert {k: v for k, v in result.items() if k != "runId"} == {
        "stopReason": "no_work", "jobsDone": 3, "jobsFailed": 0, "jobsDeferred": 0,
        "units": 0, "summary": {"echoed": 3}, "error": None}
    table = rota("run", "--app", APP, "--budget", "10").stdout
    assert "stopReason" in table and "no_work" in table

    runs = rota.json("runs")
    assert [(r["id"], r["trigger"], r["stop_reason"], r["jobs_done"], r["summary"])
            for r in runs] == [(runs[0]["id"], "cli", "no_work", 0, {}),
                               (result["runId"], "cli", "no_work", 3, {"echoed": 3})]
    assert runs[1]["duration_seconds"] >= 0
    assert len(rota.json("runs", "-n", "1")) == 1
    out = rota("runs").stdout
    assert "runs (2 shown)" in out and "echoed=3" in out and result["runId"][:8] in out


def test_maintain_prints_counters(rota: Rota) -> None:
    assert rota.json("maintain") == {
        "stuck_jobs.failed": 0, "stuck_jobs.hooks_run": 0, "killed_runs.marked": 0,
        "prune.jobs_deleted": 0, "prune.quota_rows_deleted": 0,
        "prune.runs_deleted": 0}
    assert "killed_runs.marked" in rota("maintain").stdout


def test_depth_per_stage_and_plan(rota: Rota) -> None:
    rota.sql("INSERT INTO {s}.groups (group_id, owner_id, plan, active) VALUES "
             "('f', 'o1', 'free', true), ('p', 'o2', 'pro', true), "
             "('paused', 'o3', 'pro', false), ('x', 'o4', 'gone', true)")
    for group in ("f", "f", "p", "paused", "x"):
        rota("enqueue", "echo", "{}", "--group", group)
    rota("enqueue", "boom", "{}")
    rota("enqueue", "boom", "{}", "--run-after", "2030-01-01T00:00:00Z")
    rows = rota.json("depth", "--app", APP)
    assert [(r["type"], r["plan"], r["plan_name"], r["priority"], r["due"], r["scheduled"],
             r["paused"], r["running"]) for r in rows] == [
        ("echo", "pro", "Pro", 2, 1, 0, 1, 0),
        ("echo", "free", "Free", 0, 2, 0, 0, 0),
        ("echo", "gone", "gone", 0, 1, 0, 0, 0),   # unknown plan ranks lowest
        ("boom", None, None, 1, 1, 1, 0, 0),       # no group: the middle plan
    ]
    assert all(r["oldest_due_seconds"] >= 0 for r in rows)
    table = rota("depth").stdout
    assert "queue depth" in table and "total" in table


# -- database unreachable, URL malformed --------------------------------------------------------

DB_COMMANDS = [
    ["migrate"], ["jobs"], ["jobs", "failed"], ["jobs", "retry", "1"], ["jobs", "cancel", "1"],
    ["runs"], ["maintain"], ["depth"], ["enqueue", "echo", "{}"],
    ["run", "--app", APP], ["worker", "--app", APP], ["serve", "--app", APP],
]


@pytest.mark.parametrize(("args", "line"), [
    (["jobs", "--bogus"], "error: No such option '--bogus'. (see 'rota jobs --help')"),
    (["nosuch"], "error: No such command 'nosuch'. (see 'rota --help')"),
    (["--bogus"], "error: No such option '--bogus'. (see 'rota --help')"),
    (["enqueue"], "error: Missing argument 'TYPE'. (see 'rota enqueue --help')"),
    (["jobs", "--limit", "5000"], "error: --limit must be a whole number from 1 to 1,000, "
                                  "got 5000 (see 'rota jobs --help')"),
    (["groups", "set", "g", "--active", "--paused"],
     "error: --active and --paused contradict each other (see 'rota groups set --help')"),
    (["jobs", "--lim", "3"], "error: No such option '--lim'. (Did you mean one of: '--id', "
                             "'--limit'?) (see 'rota jobs --help')"),
], ids=lambda a: " ".join(a) if isinstance(a, list) else "")
def test_a_usage_error_is_one_error_line_like_every_other(
        rota: Rota, args: list[str], line: str) -> None:
    """click's usage errors were four lines (usage, hint, blank, "Error: …") beside rota's
    one "error: …" line: now one line too, exit 2, naming the help to read."""
    result = CliRunner().invoke(cli, args, prog_name="rota", env=rota.env)
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", line + "\n")


def test_a_usage_error_from_the_installed_command_is_one_line() -> None:
    out = subprocess.run([str(ROOT / ".venv" / "bin" / "rota"), "jobs", "--bogus"],
                         capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert (out.returncode, out.stdout, out.stderr) == (
        2, "", "error: No such option '--bogus'. (see 'rota jobs --help')\n")


@pytest.mark.parametrize(("url", "line"), [
    ("postgresql://u:pw@h:99999/db", "error: malformed database URL: its port is not "
     "between 1 and 65535 (in a URL, user:password needs an @ before the host)"),
    ("postgresql://u:123456/db", "error: malformed database URL: its port is not between "
     "1 and 65535 (in a URL, user:password needs an @ before the host)"),
    ("host=127.0.0.1 port=0", "error: malformed database URL: its port is not between 1 "
     "and 65535"),
    ("mysql://u:pw@localhost/db", "error: not a PostgreSQL URL: 'mysql://u:***@localhost/db'"
     f" (rota needs {ACCEPTED_URLS})"),
    ("http://example.com/db", "error: not a PostgreSQL URL: 'http://example.com/db' (rota "
     f"needs {ACCEPTED_URLS})"),
], ids=["port-99999", "password-as-port", "key-value-port-0", "mysql", "http"])
def test_a_url_that_is_not_one_rota_can_use_is_named_as_such(
        schema: str, url: str, line: str) -> None:
    """A port out of range was "database unreachable" (a malformed URL), and mysql://
    got libpq's `missing "="`; the password is never shown."""
    result = Rota(url, schema)("jobs", ok=False)
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", line + "\n")
    assert "pw" not in result.stderr and "123456" not in result.stderr


@pytest.mark.parametrize("args", DB_COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_unreachable_database_is_one_line_and_exit_2(schema: str, args: list[str]) -> None:
    r = Rota(UNREACHABLE, schema)
    one_line_error(r(*args, ok=False), "error: database unreachable: connection")


@pytest.mark.parametrize("url, message", [
    ("not a url", "error: malformed database URL 'not a url': it has no postgresql:// "
     "scheme and is not key=value text"),
    ("postgresql://%zz@localhost/db", "error: malformed database URL: invalid percent"),
    ("", "error: no database: pass --database-url or set DATABASE_URL"),
])
@pytest.mark.parametrize("args", [["migrate"], ["jobs"], ["run", "--app", APP]],
                         ids=lambda a: a[0])
def test_malformed_database_url_is_one_line_and_exit_2(
    schema: str, url: str, message: str, args: list[str],
) -> None:
    one_line_error(Rota(url, schema)(*args, ok=False), message)


def test_console_script_reports_an_unreachable_database_in_one_line(schema: str) -> None:
    out = subprocess.run([sys.executable, "-m", "rota.cli", "runs"], capture_output=True,
                         text=True, timeout=60, cwd=ROOT,
                         env={**os.environ, "DATABASE_URL": UNREACHABLE, "ROTA_SCHEMA": schema})
    assert out.returncode == 2
    assert out.stdout == ""
    assert len(out.stderr.splitlines()) == 1
    assert out.stderr.startswith("error: database unreachable: connection")


# -- worker and serve as real processes ----------------------------------------------------------


@pytest.fixture
def process_env(rota: Rota) -> dict[str, str]:
    return {**os.environ, "DATABASE_URL": rota.url, "ROTA_SCHEMA": rota.schema,
            "ROTA_APP": APP, "PYTHONUNBUFFERED": "1"}


def test_a_killed_workers_run_is_marked_as_soon_as_it_passes_the_stale_window(
    rota: Rota, process_env: dict[str, str], spawn: Any,
) -> None:
    """A worker SIGKILLed mid-run left its run unfinished (shown running) until a
    maintenance pass found it silent past the platform timeout: the next worker's start
    was too early, and then it looked once a minute, or once a day. It now wakes when
    the run's last heartbeat passes the stale window (4 s here) and marks it then, at
    its last sign of life (docs/design.md, "Maintenance"). Real processes."""
    app = "tests.cli_app:build_quick_stale"
    env = {**process_env, "ROTA_APP": app}
    rota("migrate")
    rota.sql("SELECT {s}.enqueue('nap', to_jsonb(g)) FROM generate_series(1, 60) g")
    first = spawn(["worker", "--idle-poll", "30"], env)
    # Mid-run: a run unfinished, some of its jobs done, one running.
    wait_for(lambda: rota.sql(
        "SELECT count(*) FROM {s}.runs r JOIN {s}.jobs j ON j.run_id = r.id "
        "WHERE r.finished_at IS NULL AND j.status = 'running' AND r.jobs_done > 0"
    )[0][0] == 1, what="a run in the middle of its jobs")
    first.kill()
    first.wait(10)
    [(killed, beat)] = rota.sql(
        "SELECT id, heartbeat_at FROM {s}.runs WHERE finished_at IS NULL")
    second = spawn(["worker", "--idle-poll", "30"], env)
    seen: list[Any] = []

    def marked() -> bool:
        [(reason, error, finished, last, now)] = rota.sql(
            "SELECT stop_reason, error, finished_at, heartbeat_at, now() FROM {s}.runs "
            "WHERE id = %s", [killed])
        seen[:] = [reason, error, finished, last, now]
        return reason is not None

    wait_for(marked, timeout=40, interval=0.05, what="the killed run marked")
    reason, error, finished, last, now = seen
    assert (reason, error, finished, last) == ("error", "killed", beat, beat)
    # Never before the window, and soon after it, not at the next minute's rescue.
    assert timedelta(seconds=4) <= now - beat < timedelta(seconds=10), now - beat
    second.send_signal(signal.SIGTERM)
    assert second.wait(30) == 0


def test_worker_process_runs_jobs_and_stops_on_sigterm(
    rota: Rota, process_env: dict[str, str], spawn: Any,
) -> None:
    p = spawn(["worker", "--idle-poll", "30"], process_env)
    # Its first run (the maintenance run) has finished: the worker is up and idle.
    wait_for(lambda: rota.sql("SELECT count(*) FROM {s}.runs "
                              "WHERE finished_at IS NOT NULL")[0][0] >= 1)
    rota("enqueue", "echo", "{}")
    wait_for(lambda: rota.sql("SELECT status FROM {s}.jobs") == [("done",)])
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=10)
    assert p.returncode == 0, err
    assert "worker stopped" in err and out == ""
    # Each run is logged once, to stderr.
    lines = [line for line in err.splitlines() if " stopped " in line]
    assert len(lines) == 2 and " stopped no_work: " in lines[0]
    # The signal may land while the second run looks for more work: it then stops
    # claiming at once (interrupted).
    assert " stopped no_work: " in lines[1] or " stopped interrupted: " in lines[1]
    assert lines[1].endswith(": 1 done, 0 failed, 0 deferred")


def test_serve_process_answers_cron_only_with_the_secret(
    rota: Rota, process_env: dict[str, str], spawn: Any,
) -> None:
    secret = "serve-secret-4b1d"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = spawn(["serve", "--port", str(port), "--budget", "10"],
              {**process_env, "CRON_SECRET": secret})
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            assert p.poll() is None, p.communicate()
            return False

    wait_for(healthy)
    rota("enqueue", "echo", "{}")
    assert httpx.get(f"{base}/api/cron", timeout=30).status_code == 401
    r = httpx.get(f"{base}/api/cron", headers={"Authorization": f"Bearer {secret}"},
                  timeout=30)
    assert r.status_code == 200
    assert {k: v for k, v in r.json().items() if k != "runId"} == {
        "stopReason": "no_work", "jobsDone": 1, "jobsFailed": 0, "units": 0}
    assert httpx.post(f"{base}/api/cron", timeout=5).status_code == 405
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=10)
    # uvicorn shuts down gracefully; the re-raised signal no longer kills the process.
    assert p.returncode == 0, err  # a SIGTERM is a normal stop, not a crash
    assert "Application shutdown complete." in err
    assert secret not in out + err
    # rota's own INFO lines are shown by default (they were not).
    assert "INFO rota.web: cron request refused: missing or wrong bearer token" in err
    assert "INFO rota.web: cron run " in err and " stopped no_work: 1 done" in err


def test_long_work_shows_a_progress_bar_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    import asyncio

    from rota.cli import with_progress

    async def work() -> int:
        await asyncio.sleep(0.5)
        return 42

    monkeypatch.setenv("FORCE_COLOR", "1")  # rich treats stderr as a terminal
    assert asyncio.run(with_progress(work(), "running the pipeline", 5.0)) == 42
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "running the pipeline" in captured.err and "of 5s budget" in captured.err
    monkeypatch.delenv("FORCE_COLOR")
    monkeypatch.setenv("TERM", "dumb")
    assert asyncio.run(with_progress(work(), "quiet", 5.0)) == 42
    assert "quiet" not in capsys.readouterr().err


def test_jobs_subcommands_take_the_groups_options_too(rota: Rota) -> None:
    rota("enqueue", "echo", "{}")
    out = rota("jobs", "--database-url", rota.url, "--json", "cancel", "1",
               DATABASE_URL=None).stdout
    assert json.loads(out) == {"id": 1, "status": "failed", "giveUpHookRan": False,
                               "giveUpHook": "owed"}
    assert [j["id"] for j in json.loads(rota("jobs", "--json", "failed").stdout)] == [1]


# -- fresh-eyes findings: literal text, stopping, configuration, limits -----------------------

HOSTILE = "[/tmp/x] [bold]b[/bold] :smile: \x1b]0;pwned\x07 \x9b31m \u202egnp.exe"


def _has_no_terminal_control(text: str) -> bool:
    return not any(ch in text for ch in "\x1b\x07\x9b\u202e")


def test_text_from_the_database_is_shown_literally_and_cannot_drive_the_terminal(
    rota: Rota,
) -> None:
    rota.sql("INSERT INTO {s}.jobs (type, payload, status, attempts, max_attempts, "
             "run_after, created_at, finished_at, last_error) VALUES "
             "(%s, '{{}}', 'failed', 1, 1, now(), now(), now(), %s), "
             "(%s, '{{}}', 'pending', 0, 3, now(), now(), NULL, NULL)",
             ["[bold]t[/bold]", HOSTILE, "[/tmp/x]\x1b[2J"])
    rota.sql("INSERT INTO {s}.runs (id, trigger, stop_reason, error, summary, started_at, "
             "finished_at) VALUES (gen_random_uuid(), 'cli', 'error', %s, "
             "jsonb_build_object(%s::text, 1), now(), now())", [HOSTILE, "[red]k\x1b"])
    for args in (["jobs"], ["jobs", "failed"], ["jobs", "--status", "failed"], ["depth"],
                 ["runs"]):
        out = rota(*args).stdout
        assert _has_no_terminal_control(out), (args, out)
        assert "\\x1b" in out, (args, out)
    failed = rota("jobs", "failed").stdout
    assert "[/tmp/x] [bold]b[/bold] :smile: \\x1b]0;pwned\\x07 \\x9b31m \\u202egnp.exe" in failed
    assert "[bold]t[/bold]" in failed
    assert "[/tmp/x]\\x1b[2J" in rota("depth").stdout
    assert "[red]k\\x1b=1" in rota("runs").stdout
    # JSON keeps the exact text (escaped where a terminal would act on it).
    raw = rota("jobs", "failed", "--json").stdout
    assert _has_no_terminal_control(raw)
    assert json.loads(raw)[0]["last_error"] == HOSTILE
    # Echoed values too.
    out = rota("enqueue", "[b]x\x1b[2J", "{}").stdout
    assert _has_no_terminal_control(out) and "([b]x\\x1b[2J)" in out
    out = rota("jobs", "cancel", "3").stdout
    assert out.startswith("job 3 ([b]x\\x1b[2J) cancelled")
    result = rota("enqueue", "echo", "{}", "--group", "\x1b]0;pwned\x07", ok=False)
    assert _has_no_terminal_control(result.stderr)


@pytest.fixture
def write_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Write an app module (a unique name per call) and return its directory and name."""
    monkeypatch.syspath_prepend(str(tmp_path))
    made: list[str] = []

    def write(source: str) -> str:
        name = f"app_{uuid.uuid4().hex[:10]}"
        (tmp_path / f"{name}.py").write_text(source)
        made.append(name)
        return name

    yield write
    for name in made:
        sys.modules.pop(name, None)


GOOD_APP = """
import asyncio
from datetime import timedelta
from rota import Pipeline, Stage

async def slow(ctx):
    await asyncio.sleep({seconds})

def build(queue):
    return Pipeline(queue, [Stage("slow", 1, 1, slow)], platform_timeout=timedelta(seconds=60))

build.queue_settings = {{"types": ["slow"], "stale_after": timedelta(seconds=120)}}
"""


def test_worker_stops_after_the_current_run_on_sigterm(
    rota: Rota, spawn: Any, write_app: Any, tmp_path: Path,
) -> None:
    """SIGTERM during the worker's first run (the maintenance run): the run finishes
    (its 1 s budget ends during a 1.5 s job), and no other run starts."""
    name = write_app(GOOD_APP.format(seconds=1.5))
    for _ in range(3):
        rota("enqueue", "slow", "{}")
    env = {**os.environ, "DATABASE_URL": rota.url, "ROTA_SCHEMA": rota.schema,
           "ROTA_APP": f"{name}:build", "PYTHONUNBUFFERED": "1"}
    p = spawn(["worker", "--budget", "1"], env, cwd=tmp_path)

    def one_running() -> bool:
        assert p.poll() is None, p.communicate()
        return bool(rota.sql("SELECT count(*) FROM {s}.jobs "
                             "WHERE status = 'running'")[0][0] == 1)

    wait_for(one_running)
    [(signalled_at,)] = rota.sql("SELECT clock_timestamp()")
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=15)
    elapsed = time.monotonic() - t0
    assert p.returncode == 0, err
    # The job in flight had at most 1.5 s left; the rest is process teardown.
    assert elapsed < 1.5 + 2.0, (elapsed, err)
    assert "stopping after the current run" in err and "worker stopped" in err
    runs = rota.sql("SELECT started_at, stop_reason FROM {s}.runs")
    assert len(runs) == 1 and runs[0][0] < signalled_at and runs[0][1] == "interrupted"
    assert rota.sql("SELECT status, count(*) FROM {s}.jobs GROUP BY 1 ORDER BY 1") == [
        ("done", 1), ("pending", 2)]
    assert out == "" and len([x for x in err.splitlines() if " stopped " in x]) == 1


def test_worker_help_says_what_a_second_signal_does() -> None:
    text = " ".join(CliRunner().invoke(cli, ["worker", "--help"]).stdout.split())
    assert "stale-lock" not in text
    assert "jobs in flight are handed back too, their attempt returned" in text
    assert "records the run as stopped `interrupted`" in text


@pytest.mark.parametrize("args, starts", [
    (["worker", "--budget", "300"], "error: --budget 300s must be shorter than the app's "
                                    "platform timeout (300s)"),
    (["serve", "--budget", "300", "--host", "192.0.2.1"], "error: --budget 300s must be shorter"),
    (["run", "--budget", "400"], "error: --budget 400s must be shorter"),
], ids=["worker", "serve", "run"])
def test_a_budget_not_below_the_platform_timeout_stops_at_start_with_exit_2(
    rota: Rota, process_env: dict[str, str], args: list[str], starts: str,
) -> None:
    # A real process with a timeout: a worker that loops instead fails, not hangs.
    out = subprocess.run([sys.executable, "-m", "rota.cli", *args], capture_output=True,
                         text=True, timeout=30, cwd=ROOT, env=process_env)
    assert (out.returncode, out.stdout) == (2, ""), out.stderr
    [line] = out.stderr.splitlines()
    assert line.startswith(starts), line
    assert rota.sql("SELECT count(*) FROM {s}.runs") == [(0,)]


@pytest.mark.parametrize("command", ["worker", "serve"])
def test_long_running_modes_refuse_an_unmigrated_schema(
    database_url: str, schema: str, command: str,
) -> None:
    def start() -> subprocess.CompletedProcess[str]:
        # A real process with a timeout: a worker that loops instead fails, not hangs.
        return subprocess.run(
            [sys.executable, "-m", "rota.cli", command, "--app", APP,
             *(["--host", "192.0.2.1"] if command == "serve" else [])],
            capture_output=True, text=True, timeout=30, cwd=ROOT,
            env={**os.environ, "DATABASE_URL": database_url, "ROTA_SCHEMA": schema})

    out = start()
    assert (out.returncode, out.stdout) == (2, ""), out.stderr
    [line] = out.stderr.splitlines()
    # The command it suggests names the same app (the schema came from the environment).
    assert line.startswith("error: rota's tables are missing") and line.endswith(
        f"run `rota migrate --app {APP}`"), line
    r = Rota(database_url, schema)
    r("migrate")
    r.sql("DELETE FROM {s}.rota_migrations WHERE version = 1")
    out = start()
    assert (out.returncode, out.stderr) == (
        2, f"error: schema '{schema}' lacks migrations [1]: run `rota migrate --app {APP}`\n")


def test_run_that_ends_in_error_exits_1(rota: Rota, write_app: Any) -> None:
    name = write_app("""
import uuid
from types import SimpleNamespace

class Broken:
    async def run(self, *, trigger, time_budget):
        return SimpleNamespace(run_id=uuid.uuid4(), stop_reason="error", jobs_done=0,
                               jobs_failed=0, jobs_deferred=0, quota_units=0, summary={},
                               error="RuntimeError: [bold]disk[/bold] full")

def build(queue):
    return Broken()
""")
    result = rota("run", "--app", f"{name}:build", ok=False)
    assert result.exit_code == 1
    assert "[bold]disk[/bold] full" in result.stdout


@pytest.mark.parametrize("args", [
    ["run", "--budget", "nan"], ["run", "--budget", "inf"], ["run", "--budget", "1e308"],
    ["run", "--budget", "-inf"], ["run", "--budget", "86401"], ["serve", "--budget", "nan"],
    ["worker", "--budget", "inf"], ["worker", "--idle-poll", "nan"],
    ["worker", "--idle-poll", "inf"], ["worker", "--idle-poll", "1e308"],
], ids=lambda a: " ".join(a))
def test_non_finite_or_huge_seconds_are_refused_as_flag_values(
    rota: Rota, args: list[str],
) -> None:
    result = rota(*args, "--app", APP, ok=False)
    assert result.exit_code == 2, result.stderr
    assert f"Invalid value for '{args[1]}'" in result.stderr
    assert "Traceback" not in result.stderr


BAD_APPS = {
    "raises": ("def build(queue):\n    raise RuntimeError('no config file')\n",
               "failed: RuntimeError: no config file"),
    "no-argument": ("def build():\n    pass\n", "must take one argument, the Queue"),
    "two-arguments": ("def build(queue, other):\n    pass\n",
                      "must take one argument, the Queue"),
    "class": ("class build:\n    def __init__(self, queue):\n        pass\n", "is a class"),
    "factory-raises": ("def build(queue):\n    def make():\n        raise KeyError('x')\n"
                       "    return make\n", "failed: KeyError"),
    "stale-window": ("from datetime import timedelta\nfrom rota import Pipeline, Stage\n"
                     "async def h(ctx):\n    pass\n"
                     "def build(queue):\n    return Pipeline(queue, [Stage('echo', 1, 1, h)])\n"
                     "build.queue_settings = {'stale_after': timedelta(seconds=60)}\n",
                     "failed: ConfigError: the queue's stale window (60 seconds) must be "
                     "longer than the platform timeout (300 seconds)"),
    "misspelled-setting": ("def build(queue):\n    pass\n"
                           "build.queue_settings = {'stale_afer': 1}\n",
                           "queue_settings has unknown key 'stale_afer' "
                           "(did you mean 'stale_after'?)"),
    "settings-raise": ("def build(queue):\n    pass\n"
                       "def settings():\n    raise OSError('gone')\n"
                       "build.queue_settings = settings\n",
                       "queue_settings() failed: OSError: gone"),
    "bad-setting-value": ("from datetime import timedelta\ndef build(queue):\n    pass\n"
                          "build.queue_settings = {'stale_after': timedelta(seconds=-5)}\n",
                          "queue_settings: stale_after must be positive, got -5 seconds"),
    "settings-not-a-mapping": ("def build(queue):\n    pass\n"
                               "build.queue_settings = [('max_attempts', 5)]\n",
                               "queue_settings must be a mapping of Queue settings (a dict), "
                               "got [('max_attempts', 5)]"),
}


@pytest.mark.parametrize("kind", list(BAD_APPS))
@pytest.mark.parametrize("command", [["run"], ["worker"], ["serve"], ["maintain"]],
                         ids=lambda a: a[0])
def test_a_broken_app_is_one_line_naming_it_and_exit_2(
    rota: Rota, write_app: Any, kind: str, command: list[str],
) -> None:
    source, message = BAD_APPS[kind]
    spec = f"{write_app(source)}:build"
    if command == ["serve"]:  # were the app accepted, uvicorn could not bind: no hang
        command = ["serve", "--host", "192.0.2.1"]
    result = rota(*command, "--app", spec, ok=False)
    one_line_error(result, "error: ")
    assert spec in result.stderr and message in result.stderr, result.stderr


@pytest.mark.parametrize(("setting", "said"), [
    ("{'stale_after': timedelta(seconds=-5)}", "stale_after must be positive, got -5 seconds"),
    ("{'max_attempts': '3'}", "max_attempts must be an int >= 1, got '3'"),
    ("{'plans': ['free', 'pro']}",
     "plans must be a rota.Plans (Plans([Plan(...), ...])), got ['free', 'pro']"),
    ("{'schema': '1bad'}", "schema '1bad' is not a valid identifier (letters, digits and _, "
                           "not starting with a digit, 1 to 63 characters)"),
], ids=["duration", "int", "plans", "schema"])
def test_a_bad_queue_setting_names_the_app_it_came_from(
        rota: Rota, write_app: Any, setting: str, said: str) -> None:
    """The app's queue_settings are the app's: a value the queue refuses said only
    "stale_after must be positive, got -1 day, 23:59:55", with no word of the app."""
    spec = f"{write_app(APP_WITH_SETTINGS.format(setting=setting))}:build"
    for args, env, named in ((["--app", spec], {}, "--app"), ([], {"ROTA_APP": spec}, "ROTA_APP")):
        # No ROTA_SCHEMA: the app's own schema is the one used.
        result = rota("depth", *args, ok=False, ROTA_SCHEMA=None, **env)
        assert (result.exit_code, result.stdout, result.stderr) == (
            2, "", f"error: {named} {spec!r}: queue_settings: {said}\n")
    assert rota.sql("SELECT count(*) FROM {s}.jobs") == [(0,)]


def test_a_bad_schema_flag_is_the_flag_s_not_the_app_s(rota: Rota, write_app: Any) -> None:
    spec = f"{write_app(APP_WITH_SETTINGS.format(setting='{}'))}:build"
    result = rota("depth", "--app", spec, "--schema", "1bad", ok=False)
    assert (result.exit_code, result.stderr) == (2, (
        "error: --schema '1bad' is not a valid identifier (letters, digits and _, not "
        "starting with a digit, 1 to 63 characters)\n"))


APP_WITH_SETTINGS = """
from datetime import timedelta

def build(queue):
    pass

build.queue_settings = {setting}
"""


def test_an_app_module_with_a_syntax_error_is_one_line(rota: Rota, write_app: Any) -> None:
    name = write_app("def build(queue)\n    pass\n")
    one_line_error(rota("run", "--app", f"{name}:build", ok=False),
                   f"error: cannot import app module '{name}': SyntaxError: ")


def test_a_deeply_nested_payload_is_refused_in_one_line(rota: Rota) -> None:
    deep = "[" * 5000 + "]" * 5000
    result = rota("enqueue", "echo", deep, ok=False)
    one_line_error(result, "error: PAYLOAD_JSON is nested deeper than 256 levels")
    assert rota.sql("SELECT count(*) FROM {s}.jobs") == [(0,)]


def test_a_database_error_is_not_called_unreachable(rota: Rota) -> None:
    read_only = f"{rota.url}{'&' if '?' in rota.url else '?'}" \
        "options=-c%20default_transaction_read_only%3Don"
    result = rota("enqueue", "echo", "{}", ok=False, DATABASE_URL=read_only)
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == ("error: database error (SQLSTATE 25006): cannot execute INSERT "
                             "in a read-only transaction\n")


def test_database_errors_are_told_apart_from_connection_failures() -> None:
    from rota.cli import CliConfigError, _as_cli_error

    def translate(exc: Exception) -> tuple[int, str]:
        err = _as_cli_error(exc)
        assert err is not None
        return err.exit_code, err.message

    assert translate(psycopg.OperationalError("connection failed: refused")) == (
        2, "database unreachable: connection failed: refused")
    assert translate(psycopg.errors.AdminShutdown("terminating connection")) == (
        2, "database unreachable: terminating connection")
    assert translate(psycopg.errors.ProgramLimitExceeded("index row too big")) == (
        2, "database error (SQLSTATE 54000): index row too big")
    assert translate(psycopg.errors.SerializationFailure("could not serialize")) == (
        1, "database error (SQLSTATE 40001): could not serialize")
    assert translate(psycopg.errors.InsufficientPrivilege("permission denied")) == (
        1, "database error (SQLSTATE 42501): permission denied")
    assert isinstance(_as_cli_error(psycopg.errors.DataException("bad")), CliConfigError)


def test_tables_are_not_cut_at_80_columns_when_stdout_is_not_a_terminal(
    rota: Rota,
) -> None:
    rota.sql("INSERT INTO {s}.runs (id, trigger, stop_reason, error, summary, started_at, "
             "finished_at) VALUES (gen_random_uuid(), 'worker', 'time_budget', NULL, "
             "'{{\"maintenance.stuck_jobs.failed\": 0, \"echoed\": 12, "
             "\"a_rather_long_counter_name\": 1, \"another_long_counter_name\": 2, "
             "\"and_a_third_one\": 3}}', now(), now())")
    out = rota("runs", COLUMNS=None).stdout
    assert "time_budget" in out and "another_long_counter_name=2, echoed=12" in out
    assert 80 < max(len(line) for line in out.splitlines()) <= 160


def test_rota_runs_is_readable_at_80_columns(rota: Rota) -> None:
    """Ten columns wrapped into 1-5-character ones at 80 columns, floats printed
    unrounded, six maintenance.*=0 counters on a worker's run: the figures are one table
    that fits, what each run counted (floats to two decimals, zero maintenance counters
    left out) and its error another."""
    rota("migrate")
    rota.sql("""INSERT INTO {s}.runs (id, trigger, stop_reason, jobs_done, jobs_failed,
        jobs_deferred, quota_units, summary, error, started_at, finished_at) VALUES
        ('1a2b3c4d-0000-0000-0000-000000000001', 'worker', 'quota_exhausted', 1234, 5, 17,
         10000, '{{"maintenance.stuck_jobs.failed": 0, "maintenance.stuck_jobs.hooks_run": 0,
         "maintenance.killed_runs.marked": 0, "maintenance.prune.jobs_deleted": 3,
         "maintenance.prune.quota_rows_deleted": 0, "maintenance.prune.runs_deleted": 0,
         "rate_waited_s": 7.8759999999999994, "searches": 12}}', NULL,
         '2026-12-01 10:00:00+00', '2026-12-01 10:03:40.5+00'),
        ('2a2b3c4d-0000-0000-0000-000000000002', 'cron', 'error', 0, 1, 0, 0, '{{}}',
         'RuntimeError: the database went away in the middle of a long batch of jobs',
         '2026-12-01 11:00:00+00', '2026-12-01 11:00:02+00'),
        ('3a2b3c4d-0000-0000-0000-000000000003', 'cli', NULL, 0, 0, 0, 0, '{{}}', NULL,
         '2026-12-01 12:00:00+00', NULL)""")
    assert rota("runs", COLUMNS="80").stdout == (
        "                                 runs (3 shown)                                 \n"
        "run      trigger started (UTC)   secs stop reason     done failed deferred units\n"
        "────────────────────────────────────────────────────────────────────────────────\n"
        "3a2b3c4d cli     12-01 12:00:00     — unfinished         0      0        0     0\n"
        "2a2b3c4d cron    12-01 11:00:00   2.0 error              0      1        0     0\n"
        "1a2b3c4d worker  12-01 10:00:00 220.5 quota_exhausted 1234      5       17 10000\n"
        "\n"
        "run      summary / error                                                    \n"
        "────────────────────────────────────────────────────────────────────────────\n"
        "2a2b3c4d error: RuntimeError: the database went away in the middle of a lon…\n"
        "1a2b3c4d maintenance.prune.jobs_deleted=3, rate_waited_s=7.88, searches=12  \n")
    # --json keeps every counter as stored.
    assert rota.json("runs")[2]["summary"]["maintenance.killed_runs.marked"] == 0


def test_rota_jobs_is_readable_at_80_columns(rota: Rota) -> None:
    """The job listings wrapped into columns of a few characters at 80 columns, as
    `rota runs` did: their figures are one table that fits, each job's error another."""
    rota("migrate")
    rota("groups", "set", "campaign-1234", "--plan", "pro", "--owner", "user-77")
    rota.sql("""INSERT INTO {s}.jobs (type, payload, group_id, status, attempts,
        max_attempts, run_after, created_at, finished_at, last_error, give_up_pending)
        VALUES ('draft', '{{}}', NULL, 'failed', 1, 1, '2026-12-01 10:00:00+00',
                '2026-12-01 10:00:00+00', '2026-12-01 10:00:05+00',
                'RuntimeError: the model answered 429 Too Many Requests after three '
                'retries', true),
               ('search', '{{}}', 'campaign-1234', 'pending', 0, 3,
                '2026-12-01 11:00:00+00', '2026-12-01 11:00:00+00', NULL, NULL, false)""")
    assert rota("jobs", COLUMNS="80").stdout == (
        "                              jobs (2 shown)                               \n"
        "id type   group         plan status  attempts deferrals run after (UTC)    \n"
        "───────────────────────────────────────────────────────────────────────────\n"
        " 2 search campaign-1234 Pro  pending      0/3         0 2026-12-01 11:00:00\n"
        " 1 draft  —             —    failed       1/1         0 2026-12-01 10:00:00\n"
        "\n"
        "job last error                                                  \n"
        "────────────────────────────────────────────────────────────────\n"
        "  1 RuntimeError: the model answered 429 Too Many Requests afte…\n")
    assert rota("jobs", "failed", COLUMNS="80").stdout == (
        "                 failed jobs (1 shown)                  \n"
        "id type  group attempts finished (UTC)      give-up hook\n"
        "────────────────────────────────────────────────────────\n"
        " 1 draft —          1/1 2026-12-01 10:00:05 owed        \n"
        "\n"
        "job last error                                                                \n"
        "──────────────────────────────────────────────────────────────────────────────\n"
        "  1 RuntimeError: the model answered 429 Too Many Requests after three retries\n")


def test_depth_age_counts_from_when_the_job_could_first_be_due(rota: Rota) -> None:
    rota("enqueue", "echo", "{}", "--run-after", "2000-01-01T00:00:00Z")
    [row] = rota.json("depth")
    assert 0 <= row["oldest_due_seconds"] < 60
    rota.sql("UPDATE {s}.jobs SET created_at = now() - interval '3 days', "
             "run_after = now() - interval '50 hours'")
    [row] = rota.json("depth")
    assert abs(row["oldest_due_seconds"] - 50 * 3600) < 60
    assert " 2d │" in rota("depth").stdout


def test_schema_help_names_the_environment_variable() -> None:
    text = " ".join(CliRunner().invoke(cli, ["schema", "--help"]).stdout.split())
    assert "[default: rota]" not in text
    assert "[env ROTA_SCHEMA; when neither is given: rota]" in text
    out = CliRunner().invoke(cli, ["schema"], env={"ROTA_SCHEMA": "from_env"}).stdout
    assert 'CREATE SCHEMA "from_env";' in out


def test_enqueue_reads_the_payload_from_stdin_or_a_file(rota: Rota, tmp_path: Path) -> None:
    big = {"text": "x" * 600_000}  # longer than one command-line argument may be
    path = tmp_path / "payload.json"
    path.write_text(json.dumps(big))
    assert rota.json("enqueue", "echo", f"@{path}")["id"] == 1
    result = CliRunner().invoke(cli, ["enqueue", "echo", "-", "--json"],
                                input=json.dumps({"n": 2}), env=rota.env,
                                catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    assert rota.sql("SELECT id, length(payload::text) > 600000, payload->'n' "
                    "FROM {s}.jobs ORDER BY id") == [(1, True, None), (2, False, 2)]
    result = rota("enqueue", "echo", f"@{tmp_path / 'missing.json'}", ok=False)
    assert result.exit_code == 2
    assert "cannot read the payload from file" in result.stderr
    assert "No such file or directory" in result.stderr


UNDECLARED_APP = """
from rota import Pipeline, Stage

async def handle(ctx):
    pass

def build(queue):
    return Pipeline(queue, [Stage("send", 1, 1, handle), Stage("fetch", 1, 1, handle)])
"""


@pytest.mark.parametrize("how", ["--app", "ROTA_APP"])
def test_enqueue_refuses_a_type_the_app_never_runs(rota: Rota, write_app: Any,
                                                   how: str) -> None:
    """An app that declares no ``types``: the database would take any type, and a job
    no stage claims would never run. With the app given, it is refused, naming the stage
    types, and nothing is written; without an app it is enqueued as before."""
    app = f"{write_app(UNDECLARED_APP)}:build"
    args, env = (["--app", app], {}) if how == "--app" else ([], {"ROTA_APP": app})
    result = rota("enqueue", "nosuchtype", "{}", *args, ok=False, **env)
    one_line_error(result, "")
    assert result.stderr == (
        f"error: unknown job type 'nosuchtype': {how} {app!r} runs the stage types send, "
        "fetch (without --app/ROTA_APP any type may be enqueued)\n")
    assert rota.sql("SELECT count(*) FROM {s}.jobs") == [(0,)]
    assert rota.json("enqueue", "send", "{}", *args, **env)["id"] == 1
    assert rota.json("enqueue", "nosuchtype", "{}")["id"] == 2
    assert rota.sql("SELECT type FROM {s}.jobs ORDER BY id") == [("send",), ("nosuchtype",)]


def test_serve_refuses_to_start_without_cron_secret(
    rota: Rota, process_env: dict[str, str],
) -> None:
    """As `rota dashboard` refuses without its secret: `rota serve` started and answered
    401 to everything. A real process, exit 2, one line, nothing served."""
    rota("migrate")
    for secret in (None, "", "   ", "undefined"):
        env = {k: v for k, v in process_env.items() if k != "CRON_SECRET"}
        if secret is not None:
            env["CRON_SECRET"] = secret
        out = subprocess.run([sys.executable, "-m", "rota.cli", "serve", "--port", "0"],
                             capture_output=True, text=True, timeout=30, cwd=ROOT, env=env)
        assert (out.returncode, out.stdout, out.stderr) == (2, "", (
            "error: CRON_SECRET is not set: /api/cron would refuse every request (make "
            "one with python -c 'import secrets; print(secrets.token_urlsafe(32))')\n")), secret
    assert rota.sql("SELECT count(*) FROM {s}.runs") == [(0,)]


IN_USE = "the address is already in use (by another server?; pick another --port)"


@pytest.mark.parametrize("command", [["dashboard", "--read-only"], ["serve"],
                                     ["serve", "--metrics"]], ids=" ".join)
def test_a_server_on_a_port_in_use_is_one_line_and_exit_2(
    rota: Rota, process_env: dict[str, str], spawn: Any, command: list[str],
) -> None:
    """Real processes, a port another socket listens on: one line, exit 2, as for any
    configuration error (uvicorn's own report was a traceback and exit 3); a short
    secret is used, with a warning naming it."""
    env = {**process_env, "ROTA_DASHBOARD_SECRET": "short-secret", "CRON_SECRET": "c" * 16}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        p = spawn([*command, "--port", str(port)], env)
        out, err = p.communicate(timeout=60)
    warning = ("warning: ROTA_DASHBOARD_SECRET is 12 characters long; use at least 16 "
               "(for example: python -c 'import secrets; print(secrets.token_urlsafe(32))')"
               "\n")
    assert (p.returncode, out) == (2, "")
    assert err == ("" if command == ["serve"] else warning) + \
        f"error: cannot listen on 127.0.0.1:{port}: {IN_USE}\n"


def test_a_dashboard_secret_of_16_characters_or_an_ipv6_port_in_use(
    rota: Rota, process_env: dict[str, str], spawn: Any,
) -> None:
    with socket.socket(socket.AF_INET6) as taken:
        taken.bind(("::1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        p = spawn(["dashboard", "--host", "::1", "--port", str(port)],
                  {**process_env, "ROTA_DASHBOARD_SECRET": "s" * 16})
        out, err = p.communicate(timeout=60)
    assert (p.returncode, out, err) == (2, "", f"error: cannot listen on [::1]:{port}: "
                                                f"{IN_USE}\n")


def test_the_give_up_hook_column_is_one_truth_for_the_cli_and_the_dashboard(
    rota: Rota,
) -> None:
    """boom has no give-up hook, echo has one: `rota jobs failed` said "ran" for boom
    while the dashboard said "—". Both now ask one function; with the app they tell
    `ran` from `none`, without it they say `not owed`."""
    import asyncio
    import re as regex

    from rota import Queue, dashboard_app
    from tests.cli_app import build_pipeline

    rota("enqueue", "boom", "{}", "--app", APP)
    assert rota.json("run", "--app", APP, "--budget", "10")["jobsFailed"] == 1  # job 1
    rota("enqueue", "echo", "{}")
    rota("jobs", "cancel", "2", "--app", APP)  # its hook runs now
    rota("enqueue", "echo", "{}")
    rota("jobs", "cancel", "3")  # no app: its hook is owed
    rota("enqueue", "echo", "{}")  # job 4: pending, has not given up
    expected = {True: {1: "none", 2: "ran", 3: "owed", 4: "—"},
                False: {1: "not owed", 2: "not owed", 3: "owed", 4: "—"}}
    for with_app, states in expected.items():
        args = ["--app", APP] if with_app else []
        cli_states = {j["id"]: j["give_up_hook"]
                      for j in rota.json("jobs", "failed", *args)}
        assert cli_states == {k: v for k, v in states.items() if k != 4}
        table = rota("jobs", "failed", *args).stdout
        for job_id, state in cli_states.items():
            assert regex.search(rf"^ *{job_id} .* {state} *$", table, regex.M), table

        async def dashboard(with_app: bool = with_app,
                            states: dict[int, str] = states) -> dict[int, str]:
            queue = Queue(rota.url, schema=rota.schema)
            await queue.open()
            try:
                # The app's hooks are its pipeline's queue's: the dashboard takes them
                # from the pipeline given.
                app = dashboard_app(queue, secret="s" * 20, read_only=True,
                                    pipeline=build_pipeline(queue) if with_app else None)
                seen = {}
                async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                             base_url="http://127.0.0.1",
                                             auth=("rota", "s" * 20)) as c:
                    for job_id in states:
                        page = (await c.get(f"/jobs/{job_id}")).text
                        found = regex.search(r"<dt>give-up hook</dt><dd>([^<]*)</dd>", page)
                        assert found, page
                        seen[job_id] = found.group(1)
                return seen
            finally:
                await queue.close()

        assert asyncio.run(dashboard()) == states


def test_enqueue_with_an_app_takes_a_type_only_its_queue_declares(
    rota: Rota, write_app: Any,
) -> None:
    """A type declared in the app's queue_settings but run by no stage (another process
    runs it) may be enqueued; the refusal names it beside the stage types."""
    source = UNDECLARED_APP + 'build.queue_settings = {"types": ["send", "fetch", "mail"]}\n'
    app = f"{write_app(source)}:build"
    assert rota.json("enqueue", "mail", "{}", "--app", app)["id"] == 1
    result = rota("enqueue", "nosuchtype", "{}", "--app", app, ok=False)
    assert (result.exit_code, result.stderr) == (2, (
        f"error: unknown job type 'nosuchtype': --app {app!r} runs the stage types send, "
        "fetch; the queue also declares mail (without --app/ROTA_APP any type may be "
        "enqueued)\n"))


def test_a_one_character_secret_is_warned_about_in_the_singular(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from rota.cli.listening import warn_short_secret

    warn_short_secret("CRON_SECRET", "x")
    warn_short_secret("CRON_SECRET", "x" * 16)
    assert capsys.readouterr().err == (
        "warning: CRON_SECRET is 1 character long; use at least 16 (for example: python -c "
        "'import secrets; print(secrets.token_urlsafe(32))')\n")


def test_python_dash_m_rota_is_the_rota_command() -> None:
    # `python -m rota` runs the same command as the console script and `python -m rota.cli`.
    runs = [subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                           text=True, timeout=60, cwd=ROOT)
            for module in ("rota", "rota.cli")]
    assert [r.returncode for r in runs] == [0, 0]
    assert runs[0].stdout == runs[1].stdout
    assert runs[0].stdout.startswith("Usage: rota [OPTIONS] COMMAND [ARGS]...")
