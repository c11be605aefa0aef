"""The fair claim's contract (docs/fast-claim.md, "The contract"): `rota verify` notices
each kind of damage to the bookkeeping, naming the group and the value expected and
found; `rota verify --repair` rebuilds it from the jobs table, on a damaged queue and on
a live one with claims running on other connections, after which the claim is still
the oracle's. The fold mark (the claim reads only the deltas above it). And the
package's boundaries: one delta rule, and no code outside
`rota/fair/` that touches the bookkeeping tables."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg import sql

from rota import Queue
from rota.cli import cli
from rota.fair import Violation

from .test_fast_claim import claim_equals_oracle

ROOT = Path(__file__).resolve().parents[1]


async def run(aconn: Any, queue: Queue, query: str, *params: Any) -> list[tuple[Any, ...]]:
    """A statement on the test's own connection ({s}: the queue's schema), its rows."""
    cur = await aconn.execute(sql.SQL(query).format(s=sql.Identifier(queue.schema)),
                              params or None)
    return await cur.fetchall() if cur.description else []


async def scenario(queue: Queue, aconn: Any) -> dict[str, Any]:
    """Three groups of type t, the bookkeeping folded and its edge moved:
    g1 (pro) two jobs claimed, one of them completed, and one pending; g2 (free) two
    pending; g3 (no plan) a job deferred an hour, then a newer one ready now (so its
    head bound is valid only until the deferred one comes due).
    Returns the pending jobs' (created_at, id, run_after) as UTC text, by group."""
    await queue.upsert_group("g1", plan="pro")
    await queue.upsert_group("g2", plan="free")
    await queue.upsert_group("g3", plan=None)
    for _ in range(3):
        await queue.enqueue("t", {}, group_id="g1")
    for _ in range(2):
        await queue.enqueue("t", {}, group_id="g2")
    await queue.enqueue("t", {}, group_id="g3", run_after=(
        await queue.now()) + timedelta(hours=1))
    await queue.enqueue("t", {}, group_id="g3")
    claimed = await queue.claim("t", 2)
    assert [j.group_id for j in claimed] == ["g1", "g1"]
    assert await queue.complete(claimed[0])
    # The background rounds stopped, so none folds between a test's damage and its
    # check; then one round folds and moves the edge to the window start.
    await queue.upkeep.stop()
    await queue.upkeep.run_once()
    assert await queue.verify() == []
    await aconn.execute("SET TIME ZONE 'UTC'")
    jobs: dict[str, list[tuple[str, int, str]]] = {}
    for g, created, id_, ready in await run(aconn, queue, (
            "SELECT group_id, created_at::text, id, run_after::text FROM {s}.jobs"
            " WHERE status = 'pending' ORDER BY created_at, id")):
        jobs.setdefault(g, []).append((created, id_, ready))
    return jobs


async def bounds(aconn: Any, queue: Queue, group: str) -> tuple[str, int, str, str]:
    """The group's (head_lb, head_id, head_until, ready_lb), timestamps as UTC text."""
    rows = await run(aconn, queue, "SELECT head_lb::text, head_id, head_until::text,"
                     " ready_lb::text FROM {s}.fair_groups WHERE type = 't'"
                     " AND group_id = %s", group)
    return rows[0]  # type: ignore[return-value]


def head(created: str, id_: int, ready: str) -> str:
    return f"(head_lb, head_id) <= ({created}, {id_}) or head_until <= {ready}"


@pytest.mark.damages_bookkeeping
async def test_a_served_count_off_by_some_is_named_with_both_counts(
        queue: Queue, aconn: Any) -> None:
    await scenario(queue, aconn)
    await run(aconn, queue, "UPDATE {s}.fair_groups SET served_n = served_n + 5"
              " WHERE group_id = 'g1'")
    # Its owner's row (g1 has none: its own) no longer sums its groups' rows either.
    assert await queue.verify() == [
        Violation("t", "g1", "served", "2", "7"),
        Violation("t", "g:g1 'p:pro'", "owner_served", "7", "2", "p:pro", "g:g1")]


