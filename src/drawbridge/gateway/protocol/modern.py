"""What the gateway says to an upstream in the 2026-07-28 era, and how it reads the answers (pure).

Invariant: every request and notification the gateway sends such an upstream carries the gateway's
own envelope in ``_meta`` (protocol version, client info, client capabilities), whatever the agent's
era: the envelope describes this hop (``hop.py`` removes the agent's before forwarding). The one
exception is the client capabilities of a request made for a 2026-07-28 agent, which are what that
agent declared it can answer (``hop.outbound_params``): the upstream's ``inputRequests`` go to the
agent as they are, and may only be of kinds it declared.

Theory of operation. There is no handshake: ``server/discover`` tells the supported versions, the
capabilities and the instructions, and every later request stands alone. The upstream tells of
changes only on a ``subscriptions/listen`` stream, so the session keeps one open for the list
changes of tools, prompts and resources and for the resources agents subscribed to
(``listen_filter``); the events on it carry the stream's id, which belongs to that hop and is taken
off before they go on (``without_subscription_id``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import drawbridge
from drawbridge.gateway.protocol.eras import CLIENT_CAPABILITIES_META_KEY, MODERN_VERSION, RESERVED_PREFIX

SUBSCRIPTION_ID_KEY: Final = RESERVED_PREFIX + "subscriptionId"
SERVER_INFO_KEY: Final = RESERVED_PREFIX + "serverInfo"


def envelope(client_capabilities: Mapping[str, Any]) -> dict[str, Any]:
    return {
        RESERVED_PREFIX + "protocolVersion": MODERN_VERSION,
        RESERVED_PREFIX + "clientInfo": {"name": "drawbridge", "version": drawbridge.__version__},
        RESERVED_PREFIX + "clientCapabilities": dict(client_capabilities),
    }


def with_envelope(params: Any, hop: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` with the gateway's envelope in ``_meta`` (other ``_meta`` keys kept, and the client
    capabilities an agent declared, where ``hop.outbound_params`` left them: module docstring)."""
    params = dict(params) if isinstance(params, Mapping) else {}
    meta = params.get("_meta")
    meta = meta if isinstance(meta, Mapping) else {}
    declared = {k: v for k, v in meta.items() if k == CLIENT_CAPABILITIES_META_KEY}
    params["_meta"] = {**meta, **hop, **declared}
    return params


MISMATCH_WORDS: Final = " header does not match "


def header_missing_said(message: str, headers: Mapping[str, str]) -> str:
    """An SDK header-mismatch message (-32020) that names a routing header the request did not send
    at all, reworded to say that it is missing rather than that it does not match the body.
    ``headers`` are the request's, by lowercase name."""
    name, found, rest = message.partition(MISMATCH_WORDS)
    if not found or name.lower() in headers:
        return message
    return f"{name} header is missing; 2026-07-28 requires it, equal to {rest}"


def read_discover(result: Any) -> tuple[dict[str, Any], dict[str, Any] | None, str | None]:
    """(capabilities, server info, instructions) of a ``server/discover`` result; ``ValueError``
    naming the problem when the upstream cannot be spoken to in this era."""
    if not isinstance(result, Mapping):
        raise ValueError("server/discover gave no result")
    versions = result.get("supportedVersions")
    if not isinstance(versions, list) or MODERN_VERSION not in versions:
        raise ValueError(f"the upstream does not list {MODERN_VERSION} among its supported versions")
    capabilities = result.get("capabilities")
    meta = result.get("_meta")
    info = meta.get(SERVER_INFO_KEY) if isinstance(meta, Mapping) else None
    instructions = result.get("instructions")
    return (
        dict(capabilities) if isinstance(capabilities, Mapping) else {},
        dict(info) if isinstance(info, Mapping) else None,
        instructions if isinstance(instructions, str) else None,
    )


def listen_filter(uris: Iterable[str]) -> dict[str, Any]:
    """The ``subscriptions/listen`` filter: every list change, and updates of these resources."""
    wanted: dict[str, Any] = {
        "toolsListChanged": True, "promptsListChanged": True, "resourcesListChanged": True,
    }
    resources = sorted(set(uris))
    if resources:
        wanted["resourceSubscriptions"] = resources
    return {"notifications": wanted}


def subscription_id(body: Mapping[str, Any]) -> Any:
    params = body.get("params")
    meta = params.get("_meta") if isinstance(params, Mapping) else None
    return meta.get(SUBSCRIPTION_ID_KEY) if isinstance(meta, Mapping) else None


def honored_uris(body: Mapping[str, Any]) -> frozenset[str]:
    """The resource URIs a ``notifications/subscriptions/acknowledged`` says are honored."""
    params = body.get("params")
    notifications = params.get("notifications") if isinstance(params, Mapping) else None
    uris = notifications.get("resourceSubscriptions") if isinstance(notifications, Mapping) else None
    return frozenset(uri for uri in uris if isinstance(uri, str)) if isinstance(uris, list) else frozenset()


def without_subscription_id(body: Mapping[str, Any]) -> dict[str, Any]:
    """An event of the listen stream as it goes on: the stream's id taken off its ``_meta``."""
    params = body.get("params")
    if not isinstance(params, Mapping) or not isinstance(params.get("_meta"), Mapping):
        return dict(body)
    meta = {key: value for key, value in params["_meta"].items() if key != SUBSCRIPTION_ID_KEY}
    rest = {key: value for key, value in params.items() if key != "_meta"}
    return {**body, "params": {**rest, **({"_meta": meta} if meta else {})}}


__all__ = [
    "SUBSCRIPTION_ID_KEY",
    "header_missing_said",
    "envelope",
    "honored_uris",
    "listen_filter",
    "read_discover",
    "subscription_id",
    "with_envelope",
    "without_subscription_id",
]
