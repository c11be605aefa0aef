"""The dashboard in a real browser: headless Chromium (Debian's ``chromium``, driven by
Playwright on that executable) against ``rota.dashboard_app`` served by uvicorn on
loopback, over a queue holding jobs in every state (tests/dashboard_data.py).

Every page is opened and screenshotted (tests/browser/screenshots/; with
``ROTA_DOCS_SCREENSHOTS=1`` the ``/fairness`` one also goes to docs/img/fairness.png
for the README); no page logs an error (a Content-Security-Policy violation would);
Retry and Cancel are clicked and the database checked; the hostile payload shows as
text and its script never runs; writes without the credential or the page's CSRF
token are refused; pages refresh their content in place, without a reload.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import uvicorn
from psycopg import sql

from rota import Queue, dashboard_app
from tests.dashboard_data import EVIL_GROUP, IMG, SCRIPT, YOUTUBE, Seeded, seed

CHROMIUM = "/usr/bin/chromium"
SECRET = "browser-S3cret_for-tests"
SHOTS = Path(__file__).parent / "screenshots"
DOCS_IMG = Path(__file__).parents[2] / "docs" / "img"

if not Path(CHROMIUM).exists() and os.environ.get("CI") != "true":
    pytest.skip(f"no {CHROMIUM} (apt-get install chromium)", allow_module_level=True)

sync_api = pytest.importorskip("playwright.sync_api")


@dataclass
class Live:
    url: str
    seeded: Seeded
    database_url: str
    schema: str

    def job(self, job_id: int) -> tuple[str, str | None, int]:
        with psycopg.connect(self.database_url) as c:
            row = c.execute(sql.SQL("SELECT status, last_error, attempts FROM {}.jobs "
                                    "WHERE id = %s").format(sql.Identifier(self.schema)),
                            [job_id]).fetchone()
        assert row is not None
        return row[0], row[1], row[2]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield b
        b.close()


@pytest.fixture
def live(database_url: str, schema: str) -> Iterator[Live]:
    """The dashboard on 127.0.0.1 (a free port), in a thread with its own event loop."""

    async def prepare() -> Seeded:
        async with Queue(database_url, schema=schema) as q:
            await q.migrate()
            return await seed(q)

    with ThreadPoolExecutor(1) as pool:  # Playwright's sync API holds this thread's loop
        seeded = pool.submit(asyncio.run, prepare()).result()
    queue = Queue(database_url, schema=schema)
    app = dashboard_app(queue, secret=SECRET, quotas=[YOUTUBE],
                        refresh=timedelta(seconds=2), close_queue=True)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "the dashboard did not start"
        time.sleep(0.05)
    try:
        yield Live(f"http://127.0.0.1:{port}", seeded, database_url, schema)
    finally:
        server.should_exit = True
        thread.join(20)
        sock.close()


@pytest.fixture
def page(browser: Any, live: Live) -> Iterator[Any]:
    context = browser.new_context(http_credentials={"username": "rota", "password": SECRET},
                                  viewport={"width": 1200, "height": 900})
    p = context.new_page()
    p.errors = []  # console errors and page errors, checked by the tests
    p.on("console", lambda m: p.errors.append(m.text) if m.type == "error" else None)
    p.on("pageerror", lambda e: p.errors.append(str(e)))
    yield p
    context.close()


def test_every_page_opens_and_is_screenshotted(page: Any, live: Live) -> None:
    s = live.seeded
    SHOTS.mkdir(exist_ok=True)
    pages = {"overview": ("/", "Jobs by type"), "fairness": ("/fairness", "Fairness"),
             "runs": ("/runs", "Runs"), "jobs": ("/jobs", "Jobs"),
             "jobs-failed": ("/jobs?status=failed", "Jobs"),
             "job-failed": (f"/jobs/{s.failed_id}", f"Job {s.failed_id}"),
             "job-pending": (f"/jobs/{s.cancel_id}", f"Job {s.cancel_id}"),
             "job-running": (f"/jobs/{s.running_id}", f"Job {s.running_id}"),
             "quotas": ("/quotas", "Quotas")}
    for name, (path, heading) in pages.items():
        response = page.goto(live.url + path)
        assert response.status == 200, path
        sync_api.expect(page.locator("h1")).to_contain_text(heading)
        assert page.evaluate("typeof window.htmx") == "object", path  # the script loaded
        page.screenshot(path=SHOTS / f"{name}.png", full_page=True)
    assert page.errors == []
    page.goto(live.url + "/fairness")
    sync_api.expect(page.locator("svg.chart rect.p95")).to_have_count(3)  # Pro, Standard, Free
    if os.environ.get("ROTA_DOCS_SCREENSHOTS") == "1":
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        shutil.copy(SHOTS / "fairness.png", DOCS_IMG / "fairness.png")


def test_a_bad_filter_and_a_missing_page_show_the_dashboards_own_page(
        page: Any, live: Live) -> None:
    """A NUL in a filter (a 500 with a traceback once) is a 400 page, and a job or run
    id that cannot exist a 404 page, each in the dashboard's style, with its header."""
    for path, status, heading, detail in [
            ("/jobs?type=%00", 400, "Bad request",
             "type must not contain a NUL or another control character"),
            ("/jobs/abc", 404, "No such job",
             "There is no job 'abc': a job's id is a whole number from 1 to "
             "9223372036854775807."),
            ("/runs/not-a-uuid", 404, "No such run",
             "There is no run 'not-a-uuid': a run's id is a UUID."),
            ("/nowhere", 404, "Not found", "There is no page /nowhere.")]:
        response = page.goto(live.url + path)
        assert response.status == status, path
        sync_api.expect(page.locator("h1")).to_have_text(heading)
        sync_api.expect(page.locator("main p:not(.asof)")).to_have_text(detail)
        # Styled: the stylesheet applied (the header is a flex row), the nav is there.
        assert page.evaluate(
            "getComputedStyle(document.querySelector('header')).display") == "flex", path
        assert page.get_by_role("link", name="Jobs").count() == 1, path
    # The browser reports each page's own 400 or 404 status; nothing else (no CSP
    # violation, no script error).
    assert page.errors == ["Failed to load resource: the server responded with a status "
                           f"of {s}" for s in ("400 (Bad Request)", *["404 (Not Found)"] * 3)]


