"""No secret in any message (docs/operations.md, "Secrets"): connection strings carrying
a marker password, malformed in every way we know (and well-formed but unreachable),
go through every path that can show one: `rota` commands' stdout and stderr, the
exception of Queue(...), log records (exception text included), the error text of
runs and jobs rows, and the cron endpoint's answers. None may show the password, or
any piece of it."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import pkgutil
import time
import traceback
from datetime import timedelta
from typing import Any

import httpx
import psycopg
import pytest
from click.testing import CliRunner
from psycopg import sql

import rota
from rota import DatabaseUnavailable, Pipeline, Queue, Stage
from rota.cli import cli
from rota.redact import LOGGERS, MAX_SCANNED, RedactSecrets, redact
from rota.web import cron_app

PASSWORD = "Qx9vSECRETzK"
APP = "tests.cli_app:build_pipeline"

#: (password as written in the URL, URL): refused before any connection is tried.
MALFORMED = [
    (f"{PASSWORD}%zz", f"postgresql://u:{PASSWORD}%zz@127.0.0.1/db"),
    (PASSWORD, f"postgresq://u:{PASSWORD}@127.0.0.1/db"),
    (f"Qx9v/{PASSWORD}", f"postgresql://u:Qx9v/{PASSWORD}@127.0.0.1/db"),
    (f"Qx9v@{PASSWORD}", f"postgresql://u:Qx9v@{PASSWORD}@127.0.0.1/db"),
    (f"Qx9v {PASSWORD}", f"postgresql://u:Qx9v {PASSWORD}@127.0.0.1/db"),
    (PASSWORD, f"postgresql://u:{PASSWORD}@[::1/db"),
    (PASSWORD, f"postgresql://u:{PASSWORD}@127.0.0.1/db?bogus=1"),
    (PASSWORD, f"postgresql://u@127.0.0.1/db?password={PASSWORD}&bogus=1"),
    (PASSWORD, f"postgresql://u@127.0.0.1/db?sslpassword={PASSWORD}&bogus=1"),
    (PASSWORD, f"host=127.0.0.1 password={PASSWORD} bogus"),
    (PASSWORD, f"host=127.0.0.1 password='{PASSWORD}"),
    (f"{PASSWORD}'x", f"host=127.0.0.1 password='{PASSWORD}\\'x' bogus"),
    # The scheme mangled or missing: libpq reads key=value and quotes the whole string.
    (PASSWORD, f"postgres//u:{PASSWORD}@127.0.0.1/db"),
    (PASSWORD, f"postgresql//u:{PASSWORD}@127.0.0.1/db"),
    (PASSWORD, f"postgres:/u:{PASSWORD}@127.0.0.1/db"),
    (PASSWORD, f"postgresql:u:{PASSWORD}@127.0.0.1/db"),
    (PASSWORD, f"//u:{PASSWORD}@127.0.0.1/db"),
    (PASSWORD, f"u:{PASSWORD}@127.0.0.1/db"),
    (PASSWORD, f"postgres:\\u:{PASSWORD}@127.0.0.1/db"),
    (f"Qx9v@{PASSWORD}", f"postgres//u:Qx9v@{PASSWORD}@127.0.0.1/db"),
    (f"Qx9v {PASSWORD}", f"postgres//u:Qx9v {PASSWORD}@127.0.0.1/db"),
    # No @: libpq reads the password as the port.
    (PASSWORD, f"postgresql://u:{PASSWORD}/db"),
    (PASSWORD, f"postgresql://u:{PASSWORD}"),
    (PASSWORD, f"postgresql://h1:5432,u:{PASSWORD}/db"),
]
MALFORMED_IDS = ["bad-percent", "mistyped-scheme", "unencoded-slash", "unencoded-at",
                 "space", "bad-ipv6", "bad-query", "query-password", "query-sslpassword",
                 "keyvalue", "unterminated-quote", "quoted-keyvalue", "no-scheme-colon",
                 "no-scheme-colon-ql", "scheme-one-slash", "scheme-no-slashes",
                 "no-scheme", "bare-userinfo", "backslashes", "no-scheme-unencoded-at",
                 "no-scheme-space", "no-at-port", "no-at-no-db", "no-at-second-host"]

#: Well-formed, but the connection fails (nothing listens on port 1; a bad sslmode).
UNREACHABLE = [
    (PASSWORD, f"postgresql://u:{PASSWORD}@127.0.0.1:1/db"),
    (PASSWORD, f"postgresql://u:{PASSWORD}@127.0.0.1:1/db?sslmode=bogus"),
    (PASSWORD, f"host=127.0.0.1 port=1 password={PASSWORD}"),
]

COMMANDS = [["jobs"], ["jobs", "failed"], ["migrate"], ["runs"], ["depth"], ["maintain"],
            ["enqueue", "echo", "{}"], ["run", "--app", APP], ["worker", "--app", APP],
            ["serve", "--app", APP]]


def leaks(text: str, password: str) -> list[str]:
    """The pieces of ``password`` (any 4 characters in a row) that ``text`` shows."""
    return sorted({password[i:i + 4] for i in range(len(password) - 3)
                   if password[i:i + 4] in text})


def logged(caplog: pytest.LogCaptureFixture) -> str:
    """Every log record as a handler would write it, exception text included."""
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    return "\n".join(formatter.format(r) for r in caplog.records)


@pytest.mark.parametrize(("password", "url"), MALFORMED, ids=MALFORMED_IDS)
def test_queue_refuses_a_malformed_url_without_showing_its_password(
    password: str, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(DatabaseUnavailable) as exc:
        Queue(url)
    shown = "".join(traceback.format_exception(exc.value)) + repr(exc.value)
    # A scheme that is not postgres(ql):// (a typo included) is said to be one.
    assert str(exc.value).startswith(("malformed database URL", "not a PostgreSQL URL"))
    assert leaks(shown, password) == [], shown
    assert leaks(logged(caplog), password) == []


@pytest.mark.parametrize(("password", "url"), MALFORMED + UNREACHABLE,
                         ids=[*MALFORMED_IDS, "closed-port", "bad-sslmode", "kv-closed-port"])
def test_no_command_shows_the_password_of_a_bad_url(
    password: str, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    runner = CliRunner()
    for args in COMMANDS:
        for how in ("flag", "env"):
            argv = [args[0], "--database-url", url, *args[1:]] if how == "flag" else args
            env = {"DATABASE_URL": url if how == "env" else None, "ROTA_APP": None,
                   "ROTA_SCHEMA": None, "PGCONNECT_TIMEOUT": "3"}
            result = runner.invoke(cli, argv, env=env)
            assert result.exit_code == 2, (argv, result.output)
            out = result.stdout + result.stderr
            assert out.startswith("error: "), out
            assert leaks(out, password) == [], (argv, out)
    assert leaks(logged(caplog), password) == []


@pytest.mark.parametrize("text", [
    f"postgresql://u:{PASSWORD}@db.example/app",
    f"postgres://:{PASSWORD}@db.example:5432/app?sslmode=require",
    f"mysql+x://u:{PASSWORD}@h",
    f"dsn 'host=h password={PASSWORD} dbname=x' failed",
    f"host=h password='{PASSWORD} with spaces' dbname=x",
    f"postgresql://u@h/db?password={PASSWORD}&sslmode=require",
    f"postgresql://u@h/db?sslpassword={PASSWORD}",
    f"PGPASSWORD={PASSWORD} psql",
    f"Password = {PASSWORD}",
    f'missing "=" after "postgres//u:{PASSWORD}@host/db" in connection info string',
    f"postgresql:u:{PASSWORD}@h/db",
    f"u:{PASSWORD}@h",
    f"(u:{PASSWORD}@h",
    f"'//u:Qx9v@{PASSWORD}@h/db'",
])
def test_redact_hides_every_form_of_password(text: str) -> None:
    assert leaks(redact(text), PASSWORD.replace(" ", "")) == [], redact(text)
    assert "***" in redact(text)


def test_redact_keeps_what_is_not_a_password() -> None:
    text = 'connection to server at "db.example" (10.0.0.1), port 5432 failed: timeout'
    assert redact(text) == text
    assert redact("postgresql://u@h/db?sslmode=require") == "postgresql://u@h/db?sslmode=require"
    for kept in ("at 12:30 mail a@b", 'File "x.py", line 3: foo@bar', "git@github.com:x/y",
                 "postgresql://u@[::1]:5432/db"):
        assert redact(kept) == kept


def test_a_scheme_less_url_is_redacted_exactly() -> None:
    url = f"postgres//u:{PASSWORD}@127.0.0.1/db"
    with pytest.raises(DatabaseUnavailable) as exc:
        Queue(url)
    assert str(exc.value) == (
        "malformed database URL 'postgres//u:***@127.0.0.1/db': it has no postgresql:// "
        "scheme and is not key=value text (rota needs postgresql://[user@]host[:port]"
        "[/dbname] or postgres://…, or libpq's key=value form: host=… port=… dbname=…)")
    with pytest.raises(DatabaseUnavailable) as exc:
        Queue(f"postgresql://u:{PASSWORD}/db")
    assert str(exc.value) == ("malformed database URL: its port is not a number (in a URL, "
                              "user:password needs an @ before the host)")


def all_rota_loggers() -> set[str]:
    """The name of every logger rota's modules create (all of them imported; the Django
    backend's only where Django is installed, which needs Python 3.12)."""
    no_django = importlib.util.find_spec("django") is None
    for module in pkgutil.walk_packages(rota.__path__, "rota.", onerror=lambda _: None):
        if module.name.endswith("__main__"):  # which would run the command
            continue
        if no_django and module.name.startswith("rota.contrib.django"):
            continue
        importlib.import_module(module.name)
    return {name for name in logging.root.manager.loggerDict
            if name == "rota" or name.startswith("rota.")}


