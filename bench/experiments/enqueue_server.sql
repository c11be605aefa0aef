-- Experiment, not shipped: the database's share of a single enqueue, without the round
-- trip and the commit (bench/RESULTS.md, section 17). Run in the database that
-- bench/experiments/enqueue_profile.py leaves behind (bench_enqueue_profile_rota, schema
-- rota_enqueue, whose jobs_nofair is jobs without the fair trigger):
--   psql -X "$URL" -f bench/experiments/enqueue_server.sql
-- Each figure is microseconds per enqueue over 3,000 in one transaction, rolled back.
CREATE OR REPLACE FUNCTION pg_temp.per_call(kind text, cnt int) RETURNS float
LANGUAGE plpgsql AS $$
DECLARE t0 timestamptz := clock_timestamp(); r record;
BEGIN
  FOR i IN 1..cnt LOOP
    IF kind = 'enqueue_jobs' THEN  -- what Queue.enqueue's statement runs
      SELECT e.problem, (e.job).* INTO r FROM rota_enqueue.enqueue_jobs(
          ARRAY['noop'], ARRAY['{}'::jsonb], ARRAY['g' || (i % 100)], ARRAY[NULL::text],
          ARRAY[NULL::timestamptz], ARRAY[NULL::int], false, NULL::text[], 3, '{}'::jsonb,
          1048576, NULL::regclass, '0'::interval, ARRAY[NULL::jsonb]) AS e;
    ELSIF kind = 'insert' THEN  -- the same row, a plain INSERT (both triggers)
      INSERT INTO rota_enqueue.jobs (type, group_id, payload, max_attempts, run_after,
                                     created_at)
      VALUES ('noop', 'g' || (i % 100), '{}', 3, now(), now()) RETURNING * INTO r;
    ELSIF kind = 'insert_on_conflict' THEN
      INSERT INTO rota_enqueue.jobs (type, group_id, payload, max_attempts, run_after,
                                     created_at)
      VALUES ('noop', 'g' || (i % 100), '{}', 3, now(), now())
      ON CONFLICT DO NOTHING RETURNING * INTO r;
    ELSE  -- 'insert_no_fair_trigger'
      INSERT INTO rota_enqueue.jobs_nofair (type, group_id, payload, max_attempts,
                                            run_after, created_at)
      VALUES ('noop', 'g' || (i % 100), '{}', 3, now(), now()) RETURNING * INTO r;
    END IF;
  END LOOP;
  RETURN extract(epoch FROM clock_timestamp() - t0) * 1000000 / cnt;
END
$$;
BEGIN;  -- warm up
SELECT pg_temp.per_call('enqueue_jobs', 300), pg_temp.per_call('insert', 300),
       pg_temp.per_call('insert_on_conflict', 300),
       pg_temp.per_call('insert_no_fair_trigger', 300);
ROLLBACK;
BEGIN;
SELECT round(pg_temp.per_call('enqueue_jobs', 3000)::numeric, 1) AS enqueue_jobs_us,
       round(pg_temp.per_call('insert', 3000)::numeric, 1) AS insert_us,
       round(pg_temp.per_call('insert_on_conflict', 3000)::numeric, 1) AS on_conflict_us,
       round(pg_temp.per_call('insert_no_fair_trigger', 3000)::numeric, 1) AS no_fair_us;
ROLLBACK;
BEGIN;  -- the other order
SELECT round(pg_temp.per_call('insert_no_fair_trigger', 3000)::numeric, 1) AS no_fair_us,
       round(pg_temp.per_call('insert_on_conflict', 3000)::numeric, 1) AS on_conflict_us,
       round(pg_temp.per_call('insert', 3000)::numeric, 1) AS insert_us,
       round(pg_temp.per_call('enqueue_jobs', 3000)::numeric, 1) AS enqueue_jobs_us;
ROLLBACK;
