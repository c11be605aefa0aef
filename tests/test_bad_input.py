"""Bad input: a clear error naming what was wrong, and nothing written."""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from rota import (
    InvalidInput,
    NaiveDatetimeError,
    PayloadError,
    Plan,
    Plans,
    Queue,
    SyncQueue,
    UnknownGroup,
    UnknownJobType,
    UnknownPlan,
)
from rota.job import DeferJob


async def count(aconn: Any, queue: Queue) -> int:
    return (await (await aconn.execute(
        f'SELECT count(*) FROM "{queue.schema}".jobs')).fetchone())[0]


@pytest.mark.parametrize(("payload", "message"), [
    ({"when": datetime(2026, 1, 1)}, "not JSON-serializable"),
    ({"amount": Decimal("NaN")}, "Decimal\\('NaN'\\), which JSON cannot represent"),
    ({"tags": {"a", "b"}}, "not JSON-serializable"),
    ({"x": math.nan}, "nan"),
    ({"x": [math.inf]}, "inf"),
    ({"text": "a\x00b"}, "NUL"),
    ({"bad\x00key": 1}, "NUL"),
    ({"s": "\ud800"}, "lone surrogate"),
    ({"blob": "x" * (1024 * 1024)}, "larger than the maximum 1048576"),
])
async def test_bad_payloads_are_refused_and_nothing_written(
    queue: Queue, aconn: Any, payload: Any, message: str
) -> None:
    with pytest.raises(PayloadError, match=message):
        await queue.enqueue("t", payload)
    with pytest.raises(PayloadError, match=f"item 1: .*{message}"):
        await queue.enqueue_many([{"type": "t", "payload": {}}, {"type": "t", "payload": payload}])
    assert await count(aconn, queue) == 0


async def test_payload_limit_is_configurable(make_queue: Any) -> None:
    queue = await make_queue(max_payload_bytes=100)
    assert await queue.enqueue("t", {"s": "x" * 80})
    with pytest.raises(PayloadError, match="larger than the maximum 100"):
        await queue.enqueue("t", {"s": "x" * 100})


async def test_naive_datetimes_are_refused(queue: Queue, aconn: Any) -> None:
    naive = datetime(2030, 1, 1, 12, 0)
    with pytest.raises(NaiveDatetimeError, match="run_after=2030-01-01T12:00:00 has no time zone"):
        await queue.enqueue("t", {}, run_after=naive)
    with pytest.raises(NaiveDatetimeError):
        await queue.enqueue_many([{"type": "t", "payload": {}, "run_after": naive}])
    with pytest.raises(NaiveDatetimeError):
        DeferJob(naive)
    job = await queue.enqueue("t", {})
    assert job
    [c] = await queue.claim("t", 1)
    with pytest.raises(NaiveDatetimeError):
        await queue.defer(c, naive)
    assert (await queue.get_job(c.id)).status == "running"  # type: ignore[union-attr]
    assert await count(aconn, queue) == 1


async def test_job_types_empty_or_undeclared(make_queue: Any, aconn: Any) -> None:
    queue = await make_queue(types=["search", "draft"])
    for bad in ("", None, 5):
        with pytest.raises(InvalidInput, match="job type must be a non-empty string"):
            await queue.enqueue(bad, {})  # type: ignore[arg-type]
    with pytest.raises(UnknownJobType, match="unknown job type 'serach'; declared types: draft"):
        await queue.enqueue("serach", {})
    with pytest.raises(UnknownJobType):
        await queue.claim("serach", 1)
    with pytest.raises(UnknownJobType):
        queue.on_give_up("serach", lambda j, c: None)  # type: ignore[arg-type, return-value]
    assert await count(aconn, queue) == 0


async def test_unknown_plan_is_refused(queue: Queue, aconn: Any) -> None:
    with pytest.raises(UnknownPlan, match="unknown plan 'platinum'; known plans: free"):
        await queue.upsert_group("g", plan="platinum")
    cur = await aconn.execute(f'SELECT count(*) FROM "{queue.schema}".groups')
    assert (await cur.fetchone())[0] == 0


async def test_limit_must_be_positive(queue: Queue) -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InvalidInput, match="limit must be a positive int"):
            await queue.claim("t", bad)  # type: ignore[arg-type]


async def test_unknown_group_is_refused(queue: Queue, aconn: Any) -> None:
    await queue.upsert_group("known", plan="free")
    with pytest.raises(UnknownGroup, match="unknown group 'typo'"):
        await queue.enqueue("t", {}, group_id="typo")
    with pytest.raises(UnknownGroup, match="unknown group 'typo'"):
        await queue.enqueue_many([{"type": "t", "payload": {}, "group_id": "known"},
                                  {"type": "t", "payload": {}, "group_id": "typo"}])
    with pytest.raises(UnknownGroup, match=r"^item 0: unknown group 'b' \(unknown groups "
                                           r"in the batch: 'a', 'b'\): create it first"):
        await queue.enqueue_many([{"type": "t", "payload": {}, "group_id": g}
                                  for g in ("b", "known", "a")])
    assert await count(aconn, queue) == 0


