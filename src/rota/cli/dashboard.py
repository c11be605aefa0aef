"""``rota dashboard``: the web dashboard and ``/metrics`` (:mod:`rota.web.dashboard`)
under uvicorn."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import click
import psycopg

from ..queue import Queue
from .app import CONNECT_TIMEOUT, build_pipeline, require_migrated
from .errors import CliConfigError, RotaCommand
from .listening import listen_socket, warn_short_secret
from .options import WholeNumber, make_target, target_options
from .serving import serve_until_signal


@click.command("dashboard", cls=RotaCommand)
@target_options
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=WholeNumber(0, 65535), default=8080, show_default=True)
@click.option("--read-only", is_flag=True,
              help="No Retry or Cancel (the only way to serve without a secret, and "
                   "then only on a loopback address).")
def dashboard(database_url: str | None, schema: str | None, app_spec: str | None,
              host: str, port: int, read_only: bool) -> None:
    """Serve the web dashboard and /metrics (the credential comes from
    ROTA_DASHBOARD_SECRET; --app shows the app's quotas).

    Without ROTA_DASHBOARD_SECRET it starts only with --read-only on a loopback
    address (127.0.0.1, ::1, localhost); otherwise it exits 2, as it does when the
    database is unreachable or its schema is not migrated. SIGINT or SIGTERM stops it
    (exit 0) once the requests in flight have ended."""
    from ..web.auth import is_loopback
    from ..web.cron import usable_secret
    from ..web.dashboard import dashboard_app

    secret = usable_secret(os.environ.get("ROTA_DASHBOARD_SECRET"))
    if secret is None and not (read_only and is_loopback(host)):
        raise CliConfigError(
            "ROTA_DASHBOARD_SECRET is not set: without a credential the dashboard "
            "serves only with --read-only on a loopback address (--host 127.0.0.1)")
    warn_short_secret("ROTA_DASHBOARD_SECRET", secret)
    target = make_target(database_url, schema, app_spec)
    url = target.url()
    queue = Queue(url, **target.queue_kwargs())

    async def check() -> Any:
        async with await psycopg.AsyncConnection.connect(
                url, autocommit=True, connect_timeout=CONNECT_TIMEOUT) as conn:
            await require_migrated(queue, conn)
        # The app's pipeline, for its quotas and its give-up hooks (run on Cancel).
        return await build_pipeline(target, queue) if target.app is not None else None

    pipeline = asyncio.run(check())
    app = dashboard_app(queue, secret=secret, read_only=read_only, pipeline=pipeline,
                        close_queue=True)
    sock = listen_socket(host, port)
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"rota dashboard on http://{shown}:{sock.getsockname()[1]}/ "
               f"(schema {queue.schema!r}{', read-only' if read_only else ''})", err=True)
    serve_until_signal(app, host=host, port=port, sock=sock)
