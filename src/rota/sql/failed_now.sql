-- Included by cancel_job and fail_stuck (the failed_now placeholder, in their SET): a job
-- ends failed now, its lock and claim dropped, and gives up like any failed job, so its
-- give-up hook becomes owed (exactly once: docs/design.md, "Give-up hooks"). The
-- statement sets last_error.
status = 'failed',
    finished_at = now() + %(offset)s::interval,
    give_up_pending = true,
    locked_at = NULL,
    claim_token = NULL
