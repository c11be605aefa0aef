"""The dashboard over HTTP (in process): every page renders a queue holding jobs in every
state; the credential is required, exactly once; writes need it, a CSRF token and a
same-origin request; database text is escaped; no secret or connection string is shown;
mounted under a prefix its links follow the prefix; `rota dashboard` refuses to start
without a credential unless read-only on loopback."""

from __future__ import annotations

import base64
import re
from datetime import timedelta
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from starlette.applications import Starlette
from starlette.routing import Mount

from rota import ConfigError, Queue, dashboard_app
from rota.cli import cli
from rota.web.auth import check_credential, csrf_ok, csrf_token, is_loopback
from tests.cli_app import build_stages_only
from tests.dashboard_data import EVIL_GROUP, IMG, SCRIPT, YOUTUBE, Seeded, seed

SECRET = "dash-S3cret_value-for_tests"
PAGES = ["/", "/fairness", "/runs", "/jobs", "/quotas", "/jobs?status=failed",
         "/jobs?type=search&status=pending", f"/jobs?group={EVIL_GROUP}"]


def basic(secret: str = SECRET, user: str = "rota") -> dict[str, str]:
    token = base64.b64encode(f"{user}:{secret}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def client(app: Any, host: str = "127.0.0.1", raise_errors: bool = True,
           **kw: Any) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_errors)
    return httpx.AsyncClient(transport=transport, base_url=f"http://{host}", **kw)


@pytest.fixture
async def seeded(queue: Queue) -> Seeded:
    return await seed(queue)


async def test_every_page_renders_jobs_in_every_state(queue: Queue, seeded: Seeded,
                                                      database_url: str) -> None:
    app = dashboard_app(queue, secret=SECRET, quotas=[YOUTUBE])
    async with client(app, headers=basic()) as c:
        pages = {p: await c.get(p) for p in
                 [*PAGES, f"/jobs/{seeded.failed_id}", f"/jobs/{seeded.cancel_id}",
                  f"/jobs/{seeded.running_id}", f"/jobs/{seeded.done_id}"]}
    for path, r in pages.items():
        assert r.status_code == 200, (path, r.text[:500])
        assert r.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in r.headers["content-security-policy"]
        # Nothing from another origin, no secret, no connection string.
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", r.text), path
        assert SECRET not in r.text and database_url not in r.text
        assert "postgresql://" not in r.text and "127.0.0.1:5432" not in r.text
    home = pages["/"].text
    for label in ("search", "enrich", "draft", "oldest due waiting", "<svg"):
        assert label in home
    fairness = pages["/fairness"].text
    for label in ("Pro", "Standard", "Free", "paused-co", "acme"):
        assert label in fairness
    runs = pages["/runs"].text
    for reason in ("no_work", "time_budget", "quota_reserve", "quota_exhausted", "error"):
        assert reason in runs
    quotas = pages["/quotas"].text
    assert "3,200" in quotas and "10,000" in quotas and "America/Los_Angeles" in quotas
    failed = pages[f"/jobs/{seeded.failed_id}"].text
    assert ">Retry</button>" in failed and ">Cancel</button>" not in failed
    pending = pages[f"/jobs/{seeded.cancel_id}"].text
    assert ">Cancel</button>" in pending and ">Retry</button>" not in pending
    running = pages[f"/jobs/{seeded.running_id}"].text
    assert "<button" not in running


async def test_database_text_is_escaped_everywhere(queue: Queue, seeded: Seeded) -> None:
    app = dashboard_app(queue, secret=SECRET)
    async with client(app, headers=basic()) as c:
        texts = [(await c.get(p)).text for p in
                 [*PAGES, f"/jobs/{seeded.failed_id}", f"/jobs/{seeded.cancel_id}"]]
    for text in texts:
        assert SCRIPT not in text and IMG not in text and "<b>not bold</b>" not in text
        assert "window.__pwned" not in text or "&lt;script&gt;" in text or "&#34;" in text
        # The only script element is htmx's.
        assert re.findall(r"<script\b[^>]*>", text) == [
            '<script src="/static/htmx.min.js" defer>']
    payload_page = texts[-1]
    assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in payload_page
    assert "&lt;/pre&gt;&lt;b&gt;not bold&lt;/b&gt;" in payload_page