@pytest.mark.damages_bookkeeping
async def test_a_cost_changed_behind_the_triggers_is_named_in_cost_units(
        queue: Queue, aconn: Any) -> None:
    """The served counts are costs (docs/design.md, "Cost"): a served job of g1 whose
    cost became 3.5 with the triggers off (as a restore of jobs alone would) is named
    with both sums."""
    await scenario(queue, aconn)
    await run(aconn, queue, "SET session_replication_role = replica")
    await run(aconn, queue, "UPDATE {s}.jobs SET cost = 3.5 WHERE id = (SELECT min(id)"
              " FROM {s}.jobs WHERE group_id = 'g1' AND status IN ('running', 'done'))")
    await run(aconn, queue, "SET session_replication_role = DEFAULT")
    # The owner's row still sums its groups' rows: only the group's count is off.
    assert await queue.verify() == [Violation("t", "g1", "served", "4.5", "2")]
    await queue.repair_bookkeeping()
    assert await queue.verify() == []


@pytest.mark.damages_bookkeeping
async def test_a_stray_served_delta_is_counted_in_found(queue: Queue, aconn: Any) -> None:
    await scenario(queue, aconn)
    await run(aconn, queue, "INSERT INTO {s}.fair_served (type, group_id, n)"
              " VALUES ('t', 'g2', 1)")
    assert await queue.verify() == [Violation("t", "g2", "served", "0", "1")]


@pytest.mark.damages_bookkeeping
async def test_a_head_lb_above_the_first_job_names_that_job(
        queue: Queue, aconn: Any) -> None:
    jobs = await scenario(queue, aconn)
    await run(aconn, queue, "UPDATE {s}.fair_groups SET head_lb = head_lb + interval"
              " '1 hour' WHERE group_id = 'g2'")
    lb, hid, until, _ = await bounds(aconn, queue, "g2")
    assert until == "infinity"
    assert await queue.verify() == [
        Violation("t", "g2", "head", head(*jobs["g2"][0]), f"({lb}, {hid}), head_until {until}")]


@pytest.mark.damages_bookkeeping
async def test_a_head_id_past_the_first_job_of_its_instant_names_that_job(
        queue: Queue, aconn: Any) -> None:
    jobs = await scenario(queue, aconn)
    created, first_id, _ = jobs["g2"][0]
    await run(aconn, queue, "UPDATE {s}.fair_groups SET head_lb = %s, head_id = %s"
              " WHERE group_id = 'g2'", created, first_id + 1)
    assert await queue.verify() == [
        Violation("t", "g2", "head", head(*jobs["g2"][0]),
                  f"({created}, {first_id + 1}), head_until infinity")]


@pytest.mark.damages_bookkeeping
async def test_a_head_until_past_an_older_deferred_job_names_that_job(
        queue: Queue, aconn: Any) -> None:
    jobs = await scenario(queue, aconn)
    deferred, ready = jobs["g3"]
    lb, hid, until, _ = await bounds(aconn, queue, "g3")
    assert (lb, hid, until) == (ready[0], ready[1], deferred[2])  # what the writers kept
    await run(aconn, queue, "UPDATE {s}.fair_groups SET head_until = 'infinity'"
              " WHERE group_id = 'g3'")
    assert await queue.verify() == [
        Violation("t", "g3", "head", head(*deferred), f"({lb}, {hid}), head_until infinity")]


@pytest.mark.damages_bookkeeping
async def test_a_ready_lb_after_a_pending_job_is_named(queue: Queue, aconn: Any) -> None:
    jobs = await scenario(queue, aconn)
    await run(aconn, queue, "UPDATE {s}.fair_groups SET ready_lb = ready_lb + interval"
              " '1 hour' WHERE group_id = 'g2'")
    *_, ready_lb = await bounds(aconn, queue, "g2")
    assert await queue.verify() == [
        Violation("t", "g2", "ready_lb", f"<= {jobs['g2'][0][2]}", ready_lb)]


@pytest.mark.damages_bookkeeping
async def test_a_moved_edge_shows_in_the_served_counts_it_moved_across(
        queue: Queue, aconn: Any) -> None:
    await scenario(queue, aconn)
    # Past g1's done job: it no longer counts against this edge, but served_n says it does.
    await run(aconn, queue, "UPDATE {s}.fair_edge SET edge = now() + interval '1 hour'")
    assert await queue.verify() == [Violation("t", "g1", "served", "1", "2")]


@pytest.mark.damages_bookkeeping
async def test_a_missing_edge_row_counts_every_done_job(queue: Queue, aconn: Any) -> None:
    await scenario(queue, aconn)
    await run(aconn, queue, "UPDATE {s}.jobs SET finished_at = now() - interval '3 days'"
              " WHERE status = 'done'")  # before the edge: the trigger uncounts it
    assert await queue.verify() == []
    await run(aconn, queue, "DELETE FROM {s}.fair_edge")  # no row: -infinity
    assert await queue.verify() == [Violation("t", "g1", "served", "2", "1")]


