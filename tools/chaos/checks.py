"""The chaos run's checks, read from the tables once the work is drained (see
:mod:`tools.chaos`), and the report they print."""

from __future__ import annotations

import itertools
import re
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from psycopg import sql
from psycopg.rows import dict_row

from rota.fair import Violation
from rota.store import Statements

from .profile import Profile
from .workload import STAGES, AnyConn


@dataclass
class Kill:
    """One SIGKILL: the worker, its pid, and a moment after its death (later than
    anything the worker did; its backend may still run a statement it had sent)."""

    worker: str
    pid: int
    at: datetime


@dataclass
class Cut:
    """A worker whose link to the database was cut from ``start`` to ``end`` (the
    multi-host run, :mod:`tools.chaos_hosts`): it lived on, unable to reach the server,
    and what it had sent landed when TCP retransmitted it, up to ``slack`` after the
    link came back. Its claims may go stale and be reclaimed meanwhile, its handler
    still running: fencing, not the checks, must make that harmless.

    ``kind="slow"``: the link was only slow and lossy. Nothing may be reclaimed from
    the worker then, but its runs may overrun the chaos run's compressed platform
    timeout, and a handler cut at its deadline may have been waiting for the reply to
    the COMMIT that completed its job."""

    worker: str
    start: datetime
    end: datetime
    slack: timedelta = timedelta(0)
    kind: str = "cut"

    def covers(self, at: datetime) -> bool:
        return self.start <= at <= self.end + self.slack

    def __str__(self) -> str:
        how = "cut" if self.kind == "cut" else "slowed"
        return f"{self.worker}'s link was {how} from {self.start:%T} to {self.end:%T}"


@dataclass
class Outcome:
    """Everything the checks need from the run, besides the database."""

    kills: list[Kill] = field(default_factory=list)
    cuts: list[Cut] = field(default_factory=list)
    restarts: list[tuple[datetime, datetime]] = field(default_factory=list)
    crashed: list[str] = field(default_factory=list)
    forced_stops: list[str] = field(default_factory=list)
    stopped_starting: list[str] = field(default_factory=list)
    runs_raised: int = 0
    seeded: int = 0
    poison: list[int] = field(default_factory=list)  # ids of the unreadable rows
    worker_phase_s: float = 0.0
    drain_rounds: int = 0



@dataclass(kw_only=True)
class Findings:
    """What a harness's checks found: figures for the summary line and violations (any
    makes the run fail). The single-host and the multi-host reports both are one."""

    figures: dict[str, Any] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class Report(Findings):
    """The single-host run's findings: its counts, and notes that explain them."""

    jobs: int = 0
    kills: int = 0
    restarts: int = 0
    lost: int = 0
    duplicated: int = 0
    hooks_missing: int = 0
    hooks_doubled: int = 0
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"jobs={self.jobs} kills={self.kills} restarts={self.restarts} "
                f"lost={self.lost} duplicated={self.duplicated} "
                f"hooks_missing={self.hooks_missing} hooks_doubled={self.hooks_doubled}")

    @property
    def ok(self) -> bool:
        return not self.violations and self.lost == 0 and self.hooks_missing == 0 \
            and self.hooks_doubled == 0


TIMED_OUT = re.compile(r"^timed out after (\d+(?:\.\d+)?) s$")
IGNORED_CUT = "timed out: the handler did not stop when cancelled"


async def _rows(conn: AnyConn, schema: str, query: str) -> list[dict[str, Any]]:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(sql.SQL(query).format(schema=sql.Identifier(schema)))
    return await cur.fetchall()