def test_every_rota_logger_redacts_its_records(caplog: pytest.LogCaptureFixture) -> None:
    names = all_rota_loggers()
    assert names <= set(LOGGERS), names - set(LOGGERS)
    caplog.set_level(logging.DEBUG)
    for name in (*names, "psycopg.pool"):
        log = logging.getLogger(name)
        assert any(isinstance(f, RedactSecrets) for f in log.filters), name
        try:
            raise psycopg.OperationalError(f"cannot use postgresql://u:{PASSWORD}@h/db")
        except psycopg.OperationalError:
            log.exception("connecting with %s failed", f"password={PASSWORD}")
        log.warning("dsn %r", f"postgresql://u:{PASSWORD}@h/db", stack_info=True)
    text = logged(caplog)
    assert "OperationalError" in text and "connecting with" in text
    assert leaks(text, PASSWORD) == [], text


async def test_runs_and_jobs_rows_keep_error_text_without_passwords(
    make_queue: Any, aconn: psycopg.AsyncConnection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    queue: Queue = await make_queue(types=["leaky"])
    await queue.enqueue("leaky", {}, max_attempts=1)

    async def handler(ctx: Any) -> None:
        raise RuntimeError(f"could not reach postgresql://app:{PASSWORD}@db/app")

    class Maintenance:
        async def run_once(self) -> dict[str, int]:
            raise psycopg.OperationalError(f"host=db password={PASSWORD} is down")

    pipeline = Pipeline(queue, [Stage("leaky", 1, 1, handler)])
    ok = await pipeline.run(trigger="manual", time_budget=timedelta(seconds=30))
    broken = await pipeline.run(trigger="manual", time_budget=timedelta(seconds=30),
                                maintenance=Maintenance())
    assert ok.jobs_failed == 1 and broken.stop_reason == "error"
    cur = await aconn.execute(sql.SQL("SELECT string_agg(last_error, ' ') FROM {} UNION ALL "
                                      "SELECT string_agg(error, ' ') FROM {}")
                              .format(queue.table("jobs"), queue.table("runs")))
    last_error, run_error = [r[0] for r in await cur.fetchall()]
    assert "RuntimeError: could not reach postgresql://app:***@db/app" in last_error
    assert "OperationalError: host=db password=*** is down" in run_error
    assert leaks(f"{last_error} {run_error} {broken.error}", PASSWORD) == []
    assert leaks(logged(caplog), PASSWORD) == []


async def test_the_cron_endpoint_shows_no_password(
    make_queue: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    queue: Queue = await make_queue()

    def factory() -> Any:
        Queue(f"postgresql://u:{PASSWORD}%zz@db/app")  # raises DatabaseUnavailable

    class Broken:
        async def run(self, **_: Any) -> Any:
            raise psycopg.OperationalError(f"postgresql://u:{PASSWORD}@db/app went away")

    class Maintenance:
        async def run_once(self) -> dict[str, int]:
            raise RuntimeError(f"password={PASSWORD}")

    class ErrorRun:
        async def run(self, **kw: Any) -> Any:
            pipeline = Pipeline(queue, [Stage("echo", 1, 1, lambda ctx: None)])
            return await pipeline.run(**kw, maintenance=Maintenance())

    secret = "cron-secret-for-secrets"
    answers = []
    for source in (factory, Broken(), ErrorRun()):
        app = cron_app(source, secret=secret)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://cron") as c:
            answers.append(await c.get("/api/cron",
                                       headers={"Authorization": f"Bearer {secret}"}))
    assert [a.status_code for a in answers] == [503, 503, 500]
    for a in answers:
        assert leaks(a.text + str(a.headers), PASSWORD) == [], a.text
    assert leaks(logged(caplog), PASSWORD) == [], logged(caplog)


def test_the_cli_log_handler_redacts_records_of_any_library(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    from rota.cli.output import log_to_stderr

    configured: dict[str, Any] = {}
    monkeypatch.setattr(logging, "basicConfig", lambda **kw: configured.update(kw))
    log_to_stderr()
    [handler] = configured["handlers"]
    record = logging.LogRecord("uvicorn.error", logging.WARNING, __file__, 1, "dsn %s",
                               (f"postgresql://u:{PASSWORD}@h/db",), None)
    assert handler.filter(record)
    assert handler.format(record).endswith("uvicorn.error: dsn postgresql://u:***@h/db")


# Each a repeated unit that once made a pattern try many starts that each scanned to the
# end of the text: quadratic time on a single long word.
HOSTILE_UNITS = ["a", "1", "password", "a.", "x://", "a://b:", "'a:", " a:", "/a:", "a:",
                 "password=", "password='", "x://@", "'a:@", "@a:", ":@"]


@pytest.mark.parametrize("unit", HOSTILE_UNITS)
def test_redaction_takes_linear_time(unit: str) -> None:
    """No pattern is super-linear: 200,000 characters of any of these units (and with
    an @ at the end, where the userinfo patterns' password ends) are redacted in a time
    far from quadratic (the bound only guards against that; it takes milliseconds)."""
    text = unit * (200_000 // len(unit))
    for given in (text, "x" + text + "@"):
        started = time.perf_counter()
        redact(given, given[:1000])
        assert time.perf_counter() - started < 1.0, unit


def test_redaction_reads_a_bounded_text() -> None:
    """A text longer than MAX_SCANNED keeps its two ends and says how much was left out;
    a password in either end is still masked."""
    head, tail = "postgresql://u:hunter2@h/db ", " password=hunter3"
    text = head + "a" * 100_000 + tail
    out = redact(text)
    left_out = len(text) - MAX_SCANNED
    assert out == ("postgresql://u:***@h/db " + "a" * (MAX_SCANNED // 2 - len(head))
                   + f"… ({left_out} characters left out) …"
                   + "a" * (MAX_SCANNED // 2 - len(tail)) + " password=***")