@pytest.mark.parametrize("headers", [
    {}, basic("wrong"), {"Authorization": f"Bearer {SECRET}x"},
    {"Authorization": f"Token {SECRET}"}, {"Authorization": "Basic !!notbase64"},
    {"Authorization": f"Bearer {SECRET} {SECRET}"}, {"Cookie": f"secret={SECRET}"},
    {"X-Rota-Secret": SECRET},
], ids=["none", "wrong-basic", "longer-bearer", "token-scheme", "bad-base64", "repeated",
        "cookie", "custom-header"])
async def test_every_path_needs_the_credential(queue: Queue, headers: dict[str, str]) -> None:
    app = dashboard_app(queue, secret=SECRET)
    async with client(app, headers=headers) as c:
        for path in ["/", "/jobs", "/metrics", "/static/htmx.min.js", f"/?secret={SECRET}"]:
            r = await c.get(path)
            assert r.status_code == 401, path
            assert r.headers["www-authenticate"].startswith("Basic")
            assert SECRET not in r.text
        assert (await c.post("/jobs/1/retry")).status_code == 401


async def test_both_schemes_carry_the_credential(queue: Queue) -> None:
    app = dashboard_app(queue, secret=SECRET)
    async with client(app) as c:
        assert (await c.get("/", headers=basic(user="anyone"))).status_code == 200
        assert (await c.get("/", headers={"Authorization": f"Bearer {SECRET}"})
                ).status_code == 200


async def test_two_authorization_headers_are_refused_even_if_both_are_right(
        queue: Queue) -> None:
    app = dashboard_app(queue, secret=SECRET)
    right = basic()["Authorization"]
    async with client(app) as c:
        for second in (right, f"Bearer {SECRET}", "Bearer wrong"):
            r = await c.get("/", headers=[("Authorization", right), ("Authorization", second)])
            assert r.status_code == 400
    assert check_credential([right, right], SECRET) == "ambiguous"


async def test_retry_and_cancel_need_a_csrf_token_from_the_page(queue: Queue,
                                                                seeded: Seeded) -> None:
    app = dashboard_app(queue, secret=SECRET)
    async with client(app, headers=basic()) as c:
        page = (await c.get(f"/jobs/{seeded.failed_id}")).text
        token = re.search(r'name="csrf" value="([^"]+)"', page)
        assert token is not None
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        url = f"/jobs/{seeded.failed_id}/retry"
        for body in ("", "csrf=", "csrf=123.abc", f"csrf={csrf_token('other-secret')}",
                     f"csrf={token[1]}&csrf={token[1]}"):
            r = await c.post(url, content=body, headers=form)
            assert r.status_code == 403, body
        r = await c.post(url, content=f"csrf={token[1]}",
                         headers={**form, "Origin": "https://evil.example"})
        assert r.status_code == 403
        r = await c.post(url, content=f"csrf={token[1]}",
                         headers={**form, "Sec-Fetch-Site": "cross-site"})
        assert r.status_code == 403
        assert (await queue.get_job(seeded.failed_id)).status == "failed"  # type: ignore[union-attr]
        r = await c.post(url, content=f"csrf={token[1]}",
                         headers={**form, "Origin": "http://127.0.0.1",
                                  "Sec-Fetch-Site": "same-origin"})
        assert r.status_code == 303
        assert r.headers["location"] == f"/jobs/{seeded.failed_id}?done=retried"
        job = await queue.get_job(seeded.failed_id)
        assert job is not None and (job.status, job.attempts) == ("pending", 0)
        # Cancel: the pending hostile job; then again: refused, nothing changes.
        url = f"/jobs/{seeded.cancel_id}/cancel"
        r = await c.post(url, content=f"csrf={token[1]}", headers=form)
        assert r.headers["location"] == f"/jobs/{seeded.cancel_id}?done=cancelled"
        r = await c.post(url, content=f"csrf={token[1]}", headers=form)
        assert r.headers["location"] == f"/jobs/{seeded.cancel_id}?done=cancel-refused"
        shown = (await c.get(r.headers["location"])).text
        assert f"Job {seeded.cancel_id} was not cancelled" in shown
    job = await queue.get_job(seeded.cancel_id)
    assert job is not None and (job.status, job.last_error) == ("failed", "cancelled")