async def check(conn: AnyConn, schema: str, profile: Profile, out: Outcome) -> Report:
    """Check the run's invariants from the tables (see the module docstring)."""
    r = Report(kills=len(out.kills), restarts=len(out.restarts))
    # The poison rows' payloads and created_at cannot be loaded in Python: only the
    # columns the checks read, and a payload only when it is an object (every seed's).
    jobs = {j["id"]: j for j in await _rows(conn, schema, """
        SELECT id, type, status, attempts, deferrals, last_error, give_up_pending,
               CASE WHEN jsonb_typeof(payload) = 'object' THEN payload END AS payload
        FROM {schema}.jobs""")}
    log_rows = await _rows(conn, schema, "SELECT * FROM {schema}.chaos_log ORDER BY id")
    handler_runs = await _rows(conn, schema, "SELECT * FROM {schema}.chaos_handler_runs")
    effects = await _rows(conn, schema, "SELECT * FROM {schema}.chaos_effects")
    hooks = {h["job_id"]: h
             for h in await _rows(conn, schema, "SELECT * FROM {schema}.chaos_hooks")}
    runs = {x["id"]: x for x in await _rows(conn, schema, """
        SELECT r.*, o.app FROM {schema}.runs r
        LEFT JOIN {schema}.chaos_run_owner o ON o.run_id = r.id""")}
    r.jobs = len(jobs)
    status = Counter(j["status"] for j in jobs.values())
    r.figures["status"] = dict(status)
    killed_at: dict[str, datetime] = {f"chaos-{k.worker}": k.at for k in out.kills}
    kill_of = {k.worker: k for k in out.kills}
    # A run cut off by the restart was going when the server went down (or started
    # while the pools were reconnecting); it may record its end seconds later, once
    # psycopg_pool's reconnect backoff (1 s, 2 s, 4 s...) brings a connection back.
    restart_window = ((out.restarts[0][0], out.restarts[0][1]
                       + timedelta(seconds=profile.stale_after)) if out.restarts else None)

    def across_restart(run: dict[str, Any]) -> bool:
        return (restart_window is not None and run["started_at"] <= restart_window[1]
                and run["finished_at"] is not None and run["finished_at"] >= restart_window[0])

    cuts_of: dict[str, list[Cut]] = defaultdict(list)
    for cut in out.cuts:
        cuts_of[f"chaos-{cut.worker}"].append(cut)

    def cut_at(app: str | None, at: datetime, kinds: tuple[str, ...] = ("cut",)
               ) -> Cut | None:
        """The cut of ``app``'s link going on at ``at`` (or None)."""
        return next((c for c in cuts_of.get(str(app), [])
                     if c.kind in kinds and c.covers(at)), None)

    def across_cut(run: dict[str, Any]) -> bool:
        end = run["finished_at"] or run["started_at"]
        return any(c.start <= end and run["started_at"] <= c.end + c.slack
                   for c in cuts_of.get(str(run["app"]), []))

    # 1. Nothing lost: no job running; pending only with a due time; every done search
    #    has its two drafts (created in the search's own completing transaction).
    running = [j for j in jobs.values() if j["status"] == "running"]
    pending = [j for j in jobs.values() if j["status"] == "pending"]
    r.figures["pending_with_due_time"] = len(pending)
    for j in running:
        r.violations.append(f"job {j['id']} ({j['type']}) is still running after the drain")
    drafts_of: Counter[int] = Counter(
        int(j["payload"]["search"]) for j in jobs.values() if j["type"] == "draft")
    missing_drafts = 0
    for j in jobs.values():
        if j["type"] != "search":
            continue
        want = 2 if j["status"] == "done" else 0
        if drafts_of[j["id"]] != want:
            missing_drafts += abs(want - drafts_of[j["id"]])
            r.violations.append(f"search {j['id']} is {j['status']} with "
                                f"{drafts_of[j['id']]} draft jobs (expected {want})")
    r.lost = len(running) + missing_drafts
    done_searches = sum(1 for j in jobs.values()
                        if j["type"] == "search" and j["status"] == "done")
    workload_jobs = sum(1 for j in jobs.values() if j["type"] in STAGES)
    if workload_jobs != out.seeded + 2 * done_searches:
        r.violations.append(f"{workload_jobs} jobs, expected {out.seeded} seeded + 2 drafts "
                            f"for each of {done_searches} done searches")

    # 2. Attempts = claims - deferrals - releases (a job handed back unstarted gets its
    #    attempt back, docs/design.md "Defer"), from the trigger's log of every claim.
    claims: dict[int, list[dict[str, Any]]] = defaultdict(list)
    deferrals: Counter[int] = Counter()
    releases: Counter[int] = Counter()
    by_token: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for row in log_rows:
        if row["new_token"] is not None and row["new_token"] != row["old_token"]:
            claims[row["job_id"]].append(row)
        if row["deferred"]:
            deferrals[row["job_id"]] += 1
        if row["released"]:
            releases[row["job_id"]] += 1
        if row["old_token"] is not None:
            by_token[row["old_token"]].append(row)  # what became of a claim
    mismatched = 0
    for j in jobs.values():
        n_claims, n_defers = len(claims[j["id"]]), deferrals[j["id"]]
        n_released = releases[j["id"]]
        if (j["attempts"] != n_claims - n_defers - n_released
                or j["deferrals"] != n_defers):
            mismatched += 1
            if mismatched <= 10:
                r.violations.append(
                    f"job {j['id']}: attempts {j['attempts']} != claims {n_claims} - "
                    f"deferrals {n_defers} - releases {n_released} (deferrals column "
                    f"{j['deferrals']})")
    r.figures["claims"] = sum(len(c) for c in claims.values())
    r.figures["deferrals"] = sum(deferrals.values())
    r.figures["releases"] = sum(releases.values())
    if mismatched > 10:
        r.violations.append(f"... {mismatched} jobs in all with attempts != claims - "
                            "deferrals - releases")

    # 3. One worker at a time: handler runs of a job never overlap, and every stale
    #    reclaim took the job from a dead worker or a run that had ended.
    claim_of = {row["new_token"]: row for rows in claims.values() for row in rows}
    handler_of = {h["claim_token"]: h for h in handler_runs}

    def holder_gone(token: Any, at: datetime) -> str | None:
        """Why the claim ``token`` could no longer be running at ``at`` (or None)."""
        h = handler_of.get(token)
        c = claim_of.get(token)
        app = str(c["app"]) if c is not None else None
        if app in killed_at and killed_at[app] <= at:
            return f"{app.removeprefix('chaos-')} SIGKILLed"
        cut = cut_at(app, at)
        if cut is not None:
            return str(cut)
        if h is not None and h["ended_at"] is not None and h["ended_at"] <= at:
            run = runs.get(c["run_id"]) if c is not None else None
            if run is not None and run["stop_reason"] == "error":
                return f"its run ended in error ({run['error']})"
            return "its handler had returned and the release did not land"
        if c is not None:
            run = runs.get(c["run_id"])
            if run is not None and run["finished_at"] is not None \
                    and run["finished_at"] <= at:
                return f"its run had ended ({run['stop_reason']}: {run['error']})"
        return None

    stale_reclaims = 0
    by_job_handlers: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for h in handler_runs:
        by_job_handlers[h["job_id"]].append(h)
        if h["starts"] != 1:
            r.violations.append(f"job {h['job_id']}: one claim's handler started "
                                f"{h['starts']} times")
    for job_id, rows in claims.items():
        for row in rows:
            if row["old_status"] != "running":
                continue
            stale_reclaims += 1
            gone = holder_gone(row["old_token"], row["at"])
            stale_for = row["new_locked"] - row["old_locked"]
            if stale_for < timedelta(seconds=profile.stale_after):
                r.violations.append(f"job {job_id}: reclaimed after {stale_for}, inside "
                                    f"the stale window")
            if gone is None:
                r.violations.append(f"job {job_id}: reclaimed from a live holder "
                                    f"(claim {row['old_token']})")
    r.figures["stale_reclaims"] = stale_reclaims
    overlaps = overlaps_cut = 0

    def claim_order(token: Any, at: datetime) -> tuple[int, datetime]:
        # In the order of the claims (the log's), not of arrival: a cut-off worker's
        # handler start or effect can land after the next claim's.
        c = claim_of.get(token)
        return (int(c["id"]) if c is not None else 2**62, at)

    for job_id, rows in by_job_handlers.items():
        rows.sort(key=lambda h: claim_order(h["claim_token"], h["started_at"]))
        for a, b in itertools.pairwise(rows):
            end = a["ended_at"]
            if a["outcome"] == "ignored_cancel":
                # It ignored its cut and went on in the background until the runner
                # abandoned it at its run's hard deadline (its late settlement fenced):
                # its end is the claim's end, the abandon (or its worker's death).
                after = by_token.get(a["claim_token"], [])
                k = kill_of.get(str(a["worker"]))
                end = after[0]["at"] if after else (k.at if k is not None else None)
            if end is None:
                # A handler cut at its deadline whose own record of the cut never
                # landed (its write was cut too, on a loaded machine): the runner
                # settles a cut job only after cancelling its handler, so the
                # settlement that names the timeout is its end.
                settled = by_token.get(a["claim_token"], [])
                if settled and str(settled[0].get("last_error") or "").startswith(
                        ("timed out after", "did not stop when cancelled")):
                    end = settled[0]["at"]
            if end is None:
                k = kill_of.get(str(a["worker"]))
                end = k.at if k is not None else None
            if end is None or end > b["started_at"]:
                c = claim_of.get(b["claim_token"])
                # a's claim was taken by a stale reclaim while a's worker was cut off (b
                # is that reclaim, or a later claim): its handler went on, at least once.
                after_a = by_token.get(a["claim_token"])
                lost_to = after_a[0] if after_a else None
                if lost_to is not None and lost_to["new_token"] is not None \
                        and lost_to["old_status"] == "running" \
                        and cut_at(f"chaos-{a['worker']}", lost_to["at"]) is not None \
                        and cut_at(f"chaos-{a['worker']}", b["started_at"]) is not None:
                    overlaps_cut += 1
                    continue
                overlaps += 1
                how = ("a stale reclaim" if c is not None and c["old_status"] == "running"
                       else f"a claim from {c['old_status']}" if c is not None else "?")
                r.violations.append(
                    f"job {job_id}: handler of attempt {b['attempt']} ({b['worker']}, "
                    f"{how}) started at {b['started_at']:%T.%f} while attempt "
                    f"{a['attempt']} ({a['worker']}, started {a['started_at']:%T.%f}, "
                    f"outcome {a['outcome']}) had not ended")
    r.figures["overlaps"] = overlaps
    if out.cuts:
        r.figures["overlaps_across_cuts"] = overlaps_cut

    # 4. Side effects repeated in a later attempt, each explained by the earlier
    #    attempt's fate: its worker killed, or its run cut off mid-handler.
    effects_of: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in effects:
        effects_of[e["job_id"]].append(e)
        if e["same_claim"]:
            r.violations.append(f"job {e['job_id']}: one claim (attempt {e['attempt']}) "
                                f"wrote its effect {e['same_claim'] + 1} times")
    reasons: Counter[str] = Counter()
    hand_backs = {x["id"]: started_hand_backs(x) for x in runs.values()}
    for job_id, es in sorted(effects_of.items()):
        # In claim order, not by attempt: a hand-back returns the attempt, so two
        # claims can share its number.
        es.sort(key=lambda e: claim_order(e["claim_token"], e["at"]))
        for a, b in itertools.pairwise(es):
            r.duplicated += 1
            why = explain_repeat(a, by_token.get(a["claim_token"], []), handler_of, runs,
                                 killed_at, cut_at, hand_backs)
            if a["stage"] not in ("enrich", "runaway"):
                r.violations.append(f"job {job_id} ({a['stage']}): a transactional effect "
                                    f"repeated")
            if why is None:
                r.violations.append(f"job {job_id} ({a['stage']}): effect of attempt "
                                    f"{a['attempt']} repeated in attempt {b['attempt']}, "
                                    f"unexplained: "
                                    + repeat_facts(a, by_token.get(a["claim_token"], []),
                                                   handler_of, runs, killed_at))
                continue
            reasons[why.split(":")[0]] += 1
            r.notes.append(f"repeat: job {job_id} ({a['stage']}) attempt {a['attempt']} -> "
                           f"{b['attempt']}: {why}")
    r.figures["repeats_by_reason"] = dict(reasons)
    # 4b. A started job goes back with its attempt returned only when its run's end or a
    #     stop request cut it (or the pool had no connection for it), and the run counts
    #     each: a run that ended and counted fewer handed back a job it should have
    #     failed or completed.
    released_started: Counter[Any] = Counter()
    for row in log_rows:
        began = handler_of.get(row["old_token"]) if row["released"] else None
        if began is not None and row["at"] >= began["started_at"]:
            released_started[began["run_id"]] += 1
    for run_id, n in sorted(released_started.items(), key=lambda kv: str(kv[0])):
        x = runs.get(run_id)
        if x is None or x["finished_at"] is None:
            continue  # killed: its summary may miss its last hand-backs
        if n > (counted := started_hand_backs(x)):
            r.violations.append(f"run {run_id}: handed back {n} started job(s) but counted "
                                f"{counted} ({', '.join(STARTED_HAND_BACKS)})")
    r.figures["started_hand_backs"] = sum(released_started.values())
    for j in jobs.values():
        if j["status"] == "done" and j["type"] in STAGES and not effects_of.get(j["id"]):
            r.violations.append(f"job {j['id']} is done without its side effect")

    # 5. Give-up hooks: exactly once per failed job, none for any other.
    for j in jobs.values():
        hook = hooks.get(j["id"])
        if j["status"] == "failed":
            if hook is None or j["give_up_pending"]:
                r.hooks_missing += 1
                r.violations.append(f"failed job {j['id']} has no give-up hook run")
            elif hook["runs"] != 1:
                r.hooks_doubled += 1
                r.violations.append(f"job {j['id']}: give-up hook ran {hook['runs']} times")
        elif hook is not None:
            r.hooks_doubled += 1
            r.violations.append(f"job {j['id']} is {j['status']} but its hook ran")
    fail_reasons = Counter(re.sub(r"^job \d+ ", "", str(j["last_error"])).split(":")[0]
                           for j in jobs.values() if j["status"] == "failed")
    r.figures["failed_by"] = dict(fail_reasons)

    # 5b. Handler deadlines: a handler cut at its deadline ("timed_out"), or abandoned
    #     after ignoring the cut ("ignored_cancel"), never completed its job under that
    #     claim (it failed and was retried, or its worker died), unless its own
    #     completing transaction committed before the cut reached it (see
    #     cut_handler_verdict); a job's "timed out" error is one of the runner's two
    #     texts, within the stage's timeout.
    cut_handlers = [h for h in handler_runs if h["outcome"] in ("timed_out", "ignored_cancel")]
    commit_cut = 0
    for h in cut_handlers:
        verdict = cut_handler_verdict(h, by_token.get(h["claim_token"], []))
        if verdict == "own_commit":
            commit_cut += 1
        elif verdict is not None:
            r.violations.append(verdict)
    r.figures["cut_awaiting_commit"] = commit_cut
    limits = {"runaway": profile.runaway_timeout}
    timed_out_errors: Counter[str] = Counter()
    for j in jobs.values():
        text = str(j["last_error"] or "")
        if not text.startswith("timed out"):
            continue
        timed_out_errors[str(j["type"])] += 1
        m = TIMED_OUT.match(text)
        limit = limits.get(str(j["type"]), profile.platform_timeout / 2)
        if not (m and float(m.group(1)) <= limit + 0.05) and not text.startswith(IGNORED_CUT):
            r.violations.append(f"job {j['id']} ({j['type']}): last_error {text!r} is not "
                                f"'timed out after N s' (N <= {limit:g}) nor the abandon")
    r.figures["timed_out_fails"] = sum(
        1 for row in log_rows if row["old_status"] == "running"
        and row["new_status"] in ("pending", "failed") and not row["deferred"]
        and not row["released"] and str(row["last_error"] or "").startswith("timed out"))
    runaway_outcomes = Counter(str(h["outcome"]) for h in handler_runs
                               if h["stage"] == "runaway")
    timed_out_runs = sum(int(x["summary"].get("timed_out", 0)) for x in runs.values())
    r.figures["timed_out"] = timed_out_runs
    r.figures["runaway_handlers"] = dict(runaway_outcomes)
    r.figures["last_error_timed_out_by_type"] = dict(timed_out_errors)
    ignorer_runs = {h["run_id"] for h in handler_runs if h["outcome"] == "ignored_cancel"}
    overran = 0
    platform = timedelta(seconds=profile.platform_timeout)
    for x in runs.values():
        lasted = (x["finished_at"] - x["started_at"]
                  if x["finished_at"] is not None else timedelta(0))
        # A run the PostgreSQL restart cut off, or whose worker's link was cut or slow,
        # records its end once the database answers again (docs/design.md, "The
        # runner"), which can be past the limit.
        if lasted >= platform and not across_restart(x) and not across_cut(x):
            r.violations.append(f"run {x['id']} ({x['app']}) lasted "
                                f"{lasted.total_seconds():.2f} s, not under the platform "
                                f"timeout ({x['started_at']:%T.%f}-{x['finished_at']:%T.%f}, "
                                f"{x['stop_reason']})")
        if str(x["error"]).startswith("RunOverran"):
            overran += 1
            if x["id"] not in ignorer_runs and not across_restart(x) and not across_cut(x):
                r.violations.append(f"run {x['id']} ({x['app']}) overran without a handler "
                                    f"that ignored its cut, away from the restart")
    r.figures["runs_overran"] = overran

    # 5c. Poison rows: each failed alone ("job N cannot be read: ..."), its hook once
    #     (checked in 5), no run ended in error for it, and the runs' ``unreadable``
    #     counters add up to them (less any counted by a run SIGKILLed before it saved).
    poison_runs: set[Any] = set()
    for pid in out.poison:
        pj = jobs.get(pid)
        if pj is None:
            r.violations.append(f"poison job {pid} is gone")
            continue
        if pj["status"] != "failed" or not str(pj["last_error"]).startswith(
                f"job {pid} cannot be read:"):
            r.violations.append(f"poison job {pid} is {pj['status']} "
                                f"({pj['last_error']!r}), not failed as unreadable")
        fails = [row for row in log_rows
                 if row["job_id"] == pid and row["new_status"] == "failed"]
        poison_runs.update(row["run_id"] for row in fails)
        hook = hooks.get(pid)
        if hook is None or hook["runs"] != 1:
            r.violations.append(f"poison job {pid}: give-up hook ran "
                                f"{0 if hook is None else hook['runs']} times")
    unreadable = sum(int(x["summary"].get("unreadable", 0)) for x in runs.values())
    uncounted = sum(1 for pid in out.poison
                    if any(runs.get(row["run_id"], {}).get("error") == "killed"
                           for row in log_rows
                           if row["job_id"] == pid and row["new_status"] == "failed"))
    r.figures["unreadable"] = f"{unreadable}/{len(out.poison)}"
    if not len(out.poison) - uncounted <= unreadable <= len(out.poison):
        r.violations.append(f"runs counted {unreadable} unreadable jobs; {len(out.poison)} "
                            f"poison rows were inserted ({uncounted} failed in killed runs)")
    for rid in poison_runs:
        pr = runs.get(rid)
        if pr is not None and pr["stop_reason"] == "error" and pr["error"] != "killed" \
                and not across_restart(pr) and not across_cut(pr) \
                and pr["id"] not in ignorer_runs:
            r.violations.append(f"run {rid} failed a poison job and ended in error: "
                                f"{pr['error']}")

    # 6. Runs: every run a killed worker was in ended error/killed; nothing unfinished;
    #    no live run marked killed; other errors only around the restart.
    # A killed worker's last run was going when it died (unless it had finished and the
    # worker was between runs, or it died before its first): that run must be marked
    # error/killed (ending at its last sign of life), and it is the only one marked.
    runs_of: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for x in runs.values():
        runs_of[str(x["app"])].append(x)
    killed_runs = 0
    kills_idle = 0
    for k in out.kills:
        mine = sorted(runs_of.get(f"chaos-{k.worker}", []), key=lambda x: x["started_at"])
        for x in mine[:-1]:
            if x["error"] == "killed":
                r.violations.append(f"run {x['id']} of {k.worker} was marked killed, but "
                                    f"{k.worker} went on to start another run")
        last = mine[-1] if mine else None
        if last is not None and last["error"] == "killed":
            killed_runs += 1
        elif last is None or (last["finished_at"] is not None
                              and last["finished_at"] <= k.at):
            kills_idle += 1  # before its first run, or between two runs
        else:
            r.violations.append(f"run {last['id']} of killed {k.worker} ended "
                                f"{last['stop_reason']} ({last['error']}), not error/killed")
    r.figures["kills_between_runs"] = kills_idle
    r.figures["killed_runs"] = killed_runs
    error_runs: Counter[str] = Counter()
    for x in runs.values():
        if x["finished_at"] is None or x["stop_reason"] is None:
            r.violations.append(f"run {x['id']} ({x['app']}) never finished")
        elif x["error"] == "killed" and x["app"] not in killed_at:
            if not across_cut(x):  # silent past the platform timeout while cut off
                r.violations.append(f"run {x['id']} of live {x['app']} was marked killed")
        elif x["stop_reason"] == "error" and x["error"] != "killed":
            error_runs[str(x["error"]).split(":")[0]] += 1
            if not across_restart(x) and not across_cut(x) and not (
                    str(x["error"]).startswith("RunOverran") and x["id"] in ignorer_runs):
                r.violations.append(f"run {x['id']} ended in error away from the restart: "
                                    f"{x['error']}")
    r.figures["runs"] = len(runs)
    if out.restarts:  # runs going when PostgreSQL came back up, and how they ended
        down, up = out.restarts[0]
        across = Counter("killed" if x["error"] == "killed" else str(x["stop_reason"])
                         for x in runs.values()
                         if x["started_at"] <= up and x["finished_at"] is not None
                         and x["finished_at"] >= up)
        r.figures["restart_seconds"] = round((up - down).total_seconds(), 2)
        r.figures["runs_across_restart"] = dict(across)
    r.figures["runs_ended_error"] = dict(error_runs)
    r.figures["runs_raised"] = out.runs_raised
    if out.stopped_starting:
        r.figures["workers_stopped_while_starting"] = len(out.stopped_starting)
    for crashed in out.crashed:
        r.violations.append(f"worker {crashed} on its own")
    for name in out.forced_stops:
        r.violations.append(f"worker {name} did not stop on SIGTERM")
    if not out.restarts:
        r.violations.append("PostgreSQL was never restarted")
    if not out.kills:
        r.violations.append("no worker was killed")
    await check_bookkeeping(conn, schema, r)
    return r


