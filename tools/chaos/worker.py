"""One chaos worker process (``python -m tools.chaos worker``): pipeline runs back to
back until SIGTERM, with maintenance every few seconds."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import signal
import sys
import time
from datetime import timedelta

from .profile import Profile
from .workload import Handlers, make_maintenance, make_pipeline, make_queue

log = logging.getLogger("tools.chaos.worker")


async def worker_main(url: str, schema: str, name: str, profile: Profile, seed: int) -> int:
    """One worker process: pipeline runs back to back until SIGTERM, maintenance every
    few seconds. A run that raises (its row could not even be written: the database is
    down) is logged and the next one starts after a short pause."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, _dump_tasks)  # the harness asks when stuck
    rng = random.Random(seed)
    queue = make_queue(url, schema, profile, f"chaos-{name}")
    pipeline = make_pipeline(queue, Handlers(schema, name, profile, seed), profile)
    maintenance = make_maintenance(pipeline.queue, profile)
    budget = timedelta(seconds=profile.time_budget)
    next_maintenance = time.monotonic() + rng.uniform(0, profile.maintain_every)
    runs = raised = 0
    try:
        while not stop.is_set():
            maintain = time.monotonic() >= next_maintenance
            if maintain:
                next_maintenance = time.monotonic() + profile.maintain_every * rng.uniform(
                    0.7, 1.3)
            try:
                result = await pipeline.run(trigger="worker", time_budget=budget,
                                            maintenance=maintenance if maintain else None)
            except Exception as exc:
                raised += 1
                log.error("chaos-worker: run raised %s: %s", type(exc).__name__,
                          str(exc).strip().splitlines()[0] if str(exc).strip() else "")
                await asyncio.sleep(0.2)
                continue
            runs += 1
            if result.stop_reason == "error":
                log.warning("chaos-worker: run %s ended in error: %s", result.run_id,
                            result.error)
            elif result.stop_reason == "no_work":
                await asyncio.sleep(rng.uniform(0.05, 0.15))
    finally:
        await queue.close()
    print(json.dumps({"worker": name, "runs": runs, "raised": raised}), flush=True)
    return 0


def _dump_tasks() -> None:
    for task in asyncio.all_tasks():
        print(f"--- task {task.get_name()}", file=sys.stderr)
        task.print_stack(file=sys.stderr)
    sys.stderr.flush()
