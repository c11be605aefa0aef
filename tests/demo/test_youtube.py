"""The YouTube client against the stand-in server over real loopback HTTP."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from rota_demo.loopback import serve_in_thread
from rota_demo.youtube import (
    PACIFIC,
    STAND_IN_PREFIX,
    UNIT_COST,
    QuotaExceeded,
    StandIn,
    YouTubeClient,
    YouTubeError,
    YouTubeTimeout,
    next_reset,
    quota_day,
    stand_in_app,
)


class Clock:
    """A settable aware clock shared by the stand-in and the client."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


Serve = Callable[..., tuple[str, StandIn]]


@pytest.fixture
def serve() -> Iterator[Serve]:
    """Start stand-ins on loopback: ``serve(**stand_in_app kwargs) -> (api base, state)``."""
    stops: list[Callable[[], None]] = []

    def start(**kwargs: Any) -> tuple[str, StandIn]:
        app = stand_in_app(**kwargs)
        url, stop = serve_in_thread(app)
        stops.append(stop)
        return url + STAND_IN_PREFIX, app.state.stand_in

    yield start
    for stop in stops:
        stop()


NOON = datetime(2024, 6, 1, 19, 0, tzinfo=UTC)  # noon in Los Angeles (PDT)


async def usage(base: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        body: dict[str, Any] = (await http.get(f"{base}/_usage")).json()
        return body


async def test_search_channels_comments_and_their_units(serve: Serve) -> None:
    base, _ = serve(clock=Clock(NOON))
    async with YouTubeClient("k", base, timeout=5) as yt:
        hits = await yt.search_channels("trail running shoes", max_results=5)
        assert len(hits) == 5 and hits.units == 100
        assert all(h.channel_id.startswith("UC") and len(h.channel_id) == 24 for h in hits)
        chans = await yt.channels([h.channel_id for h in hits] + ["UCunknown"])
        assert chans.units == 1
        assert [c.id for c in chans] == [h.channel_id for h in hits]  # unknown id: absent
        assert {c.title for c in chans} == {h.title for h in hits}
        for c in chans:
            assert c.custom_url and c.custom_url.startswith("@")
            assert c.country and len(c.country) == 2
            assert c.video_count is not None and c.view_count is not None
        comments = await yt.comment_threads(channel_id=hits[0].channel_id, max_results=4)
        assert comments.units == 1 and 1 <= len(comments) <= 4
        assert all(c.text and c.author.startswith("@") for c in comments)
        assert all(c.channel_id == hits[0].channel_id for c in comments)
        assert yt.units_used == 102
    u = await usage(base)
    assert (u["units"], u["remaining"], u["dailyUnits"]) == (102, 9_898, 10_000)
    assert u["calls"] == {"search": 1, "channels": 1, "commentThreads": 1}
    assert u["day"] == "2024-06-01" and u["resetAt"] == "2024-06-02T07:00:00Z"


async def test_search_matches_topic_and_is_deterministic(serve: Serve) -> None:
    base_a, _ = serve(seed=7)
    base_b, _ = serve(seed=7)
    base_c, _ = serve(seed=8)
    async with (
        YouTubeClient("k", base_a, timeout=5) as a,
        YouTubeClient("k", base_b, timeout=5) as b,
        YouTubeClient("k", base_c, timeout=5) as c,
    ):
        first = await a.search_channels("specialty coffee", 10)
        again = await b.search_channels("specialty coffee", 10)
        other = await c.search_channels("specialty coffee", 10)
        assert [h.channel_id for h in first] == [h.channel_id for h in again]
        assert {h.channel_id for h in first}.isdisjoint(h.channel_id for h in other)
        text = " ".join(h.description.lower() for h in first)
        assert "coffee" in text or "espresso" in text
        shoes = await a.search_channels("running shoes", 10)
        assert all(
            any(w in h.description.lower() for w in ("running", "ultramarathon", "trail"))
            for h in shoes
        )


async def test_usage_is_exactly_100n_plus_m(serve: Serve) -> None:
    base, _ = serve(clock=Clock(NOON))
    async with YouTubeClient("k", base, timeout=5) as yt:
        ids: list[str] = []
        for q in ("coffee", "indie game", "budgeting app"):  # N = 3
            ids += [h.channel_id for h in await yt.search_channels(q, 3)]
        for i in ids[:4]:  # M = 4 + 3
            await yt.channels([i])
        for i in ids[:3]:
            await yt.comment_threads(channel_id=i, max_results=2)
        assert yt.units_used == 3 * 100 + 7
    u = await usage(base)
    assert u["units"] == u["totalUnits"] == 307
    assert u["calls"] == {"search": 3, "channels": 4, "commentThreads": 3}


async def test_channels_sends_50_ids_per_call(serve: Serve) -> None:
    base, state = serve(clock=Clock(NOON))
    ids = [c.id for c in state.pool[:120]]
    async with YouTubeClient("k", base, timeout=5) as yt:
        got = await yt.channels(ids + ids[:10])  # duplicates asked once
        assert got.units == 3 and [c.id for c in got] == ids
        empty = await yt.channels([])
        assert (empty.units, len(empty)) == (0, 0)
    assert (await usage(base))["calls"]["channels"] == 3


async def test_101st_search_is_quota_exceeded_until_midnight_pacific(serve: Serve) -> None:
    clock = Clock(NOON)
    base, _ = serve(clock=clock)
    async with YouTubeClient("k", base, timeout=5, clock=clock) as yt:
        for i in range(100):
            await yt.search_channels(f"coffee {i}", 1)
        assert yt.units_used == 10_000
        with pytest.raises(QuotaExceeded) as info:
            await yt.search_channels("coffee", 1)
        assert info.value.status == 403 and info.value.reason == "quotaExceeded"
        assert info.value.reset_at == datetime(2024, 6, 2, 7, 0, tzinfo=UTC)
        with pytest.raises(QuotaExceeded):  # list calls too: 10,000 + 1 > 10,000
            await yt.channels(["UCx"])
        clock.now = datetime(2024, 6, 2, 6, 59, 59, tzinfo=UTC)
        with pytest.raises(QuotaExceeded):
            await yt.comment_threads(video_id="abc", max_results=1)
        clock.now = datetime(2024, 6, 2, 7, 0, tzinfo=UTC)  # midnight PDT
        assert (await yt.search_channels("coffee", 1)).units == 100
    u = await usage(base)
    assert (u["day"], u["units"], u["quotaExceeded"]) == ("2024-06-02", 100, 3)
    assert u["history"] == {"2024-06-01": 10_000, "2024-06-02": 100}
    assert u["totalUnits"] == 10_100


async def test_quota_error_body_has_the_real_shape(serve: Serve) -> None:
    base, _ = serve(daily_units=150)
    async with httpx.AsyncClient() as http:
        ok = await http.get(f"{base}/search", params={"key": "k", "part": "snippet", "q": "coffee"})
        body = ok.json()
        assert body["kind"] == "youtube#searchListResponse" and body["etag"]
        assert body["pageInfo"]["resultsPerPage"] == 5 and len(body["items"]) == 5
        item = body["items"][0]
        assert item["kind"] == "youtube#searchResult"
        assert item["id"]["kind"] == "youtube#channel"
        assert set(item["snippet"]) >= {"channelId", "title", "description", "thumbnails"}
        denied = await http.get(
            f"{base}/search", params={"key": "k", "part": "snippet", "q": "coffee"}
        )
    assert denied.status_code == 403
    error = denied.json()["error"]
    assert error["code"] == 403 and "quota" in error["message"]
    assert error["errors"][0]["reason"] == "quotaExceeded"
    assert error["errors"][0]["domain"] == "youtube.quota"


def test_next_reset_is_dst_correct() -> None:
    # Spring forward (Sun 10 Mar 2024): that Pacific day is 23 hours long.
    early = datetime(2024, 3, 10, 8, 30, tzinfo=UTC)  # 00:30 PST
    assert quota_day(early) == datetime(2024, 3, 10).date()
    assert next_reset(early) == datetime(2024, 3, 11, 7, 0, tzinfo=UTC)  # 00:00 PDT
    assert next_reset(early) - early == timedelta(hours=22, minutes=30)
    assert next_reset(datetime(2024, 3, 9, 20, 0, tzinfo=UTC)) == datetime(
        2024, 3, 10, 8, 0, tzinfo=UTC
    )
    # Fall back (Sun 3 Nov 2024): 25 hours long.
    start = datetime(2024, 11, 3, 7, 0, tzinfo=UTC)  # 00:00 PDT
    assert next_reset(start) == datetime(2024, 11, 4, 8, 0, tzinfo=UTC)  # 00:00 PST
    assert next_reset(start) - start == timedelta(hours=25)
    # Exactly at midnight: the next one, a day later; any zone in, UTC out.
    midnight = datetime(2024, 6, 2, 0, 0, tzinfo=PACIFIC)
    assert next_reset(midnight) == datetime(2024, 6, 3, 7, 0, tzinfo=UTC)
    assert next_reset(midnight).tzinfo is UTC
    with pytest.raises(ValueError, match="aware"):
        next_reset(datetime(2024, 6, 1, 12, 0))


async def test_stand_in_resets_at_pacific_midnight_across_dst(serve: Serve) -> None:
    clock = Clock(datetime(2024, 3, 10, 20, 0, tzinfo=UTC))
    base, _ = serve(clock=clock, daily_units=100)
    async with YouTubeClient("k", base, timeout=5, clock=clock) as yt:
        await yt.search_channels("coffee", 1)
        with pytest.raises(QuotaExceeded) as info:
            await yt.search_channels("coffee", 1)
        assert info.value.reset_at == datetime(2024, 3, 11, 7, 0, tzinfo=UTC)
        clock.now = datetime(2024, 3, 11, 6, 59, 59, tzinfo=UTC)
        with pytest.raises(QuotaExceeded):
            await yt.search_channels("coffee", 1)
        clock.now = datetime(2024, 3, 11, 7, 0, tzinfo=UTC)  # not 08:00: DST began
        await yt.search_channels("coffee", 1)


async def test_missing_key_is_400(serve: Serve) -> None:
    base, _ = serve()
    async with YouTubeClient(None, base, timeout=5) as yt:
        with pytest.raises(YouTubeError) as info:
            await yt.search_channels("coffee")
    assert (info.value.status, info.value.reason) == (400, "keyInvalid")
    assert not isinstance(info.value, QuotaExceeded)
    async with httpx.AsyncClient() as http:
        raw = await http.get(f"{base}/channels", params={"part": "snippet", "id": "UCx"})
        assert raw.status_code == 400
        assert raw.json()["error"]["errors"][0]["reason"] == "keyInvalid"
        no_part = await http.get(f"{base}/channels", params={"key": "k", "id": "UCx"})
        assert no_part.status_code == 400
    u = await usage(base)
    assert (u["units"], u["badRequests"]) == (0, 3)


async def test_injected_timeouts_raise_youtube_timeout(serve: Serve) -> None:
    base, _ = serve(timeout_rate=1.0, timeout_delay=0.6)
    async with YouTubeClient("k", base, timeout=0.2) as yt:
        with pytest.raises(YouTubeTimeout) as info:
            await yt.channels(["UCx"])
        assert isinstance(info.value, YouTubeError) and info.value.reason == "timeout"
        assert yt.units_used == 0
    u = await usage(base)
    assert (u["injectedTimeouts"], u["units"]) == (1, 0)


async def test_injected_errors_are_500_backend_error_and_not_charged(serve: Serve) -> None:
    base, _ = serve(error_rate=1.0)
    async with YouTubeClient("k", base, timeout=5) as yt:
        with pytest.raises(YouTubeError) as info:
            await yt.search_channels("coffee")
    assert (info.value.status, info.value.reason) == (500, "backendError")
    assert (await usage(base))["units"] == 0


async def test_partial_error_rate_charges_only_successes(serve: Serve) -> None:
    base, state = serve(error_rate=0.3, seed=3)
    ok = failed = 0
    async with YouTubeClient("k", base, timeout=5) as yt:
        for c in state.pool[:40]:
            try:
                await yt.channels([c.id])
                ok += 1
            except YouTubeError as exc:
                assert exc.status == 500
                failed += 1
        assert yt.units_used == ok
    assert 0 < failed < 40
    u = await usage(base)
    assert (u["units"], u["injectedErrors"]) == (ok, failed)


async def test_comment_threads_errors_and_arguments(serve: Serve) -> None:
    base, _ = serve()
    async with YouTubeClient("k", base, timeout=5) as yt:
        with pytest.raises(YouTubeError) as info:
            await yt.comment_threads(channel_id="UCnobody", max_results=5)
        assert (info.value.status, info.value.reason) == (404, "channelNotFound")
        by_video = await yt.comment_threads(video_id="dQw4w9WgXcQ", max_results=3)
        assert all(c.video_id == "dQw4w9WgXcQ" for c in by_video)
        with pytest.raises(ValueError):
            await yt.comment_threads(max_results=5)
        with pytest.raises(ValueError):
            await yt.comment_threads(channel_id="a", video_id="b")
        with pytest.raises(ValueError):
            await yt.search_channels("coffee", max_results=51)
        with pytest.raises(ValueError):
            await yt.search_channels("  ")


async def test_unreachable_server_is_a_transport_error() -> None:
    app = stand_in_app()
    url, stop = serve_in_thread(app)
    stop()
    stop()  # idempotent
    async with YouTubeClient("k", url + STAND_IN_PREFIX, timeout=2) as yt:
        with pytest.raises(YouTubeError) as info:
            await yt.search_channels("coffee")
    assert (info.value.status, info.value.reason) == (0, "transport")


async def test_client_reuses_a_given_http_client(serve: Serve) -> None:
    base, _ = serve()
    async with httpx.AsyncClient() as http:
        async with YouTubeClient("k", base, timeout=5, http=http) as yt:
            await yt.channels(["UCx"])
        assert not http.is_closed  # not ours to close
        assert UNIT_COST == {"search": 100, "channels": 1, "commentThreads": 1}
