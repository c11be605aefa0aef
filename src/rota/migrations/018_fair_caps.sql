-- Caps per owner that lend idle capacity (docs/design.md, "Caps"): Plan.max_running caps
-- each owner of a plan's running jobs; the claim locks the capped owners among its
-- candidates (fair_caps, fair_cap_lock) and counts their running jobs by group
-- (jobs_running_group_idx).

CREATE INDEX jobs_running_group_idx ON {schema}.jobs (group_id, locked_at)
    WHERE status = 'running';
-- An owner's groups on a plan, for the count of a capped owner's running jobs.
CREATE INDEX groups_owner_idx ON {schema}.groups (owner_id, plan) WHERE owner_id IS NOT NULL;

-- Caps (docs/design.md, "Caps"): one row per capped owner (plan_key, unit, as
-- fair_groups names it) that a claim has taken jobs of, only ever locked, never updated:
-- the claim locks the rows of the capped owners among its candidates (fair_cap_lock),
-- so two claimers never count the same free slot. Rows of owners no longer capped stay
-- (a row an owner; the upkeep does not prune them).
CREATE TABLE {schema}.fair_caps (
    plan_key  text NOT NULL,
    unit      text NOT NULL,
    PRIMARY KEY (plan_key, unit)
);

-- Lock a capped owner for this transaction (its fair_caps row, made when missing; FOR
-- UPDATE SKIP LOCKED: never waits) and count its running jobs whose lock is fresh
-- (locked at or after p_stale_before) among its groups p_groups, as last committed:
-- VOLATILE, so the count reads a snapshot taken after the lock, which sees every claim
-- of another claimer that held it. Returns NULL when another transaction holds the
-- owner (the caller takes none of its jobs). jobs_running_group_idx makes the count a
-- probe per group.
CREATE FUNCTION {schema}.fair_cap_lock(p_plan_key text, p_unit text, p_groups text[],
                                       p_stale_before timestamptz) RETURNS bigint
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
    RETURN (SELECT count(*) FROM {schema}.jobs j
            WHERE j.group_id = ANY (p_groups) AND j.status = 'running'
              AND j.locked_at >= p_stale_before);
END
$$;
