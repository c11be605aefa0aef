"""Prometheus metrics: ``/metrics`` on the dashboard, and on ``rota serve --metrics``.

Each app has its own :class:`prometheus_client.CollectorRegistry` (no global state),
holding a collector that reads the database when scraped and the claim histogram:

- ``rota_jobs{type, status}`` (gauge): pending, running and failed jobs, all counted
  (so a scrape reads the pending backlog: about 0.4 s at 1,000,000 pending jobs, where
  the dashboard's pages stop counting at ``PENDING_CAP``). Done jobs are not a gauge:
  the done history is as long as its retention and counting it would read all of it
  at every scrape (280 ms at 880,000 done jobs); ``rota_jobs_completed_total`` is
  their useful form.
- ``rota_oldest_pending_age_seconds{type}`` (gauge): how long the longest-waiting due
  job of an active group has been due (0: none is due), found without reading the
  backlog (rota/fair/oldest_due.sql); a lower bound in the rare case the probe stops
  before proving it exact.
- ``rota_jobs_completed_total{type, plan}``, ``rota_jobs_failed_total{type, plan}``
  (counters): jobs that finished done, or failed for good, since this process's first
  scrape. Each scrape adds the jobs whose ``finished_at`` falls between the previous
  scrape and this one, minus :data:`SETTLE` (so a completion whose transaction commits
  a little after its statement started is still seen); failures read only the newest
  ``FAILED_PER_TYPE`` failed jobs of each type (no index on their finished_at; see
  dashboard_throughput.sql). ``plan`` is the plan of the job's group now (``none``:
  no group or no plan).
- ``rota_jobs_cost_charged_total{type, plan}`` (counter): the cost charged to the jobs
  counted in ``rota_jobs_completed_total`` (docs/design.md, "Cost": 1 a job unless
  its handler charged otherwise), what the fair claim counts.
- ``rota_runs_total{stop_reason}`` (counter): finished runs in the runs table, which
  maintenance prunes after 30 days (the count falls then: a counter reset).
- ``rota_claim_duration_seconds{type}`` (histogram): claims made through this
  process's queue (``Queue.claim_observers``): a dashboard mounted in the app that
  runs the pipeline, or ``rota serve --metrics``.
- ``rota_oldest_xmin_age_seconds``, ``rota_oldest_xmin_age_transactions`` (gauges):
  how long the oldest transaction of the database that holds a snapshot or an xid has
  been open, and how many transactions the xmin horizon lags (replication slots and
  standbys included): while either grows, vacuum removes nothing newer, and every
  queue's tables, rota's claim bookkeeping among them, fill with dead row versions
  (docs/operations.md, "Long transactions"; horizon_age.sql).
- ``rota_quota_units_used{quota}``, ``rota_quota_units_remaining{quota}``,
  ``rota_quota_units_limit{quota}`` (gauges): the shared quotas' current period.
- ``rota_rate_units_window{limit}``, ``rota_rate_units_limit{limit}``,
  ``rota_rate_period_seconds{limit}``, ``rota_rate_units_available{limit}``,
  ``rota_rate_next_free_seconds{limit}``, ``rota_rate_waiting_jobs{limit}`` (gauges),
  ``rota_rate_units_taken_total{limit}``, ``rota_rate_takes_refused_total{limit}``
  (counters): the rate limits, their keys summed (docs/design.md, "Rates").

Labels are job types, plans, stop reasons, quota and rate-limit names: a few values
each (a rate limit's keys are summed). Group
ids never become label values (one series per tenant would grow without bound).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from ..errors import ConfigError
from ..queue import Queue
from ..quota import Allowance, Quota
from ..rates import RateState, rate_states
from . import queries
from .auth import check_credential, is_loopback
from .cron import resolve_pipeline, usable_secret

log = logging.getLogger("rota.web.metrics")

#: How far behind the clock the completion counters count (see the module docstring).
SETTLE = timedelta(seconds=5)
#: Claim latency buckets (seconds): a claim costs a few milliseconds.
CLAIM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class KnownQuotas:
    """The quotas to report: given, or found on a pipeline (or a pipeline factory,
    called once, on first use)."""

    def __init__(self, quotas: Iterable[Quota | Allowance] | None, pipeline: Any) -> None:
        self._quotas = list(quotas) if quotas is not None else None
        self._pipeline = pipeline
        self._resolved = False
        #: Whether there was anything to find them in (quotas or an app given).
        self.given = quotas is not None or pipeline is not None

    async def pipeline(self) -> Any:
        """The pipeline (a factory is called once, on first use), or ``None`` when none
        was given or the factory failed (logged)."""
        if not self._resolved and self._pipeline is not None:
            try:
                self._pipeline = await resolve_pipeline(self._pipeline)
            except Exception:
                log.exception("could not build the pipeline")
                self._pipeline = None
            self._resolved = True
        return self._pipeline

    async def get(self) -> list[Quota | Allowance]:
        if self._quotas is None:
            found: list[Quota | Allowance] = []
            pipeline = await self.pipeline()
            if pipeline is not None:
                try:
                    found = queries.discover_quotas(pipeline)
                except Exception:
                    log.exception("could not find the pipeline's quotas")
            self._quotas = found
        return self._quotas


class RotaCollector(Collector):
    """Reads the database at scrape time (:meth:`refresh`, awaited by the endpoint),
    then hands prometheus_client what it read (:meth:`collect`)."""

    def __init__(self, queue: Queue, quotas: KnownQuotas, *, settle: timedelta = SETTLE
                 ) -> None:
        self.queue = queue
        self.quotas = quotas
        self.settle = settle
        self._since: datetime | None = None
        self._finished: Counter[tuple[str, str, str]] = Counter()  # (status, type, plan)
        self._charged: dict[tuple[str, str], float] = {}  # (type, plan): cost units
        self._families: list[Metric] = []

    def describe(self) -> list[Metric]:
        return []  # registering must not scrape

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)

    async def refresh(self) -> None:
        q = self.queue
        quotas = await self.quotas.get()
        async with q.connection() as conn:
            now = await queries.now(q, conn)
            types = await queries.job_types(q, conn)
            counts = await queries.status_counts(q, conn, types, cap=None)
            waiting = await queries.oldest_due(q, conn, types, groups=0)
            until = now - self.settle
            if self._since is not None and until > self._since:
                for r in await queries.finished_between(q, conn, types, self._since, until):
                    self._finished[r["status"], r["type"], r["plan"] or "none"] += r["n"]
                    if r["status"] == "done":
                        key = (r["type"], r["plan"] or "none")
                        self._charged[key] = self._charged.get(key, 0.0) + float(r["cost"])
            if self._since is None or until > self._since:
                self._since = until
            runs = await queries.runs_by_stop_reason(q, conn)
            horizon = await queries.horizon(q, conn)
            rates = await rate_states(q, limit=RATE_BUCKETS, conn=conn)
            shared, _ = await queries.quotas_today(
                q, conn, [x for x in quotas if isinstance(x, Quota)]) if any(
                    isinstance(x, Quota) for x in quotas) else ([], [])
        self._families = [*self._build(counts, waiting, runs, shared),
                          *self._horizon(horizon), *_rate_families(rates)]

    def _build(self, counts: list[queries.TypeCounts], waiting: queries.Waiting,
               runs: dict[str, int], shared: list[queries.QuotaToday]) -> list[Metric]:
        jobs = GaugeMetricFamily("rota_jobs", "Jobs by type and status (pending, running, "
                                 "failed; done jobs: rota_jobs_completed_total).",
                                 labels=["type", "status"])
        oldest = GaugeMetricFamily("rota_oldest_pending_age_seconds",
                                   "How long the longest-waiting due job of an active "
                                   "group has been due (0: none is due).", labels=["type"])
        for c in counts:
            jobs.add_metric([c.type, "pending"], c.pending)
            jobs.add_metric([c.type, "running"], c.running)
            jobs.add_metric([c.type, "failed"], c.failed)
            oldest.add_metric([c.type], max(waiting.by_type.get(c.type) or 0.0, 0.0))
        completed = CounterMetricFamily("rota_jobs_completed", "Jobs done, since this "
                                        "process's first scrape.", labels=["type", "plan"])
        failed = CounterMetricFamily("rota_jobs_failed", "Jobs failed for good (attempts "
                                     "used up, or cancelled), since this process's first "
                                     "scrape.", labels=["type", "plan"])
        for (status, job_type, plan), n in sorted(self._finished.items()):
            (completed if status == "done" else failed).add_metric([job_type, plan], n)
        charged = CounterMetricFamily("rota_jobs_cost_charged", "The cost charged to the "
                                      "jobs done (1 a job unless its handler charged "
                                      "otherwise), since this process's first scrape.",
                                      labels=["type", "plan"])
        for (job_type, plan), units in sorted(self._charged.items()):
            charged.add_metric([job_type, plan], units)
        run_family = CounterMetricFamily("rota_runs", "Finished runs by stop reason.",
                                         labels=["stop_reason"])
        for reason, n in sorted(runs.items()):
            run_family.add_metric([reason], n)
        used = GaugeMetricFamily("rota_quota_units_used", "Units of a shared quota spent "
                                 "in its current period.", labels=["quota"])
        remaining = GaugeMetricFamily("rota_quota_units_remaining", "Units of a shared "
                                      "quota left in its current period (reserve "
                                      "included).", labels=["quota"])
        limit = GaugeMetricFamily("rota_quota_units_limit", "Units a shared quota allows "
                                  "per period.", labels=["quota"])
        for qt in shared:
            used.add_metric([qt.name], qt.used)
            if qt.limit is not None and qt.remaining is not None:
                remaining.add_metric([qt.name], qt.remaining)
                limit.add_metric([qt.name], qt.limit)
        return [jobs, oldest, completed, failed, charged, run_family, used, remaining, limit]


    @staticmethod
    def _horizon(horizon: queries.Horizon) -> list[Metric]:
        seconds = GaugeMetricFamily(
            "rota_oldest_xmin_age_seconds", "How long the database's oldest transaction "
            "holding a snapshot or an xid has been open (0: none): vacuum removes no row "
            "version newer than it.", value=horizon.seconds)
        xids = GaugeMetricFamily(
            "rota_oldest_xmin_age_transactions", "How many transactions the xmin horizon "
            "lags (sessions, standbys' feedback, replication slots).",
            value=horizon.transactions)
        return [seconds, xids]


#: Buckets read per scrape for the rate gauges (a keyed limit may have many keys).
RATE_BUCKETS = 1000


def _rate_families(states: list[RateState]) -> list[Metric]:
    """The rate-limit gauges, one series per limit (its keys summed, so an owner-keyed
    limit stays one series; docs/design.md, "Rates")."""
    window = GaugeMetricFamily("rota_rate_units_window", "Units of a rate limit taken in "
                               "its current window of `per` (all keys).", labels=["limit"])
    limit = GaugeMetricFamily("rota_rate_units_limit", "Units a rate limit allows per "
                              "period, per key.", labels=["limit"])
    period = GaugeMetricFamily("rota_rate_period_seconds", "A rate limit's period.",
                               labels=["limit"])
    available = GaugeMetricFamily("rota_rate_units_available", "Units a take could have "
                                  "now, in the emptiest bucket of the limit (negative: "
                                  "owed after the fact or backing off).", labels=["limit"])
    next_free = GaugeMetricFamily("rota_rate_next_free_seconds", "Seconds until the next "
                                  "unit is there, in the emptiest bucket (0: now).",
                                  labels=["limit"])
    waiting = GaugeMetricFamily("rota_rate_waiting_jobs", "Jobs deferred for a rate "
                                "limit's units and not due yet.", labels=["limit"])
    taken = CounterMetricFamily("rota_rate_units_taken", "Units of a rate limit ever "
                                "taken (all keys).", labels=["limit"])
    refused = CounterMetricFamily("rota_rate_takes_refused", "Takes of a rate limit "
                                  "refused (the job was deferred).", labels=["limit"])
    by_name: dict[str, list[RateState]] = {}
    for st in states:
        by_name.setdefault(st.name, []).append(st)
    for name, group in sorted(by_name.items()):
        window.add_metric([name], sum(s.window_units for s in group))
        limit.add_metric([name], group[0].limit)
        period.add_metric([name], group[0].per_s)
        available.add_metric([name], min(s.available for s in group))
        next_free.add_metric([name], max((s.next_free - s.now).total_seconds()
                                         for s in group))
        waiting.add_metric([name], sum(s.waiting for s in group))
        taken.add_metric([name], sum(s.taken for s in group))
        refused.add_metric([name], sum(s.refused for s in group))
    return [window, limit, period, available, next_free, waiting, taken, refused]


class MetricsEndpoint:
    """``GET /metrics`` for one app: its registry, its collector, its claim histogram
    (fed by the queue's claims until :meth:`close`).

    Args:
        queue: the queue to read, and whose claims to time.
        quotas: the quotas and allowances to report (None: found on ``pipeline``).
        pipeline: a pipeline or pipeline factory to find the quotas on.
        secret: when ``guard`` is set, the credential each scrape needs (see
            :func:`rota.web.auth.check_credential`); None: scrapes are answered only
            on a loopback address.
        guard: check the credential here (``rota serve``); the dashboard checks it for
            every path before this endpoint is reached.
    """

    def __init__(self, queue: Queue, quotas: Iterable[Quota | Allowance] | None = None, *,
                 pipeline: Any = None, secret: str | None = None,
                 guard: bool = False) -> None:
        self.queue = queue
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = RotaCollector(queue, KnownQuotas(quotas, pipeline))
        self.registry.register(self.collector)
        self.claims = Histogram("rota_claim_duration_seconds",
                                "Time one claim took (rota.Queue.claim), by job type.",
                                ["type"], registry=self.registry, buckets=CLAIM_BUCKETS)
        self.secret = usable_secret(secret)
        self.guard = guard
        self._lock = asyncio.Lock()
        queue.claim_observers.append(self._observe_claim)

    def _observe_claim(self, job_type: str, seconds: float) -> None:
        self.claims.labels(job_type).observe(seconds)

    def close(self) -> None:
        """Stop timing the queue's claims."""
        if self._observe_claim in self.queue.claim_observers:
            self.queue.claim_observers.remove(self._observe_claim)

    async def render(self) -> bytes:
        """Read the database and return the text exposition format."""
        async with self._lock:  # one scrape at a time: the counters advance in order
            await self.collector.refresh()
            return generate_latest(self.registry)

    async def endpoint(self, request: Request) -> Response:
        if self.guard:
            values = request.headers.getlist("authorization")
            if self.secret is None:
                server = request.scope.get("server")
                if not (server and is_loopback(str(server[0]))) or len(values) > 1:
                    return PlainTextResponse("forbidden", status_code=403)
            else:
                verdict = check_credential(values, self.secret)
                if verdict == "ambiguous":
                    return PlainTextResponse("exactly one Authorization header",
                                             status_code=400)
                if verdict != "ok":
                    return PlainTextResponse("unauthorized", status_code=401, headers={
                        "WWW-Authenticate": 'Bearer realm="rota metrics"'})
        return Response(await self.render(), media_type=CONTENT_TYPE_LATEST)


def mount_metrics(app: Starlette, queue: Queue, *, pipeline: Any = None,
                  secret: str | None, host: str) -> MetricsEndpoint:
    """Add ``GET /metrics`` to ``app`` (the cron app of ``rota serve --metrics``).

    Args:
        secret: the credential scrapes need (``ROTA_DASHBOARD_SECRET``).
        host: the address the server binds: without a secret, only a loopback one.

    Raises:
        ConfigError: no usable secret and ``host`` is not a loopback address.
    """
    if usable_secret(secret) is None and not is_loopback(host):
        raise ConfigError("--metrics needs ROTA_DASHBOARD_SECRET (the credential a scrape "
                          "sends) unless the server binds a loopback address")
    metrics = MetricsEndpoint(queue, pipeline=pipeline, secret=secret, guard=True)
    app.router.routes.append(Route("/metrics", metrics.endpoint, methods=["GET"]))
    return metrics


__all__ = ["CLAIM_BUCKETS", "SETTLE", "KnownQuotas", "MetricsEndpoint", "RotaCollector",
           "mount_metrics"]
