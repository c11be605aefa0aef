-- The example application's own tables (an outreach product), in the app's own schema.
-- The campaign_groups view is the one source of truth rota's claim
-- reads plan and pause state from: no copy of a plan lives in rota's tables.

CREATE SCHEMA IF NOT EXISTS {app};

CREATE TABLE IF NOT EXISTS {app}.users (
    id         text PRIMARY KEY,
    email      text NOT NULL UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- A user without a row here is on the lowest plan (Free).
CREATE TABLE IF NOT EXISTS {app}.subscriptions (
    user_id text PRIMARY KEY REFERENCES {app}.users (id) ON DELETE CASCADE,
    plan    text NOT NULL
);

CREATE TABLE IF NOT EXISTS {app}.campaigns (
    id         uuid PRIMARY KEY,
    user_id    text REFERENCES {app}.users (id) ON DELETE CASCADE,
    brand_url  text NOT NULL,
    status     text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'paused')),
    brief      jsonb,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE OR REPLACE VIEW {app}.campaign_groups AS
SELECT c.id::text AS group_id,
       c.user_id AS owner_id,
       CASE WHEN c.user_id IS NULL THEN NULL ELSE coalesce(s.plan, 'free') END AS plan,
       c.status = 'active' AS active
FROM {app}.campaigns c
LEFT JOIN {app}.subscriptions s ON s.user_id = c.user_id;

-- One row per creator found for a campaign, filled in stage by stage.
CREATE TABLE IF NOT EXISTS {app}.creators (
    campaign_id      uuid NOT NULL REFERENCES {app}.campaigns (id) ON DELETE CASCADE,
    channel_id       text NOT NULL,
    title            text,
    channel          jsonb,        -- enrich: channels.list data
    score            integer,      -- score: fit 0-100
    comments_summary text,         -- comments: what the audience says
    rationale        text,         -- rationale: why this creator fits
    contact          jsonb,        -- contacts: email / links found
    draft            text,         -- draft: the first message
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (campaign_id, channel_id)
);

-- Plan credits: a draft spends one, a draft that gives up refunds it. A job spends at most
-- once per give-up cycle: it pays again only after its spend was refunded (a retried
-- draft pays again), and each spend is refunded at most once (refund_of is unique).
CREATE TABLE IF NOT EXISTS {app}.credit_ledger (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id    text NOT NULL,
    job_id     bigint NOT NULL,
    kind       text NOT NULL CHECK (kind IN ('spend', 'refund')),
    amount     integer NOT NULL,
    refund_of  bigint UNIQUE REFERENCES {app}.credit_ledger (id),
    created_at timestamptz NOT NULL DEFAULT now(),
    CHECK ((kind = 'refund') = (refund_of IS NOT NULL))
);
CREATE INDEX IF NOT EXISTS credit_ledger_job_idx ON {app}.credit_ledger (job_id);

-- The language-model stand-in's side of its requests-per-minute limit: every request
-- it was sent, and whether it answered (200) or refused it (429). Shared by every
-- process, as a provider's count is.
CREATE TABLE IF NOT EXISTS {app}.llm_requests (
    at     timestamptz NOT NULL,
    status int NOT NULL
);
CREATE INDEX IF NOT EXISTS llm_requests_at ON {app}.llm_requests (at);

-- The stand-in's bucket: requests it could answer now, refilled continuously at the
-- requests-per-minute rate up to one second's worth.
CREATE TABLE IF NOT EXISTS {app}.llm_bucket (
    id     int PRIMARY KEY CHECK (id = 1),
    tokens float8 NOT NULL,
    at     timestamptz NOT NULL
);

-- One request to the stand-in: answered (ok) when the bucket holds one, else 429 with
-- the seconds until it will. One call, under the bucket row's lock, its clock read
-- after the lock is held.
CREATE OR REPLACE FUNCTION {app}.llm_admit(p_rate float8, p_capacity float8)
RETURNS TABLE (ok boolean, retry_after float8)
LANGUAGE plpgsql AS $$
DECLARE
    b record;
    t timestamptz;
    v_tokens float8;
BEGIN
    INSERT INTO {app}.llm_bucket (id, tokens, at) VALUES (1, p_capacity, clock_timestamp())
    ON CONFLICT (id) DO NOTHING;
    SELECT * INTO b FROM {app}.llm_bucket WHERE id = 1 FOR UPDATE;
    t := clock_timestamp();
    v_tokens := least(p_capacity,
                      b.tokens + greatest(extract(epoch FROM t - b.at), 0) * p_rate);
    ok := v_tokens >= 1;
    UPDATE {app}.llm_bucket
    SET tokens = CASE WHEN ok THEN v_tokens - 1 ELSE v_tokens END, at = t
    WHERE id = 1;
    INSERT INTO {app}.llm_requests (at, status) VALUES (t, CASE WHEN ok THEN 200 ELSE 429 END);
    retry_after := CASE WHEN ok THEN 0 ELSE (1 - v_tokens) / p_rate END;
    RETURN NEXT;
END
$$;
