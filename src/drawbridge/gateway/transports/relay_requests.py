"""What wrap's relay keeps about the requests it relays that are not tools/call, and its settings.

Invariant: a ``Pending`` request is answered once: whoever takes it from the relay's table (the
upstream's answer, the upstream's exit, the agent closing) writes its one response. A tools/call
is not a ``Pending``: it is a ``pipeline.call.Flight``, whose lifecycle the pipeline owns.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import anyio

from drawbridge.gateway.protocol.jsonrpc import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_MAX_UPSTREAM_MESSAGE_BYTES,
    Message,
)
from drawbridge.gateway.protocol.one_reading import DEFAULT_MAX_DEPTH


@dataclass(eq=False, slots=True)
class OwnRequest:
    """A request the gateway sent on its own (an approval question to the agent, a tools/list to the
    server): the answer goes to whoever waits, never to the other side."""

    done: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    body: dict[str, Any] | None = None


@dataclass(frozen=True)
class RelayConfig:
    agent: str = "anonymous"
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    """Largest line accepted from the agent."""
    max_upstream_message_bytes: int = DEFAULT_MAX_UPSTREAM_MESSAGE_BYTES
    """Largest line accepted from the upstream (results may carry images)."""
    max_depth: int = DEFAULT_MAX_DEPTH
    """How deep an agent's message may nest arrays and objects."""
    shutdown_grace: float = 1.0
    """Seconds the upstream gets to exit after the agent closes the connection, before it is sent SIGTERM.
    With the rest of the shutdown it fits in the 2 s an MCP client gives a server between closing its
    stdin and SIGTERM (the Python SDK's), so the run ends sealed on the common close path."""
    server_id: str = "upstream"
    """The wrapped server's name in pins and evidence (``--server-id``)."""


@dataclass(eq=False, slots=True)
class Pending:
    """A request of the agent's (not a tools/call) relayed to the upstream, until its answer."""

    message: Message
    method: str


__all__ = ["OwnRequest", "Pending", "RelayConfig"]