def test_a_type_no_stage_runs_is_named_on_the_overview_and_left_out_of_fairness(
        page: Any, live: Live) -> None:
    """Once `rota migrate --app` published the app's stage types, a type outside them
    (here draft) is tagged on the overview and left out of the fairness page."""

    async def publish() -> None:
        async with Queue(live.database_url, schema=live.schema) as q:
            await q.publish_settings(types=["search", "enrich"])

    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, publish()).result()
    page.goto(live.url + "/")
    row = page.locator("tr", has=page.get_by_role("link", name="draft", exact=True))
    sync_api.expect(row.locator(".tag.unrun")).to_have_text("no stage runs it")
    assert page.locator(".tag.unrun").count() == 1
    sync_api.expect(page.locator("p.notice.error")).to_have_text(
        "No stage of the app runs draft: no run will ever claim its jobs. Add a stage for "
        "it, or cancel the pending ones.")
    page.goto(live.url + "/fairness")
    sync_api.expect(page.locator("p.notice.error")).to_have_text(
        "Left out: jobs of draft, which no stage of the app runs. They wait for no claim, "
        "so their waits say nothing of fairness (see the overview).")
    assert page.errors == []


def test_retry_and_cancel_by_clicking(page: Any, live: Live) -> None:
    s = live.seeded
    page.goto(f"{live.url}/jobs/{s.failed_id}")
    page.get_by_role("button", name="Retry").click()
    sync_api.expect(page.locator(".notice")).to_contain_text("is pending again")
    assert live.job(s.failed_id)[0::2] == ("pending", 0)
    assert page.get_by_role("button", name="Retry").count() == 0
    page.goto(f"{live.url}/jobs/{s.cancel_id}")
    page.get_by_role("button", name="Cancel").click()
    sync_api.expect(page.locator(".notice")).to_contain_text("is cancelled")
    assert live.job(s.cancel_id)[:2] == ("failed", "cancelled")
    assert page.errors == []


def test_an_injected_script_shows_as_text_and_never_runs(page: Any, live: Live) -> None:
    s = live.seeded
    for path in (f"/jobs/{s.cancel_id}", f"/jobs/{s.failed_id}", "/runs",
                 f"/jobs?group={EVIL_GROUP}", "/fairness", "/"):
        page.goto(live.url + path)
        page.wait_for_timeout(300)  # time for anything that would run to run
        assert page.evaluate("window.__pwned") is None, path
        assert page.locator("main img").count() == 0, path
    page.goto(f"{live.url}/jobs/{s.cancel_id}")
    payload = page.locator("pre.payload").text_content()
    assert SCRIPT in payload and IMG.replace('"', '\\"') in payload
    assert "</pre><b>not bold</b>" in payload and page.locator("main b").count() == 0
    page.goto(f"{live.url}/jobs/{s.failed_id}")
    assert SCRIPT in page.locator("pre.error").text_content()


