"""How long a connection with rota's default timeouts (:func:`rota.db.with_connection_defaults`)
takes to give up over a cut link, measured, not assumed.

Inside a host of its own, :func:`probe_main` (``python -m tools.chaos_hosts probe``)
opens two connections with the defaults, one idle and LISTENing (like a worker's
listener) and one about to send a statement, and says ``ready``. The harness cuts the
link and says ``cut``; from then on the probe sends ``SELECT 1`` on the second, opens
a third, and times each failure. Meanwhile :func:`measure` watches
``pg_stat_activity`` for the server to drop the two sessions. Each must give up within
the bound the defaults promise, plus a little.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from rota.db import CLIENT_DEFAULTS, SESSION_DEFAULTS, with_connection_defaults

from .net import ROOT, Network

SLACK_S = 4.0  # timers fire on the next retransmission or probe tick


def bounds() -> dict[str, float]:
    """Seconds each kind of give-up may take under rota's defaults (before slack)."""
    idle = (float(CLIENT_DEFAULTS["keepalives_idle"])
            + float(CLIENT_DEFAULTS["keepalives_interval"])
            * float(CLIENT_DEFAULTS["keepalives_count"]))
    server = max(float(SESSION_DEFAULTS["tcp_keepalives_idle"])
                 + float(SESSION_DEFAULTS["tcp_keepalives_interval"])
                 * float(SESSION_DEFAULTS["tcp_keepalives_count"]),
                 float(SESSION_DEFAULTS["tcp_user_timeout"]) / 1000)
    return {"connect": float(CLIENT_DEFAULTS["connect_timeout"]),
            "statement": float(CLIENT_DEFAULTS["tcp_user_timeout"]) / 1000,
            "idle": max(idle, float(CLIENT_DEFAULTS["tcp_user_timeout"]) / 1000),
            "server": server}


async def probe_main(url: str, cap: float) -> int:
    conninfo = with_connection_defaults(make_conninfo(url, application_name="chaos-probe"))
    idle = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
    busy = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
    await idle.execute("LISTEN chaos_probe")
    print(json.dumps({"ready": [idle.info.backend_pid, busy.info.backend_pid]}), flush=True)
    await asyncio.to_thread(sys.stdin.readline)  # "cut"
    t0 = time.monotonic()

    async def timed(what: str) -> tuple[str, float | None, str]:
        try:
            if what == "idle":
                async for _ in idle.notifies():
                    pass
            elif what == "statement":
                await busy.execute("SELECT 1")
            else:
                await (await psycopg.AsyncConnection.connect(conninfo)).close()
        except psycopg.OperationalError as exc:
            return what, round(time.monotonic() - t0, 1), str(exc).strip().splitlines()[0]
        return what, None, "did not fail"

    done = await asyncio.wait_for(
        asyncio.gather(timed("idle"), timed("statement"), timed("connect")), cap)
    print(json.dumps({w: {"seconds": s, "error": e} for w, s, e in done}), flush=True)
    return 0


@dataclass
class ProbeResult:
    seconds: dict[str, float | None] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)

    def line(self) -> str:
        b = bounds()
        return ", ".join(f"{k} {v if v is not None else '-'}s (bound {b[k]:g}s)"
                         for k, v in self.seconds.items())


async def measure(network: Network, host: str, url: str, admin: str) -> ProbeResult:
    """Cut ``host`` (a host with no workers) while the probe runs in it, and heal it."""
    b = bounds()
    cap = max(b.values()) + SLACK_S + 10
    result = ProbeResult()
    proc = network.spawn(host, [sys.executable, "-m", "tools.chaos_hosts", "probe",
                                "--database-url", url, "--cap", str(cap)],
                         cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        line = await asyncio.to_thread(proc.stdout.readline)
        pids: list[int] = json.loads(line)["ready"]
        network.cut(host)
        t0 = time.monotonic()
        proc.stdin.write(b"cut\n")
        proc.stdin.flush()
        async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
            server: float | None = None
            while server is None and time.monotonic() - t0 < cap:
                await asyncio.sleep(0.5)
                cur = await conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", [pids])
                row: Any = await cur.fetchone()
                if row[0] == 0:
                    server = round(time.monotonic() - t0, 1)
        out, err = await asyncio.to_thread(proc.communicate, None, cap + 10)
        lines = out.decode().strip().splitlines()
        if proc.returncode != 0 or not lines:
            result.violations.append(f"probe failed: {err.decode(errors='replace')[-500:]}")
            return result
        for what, r in json.loads(lines[-1]).items():
            result.seconds[what] = r["seconds"]
            result.errors[what] = r["error"]
        result.seconds["server"] = server
    finally:
        network.heal(host)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for what, seconds in result.seconds.items():
        if seconds is None or seconds > b[what] + SLACK_S:
            result.violations.append(
                f"a cut-off {what} {'connection' if what != 'server' else 'session'} gave "
                f"up after {seconds}s, bound {b[what]:g}s + {SLACK_S:g}s")
    return result
