-- The schedules' cursors and the queue's clock, one row per name asked for (a name
-- without a row yet has NULL created_at): the one statement a pipeline run spends on
-- its schedules when no tick is due (docs/design.md, "Schedules").
SELECT n.name, s.last_tick, s.created_at, now() + %(offset)s::interval AS now
FROM unnest(%(names)s::text[]) AS n(name)
LEFT JOIN {schema}.schedules s ON s.name = n.name
