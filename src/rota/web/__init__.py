"""rota's web apps: the cron endpoint (:mod:`rota.web.cron`), the dashboard
(:mod:`rota.web.dashboard`) and Prometheus metrics (:mod:`rota.web.metrics`).

The dashboard is imported on first use: Jinja2 and prometheus_client would otherwise
add about 150 ms to the start of every process that imports rota (a worker, a cron run).
"""

from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from .dashboard import dashboard_app


def __getattr__(name: str) -> Any:
    if name == "dashboard_app":
        from .dashboard import dashboard_app

        return dashboard_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
