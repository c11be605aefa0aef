"""The dashboard's and the metrics endpoint's credential, and the dashboard's CSRF
tokens.

One credential, the secret (``ROTA_DASHBOARD_SECRET``), in exactly one
``Authorization`` header: ``Basic`` (what a browser sends after its login prompt; the
user name is not checked) or ``Bearer`` (scripts, Prometheus). A request with two
``Authorization`` headers is refused, whatever they hold, so no proxy or client can
make two credentials disagree. The secret is never read from a query string, a cookie
or another header, is compared in constant time, and appears in no page or log.

Without a secret the apps answer only on a loopback address (the ASGI server's own
address, ``scope["server"]``), and the dashboard only read-only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import time
from collections.abc import Mapping, Sequence
from typing import Literal, TypeAlias

from .cron import usable_secret

#: How a request's credential was judged.
Verdict: TypeAlias = Literal["ok", "missing", "wrong", "ambiguous"]

#: How long a CSRF token (embedded in each page with a form) stays valid.
CSRF_MAX_AGE_S = 12 * 3600


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` (an address or ``localhost``) is a loopback address: 127.0.0.0/8
    or ::1. Any other name, including one that resolves to loopback, is not."""
    if not host:
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_credential(authorization: Sequence[str], secret: str | None) -> Verdict:
    """Judge a request's ``Authorization`` header values against ``secret``.

    Returns:
        ``"ambiguous"`` for more than one header; ``"missing"`` for none;
        ``"ok"`` for ``Basic`` with the secret as password, or ``Bearer <secret>``;
        ``"wrong"`` for anything else, and always when no usable secret is configured.
    """
    if len(authorization) > 1:
        return "ambiguous"
    if not authorization or not authorization[0].strip():
        return "missing"
    expected = usable_secret(secret)
    if expected is None:
        return "wrong"
    scheme, _, token = authorization[0].strip().partition(" ")
    token = token.strip()
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(token, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return "wrong"
        _, sep, token = decoded.partition(":")
        if not sep:
            return "wrong"
    elif scheme.lower() != "bearer":
        return "wrong"
    if not token or usable_secret(token) is None:
        return "wrong"
    matches = hmac.compare_digest(token.encode("utf-8"), expected.encode("utf-8"))
    return "ok" if matches else "wrong"


def _csrf_mac(secret: str, issued: str) -> str:
    # A key of its own, derived from the secret: the page carries a MAC, never the secret.
    key = hmac.new(secret.encode("utf-8"), b"rota-dashboard-csrf", hashlib.sha256).digest()
    return hmac.new(key, issued.encode("ascii"), hashlib.sha256).hexdigest()


def csrf_token(secret: str, now: float | None = None) -> str:
    """A token for the dashboard's forms: when it was issued and a MAC of that under a
    key derived from the secret (stateless: any process with the secret checks it)."""
    issued = str(int(time.time() if now is None else now))
    return f"{issued}.{_csrf_mac(secret, issued)}"


def csrf_ok(token: str | None, secret: str, now: float | None = None) -> bool:
    """Whether ``token`` came from :func:`csrf_token` with this secret less than
    :data:`CSRF_MAX_AGE_S` ago."""
    if not token:
        return False
    issued, _, mac = token.partition(".")
    if not issued.isascii() or not issued.isdigit() or len(issued) > 12:
        return False
    age = (time.time() if now is None else now) - int(issued)
    if not 0 <= age <= CSRF_MAX_AGE_S:
        return False
    return hmac.compare_digest(mac.encode("utf-8"), _csrf_mac(secret, issued).encode("ascii"))


def same_origin(headers: Mapping[str, str]) -> bool:
    """Whether a write comes from the dashboard's own pages as far as the browser says:
    ``Sec-Fetch-Site`` (when sent) is ``same-origin``, and ``Origin`` (when sent)
    names the host the request was sent to. A browser sends at least one of them on a
    form POST; a script sends neither and is judged by its credential and token."""
    site = headers.get("sec-fetch-site")
    if site is not None and site != "same-origin":
        return False
    origin = headers.get("origin")
    if origin is None:
        return True
    _, sep, netloc = origin.partition("://")
    return bool(sep) and netloc == headers.get("host", "")


__all__ = ["CSRF_MAX_AGE_S", "Verdict", "check_credential", "csrf_ok", "csrf_token",
           "is_loopback", "same_origin"]
