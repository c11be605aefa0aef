"""What the CLI prints: text from the database shown literally (no terminal control, no
rich markup), tables, JSON for scripts, durations and times, progress and log lines."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
import unicodedata
import uuid
from collections.abc import Awaitable, Mapping
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any, TypeVar

import click
from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from ..admin import summary_items
from ..plans import Plans
from ..redact import RedactSecrets

T = TypeVar("T")

#: Width of tables written to something that is not a terminal (a file, a pipe, a log
#: collector), where rich would otherwise assume 80 columns and cut values.
PIPE_WIDTH = 160


# -- text from the database: literal, no terminal control -------------------------------


def _escape_char(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def safe_text(value: object) -> str:
    """``value`` as text a terminal shows literally: whitespace runs (newlines, tabs)
    become one space, and every other non-printable character (C0/C1 controls such as
    ESC, bidirectional overrides, other format characters) is written as its Python
    escape (``\\x1b``, ``\\u202e``). Rich markup is not involved: pass the result in
    a :class:`rich.text.Text`, as :func:`cell` does."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():
        return text
    text = " ".join(text.split())
    if text.isprintable():
        return text
    return "".join(
        ch if ch.isprintable() else " " if unicodedata.category(ch) == "Zs"
        else _escape_char(ch)
        for ch in text)


def cell(value: object, style: str = "") -> Text:
    """A table cell showing ``value`` literally (see :func:`safe_text`)."""
    return Text(safe_text(value), style=style)


def add_row(table: Table, *values: object, style: str | None = None) -> None:
    """Add a row whose cells are shown literally: never parsed as markup or emoji."""
    table.add_row(*(v if isinstance(v, Text) else cell(v) for v in values), style=style)


def console() -> Console:
    """The console tables go to: the terminal's width on a terminal; otherwise
    ``COLUMNS`` when set, else :data:`PIPE_WIDTH` columns."""
    out = Console(highlight=False, emoji=False, markup=False)
    if not out.is_terminal and not os.environ.get("COLUMNS"):
        out = Console(highlight=False, emoji=False, markup=False, width=PIPE_WIDTH)
    return out


# -- JSON -----------------------------------------------------------------------------------


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return float(value)
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def _json_escape(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def emit_json(data: Any) -> None:
    """Print ``data`` as JSON. Non-ASCII text stays readable, but non-printable
    characters (which JSON may carry raw inside strings: C1 controls, bidirectional
    overrides) are written as ``\\uXXXX`` escapes, so the output cannot drive a
    terminal either."""
    text = json.dumps(data, default=_json_default, indent=2, ensure_ascii=False)
    if not text.replace("\n", "").isprintable():
        text = "".join(ch if ch == "\n" or ch.isprintable() else _json_escape(ch)
                       for ch in text)
    click.echo(text)


# -- values in tables -------------------------------------------------------------------------

#: What every listing shows for a value that is not there: a job without a group, a
#: group without an owner or a plan, an instant that has not come. One mark, so
#: `rota jobs` and `rota groups list` say "no plan" alike.
ABSENT = "—"


def plan_label(plans: Plans, plan_id: str | None, *, with_id: bool = False) -> str:
    """A plan for a listing.

    Args:
        plans: the queue's plans (the app's, else rota's default plans).
        plan_id: the plan id, ``None`` for none (a job without a group, a group without
            a plan).
        with_id: follow a known plan's name with its id, ``pro (p2)``.

    Returns:
        The plan's name (and id); ``ID (unknown)`` for an id ``plans`` does not hold;
        :data:`ABSENT` for no plan.
    """
    if plan_id is None:
        return ABSENT
    if plan_id not in plans:
        return f"{plan_id} (unknown)"
    name = plans[plan_id].name
    return f"{name} ({plan_id})" if with_id else name



def utc_time(value: datetime | None) -> str:
    """An instant for a table, in UTC to the second; ``—`` for none."""
    if value is None:
        return ABSENT
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def short(text: str | None, width: int = 60) -> str:
    """``text`` shown literally on one line, cut to ``width`` characters."""
    if not text:
        return ""
    line = safe_text(text)
    return line if len(line) <= width else line[: width - 1] + "…"


def age(duration: timedelta | None) -> str:
    """A duration for a table: ``42s``, ``17m``, ``5h``, ``3d``; ``—`` for none."""
    if duration is None:
        return ABSENT
    seconds = max(duration.total_seconds(), 0.0)
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= 2 * size:
            return f"{seconds // size:.0f}{unit}"
    return f"{seconds:.0f}s"


def summary_text(summary: Mapping[str, Any] | None) -> str:
    """A run's counters as ``key=value`` pairs (:func:`rota.admin.summary_items`)."""
    return ", ".join(f"{k}={v}" for k, v in summary_items(summary))


def compact_table(title: str | None = None) -> Table:
    """A table that fits 80 columns when its cells do: no vertical rules, one space
    between columns, a rule under the header."""
    return Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, padding=0,
                 show_edge=False)


# -- progress and logs ------------------------------------------------------------------------


async def with_progress(work: Awaitable[T], label: str, total: float | None = None) -> T:
    """Await ``work`` while a rich progress display on stderr shows the time spent (a bar
    against ``total`` seconds when given). Plain await when stderr is not a terminal."""
    task = asyncio.ensure_future(work)
    err = Console(stderr=True)
    if not err.is_terminal:
        return await task
    columns: list[str | ProgressColumn] = [SpinnerColumn(), TextColumn(label)]
    if total:
        columns += [BarColumn(), TimeElapsedColumn(), TextColumn(f"of {total:g}s budget")]
    else:
        columns += [TimeElapsedColumn()]
    with Progress(*columns, console=err, transient=True) as progress:
        bar = progress.add_task(label, total=total)
        start = time.monotonic()
        while not task.done():
            await asyncio.wait([task], timeout=0.2)
            progress.update(bar, completed=min(time.monotonic() - start, total or 0.0))
    return task.result()


class SafeFormatter(logging.Formatter):
    """A log formatter whose lines cannot drive a terminal: each line of a record
    (a traceback keeps its lines) has its control characters escaped, as
    :func:`safe_text` does for tables (errors carry text from jobs)."""

    def format(self, record: logging.LogRecord) -> str:
        return "\n".join(safe_text(line) for line in super().format(record).split("\n"))


def log_to_stderr() -> None:
    """Send INFO and above to stderr, one escaped line per record line, with
    connection-string passwords redacted whichever library logged them."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(SafeFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactSecrets())
    logging.basicConfig(level=logging.INFO, handlers=[handler])
