"""Record ids for approvals and grants: 16 lowercase hex characters, found again by a unique prefix.

Invariant: a stored id is always 16 lowercase hex characters, whatever the id
source returns, and a prefix names a record only when exactly one record
starts with it. An unknown prefix and an ambiguous one are different errors,
so that "approve 3f2a" never acts on a record the person did not mean
(mesh7 reported an ambiguous prefix as "not found", gateway-behaviour.md 3.1).

Ids come from an injected source (``secrets.token_hex(8)`` by default), so
tests can script collisions and prefixes. A prefix must have at least
``MIN_PREFIX`` characters: one or two characters that happen to be unique
today are too easy to mistype into the wrong record tomorrow. An id holding whitespace is malformed,
never trimmed: ``GET /approvals/%20abcd`` names no approval, and reading it as ``abcd`` would answer
for a path the caller did not send.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from typing import Any, Final

from drawbridge.canonical import sanitize

ID_LENGTH: Final = 16
MIN_PREFIX: Final = 4
IdSource = Callable[[], str]
_ID_RE: Final = re.compile(r"[0-9a-f]{16}")
_PREFIX_RE: Final = re.compile(r"[0-9a-f]+")


def default_id_source() -> str:
    """8 random bytes from the OS CSPRNG as 16 hex characters."""
    return secrets.token_hex(8)


class IdError(Exception):
    """Base of the id lookup errors. ``what`` names the kind of record ("approval", "grant")."""

    def __init__(self, what: str, message: str) -> None:
        super().__init__(message)
        self.what = what


class InvalidId(IdError, ValueError):
    """The text cannot be an id or an id prefix."""


class UnknownId(IdError, LookupError):
    """No record has this id or starts with this prefix."""


class AmbiguousId(IdError, LookupError):
    """Several records start with this prefix."""


def is_valid_id(value: object) -> bool:
    return isinstance(value, str) and _ID_RE.fullmatch(value) is not None


def new_id(source: IdSource, what: str) -> str:
    """Draw an id from ``source`` and check its form (a broken source is a programming error)."""
    value = source()
    if not is_valid_id(value):
        raise ValueError(f"{what} id source returned a value that is not 16 lowercase hex characters")
    return value


def parse_prefix(text: object, what: str) -> str:
    """Normalise an id or id prefix typed by a person: lowercased, 4 to 16 hex characters, no whitespace."""
    if not isinstance(text, str):
        raise InvalidId(what, f"{what} id must be text, not {type(text).__name__}")
    value = text.lower()
    shown = repr(sanitize(value[:24]))
    if not value.strip():
        raise InvalidId(what, f"empty {what} id")
    if any(c.isspace() for c in value):
        raise InvalidId(
            what, f"{what} id {shown} holds whitespace; {what} ids are {ID_LENGTH} hex characters"
        )
    if _PREFIX_RE.fullmatch(value) is None:
        raise InvalidId(
            what, f"{what} id {shown} is not hexadecimal; {what} ids are {ID_LENGTH} hex characters"
        )
    if len(value) > ID_LENGTH:
        raise InvalidId(what, f"{what} id {shown} is longer than {ID_LENGTH} hex characters")
    if len(value) < MIN_PREFIX:
        raise InvalidId(
            what, f"{what} id prefix {shown} is too short; give at least {MIN_PREFIX} hex characters"
        )
    return value


def prefix_range(prefix: str) -> tuple[str, str]:
    """``(low, high)`` such that a hex id starts with ``prefix`` iff ``low <= id < high`` (index-friendly)."""
    return prefix, prefix + "~"  # "~" sorts after every hex digit


def rows_by_prefix(conn: Any, table: str, columns: str, id_or_prefix: object, what: str) -> tuple[str, list[Any]]:
    """The parsed prefix and at most two rows of ``table`` whose id starts with it (two means
    ambiguous); ``table`` and ``columns`` are the caller's constants, never input."""
    prefix = parse_prefix(id_or_prefix, what)
    low, high = prefix_range(prefix)
    rows = conn.execute(
        f"SELECT {columns} FROM {table} WHERE id >= ? AND id < ? ORDER BY id LIMIT 2", (low, high)
    ).fetchall()
    return prefix, rows