async def check_bookkeeping(conn: AnyConn, schema: str, r: Findings) -> None:
    """The fair claim's contract (src/rota/fair/verify.sql, as ``rota verify`` runs it)
    on the drained queue: each violation is one of the run's."""
    cur = conn.cursor()
    await cur.execute(Statements(schema).sql("fair/verify"))
    found = [Violation(*row) for row in await cur.fetchall()]
    r.figures["bookkeeping_violations"] = len(found)
    r.violations += [f"fair bookkeeping: {v}" for v in found]


#: The stages whose handlers complete their job in their own transaction
#: (``ctx.complete(conn=...)``: see :class:`tools.chaos.workload.Handlers`).
OWN_TRANSACTION_STAGES = ("draft", "search")


def cut_handler_verdict(handler: dict[str, Any], after: list[dict[str, Any]]) -> str | None:
    """Judge one handler cut at its deadline (outcome ``timed_out`` or
    ``ignored_cancel``) by what became of its claim (``after``: the claim's log rows in
    order, each with ``new_status``, ``app`` and ``at``).

    Returns ``None`` when the claim did not complete the job; ``"own_commit"`` when
    the handler's own completing transaction did it, once: a draft or search whose
    job became done, by its own worker, no later than the handler's recorded end (the
    COMMIT was sent before the cut and the server committed; the reply reached the
    worker only after its deadline, across a slow link or an event loop starved by
    a loaded machine alike, so the handler saw the cancellation while the job was
    already done, and the runner read it done under the claim: docs/design.md,
    "Counters show what committed"); otherwise the violation's text (the runner
    completed a job whose handler it had cut: docs/design.md, "Handler deadlines").
    """
    if not after or after[0]["new_status"] != "done":
        return None
    first = after[0]
    if (handler["stage"] in OWN_TRANSACTION_STAGES
            and first["app"] == f"chaos-{handler['worker']}"
            and handler["ended_at"] is not None and first["at"] <= handler["ended_at"]):
        return "own_commit"
    return (f"job {handler['job_id']}: its handler was cut at its deadline "
            f"({handler['outcome']}) but the claim completed it")


