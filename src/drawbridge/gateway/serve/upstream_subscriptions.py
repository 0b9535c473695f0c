"""The upstream side of resource subscriptions: asking the shared upstream sessions for the updates
that agents want, and nothing more.

Invariant: what an upstream hears follows the book (``subscriptions.py``) in the order the book
changed: it is subscribed to a URI when the first subscriber joins, and unsubscribed when the last one
leaves, each change made while holding one lock, so that a subscribe and an unsubscribe of the same URI
never reach the upstream in the other order. A subscriber joins only if the upstream accepted.

Theory of operation. A handshake-era upstream takes ``resources/subscribe`` and
``resources/unsubscribe``; a 2026-07-28 upstream takes none, and the gateway changes the resources of
its own listen stream to that upstream instead (``watch_resources``). Subscribers are agent connections
and listen streams (``subscription_routes.py``); when one is gone the hub drops it from the book and
unsubscribes the upstream from what nobody wants any more (``unsubscribe_unwanted``, in the
background). A handshake-era upstream that reconnected is subscribed again to what is still wanted
(``resubscribe``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio

from drawbridge.gateway.protocol.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS
from drawbridge.gateway.protocol.methods import RESOURCES_SUBSCRIBE, RESOURCES_UNSUBSCRIBE
from drawbridge.gateway.serve.subscriptions import Key, Subscriptions
from drawbridge.gateway.upstreams.requests import UpstreamLost, UpstreamUnavailable
from drawbridge.gateway.upstreams.session import UpstreamSession

logger = logging.getLogger("drawbridge.gateway")

Ask = Callable[[], Awaitable[dict[str, Any]]]
"""A request to the upstream made only when the book says it is due: its answer, result or error."""


class UpstreamSubscriptions:
    """The book of subscribers, and the upstream requests that keep it true (module docstring)."""

    def __init__(self, upstreams: Mapping[str, UpstreamSession], *, call_timeout: float) -> None:
        self._upstreams = upstreams
        self._call_timeout = call_timeout
        self.book = Subscriptions()
        self._subscribing = anyio.Lock()
        """Held while a subscription changes, so that the upstream hears subscribe and unsubscribe
        in the order the book changed."""

    async def join(
        self, upstream: str, uri: str, subscriber: object, subscribe: Ask
    ) -> dict[str, Any] | None:
        """Add a subscriber of ``uri`` on ``upstream``. When nobody wanted it yet, ``subscribe()``
        asks the upstream first, and the subscriber is added only if it answered with a result;
        returns that answer, or None when the upstream was subscribed already."""
        async with self._subscribing:
            if self.book.wanted(upstream, uri):
                self.book.add(upstream, uri, subscriber)
                return None
            answer = await subscribe()
            if "result" in answer:
                self.book.add(upstream, uri, subscriber)
            return answer

    async def leave(
        self, upstream: str, uri: str, subscriber: object, unsubscribe: Ask
    ) -> dict[str, Any] | None:
        """Drop a subscriber. When nobody wants the URI any more (or nobody did), ``unsubscribe()``
        tells the upstream and its answer is returned; None while others still want it."""
        async with self._subscribing:
            self.book.drop(upstream, uri, subscriber)
            if self.book.wanted(upstream, uri):
                return None
            return await unsubscribe()

    async def subscribe_upstream(self, upstream: UpstreamSession, uri: str) -> dict[str, Any]:
        """The gateway's own request that the upstream send updates of ``uri``: ``resources/subscribe``,
        or, in the 2026-07-28 era, ``uri`` among the resources of its listen stream. Its answer."""
        if upstream.modern:
            return await self._watch(upstream, {*self.book.uris_of(upstream.name), uri}, uri)
        return await self.ask_upstream(upstream, RESOURCES_SUBSCRIBE, {"uri": uri})

    async def unsubscribe_upstream(self, upstream: UpstreamSession, uri: str) -> dict[str, Any]:
        if upstream.modern:
            return await self._watch(upstream, set(self.book.uris_of(upstream.name)) - {uri}, None)
        return await self.ask_upstream(upstream, RESOURCES_UNSUBSCRIBE, {"uri": uri})

    async def _watch(self, upstream: UpstreamSession, uris: set[str], wanted: str | None) -> dict[str, Any]:
        try:
            honored = await upstream.watch_resources(frozenset(uris))
        except (UpstreamUnavailable, UpstreamLost, TimeoutError) as exc:
            problem = f"the upstream's listen stream could not be changed: {exc}"
            return {"error": {"code": INTERNAL_ERROR, "message": problem}}
        if wanted is not None and wanted not in honored:
            problem = "the upstream does not send updates of this resource"
            return {"error": {"code": INVALID_PARAMS, "message": problem}}
        return {"result": {}}

    async def unsubscribe_unwanted(self, key: Key) -> None:
        name, uri = key
        upstream = self._upstreams.get(name)
        async with self._subscribing:
            if upstream is not None and not self.book.wanted(name, uri):
                await self.unsubscribe_upstream(upstream, uri)

    async def resubscribe(self, upstream: UpstreamSession) -> None:
        if upstream.modern:
            return  # its session opens its listen stream with the resources watched (upstreams/listen_stream.py)
        async with self._subscribing:
            for uri in self.book.uris_of(upstream.name):
                answer = await self.ask_upstream(upstream, RESOURCES_SUBSCRIBE, {"uri": uri})
                if "result" not in answer:
                    logger.warning("upstream %r refused to subscribe again to a resource after reconnecting",
                                   upstream.name)

    async def ask_upstream(
        self, upstream: UpstreamSession, method: str, params: dict[str, Any]
    ) -> dict[str, Any]:
        """A request of the gateway's own: the upstream's answer, or an error body when it could not
        answer (unavailable, lost, too slow)."""
        try:
            return await upstream.request(method, params, timeout=self._call_timeout)
        except (UpstreamUnavailable, UpstreamLost, TimeoutError) as exc:
            return {"error": {"code": INTERNAL_ERROR, "message": f"{method} could not be sent: {exc}"}}


__all__ = ["Ask", "UpstreamSubscriptions"]
