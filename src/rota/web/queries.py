"""What the dashboard and the metrics read, one function per page section, each running
the named statements in ``rota/sql/dashboard_*.sql`` on the queue's clock.

Every read is bounded by an index (the statements say which and what it costs): the
dashboard is opened on production queues of millions of jobs, refreshing every few
seconds. The statements take the job types present as a parameter, found by
:func:`job_types` with a loose index scan, so each can walk its partial index type by
type.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..queue import AnyConn, Queue
from ..quota import Allowance, Quota

#: Statuses a job can have, in the order pages show them.
STATUSES = ("pending", "running", "done", "failed")

#: The newest failed jobs of each type read for the last hour's failures (there is no
#: index on their finished_at; see dashboard_throughput.sql).
FAILED_PER_TYPE = 500
#: Jobs of each type read, the last done first, for the waits per plan.
WAITS_PER_TYPE = 500
#: Ids one page of `/jobs` reads at most (a bounded backwards range of the primary key).
JOBS_SCAN_IDS = 20_000
#: Pending jobs of each type a page counts at most (the metrics count them all).
PENDING_CAP = 10_000
#: Groups per type probed for the oldest due jobs: first the fewest, then more when the
#: answer is not proven exact (rota/fair/oldest_due.sql).
OLDEST_DUE_PROBES = (32, 128)


async def _rows(queue: Queue, conn: AnyConn, name: str,
                params: dict[str, Any]) -> list[dict[str, Any]]:
    return await queue.store.fetch_dicts(name, {"offset": queue.clock_offset, **params},
                                         conn=conn)


async def now(queue: Queue, conn: AnyConn) -> datetime:
    """The queue's clock (database ``now()`` plus its clock offset), on ``conn``."""
    return (await _rows(queue, conn, "db_now", {}))[0]["now"]  # type: ignore[no-any-return]


async def job_types(queue: Queue, conn: AnyConn) -> list[str]:
    """The job types that have jobs, in order."""
    return [r["type"] for r in await _rows(queue, conn, "dashboard_types", {})]


async def published_types(queue: Queue, conn: AnyConn) -> frozenset[str] | None:
    """The job types published for the SQL entry points (``rota migrate --app``: the
    app's stage types and its queue's declared ones), or ``None``: any type."""
    rows = await _rows(queue, conn, "dashboard_published_types", {})
    if not rows or rows[0]["types"] is None:
        return None
    return frozenset(rows[0]["types"])


@dataclass(frozen=True)
class TypeCounts:
    """One job type's jobs by status (``/`` and the rota_jobs gauges).

    Attributes:
        due: pending and due now, in active groups.
        later: pending, due later (backoff, deferral, quota reset), in active groups.
        paused: pending in paused groups.
        pending_read: pending jobs read; when it is the cap the page asked for
            (``capped``), the three counts above are lower bounds.
        running, failed: all of them.
        done_last_hour: done in the last hour (the done history is not counted whole).
    """

    type: str
    due: int
    later: int
    paused: int
    pending_read: int
    running: int
    failed: int
    done_last_hour: int
    capped: bool = False

    @property
    def pending(self) -> int:
        return self.due + self.later + self.paused


async def status_counts(queue: Queue, conn: AnyConn, types: Sequence[str], *,
                        cap: int | None) -> list[TypeCounts]:
    """Counts per type, reading at most ``cap`` pending jobs of each (None: all; pages
    pass :data:`PENDING_CAP`)."""
    rows = await _rows(queue, conn, "dashboard_status_counts",
                       {"types": list(types), "cap": cap})
    return [TypeCounts(**r, capped=cap is not None and r["pending_read"] >= cap)
            for r in rows]


@dataclass(frozen=True)
class Waiting:
    """How long due jobs have waited: the oldest per type, and the longest-waiting
    groups (group_id, plan, waited_seconds), from :func:`oldest_due`. Values that are
    not ``exact`` are lower bounds (the probe stopped at its largest size)."""

    by_type: dict[str, float | None]  # None: no due job
    exact: dict[str, bool]
    groups: list[dict[str, Any]]
    groups_exact: bool


