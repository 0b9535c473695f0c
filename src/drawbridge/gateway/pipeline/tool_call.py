"""A tools/call request as policy reads it: ``ToolCall``, and the strict reading that makes one.

Invariant: a ``ToolCall`` exists only for a request whose name and arguments read one way. The
reading takes ``params.name``, ``params.arguments`` and ``params._meta`` and refuses what policy could
misread: a name with control or format characters (``catalogue.names``), non-object arguments
(``null`` included: absent arguments are ``{}``, ``null`` would be forwarded as it is), a
string anywhere in the call or its id that holds a lone surrogate (no evidence could digest it), a
key that a case-insensitive parser would take for one of those members (``protocol.one_reading``).
A refusal is a ``MessageError(INVALID_PARAMS)`` whose message never quotes an argument.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from drawbridge.canonical.encoders import compact_encoder
from drawbridge.catalogue.names import shown_name, tool_name_problem
from drawbridge.gateway.protocol.eras import envelope_version, is_modern
from drawbridge.gateway.protocol.jsonrpc import INVALID_PARAMS, Message, MessageError, RequestId
from drawbridge.gateway.protocol.one_reading import CALL_MEMBERS, fold, inexact_member

_text_encode = compact_encoder(sort_keys=False, ensure_ascii=False, allow_nan=True)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """The parts of a tools/call that policy reads. ``arguments`` is never written anywhere raw."""

    agent: str
    tool: str
    arguments: Mapping[str, Any]
    meta: Mapping[str, Any] | None
    request_id: RequestId
    protocol_version: str | None = None

    @property
    def modern(self) -> bool:
        return is_modern(self.protocol_version)


def parse_tool_call(message: Message, agent: str, session_version: str | None) -> ToolCall:
    """Read a tools/call request; raise ``MessageError(INVALID_PARAMS)`` for what policy cannot read."""
    assert message.id is not None
    params = message.body.get("params")

    def invalid(problem: str) -> MessageError:
        return MessageError(INVALID_PARAMS, f"invalid params: {problem}", message.id)

    if not isinstance(params, dict):
        raise invalid("tools/call params must be a JSON object")
    inexact = inexact_member(params, CALL_MEMBERS)
    if inexact is not None:
        member = CALL_MEMBERS[fold(inexact)]
        raise invalid(
            f"a key of params reads as {member} to a case-insensitive parser without being spelled so "
            f"(the members a call is read by: {', '.join(CALL_MEMBERS.values())})"
        )
    if has_lone_surrogate(message.raw, (message.id, params)):
        raise invalid(
            "a string in the call holds a lone surrogate (half of a UTF-16 pair escaped as \\uD800-\\uDFFF), "
            "which is not Unicode text"
        )
    name = params.get("name")
    if not isinstance(name, str):
        raise invalid("tools/call params.name must be a string")
    problem = tool_name_problem(name)
    if problem is not None:
        raise invalid(problem)
    # Absent arguments are no arguments; ``null`` is not an object: decided on as ``{}`` it was forwarded
    # as ``null``, so the call that ran was not the call decided.
    arguments = params.get("arguments", {})
    if not isinstance(arguments, dict):
        raise invalid("tools/call params.arguments must be a JSON object")
    meta = params.get("_meta")
    if meta is not None and not isinstance(meta, dict):
        raise invalid("tools/call params._meta must be a JSON object")
    version = envelope_version(meta) or session_version
    return ToolCall(agent, name, arguments, meta, message.id, version)


def has_lone_surrogate(raw: bytes, value: Any) -> bool:
    """True when a string (or an object key) in ``value``, parsed from the line ``raw``, holds a lone
    surrogate: JSON can escape one, no text encoding can hold it, and no evidence can digest it.
    Only an escape in the line can make one, so a line without ``\\uD...`` is not searched."""
    if b"\\ud" not in raw and b"\\uD" not in raw:
        return False
    try:
        _text_encode(value).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def requested_tool_name(message: Message) -> str | None:
    """The requested name for the record of an invalid request: each control or format character (the
    ones ``tool_name_problem`` refuses, line breaks included) becomes U+FFFD; None if there is no name."""
    params = message.body.get("params")
    name = params.get("name") if isinstance(params, dict) else None
    return shown_name(name) if isinstance(name, str) else None


__all__ = ["ToolCall", "has_lone_surrogate", "parse_tool_call", "requested_tool_name"]
