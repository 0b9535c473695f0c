"""Text normalization with Rust semantics, where a digest depends on it, and text made safe to show.

Assay trims with Rust's ``str::trim`` (the Unicode White_Space property) and
sanitizes with the Cc general category (evidence-formats.md §0.3, 0.4).
Python's ``str.strip()`` also strips U+001C..U+001F, which would change a
target hash; these helpers keep the bytes identical.

``escape_unsafe`` is for text that a person reads and must not be able to
steer the display: every control character (C0, DEL, C1: terminal escape
sequences start with one), format character (bidi overrides and isolates,
zero-width characters), surrogate and line or paragraph separator becomes a
visible JSON-style escape, so what is shown is what was sent.
"""

from __future__ import annotations

import re
import unicodedata

RUST_WHITESPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680"
    "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)
_KEEP_CONTROLS = frozenset("\t\n\r")
UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
"""Unicode categories that can move, hide or reorder what a terminal or a client shows."""
_NOT_PRINTABLE_ASCII = re.compile(r"[^\x20-\x7e]")
_SHORT_ESCAPES = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def rust_trim(value: str) -> str:
    """``str::trim()``: strip Unicode White_Space from both ends."""
    return value.strip(RUST_WHITESPACE)


def sanitize(value: str) -> str:
    """Replace each Cc character except TAB, LF, CR with U+FFFD (one per character)."""
    if value.isprintable():
        return value
    return "".join(
        "\ufffd" if c not in _KEEP_CONTROLS and unicodedata.category(c) == "Cc" else c for c in value
    )


def escape_unsafe(value: str, keep: str = "") -> str:
    """``value`` with each character of ``UNSAFE_CATEGORIES`` (but those in ``keep``) written as a JSON
    escape: ``\\n``, ``\\t`` and the other short forms, else ``\\uXXXX`` (a UTF-16 pair beyond the BMP).

    Inside a JSON string the result means the same as ``value``; on a terminal it moves nothing.
    """
    if value.isprintable():  # printable text holds no character of those categories
        return value

    def escaped(match: re.Match[str]) -> str:
        char = match.group()
        if char in keep or unicodedata.category(char) not in UNSAFE_CATEGORIES:
            return char
        if char in _SHORT_ESCAPES:
            return _SHORT_ESCAPES[char]
        code = ord(char)
        if code > 0xFFFF:
            code -= 0x10000
            return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
        return f"\\u{code:04x}"

    return _NOT_PRINTABLE_ASCII.sub(escaped, value)
