"""The web dashboard: an ASGI app (Starlette) to mount in your own app or serve with
``rota dashboard``.

Pages: ``/`` jobs by type and status, done and failed per minute; ``/fairness`` waits
per plan, most-served, longest-waiting and paused groups; ``/runs`` the runs as a
timeline; ``/jobs`` and ``/jobs/{id}`` (Retry and Cancel); ``/quotas`` today's usage
and the rate limits; ``/metrics`` Prometheus text (:mod:`rota.web.metrics`). Pages are
Jinja2 templates (autoescaped: every value from the database is text, never markup), charts are SVG
drawn on the server, and each page refreshes its content in place every few seconds
with htmx, the one script, served from the package (``static/htmx.min.js``: htmx
4.0.1 from the npm registry, ``npm pack htmx.org``, BSD Zero Clause licence). No page
loads anything from another origin; the Content-Security-Policy says so to the browser.

Security (see :mod:`rota.web.auth`): with a secret, every request needs it, in
exactly one ``Authorization`` header; without one, the dashboard must be read-only
and answers only when served on a loopback address. Retry and Cancel are POST forms
that need the credential, a CSRF token from the page, and a same-origin request.
"""

from __future__ import annotations

import json
import logging
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import jinja2
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import admin
from ..checks import MAX_ROW_ID, require_duration
from ..cost import format_units
from ..errors import ConfigError, InvalidInput, InvalidTransition, JobNotFound
from ..queue import Queue
from ..quota import Allowance, Quota
from ..rates import rate_states
from ..runner.source import pipeline_queue
from ..store import AnyConn
from . import charts, queries
from .auth import check_credential, csrf_ok, csrf_token, is_loopback, same_origin
from .cron import usable_secret
from .metrics import KnownQuotas, MetricsEndpoint

#: Rate-limit buckets the quotas page shows at most (keyed limits may have many).
RATE_ROWS = 200

log = logging.getLogger("rota.web.dashboard")

HERE = Path(__file__).parent
NAV = (("/", "Overview"), ("/fairness", "Fairness"), ("/runs", "Runs"), ("/jobs", "Jobs"),
       ("/quotas", "Quotas"))
#: Jobs and runs per page.
PAGE_SIZE = 50
#: What a page may be asked for: longer filter values are refused, not searched.
MAX_FILTER_CHARS = 200
MAX_FORM_BYTES = 4096

