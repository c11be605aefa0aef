"""OpenTelemetry traces (docs/operations.md, "Traces"): the one module of rota that
knows OpenTelemetry.

With ``opentelemetry-api`` installed (``pip install 'rota[otel]'``) rota makes spans on
the tracer provider given to the :class:`rota.Queue` (default: the global one the
application configured); without it every function here is a no-op and rota runs
unchanged. With the API but no SDK configured, the spans are OpenTelemetry's no-op
spans: nothing is recorded or exported, but a trace context that came in (an incoming
request's ``traceparent``) still travels with the jobs.

What is traced:

- enqueue (``enqueue <type>``, PRODUCER): the job stores the W3C Trace Context of this
  span (``jobs.trace_context``), so the handler's span is its child;
- the claim (``claim <type>``, CLIENT): batch size, jobs returned, probe retries;
- each handler run (``process <type>``, CONSUMER): a *child* of the span that enqueued
  the job (so a request and the jobs it caused, and the jobs those caused, are one
  trace), linked to the span of the run that ran it; it ends when the job is settled,
  with its outcome;
- settles (``complete``/``fail``/``defer``/``release <type>``, CLIENT), quota spends
  (``quota spend <name>``) and give-up hooks (``give_up <type>``, a child of the job's
  enqueueing span);
- each :meth:`rota.Pipeline.run` (``rota run``): stop reason and counters.

Attributes follow OpenTelemetry's messaging semantic conventions where they fit
(``messaging.system = "rota"``, ``messaging.operation.type``,
``messaging.destination.name`` = the job type, ``messaging.message.id`` = the job id,
``messaging.batch.message_count``); what they have no name for is ``rota.*``
(docs/operations.md, "Traces", lists both and where rota departs from them).

Log records of rota's loggers carry ``trace_id`` and ``span_id`` (hex; empty outside a
span): see :class:`TraceContextFilter`.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from .redact import LOGGERS

try:
    from opentelemetry import trace as _otel
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _PROPAGATOR: TraceContextTextMapPropagator | None = TraceContextTextMapPropagator()
except ImportError:  # rota[otel] is not installed: every call here is a no-op
    _PROPAGATOR = None

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span

    from .job import Job

#: Whether ``opentelemetry-api`` could be imported (else rota makes no spans at all).
AVAILABLE = _PROPAGATOR is not None

#: ``messaging.system`` of every span rota makes.
SYSTEM = "rota"

#: The longest ``tracestate`` a job keeps: W3C Trace Context lets a carrier cut it at
#: 512 characters, and ``enqueue_jobs`` refuses longer ones from SQL callers.
MAX_TRACESTATE_BYTES = 512

P = ParamSpec("P")
R = TypeVar("R")


def _version() -> str | None:
    try:
        from importlib.metadata import version
        return version("rota")
    except Exception:  # not installed as a distribution (a source tree on sys.path)
        return None


class Enqueueing:
    """What an enqueue span hands the statement: ``trace_context``, the JSON text of
    the span's W3C Trace Context (``None`` when there is no valid trace context, and
    always without ``opentelemetry-api``), to store with the jobs."""

    __slots__ = ("span", "trace_context")

    def __init__(self, span: Span | None, trace_context: str | None) -> None:
        self.span = span
        self.trace_context = trace_context

    def sent(self, job_ids: Sequence[int], created: int | None = None) -> None:
        """Record what the statement created: the job ids (one job) or how many."""
        if self.span is None or not self.span.is_recording():
            return
        if len(job_ids) == 1:
            self.span.set_attribute("messaging.message.id", str(job_ids[0]))
        if created is not None:
            self.span.set_attribute("rota.enqueue.created", created)


_NO_ENQUEUE = Enqueueing(None, None)


class Claiming:
    """The claim span's handle: :meth:`claimed` records what the claim returned."""

    __slots__ = ("span",)

    def __init__(self, span: Span | None) -> None:
        self.span = span

    def claimed(self, jobs: int, probe_retries: int) -> None:
        if self.span is not None and self.span.is_recording():
            self.span.set_attribute("messaging.batch.message_count", jobs)
            self.span.set_attribute("rota.claim.probe_retries", probe_retries)