async def oldest_due(queue: Queue, conn: AnyConn, types: Sequence[str], *,
                     groups: int = 10) -> Waiting:
    """The oldest due job's wait per type and the ``groups`` longest-waiting groups,
    probing the groups the claim's bookkeeping says could hold them, more of them
    until the answer is exact (see rota/fair/oldest_due.sql), at most
    ``OLDEST_DUE_PROBES[-1]`` per type."""
    by_type: dict[str, float | None] = {}
    exact: dict[str, bool] = {}
    top: list[dict[str, Any]] = []
    top_exact = True
    for k in OLDEST_DUE_PROBES:
        rows = await queue.oldest_due_probe(types, k, conn=conn)
        clock = rows[0]["now"] if rows else None
        next_bound = {r["type"]: r["next_bound"] for r in rows}
        best: dict[str, datetime] = {}
        per_group: dict[str, dict[str, Any]] = {}
        for r in rows:
            since = r["due_since"]
            if since is None:
                continue
            if r["type"] not in best or since < best[r["type"]]:
                best[r["type"]] = since
            gid = r["group_id"]
            if gid is not None and (gid not in per_group
                                    or since < per_group[gid]["due_since"]):
                per_group[gid] = {"group_id": gid, "plan": r["plan"], "due_since": since}
        for t in types:
            nb = next_bound.get(t)
            since = best.get(t)
            exact[t] = nb is None or (since is not None and since.timestamp() <= nb)
            by_type[t] = (None if since is None or clock is None
                          else (clock - since).total_seconds())
        ranked = sorted(per_group.values(), key=lambda g: (g["due_since"], g["group_id"]))
        top = [{**g, "waited_seconds": (clock - g["due_since"]).total_seconds()}
               for g in ranked[:groups]] if clock is not None else []
        bounds = [nb for nb in next_bound.values() if nb is not None]
        top_exact = groups == 0 or not bounds or (
            len(ranked) >= groups
            and ranked[groups - 1]["due_since"].timestamp() <= min(bounds))
        if top_exact and all(exact.values()):
            break
    return Waiting(by_type, exact, top, top_exact)


@dataclass(frozen=True)
class Throughput:
    """Jobs done and failed per minute over the last hour, oldest minute first (index
    59 is the last minute); ``failed_capped``: the failed counts may miss jobs (see
    dashboard_throughput.sql)."""

    done: list[int]
    failed: list[int]
    failed_capped: bool


async def throughput(queue: Queue, conn: AnyConn, types: Sequence[str]) -> Throughput:
    rows = await _rows(queue, conn, "dashboard_throughput", {
        "types": list(types), "failed_per_type": FAILED_PER_TYPE})
    done, failed = [0] * 60, [0] * 60
    for r in rows:
        if 0 <= r["minute"] < 60:
            done[59 - r["minute"]] = r["done"]
            failed[59 - r["minute"]] = r["failed"]
    return Throughput(done, failed, any(r["failed_capped"] for r in rows))


@dataclass(frozen=True)
class PlanWaits:
    """Waits from due to done of one plan's jobs done in the last hour, in seconds."""

    plan: str | None
    jobs: int
    p50: float
    p95: float
    longest: float


async def plan_waits(queue: Queue, conn: AnyConn, types: Sequence[str]) -> list[PlanWaits]:
    """Per plan, highest priority first (unknown plans, then no plan, last)."""
    rows = await _rows(queue, conn, "dashboard_waits", {
        "types": list(types), "per_type": WAITS_PER_TYPE})
    waits = [PlanWaits(**r) for r in rows]
    order = {p.id: -p.priority for p in queue.plans}
    return sorted(waits, key=lambda w: (w.plan is None, order.get(w.plan or "", 0),
                                        w.plan or ""))


async def groups_served(queue: Queue, conn: AnyConn, types: Sequence[str],
                        limit: int = 10) -> list[dict[str, Any]]:
    """The groups charged most for the jobs done in the last hour (docs/design.md,
    "Cost"): group_id, plan, done (jobs), charged (their cost, a ``Decimal``)."""
    return await _rows(queue, conn, "dashboard_groups_served",
                       {"types": list(types), "limit": limit})


