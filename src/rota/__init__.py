"""rota: fair, crash-safe background pipelines on one PostgreSQL jobs table."""

from typing import TYPE_CHECKING

from .db import EmbeddedServer, schema_sql
from .errors import (
    ConfigError,
    DatabaseUnavailable,
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
)
from .job import DeferJob, Job
from .maintenance import KilledRuns, Maintenance, PruneDoneJobs, StuckJobs, maintain
from .plans import DEFAULT_PLANS, Plan, Plans
from .queue import Queue
from .quota import Allowance, Quota, QuotaExhausted
from .rates import RateLimit, RateLimited
from .runner import JobContext, Pipeline, RunResult, Stage
from .schedule import Schedule, Scheduler, scheduled_tick
from .settings import QueueSettings
from .sync import SyncQueue
from .web import cron_app, lazy_dashboard
from .worker import Worker

if TYPE_CHECKING:
    from .web import dashboard_app


# The dashboard is imported on first use (see rota.web).
__getattr__ = lazy_dashboard(__name__)


__all__ = [
    "DEFAULT_PLANS",
    "Allowance",
    "ConfigError",
    "DatabaseUnavailable",
    "DeferJob",
    "EmbeddedServer",
    "InvalidInput",
    "InvalidTransition",
    "Job",
    "JobContext",
    "JobNotFound",
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
    "RateLimited",
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
    "Worker",
    "cron_app",
    "dashboard_app",
    "maintain",
    "scheduled_tick",
    "schema_sql",
]