_NO_CLAIM = Claiming(None)


class RunTrace:
    """A run span's handle (:meth:`Tracer.run`): the span, the run's id once its row
    is written (:meth:`started`), its stop reason and counters at the end
    (:meth:`ended`)."""

    __slots__ = ("span",)

    def __init__(self, span: Span | None) -> None:
        self.span = span

    def started(self, run_id: object) -> None:
        if self.span is not None and self.span.is_recording():
            self.span.set_attribute("rota.run.id", str(run_id))

    def ended(self, stop_reason: str, counters: Mapping[str, int], error: str | None) -> None:
        if self.span is None or not self.span.is_recording():
            return
        self.span.set_attribute("rota.run.stop_reason", stop_reason)
        for name, n in counters.items():
            self.span.set_attribute(f"rota.run.{name}", n)
        if error is not None:
            self.span.set_status(_otel.Status(_otel.StatusCode.ERROR, error))


_NO_RUN = RunTrace(None)


class Tracer:
    """rota's spans on one OpenTelemetry tracer provider; every method is a no-op
    without ``opentelemetry-api``.

    Args:
        tracer_provider: an ``opentelemetry.trace.TracerProvider``, or ``None`` for the
            global one (``opentelemetry.trace.set_tracer_provider``; with the API alone,
            a no-op provider).
    """

    def __init__(self, tracer_provider: Any = None) -> None:
        self._provider = tracer_provider
        self._tracer = (_otel.get_tracer("rota", _version(), tracer_provider)
                        if AVAILABLE else None)

    def recording(self) -> bool:
        """Whether spans can be recorded: ``opentelemetry-api`` is there and the
        provider (the one given, else the global one, which an application may set
        later) is an SDK's, not the API's no-op. When not, rota makes no spans at all
        and only carries a trace context that came in (what the API's no-op spans
        would do, at a fraction of their cost: bench/tracing.py)."""
        if self._tracer is None:
            return False
        provider = self._provider if self._provider is not None else _otel.get_tracer_provider()
        return not isinstance(provider, _otel.ProxyTracerProvider | _otel.NoOpTracerProvider)

    # -- enqueue ------------------------------------------------------------------------

    @contextmanager
    def enqueue(self, job_type: str | None, count: int) -> Iterator[Enqueueing]:
        """The span of one enqueue statement (``enqueue <type>``, PRODUCER), current
        while it runs; it yields the trace context the jobs store.

        Args:
            job_type: the jobs' type, or ``None`` for a batch of several types.
            count: how many jobs the statement is given.
        """
        if not self.recording():
            context = current_trace_context()
            yield _NO_ENQUEUE if context is None else Enqueueing(None, context)
            return
        assert self._tracer is not None
        attrs: dict[str, Any] = {"messaging.system": SYSTEM,
                                 "messaging.operation.type": "send",
                                 "messaging.operation.name": "enqueue"}
        if job_type is not None:
            attrs["messaging.destination.name"] = job_type
        if count != 1:
            attrs["messaging.batch.message_count"] = count
        with self._tracer.start_as_current_span(
                f"enqueue {job_type}" if job_type is not None else "enqueue",
                kind=_otel.SpanKind.PRODUCER, attributes=attrs) as span:
            yield Enqueueing(span, current_trace_context())

    # -- claim and run --------------------------------------------------------------------

    @contextmanager
    def claim(self, job_type: str, batch_size: int) -> Iterator[Claiming]:
        """The span of one claim (``claim <type>``, CLIENT), current while it runs."""
        if not self.recording():
            yield _NO_CLAIM
            return
        assert self._tracer is not None
        with self._tracer.start_as_current_span(
                f"claim {job_type}", kind=_otel.SpanKind.CLIENT, attributes={
                    "messaging.system": SYSTEM, "messaging.operation.type": "receive",
                    "messaging.operation.name": "claim",
                    "messaging.destination.name": job_type,
                    "rota.claim.batch_size": batch_size}) as span:
            yield Claiming(span)

    @contextmanager
    def run(self, trigger: str) -> Iterator[RunTrace]:
        """The span of one :meth:`rota.Pipeline.run` (``rota run``), current while it
        runs: its claims, settles, schedules and maintenance are its children."""
        if not self.recording():
            yield _NO_RUN
            return
        assert self._tracer is not None
        with self._tracer.start_as_current_span(
                "rota run", attributes={"messaging.system": SYSTEM,
                                        "rota.run.trigger": trigger}) as span:
            yield RunTrace(span)

    # -- handlers -----------------------------------------------------------------------

    def start_process(self, job: Job, run: RunTrace, run_id: object) -> Span | None:
        """Start the span of one handler run of ``job`` (``process <type>``, CONSUMER):
        a child of the span that enqueued it (or, for a job enqueued without a trace
        context, of the current span: the run's), linked to the run's span. Not made
        current here (see :func:`current`); ended by :func:`end_process` when the job
        is settled."""
        if not self.recording():
            return _carried(job)
        assert self._tracer is not None
        attrs: dict[str, Any] = {
            "messaging.system": SYSTEM, "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": job.type,
            "messaging.message.id": str(job.id),
            "rota.job.attempt": job.attempts, "rota.run.id": str(run_id)}
        if job.group_id is not None:
            attrs["rota.job.group_id"] = job.group_id
        links = []
        if run.span is not None and run.span.get_span_context().is_valid:
            links.append(_otel.Link(run.span.get_span_context()))
        return self._tracer.start_span(
            f"process {job.type}", context=job_parent(job), kind=_otel.SpanKind.CONSUMER,
            attributes=attrs, links=links)

    # -- settles, quotas, give-up hooks ----------------------------------------------------

    @contextmanager
    def settle(self, operation: str, jobs: Sequence[Any]) -> Iterator[Span | None]:
        """The span of one settling statement (``complete``/``fail``/``defer``/
        ``release <type>``, CLIENT), current while it runs.

        Args:
            operation: ``complete``, ``fail``, ``defer`` or ``release``.
            jobs: the jobs it settles (items that are not jobs are left out of the
                attributes; the statement refuses them).
        """
        if not self.recording():
            yield None
            return
        assert self._tracer is not None
        types = {getattr(j, "type", None) for j in jobs}
        job_type = next(iter(types)) if len(types) == 1 else None
        attrs: dict[str, Any] = {"messaging.system": SYSTEM,
                                 "messaging.operation.type": "settle",
                                 "messaging.operation.name": operation,
                                 "messaging.batch.message_count": len(jobs)}
        if isinstance(job_type, str):
            attrs["messaging.destination.name"] = job_type
        if len(jobs) == 1 and isinstance(getattr(jobs[0], "id", None), int):
            attrs["messaging.message.id"] = str(jobs[0].id)
        name = f"{operation} {job_type}" if isinstance(job_type, str) else operation
        with self._tracer.start_as_current_span(
                name, kind=_otel.SpanKind.CLIENT, attributes=attrs) as span:
            yield span

    @contextmanager
    def quota_spend(self, name: str, kind: str, units: int) -> Iterator[Span | None]:
        """The span of one spend of a quota or allowance (``quota spend <name>``),
        current while it runs; :class:`~rota.quota.QuotaExhausted` is recorded on it."""
        if not self.recording():
            yield None
            return
        assert self._tracer is not None
        with self._tracer.start_as_current_span(
                f"quota spend {name}", attributes={
                    "rota.quota.name": name, "rota.quota.kind": kind,
                    "rota.quota.units": units}) as span:
            yield span

    @contextmanager
    def give_up(self, job: Job) -> Iterator[Span | None]:
        """The span of one give-up hook (``give_up <type>``): a child of the span that
        enqueued the job (docs/design.md, "Give-up hooks"), current while the hook
        runs, so what it enqueues stays in the job's trace."""
        if not self.recording():
            with current(_carried(job)):
                yield None
            return
        assert self._tracer is not None
        with self._tracer.start_as_current_span(
                f"give_up {job.type}", context=job_parent(job), attributes={
                    "messaging.system": SYSTEM, "messaging.destination.name": job.type,
                    "messaging.message.id": str(job.id),
                    "rota.job.attempt": job.attempts}) as span:
            yield span


