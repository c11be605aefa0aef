"""A payload's JSON text (docs/design.md, "Enqueue"): encode_payload takes a short cut
for plain JSON (a check that builds no error path), and
must say exactly what the full walk says. The oracle is that walk: rota.job's
_check_value, then the exact or the usual encoder. No database needed."""

from __future__ import annotations

import math
from decimal import Decimal
from enum import IntEnum
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rota import PayloadError
from rota.job import _ENCODER, _check_value, _encode_exact, encode_payload, too_deep


def walked(payload: Any) -> str:
    """The JSON text (or the error) of the full walk alone."""
    try:
        exact = _check_value(payload, "", 0)
    except RecursionError:
        raise too_deep() from None
    try:
        return _encode_exact(payload) if exact else _ENCODER.encode(payload)
    except RecursionError:
        raise too_deep() from None
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"payload is not JSON-serializable: {exc}") from None


def outcome(encode: Any, payload: Any) -> tuple[str, str]:
    try:
        return "text", encode(payload)
    except PayloadError as exc:
        return type(exc).__name__, str(exc)


class Level(IntEnum):
    LOW = 1


SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(),  # NaN and infinities too
    st.text(), st.text(alphabet=st.characters(codec=None)),  # lone surrogates too
    st.sampled_from(["\x00", "a\x00b", "\\u0000", "\ud800", "é", Level.LOW]),
    st.decimals(), st.just(Decimal("1e5000")), st.builds(pow, st.just(10), st.just(5000)),
    st.sampled_from([b"x", {1, 2}, 1j]),
)
KEYS = st.one_of(st.text(), st.sampled_from([1, None, True, 2.5, "\x00", "\udfff"]))
PAYLOADS = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.lists(inner, max_size=4).map(tuple),
                            st.dictionaries(KEYS, inner, max_size=4)),
    max_leaves=20)


@settings(max_examples=2000, deadline=None)
@given(PAYLOADS)
def test_the_short_cut_says_what_the_full_walk_says(payload: Any) -> None:
    assert outcome(encode_payload, payload) == outcome(walked, payload)


def cyclic() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


def nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(("payload", "expected"), [
    ({}, ("text", "{}")),
    ({"a": [1, 2.5, "é", None, True, (3,)]}, ("text", '{"a":[1,2.5,"é",null,true,[3]]}')),
    ("top", ("text", '"top"')),
    ({"n": Level.LOW}, ("text", '{"n":1}')),
    ({"amount": Decimal("0.30")}, ("text", '{"amount":0.30}')),
    ({"k": "a\x00b"}, ("PayloadError", "payload['k'] contains a NUL character (\\u0000), "
                                       "which PostgreSQL jsonb cannot store")),
    ({"k": "\ud800"}, ("PayloadError", "payload['k'] contains a lone surrogate")),
    ({1: "x"}, ("PayloadError", "payload has the int key 1; JSON object keys are strings "
                                "(JSON would turn it into '1' silently)")),
    ({"f": math.nan}, ("PayloadError", "payload['f'] is nan, which JSON cannot represent")),
    (cyclic(), ("PayloadError", "payload is nested deeper than 256 levels (or contains "
                                "itself), more than can be read back")),
    (nested(100_000), ("PayloadError", "payload is nested deeper than 256 levels (or "
                                       "contains itself), more than can be read back")),
    (10**5000, ("PayloadError", "payload is not JSON-serializable: Exceeds the limit "
                                "(4300 digits) for integer string conversion; use "
                                "sys.set_int_max_str_digits() to increase the limit")),
    ({"d": {1, 2}}, ("PayloadError", "payload is not JSON-serializable: Object of type set "
                                     "is not JSON serializable")),
], ids=["empty", "plain", "text", "int-enum", "decimal", "nul", "surrogate", "int-key",
        "nan", "cycle", "deep", "big-int", "set"])
def test_plain_and_refused_payloads(payload: Any, expected: tuple[str, str]) -> None:
    assert outcome(encode_payload, payload) == expected
    assert outcome(walked, payload) == expected
