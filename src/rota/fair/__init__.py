"""The fair claim as one package (docs/fast-claim.md): everything that makes the claim
fair and cheap, and the only code that reads or writes its bookkeeping tables
(``fair_groups``, ``fair_served``, ``fair_edge``, ``fair_plans``, ``fair_fold_mark``,
``fair_fold_lock``).

- ``claim.py``: :class:`FairClaim`, the claim and the bookkeeping's one door (the
  dashboard's probe, :meth:`FairClaim.verify`, :meth:`FairClaim.repair`).
- ``upkeep.py``: :class:`ClaimUpkeep`, folds, bound renewals, edge moves, VACUUM.
- ``claim.sql`` and its fragments (the group pool: ``claim_pool_cached.sql``, or
  ``claim_pool_scan.sql`` for an application's groups relation;
  ``claim_pool_special.sql``, ``claim_head.sql``, ``groupless_head.sql``),
  ``claim_settings.sql``: the statement.
- ``bookkeeping.sql``: the tables, functions and triggers that keep the bookkeeping
  (the fresh install's part of ``schema.sql``, included there).
- ``contract.py`` with ``verify.sql``: the contract, every invariant of
  docs/fast-claim.md as one check; ``repair_lock.sql``, ``repair_clear.sql``,
  ``repair.sql``: the rebuild from ``jobs``.
- ``oldest_due.sql``: the dashboard's probe of the longest-waiting groups.

Only :mod:`rota.queue` (and the CLI's ``rota verify`` through it) enters this package.
"""

from .claim import FairClaim
from .contract import RepairFailed, RepairReport, Violation
from .upkeep import ClaimUpkeep, UpkeepConfig

__all__ = ["ClaimUpkeep", "FairClaim", "RepairFailed", "RepairReport", "UpkeepConfig",
           "Violation"]
