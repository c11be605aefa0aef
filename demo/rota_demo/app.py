"""The example application: an outreach product (brand brief to
creators) as a rota pipeline.

A brand's web page becomes a brief; the brief becomes YouTube searches; each creator
found is enriched, scored, its comments read, a rationale written, contact details
found and a first message drafted. The application keeps its own tables (users,
subscriptions, campaigns, creators, a credit ledger) in its own schema, and rota's claim
reads plan and pause state from the ``campaign_groups`` view over them: one source of
truth.

Stages in runner order (earlier stages win; the work-generating search is last):
``enrich`` (batch 25, one channels.list call), ``contacts`` (5, 5), ``draft`` (5, 5),
``rationale`` (8, 8), ``comments`` (8, 8), ``score`` (1, 1), ``search`` (1, 1).

Configuration comes from the environment, so the CLI (``rota run|worker|serve --app
rota_demo.app:build_pipeline``) and the demo driver build the same app:

- ``ROTA_DEMO_SCHEMA``: the application's schema (default ``rota_demo_app``).
- ``ROTA_DEMO_YOUTUBE_URL``: base URL of a YouTube Data API stand-in; without it the real
  API is used with ``YOUTUBE_API_KEY``.
- ``ROTA_DEMO_PROFILE``: ``default`` (the product's real durations: 15 min stale window,
  300 s platform timeout, 1 min backoff) or ``fast`` (seconds: the demo and tests).
- ``ROTA_DEMO_LLM_FAILURE_RATE``: fraction of language-model calls that fail (default 0).
- ``ROTA_DEMO_LLM_RPM``: the language model's requests per minute (default 600). The
  stand-in answers 429 past it; the stages that call the model declare the matching
  :class:`rota.RateLimit`, so every worker keeps to it together.
"""

from __future__ import annotations

import os
import random
import re
import uuid
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from importlib import resources
from typing import Any, TypeVar

import httpx
from psycopg import AsyncConnection, sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from rota import (
    Allowance,
    DeferJob,
    InvalidInput,
    Job,
    JobContext,
    Pipeline,
    Plan,
    Plans,
    Queue,
    Quota,
    RateLimit,
    Stage,
)

from . import llm
from .brief import Brief, build_brief, fetch_page
from .youtube import Channel, QuotaExceeded, YouTubeClient

T = TypeVar("T")

# Lowest to highest: the claim ranks by this order, and the pricing table's "search
# queue" row is read from it (rota_demo.pricing).
PLANS = Plans([
    Plan("free", "Free", 0, {"searches_per_day": 3, "draft_credits_per_month": 40}),
    Plan("standard", "Standard", 1, {"searches_per_day": 10, "draft_credits_per_month": 200}),
    Plan("pro", "Pro", 2, {"searches_per_day": 50, "draft_credits_per_month": 1000}),
])

STAGE_TYPES = ("enrich", "contacts", "draft", "rationale", "comments", "score", "search")
SCORE_THRESHOLD = 35  # creators scoring below this are not worth a message

# The YouTube Data API's daily quota: 10,000 units, reset at midnight Pacific time; runs
# keep 1,000 in reserve for interactive use.
YOUTUBE_QUOTA = Quota("youtube", 10_000, reserve=1_000, reset_tz="America/Los_Angeles")
#: Each owner's daily searches, the limit read from the owner's plan.
SEARCHES = Allowance("searches", "searches_per_day", reset_tz="America/Los_Angeles")
#: The quotas and allowances the pipeline spends (the dashboard shows them).
QUOTAS = (YOUTUBE_QUOTA, SEARCHES)


@dataclass(frozen=True)
class Profile:
    """Durations of one way to run the app (``default``: production; ``fast``: demo)."""

    stale_after: timedelta
    platform_timeout: timedelta
    time_budget: timedelta
    backoff_base: timedelta
    http_timeout: float


PROFILES = {
    "default": Profile(timedelta(minutes=15), timedelta(seconds=300),
                       timedelta(seconds=220), timedelta(minutes=1), 10.0),
    "fast": Profile(timedelta(seconds=8), timedelta(seconds=6), timedelta(seconds=3),
                    timedelta(seconds=1), 1.5),
}