# -- spans that outlive one block: the handler's -------------------------------------------


def current(span: Span | None) -> AbstractContextManager[Any]:
    """Make ``span`` the current span for a block (without ending it); a no-op for
    ``None``."""
    if span is None:
        return nullcontext()
    return _otel.use_span(span, end_on_exit=False, record_exception=False,
                          set_status_on_exception=False)


def end_process(span: Span | None, outcome: str, run_stopping: bool) -> None:
    """End a handler's span (:meth:`Tracer.start_process`) with the job's outcome
    (``done``, ``retry``, ``failed``, ``deferred``, ``released``, ``lost``).
    ``run_stopping``: the run had stopped claiming (its budget spent or a stop asked
    for) when the job settled, so the run's stop reason is ``time_budget`` unless it
    ends in error; recorded as ``rota.run.stop_reason``."""
    if span is None or not span.is_recording():
        return
    span.set_attribute("rota.job.outcome", outcome)
    if run_stopping:
        span.set_attribute("rota.run.stop_reason", "time_budget")
    span.end()


def record_failure(span: Span | None, error: BaseException | str) -> None:
    """Mark a handler's span failed: the exception as an event, the status ERROR."""
    if span is None or not span.is_recording():
        return
    if isinstance(error, BaseException):
        span.record_exception(error)
        text = f"{type(error).__name__}: {error}"
    else:
        text = error
    span.set_status(_otel.Status(_otel.StatusCode.ERROR, text))


