from __future__ import annotations

import enum
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prioqueue.errors import ConfigError
from prioqueue.priority import (
    BATCH,
    DEFAULT_ALIASES,
    HEADER,
    INTERACTIVE,
    MAX_HEADER_LENGTH,
    NORMAL,
    PriorityPolicy,
    parse_priority,
)
from strategies import header_texts, priorities, priority_policies


class Level(enum.IntEnum):
    HIGH = 50


# --------------------------------------------------------------------------- constants


def test_constants() -> None:
    assert (INTERACTIVE, NORMAL, BATCH) == (100, 0, -100)
    assert HEADER == "X-LlamaSwap-Priority"
    assert MAX_HEADER_LENGTH == 32
    assert dict(DEFAULT_ALIASES) == {"interactive": 100, "normal": 0, "batch": -100}


def test_default_aliases_are_read_only() -> None:
    with pytest.raises(TypeError):
        DEFAULT_ALIASES["urgent"] = 1000  # type: ignore[index]


# --------------------------------------------------------------------------- parse_priority


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0", 0),
        ("100", 100),
        ("-100", -100),
        ("+100", 100),
        ("+0", 0),
        ("-0", 0),
        ("007", 7),
        ("-007", -7),
        (" 42 ", 42),
        ("\t-5\t", -5),
        (" \t+3 \t", 3),
        ("interactive", 100),
        ("INTERACTIVE", 100),
        ("Batch", -100),
        ("nOrMaL", 0),
        (" batch\t", -100),
        ("9" * 32, int("9" * 32)),
        ("-" + "9" * 31, -int("9" * 31)),
        (" " * 31 + "5", 5),
        (b"100", 100),
        (b" -100 ", -100),
        (b"Interactive", 100),
        (None, 0),
        ("", 0),
        (b"", 0),
        (7, 7),
        (-(10**40), -(10**40)),
        (Level.HIGH, 50),
    ],
)
def test_accepted_forms(value: str | bytes | int | None, expected: int) -> None:
    result = parse_priority(value)
    assert result == expected
    assert type(result) is int


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("\u0661\u0662\u0663", id="arabic-indic-digits"),
        pytest.param("\u06f1\u06f2\u06f3", id="extended-arabic-indic-digits"),
        pytest.param("\uff11\uff12\uff13", id="fullwidth-digits"),
        pytest.param("-\uff11", id="signed-fullwidth"),
        pytest.param("\U0001d7cf", id="mathematical-digit"),
        pytest.param("\u00b2", id="superscript"),
        pytest.param("1_000", id="underscore"),
        pytest.param("1.5", id="float"),
        pytest.param("1.0", id="integral-float"),
        pytest.param(".5", id="leading-dot"),
        pytest.param("1e3", id="exponent"),
        pytest.param("1e9999", id="huge-exponent"),
        pytest.param("1E3", id="upper-exponent"),
        pytest.param("inf", id="inf"),
        pytest.param("nan", id="nan"),
        pytest.param("1,2", id="comma-joined"),
        pytest.param("100, -100", id="comma-joined-spaced"),
        pytest.param("batch,interactive", id="comma-joined-aliases"),
        pytest.param("0x10", id="hex"),
        pytest.param("0o7", id="octal"),
        pytest.param("0b1", id="binary"),
        pytest.param("+", id="bare-plus"),
        pytest.param("-", id="bare-minus"),
        pytest.param("+-1", id="two-signs"),
        pytest.param("--1", id="double-minus"),
        pytest.param("1 0", id="inner-space"),
        pytest.param("- 1", id="space-after-sign"),
        pytest.param("1\n", id="trailing-newline"),
        pytest.param("\r\n1", id="leading-crlf"),
        pytest.param("\u00a01", id="nbsp"),
        pytest.param("\u20031", id="em-space"),
        pytest.param("\v1", id="vertical-tab"),
        pytest.param("high", id="unknown-alias"),
        pytest.param("interactive2", id="alias-suffix"),
        pytest.param("inter active", id="alias-inner-space"),
        pytest.param("\uff22\uff21\uff34\uff23\uff28", id="fullwidth-alias"),
        pytest.param("9" * 33, id="33-digits"),
        pytest.param(" " * 32 + "5", id="33-chars-with-padding"),
        pytest.param("1" * 10_000, id="10000-digits"),
        pytest.param(b"\xff", id="non-ascii-bytes"),
        pytest.param("\u0661".encode(), id="utf8-arabic-digit-bytes"),
        pytest.param(b"9" * 33, id="33-bytes"),
    ],
)
def test_rejected_forms_mean_normal(value: str | bytes) -> None:
    assert parse_priority(value) == NORMAL
    assert PriorityPolicy(default=-7).parse(value) == -7


