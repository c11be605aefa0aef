-- A rate limit's bucket saturates at the latest due time (docs/design.md, "Rates" and
-- "Time"): units spent after the fact used to move `tat` by units * emission without a
-- bound, so one large take failed with "interval out of range", and a few moved `tat`
-- past year 9999, where every later take, peek and `rota limits` failed to load it.
-- rate_take now stops `tat` at 9999-12-30, and buckets already past it are brought back.
-- Take units of a rate limit (docs/design.md, "Rates"), at clock_timestamp() read after
-- the bucket's row lock is held (so time spent waiting for the lock never makes a taker
-- look earlier than it is), plus the queue's clock offset.
--   p_max_wait NULL: after the fact: always granted now, the bucket may go below zero.
--   otherwise: granted when the units are there within p_max_wait (the caller waits
--   until `at`, a reservation no later taker can have); else refused, nothing changes
--   but the refusal count, and `at` is the moment the units will be there.
-- Returns granted, at, and wait_s: seconds from the take until `at` (>= 0).
-- Computed times saturate (docs/design.md, "Time"): a debt of units spent after the fact
-- ends at the latest due time, 9999-12-30, at the most, so a huge take neither overflows
-- the interval arithmetic nor leaves `tat` where no reader can load it.
CREATE OR REPLACE FUNCTION {schema}.rate_take(
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
    latest_due constant timestamptz := '9999-12-30 00:00:00+00';
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
    SET tat = CASE WHEN p_units * extract(epoch FROM p_emission)::numeric
                        < extract(epoch FROM latest_due - base)::numeric
                   THEN base + p_units * p_emission ELSE latest_due END,
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

UPDATE {schema}.rate_buckets SET tat = '9999-12-30 00:00:00+00'
WHERE tat > '9999-12-30 00:00:00+00';