def test_a_jobs_result_and_each_failed_attempt_show_as_text(page: Any, live: Live) -> None:
    """The job page (docs/design.md, "Results"): the return value, and each failed
    attempt with its traceback behind a click; hostile text in both stays text."""

    async def made() -> int:
        async with Queue(live.database_url, schema=live.schema) as q:
            job = await q.enqueue("report", {"n": 1})
            assert job is not None
            [claimed] = await q.claim("report", 1)
            try:
                raise ValueError(f"first try {SCRIPT}")
            except ValueError as exc:
                assert await q.fail(claimed, exc) == "retry"
            q.clock_offset = timedelta(hours=1)
            [again] = await q.claim("report", 1)
            assert await q.complete(again, result={"html": SCRIPT, "rows": 3})
            return job.id

    with ThreadPoolExecutor(1) as pool:
        job_id = pool.submit(asyncio.run, made()).result()
    page.goto(f"{live.url}/jobs/{job_id}")
    page.wait_for_timeout(300)
    assert page.evaluate("window.__pwned") is None
    result = page.locator("pre.result").text_content()
    assert result == '{\n  "html": "' + SCRIPT.replace('"', '\\"') + '",\n  "rows": 3\n}'
    sync_api.expect(page.locator("li.attempt")).to_have_count(1)
    assert page.locator("pre.attempt-error").text_content() == f"ValueError: first try {SCRIPT}"
    trace = page.locator("pre.traceback")
    sync_api.expect(trace).to_be_hidden()
    page.get_by_text("Traceback", exact=True).click()
    sync_api.expect(trace).to_be_visible()
    assert trace.text_content().endswith(f"ValueError: first try {SCRIPT}\n")
    assert page.errors == []


def test_a_write_without_the_credential_or_token_is_refused(browser: Any, page: Any,
                                                            live: Live) -> None:
    s = live.seeded
    stranger = browser.new_context()
    try:
        other = stranger.new_page()  # (a browser would show its login prompt)
        assert other.request.get(live.url + "/").status == 401
        r = other.request.post(f"{live.url}/jobs/{s.failed_id}/retry", form={"csrf": "x"})
        assert r.status == 401
    finally:
        stranger.close()
    # Signed in, but without the page's token (what a forged request has).
    page.goto(f"{live.url}/jobs/{s.failed_id}")
    status = page.evaluate("""async (url) => (await fetch(url, {method: 'POST',
        headers: {'Content-Type': 'application/x-www-form-urlencoded'},
        body: 'csrf=1.forged'})).status""", f"{live.url}/jobs/{s.failed_id}/retry")
    assert status == 403
    # The page's real token, posted by a page of another origin (a data: URL): refused.
    token = page.locator("input[name=csrf]").first.get_attribute("value")
    form = (f'<form method="post" action="{live.url}/jobs/{s.failed_id}/retry">'
            f'<input name="csrf" value="{token}"><button>go</button></form>')
    page.goto("data:text/html," + urllib.parse.quote(form))
    with page.expect_navigation():
        page.get_by_role("button", name="go").click()
    assert "forbidden" in page.content() or "unauthorized" in page.content()
    assert live.job(s.failed_id)[0] == "failed"


def test_pages_refresh_in_place_without_a_reload(page: Any, live: Live) -> None:
    page.goto(live.url + "/")
    page.evaluate("window.__marker = 42")
    assert page.get_by_role("link", name="fresh-type").count() == 0
    for job_type in ("fresh-type", "fresher-type"):  # the swapped-in content refreshes too
        with psycopg.connect(live.database_url) as c:
            c.execute(sql.SQL("INSERT INTO {}.jobs (type, payload, max_attempts, run_after, "
                              "created_at) VALUES (%s, '{{}}', 3, now(), now())")
                      .format(sql.Identifier(live.schema)), [job_type])
        sync_api.expect(page.get_by_role("link", name=job_type)).to_be_visible(
            timeout=15_000)
    assert page.evaluate("window.__marker") == 42  # the same document: swapped in place
    # A filter being typed survives the refreshes (the form is outside what refreshes).
    page.goto(live.url + "/jobs")
    page.fill("input[name=group]", "acm")
    before = page.locator("#content .asof").text_content()
    sync_api.expect(page.locator("#content .asof")).not_to_have_text(before, timeout=15_000)
    assert page.input_value("input[name=group]") == "acm"
    assert page.errors == []


