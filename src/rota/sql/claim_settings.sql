-- Planner settings for the claim's transaction only (it is prepared once per connection):
-- a generic plan, whose nested loops and LIMITs do not depend on the bound values (a
-- custom plan costs about 9 ms of planning per claim at 10,000 groups); no JIT, whose
-- compile time (about 100 ms) the cost estimates of a 30-CTE statement trigger while
-- its actual work is a few milliseconds; and sorts only where no index gives the order,
-- so the group walk reads fair_groups_walk_idx in order whatever the table's statistics
-- were when the connection prepared the claim (on a small table the planner otherwise
-- sorts every group of the plan: a plan a connection keeps after the table has grown).
SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
       set_config('jit', 'off', true),
       set_config('enable_sort', 'off', true)
