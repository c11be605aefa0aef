-- First sight of schedules: their rows, created now (queue clock); ticks before it are
-- not owed. Names in one order, so concurrent registrations cannot deadlock.
INSERT INTO {schema}.schedules (name, created_at, updated_at)
SELECT n.name, now() + %(offset)s::interval, now() + %(offset)s::interval
FROM unnest(%(names)s::text[]) AS n(name)
ORDER BY n.name
ON CONFLICT (name) DO NOTHING
