"""The 2026-07-28 per-request envelope as serve checks it: which refusal, if any, a request gets.

Invariant: a request that names a protocol version in ``params._meta`` is held to the SDK's inbound
ladder (``mcp/shared/inbound.py``: the envelope's keys, over HTTP the routing headers, the version)
before anything else reads it, and every refusal names the rule broken, never the content: the
versions named are only the gateway's own (a handshake version the request asked for in the
envelope), and ``data.requested`` of a -32022 carries the request's as MCP asks.

The order of the rungs. A version that is not a string (``20260728``, ``null``) is a malformed
envelope, refused -32602 naming the key before any other rung, over either transport: the SDK's
header rung would otherwise call it a header mismatch (-32020), since no header can equal it. Over
stdio there are no routing headers, so the version is checked next: a
client naming a version the gateway does not speak is told so (-32022, and which versions it could
use), not that its envelope lacks a key that version may not even have. Over HTTP the SDK's order
stands (the routing headers before the version), so that a client whose headers and body disagree
is told that. A handshake-era version (2025-11-25 and older) in the envelope is refused with the
reason: those versions are agreed by ``initialize`` for the whole connection and do not use the
per-request envelope, although ``data.supported`` names them (a dual-era client falls back to them
by initializing). Every ``invalid params`` refusal's message starts so, as the gateway's others do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from drawbridge.gateway.protocol.eras import (
    CLIENT_CAPABILITIES_META_KEY,
    HANDSHAKE_PROTOCOL_VERSIONS,
    PROTOCOL_VERSION_META_KEY,
    is_modern,
    message_version,
)
from drawbridge.gateway.protocol.jsonrpc import INVALID_PARAMS, INVALID_REQUEST, UNSUPPORTED_PROTOCOL_VERSION
from drawbridge.gateway.upstreams.sdk_parts import inbound

INITIALIZE_IN_MODERN: Final = "invalid request: initialize is not part of 2026-07-28"
NO_CAPABILITIES: Final = (
    f"invalid params: params._meta['{CLIENT_CAPABILITIES_META_KEY}'] must be an object (the client "
    "capabilities of the 2026-07-28 envelope; {} declares none)"
)
VERSION_NOT_TEXT: Final = (
    f"invalid params: params._meta['{PROTOCOL_VERSION_META_KEY}'] must be a string (the protocol version "
    "of the 2026-07-28 envelope, such as \"2026-07-28\")"
)
UNSUPPORTED: Final = "Unsupported protocol version"
"""The SDK's words for -32022, which clients may look for."""
INVALID_PARAMS_PREFIX: Final = "invalid params: "


@dataclass(frozen=True, slots=True)
class EnvelopeRefusal:
    """A JSON-RPC error for a request whose envelope (or, over HTTP, routing headers) is refused."""

    code: int
    message: str
    data: Any = None


def unsupported_version(requested: Any) -> EnvelopeRefusal:
    """-32022 for a version the gateway does not speak in the envelope; for a handshake version,
    why it cannot be named there (module docstring). ``data`` is completed with every version
    served when the answer is written (``downstream_session.error_response``)."""
    message = UNSUPPORTED
    if isinstance(requested, str) and requested in HANDSHAKE_PROTOCOL_VERSIONS:
        message = (
            f"{UNSUPPORTED}: {requested} is a handshake-era version, agreed by initialize for the whole "
            "connection; a request does not name it in params._meta (send initialize to use it)"
        )
    return EnvelopeRefusal(UNSUPPORTED_PROTOCOL_VERSION, message, {"requested": requested})


def version_refusal(requested: str | None) -> EnvelopeRefusal | None:
    """The refusal of the version a request's envelope names (``eras.envelope_version``), None when it
    names none or 2026-07-28: the first rung over stdio, for serve and for wrap's tools/call alike.
    Only a version the gateway speaks is kept past it, so none an agent made up (of any length) is
    recorded or exported as the call's ``protocol_version``."""
    if requested is not None and not is_modern(requested):
        return unsupported_version(requested)
    return None


def envelope_refusal(
    body: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> EnvelopeRefusal | None:
    """The refusal of a 2026-07-28 request's envelope, or None when it passes; ``headers`` (by
    lowercase name) for a request that came over HTTP, None over stdio (module docstring: the order)."""
    params = body.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance((meta if isinstance(meta, dict) else {}).get(PROTOCOL_VERSION_META_KEY, ""), str):
        return EnvelopeRefusal(INVALID_PARAMS, VERSION_NOT_TEXT)
    if headers is None and (refused := version_refusal(message_version(body))) is not None:
        return refused
    ladder = inbound()
    verdict = ladder.classify_inbound_request(body, headers=None if headers is None else dict(headers))
    if not isinstance(verdict, ladder.InboundLadderRejection):
        return None
    if verdict.code == UNSUPPORTED_PROTOCOL_VERSION:
        data = verdict.data
        return unsupported_version(data.get("requested") if isinstance(data, dict) else None)
    message = verdict.message
    if verdict.code == INVALID_PARAMS and not message.startswith(INVALID_PARAMS_PREFIX):
        message = INVALID_PARAMS_PREFIX + message
    return EnvelopeRefusal(verdict.code, message, verdict.data)


def capabilities_refusal(meta: Any) -> EnvelopeRefusal | None:
    """The client capabilities must be an object: the ladder checks only that the key is there."""
    if not isinstance(meta, dict) or not isinstance(meta.get(CLIENT_CAPABILITIES_META_KEY), dict):
        return EnvelopeRefusal(INVALID_PARAMS, NO_CAPABILITIES)
    return None


INITIALIZE_REFUSAL: Final = EnvelopeRefusal(INVALID_REQUEST, INITIALIZE_IN_MODERN)

__all__ = [
    "INITIALIZE_REFUSAL",
    "NO_CAPABILITIES",
    "VERSION_NOT_TEXT",
    "EnvelopeRefusal",
    "capabilities_refusal",
    "envelope_refusal",
    "unsupported_version",
    "version_refusal",
]
