"""Read deadlines and a connection cap for the gateway's HTTP listeners (``/mcp`` and the control plane).

Invariant: no peer holds a connection open by not sending. A request's line and headers arrive within
``header_read_seconds`` of the connection opening (or of the previous answer's end, on a kept-alive
connection), and its body within ``body_read_seconds`` of its headers; past either deadline the peer
is answered 408 (when no answer has started) and the connection is closed. At most
``max_connections`` connections are open on a listener at once: one more is answered 503 and closed
without a byte of it read (half-closed, so that the peer reads the answer). A request whose answer is
being made (an upstream call, an SSE stream) has no deadline here: how long that may take is the
gateway's (``limits.call_timeout_seconds``) and the agent's business, not the reader's.

Theory of operation. uvicorn's h11 protocol reads each connection; ``DeadlineProtocol`` extends it
with one timer per connection, re-armed after every batch of events it handles and after every
answer, according to what h11 says the peer owes: a request (``IDLE``: the header deadline) or the
rest of a body (``SEND_BODY``: the body deadline); once the request is read, no timer. uvicorn's own
keep-alive timeout still closes an idle kept-alive connection sooner.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from drawbridge.config import GatewayConfig
from drawbridge.config_limits import BODY_READ_SECONDS, HEADER_READ_SECONDS, MAX_CONNECTIONS

logger = logging.getLogger("drawbridge.gateway.http")


@dataclass(frozen=True)
class ListenerLimits:
    """How long a peer may take to send a request, and how many connections a listener holds
    (``limits.header_read_seconds``, ``limits.body_read_seconds``, ``limits.max_connections``)."""

    header_read_seconds: float = HEADER_READ_SECONDS
    body_read_seconds: float = BODY_READ_SECONDS
    max_connections: int = MAX_CONNECTIONS

    @classmethod
    def from_config(cls, config: GatewayConfig) -> ListenerLimits:
        return cls(config.header_read_seconds, config.body_read_seconds, config.max_connections)


def _plain(status: str, text: str, *extra: str) -> bytes:
    """A whole ``connection: close`` answer, written before (or instead of) any request is read."""
    body = text.encode("ascii")
    head = [f"HTTP/1.1 {status}", "content-type: text/plain; charset=utf-8", "connection: close",
            f"content-length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode("ascii") + body


_TIMED_OUT: Final = _plain("408 Request Timeout", "the request did not arrive in time; connection closed\n")
_FULL: Final = _plain(
    "503 Service Unavailable", "the listener holds as many connections as it may (limits.max_connections)\n",
    "retry-after: 5",
)


class DeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with the deadlines and the cap of the module docstring."""

    def __init__(self, *args: Any, limits: ListenerLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._limits = limits
        self._timer: asyncio.TimerHandle | None = None
        self._owed: str | None = None
        """What the timer waits for: "header", "body", or None (nothing owed by the peer)."""
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self._limits.max_connections:
            logger.warning(
                "refused a connection from %s: the listener holds limits.max_connections (%d) already",
                peer_text(self.client), self._limits.max_connections,
            )
            # Answered and half-closed, not reset: what the peer sent is read and dropped until it closes
            # (or the header deadline passes), so that the 503 reaches it rather than a reset.
            self._refused = True
            transport.write(_FULL)
            transport.write_eof()
            self._timer = self.loop.call_later(self._limits.header_read_seconds, transport.close)
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        if not self._refused:
            super().data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def _arm(self) -> None:
        if self._refused:
            return
        if self.transport is None or self.transport.is_closing():
            self._disarm()
            return
        state = self.conn.their_state
        owed = "header" if state is h11.IDLE else "body" if state is h11.SEND_BODY else None
        if owed == self._owed:
            return
        self._disarm()
        self._owed = owed
        if owed is not None:
            seconds = self._limits.header_read_seconds if owed == "header" else self._limits.body_read_seconds
            self._timer = self.loop.call_later(seconds, self._expired, owed)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._owed = None, None

    def _expired(self, owed: str) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        key = "header_read_seconds" if owed == "header" else "body_read_seconds"
        what = "its request headers" if owed == "header" else "the body its headers announced"
        logger.info(
            "closed a connection from %s: %s did not arrive within %s s (limits.%s)",
            peer_text(self.client), what, getattr(self._limits, key), key,
        )
        if owed == "header" or self.cycle is None or not self.cycle.response_started:
            self.transport.write(_TIMED_OUT)
        self.transport.close()


def peer_text(client: tuple[str, int] | None) -> str:
    """A peer's address as the log lines name it."""
    return f"{client[0]}:{client[1]}" if client else "an unknown peer"


def protocol_for(limits: ListenerLimits) -> Callable[..., asyncio.Protocol]:
    """What uvicorn makes each connection's protocol with (its ``http`` setting)."""
    return functools.partial(DeadlineProtocol, limits=limits)


__all__ = ["DeadlineProtocol", "ListenerLimits", "peer_text", "protocol_for"]
