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
    RateLimit,
    Schedule,
    Stage,
    SyncQueue,
    UnknownGroup,
    UnknownJobType,
    UnknownPlan,
    UnknownSetting,
)
from rota.checks import seconds_text
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
        with pytest.raises(InvalidInput, match=f"^plan 'a': weight must be an int from 1 to "
                                               f"1,000,000, got {re.escape(repr(bad))}$"):
            Plan("a", "A", 1, weight=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="duplicate plan ids"):
        Plans([Plan("a", "A", 1), Plan("a", "B", 2)])
    with pytest.raises(InvalidInput, match="plan id must be a non-empty string"):
        Plan("", "A", 1)
    with pytest.raises(InvalidInput, match="limits must be a mapping, got 'First'"):
        Plan("a", "A", 1, "First")  # type: ignore[arg-type]


INT4 = "2,147,483,647"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"priority": "1"}, f"plan 'a': priority must be an int from -{INT4} to {INT4}, got '1'"),
    ({"priority": True}, f"plan 'a': priority must be an int from -{INT4} to {INT4}, got True"),
    ({"priority": 2**31},
     f"plan 'a': priority must be an int from -{INT4} to {INT4}, got 2147483648"),
    ({"priority": -2**31},  # its negation, which the claim sorts by, is no integer
     f"plan 'a': priority must be an int from -{INT4} to {INT4}, got -2147483648"),
    ({"name": 5}, "plan 'a': name must be a string, got 5"),
    ({"id": 5}, "plan id must be a non-empty string, got 5"),
    ({"limits": "First"},
     "plan 'a': limits must be a mapping, got 'First' (display labels are not part of a Plan)"),
    ({"weight": "4"}, "plan 'a': weight must be an int from 1 to 1,000,000, got '4'"),
    ({"max_running": "2"},
     f"plan 'a': max_running must be an int from 1 to {INT4} (or None for no cap), got '2'"),
], ids=["priority-str", "priority-bool", "priority-too-high", "priority-too-low", "name",
        "id", "limits", "weight", "max-running"])
def test_every_plan_argument_says_what_it_got(kwargs: dict[str, Any], message: str) -> None:
    """`Plan(priority='1')` said "priority must be an int", not what it was given."""
    with pytest.raises(InvalidInput) as raised:
        Plan(**{"id": "a", "name": "A", "priority": 1, **kwargs})
    assert str(raised.value) == message


def test_the_priorities_and_caps_at_the_ends_of_the_range_are_accepted() -> None:
    low = Plan("low", "Low", -(2**31 - 1), max_running=1)
    high = Plan("high", "High", 2**31 - 1, max_running=2**31 - 1)
    assert Plans([low, high]).claim_params()["plan_caps"] == [1, 2**31 - 1]


