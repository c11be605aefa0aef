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
    assert re.search(r"; schemas rota_demo_([0-9a-f]{8}) / rota_demo_app_\1;", text), text[:600]
    # It ends by saying where the dashboard shows a demo's data, and how to get there.
    assert text.strip().splitlines()[-1].startswith(
        "dashboard: http://127.0.0.1:8080/ on a demo's data: `make demo-dashboard`"), text[-500:]
