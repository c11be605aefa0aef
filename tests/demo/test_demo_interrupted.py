"""Ctrl-C to a running demo (SIGINT to its process group, as a terminal sends it): the
demo cleans up (its schemas dropped, its servers stopped) and says so the way rota's
commands do, "error: interrupted" with exit status 130, not click's "Aborted!" or a
traceback from a server that got the signal too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psycopg


def demo_schemas(database_url: str) -> set[str]:
    with psycopg.connect(database_url, autocommit=True) as c:
        return {r[0] for r in c.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'rota\\_demo\\_%'")}


def test_ctrl_c_mid_demo_cleans_up_and_exits_130(database_url: str) -> None:
    before = demo_schemas(database_url)
    p = subprocess.Popen([sys.executable, "-m", "rota_demo", "--profile", "short",
                          "--database-url", database_url], start_new_session=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        mine: set[str] = set()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not mine:
            mine = {s for s in demo_schemas(database_url) - before
                    if not s.startswith("rota_demo_app_")}
            time.sleep(0.1)
        assert mine, "the demo made no schema"
        (schema,) = mine
        with psycopg.connect(database_url, autocommit=True) as c:
            while time.monotonic() < deadline and not c.execute(
                    f'SELECT EXISTS (SELECT FROM "{schema}".runs)').fetchone()[0]:
                time.sleep(0.1)  # a run through its cron endpoint has started
        os.killpg(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert (p.returncode, err.splitlines()[-1:]) == (130, ["error: interrupted"]), err
    assert "Traceback" not in err
    assert not {schema, schema.replace("rota_demo_", "rota_demo_app_")} \
        & demo_schemas(database_url)
