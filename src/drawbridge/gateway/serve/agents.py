"""What the hub knows of an agent's connection: how to write to it, and the error when it cannot be
asked. ``DownstreamSession`` (``downstream_session.py``) is the one implementation; the hub holds its
sessions through this shape only, so the two modules do not import each other."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Protocol

from drawbridge.gateway.protocol.jsonrpc import RequestId

UNATTRIBUTABLE: Final = "the gateway cannot tell which agent this request is for"


class Outbound(Protocol):
    """Where a session's messages to its agent go. ``related`` is the agent's request id the message
    belongs to, or None; an HTTP transport uses it to put the message on that request's stream."""

    unsolicited: bool
    """Whether messages that belong to no request can reach the agent (stdio, an HTTP GET stream)."""

    async def send(self, message: dict[str, Any], related: RequestId | None) -> None: ...


class NoBackChannel(Exception):
    """The agent's connection cannot take a request from the server."""


class AgentSession(Protocol):
    """An agent connection as the hub uses it."""

    agent: str
    initialized: bool

    @property
    def modern(self) -> bool: ...

    async def emit(self, message: dict[str, Any], related: RequestId | None) -> bool: ...

    async def request(
        self, method: str, params: Mapping[str, Any] | None, related: RequestId | None
    ) -> dict[str, Any]: ...

    async def close(self) -> None: ...


__all__ = ["UNATTRIBUTABLE", "AgentSession", "NoBackChannel", "Outbound"]
