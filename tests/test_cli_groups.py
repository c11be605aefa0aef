"""`rota groups set` and `rota groups list` against a real database: a group is created,
then only the fields given change; the claim sees the plan and the pause; bad values are
one line and exit 2, writing nothing; a queue reading the application's groups relation
lists it and refuses to set."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner
from psycopg import sql

from rota import InvalidInput, Queue, UnknownPlan, admin
from rota.cli import cli
from tests.test_cli import APP, Rota, one_line_error
from tests.test_cli import write_app as write_app  # a fixture, asked for by name


@pytest.fixture
def rota(database_url: str, schema: str) -> Rota:
    r = Rota(database_url, schema)
    r("migrate")
    return r


def groups_table(rota: Rota) -> list[tuple[object, ...]]:
    return rota.sql("SELECT group_id, owner_id, plan, active FROM {s}.groups ORDER BY 1")


def test_set_creates_then_changes_only_what_is_given(rota: Rota) -> None:
    assert rota("groups", "set", "acme", "--owner", "u1", "--plan", "pro").stdout == (
        "created group 'acme': owner u1, plan pro, active\n")
    assert rota.json("groups", "set", "acme", "--paused") == {
        "group_id": "acme", "owner_id": "u1", "plan": "pro", "active": False,
        "max_running": None, "created": False}
    assert rota("groups", "set", "acme", "--plan", "free").stdout == (
        "updated group 'acme': owner u1, plan free, paused\n")
    assert rota("groups", "set", "bare").stdout == (
        "created group 'bare': owner —, plan — (ranked as the middle plan), active\n")
    assert rota("groups", "set", "acme", "--no-owner", "--no-plan", "--active").stdout == (
        "updated group 'acme': owner —, plan — (ranked as the middle plan), active\n")
    assert groups_table(rota) == [("acme", None, None, True), ("bare", None, None, True)]


def test_the_claim_sees_the_plan_and_the_pause(rota: Rota) -> None:
    rota("groups", "set", "low", "--plan", "free")
    rota("groups", "set", "high", "--plan", "pro")
    rota("enqueue", "echo", "{}", "--group", "low")
    rota("enqueue", "echo", "{}", "--group", "high")
    rota("groups", "set", "high", "--paused")
    assert rota.json("run", "--app", APP, "--budget", "10")["jobsDone"] == 1
    assert rota.sql("SELECT group_id, status FROM {s}.jobs ORDER BY id") == [
        ("low", "done"), ("high", "pending")]
    rota("groups", "set", "high", "--active")
    assert rota.json("run", "--app", APP, "--budget", "10")["jobsDone"] == 1
    # Each was charged its one job's cost (docs/design.md, "Cost"); a charge of 2.5
    # written by hand shows as such, in the table too.
    rota.sql("UPDATE {s}.jobs SET cost = 2.5 WHERE group_id = 'high'")
    assert [(g["group_id"], g["served"]) for g in rota.json("groups", "list")] == [
        ("high", 2.5), ("low", 1)]
    assert any("│ high " in line and "2.5" in line
               for line in rota("groups", "list").stdout.splitlines())


def test_list_pages_in_id_order_with_plan_names(rota: Rota) -> None:
    for gid, plan in [("c", "pro"), ("a", "free"), ("b", None), ("d", "gone")]:
        args = ["--plan", plan] if plan else []
        if plan == "gone":  # a plan since removed from the app's plans
            rota.sql("INSERT INTO {s}.groups (group_id, plan) VALUES ('d', 'gone')")
        else:
            rota("groups", "set", gid, *args)
    rota("groups", "set", "b", "--owner", "o-7", "--paused")
    assert rota.json("groups", "list") == [
        {"group_id": "a", "owner_id": None, "plan": "free", "active": True,
         "served": 0, "running": 0, "owner_running": 0,
         "max_running": None, "cap": None},
        {"group_id": "b", "owner_id": "o-7", "plan": None, "active": False,
         "served": 0, "running": 0, "owner_running": 0,
         "max_running": None, "cap": None},
        {"group_id": "c", "owner_id": None, "plan": "pro", "active": True,
         "served": 0, "running": 0, "owner_running": 0,
         "max_running": None, "cap": None},
        {"group_id": "d", "owner_id": None, "plan": "gone", "active": True,
         "served": 0, "running": 0, "owner_running": 0,
         "max_running": None, "cap": None}]
    page = rota("groups", "list", "--limit", "2")
    assert page.stderr == ""
    lines = page.stdout.splitlines()
    assert lines[-1] == "next page: --after b"
    assert any("│ a " in line and "Free (free)" in line and "active" in line
               for line in lines), page.stdout
    assert any("│ b " in line and "o-7" in line and "paused" in line for line in lines)
    assert not any("│ c " in line for line in lines)
    result = rota("groups", "list", "--limit", "2", "--after", "b", "--json")
    assert [g["group_id"] for g in json.loads(result.stdout)] == ["c", "d"]
    assert result.stderr == ""
    text = rota("groups", "list", "--after", "c").stdout
    assert "gone (unknown)" in text and "next page" not in text


def test_max_running_is_set_kept_shown_and_cleared(rota: Rota) -> None:
    assert rota("groups", "set", "acme", "--max-running", "2").stdout == (
        "created group 'acme': owner —, plan — (ranked as the middle plan), active, "
        "max running 2\n")
    # Left out, it stays; `none` clears it.
    assert rota.json("groups", "set", "acme", "--paused")["max_running"] == 2
    rota("enqueue", "echo", "{}", "--group", "acme")
    rota.sql("UPDATE {s}.jobs SET status = 'running', locked_at = now(), attempts = 1,"
             " claim_token = gen_random_uuid()")
    [row] = rota.json("groups", "list")
    assert (row["max_running"], row["running"]) == (2, 1)
    assert any("│ acme " in line and "1/2" in line
               for line in rota("groups", "list").stdout.splitlines())
    assert rota.json("groups", "set", "acme", "--max-running", "none")["max_running"] is None
    assert rota.sql("SELECT max_running FROM {s}.groups") == [(None,)]


@pytest.mark.parametrize(("args", "message"), [
    (["--max-running", "0"], "error: --max-running must be none or a whole number from 1 "
                             "to 2,147,483,647, got 0 ("),
    (["--max-running", "two"], "error: --max-running must be none or a whole number from "
                               "1 to 2,147,483,647, got 'two' ("),
    (["--plan", "platinum"], "error: unknown plan 'platinum'"),
    (["--plan", "pro", "--no-plan"], "error: --plan and --no-plan contradict each other"),
    (["--owner", "u", "--no-owner"], "error: --owner and --no-owner contradict each other"),
    (["--paused", "--active"], "error: --active and --paused contradict each other"),
    (["--active", "--paused"], "error: --active and --paused contradict each other"),
])
def test_bad_values_are_one_line_exit_2_and_write_nothing(
    rota: Rota, args: list[str], message: str,
) -> None:
    rota("groups", "set", "g", "--plan", "free")
    result = rota("groups", "set", "g", *args, ok=False)
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr, result.stderr
    assert groups_table(rota) == [("g", None, "free", True)]


def test_an_application_groups_relation_is_listed_and_never_written(
    rota: Rota, write_app: object,
) -> None:
    rota.sql("CREATE TABLE {s}.app_groups (group_id text, owner_id text, plan text, "
             "active boolean)")
    rota.sql("INSERT INTO {s}.app_groups VALUES ('x', 'o', 'pro', true)")
    source = ("from rota import Pipeline, Stage\n"
              "async def h(ctx): pass\n"
              "def build(queue):\n"
              "    return Pipeline(queue, [Stage('echo', 1, 1, h)])\n"
              f"build.queue_settings = {{'groups': '{rota.schema}.app_groups'}}\n")
    app = f"{write_app(source)}:build"  # type: ignore[operator]
    assert rota.json("groups", "list", "--app", app) == [
        {"group_id": "x", "owner_id": "o", "plan": "pro", "active": True,
         "served": 0, "running": 0, "owner_running": 0,
         "max_running": None, "cap": None}]
    result = rota("groups", "set", "x", "--paused", "--app", app, ok=False)
    one_line_error(result, "error: this queue reads groups from the application's relation")
    assert rota.sql("SELECT active FROM {s}.app_groups") == [(True,)]


FAIR_BY_APP = """
from rota import Pipeline, Stage