def explain_repeat(effect: dict[str, Any], after: list[dict[str, Any]],
                   handler_of: dict[Any, dict[str, Any]], runs: dict[Any, dict[str, Any]],
                   killed_at: dict[str, datetime],
                   cut_at: Callable[[str, datetime], Cut | None] | None = None,
                   hand_backs: dict[Any, int] | None = None) -> str | None:
    """Why the attempt that wrote ``effect`` did not complete its job, or ``None``.
    ``after`` is the log of what became of that claim (its next transition);
    ``cut_at(app, at)`` the cut of a worker's link going on at a moment, if any;
    ``hand_backs`` how many more hand-backs of started jobs each run's summary can
    explain (by run id; spent here; ``None``: each run's own count, not shared)."""
    token = effect["claim_token"]
    h = handler_of.get(token)
    app = f"chaos-{effect['worker']}"
    nxt = after[0] if after else None
    if nxt is not None and nxt["new_status"] == "done":
        return None  # completed: the repeat cannot be explained by this attempt
    if nxt is not None and nxt["released"] and h is not None and nxt["at"] >= h["started_at"]:
        # Started, then handed back with its attempt returned: only its run's hard
        # deadline cutting the handler before its own timeout (cut_by_run) or a stop
        # request (interrupted) does that, and either may land after the effect
        # (docs/design.md, "Handler deadlines"). A handler cut at its own timeout fails
        # instead, so no other explanation stands; each hand-back the run counted
        # explains one repeat.
        return _handed_back(h, runs.get(h["run_id"]), hand_backs)
    if app in killed_at and killed_at[app] >= effect["at"]:
        where = "mid-handler" if h is None or h["ended_at"] is None else \
            "after its handler returned"
        return (f"killed: {effect['worker']} was SIGKILLed {where}, after the effect and "
                f"before the completion landed")
    if app in killed_at:
        # Written after the moment taken once the worker was dead: nothing else writes
        # as that worker (a respawn has a name of its own), so its backend ran a
        # statement the worker had sent before it died (the server's clock, busy, a few
        # ms after the kill).
        return (f"killed: {effect['worker']} was SIGKILLed with the effect's statement "
                f"in flight (written {effect['at'] - killed_at[app]} after the kill), "
                f"before the completion landed")
    if nxt is not None and nxt["new_status"] == "running" and cut_at is not None:
        cut = cut_at(app, nxt["at"])
        if cut is not None:  # reclaimed while the holder could not reach the database
            return (f"partition: {cut}; its claim went stale and was reclaimed, and its "
                    f"completion was fenced")
    if (h is not None and h["outcome"] in ("timed_out", "ignored_cancel")) or (
            nxt is not None and nxt["new_status"] in ("pending", "failed")
            and not nxt["deferred"] and not nxt["released"]
            and str(nxt["last_error"] or "").startswith("timed out")):
        # Cut at its deadline after the effect (a slow database can push even the
        # handler's own bookkeeping past a 0.5 s timeout): the job failed and retried.
        return (f"timed out: its handler was cut at its deadline "
                f"({h['outcome'] if h is not None else '?'}) after the effect")
    run = runs.get(h["run_id"]) if h is not None else None
    if run is not None and run["stop_reason"] == "error" and run["error"] != "killed":
        return f"restart: its run was cut off by the database restart ({run['error']})"
    return None


