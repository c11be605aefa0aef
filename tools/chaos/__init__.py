"""The chaos run: real worker processes, real SIGKILLs and a real PostgreSQL restart,
then proof that no work was lost, doubled or charged twice (``make chaos``).

What happens::

    python -m tools.chaos            # default profile: 5,000 jobs, 4 workers
    python -m tools.chaos --short    # the profile tests/test_chaos.py runs in `make test`

1. A fresh schema gets rota's tables, 9 groups over the three default plans, and the
   seed jobs; a few tables of the harness's own record what happens (see ``SETUP``).
   Five poison rows are inserted by SQL, bypassing enqueue (every column given): three
   payloads nested 3,000 deep (valid jsonb that Python's json will not load) and two
   created in year 10193 (valid timestamptz, past Python's datetime; their run_after is
   now, as one in 10193 would never be due).
2. ``workers`` OS processes (``python -m tools.chaos worker``) each run a
   :class:`rota.Pipeline` back to back (``pipeline.run(trigger="worker")``), with
   maintenance every few seconds. Durations are compressed by settings: a stale window
   of seconds, backoff of half a second, a platform timeout shorter than the stale
   window (as the Pipeline requires). Handlers sleep a random few milliseconds, raise
   an error about 5% of the time and ``DeferJob`` about 3% of the time. A fourth stage,
   ``runaway`` (5% of the seeds), has a 0.5 s timeout: about 2% of its calls sleep an
   hour and 1% swallow their cancellation in a loop (bounded, so the process can stop),
   which keeps the run busy until its hard deadline cuts it (the short profile makes
   both three times likelier, so a short run sees some).
3. A killer SIGKILLs a random worker every few seconds and starts a new one; once, a
   third of the way through, PostgreSQL itself is restarted (the embedded server with
   ``pg_ctl restart``; the machine's with ``pg_ctlcluster``).
4. When the work is nearly done the killing stops, the workers finish, are stopped, and
   the harness runs maintenance and drains what is left in-process, moving time with
   ``queue.clock_offset`` (stale locks, backoffs and deferrals are due at once).
5. Checks (each violation is printed; any makes the exit status 1):

   - every job is ``done`` or ``failed``, or ``pending`` with a due time (counted);
     nothing ``running``, and every done search has its two draft jobs (``lost``);
   - a side effect repeated in a later attempt only where the earlier attempt's run was
     killed or interrupted mid-handler; each repeat is explained (``duplicated``);
     the two stages that complete inside their own transaction never repeat;
   - no job's handler ran in two workers at once, and every stale reclaim took a job
     from a worker that was dead or whose run had ended (a handler cut at its deadline
     ends at the cut, outcome ``timed_out``; one that ignored the cut ends when the
     runner abandoned its job, outcome ``ignored_cancel``);
   - handler deadlines: a cut handler's claim never completed its job (it failed and
     was retried, or gave up with its hook run once); a job's "timed out" error is
     "timed out after N s" within its stage's timeout or the runner's "did not stop
     when cancelled"; every run lasted under the platform timeout; a run ended in
     error only killed, around the restart, or ``RunOverran`` when one of its handlers
     ignored its cut (``timed_out``, ``runaway_handlers``, ``runs_overran``);
   - poison rows: each ended ``failed`` with "job N cannot be read: ...", its give-up
     hook ran once, no run that failed one ended in error for it, and the runs'
     ``unreadable`` counters add up to the poison count, less any counted by a run
     SIGKILLed before it saved (``unreadable``: counted/inserted);
   - every give-up hook ran exactly once (``hooks_missing``, ``hooks_doubled``);
   - each job's attempts equal its claims minus its deferrals and releases (claims,
     deferrals and releases are logged by a trigger in the transaction that made them);
   - every run a killed worker was in is in ``runs`` ended ``error``/``killed``, no run
     is left unfinished, no live run was marked killed, and runs that ended in another
     error did so because of the restart (or overran, above);
   - no worker process died on its own.

The figures come first, one a line (``timed_out``, ``unreadable``... among them); the
last line is the summary, in this format whatever else is added::

    jobs=5000 kills=41 restarts=1 lost=0 duplicated=9 hooks_missing=0 hooks_doubled=0

Without ``--database-url`` (or ``DATABASE_URL``) an embedded server is started in a
temporary directory, so nothing else is disturbed by the restart.

With ``--pooler transaction`` (or ``session``) a real PgBouncer (:mod:`tools.pgbouncer`)
stands in front of that server: the harness and the workers connect through it and the
server restarts behind it (``make test``'s pooler leg runs the short profile so).

Run it from the repository's root (``make chaos``): it is a tool of this repository, not
part of the ``rota`` wheel. Its modules: :mod:`~tools.chaos.profile` (how big and how
violent), :mod:`~tools.chaos.workload` (the pipeline the workers run and the tables that
record it), :mod:`~tools.chaos.worker` (one worker process), :mod:`~tools.chaos.servers`
(the PostgreSQL it restarts), :mod:`~tools.chaos.harness` (spawning, killing, the restart,
the final drain), :mod:`~tools.chaos.checks` (the checks and the report) and
:mod:`~tools.chaos.main` (the command line).
"""
