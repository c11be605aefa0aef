"""Traces (docs/operations.md, "Traces"): a request's trace goes on into the jobs it
enqueued, through the database and another process, and into the jobs those enqueue;
handler spans carry their outcomes; rota's logs carry the trace; and without
OpenTelemetry (or with the API but no SDK) the same code runs and exports nothing."""

from __future__ import annotations

import ast
import json
import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from psycopg import sql
from psycopg.types.json import Jsonb

from rota import JobContext, Pipeline, Queue, Stage, SyncQueue
from rota.db import migrations
from rota.fair import FairClaim
from tests.catalog import snapshot
from tests.tracing_worker import span_record

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    yield InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    """The test's own tracer provider (none is set globally), exporting to memory."""
    p = TracerProvider()
    p.add_span_processor(SimpleSpanProcessor(exporter))
    yield p
    p.shutdown()


@pytest.fixture
async def traced_queue(make_queue: Any, provider: TracerProvider) -> Queue:
    q: Queue = await make_queue(tracer_provider=provider)
    return q


def records(exporter: InMemorySpanExporter) -> list[dict[str, Any]]:
    return [span_record(s) for s in exporter.get_finished_spans()]


def one(spans: list[dict[str, Any]], name: str, **attrs: Any) -> dict[str, Any]:
    """The one span called ``name`` whose attributes include ``attrs``."""
    found = [s for s in spans if s["name"] == name
             and all(s["attributes"].get(k) == v for k, v in attrs.items())]
    assert len(found) == 1, (name, attrs, found)
    return found[0]


