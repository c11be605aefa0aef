-- The capped claim's count of a capped owner's running jobs (fair_cap_lock; docs/design.md,
-- "Caps") probes jobs_running_group_idx once per group of the owner. Asked as one
-- `group_id = ANY (groups)`, a plan made without statistics (a new or small table) read
-- every running job of every type through jobs_running_idx, at each capped owner among
-- the candidates of every claim (bench/RESULTS.md, section 26). Only the function
-- changes; what it returns is the same.

CREATE OR REPLACE FUNCTION {schema}.fair_cap_lock(p_plan_key text, p_unit text,
                                                  p_groups text[],
                                                  p_stale_before timestamptz)
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    INSERT INTO {schema}.fair_caps (plan_key, unit) VALUES (p_plan_key, p_unit)
    ON CONFLICT DO NOTHING;
    PERFORM 1 FROM {schema}.fair_caps c
    WHERE c.plan_key = p_plan_key AND c.unit = p_unit
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    RETURN (SELECT count(*)
            FROM (SELECT DISTINCT u.group_id FROM unnest(p_groups) AS u(group_id)) g
            CROSS JOIN LATERAL (
                SELECT 1 FROM {schema}.jobs j
                WHERE j.group_id = g.group_id AND j.status = 'running'
                  AND j.locked_at >= p_stale_before) x);
END
$$;
