"""Durations as people type them for grants and timeouts: ``90s``, ``30m``, ``2h``, ``1h30m``, ``1d``.

Invariant: a duration is accepted only when it has exactly one reading and lies
within the bounds the caller gives; anything else is a ``DurationError`` whose
message names what is wrong and shows a correct spelling. There is no default
unit (``30`` is an error, not thirty seconds or thirty minutes) and no upper
bound is implied by omission: ``parse_duration`` always applies one (24 hours
by default; mesh7 capped MCP-created grants at 24 h but left HTTP-created ones
unbounded, gateway-behaviour.md 3.8).

Grammar: one or more ``<digits><unit>`` parts with units ``d``, ``h``, ``m``,
``s`` (lowercase), each unit at most once, larger units first, no signs, no
fractions, no spaces inside. Surrounding whitespace is ignored.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Final

from drawbridge.canonical import sanitize

UNIT_SECONDS: Final[dict[str, int]] = {"d": 86_400, "h": 3_600, "m": 60, "s": 1}
_UNIT_ORDER: Final = "dhms"
MAX_DIGITS: Final = 9
DEFAULT_MINIMUM: Final = timedelta(seconds=1)
DEFAULT_MAXIMUM: Final = timedelta(hours=24)
_PART: Final = re.compile(r"(\d+)([A-Za-z]*)")
_EXAMPLE: Final = "write e.g. 90s, 30m, 2h or 1h30m"


class DurationError(ValueError):
    """The text is not a duration drawbridge accepts, or lies outside the bounds."""


def _show(text: str) -> str:
    shown = sanitize(text)
    return repr(shown if len(shown) <= 40 else shown[:40] + "...")


def _fractional(text: str) -> str:
    return f"fractional amount in {_show(text)}: use whole numbers of smaller units (1h30m, not 1.5h)"


def _spaced(text: str) -> str:
    return f"space inside duration {_show(text)}; write the parts together, e.g. 1h30m"


def _fitting(
    written: str, total: int, amount: int, seen: list[str], minimum: timedelta, maximum: timedelta
) -> str:
    """A spelling for ``written`` (ending in ``amount`` without a unit) that ``parse_duration`` accepts:
    the first unit of m, s, h, d that may follow those ``seen`` and brings the duration within the
    bounds (``86400`` is ``86400s``: ``86400m`` would be refused as above 24h), else the maximum."""
    for unit in "mshd":
        if seen and _UNIT_ORDER.index(unit) <= _UNIT_ORDER.index(seen[-1]):
            continue
        if minimum <= timedelta(seconds=total + amount * UNIT_SECONDS[unit]) <= maximum:
            return written + unit
    return format_duration(maximum)


def parse_duration(
    text: str,
    *,
    minimum: timedelta = DEFAULT_MINIMUM,
    maximum: timedelta = DEFAULT_MAXIMUM,
    suggest_within: timedelta | None = None,
) -> timedelta:
    """Parse ``text`` and check ``minimum <= duration <= maximum``. A spelling suggested for a missing
    unit lies within ``suggest_within`` when given: a caller that checks only the spelling and leaves
    the bound to another (the CLI, to the gateway) still suggests what that other accepts."""
    if not isinstance(text, str):
        raise DurationError(f"a duration must be text, not {type(text).__name__}")
    stripped = text.strip()
    if not stripped:
        raise DurationError(f"empty duration; {_EXAMPLE}")
    if stripped[0] in "+-":
        raise DurationError(f"signed duration {_show(text)}: durations are positive and unsigned; {_EXAMPLE}")
    total = 0
    seen: list[str] = []
    pos = 0
    while pos < len(stripped):
        match = _PART.match(stripped, pos)
        if match is None:
            bad = stripped[pos]
            if bad in ".,":
                raise DurationError(_fractional(text))
            if bad.isspace():
                raise DurationError(_spaced(text))
            raise DurationError(f"unexpected {_show(bad)} in duration {_show(text)}; {_EXAMPLE}")
        digits, unit = match.group(1), match.group(2)
        following = stripped[match.end()] if match.end() < len(stripped) else ""
        if unit == "" and following in (".", ","):
            raise DurationError(_fractional(text))
        if unit == "" and following.isspace() and following:
            raise DurationError(_spaced(text))
        if unit == "":
            bound = maximum if suggest_within is None else min(maximum, suggest_within)
            example = _fitting(stripped[:match.end()], total, int(digits), seen, minimum, bound)
            raise DurationError(
                f"missing unit after {digits} in {_show(text)}; add one of d, h, m, s (e.g. {example})"
            )
        if unit not in UNIT_SECONDS:
            hint = " (units are lowercase)" if unit.lower() in UNIT_SECONDS else ""
            raise DurationError(f"unknown unit {_show(unit)} in {_show(text)}{hint}; units are d, h, m, s")
        if len(digits.lstrip("0")) > MAX_DIGITS:
            raise DurationError(f"amount {digits[:12]}... in {_show(text)} is too large")
        if unit in seen:
            raise DurationError(f"unit {unit} appears twice in {_show(text)}; {_EXAMPLE}")
        if seen and _UNIT_ORDER.index(unit) < _UNIT_ORDER.index(seen[-1]):
            raise DurationError(
                f"units out of order in {_show(text)}: {unit} after {seen[-1]}; "
                "write larger units first (e.g. 1h30m)"
            )
        seen.append(unit)
        total += int(digits) * UNIT_SECONDS[unit]
        pos = match.end()
    duration = timedelta(seconds=total)
    if duration < minimum:
        raise DurationError(
            f"duration {format_duration(duration)} is below the minimum of {format_duration(minimum)}"
        )
    if duration > maximum:
        raise DurationError(
            f"duration {format_duration(duration)} is above the maximum of {format_duration(maximum)}"
        )
    return duration


def format_duration(duration: timedelta) -> str:
    """Render whole seconds in the grammar ``parse_duration`` reads (``1h30m``, ``48h``).

    Sub-seconds are dropped.

    Days are shown as hours, which reads better next to the usual bounds (``24h``).
    """
    seconds = int(duration.total_seconds())
    if seconds < 0:
        return "-" + format_duration(-duration)
    if seconds == 0:
        return "0s"
    parts: list[str] = []
    for unit in "hms":
        amount, seconds = divmod(seconds, UNIT_SECONDS[unit])
        if amount:
            parts.append(f"{amount}{unit}")
    return "".join(parts)
