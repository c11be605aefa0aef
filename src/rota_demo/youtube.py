"""A YouTube Data API v3 client, and a local stand-in server with the API's rules.

The client (:class:`YouTubeClient`) covers the three calls the example pipeline makes:

- ``search_channels``: ``search.list`` with ``type=channel``, 100 units;
- ``channels``: ``channels.list``, 1 unit per call of up to 50 ids;
- ``comment_threads``: ``commentThreads.list``, 1 unit.

Every call returns an :class:`ApiResult`: the parsed items plus the quota units the call
cost, so the runner can charge them to a quota. Errors are mapped to exceptions:
:class:`QuotaExceeded` (HTTP 403, reason ``quotaExceeded``; carries the next reset instant,
midnight America/Los_Angeles), :class:`YouTubeTimeout` (no answer within the client's
timeout) and :class:`YouTubeError` (anything else, with the HTTP status and the API's reason).

The stand-in (:func:`stand_in_app`) answers ``GET /youtube/v3/search``, ``/channels`` and
``/commentThreads`` with the real API's response shapes, from a deterministic pool of fake
channels, and keeps the real quota rules: 10,000 units a day, search 100, list calls 1, reset
at midnight Pacific, 403 ``quotaExceeded`` beyond the limit. It can inject timeouts and 500
errors. ``GET /youtube/v3/_usage`` reports what was spent. :func:`serve_in_thread` runs any
ASGI app (the stand-in, the sample brand pages) on loopback in a background thread.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import random
import re
import socket
import threading
import time as _time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any, Final, Generic, TypeVar
from zoneinfo import ZoneInfo

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from rota import NaiveDatetimeError, RotaError
from rota.quota import next_local_midnight

__all__ = [
    "DEFAULT_BASE_URL",
    "PACIFIC",
    "STAND_IN_PREFIX",
    "UNIT_COST",
    "ApiResult",
    "Channel",
    "ChannelHit",
    "Comment",
    "QuotaExceeded",
    "StandIn",
    "YouTubeClient",
    "YouTubeError",
    "YouTubeTimeout",
    "next_reset",
    "quota_day",
    "serve_in_thread",
    "stand_in_app",
]

DEFAULT_BASE_URL: Final = "https://www.googleapis.com/youtube/v3"
#: Path prefix under which the stand-in answers; a client's base URL for a stand-in served at
#: ``http://127.0.0.1:PORT`` is ``http://127.0.0.1:PORT/youtube/v3``.
STAND_IN_PREFIX: Final = "/youtube/v3"
#: Quota units per call of each endpoint (YouTube Data API v3 rules).
UNIT_COST: Final[Mapping[str, int]] = {"search": 100, "channels": 1, "commentThreads": 1}
#: The YouTube Data API's quota day runs midnight to midnight in this zone.
PACIFIC: Final = ZoneInfo("America/Los_Angeles")
#: The default daily quota of a YouTube Data API project.
DAILY_UNITS: Final = 10_000
_MAX_IDS_PER_CALL: Final = 50

T = TypeVar("T")


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _require_aware(value: datetime, what: str) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be an aware datetime, got naive {value!r}")
    return value


def quota_day(now: datetime, tz: ZoneInfo = PACIFIC) -> date:
    """The quota day (a calendar date in ``tz``) that the instant ``now`` falls in.

    ``now`` must be aware (``ValueError`` otherwise).
    """
    return _require_aware(now, "now").astimezone(tz).date()


def next_reset(now: datetime, tz: ZoneInfo = PACIFIC) -> datetime:
    """The next quota reset strictly after ``now``: the next midnight in ``tz``.

    DST-correct (the instant is computed from the local calendar date, so the day before a
    DST change is 23 or 25 hours long). ``now`` must be aware (``ValueError`` otherwise).
    Returns an aware datetime in UTC, so arithmetic on it is plain elapsed time.
    """
    try:
        return next_local_midnight(now, tz)
    except NaiveDatetimeError as exc:
        raise ValueError(str(exc)) from None


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
class Channel:
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

    def to_payload(self) -> dict[str, Any]:
        """A JSON-serializable dict (for job payloads); inverse of :meth:`from_payload`."""
        return asdict(self)

    @classmethod
    def from_payload(cls, data: Mapping[str, Any]) -> Channel:
        """Rebuild from :meth:`to_payload` output (unknown keys ignored)."""
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class Comment:
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

    def to_payload(self) -> dict[str, Any]:
        """A JSON-serializable dict (for job payloads)."""
        return asdict(self)


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
        clock: Callable[[], datetime] = _utcnow,
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
        for start in range(0, len(unique), _MAX_IDS_PER_CALL):
            chunk = unique[start : start + _MAX_IDS_PER_CALL]
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


# --------------------------------------------------------------------------------------
# Stand-in server: a deterministic pool of fake channels


@dataclass(frozen=True)
class _Topic:
    name: str
    words: frozenset[str]
    shows: tuple[str, ...]
    blurbs: tuple[str, ...]
    comments: tuple[str, ...]


def _topic(
    name: str, words: str, shows: Sequence[str], blurbs: Sequence[str], comments: Sequence[str]
) -> _Topic:
    return _Topic(name, frozenset(words.split()), tuple(shows), tuple(blurbs), tuple(comments))


_TOPICS: Final[tuple[_Topic, ...]] = (
    _topic(
        "running",
        "running run runs runner runners marathon marathons trail trails ultra ultramarathon "
        "shoes shoe sneakers jogging race racing 5k 10k pace stride training",
        ["Trail Miles", "Long Run", "Stride Lab", "Pace Notes", "Ultra Diaries", "Run Club"],
        [
            "Honest running shoe reviews, trail races and marathon training logs.",
            "Ultramarathon vlogs, gear tests and weekly long runs in the mountains.",
            "Road and trail running: shoe rotations, race recaps and training plans.",
        ],
        [
            "Which shoe would you pick for a first trail marathon?",
            "Your long-run pacing tips got me through my first 10k.",
            "How many miles do you get out of a pair before retiring them?",
            "The rocky trail test was exactly what I needed, thanks!",
        ],
    ),
    _topic(
        "coffee",
        "coffee coffees espresso roaster roasters roast roasting brew brewing latte barista "
        "beans bean pour pourover grinder specialty origin cafe",
        ["Daily Grind", "Espresso Lab", "Slow Pour", "Bean Notes", "Morning Cup", "Roast Ratio"],
        [
            "Specialty coffee at home: brewing guides, grinder tests and roaster visits.",
            "Espresso deep dives, latte art practice and single-origin tastings.",
            "Pour-over recipes, bean subscriptions reviewed and cafe tours.",
        ],
        [
            "What grind size do you use for the V60 recipe?",
            "Ordered the Ethiopian beans after this video, so fruity!",
            "Can you compare light and medium roasts for espresso?",
            "My morning routine is now your 1:16 ratio.",
        ],
    ),
    _topic(
        "gaming",
        "game games gaming gamer indie pixel rpg steam nintendo switch playthrough devlog "
        "roguelike platformer studio console pc",
        ["Pixel Hearts", "Indie Spotlight", "Save Point", "Co-op Couch", "Devlog Diaries"],
        [
            "Indie game reviews, hidden gems on Steam and cozy playthroughs.",
            "Roguelikes, platformers and interviews with small game studios.",
            "Let's plays and devlogs from the indie scene, every week.",
        ],
        [
            "Wishlisted it on Steam right after the stream.",
            "Is there a Switch version coming?",
            "The pixel art in this one is gorgeous.",
            "Please do a full playthrough of the demo!",
        ],
    ),
    _topic(
        "finance",
        "budget budgets budgeting money finance finances personal saving savings save debt "
        "invest investing frugal spending paycheck app apps bank",
        ["Money Plainly", "Budget Beans", "Frugal Friday", "Paycheck Plan", "Debt Free Diary"],
        [
            "Personal finance without jargon: budgeting, saving and paying off debt.",
            "Budgeting app reviews, zero-based budgets and monthly money check-ins.",
            "Frugal living, saving challenges and beginner investing explained.",
        ],
        [
            "Started zero-based budgeting after this and finally saved something.",
            "Which budgeting app do you actually use day to day?",
            "Paid off my card this month thanks to the envelope method!",
            "Could you do a video on budgeting with irregular income?",
        ],
    ),
    _topic(
        "fitness",
        "fitness workout workouts gym strength training cardio yoga mobility exercise "
        "health athlete recovery stretching",
        ["Strong Daily", "Mobility Minute", "Iron Notes", "Home Gym Hero", "Flow Yoga"],
        [
            "Home workouts, strength training and mobility routines for busy people.",
            "Gym programming, recovery tips and honest supplement talk.",
        ],
        [
            "Day 30 of this routine and my knees feel so much better.",
            "What do you eat before a morning workout?",
            "The mobility flow at the end is gold.",
        ],
    ),
    _topic(
        "outdoors",
        "hiking hike outdoor outdoors camping backpacking trail trails mountain mountains "
        "climbing gear adventure wilderness",
        ["Wild Miles", "Summit Stories", "Pack Light", "Basecamp Weekly", "Ridge Line"],
        [
            "Backpacking trips, ultralight gear and mountain adventures.",
            "Hiking guides, camping hacks and honest outdoor gear reviews.",
        ],
        [
            "That ridge at sunrise was unreal.",
            "What's your base weight for this trip?",
            "Adding this trail to my summer list.",
        ],
    ),
    _topic(
        "cooking",
        "cooking cook recipe recipes kitchen food baking bake chef meal meals breakfast",
        ["Weeknight Kitchen", "Crumb Club", "Sunday Sauce", "Pan to Plate"],
        [
            "Easy weeknight recipes, baking projects and kitchen gear tests.",
            "Cooking from scratch on a budget, one pan at a time.",
        ],
        [
            "Made this last night, the family loved it.",
            "Can I swap the butter for olive oil?",
            "Your sourdough tips finally worked for me!",
        ],
    ),
    _topic(
        "tech",
        "tech technology gadget gadgets review reviews smartphone phone laptop productivity "
        "software app apps setup desk",
        ["Byte Size", "Desk Setup", "Gadget Lab", "Plain Tech", "Pocket Review"],
        [
            "Gadget reviews, desk setups and productivity apps that earn their place.",
            "Straightforward tech reviews: phones, laptops and software.",
        ],
        [
            "Which app do you use for notes?",
            "Great review, ordered the same laptop stand.",
            "Please review more budget phones!",
        ],
    ),
    _topic(
        "travel",
        "travel traveling trip trips city cities guide backpacker flights hotel vanlife",
        ["Carry On", "Slow Travel", "City Guide", "Window Seat"],
        [
            "Slow travel guides, city walks and budget trip planning.",
            "Travel vlogs, packing lists and honest hotel reviews.",
        ],
        [
            "Saving this for my trip next spring!",
            "How did you find that little cafe?",
            "Your packing list is so helpful.",
        ],
    ),
    _topic(
        "music",
        "music musician guitar piano songs song producer beats synth band",
        ["Chord Club", "Bedroom Beats", "Fret Notes", "Synth Corner"],
        [
            "Guitar lessons, gear demos and songwriting sessions.",
            "Beat making, synth sounds and home studio tips.",
        ],
        [
            "Learned the riff in one evening thanks to you.",
            "What pedal is that at 3:12?",
            "More synth patches please!",
        ],
    ),
)

_HOSTS: Final = (
    "Sam", "Alex", "Maya", "Jordan", "Priya", "Chris", "Lena", "Diego", "Noor", "Kai",
    "Hana", "Tom", "Ines", "Marco", "Zoe", "Ravi", "Elif", "Jonas", "Ana", "Theo",
)  # fmt: skip
_FORMATS: Final = ("{show}", "{show} with {host}", "{host}'s {show}", "{show} TV", "{show} Weekly")
_COUNTRIES: Final = ("US", "US", "US", "GB", "CA", "AU", "DE", "FR", "IN", "BR", "NL", "JP")
_AUTHORS: Final = ("runner", "maker", "fan", "viewer", "sub", "learner", "nerd", "friend")
_GENERIC_COMMENTS: Final = (
    "Great video as always.",
    "Been watching since the early days, love the new format.",
    "The editing on this one is so good.",
    "Subscribed after the last upload!",
    "Would love a collab with a brand that gets your audience.",
)
_WORD_RE: Final = re.compile(r"[a-z0-9]+")


def _digest(*parts: object) -> bytes:
    return hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()


def _num(*parts: object) -> int:
    return int.from_bytes(_digest(*parts)[:8], "big")


def _b64(raw: bytes, n: int) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")[:n]


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class _FakeChannel:
    index: int
    id: str
    topic: _Topic
    title: str
    handle: str
    description: str
    country: str
    subscribers: int
    hidden: bool
    videos: int
    views: int
    published_at: str


def _make_pool(seed: int, size: int) -> list[_FakeChannel]:
    pool: list[_FakeChannel] = []
    epoch = datetime(2008, 1, 1, tzinfo=UTC)
    for index in range(size):
        topic = _TOPICS[index % len(_TOPICS)]
        r = random.Random(_num("channel", seed, index))
        show = r.choice(topic.shows)
        title = r.choice(_FORMATS).format(show=show, host=r.choice(_HOSTS))
        handle = "@" + re.sub(r"[^a-z0-9]", "", title.lower()) + str(r.randrange(10, 100))
        subscribers = int(10 ** r.uniform(3, 6.3))
        videos = r.randrange(20, 900)
        pool.append(
            _FakeChannel(
                index=index,
                id="UC" + _b64(_digest("id", seed, index), 22),
                topic=topic,
                title=title,
                handle=handle,
                description=f"{r.choice(topic.blurbs)} Hosted by {r.choice(_HOSTS)}. "
                f"New videos every {r.choice(['week', 'Tuesday', 'Friday', 'other week'])}.",
                country=r.choice(_COUNTRIES),
                subscribers=subscribers,
                hidden=r.random() < 0.05,
                videos=videos,
                views=subscribers * r.randrange(20, 200),
                published_at=_iso(epoch + timedelta(days=r.randrange(0, 5000))),
            )
        )
    return pool


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
        self.pool = _make_pool(seed, pool_size)
        self.by_id = {c.id: c for c in self.pool}
        self._dice = random.Random(_num("dice", seed))
        self._usage = _Usage(day=quota_day(self._now()))

    def _now(self) -> datetime:
        return _require_aware(self.clock(), "clock()")

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
            "resetAt": _iso(next_reset(now)),
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
        words = set(_WORD_RE.findall(query.lower()))
        scores = {t.name: len(words & t.words) for t in _TOPICS}
        best = max(scores.values(), default=0)
        if best > 0:
            matching = [c for c in self.pool if scores[c.topic.name] == best]
        else:
            matching = list(self.pool) if words else []
        norm = " ".join(sorted(words))
        matching.sort(key=lambda c: _num("rank", self.seed, norm, c.index))
        items = [
            {
                "kind": "youtube#searchResult",
                "etag": _b64(_digest("etag", c.id, norm), 27),
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
            "etag": _b64(_digest("search", norm, limit), 27),
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
        if len(ids) > _MAX_IDS_PER_CALL:
            raise _BadRequest(f"at most {_MAX_IDS_PER_CALL} ids per call")
        parts = set(params.get("part", "").split(","))
        items = []
        for ident in ids:
            c = self.by_id.get(ident)
            if c is None:
                continue
            item: dict[str, Any] = {"kind": "youtube#channel", "etag": _b64(_digest("e", c.id), 27)}
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
            "etag": _b64(_digest("channels", raw), 27),
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
            topic = _TOPICS[_num("video", self.seed, video_id) % len(_TOPICS)]
            owner = self.pool[_num("owner", self.seed, video_id) % len(self.pool)]
        r = random.Random(_num("comments", self.seed, target))
        count = min(limit, r.randrange(3, 13))
        pool_texts = topic.comments + _GENERIC_COMMENTS
        start = r.randrange(len(pool_texts))
        items = []
        for i in range(count):
            text = pool_texts[(start + i) % len(pool_texts)]
            author = f"@{r.choice(_AUTHORS)}{r.randrange(100, 10000)}"
            thread_id = "Ug" + _b64(_digest("thread", self.seed, target, i), 24)
            vid = video_id if video_id is not None else _b64(_digest("v", target, i), 11)
            published = _iso(now - timedelta(hours=r.randrange(1, 24 * 60)))
            likes = r.randrange(0, 400)
            items.append(
                {
                    "kind": "youtube#commentThread",
                    "etag": _b64(_digest("e", thread_id), 27),
                    "id": thread_id,
                    "snippet": {
                        "channelId": owner.id,
                        "videoId": vid,
                        "topLevelComment": {
                            "kind": "youtube#comment",
                            "etag": _b64(_digest("c", thread_id), 27),
                            "id": thread_id,
                            "snippet": {
                                "channelId": owner.id,
                                "videoId": vid,
                                "textDisplay": text,
                                "textOriginal": text,
                                "authorDisplayName": author,
                                "authorChannelId": {"value": "UC" + _b64(_digest(author), 22)},
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
            "etag": _b64(_digest("threads", target, limit), 27),
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
    clock: Callable[[], datetime] = _utcnow,
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


# --------------------------------------------------------------------------------------
# Serving on loopback


def serve_in_thread(
    app: ASGIApp, host: str = "127.0.0.1", port: int = 0, *, start_timeout: float = 10.0
) -> tuple[str, Callable[[], None]]:
    """Serve ``app`` with uvicorn in a daemon thread; return ``(base_url, stop)``.

    ``port`` 0 picks a free port. ``base_url`` is ``http://host:port`` (no trailing slash).
    ``stop()`` asks the server to exit, waits for it (in-flight requests get up to 2 s) and
    is idempotent. Raises ``RuntimeError`` if the server has not started within
    ``start_timeout`` seconds, ``OSError`` if the address cannot be bound.
    """
    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted sockets inherit this; without it small responses wait ~40 ms (delayed ACK).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    bound_port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=2,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name=f"serve:{bound_port}", daemon=True
    )
    thread.start()
    deadline = _time.monotonic() + start_timeout
    while not server.started:
        if not thread.is_alive() or _time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError(f"server on {host}:{bound_port} did not start")
        _time.sleep(0.005)
    stopped = threading.Event()

    def stop() -> None:
        if stopped.is_set():
            return
        stopped.set()
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()

    shown = f"[{host}]" if family == socket.AF_INET6 else host
    return f"http://{shown}:{bound_port}", stop
