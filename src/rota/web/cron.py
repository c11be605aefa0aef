"""The cron endpoint (docs/design.md, "Ways to run it"): ``GET /api/cron`` runs the pipeline once
within its time budget, for a platform scheduler (Vercel Cron, Cloud Scheduler, a
Kubernetes CronJob with curl) that calls a URL on a schedule.

Only a request with ``Authorization: Bearer <CRON_SECRET>`` runs anything. The secret is
compared in constant time; with no secret configured every request is refused, so a
deployment that forgot to set it is closed, not open. The secret is never logged or
echoed.
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Mapping
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any, Protocol

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..checks import require_duration
from ..runner.source import (  # re-exported: the worker takes them without Starlette
    PipelineSource,
    RunnablePipeline,
    check_time_budget,
    resolve_pipeline,
)
from ..runner.stage import HEALTHY_STOP_REASONS, Trigger

log = logging.getLogger("rota.web")

# Tokens that a misconfigured client sends when its secret variable is unset
# (JavaScript's `${undefined}`, a JSON null): they never authenticate, and a configured
# secret equal to one of them counts as no secret at all.
_PLACEHOLDER_SECRETS = frozenset({"", "undefined", "null", "none"})

_ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


class RunOutcome(Protocol):
    """What a run reports (``rota.runner.RunResult`` has these fields)."""

    @property
    def run_id(self) -> Any: ...
    @property
    def stop_reason(self) -> str: ...
    @property
    def jobs_done(self) -> int: ...
    @property
    def jobs_failed(self) -> int: ...
    @property
    def jobs_deferred(self) -> int: ...
    @property
    def quota_units(self) -> int: ...
    @property
    def summary(self) -> Mapping[str, Any]: ...
    @property
    def error(self) -> str | None: ...


def usable_secret(secret: str | None) -> str | None:
    """The configured secret with surrounding whitespace removed, or ``None`` when it is
    unset, blank or a placeholder (``undefined``, ``null``, ``none``), which would let a
    misconfigured client in."""
    if secret is None:
        return None
    cleaned = secret.strip()
    return None if cleaned.lower() in _PLACEHOLDER_SECRETS else cleaned


def bearer_matches(authorization: str | None, secret: str | None) -> bool:
    """Whether an ``Authorization`` header value carries exactly ``Bearer <secret>``.

    The scheme is matched case-insensitively (RFC 7235); the token is compared with
    :func:`hmac.compare_digest` on UTF-8 bytes, so the time taken does not depend on how
    much of the token was right. No secret, a blank token and the placeholder tokens
    ``undefined``/``null``/``none`` never match.
    """
    expected = usable_secret(secret)
    if expected is None or not authorization:
        return False
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or token.lower() in _PLACEHOLDER_SECRETS:
        return False
    return hmac.compare_digest(token.encode("utf-8"), expected.encode("utf-8"))


def result_json(result: Any) -> dict[str, Any]:
    """The endpoint's JSON for a run result: ``runId`` (text), ``stopReason``,
    ``jobsDone``, ``jobsFailed``, ``units`` (quota units spent)."""
    return {
        "runId": str(result.run_id),
        "stopReason": result.stop_reason,
        "jobsDone": result.jobs_done,
        "jobsFailed": result.jobs_failed,
        "units": result.quota_units,
    }


def cron_app(
    pipeline: PipelineSource,
    *,
    secret: str | None,
    time_budget: timedelta = timedelta(seconds=220),
    queue: Any = None,
    stop: asyncio.Event | None = None,
    stop_now: asyncio.Event | None = None,
) -> Starlette:
    """Build the cron endpoint's ASGI app.

    Routes:
        ``GET /api/cron``: with ``Authorization: Bearer <secret>``, runs the pipeline once
        (trigger ``"cron"``) within ``time_budget`` and answers 200 with
        ``{"runId", "stopReason", "jobsDone", "jobsFailed", "units"}``; when the run
        stopped with ``error`` (an incident) the same JSON comes with status 500, so the
        scheduler's dashboard shows it; when the run could not start (database down)
        503 ``{"error": ...}`` naming the exception type only. With more than one
        Authorization header, 400 ``{"error": "more than one Authorization header"}``
        whatever they hold (exactly one credential: a proxy or framework that reads
        another of them than this check would disagree about who asked). Without the
        right secret, 401 ``{"error": "unauthorized"}``; any other method, 405.
        ``GET /healthz``: 200 ``{"status": "ok"}`` (the process is up; no database call).

    Args:
        pipeline: a pipeline (anything with ``async run(*, trigger, time_budget)``
            returning a ``RunResult``) or a zero-argument factory of one, called per
            request (see :data:`PipelineSource`).
        secret: the shared secret (``CRON_SECRET``). ``None``, blank or a placeholder
            such as ``"undefined"`` refuses every request.
        time_budget: how long one run may claim new work; keep it below the platform's
            timeout (default 220 s of 300 s).
        queue: an object with ``async close()`` (the ``rota.Queue`` the pipeline uses)
            that the app closes at shutdown, for ``rota serve``; ``None`` when the caller
            manages it.
        stop: an event that, once set (``rota serve``'s SIGTERM), makes the run in
            flight claim nothing more and stop ``interrupted``, given to pipelines
            whose ``run`` takes ``stop``.
        stop_now: an event that, once set (``rota serve``'s second signal), cancels
            the run in flight: it hands its jobs back and stops ``interrupted``, and
            the request is answered 503 ``{"error": "stopped at once"}``.

    Raises:
        InvalidInput: ``time_budget`` is not a positive ``timedelta``.
        ConfigError: ``pipeline`` is a pipeline (not a factory) whose
            ``platform_timeout`` is not longer than ``time_budget``.
    """
    budget = require_duration(time_budget, "time_budget")
    if callable(getattr(pipeline, "run", None)):
        check_time_budget(pipeline, budget)
    configured = usable_secret(secret)
    if configured is None:
        log.warning("no usable cron secret is configured: /api/cron refuses every request")

    async def cron(request: Request) -> Response:
        if request.method != "GET":
            return JSONResponse({"error": "method not allowed"}, status_code=405,
                                headers={"Allow": "GET"})
        authorizations = request.headers.getlist("authorization")
        if len(authorizations) > 1:
            log.info("cron request refused: more than one Authorization header")
            return JSONResponse({"error": "more than one Authorization header"},
                                status_code=400)
        if not bearer_matches(request.headers.get("authorization"), configured):
            log.info("cron request refused: missing or wrong bearer token")
            return JSONResponse({"error": "unauthorized"}, status_code=401,
                                headers={"WWW-Authenticate": 'Bearer realm="rota"'})
        try:
            runner = await resolve_pipeline(pipeline)
            stopping = ({"stop": stop} if stop is not None and "stop" in
                        inspect.signature(runner.run).parameters else {})
            result = await _run_unless(
                stop_now, runner.run(trigger="cron", time_budget=budget, **stopping))
            if result is None:
                return JSONResponse({"error": "stopped at once"}, status_code=503)
        except Exception as exc:
            log.exception("cron run could not run")
            return JSONResponse({"error": f"run failed: {type(exc).__name__}"},
                                status_code=503)
        body = result_json(result)
        healthy = result.stop_reason in HEALTHY_STOP_REASONS
        log.info("cron run %s stopped %s: %s done, %s failed", body["runId"],
                 body["stopReason"], body["jobsDone"], body["jobsFailed"])
        return JSONResponse(body, status_code=200 if healthy else 500)

    async def healthz(request: Request) -> Response:
        if request.method not in ("GET", "HEAD"):
            return JSONResponse({"error": "method not allowed"}, status_code=405,
                                headers={"Allow": "GET, HEAD"})
        return JSONResponse({"status": "ok"})

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if queue is not None:
                await queue.close()

    return Starlette(
        routes=[
            # Every method is routed here so that HEAD (which Starlette would otherwise
            # serve through GET, running the pipeline) and the rest get a plain 405.
            Route("/api/cron", cron, methods=_ALL_METHODS),
            Route("/healthz", healthz, methods=_ALL_METHODS),
        ],
        lifespan=lifespan,
    )


async def _run_unless(stop_now: asyncio.Event | None, work: Awaitable[Any]) -> Any:
    """``work``'s result, or ``None`` once it was cancelled because ``stop_now`` was set
    (waiting for it to settle: a cancelled run hands its jobs back and records its
    end)."""
    task = asyncio.ensure_future(work)
    if stop_now is None:
        return await task
    waiter = asyncio.ensure_future(stop_now.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        waiter.cancel()
    if not task.done():
        task.cancel()
        await asyncio.wait({task})
    if task.cancelled():
        return None
    return task.result()


__all__ = [
    "HEALTHY_STOP_REASONS",
    "PipelineSource",
    "RunOutcome",
    "RunnablePipeline",
    "Trigger",
    "bearer_matches",
    "check_time_budget",
    "cron_app",
    "resolve_pipeline",
    "result_json",
    "usable_secret",
]
