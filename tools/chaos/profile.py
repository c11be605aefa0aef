"""The chaos run's profiles: how big and how violent a run is (the default for
``make chaos``, the short one for the tests)."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    """How big and how violent a chaos run is.

    Attributes:
        jobs: total jobs (seeded enrich and search jobs, plus two drafts per search).
        workers: worker processes running at any time (at least 2 runs overlap).
        kill_every: seconds between kills, drawn uniformly from this range.
        restart_at: fraction of jobs finished when PostgreSQL is restarted (once).
        stop_killing_at: fraction of jobs finished when the killing stops.
        deadline: seconds for the worker phase; what is open then is drained.
        error_rate, defer_rate: chance a handler raises an error / ``DeferJob``.
        latency_ms: a handler's random latency range (enrich sleeps it twice, once
            after its side effect, so kills land there too).
        stale_after, platform_timeout, heartbeat_every, time_budget, backoff_base:
            the compressed durations (seconds).
        maintain_every: seconds between a worker's maintenance passes (jittered).
    """

    jobs: int
    workers: int = 4
    kill_every: tuple[float, float] = (1.5, 3.0)
    restart_at: float = 0.35
    stop_killing_at: float = 0.97
    deadline: float = 240.0
    error_rate: float = 0.05
    defer_rate: float = 0.03
    latency_ms: tuple[float, float] = (1.0, 20.0)
    stale_after: float = 6.0
    platform_timeout: float = 5.0
    heartbeat_every: float = 1.0
    time_budget: float = 2.0
    backoff_base: float = 0.5
    maintain_every: float = 3.0

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> Profile:
        raw = json.loads(text)
        for k in ("kill_every", "latency_ms"):
            raw[k] = tuple(raw[k])
        return cls(**raw)


DEFAULT_PROFILE = Profile(jobs=5000)
SHORT_PROFILE = Profile(jobs=600, kill_every=(0.5, 1.0), latency_ms=(5.0, 60.0), deadline=40.0)
