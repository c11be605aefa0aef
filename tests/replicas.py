"""A real primary and streaming replica for failover tests: ``initdb``, ``pg_basebackup
-R``, synchronous replication (``synchronous_standby_names = '*'``), each server on a
free loopback port, all in one temporary directory removed on :meth:`close`. As root,
the servers run as ``postgres`` (PostgreSQL refuses root)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from tests.pgbouncer import free_port

BIN = Path(os.environ.get("ROTA_PG_BIN", "/usr/lib/postgresql/15/bin"))


def available() -> bool:
    """Whether the server binaries are installed."""
    return all((BIN / name).exists() for name in ("initdb", "pg_ctl", "pg_basebackup"))


class ReplicatedPair:
    """A primary (port :attr:`primary_port`) and its synchronous streaming replica
    (:attr:`replica_port`), both running when made."""

    def __init__(self, *, synchronous: bool = True) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="rota-failover-"))
        self._as: dict[str, Any] = {}
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(self.dir, owner.pw_uid, owner.pw_gid)
            self._as = {"user": owner.pw_uid, "group": owner.pw_gid, "extra_groups": []}
        self.primary = self.dir / "primary"
        self.replica = self.dir / "replica"
        self.primary_port = free_port()
        self.replica_port = free_port()
        try:
            self._run(BIN / "initdb", "-D", self.primary, "-U", "postgres", "--auth=trust",
                      "--encoding=UTF8", "--no-sync", "--no-instructions")
            settings = {
                "port": self.primary_port, "listen_addresses": "'127.0.0.1'",
                "unix_socket_directories": f"'{self.dir}'", "fsync": "off",
                "wal_level": "replica", "max_wal_senders": 4, "max_connections": 60,
                "shared_buffers": "'16MB'", "synchronous_standby_names":
                    "'*'" if synchronous else "''",
            }
            with open(self.primary / "postgresql.conf", "a") as conf:
                conf.writelines(f"{k} = {v}\n" for k, v in settings.items())
            self._ctl(self.primary, "start")
            self._run(BIN / "pg_basebackup", "-h", "127.0.0.1", "-p",
                      str(self.primary_port), "-U", "postgres", "-D", self.replica, "-R",
                      "-X", "stream", "--no-sync")
            # Promoted, it has no standby of its own: with the primary's
            # synchronous_standby_names every commit would wait for one forever.
            with open(self.replica / "postgresql.auto.conf", "a") as conf:
                conf.write(f"port = {self.replica_port}\nsynchronous_standby_names = ''\n")
            self._ctl(self.replica, "start")
            self._wait_streaming(synchronous)
        except BaseException:
            self.close()
            raise

    def _run(self, *argv: Any) -> None:
        done = subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                              cwd="/", check=False, timeout=120, **self._as)
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed: {done.stderr or done.stdout}")

    def _ctl(self, data: Path, action: str, *args: str) -> None:
        self._run(BIN / "pg_ctl", "-D", data, "-l", data.parent / f"{data.name}.log", "-w",
                  action, *args)

    def _wait_streaming(self, synchronous: bool) -> None:
        want = "sync" if synchronous else "async"
        end = time.monotonic() + 30
        with psycopg.connect(self.url_of(self.primary_port), autocommit=True) as c:
            while time.monotonic() < end:
                row = c.execute("SELECT sync_state FROM pg_stat_replication").fetchone()
                if row is not None and row[0] == want:
                    return
                time.sleep(0.05)
        raise RuntimeError(f"the replica did not stream ({want}) within 30 s")

    @staticmethod
    def url_of(port: int) -> str:
        return f"host=127.0.0.1 port={port} dbname=postgres user=postgres"

    @property
    def url(self) -> str:
        """Both servers, the writable one chosen (a multi-host URL)."""
        return (f"host=127.0.0.1,127.0.0.1 port={self.primary_port},{self.replica_port} "
                "dbname=postgres user=postgres target_session_attrs=read-write")

    def stop_primary(self) -> None:
        """Stop the primary at once (immediate mode: as a crash)."""
        self._ctl(self.primary, "stop", "-m", "immediate")

    def promote(self) -> None:
        """Promote the replica; returns when it accepts writes."""
        self._ctl(self.replica, "promote")

    def log(self) -> str:
        return "".join(p.read_text(errors="replace")[-3000:]
                       for p in self.dir.glob("*.log"))

    def close(self) -> None:
        for data in (self.replica, self.primary):
            if (data / "postmaster.pid").exists():
                try:
                    self._ctl(data, "stop", "-m", "immediate")
                except (RuntimeError, subprocess.TimeoutExpired):
                    pass
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> ReplicatedPair:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
