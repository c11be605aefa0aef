"""The command line: ``python -m tools.chaos [--short]`` (and, internally, ``... worker``)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from rota import ConfigError

from .checks import print_report
from .harness import Harness
from .profile import DEFAULT_PROFILE, SHORT_PROFILE, Profile
from .servers import BehindPgBouncer, ClusterPostgres, EmbeddedPostgres, Server
from .worker import worker_main


async def harness_main(args: argparse.Namespace) -> int:
    profile = SHORT_PROFILE if args.short else DEFAULT_PROFILE
    if args.jobs is not None:
        profile = replace(profile, jobs=args.jobs)
    if args.workers is not None:
        profile = replace(profile, workers=args.workers)
    if profile.workers < 2:
        raise ConfigError("the chaos run needs at least 2 workers (overlapping runs)")
    url = None if args.embedded else (
        args.database_url if args.database_url is not None else os.environ.get("DATABASE_URL"))
    inner = ClusterPostgres.detect(url) if url else EmbeddedPostgres()
    server: Server = inner
    if args.pooler:
        try:
            server = BehindPgBouncer(inner, args.pooler)
        except BaseException:
            inner.stop()
            raise
    workdir = Path(tempfile.mkdtemp(prefix="rota-chaos-"))
    started = time.monotonic()
    harness = Harness(server, profile, seed=args.seed, quiet=args.quiet, workdir=workdir)
    try:
        report = await harness.run()
        if not args.keep:
            await harness.drop_schema()
    finally:
        harness.kill_workers()
        server.stop()
    report.figures["seconds"] = round(time.monotonic() - started, 1)
    if report.ok and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        report.figures["worker_logs"] = str(workdir)
    print_report(report, verbose=args.verbose)
    return 0 if report.ok else 1


def run_parser(prog: str, description: str, *, jobs_help: str, seed: int,
               keep_help: str) -> argparse.ArgumentParser:
    """The parser of a chaos run (``tools.chaos``, ``tools.chaos_hosts``) with the options
    every run takes: ``--short``, ``--jobs``, ``--seed``, ``--quiet``, ``--verbose`` and
    ``--keep``."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--short", action="store_true", help="the short profile (CI)")
    parser.add_argument("--jobs", type=int, help=jobs_help)
    parser.add_argument("--seed", type=int, default=seed)
    parser.add_argument("--quiet", action="store_true", help="print only the report")
    parser.add_argument("--verbose", action="store_true", help="list every repeat")
    parser.add_argument("--keep", action="store_true", help=keep_help)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tools.chaos [--short]`` (and, internally, ``... worker``)."""
    parser = run_parser(
        "python -m tools.chaos",
        "The chaos run: real worker processes, real SIGKILLs and a real PostgreSQL "
        "restart, then proof that no work was lost, doubled or charged twice.",
        jobs_help="override the profile's job count", seed=int(time.time()) % 100_000,
        keep_help="keep the schema and logs")
    parser.add_argument("--workers", type=int, help="override the profile's worker count")
    parser.add_argument("--database-url", help="a local server to use and restart "
                        "(default DATABASE_URL; unset: an embedded server)")
    parser.add_argument("--embedded", action="store_true", help="use a private embedded "
                        "server even when DATABASE_URL is set (tests: restarting a shared "
                        "server would break what runs beside them)")
    parser.add_argument("--pooler", choices=["transaction", "session"],
                        help="run everything through a real PgBouncer in this mode in "
                        "front of the server (Debian's pgbouncer)")
    sub = parser.add_subparsers(dest="command")
    w = sub.add_parser("worker", help="internal: one worker process")
    w.add_argument("--database-url", required=True)
    w.add_argument("--schema", required=True)
    w.add_argument("--name", required=True)
    w.add_argument("--profile", required=True)
    w.add_argument("--seed", type=int, required=True)
    args = parser.parse_args(argv)
    if args.command == "worker":
        logging.basicConfig(level=logging.WARNING,
                            format="%(asctime)s %(name)s %(levelname)s %(message)s")
        return asyncio.run(worker_main(args.database_url, args.schema, args.name,
                                       Profile.from_json(args.profile), args.seed))
    logging.basicConfig(level=logging.ERROR, format="%(name)s %(levelname)s %(message)s")
    print(f"seed={args.seed}", flush=True)
    return asyncio.run(harness_main(args))


if __name__ == "__main__":
    sys.exit(main())
