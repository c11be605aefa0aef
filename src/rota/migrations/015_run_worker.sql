-- Each run names the process that ran it, `host:pid` (docs/design.md, "The runner"):
-- a job's attempts say which worker ran them (a Django task's worker_ids), the same
-- for all the runs of one long-running worker.
ALTER TABLE {schema}.runs ADD COLUMN worker text;
