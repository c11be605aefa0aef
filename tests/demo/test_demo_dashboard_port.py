"""`make demo-dashboard` (``rota-demo --dashboard``) with port 8080 taken: one line and
exit 2 before the demo runs (it found out only after the whole demo, with uvicorn's
report)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys


def test_the_dashboards_port_in_use_is_refused_before_the_demo_runs() -> None:
    with contextlib.ExitStack() as stack:
        taken = stack.enter_context(socket.socket())
        with contextlib.suppress(OSError):  # another process holding it does as well
            taken.bind(("127.0.0.1", 8080))
            taken.listen()
        out = subprocess.run(
            [sys.executable, "-m", "rota_demo", "--dashboard", "--database-url",
             "postgresql://nobody@127.0.0.1:1/none"],  # never reached
            capture_output=True, text=True, timeout=60, env={**os.environ})
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == ("error: cannot listen on 127.0.0.1:8080: the address is already "
                          "in use (by another server?)\n")
