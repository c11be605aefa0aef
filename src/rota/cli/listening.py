"""What a server command (``rota serve``, ``rota dashboard``) settles before it serves:
the socket it listens on, bound here so that a port in use is one line and exit 2 like
any configuration error (not uvicorn's traceback and exit 3), and a warning for a
secret too short to resist guessing (docs/operations.md, "Secrets")."""

from __future__ import annotations

import errno
import socket

import click

from .errors import CliConfigError

#: The fewest characters a secret should have; a shorter one is accepted with a warning.
MIN_SECRET_CHARS = 16

# Why a bind failed; {pick} is "; pick another --port" (or nothing, without the option).
_REASONS = {
    errno.EADDRINUSE: "the address is already in use (by another server?{pick})",
    errno.EACCES: "permission denied (ports below 1024 need privileges{pick})",
    errno.EADDRNOTAVAIL: "no interface of this machine has that address (check --host)",
}


def listen_socket(host: str, port: int, *, port_option: str | None = "--port"
                  ) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` and listening, to hand to uvicorn
    (``uvicorn.Server.run(sockets=[…])``), set up as uvicorn sets up its own: IPv6 when
    ``host`` has a colon, ``SO_REUSEADDR``, inheritable (for its workers).

    Args:
        host: an IP address or a host name (``localhost``).
        port: 0 to 65535 (0: any free port).
        port_option: the command's option that chooses the port, named in the error
            (``None``: it has none).

    Returns:
        The listening socket; the caller closes it (uvicorn does when it stops).

    Raises:
        CliConfigError: it cannot be bound (the port is in use, a privileged port, an
            address not of this machine, a name that does not resolve); one line, exit 2.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)  # uvicorn's default backlog
    except OSError as exc:
        sock.close()
        pick = f"; pick another {port_option}" if port_option else ""
        reason = (_REASONS[exc.errno].format(pick=pick) if exc.errno in _REASONS
                  else exc.strerror or str(exc))
        where = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
        raise CliConfigError(f"cannot listen on {where}: {reason}") from None
    sock.set_inheritable(True)
    return sock


def warn_short_secret(name: str, secret: str | None) -> None:
    """Print a warning to stderr when the secret in environment variable ``name`` is
    set but shorter than :data:`MIN_SECRET_CHARS` characters (it is still used)."""
    if secret is not None and len(secret) < MIN_SECRET_CHARS:
        chars = "character" if len(secret) == 1 else "characters"
        click.echo(f"warning: {name} is {len(secret)} {chars} long; use at least "
                   f"{MIN_SECRET_CHARS} (for example: python -c 'import secrets; "
                   "print(secrets.token_urlsafe(32))')", err=True)


__all__ = ["MIN_SECRET_CHARS", "listen_socket", "warn_short_secret"]
