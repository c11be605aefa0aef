"""rota: fair, crash-safe background pipelines on one PostgreSQL jobs table."""

from .db import EmbeddedServer, schema_sql
from .errors import (
    ConfigError,
    DatabaseUnavailable,
    InvalidInput,
    MigrationError,
    NaiveDatetimeError,
    PayloadError,
    RotaError,
    UnknownGroup,
    UnknownJobType,
    UnknownPlan,
)
from .job import DeferJob, Job
from .plans import DEFAULT_PLANS, Plan, Plans
from .queue import Queue, QueueSettings
from .sync import SyncQueue

__all__ = [
    "DEFAULT_PLANS",
    "ConfigError",
    "DatabaseUnavailable",
    "DeferJob",
    "EmbeddedServer",
    "InvalidInput",
    "Job",
    "MigrationError",
    "NaiveDatetimeError",
    "PayloadError",
    "Plan",
    "Plans",
    "Queue",
    "QueueSettings",
    "RotaError",
    "SyncQueue",
    "UnknownGroup",
    "UnknownJobType",
    "UnknownPlan",
    "schema_sql",
]
