"""Glob patterns for agent ids and tool names, with mesh7's semantics.

Invariant: a glob is checked and compiled exactly once, when the policy is
loaded; matching a name never parses a pattern or compiles a regex, and a
malformed pattern is a load error, never a pattern that silently matches
nothing (mesh7 treats it as "no match"). A rule's ``tools`` glob holds no character a tool name
may not hold (``FORBIDDEN_NAME_CATEGORIES``, ``compile_tool_glob``): it could match no name the
gateway decides on.

Theory of operation. mesh7 matches with Go's ``path/filepath.Match`` plus two
extras (gateway-behaviour.md 2.1):

- the pattern ``*`` alone matches every value, ``/`` included;
- a pattern equal to the value matches, whatever its metacharacters.

Everything else is ``filepath.Match`` on Unix: ``*`` is any run of characters
other than ``/`` (``.`` is not special, so ``github.*`` matches
``github.repos.list``), ``?`` is one character other than ``/``, ``[...]`` and
``[^...]`` are character classes with ``lo-hi`` ranges (a class may match
``/``), ``\\`` escapes the next character, matching is anchored and
case-sensitive. We translate each pattern into an equivalent Python regex
once; patterns with no metacharacter are compared as strings, and ``*`` is a
constant.

Specificity (used to order policies by their ``agent`` glob): an exact name
beats any glob, a glob with a longer literal prefix beats one with a shorter
prefix, and the catch-all ``*`` comes last. mesh7 counted a pattern with only
``[...]`` as exact; we count it as a glob, because it is one.
"""

from __future__ import annotations

import enum
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Final

_META = frozenset("*?[\\")


class GlobError(ValueError):
    """A pattern that Go's ``filepath.Match`` would reject (ErrBadPattern)."""


class GlobKind(enum.IntEnum):
    """Specificity class; lower sorts first."""

    EXACT = 0
    PARTIAL = 1
    CATCH_ALL = 2


@dataclass(frozen=True, slots=True)
class Glob:
    """A compiled pattern. ``text`` is the pattern as written in the policy."""

    text: str
    kind: GlobKind
    literal_prefix: str
    _regex: re.Pattern[str] | None = field(default=None, repr=False, compare=False)
    _exact: str | None = field(default=None, repr=False, compare=False)

    def matches(self, value: str) -> bool:
        if self.kind is GlobKind.CATCH_ALL:
            return True
        if value == self.text:
            return True
        if self._exact is not None:
            return value == self._exact
        assert self._regex is not None
        return self._regex.fullmatch(value) is not None

    @property
    def exact_value(self) -> str | None:
        """The one name this pattern matches, when it has no wildcard."""
        return self._exact

    @property
    def specificity(self) -> tuple[int, int]:
        """Sort key: exact first, then longer literal prefix, then ``*``."""
        if self.kind is GlobKind.PARTIAL:
            return (1, -len(self.literal_prefix))
        return (int(self.kind), 0)


def _class_char(pattern: str, i: int) -> tuple[str, int]:
    """Go's getEsc: one (possibly escaped) character inside ``[...]``."""
    n = len(pattern)
    if i >= n:
        raise GlobError("unterminated character class")
    if pattern[i] in "-]":
        raise GlobError(f"unexpected {pattern[i]!r} in a character class (escape it)")
    if pattern[i] == "\\":
        i += 1
        if i >= n:
            raise GlobError("escape at the end of a character class")
    ch = pattern[i]
    i += 1
    if i >= n:
        raise GlobError("unterminated character class")
    return ch, i


def _translate(pattern: str) -> tuple[str, str, bool]:
    """Return (regex source, literal prefix, has_wildcard)."""
    out: list[str] = []
    prefix: list[str] = []
    in_prefix = True
    wildcard = False
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "*":
            out.append("[^/]*")
            in_prefix = False
            wildcard = True
            i += 1
        elif ch == "?":
            out.append("[^/]")
            in_prefix = False
            wildcard = True
            i += 1
        elif ch == "\\":
            if i + 1 >= n:
                raise GlobError("trailing backslash")
            lit = pattern[i + 1]
            out.append(re.escape(lit))
            if in_prefix:
                prefix.append(lit)
            i += 2
        elif ch == "[":
            in_prefix = False
            wildcard = True
            i += 1
            negated = False
            if i < n and pattern[i] == "^":
                negated = True
                i += 1
            ranges: list[str] = []
            count = 0
            while True:
                if i < n and pattern[i] == "]" and count > 0:
                    i += 1
                    break
                lo, i = _class_char(pattern, i)
                hi = lo
                if pattern[i] == "-":
                    hi, i = _class_char(pattern, i + 1)
                if lo <= hi:
                    ranges.append(re.escape(lo) if lo == hi else f"{re.escape(lo)}-{re.escape(hi)}")
                count += 1
            if ranges:
                out.append(("[^" if negated else "[") + "".join(ranges) + "]")
            else:
                # Every range was empty (lo > hi): Go matches nothing, or anything when negated.
                out.append("(?s:.)" if negated else "(?!)")
        else:
            out.append(re.escape(ch))
            if in_prefix:
                prefix.append(ch)
            i += 1
    return "".join(out), "".join(prefix), wildcard


def compile_glob(pattern: str) -> Glob:
    """Check and compile one pattern; raise GlobError naming the problem."""
    if not isinstance(pattern, str):
        raise GlobError(f"a glob must be a string, not {type(pattern).__name__}")
    if pattern == "":
        raise GlobError("empty glob")
    if pattern == "*":
        return Glob(pattern, GlobKind.CATCH_ALL, "")
    if not (_META & set(pattern)):
        return Glob(pattern, GlobKind.EXACT, pattern, None, pattern)
    source, prefix, wildcard = _translate(pattern)
    if not wildcard:
        # Only escapes: still one literal name.
        return Glob(pattern, GlobKind.EXACT, prefix, None, prefix)
    return Glob(pattern, GlobKind.PARTIAL, prefix, re.compile(source, re.DOTALL))


FORBIDDEN_NAME_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
"""Unicode categories a tool name may not contain (``catalogue.names`` refuses them wherever a name
enters the gateway): each can make a name that looks like one tool to a human or a glob and like
another to the upstream."""


def compile_tool_glob(pattern: str) -> Glob:
    """A rule's glob on tool names: well formed, and without a character of
    ``FORBIDDEN_NAME_CATEGORIES`` (a NUL, a line break, a zero-width space): no name the gateway
    decides on holds one, so such a pattern would only hide what it says."""
    for position, char in enumerate(pattern):
        if unicodedata.category(char) in FORBIDDEN_NAME_CATEGORIES:
            raise GlobError(f"contains a control or format character (U+{ord(char):04X} at index {position})")
    return compile_glob(pattern)


GLOB_METACHARACTERS: Final = frozenset("*?[\\")
"""The characters that make a glob pattern (section 3 of the policy format)."""


def escape_glob(name: str) -> str:
    """A glob that matches ``name`` literally (section 3 of the policy format: ``\\`` escapes)."""
    return "".join("\\" + char if char in GLOB_METACHARACTERS else char for char in name)
