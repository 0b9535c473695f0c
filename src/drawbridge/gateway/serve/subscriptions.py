"""Who wants updates of which resource, on upstream sessions that every agent shares.

Invariant: the gateway keeps an upstream subscribed to a URI exactly while at least one subscriber
wants it. A subscriber is an agent connection that sent ``resources/subscribe`` (handshake era) or a
2026-07-28 ``subscriptions/listen`` stream that asked for the URI. To the upstream the gateway is one
client: the first subscriber subscribes it, the last one to leave unsubscribes it, and no agent's
unsubscribe (or disconnect) ends another's updates.

This module only keeps the book; ``upstream_subscriptions.py`` asks the upstreams, and the hub
(``hub.py``) delivers the updates.
"""

from __future__ import annotations

Key = tuple[str, str]
"""(upstream name, resource URI)."""


class Subscriptions:
    def __init__(self) -> None:
        self._by_key: dict[Key, set[object]] = {}

    def wanted(self, upstream: str, uri: str) -> bool:
        """Someone wants updates of ``uri`` from ``upstream`` (so the upstream is subscribed)."""
        return bool(self._by_key.get((upstream, uri)))

    def add(self, upstream: str, uri: str, subscriber: object) -> None:
        self._by_key.setdefault((upstream, uri), set()).add(subscriber)

    def drop(self, upstream: str, uri: str, subscriber: object) -> None:
        subscribers = self._by_key.get((upstream, uri))
        if subscribers is not None:
            subscribers.discard(subscriber)
            if not subscribers:
                del self._by_key[(upstream, uri)]

    def drop_all(self, subscriber: object) -> list[Key]:
        """Forget ``subscriber`` everywhere; the keys nobody wants any more."""
        left: list[Key] = []
        for key, subscribers in list(self._by_key.items()):
            if subscriber in subscribers:
                subscribers.discard(subscriber)
                if not subscribers:
                    del self._by_key[key]
                    left.append(key)
        return left

    def subscribers(self, upstream: str, uri: str) -> list[object]:
        return list(self._by_key.get((upstream, uri), ()))

    def uris_of(self, upstream: str) -> list[str]:
        """The URIs the upstream must be subscribed to (again, after it reconnected)."""
        return [uri for name, uri in self._by_key if name == upstream]


__all__ = ["Key", "Subscriptions"]