def profile() -> Profile:
    """The profile named by ``ROTA_DEMO_PROFILE`` (default ``default``).

    Raises:
        InvalidInput: an unknown profile name.
    """
    name = os.environ.get("ROTA_DEMO_PROFILE", "default")
    try:
        return PROFILES[name]
    except KeyError:
        raise InvalidInput(f"ROTA_DEMO_PROFILE={name!r}: use one of "
                           f"{', '.join(PROFILES)}") from None


def app_schema() -> str:
    """The application's schema name (``ROTA_DEMO_SCHEMA``, default ``rota_demo_app``)."""
    return os.environ.get("ROTA_DEMO_SCHEMA", "rota_demo_app")


def queue_settings() -> dict[str, Any]:
    """The :class:`rota.Queue` settings this app needs (plans, groups view, types,
    durations from the profile)."""
    p = profile()
    return {
        "plans": PLANS,
        "groups": f"{app_schema()}.campaign_groups",
        "types": STAGE_TYPES,
        "stale_after": p.stale_after,
        "backoff_base": p.backoff_base,
    }


async def migrate_app(conn: AsyncConnection[Any], schema: str | None = None) -> None:
    """Create the application's tables and the ``campaign_groups`` view (idempotent)."""
    text = resources.files("rota_demo").joinpath("schema.sql").read_text("utf-8")
    ident = sql.Identifier(schema or app_schema())
    await conn.execute(sql.SQL(text).format(app=ident).as_string(conn).encode())


class FlakyModel:
    """A language model wrapper that fails a given fraction of calls (seeded), to show
    retries, give-ups and refunds with the offline model."""

    def __init__(self, model: llm.LanguageModel, failure_rate: float, seed: int = 7):
        self.model = model
        self.failure_rate = failure_rate
        self._random = random.Random(seed)

    async def complete(self, prompt: str, *, max_tokens: int) -> llm.Completion:
        if self._random.random() < self.failure_rate:
            raise RuntimeError("language model: 529 overloaded")
        return await self.model.complete(prompt, max_tokens=max_tokens)


class ProviderLimitedModel:
    """The language-model provider's requests-per-minute limit, as the stand-in
    enforces it, shared by every process (on the database's clock): a bucket refilled
    continuously at ``rpm`` a minute that holds at most one second's worth
    (``rpm / 60``, at least 1), as providers enforce a per-minute limit; a request that
    finds it empty is answered 429 with a ``Retry-After`` of when the next one will be
    there (:class:`llm.ModelRateLimited`). Every request and its answer is logged in the
    app's ``llm_requests``."""

    def __init__(self, model: llm.LanguageModel, queue: Queue, rpm: int,
                 schema: str) -> None:
        self.model = model
        self.queue = queue
        self.rate = rpm / 60.0  # requests a second
        self.capacity = max(rpm / 60.0, 1.0)
        self.t = sql.Identifier(schema)

    async def complete(self, prompt: str, *, max_tokens: int) -> llm.Completion:
        async with self.queue.connection() as conn:
            cur = await conn.execute(sql.SQL("SELECT ok, retry_after FROM {}.llm_admit(%s, %s)")
                                     .format(self.t), [self.rate, self.capacity])
            row = await cur.fetchone()
        assert row is not None
        if not row[0]:
            raise llm.ModelRateLimited(round(float(row[1]), 3))
        return await self.model.complete(prompt, max_tokens=max_tokens)


def llm_rpm() -> int:
    """The language model's requests per minute (``ROTA_DEMO_LLM_RPM``, default 600).

    Raises:
        InvalidInput: not a positive integer.
    """
    raw = os.environ.get("ROTA_DEMO_LLM_RPM", "600") or "600"
    if not raw.isdigit() or int(raw) < 1:
        raise InvalidInput(f"ROTA_DEMO_LLM_RPM={raw!r}: use a positive integer")
    return int(raw)


def llm_requests_limit(rpm: int) -> RateLimit:
    """The rota rate limit matching the model's requests per minute (docs/design.md,
    "Rates"): one unit per job of each stage that calls the model, evenly spaced."""
    return RateLimit("llm-requests", rpm, timedelta(minutes=1))


