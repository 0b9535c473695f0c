"""Text the gateway writes into policy files: YAML scalars and comments in printable ASCII (pure).

Drafts (``catalogue.draft``) and in-place edits (``policy.edit_splice``) both write tool names that
may hold any character; these keep every written line printable ASCII and readable back to the same
string.
"""

from __future__ import annotations


def escape_char(char: str) -> str:
    code = ord(char)
    if char == '"':
        return '\\"'
    if char == "\\":
        return "\\\\"
    if 0x20 <= code < 0x7F:
        return char
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def quoted(text: str) -> str:
    """A YAML double-quoted scalar in printable ASCII (also a valid JSON string for ASCII input)."""
    return '"' + "".join(escape_char(char) for char in text) + '"'


def comment_text(text: str) -> str:
    """Text made safe for one comment line: printable ASCII, everything else escaped."""
    return "".join(char if 0x20 <= ord(char) < 0x7F else escape_char(char) for char in text)
