"""The call pipeline in this process, with a transport and an upstream the test plays.

``Upstream`` is a ``Forwarder`` that answers each call it is sent (an echo of its arguments, or what
the test scripts), ``Catalogue`` a ``Resolver`` over a fixed list of names, ``Agent`` a ``Replier``
that keeps what it is delivered. The pipeline under test is the real one; only the bytes around it
are played by the test.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio

from drawbridge.gateway.pipeline.call import CallPipeline, Flight, Resolved
from drawbridge.gateway.pipeline.floors import Route
from drawbridge.gateway.protocol.jsonrpc import Message, parse_client_message


@dataclass
class Upstream:
    """Answers every call it is sent with its arguments, unless ``hold`` names it (then the test settles it)."""

    pipeline: CallPipeline | None = None
    sent: list[Flight] = field(default_factory=list)
    abandoned: list[tuple[Flight, str, bool]] = field(default_factory=list)
    hold: set[str] = field(default_factory=set)

    def send(self, flight: Flight) -> None:
        self.sent.append(flight)
        assert flight.call is not None and self.pipeline is not None
        if flight.call.tool not in self.hold:
            text = json.dumps(dict(flight.call.arguments), sort_keys=True)
            self.pipeline.answered(flight, {"jsonrpc": "2.0", "id": flight.request_id, "result": {"content": [{"type": "text", "text": text}]}})

    def abandon(self, flight: Flight, reason: str, *, timed_out: bool) -> None:
        self.abandoned.append((flight, reason, timed_out))


@dataclass
class Catalogue:
    """Resolves the names in ``tools`` (all names when None) to ``server``'s ``upstream``."""

    upstream: Upstream
    tools: set[str] | None = None
    server: str = "srv"
    dispatchers: dict[str, Any] = field(default_factory=dict)
    """Names served by a CLI dispatcher, with its ``default_action`` (or None)."""

    def resolve_now(self, tool: str) -> Resolved | None:
        if self.tools is not None and tool not in self.tools:
            return None
        if tool in self.dispatchers:
            return Resolved(Route(self.server, tool, True, self.dispatchers[tool]), self.upstream)
        return Resolved(Route(self.server, tool), self.upstream)

    async def resolve(self, tool: str) -> Resolved | None:
        return self.resolve_now(tool)


@dataclass
class Agent:
    """The agent's side: asks in-band through ``ask`` when given; keeps what it is delivered."""

    ask: Callable[[Any, Mapping[str, Any]], Awaitable[Mapping[str, Any]]] | None = None
    delivered: list[Flight] = field(default_factory=list)
    session_id: str | None = None

    def elicit(self, flight: Flight) -> Any:
        return self.ask

    def deliver(self, flights: Sequence[Flight]) -> None:
        self.delivered.extend(flights)


def call_message(request_id: Any, tool: str, arguments: Mapping[str, Any] | None = None, **params: Any) -> Message:
    body = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
            "params": {"name": tool, "arguments": dict(arguments or {}), **params}}
    return parse_client_message(json.dumps(body).encode())


@dataclass
class Rig:
    pipeline: CallPipeline
    upstream: Upstream
    catalogue: Catalogue
    agent: Agent

    async def call(self, request_id: Any, tool: str, arguments: Mapping[str, Any] | None = None,
                   *, agent: str = "a", version: str | None = None, **params: Any) -> Flight:
        message = call_message(request_id, tool, arguments, **params)
        return await self.pipeline.call(message, agent=agent, version=version, replier=self.agent, resolver=self.catalogue)

    def start(self, request_id: Any, tool: str, arguments: Mapping[str, Any] | None = None,
              *, agent: str = "a", version: str | None = None) -> Flight:
        message = call_message(request_id, tool, arguments)
        return self.pipeline.start(message, agent=agent, version=version, replier=self.agent, resolver=self.catalogue)


@asynccontextmanager
async def running(pipeline: CallPipeline, *, tools: set[str] | None = None, ask: Any = None,
                  server: str = "srv", dispatchers: dict[str, Any] | None = None) -> AsyncIterator[Rig]:
    upstream = Upstream(pipeline)
    rig = Rig(pipeline, upstream, Catalogue(upstream, tools, server, dict(dispatchers or {})), Agent(ask))
    async with anyio.create_task_group() as tg:
        await tg.start(pipeline.run)
        yield rig
        tg.cancel_scope.cancel()