def spend_traced(method: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Wrap ``JobContext.spend(quota, units=1)`` in a :meth:`Tracer.quota_spend` span
    (the units left recorded as ``rota.quota.left``)."""
    if not AVAILABLE:
        return method

    @functools.wraps(method)
    async def spend(*args: P.args, **kwargs: P.kwargs) -> R:
        ctx: Any = args[0]
        if not ctx.queue.tracer.recording():
            return await method(*args, **kwargs)
        quota = args[1] if len(args) > 1 else kwargs.get("quota")
        units = args[2] if len(args) > 2 else kwargs.get("units", 1)
        name = quota if isinstance(quota, str) else getattr(quota, "name", "?")
        kind = type(quota).__name__.lower() if not isinstance(quota, str) else "quota"
        with ctx.queue.tracer.quota_spend(str(name), kind, units) as span:
            left = await method(*args, **kwargs)
            if span is not None and span.is_recording() and isinstance(left, int):
                span.set_attribute("rota.quota.left", left)
            return left
    return spend


def settle_traced(operation: str) -> Callable[[Callable[P, Awaitable[R]]],
                                              Callable[P, Awaitable[R]]]:
    """Wrap a :class:`rota.Queue` method whose first argument is a job or jobs in a
    :meth:`Tracer.settle` span named after ``operation``; how many jobs it settled is
    recorded as ``rota.jobs.settled``."""
    def decorate(method: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        if not AVAILABLE:
            return method

        @functools.wraps(method)
        async def settle(*args: P.args, **kwargs: P.kwargs) -> R:
            queue: Any = args[0]
            if not queue.tracer.recording():
                return await method(*args, **kwargs)
            given = args[1] if len(args) > 1 else kwargs.get("job", kwargs.get("jobs"))
            jobs: list[Any]
            if isinstance(given, str | bytes | Mapping) or not isinstance(given, Iterable):
                jobs = [given]
            else:  # consumed here, so handed on as a list
                jobs = list(given)
                args = (args[0], jobs, *args[2:])  # type: ignore[assignment]
            with queue.tracer.settle(operation, jobs) as span:
                result = await method(*args, **kwargs)
                if span is not None and span.is_recording():
                    span.set_attribute("rota.jobs.settled", _settled(result))
                return result
        return settle
    return decorate


def _settled(result: object) -> int:
    """How many jobs a settling method's answer says it settled."""
    if isinstance(result, bool):
        return int(result)
    if isinstance(result, int):
        return result
    if isinstance(result, str):  # fail: retry / failed / lost
        return 0 if result == "lost" else 1
    if isinstance(result, list):
        return sum(1 for r in result if r)
    return 0


# -- propagation ----------------------------------------------------------------------------


def current_trace_context() -> str | None:
    """The current span's W3C Trace Context as the JSON text a job stores
    (``{"traceparent": ..., "tracestate": ...}``), or ``None`` when there is no valid
    one (or no ``opentelemetry-api``). A ``tracestate`` longer than
    :data:`MAX_TRACESTATE_BYTES` is left out, as W3C Trace Context allows."""
    if _PROPAGATOR is None:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    if "traceparent" not in carrier:
        return None
    if len(carrier.get("tracestate", "").encode("utf-8")) > MAX_TRACESTATE_BYTES:
        del carrier["tracestate"]
    return json.dumps({k: carrier[k] for k in ("traceparent", "tracestate") if k in carrier},
                      separators=(",", ":"))


def _carried(job: Job) -> Span | None:
    """Without recording, what stands for a job's span: a non-recording span with the
    job's stored context (so what its handler enqueues carries that context on), or
    ``None`` for a job without one."""
    parent = job_parent(job)
    if parent is None:
        return None
    return _otel.NonRecordingSpan(_otel.get_current_span(parent).get_span_context())


def job_parent(job: Job) -> Context | None:
    """The context a job's spans descend from: the one stored with it at enqueue, or
    ``None`` (the current context) when it has none that is valid."""
    carrier = getattr(job, "trace_context", None)
    if _PROPAGATOR is None or not isinstance(carrier, Mapping):
        return None
    ctx = _PROPAGATOR.extract({k: v for k, v in carrier.items()
                               if isinstance(k, str) and isinstance(v, str)})
    return ctx if _otel.get_current_span(ctx).get_span_context().is_valid else None


# -- logs -----------------------------------------------------------------------------------


class TraceContextFilter(logging.Filter):
    """Gives each record ``trace_id`` (32 hex digits) and ``span_id`` (16) of the span
    current where it was logged, both empty outside a span (and always without
    ``opentelemetry-api``). rota's own loggers have it (:func:`install`); add it to a
    handler to give every record passing through the fields, so a format string may
    name them::

        handler.addFilter(rota.tracing.TraceContextFilter())
        handler.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s [trace=%(trace_id)s span=%(span_id)s] "
            "%(message)s"))
    """

    def filter(self, record: logging.LogRecord) -> bool:
        trace_id = span_id = ""
        if AVAILABLE:
            sc = _otel.get_current_span().get_span_context()
            if sc.is_valid:
                trace_id, span_id = f"{sc.trace_id:032x}", f"{sc.span_id:016x}"
        record.trace_id = trace_id
        record.span_id = span_id
        return True


_FILTER = TraceContextFilter()


def install(names: Iterable[str] = LOGGERS) -> None:
    """Attach :class:`TraceContextFilter` to rota's loggers (once each): those
    :mod:`rota.redact` names, since a filter applies to its own logger's records only."""
    for name in names:
        if name == "rota" or name.startswith("rota."):
            logger = logging.getLogger(name)
            if _FILTER not in logger.filters:
                logger.addFilter(_FILTER)


install()

__all__ = ["AVAILABLE", "TraceContextFilter", "Tracer", "current", "current_trace_context",
           "install", "job_parent"]