class App:
    """The handlers and the clients they share (one per process).

    Args:
        queue: the rota queue (its groups relation is this app's ``campaign_groups``).
        youtube: a YouTube Data API client (the stand-in's or the real one).
        model: the language model.
        http: an httpx client for brand pages.
        schema: the application's schema.
    """

    def __init__(self, queue: Queue, youtube: YouTubeClient, model: llm.LanguageModel,
                 http: httpx.AsyncClient, schema: str) -> None:
        self.queue = queue
        self.youtube = youtube
        self.model = model
        self.http = http
        self.schema = schema
        self.t = sql.Identifier(schema)
        self.youtube_quota = YOUTUBE_QUOTA
        self.searches = SEARCHES
        self.llm_limit = llm_requests_limit(llm_rpm())

    def pipeline(self, platform_timeout: timedelta) -> Pipeline:
        """The seven stages, in runner order (docs/design.md, "The runner")."""
        return Pipeline(self.queue, [
            Stage("enrich", 25, batch_handler=self.enrich, quota=self.youtube_quota),
            Stage("contacts", 5, 5, self.contacts),
            Stage("draft", 5, 5, self.draft, on_give_up=self.refund_draft,
                  rate_limits=self.llm_limit),
            Stage("rationale", 8, 8, self.rationale, rate_limits=self.llm_limit),
            Stage("comments", 8, 8, self.comments, quota=self.youtube_quota,
                  rate_limits=self.llm_limit),
            Stage("score", 1, 1, self.score, rate_limits=self.llm_limit),
            Stage("search", 1, 1, self.search, quota=self.youtube_quota, quota_cost=100),
        ], quotas=[self.searches], platform_timeout=platform_timeout)

    # -- helpers ---------------------------------------------------------------------

    def q(self, text: str) -> sql.Composed:
        return sql.SQL(text).format(t=self.t)

    async def creator(self, ctx: JobContext) -> dict[str, Any]:
        async with ctx.connection() as c:
            cur = c.cursor(row_factory=dict_row)
            await cur.execute(self.q(
                "SELECT cr.*, ca.brief FROM {t}.creators cr "
                "JOIN {t}.campaigns ca ON ca.id = cr.campaign_id "
                "WHERE cr.campaign_id = %s AND cr.channel_id = %s"),
                [ctx.job.payload["campaign_id"], ctx.job.payload["channel_id"]])
            row = await cur.fetchone()
        if row is None:
            raise LookupError(f"creator {ctx.job.payload} is gone")
        return row

    async def advance(self, ctx: JobContext, column: str, value: Any,
                      next_type: str | None) -> None:
        """Store a stage's result and enqueue the next stage, in one transaction that
        also completes this job (done iff the writes commit)."""
        p = ctx.job.payload
        async with ctx.connection() as c, c.transaction():
            await c.execute(
                sql.SQL("UPDATE {t}.creators SET {col} = %s, updated_at = now() "
                        "WHERE campaign_id = %s AND channel_id = %s")
                .format(t=self.t, col=sql.Identifier(column)),
                [value, p["campaign_id"], p["channel_id"]])
            if next_type is not None:
                # Through the pipeline's queue (ctx.queue), so the next stage's own
                # rules (its max_attempts) apply.
                await ctx.queue.enqueue(
                    next_type, {"campaign_id": p["campaign_id"], "channel_id": p["channel_id"]},
                    group_id=ctx.job.group_id,
                    dedupe_key=f"{next_type}:{p['campaign_id']}:{p['channel_id']}", conn=c)
            await ctx.complete(conn=c)

    @staticmethod
    def brief_of(row: Mapping[str, Any]) -> Brief:
        return Brief.from_payload(row["brief"])

    @staticmethod
    def channel_of(row: Mapping[str, Any]) -> Channel:
        return Channel.from_payload(row["channel"])

    async def ask(self, ctx: JobContext, call: Awaitable[T]) -> T:
        """A language-model call; a 429 holds every worker off the model for its
        Retry-After and defers this job until then (``ctx.backoff``), not a failure."""
        try:
            return await call
        except llm.ModelRateLimited as exc:
            await ctx.backoff(self.llm_limit, exc.retry_after)

    def count_tokens(self, ctx: JobContext, completion: llm.Completion) -> None:
        ctx.count("tokens_spent", completion.tokens)

    # -- stages ----------------------------------------------------------------------

    async def search(self, ctx: JobContext) -> None:
        """Brief from the brand's page, then one search.list per query (100 units each);
        every channel found becomes an ``enrich`` job. Spends the owner's daily search
        allowance (deferred to its reset when spent)."""
        campaign_id = ctx.job.payload["campaign_id"]
        max_results = int(ctx.job.payload.get("max_results", 5))
        await ctx.spend(self.searches, 1)
        async with ctx.connection() as c:
            cur = await c.execute(self.q("SELECT brand_url, brief FROM {t}.campaigns "
                                         "WHERE id = %s"), [campaign_id])
            row = await cur.fetchone()
        if row is None:
            raise LookupError(f"campaign {campaign_id} is gone")
        brief = (Brief.from_payload(row[1]) if row[1] else
                 build_brief(await fetch_page(row[0], self.http), row[0]))
        found: dict[str, str] = {}
        for query in brief.search_queries[: int(ctx.job.payload.get("queries", 3))]:
            await ctx.spend(self.youtube_quota, 100)
            try:
                result = await self.youtube.search_channels(query, max_results)
            except QuotaExceeded:
                await ctx.exhaust(self.youtube_quota)
            ctx.count("searches")
            for hit in result:
                found.setdefault(hit.channel_id, hit.title)
        async with ctx.connection() as c, c.transaction():
            await c.execute(self.q("UPDATE {t}.campaigns SET brief = %s WHERE id = %s"),
                            [Jsonb(brief.to_payload()), campaign_id])
            async with c.cursor() as cur:
                await cur.executemany(self.q(
                    "INSERT INTO {t}.creators (campaign_id, channel_id, title) "
                    "VALUES (%s, %s, %s) ON CONFLICT DO NOTHING"),
                    [(campaign_id, cid, title) for cid, title in found.items()])
            await ctx.queue.enqueue_many([
                {"type": "enrich", "payload": {"campaign_id": campaign_id, "channel_id": cid},
                 "group_id": ctx.job.group_id, "dedupe_key": f"enrich:{campaign_id}:{cid}"}
                for cid in found], conn=c)
            await ctx.complete(conn=c)
        ctx.count("channels_found", len(found))

    async def enrich(self, ctxs: list[JobContext]) -> None:
        """One channels.list call (1 unit) for the whole batch of up to 25 channels."""
        ids = sorted({ctx.job.payload["channel_id"] for ctx in ctxs})
        await ctxs[0].spend(self.youtube_quota, 1)
        try:
            result = await self.youtube.channels(ids)
        except QuotaExceeded:
            await ctxs[0].exhaust(self.youtube_quota)
        by_id = {ch.id: ch for ch in result}
        for ctx in ctxs:
            ch = by_id.get(ctx.job.payload["channel_id"])
            if ch is None:
                await ctx.fail(f"channel {ctx.job.payload['channel_id']} not found")
                continue
            await self.advance(ctx, "channel", Jsonb(ch.to_payload()), "score")
            ctx.count("channels_enriched")

    async def score(self, ctx: JobContext) -> None:
        """The model scores the creator's fit (0-100); good fits go on to comments."""
        row = await self.creator(ctx)
        value, completion = await self.ask(ctx, llm.score(
            self.model, self.brief_of(row), self.channel_of(row), ""))
        self.count_tokens(ctx, completion)
        await self.advance(ctx, "score", value,
                           "comments" if value >= SCORE_THRESHOLD else None)
        ctx.count("scored")

    async def comments(self, ctx: JobContext) -> None:
        """Read the channel's comment threads (1 unit) and summarize the audience."""
        row = await self.creator(ctx)
        await ctx.spend(self.youtube_quota, 1)
        try:
            threads = await self.youtube.comment_threads(
                channel_id=ctx.job.payload["channel_id"], max_results=20)
        except QuotaExceeded:
            await ctx.exhaust(self.youtube_quota)
        completion = await self.ask(ctx, llm.summarize_comments(
            self.model, self.brief_of(row), self.channel_of(row), list(threads)))
        self.count_tokens(ctx, completion)
        await self.advance(ctx, "comments_summary", completion.text, "rationale")
        ctx.count("comments_read", len(threads))

    async def rationale(self, ctx: JobContext) -> None:
        """The model writes why this creator fits the brief."""
        row = await self.creator(ctx)
        completion = await self.ask(ctx, llm.rationale(
            self.model, self.brief_of(row), self.channel_of(row)))
        self.count_tokens(ctx, completion)
        await self.advance(ctx, "rationale", completion.text, "contacts")

    async def contacts(self, ctx: JobContext) -> None:
        """Contact details from the channel's public description (emails, links)."""
        row = await self.creator(ctx)
        description = self.channel_of(row).description or ""
        contact = {
            "emails": sorted(set(re.findall(r"[\w.+-]+@[\w-]+\.[\w.]+", description))),
            "links": sorted(set(re.findall(r"https?://\S+", description)))[:5],
        }
        await self.advance(ctx, "contact", Jsonb(contact), "draft")
        ctx.count("contacts_found", len(contact["emails"]) + len(contact["links"]))

    async def draft(self, ctx: JobContext) -> None:
        """Draft the first message. Spends one monthly plan credit, once per job (the
        ledger's unique key); out of credits, the job waits for next month."""
        row = await self.creator(ctx)
        user_id, limit = await self.credit_limit(ctx)
        if user_id is not None and not await self.spend_credit(ctx, user_id, limit):
            raise DeferJob(await self.next_month(ctx), "no draft credits left this month")
        completion = await self.ask(ctx, llm.draft_message(
            self.model, self.brief_of(row), self.channel_of(row),
            comments_summary=row["comments_summary"] or ""))
        self.count_tokens(ctx, completion)
        await self.advance(ctx, "draft", completion.text, None)
        ctx.count("drafts_written")

    async def credit_limit(self, ctx: JobContext) -> tuple[str | None, int]:
        async with ctx.connection() as c:
            cur = await c.execute(self.q(
                "SELECT owner_id, plan FROM {t}.campaign_groups WHERE group_id = %s"),
                [ctx.job.group_id])
            row = await cur.fetchone()
        if row is None or row[0] is None:
            return None, 0
        plan = PLANS[row[1]] if row[1] in PLANS else PLANS.lowest
        return row[0], int(plan.limits["draft_credits_per_month"])

    async def spend_credit(self, ctx: JobContext, user_id: str, limit: int) -> bool:
        """Pay one credit for this job unless it holds an unrefunded spend already (a
        draft retried after a failed attempt does not pay twice; one retried by an
        operator after a refund pays again). Returns ``False`` when none are left."""
        async with ctx.connection() as c, c.transaction():
            # Serialize one user's spenders so two drafts cannot both take the last credit
            # (keyed by this app's schema too: apps in other schemas have other ledgers).
            await c.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                            [f"credits:{self.schema}:{user_id}"])
            cur = await c.execute(self.q(
                "SELECT count(*) FILTER (WHERE s.job_id = %s AND NOT EXISTS ("
                "   SELECT 1 FROM {t}.credit_ledger r WHERE r.refund_of = s.id)),"
                " coalesce(sum(s.amount) FILTER (WHERE NOT EXISTS ("
                "   SELECT 1 FROM {t}.credit_ledger r WHERE r.refund_of = s.id)), 0)"
                " FROM {t}.credit_ledger s WHERE s.user_id = %s AND s.kind = 'spend'"
                " AND s.created_at >= date_trunc('month', now() + %s)"),
                [ctx.job.id, user_id, self.queue.clock_offset])
            row = await cur.fetchone()
            assert row is not None
            if row[0]:
                return True
            if row[1] >= limit:
                return False
            await c.execute(self.q(
                "INSERT INTO {t}.credit_ledger (user_id, job_id, kind, amount, created_at)"
                " VALUES (%s, %s, 'spend', 1, now() + %s)"),
                [user_id, ctx.job.id, self.queue.clock_offset])
        ctx.count("credits_spent")
        return True

    async def next_month(self, ctx: JobContext) -> datetime:
        async with ctx.connection() as c:
            cur = await c.execute("SELECT date_trunc('month', now() + %s) + interval '1 month'",
                                  [self.queue.clock_offset])
            row = await cur.fetchone()
        assert row is not None
        value: datetime = row[0]
        return value

    async def refund_draft(self, job: Job, conn: AsyncConnection[Any]) -> None:
        """Give-up hook of ``draft``: refund the credit the job spent, exactly once per
        give-up (inside the give-up transaction; ``refund_of`` is unique, so a spend is
        never refunded twice)."""
        await conn.execute(self.q(
            "INSERT INTO {t}.credit_ledger (user_id, job_id, kind, amount, refund_of)"
            " SELECT s.user_id, s.job_id, 'refund', s.amount, s.id FROM {t}.credit_ledger s"
            " WHERE s.job_id = %s AND s.kind = 'spend'"
            " ON CONFLICT (refund_of) DO NOTHING"), [job.id])


