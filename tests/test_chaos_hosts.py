"""The multi-host run's short profile (``python -m tools.chaos_hosts --short``): 3 hosts
as network namespaces with 2 ``rota worker`` processes each, about 600 jobs; one host cut
off for twice the stale window (its jobs are reclaimed elsewhere and its late
transitions fenced), one for a third of it (nothing reclaimed), one slowed to 200 ms
with 5 % loss, a SIGKILL and a PostgreSQL restart, and the timeout probe; then the
checks of tools.chaos and tools.chaos_hosts. ``make chaos-hosts`` runs the default
profile.

It needs root (CAP_NET_ADMIN), ``ip``, ``tc`` and ``iptables``, as CI has (.ci/run installs
them); without them it fails and says why, rather than skipping what CI must run.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SUMMARY = re.compile(r"^hosts=(\d+) partitions=(\d+) lost=(\d+) duplicated=(\d+) "
                     r"hooks_missing=(\d+) hooks_doubled=(\d+) schedule_ticks=(\d+) "
                     r"schedule_fired=(\d+)$")
ROOT = Path(__file__).resolve().parents[1]  # tools/ is importable from the repository's root


def test_short_multi_host_run_fences_the_cut_off_host_and_loses_nothing() -> None:
    out = subprocess.run([sys.executable, "-m", "tools.chaos_hosts", "--short", "--quiet"],
                         capture_output=True, text=True, timeout=240, cwd=ROOT)
    lines = out.stdout.strip().splitlines()
    assert out.returncode != 2, f"cannot run the multi-host test here: {out.stderr.strip()}"
    assert out.returncode == 0, out.stdout + out.stderr
    match = SUMMARY.match(lines[-1])
    assert match, lines[-1]
    hosts, partitions, lost, duplicated, missing, doubled, ticks, fired = map(
        int, match.groups())
    assert hosts == 3 and partitions == 2
    assert (lost, missing, doubled) == (0, 0, 0) and ticks == fired
    assert not any("VIOLATION" in line for line in lines)
    text = "\n".join(lines)
    assert re.search(r"long_cut: h1 .* [1-9]\d* reclaimed by other hosts", text), text
    assert re.search(r"short_cut: h2 .* 0 reclaimed", text), text
    assert "give_up_over_a_cut_link" in text
    repeats = [line for line in lines if line.strip().startswith("repeat:")]
    assert len(repeats) == min(duplicated, 20)  # each repeat is listed with its reason
