"""The two protocol eras the gateway speaks, and how a message says which one it belongs to (pure).

2025-11-25 and older are handshake eras: ``initialize`` fixes the version for the connection.
2026-07-28 is stateless: every request carries its version in the ``_meta`` envelope
(``PROTOCOL_VERSION_META_KEY``). The version lists are the ``mcp`` SDK's (``mcp_types.version``),
written out here so that reading a message does not load the SDK's models (a fifth of a second at
every start of ``wrap``); tests/test_serve_eras.py holds them equal to the SDK's.
"""

from __future__ import annotations

from typing import Any, Final

HANDSHAKE_PROTOCOL_VERSIONS: Final = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
MODERN_PROTOCOL_VERSIONS: Final = ("2026-07-28",)
RESERVED_PREFIX: Final = "io.modelcontextprotocol/"
PROTOCOL_VERSION_META_KEY: Final = RESERVED_PREFIX + "protocolVersion"
CLIENT_CAPABILITIES_META_KEY: Final = RESERVED_PREFIX + "clientCapabilities"
LATEST_HANDSHAKE_VERSION: Final = HANDSHAKE_PROTOCOL_VERSIONS[-1]
MODERN_VERSION: Final = MODERN_PROTOCOL_VERSIONS[-1]
SERVED_VERSIONS: Final = (*reversed(MODERN_PROTOCOL_VERSIONS), *reversed(HANDSHAKE_PROTOCOL_VERSIONS))
"""Every version an agent may speak to the gateway, newest first: ``server/discover``'s
``supportedVersions`` and the ``supported`` of an unsupported-version error (-32022), so that a
dual-era client may fall back to a handshake era (basic/versioning.mdx)."""


def unsupported_version_data(data: Any) -> dict[str, Any]:
    """The ``data`` of a -32022 answer: the version asked for, and every version served (the SDK's
    inbound ladder, which speaks only 2026-07-28, names only that)."""
    requested = data.get("requested") if isinstance(data, dict) else getattr(data, "requested", None)
    return {"supported": list(SERVED_VERSIONS), "requested": requested}


def is_modern(version: str | None) -> bool:
    return version in MODERN_PROTOCOL_VERSIONS


def envelope_version(meta: Any) -> str | None:
    """The protocol version a 2026-07-28 request carries in its ``_meta`` envelope, if any."""
    if isinstance(meta, dict):
        version = meta.get(PROTOCOL_VERSION_META_KEY)
        if isinstance(version, str):
            return version
    return None


def message_version(body: Any) -> str | None:
    """The version a message's own envelope names (``params._meta``), if any."""
    params = body.get("params") if isinstance(body, dict) else None
    return envelope_version(params.get("_meta")) if isinstance(params, dict) else None


def http_era_is_modern(body: Any, header_versions: list[str]) -> bool:
    """Whether a message POSTed over HTTP belongs to 2026-07-28: its envelope names that era, or any
    ``MCP-Protocol-Version`` it came with does. The body decides first, and no header's position
    counts, so a routing header missing, repeated or contradicting the body is checked by the
    2026-07-28 rules (-32020) whatever order the headers came in; it is never taken for a 2025-era
    message without a session."""
    return is_modern(message_version(body)) or any(is_modern(version) for version in header_versions)


def negotiate_version(requested: Any) -> str:
    """The handshake version to answer ``initialize`` with: the client's if it is one we speak, else ours."""
    if isinstance(requested, str) and requested in HANDSHAKE_PROTOCOL_VERSIONS:
        return requested
    return LATEST_HANDSHAKE_VERSION


__all__ = [
    "HANDSHAKE_PROTOCOL_VERSIONS",
    "LATEST_HANDSHAKE_VERSION",
    "MODERN_PROTOCOL_VERSIONS",
    "MODERN_VERSION",
    "PROTOCOL_VERSION_META_KEY",
    "CLIENT_CAPABILITIES_META_KEY",
    "RESERVED_PREFIX",
    "SERVED_VERSIONS",
    "envelope_version",
    "http_era_is_modern",
    "is_modern",
    "message_version",
    "negotiate_version",
    "unsupported_version_data",
]