def test_aliases_match_ascii_case_only() -> None:
    policy = PriorityPolicy().with_aliases(bulk=-50)
    assert policy.parse("BULK") == -50
    # U+212A KELVIN SIGN lower-cases to "k" in Unicode, but is not an ASCII letter.
    assert "bul\u212a".lower() == "bulk"
    assert policy.parse("bul\u212a") == 0
    assert policy.parse("BUL\u212a") == 0


class _NoWorkStr(str):
    __slots__ = ()

    def strip(self, chars: str | None = None) -> str:
        raise AssertionError("a too-long header must be refused before any other work")


class _NoWorkBytes(bytes):
    def isascii(self) -> bool:
        raise AssertionError("a too-long header must be refused before any other work")


def test_length_is_checked_before_any_work() -> None:
    assert parse_priority(_NoWorkStr("1" * (MAX_HEADER_LENGTH + 1))) == 0
    assert parse_priority(_NoWorkBytes(b"1" * (MAX_HEADER_LENGTH + 1))) == 0
    with pytest.raises(AssertionError):  # the probes do detect work on short values
        parse_priority(_NoWorkStr("1"))
    with pytest.raises(AssertionError):
        parse_priority(_NoWorkBytes(b"1"))


@pytest.mark.parametrize("value", [1.5, 100.0, True, False, bytearray(b"1"), [], object()])
def test_other_types_are_a_type_error(value: object) -> None:
    with pytest.raises(TypeError, match="str, bytes, None or an int"):
        parse_priority(value)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="str, bytes, None or an int"):
        PriorityPolicy().parse(value)  # type: ignore[arg-type]


def _reference(text: str) -> int:
    """An independent statement of the grammar, for comparison."""
    if len(text) > 32:
        return 0
    stripped = text.strip(" \t")
    body = stripped[1:] if stripped[:1] in ("+", "-") else stripped
    if body and all(char in "0123456789" for char in body):
        return int(stripped)
    if not stripped.isascii():
        return 0
    return {"interactive": 100, "normal": 0, "batch": -100}.get(stripped.lower(), 0)


@given(st.integers(min_value=-(10**31) + 1, max_value=10**32 - 1))
def test_every_int_that_fits_round_trips(n: int) -> None:
    assert parse_priority(str(n)) == n
    assert parse_priority(str(n).encode()) == n
    assert parse_priority(f" {n}\t") == n or len(f" {n}\t") > MAX_HEADER_LENGTH


@given(st.integers(min_value=10**32, max_value=10**80), st.booleans())
def test_every_int_that_does_not_fit_is_the_default(n: int, negative: bool) -> None:
    text = str(-n if negative else n)
    assert len(text) > MAX_HEADER_LENGTH
    assert parse_priority(text) == 0


@given(header_texts())
def test_arbitrary_text_never_raises_and_matches_the_grammar(text: str) -> None:
    result = parse_priority(text)
    assert type(result) is int
    assert result == _reference(text)


@given(st.binary(max_size=40))
def test_arbitrary_bytes_never_raise(data: bytes) -> None:
    result = parse_priority(data)
    assert type(result) is int
    expected = _reference(data.decode("ascii")) if data.isascii() else 0
    assert result == expected


# --------------------------------------------------------------------------- PriorityPolicy


def test_policy_defaults() -> None:
    policy = PriorityPolicy()
    assert policy.aliases == DEFAULT_ALIASES
    assert (policy.default, policy.minimum, policy.maximum) == (0, None, None)
    assert policy == PriorityPolicy()
    assert hash(policy) == hash(PriorityPolicy())
    assert "'interactive': 100" in repr(policy)
    assert policy.parse("1000000") == 1_000_000  # no bounds unless configured


def test_policy_aliases_are_stored_lower_cased_and_read_only() -> None:
    source = {"Low-Latency": 50}
    policy = PriorityPolicy(aliases=source)
    source["other"] = 1
    assert dict(policy.aliases) == {"low-latency": 50}
    assert policy.parse("LOW-LATENCY") == 50
    assert policy.parse("interactive") == 0  # replaced, not merged
    with pytest.raises(TypeError):
        policy.aliases["x"] = 1  # type: ignore[index]


def test_with_aliases_extends_and_overrides() -> None:
    base = PriorityPolicy(minimum=-200)
    extended = base.with_aliases({"low-latency": 150, "Batch": -50}, urgent=1000, idle=-200)
    assert extended.parse("low-latency") == 150
    assert extended.parse("URGENT") == 1000
    assert extended.parse("batch") == -50
    assert extended.parse("idle") == -200
    assert extended.parse("interactive") == 100  # kept
    assert extended.minimum == -200
    assert base.parse("urgent") == 0  # the original is unchanged
    assert base.parse("batch") == -100
    assert base.with_aliases({"urgent": 1}, URGENT=2).parse("urgent") == 2  # keywords last
    assert base.with_aliases() == base


