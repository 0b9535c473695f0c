"""Streamable HTTP at ``/mcp``: the agents' side of ``drawbridge serve``, as a Starlette app.

Invariant: an HTTP request reaches any route of the agents' listener (``/mcp``, ``/healthz``,
``/readyz``, the OAuth metadata) only when it names a host the listener answers to (``HostGuard``,
``http_hosts``: ``Host``, and ``Origin`` when present, against ``listen.allowed_hosts``; 421 and 403
otherwise, recorded), and a ``DownstreamSession`` only with an identity (``http_auth``: one bearer
token that matches a configured agent or, with ``auth.oauth``, a verified access token for this
resource; or the anonymous agent when no ``Authorization`` is presented at all). A session belongs to
the credential that created it (``Identity.credential``: a static token, the anonymous agent, or an
OAuth issuer and subject), not only to its agent id; the same id presented with another credential
is unknown (404). Session ids are minted by the gateway at ``initialize`` and never taken from the
client (fixation defence). One credential's sessions never end another's (an OAuth subject mapped to
a static agent's id counts apart from the static token): a credential holds at most
``max_sessions_per_agent`` (its least recently used one ends when it opens one more), and when the
gateway holds ``max_sessions`` a credential with none of its own is refused (503), never given room.

Theory of operation. ``POST /mcp`` reads at most ``max_message_bytes`` (413 beyond, with a JSON-RPC
error), parses one JSON-RPC message strictly and picks the era (``eras.http_era_is_modern``): 2026-07-28
when the body's envelope names it or any ``MCP-Protocol-Version`` sent does, whatever the headers'
order, so that a routing header missing, repeated or not matching the body is answered -32020:

* 2025-11-25 and earlier (sessions): ``initialize`` creates a session and answers with its
  ``Mcp-Session-Id``; every other message needs a known session (400 without the header, 404 for an
  unknown id); notifications and responses are answered 202. A request is answered with JSON, unless
  the agent accepts ``text/event-stream`` and the upstream sends something for that request first
  (progress, an elicitation): then the answer becomes an SSE stream carrying those messages and, last,
  the response. ``GET /mcp`` opens the session's stream for messages that belong to no request
  (list changes, server requests that could not be tied to a POST); ``DELETE /mcp`` ends the session.
* 2026-07-28 (stateless): each POST is a whole exchange with a fresh session. The request is checked by
  the SDK's inbound ladder (``serve.envelope``: envelope, ``Mcp-Method``/``Mcp-Name`` against the body,
  version), errors get the status the spec's table gives them (``Mcp-Param-*`` against the arguments:
  ``http_params``; an answer's: ``http_wire.answer_status``), notifications are answered 202, closing
  the connection cancels the request, and every refusal is recorded as over stdio (``invalid_message``).

Where a session's messages wait for their stream is ``http_mailbox.py``; the bytes on the wire (the
body read, JSON answers, SSE framing) are ``http_wire.py``. ``build_app`` returns the Starlette app
with this route, the routes passed in (the health checks) and the Host check in front of them all.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from drawbridge.gateway.protocol.eras import HANDSHAKE_PROTOCOL_VERSIONS, http_era_is_modern
from drawbridge.gateway.protocol.jsonrpc import (
    INVALID_REQUEST,
    Kind,
    Message,
    MessageError,
    RequestId,
    incident_kind,
    parse_client_message,
)
from drawbridge.gateway.protocol.methods import INITIALIZE
from drawbridge.gateway.protocol.modern import header_missing_said
from drawbridge.gateway.serve.downstream_session import (
    DownstreamSession,
    error_response,
    refuse_call_notification,
)
from drawbridge.gateway.serve.envelope import EnvelopeRefusal, envelope_refusal, unsupported_version
from drawbridge.gateway.serve.hub import Gateway
from drawbridge.gateway.serve.routes import open_session
from drawbridge.gateway.transports.http_auth import Authenticator, Identity, Refusal
from drawbridge.gateway.transports.http_deadlines import peer_text
from drawbridge.gateway.transports.http_hosts import HostGuard
from drawbridge.gateway.transports.http_identity import AUTH_REPEATED, HttpSettings
from drawbridge.gateway.transports.http_params import ParamHeaders
from drawbridge.gateway.transports.http_mailbox import HttpOutbound, Mailbox
from drawbridge.gateway.transports.http_wire import (
    TooLarge,
    accepts,
    answer_status,
    header_values,
    headers_of,
    raw_headers,
    read_body,
    send_error,
    send_json,
    send_status,
    stream_answer,
    stream_mailbox,
)
from drawbridge.gateway.upstreams.sdk_parts import MCP_PROTOCOL_VERSION_HEADER, inbound

logger = logging.getLogger("drawbridge.gateway.http")

MCP_PATH: Final = "/mcp"
SESSION_HEADER: Final = "mcp-session-id"
RESPONSE_IN_MODERN: Final = EnvelopeRefusal(
    INVALID_REQUEST, "invalid request: a 2026-07-28 client does not send responses"
)
SESSIONS_FULL: Final = (
    "service unavailable: the gateway holds as many sessions as it may (limits.max_sessions), none of them "
    "this credential's; try again once sessions end"
)


@dataclass(eq=False)
class _HttpSession:
    id: str
    agent: str
    credential: str
    session: DownstreamSession
    outbound: HttpOutbound
    last_used: float = field(default_factory=time.monotonic)
    get_open: bool = False


class McpEndpoint:
    """The ASGI app behind ``/mcp``."""

    def __init__(self, gateway: Gateway, settings: HttpSettings, auth: Authenticator | None = None) -> None:
        self.gateway = gateway
        self.settings = settings
        self.auth = auth if auth is not None else Authenticator(settings, None, None)
        self.params = ParamHeaders(gateway)
        self.sessions: dict[str, _HttpSession] = {}
        self.by_credential: dict[str, dict[str, _HttpSession]] = {}  # the limits count these, not agent ids

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = headers_of(scope)
        method = scope["method"]
        if method not in ("POST", "GET", "DELETE"):
            await send_error(
                send, 405, INVALID_REQUEST, "method not allowed: /mcp takes POST, GET and DELETE",
                extra=[("allow", "GET, POST, DELETE")],
            )
            return
        authorization = header_values(scope, "authorization")
        if len(authorization) > 1:
            await self.gateway.incident("repeated_authorization", "client", AUTH_REPEATED, INVALID_REQUEST)
            challenge = ("www-authenticate", self.auth.challenge("invalid_request", AUTH_REPEATED))
            await send_error(send, 401, INVALID_REQUEST, AUTH_REPEATED, extra=[challenge])
            return
        peer = _peer(scope)
        identity = await self.auth.authenticate(authorization[0] if authorization else None, peer)
        if isinstance(identity, Refusal):
            await send_error(
                send, identity.status, INVALID_REQUEST, identity.message, extra=[("www-authenticate", identity.challenge)]
            )
            return
        if method == "POST":
            await self._post(scope, receive, send, headers, identity)
        elif method == "GET":
            await self._get(scope, receive, send, headers, identity)
        else:
            await self._delete(send, headers, identity)

    # -- sessions

    def _lookup(self, headers: Mapping[str, str], identity: Identity) -> _HttpSession | None | str:
        sid = headers.get(SESSION_HEADER)
        if not sid:
            return "missing"
        state = self.sessions.get(sid)
        if state is None or state.session.closed:
            return None
        if (state.agent, state.credential) != (identity.agent, identity.credential):
            return None
        state.last_used = time.monotonic()
        return state

    async def _session_error(self, send: Send, found: _HttpSession | None | str, request_id: RequestId | None) -> bool:
        if found == "missing":
            await send_error(
                send, 400, INVALID_REQUEST, "invalid request: missing Mcp-Session-Id (send initialize first)", request_id
            )
            return True
        if found is None:
            await send_error(send, 404, INVALID_REQUEST, "invalid request: unknown or ended session", request_id)
            return True
        return False

    async def _new_session(self, identity: Identity) -> _HttpSession | None:
        """A session for ``identity``, or None when the gateway is full of other credentials' sessions:
        the room is made and the session registered before anything is awaited, so initializes that
        arrive together cannot pass a limit between them; the sessions that make room end after.
        """
        agent = identity.agent
        ending = self._make_room(identity)
        state: _HttpSession | None = None
        if len(self.sessions) < self.settings.max_sessions:
            sid = secrets.token_urlsafe(32)
            outbound = HttpOutbound(unsolicited=True)
            session = open_session(self.gateway, agent, outbound, transport="http")
            session.session_id = sid
            state = _HttpSession(sid, agent, identity.credential, session, outbound)
            self.sessions[sid] = state
            self.by_credential.setdefault(identity.credential, {})[sid] = state
        for old in ending:
            await self._close(old)
        return state

    def _make_room(self, identity: Identity) -> list[_HttpSession]:
        """Forget the sessions that make room for one more of ``identity``'s: only its own, or ended ones."""
        ending: list[_HttpSession] = []
        agent, own = identity.agent, self.by_credential.get(identity.credential, {})

        def forget(state: _HttpSession) -> None:
            self._forget(state)
            ending.append(state)

        for state in [s for s in own.values() if s.session.closed]:
            forget(state)
        while len(own) >= self.settings.max_sessions_per_agent:
            logger.info(
                "closing the least recently used HTTP session of agent %s "
                "(limits.max_sessions_per_agent is %d)", agent, self.settings.max_sessions_per_agent,
            )
            forget(min(own.values(), key=lambda s: s.last_used))
        if len(self.sessions) >= self.settings.max_sessions:
            for state in [s for s in self.sessions.values() if s.session.closed]:
                forget(state)
        if len(self.sessions) >= self.settings.max_sessions and own:
            logger.info(
                "closing the least recently used HTTP session of agent %s (limits.max_sessions is %d)",
                agent, self.settings.max_sessions,
            )
            forget(min(own.values(), key=lambda s: s.last_used))
        return ending

    def _forget(self, state: _HttpSession) -> None:
        self.sessions.pop(state.id, None)
        own = self.by_credential.get(state.credential)
        if own is not None:
            own.pop(state.id, None)
            if not own:
                del self.by_credential[state.credential]

    async def _close(self, state: _HttpSession) -> None:
        state.outbound.mailbox.close()
        await state.session.close()

    async def _end(self, state: _HttpSession) -> None:
        self._forget(state)
        await self._close(state)

    async def close(self) -> None:
        for state in list(self.sessions.values()):
            await self._end(state)

    # -- POST

    async def _post(
        self, scope: Scope, receive: Receive, send: Send, headers: Mapping[str, str], identity: Identity
    ) -> None:
        agent = identity.agent
        content_type = headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type != "application/json":
            await send_error(send, 415, INVALID_REQUEST, "invalid request: Content-Type must be application/json")
            return
        if not accepts(headers, "application/json"):
            await send_error(send, 406, INVALID_REQUEST, "invalid request: the client must accept application/json")
            return
        declared = headers.get("content-length")
        try:
            body = await read_body(
                receive, self.settings.max_message_bytes, int(declared) if declared and declared.isdigit() else None
            )
        except TooLarge as exc:
            fate = "it was discarded unread" if exc.unread else "it was discarded once that much was read"
            detail = (
                f"invalid request: message of at least {exc.size} bytes exceeds the limit of "
                f"{self.settings.max_message_bytes} bytes; {fate}"
            )
            await self.gateway.incident("oversize", "client", detail, INVALID_REQUEST)
            await send_error(send, 413, INVALID_REQUEST, detail)
            return
        except anyio.EndOfStream:
            return
        try:
            message = parse_client_message(body, self.settings.max_depth)
        except MessageError as exc:
            await self.gateway.incident(incident_kind(exc), "client", exc.message, exc.code)
            await send_error(send, 400, exc.code, exc.message, exc.request_id)
            return
        if (refusal := self.auth.check_message(identity, message, _peer(scope))) is not None:
            await send_error(
                send, refusal.status, INVALID_REQUEST, refusal.message, message.id,
                extra=[("www-authenticate", refusal.challenge)],
            )
            return
        if http_era_is_modern(message.body, header_values(scope, MCP_PROTOCOL_VERSION_HEADER)):
            await self._post_modern(scope, receive, send, headers, agent, message)
            return
        version = headers.get(MCP_PROTOCOL_VERSION_HEADER)
        if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS and message.method != INITIALIZE:
            # -32022 with the versions served, so a dual-era client can fall back (2026-07-28 versioning)
            await self._refuse(send, message, unsupported_version(version), agent)
            return
        if message.kind is Kind.REQUEST and message.method == INITIALIZE:
            state = await self._new_session(identity)
            if state is None:
                await self.gateway.incident("session_limit", "client", SESSIONS_FULL, INVALID_REQUEST)
                await send_error(
                    send, 503, INVALID_REQUEST, SESSIONS_FULL, message.id, extra=[("retry-after", "5")]
                )
                return
            response = await state.session.handle_request(message)
            if response is None or "error" in response:
                await self._end(state)
                await send_json(send, 200, response or error_response(message.id, INVALID_REQUEST, "cancelled"))
                return
            await send_json(send, 200, response, [(SESSION_HEADER, state.id)])
            return
        found = self._lookup(headers, identity)
        if await self._session_error(send, found, message.id):
            return
        assert isinstance(found, _HttpSession)
        if message.kind is not Kind.REQUEST:
            await found.session.handle(message)
            await send_status(send, 202)
            return
        await self._answer(scope, receive, send, headers, found.session, found.outbound, message, modern=False)

    async def _post_modern(
        self, scope: Scope, receive: Receive, send: Send, headers: Mapping[str, str], agent: str, message: Message
    ) -> None:
        if message.kind is Kind.RESPONSE:
            await self._refuse(send, message, RESPONSE_IN_MODERN, agent)
            return
        if message.kind is Kind.NOTIFICATION:
            await refuse_call_notification(self.gateway, message.method)
            await send_status(send, 202)
            return
        rejection = self._refusal(scope, headers, message)
        if rejection is not None:
            await self._refuse(send, message, rejection, agent)
            return
        outbound = HttpOutbound(unsolicited=False)
        session = open_session(self.gateway, agent, outbound, transport="http")
        try:
            await self._answer(scope, receive, send, headers, session, outbound, message, modern=True)
        finally:
            await session.close()

    def _refusal(self, scope: Scope, headers: Mapping[str, str], message: Message) -> EnvelopeRefusal | None:
        """A 2026-07-28 request's routing headers and envelope, as MCP's inbound ladder checks them
        (``serve.envelope``), then its ``Mcp-Param-*`` headers (``http_params``)."""
        duplicated = inbound().find_duplicated_routing_header(raw_headers(scope))
        if duplicated is not None:
            return EnvelopeRefusal(inbound().HEADER_MISMATCH, f"{duplicated} header appears more than once")
        refused = envelope_refusal(message.body, headers)
        if refused is not None:
            return dataclasses.replace(refused, message=header_missing_said(refused.message, headers))
        params = self.params.rejection(message, raw_headers(scope))
        return None if params is None else EnvelopeRefusal(params.code, params.message, params.data)

    async def _refuse(self, send: Send, message: Message, refusal: EnvelopeRefusal, agent: str) -> None:
        """A message refused for its form, its headers or its version: recorded (``invalid_message``: the
        rule broken, never the content; the agent) and answered with the status MCP gives the code."""
        await self.gateway.incident("invalid_message", "client", refusal.message, refusal.code, agent=agent)
        status = inbound().ERROR_CODE_HTTP_STATUS.get(refusal.code, 400)
        await send_json(send, status, error_response(message.id, refusal.code, refusal.message, refusal.data))

    async def _answer(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        headers: Mapping[str, str],
        session: DownstreamSession,
        outbound: HttpOutbound,
        message: Message,
        *,
        modern: bool,
    ) -> None:
        """Run one request; answer with JSON, or with SSE once a related message comes first."""
        key = message.key
        box = Mailbox() if accepts(headers, "text/event-stream") else None
        if box is not None:
            outbound.streams[key] = box
        result: list[dict[str, Any] | None] = []
        done = anyio.Event()

        async def work() -> None:
            try:
                result.append(await session.handle_request(message, envelope_checked=modern))
            finally:
                done.set()
                if box is not None:
                    box.close()

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(work)
                if modern:
                    tg.start_soon(self._watch_disconnect, receive, session, message.id)
                early: list[dict[str, Any]] = []
                if box is not None:
                    await box.wait()
                    early = box.drain()
                if early:
                    assert box is not None
                    await stream_answer(send, box, early, done, result, message)
                else:
                    await done.wait()
                    await self._write_final(send, result[0] if result else None, message, modern)
                tg.cancel_scope.cancel()
        finally:
            if box is not None:
                outbound.streams.pop(key, None)

    async def _write_final(
        self, send: Send, response: dict[str, Any] | None, message: Message, modern: bool
    ) -> None:
        if response is None:
            response = error_response(message.id, INVALID_REQUEST, "the request was cancelled")
        status = 200
        if modern and isinstance(response.get("error"), dict):
            status = answer_status(response["error"].get("code"))
        await send_json(send, status, response)

    async def _watch_disconnect(self, receive: Receive, session: DownstreamSession, request_id: RequestId | None) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                session.cancel_request(request_id)
                return

    # -- GET and DELETE

    async def _get(
        self, scope: Scope, receive: Receive, send: Send, headers: Mapping[str, str], identity: Identity
    ) -> None:
        if http_era_is_modern(None, header_values(scope, MCP_PROTOCOL_VERSION_HEADER)):
            await send_error(
                send, 405, INVALID_REQUEST, "method not allowed: 2026-07-28 has no GET stream", extra=[("allow", "POST")]
            )
            return
        if not accepts(headers, "text/event-stream"):
            await send_error(send, 406, INVALID_REQUEST, "invalid request: the client must accept text/event-stream")
            return
        found = self._lookup(headers, identity)
        if await self._session_error(send, found, None):
            return
        assert isinstance(found, _HttpSession)
        if found.get_open:
            await send_error(send, 409, INVALID_REQUEST, "conflict: this session already has an open GET stream")
            return
        found.get_open = True
        try:
            await stream_mailbox(send, receive, found.outbound.mailbox)
        except OSError:
            pass
        finally:
            found.get_open = False

    async def _delete(self, send: Send, headers: Mapping[str, str], identity: Identity) -> None:
        found = self._lookup(headers, identity)
        if await self._session_error(send, found, None):
            return
        assert isinstance(found, _HttpSession)
        await self._end(found)
        await send_status(send, 204)


def _peer(scope: Scope) -> str:
    return peer_text(scope.get("client"))


def build_app(
    gateway: Gateway, settings: HttpSettings, routes: Sequence[BaseRoute] = (), auth: Authenticator | None = None
) -> Starlette:
    """The gateway's HTTP app: ``/mcp`` plus any ``routes`` given (``/healthz``, ``/readyz``), and the
    protected-resource metadata when ``auth`` makes ``/mcp`` an OAuth resource server; each path is
    served as written (no redirect of ``/mcp/`` to ``/mcp``: a redirect would name whatever host the
    request did), and every request passes the ``Host`` check first (``HostGuard``)."""
    endpoint = McpEndpoint(gateway, settings, auth)
    app = Starlette(
        routes=[Route(MCP_PATH, endpoint), *endpoint.auth.routes(), *routes],
        middleware=[Middleware(HostGuard, gateway=gateway, hosts=settings.allowed_hosts)],
    )
    app.router.redirect_slashes = False
    app.state.mcp_endpoint = endpoint
    app.state.gateway = gateway
    return app


def describe_url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}{MCP_PATH}"


__all__ = ["McpEndpoint", "build_app", "describe_url"]