async def owners_served(queue: Queue, conn: AnyConn, types: Sequence[str],
                        limit: int = 10, waiting: Sequence[dict[str, Any]] = ()
                        ) -> list[dict[str, Any]]:
    """The owners charged most for the jobs done in the last hour, and the owners of the
    longest-waiting groups (docs/design.md, "The fair claim"; a group without an owner
    is its own, ``own`` true).

    Args:
        waiting: the longest-waiting groups (:func:`oldest_due`'s ``groups``: dicts
            with ``group_id`` and ``waited_seconds``); their owners are listed too, with
            how long their longest-waiting group has waited, even with nothing done (a
            starved owner).

    Returns:
        Rows ``owner_id, own, plan, groups, done, charged, weight, share, per_weight,
        waited, running, cap``: ``done`` jobs, ``charged`` their cost (docs/design.md,
        "Cost"), ``running`` its jobs running now with a fresh lock (every type) and
        ``cap`` its plan's ``max_running`` (``None``: no cap; docs/design.md, "Caps"),
        ``share`` the owner's part of the cost charged to the owners listed (0..1),
        ``weight`` its plan's (:class:`rota.Plan`; the middle plan's without one, the
        lowest plan's for an unknown plan), ``per_weight`` its charged cost divided by
        its weight against the mean of the owners listed (1.0: exactly its weighted
        share among them), ``waited`` seconds (``None``: none of its groups is among
        ``waiting``). The most charged first, then the waiting ones.
    """
    rows = await _rows(queue, conn, "dashboard_owners_served",
                       {"types": list(types), "limit": limit})
    for r in rows:
        r["waited"] = None
    if waiting:
        owners = {o["group_id"]: o for o in await _rows(
            queue, conn, "dashboard_group_owners",
            {"ids": [w["group_id"] for w in waiting]})}
        for w in waiting:
            o = owners.get(w["group_id"], {})
            owner_id = o.get("owner_id") or w["group_id"]
            own = o.get("owner_id") is None
            row = next((r for r in rows if (r["owner_id"], r["own"]) == (owner_id, own)),
                       None)
            if row is None:
                row = {"owner_id": owner_id, "own": own, "plan": o.get("plan"),
                       "groups": 0, "done": 0, "charged": 0, "waited": None}
                rows.append(row)
            row["waited"] = max(row["waited"] or 0.0, w["waited_seconds"])
    plans = queue.plans
    running = {(r["owner_id"], r["own"], r["plan"]): r["running"] for r in await _rows(
        queue, conn, "dashboard_owners_running", {"stale_after": queue.stale_after})}
    for r in rows:
        plan = r["plan"]
        r["weight"] = (plans.middle.weight if plan is None else
                       plans[plan].weight if plan in plans else plans.lowest.weight)
        r["running"] = running.get((r["owner_id"], r["own"], plan), 0)
        r["cap"] = plans[plan].max_running if plan in plans else None
    for r in rows:
        r["charged"] = float(r["charged"] or 0)
    total = sum(r["charged"] for r in rows)
    served = [r for r in rows if r["charged"]]
    mean = sum(r["charged"] / r["weight"] for r in served) / len(served) if served else 0
    for r in rows:
        r["share"] = r["charged"] / total if total else 0.0
        r["per_weight"] = r["charged"] / r["weight"] / mean if mean else 0.0
    return rows


async def groups_paused(queue: Queue, conn: AnyConn, types: Sequence[str],
                        limit: int = 20) -> tuple[list[dict[str, Any]], int]:
    """Paused groups (group_id, plan, pending), the first ``limit`` by id, and how
    many are paused in all."""
    rows = await _rows(queue, conn, "dashboard_groups_paused",
                       {"types": list(types), "limit": limit})
    return rows, (rows[0]["total"] if rows else 0)