@pytest.mark.damages_bookkeeping
async def test_a_plan_copy_that_differs_from_the_groups_table_is_named(
        queue: Queue, aconn: Any) -> None:
    await scenario(queue, aconn)
    await run(aconn, queue, "UPDATE {s}.fair_groups SET plan = 'free' WHERE group_id = 'g1'")
    assert await queue.verify() == [Violation("t", "g1", "plan", "'pro'", "'free'")]


@pytest.mark.damages_bookkeeping
async def test_an_active_copy_that_differs_is_named(queue: Queue, aconn: Any) -> None:
    await scenario(queue, aconn)
    await run(aconn, queue, "UPDATE {s}.fair_groups SET active = false WHERE group_id = 'g2'")
    assert await queue.verify() == [Violation("t", "g2", "active", "true", "false")]


@pytest.mark.damages_bookkeeping
async def test_a_plan_missing_from_fair_plans_is_named(queue: Queue, aconn: Any) -> None:
    await scenario(queue, aconn)
    await run(aconn, queue, "DELETE FROM {s}.fair_plans WHERE plan = 'pro'")
    assert await queue.verify() == [
        Violation("t", "g1", "fair_plans", "plan 'pro' listed", "not listed")]


@pytest.mark.damages_bookkeeping
async def test_a_group_with_pending_jobs_and_no_row_is_named(
        queue: Queue, aconn: Any) -> None:
    await scenario(queue, aconn)
    await run(aconn, queue, "DELETE FROM {s}.fair_groups WHERE group_id = 'g2'")
    assert await queue.verify() == [
        Violation("t", "g2", "row", "a fair_groups row (2 pending jobs)", "none")]


@pytest.mark.damages_bookkeeping
async def test_an_owner_copy_that_differs_from_the_groups_table_is_named(
        queue: Queue, aconn: Any) -> None:
    await scenario(queue, aconn)
    await run(aconn, queue, "UPDATE {s}.fair_groups SET owner_id = 'acme'"
              " WHERE group_id = 'g2'")
    assert await queue.verify() == [Violation("t", "g2", "owner_id", "NULL", "'acme'")]


@pytest.mark.damages_bookkeeping
async def test_an_owner_row_whose_served_count_is_not_its_groups_sum_is_named(
        queue: Queue, aconn: Any) -> None:
    await scenario(queue, aconn)
    await run(aconn, queue, "UPDATE {s}.fair_owners SET served_n = served_n + 3"
              " WHERE unit = 'g:g1'")
    assert await queue.verify() == [
        Violation("t", "g:g1 'p:pro'", "owner_served", "2", "5", "p:pro", "g:g1")]


async def test_an_owner_bound_above_a_group_or_no_owner_row_is_named(
        queue: Queue, aconn: Any) -> None:
    await scenario(queue, aconn)
    # A change the fold could not take in yet (another test's open transaction holds
    # back the mark) would exempt g2 from the check: fold until there is none.
    for _ in range(100):
        if await run(aconn, queue, "SELECT count(*) FROM {s}.fair_owner_changes") == [(0,)]:
            break
        await asyncio.sleep(0.1)
        await queue.upkeep.run_once()
    assert await run(aconn, queue, "SELECT count(*) FROM {s}.fair_owner_changes") == [(0,)]
    head_lb, head_id, _, ready = await bounds(aconn, queue, "g2")
    expected = (f"(b_served, b_head_lb, b_head_id) <= (0, {head_lb}, {head_id}) and "
                f"ready_lb <= {ready}")
    await run(aconn, queue, "UPDATE {s}.fair_owners SET b_served = 9 WHERE unit = 'g:g2'")
    assert await queue.verify() == [Violation(
        "t", "g2", "owner_bound", expected, f"(9, {head_lb}, {head_id}), ready_lb {ready}",
        "p:free", "g:g2")]
    await run(aconn, queue, "DELETE FROM {s}.fair_owners WHERE unit = 'g:g2'")
    assert await queue.verify() == [Violation("t", "g2", "owner_bound", expected,
                                              "no owner row", "p:free", "g:g2")]
    # Recorded in fair_owner_changes since the fold (as a writer that lowered it
    # would): the claim takes it as special, and the owner's row need not hold it.
    await run(aconn, queue, "INSERT INTO {s}.fair_owner_changes (type, group_id, plan_key,"
              " unit) VALUES ('t', 'g2', 'p:free', 'g:g2')")
    assert await queue.verify() == []


