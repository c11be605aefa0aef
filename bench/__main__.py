"""`make bench`: claim latency against backlog (with the EXPLAIN at 1M), enqueue
throughput, drain throughput and fairness positions, against the references measured
in the same run. Results go to
bench/results/ (JSON, PNG, EXPLAIN); bench/RESULTS.md records a run with its machine.

Usage: python -m bench [--quick] [--hosts] (DATABASE_URL, default the local test
database). --quick stops the claim sizes at 100k (the 1M build takes a minute or two),
builds the workload matrix at 100,000 pending jobs instead of 1,000,000, drains 5,000
jobs instead of 20,000, runs procrastinate's fairness only with its lock, and times the
dashboard's pages at 100,000 jobs instead of 1,000,000 (bench/dashboard.py), and runs
the many-workers part (bench/workers.py) once instead of twice, pins the xmin horizon
for 60 s at 100,000 pending jobs only (bench/pinned.py; otherwise 10 minutes, at
100,000 and 1,000,000), runs one round of enqueue-to-start (bench/start.py) instead of
two, and the rate limiter's takes (bench/rates.py) for 3 s per configuration instead of
10. --hosts adds
the multi-host part (bench/hosts.py: namespaced hosts and a private server of its own,
root only; alone: make bench-hosts)."""

from __future__ import annotations

import json
import os
import platform
import sys
from importlib import metadata
from pathlib import Path

import psycopg

from . import (
    claim_latency,
    dashboard,
    drain,
    enqueue,
    fairness,
    matrix,
    pinned,
    rates,
    server,
    start,
    workers,
)

RESULTS = Path(__file__).parent / "results"


def machine(url: str) -> dict[str, str]:
    with psycopg.connect(url) as c:
        row = c.execute("SELECT version()").fetchone()
    return {
        "cpu_count": str(os.cpu_count()),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "postgres": row[0] if row else "?",
        **{f"server_{k}": v for k, v in server.settings(url).items()},
        **{p: metadata.version(p) for p in ("psycopg", "procrastinate", "pgqueuer", "asyncpg")},
    }


def main() -> None:
    url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
    sizes = claim_latency.SIZES[:-1] if "--quick" in sys.argv else claim_latency.SIZES
    info = machine(url)
    print(json.dumps(info, indent=2))
    print(server.describe(url))
    claims = claim_latency.main(url, RESULTS, sizes)
    quick = "--quick" in sys.argv
    cells = matrix.main(url, pending=100_000 if quick else 1_000_000, quick=quick)
    enq = enqueue.main(url)
    drained = drain.main(url, n=5_000 if quick else 20_000, rounds=3)
    fair = fairness.main(url, quick=quick)
    pages = dashboard.main(url, 100_000 if quick else 1_000_000)
    many = workers.main(url, rounds=1 if quick else 2, jobs=200_000)
    horizon = pinned.main(url, sizes=pinned.QUICK if quick else pinned.FULL)
    to_start = start.main(url, rounds=1 if quick else 2)
    takes = rates.main(url, seconds=3.0 if quick else 10.0)
    (RESULTS / "results.json").write_text(json.dumps(
        {"machine": info, "claim_latency_ms": claims, "enqueue_jobs_per_s": enq,
         "drain_jobs_per_s": drained, "fairness": fair, "dashboard": pages,
         "matrix": cells, "workers": many, "pinned": horizon, "start_ms": to_start,
         "rate_takes": takes}, indent=2))
    print("\nclaim latency (ms):\n" + claim_latency.header())
    for pending, r in sorted(claims["by_pending"].items()):
        print(claim_latency.row(pending, r))
    if claims["clutter"]:
        print(claim_latency.row(1_000_000, claims["clutter"], " + clutter"))
    print("\nworkload matrix (claim of 25, ms; FIFO in the same cell):\n" + matrix.header())
    for cell in cells:
        print(matrix.row(cell))
    print("\nenqueue:\n" + enqueue.report(enq))
    print("\ndrain throughput:\n" + drain.report(drained))
    print("\n" + drain.report_prefetch(drained["rota prefetch"]))
    print("\nfairness:" + fairness.report(fair))
    print("\n" + dashboard.report(pages["jobs"], pages["median_ms"]))
    print("\nmany workers:\n" + workers.report(many))
    print("\npinned horizon (claim of 25, p50):\n" + pinned.report(horizon))
    print("\nenqueue to start (idle worker):\n" + start.report(to_start))
    print("\nrate limit takes (8 processes):\n" + rates.report(takes))
    if "--hosts" in sys.argv:
        from . import hosts

        across = hosts.main()
        (RESULTS / "hosts.json").write_text(json.dumps(across, indent=2))
        print("\nacross hosts:\n" + hosts.report(across))


if __name__ == "__main__":
    main()
