"""A worker process for tests/test_tracing.py: runs one pipeline run on a schema with
the OpenTelemetry SDK, exporting every finished span as one JSON line to a file, so the
test reads the spans of another process (the trace context crossed the database).

    python -m tests.tracing_worker DATABASE_URL SCHEMA SPANS_FILE

Stages (batches of 5): ``enrich`` (does nothing) and ``search`` (the job with payload ``{"n": 3}``
enqueues an ``enrich`` job). Prints the run's id and stop reason.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from rota import JobContext, Pipeline, Queue, Stage


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """A finished span as plain JSON: ids as hex, the parent's span id or None."""
    ctx = span.get_span_context()
    assert ctx is not None
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_id": None if span.parent is None else f"{span.parent.span_id:016x}",
        "links": [f"{link.context.trace_id:032x}/{link.context.span_id:016x}"
                  for link in span.links],
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
        "events": [e.name for e in span.events],
    }


class FileExporter(SpanExporter):
    """Appends each span as a JSON line to ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a", encoding="utf-8") as f:
            for s in spans:
                f.write(json.dumps(span_record(s)) + "\n")
        return SpanExportResult.SUCCESS


async def main(url: str, schema: str, path: str) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter(path)))

    async def search(ctx: JobContext) -> None:
        if ctx.job.payload["n"] == 3:
            await ctx.queue.enqueue("enrich", {"from": ctx.job.id}, group_id="acme")

    async def enrich(ctx: JobContext) -> None:
        pass

    async with Queue(url, schema=schema, tracer_provider=provider) as queue:
        pipeline = Pipeline(queue, [Stage("enrich", 5, handler=enrich),
                                    Stage("search", 5, handler=search)])
        result = await pipeline.run(trigger="cli")
    provider.shutdown()
    print(result.run_id, result.stop_reason, result.jobs_done)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
