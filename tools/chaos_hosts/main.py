"""The command line: ``python -m tools.chaos_hosts [--short]``, and, internally, the
``probe`` and ``delay`` processes it starts inside the hosts."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import FrameType

from psycopg import sql

from ..chaos.checks import print_report
from ..chaos.main import run_parser
from .checks import check_hosts, print_hosts_report
from .harness import PROBE_HOST, HostsHarness, keep_logs, seed_default
from .net import Network, NetworkUnavailable, require_network_admin
from .profile import DEFAULT_PROFILE, SHORT_PROFILE
from .server import BridgePostgres


def _stop_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so the namespaces and the server are removed."""

    def raise_exit(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, raise_exit)


async def harness_main(args: argparse.Namespace) -> int:
    profile = SHORT_PROFILE if args.short else DEFAULT_PROFILE
    if args.jobs is not None:
        profile = profile.with_jobs(args.jobs)
    if args.hosts is not None:
        profile = replace(profile, hosts=args.hosts)
    if args.no_probe:
        profile = replace(profile, probe=False)
    try:
        require_network_admin()
    except NetworkUnavailable as exc:
        print(f"chaos-hosts: {exc}", file=sys.stderr)
        return 2
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="rota-chaos-hosts-"))
    names = [f"h{i}" for i in range(1, profile.hosts + 1)]
    with Network([*names, PROBE_HOST] if profile.probe else names) as network:
        server = BridgePostgres(network)
        harness = HostsHarness(server, network, profile, seed=args.seed, quiet=args.quiet,
                               workdir=workdir)
        harness.say(f"hosts {', '.join(names)} on {network.subnet}; server {server.kind}")
        try:
            chaos = await harness.run()
            async with await harness.connect() as conn:
                report = await check_hosts(conn, harness.schema, chaos, harness.hosts_out,
                                           len(harness.hosts))
                await conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(
                    sql.Identifier(harness.schema)))
        finally:
            harness.kill_workers()
            server.stop()
    chaos.figures["seconds"] = round(time.monotonic() - started, 1)
    logs = keep_logs(workdir, report.ok, args.keep)
    if logs:
        chaos.figures["worker_logs"] = logs
    print_hosts_report(report)
    print_report(chaos, verbose=args.verbose, summary=report.summary())
    return 0 if report.ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tools.chaos_hosts [--short]`` (and ``... probe``, ``... delay``)."""
    parser = run_parser(
        "python -m tools.chaos_hosts",
        "Workers on several hosts (network namespaces): cut links, a slow link, a SIGKILL "
        "and a PostgreSQL restart, then proof that nothing was lost or doubled and that "
        "cut-off workers were fenced. Needs root.",
        jobs_help="about this many seeded jobs", seed=seed_default(),
        keep_help="keep the worker logs")
    parser.add_argument("--hosts", type=int, help="override the profile's host count")
    parser.add_argument("--no-probe", action="store_true",
                        help="skip the ~35 s measurement of rota's connection timeouts")
    sub = parser.add_subparsers(dest="command")
    p = sub.add_parser("probe", help="internal: the timeout probe, inside its host")
    p.add_argument("--database-url", required=True)
    p.add_argument("--cap", type=float, required=True)
    d = sub.add_parser("delay", help="internal: the NFQUEUE delayer, inside a host")
    d.add_argument("--queue", type=int, required=True)
    d.add_argument("--ms", type=float, required=True)
    args = parser.parse_args(argv)
    if args.command == "probe":
        from .probe import probe_main

        return asyncio.run(probe_main(args.database_url, args.cap))
    if args.command == "delay":
        from .nfqueue import main as delay_main

        return delay_main(args.queue, args.ms)
    logging.basicConfig(level=logging.ERROR, format="%(name)s %(levelname)s %(message)s")
    _stop_on_sigterm()
    print(f"seed={args.seed}", flush=True)
    return asyncio.run(harness_main(args))


if __name__ == "__main__":
    sys.exit(main())
