"""One agent connection: ``DownstreamSession``, whatever transport carries it (stdio, HTTP, in-process).

Invariant: only ``tools/call`` is decided, and a call reaches an upstream only after the decider said
``allow`` for the namespaced name the agent used and the exact arguments the upstream receives. Every
request an agent sends gets exactly one answer (unless the agent cancelled it): the upstream's, with
only the per-hop parts rewritten (``hop.py``), or one written by the gateway.

Theory of operation. A transport feeds the session parsed messages (``handle``) and gives it an
``Outbound`` to write to. Each request runs in its own cancel scope, so ``notifications/cancelled``
(or, at 2026-07-28 over HTTP, a closed connection) stops it and tells the upstream. The session
knows its era: 2025-11-25 and older after ``initialize``, or 2026-07-28 from the per-request envelope,
which is checked with the SDK's inbound ladder before anything else. Requests the gateway relays to
the agent (an upstream's sampling or elicitation) get ids of the session's own, and so do the
gateway's own approval questions: during a tools/call's decision the session offers the approval
gate a ``client_link`` (an ``elicitation/create`` on this session, when the agent declared form
elicitation; the gateway's ``requestState`` of a 2026-07-28 retry, which is never forwarded). The shared tables and
the upstreams live in the ``Gateway`` (``hub.py``).

Who answers what:

=========================  ==============================================================================
initialize, ping           the gateway (capabilities: the union of what upstreams offer; serverInfo drawbridge)
server/discover            the gateway (2026-07-28)
tools/list                 the gateway, from the merged catalogue (``server.tool`` names), per agent
tools/call                 decided, then forwarded to the tool's upstream with the prefix removed
prompts/list               every upstream that offers prompts, merged, names namespaced like tools
prompts/get                the upstream named by the prefix, prefix removed
resources/list, templates  every upstream that offers resources, merged; URIs are not rewritten
resources/read, subscribe  the upstream that listed the URI (or whose template matches it)
completion/complete        by the reference: a namespaced prompt, or a resource URI
logging/setLevel           answered by the gateway and not forwarded (upstream sessions are shared)
subscriptions/listen       the gateway (2026-07-28): the list changes of tools, prompts and resources
anything else              -32601: the gateway cannot tell which upstream serves it
=========================  ==============================================================================
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
from mcp.shared.inbound import InboundLadderRejection, classify_inbound_request

import drawbridge
from drawbridge.catalogue.merged import build_catalogue
from drawbridge.catalogue.names import split_namespaced, tool_name_problem
from drawbridge.gateway.pipeline.call import Flight, GatewayError, GatewayResult, UpstreamAnswer
from drawbridge.gateway.pipeline.client_link import Elicit, declares_form_elicitation
from drawbridge.gateway.protocol.eras import MODERN_VERSION, PROTOCOL_VERSION_META_KEY, negotiate_version
from drawbridge.gateway.protocol.hop import downstream_result, gateway_result, outbound_params, progress_token
from drawbridge.gateway.protocol.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    UPSTREAM_EXITED,
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
from drawbridge.gateway.protocol.methods import CANCELLED, ELICIT, TOOLS_CALL, looks_like_tools_call
from drawbridge.gateway.serve.agents import NoBackChannel, Outbound
from drawbridge.gateway.serve.hub import Gateway
from drawbridge.gateway.upstreams.session import UpstreamLost, UpstreamSession, UpstreamUnavailable

logger = logging.getLogger("drawbridge.gateway")

SERVER_INFO: Final[Mapping[str, str]] = {"name": "drawbridge", "version": drawbridge.__version__}
SERVER_INFO_META_KEY: Final = "io.modelcontextprotocol/serverInfo"
SUBSCRIPTION_ID_META_KEY: Final = "io.modelcontextprotocol/subscriptionId"
NO_LISTEN_STREAM: Final = "invalid request: subscriptions/listen needs a response stream (Accept: text/event-stream)"
LISTEN_EVENTS: Final[Mapping[str, str]] = {
    "toolsListChanged": "notifications/tools/list_changed",
    "promptsListChanged": "notifications/prompts/list_changed",
    "resourcesListChanged": "notifications/resources/list_changed",
}
"""The list changes a 2026-07-28 agent can listen for, by the filter field that asks for them."""


def notification(method: str, params: Mapping[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": dict(params)}




def _response(request_id: RequestId | None, body: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
    if "error" in body:
        out["error"] = body["error"]
    else:
        out["result"] = body.get("result")
    return out


def error_response(request_id: RequestId | None, code: int, message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
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


class _Timeout(Exception):
    pass


# ------------------------------------------------------------------------------- downstream session


@dataclass(eq=False)
class _Inflight:
    message: Message
    modern: bool
    version: str | None
    scope: anyio.CancelScope | None = None
    cancelled: bool = False


@dataclass(eq=False)
class _Reply:
    done: anyio.Event = field(default_factory=anyio.Event)
    body: dict[str, Any] | None = None


Handler = Callable[["DownstreamSession", _Inflight], Awaitable[dict[str, Any]]]


class DownstreamSession:
    """One agent connection. Transport-independent: fed parsed messages, writes through ``outbound``."""

    def __init__(self, gateway: Gateway, agent: str, outbound: Outbound, *, transport: str) -> None:
        self.gateway = gateway
        self.agent = agent
        self.outbound = outbound
        self.transport = transport
        self.version: str | None = None
        self.initialized = False
        self.client_capabilities: dict[str, Any] = {}
        self.closed = False
        self._inflight: dict[IdKey, _Inflight] = {}
        self._outgoing: dict[IdKey, _Reply] = {}
        self._next_id = 0

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
            if not envelope_checked:
                verdict = classify_inbound_request(message.body)
                if isinstance(verdict, InboundLadderRejection):
                    return error_response(message.id, verdict.code, verdict.message, verdict.data)
            modern, version = True, MODERN_VERSION
            if self.version is None:
                self.version = MODERN_VERSION  # like an SDK server, the connection now serves 2026-07-28
        entry = _Inflight(message, modern, version)
        self._inflight[key] = entry
        try:
            with anyio.CancelScope() as scope:
                entry.scope = scope
                return await self._dispatch(entry)
            return None
        finally:
            if self._inflight.get(key) is entry:
                del self._inflight[key]

    async def _dispatch(self, entry: _Inflight) -> dict[str, Any]:
        message = entry.message
        method = message.method
        assert method is not None
        if looks_like_tools_call(method):
            detail = "method not found: the method is not exactly 'tools/call' and is refused"
            await self.gateway.incident("invalid_message", "client", detail, METHOD_NOT_FOUND)
            return error_response(message.id, METHOD_NOT_FOUND, detail)
        handler = _HANDLERS.get(method)
        if handler is None:
            return error_response(
                message.id,
                METHOD_NOT_FOUND,
                "method not found: the gateway does not know which upstream serves this method",
            )
        if not entry.modern and self.version is None and method not in ("initialize", "ping"):
            return error_response(
                message.id,
                INVALID_REQUEST,
                "invalid request: the session is not initialized (send initialize, or a 2026-07-28 request envelope)",
            )
        try:
            return await handler(self, entry)
        except MessageError as exc:
            return error_response(message.id, exc.code, exc.message)

    async def handle_notification(self, message: Message) -> None:
        method = message.method
        params = message.params
        if method == "notifications/initialized":
            if self.version is not None and not self.modern:
                self.initialized = True
            return
        if method == CANCELLED:
            self.cancel_request(params.get("requestId") if isinstance(params, dict) else None)
            return
        if method == "notifications/progress" and isinstance(params, dict):
            upstream = self.gateway.client_progress_upstream(self, params.get("progressToken"))
            if upstream is not None:
                try:
                    await upstream.notify(method, params)
                except (UpstreamLost, UpstreamUnavailable):
                    pass
            return
        if method is not None and (method == TOOLS_CALL or looks_like_tools_call(method)):
            await self.gateway.incident(
                "tools_call_notification", "client", "a tools/call without an id was dropped (it cannot be answered)"
            )
            return
        logger.debug("a client notification with no upstream to go to was dropped")

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
        entry: _Inflight,
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
            call = await upstream.send_request(method, outbound_params(params, **rewrite))
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

    async def _relay(
        self, entry: _Inflight, upstream: UpstreamSession, params: Mapping[str, Any] | None, **rewrite: Any
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
        return self._answer(entry, body)

    def _answer(self, entry: _Inflight, body: Mapping[str, Any]) -> dict[str, Any]:
        if "error" in body:
            return _response(entry.message.id, body)
        result = downstream_result(body.get("result"), method=entry.message.method, modern=entry.modern)
        return _response(entry.message.id, {"result": result})

    def _result(self, entry: _Inflight, result: Mapping[str, Any]) -> dict[str, Any]:
        method = entry.message.method
        assert method is not None and entry.message.id is not None
        return result_response(entry.message.id, gateway_result(result, method=method, modern=entry.modern))

    # ---------------------------------------------------------------------------- handlers

    async def _initialize(self, entry: _Inflight) -> dict[str, Any]:
        message = entry.message
        if entry.modern:
            return error_response(message.id, INVALID_REQUEST, "invalid request: initialize is not part of 2026-07-28")
        if self.version is not None:
            return error_response(message.id, INVALID_REQUEST, "invalid request: the session is already initialized")
        params = message.params if isinstance(message.params, dict) else {}
        self.version = negotiate_version(params.get("protocolVersion"))
        capabilities = params.get("capabilities")
        self.client_capabilities = dict(capabilities) if isinstance(capabilities, dict) else {}
        result: dict[str, Any] = {
            "protocolVersion": self.version,
            "capabilities": self.gateway.capabilities(),
            "serverInfo": dict(SERVER_INFO),
        }
        instructions = self.gateway.instructions()
        if instructions is not None:
            result["instructions"] = instructions
        return self._result(entry, result)

    async def _discover(self, entry: _Inflight) -> dict[str, Any]:
        result: dict[str, Any] = {
            "supportedVersions": [MODERN_VERSION],
            "capabilities": self.gateway.capabilities(),
            "_meta": {SERVER_INFO_META_KEY: dict(SERVER_INFO)},
        }
        instructions = self.gateway.instructions()
        if instructions is not None:
            result["instructions"] = instructions
        return result_response(
            entry.message.id,  # type: ignore[arg-type]
            gateway_result(result, method="server/discover", modern=True),
        )

    async def _ping(self, entry: _Inflight) -> dict[str, Any]:
        return self._result(entry, {})

    async def _set_level(self, entry: _Inflight) -> dict[str, Any]:
        return self._result(entry, {})

    async def _tools_list(self, entry: _Inflight) -> dict[str, Any]:
        params = entry.message.params
        if isinstance(params, dict) and params.get("cursor") is not None:
            return error_response(entry.message.id, INVALID_PARAMS, "invalid params: the gateway issued no such cursor")
        # Per agent: under hide_denied_tools the list leaves out what the agent could only be refused
        # (calls are still decided). gateway_result marks 2026-07-28 lists cacheScope "private".
        return self._result(entry, {"tools": self.gateway.listing_for(self.agent)})

    async def _tools_call(self, entry: _Inflight) -> dict[str, Any]:
        """Handed to the pipeline whole (``pipeline.call``): it decides, forwards, records, answers."""
        flight = await self.gateway.pipeline.call(
            entry.message, agent=self.agent, version=entry.version, replier=_CallReplier(self, entry),
            resolver=self.gateway,
        )
        answer = flight.answer
        message_id = entry.message.id
        if isinstance(answer, UpstreamAnswer):
            return self._answer(entry, answer.body)
        if isinstance(answer, GatewayResult):
            assert message_id is not None
            return result_response(message_id, answer.result)
        assert isinstance(answer, GatewayError)
        return error_response(message_id, answer.code, answer.message)

    def _elicit(self, entry: _Inflight) -> Elicit | None:
        """How the approval stage may ask this agent in-band: a gateway-originated
        ``elicitation/create`` on this session's own request ids (the mechanism that relays an
        upstream's elicitation), when the agent declared form elicitation."""
        if entry.modern or not self.back_channel or not declares_form_elicitation(self.client_capabilities):
            return None
        related = entry.message.id

        async def ask(_call: Any, params: Mapping[str, Any]) -> Mapping[str, Any]:
            answer = await self.request(ELICIT, dict(params), related)
            result = answer.get("result")
            if "error" in answer or not isinstance(result, dict):
                raise NoBackChannel("the agent answered the approval question with an error")
            return result

        return ask

    async def _fan_out(self, method: str, key: str, capability: str) -> dict[str, list[Any]]:
        """Every page of ``method`` from every ready upstream offering ``capability``, by upstream name."""
        upstreams = [u for u in self.gateway.upstreams.values() if u.ready and capability in u.capabilities]
        found: dict[str, list[Any]] = {}

        async def one(upstream: UpstreamSession) -> None:
            try:
                found[upstream.name] = await upstream.list_all(method, key)
            except Exception as exc:  # noqa: BLE001 -- the others still answer
                logger.warning("upstream %r: %s failed (%s); its items are left out", upstream.name, method, exc)

        async with anyio.create_task_group() as tg:
            for upstream in upstreams:
                tg.start_soon(one, upstream)
        return {u.name: found[u.name] for u in upstreams if u.name in found}

    async def _prompts_list(self, entry: _Inflight) -> dict[str, Any]:
        found = await self._fan_out("prompts/list", "prompts", "prompts")
        catalogue = build_catalogue(list(found.items()), "prompt")
        for problem in catalogue.problems:
            logger.warning("prompt not served: %s", problem.describe())
        return self._result(entry, {"prompts": catalogue.listing()})

    def _named_route(self, entry: _Inflight, name: Any, kind: str) -> tuple[UpstreamSession, str]:
        if not isinstance(name, str):
            raise MessageError(INVALID_PARAMS, f"invalid params: the {kind} name must be a string", entry.message.id)
        problem = tool_name_problem(name)
        split = split_namespaced(name) if problem is None else None
        upstream = self.gateway.upstreams.get(split[0]) if split is not None else None
        if upstream is None or split is None:
            raise MessageError(
                INVALID_PARAMS,
                f"invalid params: unknown {kind}: names are <server>{'.'}<{kind}> (see {kind}s/list)",
                entry.message.id,
            )
        return upstream, split[1]

    async def _prompts_get(self, entry: _Inflight) -> dict[str, Any]:
        params = entry.message.params if isinstance(entry.message.params, dict) else {}
        upstream, name = self._named_route(entry, params.get("name"), "prompt")
        return await self._relay(entry, upstream, params, name=name)

    async def _resources_list(self, entry: _Inflight) -> dict[str, Any]:
        found = await self._fan_out("resources/list", "resources", "resources")
        merged: list[Any] = []
        for name, items in found.items():
            self.gateway.learn_resources(name, items)
            merged.extend(items)
        return self._result(entry, {"resources": merged})

    async def _templates_list(self, entry: _Inflight) -> dict[str, Any]:
        found = await self._fan_out("resources/templates/list", "resourceTemplates", "resources")
        merged: list[Any] = []
        for name, items in found.items():
            self.gateway.learn_templates(name, items)
            merged.extend(items)
        return self._result(entry, {"resourceTemplates": merged})

    async def _uri_route(self, entry: _Inflight, uri: Any) -> UpstreamSession:
        if not isinstance(uri, str) or not uri:
            raise MessageError(INVALID_PARAMS, "invalid params: uri must be a non-empty string", entry.message.id)
        upstream = self.gateway.resource_upstream(uri)
        if upstream is None:
            await self.gateway.relearn_resources()
            upstream = self.gateway.resource_upstream(uri)
        if upstream is None:
            raise MessageError(
                INVALID_PARAMS, "invalid params: no upstream lists this resource URI or a template matching it", entry.message.id
            )
        return upstream

    async def _by_uri(self, entry: _Inflight) -> dict[str, Any]:
        params = entry.message.params if isinstance(entry.message.params, dict) else {}
        upstream = await self._uri_route(entry, params.get("uri"))
        return await self._relay(entry, upstream, params)

    async def _subscribe(self, entry: _Inflight) -> dict[str, Any]:
        """``resources/subscribe`` and ``resources/unsubscribe``: the upstream hears the first
        subscribe and the last unsubscribe of a URI (``subscriptions.py``); the others are answered
        here, so one agent's unsubscribe never ends another's updates."""
        params = entry.message.params if isinstance(entry.message.params, dict) else {}
        uri = params.get("uri")
        upstream = await self._uri_route(entry, uri)
        assert isinstance(uri, str)

        async def relay() -> dict[str, Any]:
            if not upstream.modern:
                return await self._relay(entry, upstream, params)
            # 2026-07-28 upstreams take no resources/subscribe: the gateway changes its listen stream.
            if entry.message.method == "resources/subscribe":
                body = await self.gateway.subscribe_upstream(upstream, uri)
            else:
                body = await self.gateway.unsubscribe_upstream(upstream, uri)
            return _response(entry.message.id, body) if "error" in body else self._result(entry, {})

        if entry.message.method == "resources/subscribe":
            answer = await self.gateway.join(upstream.name, uri, self, relay)
        else:
            answer = await self.gateway.leave(upstream.name, uri, self, relay)
        return answer if answer is not None else self._result(entry, {})

    async def _listen(self, entry: _Inflight) -> dict[str, Any]:
        """``subscriptions/listen`` (2026-07-28): acknowledge what is honored, then relay the list
        changes and resource updates asked for, tagged with the stream's id, until the agent cancels
        (closes) it or the gateway stops (then the result ends the stream). A resource is honored
        when its URI routes to an upstream that subscribes to it (the stream is then one of its
        subscribers, ``subscriptions.py``); the others are left out of the acknowledgement."""
        message = entry.message
        assert message.id is not None
        if not entry.modern:
            return error_response(
                message.id, METHOD_NOT_FOUND,
                "method not found: subscriptions/listen is part of 2026-07-28; this session is told of "
                "changes by list_changed notifications",
            )
        params = message.params if isinstance(message.params, dict) else {}
        wanted = params.get("notifications")
        if not isinstance(wanted, dict):
            return error_response(message.id, INVALID_PARAMS, "invalid params: notifications must be an object")
        honored: dict[str, Any] = {}
        methods = set()
        for field_name, method in LISTEN_EVENTS.items():
            value = wanted.get(field_name)
            if value is not None and not isinstance(value, bool):
                return error_response(message.id, INVALID_PARAMS, f"invalid params: {field_name} must be a boolean")
            if value:
                honored[field_name] = True
                methods.add(method)
        uris = wanted.get("resourceSubscriptions")
        if uris is not None and not (isinstance(uris, list) and all(isinstance(uri, str) for uri in uris)):
            return error_response(
                message.id, INVALID_PARAMS, "invalid params: resourceSubscriptions must be a list of strings"
            )
        has_stream = getattr(self.outbound, "has_stream", None)
        if has_stream is not None and not has_stream(message.id):
            return error_response(message.id, INVALID_REQUEST, NO_LISTEN_STREAM)
        meta = {SUBSCRIPTION_ID_META_KEY: message.id}
        token, events = self.gateway.listen(frozenset(methods))
        try:
            asked = dict.fromkeys(uris or ())
            subscribed = [uri for uri in asked if await self._listen_to(entry, token, uri)]
            if subscribed:
                honored["resourceSubscriptions"] = subscribed
            ack = {"notifications": honored, "_meta": meta}
            if not await self.emit(notification("notifications/subscriptions/acknowledged", ack), message.id):
                return error_response(message.id, INVALID_REQUEST, NO_LISTEN_STREAM)
            async with events:
                async for method, params in events:
                    if not await self.emit(notification(method, {**params, "_meta": meta}), message.id):
                        break
        finally:
            self.gateway.unlisten(token)
        return result_response(message.id, {"_meta": meta})

    async def _listen_to(self, entry: _Inflight, token: object, uri: str) -> bool:
        """Make a listen stream a subscriber of ``uri``; False when no upstream serves it or the
        one that does would not subscribe."""
        try:
            upstream = await self._uri_route(entry, uri)
        except MessageError:
            return False

        async def subscribe() -> dict[str, Any]:
            return await self.gateway.subscribe_upstream(upstream, uri)

        answer = await self.gateway.join(upstream.name, uri, token, subscribe)
        return answer is None or "result" in answer

    async def _complete(self, entry: _Inflight) -> dict[str, Any]:
        params = entry.message.params if isinstance(entry.message.params, dict) else {}
        ref = params.get("ref")
        if not isinstance(ref, dict):
            return error_response(entry.message.id, INVALID_PARAMS, "invalid params: ref must be an object")
        if ref.get("type") == "ref/prompt":
            upstream, name = self._named_route(entry, ref.get("name"), "prompt")
            return await self._relay(entry, upstream, params, name={**ref, "name": name}, name_key="ref")
        if ref.get("type") == "ref/resource":
            upstream = await self._uri_route(entry, ref.get("uri"))
            return await self._relay(entry, upstream, params)
        return error_response(entry.message.id, INVALID_PARAMS, "invalid params: ref.type must be ref/prompt or ref/resource")


