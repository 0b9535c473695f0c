"""What a person is shown of a call's arguments before approving it.

Invariant: the value under a secret-like key (the evidence's own rule, ``evidence.truth.is_secret_key``:
``password``, ``token``, ``api_key`` ... at any depth) is never shown, whatever its type. At most
``MAX_SHOWN_VALUES`` values and ``MAX_SHOWN_CHARS`` characters (paths and values together) are shown,
no string beyond ``MAX_VALUE_CHARS``, and every cut says so. The text rendered for a terminal or a
client (``argument_lines``) holds no control, format or separator character: each is a visible escape
(``canonical.escape_unsafe``); and a line folded to fit a width goes on under a marker of its own, so
no value can pass for another line.

Theory of operation. ``show_arguments(arguments)`` walks the arguments depth first, in the order the
agent wrote them and without recursion, and makes one ``ShownValue`` per leaf (a scalar, an empty
object or array, or whatever stands under a secret-like key), named by its JSON Pointer (RFC 6901):
the value itself, the first characters of a long string with its full length, or ``masked``. What no
longer fits the bounds is counted (``omitted``), not shown. The result is plain data and small:
``as_dict`` is what the control plane answers, and the gateway holds the ``ShownArguments`` (already
masked and bounded) while the approval is pending, in memory only
(``gateway.pipeline.approvals.held_arguments``).

``argument_lines(shown, width)`` renders the ``as_dict`` form (or the same JSON read back from the
control plane) for a person, one value a line: ``/path: <the value as JSON>``; a string that holds
line breaks as a block, each of its lines under ``  | ``; ``masked (secret-like key)``; cuts and
omissions in words. With a width, a longer line is folded and each continuation begins with ``  + ``.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from drawbridge.canonical import escape_unsafe
from drawbridge.evidence.truth import is_secret_key

MAX_SHOWN_VALUES: Final = 100
MAX_SHOWN_CHARS: Final = 16_000
MAX_VALUE_CHARS: Final = 8_000
MIN_CUT_CHARS: Final = 40
"""A string cut to fewer characters than this is counted as omitted instead."""
MASKED: Final = "masked (secret-like key)"
BLOCK: Final = "  | "
CONTINUED: Final = "  + "
MIN_WIDTH: Final = 24

_SCALARS: Final = (str, int, float, bool, type(None))
_CONTAINERS: Final = (dict, list, tuple)
"""What parsed JSON nests in (plain types: an ABC check per value would dominate the walk)."""


@dataclass(frozen=True, slots=True)
class ShownValue:
    """One leaf of the arguments as shown: ``value`` (a JSON scalar, ``{}`` or ``[]``), or ``masked``.

    ``length`` is set when a string was cut: its full length in characters (``value`` holds the first
    ones).
    """

    path: str
    value: Any = None
    masked: bool = False
    length: int | None = None

    def as_dict(self) -> dict[str, Any]:
        if self.masked:
            return {"path": self.path, "masked": True}
        shown: dict[str, Any] = {"path": self.path, "value": self.value}
        if self.length is not None:
            shown["length"] = self.length
        return shown


@dataclass(frozen=True, slots=True)
class ShownArguments:
    """A call's arguments as a person is shown them (module docstring)."""

    values: tuple[ShownValue, ...]
    omitted: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"values": [value.as_dict() for value in self.values], "omitted": self.omitted}

    def lines(self, width: int | None = None) -> list[str]:
        return argument_lines(self.as_dict(), width)


def _pointer(key: str) -> str:
    return "/" + key.replace("~", "~0").replace("/", "~1")


def _members(path: str, value: Any) -> Iterator[tuple[str, Any, bool]]:
    """(path, value, under a secret-like key) for each member of an object or element of an array."""
    if isinstance(value, dict):
        for key, member in value.items():
            name = key if isinstance(key, str) else str(key)
            yield path + _pointer(name), member, is_secret_key(name)
    else:
        for index, element in enumerate(value):
            yield f"{path}/{index}", element, False


def _leaf_count(value: Any) -> int:
    """How many leaves ``show_arguments`` would make of ``value`` (an object or array)."""
    count = 0
    stack: list[Any] = [value]
    while stack:
        current = stack.pop()
        members = current.items() if isinstance(current, dict) else ((None, v) for v in current)
        for key, member in members:
            secret = isinstance(key, str) and is_secret_key(key)
            if not secret and isinstance(member, _CONTAINERS) and member:
                stack.append(member)
            else:
                count += 1
    return count


