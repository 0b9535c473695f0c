"""Who sends an HTTP request to ``/mcp``: the agent its bearer token names, and the settings that say so.

Invariant: an HTTP request has an identity only through a bearer token whose SHA-256 matches a
configured agent (compared with ``hmac.compare_digest``), or, when the request carries no
``Authorization`` at all and ``anonymous_agent`` is configured, that agent. A presented token that
matches no agent has none (401) even then: a wrong credential is a mistake or an attack, not a
request to be anonymous. Tokens are never logged, echoed, or forwarded upstream; only their digests
are configured.

Theory of operation. ``identify`` compares the presented token's digest with every configured one,
so timing says nothing about which agent it belongs to. ``origin_ok`` refuses a browser's
cross-origin request (DNS rebinding) before any identity is looked at.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from drawbridge.config import AgentToken, GatewayConfig
from drawbridge.gateway.protocol.one_reading import DEFAULT_MAX_DEPTH

MAX_SESSIONS: Final = 1024

AUTH_REQUIRED: Final = "authentication required: present a bearer token that the gateway maps to an agent"


@dataclass(frozen=True)
class HttpSettings:
    agents: tuple[AgentToken, ...] = ()
    anonymous_agent: str | None = None
    max_message_bytes: int = 4 * 1024 * 1024
    max_sessions: int = MAX_SESSIONS
    max_depth: int = DEFAULT_MAX_DEPTH

    @classmethod
    def from_config(cls, config: GatewayConfig) -> HttpSettings:
        return cls(
            agents=config.agents,
            anonymous_agent=config.anonymous_agent,
            max_message_bytes=config.max_message_bytes,
            max_depth=config.max_depth,
        )


def identify(authorization: str | None, settings: HttpSettings) -> str | None:
    """The agent id for an ``Authorization`` header value, or None (401).

    Every configured digest is compared, whichever matches, so timing says nothing about which agent
    a token belongs to or how close a guess came.
    """
    if authorization is None or not authorization.strip():
        return settings.anonymous_agent
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()
    found: str | None = None
    for entry in settings.agents:
        if hmac.compare_digest(digest, entry.token_sha256):
            found = entry.agent
    return found


def origin_ok(headers: Mapping[str, str]) -> bool:
    """A browser's cross-origin request (DNS rebinding) names another origin than the Host it reached."""
    origin = headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    try:
        netloc = urlsplit(origin).netloc
    except ValueError:
        return False
    return netloc.lower() == headers.get("host", "").lower()


__all__ = ["AUTH_REQUIRED", "MAX_SESSIONS", "HttpSettings", "identify", "origin_ok"]