# An inline element that wraps has one client rectangle per line; an inline-block (the
# group's cell, cut with an ellipsis) is one line-height tall exactly when on one line.
_LINES = """els => els.map(e => getComputedStyle(e).display === 'inline'
    ? e.getClientRects().length
    : Math.round(e.getBoundingClientRect().height
                 / parseFloat(getComputedStyle(e).lineHeight)))"""


def test_at_1400_px_nothing_wraps_and_runs_and_jobs_link_both_ways(
    browser: Any, live: Live,
) -> None:
    """At 1,400 px: start times, stop reasons (with their colour square), group names and
    plans each on one line; the same cells under the old layout (1,100 px, wrapping
    allowed) do wrap, so the check can fail. A run links to its page, which links to its
    jobs; each of those links to its own page, which links back to the run."""
    context = browser.new_context(http_credentials={"username": "rota", "password": SECRET},
                                  viewport={"width": 1400, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    with psycopg.connect(live.database_url) as c:  # the newest run claimed three jobs
        run_id = c.execute(sql.SQL("SELECT id FROM {}.runs ORDER BY started_at DESC LIMIT 1")
                           .format(sql.Identifier(live.schema))).fetchone()[0]
        s = live.seeded
        c.execute(sql.SQL("UPDATE {}.jobs SET run_id = %s WHERE id = ANY(%s)")
                  .format(sql.Identifier(live.schema)),
                  [run_id, [s.failed_id, s.running_id, s.done_id]])
    try:
        SHOTS.mkdir(exist_ok=True)
        for path, selectors, count in [
            ("/runs", "table.runs time.one-line, table.runs .reason.one-line", 16),
            ("/jobs", "table.jobs time.one-line, table.jobs td.group .one-line", 50 * 3),
            ("/jobs?status=pending",  # the long group names: EVIL_GROUP, paused-co
             "table.jobs time.one-line, table.jobs td.group .one-line", 8 * 3),
        ]:
            page.goto(live.url + path)
            cells = page.locator(selectors)
            lines = cells.evaluate_all(_LINES)
            assert len(lines) == count and set(lines) == {1}, (path, lines)
            name = path.replace("/", "-").replace("?", "-").replace("=", "-")
            page.screenshot(path=SHOTS / f"1400{name}.png", full_page=True)
            page.evaluate("""() => {  /* the CSP refuses a style tag; the CSSOM is fine */
                document.querySelector('main').style.maxWidth = '1100px';
                for (const e of document.querySelectorAll('.one-line, td.id'))
                    e.style.whiteSpace = 'normal';
            }""")
            if path != "/jobs":  # (its first page's groups are short: acme, globex)
                assert max(cells.evaluate_all(_LINES)) > 1, path  # the old layout wrapped
        # The hostile group id, longer than its cell: one line, cut with an ellipsis.
        evil = page.locator("table.jobs td.group .one-line", has_text="evil")
        assert evil.count() == 1 and evil.get_attribute("title") == EVIL_GROUP

        page.goto(live.url + "/runs")
        link = page.locator(f"table.runs a.run-link[href$='/runs/{run_id}']")
        assert link.text_content() == str(run_id)[:8]
        link.click()
        page.wait_for_url(f"{live.url}/runs/{run_id}")
        sync_api.expect(page.locator("h1")).to_contain_text(f"Run {str(run_id)[:8]}")
        page.locator("a.jobs-link").click()
        page.wait_for_url(f"{live.url}/jobs?run={run_id}")
        ids = page.locator("table.jobs tbody tr td:first-child a").all_text_contents()
        assert ids == [str(i) for i in sorted([s.failed_id, s.running_id, s.done_id],
                                              reverse=True)]
        assert set(page.locator("table.jobs a.run-link").all_text_contents()) == {
            str(run_id)[:8]}
        page.locator(f"table.jobs a[href$='/jobs/{s.failed_id}']").click()
        page.wait_for_url(f"{live.url}/jobs/{s.failed_id}")
        page.locator("dl.fields a.run-link").click()
        page.wait_for_url(f"{live.url}/runs/{run_id}")
        page.screenshot(path=SHOTS / "1400-run.png", full_page=True)
        assert page.goto(f"{live.url}/jobs?run=nope").status == 400
        assert page.goto(f"{live.url}/runs/{uuid.uuid4()}").status == 404
        assert errors == []
    finally:
        context.close()
