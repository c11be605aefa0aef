"""The example's pricing table: its "search queue" row is the claim's priority order,
read from the plans object the example's queue ranks by."""

from __future__ import annotations

import json
import subprocess
import sys

from rota import Plan, Plans
from rota_demo import app
from rota_demo.pricing import pricing_rows, queue_label


def test_search_queue_row_follows_the_priority_order() -> None:
    assert pricing_rows(app.PLANS)[0] == ("Search queue", ["Standard", "Ahead of Free", "First"])
    assert app.queue_settings()["plans"] is app.PLANS  # the object the claim ranks by
    four = Plans([Plan("free", "Free", 0), Plan("team", "Team", 3), Plan("biz", "Biz", 5),
                  Plan("pro", "Pro", 9)])
    assert [queue_label(four, p) for p in four] == [
        "Standard", "Ahead of Free", "Ahead of Team", "First"]
    assert [queue_label(Plans([Plan("one", "One", 0)]), p)
            for p in Plans([Plan("one", "One", 0)])] == ["Standard"]


def test_limits_become_rows_with_a_dash_where_a_plan_has_none() -> None:
    plans = Plans([Plan("free", "Free", 0, {"searches_per_day": 5}),
                   Plan("pro", "Pro", 2, {"searches_per_day": 500, "draft_credits": 100})])
    assert pricing_rows(plans) == [
        ("Search queue", ["Standard", "First"]),
        ("Searches per day", ["5", "500"]),
        ("Draft credits", ["—", "100"]),
    ]


def test_rota_demo_pricing_needs_no_database() -> None:
    out = subprocess.run([sys.executable, "-m", "rota_demo", "pricing", "--json"],
                         capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["plans"] == [{"id": "free", "name": "Free", "priority": 0},
                            {"id": "standard", "name": "Standard", "priority": 1},
                            {"id": "pro", "name": "Pro", "priority": 2}]
    assert [(r["label"], r["values"]) for r in got["rows"]] == pricing_rows(app.PLANS)
    table = subprocess.run([sys.executable, "-m", "rota_demo", "pricing"], capture_output=True,
                           text=True, timeout=60, env={"PATH": "/usr/bin:/bin",
                                                       "COLUMNS": "120"}).stdout
    assert "Search queue" in table and "Ahead of Free" in table and "Draft credits" in table
