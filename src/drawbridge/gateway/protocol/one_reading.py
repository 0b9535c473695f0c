"""What makes a message read one way by every JSON parser: the rules applied while it is parsed.

Invariant: the gateway decides on its own reading of a message and forwards the bytes it received, so
a message is taken only when no other parser could read it differently. Parsers differ on repeated
keys (first or last wins), on keys that differ only in case (Go's ``encoding/json`` matches them
ignoring case, the last match winning) or in Unicode normalization, on keys holding control or format
characters (some cut a key at NUL), on numbers beyond a double, and on how deep they nest before they
give up. Here every such message is refused before anything is decided:

* in every object, at every depth: no key repeated, none equal to another after NFKC and case folding,
  none holding a control, format or line/paragraph-separator character;
* the members the gateway reads (the JSON-RPC envelope; ``name``, ``arguments``, ``_meta`` and the
  retry fields of tools/call ``params``) are spelled exactly: ``"Method"`` or ``"Arguments"`` beside
  them, or instead of them, is refused, since a case-insensitive reader would take it for the member;
* numbers: integers a double holds exactly, and decimals within a double's range (what every reader
  reads as the same number, and evidence renders canonically);
* nesting: at most ``max_depth`` levels of arrays and objects (default 64).

A refusal names the rule, never the content. Theory of operation: the object hook and the number
hooks of the strict decoder (``jsonrpc``) raise ``Ambiguous`` as objects are built; the depth is
counted over the parsed value only when the line has more brackets than the limit.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from typing import Any, Final

from drawbridge.catalogue.names import FORBIDDEN_NAME_CATEGORIES

DEFAULT_MAX_DEPTH: Final = 64
ENVELOPE_MEMBERS: Final = {m.casefold(): m for m in ("jsonrpc", "id", "method", "params", "result", "error")}
CALL_MEMBERS: Final = {m.casefold(): m for m in ("name", "arguments", "_meta", "requestState", "inputResponses")}
"""The members of tools/call ``params`` the gateway decides on or takes out, by their folded form."""
_EXACT_INTEGERS: Final = 2**53
"""Every integer up to this magnitude has a double of its own."""
KEY_FORBIDDEN_CATEGORIES: Final = FORBIDDEN_NAME_CATEGORIES - {"Cs"}
"""What a key may not hold. A lone surrogate is refused later, by the reading of a tools/call, which can
still name the request (it has no other reading: no text encoding holds it)."""


class Ambiguous(ValueError):
    """A message another parser could read differently (the message says which rule)."""


class RepeatedKey(Ambiguous):
    """An object repeats a key exactly (a parse error, as JSON readers disagree on which one wins)."""


class NumberTooLarge(Ambiguous):
    """A number no double holds (a parse error: no canonical form, no common reading)."""


def fold(key: str) -> str:
    """The form in which two keys are the same key to some parser: NFKC, then case folded."""
    return key.lower() if key.isascii() else unicodedata.normalize("NFKC", key).casefold()


def _folded(key: str) -> str:
    if key.isascii():
        if not key.isprintable():
            raise Ambiguous("a key in the message holds a control character")
        return key.lower()
    for char in key:
        if unicodedata.category(char) in KEY_FORBIDDEN_CATEGORIES:
            raise Ambiguous("a key in the message holds a control or format character")
    return unicodedata.normalize("NFKC", key).casefold()


def one_reading_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """The object hook: a dict, or ``Ambiguous`` for keys two parsers could read apart."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise RepeatedKey("a JSON object in the message repeats a key")
    check_keys(obj)
    return obj


def check_keys(obj: Mapping[str, Any]) -> None:
    """``Ambiguous`` when two keys of one object fold alike, or a key holds a control or format character.

    Keys that are all printable ASCII (nearly every key) are checked together: without an upper-case
    letter each is its own folded form, so distinct keys cannot fold alike."""
    if not obj:
        return
    joined = "".join(obj)
    if joined.isascii():
        if not joined.isprintable():
            raise Ambiguous("a key in the message holds a control character")
        if len(obj) == 1 or joined.lower() == joined or len({key.lower() for key in obj}) == len(obj):
            return
    elif len({_folded(key) for key in obj}) == len(obj) or len(obj) == 1:
        return
    raise Ambiguous("a JSON object in the message has keys that differ only in case or Unicode form")


def bounded_int(text: str) -> int:
    """The integer hook: an integer a double holds exactly. Beyond 2**53 most integers have no double
    (``9007199254740993``): JavaScript and Go read them as the nearest one, a different number from
    the one a rule here would judge, so they are refused; one a double holds (``2**60``) reads alike
    everywhere. Up to 15 digits an integer is below 2**53, and nothing more is asked of it."""
    value = int(text)
    if len(text) > 15 and abs(value) > _EXACT_INTEGERS:
        try:
            exact = float(value) == value
        except OverflowError:
            exact = False
        if not exact:
            raise NumberTooLarge("an integer no double holds exactly (beyond 2**53, JSON readers differ on it)")
    return value


def inexact_member(obj: Mapping[str, Any], members: Mapping[str, str]) -> str | None:
    """A key that a case-insensitive reader would take for one of ``members`` (by folded form)
    without being spelled as it; None when there is none."""
    for key in obj:
        exact = members.get(key.lower() if key.isascii() else fold(key))
        if exact is not None and exact != key:
            return key
    return None


def too_deep(max_depth: int) -> str:
    """The refusal of a message nested past the limit (the same however deep it goes)."""
    return f"the message nests deeper than {max_depth} levels of arrays and objects"


def nesting_problem(line: bytes, value: Any, max_depth: int) -> str | None:
    """Why ``value`` (parsed from ``line``) nests too deeply, or None. Only a line with more brackets
    than the limit is walked."""
    if line.count(b"[") + line.count(b"{") <= max_depth:
        return None
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > max_depth:
            return too_deep(max_depth)
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return None


__all__ = [
    "CALL_MEMBERS",
    "DEFAULT_MAX_DEPTH",
    "ENVELOPE_MEMBERS",
    "Ambiguous",
    "NumberTooLarge",
    "RepeatedKey",
    "bounded_int",
    "check_keys",
    "fold",
    "inexact_member",
    "nesting_problem",
    "one_reading_object",
    "too_deep",
]
