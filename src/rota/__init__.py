"""rota: fair, crash-safe background pipelines on one PostgreSQL jobs table."""

from typing import TYPE_CHECKING, Any

from .db import EmbeddedServer, schema_sql
from .errors import (
    AttemptLost,
    ConfigError,
    DatabaseUnavailable,
    HandlerTimedOut,
    InvalidCharge,
    InvalidInput,
    InvalidTransition,
    JobNotFound,
    MigrationError,
    NaiveDatetimeError,
    PayloadError,
    RotaError,
    UnknownGroup,
    UnknownJobType,
    UnknownPlan,
    UnknownSetting,
)
from .job import DeferJob, Job
from .maintenance import KilledRuns, Maintenance, PruneDoneJobs, StuckJobs, maintain
from .plans import DEFAULT_PLANS, Plan, Plans
from .queue import Queue
from .quota import Allowance, Quota, QuotaExhausted
from .rates import RateLimit, RateLimited, RateLimitUnreachable
from .results import AttemptError, JobResult, ResultError, WaitTimeout
from .runner import JobContext, Pipeline, RunResult, Stage
from .schedule import Schedule, Scheduler, scheduled_tick
from .settings import QueueSettings
from .sync import SyncQueue
from .worker import Worker

if TYPE_CHECKING:
    from .web import cron_app, dashboard_app


def __getattr__(name: str) -> Any:
    """The web apps, imported on first use (PEP 562): ``import rota`` (and so every
    worker) loads no web framework unless a web app is asked for."""
    if name in ("cron_app", "dashboard_app"):
        from . import web

        return getattr(web, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_PLANS",
    "Allowance",
    "AttemptError",
    "AttemptLost",
    "ConfigError",
    "DatabaseUnavailable",
    "DeferJob",
    "EmbeddedServer",
    "HandlerTimedOut",
    "InvalidCharge",
    "InvalidInput",
    "InvalidTransition",
    "Job",
    "JobContext",
    "JobNotFound",
    "JobResult",
    "KilledRuns",
    "Maintenance",
    "MigrationError",
    "NaiveDatetimeError",
    "PayloadError",
    "Pipeline",
    "Plan",
    "Plans",
    "PruneDoneJobs",
    "Queue",
    "QueueSettings",
    "Quota",
    "QuotaExhausted",
    "RateLimit",
    "RateLimitUnreachable",
    "RateLimited",
    "ResultError",
    "RotaError",
    "RunResult",
    "Schedule",
    "Scheduler",
    "Stage",
    "StuckJobs",
    "SyncQueue",
    "UnknownGroup",
    "UnknownJobType",
    "UnknownPlan",
    "UnknownSetting",
    "WaitTimeout",
    "Worker",
    "cron_app",
    "dashboard_app",
    "maintain",
    "scheduled_tick",
    "schema_sql",
]
