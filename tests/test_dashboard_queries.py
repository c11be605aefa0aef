"""The dashboard's reads (rota.web.queries over sql/dashboard_*.sql), each with exact
expected values on small data sets whose times are set in SQL."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from psycopg import sql

from rota import Allowance, Pipeline, Plan, Plans, Queue, Quota, Stage
from rota.web import queries
from tests.cli_app import TEST_PLANS

YT = Quota("youtube", 10_000, reserve=1_000, reset_tz="America/Los_Angeles")
LLM = Quota("llm", 500, reserve=50, reset_tz="UTC")
SEARCHES = Allowance("searches", "searches_per_day", reset_tz="Europe/Paris")


async def run(queue: Queue, statement: str, params: dict[str, Any] | None = None) -> None:
    async with queue.connection() as c:
        await c.execute(sql.SQL(statement).format(jobs=queue.table("jobs"),
                                                  runs=queue.table("runs")), params or {})


async def groups(queue: Queue) -> None:
    for gid, plan, active in (("p1", "pro", True), ("p2", "pro", True),
                              ("s1", "standard", True), ("f1", "free", True),
                              ("z1", "free", False)):
        await queue.upsert_group(gid, plan=plan, active=active)


async def test_status_counts_per_type(queue: Queue) -> None:
    await groups(queue)
    later = await queue.now() + timedelta(hours=2)
    await queue.enqueue_many([
        *({"type": "a", "payload": {}, "group_id": g} for g in ("p1", "p1", "s1", "f1")),
        {"type": "a", "payload": {}, "group_id": "p2", "run_after": later},
        *({"type": "a", "payload": {}, "group_id": "z1"} for _ in range(3)),
        *({"type": "b", "payload": {}, "group_id": "s1"} for _ in range(4)),
        {"type": "c", "payload": {}, "max_attempts": 1},
    ])
    jobs = await queue.claim("b", 3)
    await queue.complete(jobs[0])
    await queue.complete(jobs[1])
    [c] = await queue.claim("c", 1)
    await queue.fail(c, "boom")
    # The oldest due job of an active group of type a has been due 10 minutes (it was
    # created 20 minutes ago); the paused group's are older and do not count; a done
    # job of b finished 2 hours ago is outside the last hour.
    await run(queue, "UPDATE {jobs} SET created_at = now() - interval '20 minutes', "
                     "run_after = now() - interval '10 minutes' "
                     "WHERE id = (SELECT min(id) FROM {jobs} WHERE group_id = 'p1')")
    await run(queue, "UPDATE {jobs} SET created_at = now() - interval '1 day', "
                     "run_after = now() - interval '1 day' WHERE group_id = 'z1'")
    await run(queue, "UPDATE {jobs} SET finished_at = now() - interval '2 hours' "
                     "WHERE id = %(id)s", {"id": jobs[1].id})
    async with queue.connection() as conn:
        types = await queries.job_types(queue, conn)
        counts = {c.type: c for c in await queries.status_counts(queue, conn, types,
                                                                 cap=None)}
        capped = {c.type: c for c in await queries.status_counts(queue, conn, types, cap=3)}
        waiting = await queries.oldest_due(queue, conn, types)
    assert types == ["a", "b", "c"]
    a, b, cc = counts["a"], counts["b"], counts["c"]
    assert (a.due, a.later, a.paused, a.running, a.failed, a.done_last_hour, a.pending,
            a.capped) == (4, 1, 3, 0, 0, 0, 8, False)
    assert (b.due, b.later, b.paused, b.running, b.failed, b.done_last_hour) == (
        1, 0, 0, 1, 0, 1)
    assert (cc.due, cc.running, cc.failed) == (0, 0, 1)
    # Capped at 3 pending jobs read per type: "at least" counts.
    assert (capped["a"].pending, capped["a"].capped) == (3, True)
    assert (capped["b"].pending, capped["b"].capped) == (1, False)
    oldest = waiting.by_type["a"]
    assert oldest is not None and 600 <= oldest < 660 and waiting.exact["a"]
    assert (waiting.by_type["c"], waiting.exact["c"]) == (None, True)
    assert waiting.by_type["b"] is not None and waiting.by_type["b"] < 60


async def test_status_counts_read_an_application_groups_view(make_queue: Any,
                                                             schema: str) -> None:
    base: Queue = await make_queue()
    await run(base, "CREATE TABLE {schema}.tenants (id text, plan text, on_hold boolean)"
              .replace("{schema}", f'"{schema}"'))
    await run(base, f'INSERT INTO "{schema}".tenants VALUES (\'t1\', \'pro\', false), '
                    f'(\'t2\', \'free\', true)')
    await run(base, f'CREATE VIEW "{schema}".tenant_groups AS SELECT id AS group_id, '
                    f'NULL::text AS owner_id, plan, NOT on_hold AS active FROM '
                    f'"{schema}".tenants')
    queue: Queue = await make_queue(groups=f"{schema}.tenant_groups")
    await queue.enqueue_many([{"type": "a", "payload": {}, "group_id": g}
                              for g in ("t1", "t1", "t2")])
    async with queue.connection() as conn:
        [counts] = await queries.status_counts(queue, conn, ["a"], cap=None)
        paused, total = await queries.groups_paused(queue, conn, ["a"])
    assert (counts.due, counts.paused) == (2, 1)
    assert (paused, total) == ([{"group_id": "t2", "plan": "free", "total": 1,
                                 "pending": 1}], 1)


async def test_throughput_per_minute_and_the_failed_cap(queue: Queue,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    await queue.enqueue_many([{"type": t, "payload": {}, "max_attempts": 1}
                              for t in ("a",) * 6 + ("b",) * 4])
    for t, n in (("a", 6), ("b", 4)):
        for j in await queue.claim(t, n):
            if t == "a" or j.id % 2:
                await queue.complete(j)
            else:
                await queue.fail(j, "boom")
    # Done a: 90 s ago (minute 1) x3, 30 minutes ago x2, 2 hours ago x1; failed b: 5
    # minutes ago; done b: minute 0.
    await run(queue, """
        UPDATE {jobs} j SET finished_at = now() - t.ago
        FROM (SELECT id, CASE WHEN rn <= 3 THEN interval '90 seconds'
                              WHEN rn <= 5 THEN interval '30 minutes 10 seconds'
                              ELSE interval '2 hours' END AS ago
              FROM (SELECT id, row_number() OVER (ORDER BY id) rn FROM {jobs}
                    WHERE type = 'a') x) t
        WHERE j.id = t.id""")
    await run(queue, "UPDATE {jobs} SET finished_at = now() - interval '5 minutes 5 seconds' "
                     "WHERE status = 'failed'")
    await run(queue, "UPDATE {jobs} SET finished_at = now() - interval '10 seconds' "
                     "WHERE status = 'done' AND type = 'b'")
    async with queue.connection() as conn:
        got = await queries.throughput(queue, conn, ["a", "b"])
        monkeypatch.setattr(queries, "FAILED_PER_TYPE", 2)
        capped = await queries.throughput(queue, conn, ["a", "b"])
    expected_done = [0] * 60
    expected_done[59] = 2     # b, the last minute
    expected_done[58] = 3     # a, 90 s ago
    expected_done[29] = 2     # a, 30 minutes ago
    expected_failed = [0] * 60
    expected_failed[54] = 2   # b, 5 minutes ago
    assert (got.done, got.failed, got.failed_capped) == (expected_done, expected_failed,
                                                          False)
    assert capped.failed_capped is True and capped.failed == expected_failed


async def test_waits_per_plan_and_the_served_groups(queue: Queue) -> None:
    await groups(queue)
    # Done in the last hour: pro waits 10, 20, 30 s; standard 60 s; no group 5 s;
    # one pro job done 2 hours ago (outside the hour). p2's job was charged 5.5 units
    # (docs/design.md, "Cost"), the others 1: groups are listed by cost charged.
    await run(queue, """
        INSERT INTO {jobs} (type, group_id, payload, status, max_attempts, run_after,
                            created_at, finished_at, cost)
        SELECT 'a', w.g, '{{}}', 'done', 3, now() - interval '1 minute' - w.s * interval '1 s',
               now() - interval '2 minutes', now() - interval '1 minute' - w.ago, w.cost
        FROM (VALUES ('p1', 10, interval '0', 1), ('p1', 20, interval '0', 1),
                     ('p2', 30, interval '0', 5.5), ('s1', 60, interval '0', 1),
                     (NULL, 5, interval '0', 1), ('p1', 99, interval '2 hours', 1))
             AS w(g, s, ago, cost)
        """)
    async with queue.connection() as conn:
        waits = await queries.plan_waits(queue, conn, ["a"])
        served = await queries.groups_served(queue, conn, ["a"])
    assert [(w.plan, w.jobs) for w in waits] == [("pro", 3), ("standard", 1), (None, 1)]
    pro = waits[0]
    assert (pro.p50, pro.longest) == pytest.approx((20.0, 30.0), abs=1e-3)
    assert pro.p95 == pytest.approx(29.0, abs=1e-3)
    assert served == [{"group_id": "p2", "plan": "pro", "done": 1, "charged": Decimal("5.5")},
                      {"group_id": "p1", "plan": "pro", "done": 2, "charged": 2},
                      {"group_id": "s1", "plan": "standard", "done": 1, "charged": 1}]


async def test_longest_waiting_groups_skip_paused_ones(queue: Queue,
                                                       monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    await groups(queue)
    await queue.enqueue_many([
        *({"type": "a", "payload": {}, "group_id": g} for g in ("p1", "p1", "s1", "f1", "z1")),
        {"type": "b", "payload": {}, "group_id": "p2"}, {"type": "b", "payload": {}}])
    for gid, ago in (("s1", "3 hours"), ("p1", "1 hour"), ("f1", "2 hours"),
                     ("z1", "9 hours"), ("p2", "80 minutes")):
        await run(queue, "UPDATE {jobs} SET created_at = now() - %(ago)s::interval, "
                         "run_after = now() - %(ago)s::interval WHERE group_id = %(g)s",
                  {"ago": ago, "g": gid})
    # A job created 5 hours ago but due only 4 hours ago has waited 4 hours; the
    # groupless job of b has waited 6 hours (it counts for b, and is no group).
    await run(queue, "UPDATE {jobs} SET created_at = now() - interval '5 hours', "
                     "run_after = now() - interval '4 hours' "
                     "WHERE id = (SELECT max(id) FROM {jobs} WHERE group_id = 'p1')")
    await run(queue, "UPDATE {jobs} SET created_at = now() - interval '6 hours', "
                     "run_after = now() - interval '6 hours' WHERE group_id IS NULL")
    async with queue.connection() as conn:
        waiting = await queries.oldest_due(queue, conn, ["a", "b"])
        top = await queries.oldest_due(queue, conn, ["a", "b"], groups=2)
        # Probing one group per type at first: the search widens until exact.
        monkeypatch.setattr(queries, "OLDEST_DUE_PROBES", (1, 512))
        widened = await queries.oldest_due(queue, conn, ["a", "b"])
        # Never widened: what it cannot prove, it says so.
        monkeypatch.setattr(queries, "OLDEST_DUE_PROBES", (1,))
        partial = await queries.oldest_due(queue, conn, ["a", "b"])
    hours = [(g["group_id"], g["plan"], round(g["waited_seconds"] / 3600))
             for g in waiting.groups]
    assert hours == [("p1", "pro", 4), ("s1", "standard", 3), ("f1", "free", 2),
                     ("p2", "pro", 1)]
    assert waiting.groups_exact and all(waiting.exact.values())
    assert {t: round(v / 3600) for t, v in waiting.by_type.items() if v} == {"a": 4, "b": 6}
    assert [g["group_id"] for g in top.groups] == ["p1", "s1"] and top.groups_exact
    assert ([(g["group_id"], g["due_since"]) for g in widened.groups]
            == [(g["group_id"], g["due_since"]) for g in waiting.groups])
    assert widened.groups_exact
    # One group per type is enough to prove each type's oldest (the next group's bound
    # is later), not the top 10 groups.
    assert partial.exact == {"a": True, "b": True} and not partial.groups_exact
    assert [g["group_id"] for g in partial.groups] == ["p1", "p2"]


async def test_jobs_pages_are_keyset_and_bounded(queue: Queue) -> None:
    await groups(queue)
    await queue.enqueue_many([{"type": "a" if i % 3 else "b", "payload": {"i": i},
                               "group_id": "p1" if i < 10 else "s1"} for i in range(40)])
    async with queue.connection() as conn:
        first = await queries.jobs_page(queue, conn, job_type=None, status=None,
                                        group_id=None, job_id=None, before=None, limit=15)
        ids = [j["id"] for j in first.jobs]
        high = ids[0]
        assert len(ids) == 15 and ids == sorted(ids, reverse=True)
        assert first.next_before == ids[-1] and first.jobs[0]["plan"] == "standard"
        # p1's jobs are the 10 oldest: a scan of 12 ids from the top finds none, and
        # says where to go on.
        bounded = await queries.jobs_page(queue, conn, job_type=None, status=None,
                                          group_id="p1", job_id=None, before=None,
                                          limit=15, scan=12)
        assert bounded.jobs == [] and bounded.next_before == high + 1 - 12
        found: list[int] = []
        before: int | None = None
        while True:
            page = await queries.jobs_page(queue, conn, job_type="b", status="pending",
                                           group_id="p1", job_id=None, before=before,
                                           limit=2, scan=7)
            found += [j["id"] for j in page.jobs]
            if page.next_before is None:
                break
            before = page.next_before
        one = await queries.jobs_page(queue, conn, job_type=None, status=None,
                                      group_id=None, job_id=high - 3, before=None, limit=15)
    assert len(found) == 4 and found == sorted(found, reverse=True)  # i = 0, 3, 6, 9
    assert [j["id"] for j in one.jobs] == [high - 3] and one.next_before is None


async def test_runs_page_keyset(queue: Queue) -> None:
    await run(queue, """
        INSERT INTO {runs} (id, trigger, stop_reason, started_at, finished_at)
        SELECT gen_random_uuid(), 'cron', 'no_work', now() - (i / 2) * interval '1 minute',
               now() - (i / 2) * interval '1 minute' + interval '3 seconds'
        FROM generate_series(0, 8) i""")  # pairs of runs that started at the same time
    async with queue.connection() as conn:
        seen = []
        before = None
        while True:
            rows = await queries.runs_page(queue, conn, before=before, limit=4)
            seen += rows
            if len(rows) < 4:
                break
            before = (rows[-1]["started_at"], rows[-1]["id"])
    keys = [(r["started_at"], r["id"]) for r in seen]
    assert len(keys) == len(set(keys)) == 9 and keys == sorted(keys, reverse=True)
    assert all(r["seconds"] == pytest.approx(3.0) for r in seen)


async def test_quotas_today_in_their_own_time_zones(make_queue: Any) -> None:
    queue: Queue = await make_queue(plans=TEST_PLANS)  # plans with searches_per_day
    await queue.upsert_group("p1", plan="pro", owner_id="owner-1")
    await queue.upsert_group("p2", plan="pro", owner_id="owner-2")
    await YT.spend(queue, 1_200)
    await YT.spend(queue, 300)
    await SEARCHES.spend(queue, "p1", 3)
    await SEARCHES.spend(queue, "p2", 5)
    now = await queue.now()
    async with queue.connection() as conn:
        shared, owners = await queries.quotas_today(queue, conn, [YT, LLM, SEARCHES])
        unknown, _ = await queries.quotas_today(queue, conn, [])
    assert [(q.name, q.used, q.limit, q.reserve, q.remaining) for q in shared] == [
        ("youtube", 1_500, 10_000, 1_000, 8_500), ("llm", 0, 500, 50, 500)]
    assert shared[0].resets_at == YT.next_reset(now) and shared[0].reset_tz == YT.reset_tz
    assert [(a.name, a.owners, a.used, a.most) for a in owners] == [("searches", 2, 8, 5)]
    assert [(q.name, q.used, q.limit) for q in unknown] == [("youtube", 1_500, None)]


def test_quotas_are_found_on_a_pipeline(queue: Queue) -> None:
    async def noop(ctx: Any) -> None:
        pass

    pipeline = Pipeline(queue, [Stage("a", 1, 1, noop, quota=YT),
                                Stage("b", 1, 1, noop, quota=YT)], quotas=[LLM, SEARCHES])
    assert queries.discover_quotas(pipeline) == [YT, LLM, SEARCHES]
    assert queries.discover_quotas(None) == []


async def test_owners_served_with_their_share_against_their_weight(make_queue: Any) -> None:
    """Owners sum their groups' jobs done in the last hour and the cost charged to them
    (docs/design.md, "Cost"); a group without an owner is its own; the share per weight
    compares charged / weight with the owners' mean; each owner's running jobs (a fresh
    lock) against its plan's cap (docs/design.md, "Caps")."""
    plans = Plans([Plan("free", "Free", 0, max_running=2), Plan("pro", "Pro", 1, weight=4)])
    queue: Queue = await make_queue(plans=plans, fair_by="owner")
    for gid, plan, owner in (("a1", "pro", "A"), ("a2", "pro", "A"), ("b1", "free", "B"),
                             ("solo", "free", None)):
        await queue.upsert_group(gid, plan=plan, owner_id=owner)
    # Done in the last hour: A 8 (a1 5, a2 3), B 2, solo 2 charged 0.5 each; one of
    # B's 2 hours ago.
    await run(queue, """
        INSERT INTO {jobs} (type, group_id, payload, status, max_attempts, run_after,
                            created_at, finished_at, cost)
        SELECT 'a', w.g, '{{}}', 'done', 3, now() - interval '1 hour',
               now() - interval '1 hour', now() - w.ago,
               CASE WHEN w.g = 'solo' THEN 0.5 ELSE 1 END
        FROM (VALUES ('a1', interval '1 minute'), ('a1', interval '1 minute'),
                     ('a1', interval '1 minute'), ('a1', interval '1 minute'),
                     ('a1', interval '1 minute'), ('a2', interval '1 minute'),
                     ('a2', interval '1 minute'), ('a2', interval '1 minute'),
                     ('b1', interval '1 minute'), ('b1', interval '1 minute'),
                     ('b1', interval '2 hours'), ('solo', interval '1 minute'),
                     ('solo', interval '1 minute')) AS w(g, ago)
        """)
    await queue.upsert_group("c1", plan="free", owner_id="C")  # starved: nothing done
    # B has a job running; solo's running job's lock is an hour old (stale: no slot).
    await run(queue, """
        INSERT INTO {jobs} (type, group_id, payload, status, max_attempts, run_after,
                            created_at, locked_at, attempts, claim_token)
        SELECT 'a', w.g, '{{}}', 'running', 3, now(), now(), now() - w.ago, 1,
               gen_random_uuid()
        FROM (VALUES ('b1', interval '0'), ('solo', interval '1 hour')) AS w(g, ago)
        """)
    waiting = [{"group_id": "c1", "waited_seconds": 90.0},
               {"group_id": "a2", "waited_seconds": 12.5},
               {"group_id": "gone", "waited_seconds": 3.0}]  # not in the groups table
    async with queue.connection() as conn:
        owners = await queries.owners_served(queue, conn, ["a"], waiting=waiting)
    # charged / weight: A 8/4 = 2, B 2, solo 1; their mean 5/3: A and B 1.2, solo 0.6.
    assert owners == [
        {"owner_id": "A", "own": False, "plan": "pro", "groups": 2, "done": 8,
         "charged": 8.0, "weight": 4, "share": 8 / 11, "per_weight": pytest.approx(1.2),
         "waited": 12.5, "running": 0, "cap": None},
        {"owner_id": "B", "own": False, "plan": "free", "groups": 1, "done": 2,
         "charged": 2.0, "weight": 1, "share": 2 / 11, "per_weight": pytest.approx(1.2),
         "waited": None, "running": 1, "cap": 2},
        {"owner_id": "solo", "own": True, "plan": "free", "groups": 1, "done": 2,
         "charged": 1.0, "weight": 1, "share": 1 / 11, "per_weight": pytest.approx(0.6),
         "waited": None, "running": 0, "cap": 2},
        {"owner_id": "C", "own": False, "plan": "free", "groups": 0, "done": 0,
         "charged": 0.0, "weight": 1, "share": 0.0, "per_weight": 0.0, "waited": 90.0,
         "running": 0, "cap": 2},
        {"owner_id": "gone", "own": True, "plan": None, "groups": 0, "done": 0,
         "charged": 0.0, "weight": 1, "share": 0.0, "per_weight": 0.0, "waited": 3.0,
         "running": 0, "cap": None},
    ]
