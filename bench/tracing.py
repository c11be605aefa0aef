"""What tracing costs per job (docs/operations.md, "Traces"), beside what a claim costs,
in three set-ups, each in its own process:

- ``none``: opentelemetry not importable (``rota`` without the ``otel`` extra);
- ``api``: ``opentelemetry-api`` without an SDK (its no-op spans; the SDK's import is
  blocked);
- ``sdk``: the SDK with a ``SimpleSpanProcessor`` and an in-memory exporter (every
  span recorded and exported at once: the most a span costs in-process).

Two figures per set-up:

- *hooks*: the CPU time of the spans one job goes through, without the database: an
  enqueue span (with its trace context), a handler span made current and ended, a
  settle span (one per job: the most, since completions share one per group commit);
  under a request span in ``sdk``; 20,000 jobs a round.
- *enqueue* and *drain*: 1,000 jobs enqueued one by one, then drained by a one-stage
  pipeline (no-op handler, runner-sized claims), per job.

And, in the ``none`` process, one claim of 25 jobs (median of 100) for scale. Each
round runs the three set-ups one after the other (a process each), so a change of the
machine's load falls on all three; the figures are the medians of the rounds.

Usage: python -m bench.tracing [--rounds N] (default 5; DATABASE_URL, default the
local test database). Prints a table and the ratios to ``none``.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

SETUPS = {
    "none": 'sys.modules["opentelemetry"] = None',
    "api": 'sys.modules["opentelemetry.sdk"] = None',
    "sdk": "",
}
HOOK_JOBS = 20_000
DB_JOBS = 1_000


def _provider() -> Any:
    """The SDK's provider with an in-memory exporter (the ``sdk`` set-up)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.exporter = exporter  # type: ignore[attr-defined]
    return provider


def hooks_us(provider: Any, n: int) -> float:
    """Microseconds of tracing per job, without the database."""
    import uuid
    from datetime import UTC, datetime

    from rota import tracing
    from rota.job import Job

    tracer = tracing.Tracer(provider)
    now = datetime.now(UTC)
    job = Job(1, "t", "g", {}, None, "running", 1, 3, 0, now, now, uuid.uuid4(), None,
              uuid.uuid4(), now, None, False)
    request = (provider.get_tracer("bench").start_as_current_span("request")
               if provider is not None else None)
    with tracer.run("cli") as run:
        if request is not None:
            request.__enter__()
        t = time.perf_counter()
        for i in range(n):
            with tracer.enqueue("t", 1) as sending:
                sending.sent([i], 1)
            span = tracer.start_process(job, run, "run")
            with tracing.current(span), tracer.settle("complete", [job]):
                pass
            tracing.end_process(span, "done", False)
        elapsed = time.perf_counter() - t
        if request is not None:
            request.__exit__(None, None, None)
    if provider is not None:
        provider.exporter.clear()
    return elapsed / n * 1e6


async def db_us(url: str, provider: Any, n: int) -> tuple[float, float]:
    """Microseconds per job to enqueue ``n`` jobs one by one, then to drain them."""
    import psycopg
    from psycopg import sql

    from rota import JobContext, Pipeline, Queue, Stage

    async def noop(ctx: JobContext) -> None:
        pass

    schema = f"bench_tracing_{os.getpid()}"
    async with Queue(url, schema=schema, tracer_provider=provider) as queue:
        await queue.migrate()
        try:
            t = time.perf_counter()
            for _ in range(n):
                await queue.enqueue("t", {})
            enq = time.perf_counter() - t
            t = time.perf_counter()
            result = await Pipeline(queue, [Stage("t", handler=noop)]).run(trigger="cli")
            drain = time.perf_counter() - t
            assert result.jobs_done == n, result
        finally:
            with psycopg.connect(url, autocommit=True) as c:
                c.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    if provider is not None:
        provider.exporter.clear()
    return enq / n * 1e6, drain / n * 1e6


async def claim_ms(url: str, rounds: int = 100) -> float:
    """Median milliseconds of one claim of 25 jobs (one type, 100 groups)."""
    import psycopg
    from psycopg import sql

    from rota import Queue

    schema = f"bench_tracing_claim_{os.getpid()}"
    async with Queue(url, schema=schema) as queue:
        await queue.migrate()
        try:
            for g in range(100):
                await queue.upsert_group(f"g{g}", plan=None)
            await queue.enqueue_many([{"type": "c", "payload": {}, "group_id": f"g{i % 100}"}
                                      for i in range(25 * rounds)])
            times = []
            for _ in range(rounds):
                t = time.perf_counter()
                jobs = await queue.claim("c", 25)
                times.append(time.perf_counter() - t)
                await queue.complete_many(jobs)
        finally:
            with psycopg.connect(url, autocommit=True) as c:
                c.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    return statistics.median(times) * 1e3


def child(setup: str, url: str) -> dict[str, Any]:
    """One round of one set-up (in its own process)."""
    from rota import tracing
    provider = _provider() if setup == "sdk" else None
    assert tracing.AVAILABLE == (setup != "none")
    hooks_us(provider, 1_000)  # warm up
    enqueue, drain = asyncio.run(db_us(url, provider, DB_JOBS))
    out: dict[str, Any] = {"hooks_us": hooks_us(provider, HOOK_JOBS),
                           "enqueue_us": enqueue, "drain_us": drain}
    if setup == "none":
        out["claim_25_ms"] = asyncio.run(claim_ms(url))
    return out


def main(url: str, rounds: int = 5) -> dict[str, dict[str, Any]]:
    samples: dict[str, list[dict[str, Any]]] = {setup: [] for setup in SETUPS}
    for _ in range(rounds):
        for setup, block in SETUPS.items():
            code = (f"import sys\n{block}\nimport json\nfrom bench.tracing import child\n"
                    f"print(json.dumps(child({setup!r}, {url!r})))")
            out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                                 text=True, check=True)
            samples[setup].append(json.loads(out.stdout.strip().splitlines()[-1]))
    results = {setup: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
               for setup, rs in samples.items()}
    base = results["none"]
    print(f"{'set-up':8} {'hooks µs/job':>13} {'enqueue µs/job':>15} {'drain µs/job':>13}")
    for setup, r in results.items():
        print(f"{setup:8} {r['hooks_us']:13.2f} {r['enqueue_us']:15.1f} {r['drain_us']:13.1f}"
              f"   (enqueue {r['enqueue_us'] / base['enqueue_us']:.2f}x, "
              f"drain {r['drain_us'] / base['drain_us']:.2f}x)")
    print(f"one claim of 25 jobs: {base['claim_25_ms']:.2f} ms "
          f"({base['claim_25_ms'] * 1e3 / 25:.0f} µs a job)")
    return results


if __name__ == "__main__":
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 5
    main(os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"), rounds)
