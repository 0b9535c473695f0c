"""wrap's stdio relay: an MCP server to the agent, an MCP client's pipe to the real server.

Invariant: every request the agent sends gets exactly one response, and that response is either the
upstream's own line, byte for byte, or an error or refusal written by the gateway; never both, never
none while the gateway runs. When the gateway is stopped (``stop``: SIGINT, SIGTERM) every request
in flight is answered that it stopped, and every tools/call in flight is settled and recorded first.
Only ``tools/call`` is decided, and it is decided by the pipeline (``pipeline.call``), to which the
relay hands every one; every other message, in both directions,
is passed on as the exact bytes received, but for one: under ``--pin-tools`` an answer to the
agent's ``tools/list`` (``--pin-prompts``: ``prompts/list``; ``listings``, by method) holding a definition
nobody accepted is written anew (``ChildCatalogue.shown``), and until the first pin check such a request
waits before it is sent; a ``prompts/get`` waits for it and is refused unless pinned (``wrap_prompts``).
The relay only moves bytes. When a change of the pins changes what that answer would show
(``tools_changed``), the gateway tells the agent ``notifications/tools/list_changed`` of its own,
as serve does: only after the agent's ``notifications/initialized`` and only in the handshake era. A
2026-07-28 agent is not told: that era allows the notification only on a ``subscriptions/listen``
stream, and wrap relays that stream as the server's own (its id and subscription are the server's),
so the agent reads the accepted list at its next ``tools/list``.

Theory of operation. Two loops run concurrently. The client loop frames the agent's stdin into lines,
parses each strictly (``jsonrpc.read_client_line``) and either answers it (bad input, a method some
reader could take for tools/call, a request the session's state refuses: ``wrap_session``), forwards it
(everything but tools/call, under the pipeline's call timeout like a tools/call, but for
``initialize``, which waits for the server to start), or hands it to
the pipeline (``CallPipeline.start``). The upstream loop
frames the child's stdout, forwards server requests and notifications to the agent, and matches
responses to the table of requests in flight, keyed by the agent's request id. A line it must drop
for its size, its bytes or its reading (larger than the limit, not UTF-8, not one reading) that provably
answers a request in flight (``partial_id``) answers that request at once with an error naming the
problem (-32603); one whose
request cannot be known safely is only reported, and its request waits for the call timeout. For the pipeline the
relay is three things: the call's ``Forwarder`` (its line goes to the child; the child's answer
comes back to ``answered``), its ``Replier`` (in-band questions to the agent; the answers written),
and, through ``wrap_catalogue.ChildCatalogue``, its ``Resolver``.

Ids. The relay rewrites no id in either direction. Requests from the agent keep their ids, so a
response from the upstream goes back unchanged; requests from the upstream (sampling, elicitation,
roots, ping) keep the upstream's ids, and the agent's responses to them go back unchanged. The two id
spaces never meet: JSON-RPC ids are scoped to the side that sends the request. The gateway itself
originates requests in both directions -- ``elicitation/create`` to the agent (asking a person to
approve a call) and ``tools/list`` to the server (its catalogue) -- on id spaces of its own, strings
``drawbridge-approval-<random>-<n>`` and ``drawbridge-catalogue-<random>-<n>`` with a random part
drawn per relay, so neither side can predict them;
the answers to them are consumed by the gateway and never forwarded, and a request from the other
side that carries an id of such a space is refused rather than relayed.

Batches. What arrives in one read is handled together. The lines of the calls decided from one read
of the client go to the upstream in one write, at the end of that read (or sooner, before any other
line the upstream must see after them); when the pipe cannot take them at once, a task waits for it
while the client loop goes on reading. The calls answered in one read of the upstream, and in what
it wrote while they were handled (up to 64 calls), are recorded together and then answered in one
write (``CallPipeline.flush``), before any other line the agent must see after them.

Size. The relay is one module because its invariant spans both loops: the table of requests in
flight, the lines queued for the upstream and the gateway's own id spaces are shared by the client
loop and the upstream loop, and each rule (who answers, in which order lines go out) reads only
with both in view; the server's catalogue, the agent's session, the settings and pending requests live
beside it.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, Final

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream, TaskGroup

from drawbridge.gateway.pipeline.call import CallPipeline, Flight, GatewayError, GatewayResult, Resolver, UpstreamAnswer
from drawbridge.gateway.pipeline.client_link import Elicit, in_band
from drawbridge.gateway.pipeline.deciders import RECORDING_FAILED as RECORDING_FAILED  # the refusal's text
from drawbridge.gateway.pipeline.tool_call import ToolCall
from drawbridge.gateway.protocol.hop import relayed_codes
from drawbridge.gateway.protocol.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    UPSTREAM_EXITED,
    UPSTREAM_TIMEOUT,
    IdKey,
    Kind,
    LineFramer,
    LineRefusal,
    Message,
    MessageError,
    Oversize,
    RequestId,
    encode_line,
    error_line,
    id_key,
    notification_line,
    parse_upstream_message,
    read_client_line,
    result_line,
    valid_id,
)
from drawbridge.gateway.protocol.partial_id import response_id, undecodable_response_id
from drawbridge.gateway.protocol.methods import (
    CANCELLED,
    ELICIT,
    INITIALIZE,
    INITIALIZED,
    NOT_EXACTLY_TOOLS_CALL,
    PROMPTS_GET,
    PROMPTS_LIST,
    TOOLS_CALL,
    TOOLS_LIST,
    TOOLS_LIST_CHANGED,
    looks_like_tools_call,
)
from drawbridge.gateway.transports.relay_requests import OwnRequest, Pending, RelayConfig
from drawbridge.gateway.transports.wrap_catalogue import ChildCatalogue
from drawbridge.gateway.transports.wrap_prompts import prompt_named
from drawbridge.gateway.transports.wrap_session import AgentSession
from drawbridge.gateway.upstreams.child_process import UpstreamGone, UpstreamProcess
from drawbridge.gateway.upstreams.child_spawn import EnvFilter

logger = logging.getLogger("drawbridge.gateway")

READ_CHUNK: Final = 65536
MAX_ANSWERED_TOGETHER: Final = 64
OWN_ID_PREFIX: Final = "drawbridge-approval-"
"""Ids of the requests the gateway itself sends the agent (approval questions) start with this, then a
per-relay random part."""
OWN_UPSTREAM_ID_PREFIX: Final = "drawbridge-catalogue-"
"""Ids of the requests the gateway itself sends the server (its tool list): this, then the same part."""
QUEUED: Final = "queued"
"""A decided call's ``Flight.handle`` while its line waits for the end of the client's read."""
SENT: Final = "sent"
"""Its ``handle`` once its line is handed to the upstream: only then can the upstream answer it."""


class ClientRequestFailed(Exception):
    """A gateway-originated request to the agent got an error, or no answer (the agent is gone)."""


class StdioRelay:
    session_id: str | None = None
    """A pipe has no session id (the pipeline's ``Replier``)."""

    def __init__(
        self,
        upstream: UpstreamProcess,
        client_in: ByteReceiveStream,
        client_out: ByteSendStream,
        *,
        pipeline: CallPipeline,
        config: RelayConfig | None = None,
        catalogue: ChildCatalogue | None = None,
    ) -> None:
        self.upstream = upstream
        self.config = config or RelayConfig()
        self.pipeline = pipeline
        self._client_in = client_in
        self._client_out = client_out
        self.catalogue: Resolver = catalogue or ChildCatalogue(
            self.config.server_id, self, self.request_upstream, modern=lambda: self.session.modern
        )
        self.listings: dict[str, ChildCatalogue] = {TOOLS_LIST: self.catalogue} if isinstance(self.catalogue, ChildCatalogue) else {}
        self._to_send: list[Flight] = []
        """Calls decided from the client's last read, whose lines go to the upstream together."""
        self._reading = False
        """The client loop is handling the lines of one read (calls decided now wait for its end)."""
        self._out_lock = anyio.Lock(fast_acquire=True)
        send_now = getattr(client_out, "send_nowait", None)
        self._client_send_now = send_now if callable(send_now) else None
        self._inflight: dict[IdKey, Pending | Flight] = {}
        """The agent's requests in flight (a ``Flight`` is a tools/call), by the agent's id."""
        self._upstream_gone: str | None = None
        self._upstream_done = anyio.Event()
        self._client_gone = False
        self._client_scope: anyio.CancelScope | None = None
        self._tasks: TaskGroup | None = None
        self.session = AgentSession()
        self._closing = False
        self._stopped: str | None = None
        """Why the gateway stops (``stop``), once it was told to."""
        self._grace_scope: anyio.CancelScope | None = None
        random_part = secrets.token_hex(6)
        self._own_prefix = f"{OWN_ID_PREFIX}{random_part}-"
        self._own_upstream_prefix = f"{OWN_UPSTREAM_ID_PREFIX}{random_part}-"
        self._own_seq = 0
        self._own: dict[IdKey, OwnRequest] = {}
        """The gateway's requests to the agent, by id."""
        self._own_upstream: dict[IdKey, OwnRequest] = {}
        """The gateway's requests to the server, by id."""

    # ------------------------------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        """Relay until the agent closes its end (or ``stop``), then stop the upstream. Returns when both
        are done."""
        async with anyio.create_task_group() as outer:
            if not self.pipeline.running:
                await outer.start(self.pipeline.run)
            outer.start_soon(self._upstream_loop)
            try:
                async with anyio.create_task_group() as tasks:
                    self._tasks = tasks
                    with anyio.CancelScope() as scope:
                        self._client_scope = scope
                        if self._stopped is None:
                            await self._client_loop()
                    await self._shutdown()
                    tasks.cancel_scope.cancel()
            finally:
                self._tasks = None
                with anyio.CancelScope(shield=True):
                    # The upstream already had its grace (``_shutdown``): what is still running is stopped.
                    await self.upstream.aclose(grace=0)
                outer.cancel_scope.cancel()

    def stop(self, reason: str) -> None:
        """The gateway is told to stop (a signal): stop reading the agent, and end every request in flight
        at once with ``reason`` (recorded, answered) instead of waiting for the upstream; then the upstream
        is stopped. ``run`` returns once that is done."""
        if self._stopped is not None:
            return
        self._stopped = reason
        self._closing = True
        for scope in (self._client_scope, self._grace_scope):
            if scope is not None:
                scope.cancel()

    async def _shutdown(self) -> None:
        """The agent is gone (or the gateway stops): let the upstream exit on its own, settle what is in
        flight, stop the child. Stopping skips the wait: what is in flight ends at once."""
        self._closing = True
        if self._stopped is None:
            with anyio.CancelScope() as grace, anyio.move_on_after(self.config.shutdown_grace):
                self._grace_scope = grace
                # Calls still being decided were sent before the agent closed its end: as with the server
                # itself, they are forwarded (or refused) before the upstream hears the end of input.
                await self.pipeline.decisions_done()
                await self._send_decided()
                # Bounded: closing waits for a write in progress, which a child that stopped reading blocks.
                await self.upstream.close_stdin()
                await self._upstream_done.wait()
            self._grace_scope = None
        stopped = self._stopped
        for key, entry in list(self._inflight.items()):
            del self._inflight[key]
            if isinstance(entry, Flight):
                if stopped is None:
                    reason = "the agent closed the connection before an answer"
                    self.pipeline.withdraw_approval(entry, reason)  # one still asked for is asked for nobody
                    self.pipeline.cancel(entry, reason)
                else:
                    self._strand(entry, stopped)
            elif stopped is not None:
                detail = f"{stopped} before the upstream answered {entry.method}"
                await self._to_client(error_line(entry.message.id, UPSTREAM_EXITED, detail))
        await self.pipeline.flush()

    def _strand(self, flight: Flight, cause: str) -> None:
        """End a call the upstream will not answer (it is gone, or the gateway stops): one that was sent
        as lost before its answer, one that was not (queued, or still being decided) as not sent."""
        if flight.handle is QUEUED:
            self._to_send.remove(flight)
            self.pipeline.lost(flight, f"{cause}; the call was not sent", sent=False)
        elif flight.handle is SENT:
            self.pipeline.lost(flight, f"{cause} before answering {TOOLS_CALL}")
        else:
            self.pipeline.lost(flight, f"{cause}; the call was not sent", sent=False)

    # ----------------------------------------------------------------------------------- writing

    async def _to_client(self, data: bytes) -> None:
        """Write to the agent. Lines never interleave: a write that cannot finish at once holds the
        lock while it waits, and nobody writes without it while it is held. When it is free, what
        the pipe takes now is written without it (no await, so nobody can come in between)."""
        if self._client_gone:
            return
        try:
            if self._client_send_now is not None and not self._out_lock.locked():
                written = self._client_send_now(data)
                if written == len(data):
                    return
                data = data[written:]
            async with self._out_lock:
                await self._client_out.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self._client_gone = True
            logger.warning("the agent's end of the connection is closed; shutting down")
            if self._client_scope is not None:
                self._client_scope.cancel()

    async def _to_upstream(self, data: bytes) -> bool:
        """Write to the upstream; False if it cannot be written (the upstream loop then sees it end).
        Calls decided earlier go first, so the upstream sees lines in the client's order."""
        if self._to_send:
            await self._send_decided()
        try:
            await self.upstream.send(data)
        except UpstreamGone as exc:
            await self.pipeline.guard.incident("upstream_unwritable", "upstream", str(exc))
            return False
        return True

    # -------------------------------------------------------------- the pipeline's Forwarder

    def send(self, flight: Flight) -> Awaitable[None] | None:
        """Queue the decided call's line: it goes out with the others of the client's read
        (``_send_decided``), or at once when its decision came later (a decision task awaits it)."""
        if self._upstream_gone is not None:
            self._take(flight)
            self.pipeline.lost(flight, f"{self._upstream_gone}; the call was not sent", sent=False)
            return None
        flight.handle = QUEUED
        self._to_send.append(flight)
        return None if self._reading else self._send_decided()

    def abandon(self, flight: Flight, reason: str, *, timed_out: bool) -> Awaitable[None] | None:
        """A timed-out call: the upstream hears ``notifications/cancelled``. A call the agent cancelled:
        the agent's own notification goes on (``_cancel_from_client``), unless the line never left."""
        self._take(flight)
        if flight.handle is QUEUED:  # decided, but its line is not handed over yet
            self._to_send.remove(flight)
            flight.forwarded = False
            return None
        if timed_out and self._upstream_gone is None:
            return self._tell_upstream_cancelled(flight.request_id, reason)
        return None

    async def _tell_upstream_cancelled(self, request_id: Any, reason: str) -> None:
        await self._to_upstream(notification_line(CANCELLED, {"requestId": request_id, "reason": reason}))

    async def _send_decided(self) -> None:
        """Hand the lines of the calls decided since the last time to the upstream, in one write.

        When the pipe cannot take them now (it is full, or another write is waiting), a task of their
        own waits for it, so the client loop goes on reading (cancellations, the agent closing); the
        upstream's write lock keeps the order. When the upstream is gone, the calls are answered that
        they were not sent."""
        batch = [flight for flight in self._to_send if not flight.settled]
        self._to_send = []
        if not batch:
            return
        for flight in batch:
            flight.handle = SENT
        data = b"".join([flight.message.raw + b"\n" for flight in batch])
        try:
            if self.upstream.send_nowait(data):
                return
        except UpstreamGone as exc:
            await self._not_sent(batch, exc)
            return
        assert self._tasks is not None
        self._tasks.start_soon(self._send_waiting, batch, data)

    async def _send_waiting(self, batch: list[Flight], data: bytes) -> None:
        try:
            await self.upstream.send(data)
        except UpstreamGone as exc:
            await self._not_sent(batch, exc)

    async def _not_sent(self, batch: list[Flight], exc: UpstreamGone) -> None:
        await self.pipeline.guard.incident("upstream_unwritable", "upstream", str(exc))
        for flight in batch:
            self._take(flight)
            self.pipeline.lost(flight, "the upstream is gone; the call was not sent", sent=False)
        await self.pipeline.flush()

    # ---------------------------------------------------------------- the pipeline's Replier

    def elicit(self, flight: Flight) -> Elicit | None:
        call = flight.call
        if call is not None and not call.modern:
            return in_band(self._elicit, self.session.capabilities)
        return None

    def deliver(self, flights: Sequence[Flight]) -> Awaitable[None] | None:
        """Write the answers of recorded calls in one write; a line already in the pipe needs no wait.
        From here on their ids are free for the agent to use again."""
        lines = []
        for flight in flights:
            if not flight.forwarded:  # a call refused after its decision task (a forwarded one left already)
                self._take(flight)
            answer = flight.answer
            if isinstance(answer, UpstreamAnswer):
                assert answer.raw is not None
                lines.append(answer.raw + b"\n")
            elif isinstance(answer, GatewayResult):
                lines.append(result_line(flight.request_id, answer.result))
            elif isinstance(answer, GatewayError):
                lines.append(error_line(flight.request_id, answer.code, answer.message))
        if not lines:
            return None
        return self._to_client(b"".join(lines))

    def _take(self, flight: Flight) -> None:
        key = flight.message.key
        if key is not None and self._inflight.get(key) is flight:
            del self._inflight[key]

    async def tools_changed(self) -> None:
        """What the agent's ``tools/list`` shows changed (pins accepted): tell a handshake-era agent
        whose session is initialized (module docstring); a 2026-07-28 agent is not told."""
        if self.session.initialized and not self.session.modern and not self._closing:
            await self._to_client(encode_line({"jsonrpc": "2.0", "method": TOOLS_LIST_CHANGED}))

    # ------------------------------------------------------------------- the gateway's own requests

    def _is_own_id(self, request_id: Any, prefix: str | None = None) -> bool:
        """Whether an id is of the gateway's own space towards the agent (or the one ``prefix`` starts)."""
        return isinstance(request_id, str) and request_id.startswith(prefix or self._own_prefix)

    def _next_own_id(self, prefix: str) -> str:
        self._own_seq += 1
        return f"{prefix}{self._own_seq}"

    def _own_response(self, message: Message, table: dict[IdKey, OwnRequest], prefix: str) -> bool:
        """Consume an answer to a request the gateway sent; True if it was one (even a late one)."""
        request_id = message.id
        if not (isinstance(request_id, str) and request_id.startswith(prefix)):
            return False
        key = message.key
        request = table.pop(key, None) if key is not None else None
        if request is not None:
            request.body = message.body
            request.done.set()
        return True

    async def request_client(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Send the agent a request of the gateway's own and wait for its answer (the response body).

        Raises ``ClientRequestFailed`` when the agent is gone or closes before answering. A cancelled
        wait tells the agent (``notifications/cancelled``) that the answer is no longer wanted."""
        if self._client_gone or self._closing:
            raise ClientRequestFailed("the agent's connection is closing")
        request_id = self._next_own_id(self._own_prefix)
        key = id_key(request_id)
        request = OwnRequest()
        self._own[key] = request
        try:
            line = encode_line({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
            await self._to_client(line)
            if self._client_gone:
                raise ClientRequestFailed("the agent's connection is closed")
            await request.done.wait()
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                if self._own.pop(key, None) is not None:
                    await self._to_client(
                        notification_line(CANCELLED, {"requestId": request_id, "reason": "no longer needed"})
                    )
            raise
        finally:
            self._own.pop(key, None)
        assert request.body is not None
        return request.body

    async def request_upstream(self, method: str, params: dict[str, Any] | None) -> dict[str, Any]:
        """Send the server a request of the gateway's own (its catalogue) and wait for the response body.
        Raises ``ConnectionError`` when the server is gone before it answers."""
        if self._upstream_gone is not None:
            raise ConnectionError(self._upstream_gone)
        request_id = self._next_own_id(self._own_upstream_prefix)
        key = id_key(request_id)
        request = OwnRequest()
        self._own_upstream[key] = request
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        try:
            if not await self._to_upstream(encode_line(message)):
                raise ConnectionError("the upstream is gone")
            await request.done.wait()
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                if self._own_upstream.pop(key, None) is not None and self._upstream_gone is None:
                    await self._tell_upstream_cancelled(request_id, "no longer needed")
            raise
        finally:
            self._own_upstream.pop(key, None)
        if request.body is None:
            raise ConnectionError(self._upstream_gone or "the upstream is gone")
        return request.body

    async def _elicit(self, call: ToolCall, params: Mapping[str, Any]) -> Mapping[str, Any]:
        """Ask the agent in-band (``elicitation/create``); its ``ElicitResult``, or raise."""
        body = await self.request_client(ELICIT, dict(params))
        result = body.get("result")
        if "error" in body or not isinstance(result, dict):
            raise ClientRequestFailed("the agent answered the approval question with an error")
        return result

    # ----------------------------------------------------------------------------- client -> upstream

    async def _client_loop(self) -> None:
        framer = LineFramer(self.config.max_message_bytes)
        while True:
            try:
                chunk = await self._client_in.receive(READ_CHUNK)
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                break
            self._reading = True
            try:
                for item in framer.feed(chunk):
                    await self._on_client_line(item)
            finally:
                self._reading = False
            if self._to_send:
                await self._send_decided()
            await self.pipeline.flush()
        last = framer.close()
        if last is not None:
            await self._on_client_line(last)
        await self._send_decided()
        await self.pipeline.flush()

    async def _on_client_line(self, item: bytes | Oversize) -> None:
        message = read_client_line(item, self.config.max_depth)
        if isinstance(message, LineRefusal):
            await self.pipeline.guard.incident(message.kind, "client", message.detail, message.code)
            if message.reply is not None:
                await self._to_client(message.reply)
            return
        if message.kind is Kind.RESPONSE:
            if self._own_response(message, self._own, self._own_prefix):
                return
            if self._upstream_gone is None:
                await self._to_upstream(item + b"\n")
        elif message.kind is Kind.NOTIFICATION:
            await self._on_client_notification(message)
        else:
            await self._on_client_request(message)

    async def _on_client_notification(self, message: Message) -> None:
        method = message.method
        assert method is not None
        if method == TOOLS_CALL or looks_like_tools_call(method):
            await self.pipeline.guard.incident(
                "tools_call_notification", "client", "a tools/call without an id was dropped (it cannot be answered)"
            )
            return
        if method == CANCELLED and await self._cancel_from_client(message):
            return
        if self._upstream_gone is None:
            await self._to_upstream(message.raw + b"\n")
            if method == INITIALIZED and self.session.initialized_by_agent() and self._tasks is not None:
                for listing in self.listings.values():
                    listing.prefetch(self._tasks)

    async def _cancel_from_client(self, message: Message) -> bool:
        """Settle a cancelled tools/call; True if the upstream must not hear of it (it never saw it)."""
        params = message.params
        request_id = params.get("requestId") if isinstance(params, dict) else None
        if not valid_id(request_id):
            return False
        flight = self._inflight.get(id_key(request_id))
        if not isinstance(flight, Flight):
            return False
        self._take(flight)
        abandoning = self.pipeline.cancel(flight, "the agent cancelled the request")
        if abandoning is not None:
            await abandoning
        await self.pipeline.flush()
        return not flight.forwarded

    async def _on_client_request(self, message: Message) -> None:
        key = message.key
        method = message.method
        assert key is not None and method is not None
        request_id = message.id
        if key in self._inflight or (isinstance(request_id, str) and request_id.startswith(self._own_upstream_prefix)):
            detail = f"request id {message.id!r} is already in use by a request in flight; the duplicate was dropped"
            await self.pipeline.guard.incident("duplicate_id", "client", detail, INVALID_REQUEST)
            await self._to_client(error_line(None, INVALID_REQUEST, f"invalid request: {detail}"))
            return
        if looks_like_tools_call(method):
            await self._refuse(message, METHOD_NOT_FOUND, NOT_EXACTLY_TOOLS_CALL)
            return
        refusal = self.session.refusal(method, message.params)
        if refusal is not None:
            await self._refuse(message, refusal.code, refusal.message, refusal.data)
            return
        if method == TOOLS_CALL:
            flight = self.pipeline.start(message, agent=self.config.agent, version=self.session.version,
                                         replier=self, resolver=self.catalogue)
            if not flight.settled:
                self._inflight[key] = flight
            return
        if self._upstream_gone is not None:
            await self._to_client(error_line(message.id, UPSTREAM_EXITED, f"{self._upstream_gone}; {method} was not sent"))
            return
        pending = Pending(message, method)
        self._inflight[key] = pending
        named = prompt_named(message) is not None  # a prompts/get, or a completion of a prompt's arguments
        listing = self.listings.get(PROMPTS_LIST if named else method)
        if listing is not None and listing.listing_waits(PROMPTS_GET if named else method):
            assert self._tasks is not None
            self._tasks.start_soon(self._list_when_checked, key, pending, listing)
        elif not await self._forward(key, pending):
            return
        if self._tasks is not None and method != INITIALIZE:  # the server may take its time to start
            self._tasks.start_soon(self._time_out_pending, key, pending)

    async def _refuse(
        self, message: Message, code: int, detail: str, data: Any = None, kind: str = "invalid_message"
    ) -> None:
        """A request the relay refuses itself: recorded (the rule broken, never ``data``), and answered."""
        await self.pipeline.guard.incident(kind, "client", detail, code)
        await self._to_client(error_line(message.id, code, detail, data))

    async def _forward(self, key: IdKey, pending: Pending) -> bool:
        """Send a relayed request to the upstream; False when it could not be sent (then answered so)."""
        if await self._to_upstream(pending.message.raw + b"\n"):
            return True
        if self._inflight.get(key) is pending:
            del self._inflight[key]
            detail = f"the upstream is gone; {pending.method} was not sent"
            await self._to_client(error_line(pending.message.id, UPSTREAM_EXITED, detail))
        return False

    async def _list_when_checked(self, key: IdKey, pending: Pending, catalogue: ChildCatalogue) -> None:
        """``--pin-tools``: the agent's tools/list goes out once the server's catalogue was checked
        against the pins (before that, nothing could be shown of the answer); unless it was answered
        meanwhile (timed out, the upstream gone, the gateway stopped); a held-back prompt's get is refused."""
        await catalogue.checked()
        if self._inflight.get(key) is pending:
            if (refusal := catalogue.refusal(pending.message)) is None:
                await self._forward(key, pending)
            elif self._inflight.pop(key, None) is pending:
                await self._refuse(pending.message, INVALID_PARAMS, refusal, kind="prompt_held_back")

    async def _time_out_pending(self, key: IdKey, pending: Pending) -> None:
        """The call timeout holds for every forwarded request but ``initialize``: one the upstream has not
        answered by then is answered -32001, and the upstream hears ``notifications/cancelled``."""
        timeout = self.pipeline.call_timeout
        await anyio.sleep(timeout)
        if self._inflight.get(key) is not pending:
            return
        del self._inflight[key]
        method = pending.method
        await self._to_client(error_line(
            pending.message.id, UPSTREAM_TIMEOUT, f"the upstream did not answer {method} within {timeout:g} seconds"
        ))
        if self._upstream_gone is None:
            await self._tell_upstream_cancelled(pending.message.id, "gateway timeout")

    # ----------------------------------------------------------------------------- upstream -> client

    async def _upstream_loop(self) -> None:
        answered = 0
        async for batch in self.upstream.line_batches():
            for item in batch:
                answered += await self._on_upstream_line(item)
            # Answers that came while these were handled join them (fewer writes per call); with
            # nothing else in flight none can have come, and the read that would find so is saved.
            while answered and answered < MAX_ANSWERED_TOGETHER and self._inflight:
                more = self.upstream.more_lines()
                if not more:
                    break
                for item in more:
                    answered += await self._on_upstream_line(item)
            answered = 0
            await self.pipeline.flush()
        await self._on_upstream_end()

    async def _on_upstream_line(self, item: bytes | Oversize) -> int:
        """Relay one line from the upstream; 1 when it answered a tools/call (completed with the
        others of the same read), else 0. Anything else first completes those, so the agent receives
        lines in the upstream's order."""
        if isinstance(item, Oversize):
            await self.pipeline.flush()
            detail = (
                f"a line of at least {item.size} bytes from the upstream exceeds --max-upstream-message-bytes "
                f"({item.limit}); it was dropped"
            )
            await self.pipeline.guard.incident("upstream_oversize", "upstream", detail)
            return await self._dropped_answer(response_id(item.head), detail)
        try:
            message = parse_upstream_message(item)
        except MessageError as exc:
            await self.pipeline.flush()
            detail = f"a line from the upstream was dropped: {exc.message}"
            await self.pipeline.guard.incident("upstream_garbage", "upstream", detail)
            return await self._dropped_answer(undecodable_response_id(item), detail)
        if message.kind is not Kind.RESPONSE:
            await self.pipeline.flush()
            if message.kind is Kind.REQUEST and self._is_own_id(message.id):
                detail = "a request from the upstream used an id of the gateway's own id space; refused"
                await self.pipeline.guard.incident("invalid_message", "upstream", detail, INVALID_REQUEST)
                await self._to_upstream(error_line(message.id, INVALID_REQUEST, f"invalid request: {detail}"))
                return 0
            for listing in self.listings.values() if self._tasks is not None else ():
                listing.changed(self._tasks, message.method)
            await self._to_client(item + b"\n")
            return 0
        request_id = message.id
        if isinstance(request_id, str) and self._own_response(message, self._own_upstream, self._own_upstream_prefix):
            return 0
        key = message.key
        assert key is not None
        entry = self._inflight.get(key)
        if isinstance(entry, Flight):
            # Only a call the upstream was actually sent can be answered by it: a response for a call
            # still being decided (a guessable id) must not settle it.
            if entry.forwarded and entry.handle is SENT:
                del self._inflight[key]
                self.pipeline.answered(entry, message.body, item, passed=relayed_codes(envelope=True))
                return 1
        elif entry is not None:
            del self._inflight[key]
            await self.pipeline.flush()
            line = item + b"\n"
            if (listing := self.listings.get(entry.method)) is not None:
                line = listing.shown(message, line)
            await self._to_client(line)
            if entry.method == INITIALIZE:
                self.session.answered_initialize(message.body)
            return 0
        await self.pipeline.flush()
        detail = f"a response for id {message.id!r}, which has no request in flight, was dropped"
        await self.pipeline.guard.incident("unknown_response", "upstream", detail)
        return 0

    async def _dropped_answer(self, request_id: RequestId | None, detail: str) -> int:
        """A dropped line that is, provably, the answer to a request in flight (``partial_id``): that
        request is answered now with an error naming the problem, instead of waiting for a timeout.
        1 when it was a tools/call (completed with the others of the same read), else 0."""
        if request_id is None:
            return 0
        key = id_key(request_id)
        entry = self._inflight.get(key)
        if isinstance(entry, Flight):
            if not (entry.forwarded and entry.handle is SENT):
                return 0
            del self._inflight[key]
            self.pipeline.unreadable(entry, f"the upstream's answer could not be passed on: {detail}")
            return 1
        if entry is not None:
            del self._inflight[key]
            message = f"the upstream's answer to {entry.method} could not be passed on: {detail}"
            await self._to_client(error_line(entry.message.id, INTERNAL_ERROR, message))
        return 0

    async def _on_upstream_end(self) -> None:
        await self.upstream.wait_exit(0.5)
        self._upstream_gone = self.upstream.exit_description()
        self._upstream_done.set()
        for request in list(self._own_upstream.values()):
            request.done.set()  # the gateway's own requests end unanswered
        stranded = list(self._inflight.items())
        self._inflight.clear()
        if self._closing and not stranded:
            logger.info("%s after the agent closed the connection", self._upstream_gone)
        else:
            detail = f"{self._upstream_gone}; {len(stranded)} request(s) in flight"
            await self.pipeline.guard.incident("upstream_exited", "upstream", detail)
        for _key, entry in stranded:
            if isinstance(entry, Flight):
                self._strand(entry, self._upstream_gone)
            else:
                detail = f"{self._upstream_gone} before answering {entry.method}"
                await self._to_client(error_line(entry.message.id, UPSTREAM_EXITED, detail))
        await self.pipeline.flush()


async def run_relay(
    argv: list[str],
    client_in: ByteReceiveStream,
    client_out: ByteSendStream,
    *,
    pipeline: CallPipeline,
    config: RelayConfig | None = None,
    env_filter: EnvFilter | None = None,
    cwd: str | None = None,
) -> None:
    """Spawn the upstream and relay between it and the given client streams until the client closes."""
    config = config or RelayConfig()
    upstream = await UpstreamProcess.spawn(
        argv, env_filter=env_filter, cwd=cwd, max_message_bytes=config.max_upstream_message_bytes
    )
    relay = StdioRelay(upstream, client_in, client_out, pipeline=pipeline, config=config)
    await relay.run()


async def serve_stdio(
    argv: list[str],
    *,
    pipeline: CallPipeline,
    config: RelayConfig | None = None,
    env_filter: EnvFilter | None = None,
    cwd: str | None = None,
) -> None:
    """``drawbridge wrap``: relay between this process's stdin/stdout and the upstream command."""
    from drawbridge.gateway.transports.process_stdio import process_stdio

    async with process_stdio() as (client_in, client_out):
        await run_relay(argv, client_in, client_out, pipeline=pipeline, config=config, env_filter=env_filter, cwd=cwd)


__all__ = ["RECORDING_FAILED", "ClientRequestFailed", "StdioRelay", "run_relay", "serve_stdio"]
