"""A YouTube Data API v3 client for the three calls the example pipeline makes.

- ``search_channels``: ``search.list`` with ``type=channel``, 100 units;
- ``channels``: ``channels.list``, 1 unit per call of up to 50 ids;
- ``comment_threads``: ``commentThreads.list``, 1 unit.

Every call returns an :class:`ApiResult`: the parsed items plus the quota units the call
cost, so the runner can charge them to a quota. Errors are mapped to exceptions:
:class:`QuotaExceeded` (HTTP 403, reason ``quotaExceeded``; carries the next reset instant,
midnight America/Los_Angeles), :class:`YouTubeTimeout` (no answer within the client's
timeout) and :class:`YouTubeError` (anything else, with the HTTP status and the API's reason).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

import httpx

from rota import RotaError

from ..payloads import Payload
from .api import DEFAULT_BASE_URL, MAX_IDS_PER_CALL, UNIT_COST, next_reset, utcnow

T = TypeVar("T")


# --------------------------------------------------------------------------------------
# Errors


class YouTubeError(RotaError):
    """The API answered with an error, or could not be reached.

    ``status`` is the HTTP status (0 when there was no HTTP answer); ``reason`` is the API's
    error reason (``errors[0].reason`` of the error body, e.g. ``backendError``,
    ``badRequest``, ``channelNotFound``), or ``timeout`` / ``transport`` / ``unknown``.
    """

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"YouTube API error {status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class QuotaExceeded(YouTubeError):
    """HTTP 403 with reason ``quotaExceeded``: the project's daily units are spent.

    ``reset_at`` is the next quota reset (aware, UTC), midnight America/Los_Angeles after
    the moment the error was seen: defer quota-blocked work until then.
    """

    def __init__(self, message: str, reset_at: datetime, reason: str = "quotaExceeded") -> None:
        super().__init__(403, reason, message)
        self.reset_at = reset_at


class YouTubeTimeout(YouTubeError):
    """No complete answer within the client's timeout (``status`` 0, ``reason`` timeout)."""

    def __init__(self, message: str) -> None:
        super().__init__(0, "timeout", message)


# --------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class ApiResult(Generic[T]):
    """What one client method returned: ``items`` and the quota ``units`` it cost.

    Iterating, ``len()`` and indexing go to ``items``.
    """

    items: list[T]
    units: int

    def __iter__(self) -> Iterator[T]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> T:
        return self.items[index]


@dataclass(frozen=True)
class ChannelHit:
    """One ``search.list`` result of kind ``youtube#channel``.

    ``published_at`` is the API's RFC 3339 string; ``thumbnail_url`` may be ``None``.
    """

    channel_id: str
    title: str
    description: str
    published_at: str
    thumbnail_url: str | None = None


@dataclass(frozen=True)
class Channel(Payload):
    """The fields of a ``channels.list`` item that the example pipeline uses.

    ``subscriber_count`` is ``None`` when the channel hides it; ``custom_url`` is the
    channel's handle (e.g. ``@trailmiles``) and ``country`` an ISO 3166 code, both ``None``
    when not set. Counts are ints (the API sends them as strings).
    """

    id: str
    title: str
    description: str
    custom_url: str | None = None
    country: str | None = None
    subscriber_count: int | None = None
    video_count: int | None = None
    view_count: int | None = None
    published_at: str | None = None


@dataclass(frozen=True)
class Comment(Payload):
    """The top-level comment of one ``commentThreads.list`` item.

    ``video_id`` is ``None`` for a comment about the channel itself; ``published_at`` is
    the API's RFC 3339 string.
    """

    thread_id: str
    author: str
    text: str
    like_count: int
    reply_count: int
    published_at: str
    video_id: str | None = None
    channel_id: str | None = None


# --------------------------------------------------------------------------------------
# Client


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


