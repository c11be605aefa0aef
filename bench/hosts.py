"""Scale across hosts (``make bench-hosts``, or ``python -m bench --hosts``): jobs/s and
claim latency with 1, 2, 4 and 8 worker processes spread over 4 hosts, each host a
network namespace reaching one PostgreSQL over its own link, with 0 and 5 ms added to
every packet a host sends (so each round trip costs 5 ms more; tc netem, or the
NFQUEUE delayer of tools/chaos_hosts where the kernel has no netem). Needs root.

Each configuration starts from a fresh schema holding enough ready no-op jobs over
1,000 groups and three plans (bench/scale.py's bulk build, no history) that no worker
runs dry. The workers start, load, wait, and are released together; each then runs its
``Pipeline`` (one stage, claims of 25, the README's size) back to back for the window,
timing every claim (``Queue.claim``, as the runner calls it; not the handlers). Reported:
completed jobs per second over the window (all workers), and the median and p90 claim.
Configurations are interleaved round by round; figures are medians over the rounds.

The server is the private one of tools/chaos_hosts (``listen_addresses`` the bridge
address only), started for the run and removed after it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from .workers import drop, release_together, run_window

ROOT = Path(__file__).resolve().parents[1]
WORKERS = (1, 2, 4, 8)
LATENCIES_MS = (0.0, 5.0)
HOSTS = 4
BATCH = 25
GROUPS = 1000


async def worker_main(url: str, schema: str, seconds: float) -> int:
    """One worker inside a host: ``ready``, wait for ``go`` on stdin, run for
    ``seconds``, print the jobs done and every claim's milliseconds as JSON."""
    from rota import Pipeline, Queue, Stage

    queue = Queue(url, schema=schema)
    await queue.open()
    claims: list[float] = []
    claim = queue.claim  # what the runner calls for each batch

    async def timed_claim(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        result = await claim(*args, **kwargs)
        claims.append((time.perf_counter() - t) * 1000)
        return result

    queue.claim = timed_claim  # type: ignore[method-assign]

    async def noop(ctx: Any) -> None:
        pass

    pipeline = Pipeline(queue, [Stage("t", BATCH, 1, noop)])
    rtts = []
    async with queue.connection() as conn:  # warm a pooled connection; time round trips
        for _ in range(21):
            t = time.perf_counter()
            await conn.execute("SELECT 1")
            rtts.append((time.perf_counter() - t) * 1000)
    done = await run_window(queue, pipeline, seconds)
    print(json.dumps({"done": done, "claims": claims, "rtt": statistics.median(rtts)}),
          flush=True)
    return 0


async def build(url: str, schema: str, jobs: int) -> None:
    from .scale import build as bulk_build

    await bulk_build(url, schema, pending=jobs, groups=GROUPS, done=0)


def run_config(net: Any, url: str, workers: int, latency_ms: float,
               seconds: float, jobs: int) -> dict[str, Any]:
    """One measurement: a fresh schema, ``workers`` processes over the hosts."""
    schema = f"bench_hosts_{uuid.uuid4().hex[:8]}"
    asyncio.run(build(url, schema, jobs))
    hosts = list(net.hosts)
    if latency_ms:
        for h in hosts:
            net.slow(h, latency_ms)
    try:
        outs = release_together(lambda i: net.spawn(
            hosts[i % len(hosts)],
            [sys.executable, "-m", "bench.hosts", "worker", "--url",
             make_conninfo(url, application_name=f"bench-{hosts[i % len(hosts)]}-{i}"),
             "--schema", schema, "--seconds", str(seconds)],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT)}), workers, seconds + 60)
    finally:
        for h in hosts:
            net.heal(h)
        asyncio.run(drop(url, schema))
    claims = sorted(c for o in outs for c in o["claims"])
    done = sum(o["done"] for o in outs)
    if done >= jobs:
        raise RuntimeError(f"{workers} workers drained all {jobs} jobs: raise --jobs")
    return {"jobs_per_s": done / seconds, "claims": len(claims),
            "rtt_ms": statistics.median(o["rtt"] for o in outs),
            "claim_p50_ms": statistics.median(claims) if claims else float("nan"),
            "claim_p90_ms": claims[int(0.9 * (len(claims) - 1))] if claims else float("nan")}


def main(rounds: int = 3, seconds: float = 6.0, jobs: int = 100_000) -> dict[str, Any]:
    from tools.chaos_hosts.net import Network
    from tools.chaos_hosts.server import BridgePostgres

    results: dict[str, list[dict[str, Any]]] = {}
    with Network(HOSTS) as net:
        server = BridgePostgres(net)
        how = "netem" if net.has_netem(next(iter(net.hosts))) else "nfqueue"
        try:
            with psycopg.connect(server.url) as c:
                version = c.execute("SHOW server_version").fetchone()
            for r in range(rounds):
                for latency in LATENCIES_MS:
                    for workers in WORKERS:
                        key = f"{workers}:{latency:g}"
                        m = run_config(net, server.url, workers, latency, seconds, jobs)
                        results.setdefault(key, []).append(m)
                        print(f"round {r + 1}: {workers} workers, +{latency:g} ms: "
                              f"{m['jobs_per_s']:.0f} jobs/s, claim p50 "
                              f"{m['claim_p50_ms']:.2f} ms, round trip "
                              f"{m['rtt_ms']:.2f} ms, load {os.getloadavg()[0]:.1f}",
                              flush=True)
        finally:
            server.stop()
    table = {}
    for key, ms in results.items():
        table[key] = {k: statistics.median(m[k] for m in ms)
                      for k in ("jobs_per_s", "claim_p50_ms", "claim_p90_ms", "rtt_ms")}
    return {"rounds": rounds, "seconds": seconds, "hosts": HOSTS, "batch": BATCH,
            "delay": how, "server": f"PostgreSQL {version[0] if version else '?'}",
            "load_after": os.getloadavg(), "table": table}


def report(r: dict[str, Any]) -> str:
    t = r["table"]
    lines = [f"{r['hosts']} hosts, claims of {r['batch']}, {r['seconds']:g} s windows, "
             f"medians of {r['rounds']} rounds, delay by {r['delay']}",
             "| workers | jobs/s +0 ms | claim p50 +0 ms | round trip +0 ms | jobs/s +5 ms "
             "| claim p50 +5 ms | claim p90 +5 ms | round trip +5 ms | claim p50 added |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for w in WORKERS:
        a, b = t.get(f"{w}:0"), t.get(f"{w}:5")
        if a is None or b is None:
            continue
        lines.append(f"| {w} | {a['jobs_per_s']:.0f} | {a['claim_p50_ms']:.1f} | "
                     f"{a['rtt_ms']:.2f} | {b['jobs_per_s']:.0f} | {b['claim_p50_ms']:.1f} | "
                     f"{b['claim_p90_ms']:.1f} | {b['rtt_ms']:.2f} | "
                     f"{b['claim_p50_ms'] - a['claim_p50_ms']:.1f} |")
    return "\n".join(lines)


def cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hosts", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--jobs", type=int, default=100_000)
    sub = parser.add_subparsers(dest="command")
    w = sub.add_parser("worker", help="internal: one worker inside a host")
    w.add_argument("--url", required=True)
    w.add_argument("--schema", required=True)
    w.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args(argv)
    if args.command == "worker":
        return asyncio.run(worker_main(args.url, args.schema, args.seconds))
    result = main(args.rounds, args.seconds, args.jobs)
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "hosts.json").write_text(json.dumps(result, indent=2))
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(cli())