def test_csrf_tokens_expire_and_are_bound_to_the_secret() -> None:
    token = csrf_token(SECRET, now=1_000_000)
    assert csrf_ok(token, SECRET, now=1_000_010)
    assert not csrf_ok(token, SECRET, now=1_000_000 + 13 * 3600)
    assert not csrf_ok(token, SECRET + "x", now=1_000_010)
    assert not csrf_ok(token.replace(".", ".0"), SECRET, now=1_000_010)
    assert SECRET not in token


async def test_read_only_shows_no_buttons_and_refuses_writes(queue: Queue,
                                                             seeded: Seeded) -> None:
    app = dashboard_app(queue, secret=SECRET, read_only=True)
    async with client(app, headers=basic()) as c:
        page = (await c.get(f"/jobs/{seeded.failed_id}")).text
        assert "<button" not in page and "read-only" in page
        r = await c.post(f"/jobs/{seeded.failed_id}/retry",
                         content=f"csrf={csrf_token(SECRET)}",
                         headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert r.status_code == 403
    assert (await queue.get_job(seeded.failed_id)).status == "failed"  # type: ignore[union-attr]


async def test_without_a_secret_only_read_only_on_loopback(queue: Queue) -> None:
    for secret in (None, "", "  ", "undefined"):
        with pytest.raises(ConfigError):
            dashboard_app(queue, secret=secret)
    app = dashboard_app(queue, read_only=True)
    async with client(app) as c:
        assert (await c.get("/")).status_code == 200
        assert (await c.post("/jobs/1/retry")).status_code == 403
    for host in ("10.0.0.5", "dashboard.example", "[::1]"):
        async with client(app, host=host) as c:
            expected = 200 if host == "[::1]" else 403
            assert (await c.get("/")).status_code == expected, host
    assert is_loopback("127.0.0.2") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("localhost.example")


async def test_mounted_under_a_prefix_links_follow_it(queue: Queue, seeded: Seeded) -> None:
    outer = Starlette(routes=[Mount("/ops/rota", dashboard_app(queue, secret=SECRET))])
    async with client(outer, headers=basic()) as c:
        r = await c.get("/ops/rota/")
        assert r.status_code == 200
        hrefs = re.findall(r'(?:href|src|action|hx-get)="([^"#]+)"', r.text)
        assert hrefs and all(h.startswith("/ops/rota/") for h in hrefs), hrefs
        assert (await c.get("/ops/rota/static/htmx.min.js")).status_code == 200
        job = await c.get(f"/ops/rota/jobs/{seeded.failed_id}")
        assert f'action="/ops/rota/jobs/{seeded.failed_id}/retry"' in job.text


async def test_bad_filters_are_a_400_page_not_an_error(queue: Queue) -> None:
    app = dashboard_app(queue, secret=SECRET)
    async with client(app, headers=basic()) as c:
        for q in ("status=nope", "id=-1", "id=abc", "before=1e9", "type=" + "x" * 300):
            r = await c.get(f"/jobs?{q}")
            assert r.status_code == 400, q
        assert (await c.get("/runs?before=garbage")).status_code == 400
        assert (await c.get("/jobs/999999")).status_code == 404


TOP_PAGES = ["/", "/fairness", "/runs", "/jobs", "/quotas"]
PARAMS = ["type", "status", "group", "id", "run", "before", "done"]
HOSTILE = ["%00", "a%00b", "%01", "%7F", "%C0%80", "%FF%FE", "%ED%A0%80", "x" * 300,
           "-1", "0", "99999999999999999999", "1e999", "' OR 1=1 --", "%E2%80%AE"]


async def test_every_parameter_of_every_page_is_checked_never_a_500(queue: Queue) -> None:
    """A NUL in a filter was a 500 with a traceback: every page's every parameter is
    checked, and what it refuses is a styled 400 page naming the parameter."""
    app = dashboard_app(queue, secret=SECRET)
    async with client(app, headers=basic()) as c:
        r = await c.get("/jobs?type=%00")
        assert r.status_code == 400
        assert "<h1>Bad request</h1>" in r.text and "/static/dashboard.css" in r.text
        assert "<p>type must not contain a NUL or another control character</p>" in r.text
        for path in TOP_PAGES:
            for name in PARAMS:
                for value in HOSTILE:
                    r = await c.get(f"{path}?{name}={value}")
                    assert r.status_code in (200, 400), (path, name, value, r.text[:300])
                    assert "/static/dashboard.css" in r.text, (path, name, value)


@pytest.mark.parametrize(("path", "heading", "detail"), [
    ("/jobs/abc", "No such job",
     "There is no job &#39;abc&#39;: a job&#39;s id is a whole number from 1 to "
     "9223372036854775807."),
    ("/jobs/0", "No such job", "There is no job &#39;0&#39;"),
    ("/jobs/99999999999999999999", "No such job", "There is no job &#39;9999"),
    ("/jobs/999999", "No such job", "There is no job 999999."),
    ("/runs/not-a-uuid", "No such run",
     "There is no run &#39;not-a-uuid&#39;: a run&#39;s id is a UUID."),
    ("/runs/00000000-0000-0000-0000-000000000000", "No such run",
     "There is no run 00000000-0000-0000-0000-000000000000"),
    ("/nowhere", "Not found", "There is no page /nowhere."),
    ("/jobs/1/nowhere", "Not found", "There is no page /jobs/1/nowhere."),
])
async def test_a_missing_page_is_a_styled_404(queue: Queue, path: str, heading: str,
                                              detail: str) -> None:
    app = dashboard_app(queue, secret=SECRET)
    async with client(app, headers=basic()) as c:
        r = await c.get(path)
    assert r.status_code == 404
    assert f"<h1>{heading}</h1>" in r.text and detail in r.text
    assert "/static/dashboard.css" in r.text and "Not Found" not in r.text
    assert r.headers["content-security-policy"].startswith("default-src 'none'")


async def test_every_refusal_is_a_styled_page(queue: Queue) -> None:
    """401, 403, 405 and 500 too: the dashboard's own page, never bare text or a
    traceback."""
    app = dashboard_app(queue, secret=SECRET)
    async with client(app) as c:
        r = await c.get("/jobs")
        assert r.status_code == 401 and "<h1>Unauthorized</h1>" in r.text
        assert r.headers["www-authenticate"].startswith("Basic")
    async with client(app, headers=basic()) as c:
        r = await c.delete("/jobs")
        assert r.status_code == 405 and "<h1>Method not allowed</h1>" in r.text
        assert "<p>/jobs does not take DELETE.</p>" in r.text
        r = await c.post("/jobs/abc/retry")
        assert r.status_code == 404 and "<h1>No such job</h1>" in r.text
        r = await c.post("/jobs/1/retry", content="csrf=x",
                         headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert r.status_code == 403 and "forbidden: reload the page" in r.text
    ro = dashboard_app(queue, secret=SECRET, read_only=True)
    async with client(ro, headers=basic()) as c:
        r = await c.post("/jobs/1/retry")
        assert r.status_code == 403 and "<p>the dashboard is read-only</p>" in r.text
    async with client(app, headers=basic(), raise_errors=False) as c:
        await queue.close()  # every query now fails: an unexpected error
        r = await c.get("/jobs")
    assert r.status_code == 500 and "<h1>Something went wrong</h1>" in r.text
    assert "Traceback" not in r.text and "/static/dashboard.css" in r.text
    assert r.headers["content-security-policy"].startswith("default-src 'none'")


async def test_jobs_are_paged_by_id_and_each_page_reads_a_bounded_range(
        queue: Queue) -> None:
    await queue.enqueue_many([{"type": "t", "payload": {"i": i}} for i in range(120)])
    app = dashboard_app(queue, secret=SECRET)
    seen: list[int] = []
    url: str | None = "/jobs?type=t"
    async with client(app, headers=basic()) as c:
        while url:
            text = (await c.get(url)).text
            seen += [int(i) for i in re.findall(r'<a href="/jobs/(\d+)">', text)]
            nxt = re.search(r'<a href="([^"]+)">older', text)
            url = nxt[1].replace("&amp;", "&") if nxt else None
    assert seen == sorted(seen, reverse=True) and len(seen) == len(set(seen)) == 120


def test_cli_refuses_to_start_without_a_credential(database_url: str) -> None:
    env = {"DATABASE_URL": database_url, "ROTA_DASHBOARD_SECRET": ""}
    for args in (["dashboard"], ["dashboard", "--read-only", "--host", "0.0.0.0"],
                 ["dashboard", "--host", "127.0.0.1"]):
        result = CliRunner().invoke(cli, args, env=env)
        assert result.exit_code == 2, (args, result.output)
        assert "ROTA_DASHBOARD_SECRET is not set" in result.output
        assert database_url not in result.output


async def test_capped_counts_and_unproven_waits_say_so(queue: Queue, seeded: Seeded,
                                                       monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    from rota.web import queries

    monkeypatch.setattr(queries, "PENDING_CAP", 2)
    monkeypatch.setattr(queries, "OLDEST_DUE_PROBES", (1,))
    app = dashboard_app(queue, secret=SECRET)
    async with client(app, headers=basic()) as c:
        home = (await c.get("/")).text
        fairness = (await c.get("/fairness")).text
    # search has 7 pending jobs: counted up to 2 and marked; its oldest is still proven.
    search = re.search(r"<tr>\s*<td><a[^>]*>search</a></td>(.*?)</tr>", home, re.S)
    assert search is not None and "+</a>" in search[1] and "≥" not in search[1]
    assert "a page counts at most 2 pending jobs of each type" in home
    assert "At least these long" in fairness  # 3 groups wait, 1 probed per type


@pytest.mark.parametrize(("given", "says"), [
    ({}, "No quota is known: give the dashboard the app (<code>--app</code>) or its quotas."),
    ({"quotas": []}, "The app declares no quota and no allowance."),
])
async def test_the_quotas_page_says_why_it_is_empty(queue: Queue, given: dict[str, Any],
                                                    says: str) -> None:
    """With an app that has no quotas it used to say to give it the app."""
    async with client(dashboard_app(queue, secret=SECRET, **given), headers=basic()) as c:
        r = await c.get("/quotas")
    assert r.status_code == 200
    assert says in r.text


async def test_a_type_no_stage_runs_is_shown_as_such(queue: Queue) -> None:
    """A job of a type no stage of the app runs (enqueued from SQL before the types were
    published) is named on the overview, and left out of the fairness page, where it
    showed its group, a Pro one, as the longest waiting."""
    await queue.upsert_group("acme", plan="pro")
    await queue.upsert_group("small", plan="free")
    await queue.enqueue("nosuchtype", {}, group_id="acme")
    queue.clock_offset = timedelta(minutes=5)
    await queue.enqueue("echo", {}, group_id="small")
    queue.clock_offset = timedelta(minutes=10)
    note = ("No stage of the app runs nosuchtype: no run\nwill ever claim its jobs. Add "
            "a stage for\nit, or cancel the pending ones.")
    for known_by in ("the app", "the published types"):
        if known_by == "the app":
            app = dashboard_app(queue, secret=SECRET, pipeline=build_stages_only(queue))
        else:  # as `rota migrate --app` publishes them
            await queue.publish_settings(types=["echo", "boom"])
            app = dashboard_app(queue, secret=SECRET)
        async with client(app, headers=basic()) as c:
            home = (await c.get("/")).text
            fair = (await c.get("/fairness")).text
        assert home.count('<span class="tag unrun">no stage runs it</span>') == 1
        assert ('<td><a href="/jobs?type=nosuchtype">nosuchtype</a> <span class="tag '
                'unrun">no stage runs it</span></td>') in home
        assert note in home
        assert ("Left out: jobs of nosuchtype, which no stage\nof the app runs.") in fair
        longest = fair.split("<h2>Longest waiting</h2>")[1].split("</section>")[0]
        assert re.findall(r'jobs\?group=([^&"]+)', longest) == ["small"]
        assert "<td>Free</td>" in longest and "Pro" not in longest
    # Nothing published and no app: nothing is known to be unrun.
    await queue.publish_settings()
    async with client(dashboard_app(queue, secret=SECRET), headers=basic()) as c:
        home = (await c.get("/")).text
        fair = (await c.get("/fairness")).text
    assert "no stage runs it" not in home and "Left out" not in fair
    longest = fair.split("<h2>Longest waiting</h2>")[1].split("</section>")[0]
    assert re.findall(r'jobs\?group=([^&"]+)', longest) == ["acme", "small"]
