"""The one path that settles a job (docs/design.md, "The runner"): every way a handler
call can end, and exactly what happens to its jobs (:func:`rota.runner.settle.decide`,
pure: no database); and no runner module but the settler calls a job transition."""

from __future__ import annotations

import ast
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from psycopg_pool import PoolTimeout

import rota.runner
from rota import DeferJob, HandlerTimedOut
from rota.quota import SHARED_SCOPE, QuotaExhausted
from rota.rates import NO_KEY, RateLimited
from rota.runner.settle import (
    CallOutcome,
    Complete,
    Defer,
    Fail,
    HandBack,
    Keep,
    WaitForRate,
    decide,
)

AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_a_call_that_returned_completes_its_jobs_with_its_value() -> None:
    assert decide(CallOutcome(value={"n": 1})) == Complete({"n": 1})
    assert decide(CallOutcome()) == Complete(None)


def test_a_call_that_raised_defer_job_defers_to_its_until() -> None:
    assert decide(CallOutcome(failure=DeferJob(AT))) == Defer(AT)
    assert decide(CallOutcome(failure=DeferJob(timedelta(seconds=30)))) == Defer(
        timedelta(seconds=30))
    assert decide(CallOutcome(failure=DeferJob())) == Defer(None)


def test_a_shared_quota_spent_defers_to_its_reset_and_blocks_the_stage() -> None:
    spent = QuotaExhausted("api", SHARED_SCOPE, AT)
    assert decide(CallOutcome(failure=spent)) == Defer(AT, count="quota_deferred",
                                                       blocks=spent)


def test_an_owners_allowance_spent_defers_to_its_reset_without_blocking() -> None:
    spent = QuotaExhausted("daily", "acme", AT)
    assert decide(CallOutcome(failure=spent)) == Defer(AT, count="quota_deferred")


def test_a_rate_limit_refusal_waits_for_its_units() -> None:
    refused = RateLimited("llm", NO_KEY, 1, AT)
    assert decide(CallOutcome(failure=refused)) == WaitForRate(refused)


def test_no_connection_from_rotas_pool_hands_the_job_back_after_the_run() -> None:
    assert decide(CallOutcome(failure=PoolTimeout("none"), pool_timed_out=True)) == (
        HandBack(after_run=True, also="pool_timeouts",
                 why="no connection within the pool's timeout; handed back"))


def test_a_pool_timeout_of_the_handlers_own_pool_is_the_jobs_failure() -> None:
    error = PoolTimeout("theirs")
    assert decide(CallOutcome(failure=error)) == Fail(error)


def test_any_other_error_fails_the_jobs_with_it() -> None:
    error = ValueError("bad")
    assert decide(CallOutcome(failure=error)) == Fail(error)


def test_a_sync_handler_past_its_timeout_fails_counted_timed_out() -> None:
    error = HandlerTimedOut("ran 3 s")
    assert decide(CallOutcome(failure=error)) == Fail(error, count="timed_out")


def test_a_call_cut_at_its_own_timeout_fails_timed_out() -> None:
    assert decide(CallOutcome(failure=TimeoutError(), timed_out=True, seconds=1.04,
                              limit=1.0)) == Fail("timed out after 1 s",
                                                  count="timed_out", warn=True)
    assert decide(CallOutcome(timed_out=True, seconds=2.46, limit=5.0,
                              unsettled=2)) == Fail("timed out after 2.5 s",
                                                    count="timed_out", warn=True)


def test_a_call_cut_by_the_runs_end_before_its_timeout_goes_back_as_it_was() -> None:
    assert decide(CallOutcome(timed_out=True, run_cut=True, seconds=1.26,
                              limit=1.5)) == HandBack(
        count="cut_by_run", best_effort=True,
        why="cut by the run's end after 1.3 s, before their 1.5 s timeout: handed "
            "back as they were")


def test_a_cut_call_that_settled_every_job_leaves_nothing_to_do() -> None:
    assert decide(CallOutcome(timed_out=True, unsettled=0)) == Keep()
    assert decide(CallOutcome(timed_out=True, run_cut=True, unsettled=0)) == Keep()


@pytest.mark.parametrize("outcome", [
    CallOutcome(), CallOutcome(failure=ValueError("x")), CallOutcome(timed_out=True)])
def test_deciding_is_pure(outcome: CallOutcome) -> None:
    assert decide(outcome) == decide(outcome)


RUNNER = Path(rota.runner.__file__).parent
TRANSITIONS = {"complete", "complete_many", "fail", "defer", "release",
               "restore_due_times", "postpone", "claim_states"}


@pytest.mark.parametrize("module", sorted(
    p.name for p in RUNNER.glob("*.py") if p.name != "settle.py"))
def test_only_the_settler_calls_the_queues_job_transitions(module: str) -> None:
    """``queue.complete(...)``, ``self.queue.fail(...)``... appear in settle.py alone."""
    tree = ast.parse((RUNNER / module).read_text())
    calls = {n.func.attr for n in ast.walk(tree)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and isinstance(n.func.value, ast.Attribute | ast.Name)
             and (n.func.value.attr if isinstance(n.func.value, ast.Attribute)
                  else n.func.value.id) == "queue"}
    assert calls & TRANSITIONS == set()


@pytest.mark.parametrize("module", sorted(
    p.name for p in RUNNER.glob("*.py") if p.name != "settle.py"))
def test_only_the_settler_writes_the_settling_counters(module: str) -> None:
    tree = ast.parse((RUNNER / module).read_text())
    written = {t.attr for n in ast.walk(tree) if isinstance(n, ast.AugAssign | ast.Assign)
               for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
               if isinstance(t, ast.Attribute)}
    if module == "context.py":  # RunState.__init__ sets them to 0
        written -= {"jobs_done", "jobs_failed", "jobs_deferred"}
    assert written & {"jobs_done", "jobs_failed", "jobs_deferred", "outcome"} == set()
