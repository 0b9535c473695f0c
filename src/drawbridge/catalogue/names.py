"""What a tool or prompt name may hold, and how names are namespaced across upstreams (pure).

Invariant: a name the gateway decides on, advertises or routes reads the same to a person, a glob
and an upstream. Controls, format characters (zero-width joiners, bidi overrides), surrogates,
line and paragraph separators, edge whitespace, the empty name and names longer than
``MAX_TOOL_NAME_CHARS`` are refused wherever a name enters: a tools/call's ``params.name`` and every
item an upstream lists; a policy's ``tools`` glob holding a character of those categories is a load
error (``FORBIDDEN_NAME_CATEGORIES`` lives in ``policy.globs`` for that). Problems are described
without quoting the name.

Namespacing. Upstream names (``[A-Za-z0-9_-]+``, enforced by the configuration) hold no dot, so
``<server>.<name>`` splits unambiguously at its first dot even when the upstream's own name has dots.
"""

from __future__ import annotations

import unicodedata
from typing import Final

from drawbridge.policy.globs import FORBIDDEN_NAME_CATEGORIES

MAX_TOOL_NAME_CHARS: Final = 1024
SEPARATOR: Final = "."


def tool_name_problem(name: str) -> str | None:
    """Why a tool name cannot be decided on, or None. The message never contains the name."""
    if not name:
        return "tool name is empty"
    if len(name) > MAX_TOOL_NAME_CHARS:
        return f"tool name is longer than {MAX_TOOL_NAME_CHARS} characters"
    if name.isascii() and name.isprintable():
        # The usual name: printable ASCII holds no character of a forbidden category, and its only
        # whitespace is the space.
        if name[0] == " " or name[-1] == " ":
            return "tool name has leading or trailing whitespace"
        return None
    for position, char in enumerate(name):
        if unicodedata.category(char) in FORBIDDEN_NAME_CATEGORIES:
            return f"tool name contains a control or format character (U+{ord(char):04X} at index {position})"
    if name != name.strip():
        return "tool name has leading or trailing whitespace"
    return None


def shown_name(name: str) -> str:
    """A name for a record: each forbidden character becomes U+FFFD, the length is capped."""
    return "".join(
        "\ufffd" if unicodedata.category(char) in FORBIDDEN_NAME_CATEGORIES else char
        for char in name[:MAX_TOOL_NAME_CHARS]
    )


def namespaced(server: str, name: str) -> str:
    """The name an agent sees for an upstream item."""
    return f"{server}{SEPARATOR}{name}"


def split_namespaced(name: str) -> tuple[str, str] | None:
    """``(server, upstream name)`` for a namespaced name, or None when it has no server prefix."""
    server, dot, rest = name.partition(SEPARATOR)
    if not dot or not server or not rest:
        return None
    return server, rest


__all__ = [
    "FORBIDDEN_NAME_CATEGORIES",
    "MAX_TOOL_NAME_CHARS",
    "SEPARATOR",
    "namespaced",
    "shown_name",
    "split_namespaced",
    "tool_name_problem",
]
