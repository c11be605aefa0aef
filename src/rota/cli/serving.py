"""Serving an ASGI app under uvicorn until a signal, for ``rota serve`` and ``rota
dashboard``: the first SIGINT or SIGTERM stops taking requests, lets the requests in
flight end (a cron run among them claims nothing more and stops ``interrupted``) and
exits 0; a second one stops at once (docs/design.md, "Handler deadlines").

uvicorn itself re-raises the signal it caught once it has shut down, so that the process
dies of it (exit 143 for SIGTERM, and click's ``Aborted!`` with exit 1 for SIGINT): a
platform that stops a service with SIGTERM would count every stop as a crash."""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

#: uvicorn's exit status when the server did not start (the port is taken, say).
STARTUP_FAILURE = 3

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def serve_until_signal(app: Any, *, host: str, port: int,
                       sock: socket.socket | None = None,
                       graceful_seconds: float | None = None,
                       on_stop: Callable[[], None] | None = None,
                       on_stop_now: Callable[[], None] | None = None,
                       exit_after: tuple[float, Callable[[], None]] | None = None) -> None:
    """Serve ``app`` on ``host``:``port`` until SIGINT or SIGTERM, then return (so the
    process exits 0).

    Args:
        app: the ASGI app.
        host, port: where to listen.
        sock: the socket to serve on, already bound to ``host``:``port`` and listening
            (:func:`rota.cli.listening.listen_socket`: a port in use is then a one-line
            error before this is called); ``None``: uvicorn binds it.
        graceful_seconds: how long, after the first signal, requests in flight may take
            to end (``None``: without limit).
        on_stop: called in the server's event loop at the first signal, before uvicorn
            stops taking requests (``rota serve`` sets its cron runs' stop event).
        on_stop_now: called in the server's event loop at the second signal (``rota
            serve`` cancels its cron run in flight, which hands its jobs back); without
            it, a second signal stops waiting for the requests in flight.
        exit_after: ``(seconds, exit)``: ``exit`` (which ends the process) is called
            that long after the first signal if the process is still there, from a
            thread of its own, so a server whose event loop waits on a database that
            stopped answering still ends by then (``rota serve``: just before the
            platform timeout; docs/operations.md, "A database that stops answering").

    Raises:
        SystemExit: 3 when the server did not start (uvicorn logged why).
    """
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if self.should_exit:  # a second signal
                if on_stop_now is None:
                    self.force_exit = True  # stop waiting for requests
                else:
                    _call_in_loop(on_stop_now)
                return
            if on_stop is not None:
                _call_in_loop(on_stop)
            if exit_after is not None:
                timer = threading.Timer(*exit_after)
                timer.daemon = True
                timer.start()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, host=host, port=port, log_level="info",
                            timeout_graceful_shutdown=(None if graceful_seconds is None
                                                       else max(1, int(graceful_seconds))))
    server = Server(config)
    # What uvicorn restores and then re-raises the caught signal into once it has shut
    # down: a handler that does nothing, so the process ends normally.
    previous = {sig: signal.signal(sig, _ignore) for sig in _SIGNALS}
    try:
        server.run(sockets=None if sock is None else [sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not server.started:
        sys.exit(STARTUP_FAILURE)


def _call_in_loop(callback: Callable[[], None]) -> None:
    """Run ``callback`` in the running event loop, soon (from a signal handler, which
    may interrupt the loop anywhere), or now when no loop runs."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        callback()
    else:
        loop.call_soon_threadsafe(callback)


def _ignore(sig: int, frame: FrameType | None) -> None:
    """The signal uvicorn re-raises after it has shut down for it: already handled."""


__all__ = ["STARTUP_FAILURE", "serve_until_signal"]
