"""The demo itself, short profile (``rota-demo --profile short``): it drives the example
pipeline through real HTTP calls to the cron endpoint (with overlapping calls and a
SIGKILLed invocation) and must find every invariant holding."""

from __future__ import annotations

import os
import re
import subprocess
import sys


def test_demo_short_profile_keeps_every_invariant(database_url: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "rota_demo", "--profile", "short",
         "--database-url", database_url],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "COLUMNS": "120"},
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    text = out.stdout
    assert "BAD" not in text
    for line in (
        "ok  no job left running or without a due time",
        "ok  every finished stage enqueued the next",
        "ok  no job holds two unrefunded credits",
        "ok  every draft that gave up after spending was refunded",
        "ok  every run finished or marked killed",
        "ok  the SIGKILLed run is visible as killed",
        "ok  the fair claim's bookkeeping matches the jobs (rota verify)",
        "ok  the language model never answered 429 (rota kept every worker to its "
        "requests per minute)",
        "no job lost",
    ):
        assert line in text, text[-3000:]
    assert "quota_reserve" in text and "time_budget" in text
    # The report says how close to the model's limit the fleet came.
    assert re.search(r"0 answered 429; rate reached: \d+/min over the busiest 10 s "
                     r"\(\d+% of the limit\)", " ".join(text.split())), text[-3000:]
    # Both schemas carry the demo's own name, and one tag, so they are found together.
    assert re.search(r"; schemas rota_demo_([0-9a-f]{8}) / rota_demo_app_\1\.", text), text[:600]
    # One statement a line, never broken in the middle (the console wrapped long lines
    # mid-sentence), and counts written one way, with thousands separators.
    lines = text.splitlines()
    assert "  YouTube quota: 7,400 of 10,000 units spent earlier today" in lines
    assert ("quota units: YouTube Data API units a run spent (a search costs 100, a "
            "channel or comments lookup 1; 10,000 a day).") in lines
    assert any(re.fullmatch(r"YouTube quota, as rota counts it: \d{1,2},\d{3} of 10,000 units "
                            r"used today \(7,400 before the demo; the last 1,000 are a "
                            r"reserve no run spends\)\.", line) for line in lines), text
    prose = [line for line in lines if line and line[0] not in "│┃┏┡└━ "
             and not line.startswith(("jobs settled", "dashboard:", "demo took"))]
    assert all(line.endswith((".", ")", "time_budget", "Ctrl-C")) or ":" in line
               for line in prose), prose
    assert not [line for line in prose if re.search(r"(?<![\d,.x_])\d{4,}(?![\d,])", line)
                and "rota_demo_" not in line and "pid" not in line], prose
    # It says what the fair claim did, with its own figures.
    assert ("fairness: each claim takes the highest plan first, then within a plan the "
            "campaign served least, then the oldest job.") in lines
    assert any(re.fullmatch(r"  By plan: pro jobs waited a median \d+\.\d s, .*\.", line)
               for line in lines), text
    assert any(re.fullmatch(r"  Within pro: the largest campaign \(\d+ jobs done\) waited a "
                            r"median \d+\.\d s, the 2 others \(\d+ jobs\) \d+\.\d s: the "
                            r"least-served campaign goes first, so a large one does not "
                            r"crowd out the small ones\.", line) for line in lines), text
    # It ends by saying where the dashboard shows a demo's data, and how to get there.
    assert text.strip().splitlines()[-1].startswith(
        "dashboard: http://127.0.0.1:8080/ on a demo's data: `make demo-dashboard`"), text[-500:]
