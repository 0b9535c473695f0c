"""Where an HTTP session's messages to its agent wait: a mailbox per SSE stream, and which one.

Invariant: a message for the agent never blocks the gateway part that sends it: a mailbox is bounded,
and when it is full the oldest message is dropped (with a warning), never the sender held. A message
about a request goes to the SSE stream of the POST that carried that request, if that POST accepted
one; otherwise, on a session that may be sent to unasked, to the session's own mailbox (which its
GET stream drains); else nowhere.

Theory of operation. The ``DownstreamSession`` sends through its ``HttpOutbound``; the endpoint
(``http_endpoint.McpEndpoint``) registers a mailbox in ``streams`` for every POST answered as SSE
and removes it when the answer is written, and the GET stream drains ``mailbox``. A 2026-07-28
exchange is not sent to unasked (``unsolicited`` False): it has no GET stream.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any, Final

import anyio

from drawbridge.gateway.protocol.jsonrpc import RequestId, id_key

logger = logging.getLogger("drawbridge.gateway.http")

MAILBOX_SIZE: Final = 1024


class Mailbox:
    """A bounded queue that never blocks the sender: when full, the oldest message is dropped."""

    def __init__(self, size: int = MAILBOX_SIZE) -> None:
        self._items: deque[dict[str, Any]] = deque(maxlen=size)
        self._event = anyio.Event()
        self.closed = False

    def put(self, item: dict[str, Any]) -> None:
        if self.closed:
            return
        if len(self._items) == self._items.maxlen:
            logger.warning("a message queue for an agent is full; the oldest message was dropped")
        self._items.append(item)
        self._event.set()

    def close(self) -> None:
        self.closed = True
        self._event.set()

    def drain(self) -> list[dict[str, Any]]:
        items = list(self._items)
        self._items.clear()
        self._event = anyio.Event()
        return items

    async def wait(self, timeout: float | None = None) -> None:
        if self._items or self.closed:
            return
        with anyio.move_on_after(timeout):
            await self._event.wait()


class HttpOutbound:
    """Routes a session's messages: onto the SSE stream of the POST they belong to, else the GET stream."""

    def __init__(self, unsolicited: bool) -> None:
        self.unsolicited = unsolicited
        self.streams: dict[Any, Mailbox] = {}
        self.mailbox = Mailbox()

    def has_stream(self, related: RequestId) -> bool:
        """Whether messages about this request reach the agent (its POST accepted an SSE answer)."""
        return id_key(related) in self.streams or self.unsolicited

    async def send(self, message: dict[str, Any], related: RequestId | None) -> None:
        if related is not None and (box := self.streams.get(id_key(related))) is not None:
            box.put(message)
            return
        if self.unsolicited:
            self.mailbox.put(message)


__all__ = ["MAILBOX_SIZE", "HttpOutbound", "Mailbox"]
