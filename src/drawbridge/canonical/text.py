"""Text normalization with Rust semantics, where a digest depends on it.

Assay trims with Rust's ``str::trim`` (the Unicode White_Space property) and
sanitizes with the Cc general category (evidence-formats.md 0.3, 0.4).
Python's ``str.strip()`` also strips U+001C..U+001F, which would change a
target hash; these helpers keep the bytes identical.
"""

from __future__ import annotations

import unicodedata

RUST_WHITESPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680"
    "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)
_KEEP_CONTROLS = frozenset("\t\n\r")


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
