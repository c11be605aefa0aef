"""The PostgreSQL a chaos run restarts: a private embedded server, or the machine's
local cluster."""

from __future__ import annotations

import subprocess
from typing import Protocol

from psycopg.conninfo import conninfo_to_dict

from rota import ConfigError, DatabaseUnavailable
from rota.embedded import SERVER_USER, EmbeddedServer

from ..pgbouncer import PgBouncer, PoolMode


class Server(Protocol):
    url: str
    kind: str

    def restart(self) -> None: ...

    def stop(self) -> None: ...


class BehindPgBouncer:
    """Another server with a real PgBouncer in front (``--pooler MODE``; docs/operations.md,
    "Poolers and failover"): the harness and the workers reach the server through the
    pooler's URL, and the restart is the server's behind it, so the pooler's clients
    meet the restart as a managed platform's pooled URL shows it. rota finds the pooler
    by itself (no ``pooled=``), and the workers, whose notifications a transaction
    pooler does not carry, poll."""

    def __init__(self, inner: EmbeddedPostgres | ClusterPostgres, mode: PoolMode) -> None:
        self.inner = inner
        user = SERVER_USER if isinstance(inner, EmbeddedPostgres) else "postgres"
        self._bouncer = PgBouncer(inner.url, pool_mode=mode, user=user)
        self.url = self._bouncer.url()
        self.kind = f"{inner.kind} behind PgBouncer ({mode} mode)"

    def restart(self) -> None:
        self.inner.restart()

    def stop(self) -> None:
        try:
            self._bouncer.close()
        finally:
            self.inner.stop()


class EmbeddedPostgres:
    """A private server (:class:`rota.embedded.EmbeddedServer`, its owner's alone, gone
    with this process however it ends); restarted by its watchdog with a fast shutdown
    on the same data directory and socket."""

    kind = "embedded"

    def __init__(self) -> None:
        try:
            self._server = EmbeddedServer()
        except DatabaseUnavailable as exc:
            raise DatabaseUnavailable(
                f"the chaos run needs a server it may restart: {exc} (or pass "
                "--database-url)") from None
        self.url = self._server.url

    def restart(self) -> None:
        self._server.restart()

    def stop(self) -> None:
        self._server.stop()


class ClusterPostgres:
    """The machine's server (Debian/Ubuntu postgresql-common): restarted with
    ``pg_ctlcluster --skip-systemctl-redirect VERSION NAME restart`` (fast mode)."""

    kind = "pg_ctlcluster"

    def __init__(self, url: str, version: str, name: str) -> None:
        self.url = url
        self.version = version
        self.name = name

    @classmethod
    def detect(cls, url: str) -> ClusterPostgres:
        """The local cluster listening on the URL's port.

        Raises:
            ConfigError: the URL is not a local server, or no local cluster matches.
        """
        params = conninfo_to_dict(url)
        host = str(params.get("host") or "localhost")
        port = str(params.get("port") or "5432")
        if host not in ("localhost", "127.0.0.1", "::1") and not host.startswith("/"):
            raise ConfigError(f"cannot restart the server at {host!r}: the chaos run "
                              f"restarts only a local cluster (or run without a URL)")
        try:
            out = subprocess.run(["pg_lsclusters", "--no-header"], check=True,
                                 capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            raise ConfigError(f"cannot list local clusters (pg_lsclusters): {exc}") from None
        for line in out.splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[2] == port and parts[3].startswith("online"):
                return cls(url, parts[0], parts[1])
        raise ConfigError(f"no online local cluster on port {port} (pg_lsclusters)")

    def restart(self) -> None:
        subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", "--mode", "fast",
                        self.version, self.name, "restart"], check=True,
                       capture_output=True, timeout=120)

    def stop(self) -> None:
        pass
