-- Fail a job under its claim (docs/design.md, "Fail and backoff"). Attempts left: back to
-- pending with run_after = now + least(backoff_base * 2^attempts, max_backoff) (base 1
-- minute: 2, then 4 minutes, never more than an hour by default). Attempts used up, or
-- give_up (a row that cannot be read): failed, finished, give-up hook owed. The error
-- text is kept, and so is the claim's token, so a repeated fail under the same claim
-- can tell what this one did (docs/design.md, "Settling twice").
-- Computed times saturate: the backoff is worked out in float seconds (the exponent
-- capped at 60, so 2^attempts cannot overflow) and capped at max_backoff, and the due
-- time at latest_due, so no run_after leaves the range a reader can load: 31 reclaims
-- and a fail at max_attempts 50 once made it year 10193.
-- Each attempt's error (message and traceback, bounded by the caller) is kept in
-- job_errors, and a waiter is told when the job ends failed (docs/design.md, "Results").
WITH f AS (
    UPDATE {schema}.jobs
    SET status = CASE WHEN attempts >= max_attempts OR %(give_up)s THEN 'failed'
                      ELSE 'pending' END,
        finished_at = CASE WHEN attempts >= max_attempts OR %(give_up)s
                           THEN now() + %(offset)s::interval END,
        run_after = CASE WHEN attempts >= max_attempts OR %(give_up)s THEN run_after
                         ELSE least(now() + %(offset)s::interval
                                    + make_interval(secs => least(
                                        extract(epoch FROM %(backoff_base)s::interval)::float8
                                          * power(2::float8, least(attempts, 60)),
                                        extract(epoch FROM %(max_backoff)s::interval)::float8)),
                                    %(latest_due)s::timestamptz) END,
        give_up_pending = attempts >= max_attempts OR %(give_up)s,
        last_error = %(error)s,
        started_at = %(started_at)s::timestamptz,
        locked_at = NULL
    WHERE id = %(id)s AND status = 'running' AND claim_token = %(claim_token)s::uuid
    RETURNING id, status, attempts, run_id
), kept AS (
    INSERT INTO {schema}.job_errors (job_id, attempt, run_id, started_at, failed_at,
                                     error, error_type, traceback)
    SELECT f.id, f.attempts, f.run_id, %(started_at)s::timestamptz,
           now() + %(offset)s::interval, %(error)s, %(error_type)s, %(traceback)s
    FROM f
), told AS (
    SELECT pg_notify('rota_settled', %(schema_name)s::text || ':' || f.id)
    FROM f
    WHERE f.status = 'failed'
      AND EXISTS (SELECT 1 FROM {schema}.job_waiters w WHERE w.job_id = f.id)
)
SELECT f.status FROM f WHERE (SELECT count(*) FROM told) >= 0
