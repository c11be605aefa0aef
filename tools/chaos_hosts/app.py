"""The app the hosts' workers run: ``rota worker --app tools.chaos_hosts.app:app``.

It is the chaos pipeline (:mod:`tools.chaos.workload`), with the ``tick`` stage and the
schedule of :mod:`tools.chaos_hosts.schedules`. The harness
passes the workload profile, the worker's name and its seed in the environment; the
worker's connections carry ``application_name=chaos-NAME`` in its URL.
"""

from __future__ import annotations

import asyncio
import os
import signal
from datetime import timedelta
from typing import Any

from rota import Pipeline, Queue

from ..chaos.profile import Profile
from ..chaos.worker import _dump_tasks
from ..chaos.workload import Handlers
from . import schedules

ENV_PROFILE = "ROTA_CHAOS_PROFILE"
ENV_WORKER = "ROTA_CHAOS_WORKER"
ENV_SEED = "ROTA_CHAOS_SEED"


def make_pipeline(queue: Queue, handlers: Handlers, profile: Profile) -> Pipeline:
    """The chaos pipeline with the schedule's stage first (when there is one)."""
    return Pipeline(queue, [*schedules.stages(handlers), *handlers.stages()],
                    platform_timeout=timedelta(seconds=profile.platform_timeout),
                    heartbeat_every=timedelta(seconds=profile.heartbeat_every),
                    schedules=[schedules.SCHEDULE])


class ChaosApp:
    """``app(queue) -> Pipeline``, with the profile's compressed durations as
    ``queue_settings`` (the CLI reads them before it opens the queue)."""

    @staticmethod
    def profile() -> Profile:
        return Profile.from_json(os.environ[ENV_PROFILE])

    def queue_settings(self) -> dict[str, Any]:
        p = self.profile()
        return {"stale_after": timedelta(seconds=p.stale_after),
                "backoff_base": timedelta(seconds=p.backoff_base)}

    def __call__(self, queue: Queue) -> Pipeline:
        p = self.profile()
        # Called inside the worker's event loop: the harness asks a stuck worker for its
        # task stacks with SIGUSR1 before it kills it.
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, _dump_tasks)
        handlers = Handlers(queue.schema, os.environ[ENV_WORKER], p,
                            int(os.environ[ENV_SEED]))
        return make_pipeline(queue, handlers, p)


app = ChaosApp()
