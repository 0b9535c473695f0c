"""What an agent asks to be told of: ``resources/subscribe`` and ``resources/unsubscribe`` (handshake
era), and the 2026-07-28 ``subscriptions/listen`` streams.

Invariant: one agent's subscriptions never end another's updates. Every subscriber (an agent
connection, or a listen stream) joins and leaves the book on its own (``subscriptions.py``); the
upstream hears only the first subscribe and the last unsubscribe of a URI
(``upstream_subscriptions.py``), and the others are answered here. A listen stream acknowledges only
what it will relay: the list changes asked for, and the resources whose URI routes to an upstream that
subscribed to it.

Theory of operation. A listen stream is one agent request that stays open: the hub publishes to it
(``listen_streams.py``) and this handler relays each event, tagged with the stream's id, on that
request's response stream, until the agent closes it or the stream ends; then its subscriptions are
released and the request gets its result. Without a response stream (HTTP without
``Accept: text/event-stream``) a listen request is refused at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from drawbridge.gateway.protocol.jsonrpc import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    MessageError,
)
from drawbridge.gateway.protocol.methods import (
    LISTEN_ACKNOWLEDGED,
    PROMPTS_LIST_CHANGED,
    RESOURCES_LIST_CHANGED,
    RESOURCES_SUBSCRIBE,
    TOOLS_LIST_CHANGED,
)
from drawbridge.gateway.serve.catalogue_routes import uri_route
from drawbridge.gateway.serve.downstream_session import (
    DownstreamSession,
    Inflight,
    error_response,
    result_response,
)

SUBSCRIPTION_ID_META_KEY: Final = "io.modelcontextprotocol/subscriptionId"
NO_LISTEN_STREAM: Final = "invalid request: subscriptions/listen needs a response stream (Accept: text/event-stream)"
LISTEN_EVENTS: Final[Mapping[str, str]] = {
    "toolsListChanged": TOOLS_LIST_CHANGED,
    "promptsListChanged": PROMPTS_LIST_CHANGED,
    "resourcesListChanged": RESOURCES_LIST_CHANGED,
}
"""The list changes a 2026-07-28 agent can listen for, by the filter field that asks for them."""


def _notification(method: str, params: Mapping[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": dict(params)}


async def subscribe(session: DownstreamSession, entry: Inflight) -> dict[str, Any]:
    """``resources/subscribe`` and ``resources/unsubscribe``: the upstream hears the first
    subscribe and the last unsubscribe of a URI (``subscriptions.py``); the others are answered
    here, so one agent's unsubscribe never ends another's updates."""
    params = entry.message.params if isinstance(entry.message.params, dict) else {}
    uri = params.get("uri")
    upstream = await uri_route(session, entry, uri)
    assert isinstance(uri, str)
    subscriptions = session.gateway.subscriptions

    async def relay() -> dict[str, Any]:
        if not upstream.modern:
            return await session.relay(entry, upstream, params)
        # 2026-07-28 upstreams take no resources/subscribe: the gateway changes its listen stream.
        if entry.message.method == RESOURCES_SUBSCRIBE:
            body = await subscriptions.subscribe_upstream(upstream, uri)
        else:
            body = await subscriptions.unsubscribe_upstream(upstream, uri)
        return session.answer(entry, body) if "error" in body else session.result(entry, {})

    if entry.message.method == RESOURCES_SUBSCRIBE:
        answer = await subscriptions.join(upstream.name, uri, session, relay)
    else:
        answer = await subscriptions.leave(upstream.name, uri, session, relay)
    return answer if answer is not None else session.result(entry, {})


async def listen(session: DownstreamSession, entry: Inflight) -> dict[str, Any]:
    """``subscriptions/listen`` (2026-07-28): acknowledge what is honored, then relay the list
    changes and resource updates asked for, tagged with the stream's id, until the agent cancels
    (closes) it or the gateway stops (then the result ends the stream). A resource is honored
    when its URI routes to an upstream that subscribes to it (the stream is then one of its
    subscribers, ``subscriptions.py``); the others are left out of the acknowledgement."""
    message = entry.message
    assert message.id is not None
    if not entry.modern:
        return await session.refuse(
            message.id, METHOD_NOT_FOUND,
            "method not found: subscriptions/listen is part of 2026-07-28; this session is told of "
            "changes by list_changed notifications",
        )
    params = message.params if isinstance(message.params, dict) else {}
    wanted = params.get("notifications")
    if not isinstance(wanted, dict):
        said = "invalid params: notifications must be an object"
        return await session.refuse(message.id, INVALID_PARAMS, said)
    honored: dict[str, Any] = {}
    methods: set[str] = set()
    for field_name, method in LISTEN_EVENTS.items():
        value = wanted.get(field_name)
        if value is not None and not isinstance(value, bool):
            said = f"invalid params: {field_name} must be a boolean"
            return await session.refuse(message.id, INVALID_PARAMS, said)
        if value:
            honored[field_name] = True
            methods.add(method)
    uris = wanted.get("resourceSubscriptions")
    if uris is not None and not (isinstance(uris, list) and all(isinstance(uri, str) for uri in uris)):
        return await session.refuse(
            message.id, INVALID_PARAMS, "invalid params: resourceSubscriptions must be a list of strings"
        )
    has_stream = getattr(session.outbound, "has_stream", None)
    if has_stream is not None and not has_stream(message.id):
        return await session.refuse(message.id, INVALID_REQUEST, NO_LISTEN_STREAM)
    meta = {SUBSCRIPTION_ID_META_KEY: message.id}
    streams = session.gateway.listen_streams
    token, events = streams.listen(frozenset(methods))
    try:
        asked = dict.fromkeys(uris or ())
        subscribed = [uri for uri in asked if await _listen_to(session, entry, token, uri)]
        if subscribed:
            honored["resourceSubscriptions"] = subscribed
        ack = {"notifications": honored, "_meta": meta}
        if not await session.emit(_notification(LISTEN_ACKNOWLEDGED, ack), message.id):
            return error_response(message.id, INVALID_REQUEST, NO_LISTEN_STREAM)
        async with events:
            async for method, params in events:
                if not await session.emit(_notification(method, {**params, "_meta": meta}), message.id):
                    break
    finally:
        streams.unlisten(token)
    return result_response(message.id, {"_meta": meta})


async def _listen_to(session: DownstreamSession, entry: Inflight, token: object, uri: str) -> bool:
    """Make a listen stream a subscriber of ``uri``; False when no upstream serves it or the
    one that does would not subscribe."""
    try:
        upstream = await uri_route(session, entry, uri)
    except MessageError:
        return False
    subscriptions = session.gateway.subscriptions

    async def subscribe() -> dict[str, Any]:
        return await subscriptions.subscribe_upstream(upstream, uri)

    answer = await subscriptions.join(upstream.name, uri, token, subscribe)
    return answer is None or "result" in answer


__all__ = ["LISTEN_EVENTS", "NO_LISTEN_STREAM", "SUBSCRIPTION_ID_META_KEY", "listen", "subscribe"]
