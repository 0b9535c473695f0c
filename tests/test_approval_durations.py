"""Durations for grants and timeouts: one reading or a precise error."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from drawbridge.approval.durations import DurationError, format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("30m", 1800),
        ("2h", 7200),
        ("1h30m", 5400),
        ("1h0m5s", 3605),
        (" 45m ", 2700),
        ("1d", 86400),
        ("0h10m", 600),
        ("90m", 5400),
    ],
)
def test_accepted(text: str, seconds: int) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty duration"),
        ("   ", "empty duration"),
        ("30", "missing unit after 30"),
        ("1h30", "missing unit after 30"),
        ("1.5h", "fractional amount"),
        ("1,5h", "fractional amount"),
        ("30x", "unknown unit 'x'"),
        ("30min", "unknown unit 'min'"),
        ("30M", "units are lowercase"),
        ("30m1h", "units out of order in '30m1h': h after m"),
        ("1h1h", "unit h appears twice"),
        ("-5m", "signed duration"),
        ("+5m", "signed duration"),
        ("5 m", "space inside duration"),
        ("1h 30m", "space inside duration"),
        ("h", "unexpected 'h'"),
        ("0s", "below the minimum of 1s"),
        ("25h", "duration 25h is above the maximum of 24h"),
        ("2d", "duration 48h is above the maximum of 24h"),
        ("9999999999h", "too large"),
    ],
)
def test_refused_with_a_precise_message(text: str, message: str) -> None:
    with pytest.raises(DurationError, match=message.replace("(", r"\(").replace("+", r"\+")):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "example"),
    [("30", "30m"), ("86400", "86400s"), ("1h30", "1h30m"), ("99999999", "24h")],
)
def test_a_missing_unit_is_answered_with_a_spelling_within_the_bounds(text: str, example: str) -> None:
    with pytest.raises(DurationError, match=rf"missing unit .*\(e\.g\. {example}\)$"):
        parse_duration(text)
    assert parse_duration(example) <= timedelta(hours=24)


def test_a_caller_that_checks_only_the_spelling_suggests_within_the_bound_it_leaves_to_another() -> None:
    wide = timedelta(days=3650)
    with pytest.raises(DurationError, match=r"\(e\.g\. 86400s\)$"):
        parse_duration("86400", maximum=wide, suggest_within=timedelta(hours=24))
    with pytest.raises(DurationError, match=r"\(e\.g\. 86400m\)$"):
        parse_duration("86400", maximum=wide)
    assert parse_duration("48h", maximum=wide, suggest_within=timedelta(hours=24)) == timedelta(hours=48)


def test_bounds_are_the_callers() -> None:
    assert parse_duration("7d", maximum=timedelta(days=7)) == timedelta(days=7)
    with pytest.raises(DurationError, match="below the minimum of 1m"):
        parse_duration("30s", minimum=timedelta(minutes=1))
    with pytest.raises(DurationError, match="must be text"):
        parse_duration(30)  # type: ignore[arg-type]


def test_control_characters_are_not_echoed_raw() -> None:
    with pytest.raises(DurationError) as info:
        parse_duration("5\x1b[31mm")
    assert "\x1b" not in str(info.value)


@given(st.integers(min_value=1, max_value=24 * 3600))
def test_format_then_parse_round_trips(seconds: int) -> None:
    duration = timedelta(seconds=seconds)
    assert parse_duration(format_duration(duration)) == duration


def test_format() -> None:
    assert format_duration(timedelta(0)) == "0s"
    assert format_duration(timedelta(hours=1, minutes=30)) == "1h30m"
    assert format_duration(timedelta(days=2, seconds=5)) == "48h5s"
