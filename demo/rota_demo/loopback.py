"""Serving an ASGI app (the YouTube stand-in, the sample brand pages) on loopback in a
background thread, for the demo and the tests."""

from __future__ import annotations

import socket
import threading
import time as _time
from collections.abc import Callable

from starlette.types import ASGIApp


def serve_in_thread(
    app: ASGIApp, host: str = "127.0.0.1", port: int = 0, *, start_timeout: float = 10.0
) -> tuple[str, Callable[[], None]]:
    """Serve ``app`` with uvicorn in a daemon thread; return ``(base_url, stop)``.

    ``port`` 0 picks a free port. ``base_url`` is ``http://host:port`` (no trailing slash).
    ``stop()`` asks the server to exit, waits for it (in-flight requests get up to 2 s) and
    is idempotent. Raises ``RuntimeError`` if the server has not started within
    ``start_timeout`` seconds, ``OSError`` if the address cannot be bound.
    """
    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted sockets inherit this; without it small responses wait ~40 ms (delayed ACK).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    bound_port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=2,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name=f"serve:{bound_port}", daemon=True
    )
    thread.start()
    deadline = _time.monotonic() + start_timeout
    while not server.started:
        if not thread.is_alive() or _time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError(f"server on {host}:{bound_port} did not start")
        _time.sleep(0.005)
    stopped = threading.Event()

    def stop() -> None:
        if stopped.is_set():
            return
        stopped.set()
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()

    shown = f"[{host}]" if family == socket.AF_INET6 else host
    return f"http://{shown}:{bound_port}", stop
