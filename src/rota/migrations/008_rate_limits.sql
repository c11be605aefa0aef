-- Rate limits shared by every worker (docs/design.md, "Rates"): one bucket row per
-- (limit, key), spent by rate_take under the row's lock, so every process on every host
-- sees one bucket. A generic cell rate algorithm (a token bucket kept as one instant):
-- `tat` is the instant the bucket is full again; a unit refills every `emission`
-- (per / limit, rounded up to the microsecond); `burst` units can be taken at once from a
-- full bucket. A tat further ahead than burst * emission is a bucket below zero: units
-- spent after the fact, or a backoff, that later takers wait out.
CREATE TABLE {schema}.rate_buckets (
    name         text NOT NULL CHECK (name <> ''),
    key          text NOT NULL DEFAULT '',           -- '' for an unkeyed limit
    tat          timestamptz NOT NULL,               -- full again at this instant
    limit_units  bigint NOT NULL CHECK (limit_units > 0),
    per          interval NOT NULL,
    burst        bigint NOT NULL CHECK (burst > 0),
    emission     interval NOT NULL,
    window_start timestamptz NOT NULL,               -- the fixed window of `per` now counted
    window_units bigint NOT NULL DEFAULT 0,          -- units taken in it (for display)
    prev_units   bigint NOT NULL DEFAULT 0,          -- units taken in the window before
    taken        bigint NOT NULL DEFAULT 0,          -- units ever taken
    refused      bigint NOT NULL DEFAULT 0,          -- takes ever refused (deferred jobs)
    backoff_until timestamptz,                       -- the last backoff asked for
    updated_at   timestamptz NOT NULL,
    PRIMARY KEY (name, key)
);

-- Jobs deferred because a rate limit had no units for them, and until when: the
-- dashboard's "waiting jobs". A row whose job has moved on (claimed again, deferred for
-- another reason, deleted) no longer matches its job's run_after and is not counted;
-- noting a wait deletes the limit's waits that ended over an hour ago.
CREATE TABLE {schema}.rate_waits (
    job_id bigint PRIMARY KEY,
    name   text NOT NULL,
    key    text NOT NULL,
    until  timestamptz NOT NULL
);
CREATE INDEX rate_waits_name_until ON {schema}.rate_waits (name, until);

-- Take units of a rate limit (docs/design.md, "Rates"), at clock_timestamp() read after
-- the bucket's row lock is held (so time spent waiting for the lock never makes a taker
-- look earlier than it is), plus the queue's clock offset.
--   p_max_wait NULL: after the fact: always granted now, the bucket may go below zero.
--   otherwise: granted when the units are there within p_max_wait (the caller waits
--   until `at`, a reservation no later taker can have); else refused, nothing changes
--   but the refusal count, and `at` is the moment the units will be there.
-- Returns granted, at, and wait_s: seconds from the take until `at` (>= 0).
CREATE FUNCTION {schema}.rate_take(
    p_name text, p_key text, p_units bigint, p_limit bigint, p_per interval,
    p_burst bigint, p_emission interval, p_max_wait interval, p_offset interval
) RETURNS TABLE (granted boolean, at timestamptz, wait_s float8)
LANGUAGE plpgsql AS $$
DECLARE
    b record;
    t timestamptz;
    base timestamptz;
    free_at timestamptz;
    w_start timestamptz;
BEGIN
    -- A bucket's state is soft: losing the last few milliseconds of takes in a server
    -- crash forgets units, it never invents them. Not waiting for the WAL flush keeps
    -- the row lock short, which is what bounds takes per second on one key.
    PERFORM set_config('synchronous_commit', 'off', true);
    INSERT INTO {schema}.rate_buckets AS r
        (name, key, tat, limit_units, per, burst, emission, window_start, updated_at)
    VALUES (p_name, p_key, '-infinity', p_limit, p_per, p_burst, p_emission,
            '-infinity', clock_timestamp() + p_offset)
    ON CONFLICT (name, key) DO NOTHING;
    SELECT * INTO b FROM {schema}.rate_buckets r
    WHERE r.name = p_name AND r.key = p_key FOR UPDATE;
    t := clock_timestamp() + p_offset;
    base := greatest(b.tat, t);
    IF p_max_wait IS NULL THEN
        free_at := t;
    ELSE
        -- The units are there once the bucket holds p_units: burst - p_units emissions
        -- before it is full again.
        free_at := greatest(base - (p_burst - p_units) * p_emission, t);
        IF free_at > t + p_max_wait THEN
            UPDATE {schema}.rate_buckets r
            SET refused = r.refused + 1, limit_units = p_limit, per = p_per,
                burst = p_burst, emission = p_emission, updated_at = t
            WHERE r.name = p_name AND r.key = p_key;
            RETURN QUERY SELECT false, free_at,
                extract(epoch FROM free_at - t)::float8;
            RETURN;
        END IF;
    END IF;
    -- Units count in the fixed window of `per` (aligned to the epoch) their take falls in.
    w_start := to_timestamp(floor(extract(epoch FROM free_at)
                                  / extract(epoch FROM p_per))
                            * extract(epoch FROM p_per));
    w_start := greatest(w_start, b.window_start);  -- a clock moved back counts as now
    UPDATE {schema}.rate_buckets r
    SET tat = base + p_units * p_emission,
        limit_units = p_limit, per = p_per, burst = p_burst, emission = p_emission,
        prev_units = CASE WHEN w_start = r.window_start THEN r.prev_units
                          WHEN w_start = r.window_start + p_per THEN r.window_units
                          ELSE 0 END,
        window_units = CASE WHEN w_start = r.window_start THEN r.window_units + p_units
                            ELSE p_units END,
        window_start = greatest(w_start, r.window_start),
        taken = r.taken + p_units,
        updated_at = t
    WHERE r.name = p_name AND r.key = p_key;
    RETURN QUERY SELECT true, free_at, extract(epoch FROM free_at - t)::float8;
END
$$;
