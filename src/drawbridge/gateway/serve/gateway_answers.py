"""The requests the gateway answers itself, without asking an upstream: ``initialize``, ``ping``,
``server/discover``, ``tools/list`` and ``logging/setLevel``.

In the 2026-07-28 era ``ping`` and ``logging/setLevel`` do not exist (the changelog removes them; the
log level rides on each request's ``_meta``): the session refuses a 2026-07-28 request for either
before it reaches a handler here (-32601, ``methods.REMOVED_BY_MODERN``), and a tools/list for a
2026-07-28 agent leaves out the tools that run only as tasks (``protocol.tasks.task_only``: every call
to one would fail).

Invariant: to an agent the gateway is one server, ``drawbridge``: its capabilities are the union of
what the upstreams offer, its instructions theirs combined, and its tool list the merged catalogue as
this agent may see it (``Gateway.listing_for``; hiding a tool changes no decision). Nothing here
reaches an upstream: the upstream sessions are shared, so one agent's ``logging/setLevel``
is acknowledged and not forwarded, and a ``tools/list`` cursor the gateway never issued is refused.

Theory of operation. ``initialize`` fixes the session's era and remembers the capabilities the agent
declared (the approval gate asks in-band only when it declared form elicitation, ``tool_calls.py``);
a 2026-07-28 agent sends none and learns the same from ``server/discover``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import drawbridge
from drawbridge.gateway.protocol.eras import SERVED_VERSIONS, negotiate_version
from drawbridge.gateway.protocol.hop import gateway_result
from drawbridge.gateway.protocol.jsonrpc import INVALID_PARAMS, INVALID_REQUEST
from drawbridge.gateway.protocol.methods import DISCOVER
from drawbridge.gateway.protocol.tasks import task_only
from drawbridge.gateway.serve.downstream_session import (
    DownstreamSession,
    Inflight,
    result_response,
)
from drawbridge.gateway.serve.envelope import INITIALIZE_REFUSAL

SERVER_INFO: Final[Mapping[str, str]] = {"name": "drawbridge", "version": drawbridge.__version__}
SERVER_INFO_META_KEY: Final = "io.modelcontextprotocol/serverInfo"
NO_SUCH_CURSOR: Final = "invalid params: the gateway issued no such cursor"
ALREADY_INITIALIZED: Final = "invalid request: the session is already initialized"
TASKS_VERSION: Final = "2025-11-25"
"""The first version with tasks; the gateway declares them to no older session."""


async def initialize(session: DownstreamSession, entry: Inflight) -> dict[str, Any]:
    message = entry.message
    if entry.modern:
        return await session.refuse(message.id, INITIALIZE_REFUSAL.code, INITIALIZE_REFUSAL.message)
    if session.version is not None:
        return await session.refuse(message.id, INVALID_REQUEST, ALREADY_INITIALIZED)
    params = message.params if isinstance(message.params, dict) else {}
    session.version = negotiate_version(params.get("protocolVersion"))
    capabilities = params.get("capabilities")
    session.client_capabilities = dict(capabilities) if isinstance(capabilities, dict) else {}
    result: dict[str, Any] = {
        "protocolVersion": session.version,
        "capabilities": session.gateway.capabilities(tasks=session.version >= TASKS_VERSION),
        "serverInfo": dict(SERVER_INFO),
    }
    instructions = session.gateway.instructions()
    if instructions is not None:
        result["instructions"] = instructions
    return session.result(entry, result)


async def discover(session: DownstreamSession, entry: Inflight) -> dict[str, Any]:
    result: dict[str, Any] = {
        "supportedVersions": list(SERVED_VERSIONS),
        "capabilities": session.gateway.capabilities(),
        "_meta": {SERVER_INFO_META_KEY: dict(SERVER_INFO)},
    }
    instructions = session.gateway.instructions()
    if instructions is not None:
        result["instructions"] = instructions
    return result_response(
        entry.message.id,  # type: ignore[arg-type]
        gateway_result(result, method=DISCOVER, modern=True),
    )


async def acknowledge(session: DownstreamSession, entry: Inflight) -> dict[str, Any]:
    """``ping`` and ``logging/setLevel`` of a handshake-era session: an empty result (2026-07-28 has
    neither, and the session refuses them there)."""
    return session.result(entry, {})


async def tools_list(session: DownstreamSession, entry: Inflight) -> dict[str, Any]:
    params = entry.message.params
    if isinstance(params, dict) and params.get("cursor") is not None:
        return await session.refuse(entry.message.id, INVALID_PARAMS, NO_SUCH_CURSOR)
    # Per agent: under hide_denied_tools the list leaves out what the agent could only be refused
    # (calls are still decided). gateway_result marks 2026-07-28 lists cacheScope "private".
    tools = session.gateway.listing_for(session.agent)
    if entry.modern:  # its calls are never tasks: a tool that runs only as one could only fail
        tools = [tool for tool in tools if not task_only(tool)]
    return session.result(entry, {"tools": tools})


__all__ = ["SERVER_INFO", "SERVER_INFO_META_KEY", "acknowledge", "discover", "initialize", "tools_list"]
