"""Passwords out of every message (docs/operations.md, "Secrets"): :func:`redact` replaces
the password of any connection string in a text by ``***``, and :class:`RedactSecrets`
does it to the log records of rota's loggers, exception text included.

What counts as a password: the ``user:password@`` of a URL (any scheme, so a mistyped
``postgresq://`` too, and with the scheme mangled or missing: ``postgres//u:pw@host``,
``postgresql:u:pw@host``, ``u:pw@host``), and the value of ``password=``,
``sslpassword=`` or any other ``…password=`` key, in key/value conninfo (quoted or
not), a URL's query string or an environment-style ``PGPASSWORD=``. Given the
connection string a message is about, :func:`redact` also removes that string's
password wherever the message quotes it, even a piece of it (libpq's parse errors quote
the token they stumbled on: ``invalid percent-encoded token: "hunter2%zz"``).

This module imports nothing from rota, so every other module may use it.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote

MASK = "***"

# Every pattern here runs in time linear in the text it scans (docs/operations.md,
# "Secrets"): a match may start only where no earlier position could have started the
# same match (the start of a run of scheme characters, after a delimiter, at a word's
# start), and what a start scans stops at the characters that could start the next
# one, so each character is read a bounded number of times. The userinfo patterns'
# password runs to the last @ of a run of non-blank characters; they are applied only to
# a run's text up to that @ (:func:`_redact_userinfo`), so a start never scans to the
# run's end in vain.

# scheme://user:PASSWORD@ — the password runs to the last @ of the unbroken run, since an
# unencoded @ in a password is the commonest way to write a malformed URL.
_URL_PASSWORD = re.compile(
    r"(?i)(?<![a-z0-9+.\-])([a-z][a-z0-9+.\-]*+://[^\s:/?#@\"']*+:)([^\s\"]*)(@)")
# A URL's userinfo whatever its scheme became (``postgres//u:PASSWORD@h``,
# ``postgresql:u:PASSWORD@h``, ``u:PASSWORD@h``): a word that starts after a boundary,
# a colon not followed by ``/`` (that is a scheme's ``://``), then to the last ``@`` of
# the run.
_USERINFO_PASSWORD = re.compile(
    r"(?:(?<=^)|(?<=[\s\"'/\\]))([^\s:/@\"'\\=]++:)(?!/)([^\s\"]*)(@)")
# The same in the connection string a message is about, where the password runs to the
# string's last @ (a space in it is a malformed password, not the end of one).
_CONNINFO_USERINFO = re.compile(
    r"(?:(?<=^)|(?<=[\s\"'/\\]))[^\s:/@\"'\\=]++:(?!/)(.*)@", re.S)
# password=VALUE, sslpassword='VALUE', PGPASSWORD=VALUE, ?password=VALUE&…
_KEY_PASSWORD = re.compile(
    r"(?i)((?<!\w)\w*password\s*+=\s*+)('(?:[^'\\]|\\.)*+'?|[^\s&'\"]++)")
# A run of characters a URL's or a userinfo's password can hold (and so the patterns
# above can span).
_RUN = re.compile(r'[^\s"]+')

#: The most of a text :func:`redact` scans: a longer one keeps its first and last
#: ``MAX_SCANNED // 2`` characters, the middle left out and said so, before any pattern
#: reads it, so a message of any length costs a bounded time (docs/operations.md,
#: "Secrets").
MAX_SCANNED = 64_000

#: The loggers whose records are redacted: rota's, and the pool's that rota opens.
LOGGERS = ("rota", "rota.claim", "rota.cli", "rota.connections", "rota.queue", "rota.runner",
           "rota.store", "rota.web", "rota.web.dashboard", "rota.web.metrics",
           "rota.worker", "psycopg.pool")


def redact(text: str, conninfo: str | None = None) -> str:
    """``text`` with every connection-string password in it replaced by ``***``.

    Args:
        text: a message (an error, a log line, a traceback).
        conninfo: the connection string the message is about, if known: its password
            is also removed where the message quotes it whole, decoded or in part.

    Returns:
        The text, unchanged where it holds no password.
    """
    text = bounded(text, MAX_SCANNED)
    if conninfo:
        conninfo = bounded(conninfo, MAX_SCANNED)
        spans = _secret_spans(conninfo)
        if spans:
            text = re.sub(r'"([^"]*)"', lambda m: f'"{_mask_token(m.group(1), conninfo, spans)}"',
                          text)
            secrets = {conninfo[a:b] for a, b in spans}
            secrets |= {unquote(s) for s in secrets}
            for secret in sorted(secrets, key=len, reverse=True):
                if len(secret) >= 3:  # shorter ones would garble the text, not hide much
                    text = text.replace(secret, MASK)
    text = _RUN.sub(_redact_userinfo, text)
    return _KEY_PASSWORD.sub(lambda m: m.group(1) + MASK, text)


def bounded(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters, else its first and last
    ``limit // 2`` with a marker saying how many were left out between them."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}… ({len(text) - 2 * half} characters left out) …{text[-half:]}"


def _redact_userinfo(run: re.Match[str]) -> str:
    """One run of non-blank characters with its URL and userinfo passwords masked. Both
    end at an ``@``, so only the run up to its last ``@`` is scanned (none: nothing)."""
    text = run.group()
    end = text.rfind("@") + 1
    if not end:
        return text
    head = _URL_PASSWORD.sub(lambda m: m.group(1) + MASK + m.group(3), text[:end])
    head = _USERINFO_PASSWORD.sub(lambda m: m.group(1) + MASK + m.group(3), head)
    return head + text[end:]


def _secret_spans(conninfo: str) -> list[tuple[int, int]]:
    """Where the passwords are in ``conninfo``, as ``(start, end)`` offsets: the URL's
    password both as libpq reads it (userinfo up to the first ``@`` or ``/``) and, when
    the URL has another ``@`` after that, up to the last ``@`` (the password that was
    meant, unencoded); and each ``…password=`` value."""
    spans = []
    scheme = re.match(r"\s*[A-Za-z][A-Za-z0-9+.\-]*://", conninfo)
    if scheme:
        start = scheme.end()
        stop = re.compile(r"[@/]").search(conninfo, start)
        last_at = conninfo.rfind("@")
        for end in {stop.start() if stop and stop.group() == "@" else -1, last_at}:
            colon = conninfo.find(":", start, end) if end > start else -1
            if colon >= 0:
                spans.append((colon + 1, end))
    else:  # a mangled or missing scheme: a userinfo is still a userinfo, spaces and all
        # Up to the last @ only, where the pattern's password ends (see above).
        userinfo = _CONNINFO_USERINFO.search(conninfo, 0, conninfo.rfind("@") + 1)
        if userinfo:
            spans.append(userinfo.span(1))
    spans += [m.span(2) for m in _KEY_PASSWORD.finditer(conninfo)]
    return [(a, b) for a, b in spans if b > a]


def _mask_token(token: str, conninfo: str, spans: list[tuple[int, int]]) -> str:
    """``token`` (quoted by a message) with the characters that come from a password of
    ``conninfo`` replaced by ``***``, wherever in ``conninfo`` the token occurs."""
    if not token:
        return token
    hidden = [False] * len(token)
    at = conninfo.find(token)
    while at >= 0:
        for a, b in spans:
            for i in range(max(a, at), min(b, at + len(token))):
                hidden[i - at] = True
        at = conninfo.find(token, at + 1)
    out, i = [], 0
    while i < len(token):
        if hidden[i]:
            while i < len(token) and hidden[i]:
                i += 1
            out.append(MASK)
        else:
            out.append(token[i])
            i += 1
    return "".join(out)


class RedactSecrets(logging.Filter):
    """A logging filter that redacts a record's message, arguments, exception text and
    stack with :func:`redact` (it never drops a record). Attached to :data:`LOGGERS`
    when rota is imported."""

    _formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        """Redact ``record`` in place; always ``True``."""
        message = record.getMessage()
        redacted = redact(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        if record.exc_info and not record.exc_text:
            record.exc_text = self._formatter.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


_FILTER = RedactSecrets()


def install(names: tuple[str, ...] = LOGGERS) -> None:
    """Attach the redacting filter to the loggers ``names`` (once each).

    A filter applies to the records of the logger it is attached to, not to those of
    its children, so each of rota's loggers is named in :data:`LOGGERS`."""
    for name in names:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)


install()

__all__ = ["LOGGERS", "MASK", "MAX_SCANNED", "RedactSecrets", "bounded", "install", "redact"]
