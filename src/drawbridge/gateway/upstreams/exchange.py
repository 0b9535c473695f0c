"""The session's JSON-RPC exchange with its upstream: its id space and the requests in flight both ways.

Invariant: every request the gateway sends ends exactly once: with the upstream's response (matched by
id), or failed when it is cancelled or its connection ends (``lose_all``); it never moves to the next
connection. Ids count up for the session's whole life, across reconnects, so a late answer from a
dead connection can never match a new request. A request from the upstream is answered at most
once, with an error rather than never when answering it fails, and not at all once the upstream
cancelled it or its connection ended.

Theory of operation. The supervisor (``session.UpstreamSession``) attaches each connection's link
(``attach``, which counts the connection's generation) and task group (``tasks``), and detaches them
when the connection ends. The link hands every message it reads to ``deliver``: a response completes
its ``PendingCall``, a request from the upstream is served in the connection's task group (``ping``
here, everything else by the session's ``answer``), a notification goes to the session's ``notified``.
A line that is no message (too large, not UTF-8, not JSON) and a response to no request in flight
(never sent, answered already, given up) are dropped and reported to the session's ``dropped``
(``dropped_lines.py``); a dropped line whose start proves it answers a request in flight
(``partial_id``) ends that request at once with an error naming the problem (-32603).
For a 2026-07-28 upstream every message with a method carries the gateway's envelope (``hop``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
from anyio.abc import TaskGroup

from drawbridge.gateway.protocol.jsonrpc import (
    INTERNAL_ERROR,
    Kind,
    MessageError,
    Oversize,
    RequestId,
    parse_upstream_message,
)
from drawbridge.gateway.protocol.methods import CANCELLED, PING
from drawbridge.gateway.protocol.modern import with_envelope
from drawbridge.gateway.protocol.partial_id import response_id, undecodable_response_id
from drawbridge.gateway.upstreams.dropped_lines import (
    LogBudget,
    answer_dropped,
    garbage_detail,
    oversize_detail,
    unknown_response_detail,
)
from drawbridge.gateway.upstreams.http_link import HttpLink
from drawbridge.gateway.upstreams.requests import PendingCall, UpstreamLost, UpstreamUnavailable
from drawbridge.gateway.upstreams.stdio_link import StdioLink

logger = logging.getLogger("drawbridge.gateway.upstream")

Link = StdioLink | HttpLink

Notified = Callable[[dict[str, Any], "int | None"], Awaitable[None]]
"""The session's handling of one notification from the upstream (``related``: the request it is about)."""
Answer = Callable[[dict[str, Any], "int | None"], Awaitable[dict[str, Any]]]
"""The session's answer to one request from the upstream: ``{"result": ...}`` or ``{"error": ...}``."""
Dropped = Callable[[str, str, bool], Awaitable[None]]
"""The session's report of a line it dropped: (incident kind, detail, whether to log it)."""


