"""The tests' PgBouncer: tools/pgbouncer.py (the chaos run uses it too)."""

from tools.pgbouncer import PGBOUNCER, PgBouncer, PoolMode, available, free_port

__all__ = ["PGBOUNCER", "PgBouncer", "PoolMode", "available", "free_port"]
