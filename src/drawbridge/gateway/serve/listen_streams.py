"""The open 2026-07-28 ``subscriptions/listen`` streams, as the hub publishes events to them.

Invariant: a listen stream receives only the notification methods it asked for (and the resource
updates of the URIs it subscribed to, which the hub delivers by its token), and never blocks the hub:
its queue holds ``LISTEN_BACKLOG`` events, and a stream whose agent stops reading is ended there rather
than waited for. However a stream ends, its subscriptions are released (``on_end``), so no upstream
stays subscribed for a stream that is gone.

Theory of operation. ``subscription_routes.py`` opens a stream for one agent request and relays what
arrives on it until the agent closes it or the stream ends; the token it gets is also the stream's
identity as a subscriber of resources (``upstream_subscriptions.py``). Ending a stream closes its
queue, so the agent's request gets its result.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc

logger = logging.getLogger("drawbridge.gateway")

LISTEN_BACKLOG = 256
"""Events a 2026-07-28 listen stream may hold unsent; a stream whose agent stops reading is ended
there (the agent listens again and refetches: events are not replayed)."""

Event = tuple[str, dict[str, Any]]
"""(notification method, params) as a listen stream receives it."""


@dataclass(eq=False)
class _Listener:
    """One ``subscriptions/listen`` stream: the notification methods it takes, and its queue."""

    methods: frozenset[str]
    send: anyio.abc.ObjectSendStream[Event]


class ListenStreams:
    """The hub's listen streams, by token (module docstring)."""

    def __init__(self, on_end: Callable[[object], None]) -> None:
        self._on_end = on_end
        self._listeners: dict[object, _Listener] = {}

    def __contains__(self, token: object) -> bool:
        return token in self._listeners

    def listen(self, methods: frozenset[str]) -> tuple[object, anyio.abc.ObjectReceiveStream[Event]]:
        """Open a listen stream for these notification methods: its token (also the subscriber of
        the resources it asks for, ``UpstreamSubscriptions.join``) and the (method, params) it receives."""
        send, receive = anyio.create_memory_object_stream[Event](LISTEN_BACKLOG)
        token = object()
        self._listeners[token] = _Listener(methods, send)
        return token, receive

    def unlisten(self, token: object) -> None:
        listener = self._listeners.pop(token, None)
        if listener is not None:
            listener.send.close()
        self._on_end(token)

    def unlisten_all(self) -> None:
        """End every stream gracefully, with its result (the gateway is closing)."""
        for token in list(self._listeners):
            self.unlisten(token)

    def publish(self, method: str) -> None:
        for token, listener in list(self._listeners.items()):
            if method in listener.methods:
                self.deliver(token, (method, {}))

    def deliver(self, token: object, event: Event) -> None:
        listener = self._listeners.get(token)
        if listener is None:
            return
        try:
            listener.send.send_nowait(event)
        except anyio.WouldBlock:
            logger.warning("a listen stream's agent stopped reading; the stream is ended")
            self.unlisten(token)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._listeners.pop(token, None)
            self._on_end(token)


__all__ = ["LISTEN_BACKLOG", "Event", "ListenStreams"]
