"""Briefs from the sample brand pages, and fetching pages over loopback HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rota_demo.brief import (
    PAGES_DIR,
    Brief,
    PageError,
    PageTooLarge,
    build_brief,
    fetch_page,
    pages_app,
    sample_pages,
)
from rota_demo.loopback import serve_in_thread

EXPECTED: dict[str, dict[str, Any]] = {
    "ember-oak.html": {
        "brand": "Ember & Oak Coffee Roasters",
        "title": "Specialty Coffee Subscription – Ember & Oak Coffee Roasters",
        "summary": "Small-batch specialty coffee, roasted weekly in Portland and shipped within "
        "48 hours. Single-origin beans and espresso blends by subscription.",
        "keywords": [
            "specialty coffee",
            "coffee subscription",
            "brewing guides",
            "roasted",
            "single origin beans",
            "espresso blend",
            "portland",
            "small-batch",
        ],
        "search_queries": ["specialty coffee", "coffee subscription", "brewing guides"],
        "headings": [
            "Fresh specialty coffee, roasted every week",
            "How the subscription works",
            "This month's single origin",
            "Ethiopia Guji, washed",
            "Brewing guides",
        ],
    },
    "lantern-fox.html": {
        "brand": "Lantern Fox Games",
        "title": "Lantern Fox Games - Cozy roguelike adventures",
        "summary": "A cozy roguelike about a minotaur who tends a labyrinth garden. Coming to "
        "Steam and Nintendo Switch.",
        "keywords": [
            "cozy roguelike",
            "moss minotaur",
            "steam",
            "wishlist",
            "labyrinth garden",
            "nintendo switch",
            "adventures",
            "demo",
        ],
        # Names seen only capitalised ("Moss & Minotaur", "Nintendo Switch") are not topics.
        "search_queries": ["cozy roguelike", "labyrinth garden"],
        "headings": ["Moss & Minotaur", "Features", "Wishlist the demo on Steam", "Devlog"],
    },
    "stridewell.html": {
        "brand": "Stridewell",
        "title": "Stridewell | Trail Running Shoes Built for Long Miles",
        "summary": "Stridewell makes lightweight trail running shoes with grippy outsoles and "
        "recycled uppers, tested on ultramarathon courses by our own runners.",
        "keywords": [
            "running shoes",
            "trail running",
            "long miles",
            "ultramarathon courses",
            "trail shoe",
            "grippy",
            "lightweight trail",
            "runners",
        ],
        "search_queries": ["running shoes", "trail running", "long miles"],
        "headings": [
            "Trail running shoes for long miles",
            "The Ridgeline 3 trail shoe",
            "Built to be repaired",
            "Tested by our ultra team",
        ],
    },
    "tally.html": {
        "brand": "Tally",
        "title": "Tally: the budgeting app for irregular income",
        # No meta description: the first paragraph, cut at a sentence within 300 characters.
        "summary": "Tally is a budgeting app for freelancers, creators and shift workers. It "
        "plans your spending from the money you actually have, not the money you hope to "
        "earn, so irregular income stops feeling like a monthly emergency.",
        "keywords": [
            "budgeting app",
            "irregular income",
            "savings goals",
            "money",
            "paycheck",
            "schedule",
            "dollar",
            "job",
        ],
        "search_queries": ["budgeting app", "irregular income", "savings goals"],
        "headings": [
            "Budgeting that works when your paycheck doesn't arrive on schedule",
            "Give every dollar a job",
            "Savings goals you can see",
            "Private by design",
        ],
    },
}


def test_sample_pages_are_shipped() -> None:
    assert sample_pages() == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_brief_of_each_sample_page(name: str) -> None:
    url = f"http://127.0.0.1:8000/{name}"
    brief = build_brief((PAGES_DIR / name).read_text(encoding="utf-8"), url)
    got = {key: getattr(brief, key) for key in EXPECTED[name]}
    assert got == EXPECTED[name]
    assert brief.url == url
    assert 1 <= len(brief.search_queries) <= 3
    assert len(brief.summary) <= 300
    assert Brief.from_payload(brief.to_payload()) == brief
    # Scripts, styles, navigation and footers never leak into the brief.
    text = " ".join([*brief.keywords, *brief.headings, brief.summary]).lower()
    for leak in ("datalayer", "font-family", "privacy", "wishlist on steam", "log in"):
        assert leak not in text


def test_meta_and_og_tags() -> None:
    brief = build_brief((PAGES_DIR / "stridewell.html").read_text(), "https://stridewell.example/")
    assert brief.og == {
        "site_name": "Stridewell",
        "title": "Trail running shoes built for long miles",
        "description": "Lightweight, grippy, repairable trail running shoes.",
        "type": "website",
        "image": "https://stridewell.example/og/ridgeline.jpg",
    }
    assert brief.description.startswith("Stridewell makes lightweight")


def test_brand_from_the_url_when_the_page_has_no_site_name() -> None:
    html = (PAGES_DIR / "ember-oak.html").read_text()
    assert build_brief(html, "https://emberandoak.example/").brand == (
        "Ember & Oak Coffee Roasters"
    )
    # A one-segment title that does not name the site loses to the host name.
    bare = "<html><head><title>Home</title></head><body><p>Hi</p></body></html>"
    assert build_brief(bare, "https://www.acme.example/").brand == "Acme"
    assert build_brief("<p>no title at all", "https://www.acme.example/").brand == "Acme"
    titled = "<title>Welcome to Acme Tools</title>"
    assert build_brief(titled, "https://www.acme.example/").brand == "Welcome to Acme Tools"


def test_malformed_html_never_raises_and_is_deterministic() -> None:
    html = (
        "<html><title>Bolt &amp; Nut | Tools for small workshops</title><body><main>"
        "<h1>Hand tools <b>for small workshops<p>Unclosed <div>woodworking hand tools, "
        "woodworking hand tools and <script>var x = '</main>';</script> more <!-- hidden --> "
        "</main></body><p>after"
    )
    first = build_brief(html, "https://boltandnut.example/")
    assert first == build_brief(html, "https://boltandnut.example/")
    assert first.brand == "Bolt & Nut"
    assert "woodworking hand" in first.keywords or "hand tools" in first.keywords
    assert all("var x" not in k for k in first.keywords)
    empty = build_brief("", "https://quietbrand.example/")
    assert (empty.brand, empty.keywords, empty.search_queries) == ("Quietbrand", [], ["Quietbrand"])


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    """The sample pages plus a few misbehaving routes, served on loopback."""

    async def big(request: Request) -> Response:
        return Response("<p>" + "x" * 5000 + "</p>", media_type="text/html")

    async def json_page(request: Request) -> Response:
        return Response('{"a": 1}', media_type="application/json")

    async def slow(request: Request) -> Response:
        await asyncio.sleep(0.5)
        return Response("<p>late</p>", media_type="text/html")

    async def latin1(request: Request) -> Response:
        body = '<meta charset="iso-8859-1"><title>Café Zoë</title>'.encode("latin-1")
        return Response(body, media_type="application/xhtml+xml")

    async def redirect(request: Request) -> Response:
        return Response(status_code=302, headers={"location": "/pages/tally.html"})

    app = Starlette(
        routes=[
            Route("/big", big),
            Route("/json", json_page),
            Route("/slow", slow),
            Route("/latin1", latin1),
            Route("/moved", redirect),
        ]
    )
    app.mount("/pages", pages_app())
    url, stop = serve_in_thread(app)
    yield url
    stop()


async def test_fetch_each_sample_page_over_http(site: str) -> None:
    async with httpx.AsyncClient() as http:
        for name in sample_pages():
            url = f"{site}/pages/{name}"
            html = await fetch_page(url, http)
            assert html == (PAGES_DIR / name).read_text(encoding="utf-8")
            brief = build_brief(html, url)
            assert brief.keywords == EXPECTED[name]["keywords"]
        moved = await fetch_page(f"{site}/moved", http)
        assert "<title>Tally" in moved


async def test_fetch_errors_are_clear(site: str) -> None:
    async with httpx.AsyncClient() as http:
        with pytest.raises(PageError, match="HTTP 404") as info:
            await fetch_page(f"{site}/pages/nope.html", http)
        assert info.value.status == 404 and info.value.url.endswith("nope.html")
        with pytest.raises(PageTooLarge, match="4000-byte cap"):
            await fetch_page(f"{site}/big", http, max_bytes=4000)
        assert len(await fetch_page(f"{site}/big", http, max_bytes=6000)) == 5007
        with pytest.raises(PageError, match="not an HTML page"):
            await fetch_page(f"{site}/json", http)
        with pytest.raises(PageError, match="timed out"):
            await fetch_page(f"{site}/slow", http, read_timeout=0.1)
        with pytest.raises(PageError, match="not an http"):
            await fetch_page("ftp://example.com/x", http)
        with pytest.raises(PageError, match="not an http"):
            await fetch_page("/relative/path", http)
        with pytest.raises(PageError, match="ConnectError"):
            await fetch_page("http://127.0.0.1:9/", http)


async def test_fetch_decodes_the_declared_charset(site: str) -> None:
    async with httpx.AsyncClient() as http:
        html = await fetch_page(f"{site}/latin1", http)
    assert build_brief(html, f"{site}/latin1").title == "Café Zoë"