@pytest.mark.parametrize(
    ("aliases", "match"),
    [
        ({"": 1}, "non-empty"),
        ({"a b": 1}, "no whitespace"),
        ({"tab\t": 1}, "no whitespace"),
        ({"\u00fcn\u00ef": 1}, "visible ASCII"),
        ({5: 1}, "non-empty string"),
        ({"x" * 33: 1}, "longer than MAX_HEADER_LENGTH"),
        ({"123": 1}, "is a number"),
        ({"-5": 1}, "is a number"),
        ({"ok": True}, "must be an int"),
        ({"ok": 1.5}, "must be an int"),
        ({"ok": "1"}, "must be an int"),
        ({"Batch": 1, "batch": 2}, "case-insensitive"),
    ],
)
def test_bad_aliases_are_refused(aliases: dict[object, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as caught:
        PriorityPolicy(aliases=aliases)  # type: ignore[arg-type]
    assert "aliases" in str(caught.value)


def test_aliases_must_be_a_mapping() -> None:
    with pytest.raises(ConfigError, match="aliases must be a mapping"):
        PriorityPolicy(aliases=[("a", 1)])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="is a number"):
        PriorityPolicy().with_aliases({"42": 1})
    with pytest.raises(ConfigError, match="must be an int"):
        PriorityPolicy().with_aliases(urgent=True)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"default": True}, "default"),
        ({"default": "0"}, "default"),
        ({"default": 0.0}, "default"),
        ({"minimum": 1.5}, "minimum"),
        ({"minimum": False}, "minimum"),
        ({"maximum": True}, "maximum"),
        ({"maximum": "100"}, "maximum"),
    ],
)
def test_bad_field_types_are_refused(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=f"^{field} must be an int"):
        PriorityPolicy(**kwargs)  # type: ignore[arg-type]


def test_minimum_above_maximum_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"minimum \(10\) must not be greater than maximum \(5\)"):
        PriorityPolicy(minimum=10, maximum=5, default=7)


@pytest.mark.parametrize(
    "kwargs",
    [{"minimum": 10}, {"maximum": -10}, {"minimum": -5, "maximum": 5, "default": 6}],
)
def test_default_outside_the_bounds_is_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=r"default \(-?\d+\) must lie within"):
        PriorityPolicy(**kwargs)


def test_equal_bounds_pin_every_priority() -> None:
    policy = PriorityPolicy(minimum=0, maximum=0)
    assert {policy.parse(v) for v in ("interactive", "batch", "999", "-999", None)} == {0}


BOUNDED = PriorityPolicy(minimum=BATCH, maximum=INTERACTIVE)


@pytest.mark.parametrize(
    ("policy", "value", "ceiling", "expected"),
    [
        (BOUNDED, "1000", None, 100),
        (BOUNDED, "-1000", None, -100),
        (BOUNDED, "50", None, 50),
        (BOUNDED, "interactive", NORMAL, 0),
        (BOUNDED, "batch", NORMAL, -100),
        (BOUNDED, "1000", 500, 100),
        (BOUNDED, "1000", 30, 30),
        (BOUNDED, "batch", -200, -200),  # the ceiling wins over the minimum
        (BOUNDED, None, -10, -10),  # so does it over the default
        (BOUNDED, "garbage", None, 0),
        (BOUNDED, 5000, None, 100),
        (PriorityPolicy(minimum=-10), "-1000", None, -10),
        (PriorityPolicy(minimum=-10), "1000", None, 1000),
        (PriorityPolicy(maximum=10), "1000", None, 10),
        (PriorityPolicy(maximum=10), "-1000", None, -1000),
        (PriorityPolicy(), "1000", None, 1000),
        (PriorityPolicy(), "1000", 100, 100),
        (PriorityPolicy(), "-1000", 100, -1000),
        (PriorityPolicy(default=-100), "", None, -100),
        (PriorityPolicy(), "100", Level.HIGH, 50),
    ],
)
def test_parse_bounds_interplay(
    policy: PriorityPolicy, value: str | int | None, ceiling: int | None, expected: int
) -> None:
    result = policy.parse(value, ceiling)
    assert result == expected
    assert type(result) is int
    if isinstance(value, int):
        assert policy.clamp(value, ceiling) == expected


@pytest.mark.parametrize(
    ("value", "ceiling", "expected"),
    [
        (1000, None, 100),
        (-1000, None, -100),
        (0, None, 0),
        (100, 0, 0),
        (-1000, -150, -150),
        (Level.HIGH, None, 50),
    ],
)
def test_clamp(value: int, ceiling: int | None, expected: int) -> None:
    result = BOUNDED.clamp(value, ceiling=ceiling)
    assert result == expected
    assert type(result) is int


