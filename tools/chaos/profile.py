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
        runaway_share: fraction of the seeded jobs of the ``runaway`` stage.
        runaway_timeout: the ``runaway`` stage's handler timeout (seconds), well below
            the platform timeout.
        hang_rate, ignore_cancel_rate: chance a ``runaway`` call sleeps an hour / swallows
            its cancellation in a loop (bounded, so the process can still stop).
        poison: rows inserted by SQL, bypassing enqueue, that cannot be read (a payload
            nested 3,000 deep; a created_at in year 10193).
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
    runaway_share: float = 0.05
    runaway_timeout: float = 0.5
    hang_rate: float = 0.02
    ignore_cancel_rate: float = 0.01
    poison: int = 5

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> Profile:
        raw = json.loads(text)
        for k in ("kill_every", "latency_ms"):
            raw[k] = tuple(raw[k])
        return cls(**raw)


DEFAULT_PROFILE = Profile(jobs=5000)
# The short profile has few runaway jobs, so they misbehave more often (a few per run).
SHORT_PROFILE = Profile(jobs=600, kill_every=(0.5, 1.0), latency_ms=(5.0, 60.0), deadline=40.0,
                        hang_rate=0.06, ignore_cancel_rate=0.04)