async def runs_page(queue: Queue, conn: AnyConn, *, before: tuple[datetime, uuid.UUID] | None,
                    limit: int) -> list[dict[str, Any]]:
    """Up to ``limit`` runs, newest first, started before ``before`` (started_at, id)."""
    return await _rows(queue, conn, "dashboard_runs", {
        "before_started": before[0] if before else None,
        "before_id": before[1] if before else None, "limit": limit})


@dataclass(frozen=True)
class JobsPage:
    """One page of ``/jobs``: the jobs found among ids in ``[low, before)``, newest
    first; ``next_before``: where the next page starts (None: no older jobs)."""

    jobs: list[dict[str, Any]]
    before: int
    low: int
    next_before: int | None


async def jobs_page(queue: Queue, conn: AnyConn, *, job_type: str | None,
                    status: str | None, group_id: str | None, job_id: int | None,
                    before: int | None, limit: int, run_id: uuid.UUID | None = None,
                    scan: int = JOBS_SCAN_IDS) -> JobsPage:
    """Jobs matching the filters (``run_id``: the run that claimed them last), newest
    first, reading at most ``scan`` ids."""
    ids = await _rows(queue, conn, "dashboard_id_range", {})
    high, lowest = ids[0]["high"], ids[0]["low"]
    if high is None:
        return JobsPage([], 1, 1, None)
    if job_id is not None:
        start, low = job_id + 1, job_id
    else:
        start = min(before, high + 1) if before is not None else high + 1
        low = max(start - scan, lowest)
    rows = await _rows(queue, conn, "dashboard_jobs", {
        "before": start, "low": low, "type": job_type, "status": status,
        "group_id": group_id, "run_id": run_id, "limit": limit})
    if job_id is not None:
        nxt = None
    elif len(rows) == limit:
        nxt = rows[-1]["id"]
    else:
        nxt = low if low > lowest else None
    return JobsPage(rows, start, low, nxt)


async def run(queue: Queue, conn: AnyConn, run_id: uuid.UUID) -> dict[str, Any] | None:
    """One run as ``/runs`` shows it, or ``None`` (no such run, or pruned)."""
    rows = await _rows(queue, conn, "dashboard_run", {"id": run_id})
    return rows[0] if rows else None


async def job(queue: Queue, conn: AnyConn, job_id: int) -> dict[str, Any] | None:
    rows = await _rows(queue, conn, "dashboard_job", {"id": job_id})
    return rows[0] if rows else None


@dataclass(frozen=True)
class QuotaToday:
    """A shared quota in its current period (``limit``, ``reserve`` None: a quota
    known only from its usage rows, its definition not given to the dashboard)."""

    name: str
    used: int
    limit: int | None
    reserve: int | None
    reset_tz: str | None
    period_start: datetime
    resets_at: datetime | None

    @property
    def remaining(self) -> int | None:
        return None if self.limit is None else max(self.limit - self.used, 0)


@dataclass(frozen=True)
class AllowanceToday:
    """A per-owner allowance in its current period: owners who spent some, units
    spent by all of them, the most one owner spent."""

    name: str
    limit_key: str
    reset_tz: str
    owners: int
    used: int
    most: int
    resets_at: datetime


async def quotas_today(queue: Queue, conn: AnyConn, quotas: Iterable[Quota | Allowance]
                       ) -> tuple[list[QuotaToday], list[AllowanceToday]]:
    """Today's usage of ``quotas`` (each in its own time zone's day); with no quotas
    given, the shared quotas that have recent usage rows, without their limits."""
    shared = [q for q in quotas if isinstance(q, Quota)]
    allowances = [q for q in quotas if isinstance(q, Allowance)]
    clock = await now(queue, conn)
    if not shared and not allowances:
        rows = await _rows(queue, conn, "dashboard_quota_names", {})
        return [QuotaToday(r["quota"], r["units"], None, None, None, r["period_start"],
                           None) for r in rows], []
    out: list[QuotaToday] = []
    if shared:
        starts = [q.period_start(clock) for q in shared]
        rows = await _rows(queue, conn, "dashboard_quota_usage", {
            "quotas": [q.name for q in shared], "period_starts": starts})
        used = {r["quota"]: int(r["used"]) for r in rows}
        out = [QuotaToday(q.name, used.get(q.name, 0), q.daily_units, q.reserve, q.reset_tz,
                          start, q.next_reset(clock)) for q, start in zip(shared, starts,
                                                                         strict=True)]
    per_owner: list[AllowanceToday] = []
    if allowances:
        rows = await _rows(queue, conn, "dashboard_allowance_usage", {
            "quotas": [a.name for a in allowances],
            "period_starts": [a.period_start(clock) for a in allowances]})
        by_name = {r["quota"]: r for r in rows}
        per_owner = [AllowanceToday(a.name, a.limit_key, a.reset_tz,
                                    int(by_name[a.name]["owners"]),
                                    int(by_name[a.name]["used"]),
                                    int(by_name[a.name]["most"]), a.next_reset(clock))
                     for a in allowances]
    return out, per_owner


