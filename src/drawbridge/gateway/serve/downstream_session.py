"""One agent connection: ``DownstreamSession``, whatever transport carries it (stdio, HTTP, in-process).

Invariant: only ``tools/call`` is decided, and a call reaches an upstream only after the decider said
``allow`` for the namespaced name the agent used and the exact arguments the upstream receives. Every
request an agent sends gets exactly one answer (unless the agent cancelled it): the upstream's, with
only the per-hop parts rewritten (``hop.py``), or one written by the gateway.

Theory of operation. A transport feeds the session parsed messages (``handle``) and gives it an
``Outbound`` to write to. Each request runs in its own cancel scope, so ``notifications/cancelled``
(or, at 2026-07-28 over HTTP, a closed connection) stops it and tells the upstream. The session
knows its era: 2025-11-25 and older after ``initialize``, or 2026-07-28 from the per-request envelope,
which is checked before anything else (``envelope.py``); a request refused for its envelope, its
era (a method 2026-07-28 removed: ``methods.REMOVED_BY_MODERN``) or its params (a handler's -32602)
is recorded as an ``invalid_message`` incident naming the agent (``refuse``), and a tools/call sent as
a notification as a ``tools_call_notification``, whatever the transport. Only a method no handler
serves is answered -32601 without a record. A request is answered by the
handler its method has in the session's table (``routes.py``: who answers what); the handlers take the
session as it is here, so this module imports none of them, and a session is opened where the table is
(``open_session``). What the handlers share lives here: relaying a request that is not decided
(``relay``) and writing the gateway's own results (``result``). Requests the gateway relays to the
agent (an upstream's sampling or elicitation) get ids of the session's own, and so do the gateway's
own approval questions: during a tools/call's decision the session offers the approval gate a
``client_link`` (``tool_calls.py``: an ``elicitation/create`` on this session, when the agent declared
form elicitation; the gateway's ``requestState`` of a 2026-07-28 retry, which is never forwarded). The
shared tables and the upstreams live in the ``Gateway`` (``hub.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import anyio

from drawbridge.gateway.protocol.eras import (
    MODERN_VERSION,
    PROTOCOL_VERSION_META_KEY,
    unsupported_version_data,
)
from drawbridge.gateway.protocol.hop import (
    downstream_result,
    gateway_result,
    log_line_wanted,
    modern_error,
    outbound_params,
    progress_token,
    relayed_codes,
)
from drawbridge.gateway.protocol.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    UPSTREAM_EXITED,
    UNSUPPORTED_PROTOCOL_VERSION,
    UPSTREAM_TIMEOUT,
    IdKey,
    Kind,
    Message,
    MessageError,
    RequestId,
    encode_line,
    error_line,
    id_key,
    valid_id,
)
from drawbridge.gateway.protocol.methods import (
    CANCELLED,
    INITIALIZE,
    INITIALIZED,
    LOG_MESSAGE,
    NOT_EXACTLY_TOOLS_CALL,
    PING,
    PROGRESS,
    REMOVED_BY_MODERN,
    TOOLS_CALL,
    looks_like_tools_call,
    removed_by_modern,
)
from drawbridge.gateway.serve.agents import NoBackChannel, Outbound
from drawbridge.gateway.serve.envelope import (
    INITIALIZE_REFUSAL,
    EnvelopeRefusal,
    capabilities_refusal,
    envelope_refusal,
)
from drawbridge.gateway.serve.hub import Gateway
from drawbridge.gateway.upstreams.requests import UpstreamLost, UpstreamUnavailable
from drawbridge.gateway.upstreams.session import UpstreamSession

logger = logging.getLogger("drawbridge.gateway")

CALL_NOTIFICATION: Final = "a tools/call without an id was dropped (it cannot be answered)"


def _response(request_id: RequestId | None, body: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
    if "error" in body:
        out["error"] = body["error"]
    else:
        out["result"] = body.get("result")
    return out


def error_response(request_id: RequestId | None, code: int, message: str, data: Any = None) -> dict[str, Any]:
    """A JSON-RPC error answer; an unsupported-version error names every version served."""
    error: dict[str, Any] = {"code": code, "message": message}
    if code == UNSUPPORTED_PROTOCOL_VERSION:
        data = unsupported_version_data(data)
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


def result_response(request_id: RequestId, result: Mapping[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def safe_render(message: Mapping[str, Any]) -> bytes | None:
    """A message as one JSON line. An upstream answer that cannot be encoded (NaN) becomes an error."""
    try:
        return encode_line(message)
    except (ValueError, TypeError):
        if "id" in message and ("result" in message or "error" in message):
            return error_line(
                message["id"], INTERNAL_ERROR, "the upstream's answer cannot be encoded as JSON (NaN or Infinity)"
            )
        logger.warning("a message that cannot be encoded as JSON was dropped")
        return None


async def refuse_call_notification(gateway: Gateway, method: str | None) -> bool:
    """A tools/call sent as a notification cannot be answered, so it is not run: recorded
    (``tools_call_notification``) whatever the era or transport; False for any other method."""
    if method is None or not (method == TOOLS_CALL or looks_like_tools_call(method)):
        return False
    await gateway.incident("tools_call_notification", "client", CALL_NOTIFICATION)
    return True


class _Timeout(Exception):
    pass


# ------------------------------------------------------------------------------- downstream session


@dataclass(eq=False)
class Inflight:
    """One of the agent's requests while it is answered: the era it came in, and the scope that its
    cancellation stops."""

    message: Message
    modern: bool
    version: str | None
    scope: anyio.CancelScope | None = None
    cancelled: bool = False


@dataclass(eq=False)
class _Reply:
    done: anyio.Event = field(default_factory=anyio.Event)
    body: dict[str, Any] | None = None


Handler = Callable[["DownstreamSession", Inflight], Awaitable[dict[str, Any]]]
"""How a session answers one method: the response to the request it is given (``routes.py``)."""


class DownstreamSession:
    """One agent connection. Transport-independent: fed parsed messages, writes through ``outbound``."""

    def __init__(
        self,
        gateway: Gateway,
        agent: str,
        outbound: Outbound,
        *,
        handlers: Mapping[str, Handler],
        transport: str,
    ) -> None:
        self.gateway = gateway
        self.agent = agent
        self.outbound = outbound
        self.transport = transport
        self.version: str | None = None
        self.initialized = False
        self.client_capabilities: dict[str, Any] = {}
        self.closed = False
        self.session_id: str | None = None
        """The HTTP ``Mcp-Session-Id`` the transport gave this session, if it gave one."""
        self._inflight: dict[IdKey, Inflight] = {}
        self._outgoing: dict[IdKey, _Reply] = {}
        self._next_id = 0
        self._handlers = handlers

    @property
    def modern(self) -> bool:
        return self.version == MODERN_VERSION

    @property
    def inflight(self) -> int:
        """How many of the agent's requests are still being answered."""
        return len(self._inflight)

    @property
    def back_channel(self) -> bool:
        """Whether the gateway may send this agent requests (handshake era, open connection)."""
        return not self.closed and not self.modern and self.version is not None

    # ------------------------------------------------------------------------------- input

    async def handle(self, message: Message, *, envelope_checked: bool = False) -> dict[str, Any] | None:
        """Feed one parsed message; returns the response to send for a request (None otherwise)."""
        if message.kind is Kind.REQUEST:
            return await self.handle_request(message, envelope_checked=envelope_checked)
        if message.kind is Kind.NOTIFICATION:
            await self.handle_notification(message)
        else:
            await self.handle_response(message)
        return None

    async def handle_request(self, message: Message, *, envelope_checked: bool = False) -> dict[str, Any] | None:
        """The response to one request, or None when the agent cancelled it (no response is due)."""
        key = message.key
        method = message.method
        assert key is not None and method is not None
        if key in self._inflight:
            detail = f"request id {message.id!r} is already in use by a request in flight; the duplicate was dropped"
            await self.gateway.incident("duplicate_id", "client", detail, INVALID_REQUEST)
            return error_response(None, INVALID_REQUEST, f"invalid request: {detail}")
        modern, version = False, self.version
        params = message.body.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        if self.modern or (isinstance(meta, dict) and PROTOCOL_VERSION_META_KEY in meta):
            if method == INITIALIZE:  # before the envelope, which initialize does not carry
                refused: EnvelopeRefusal | None = INITIALIZE_REFUSAL
            else:
                refused = None if envelope_checked else envelope_refusal(message.body)
                refused = refused or capabilities_refusal(meta)
            if refused is not None:
                return await self.refuse(message.id, refused.code, refused.message, refused.data)
            modern, version = True, MODERN_VERSION
            if self.version is None:
                self.version = MODERN_VERSION  # like an SDK server, the connection now serves 2026-07-28
        entry = Inflight(message, modern, version)
        self._inflight[key] = entry
        try:
            with anyio.CancelScope() as scope:
                entry.scope = scope
                return await self._dispatch(entry)
            return None
        finally:
            if self._inflight.get(key) is entry:
                del self._inflight[key]

    async def _dispatch(self, entry: Inflight) -> dict[str, Any]:
        message = entry.message
        method = message.method
        assert method is not None
        if looks_like_tools_call(method):
            await self.gateway.incident("invalid_message", "client", NOT_EXACTLY_TOOLS_CALL, METHOD_NOT_FOUND)
            return error_response(message.id, METHOD_NOT_FOUND, NOT_EXACTLY_TOOLS_CALL)
        if entry.modern and method in REMOVED_BY_MODERN:  # refused for its era: recorded
            return await self.refuse(message.id, METHOD_NOT_FOUND, removed_by_modern(method))
        handler = self._handlers.get(method)
        if handler is None:
            return error_response(
                message.id,
                METHOD_NOT_FOUND,
                "method not found: the gateway does not know which upstream serves this method",
            )
        if not entry.modern and self.version is None and method not in (INITIALIZE, PING):
            return await self.refuse(
                message.id,
                INVALID_REQUEST,
                "invalid request: the session is not initialized (send initialize, or a 2026-07-28 request envelope)",
            )
        try:
            return await handler(self, entry)
        except MessageError as exc:  # a handler's refusal of the params (catalogue_routes): recorded
            return await self.refuse(message.id, exc.code, exc.message)

    async def handle_notification(self, message: Message) -> None:
        method = message.method
        params = message.params
        if method == INITIALIZED:
            if self.version is not None and not self.modern:
                self.initialized = True
            return
        if method == CANCELLED:
            self.cancel_request(params.get("requestId") if isinstance(params, dict) else None)
            return
        if method == PROGRESS and isinstance(params, dict):
            upstream = self.gateway.client_progress_upstream(self, params.get("progressToken"))
            if upstream is not None:
                try:
                    await upstream.notify(method, params)
                except (UpstreamLost, UpstreamUnavailable):
                    pass
            return
        if await refuse_call_notification(self.gateway, method):
            return
        logger.debug("a client notification with no upstream to go to was dropped")

    async def refuse(
        self, request_id: RequestId | None, code: int, detail: str, data: Any = None
    ) -> dict[str, Any]:
        """A request refused for what it is (its envelope, its era, its params): recorded
        (``invalid_message``, the rule broken, never the content, and the agent that sent it) and
        answered with an error."""
        await self.gateway.incident("invalid_message", "client", detail, code, agent=self.agent)
        return error_response(request_id, code, detail, data)

    def cancel_request(self, request_id: Any) -> bool:
        """The agent gave up on a request: stop it (the upstream is told); no response will be sent."""
        entry = self._inflight.get(id_key(request_id)) if valid_id(request_id) else None
        if entry is None or entry.scope is None:
            return False
        entry.cancelled = True
        entry.scope.cancel()
        return True

    async def handle_response(self, message: Message) -> None:
        key = message.key
        reply = self._outgoing.pop(key, None) if key is not None else None
        if reply is None:
            await self.gateway.incident(
                "unknown_response", "client", f"a response for id {message.id!r}, which the gateway never sent, was dropped"
            )
            return
        reply.body = message.body
        reply.done.set()

    # ------------------------------------------------------------------------------ output

    async def emit(self, message: dict[str, Any], related: RequestId | None) -> bool:
        """Send a notification or request to the agent; False when it cannot receive it (then dropped)."""
        if self.closed:
            return False
        if related is not None and id_key(related) not in self._inflight:
            related = None
        if related is None and (self.modern or self.version is None or not self.outbound.unsolicited):
            return False
        if related is not None and message.get("method") == LOG_MESSAGE:
            entry = self._inflight[id_key(related)]
            if entry.modern and not log_line_wanted(entry.message.params, message.get("params")):
                return False
        try:
            await self.outbound.send(message, related)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            await self.close()
            return False
        return True

    async def request(self, method: str, params: Mapping[str, Any] | None, related: RequestId | None) -> dict[str, Any]:
        """Send the agent a request (a relayed server request) and wait for its answer: result or error."""
        if not self.back_channel:
            raise NoBackChannel
        self._next_id += 1
        request_id = self._next_id
        key = id_key(request_id)
        reply = _Reply()
        self._outgoing[key] = reply
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        try:
            if not await self.emit(message, related):
                raise NoBackChannel
            await reply.done.wait()
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await self.emit(
                    {"jsonrpc": "2.0", "method": CANCELLED, "params": {"requestId": request_id, "reason": "cancelled upstream"}},
                    related,
                )
            raise
        finally:
            self._outgoing.pop(key, None)
        body = reply.body
        if body is None:
            return {"error": {"code": UPSTREAM_EXITED, "message": "the agent's connection closed before it answered"}}
        if "error" in body:
            return {"error": body["error"]}
        return {"result": body.get("result")}

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for entry in list(self._inflight.values()):
            if entry.scope is not None:
                entry.scope.cancel()
        for reply in list(self._outgoing.values()):
            reply.done.set()
        self.gateway.forget_session(self)

    # ------------------------------------------------------------------------- forwarding

    async def _forward(
        self,
        entry: Inflight,
        upstream: UpstreamSession,
        params: Mapping[str, Any] | None,
        **rewrite: Any,
    ) -> dict[str, Any]:
        """Send one request upstream and wait for its response message (the raw dict).

        Raises ``UpstreamUnavailable``, ``UpstreamLost`` or ``_Timeout``; a cancelled wait tells the
        upstream (``notifications/cancelled``) before the cancellation propagates.
        """
        method = entry.message.method
        assert method is not None
        token = progress_token(params)
        gateway_token: str | None = None
        if token is not None:
            gateway_token = self.gateway.new_progress_route(upstream, self, token, entry.message.id)  # type: ignore[arg-type]
            rewrite["progress"] = gateway_token
        try:
            call = await upstream.send_request(
                method, outbound_params(params, agent_capabilities=upstream.modern, **rewrite)
            )
            self.gateway.track(upstream, call, self, entry.message.id)  # type: ignore[arg-type]
            try:
                with anyio.move_on_after(self.gateway.settings.call_timeout) as timer:
                    return await call.wait()
                if timer.cancelled_caught:
                    with anyio.CancelScope(shield=True):
                        await upstream.cancel(call, "gateway timeout")
                    raise _Timeout
                raise AssertionError("unreachable")  # pragma: no cover
            except anyio.get_cancelled_exc_class():
                with anyio.CancelScope(shield=True):
                    await upstream.cancel(call, "the agent cancelled the request")
                raise
            finally:
                self.gateway.untrack(upstream, call)
        finally:
            if gateway_token is not None:
                self.gateway.drop_progress_route(upstream, gateway_token)

    async def relay(
        self, entry: Inflight, upstream: UpstreamSession, params: Mapping[str, Any] | None, **rewrite: Any
    ) -> dict[str, Any]:
        """Forward a request that is not decided on and build the agent's response."""
        message = entry.message
        method = message.method
        try:
            body = await self._forward(entry, upstream, params, **rewrite)
        except UpstreamUnavailable as exc:
            return error_response(message.id, UPSTREAM_EXITED, f"{exc}; {method} was not sent")
        except UpstreamLost as exc:
            return error_response(message.id, UPSTREAM_EXITED, f"{exc} before answering {method}")
        except _Timeout:
            return error_response(
                message.id,
                UPSTREAM_TIMEOUT,
                f"upstream {upstream.name!r} did not answer {method} within {self.gateway.settings.call_timeout:g} seconds",
            )
        return self.answer(entry, body, passed=relayed_codes(capabilities=upstream.modern))

    def answer(
        self, entry: Inflight, body: Mapping[str, Any], *, passed: frozenset[int] = frozenset()
    ) -> dict[str, Any]:
        """The agent's response to an upstream's answer: an error as it came, a result with only the
        per-hop parts rewritten for the request's era (``hop.downstream_result``, ``hop.modern_error``:
        ``passed`` names the codes 2026-07-28 defines that the upstream may have meant for the agent)."""
        if "error" in body:
            error = modern_error(body["error"], passed=passed) if entry.modern else body["error"]
            return _response(entry.message.id, {"error": error})
        result = downstream_result(body.get("result"), method=entry.message.method, modern=entry.modern)
        return _response(entry.message.id, {"result": result})

    def result(self, entry: Inflight, result: Mapping[str, Any]) -> dict[str, Any]:
        """The agent's response to a result the gateway wrote itself, in the request's era
        (``hop.gateway_result``)."""
        method = entry.message.method
        assert method is not None and entry.message.id is not None
        return result_response(entry.message.id, gateway_result(result, method=method, modern=entry.modern))
