"""Whom a response the gateway could not read was for: its id, from the start of its line.

Invariant: an id is named only when the bytes read prove it is the top-level ``id`` of a response:
the line starts as a JSON object, whose members up to that point are read exactly (each complete,
valid UTF-8 and JSON), among them ``id`` (a string or an integer) and ``result`` or ``error``, and no
``method``, nor a key another reader could take for a member (``one_reading.fold``: ``ID``, ``Id``...)
or a member twice. A nested ``"id"``, a member cut before its end, an invalid byte before the id: no
id. The part not read may still hold such a key: the relay uses ``response_id`` only for lines dropped
for their size or their bytes. A line that is UTF-8 is read whole instead (``undecodable_response_id``),
leniently (NaN, repeats), and names its request only when every top-level member was read so: its
envelope reads one way, and what got it dropped lies inside ``result`` or ``error`` (a key repeated
in the result, a ``NaN``). The relay answers the request named with an error of its own, never with
anything from the line. So a dropped line (too large, not UTF-8, not one reading) is tied to the
request it answers, or to none; a server's request or notification is never taken for an answer,
whatever follows the part read.
"""

from __future__ import annotations

import codecs
import json
from typing import Any, Final

from drawbridge.gateway.protocol.jsonrpc import RequestId, valid_id
from drawbridge.gateway.protocol.one_reading import ENVELOPE_MEMBERS, check_keys, fold

_DECODER: Final = json.JSONDecoder()
_SPACE: Final = " \t\n\r"


def _readable_prefix(data: bytes) -> str:
    """The longest prefix of ``data`` that is valid UTF-8 (a character cut at the end left out)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        return decoder.decode(data, final=False)
    except UnicodeDecodeError as exc:
        return data[: exc.start].decode("utf-8")


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at] in _SPACE:
        at += 1
    return at


def response_id(data: bytes) -> RequestId | None:
    """The top-level id of the response ``data`` starts (module docstring), or None."""
    text = _readable_prefix(data)
    at = _skip_space(text, 0)
    if not text.startswith("{", at):
        return None
    at += 1
    found: RequestId | None = None
    has_id = answers = False
    seen: set[str] = set()
    while True:
        at = _skip_space(text, at)
        if has_id and answers:
            return found
        try:
            key, at = _DECODER.raw_decode(text, at)
            if not isinstance(key, str):
                return None
            folded = fold(key)
            if folded in seen or ENVELOPE_MEMBERS.get(folded, key) != key:
                return None  # another reader could read this member differently
            seen.add(folded)
            at = _skip_space(text, at)
            if not text.startswith(":", at):
                return None
            at = _skip_space(text, at + 1)
            if key in ("result", "error"):
                answers = True
                if has_id:
                    return found
            value, at = _DECODER.raw_decode(text, at)
        except (json.JSONDecodeError, RecursionError):
            return None  # cut, or not JSON, before the id and the answer were both read
        if at >= len(text):
            return None  # the value may go on past the part read (a number cut short)
        if key == "method":
            return None
        if key == "id":
            if has_id or not valid_id(value):
                return None
            found, has_id = value, True
        at = _skip_space(text, at)
        if text.startswith(",", at):
            at += 1
        else:
            return found if has_id and answers else None


def undecodable_response_id(data: bytes) -> RequestId | None:
    """Whom a line dropped for its bytes or its reading answers: ``response_id`` of a line that is not
    UTF-8; for a UTF-8 line, the id of its envelope read whole, when it reads one way (module docstring)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return response_id(data)
    return _whole_response_id(text)


def _whole_response_id(text: str) -> RequestId | None:
    envelope: list[tuple[str, Any]] = []

    def keep(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        envelope[:] = pairs  # the top-level object is the last one built
        return dict(pairs)

    try:
        body = json.JSONDecoder(object_pairs_hook=keep).decode(text)
        if not isinstance(body, dict) or len(body) != len(envelope):
            return None
        check_keys(body)
    except (ValueError, RecursionError):  # Ambiguous is a ValueError
        return None
    if any(ENVELOPE_MEMBERS.get(fold(key), key) != key for key in body) or "method" in body:
        return None
    request_id = body.get("id")
    if not valid_id(request_id) or ("result" in body) == ("error" in body):
        return None
    return request_id


__all__ = ["response_id", "undecodable_response_id"]