async def test_an_unknown_group_in_a_batch_names_its_item_and_group(
        queue: Queue, aconn: Any) -> None:
    """As every other bad item of a batch is named (`item 1: ...`, from 0): the first
    item whose group is unknown, and its group id, on the async and the sync path; ids
    with quotes, backslashes and ", " in them read back exactly."""
    await queue.upsert_group("known", plan="free")
    tail = ("create it first (a row of the groups relation; queue.upsert_group in Python) "
            "or enqueue without a group")
    batches = [
        (["known", "nope"], f"item 1: unknown group 'nope': {tail}"),
        ([None, "known", "it's", "it's"], f"item 2: unknown group 'it''s': {tail}"),
        (["known", "a', 'known", "back\\slash"],
         "item 1: unknown group 'a'', ''known' (unknown groups in the batch: "
         f"'a'', ''known', E'back\\\\slash'): {tail}"),
        ([f"g{n}" for n in range(7)],
         "item 0: unknown group 'g0' (unknown groups in the batch: 'g0', 'g1', 'g2', 'g3', "
         f"'g4' …): {tail}"),
    ]
    sync = SyncQueue(schema=queue.schema)
    for groups, message in batches:
        items = [{"type": "t", "payload": {}, "group_id": g} for g in groups]
        with pytest.raises(UnknownGroup) as raised:
            await queue.enqueue_many(items)
        assert str(raised.value) == message
        with psycopg.connect(aconn.info.dsn, autocommit=True) as c, \
                pytest.raises(UnknownGroup) as raised:
            sync.enqueue_many(c, items)
        assert str(raised.value) == message
    assert await count(aconn, queue) == 0


@pytest.mark.parametrize("items", [None, "jobs", {"type": "t", "payload": {}}, 42])
async def test_enqueue_many_needs_an_iterable_of_mappings(queue: Queue, aconn: Any,
                                                          items: Any) -> None:
    with pytest.raises(InvalidInput, match="^items must be an iterable of mappings"):
        await queue.enqueue_many(items)
    assert await count(aconn, queue) == 0


async def test_bad_settings_and_batch_items(database_url: str, queue: Queue) -> None:
    with pytest.raises(InvalidInput, match="schema 'x; drop table jobs' is not a valid"):
        Queue(database_url, schema="x; drop table jobs")
    with pytest.raises(InvalidInput, match="stale_after must be a datetime.timedelta"):
        Queue(database_url, stale_after=900)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="max_attempts must be an int >= 1"):
        Queue(database_url, max_attempts=0)
    with pytest.raises(InvalidInput, match="item 0: needs 'type' and 'payload'"):
        await queue.enqueue_many([{"payload": {}}])
    with pytest.raises(InvalidInput, match="unexpected \\['priority'\\]"):
        await queue.enqueue_many([{"type": "t", "payload": {}, "priority": 9}])
    with pytest.raises(InvalidInput, match="clock_offset must be a datetime.timedelta"):
        queue.clock_offset = 5  # type: ignore[assignment]
    assert queue.clock_offset == timedelta(0)


def test_plans_are_validated() -> None:
    with pytest.raises(InvalidInput, match=r"priorities never decreasing\), got \[2, 1\]"):
        Plans([Plan("a", "A", 2), Plan("b", "B", 1)])
    assert [p.weight for p in Plans([Plan("a", "A", 1), Plan("b", "B", 1, weight=4)])] \
        == [1, 4]  # plans of one priority share by weight
    for bad in (0, -1, 1.5, True, "4", 1_000_001, None):
        with pytest.raises(InvalidInput, match=f"plan 'a': weight must be an int from 1 to "
                                               f"1,000,000, got {re.escape(repr(bad))}$"):
            Plan("a", "A", 1, weight=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="duplicate plan ids"):
        Plans([Plan("a", "A", 1), Plan("a", "B", 2)])
    with pytest.raises(InvalidInput, match="plan id must be a non-empty string"):
        Plan("", "A", 1)
    with pytest.raises(InvalidInput, match="limits must be a mapping, got 'First'"):
        Plan("a", "A", 1, "First")  # type: ignore[arg-type]


async def test_plan_id_never_becomes_sql(make_queue: Any) -> None:
    evil = "x' then 99 end; drop table jobs; --"
    queue = await make_queue(plans=Plans([Plan("free", "Free", 0),
                                          Plan(evil, "Evil", 1),
                                          Plan("pro", "Pro", 2)]))
    await queue.upsert_group("g", plan=evil)
    job = await queue.enqueue("t", {}, group_id="g")
    assert job
    assert [j.id for j in await queue.claim("t", 1)] == [job.id]


