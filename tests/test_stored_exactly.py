"""What the user typed is what is stored (docs/design.md, "Enqueue" and "Bad input"):
JSON numbers on every path (CLI, API, sync) are stored digit for digit, or refused
saying why; text that cannot be stored (a lone surrogate, more UTF-8 bytes than an
index row holds) is refused up front, before anything is written."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg import sql

from rota import InvalidInput, PayloadError, Queue, SyncQueue
from rota.cli import cli

AConn = psycopg.AsyncConnection[Any]


async def stored(aconn: AConn, queue: Queue, key: str) -> list[str]:
    """The payload's value at ``key`` as PostgreSQL prints it, for every job by id."""
    cur = await aconn.execute(sql.SQL("SELECT payload ->> %s FROM {} ORDER BY id")
                              .format(queue.table("jobs")), [key])
    return [r[0] for r in await cur.fetchall()]


async def count(aconn: AConn, queue: Queue) -> int:
    cur = await aconn.execute(sql.SQL("SELECT count(*) FROM {}").format(queue.table("jobs")))
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


def cli_enqueue(url: str, schema: str, *args: str) -> Any:
    return CliRunner().invoke(cli, ["enqueue", *args], catch_exceptions=False, env={
        "DATABASE_URL": url, "ROTA_SCHEMA": schema, "ROTA_APP": None})


EXACT = ["12345678901234567.89", "0.1", "123456789012345678901234567890",
         "-0.000000000000000000000000001", "1E+400", "3.141592653589793238462643383279"]


async def test_the_cli_stores_numbers_as_typed(
    queue: Queue, aconn: AConn, database_url: str
) -> None:
    """The issue's example: `rota enqueue t '{"amount": 12345678901234567.89}'` stored
    12345678901234568."""
    for number in EXACT:
        result = await asyncio.to_thread(cli_enqueue, database_url, queue.schema, "t",
                                         f'{{"amount": {number}}}')
        assert result.exit_code == 0, result.stderr
    assert await stored(aconn, queue, "amount") == [
        "12345678901234567.89", "0.1", "123456789012345678901234567890",
        "-0.000000000000000000000000001", "1" + "0" * 400,
        "3.141592653589793238462643383279"]


async def test_the_api_and_the_sync_path_store_decimals_as_given(
    queue: Queue, aconn: AConn, database_url: str
) -> None:
    await queue.enqueue("t", {"amount": Decimal("12345678901234567.89")})
    await queue.enqueue_many([{"type": "t", "payload": {"amount": Decimal("0.10")}}])

    def sync() -> None:
        with psycopg.connect(database_url) as conn:
            SyncQueue(schema=queue.schema).enqueue(
                conn, "t", {"amount": [Decimal("-1E-30"), 2**100]})

    await asyncio.to_thread(sync)
    assert await stored(aconn, queue, "amount") == [
        "12345678901234567.89", "0.10",
        "[-0.000000000000000000000000000001, 1267650600228229401496703205376]"]
    # Read back as Python's JSON types (a float for a decimal), as documented.
    [first, *_] = await queue.claim("t", 3)
    assert first.payload == {"amount": 12345678901234567.89}


@pytest.mark.parametrize(("number", "message"), [
    ("1e99999", "a Decimal with 100000 digits before the point; at most 4300 can be read"),
    ("1e-20000", "a Decimal with 20000 digits after the point; PostgreSQL stores at most"),
], ids=["too-many-digits", "too-fine"])
async def test_numbers_that_cannot_be_stored_exactly_are_refused_saying_why(
    queue: Queue, aconn: AConn, database_url: str, number: str, message: str
) -> None:
    result = await asyncio.to_thread(cli_enqueue, database_url, queue.schema, "t",
                                     f'{{"n": {number}}}')
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr.startswith(f"error: PAYLOAD_JSON['n'] is {message}"), result.stderr
    with pytest.raises(PayloadError, match=message):
        await queue.enqueue("t", {"n": Decimal(number)})
    assert await count(aconn, queue) == 0


# -- text that cannot be stored ---------------------------------------------------------------

FOUR_BYTES = "𝄞"  # U+1D11E: four bytes in UTF-8


@pytest.mark.parametrize(("field", "value", "message"), [
    ("type", "t\udc80", "job type 't\\\\udc80' contains a lone surrogate"),
    ("group_id", "g\ud800", "group_id 'g\\\\ud800' contains a lone surrogate"),
    ("dedupe_key", "\udfff", "dedupe_key '\\\\udfff' contains a lone surrogate"),
    ("type", FOUR_BYTES * 512,
     "job type is 2048 bytes long in UTF-8 \\(512 characters\\); at most 512 bytes"),
    ("group_id", FOUR_BYTES * 512,
     "group_id is 2048 bytes long in UTF-8 \\(512 characters\\); at most 512 bytes"),
    ("dedupe_key", "é" * 257,
     "dedupe_key is 514 bytes long in UTF-8 \\(257 characters\\); at most 512 bytes"),
], ids=["surrogate-type", "surrogate-group", "surrogate-key", "4-byte-type",
        "4-byte-group", "2-byte-key"])
async def test_text_that_cannot_be_stored_is_refused_up_front(
    queue: Queue, aconn: AConn, database_url: str, field: str, value: str, message: str
) -> None:
    """A type and a group of 512 four-byte characters each hit ProgramLimitExceeded
    (the index row): now each is refused by its UTF-8 length, nothing written, on every
    path."""
    args: dict[str, Any] = {"type": "t", "payload": {}, field: value}
    with pytest.raises(InvalidInput, match=message):
        await queue.enqueue(args.pop("type"), args.pop("payload"), **args)
    with pytest.raises(InvalidInput, match=f"item 0: {message}"):
        await queue.enqueue_many([{"type": "t", "payload": {}, field: value}])
    flag = {"type": [], "group_id": ["--group"], "dedupe_key": ["--dedupe-key"]}[field]
    cli_args = [value, "{}"] if field == "type" else ["t", "{}", *flag, value]
    result = await asyncio.to_thread(cli_enqueue, database_url, queue.schema, *cli_args)
    assert (result.exit_code, result.stdout) == (2, ""), result.stderr
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("error: ")
    assert await count(aconn, queue) == 0


async def test_the_longest_names_allowed_are_stored(queue: Queue) -> None:
    name = FOUR_BYTES * 128  # 512 bytes
    await queue.upsert_group(name, plan=None)
    job = await queue.enqueue(name, {}, group_id=name, dedupe_key=name)
    assert job is not None and (job.type, job.group_id) == (name, name)
    [claimed] = await queue.claim(name, 1)
    assert await queue.complete(claimed)