# Nothing from another origin, no inline script or style; forms post only here.
_SECURITY_HEADERS = [
    (b"content-security-policy",
     b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
     b"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    (b"x-content-type-options", b"nosniff"),
    # same-origin, not no-referrer: with no-referrer a browser sends "Origin: null" on
    # the dashboard's own form posts, which the same-origin check must refuse.
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]

_ERROR_HEADINGS = {400: "Bad request", 401: "Unauthorized", 403: "Forbidden",
                   404: "Not found", 405: "Method not allowed", 413: "Too large",
                   500: "Something went wrong"}

_MESSAGES = {
    "retried": ("Job {id} is pending again, due now.", "ok"),
    "retry-refused": ("Job {id} was not retried: only a failed job can be, and not while "
                      "another open job holds its dedupe key.", "error"),
    "cancelled": ("Job {id} is cancelled (failed, 'cancelled'); its give-up hook is owed "
                  "or has run.", "ok"),
    "cancel-refused": ("Job {id} was not cancelled: only a pending job can be.", "error"),
}


class _Guard:
    """ASGI middleware: the credential rule for every request, and the security
    headers on every response."""

    def __init__(self, app: ASGIApp, secret: str | None,
                 page: Callable[..., HTMLResponse]) -> None:
        self.app = app
        self.secret = secret
        self.page = page

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_SECURITY_HEADERS]
            await send(message)

        refusal = self._refusal(scope)
        if refusal is not None:
            refusal = self.page(scope, refusal.status_code, bytes(refusal.body).decode(),
                                headers=dict(refusal.headers))
            await refusal(scope, receive, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)

    def _refusal(self, scope: Scope) -> Response | None:
        values = [v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"]
        if self.secret is None:
            server = scope.get("server")
            if not (server and is_loopback(str(server[0]))):
                return PlainTextResponse("the dashboard has no secret: it answers only on "
                                         "a loopback address", status_code=403)
            if len(values) > 1:
                return PlainTextResponse("one Authorization header at most",
                                         status_code=400)
            return None
        verdict = check_credential(values, self.secret)
        if verdict == "ok":
            return None
        if verdict == "ambiguous":
            log.info("dashboard request refused: more than one Authorization header")
            return PlainTextResponse("exactly one Authorization header", status_code=400)
        log.info("dashboard request refused: %s credential", verdict)
        return PlainTextResponse("unauthorized", status_code=401, headers={
            "WWW-Authenticate": 'Basic realm="rota dashboard", charset="UTF-8"'})


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every value is text; only the templates' own markup is markup
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["dt"] = _dt
    env.filters["num"] = _num
    env.filters["units"] = format_units
    env.filters["duration"] = charts.duration
    env.filters["local"] = _local
    env.filters["counters"] = admin.summary_items
    return env


def _dt(value: datetime | None) -> str:
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _num(value: int | float | None) -> str:
    return "—" if value is None else f"{value:,}"


def _local(value: datetime, tz: str) -> str:
    return value.astimezone(ZoneInfo(tz)).strftime("%Y-%m-%d %H:%M %Z")


def _text(params: Any, name: str) -> str | None:
    """A filter's value, or ``None`` when absent or blank. Every parameter a page reads
    comes through here, so each is checked before it reaches a query: at most
    :data:`MAX_FILTER_CHARS` characters, none of them a NUL or another control
    character (PostgreSQL text cannot hold a NUL; no name rota stores holds the others).

    Raises:
        InvalidInput: the value is too long or holds a control character.
    """
    value = params.get(name)
    if value is None or not value.strip():
        return None
    if len(value) > MAX_FILTER_CHARS:
        raise InvalidInput(f"{name} is longer than {MAX_FILTER_CHARS} characters")
    if any(c < " " or c == "\x7f" for c in value):
        raise InvalidInput(f"{name} must not contain a NUL or another control character")
    return str(value).strip()


def _path_id(value: str) -> int | None:
    """A job id from a page's path (``/jobs/ID``), or ``None`` when it cannot be one
    (not digits, 0, past ``jobs.id``'s range): that page does not exist."""
    if not (value.isascii() and value.isdigit()) or len(value) > 19:
        return None
    job_id = int(value)
    return job_id if 1 <= job_id <= MAX_ROW_ID else None


def _int(params: Any, name: str) -> int | None:
    value = _text(params, name)
    if value is None:
        return None
    if not value.isascii() or not value.isdigit() or len(value) > 18 or int(value) < 1:
        raise InvalidInput(f"{name} must be a positive integer")
    return int(value)


def _uuid(params: Any, name: str) -> uuid.UUID | None:
    value = _text(params, name)
    if value is None:
        return None
    try:
        return uuid.UUID(value)
    except ValueError:
        raise InvalidInput(f"{name} must be a run id (a UUID)") from None


async def retry_or_cancel(queue: Queue, action: str, job_id: int) -> bool:
    """Retry a failed job or cancel a pending one (:func:`rota.admin.retry_job`,
    :func:`rota.admin.cancel_job`); a cancel then runs the give-up hooks the queue has
    (give the app's pipeline's queue, ``pipeline.queue``, for the app's hooks).

    Returns:
        Whether the job changed (False: not found, or not in a state the action
        applies to).
    """
    try:
        if action == "retry":
            await admin.retry_job(queue, job_id)
        else:
            await admin.cancel_job(queue, job_id)
    except (JobNotFound, InvalidTransition):
        return False
    if action == "cancel":
        await queue.run_give_up_hooks([job_id])  # the app's, on the pipeline's queue
    return True


def dashboard_app(
    queue: Queue,
    *,
    secret: str | None = None,
    read_only: bool = False,
    quotas: Iterable[Quota | Allowance] | None = None,
    pipeline: Any = None,
    refresh: timedelta = timedelta(seconds=5),
    close_queue: bool = False,
) -> Starlette:
    """Build the dashboard's ASGI app.

    Mount it in your own app (``app.mount("/rota", rota.dashboard_app(queue,
    secret=os.environ["ROTA_DASHBOARD_SECRET"]))``): links follow the mount path.

    Args:
        queue: the :class:`rota.Queue` to show (its schema, groups relation and plans).
        secret: the credential every request must carry (``Authorization: Basic`` with
            it as password, or ``Bearer``). ``None`` (or blank, or a placeholder such as
            ``"undefined"``): no credential, allowed only with ``read_only``, and then
            the app answers only when served on a loopback address.
        read_only: hide Retry and Cancel and refuse them.
        quotas: the quotas and allowances for ``/quotas`` and the quota gauges.
        pipeline: the app's :class:`rota.Pipeline` (or a factory of one, called once on
            first use): its quotas are shown when ``quotas`` is not given, and its queue
            (``pipeline.queue``: its stages' give-up hooks) runs and reports the
            give-up hooks (Cancel, a job's page); without one, ``queue``'s.
        refresh: how often pages refresh their content.
        close_queue: close the queue when the app shuts down (``rota dashboard``).

    Raises:
        ConfigError: no secret and not read-only.
        InvalidInput: ``refresh`` is not a positive timedelta.
    """
    if not isinstance(queue, Queue):
        raise InvalidInput("dashboard_app needs a rota.Queue")
    configured = usable_secret(secret)
    if configured is None and not read_only:
        raise ConfigError("the dashboard needs a secret (ROTA_DASHBOARD_SECRET) for Retry "
                          "and Cancel; without one it must be read-only, on loopback")
    refresh_s = max(int(require_duration(refresh, "refresh").total_seconds()), 1)
    known = KnownQuotas(quotas, pipeline)

    async def run_types(conn: AnyConn) -> frozenset[str] | None:
        """The types some stage runs: the app's stage types when the dashboard has the
        app, else those ``rota migrate --app`` published; ``None``: not known."""
        stages = getattr(await known.pipeline(), "stages", None)
        if stages is not None:
            return frozenset(s.type for s in stages)
        return await queries.published_types(queue, conn)

    async def app_queue() -> Queue:
        """The queue whose give-up hooks are the app's (docs/design.md, "The runner")."""
        return pipeline_queue(await known.pipeline(), queue)
    env = _environment()
    metrics = MetricsEndpoint(queue, quotas, pipeline=pipeline)

    def render(request: Request, template: str, section: str, now: datetime | None,
               status_code: int = 200, **context: Any) -> HTMLResponse:
        base = str(request.scope.get("root_path", "")).rstrip("/")
        query = request.url.query
        message, kind = "", ""
        done = request.query_params.get("done")
        if done in _MESSAGES and "id" in context.get("job", {}):
            text, kind = _MESSAGES[done]
            message = text.format(id=context["job"]["id"])
        html = env.get_template(template).render(
            base=base, nav=NAV, section=section, now=now, read_only=read_only,
            queue_schema=queue.schema, refresh_s=refresh_s, message=message,
            message_kind=kind,
            refresh_url=f"{base}{request.url.path.removeprefix(base)}"
                        + (f"?{query}" if query else ""),
            plan_name=_plan_name, **context)
        return HTMLResponse(html, status_code=status_code)

    def error_page(scope: Scope, status_code: int, detail: str, *, section: str = "",
                   now: datetime | None = None, heading: str | None = None,
                   headers: dict[str, str] | None = None) -> HTMLResponse:
        """Every error the dashboard answers, as a page in its own style (no traceback,
        no bare "Not Found"); the status line names it unless ``heading`` does."""
        heading = heading or _ERROR_HEADINGS.get(status_code, "Error")
        base = str(scope.get("root_path", "")).rstrip("/")
        html = env.get_template("error.html").render(
            base=base, nav=NAV, section=section, now=now, read_only=read_only,
            queue_schema=queue.schema, refresh_s=refresh_s, message="", message_kind="",
            refresh_url="", title=heading, heading=heading, detail=detail,
            plan_name=_plan_name)
        kept = {k: v for k, v in (headers or {}).items()
                if k.lower() not in ("content-length", "content-type")}
        if status_code == 500:  # sent from outside the guard, which adds these to others
            kept.update({k.decode(): v.decode() for k, v in _SECURITY_HEADERS})
        return HTMLResponse(html, status_code=status_code, headers=kept)

    async def http_error(request: Request, exc: Exception) -> Response:
        """Starlette's own errors (no route: 404; a method the path does not take: 405)
        as pages."""
        assert isinstance(exc, HTTPException)
        detail = {404: f"There is no page {request.url.path}.",
                  405: f"{request.url.path} does not take {request.method}."}.get(
                      exc.status_code, str(exc.detail))
        return error_page(request.scope, exc.status_code, detail,
                          headers=dict(exc.headers or {}))

    async def server_error(request: Request, exc: Exception) -> Response:
        """An unexpected error: a page saying so, the traceback in the log only."""
        log.error("dashboard %s %s failed", request.method, request.url.path,
                  exc_info=exc)
        return error_page(request.scope, 500, "The dashboard could not answer this "
                          "request; its log says why.")

    def _plan_name(plan_id: str | None) -> str:
        if plan_id is None:
            return "none"
        return queue.plans[plan_id].name if plan_id in queue.plans else plan_id

    def page(handler: Callable[[Request], Awaitable[Response]]
             ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request)
            except InvalidInput as exc:
                return error_page(request.scope, 400, str(exc), now=await queue.now())
        return endpoint

    @page
    async def overview(request: Request) -> Response:
        async with queue.connection() as conn:
            now = await queries.now(queue, conn)
            types = await queries.job_types(queue, conn)
            counts = await queries.status_counts(queue, conn, types,
                                                 cap=queries.PENDING_CAP)
            waiting = await queries.oldest_due(queue, conn, types, groups=0)
            minutes = await queries.throughput(queue, conn, types)
            runs = await run_types(conn)
        return render(request, "overview.html", "/", now, title="Overview",
                      counts=counts, waiting=waiting,
                      unrun=[t for t in types if runs is not None and t not in runs],
                      pending_cap=queries.PENDING_CAP,
                      minutes=charts.stacked_minutes(minutes.done, minutes.failed),
                      done_total=sum(minutes.done), failed_total=sum(minutes.failed),
                      failed_capped=minutes.failed_capped,
                      failed_per_type=queries.FAILED_PER_TYPE)

    @page
    async def fairness(request: Request) -> Response:
        async with queue.connection() as conn:
            now = await queries.now(queue, conn)
            found = await queries.job_types(queue, conn)
            runs = await run_types(conn)
            # A job no stage runs waits for no claim: it says nothing of fairness, and
            # would show a group as starved that is not.
            types = [t for t in found if runs is None or t in runs]
            unrun = [t for t in found if t not in types]
            waits = await queries.plan_waits(queue, conn, types)
            served = await queries.groups_served(queue, conn, types)
            waiting = await queries.oldest_due(queue, conn, types)
            owners = await queries.owners_served(queue, conn, types,
                                                 waiting=waiting.groups)
            paused, paused_total = await queries.groups_paused(queue, conn, types)
        wait_chart = charts.grouped_bars(
            [_plan_name(w.plan) for w in waits],
            [("p50", "p50", [w.p50 for w in waits]), ("p95", "p95", [w.p95 for w in waits])])
        return render(request, "fairness.html", "/fairness", now,
                      title="Fairness", waits=waits, wait_chart=wait_chart, served=served,
                      waiting=waiting, paused=paused, paused_total=paused_total,
                      owners=owners, fair_by=queue.fair_by, unrun=unrun,
                      waits_per_type=queries.WAITS_PER_TYPE)

    @page
    async def runs(request: Request) -> Response:
        before: tuple[datetime, uuid.UUID] | None = None
        cursor = _text(request.query_params, "before")
        if cursor is not None:
            try:
                started, _, run_id = cursor.partition("~")
                before = (datetime.fromisoformat(started), uuid.UUID(run_id))
            except ValueError:
                raise InvalidInput("before must be a cursor from the runs page") from None
            if before[0].tzinfo is None:
                raise InvalidInput("before must be a cursor from the runs page")
        async with queue.connection() as conn:
            now = await queries.now(queue, conn)
            rows = await queries.runs_page(queue, conn, before=before, limit=PAGE_SIZE + 1)
        shown = rows[:PAGE_SIZE]
        base = str(request.scope.get("root_path", "")).rstrip("/")
        next_url = None
        if len(rows) > PAGE_SIZE:
            last = shown[-1]
            next_url = f"{base}/runs?" + urllib.parse.urlencode(
                {"before": f"{last['started_at'].isoformat()}~{last['id']}"})
        reasons = sorted({r["stop_reason"] or "running" for r in shown})
        return render(request, "runs.html", "/runs", now, title="Runs", runs=shown,
                      timeline=charts.timeline(shown, now), reasons=reasons,
                      next_url=next_url, first_page=before is None)

    @page
    async def run_page(request: Request) -> Response:
        try:
            run_id = uuid.UUID(request.path_params["id"])
        except ValueError:
            return error_page(request.scope, 404, f"There is no run "
                              f"{request.path_params['id']!r}: a run's id is a UUID.",
                              section="/runs", heading="No such run")
        async with queue.connection() as conn:
            now = await queries.now(queue, conn)
            row = await queries.run(queue, conn, run_id)
        if row is None:
            return render(request, "error.html", "/runs", now, 404, title="No such run",
                          heading="No such run",
                          detail=f"There is no run {run_id} (runs are kept 30 days).")
        return render(request, "run.html", "/runs", now, title=f"Run {str(run_id)[:8]}",
                      run=row)

    @page
    async def jobs(request: Request) -> Response:
        params = request.query_params
        status = _text(params, "status")
        if status is not None and status not in queries.STATUSES:
            raise InvalidInput(f"status must be one of {', '.join(queries.STATUSES)}")
        job_type, group_id, job_id = (_text(params, "type"), _text(params, "group"),
                                      _int(params, "id"))
        run_id = _uuid(params, "run")
        filters: dict[str, str | int | None] = {
            "type": job_type, "status": status, "group": group_id, "id": job_id,
            "run": None if run_id is None else str(run_id)}
        before = _int(params, "before")
        async with queue.connection() as conn:
            now = await queries.now(queue, conn)
            types = await queries.job_types(queue, conn)
            found = await queries.jobs_page(
                queue, conn, job_type=job_type, status=status, group_id=group_id,
                job_id=job_id, before=before, limit=PAGE_SIZE, run_id=run_id)
        base = str(request.scope.get("root_path", "")).rstrip("/")
        kept = {k: v for k, v in filters.items() if v is not None}

        def url(**extra: Any) -> str:
            q = urllib.parse.urlencode({**kept, **extra})
            return f"{base}/jobs" + (f"?{q}" if q else "")

        next_url = url(before=found.next_before) if found.next_before is not None else None
        return render(request, "jobs.html", "/jobs", now, title="Jobs",
                      page=found, types=types, statuses=queries.STATUSES,
                      filters=filters, filtered=bool(kept), next_url=next_url,
                      newest_url=url(), first_page=before is None)

    @page
    async def job_page(request: Request) -> Response:
        job_id = _path_id(request.path_params["id"])
        if job_id is None:
            return error_page(request.scope, 404, f"There is no job "
                              f"{request.path_params['id']!r}: a job's id is a whole "
                              f"number from 1 to {MAX_ROW_ID}.", section="/jobs",
                              heading="No such job")
        async with queue.connection() as conn:
            now = await queries.now(queue, conn)
            row = await queries.job(queue, conn, job_id)
        if row is None:
            return render(request, "error.html", "/jobs", now, 404, title="No such job",
                          heading="No such job", detail=f"There is no job {job_id}.")
        payload = json.dumps(row["payload"], indent=2, ensure_ascii=False, sort_keys=True)
        result = (None if row["result"] is None else
                  json.dumps(row["result"], indent=2, ensure_ascii=False, sort_keys=True))
        errors = [{**e, "failed_at": datetime.fromisoformat(e["failed_at"])}
                  for e in row["errors"] or []]
        writable = configured is not None and not read_only
        hooks = (await app_queue()).give_up_hooks
        hook = admin.give_up_hook_state(row["type"], row["status"], row["give_up_pending"],
                                        hooks)
        return render(request, "job.html", "/jobs", now, title=f"Job {job_id}", job=row,
                      payload=payload, result=result, errors=errors, give_up_hook=hook,
                      can_retry=writable and row["status"] == "failed",
                      can_cancel=writable and row["status"] == "pending",
                      csrf=csrf_token(configured) if writable and configured else "")

    async def retry(request: Request) -> Response:
        return await job_action(request, "retry")

    async def cancel(request: Request) -> Response:
        return await job_action(request, "cancel")

    async def job_action(request: Request, action: str) -> Response:
        job_id = _path_id(request.path_params["id"])
        if job_id is None:
            return error_page(request.scope, 404, f"There is no job "
                              f"{request.path_params['id']!r}.", heading="No such job")
        if configured is None or read_only:
            return error_page(request.scope, 403, "the dashboard is read-only")
        body = await request.body()
        if len(body) > MAX_FORM_BYTES:
            return error_page(request.scope, 413, "form too large")
        form = urllib.parse.parse_qs(body.decode("utf-8", "replace"))
        tokens = form.get("csrf", [])
        if (len(tokens) != 1 or not csrf_ok(tokens[0], configured)
                or not same_origin(request.headers)):
            log.info("dashboard %s of job %s refused: CSRF check failed", action, job_id)
            return error_page(request.scope, 403,
                              "forbidden: reload the page and try again")
        changed = await retry_or_cancel(await app_queue(), action, job_id)
        log.info("dashboard %s of job %s: %s", action, job_id,
                 "done" if changed else "refused")
        outcome = {("retry", True): "retried", ("retry", False): "retry-refused",
                   ("cancel", True): "cancelled", ("cancel", False): "cancel-refused"}
        base = str(request.scope.get("root_path", "")).rstrip("/")
        return RedirectResponse(f"{base}/jobs/{job_id}?done={outcome[action, changed]}",
                                status_code=303)

    @page
    async def quotas_page(request: Request) -> Response:
        quotas_known = await known.get()
        async with queue.connection() as conn:
            now = await queries.now(queue, conn)
            shared, per_owner = await queries.quotas_today(queue, conn, quotas_known)
            # Rate limits keep their settings on their buckets: no app needed.
            rates = await rate_states(queue, limit=RATE_ROWS, conn=conn)
        return render(request, "quotas.html", "/quotas", now, title="Quotas",
                      quotas=shared, allowances=per_owner, app_given=known.given,
                      rates=rates, rate_rows=RATE_ROWS,
                      until=lambda t: (t - now).total_seconds())

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            metrics.close()
            if close_queue:
                await queue.close()

    app = Starlette(
        routes=[
            Route("/", overview),
            Route("/fairness", fairness),
            Route("/runs", runs),
            Route("/runs/{id}", run_page),
            Route("/jobs", jobs),
            Route("/jobs/{id}", job_page),
            Route("/jobs/{id}/retry", retry, methods=["POST"]),
            Route("/jobs/{id}/cancel", cancel, methods=["POST"]),
            Route("/quotas", quotas_page),
            Route("/metrics", metrics.endpoint),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ],
        lifespan=lifespan,
        exception_handlers={404: http_error, 405: http_error, 500: server_error},
    )
    app.add_middleware(_Guard, secret=configured, page=error_page)
    return app


__all__ = ["dashboard_app", "retry_or_cancel"]
