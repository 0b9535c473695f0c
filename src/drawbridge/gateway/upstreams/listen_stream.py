"""2026-07-28: the one ``subscriptions/listen`` stream through which an upstream tells its changes.

Invariant: the session takes the events of the streams it follows and no others: the current stream,
and while it is being replaced (until the new one is acknowledged and the old one cancelled) the old
one too, so no update falls between them; an event of any other stream is dropped. An upstream that
refuses the stream is said once, and not asked again before the next connection or the next change
of the resources watched; one that ends it (a result) gets a new stream a second later.

Theory of operation. ``open`` sends ``subscriptions/listen`` with the filter for the resources
watched and follows the stream in the connection's task group until it ends. ``take`` is the
session's first look at every notification of a 2026-07-28 upstream: the acknowledgement of the
current stream is kept here (the URIs the upstream honored) and ends a ``replace``; other events of a
followed stream reach the session without their subscription id. The requests themselves go through
the session (``session.UpstreamSession``), which hands this stream how to start and cancel them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

import anyio
from anyio.abc import TaskGroup

from drawbridge.gateway.protocol.methods import LISTEN, LISTEN_ACKNOWLEDGED
from drawbridge.gateway.protocol.modern import (
    honored_uris,
    listen_filter,
    subscription_id,
    without_subscription_id,
)
from drawbridge.gateway.protocol.paging import error_summary
from drawbridge.gateway.upstreams.requests import PendingCall, UpstreamLost

logger = logging.getLogger("drawbridge.gateway.upstream")

LISTEN_AGAIN_SECONDS: Final = 1.0
"""How long after an upstream ended the listen stream the gateway opens a new one."""


class StartRequest(Protocol):
    """Send a request on the session's connection; ``track`` learns of it before it is sent."""

    async def __call__(
        self, method: str, params: Mapping[str, Any] | None, *, track: Callable[[PendingCall], None] | None = None
    ) -> PendingCall: ...


class CancelRequest(Protocol):
    """Abandon a request and tell the upstream, if it is still connected."""

    async def __call__(self, call: PendingCall, reason: str) -> None: ...


class ListenStream:
    """The listen stream of one upstream session, across its connections."""

    def __init__(self, upstream: str, start: StartRequest, cancel: CancelRequest, ready: Callable[[], bool]) -> None:
        self._upstream = upstream
        self._start = start
        self._cancel = cancel
        self._ready = ready
        self._watched: frozenset[str] = frozenset()
        """The resources whose updates the listen stream asks for."""
        self._current: PendingCall | None = None
        self._ids: set[int] = set()
        """The listen streams whose events are taken: the current one, and while it is replaced
        (until the new one is acknowledged and the old one cancelled) the old one too."""
        self._acked = anyio.Event()
        self._honored: frozenset[str] = frozenset()

    async def open(self, tg: TaskGroup | None) -> PendingCall:
        """A new stream for the resources watched, followed in ``tg`` (the connection's task group)."""

        def follow(call: PendingCall) -> None:  # before the acknowledgement can arrive
            self._current, self._acked, self._honored = call, anyio.Event(), frozenset()
            self._ids.add(call.id)

        call = await self._start(LISTEN, listen_filter(self._watched), track=follow)
        if tg is not None:
            tg.start_soon(self._follow, call, tg)
        return call

    async def _follow(self, call: PendingCall, tg: TaskGroup) -> None:
        """Until the stream ends: an error means this upstream's changes cannot be followed (said
        once); a result (the upstream ended it) is followed by a new stream a second later."""
        try:
            body = await call.wait()
        except UpstreamLost:
            self._ids.discard(call.id)
            return
        self._ids.discard(call.id)
        if self._current is not call:
            return
        self._current = None
        self._acked.set()
        if "error" in body:
            logger.warning("upstream %r refused subscriptions/listen (%s); its list changes and resource "
                           "updates are not followed", self._upstream, error_summary(body))
            return
        await anyio.sleep(LISTEN_AGAIN_SECONDS)
        if self._current is None and self._ready():
            await self.open(tg)

    async def replace(self, uris: frozenset[str], timeout: float, tg: TaskGroup | None) -> frozenset[str]:
        """Follow updates of exactly these resources: a new stream replaces the old one once
        acknowledged (within ``timeout`` seconds); the URIs the upstream honored."""
        self._watched = uris
        old = self._current
        await self.open(tg)
        acked = self._acked
        try:
            with anyio.fail_after(timeout):
                await acked.wait()
        finally:
            if old is not None:
                await self._cancel(old, "replaced by a new subscription")
                self._ids.discard(old.id)
        return self._honored

    def take(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """A notification as the session handles it, or None when it was the stream's own (or of a
        stream no longer followed)."""
        stream = subscription_id(body)
        if stream is None:
            return body
        if stream not in self._ids:
            return None  # a stream the gateway no longer follows
        if body.get("method") == LISTEN_ACKNOWLEDGED:
            if self._current is not None and stream == self._current.id:
                self._honored = honored_uris(body)
                self._acked.set()
            return None
        return without_subscription_id(body)


__all__ = ["LISTEN_AGAIN_SECONDS", "CancelRequest", "ListenStream", "StartRequest"]
