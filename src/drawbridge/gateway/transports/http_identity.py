"""Who sends an HTTP request to ``/mcp``: the agent its bearer token names, and the settings that say so.

Invariant: an HTTP request has an identity only through a bearer token whose SHA-256 matches a
configured agent (compared with ``hmac.compare_digest``), or, when the request carries no
``Authorization`` at all and ``anonymous_agent`` is configured, that agent. A presented token that
matches no agent has none (401) even then: a wrong credential is a mistake or an attack, not a
request to be anonymous. So has a request with two ``Authorization`` headers (which of them a proxy
or a server reads differs). Tokens are never logged, echoed, or forwarded upstream; only their
digests are configured.

Theory of operation. ``identify`` compares the presented token's digest with every configured one,
so timing says nothing about which agent it belongs to. The endpoint checks ``Host`` and ``Origin``
(``http_hosts``) before any identity is looked at.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field
from typing import Final

from drawbridge.config import MAX_SESSIONS, MAX_SESSIONS_PER_AGENT, AgentToken, GatewayConfig
from drawbridge.gateway.protocol.one_reading import DEFAULT_MAX_DEPTH
from drawbridge.gateway.transports.http_hosts import AllowedHosts

AUTH_REQUIRED: Final = "authentication required: present a bearer token that the gateway maps to an agent"
AUTH_REPEATED: Final = (
    "authentication refused: the request carries more than one Authorization header; send exactly one"
)


@dataclass(frozen=True)
class HttpSettings:
    agents: tuple[AgentToken, ...] = ()
    anonymous_agent: str | None = None
    max_message_bytes: int = 4 * 1024 * 1024
    max_sessions: int = MAX_SESSIONS
    max_sessions_per_agent: int = MAX_SESSIONS_PER_AGENT
    max_depth: int = DEFAULT_MAX_DEPTH
    allowed_hosts: AllowedHosts = field(default_factory=lambda: AllowedHosts.build(None, "127.0.0.1", 8787))

    @classmethod
    def from_config(cls, config: GatewayConfig, port: int) -> HttpSettings:
        """The settings of a ``/mcp`` listening on ``port``: the port bound (``port: 0`` picks it)."""
        return cls(
            agents=config.agents,
            anonymous_agent=config.anonymous_agent,
            max_message_bytes=config.max_message_bytes,
            max_sessions=config.max_sessions,
            max_sessions_per_agent=config.max_sessions_per_agent,
            max_depth=config.max_depth,
            allowed_hosts=AllowedHosts.build(config.allowed_hosts, config.listen_host, port),
        )


def bearer_digest(authorization: str) -> str | None:
    """The SHA-256 (hex) of the token in a ``Bearer`` ``Authorization`` value; None when it is not one."""
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


def identify(authorization: str | None, settings: HttpSettings) -> str | None:
    """The agent id for the one ``Authorization`` header value, or None (401).

    Only a request with no ``Authorization`` header at all is the anonymous agent's: an empty or blank
    one is a credential presented and refused, like any other that names no agent.
    Every configured digest is compared, whichever matches, so timing says nothing about which agent
    a token belongs to or how close a guess came.
    """
    if authorization is None:
        return settings.anonymous_agent
    digest = bearer_digest(authorization)
    if digest is None:
        return None
    found: str | None = None
    for entry in settings.agents:
        if hmac.compare_digest(digest, entry.token_sha256):
            found = entry.agent
    return found


__all__ = ["AUTH_REPEATED", "AUTH_REQUIRED", "HttpSettings", "bearer_digest", "identify"]