async def test_overlong_keys_and_deep_payloads_are_refused(queue: Queue, aconn: Any) -> None:
    with pytest.raises(InvalidInput, match="dedupe_key is 20000 bytes long in UTF-8 "
                                           "\\(20000 characters\\); at most 512"):
        await queue.enqueue("t", {}, dedupe_key="k" * 20_000)
    deep: Any = []
    for _ in range(5_000):
        deep = [deep]
    with pytest.raises(PayloadError, match="nested deeper than 256 levels"):
        await queue.enqueue("t", deep)
    loop: dict[str, Any] = {}
    loop["self"] = loop
    with pytest.raises(PayloadError, match="nested deeper than 256 levels \\(or contains "
                                           "itself\\)"):
        await queue.enqueue("t", loop)
    assert await count(aconn, queue) == 0


@pytest.mark.parametrize("field", ["every", "advance_every", "vacuum_every",
                                   "horizon_every", "held_after"])
@pytest.mark.parametrize(("value", "says"), [
    (0, "must be a positive number of seconds, got 0"),
    (-1.5, "must be a positive number of seconds, got -1.5"),
    (math.nan, "must be a positive number of seconds, got nan"),
    (math.inf, "must be a positive number of seconds, got inf"),
    (True, "must be a positive number of seconds, got True"),
    ("5", "must be a positive number of seconds, got '5'"),
    (None, "must be a positive number of seconds, got None"),
    (1e308, "must be at most 31557600000 seconds (1000 years), got 1e+308"),
])
def test_upkeep_settings_must_be_positive_seconds_within_1000_years(
        field: str, value: Any, says: str) -> None:
    """The claim's upkeep intervals (docs/operations.md, "Long transactions"): a value
    that would break the loop, or in effect turn it off, is refused by name."""
    from rota.fair import UpkeepConfig

    with pytest.raises(InvalidInput) as raised:
        UpkeepConfig(**{field: value})
    assert str(raised.value) == f"UpkeepConfig.{field} {says}"
    assert getattr(UpkeepConfig(**{field: 31_557_600_000}), field) == 31_557_600_000


class Text(str):
    """A str subclass: checked item by item (the batch remembers only exact strs)."""


@pytest.mark.parametrize(("items", "error", "message"), [
    ([{"type": "t", "payload": {}, "group_id": "g"}, {"type": "t", "payload": {}},
      {"type": "t\x00", "payload": {}}],
     InvalidInput, "item 2: job type 't\\x00' contains a NUL character"),
    ([{"type": "t", "payload": {}, "group_id": "g"},
      {"type": "t", "payload": {}, "group_id": "g"},
      {"type": "t", "payload": {}, "group_id": "g\ud800"}],
     InvalidInput, "item 2: group_id 'g\\ud800' contains a lone surrogate, which is not "
                   "UTF-8 text"),
    ([{"type": "t", "payload": {}}, {"type": 7, "payload": {}}],
     InvalidInput, "item 1: job type must be a non-empty string, got 7"),
    ([{"type": "t", "payload": {}, "group_id": "g"},
      {"type": "t", "payload": {}, "group_id": ["g"]}],
     InvalidInput, "item 1: group_id must be a non-empty string, got ['g']"),
    ([{"type": "t", "payload": {}}, {"type": Text("t\x00"), "payload": {}}],
     InvalidInput, "item 1: job type 't\\x00' contains a NUL character"),
])
def test_a_batch_checks_every_item_s_texts_though_they_repeat(
    items: list[dict[str, Any]], error: type[Exception], message: str
) -> None:
    from rota.enqueue import enqueue_many_params
    from rota.settings import QueueSettings

    with pytest.raises(error) as raised:
        enqueue_many_params(QueueSettings(), items)
    assert (type(raised.value), str(raised.value)) == (error, message)


def test_a_batch_sends_repeated_and_uuid_texts_as_given() -> None:
    import uuid

    from rota.enqueue import enqueue_many_params
    from rota.settings import QueueSettings

    g = uuid.UUID(int=5)
    params = enqueue_many_params(QueueSettings(), [
        {"type": "t", "payload": {}, "group_id": g}, {"type": "t", "payload": [1]},
        {"type": "u", "payload": {}, "group_id": str(g)}, {"type": "t", "payload": {},
                                                          "group_id": g}])
    assert {k: params[k] for k in ("types", "payloads", "group_ids")} == {
        "types": ["t", "t", "u", "t"], "payloads": ["{}", "[1]", "{}", "{}"],
        "group_ids": [str(g), None, str(g), str(g)]}