async def note(ctx):
    ctx.count("by_" + ctx.queue.fair_by)

def build(queue):
    return Pipeline(queue, [Stage("note", 1, 1, note)])

build.queue_settings = {{"fair_by": {setting!r}}}
"""


@pytest.mark.parametrize("setting, flag, env, used", [
    ("group", [], None, "group"),                      # the app's setting
    ("owner", [], None, "owner"),
    ("group", ["--fair-by", "owner"], None, "owner"),  # the flag wins over the app's
    ("owner", [], "group", "group"),                   # and so does ROTA_FAIR_BY
])
def test_fair_by_comes_from_the_flag_the_environment_or_the_app(
        rota: Rota, write_app: Any, setting: str, flag: list[str], env: str | None,
        used: str) -> None:
    app = write_app(FAIR_BY_APP.format(setting=setting))
    rota("enqueue", "note", "{}", "--app", f"{app}:build")
    summary = rota.json("run", *flag, "--app", f"{app}:build", "--budget", "10",
                        ROTA_FAIR_BY=env)["summary"]
    assert {k: v for k, v in summary.items() if k.startswith("by_")} == {f"by_{used}": 1}


def test_a_bad_fair_by_is_refused_before_anything_runs(rota: Rota) -> None:
    result = rota("groups", "list", ok=False, ROTA_FAIR_BY="customer")
    assert result.exit_code == 2
    assert "'customer' is not one of 'group', 'owner'" in result.stderr


@pytest.mark.parametrize(("args", "env", "named"), [
    ([], {"ROTA_FAIR_BY": "bogus"}, "ROTA_FAIR_BY"),
    (["--fair-by", "bogus"], {}, "--fair-by"),
    (["--fair-by", "bogus"], {"ROTA_FAIR_BY": "group"}, "--fair-by"),
], ids=["environment", "option", "option-over-environment"])
def test_a_bad_fair_by_is_named_as_it_was_given(
        rota: Rota, args: list[str], env: dict[str, str], named: str) -> None:
    """ROTA_FAIR_BY=bogus was reported as --fair-by, which the user never typed."""
    result = CliRunner().invoke(cli, ["groups", *args, "list"], prog_name="rota",
                                env={**rota.env, **env})
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", (
        f"error: Invalid value for '{named}': 'bogus' is not one of 'group', 'owner'. "
        "(see 'rota groups --help')\n"))


def test_set_keeps_a_stored_plan_the_queue_does_not_know(rota: Rota) -> None:
    """Without --app only rota's default plans are known: a group whose stored plan is
    another (since removed, or the app's) was refused by every `groups set`, though
    --plan was not given. Only what is given is checked; the plan stays as it is."""
    rota.sql("INSERT INTO {s}.groups (group_id, plan) VALUES ('legacy', 'oldplan')")
    assert rota("groups", "set", "legacy", "--paused").stdout == (
        "updated group 'legacy': owner —, plan oldplan, paused\n")
    assert rota("groups", "set", "legacy", "--owner", "o1", "--max-running", "3").stdout == (
        "updated group 'legacy': owner o1, plan oldplan, paused, max running 3\n")
    assert rota.json("groups", "set", "legacy", "--no-owner", "--active") == {
        "group_id": "legacy", "owner_id": None, "plan": "oldplan", "active": True,
        "max_running": 3, "created": False}
    assert groups_table(rota) == [("legacy", None, "oldplan", True)]
    # A plan given is still checked: the queue's plans do not have it.
    result = rota("groups", "set", "legacy", "--plan", "oldplan", "--paused", ok=False)
    assert (result.exit_code, result.stderr) == (
        2, "error: unknown plan 'oldplan'; known plans: free, standard, pro\n")
    assert groups_table(rota) == [("legacy", None, "oldplan", True)]


async def test_set_group_checks_only_what_is_given(queue: Queue) -> None:
    await queue.upsert_group("g", plan="pro", max_running=2)
    async with queue.connection() as conn:
        await conn.execute(sql.SQL("UPDATE {}.groups SET plan = 'gone'")
                           .format(sql.Identifier(queue.schema)))
    row, created = await admin.set_group(queue, "g", active=False)
    assert (row.plan, row.active, row.max_running, created) == ("gone", False, 2, False)
    with pytest.raises(UnknownPlan):
        await admin.set_group(queue, "g", plan="gone")
    with pytest.raises(InvalidInput, match=r"^max_running must be None or an int from 1 to "
                                           r"2,147,483,647, got 2147483648$"):
        await admin.set_group(queue, "g", max_running=2**31)


@pytest.mark.parametrize(("value", "written"), [("2147483647", 2**31 - 1), ("1", 1)])
def test_max_running_takes_every_cap_the_table_holds(
        rota: Rota, value: str, written: int) -> None:
    """The groups table's max_running is an integer checked only for more than 0: every
    such cap can be set, and the message for one out of range says the range."""
    rota("groups", "set", "g", "--max-running", value)
    assert rota.sql("SELECT max_running FROM {s}.groups") == [(written,)]
    result = CliRunner().invoke(cli, ["groups", "set", "g", "--max-running", "2147483648"],
                                prog_name="rota", env=rota.env)
    assert (result.exit_code, result.stderr) == (2, (
        "error: --max-running must be none or a whole number from 1 to 2,147,483,647, got "
        "2147483648 (see 'rota groups set --help')\n"))
    assert rota.sql("SELECT max_running FROM {s}.groups") == [(written,)]


def test_list_shows_running_against_the_owners_cap(rota: Rota) -> None:
    """Each group's running jobs (a fresh lock), and its owner's against its plan's cap
    (docs/design.md, "Caps"): X has one job running in each of its two groups, at its
    cap of 2; a stale lock holds no slot."""
    app = "tests.cli_app:build_capped"  # CAP_PLANS: "capped" caps each owner at 2
    for gid in ("x1", "x2"):
        rota("groups", "set", gid, "--owner", "X", "--plan", "capped", "--app", app)
    rota("groups", "set", "y", "--plan", "open", "--app", app)
    rota.sql("INSERT INTO {s}.jobs (type, group_id, payload, status, max_attempts,"
             " run_after, created_at, locked_at, attempts, claim_token)"
             " SELECT 'hold', g, '{{}}', 'running', 3, now(), now(), now() - ago, 1,"
             " gen_random_uuid() FROM (VALUES ('x1', interval '0'), ('x2', interval '0'),"
             " ('y', interval '0'), ('y', interval '1 hour')) AS w(g, ago)")
    assert [(g["group_id"], g["running"], g["owner_running"], g["cap"])
            for g in rota.json("groups", "list", "--app", app)] == [
        ("x1", 1, 2, 2), ("x2", 1, 2, 2), ("y", 1, 1, None)]
    lines = rota("groups", "list", "--app", app).stdout.splitlines()
    assert any("│ x1 " in line and "1 (owner 2/2)" in line for line in lines), lines
    assert any("│ y " in line and "1 (owner" not in line for line in lines), lines


def table_rows(text: str) -> list[list[str]]:
    """A rich table's body rows as their cells, stripped."""
    return [[c.strip() for c in line.split("│")[1:-1]]
            for line in text.splitlines() if line.count("│") > 2]


def test_every_listing_marks_a_missing_plan_and_owner_with_the_same_dash(
        rota: Rota) -> None:
    """`rota jobs` said "(no owner)" and `rota depth` "(none)" where `rota groups list`
    said "—" for a group without a plan: one mark everywhere now."""
    rota("groups", "set", "bare")
    rota("enqueue", "echo", "{}", "--group", "bare")
    rota("enqueue", "echo", "{}")  # no group, so no plan either
    # A compact table: cells one space apart, none of these with a space in it.
    jobs = [line.split() for line in rota("jobs").stdout.splitlines()
            if line.split()[:1] in (["1"], ["2"])]
    assert [(r[0], r[2], r[3]) for r in jobs] == [("2", "—", "—"), ("1", "bare", "—")]
    groups = table_rows(rota("groups", "list").stdout)
    assert [r[:3] for r in groups] == [["bare", "—", "—"]]
    depth = table_rows(rota("depth").stdout)
    assert [r[:2] for r in depth] == [["echo", "—"], ["total", ""]]