@pytest.mark.damages_bookkeeping
async def test_an_owner_change_below_the_fold_mark_is_named(
        queue: Queue, aconn: Any) -> None:
    await scenario(queue, aconn)
    [(mark,)] = await run(aconn, queue, "SELECT max(upto)::text FROM {s}.fair_fold_mark")
    await run(aconn, queue, "INSERT INTO {s}.fair_owner_changes (type, group_id, plan_key,"
              " unit, xid) VALUES ('t', 'g2', 'p:free', 'g:g2', '1')")
    assert await queue.verify() == [Violation(
        "t", "g2", "changes_mark", f"rows at or above mark {mark}", "1 below it, from xid 1",
        "p:free", "g:g2")]


@pytest.mark.damages_bookkeeping
async def test_an_owner_change_moving_a_served_count_is_counted_with_the_row(
        queue: Queue, aconn: Any) -> None:
    """A move not taken in yet: the owner's row plus its changes is its groups' sum, and
    a change with no move behind it shows as owner_served."""
    await scenario(queue, aconn)
    await queue.upsert_group("g1", plan="pro", owner_id="acme")  # g1 (served 2) moves
    assert await queue.verify() == []
    # (Changes the fold has not taken in yet may be there too: only the move's count.)
    assert await run(aconn, queue, "SELECT unit, n FROM {s}.fair_owner_changes"
                     " WHERE group_id = 'g1' AND n <> 0 ORDER BY unit") == [
        ("g:g1", -2), ("o:acme", 2)]
    await run(aconn, queue, "INSERT INTO {s}.fair_owner_changes (type, group_id, plan_key,"
              " unit, n) VALUES ('t', 'g2', 'p:free', 'g:g2', 4)")
    assert await queue.verify() == [
        Violation("t", "g:g2 'p:free'", "owner_served", "0", "4", "p:free", "g:g2")]


# -- rota verify ------------------------------------------------------------------------


async def test_rota_verify_exits_0_when_exact_and_1_naming_each_violation(
        queue: Queue, aconn: Any, database_url: str) -> None:
    await scenario(queue, aconn)
    env = {"DATABASE_URL": database_url, "ROTA_SCHEMA": queue.schema, "COLUMNS": "250"}

    def invoke(*args: str) -> Any:
        return CliRunner().invoke(cli, ["verify", *args], env=env, catch_exceptions=False)

    async def rota(*args: str) -> Any:  # the command runs its own event loop
        return await asyncio.to_thread(invoke, *args)

    clean = await rota()
    assert (clean.exit_code, clean.stdout) == (0, "violations: none\n")
    assert json.loads((await rota("--json")).stdout) == {"violations": []}
    await run(aconn, queue, "UPDATE {s}.fair_groups SET served_n = served_n + 5"
              " WHERE group_id = 'g1'")
    await run(aconn, queue, "UPDATE {s}.fair_groups SET active = false WHERE group_id = 'g2'")
    broken = await rota("--schema", queue.schema)  # the target options of every command
    assert broken.exit_code == 1
    rows = [line.split("│")[1:-1] for line in broken.stdout.splitlines() if "│" in line]
    assert "violations (3)" in broken.stdout
    assert [[c.strip() for c in r] for r in rows] == [
        ["t", "g1", "—", "served", "2", "7"],
        ["t", "g2", "—", "active", "true", "false"],
        ["t", "—", "unit g:g1, plan pro", "owner_served", "7", "2"]]
    as_json = await rota("--json")
    assert as_json.exit_code == 1
    assert json.loads(as_json.stdout) == {"violations": [
        {"type": "t", "group_id": "g1", "invariant": "served", "expected": "2", "found": "7",
         "plan_key": None, "unit": None},
        {"type": "t", "group_id": "g2", "invariant": "active", "expected": "true",
         "found": "false", "plan_key": None, "unit": None},
        {"type": "t", "group_id": "g:g1 'p:pro'", "invariant": "owner_served",
         "expected": "7", "found": "2", "plan_key": "p:pro", "unit": "g:g1"}]}
    repaired = await rota("--repair", "--json")
    assert repaired.exit_code == 0
    assert json.loads(repaired.stdout) == {
        "violations": [],
        "repaired": {"found": json.loads(as_json.stdout)["violations"], "groups": 3}}


