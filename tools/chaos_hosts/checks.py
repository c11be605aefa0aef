"""The multi-host run's own checks, on top of the chaos run's (:mod:`tools.chaos.checks`,
which already explains a reclaim, an overlap or a repeated effect by a cut link), and
its summary line.

- Fencing: every transition that ends a claim (complete, fail, defer, release) was made
  by the worker holding that claim, or by the stuck-jobs sweep; a cut-off worker's
  late transitions on jobs reclaimed meanwhile were all refused. The long cut must
  have reclaimed something, and its worker must have tried (and failed) to settle it
  once the link was back.
- The short cut reclaimed nothing, and work held through it was finished by its host.
- The slow link reclaimed nothing.
- The probe: connections with rota's default timeouts gave up within their bounds.
- Schedules: every tick owed fired exactly once (:mod:`tools.chaos_hosts.schedules`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..chaos.checks import Findings, Report, _rows
from ..chaos.workload import AnyConn
from . import schedules
from .harness import Fault, HostsOutcome


@dataclass(kw_only=True)
class HostsReport(Findings):
    """The multi-host run's findings, beside the single-host checks' (``chaos``)."""

    chaos: Report
    hosts: int = 0
    partitions: int = 0
    schedule_ticks: int = 0
    schedule_fired: int = 0

    def summary(self) -> str:
        c = self.chaos
        return (f"hosts={self.hosts} partitions={self.partitions} lost={c.lost} "
                f"duplicated={c.duplicated} hooks_missing={c.hooks_missing} "
                f"hooks_doubled={c.hooks_doubled} schedule_ticks={self.schedule_ticks} "
                f"schedule_fired={self.schedule_fired}")

    @property
    def ok(self) -> bool:
        return (self.chaos.ok and not self.violations
                and self.schedule_fired == self.schedule_ticks)


async def check_hosts(conn: AnyConn, schema: str, chaos: Report, out: HostsOutcome,
                      hosts: int) -> HostsReport:
    r = HostsReport(chaos=chaos, hosts=hosts)
    # Only readable columns: the chaos run's poison rows hold a created_at in year 10193.
    jobs = {j["id"]: j for j in await _rows(
        conn, schema, "SELECT id, status, last_error FROM {schema}.jobs")}
    log = await _rows(conn, schema, "SELECT * FROM {schema}.chaos_log ORDER BY id")
    handler_of = {h["claim_token"]: h for h in await _rows(
        conn, schema, "SELECT * FROM {schema}.chaos_handler_runs")}
    runs = await _rows(conn, schema, """
        SELECT r.*, o.app FROM {schema}.runs r
        LEFT JOIN {schema}.chaos_run_owner o ON o.run_id = r.id""")
    claims = [x for x in log if x["new_token"] is not None and x["new_token"] != x["old_token"]]
    claim_of = {x["new_token"]: x for x in claims}
    # A claim ends when its job leaves `running` (its token stays on the row).
    settles = [x for x in log if x["old_status"] == "running"
               and x["new_status"] != "running" and x["old_token"] is not None]
    settle_of = {x["old_token"]: x for x in settles}
    reclaims = [x for x in claims if x["old_status"] == "running"]

    # Fencing: a claim is ended only by its holder (or the stuck sweep).
    foreign = 0
    for x in settles:
        holder = claim_of.get(x["old_token"])
        if holder is None or holder["app"] == x["app"]:
            continue
        job = jobs[x["job_id"]]
        if x["new_status"] == "failed" and str(job["last_error"]).startswith("stuck:"):
            continue
        foreign += 1
        r.violations.append(f"job {x['job_id']}: the claim of {holder['app']} was ended "
                            f"({x['new_status']}) by {x['app']}")
    r.figures["claims_ended_by_another_worker"] = foreign

    def app(worker: str) -> str:
        return f"chaos-{worker}"

    def held_at(f: Fault) -> list[dict[str, Any]]:
        """Claims of the fault's workers open when it began."""
        apps = {app(w) for w in f.workers}
        return [c for c in claims if c["app"] in apps and c["at"] <= f.start
                and (c["new_token"] not in settle_of
                     or settle_of[c["new_token"]]["at"] >= f.start)
                and not any(x["old_token"] == c["new_token"] and x["at"] < f.start
                            for x in reclaims)]

    def reclaimed_from(f: Fault, slack: timedelta) -> list[dict[str, Any]]:
        apps = {app(w) for w in f.workers}
        return [x for x in reclaims
                if f.start <= x["at"] <= f.end + slack
                and (c := claim_of.get(x["old_token"])) is not None and c["app"] in apps]

    r.partitions = sum(1 for f in out.faults if f.kind.endswith("_cut"))
    for f in out.faults:
        span = round((f.end - f.start).total_seconds(), 1)
        if f.kind == "long_cut":
            slack = f.end - f.start + timedelta(seconds=1)
            taken = reclaimed_from(f, slack)
            attempts: Counter[str] = Counter()
            for x in taken:
                h = handler_of.get(x["old_token"])
                outcome = h["outcome"] if h is not None else None
                # A handler that never started was in a batch the run hands back.
                attempts[{"done": "complete", "lost": "complete", "error": "fail",
                          "deferred": "defer"}.get(str(outcome), "release")] += 1
            apps = {app(w) for w in f.workers}
            lost_said = sum(int((x["summary"] or {}).get("lost", 0)) for x in runs
                            if x["app"] in apps)
            r.figures["long_cut"] = (f"{f.host} for {span}s: {len(held_at(f))} claims held, "
                                     f"{len(taken)} reclaimed by other hosts; late "
                                     f"transitions fenced: {dict(attempts)}; runs there "
                                     f"reported {lost_said} lost")
            if not taken:
                r.violations.append(f"the long cut of {f.host} reclaimed nothing: no job "
                                    f"of its was reclaimed by another host")
            elif not attempts:
                r.violations.append(f"the long cut of {f.host}: its workers never tried to "
                                    f"settle the {len(taken)} jobs taken from them")
        elif f.kind == "short_cut":
            slack = f.end - f.start + timedelta(seconds=1)
            taken = reclaimed_from(f, slack)
            held = held_at(f)
            finished = [c for c in held if c["new_token"] in settle_of
                        and settle_of[c["new_token"]]["app"] == c["app"]]
            r.figures["short_cut"] = (f"{f.host} for {span}s: {len(held)} claims held, "
                                      f"{len(finished)} settled by their holder after, "
                                      f"{len(taken)} reclaimed")
            for x in taken:
                r.violations.append(f"job {x['job_id']} was reclaimed during the short cut "
                                    f"of {f.host}")
            if not held:
                r.violations.append(f"the short cut of {f.host} found it idle")
            elif len(finished) < len(held):
                r.violations.append(f"short cut of {f.host}: {len(held) - len(finished)} "
                                    f"held claims were not finished by their holder")
        elif f.kind == "slow":
            taken = reclaimed_from(f, timedelta(seconds=2))
            apps = {app(w) for w in f.workers}
            during = [x for x in log if x["app"] in apps and f.start <= x["at"] <= f.end]
            claimed = sum(1 for x in during if x["new_token"] is not None)
            done = sum(1 for x in during if x["new_status"] == "done")
            r.figures["slow"] = (f"{f.host} for {span}s ({f.how}): {len(held_at(f))} claims "
                                 f"held at the start, {claimed} claimed and {done} completed "
                                 f"there meanwhile, {len(taken)} reclaimed")
            if not during:
                r.violations.append(f"the slow {f.host} did nothing during the slow spell")
            for x in taken:
                r.violations.append(f"job {x['job_id']} was reclaimed from the slow {f.host}")
        elif f.kind == "kill":
            r.figures["kill"] = f"{f.workers[0]} on {f.host}"
        elif f.kind == "restart":
            # When each worker alive across the restart started its next run.
            resumed: dict[str, Any] = {}
            for x in runs:
                w = str(x["app"]).removeprefix("chaos-")
                if w in out.host_of and x["started_at"] >= f.end and (
                        w not in resumed or x["started_at"] < resumed[w]):
                    resumed[w] = x["started_at"]
            waits = sorted(((t - f.end).total_seconds(), w) for w, t in resumed.items())
            slowest = (f"; each worker's first run after it started {waits[0][0]:.1f}-"
                       f"{waits[-1][0]:.1f}s later ({waits[-1][1]} last)" if waits else "")
            r.figures["restart"] = f"{f.how}, {span}s{slowest}"
    for kind in ("long_cut", "short_cut", "slow", "kill", "restart"):
        if not any(f.kind == kind for f in out.faults):
            r.violations.append(f"the {kind.replace('_', ' ')} never happened")

    if out.probe is not None:
        r.figures["give_up_over_a_cut_link"] = out.probe.line()
        r.violations += out.probe.violations

    r.schedule_ticks, r.schedule_fired, schedule_violations = await schedules.count(
        conn, schema)
    r.violations += schedule_violations
    r.figures["schedule"] = (f"{schedules.NAME} ({schedules.CRON}): {r.schedule_ticks} "
                             f"ticks owed, {r.schedule_fired} fired exactly once")
    return r


def print_hosts_report(r: HostsReport) -> None:
    for key, value in r.figures.items():
        print(f"  {key}: {value}")
    for v in r.violations[:50]:
        print(f"  VIOLATION: {v}")
