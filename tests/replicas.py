"""Servers a test owns, for tests that stop or restart them (never the machine's server,
which other tests share): a real primary and streaming replica for failover tests
(``initdb``, ``pg_basebackup -R``, synchronous replication: ``synchronous_standby_names
= '*'``), and a lone server to restart. Each server is on a free loopback port, all in
one temporary directory removed on ``close``. As root, the servers run as ``postgres``
(PostgreSQL refuses root)."""

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


def _owned_dir(prefix: str) -> tuple[Path, dict[str, Any]]:
    """A new temporary directory, and the ``subprocess.run`` arguments that run the
    server's programs as its owner (``postgres`` when this process is root)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    if os.geteuid() != 0:
        return path, {}
    owner = pwd.getpwnam("postgres")
    os.chown(path, owner.pw_uid, owner.pw_gid)
    return path, {"user": owner.pw_uid, "group": owner.pw_gid, "extra_groups": []}


def _run(run_as: dict[str, Any], *argv: Any) -> None:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                          cwd="/", check=False, timeout=120, **run_as)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed: {done.stderr or done.stdout}")


def _ctl(run_as: dict[str, Any], data: Path, action: str, *args: str) -> None:
    _run(run_as, BIN / "pg_ctl", "-D", data, "-l", data.parent / f"{data.name}.log", "-w",
         action, *args)


class LoneServer:
    """One server on a free loopback port (:attr:`port`), running when made, that the
    test may restart (:meth:`restart`)."""

    def __init__(self) -> None:
        self.dir, self._as = _owned_dir("rota-server-")
        self.data = self.dir / "data"
        self.port = free_port()
        try:
            _run(self._as, BIN / "initdb", "-D", self.data, "-U", "postgres",
                 "--auth=trust", "--encoding=UTF8", "--no-sync", "--no-instructions")
            settings = {"port": self.port, "listen_addresses": "'127.0.0.1'",
                        "unix_socket_directories": f"'{self.dir}'", "fsync": "off",
                        "max_connections": 60, "shared_buffers": "'16MB'"}
            with open(self.data / "postgresql.conf", "a") as conf:
                conf.writelines(f"{k} = {v}\n" for k, v in settings.items())
            _ctl(self._as, self.data, "start")
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        """The server's URL (database and user ``postgres``, trust)."""
        return ReplicatedPair.url_of(self.port)

    def restart(self, down: float = 0.0) -> None:
        """A fast shutdown (every connection ends), ``down`` seconds without a server,
        then a start; returns when the server accepts connections again."""
        _ctl(self._as, self.data, "stop", "-m", "fast")
        time.sleep(down)
        _ctl(self._as, self.data, "start")

    def log(self) -> str:
        """The end of the server's log."""
        path = self.dir / "data.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def close(self) -> None:
        if (self.data / "postmaster.pid").exists():
            try:
                _ctl(self._as, self.data, "stop", "-m", "immediate")
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LoneServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ReplicatedPair:
    """A primary (port :attr:`primary_port`) and its synchronous streaming replica
    (:attr:`replica_port`), both running when made."""

    def __init__(self, *, synchronous: bool = True) -> None:
        self.dir, self._as = _owned_dir("rota-failover-")
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
        _run(self._as, *argv)

    def _ctl(self, data: Path, action: str, *args: str) -> None:
        _ctl(self._as, data, action, *args)

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
