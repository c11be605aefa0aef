"""rota's web apps: the cron endpoint (:mod:`rota.web.cron`), the dashboard
(:mod:`rota.web.dashboard`) and Prometheus metrics (:mod:`rota.web.metrics`)."""

from .cron import (
    HEALTHY_STOP_REASONS,
    PipelineSource,
    RunnablePipeline,
    RunOutcome,
    Trigger,
    bearer_matches,
    check_time_budget,
    cron_app,
    resolve_pipeline,
    result_json,
    usable_secret,
)
from .dashboard import dashboard_app

__all__ = [
    "HEALTHY_STOP_REASONS",
    "PipelineSource",
    "RunOutcome",
    "RunnablePipeline",
    "Trigger",
    "bearer_matches",
    "check_time_budget",
    "cron_app",
    "dashboard_app",
    "resolve_pipeline",
    "result_json",
    "usable_secret",
]
