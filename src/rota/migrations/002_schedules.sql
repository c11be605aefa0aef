-- Periodic schedules (docs/design.md, "Schedules"): one row per schedule name, holding
-- the last tick taken. A tick is enqueued in the transaction that moves last_tick past
-- it, under this row's lock, so each tick is taken once across every worker on every
-- host, also after its job has finished (the dedupe index covers open jobs only).
CREATE TABLE {schema}.schedules (
    name       text PRIMARY KEY,
    last_tick  timestamptz,          -- the latest tick taken (enqueued or skipped); null: none yet
    created_at timestamptz NOT NULL, -- first seen (queue clock): earlier ticks are not owed
    updated_at timestamptz NOT NULL
);