class YouTubeClient:
    """An async client for the three YouTube Data API v3 calls the pipeline makes.

    ``api_key``: sent as the ``key`` query parameter (``None`` sends no key, which the API
    refuses). ``base_url``: the API root, default the real API; for the stand-in use
    ``<served url> + STAND_IN_PREFIX``. ``timeout``: seconds for each request as a whole
    (connect, send, wait, read); beyond it :class:`YouTubeTimeout`. ``http``: an
    ``httpx.AsyncClient`` to reuse (not closed by this client); otherwise the client makes
    and owns one (close it with :meth:`aclose` or ``async with``). ``clock``: returns the
    aware "now" used for :attr:`QuotaExceeded.reset_at`.

    ``units_used`` is the running total of units this client's successful calls cost.
    Methods are safe to call concurrently.
    """

    def __init__(
        self,
        api_key: str | None,
        base_url: str = DEFAULT_BASE_URL,
        *,
        timeout: float = 10.0,
        http: httpx.AsyncClient | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive seconds, got {timeout!r}")
        self.api_key = api_key
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.clock = clock
        self.units_used = 0
        self._owns_http = http is None
        self._http = http if http is not None else httpx.AsyncClient()

    async def __aenter__(self) -> YouTubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP client if this client created it."""
        if self._owns_http:
            await self._http.aclose()

    async def search_channels(self, query: str, max_results: int = 5) -> ApiResult[ChannelHit]:
        """``search.list`` with ``type=channel``, ``part=snippet``: channels matching ``query``.

        ``max_results``: 1–50. Costs 100 units. Raises ``ValueError`` for bad arguments,
        :class:`QuotaExceeded`, :class:`YouTubeTimeout` or :class:`YouTubeError`.
        """
        if not query.strip():
            raise ValueError("query must not be empty")
        if not 1 <= max_results <= 50:
            raise ValueError(f"max_results must be 1..50, got {max_results}")
        body = await self._get(
            "search",
            {"part": "snippet", "type": "channel", "q": query, "maxResults": str(max_results)},
        )
        hits: list[ChannelHit] = []
        for item in body.get("items", []):
            ident = item.get("id", {})
            snippet = item.get("snippet", {})
            channel_id = ident.get("channelId") or snippet.get("channelId")
            if ident.get("kind") != "youtube#channel" or not channel_id:
                continue
            thumbs = snippet.get("thumbnails", {})
            thumb = (thumbs.get("default") or {}).get("url")
            hits.append(
                ChannelHit(
                    channel_id=str(channel_id),
                    title=str(snippet.get("title", "")),
                    description=str(snippet.get("description", "")),
                    published_at=str(snippet.get("publishedAt", "")),
                    thumbnail_url=thumb,
                )
            )
        return ApiResult(hits, UNIT_COST["search"])

    async def channels(self, ids: Sequence[str]) -> ApiResult[Channel]:
        """``channels.list`` with ``part=snippet,statistics`` for ``ids``.

        Duplicate ids are asked once; ids are sent 50 per call, each call costing 1 unit
        (no ids: no call, 0 units). Unknown ids are simply absent from the result, as in the
        API; order follows the API's answer. If a later call fails, the units of earlier
        calls are spent (and counted in ``units_used``) but not returned. Raises
        :class:`QuotaExceeded`, :class:`YouTubeTimeout` or :class:`YouTubeError`.
        """
        unique = list(dict.fromkeys(i for i in ids if i))
        found: list[Channel] = []
        units = 0
        for start in range(0, len(unique), MAX_IDS_PER_CALL):
            chunk = unique[start : start + MAX_IDS_PER_CALL]
            body = await self._get(
                "channels",
                {"part": "snippet,statistics", "id": ",".join(chunk), "maxResults": "50"},
            )
            units += UNIT_COST["channels"]
            for item in body.get("items", []):
                snippet = item.get("snippet", {})
                stats = item.get("statistics", {})
                hidden = bool(stats.get("hiddenSubscriberCount", False))
                found.append(
                    Channel(
                        id=str(item.get("id", "")),
                        title=str(snippet.get("title", "")),
                        description=str(snippet.get("description", "")),
                        custom_url=snippet.get("customUrl"),
                        country=snippet.get("country"),
                        subscriber_count=None
                        if hidden
                        else _int_or_none(stats.get("subscriberCount")),
                        video_count=_int_or_none(stats.get("videoCount")),
                        view_count=_int_or_none(stats.get("viewCount")),
                        published_at=snippet.get("publishedAt"),
                    )
                )
        return ApiResult(found, units)

    async def comment_threads(
        self,
        *,
        channel_id: str | None = None,
        video_id: str | None = None,
        max_results: int = 20,
    ) -> ApiResult[Comment]:
        """``commentThreads.list``, ``part=snippet``: recent top-level comments.

        Exactly one of ``channel_id`` (all threads related to the channel, the
        ``allThreadsRelatedToChannelId`` filter) or ``video_id``. ``max_results``: 1–100.
        Costs 1 unit. Raises ``ValueError`` for bad arguments, :class:`QuotaExceeded`,
        :class:`YouTubeTimeout` or :class:`YouTubeError` (e.g. 404 ``channelNotFound``).
        """
        if (channel_id is None) == (video_id is None):
            raise ValueError("pass exactly one of channel_id or video_id")
        if not 1 <= max_results <= 100:
            raise ValueError(f"max_results must be 1..100, got {max_results}")
        params = {"part": "snippet", "maxResults": str(max_results), "textFormat": "plainText"}
        if channel_id is not None:
            params["allThreadsRelatedToChannelId"] = channel_id
        else:
            assert video_id is not None
            params["videoId"] = video_id
        body = await self._get("commentThreads", params)
        comments: list[Comment] = []
        for item in body.get("items", []):
            snippet = item.get("snippet", {})
            top = snippet.get("topLevelComment", {}).get("snippet", {})
            comments.append(
                Comment(
                    thread_id=str(item.get("id", "")),
                    author=str(top.get("authorDisplayName", "")),
                    text=str(top.get("textOriginal", top.get("textDisplay", ""))),
                    like_count=_int_or_none(top.get("likeCount")) or 0,
                    reply_count=_int_or_none(snippet.get("totalReplyCount")) or 0,
                    published_at=str(top.get("publishedAt", "")),
                    video_id=snippet.get("videoId") or top.get("videoId"),
                    channel_id=snippet.get("channelId") or top.get("channelId"),
                )
            )
        return ApiResult(comments, UNIT_COST["commentThreads"])

    async def _get(self, endpoint: str, params: dict[str, str]) -> dict[str, Any]:
        if self.api_key is not None:
            params = {**params, "key": self.api_key}
        url = f"{self.base_url}/{endpoint}"
        try:
            # wait_for bounds the whole exchange; httpx's timeout bounds each phase.
            response = await asyncio.wait_for(
                self._http.get(url, params=params, timeout=self.timeout), self.timeout
            )
        except (httpx.TimeoutException, TimeoutError) as exc:
            raise YouTubeTimeout(f"{endpoint}: no answer within {self.timeout:g}s") from exc
        except httpx.HTTPError as exc:
            raise YouTubeError(0, "transport", f"{endpoint}: {exc!r}") from exc
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.is_success and isinstance(body, dict):
            self.units_used += UNIT_COST[endpoint]
            return body
        if response.is_success:
            raise YouTubeError(response.status_code, "invalidResponse", "body is not JSON")
        reason, message = "unknown", response.text[:200]
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            error = body["error"]
            message = str(error.get("message", message))
            errors = error.get("errors")
            if isinstance(errors, list) and errors and isinstance(errors[0], dict):
                reason = str(errors[0].get("reason", reason))
        if response.status_code == 403 and reason in ("quotaExceeded", "dailyLimitExceeded"):
            raise QuotaExceeded(message, next_reset(self.clock()), reason)
        raise YouTubeError(response.status_code, reason, message)
