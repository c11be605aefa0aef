"""A TCP proxy on 127.0.0.1 in front of the test's PostgreSQL that can go silent without
closing anything: what a frozen server, a hung pooler or proxy, or a storage stall look
like to a client (TCP stays up, so keepalives and ``tcp_user_timeout`` never fire). It
runs its own event loop in a thread, so sync tests (real worker processes) and async
tests (an in-process worker) use it alike.

- :meth:`SilentProxy.freeze`: the connections open now stop forwarding in both
  directions and stay open; with ``new="silent"`` new ones are accepted and never
  answered too, with ``new="forward"`` (the default) new ones work (the link came back
  for new connections, as after a failover behind a proxy).
- :meth:`SilentProxy.thaw`: new connections forward again.
- :meth:`SilentProxy.close`: the listening socket and every connection closed (the
  server is down: connection refused).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Literal

from psycopg.conninfo import conninfo_to_dict, make_conninfo

Mode = Literal["forward", "silent"]


class SilentProxy:
    """Forward ``127.0.0.1:port`` to the server of ``database_url``."""

    def __init__(self, database_url: str) -> None:
        params = conninfo_to_dict(database_url)
        host = str(params.get("host") or "127.0.0.1").split(",")[0]
        port = int(str(params.get("port") or 5432).split(",")[0])
        # The embedded server (DATABASE_URL unset) listens on a Unix socket only.
        self._socket = f"{host}/.s.PGSQL.{port}" if host.startswith("/") else None
        self._target = (host, port)
        self._database_url = database_url
        self._new: Mode = "forward"
        self._frozen: set[int] = set()   # ids of connections that no longer forward
        self._conns: dict[int, list[asyncio.StreamWriter]] = {}
        self._next_id = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server = self._call(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.port: int = self._server.sockets[0].getsockname()[1]
        self.accepted = 0

    @property
    def url(self) -> str:
        """``database_url`` with the proxy as its host and port."""
        return make_conninfo(self._database_url, host="127.0.0.1", port=self.port)

    def freeze(self, *, new: Mode = "forward") -> None:
        """Stop forwarding on every connection open now (they stay open); new ones
        then forward or stay silent as ``new`` says."""
        def do() -> None:
            self._frozen.update(self._conns)
            self._new = new
        self._loop.call_soon_threadsafe(do)
        self._call(asyncio.sleep(0))

    def thaw(self) -> None:
        """New connections forward again (frozen ones stay frozen)."""
        def do() -> None:
            self._new = "forward"
        self._loop.call_soon_threadsafe(do)
        self._call(asyncio.sleep(0))

    def close(self) -> None:
        """Close the listening socket and every connection: the server is gone."""
        async def do() -> None:
            self._server.close()
            for writers in self._conns.values():
                for w in writers:
                    w.transport.abort()
            await self._server.wait_closed()
        self._call(do())

    def stop(self) -> None:
        """Close everything and end the proxy's thread (teardown)."""
        if not self._loop.is_closed():
            self.close()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)

    def _call(self, coro: object) -> object:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)  # type: ignore[arg-type]

    async def _accept(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        cid = self._next_id
        self._next_id += 1
        self._conns[cid] = [writer]
        if self._new == "silent":
            self._frozen.add(cid)
            await reader.read(-1)  # hold it open, answer nothing, until the client goes
            writer.transport.abort()
            return
        try:
            if self._socket is not None:
                up_reader, up_writer = await asyncio.open_unix_connection(self._socket)
            else:
                up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        self._conns[cid].append(up_writer)
        await asyncio.gather(self._pump(cid, reader, up_writer),
                             self._pump(cid, up_reader, writer), return_exceptions=True)
        for w in self._conns.pop(cid, []):
            w.transport.abort()

    async def _pump(self, cid: int, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> None:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            if cid in self._frozen:
                # Silent from here on: whatever comes is dropped, nothing is closed.
                await asyncio.Event().wait()
            writer.write(data)
            await writer.drain()
        for w in self._conns.get(cid, []):
            w.transport.abort()
