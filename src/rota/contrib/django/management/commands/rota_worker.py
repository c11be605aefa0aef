"""``python manage.py rota_worker``: run the project's tasks with rota's worker
(docs/django.md, "Running tasks")."""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from .....cli.run import EXIT_STOPPED_AT_ONCE
from .....errors import ConfigError, InvalidInput
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
        """Refuse what would run nothing or what rota refuses (a queue name the backend
        does not have, a concurrency or batch under 1, a budget not inside the platform
        timeout) with one line, before running: a worker on a misspelt queue would
        otherwise wait for ever on job types nobody enqueues."""
        offset = options["clock_offset"]
        budget = options["time_budget"]
        b = backend(options["backend"])
        unknown = sorted(set(options["queues"] or ()) - set(b.queues))
        if unknown:
            raise CommandError(
                f"unknown queue {', '.join(map(repr, unknown))}: TASKS"
                f"[{options['backend']!r}]['QUEUES'] is {sorted(b.queues)}")
        for name in ("concurrency", "batch"):
            if options[name] is not None and options[name] < 1:
                raise CommandError(f"--{name} must be at least 1, got {options[name]}")
        try:
            asyncio.run(run_worker(
                b, queue_names=options["queues"],
                concurrency=options["concurrency"], batch=options["batch"],
                once=options["once"],
                clock_offset=None if offset is None else timedelta(seconds=offset),
                time_budget=None if budget is None else timedelta(seconds=budget)))
        except (ConfigError, InvalidInput) as exc:  # a handler's never reaches here
            raise CommandError(str(exc)) from None
        except asyncio.CancelledError:  # a second SIGINT/SIGTERM, as for `rota worker`
            self.stderr.write("stopped at once: the async tasks in flight were handed "
                              "back (sync ones, which cannot be cancelled, were waited "
                              "for up to the platform timeout)")
            sys.exit(EXIT_STOPPED_AT_ONCE)