class Exchange:
    """The requests between the gateway and one upstream, across the session's connections."""

    def __init__(
        self,
        upstream: str,
        *,
        unavailable: Callable[[], str],
        hop: Mapping[str, Any] | None,
        notified: Notified,
        answer: Answer,
        dropped: Dropped,
    ) -> None:
        self._upstream = upstream
        self._unavailable = unavailable
        self._hop = hop
        self._notified = notified
        self._answer = answer
        self._dropped = dropped
        self._log_budget = LogBudget(upstream)
        self.link: Link | None = None
        self.tasks: TaskGroup | None = None
        """The task group of the connection now attached; None between connections."""
        self.generation = 0
        self._next_id = 0
        self._pending: dict[int, PendingCall] = {}
        self._incoming: dict[tuple[str, Any], anyio.CancelScope] = {}

    def attach(self, link: Link) -> None:
        self.generation += 1
        self.link = link

    def detach(self) -> None:
        self.tasks = None
        self.link = None

    def lose_all(self, reason: str) -> None:
        """The connection ended: every request in flight, either way, ends with it."""
        pending, self._pending = self._pending, {}
        for call in pending.values():
            call.fail(f"upstream {self._upstream!r}: {reason}")
        incoming, self._incoming = self._incoming, {}
        for scope in incoming.values():
            scope.cancel()

    # -- the gateway's requests

    async def start(
        self,
        method: str,
        params: Mapping[str, Any] | None,
        *,
        track: Callable[[PendingCall], None] | None = None,
    ) -> PendingCall:
        """Send a request; ``track`` learns of it before it is sent (before anything it causes arrives)."""
        self._next_id += 1
        call = PendingCall(self._next_id, method, self.generation)
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": call.id, "method": method}
        if params is not None:
            message["params"] = params
        self._pending[call.id] = call
        if track is not None:
            track(call)
        try:
            await self.send(message)
        except BaseException:
            self._pending.pop(call.id, None)
            raise
        return call

    async def wait(self, call: PendingCall, timeout: float) -> dict[str, Any]:
        try:
            with anyio.fail_after(timeout):
                return await call.wait()
        except TimeoutError:
            await self.cancel(call, "gateway timeout")
            raise TimeoutError(
                f"upstream {self._upstream!r} did not answer {call.method} within {timeout:g} seconds"
            ) from None

    async def cancel(self, call: PendingCall, reason: str) -> None:
        """Abandon a request and tell the upstream (``notifications/cancelled``), if it is still connected."""
        if self._pending.pop(call.id, None) is None:
            return
        call.fail("cancelled")
        link = self.link
        if call.generation != self.generation or link is None:
            return
        link.abort(call.id)
        try:
            await self.send(
                {"jsonrpc": "2.0", "method": CANCELLED, "params": {"requestId": call.id, "reason": reason}}
            )
        except (UpstreamLost, UpstreamUnavailable):
            pass

    async def send(self, message: Mapping[str, Any]) -> None:
        link = self.link
        if link is None:
            raise UpstreamUnavailable(self._unavailable())
        if self._hop is not None and "method" in message:
            message = {**message, "params": with_envelope(message.get("params"), self._hop)}
        await link.send(message)

    # -- what the upstream sends

    async def deliver(self, data: bytes | Oversize, related: int | None) -> bool:
        if isinstance(data, Oversize):
            detail = oversize_detail(self._upstream, data)
            return await self._line_dropped("upstream_oversize", detail, response_id(data.head), related)
        try:
            message = parse_upstream_message(data)
        except MessageError as exc:
            detail = garbage_detail(self._upstream, exc.message)
            answers = undecodable_response_id(data)
            return await self._line_dropped("upstream_garbage", detail, answers, related)
        if message.kind is Kind.RESPONSE:
            call = self._pending.pop(message.id, None) if isinstance(message.id, int) else None  # type: ignore[arg-type]
            if call is None:
                sent = isinstance(message.id, int) and 0 < message.id <= self._next_id
                detail = unknown_response_detail(self._upstream, message.id, sent=sent)
                await self._dropped("unknown_response", detail, self._log_budget.allows())
            else:
                call.complete(message.body)
            return related is not None and message.id == related
        if message.kind is Kind.REQUEST:
            if self.tasks is not None:
                self.tasks.start_soon(self._serve, message.body, related)
            return False
        await self._notified(message.body, related)
        return False

    async def _line_dropped(self, kind: str, detail: str, answers: RequestId | None, related: int | None) -> bool:
        """A line that had to be dropped is reported; when its start proves it answers a request in
        flight (``partial_id``), that request ends now with an error naming the problem, instead of
        waiting for its timeout."""
        await self._dropped(kind, detail, self._log_budget.allows())
        call = self._pending.pop(answers, None) if isinstance(answers, int) else None
        if call is None:
            return False
        call.dropped(answer_dropped(call.method, detail))
        return related is not None and answers == related

    def cancelled(self, request_id: Any) -> None:
        """The upstream cancelled one of its requests: its answer is abandoned, never sent."""
        scope = self._incoming.get(_key(request_id)) if request_id is not None else None
        if scope is not None:
            scope.cancel()

    async def _serve(self, body: dict[str, Any], related: int | None) -> None:
        request_id = body.get("id")
        key = _key(request_id)
        answer: dict[str, Any] | None = None
        with anyio.CancelScope() as scope:
            self._incoming[key] = scope
            try:
                if body.get("method") == PING:
                    answer = {"result": {}}
                else:
                    answer = await self._answer(body, related)
            except Exception as exc:  # noqa: BLE001 -- the upstream gets an error, never a hang
                logger.error("answering a request from upstream %r failed (%s)", self._upstream, type(exc).__name__)
                answer = error_answer(INTERNAL_ERROR, "the gateway could not answer this request")
            finally:
                if self._incoming.get(key) is scope:
                    del self._incoming[key]
        if answer is None or scope.cancelled_caught:
            return
        try:
            await self.send({"jsonrpc": "2.0", "id": request_id, **answer})
        except (UpstreamLost, UpstreamUnavailable):
            pass


def _key(request_id: Any) -> tuple[str, Any]:
    return ("s", request_id) if isinstance(request_id, str) else ("i", request_id)


def error_answer(code: int, message: str) -> dict[str, Any]:
    """An answer that refuses a request from the upstream (no id, no jsonrpc)."""
    return {"error": {"code": code, "message": message}}


__all__ = ["Answer", "Exchange", "Link", "Notified", "error_answer"]