def build_app(queue: Queue) -> App:
    """The app with clients configured from the environment."""
    p = profile()
    base = os.environ.get("ROTA_DEMO_YOUTUBE_URL")
    key = os.environ.get("YOUTUBE_API_KEY") or ("demo-key" if base else None)
    if key is None:
        raise InvalidInput("set ROTA_DEMO_YOUTUBE_URL (a stand-in) or YOUTUBE_API_KEY")
    youtube = (YouTubeClient(key, base, timeout=p.http_timeout) if base
               else YouTubeClient(key, timeout=p.http_timeout))
    # A little latency per call, as a real model has, so runs take time to drain.
    model: llm.LanguageModel = llm.OfflineModel(
        latency=float(os.environ.get("ROTA_DEMO_LLM_LATENCY", "0.02") or 0))
    rate = float(os.environ.get("ROTA_DEMO_LLM_FAILURE_RATE", "0") or 0)
    if rate > 0:
        model = FlakyModel(model, rate, seed=os.getpid())
    model = ProviderLimitedModel(model, queue, llm_rpm(), app_schema())
    http = httpx.AsyncClient(timeout=p.http_timeout, follow_redirects=True)
    return App(queue, youtube, model, http, app_schema())


def build_pipeline(queue: Queue) -> Pipeline:
    """The CLI's app entry point (``--app rota_demo.app:build_pipeline``)."""
    return build_app(queue).pipeline(profile().platform_timeout)