@pytest.mark.parametrize(("plans", "message"), [
    ([], "Plans needs at least one plan, got []"),
    ("free", "Plans needs a list of rota.Plan, got 'free'"),
    (None, "Plans needs a list of rota.Plan, got None"),
    ([Plan("a", "A", 1), "pro"], "Plans needs a list of rota.Plan, got 'pro' among them"),
    ([Plan("a", "A", 1), Plan("a", "B", 2)], "duplicate plan ids ['a'] in ['a', 'a']"),
    ([Plan("a", "A", 2), Plan("b", "B", 1)],
     "plans must be ordered lowest to highest (priorities never decreasing), got [2, 1]"),
], ids=["empty", "str", "none", "not-a-plan", "duplicate", "decreasing"])
def test_plans_say_what_they_got(plans: Any, message: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        Plans(plans)
    assert str(raised.value) == message


@pytest.mark.parametrize(("settings", "message"), [
    ({"plans": "pro"}, "plans must be a rota.Plans (Plans([Plan(...), ...])), got 'pro'"),
    ({"types": "send"}, "types must be a list of job types (or None for any), got 'send'"),
    ({"types": 5}, "types must be a list of job types (or None for any), got 5"),
    ({"types": [""]}, "job type must be a non-empty string, got ''"),
    ({"types": []}, "types must name at least one job type (or be None for any), got []"),
    ({"max_attempts": "3"}, "max_attempts must be an int >= 1, got '3'"),
    ({"max_attempts_by_type": 5},
     "max_attempts_by_type must be a mapping of job type to attempts (or None), got 5"),
    ({"max_attempts_by_type": {"t": 0}}, "max_attempts for 't' must be an int >= 1, got 0"),
    ({"stale_after": 900}, "stale_after must be a datetime.timedelta, got 900"),
    ({"served_window": "1 day"}, "served_window must be a datetime.timedelta, got '1 day'"),
    ({"fair_by": "tenant"}, "fair_by must be one of 'group', 'owner', got 'tenant'"),
    ({"max_deferrals": -1}, "max_deferrals must be an int >= 0, got -1"),
    ({"max_payload_bytes": 2**31}, "max_payload_bytes must be at most 2147483647, got "
                                   "2147483648"),
    ({"schema": 5}, "schema must be a string, got 5"),
    ({"groups": 5}, "groups relation must be a string, got 5"),
], ids=["plans", "types-str", "types-int", "type-empty", "types-none-named", "max-attempts",
        "max-attempts-by-type", "max-attempts-by-type-value", "stale-after-int",
        "served-window-str", "fair-by", "max-deferrals", "max-payload-bytes", "schema",
        "groups"])
def test_every_queue_setting_says_what_it_got(database_url: str, settings: dict[str, Any],
                                              message: str) -> None:
    """`types="send"` declared the types s, e, n and d; a bad `max_attempts_by_type` met
    an AttributeError; `plans` and a schema that is no string did not say what they got."""
    with pytest.raises(InvalidInput) as raised:
        Queue(database_url, **settings)
    assert str(raised.value) == message


SETTINGS_LISTED = ("schema, plans, groups, types, max_attempts, max_attempts_by_type, "
                   "stale_after, served_window, fair_by, backoff_base, max_backoff, "
                   "max_deferrals, max_payload_bytes")


@pytest.mark.parametrize(("make", "message"), [
    (lambda url: Queue(url, fairby="owner"),
     "Queue got an unknown setting 'fairby' (did you mean 'fair_by'?); its keyword "
     "arguments are pooled, listen_url, tracer_provider, " + SETTINGS_LISTED),
    (lambda url: Queue(url, listen="postgresql://h/db"),
     "Queue got an unknown setting 'listen' (did you mean 'listen_url'?); its keyword "
     "arguments are pooled, listen_url, tracer_provider, " + SETTINGS_LISTED),
    (lambda url: SyncQueue(shcema="app", max_attempt=3),
     "SyncQueue got unknown settings 'max_attempt' (did you mean 'max_attempts'?) and "
     "'shcema' (did you mean 'schema'?); its keyword arguments are tracer_provider, "
     + SETTINGS_LISTED),
    (lambda url: SyncQueue(pooled=True),
     "SyncQueue got an unknown setting 'pooled'; its keyword arguments are "
     "tracer_provider, " + SETTINGS_LISTED),
], ids=["queue-misspelled", "queue-own-keyword", "sync-two", "sync-none-close"])
def test_an_unknown_setting_names_the_closest_one(database_url: str, make: Any,
                                                   message: str) -> None:
    """A misspelled keyword said `QueueSettings.__init__() got an unexpected keyword
    argument`, a class the caller never named. It is still a TypeError, as Python's own
    is, and an InvalidInput naming the keyword."""
    with pytest.raises(UnknownSetting) as raised:
        make(database_url)
    assert str(raised.value) == message
    assert isinstance(raised.value, TypeError)
    assert isinstance(raised.value, InvalidInput)
    assert raised.value.names == message.split("; ")[0].split("'")[1::4]
    assert raised.value.argument is None  # the message begins with the class


def test_a_queue_needs_a_connection_string_or_a_pool() -> None:
    with pytest.raises(InvalidInput) as raised:
        Queue(b"postgresql://u:secret@h/db")  # type: ignore[arg-type]
    # The type only: the value may hold a password.
    assert str(raised.value) == ("Queue needs a connection string or an "
                                 "AsyncConnectionPool, got bytes")


@pytest.mark.parametrize(("value", "text"), [
    (timedelta(seconds=-5), "-5 seconds"),
    (timedelta(0), "0 seconds"),
    (timedelta(seconds=1), "1 second"),
    (timedelta(seconds=-1), "-1 second"),
    (timedelta(milliseconds=-1500), "-1.5 seconds"),
    (timedelta(microseconds=1), "0.000001 seconds"),
    (timedelta(minutes=15), "900 seconds"),
    (timedelta.max, "86399999999999.999999 seconds"),
])
def test_a_duration_is_said_in_seconds_exactly(value: timedelta, text: str) -> None:
    """str(timedelta(seconds=-5)) is "-1 day, 23:59:55"."""
    assert seconds_text(value) == text


@pytest.mark.parametrize(("settings", "message"), [
    ({"stale_after": timedelta(seconds=-5)}, "stale_after must be positive, got -5 seconds"),
    ({"served_window": timedelta(seconds=-5)},
     "served_window must be positive, got -5 seconds"),
    ({"max_backoff": timedelta(seconds=-5)}, "max_backoff must be positive, got -5 seconds"),
    ({"backoff_base": timedelta(seconds=-5)},
     "backoff_base must not be negative, got -5 seconds"),
    ({"stale_after": timedelta(0)}, "stale_after must be positive, got 0 seconds"),
], ids=["stale-after", "served-window", "max-backoff", "backoff-base", "zero"])
def test_a_bad_duration_setting_is_said_in_seconds(
        database_url: str, settings: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        Queue(database_url, **settings)
    assert str(raised.value) == message


async def _h(ctx: Any) -> None:
    pass


@pytest.mark.parametrize(("make", "message"), [
    (lambda: Stage("t", handler=_h, timeout=timedelta(seconds=-5)),
     "stage 't': timeout must be positive, got -5 seconds"),
    (lambda: RateLimit("api", 10, timedelta(seconds=-5)),
     "rate limit 'api': per must be positive, got -5 seconds"),
    (lambda: RateLimit("api", 10, timedelta(seconds=1), max_wait=timedelta(seconds=-5)),
     "rate limit 'api': max_wait must not be negative, got -5 seconds"),
    (lambda: DeferJob(timedelta(seconds=-5)),
     "until must not be a negative timedelta, got -5 seconds"),
    (lambda: Schedule("s", cron="@hourly", type="t", missed="skip",
                      grace=timedelta(seconds=-5)),
     "schedule 's': grace must be positive, got -5 seconds"),
], ids=["stage-timeout", "rate-per", "rate-max-wait", "defer", "schedule-grace"])
def test_every_duration_setting_says_a_negative_value_in_seconds(
        make: Any, message: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        make()
    assert str(raised.value) == message


def test_a_clock_offset_is_said_in_seconds(database_url: str) -> None:
    queue = Queue(database_url)
    with pytest.raises(InvalidInput) as raised:
        queue.clock_offset = timedelta(days=-365_251)
    assert str(raised.value) == ("clock_offset must be at most 31557600000 seconds (1000 "
                                 "years) either way, got -31557686400 seconds")


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
