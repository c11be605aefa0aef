-- Fail a job under its claim (docs/design.md, "Fail and backoff"). Attempts left: back to pending with
-- run_after = now + backoff_base * 2^attempts (base 1 minute: 2, then 4 minutes).
-- Attempts used up: failed, finished, give-up hook owed. The error text is kept.
UPDATE {schema}.jobs
SET status = CASE WHEN attempts >= max_attempts THEN 'failed' ELSE 'pending' END,
    finished_at = CASE WHEN attempts >= max_attempts
                       THEN now() + %(offset)s::interval END,
    run_after = CASE WHEN attempts >= max_attempts THEN run_after
                     ELSE now() + %(offset)s::interval
                          + %(backoff_base)s::interval * power(2, attempts) END,
    give_up_pending = attempts >= max_attempts,
    last_error = %(error)s,
    locked_at = NULL,
    claim_token = NULL
WHERE id = %(id)s AND status = 'running' AND claim_token = %(claim_token)s::uuid
RETURNING status
