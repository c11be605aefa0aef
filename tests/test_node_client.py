"""The Node client (clients/node, the `pg` package) end to end: a Node program enqueues
1,000 jobs through SCHEMA.enqueue and enqueue_many in its own transactions, as a role
that may only enqueue, and rolls back every other transaction; a Python `rota worker`
then runs exactly the committed half, each job once (docs/enqueue-from-sql.md).

`make test` installs the client's packages (npm ci) and sets ROTA_NODE_CLIENT=required,
so a missing node fails there; a bare pytest run without node skips this test."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from rota.enqueue import enqueue_settings
from rota.settings import QueueSettings
from rota.store import Statements

from .cli_app import build_pipeline
from .helpers import wait_for

ROOT = Path(__file__).resolve().parents[1]
CLIENT = ROOT / "clients" / "node"
APP = "tests.cli_app:build_pipeline"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def node() -> str:
    """The machine's node, with the client's packages installed; else skip (or fail
    under `make test`)."""
    found = shutil.which("node")
    missing = ("node is not installed" if found is None else
               "clients/node has no node_modules: run `npm ci` there (make test does)"
               if not (CLIENT / "node_modules" / "pg").is_dir() else None)
    if missing is None and found is not None:
        return found
    if os.environ.get("ROTA_NODE_CLIENT") == "required":
        pytest.fail(missing)
    pytest.skip(missing)


def test_node_enqueues_in_its_transactions_and_a_worker_runs_the_committed_half(
    database_url: str, migrated: str, enqueue_only_role: Any
) -> None:
    node_bin = node()
    s = sql.Identifier(migrated)

    def query(text: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(database_url, autocommit=True) as conn:
            return conn.execute(sql.SQL(text).format(s=s)).fetchall()

    # The app's settings (its declared types) are what the SQL functions apply, as
    # `rota migrate --app` publishes them.
    settings = QueueSettings(schema=migrated, **build_pipeline.queue_settings)  # type: ignore[attr-defined]
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(Statements(migrated).sql("publish_settings"), enqueue_settings(settings))
    role = enqueue_only_role(migrated)
    env = {**os.environ, "DATABASE_URL": database_url, "ROTA_SCHEMA": migrated,
           "ROTA_APP": APP, "PYTHONUNBUFFERED": "1"}
    worker = subprocess.Popen(
        [sys.executable, "-m", "rota.cli", "worker", "--idle-poll", "30"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Its first run (with maintenance) has ended: it is up, waiting for a notification.
        wait_for(lambda: query("SELECT 1 FROM {s}.runs WHERE finished_at IS NOT NULL")
                 or worker.poll() is not None, 60, "the worker's first run")
        assert worker.poll() is None, worker.communicate()
        out = subprocess.run([node_bin, "enqueue-demo.js"], cwd=CLIENT, capture_output=True,
                             text=True, timeout=300,
                             env={**env, "ROTA_ROLE": role, "JOBS": "1000",
                                  "TRACEPARENT": TRACEPARENT})
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        committed = sorted(int(i) for i in report["committed"])
        assert (len(committed), report["rolledBack"], report["duplicates"]) == (500, 500, 100)
        assert report["refused"] == {
            "code": "23503", "kind": "UnknownGroup", "column": "group_id",
            "message": "unknown group 'no-such-group': create it first (a row of the groups "
                       "relation; queue.upsert_group in Python) or enqueue without a group"}

        wait_for(lambda: query("SELECT count(*) FROM {s}.jobs WHERE status = 'done'")[0][0]
                 >= 500, 180, "the worker to run 500 jobs")
        jobs = query("SELECT id, status, attempts, payload FROM {s}.jobs ORDER BY id")
        # Every job carries the service's trace context (docs/operations.md, "Traces").
        assert query("SELECT DISTINCT trace_context FROM {s}.jobs") == [
            ({"traceparent": TRACEPARENT},)]
        # Exactly the committed jobs exist, and each ran once.
        assert [j[0] for j in jobs] == committed
        assert {(j[1], j[2]) for j in jobs} == {("done", 1)}
        assert sorted(j[3]["n"] for j in jobs) == sorted(
            n for t in range(0, 100, 2) for n in range(t * 10, t * 10 + 10))
        [(done, echoed)] = query("SELECT sum(jobs_done), sum((summary ->> 'echoed')::int) "
                                 "FROM {s}.runs")
        assert (done, echoed) == (500, 500)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            _, err = worker.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            _, err = worker.communicate()
    assert worker.returncode == 0, err