# The CLI reads the Queue settings from here (called, so the environment is read late).
build_pipeline.queue_settings = queue_settings  # type: ignore[attr-defined]


@dataclass(frozen=True)
class SeedPlan:
    """What :func:`seed` creates: ``campaigns`` per plan, one large Pro campaign."""

    per_plan: Mapping[str, int]
    big_campaign_results: int = 50
    queries: int = 2


async def seed(conn: AsyncConnection[Any], queue: Queue, pages_base: str, plan: SeedPlan,
               *, rng: random.Random) -> list[uuid.UUID]:
    """Users, subscriptions and campaigns across the plans, each with a ``search`` job;
    the first Pro campaign is very large (``big_campaign_results`` channels a query).

    Returns:
        The campaign ids, the large one first.
    """
    pages = ["stridewell.html", "ember-oak.html", "lantern-fox.html", "tally.html"]
    t = sql.Identifier(app_schema())
    campaigns: list[uuid.UUID] = []
    jobs: list[dict[str, Any]] = []
    n = 0
    for plan_id in ("pro", "standard", "free"):
        for i in range(plan.per_plan.get(plan_id, 0)):
            n += 1
            user = f"user-{plan_id}-{i}"
            await conn.execute(sql.SQL(
                "INSERT INTO {}.users (id, email) VALUES (%s, %s) ON CONFLICT DO NOTHING")
                .format(t), [user, f"{user}@example.com"])
            if plan_id != "free" or i % 2:  # half the free users have no subscription row
                await conn.execute(sql.SQL(
                    "INSERT INTO {}.subscriptions (user_id, plan) VALUES (%s, %s) "
                    "ON CONFLICT DO NOTHING").format(t), [user, plan_id])
            cid = uuid.UUID(int=rng.getrandbits(128))
            url = f"{pages_base.rstrip('/')}/{pages[n % len(pages)]}"
            await conn.execute(sql.SQL(
                "INSERT INTO {}.campaigns (id, user_id, brand_url) VALUES (%s, %s, %s)")
                .format(t), [cid, user, url])
            big = plan_id == "pro" and i == 0
            campaigns.append(cid)
            jobs.append({"type": "search", "group_id": str(cid),
                         "dedupe_key": f"search:{cid}",
                         "payload": {"campaign_id": str(cid), "queries": 3 if big else plan.queries,
                                     "max_results": plan.big_campaign_results if big else 5}})
    await queue.enqueue_many(jobs, conn=conn)
    return campaigns


__all__: Sequence[str] = ["PLANS", "STAGE_TYPES", "YOUTUBE_QUOTA", "App", "SeedPlan", "build_app",
                          "build_pipeline", "migrate_app", "queue_settings", "seed"]