async def finished_between(queue: Queue, conn: AnyConn, types: Sequence[str],
                           since: datetime, until: datetime) -> list[dict[str, Any]]:
    """Jobs finished in ``(since, until]`` per type, plan and status (done, failed):
    rows ``type, plan, status, n, cost`` (the cost charged to the done ones, a
    ``Decimal``; 0 for failed: docs/design.md, "Cost")."""
    return await _rows(queue, conn, "dashboard_metrics_finished", {
        "types": list(types), "since": since, "until": until,
        "failed_per_type": FAILED_PER_TYPE})


async def runs_by_stop_reason(queue: Queue, conn: AnyConn) -> dict[str, int]:
    """Finished runs in the runs table (pruned after 30 days by default), by stop
    reason."""
    rows = await _rows(queue, conn, "dashboard_metrics_runs", {})
    return {r["stop_reason"]: int(r["n"]) for r in rows}


@dataclass(frozen=True)
class Horizon:
    """How far the database's xmin horizon lags (horizon_age.sql): ``seconds`` since the
    oldest transaction of this database holding a snapshot or an xid began (0: none),
    and ``transactions``: how many transactions the horizon lags, replication slots and
    standbys' feedback included. Lower bounds for a role that cannot read other roles'
    sessions (docs/operations.md, "Long transactions")."""

    seconds: float
    transactions: int


async def horizon(queue: Queue, conn: AnyConn) -> Horizon:
    """The xmin horizon's age (see :class:`Horizon`)."""
    row = (await _rows(queue, conn, "horizon_age", {}))[0]
    return Horizon(float(row["seconds"]), int(row["transactions"]))


def discover_quotas(pipeline: Any) -> list[Quota | Allowance]:
    """The quotas and allowances of a :class:`rota.Pipeline`: its stages' quotas and
    those given to it as ``quotas=`` (an object without stages has none)."""
    found: dict[str, Quota | Allowance] = {}
    given = getattr(pipeline, "quotas", None)
    if given is None:  # the Pipeline keeps the ones it was given by name
        given = getattr(pipeline, "_quotas", {})
    values = given.values() if isinstance(given, dict) else given
    for stage in getattr(pipeline, "stages", ()):
        q = getattr(stage, "quota", None)
        if isinstance(q, Quota):
            found.setdefault(q.name, q)
    for q in values or ():
        if isinstance(q, Quota | Allowance):
            found.setdefault(q.name, q)
    return list(found.values())


__all__ = [
    "FAILED_PER_TYPE",
    "JOBS_SCAN_IDS",
    "OLDEST_DUE_PROBES",
    "PENDING_CAP",
    "STATUSES",
    "WAITS_PER_TYPE",
    "AllowanceToday",
    "JobsPage",
    "PlanWaits",
    "QuotaToday",
    "Throughput",
    "TypeCounts",
    "Waiting",
    "discover_quotas",
    "finished_between",
    "groups_paused",
    "groups_served",
    "job",
    "job_types",
    "jobs_page",
    "now",
    "oldest_due",
    "plan_waits",
    "quotas_today",
    "runs_by_stop_reason",
    "runs_page",
    "status_counts",
]
