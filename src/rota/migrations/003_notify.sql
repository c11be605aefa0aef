-- Wake sleeping workers when jobs are enqueued: `rota worker` LISTENs on a channel named
-- exactly like the schema (TG_TABLE_SCHEMA here, the same name there, so the two cannot
-- drift). Statement-level, so a batch enqueue sends one notification, and only when the
-- statement inserted rows (ON CONFLICT DO NOTHING may insert none). PostgreSQL delivers
-- notifications at commit and folds identical ones of one transaction into one, so a
-- job enqueued in a rolled-back transaction wakes nobody.
CREATE FUNCTION {schema}.notify_jobs_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM inserted) THEN
        PERFORM pg_notify(TG_TABLE_SCHEMA, 'insert');
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_notify_inserted
    AFTER INSERT ON {schema}.jobs
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.notify_jobs_inserted();