@pytest.mark.damages_bookkeeping
async def test_rota_verify_names_the_owner_type_and_fault_of_each_owner_violation(
        queue: Queue, aconn: Any, database_url: str) -> None:
    """A broken owner's row is named as a group's is: type, owner (its unit and plan),
    invariant, expected, found; `rota verify` used to print only the owner's keys
    packed into the group column, and an owner_bound or changes_mark line named no
    owner at all."""
    await scenario(queue, aconn)
    [(mark,)] = await run(aconn, queue, "SELECT max(upto)::text FROM {s}.fair_fold_mark")
    await run(aconn, queue, "UPDATE {s}.fair_owners SET served_n = served_n + 3"
              " WHERE unit = 'g:g1'")
    await run(aconn, queue, "INSERT INTO {s}.fair_owner_changes (type, group_id, plan_key,"
              " unit, xid) VALUES ('t', 'g2', 'p:free', 'g:g2', '1')")
    env = {"DATABASE_URL": database_url, "ROTA_SCHEMA": queue.schema, "COLUMNS": "250"}
    result = await asyncio.to_thread(CliRunner().invoke, cli, ["verify"], env=env,
                                     catch_exceptions=False)
    assert result.exit_code == 1
    rows = [[c.strip() for c in line.split("│")[1:-1]]
            for line in result.stdout.splitlines() if "│" in line]
    assert sorted(rows) == [
        ["t", "g2", "unit g:g2, plan free", "changes_mark", f"rows at or above mark {mark}",
         "1 below it, from xid 1"],
        ["t", "—", "unit g:g1, plan pro", "owner_served", "2", "5"]]
    assert sorted(str(v) for v in await queue.verify()) == [
        f"type 't' group 'g2' owner 'g:g2' plan 'p:free': changes_mark expected rows at or "
        f"above mark {mark}, found 1 below it, from xid 1",
        "type 't' owner 'g:g1' plan 'p:pro': owner_served expected 2, found 5"]


@pytest.mark.damages_bookkeeping
async def test_ctrl_c_during_a_repair_exits_130_and_rebuilds_nothing(
        queue: Queue, aconn: Any, database_url: str, spawn: Any) -> None:
    # Interrupted, `rota verify` used to print click's "Aborted!" and exit 1, which is
    # also its "violations found": a monitoring job read Ctrl-C as broken bookkeeping.
    await scenario(queue, aconn)
    await run(aconn, queue, "UPDATE {s}.fair_groups SET served_n = served_n + 5"
              " WHERE group_id = 'g1'")
    # PYTHONFAULTHANDLER: a process that does not end dumps its threads' stacks on
    # SIGABRT, so a hang shows where it waits (it hung when the suite ran in the
    # background, which passed SIGINT on ignored: conftest.signals_as_from_a_terminal).
    env = {**os.environ, "DATABASE_URL": database_url, "ROTA_SCHEMA": queue.schema,
           "PYTHONPATH": str(ROOT / "src"), "PYTHONFAULTHANDLER": "1"}
    async with await psycopg.AsyncConnection.connect(database_url) as holder:
        # A transaction that wrote jobs: the rebuild waits for it (docs/operations.md).
        await queue.enqueue("t", {}, group_id="g2", conn=holder)
        repair = spawn(["verify", "--repair"], env)
        waiting: list[Any] = []
        for _ in range(200):
            # This test's rebuild only: another test's, in another schema, may wait on
            # a lock at the same moment.
            waiting = await run(aconn, queue, "SELECT pid FROM pg_stat_activity WHERE"
                                " wait_event_type = 'Lock' AND query LIKE"
                                " '%%The rebuild''s locks%%' AND strpos(query, %s) > 0",
                                f"{queue.schema}\".jobs")
            if waiting:
                break
            await asyncio.sleep(0.05)
        assert len(waiting) == 1
        repair.send_signal(signal.SIGINT)
        try:
            out, err = await asyncio.to_thread(repair.communicate, timeout=30)
        except subprocess.TimeoutExpired:
            # Whether SIGINT was blocked, ignored or caught there (a disposition the
            # test process passed on would show here), then its stacks.
            status = (await asyncio.to_thread(
                Path(f"/proc/{repair.pid}/status").read_text)).splitlines()
            masks = [line for line in status if line.startswith(("SigBlk", "SigIgn",
                                                                  "SigCgt"))]
            repair.send_signal(signal.SIGABRT)
            out, err = await asyncio.to_thread(repair.communicate, timeout=10)
            raise AssertionError(f"rota verify --repair did not end within 30 s of "
                                 f"SIGINT ({'; '.join(masks)}; SIGINT here: "
                                 f"{signal.getsignal(signal.SIGINT)}); its stacks:\n"
                                 f"{err}") from None
        assert (repair.returncode, out, err) == (130, "", "error: interrupted\n")
        await holder.rollback()
    # The rebuild was rolled back with its connection: the damage is still there.
    assert await queue.verify() == [
        Violation("t", "g1", "served", "2", "7"),
        Violation("t", "g:g1 'p:pro'", "owner_served", "7", "2", "p:pro", "g:g1")]


