"""Every statement has its typed function (docs/design.md, "Where things live"):
``rota.statements.NAME`` for ``rota/sql/NAME.sql``, whose keyword parameters are exactly
the placeholders its statement uses, so a mistyped name or a missing parameter fails
here (and in mypy), not in production. No database needed."""

from __future__ import annotations

import inspect
import re
import string
from pathlib import Path

import pytest

import rota
from rota import statements
from rota.store import Statements

SQL = Path(rota.__file__).parent / "sql"
#: ``%(name)s`` (text), ``%(name)b`` (binary) or ``%(name)t`` placeholders; ``%%`` is a
#: percent sign.
PLACEHOLDER = re.compile(r"%%|%\((\w+)\)[sbt]")
#: Arguments a function takes besides the statement's parameters.
NOT_PARAMETERS = {"store", "conn", "deadline", "row_factory"}


def blocks() -> set[str]:
    """Files included by other statements (``{fenced_claims}``): shared blocks, not
    statements of their own."""
    found: set[str] = set()
    for path in SQL.glob("*.sql"):
        text = path.read_text("utf-8")
        found |= {f for _, f, _, _ in string.Formatter().parse(text) if f}
    return found - {"schema", "groups"}


def placeholders(name: str) -> set[str]:
    """The parameters statement ``name`` uses, its included blocks' too."""
    text = Statements("s").sql(name).as_string(None)
    return {m.group(1) for m in PLACEHOLDER.finditer(text) if m.group(1)}


def functions() -> dict[str, object]:
    return {n: f for n, f in vars(statements).items()
            if inspect.iscoroutinefunction(f) and f.__module__ == statements.__name__}


STATEMENTS = sorted(p.stem for p in SQL.glob("*.sql") if p.stem not in blocks())


@pytest.mark.parametrize("name", STATEMENTS)
def test_every_statement_has_its_function(name: str) -> None:
    assert name in functions(), f"rota/sql/{name}.sql has no rota.statements.{name}"


@pytest.mark.parametrize("name", sorted(functions()))
def test_each_functions_parameters_are_its_statements_placeholders(name: str) -> None:
    assert (SQL / f"{name}.sql").exists(), f"no statement rota/sql/{name}.sql"
    params = inspect.signature(functions()[name]).parameters  # type: ignore[arg-type]
    first, *rest = params.values()
    assert first.name == "store"
    assert all(p.kind is p.KEYWORD_ONLY for p in rest)  # named at every call
    assert set(params) - NOT_PARAMETERS == placeholders(name)


def test_the_placeholder_parser_reads_binary_and_text_parameters() -> None:
    assert placeholders("complete_many") == {
        "ids", "claim_tokens", "results", "started_ats", "costs", "offset", "schema_name"}
    assert {"ids", "claim_tokens"} <= placeholders("defer")  # from {fenced_claims}
