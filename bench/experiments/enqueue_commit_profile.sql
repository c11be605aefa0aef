-- Experiment, not shipped: the database's CPU per single enqueue, each in its own
-- transaction (the commit included, synchronous_commit off so that the WAL flush, which
-- a shared disk makes vary by milliseconds, is left out), for two schemas side by side:
-- rota_old (a fresh install of the code before) and rota_new (of the code after), each
-- with groups g0..g99 (bench/RESULTS.md, section 19). A procedure loops CALL-side, so
-- there is no round trip; the backend's CPU is read from /proc/self/stat (superuser,
-- Linux), in ticks of 10 ms, so use a few hundred calls a round and many rounds:
--   psql -X "$URL" -f bench/experiments/enqueue_commit_profile.sql
--   for r in $(seq 24); do for s in rota_old rota_new; do
--     PGOPTIONS="-c synchronous_commit=off" psql -X -q "$URL" -c "CALL enqueue_profile('$s', 400)"
--   done; done
--   psql -X "$URL" -c "SELECT variant, count(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY cpu_us),
--     min(cpu_us) FROM enqueue_profile_out GROUP BY 1"
CREATE TABLE IF NOT EXISTS public.enqueue_profile_out (
    variant text, n int, wall_us float, cpu_us float, at timestamptz DEFAULT clock_timestamp());

CREATE OR REPLACE FUNCTION public.enqueue_profile_ticks() RETURNS bigint
LANGUAGE sql AS $$
    SELECT f[12]::bigint + f[13]::bigint  -- utime + stime
    FROM (SELECT string_to_array(split_part(pg_read_file('/proc/self/stat'), ') ', 2), ' ')
          AS f) s
$$;

CREATE OR REPLACE PROCEDURE public.enqueue_profile(kind text, cnt int)
LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz;
    c0 bigint;
    r record;
BEGIN
    c0 := public.enqueue_profile_ticks();
    t0 := clock_timestamp();
    FOR i IN 1..cnt LOOP
        IF kind = 'rota_old' THEN  -- what Queue.enqueue's statement runs
            SELECT e.problem, (e.job).* INTO r FROM rota_old.enqueue_jobs(
                ARRAY['noop'], ARRAY['{}'::jsonb], ARRAY['g' || (i % 100)], ARRAY[NULL::text],
                ARRAY[NULL::timestamptz], ARRAY[NULL::int], false, NULL::text[], 3,
                '{}'::jsonb, 1048576, NULL::regclass, '0'::interval, ARRAY[NULL::jsonb]) AS e;
        ELSIF kind = 'rota_new' THEN
            SELECT e.problem, (e.job).* INTO r FROM rota_new.enqueue_jobs(
                ARRAY['noop'], ARRAY['{}'::jsonb], ARRAY['g' || (i % 100)], ARRAY[NULL::text],
                ARRAY[NULL::timestamptz], ARRAY[NULL::int], false, NULL::text[], 3,
                '{}'::jsonb, 1048576, NULL::regclass, '0'::interval, ARRAY[NULL::jsonb]) AS e;
        ELSIF kind = 'rota_old_dup' THEN  -- a dedupe key, mostly duplicates of open jobs
            SELECT e.problem, (e.job).* INTO r FROM rota_old.enqueue_jobs(
                ARRAY['noop'], ARRAY['{}'::jsonb], ARRAY['g' || (i % 100)],
                ARRAY['k' || (i % 10)], ARRAY[NULL::timestamptz], ARRAY[NULL::int], false,
                NULL::text[], 3, '{}'::jsonb, 1048576, NULL::regclass, '0'::interval,
                ARRAY[NULL::jsonb]) AS e;
        ELSIF kind = 'rota_new_dup' THEN
            SELECT e.problem, (e.job).* INTO r FROM rota_new.enqueue_jobs(
                ARRAY['noop'], ARRAY['{}'::jsonb], ARRAY['g' || (i % 100)],
                ARRAY['k' || (i % 10)], ARRAY[NULL::timestamptz], ARRAY[NULL::int], false,
                NULL::text[], 3, '{}'::jsonb, 1048576, NULL::regclass, '0'::interval,
                ARRAY[NULL::jsonb]) AS e;
        END IF;
        COMMIT;
    END LOOP;
    INSERT INTO public.enqueue_profile_out (variant, n, wall_us, cpu_us)
    VALUES (kind, cnt, extract(epoch FROM clock_timestamp() - t0) * 1e6 / cnt,
            (public.enqueue_profile_ticks() - c0) * 10000.0 / cnt);
    COMMIT;
END
$$;