# -- the rebuild --------------------------------------------------------------------------


async def test_repair_rebuilds_every_kind_of_damage_and_the_claim_stays_the_oracles(
        queue: Queue, aconn: Any, database_url: str) -> None:
    await scenario(queue, aconn)
    for damage in (
            "UPDATE {s}.fair_groups SET served_n = served_n + 5 WHERE group_id = 'g1'",
            "INSERT INTO {s}.fair_served (type, group_id, n) VALUES ('t', 'g2', 3)",
            "UPDATE {s}.fair_groups SET head_lb = 'infinity', ready_lb = 'infinity'"
            " WHERE group_id = 'g2'",
            "UPDATE {s}.fair_groups SET head_until = 'infinity' WHERE group_id = 'g3'",
            "UPDATE {s}.fair_groups SET plan = 'free', active = false WHERE group_id = 'g1'",
            "DELETE FROM {s}.fair_plans"):
        await run(aconn, queue, damage)
    broken = await queue.verify()
    assert {(v.group_id, v.invariant) for v in broken} == {
        ("g1", "served"), ("g2", "served"), ("g2", "head"), ("g2", "ready_lb"),
        ("g3", "head"), ("g1", "plan"), ("g1", "active"), ("g1", "fair_plans"),
        ("g2", "fair_plans"), ("g:g1 'p:pro'", "owner_served")}
    report = await queue.repair_bookkeeping()
    assert (report.found, report.groups) == (broken, 3)
    assert await queue.verify() == []
    assert await run(aconn, queue, "SELECT count(*) FROM {s}.fair_served") == [(0,)]
    await claim_equals_oracle(queue, database_url, "t", 4)
    # The rebuilt rows are what the writers and the upkeep keep from here on.
    for j in await queue.claim("t", 3):
        assert await queue.complete(j)
    await queue.upkeep.run_once()
    assert await queue.verify() == []
    await claim_equals_oracle(queue, database_url, "t", 4)


async def test_repair_makes_a_missing_edge_row_and_the_upkeep_moves_it(
        make_queue: Any, aconn: Any) -> None:
    """Bookkeeping restored from a backup older than the type's first completion: its
    done jobs are there, its fair_edge row is not. The upkeep never makes one
    (fair_advance: it would wait for a first completion's uncommitted insert while its
    fold holds group rows), so the repair does, at '-infinity' as a first completion
    would; the next upkeep round moves it past the done jobs, and the claim's edge
    correction stops reading them. Without the row, a type whose later jobs have no
    group (their completions lock no edge) kept it missing for good."""
    queue: Queue = await make_queue()
    await queue.upsert_group("g", plan="pro", owner_id="A")
    await queue.enqueue_many([{"type": "t", "payload": {"i": i}, "group_id": "g"}
                              for i in range(3)])
    for job in await queue.claim("t", 3):
        assert await queue.complete(job)  # the type's first completion makes its row
    await run(aconn, queue, "DELETE FROM {s}.fair_edge WHERE type = 't'")
    await queue.repair_bookkeeping()
    assert await run(aconn, queue, "SELECT edge::text FROM {s}.fair_edge") == [("-infinity",)]
    queue.clock_offset = timedelta(days=2)  # the done jobs before the window start
    await queue.enqueue("t", {"groupless": True})
    [job] = await queue.claim("t", 1)
    assert await queue.complete(job)
    await queue.upkeep.run_once()
    assert await run(aconn, queue, "SELECT e.edge > max(j.finished_at) FROM {s}.fair_edge e,"
                     " {s}.jobs j WHERE j.group_id = 'g' GROUP BY e.edge") == [(True,)]
    assert await queue.verify() == []


