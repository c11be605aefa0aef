"""A real PgBouncer in front of a PostgreSQL server, on a free loopback port, with its
own temporary directory (config, pid file, log), stopped and removed on :meth:`close`:
for the tests (tests/test_poolers.py) and the chaos run through a pooler
(``python -m tools.chaos --pooler transaction``). Not shipped.

PgBouncer refuses to run as root: as root it is started with ``-u`` as the server's user
(``postgres`` for the machine's server; the embedded server's own user, whose socket
directory only it may enter), and its directory is given to that user.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Literal

from psycopg.conninfo import conninfo_to_dict, make_conninfo

PoolMode = Literal["transaction", "session", "statement"]

#: Debian's package installs it here; `.ci/run` installs it when missing.
PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def available() -> bool:
    """Whether PgBouncer is installed."""
    return os.path.exists(PGBOUNCER)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class PgBouncer:
    """PgBouncer forwarding every database name to the server of ``database_url``.

    Args:
        database_url: the test's server (host, port, user; trust authentication).
        pool_mode: ``transaction``, ``session`` or ``statement``.
        pool_size: server connections per database and user.
        extra: more ``[pgbouncer]`` settings (``ignore_startup_parameters``, say).
        user: the system user PgBouncer runs as when this process is root; by default
            the owner of the server's socket directory when the server is reached by a
            Unix socket (the embedded server's own user: only it may enter that
            directory), else ``postgres``.
    """

    def __init__(self, database_url: str, *, pool_mode: PoolMode = "transaction",
                 pool_size: int = 20, extra: dict[str, str] | None = None,
                 user: str | None = None) -> None:
        params = conninfo_to_dict(database_url)
        host = str(params.get("host") or "127.0.0.1").split(",")[0]
        port = str(params.get("port") or 5432).split(",")[0]
        self._url = database_url
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="rota-pgbouncer-"))
        settings = {
            "listen_addr": "127.0.0.1",
            "listen_port": str(self.port),
            "auth_type": "trust",
            "auth_file": str(self.dir / "users.txt"),
            "pool_mode": pool_mode,
            "default_pool_size": str(pool_size),
            "max_client_conn": "500",
            "logfile": str(self.dir / "pgbouncer.log"),
            "pidfile": str(self.dir / "pgbouncer.pid"),
            "unix_socket_dir": "",
            "server_check_delay": "0",
            # After a failed server login (a restart's "the database system is shutting
            # down"), PgBouncer opens no server connection and turns new clients away for
            # this long; its default, 15 s, would stall every client after each restart
            # (docs/operations.md, "Poolers and failover").
            "server_login_retry": "1",
            **(extra or {}),
        }
        lines = ["[databases]", f"* = host={host} port={port}", "", "[pgbouncer]"]
        lines += [f"{k} = {v}" for k, v in settings.items()]
        (self.dir / "pgbouncer.ini").write_text("\n".join(lines) + "\n")
        # Trust authentication, for the users the tests connect as (any other is refused:
        # "trust" authentication failed).
        (self.dir / "users.txt").write_text('"postgres" ""\n"root" ""\n')
        command = [PGBOUNCER, str(self.dir / "pgbouncer.ini")]
        if os.geteuid() == 0:
            if user is None:
                user = (pwd.getpwuid(os.stat(host).st_uid).pw_name if host.startswith("/")
                        else "postgres")
            owner = pwd.getpwnam(user)
            for path in (self.dir, *self.dir.iterdir()):
                os.chown(path, owner.pw_uid, owner.pw_gid)
            command[1:1] = ["-u", user]
        # Its output to a file, never a pipe: PgBouncer in the foreground logs every line
        # to stderr as well, and once a pipe nobody reads is full (64 KB, a few hundred
        # logins) it blocks writing and stops serving anyone.
        with open(self.dir / "stderr.log", "wb") as err:
            self._proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err,
                                          start_new_session=True)
        self._wait_ready()

    def _wait_ready(self) -> None:
        end = time.monotonic() + 10
        while time.monotonic() < end:
            if self._proc.poll() is not None:
                err = (self.dir / "stderr.log").read_text(errors="replace").strip()
                self.close()
                raise RuntimeError(f"pgbouncer exited at start: {err} {self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        self.close()
        raise RuntimeError("pgbouncer did not listen within 10 s")

    def url(self, **params: str) -> str:
        """The test's URL with PgBouncer as its host and port (and ``params`` set)."""
        return make_conninfo(self._url, host="127.0.0.1", port=str(self.port), **params)

    def log(self) -> str:
        """PgBouncer's log so far."""
        path = self.dir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        """Stop PgBouncer (SIGINT: at once) and remove its directory."""
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PgBouncer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