#: The summary counters of a run's hand-backs of started jobs (docs/design.md, "Handler
#: deadlines" and "Defer").
STARTED_HAND_BACKS = ("cut_by_run", "interrupted", "pool_timeouts")


def started_hand_backs(run: dict[str, Any]) -> int:
    """How many started jobs a run's summary says it handed back."""
    return sum(int(run["summary"].get(k, 0)) for k in STARTED_HAND_BACKS)


def _handed_back(h: dict[str, Any], run: dict[str, Any] | None,
                 hand_backs: dict[Any, int] | None) -> str | None:
    """The explanation of a repeat after a started job's hand-back, if its run counted
    one that no other repeat has used (``hand_backs``: what is left per run)."""
    if run is None:
        return None
    budget = hand_backs if hand_backs is not None else {run["id"]: started_hand_backs(run)}
    if budget.get(run["id"], 0) <= 0:
        return None
    budget[run["id"]] -= 1
    which = ", ".join(f"{k} {run['summary'][k]}" for k in STARTED_HAND_BACKS
                      if run["summary"].get(k))
    return (f"handed back: its run's end cut the handler after the effect (outcome "
            f"{h['outcome']}; the run counted {which})")


def repeat_facts(effect: dict[str, Any], after: list[dict[str, Any]],
                 handler_of: dict[Any, dict[str, Any]], runs: dict[Any, dict[str, Any]],
                 killed_at: dict[str, datetime]) -> str:
    """What the record says of an attempt whose repeat went unexplained: its worker, its
    handler's outcome and end, its run's stop reason, and its claim's next transition
    (so a failure in CI can be read without the run's database)."""
    h = handler_of.get(effect["claim_token"])
    run = runs.get(h["run_id"]) if h is not None else None
    nxt = after[0] if after else None
    app = f"chaos-{effect['worker']}"
    parts = [f"worker {effect['worker']}, effect at {effect['at']:%T.%f}"]
    if app in killed_at:
        parts.append(f"worker killed at {killed_at[app]:%T.%f}")
    if h is not None:
        ended = h["ended_at"]
        parts.append(f"handler outcome {h['outcome']}, ended "
                     f"{'never' if ended is None else format(ended, '%T.%f')}")
    if run is not None:
        parts.append(f"run {run['stop_reason']} ({run['error']}), finished "
                     f"{run['finished_at']}")
    if nxt is None:
        parts.append("no transition of its claim")
    else:
        parts.append(f"next: {nxt['old_status']} -> {nxt['new_status']} at "
                     f"{nxt['at']:%T.%f} (released {nxt['released']}, deferred "
                     f"{nxt['deferred']}, error {nxt['last_error']!r})")
    return "; ".join(parts)


def print_report(r: Report, *, verbose: bool, summary: str | None = None) -> None:
    for key, value in r.figures.items():
        print(f"  {key}: {value}")
    notes = r.notes if verbose else r.notes[:20]
    for note in notes:
        print(f"  {note}")
    if len(notes) < len(r.notes):
        print(f"  ... {len(r.notes) - len(notes)} more repeats (--verbose lists them)")
    for v in r.violations[:50]:
        print(f"  VIOLATION: {v}")
    if len(r.violations) > 50:
        print(f"  ... {len(r.violations) - 50} more violations")
    print(r.summary() if summary is None else summary, flush=True)