async def test_repair_on_a_live_queue_keeps_claims_exact(
        make_queue: Any, aconn: Any, database_url: str) -> None:
    """Three workers, each with its own queue (pool), claim, complete, fail and defer
    on their own connections while enqueuers add jobs and the rebuild runs again and
    again: every rebuild sees the bookkeeping exact (writers wait for its lock), and
    afterwards it is exact and the claim is the oracle's."""
    queue: Queue = await make_queue()
    for g in range(12):
        await queue.upsert_group(f"g{g}", plan=("free", "standard", "pro")[g % 3])
    await queue.enqueue_many([{"type": "t", "payload": {}, "group_id": f"g{i % 12}"}
                              for i in range(300)])
    workers = [await make_queue() for _ in range(3)]
    stop = asyncio.Event()
    counts = {"claimed": 0, "repairs": 0}

    async def work(q: Queue) -> None:
        n = 0
        while not stop.is_set():
            for j in await q.claim("t", 3):
                n += 1
                if n % 7 == 0:
                    await q.fail(j, "boom")
                elif n % 5 == 0:
                    await q.defer(j)
                else:
                    await q.complete(j)
                counts["claimed"] += 1
            await asyncio.sleep(0)

    async def enqueue() -> None:
        i = 0
        while not stop.is_set():
            await queue.enqueue("t", {}, group_id=f"g{i % 12}")
            i += 1
            await asyncio.sleep(0.005)

    async def repair() -> None:
        while counts["repairs"] < 5:
            report = await queue.repair_bookkeeping()
            assert report.found == []  # the writers kept it exact up to the lock
            counts["repairs"] += 1
            await asyncio.sleep(0.05)
        stop.set()

    await asyncio.wait_for(asyncio.gather(
        *(work(q) for q in workers), enqueue(), repair()), timeout=120)
    assert counts["repairs"] == 5 and counts["claimed"] > 0
    for q in workers:
        await q.run_upkeep()
    assert await queue.verify() == []
    await claim_equals_oracle(queue, database_url, "t", 10)


# -- the package's boundaries --------------------------------------------------------------


async def test_every_writer_of_fair_served_appends_rows_stamped_with_its_xid(
        queue: Queue, aconn: Any) -> None:
    """The delta rule: a claim, a completion, an insert of a running job, a deletion and
    an edge move each only insert rows of their own, stamped with their transaction's
    id (xid); no row is ever updated (each row's xmin is its writer's xid)."""
    await queue.upsert_group("g", plan="pro")
    await queue.enqueue("t", {}, group_id="g")
    await queue.enqueue("t", {}, group_id="g")
    await run(aconn, queue, "DELETE FROM {s}.fair_served")  # the test's own rows only
    writes = [
        "UPDATE {s}.jobs SET status = 'running', locked_at = now(), attempts = 1"
        " WHERE id = (SELECT min(id) FROM {s}.jobs)",  # a claim: +1
        "UPDATE {s}.jobs SET status = 'done', finished_at = now(), locked_at = NULL"
        " WHERE status = 'running'",  # a completion: nets to no row
        "INSERT INTO {s}.jobs (type, group_id, payload, status, max_attempts, run_after,"
        " created_at, locked_at, attempts) VALUES ('t', 'g', '{{}}', 'running', 3, now(),"
        " now(), now(), 1)",  # +1
        "DELETE FROM {s}.jobs WHERE status = 'running'",  # -1
        "SELECT {s}.fair_advance('t', now() + interval '1 hour')",  # the done job: -1
    ]
    xids = []
    for w in writes:
        async with aconn.transaction():
            await run(aconn, queue, w)
            xids.append((await run(aconn, queue, "SELECT pg_current_xact_id()"))[0][0])
    rows = await run(aconn, queue, "SELECT n, xid, xmin::text = (xid::text::numeric"
                     " % 4294967296)::text FROM {s}.fair_served ORDER BY xid")
    assert rows == [(1, xids[0], True), (1, xids[2], True), (-1, xids[3], True),
                    (-1, xids[4], True)]
    assert await queue.verify() == []


def test_only_the_fair_package_touches_the_bookkeeping_tables() -> None:
    """Outside src/rota/fair/ (and the migrations, which are history), no code or SQL
    statement names fair_groups, fair_served, fair_edge, fair_plans or a fair_ function
    (queue.py calls FairClaim's methods); comments may name them."""
    src = ROOT / "src" / "rota"
    name = re.compile(r"\bfair_(groups|served|edge|plans|fold|advance|fold_lock|fold_mark|"
                      r"count_served|note_pending|lock_edges|still_claimable|"
                      r"insert_groups|owners|owner_changes|costs|caps|cap_lock)\b")
    touching = [f"{p.relative_to(src)}: {line.strip()}" for p in sorted(src.rglob("*"))
                if p.suffix in (".py", ".sql") and "fair" not in p.relative_to(src).parts
                and p.parent.name != "migrations"
                for line in p.read_text("utf-8").splitlines()
                if name.search(line) and not line.lstrip().startswith(("--", "#"))]
    assert touching == []


