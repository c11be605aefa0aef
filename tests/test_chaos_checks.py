"""The chaos run's judgement of a handler cut at its deadline (tools/chaos/checks.py,
``cut_handler_verdict``; docs/design.md, "Handler deadlines" and "Counters show what
committed"): its claim may complete the job only through the handler's own completing
transaction, committed before the cut reached the handler, whatever delayed the
COMMIT's reply (a slow link, or an event loop starved by a loaded machine: the flake
of the short chaos run, seeds 39082 and 41120). What the runner's own run does in that
case is tested against PostgreSQL in tests/test_deadlines.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from tools.chaos.checks import cut_handler_verdict

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