@pytest.mark.parametrize("value", [True, 1.5, "1", None])
def test_clamp_refuses_non_int_values(value: object) -> None:
    with pytest.raises(TypeError, match="value must be an int"):
        BOUNDED.clamp(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("ceiling", [True, False, 1.5, "0", float("nan")])
def test_ceiling_of_wrong_type_is_a_type_error(ceiling: object) -> None:
    with pytest.raises(TypeError, match="ceiling must be an int"):
        BOUNDED.parse("1", ceiling)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ceiling must be an int"):
        BOUNDED.parse(None, ceiling)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ceiling must be an int"):
        BOUNDED.clamp(1, ceiling)  # type: ignore[arg-type]


@given(priority_policies(), header_texts(), st.none() | priorities())
def test_parse_stays_within_the_bounds_and_the_ceiling(
    policy: PriorityPolicy, text: str, ceiling: int | None
) -> None:
    result = policy.parse(text, ceiling)
    assert type(result) is int
    if ceiling is not None:
        assert result <= ceiling
    if policy.maximum is not None:
        assert result <= policy.maximum
    if policy.minimum is not None:
        floor = policy.minimum if ceiling is None else min(policy.minimum, ceiling)
        assert result >= floor
    assert policy.clamp(result, ceiling) == result  # bounding is idempotent


@given(priority_policies(), header_texts(), st.none() | priorities())
def test_parse_is_clamp_of_the_unbounded_parse(
    policy: PriorityPolicy, text: str, ceiling: int | None
) -> None:
    unbounded = PriorityPolicy(aliases=policy.aliases, default=policy.default)
    assert policy.parse(text, ceiling) == policy.clamp(unbounded.parse(text), ceiling)


@given(
    value=st.one_of(st.none(), st.integers(-1000, 1000), st.sampled_from(["batch", "normal"])),
    ceiling=st.one_of(st.none(), st.integers(-1000, 1000)),
)
def test_a_dispatcher_submit_keeps_the_ceiling_even_below_the_minimum(
    value: int | str | None, ceiling: int | None
) -> None:
    """Issue 21 item 8: the core's submit bounds a level exactly as ``parse`` does, so an
    operator's ceiling below the policy's minimum is kept, not raised back to the minimum."""
    from prioqueue import FleetDispatcher, SizeOneDispatcher
    from prioqueue.testing import ReferenceFleet

    policy = PriorityPolicy(minimum=-100, maximum=100)
    expected = policy.parse(value, ceiling)
    for dispatcher in (
        SizeOneDispatcher(policy=policy),
        FleetDispatcher(policy=policy),
        ReferenceFleet(policy=policy),
    ):
        ticket = dispatcher.submit("j", member="m", priority=value, ceiling=ceiling, now=0.0)
        assert ticket.job.priority == expected, type(dispatcher).__name__
    assert PriorityPolicy(minimum=-100).parse("batch", -150) == -150


# --------------------------------------------------------------------------- stated values


@given(policy=priority_policies(), value=header_texts(), ceiling=st.none() | priorities())
def test_a_stated_priority_is_parsed_as_a_header_or_refused(
    policy: PriorityPolicy, value: str, ceiling: int | None
) -> None:
    """``parse_stated`` agrees with ``parse`` on every value ``parse`` recognises, and refuses
    the rest (where ``parse`` would quietly take the default)."""
    text = value.strip(" \t") if len(value) <= MAX_HEADER_LENGTH else None
    recognised = text is not None and (
        re.fullmatch(r"[+-]?[0-9]+", text, flags=re.ASCII) is not None
        or (text.isascii() and text.lower() in policy.aliases)
    )
    if recognised:
        assert policy.parse_stated(value, ceiling) == policy.parse(value, ceiling)
    else:
        with pytest.raises(ValueError, match="neither an integer nor an alias") as caught:
            policy.parse_stated(value, ceiling)
        assert len(str(caught.value)) < 200 + 20 * len(policy.aliases)


def test_a_stated_priority_names_the_allowed_forms() -> None:
    policy = PriorityPolicy()
    assert policy.parse_stated(" Interactive\t") == INTERACTIVE
    assert policy.parse_stated("-7") == -7
    assert policy.parse_stated(7, ceiling=5) == 5
    for typo in ("interactiv", "9" * 100_000, "1.5", "", "\u0661\u0660\u0660"):
        with pytest.raises(ValueError, match="neither an integer nor an alias") as caught:
            policy.parse_stated(typo)
        message = str(caught.value)
        assert "send an integer (e.g. 100, 0, -100)" in message
        assert "interactive (100), normal (0), batch (-100)" in message
        assert len(message) < 250
    with pytest.raises(TypeError, match="int \\(not bool\\) or a str"):
        policy.parse_stated(True)
    with pytest.raises(TypeError):
        policy.parse_stated(b"100")  # type: ignore[arg-type]