def test_only_the_queue_and_rota_verify_import_the_fair_package() -> None:
    """fair/ is one room: inside the library only queue.py (FairClaim, ClaimUpkeep) and
    the CLI's verify command (its result types) import it, and it imports no module that
    imports it back."""
    src = ROOT / "src" / "rota"
    imports = re.compile(r"^\s*from (\.+fair|rota\.fair)\b.* import|^\s*import rota\.fair",
                         re.MULTILINE)
    entering = sorted(str(p.relative_to(src)) for p in src.rglob("*.py")
                      if "fair" not in p.relative_to(src).parts
                      and imports.search(p.read_text("utf-8")))
    assert entering == ["cli/verify.py", "queue.py"]
    back = re.compile(r"^\s*from \.\.(queue|cli|web|runner|worker)\b", re.MULTILINE)
    assert [p.name for p in (src / "fair").glob("*.py") if back.search(p.read_text())] == []


def test_each_claim_fragment_says_what_it_needs_and_defines() -> None:
    fair = ROOT / "src" / "rota" / "fair"
    for fragment in ("claim_pool_cached", "claim_pool_scan", "claim_head", "groupless_head",
                     "claim_pool_special", "claim_order_group",
                     "claim_order_owner", "claim_pool_owner", "claim_pool_owner_cached",
                     "claim_owner_walk_cached", "claim_owner_walk_scan", "claim_owner_rank",
                     "claim_probe_jobs", "special_group_row"):
        top = (fair / f"{fragment}.sql").read_text("utf-8").split("\n\n")[0]
        assert "-- Needs:" in top and "-- Defines:" in top, fragment


def test_comments_name_no_migration_numbers() -> None:
    """Outside the migrations themselves, no SQL comment names a migration by number."""
    src = ROOT / "src" / "rota"
    numbered = re.compile(r"--.*\b(migration \d{3}|\d{3}_\w+\.sql|^-- \d{3}:)")
    found = [f"{p.name}: {line.strip()}" for p in src.rglob("*.sql")
             if p.parent.name != "migrations"
             for line in p.read_text("utf-8").splitlines() if numbered.search(line)]
    assert found == []


def test_fresh_install_includes_the_bookkeeping_file() -> None:
    from rota import db
    text = db.schema_text()
    book = (ROOT / "src" / "rota" / "fair" / "bookkeeping.sql").read_text("utf-8")
    assert book.rstrip() in text and "@include" not in text
    core = (ROOT / "src" / "rota" / "schema.sql").read_text("utf-8")
    assert "fair_groups" not in core and core.count("-- @include fair/bookkeeping.sql") == 1


@pytest.mark.parametrize("damage", ["served"])
@pytest.mark.damages_bookkeeping
def test_the_fixture_used_after_concurrency_tests_fails_on_a_violation(
        migrated: str, database_url: str, damage: str) -> None:
    """fair_exact (tests/conftest.py) reads the same contract: damage it and the query
    the fixture runs names the group."""
    from rota.store import Statements
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("INSERT INTO {}.fair_served (type, group_id, n)"
                             " VALUES ('t', 'gx', 4)")
                     .format(sql.Identifier(migrated)))
        rows = conn.execute(Statements(migrated).sql("fair/verify")).fetchall()
    assert [Violation(*r) for r in rows] == [Violation("t", "gx", damage, "0", "4")]


async def test_a_truncate_of_the_groups_table_makes_every_copy_a_missing_groups(
        queue: Queue, aconn: Any, database_url: str) -> None:
    """TRUNCATE fires no row trigger: the copies of plan, active and owner stayed as they
    were, and the claim (its walk and its special groups) ranked the groups by them
    (rota verify named each). Now every group is as a missing one: no plan, active, no
    owner, by owner as by group."""
    await scenario(queue, aconn)
    await queue.upsert_group("g2", plan="free", owner_id="acme", active=False)
    assert await queue.verify() == []
    await run(aconn, queue, "TRUNCATE {s}.groups")
    assert await run(aconn, queue, "SELECT group_id, plan, active, owner_id"
                     " FROM {s}.fair_groups ORDER BY group_id") == [
        ("g1", None, True, None), ("g2", None, True, None), ("g3", None, True, None)]
    assert await queue.verify() == []
    await claim_equals_oracle(queue, database_url, "t", 4)
    await queue.upkeep.run_once()
    assert await queue.verify() == []
    by_owner = Queue(database_url, schema=queue.schema, fair_by="owner")
    await by_owner.open()
    try:
        await claim_equals_oracle(by_owner, database_url, "t", 4)
    finally:
        await by_owner.close()
