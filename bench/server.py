"""The server settings a benchmark's figures depend on, printed at the top of each
benchmark's output and kept in ``results.json`` (bench/RESULTS.md, section 23).

``autovacuum`` most of all: with it off (as on the machines these figures were measured
on, whose PostgreSQL has ``autovacuum = off`` in a ``conf.d`` file of its own), nothing
ever vacuums ``jobs``, for rota and for the FIFO reference alike: their dead row versions
are only pruned as pages are read. rota vacuums its own bookkeeping tables
(docs/operations.md, "Pruning and vacuum"), so it does not depend on the setting; a production
server runs with it on (docs/operations.md).
"""

from __future__ import annotations

import psycopg

#: The settings printed, in order.
NAMES = ("server_version", "autovacuum", "fsync", "synchronous_commit", "shared_buffers",
         "work_mem", "max_connections")


def settings(url: str) -> dict[str, str]:
    """The server's values of :data:`NAMES` (``SHOW`` text, e.g. ``"128MB"``).

    Raises:
        psycopg.OperationalError: the server cannot be reached.
    """
    with psycopg.connect(url) as c:
        return {name: str(c.execute(f"SHOW {name}").fetchone()[0])  # type: ignore[index]
                for name in NAMES}


def describe(url: str) -> str:
    """One line for a benchmark's header: ``server: name=value, ...``, and a second line
    saying what ``autovacuum = off`` means for the figures when it is off."""
    values = settings(url)
    line = "server: " + ", ".join(f"{k}={v}" for k, v in values.items())
    if values["autovacuum"] == "off":
        line += ("\n  (autovacuum is off: no one vacuums jobs during these runs, for rota or "
                 "the FIFO reference; rota vacuums its own bookkeeping)")
    return line
