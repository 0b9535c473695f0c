"""A request the gateway has in flight to an upstream, and the two ways it can fail to be answered.

Invariant: a ``PendingCall`` ends exactly once: ``complete`` with the upstream's response, ``dropped``
when that response was a line the gateway could not read (an error of the gateway's in its place), or
``fail`` with the reason the connection ended first; whichever comes second is ignored, and every callback
given to ``when_done`` runs once, as it ends. A lost call says so (``UpstreamLost``) and never
pretends to have an answer.

Theory of operation. The session (``session.UpstreamSession``) makes a ``PendingCall`` for every
request it sends and keeps it by id until the link (``stdio_link.StdioLink``, ``http_link.HttpLink``)
hands back the answer through ``Deliver``. ``UpstreamUnavailable`` is raised before anything is
sent (the upstream is not ready); ``UpstreamLost`` after, when the connection that received the
request ended without answering it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio

from drawbridge.gateway.protocol.jsonrpc import INTERNAL_ERROR, Oversize, encode_line


class UpstreamUnavailable(Exception):
    """The upstream is not connected now; the message says why and when it is tried again."""


class UpstreamLost(Exception):
    """The connection ended before the upstream answered."""


@dataclass(eq=False)
class PendingCall:
    """A request in flight to the upstream; ``wait`` returns the whole response message (a dict), and
    callbacks given to ``when_done`` run (synchronously) as it ends, answered or lost."""

    id: int
    method: str
    generation: int
    _done: anyio.Event = field(default_factory=anyio.Event)
    _body: dict[str, Any] | None = None
    _lost: str | None = None
    _callbacks: list[Callable[[PendingCall], None]] = field(default_factory=list)
    unreadable: str | None = None
    """Why the upstream's answer was dropped unread (too large, not UTF-8), when it was: the request
    then ended with an internal error of the gateway's that says so (``dropped``)."""

    def complete(self, body: dict[str, Any]) -> None:
        if not self._done.is_set():
            self._body = body
            self._end()

    def dropped(self, detail: str) -> None:
        """The upstream answered with a line that had to be dropped: the answer is an internal error
        (-32603) naming the problem, never anything of the line's."""
        if not self._done.is_set():
            self.unreadable = detail
            self._body = {"jsonrpc": "2.0", "id": self.id, "error": {"code": INTERNAL_ERROR, "message": detail}}
            self._end()

    def fail(self, reason: str) -> None:
        if not self._done.is_set():
            self._lost = reason
            self._end()

    def _end(self) -> None:
        self._done.set()
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)

    def when_done(self, callback: Callable[[PendingCall], None]) -> None:
        """Run ``callback(self)`` when the request ends (at once if it has)."""
        if self._done.is_set():
            callback(self)
        else:
            self._callbacks.append(callback)

    def outcome(self) -> dict[str, Any]:
        """The response of an ended request; raises ``UpstreamLost`` when it was lost."""
        if self._body is None:
            raise UpstreamLost(self._lost or "the connection ended")
        return self._body

    @property
    def done(self) -> bool:
        return self._done.is_set()

    async def wait(self) -> dict[str, Any]:
        await self._done.wait()
        return self.outcome()


Deliver = Callable[["bytes | Oversize", "int | None"], Awaitable[bool]]
"""Hand one message (JSON bytes, or what is left of a line too large to read) to the session; True
when it was the response to ``related``."""


def render(message: Mapping[str, Any]) -> bytes:
    """One message as a JSON line (ASCII; refuses NaN, which the strict client parser never lets in)."""
    return encode_line(message)


__all__ = ["Deliver", "PendingCall", "UpstreamLost", "UpstreamUnavailable", "render"]
