"""``python manage.py rota_worker``: run the project's tasks with rota's worker
(docs/django.md, "Running tasks")."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from ...worker import backend, run_worker


class Command(BaseCommand):  # type: ignore[misc]
    help = ("Run the task backend's tasks with rota's worker until SIGTERM/SIGINT (the run "
            "in flight claims nothing more and finishes its tasks; a second signal stops "
            "at once).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--backend", default="default",
                            help="The TASKS alias (default: default).")
        parser.add_argument("--queue", action="append", dest="queues", metavar="NAME",
                            help="Run only this queue's tasks (repeatable; default: the "
                                 "backend's QUEUES).")
        parser.add_argument("--concurrency", type=int, default=None,
                            help="Tasks run at once per stage (default WORKER['concurrency'] "
                                 "or 4).")
        parser.add_argument("--batch", type=int, default=None,
                            help="Jobs claimed at once (default: sized by the runner).")
        parser.add_argument("--once", action="store_true",
                            help="One run: until no task is due (or the budget ends), then "
                                 "exit (for cron, and tests).")
        parser.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                            help="Each run's budget (default WORKER['time_budget'] or 220).")
        parser.add_argument("--clock-offset", type=float, default=None, metavar="SECONDS",
                            help="Move the queue's clock forward (tests, simulations).")

    def handle(self, *args: Any, **options: Any) -> None:
        offset = options["clock_offset"]
        budget = options["time_budget"]
        asyncio.run(run_worker(
            backend(options["backend"]), queue_names=options["queues"],
            concurrency=options["concurrency"], batch=options["batch"],
            once=options["once"],
            clock_offset=None if offset is None else timedelta(seconds=offset),
            time_budget=None if budget is None else timedelta(seconds=budget)))
