"""The chaos run's judgement of a handler cut at its deadline, and of a side effect
repeated after its run's end handed the job back (tools/chaos/checks.py,
``cut_handler_verdict``; docs/design.md, "Handler deadlines" and "Counters show what
committed"): its claim may complete the job only through the handler's own completing
transaction, committed before the cut reached the handler, whatever delayed the
COMMIT's reply (a slow link, or an event loop starved by a loaded machine: the flake
of the short chaos run, seeds 39082 and 41120). What the runner's own run does in that
case is tested against PostgreSQL in tests/test_deadlines.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from tools.chaos.checks import cut_handler_verdict, explain_repeat

T0 = datetime(2026, 12, 1, 16, 0, tzinfo=UTC)
MS = timedelta(milliseconds=1)


def handler(stage: str, outcome: str = "timed_out", ended: datetime | None = T0,
            worker: str = "w3") -> dict[str, Any]:
    return {"job_id": 17, "stage": stage, "outcome": outcome, "worker": worker,
            "ended_at": ended}


def row(status: str, at: datetime, app: str = "chaos-w3") -> dict[str, Any]:
    return {"new_status": status, "at": at, "app": app}


def test_its_own_commit_before_the_cut_did_the_job_without_a_slow_link() -> None:
    for stage in ("draft", "search"):
        for outcome in ("timed_out", "ignored_cancel"):
            assert cut_handler_verdict(handler(stage, outcome), [row("done", T0 - MS)]) \
                == "own_commit"
            assert cut_handler_verdict(handler(stage, outcome), [row("done", T0)]) \
                == "own_commit"


def test_a_claim_that_did_not_complete_the_job_is_no_concern() -> None:
    assert cut_handler_verdict(handler("enrich"), []) is None
    assert cut_handler_verdict(handler("enrich"), [row("pending", T0 + MS),
                                                   row("done", T0 + 9 * MS)]) is None
    assert cut_handler_verdict(handler("draft"), [row("failed", T0 - MS)]) is None


def test_a_completion_the_handler_did_not_commit_itself_is_a_violation() -> None:
    violation = "job 17: its handler was cut at its deadline (timed_out) but the claim " \
                "completed it"
    # The runner completes an enrich job (its handler never completes it itself).
    assert cut_handler_verdict(handler("enrich"), [row("done", T0 - MS)]) == violation
    # Done after the handler's end: the runner's completion, not the handler's COMMIT.
    assert cut_handler_verdict(handler("draft"), [row("done", T0 + MS)]) == violation
    # Done by another worker's connection under this claim.
    assert cut_handler_verdict(handler("draft"), [row("done", T0 - MS, "chaos-w4")]) \
        == violation
    # The handler's end never recorded: nothing says its COMMIT came first.
    assert cut_handler_verdict(handler("search", ended=None), [row("done", T0)]) \
        == violation
    assert cut_handler_verdict(handler("draft", "ignored_cancel"), [row("done", T0 + MS)]) \
        == "job 17: its handler was cut at its deadline (ignored_cancel) but the claim " \
           "completed it"


def effect_of(token: str = "t1") -> dict[str, Any]:
    return {"job_id": 275, "claim_token": token, "worker": "w3", "stage": "enrich",
            "attempt": 1, "at": T0}


def released(at: datetime) -> dict[str, Any]:
    return {"old_status": "running", "new_status": "pending", "at": at, "released": True,
            "deferred": False, "last_error": None}


def ran(outcome: str, run_id: str = "r1") -> dict[str, Any]:
    return {"claim_token": "t1", "outcome": outcome, "started_at": T0 - 9 * MS,
            "ended_at": T0 + MS, "run_id": run_id}


def run_row(**summary: int) -> dict[str, Any]:
    return {"id": "r1", "stop_reason": "time_budget", "error": None, "summary": summary}


def test_a_handler_its_runs_end_cut_after_the_effect_explains_the_repeat() -> None:
    """The CI flake of seed 81489: the handler wrote its effect and was recording its
    end when its run's hard deadline cut it (its outcome already ``done``); the runner
    handed the job back (``cut_by_run``), and the next attempt wrote the effect again."""
    for outcome in ("done", "cancelled", "timed_out"):
        why = explain_repeat(effect_of(), [released(T0 + 2 * MS)],
                             {"t1": ran(outcome)}, {"r1": run_row(cut_by_run=1)}, {})
        assert why == (f"handed back: its run's end cut the handler after the effect "
                       f"(outcome {outcome}; the run counted cut_by_run 1)")
    why = explain_repeat(effect_of(), [released(T0 + 2 * MS)], {"t1": ran("done")},
                         {"r1": run_row(interrupted=2)}, {})
    assert why == ("handed back: its run's end cut the handler after the effect "
                   "(outcome done; the run counted interrupted 2)")


def test_each_counted_hand_back_explains_one_repeat() -> None:
    # The run counted one hand-back of a started job: of two claims it released after
    # their effects, one is explained and the other is not.
    budget = {"r1": 1}
    whys = [explain_repeat(effect_of(t), [released(T0 + 2 * MS)],
                           {t: {**ran("done"), "claim_token": t}},
                           {"r1": run_row(cut_by_run=1, released=1)}, {}, None, budget)
            for t in ("t1", "t2")]
    assert [w is not None for w in whys] == [True, False]
    assert budget == {"r1": 0}


def test_a_handler_cut_at_its_own_timeout_and_handed_back_is_unexplained() -> None:
    # Cut at its own timeout, a job fails and its attempt counts; handed back instead
    # (the run counted no cut by its end), the repeat is a defect, whatever the
    # handler's outcome says.
    assert explain_repeat(effect_of(), [released(T0 + 2 * MS)], {"t1": ran("timed_out")},
                          {"r1": run_row(released=1)}, {}) is None


def test_a_hand_back_its_run_did_not_count_leaves_the_repeat_unexplained() -> None:
    # The run counted no hand-back of a started job: nothing explains the repeat.
    assert explain_repeat(effect_of(), [released(T0 + 2 * MS)], {"t1": ran("done")},
                          {"r1": run_row(released=1)}, {}) is None
    # Released before its handler started: not this claim's handler run.
    early = {**ran("done"), "started_at": T0 + 5 * MS}
    assert explain_repeat(effect_of(), [released(T0 + 2 * MS)], {"t1": early},
                          {"r1": run_row(cut_by_run=1)}, {}) is None
    # Completed: a repeat is never explained by a claim that did the job.
    done = {**released(T0 + 2 * MS), "new_status": "done", "released": False}
    assert explain_repeat(effect_of(), [done], {"t1": ran("done")},
                          {"r1": run_row(cut_by_run=1)}, {}) is None


def test_an_effect_its_backend_wrote_just_after_the_worker_was_killed_is_explained() -> None:
    """The short chaos run, seed 46940: w4's effect at 05:02:23.872407, its SIGKILL's
    moment (taken once it was dead) at 05:02:23.869373. Nothing writes as w4 after its
    death but a statement it had sent: the kill explains the repeat. Before, only a kill
    at or after the effect did, and this repeat was called unexplained."""
    effect = {**effect_of(), "worker": "w4"}
    running = {"old_status": "running", "new_status": "running", "at": T0 + 5821 * MS,
               "released": False, "deferred": False, "last_error": None}
    why = explain_repeat(effect, [running], {}, {}, {"chaos-w4": T0 - 3 * MS})
    assert why == ("killed: w4 was SIGKILLed with the effect's statement in flight "
                   "(written 0:00:00.003000 after the kill), before the completion landed")
    # A kill after the effect explains it as before.
    assert explain_repeat(effect, [running], {}, {}, {"chaos-w4": T0 + MS}) == (
        "killed: w4 was SIGKILLed mid-handler, after the effect and before the completion "
        "landed")
    # Another worker's kill explains nothing.
    assert explain_repeat(effect, [running], {}, {}, {"chaos-w3": T0 - 3 * MS}) is None
