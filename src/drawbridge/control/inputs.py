"""Reading a control-plane request: its JSON body, its fields, its query, its caller.

Invariant: a handler sees only input that passed these readers: a body of at most
``MAX_BODY_BYTES`` that is one JSON object, read as ``/mcp`` reads an agent's message
(``ControlServices.read_json``, the gateway's ``one_reading`` rules: no key repeated or equal to
another but for case, no NaN, no number beyond a double, no nesting past 64 levels, UTF-8 only)
with no field
the handler does not name, text fields that are strings of bounded length, query parameters given
at most once, and the name a change is recorded under (``by``, ``resolved_by``) holds no control or
format character (``person``: it goes into policy files, the trace and log lines, where such a
character could hide or reorder what a reader sees), and a grant's globs could match a name
(``agent_glob``: only agent id characters and glob metacharacters; ``tool_glob``: no control or
format character, no edge whitespace, as ``catalogue.names`` reads a tool name), and a decision
table is made for an agent id or ``*`` only (``decision_agent``; the console's Tools page checks its
agent with it too). Anything else is a ``Problem`` (400, or 413 for a body too large) whose message
quotes a name from the request only through ``shown`` (sanitized, capped), never a value.

Theory of operation. The body is read as a stream and refused as soon as it outgrows the limit,
whatever ``Content-Length`` claimed; a declared length above the limit is refused before reading.
The default ``by`` of a change is the caller's address (``caller``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from starlette.requests import Request

import unicodedata

from drawbridge.canonical import sanitize
from drawbridge.canonical.text import UNSAFE_CATEGORIES
from drawbridge.config_reader import AGENT_GLOB, AGENT_ID, AGENT_ID_CHARS
from drawbridge.control.problems import Problem
from drawbridge.control.services import JsonReader

MAX_BODY_BYTES: Final = 64 * 1024
MAX_NAME_CHARS: Final = 1024


def shown(value: object, limit: int = 120) -> str:
    """A name from a request, fit for a message: sanitized, capped, quoted."""
    safe = sanitize(str(value))
    if len(safe) > limit:
        safe = safe[:limit] + "..."
    return json.dumps(safe, ensure_ascii=False)


async def json_body(request: Request, read: JsonReader, *, required: bool = True) -> dict[str, Any]:
    """The request body as a JSON object (``{}`` when empty and not ``required``), read by ``read``
    (``ControlServices.read_json``)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise Problem(413, f"request body larger than {MAX_BODY_BYTES} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise Problem(413, f"request body larger than {MAX_BODY_BYTES} bytes")
    if not body.strip():
        if required:
            raise Problem(400, "a JSON object body is required")
        return {}
    try:
        value = read(bytes(body))
    except ValueError as exc:
        # The rule broken, as /mcp names it (a repeated key, keys equal but for case, ...), never the content.
        raise Problem(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise Problem(400, "the request body must be a JSON object")
    return value


def check_keys(body: Mapping[str, Any], allowed: Sequence[str]) -> None:
    """Refuse a body with a field outside ``allowed``."""
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        names = ", ".join(shown(k, 40) for k in unknown[:5])
        raise Problem(400, f"unknown field(s) {names}; allowed: {', '.join(allowed)}")


def text_field(body: Mapping[str, Any], key: str, *, required: bool) -> str | None:
    """A string field of bounded length; None when absent and not ``required``."""
    value = body.get(key)
    if value is None:
        if required:
            raise Problem(400, f"field {key!r} is required")
        return None
    if not isinstance(value, str):
        raise Problem(400, f"field {key!r} must be a string")
    if required and not value.strip():
        raise Problem(400, f"field {key!r} must not be empty")
    if len(value) > MAX_NAME_CHARS * 4:
        raise Problem(400, f"field {key!r} is longer than {MAX_NAME_CHARS * 4} characters")
    return value


def person(value: str | None, key: str) -> str | None:
    """The name a change is recorded under, as given (None stays None); refused when it holds a control
    or format character, named by its code point (the console refuses such a name at login too)."""
    if value is None:
        return None
    for index, char in enumerate(value):
        if unicodedata.category(char) in UNSAFE_CATEGORIES:
            raise Problem(
                400, f"{key!r} holds a control or format character (U+{ord(char):04X} at position {index + 1}); "
                "give the name in printable characters"
            )
    return value


def agent_glob(value: str, key: str) -> str:
    """A glob over agent ids: the characters of an agent id (``config_reader.AGENT_ID``) and glob
    metacharacters only; a space, a line break or an escape character could match no agent."""
    if not AGENT_GLOB.fullmatch(value):
        raise Problem(
            400, f"{key!r} is not a glob over agent ids: use only {AGENT_ID_CHARS} and the glob characters * ? [ ] ^ \\"
        )
    return value


def decision_agent(agent: str | None) -> str:
    """The agent a decision table is for: an agent id, or ``*`` for the policy written for every agent.
    No agent can have another id (the configuration and ``--agent`` refuse it), so a table for it (a
    policy's glob such as ``bot-*``, markup) would only show what nobody is decided by: refused, as
    ``GET /tools/decisions`` and the console's Tools page both refuse it."""
    if agent is None or not agent.strip():
        raise Problem(400, "query parameter 'agent' is required: GET /tools/decisions?agent=<id>")
    if len(agent) > MAX_NAME_CHARS:
        raise Problem(400, f"agent is longer than {MAX_NAME_CHARS} characters")
    if agent != "*" and not AGENT_ID.fullmatch(agent):
        raise Problem(
            400,
            f"agent {shown(agent)} is not an agent id: ids use only {AGENT_ID_CHARS} "
            "(or * for the policy written for every agent)",
        )
    return agent


def tool_glob(value: str, key: str) -> str:
    """A glob over tool names: refused where a tool name is (no control or format character, no
    leading or trailing whitespace), named by position, never shown."""
    person(value, key)
    if value != value.strip():
        raise Problem(400, f"{key!r} has leading or trailing whitespace")
    return value


def caller(request: Request) -> str:
    """The default ``by`` when the body names nobody: the caller's address, as mesh7 records it."""
    host = request.client.host if request.client else "unknown"
    return f"http:{sanitize(host)[:64]}"


def query_param(request: Request, key: str) -> str | None:
    """A query parameter given at most once."""
    values = request.query_params.getlist(key)
    if len(values) > 1:
        raise Problem(400, f"query parameter {key!r} is given more than once")
    return values[0] if values else None


def truthy(value: str | None, key: str) -> bool:
    """A yes/no query value (absent: no)."""
    if value is None:
        return False
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes"):
        return True
    if lowered in ("0", "false", "no", ""):
        return False
    raise Problem(400, f"query parameter {key!r} must be true or false")


__all__ = [
    "MAX_BODY_BYTES",
    "MAX_NAME_CHARS",
    "caller",
    "check_keys",
    "decision_agent",
    "json_body",
    "person",
    "query_param",
    "shown",
    "text_field",
    "truthy",
]
