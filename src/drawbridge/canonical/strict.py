"""Assay's strict JSON (auditor-evidence.md 1.6): the one reading of an evidence file handed over as bytes.

Invariant: a file is read only as Assay's strict reader reads it, so that one file never gets two
verdicts: UTF-8 only, no byte order mark, no key given twice in any object, no lone surrogate, no NaN
or Infinity, nesting at most ``MAX_DEPTH``, at most ``MAX_KEYS`` keys in an object, strings of at most
``MAX_STRING_CHARS`` characters. ``json.loads`` alone would guess UTF-16 and UTF-32 and skip a byte
order mark, and keep the last of two equal keys: a file another reader rejects (or reads otherwise)
could then bind here. A refusal names the rule it broke and never shows the text.

The bundle's manifest and event lines (``evidence.bundle``) and imported audit records
(``evidence.audit_import``) are read here.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

from drawbridge.canonical.jcs import CanonicalizationError, DuplicateKeyError, shown_key, unique_object

MAX_DEPTH: Final = 64
MAX_KEYS: Final = 10_000
MAX_STRING_CHARS: Final = 1_048_576
_SURROGATE = re.compile("[\ud800-\udfff]")
_BOM: Final = b"\xef\xbb\xbf"


class StrictJSONError(CanonicalizationError):
    """Bytes that are not Assay's strict JSON. The message reads after the file's name: ``starts with a
    byte order mark``, ``is not UTF-8``, ``is not JSON (...)`` or ``is not strict JSON: <rule>``."""


class _Broken(Exception):
    """A strict rule broken inside the decoder's hooks, carried out of ``json.loads``."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    if len(pairs) > MAX_KEYS:
        raise _Broken(f"an object holds {len(pairs)} keys, more than {MAX_KEYS}")
    try:
        return unique_object(pairs)
    except DuplicateKeyError as exc:
        raise _Broken(f"the key {shown_key(exc.key)} appears twice in one object") from None


def _no_constant(name: str) -> Any:
    raise _Broken(f"{name} is not JSON")


def _too_deep() -> str:
    return f"nesting is deeper than {MAX_DEPTH} levels, the depth limit"


def _check_strings(value: Any, depth: int = 1) -> None:
    """The limits on a parsed value: no lone surrogate (a ``\\uD800`` escape with no partner), nesting
    at most MAX_DEPTH, each string at most MAX_STRING_CHARS characters."""
    if isinstance(value, str):
        if len(value) > MAX_STRING_CHARS:
            raise _Broken(f"a string holds {len(value)} characters, more than {MAX_STRING_CHARS}")
        if _SURROGATE.search(value):
            raise _Broken("a string holds a lone surrogate (half of a UTF-16 pair, escaped as \\uD800-\\uDFFF)")
        return
    if isinstance(value, (dict, list)):
        if depth > MAX_DEPTH:
            raise _Broken(_too_deep())
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(key, str):
                _check_strings(key, depth)
            _check_strings(item, depth + 1)


def parse_strict_json(data: bytes) -> Any:
    """The value of ``data`` under the strict rules (module docstring), or ``StrictJSONError``."""
    if data.startswith(_BOM):
        raise StrictJSONError("starts with a byte order mark")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise StrictJSONError("is not UTF-8") from None
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
        _check_strings(value)
    except _Broken as exc:
        raise StrictJSONError(f"is not strict JSON: {exc}") from None
    except RecursionError:  # the parser gives up hundreds of levels past the limit
        raise StrictJSONError(f"is not strict JSON: {_too_deep()}") from None
    except ValueError as exc:
        raise StrictJSONError(f"is not JSON ({exc})") from None
    return value


__all__ = ["MAX_DEPTH", "MAX_KEYS", "MAX_STRING_CHARS", "StrictJSONError", "parse_strict_json"]
