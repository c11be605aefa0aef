-- Included by dashboard_groups_served and dashboard_throughput (the done_last_hour
-- placeholder): the jobs of the types %(types)s done in the last hour of the including
-- statement's clock (its CTE `clock`), with their costs, index-only type by type from
-- jobs_done_idx (type, finished_at, group_id) INCLUDE (cost).
SELECT d.group_id, d.finished_at, d.cost
FROM unnest(%(types)s::text[]) AS t(type)
CROSS JOIN clock c
CROSS JOIN LATERAL (
    SELECT j.group_id, j.finished_at, j.cost FROM {schema}.jobs j
    WHERE j.status = 'done' AND j.type = t.type
      AND j.finished_at > c.now - interval '1 hour' AND j.finished_at <= c.now
) d