_HANDLERS: Final[Mapping[str, Handler]] = {
    "initialize": DownstreamSession._initialize,
    "ping": DownstreamSession._ping,
    "server/discover": DownstreamSession._discover,
    "tools/list": DownstreamSession._tools_list,
    "tools/call": DownstreamSession._tools_call,
    "prompts/list": DownstreamSession._prompts_list,
    "prompts/get": DownstreamSession._prompts_get,
    "resources/list": DownstreamSession._resources_list,
    "resources/templates/list": DownstreamSession._templates_list,
    "resources/read": DownstreamSession._by_uri,
    "resources/subscribe": DownstreamSession._subscribe,
    "resources/unsubscribe": DownstreamSession._subscribe,
    "completion/complete": DownstreamSession._complete,
    "logging/setLevel": DownstreamSession._set_level,
    "subscriptions/listen": DownstreamSession._listen,
}


def open_session(gateway: Gateway, agent: str, outbound: Outbound, *, transport: str) -> DownstreamSession:
    """A new agent connection on ``gateway``: registered there until it closes."""
    session = DownstreamSession(gateway, agent, outbound, transport=transport)
    gateway.sessions.add(session)
    return session


class _CallReplier:
    """The pipeline's ``Replier`` for one tools/call of a session: the session answers it itself (the
    pipeline's ``call`` returns the flight), so nothing is delivered here."""

    __slots__ = ("entry", "session")

    def __init__(self, session: DownstreamSession, entry: _Inflight) -> None:
        self.session = session
        self.entry = entry

    def elicit(self, flight: Flight) -> Elicit | None:
        return self.session._elicit(self.entry)  # noqa: SLF001 -- the session's own helper

    def deliver(self, flights: Sequence[Flight]) -> None:
        return None
