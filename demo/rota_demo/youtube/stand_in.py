"""A local stand-in for the YouTube Data API v3, with the API's rules.

:func:`stand_in_app` answers ``GET /youtube/v3/search``, ``/channels`` and
``/commentThreads`` with the real API's response shapes, from the deterministic pool of
fake channels in :mod:`rota_demo.youtube.fixtures`, and keeps the real quota rules: 10,000
units a day, search 100, list calls 1, reset at midnight Pacific, 403 ``quotaExceeded``
beyond the limit. It can inject timeouts and 500 errors. ``GET /youtube/v3/_usage``
reports what was spent. Serve it with :func:`rota_demo.loopback.serve_in_thread`.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .api import (
    DAILY_UNITS,
    MAX_IDS_PER_CALL,
    STAND_IN_PREFIX,
    UNIT_COST,
    next_reset,
    quota_day,
    require_aware,
    utcnow,
)
from .fixtures import (
    AUTHORS,
    GENERIC_COMMENTS,
    TOPICS,
    WORD_RE,
    b64,
    digest,
    iso,
    make_pool,
    num,
)


@dataclass
class _Usage:
    day: date
    units: int = 0
    calls: dict[str, int] = field(default_factory=lambda: {k: 0 for k in UNIT_COST})
    history: dict[str, int] = field(default_factory=dict)
    total_units: int = 0
    quota_exceeded: int = 0
    injected_timeouts: int = 0
    injected_errors: int = 0
    bad_requests: int = 0


class StandIn:
    """The stand-in's state: channel pool, quota counter, injection dice.

    Built by :func:`stand_in_app` (reachable as ``app.state.stand_in``); see there for the
    arguments. :meth:`usage` is what ``GET /youtube/v3/_usage`` answers.
    """

    def __init__(
        self,
        *,
        daily_units: int,
        seed: int,
        timeout_rate: float,
        error_rate: float,
        clock: Callable[[], datetime],
        timeout_delay: float,
        pool_size: int,
    ) -> None:
        for name, rate in (("timeout_rate", timeout_rate), ("error_rate", error_rate)):
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {rate!r}")
        if daily_units < 0 or pool_size < 1 or timeout_delay < 0:
            raise ValueError("daily_units >= 0, pool_size >= 1 and timeout_delay >= 0 required")
        self.daily_units = daily_units
        self.seed = seed
        self.timeout_rate = timeout_rate
        self.error_rate = error_rate
        self.clock = clock
        self.timeout_delay = timeout_delay
        self.pool = make_pool(seed, pool_size)
        self.by_id = {c.id: c for c in self.pool}
        self._dice = random.Random(num("dice", seed))
        self._usage = _Usage(day=quota_day(self._now()))

    def _now(self) -> datetime:
        return require_aware(self.clock(), "clock()")

    def _roll_day(self) -> datetime:
        now = self._now()
        today = quota_day(now)
        if today != self._usage.day:
            self._usage.day = today
            self._usage.units = 0
        return now

    def usage(self) -> dict[str, Any]:
        """Quota use as JSON: today's ``units``/``dailyUnits``/``remaining``, ``day`` (Pacific
        date), ``resetAt``, ``calls`` per endpoint (successful), ``history`` (units per day),
        ``totalUnits``, and counts of ``quotaExceeded``, ``injectedTimeouts``,
        ``injectedErrors``, ``badRequests`` answers."""
        now = self._roll_day()
        u = self._usage
        history = dict(u.history)
        return {
            "day": u.day.isoformat(),
            "units": u.units,
            "dailyUnits": self.daily_units,
            "remaining": max(self.daily_units - u.units, 0),
            "resetAt": iso(next_reset(now)),
            "calls": dict(u.calls),
            "history": history,
            "totalUnits": u.total_units,
            "quotaExceeded": u.quota_exceeded,
            "injectedTimeouts": u.injected_timeouts,
            "injectedErrors": u.injected_errors,
            "badRequests": u.bad_requests,
        }

    # -- request handling ----------------------------------------------------------------

    async def handle(self, request: Request, endpoint: str) -> Response:
        params = request.query_params
        if not params.get("key"):
            self._usage.bad_requests += 1
            return _error(400, "keyInvalid", "global", "The request is missing a valid API key.")
        if not params.get("part"):
            self._usage.bad_requests += 1
            return _error(400, "required", "global", "Required parameter: part")
        now = self._roll_day()
        cost = UNIT_COST[endpoint]
        if self._usage.units + cost > self.daily_units:
            self._usage.quota_exceeded += 1
            return _error(
                403,
                "quotaExceeded",
                "youtube.quota",
                'The request cannot be completed because you have exceeded your <a href="/you'
                'tube/v3/getting-started#quota">quota</a>.',
            )
        roll = self._dice.random()
        if roll < self.timeout_rate:
            self._usage.injected_timeouts += 1
            await asyncio.sleep(self.timeout_delay)
            return _error(503, "backendError", "global", "The service is currently unavailable.")
        if roll < self.timeout_rate + self.error_rate:
            self._usage.injected_errors += 1
            return _error(500, "backendError", "global", "Internal error encountered.")
        try:
            if endpoint == "search":
                body = self._search(params.get("q", ""), params)
            elif endpoint == "channels":
                body = self._channels(params)
            else:
                body = self._comment_threads(params, now)
        except _BadRequest as exc:
            self._usage.bad_requests += 1
            return _error(exc.status, exc.reason, exc.domain, str(exc))
        # Only successful calls are charged (a simplification of the real API's rules).
        self._usage.units += cost
        self._usage.total_units += cost
        self._usage.calls[endpoint] += 1
        day = self._usage.day.isoformat()
        self._usage.history[day] = self._usage.history.get(day, 0) + cost
        return JSONResponse(body)

    def _max_results(self, params: Mapping[str, str], default: int, top: int, low: int) -> int:
        raw = params.get("maxResults", str(default))
        try:
            value = int(raw)
        except ValueError:
            raise _BadRequest(f"Invalid value '{raw}' for maxResults") from None
        if not low <= value <= top:
            raise _BadRequest(f"maxResults must be between {low} and {top}")
        return value

    def _search(self, query: str, params: Mapping[str, str]) -> dict[str, Any]:
        if params.get("type", "channel") != "channel":
            raise _BadRequest("the stand-in answers type=channel searches only")
        limit = self._max_results(params, 5, 50, 0)
        words = set(WORD_RE.findall(query.lower()))
        scores = {t.name: len(words & t.words) for t in TOPICS}
        best = max(scores.values(), default=0)
        if best > 0:
            matching = [c for c in self.pool if scores[c.topic.name] == best]
        else:
            matching = list(self.pool) if words else []
        norm = " ".join(sorted(words))
        matching.sort(key=lambda c: num("rank", self.seed, norm, c.index))
        items = [
            {
                "kind": "youtube#searchResult",
                "etag": b64(digest("etag", c.id, norm), 27),
                "id": {"kind": "youtube#channel", "channelId": c.id},
                "snippet": {
                    "publishedAt": c.published_at,
                    "channelId": c.id,
                    "title": c.title,
                    "description": c.description,
                    "thumbnails": _thumbnails(c.id),
                    "channelTitle": c.title,
                    "liveBroadcastContent": "none",
                    "publishTime": c.published_at,
                },
            }
            for c in matching[:limit]
        ]
        return {
            "kind": "youtube#searchListResponse",
            "etag": b64(digest("search", norm, limit), 27),
            "regionCode": "US",
            "pageInfo": {"totalResults": len(matching), "resultsPerPage": limit},
            "items": items,
        }

    def _channels(self, params: Mapping[str, str]) -> dict[str, Any]:
        raw = params.get("id", "")
        ids = [i for i in raw.split(",") if i]
        if not ids:
            raise _BadRequest(
                "No filter selected. Expected one of: id, forHandle, mine", "badRequest"
            )
        if len(ids) > MAX_IDS_PER_CALL:
            raise _BadRequest(f"at most {MAX_IDS_PER_CALL} ids per call")
        parts = set(params.get("part", "").split(","))
        items = []
        for ident in ids:
            c = self.by_id.get(ident)
            if c is None:
                continue
            item: dict[str, Any] = {"kind": "youtube#channel", "etag": b64(digest("e", c.id), 27)}
            item["id"] = c.id
            if "snippet" in parts:
                item["snippet"] = {
                    "title": c.title,
                    "description": c.description,
                    "customUrl": c.handle,
                    "publishedAt": c.published_at,
                    "thumbnails": _thumbnails(c.id),
                    "localized": {"title": c.title, "description": c.description},
                    "country": c.country,
                }
            if "statistics" in parts:
                stats: dict[str, Any] = {
                    "viewCount": str(c.views),
                    "hiddenSubscriberCount": c.hidden,
                    "videoCount": str(c.videos),
                }
                if not c.hidden:
                    stats["subscriberCount"] = str(c.subscribers)
                item["statistics"] = stats
            items.append(item)
        return {
            "kind": "youtube#channelListResponse",
            "etag": b64(digest("channels", raw), 27),
            "pageInfo": {"totalResults": len(items), "resultsPerPage": len(items)},
            "items": items,
        }

    def _comment_threads(self, params: Mapping[str, str], now: datetime) -> dict[str, Any]:
        limit = self._max_results(params, 20, 100, 1)
        channel_id = params.get("allThreadsRelatedToChannelId")
        video_id = params.get("videoId")
        if (channel_id is None) == (video_id is None):
            raise _BadRequest("exactly one of allThreadsRelatedToChannelId or videoId required")
        if channel_id is not None:
            owner = self.by_id.get(channel_id)
            if owner is None:
                raise _BadRequest(
                    "The channel identified by the allThreadsRelatedToChannelId parameter "
                    "could not be found.",
                    "channelNotFound",
                    status=404,
                )
            target, topic = owner.id, owner.topic
        else:
            assert video_id is not None
            target = video_id
            topic = TOPICS[num("video", self.seed, video_id) % len(TOPICS)]
            owner = self.pool[num("owner", self.seed, video_id) % len(self.pool)]
        r = random.Random(num("comments", self.seed, target))
        count = min(limit, r.randrange(3, 13))
        pool_texts = topic.comments + GENERIC_COMMENTS
        start = r.randrange(len(pool_texts))
        items = []
        for i in range(count):
            text = pool_texts[(start + i) % len(pool_texts)]
            author = f"@{r.choice(AUTHORS)}{r.randrange(100, 10000)}"
            thread_id = "Ug" + b64(digest("thread", self.seed, target, i), 24)
            vid = video_id if video_id is not None else b64(digest("v", target, i), 11)
            published = iso(now - timedelta(hours=r.randrange(1, 24 * 60)))
            likes = r.randrange(0, 400)
            items.append(
                {
                    "kind": "youtube#commentThread",
                    "etag": b64(digest("e", thread_id), 27),
                    "id": thread_id,
                    "snippet": {
                        "channelId": owner.id,
                        "videoId": vid,
                        "topLevelComment": {
                            "kind": "youtube#comment",
                            "etag": b64(digest("c", thread_id), 27),
                            "id": thread_id,
                            "snippet": {
                                "channelId": owner.id,
                                "videoId": vid,
                                "textDisplay": text,
                                "textOriginal": text,
                                "authorDisplayName": author,
                                "authorChannelId": {"value": "UC" + b64(digest(author), 22)},
                                "canRate": True,
                                "viewerRating": "none",
                                "likeCount": likes,
                                "publishedAt": published,
                                "updatedAt": published,
                            },
                        },
                        "canReply": True,
                        "totalReplyCount": r.randrange(0, 12),
                        "isPublic": True,
                    },
                }
            )
        return {
            "kind": "youtube#commentThreadListResponse",
            "etag": b64(digest("threads", target, limit), 27),
            "pageInfo": {"totalResults": len(items), "resultsPerPage": limit},
            "items": items,
        }


class _BadRequest(Exception):
    def __init__(
        self, message: str, reason: str = "invalidParameter", *, status: int = 400
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.status = status
        self.domain = "youtube.parameter" if status == 400 else "youtube.commentThread"


def _thumbnails(channel_id: str) -> dict[str, Any]:
    base = f"https://yt3.example.invalid/{channel_id}"
    return {
        "default": {"url": f"{base}=s88", "width": 88, "height": 88},
        "medium": {"url": f"{base}=s240", "width": 240, "height": 240},
        "high": {"url": f"{base}=s800", "width": 800, "height": 800},
    }


def _error(status: int, reason: str, domain: str, message: str) -> JSONResponse:
    body = {
        "error": {
            "code": status,
            "message": message,
            "errors": [{"message": message, "domain": domain, "reason": reason}],
        }
    }
    return JSONResponse(body, status_code=status)


def stand_in_app(
    *,
    daily_units: int = DAILY_UNITS,
    seed: int = 0,
    timeout_rate: float = 0.0,
    error_rate: float = 0.0,
    clock: Callable[[], datetime] = utcnow,
    timeout_delay: float = 30.0,
    pool_size: int = 1200,
) -> Starlette:
    """A Starlette app standing in for the YouTube Data API v3.

    Routes (GET): ``/youtube/v3/search`` (``type=channel`` only), ``/youtube/v3/channels``
    (``id=`` up to 50 comma-separated ids), ``/youtube/v3/commentThreads``
    (``allThreadsRelatedToChannelId=`` or ``videoId=``), each requiring ``key`` (400
    ``keyInvalid`` without) and ``part`` (400 ``required``), answering the real API's
    shapes; and ``/youtube/v3/_usage`` (no key, free): :meth:`StandIn.usage` as JSON.

    ``daily_units``: quota per Pacific day (search costs 100, list calls 1; a request whose
    cost would exceed what is left gets 403 ``quotaExceeded``; only successful calls are
    charged). ``seed``: the fake channel pool (``pool_size`` channels over ten topics; a
    search ranks the channels of the topic its words match best) and the injection dice.
    ``timeout_rate`` / ``error_rate``: probabilities in [0, 1] that an accepted request
    sleeps ``timeout_delay`` seconds (longer than the client's timeout) before a 503, or gets
    a 500 ``backendError``. ``clock``: returns the aware "now" for the quota day.
    The state is at ``app.state.stand_in`` (:class:`StandIn`).
    """
    stand_in = StandIn(
        daily_units=daily_units,
        seed=seed,
        timeout_rate=timeout_rate,
        error_rate=error_rate,
        clock=clock,
        timeout_delay=timeout_delay,
        pool_size=pool_size,
    )

    def endpoint(name: str) -> Callable[[Request], Any]:
        async def handler(request: Request) -> Response:
            return await stand_in.handle(request, name)

        return handler

    async def usage(request: Request) -> Response:
        return JSONResponse(stand_in.usage())

    routes = [Route(f"{STAND_IN_PREFIX}/{name}", endpoint(name)) for name in UNIT_COST]
    routes.append(Route(f"{STAND_IN_PREFIX}/_usage", usage))
    app = Starlette(routes=routes)
    app.state.stand_in = stand_in
    return app