def worker(database_url: str, schema: str, spans_file: Path) -> list[str]:
    """Run tests/tracing_worker.py's pipeline once in another process."""
    out = subprocess.run(
        [sys.executable, "-m", "tests.tracing_worker", database_url, schema,
         str(spans_file)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


# -- one trace from the request to the last job ------------------------------------------


async def test_a_request_and_every_job_it_causes_are_one_trace(
    traced_queue: Queue, provider: TracerProvider, exporter: InMemorySpanExporter,
    database_url: str, tmp_path: Path
) -> None:
    """A request-like span enqueues three jobs; a worker process runs them, and the
    third one's handler enqueues a fourth: the request, the three enqueues, the four
    handler runs and the enqueue between them form one trace, each span the child of
    the one that caused it."""
    queue = traced_queue
    await queue.upsert_group("acme", plan=None)
    tracer = provider.get_tracer("app")
    with tracer.start_as_current_span("POST /campaigns") as request:
        ids = [(await queue.enqueue("search", {"n": n}, group_id="acme")).id  # type: ignore[union-attr]
               for n in (1, 2, 3)]
    trace_id = f"{request.get_span_context().trace_id:032x}"
    flags = f"{request.get_span_context().trace_flags:02x}"  # sampled (and random)
    here = records(exporter)
    req = one(here, "POST /campaigns")
    enqueues = [one(here, "enqueue search", **{"messaging.message.id": str(i)}) for i in ids]
    assert [(s["trace_id"], s["parent_id"], s["kind"]) for s in enqueues] == [
        (trace_id, req["span_id"], "PRODUCER")] * 3
    assert enqueues[0]["attributes"] == {
        "messaging.system": "rota", "messaging.operation.type": "send",
        "messaging.operation.name": "enqueue", "messaging.destination.name": "search",
        "messaging.message.id": str(ids[0]), "rota.enqueue.created": 1}
    stored = [(await queue.get_job(i)).trace_context for i in ids]  # type: ignore[union-attr]
    assert stored == [{"traceparent": f"00-{trace_id}-{s['span_id']}-{flags}"}
                      for s in enqueues]

    spans_file = tmp_path / "spans.jsonl"
    run_id, stop_reason, done = worker(database_url, queue.schema, spans_file)
    assert (stop_reason, done) == ("no_work", "4")
    there = [json.loads(line) for line in spans_file.read_text().splitlines()]

    run = one(there, "rota run")
    assert run["parent_id"] is None and run["trace_id"] != trace_id
    assert run["attributes"] == {
        "messaging.system": "rota", "rota.run.trigger": "cli", "rota.run.id": run_id,
        "rota.run.stop_reason": "no_work", "rota.run.jobs_done": 4,
        "rota.run.jobs_failed": 0, "rota.run.jobs_deferred": 0, "rota.run.quota_units": 0}
    searches = [one(there, "process search", **{"messaging.message.id": str(i)})
                for i in ids]
    for s, enq, i in zip(searches, enqueues, ids, strict=True):
        assert (s["trace_id"], s["parent_id"], s["kind"], s["status"]) == (
            trace_id, enq["span_id"], "CONSUMER", "UNSET")
        assert s["links"] == [f"{run['trace_id']}/{run['span_id']}"]
        assert s["attributes"] == {
            "messaging.system": "rota", "messaging.operation.type": "process",
            "messaging.operation.name": "process", "messaging.destination.name": "search",
            "messaging.message.id": str(i), "rota.job.attempt": 1, "rota.run.id": run_id,
            "rota.job.group_id": "acme", "rota.job.outcome": "done"}
    fourth = one(there, "enqueue enrich")
    assert (fourth["trace_id"], fourth["parent_id"]) == (trace_id, searches[2]["span_id"])
    enrich = one(there, "process enrich")
    assert (enrich["trace_id"], enrich["parent_id"]) == (trace_id, fourth["span_id"])
    assert enrich["attributes"]["messaging.message.id"] == \
        fourth["attributes"]["messaging.message.id"]
    assert enrich["attributes"]["rota.job.outcome"] == "done"

    # The trace holds exactly these spans; the run's own work is in the run's trace.
    in_trace = sorted(s["name"] for s in here + there if s["trace_id"] == trace_id)
    assert in_trace == sorted(["POST /campaigns", *["enqueue search"] * 3,
                               *["process search"] * 3, "enqueue enrich", "process enrich"])
    in_run = [s for s in there if s["trace_id"] == run["trace_id"] and s is not run]
    assert {s["parent_id"] for s in in_run} == {run["span_id"]}
    claims = [s for s in in_run if s["name"].startswith("claim ")]
    assert sorted((s["name"], s["attributes"]["messaging.batch.message_count"])
                  for s in claims if s["attributes"]["messaging.batch.message_count"]) == [
        ("claim enrich", 1), ("claim search", 3)]
    for c in claims:
        assert c["kind"] == "CLIENT"
        assert c["attributes"]["messaging.operation.type"] == "receive"
        assert c["attributes"]["rota.claim.batch_size"] == 5  # the stages' batch
    # Each group is probed as deep as the order takes from it (docs/fast-claim.md): the
    # claim of 3 jobs of one group read them at once.
    assert sorted((s["name"], s["attributes"]["rota.claim.probe_retries"]) for s in claims
                  if s["attributes"]["messaging.batch.message_count"]) == [
        ("claim enrich", 0), ("claim search", 0)]
    completes = [s for s in in_run if s["name"].startswith("complete ")]
    assert sum(s["attributes"]["rota.jobs.settled"] for s in completes) == 4
    assert {s["attributes"]["messaging.operation.type"] for s in completes} == {"settle"}


# -- outcomes ---------------------------------------------------------------------------


async def test_a_claim_span_counts_the_claims_reads_again(
    traced_queue: Queue, exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim whose probe could not prove its batch reads again; its span says how many
    times (rota.claim.probe_retries), exactly as the claim counted them. The probe starts
    at one group and one job a group here, so the claim of 6 over 3 groups must read
    further."""
    monkeypatch.setattr(FairClaim, "probe_floor", (1, 1))
    queue = traced_queue
    for g in ("a", "b", "c"):
        await queue.upsert_group(g, plan=None)
        await queue.enqueue_many([{"type": "t", "payload": {}, "group_id": g}] * 2)
    exporter.clear()
    claimed = await queue.claim("t", 6)
    assert len(claimed) == 6
    retries = queue.fair_claim.retries["t"]
    assert retries > 0
    span = one(records(exporter), "claim t")
    assert span["attributes"]["rota.claim.probe_retries"] == retries
    assert span["attributes"]["messaging.batch.message_count"] == 6


async def test_a_failed_then_retried_job_has_two_handler_spans_retry_then_done(
    traced_queue: Queue, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    queue = traced_queue
    calls = 0

    async def flaky(ctx: JobContext) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("the API hung up")

    pipeline = Pipeline(queue, [Stage("fetch", handler=flaky)])
    with provider.get_tracer("app").start_as_current_span("request"):
        job = await queue.enqueue("fetch", {})
    assert job is not None
    first = await pipeline.run(trigger="manual")
    queue.clock_offset += timedelta(hours=1)  # past the backoff
    second = await pipeline.run(trigger="manual")
    assert (first.summary, second.jobs_done) == ({"retries": 1}, 1)

    spans = records(exporter)
    enqueue = one(spans, "enqueue fetch")
    handled = [s for s in spans if s["name"] == "process fetch"]
    assert [(s["trace_id"], s["parent_id"]) for s in handled] == [
        (enqueue["trace_id"], enqueue["span_id"])] * 2
    assert [(s["attributes"]["rota.job.attempt"], s["attributes"]["rota.job.outcome"],
             s["status"], s["events"]) for s in handled] == [
        (1, "retry", "ERROR", ["exception"]), (2, "done", "UNSET", [])]
    assert [s["attributes"]["rota.run.id"] for s in handled] == [
        str(first.run_id), str(second.run_id)]
    # The failure's settle is the handler's child, in the job's trace.
    fail = one(spans, "fail fetch")
    assert (fail["parent_id"], fail["attributes"]["rota.jobs.settled"],
            fail["attributes"]["messaging.message.id"]) == (
        handled[0]["span_id"], 1, str(job.id))


async def test_deferred_and_given_up_jobs_and_quota_spends_are_traced(
    traced_queue: Queue, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    """A deferral is an outcome, not an error; the give-up hook runs in the job's trace;
    a quota spend is a span of the handler's."""
    from rota import DeferJob, Job, Quota
    queue = traced_queue
    quota = Quota("api", daily_units=10)
    hooks: list[str] = []

    async def later(ctx: JobContext) -> None:
        await ctx.spend("api", 2)
        raise DeferJob(await ctx.queue.now() + timedelta(hours=2))

    async def boom(ctx: JobContext) -> None:
        raise ValueError("no")

    async def refund(job: Job, conn: Any) -> None:
        hooks.append(f"{trace.get_current_span().get_span_context().trace_id:032x}")

    pipeline = Pipeline(queue, [Stage("later", handler=later, quota=quota),
                                Stage("boom", handler=boom, max_attempts=1,
                                      on_give_up=refund)])
    with provider.get_tracer("app").start_as_current_span("request") as request:
        await queue.enqueue("later", {})
        await pipeline.queue.enqueue("boom", {})  # the stage's max_attempts, 1
    trace_id = f"{request.get_span_context().trace_id:032x}"
    result = await pipeline.run(trigger="manual")
    assert (result.jobs_deferred, result.jobs_failed) == (1, 1)

    spans = records(exporter)
    deferred = one(spans, "process later")
    assert (deferred["attributes"]["rota.job.outcome"], deferred["status"]) == (
        "deferred", "UNSET")
    spend = one(spans, "quota spend api")
    assert (spend["parent_id"], spend["attributes"]) == (deferred["span_id"], {
        "rota.quota.name": "api", "rota.quota.kind": "quota", "rota.quota.units": 2,
        "rota.quota.left": 8})
    failed = one(spans, "process boom")
    assert (failed["attributes"]["rota.job.outcome"], failed["status"]) == (
        "failed", "ERROR")
    give_up = one(spans, "give_up boom")
    enqueue_boom = one(spans, "enqueue boom")
    assert (give_up["trace_id"], give_up["parent_id"]) == (trace_id, enqueue_boom["span_id"])
    assert hooks == [trace_id]


# -- enqueue paths ------------------------------------------------------------------------


async def test_enqueue_many_and_sync_enqueue_carry_the_trace(
    traced_queue: Queue, exporter: InMemorySpanExporter, provider: TracerProvider,
    database_url: str
) -> None:
    queue = traced_queue
    sync = SyncQueue(schema=queue.schema, tracer_provider=provider)
    with provider.get_tracer("app").start_as_current_span("request") as request:
        assert await queue.enqueue_many([{"type": "a", "payload": i} for i in range(3)]) == 3
        with psycopg.connect(database_url) as conn:
            job = sync.enqueue(conn, "b", {})
    assert job is not None
    trace_id = f"{request.get_span_context().trace_id:032x}"
    flags = f"{request.get_span_context().trace_flags:02x}"
    spans = records(exporter)
    batch, single = one(spans, "enqueue a"), one(spans, "enqueue b")
    assert batch["attributes"]["messaging.batch.message_count"] == 3
    assert batch["attributes"]["rota.enqueue.created"] == 3
    assert single["attributes"]["messaging.message.id"] == str(job.id)
    jobs = (await queue.list_jobs()).jobs
    contexts = sorted((j.type, json.dumps(j.trace_context)) for j in jobs)
    assert contexts == sorted(
        [("a", json.dumps({"traceparent": f"00-{trace_id}-{batch['span_id']}-{flags}"}))] * 3
        + [("b", json.dumps({"traceparent": f"00-{trace_id}-{single['span_id']}-{flags}"}))])


async def test_a_job_enqueued_from_sql_with_a_trace_context_continues_it(
    traced_queue: Queue, exporter: InMemorySpanExporter, database_url: str
) -> None:
    queue = traced_queue
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    carrier = {"traceparent": parent, "tracestate": "vendor=1"}
    with psycopg.connect(database_url, autocommit=True) as conn:
        s = sql.Identifier(queue.schema)
        conn.execute(sql.SQL("SELECT {}.enqueue('x', '{{}}', trace_context => %s)").format(s),
                     [Jsonb(carrier)])
        conn.execute(sql.SQL("SELECT {}.enqueue_many(%s)").format(s),
                     [Jsonb([{"type": "x", "payload": 1, "trace_context": carrier},
                             {"type": "x", "payload": 2, "trace_context": None}])])
        conn.execute(sql.SQL("SELECT {}.enqueue('x', '3')").format(s))  # as before 009
    await Pipeline(queue, [Stage("x", handler=_noop)]).run(trigger="manual")
    spans = [s for s in records(exporter) if s["name"] == "process x"]
    run = one(records(exporter), "rota run")
    # Two continue the caller's trace; the jobs without a context run in the run's.
    assert sorted((s["trace_id"], s["parent_id"]) for s in spans) == sorted(
        [("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")] * 2
        + [(run["trace_id"], run["span_id"])] * 2)


async def _noop(ctx: JobContext) -> None:
    pass


@pytest.mark.parametrize(("context", "shown"), [
    ('"00-abc"', '"00-abc"'),
    ('{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333-01"}',
     '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333-01"}'),
    ('{"traceparent": 5}', '{"traceparent": 5}'),
    ('{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "x": "1"}',
     '{"x": "1", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'),
    # traceparent is required (docs/enqueue-from-sql.md): both were accepted once.
    ('{}', '{}'),
    ('{"tracestate": "a=b"}', '{"tracestate": "a=b"}'),
    ('{"traceparent": null}', '{"traceparent": null}'),
], ids=["not-an-object", "short-parent-id", "not-text", "unknown-key", "empty",
        "tracestate-only", "null-traceparent"])
async def test_sql_enqueue_refuses_a_trace_context_that_is_not_one(
    queue: Queue, database_url: str, context: str, shown: str
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as exc:
            conn.execute(sql.SQL("SELECT {}.enqueue('x', '{{}}', trace_context => %s::jsonb)")
                         .format(sql.Identifier(queue.schema)), [context])
        assert exc.value.diag.column_name == "trace_context"
        assert exc.value.diag.message_primary == (
            'trace_context must be a W3C Trace Context object {"traceparent": "00-<32 hex '
            'trace id>-<16 hex parent id>-<2 hex flags>"[, "tracestate": "<at most 512 '
            f'bytes>"]}}, got {shown}')
        count = sql.SQL("SELECT count(*) FROM {}").format(queue.table("jobs"))
        assert conn.execute(count).fetchone() == (0,)


def test_upgrading_to_009_keeps_the_roles_granted_enqueue(
    database_url: str, schema: str, enqueue_only_role: Any
) -> None:
    """enqueue gains an argument (a new function): the roles granted EXECUTE on the old
    one may call the new one, and PUBLIC still may not."""
    ident = sql.Identifier(schema)
    with psycopg.connect(database_url, autocommit=True) as conn:
        with conn.transaction():
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(ident))
            for m in migrations():
                if m.version == 9:
                    break
                conn.execute(m.text.format(schema=ident.as_string(conn)).encode())
            conn.execute(sql.SQL("UPDATE {}.enqueue_settings SET types = NULL").format(ident))
        role = enqueue_only_role(schema, grants=(
            "GRANT USAGE ON SCHEMA {schema} TO {role}",
            "GRANT EXECUTE ON FUNCTION {schema}.enqueue(text, jsonb, text, text, "
            "timestamptz, integer) TO {role}"))
        [m9] = [m for m in migrations() if m.version == 9]
        conn.execute(m9.text.format(schema=ident.as_string(conn)).encode())
        acl = snapshot(conn, schema)["function"][
            "enqueue(type text, payload jsonb, group_id text, dedupe_key text, run_after "
            "timestamp with time zone, max_attempts integer, trace_context jsonb)"]
        owner = conn.execute("SELECT current_user").fetchone()[0]  # type: ignore[index]
        assert acl.endswith(f"-- acl {{{owner}=X/{owner},{role}=X/{owner}}}"), acl
        with conn.transaction():
            conn.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(role)))
            row = conn.execute(sql.SQL("SELECT {}.enqueue('t', '{{}}')").format(ident))
            assert row.fetchone() is not None


# -- logs -----------------------------------------------------------------------------------


async def test_rotas_log_records_carry_the_span_they_were_logged_in(
    traced_queue: Queue, exporter: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    async def boom(ctx: JobContext) -> None:
        raise ValueError("nope")

    caplog.set_level(logging.INFO, logger="rota")
    await traced_queue.enqueue("boom", {})
    await Pipeline(traced_queue, [Stage("boom", handler=boom)]).run(trigger="manual")
    spans = records(exporter)
    handler, run = one(spans, "process boom"), one(spans, "rota run")
    by_message = {r.getMessage().split(":")[0]: r for r in caplog.records}
    raised = next(r for m, r in by_message.items() if m.endswith("raised ValueError"))
    stopped = next(r for m, r in by_message.items() if " stopped no_work" in m)
    assert (raised.trace_id, raised.span_id) == (handler["trace_id"], handler["span_id"])  # type: ignore[attr-defined]
    assert (stopped.trace_id, stopped.span_id) == (run["trace_id"], run["span_id"])  # type: ignore[attr-defined]
    # Formatted as docs/operations.md shows, outside a span too.
    formatter = logging.Formatter("%(name)s [trace=%(trace_id)s span=%(span_id)s] %(message)s")
    assert formatter.format(stopped).startswith(
        f"rota.runner [trace={run['trace_id']} span={run['span_id']}] run ")
    logging.getLogger("rota.queue").info("outside")
    assert formatter.format(caplog.records[-1]) == "rota.queue [trace= span=] outside"


def test_every_rota_logger_carries_trace_ids() -> None:
    """Each logger rota's modules make is one of rota.redact.LOGGERS, which carry the
    trace filter (and the redacting one)."""
    import importlib
    import pkgutil

    import rota
    from rota.tracing import TraceContextFilter
    for m in pkgutil.walk_packages(rota.__path__, "rota."):
        if m.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(m.name)
        except ModuleNotFoundError as exc:  # an extra not installed here (Django)
            assert exc.name is not None and not exc.name.startswith("rota"), exc
    names = [n for n, lg in logging.Logger.manager.loggerDict.items()
             if n.startswith("rota.") and isinstance(lg, logging.Logger)]
    assert "rota.queue" in names and "rota.runner" in names
    missing = [n for n in names if not any(isinstance(f, TraceContextFilter)
                                           for f in logging.getLogger(n).filters)]
    assert missing == []


# -- without OpenTelemetry ----------------------------------------------------------------

_SAME_CODE = """
import asyncio, sys
{block}
from rota import JobContext, Pipeline, Queue, Stage, tracing

async def main(url, schema):
    async def search(ctx: JobContext) -> None:
        if ctx.job.payload["n"] == 3:
            await ctx.queue.enqueue("enrich", {{}})
        assert ctx.span is None or not ctx.span.is_recording()

    async def enrich(ctx: JobContext) -> None:
        pass

    async with Queue(url, schema=schema) as queue:
        await queue.migrate()
        {enqueue}
        result = await Pipeline(queue, [Stage("enrich", handler=enrich),
                                        Stage("search", handler=search)]).run()
        jobs = sorted((j.id, j.trace_context) for j in (await queue.list_jobs()).jobs)
    print(tracing.AVAILABLE, result.stop_reason, result.jobs_done, jobs)

asyncio.run(main(*sys.argv[1:3]))
"""


def run_without(block: str, enqueue: str, database_url: str, schema: str) -> str:
    code = _SAME_CODE.format(block=block, enqueue=enqueue)
    out = subprocess.run([sys.executable, "-c", code, database_url, schema], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "opentelemetry" not in out.stderr.lower()
    return out.stdout.strip()


def test_without_opentelemetry_the_same_code_runs_and_traces_nothing(
    database_url: str, schema: str
) -> None:
    out = run_without('sys.modules["opentelemetry"] = None', textwrap.dedent("""\
        for n in (1, 2, 3):
                    await queue.enqueue("search", {"n": n})"""), database_url, schema)
    assert out == ("False no_work 4 [(1, None), (2, None), (3, None), (4, None)]")


def test_with_the_api_and_no_sdk_nothing_is_recorded_but_a_context_still_travels(
    database_url: str, schema: str
) -> None:
    """No SDK (its import blocked): the spans are no-ops, nothing exported; a trace
    context that came in (a request's traceparent header) is what the jobs carry."""
    incoming = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    block = textwrap.dedent("""\
        sys.modules["opentelemetry.sdk"] = None
        from opentelemetry import context, trace
        from opentelemetry.trace.propagation.tracecontext import (
            TraceContextTextMapPropagator)
        """)
    enqueue = textwrap.dedent(f"""\
        token = context.attach(TraceContextTextMapPropagator().extract(
                    {{"traceparent": "{incoming}"}}))
                for n in (1, 2, 3):
                    await queue.enqueue("search", {{"n": n}})
                context.detach(token)
                assert not trace.get_current_span().is_recording()""")
    out = run_without(block, enqueue, database_url, schema)
    carried = {"traceparent": incoming}
    assert out == (f"True no_work 4 [(1, {carried}), (2, {carried}), (3, {carried}), "
                   f"(4, {carried})]")


def test_the_propagator_is_w3c_trace_context() -> None:
    """What a job stores is what any W3C Trace Context library reads."""
    from rota import tracing
    provider = TracerProvider()
    with provider.get_tracer("t").start_as_current_span("s") as span:
        stored = tracing.current_trace_context()
    assert stored is not None
    ctx = TraceContextTextMapPropagator().extract(json.loads(stored))
    assert trace.get_current_span(ctx).get_span_context().span_id == \
        span.get_span_context().span_id


def test_a_global_provider_set_after_the_queue_is_made_is_used(
    database_url: str, schema: str
) -> None:
    """What docs/operations.md shows: the application sets the global provider once,
    wherever it starts; queues made before it trace from then on."""
    block = textwrap.dedent("""\
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
            InMemorySpanExporter)
        exporter = InMemorySpanExporter()
        """)
    enqueue = textwrap.dedent("""\
        await queue.enqueue("search", {"n": 1})  # before: no span, no context
                provider = TracerProvider()
                provider.add_span_processor(SimpleSpanProcessor(exporter))
                trace.set_tracer_provider(provider)
                with trace.get_tracer("app").start_as_current_span("request"):
                    await queue.enqueue("search", {"n": 3})""")
    code = _SAME_CODE.format(block=block, enqueue=enqueue).replace(
        "print(tracing.AVAILABLE,",
        "print(sorted(s.name for s in exporter.get_finished_spans()),").replace(
        "assert ctx.span is None or not ctx.span.is_recording()",
        "assert ctx.span is None or ctx.span.is_recording()")
    out = subprocess.run([sys.executable, "-c", code, database_url, schema], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    names, rest = out.stdout.strip().split("] ", 1)
    # Claims and group commits depend on the runner's batch sizes: left out here.
    assert [n for n in ast.literal_eval(names + "]")
            if not n.startswith(("claim ", "complete "))] == [
        "enqueue enrich", "enqueue search", "process enrich", "process search",
        "process search", "request", "rota run"]
    assert rest.startswith("no_work 3 [(1, None), (2, {'traceparent': '00-")