def _leaf(path: str, value: Any, secret: bool, budget: int) -> ShownValue | None:
    """The leaf as shown within ``budget`` characters (its path included), or None if it does not fit."""
    room = budget - len(path)
    if secret:
        return ShownValue(path, masked=True) if room >= 0 else None
    if isinstance(value, str):
        take = min(len(value), MAX_VALUE_CHARS, room)
        if take == len(value):
            return ShownValue(path, value)
        return ShownValue(path, value[:take], length=len(value)) if take >= MIN_CUT_CHARS else None
    if isinstance(value, _CONTAINERS):  # empty: ``show_arguments`` opens the others
        empty: Any = {} if isinstance(value, dict) else []
        return ShownValue(path, empty) if room >= 2 else None
    if isinstance(value, _SCALARS):
        try:
            text = json.dumps(value, allow_nan=False)
        except ValueError:
            return None  # not JSON (the gateway refuses such calls before they are asked about)
        return ShownValue(path, value) if room >= len(text) else None
    return None


def _cost(shown: ShownValue) -> int:
    if shown.masked:
        return len(shown.path)
    if isinstance(shown.value, str):
        return len(shown.path) + len(shown.value)
    return len(shown.path) + len(json.dumps(shown.value))


def show_arguments(arguments: Mapping[str, Any]) -> ShownArguments:
    """The arguments as a person is shown them: secret-like values masked, within the bounds."""
    shown: list[ShownValue] = []
    omitted = 0
    budget = MAX_SHOWN_CHARS
    stack: list[Iterator[tuple[str, Any, bool]]] = [_members("", dict(arguments))]
    while stack:
        member = next(stack[-1], None)
        if member is None:
            stack.pop()
            continue
        path, value, secret = member
        if not secret and isinstance(value, _CONTAINERS) and value:
            if len(shown) < MAX_SHOWN_VALUES and len(path) < budget:
                stack.append(_members(path, value))
            else:  # nothing under it can be shown: count, without building paths
                omitted += _leaf_count(value)
            continue
        leaf = _leaf(path, value, secret, budget) if len(shown) < MAX_SHOWN_VALUES else None
        if leaf is None:
            omitted += 1
            continue
        shown.append(leaf)
        budget -= _cost(leaf)
    return ShownArguments(tuple(shown), omitted)


# -- rendering -------------------------------------------------------------------------------------


def _json_text(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        text = "(not JSON)"
    return escape_unsafe(text)


def _entry_lines(entry: Any) -> list[str]:
    if not isinstance(entry, Mapping):
        return ["?: (unreadable entry)"]
    path = entry.get("path")
    label = escape_unsafe(path) if isinstance(path, str) and path else "?"
    if entry.get("masked") is True:
        return [f"{label}: {MASKED}"]
    if "value" not in entry:
        return [f"{label}: (no value)"]
    value, length = entry["value"], entry.get("length")
    cut = ""
    if isinstance(value, str) and isinstance(length, int) and not isinstance(length, bool):
        cut = f"first {len(value):,} of {length:,} characters"
    if isinstance(value, str) and "\n" in value:
        rows = value.split("\n")
        head = f"{label}: text, {len(rows):,} lines" + (f", {cut}" if cut else "") + ":"
        return [head, *(BLOCK + escape_unsafe(row) for row in rows)]
    return [f"{label}" + (f" ({cut})" if cut else "") + f": {_json_text(value)}"]


def _cells(char: str) -> int:
    """Terminal columns a character may take (wide and ambiguous ones counted as two: never fewer)."""
    return 2 if unicodedata.east_asian_width(char) in ("W", "F", "A") else 1


def _fold(line: str, width: int) -> list[str]:
    if line.isascii() and len(line) <= width:
        return [line]
    pieces: list[str] = []
    current: list[str] = []
    used, room = 0, width
    for char in line:
        cells = _cells(char)
        if used + cells > room and current:
            pieces.append(("" if not pieces else CONTINUED) + "".join(current))
            current, used, room = [], 0, width - len(CONTINUED)
        current.append(char)
        used += cells
    pieces.append(("" if not pieces else CONTINUED) + "".join(current))
    return pieces


def argument_lines(shown: Any, width: int | None = None) -> list[str]:
    """The arguments as lines for a person (module docstring); ``shown`` is ``ShownArguments.as_dict()``."""
    if not isinstance(shown, Mapping) or not isinstance(shown.get("values"), list):
        return ["(the arguments could not be read)"]
    lines = [line for entry in shown["values"] for line in _entry_lines(entry)]
    omitted = shown.get("omitted")
    if isinstance(omitted, int) and not isinstance(omitted, bool) and omitted > 0:
        lines.append(
            f"({omitted:,} more {'value' if omitted == 1 else 'values'} not shown: at most "
            f"{MAX_SHOWN_VALUES} values and {MAX_SHOWN_CHARS:,} characters are shown)"
        )
    if not lines:
        lines.append("(no arguments)")
    if width is None:
        return lines
    return [piece for line in lines for piece in _fold(line, max(width, MIN_WIDTH))]


__all__ = [
    "MASKED",
    "MAX_SHOWN_CHARS",
    "MAX_SHOWN_VALUES",
    "MAX_VALUE_CHARS",
    "ShownArguments",
    "ShownValue",
    "argument_lines",
    "show_arguments",
]
