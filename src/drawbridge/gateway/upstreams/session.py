"""One long-lived MCP client session to one upstream server, shared by every agent's calls.

Invariant: at any moment an upstream has at most one live connection, and every request the gateway
sent on it ends exactly once: with the upstream's own answer, or with ``UpstreamLost`` when that
connection ended first. A request never silently moves to the next connection (the upstream that
would answer it is not the one that received it), and no request is sent while the upstream is not
``ready`` (``UpstreamUnavailable`` says why and when the next attempt is).

Theory of operation. ``run`` is a supervisor loop: connect (spawn the stdio child through
``UpstreamProcess``, or open an HTTP client), run the initialize handshake at 2025-11-25 under the
gateway's own name, send ``notifications/initialized``, load the tool catalogue (``tools/list`` with
cursor pagination), become ``ready``, and wait until the link ends. Then every pending request fails
with ``UpstreamLost`` and the loop waits ``backoff_delay(attempt)`` (1 s doubling to 30 s, with "equal
jitter" from an injected random source) before the next attempt; the attempt counter resets once a
connection has reached ``ready``. ``notifications/tools/list_changed`` reloads the catalogue; reloads
are coalesced, so a burst of notifications costs one reload after the one in progress. An upstream
configured for 2026-07-28 gets ``server/discover`` instead of the handshake, the gateway's envelope on
everything sent to it, and one ``subscriptions/listen`` stream for its changes and the resources
watched (``upstream_modern.py``; ``watch_resources`` replaces the stream when that set changes).

The session speaks raw JSON-RPC dicts and keeps its own id space (integers counting up for the
session's whole life, across reconnects, so a late answer from a dead connection can never match a
new request). Messages from the upstream are dispatched by kind: responses complete their waiter,
``ping`` is answered here, other server requests (sampling, elicitation) and notifications go to the
``UpstreamListener`` (the router), which knows which agent they are for. On streamable HTTP, a message
that arrived on the SSE stream of one of our POSTs carries that request's id as ``related``; on stdio
nothing links a server message to a request, and ``related`` is None.

Streamable HTTP: each request is its own POST (answered with JSON or an SSE stream), notifications and
responses are POSTs answered 202, ``Mcp-Session-Id`` from the initialize answer is sent on every later
request, the negotiated ``MCP-Protocol-Version`` too, and ``Mcp-Method``/``Mcp-Name`` mirror the body
(so the name header always carries the upstream's own, un-namespaced name). A GET SSE stream carries
messages the upstream sends outside any request; when it breaks twice in a row the upstream is taken
for dead. Header values come from the environment variables named in ``headers_env`` and are never
logged; URLs are logged without credentials or query.
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, Protocol
from urllib.parse import urlsplit

import anyio
import httpx
from anyio.abc import TaskGroup, TaskStatus
from mcp.shared.inbound import NAME_BEARING_METHODS, encode_header_value
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

import drawbridge
from drawbridge.config import UpstreamConfig
from drawbridge.gateway.protocol.eras import LATEST_HANDSHAKE_VERSION, MODERN_VERSION
from drawbridge.gateway.protocol.jsonrpc import (
    DEFAULT_MAX_UPSTREAM_MESSAGE_BYTES,
    INTERNAL_ERROR,
    METHOD_NOT_FOUND,
    UPSTREAM_EXITED,
    Kind,
    MessageError,
    Oversize,
    encode_line,
    parse_upstream_message,
)
from drawbridge.gateway.protocol.methods import LISTEN_ACKNOWLEDGED
from drawbridge.gateway.protocol.modern import (
    envelope,
    honored_uris,
    listen_filter,
    read_discover,
    subscription_id,
    with_envelope,
    without_subscription_id,
)
from drawbridge.gateway.upstreams.child_process import (
    EnvFilter,
    EnvPolicy,
    UpstreamGone,
    UpstreamProcess,
    UpstreamStartError,
)

logger = logging.getLogger("drawbridge.gateway.upstream")

INITIAL_BACKOFF_SECONDS: Final = 1.0
MAX_BACKOFF_SECONDS: Final = 30.0
HANDSHAKE_TIMEOUT_SECONDS: Final = 30.0
LIST_TIMEOUT_SECONDS: Final = 30.0
LISTEN_AGAIN_SECONDS: Final = 1.0
"""2026-07-28: how long after an upstream ended the listen stream the gateway opens a new one."""
MAX_LIST_PAGES: Final = 100
HTTP_CONNECT_TIMEOUT_SECONDS: Final = 10.0
HTTP_WRITE_TIMEOUT_SECONDS: Final = 30.0
GET_STREAM_RETRY_SECONDS: Final = 1.0
GET_STREAM_MAX_FAILURES: Final = 2
CLIENT_CAPABILITIES: Final[Mapping[str, Any]] = {"elicitation": {"form": {}, "url": {}}, "sampling": {}}
"""What the gateway declares to upstreams. Sampling and elicitation are relayed to the agent whose call
caused them; roots are not declared, because one shared session cannot speak for several agents' roots."""


def backoff_delay(attempt: int, rand: Callable[[], float]) -> float:
    """Seconds to wait before reconnect attempt ``attempt`` (0-based): 1, 2, 4, ... capped at 30, each
    scaled into [50 %, 100 %] by ``rand()`` (in [0, 1)) so that many gateways do not retry in step."""
    base = min(MAX_BACKOFF_SECONDS, INITIAL_BACKOFF_SECONDS * (2.0 ** min(max(attempt, 0), 16)))
    return base * (0.5 + 0.5 * min(max(rand(), 0.0), 1.0))


class State(StrEnum):
    CONNECTING = "connecting"
    READY = "ready"
    RECONNECTING = "reconnecting"
    FAILED = "failed"  # the first start failed for a reason retrying cannot fix (command not found)
    CLOSED = "closed"


class UpstreamUnavailable(Exception):
    """The upstream is not connected now; the message says why and when it is tried again."""


class UpstreamLost(Exception):
    """The connection ended before the upstream answered."""


class _ConnectFailed(Exception):
    pass


class UpstreamListener(Protocol):
    """What the session hands to the router."""

    async def upstream_notification(self, upstream: UpstreamSession, message: dict[str, Any], related: int | None) -> None: ...

    async def upstream_request(
        self, upstream: UpstreamSession, message: dict[str, Any], related: int | None
    ) -> dict[str, Any]:
        """Answer a server request: return ``{"result": ...}`` or ``{"error": ...}`` (no id, no jsonrpc)."""
        ...

    async def upstream_catalogue(self, upstream: UpstreamSession, changed: bool) -> None: ...

    async def upstream_state(self, upstream: UpstreamSession) -> None: ...


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

    def complete(self, body: dict[str, Any]) -> None:
        if not self._done.is_set():
            self._body = body
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


Deliver = Callable[[bytes, "int | None"], Awaitable[bool]]
"""Hand one message (JSON bytes) to the session; True when it was the response to ``related``."""


def safe_url(url: str) -> str:
    """A URL for logs and errors: scheme, host, port and path; never userinfo or query."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<unparsable url>"
    return f"{parts.scheme}://{host}{port}{parts.path}"


def render(message: Mapping[str, Any]) -> bytes:
    """One message as a JSON line (ASCII; refuses NaN, which the strict client parser never lets in)."""
    return encode_line(message)


# ------------------------------------------------------------------------------------------- links


class _StdioLink:
    """The upstream as a child process: one JSON message per line on its stdin and stdout."""

    related_known = False

    def __init__(self, process: UpstreamProcess) -> None:
        self.process = process

    async def send(self, message: Mapping[str, Any]) -> None:
        try:
            await self.process.send(render(message))
        except UpstreamGone as exc:
            raise UpstreamLost(str(exc)) from exc

    async def run(self, deliver: Deliver, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> str:
        task_status.started()
        async for item in self.process.lines():
            if isinstance(item, Oversize):
                logger.warning("an upstream message of at least %d bytes was dropped (limit %d)", item.size, item.limit)
                continue
            await deliver(item, None)
        await self.process.wait_exit(0.5)
        return self.process.exit_description()

    def handshake_done(self, version: str) -> None:
        pass

    def abort(self, request_id: int) -> None:
        pass

    async def aclose(self) -> None:
        await self.process.aclose(grace=1.0)


class _SseFramer:
    """Server-sent events from a byte stream: yields the non-empty ``data`` of each ``message`` event."""

    def __init__(self, max_bytes: int) -> None:
        self._max = max_bytes
        self._buf = bytearray()
        self._data: list[bytes] = []
        self._size = 0
        self._event = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        out: list[bytes] = []
        self._buf += chunk
        while True:
            cut = self._buf.find(b"\n")
            if cut < 0:
                if len(self._buf) > self._max:
                    raise ValueError(f"an SSE line exceeds {self._max} bytes")
                return out
            line = bytes(self._buf[:cut]).rstrip(b"\r")
            del self._buf[: cut + 1]
            if not line:
                data = b"\n".join(self._data)
                if data.strip() and self._event in (b"", b"message"):  # empty data: a resumption primer
                    out.append(data)
                self._data, self._size, self._event = [], 0, b""
                continue
            if line.startswith(b":"):
                continue
            name, _, value = line.partition(b":")
            if value.startswith(b" "):
                value = value[1:]
            if name == b"data":
                self._size += len(value) + 1
                if self._size > self._max:
                    raise ValueError(f"an SSE event exceeds {self._max} bytes")
                self._data.append(value)
            elif name == b"event":
                self._event = value


class _HttpLink:
    """The upstream at a streamable-HTTP URL."""

    related_known = True

    def __init__(self, url: str, headers: Mapping[str, str], max_bytes: int, deliver: Deliver | None = None) -> None:
        self.url = url
        self.shown_url = safe_url(url)
        self._extra_headers = dict(headers)
        self._max = max_bytes
        self.session_id: str | None = None
        self.protocol_version: str | None = None
        self._dead = anyio.Event()
        self._dead_reason = "the connection was closed"
        self._client: httpx.AsyncClient | None = None
        self._tg: TaskGroup | None = None
        self._deliver: Deliver | None = deliver
        self._posts: dict[int, anyio.CancelScope] = {}

    # -- lifecycle

    async def run(self, deliver: Deliver, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> str:
        self._deliver = deliver
        timeout = httpx.Timeout(
            connect=HTTP_CONNECT_TIMEOUT_SECONDS, read=None, write=HTTP_WRITE_TIMEOUT_SECONDS, pool=None
        )
        async with httpx.AsyncClient(timeout=timeout, follow_redirects=False) as client:
            self._client = client
            try:
                async with anyio.create_task_group() as tg:
                    self._tg = tg
                    task_status.started()
                    await self._dead.wait()
                    tg.cancel_scope.cancel()
            finally:
                self._tg = None
                await self._terminate(client)
        return self._dead_reason

    def die(self, reason: str) -> None:
        if not self._dead.is_set():
            self._dead_reason = reason
            self._dead.set()

    def handshake_done(self, version: str) -> None:
        self.protocol_version = version

    def start_get_stream(self) -> None:
        if self._tg is not None:
            self._tg.start_soon(self._get_stream)

    async def aclose(self) -> None:
        self.die("the gateway closed the connection")

    async def _terminate(self, client: httpx.AsyncClient) -> None:
        if self.session_id is None:
            return
        with anyio.move_on_after(2.0, shield=True):
            try:
                await client.delete(self.url, headers=self._headers(None))
            except httpx.HTTPError:
                pass

    # -- sending

    def _headers(self, message: Mapping[str, Any] | None) -> dict[str, str]:
        headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
        headers.update(self._extra_headers)
        if self.session_id is not None:
            headers["mcp-session-id"] = self.session_id
        if self.protocol_version is not None:
            headers["mcp-protocol-version"] = self.protocol_version
        if message is not None and isinstance(method := message.get("method"), str):
            headers["mcp-method"] = method
            key = NAME_BEARING_METHODS.get(method)
            params = message.get("params")
            if key is not None and isinstance(params, Mapping) and isinstance(value := params.get(key), str):
                headers["mcp-name"] = encode_header_value(value)
        return headers

    async def send(self, message: Mapping[str, Any]) -> None:
        if self._dead.is_set() or self._tg is None:
            raise UpstreamLost(self._dead_reason)
        if "method" in message and "id" in message:
            self._tg.start_soon(self._post_request, dict(message))
        else:
            await self._post_message(message)

    async def _post_message(self, message: Mapping[str, Any]) -> None:
        """A notification or a response: the upstream acknowledges it; there is no answer to wait for."""
        assert self._client is not None
        try:
            response = await self._client.post(self.url, content=render(message), headers=self._headers(message))
        except httpx.TransportError as exc:
            self.die(f"the upstream at {self.shown_url} is unreachable ({type(exc).__name__})")
            raise UpstreamLost(self._dead_reason) from exc
        except httpx.HTTPError as exc:
            raise UpstreamLost(f"posting to the upstream failed ({type(exc).__name__})") from exc
        if response.status_code == 404 and self.session_id is not None:
            self.die("the upstream no longer knows the session (HTTP 404)")
            raise UpstreamLost(self._dead_reason)
        if response.status_code >= 400:
            logger.warning("upstream at %s refused a message with HTTP %d", self.shown_url, response.status_code)

    async def _synthesize(self, request_id: int, code: int, message: str) -> None:
        assert self._deliver is not None
        body = {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}
        await self._deliver(json.dumps(body).encode(), request_id)

    def abort(self, request_id: int) -> None:
        """Stop waiting on a request's POST (it was cancelled; a handshake-era server sends no answer)."""
        scope = self._posts.pop(request_id, None)
        if scope is not None:
            scope.cancel()

    async def _post_request(self, message: dict[str, Any]) -> None:
        request_id = message["id"]
        with anyio.CancelScope() as scope:
            self._posts[request_id] = scope
            try:
                await self._post_request_in_scope(message)
            finally:
                if self._posts.get(request_id) is scope:
                    del self._posts[request_id]

    async def _post_request_in_scope(self, message: dict[str, Any]) -> None:
        assert self._client is not None and self._deliver is not None
        request_id = message["id"]
        try:
            async with self._client.stream(
                "POST", self.url, content=render(message), headers=self._headers(message)
            ) as response:
                if message.get("method") == "initialize" and (sid := response.headers.get("mcp-session-id")):
                    self.session_id = sid
                await self._read_answer(response, request_id)
        except httpx.TransportError as exc:
            self.die(f"the upstream at {self.shown_url} is unreachable ({type(exc).__name__})")
        except (ValueError, httpx.HTTPError) as exc:  # oversize, unparsable framing, a broken stream
            await self._synthesize(request_id, INTERNAL_ERROR, f"the upstream's answer was refused: {exc}")

    async def _read_answer(self, response: httpx.Response, request_id: int) -> None:
        assert self._deliver is not None
        status = response.status_code
        content_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if status == 404 and self.session_id is not None:
            self.die("the upstream no longer knows the session (HTTP 404)")
            return
        if status >= 400:
            if content_type == "application/json":
                body = await self._read_limited(response)
                if self._is_error_for(body):
                    fixed = json.loads(body)
                    fixed["id"] = request_id
                    await self._deliver(json.dumps(fixed).encode(), request_id)
                    return
            await self._synthesize(request_id, INTERNAL_ERROR, f"the upstream answered with HTTP status {status}")
            return
        if 300 <= status < 400:
            await self._synthesize(request_id, INTERNAL_ERROR, f"the upstream redirected (HTTP {status}); not followed")
            return
        if status == 202:
            await self._synthesize(request_id, INTERNAL_ERROR, "the upstream answered a request with 202 Accepted")
            return
        if content_type == "application/json":
            await self._deliver(await self._read_limited(response), request_id)
            return
        if content_type == "text/event-stream":
            framer = _SseFramer(self._max)
            async for chunk in response.aiter_bytes():
                for data in framer.feed(chunk):
                    if await self._deliver(data, request_id):
                        return
            await self._synthesize(
                request_id, UPSTREAM_EXITED, "the upstream closed the response stream without answering"
            )
            return
        await self._synthesize(request_id, INTERNAL_ERROR, "the upstream answered with an unexpected content type")

    @staticmethod
    def _is_error_for(body: bytes) -> bool:
        try:
            parsed = json.loads(body)
        except ValueError:
            return False
        return isinstance(parsed, dict) and isinstance(parsed.get("error"), dict)

    async def _read_limited(self, response: httpx.Response) -> bytes:
        data = bytearray()
        async for chunk in response.aiter_bytes():
            data += chunk
            if len(data) > self._max:
                raise ValueError(f"the answer exceeds {self._max} bytes")
        return bytes(data)

    # -- the GET stream

    async def _get_stream(self) -> None:
        assert self._client is not None and self._deliver is not None
        failures = 0
        while not self._dead.is_set():
            try:
                headers = self._headers(None)
                headers["accept"] = "text/event-stream"
                async with self._client.stream("GET", self.url, headers=headers) as response:
                    if response.status_code == 404 and self.session_id is not None:
                        self.die("the upstream no longer knows the session (HTTP 404)")
                        return
                    content_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
                    if response.status_code != 200 or content_type != "text/event-stream":
                        logger.info(
                            "upstream at %s offers no GET stream (HTTP %d)", self.shown_url, response.status_code
                        )
                        return
                    failures = 0
                    framer = _SseFramer(self._max)
                    async for chunk in response.aiter_bytes():
                        for data in framer.feed(chunk):
                            await self._deliver(data, None)
            except httpx.TransportError as exc:
                failures += 1
                if failures >= GET_STREAM_MAX_FAILURES:
                    self.die(f"the upstream at {self.shown_url} is unreachable ({type(exc).__name__})")
                    return
            except (ValueError, httpx.HTTPError) as exc:
                logger.warning("upstream at %s: GET stream dropped: %s", self.shown_url, exc)
            await anyio.sleep(GET_STREAM_RETRY_SECONDS)


_Link = _StdioLink | _HttpLink


# ----------------------------------------------------------------------------------------- session


class UpstreamSession:
    def __init__(
        self,
        config: UpstreamConfig,
        *,
        max_message_bytes: int = DEFAULT_MAX_UPSTREAM_MESSAGE_BYTES,
        env_filter: EnvFilter | None = None,
        environ: Mapping[str, str] | None = None,
        rand: Callable[[], float] = random.random,
        request_timeout: float = LIST_TIMEOUT_SECONDS,
    ) -> None:
        self.config = config
        self.name = config.name
        self.listener: UpstreamListener | None = None
        self._max = max_message_bytes
        self._env_filter = env_filter or EnvPolicy(extra=dict(config.env))
        self._environ = environ
        self._rand = rand
        self._request_timeout = request_timeout

        self.state = State.CONNECTING
        self.last_error: str | None = None
        self.start_error: str | None = None
        self.next_attempt_in: float | None = None
        self.generation = 0
        self.capabilities: dict[str, Any] = {}
        self.server_info: dict[str, Any] | None = None
        self.instructions: str | None = None
        self.protocol_version: str | None = None
        self.modern = config.protocol == MODERN_VERSION
        """The upstream is spoken to in the 2026-07-28 era (``upstream_modern.py``)."""
        self.tools: tuple[Any, ...] = ()
        self.catalogue_version = 0
        self._hop = envelope(CLIENT_CAPABILITIES)
        self._watched: frozenset[str] = frozenset()
        """2026-07-28: the resources whose updates the listen stream asks for."""
        self._listen: PendingCall | None = None
        self._listen_ids: set[int] = set()
        """The listen streams whose events are taken: the current one, and while it is replaced
        (until the new one is acknowledged and the old one cancelled) the old one too."""
        self._listen_acked = anyio.Event()
        self._listen_honored: frozenset[str] = frozenset()

        self._next_id = 0
        self._pending: dict[int, PendingCall] = {}
        self._incoming: dict[tuple[str, Any], anyio.CancelScope] = {}
        self._link: _Link | None = None
        self._conn_tg: TaskGroup | None = None
        self._refresh_wanted = False
        self._refreshing = False
        self._closing = False
        self._run_scope: anyio.CancelScope | None = None
        self._settled = anyio.Event()

    # ------------------------------------------------------------------------------- public

    @property
    def ready(self) -> bool:
        return self.state is State.READY

    @property
    def related_known(self) -> bool:
        """Whether server messages say which request they belong to (streamable HTTP) or not (stdio)."""
        return self.config.transport == "streamable_http"

    def describe(self) -> str:
        where = safe_url(self.config.url) if self.config.url else (self.config.command or "")
        return f"{self.name} ({self.config.transport}: {where})"

    def unavailable_reason(self) -> str:
        if self.state is State.FAILED:
            return f"upstream {self.name!r} could not be started: {self.start_error}"
        if self.state is State.CLOSED:
            return f"upstream {self.name!r} is closed"
        if self.state is State.RECONNECTING:
            when = f"; next attempt in {self.next_attempt_in:.1f} s" if self.next_attempt_in is not None else ""
            why = f" ({self.last_error})" if self.last_error else ""
            return f"upstream {self.name!r} is disconnected{why}{when}"
        return f"upstream {self.name!r} is connecting"

    async def wait_settled(self) -> None:
        """Return once the first connection attempt has succeeded or failed."""
        await self._settled.wait()

    async def run(self) -> None:
        """Connect, and reconnect with backoff, until ``close``."""
        attempt = 0
        with anyio.CancelScope() as scope:
            self._run_scope = scope
            while not self._closing:
                self.state = State.CONNECTING
                self.next_attempt_in = None
                try:
                    reason = await self._connect_once()
                    attempt = 0
                except UpstreamStartError as exc:
                    if not self._settled.is_set():
                        self.start_error = str(exc)
                        self.state = State.FAILED
                        logger.error("upstream %r: %s", self.name, exc)
                        self._settled.set()
                        await self._tell_state()
                        return
                    reason = str(exc)
                except _ConnectFailed as exc:
                    reason = str(exc)
                except Exception as exc:  # noqa: BLE001 -- a bug in one connection must not stop the gateway
                    logger.exception("upstream %r: the connection failed unexpectedly", self.name)
                    reason = f"the connection failed unexpectedly ({type(exc).__name__})"
                self._settled.set()
                if self._closing:
                    break
                self.last_error = reason
                delay = backoff_delay(attempt, self._rand)
                attempt += 1
                self.state = State.RECONNECTING
                self.next_attempt_in = delay
                logger.warning("upstream %r: %s; reconnecting in %.1f s", self.name, reason, delay)
                await self._tell_state()
                await anyio.sleep(delay)
        self.state = State.CLOSED
        self._settled.set()

    async def close(self) -> None:
        self._closing = True
        if self._run_scope is not None:
            self._run_scope.cancel()
        self.state = State.CLOSED
        self._settled.set()

    async def send_request(self, method: str, params: Mapping[str, Any] | None) -> PendingCall:
        """Send a request now; raise ``UpstreamUnavailable`` if the upstream is not ready."""
        if self.state is not State.READY or self._link is None:
            raise UpstreamUnavailable(self.unavailable_reason())
        return await self._start(method, params)

    async def request(self, method: str, params: Mapping[str, Any] | None, timeout: float | None = None) -> dict[str, Any]:
        """Send a request and wait for its response message; ``TimeoutError`` after ``timeout`` seconds."""
        call = await self.send_request(method, params)
        return await self._await(call, timeout or self._request_timeout)

    async def cancel(self, call: PendingCall, reason: str) -> None:
        """Abandon a request and tell the upstream (``notifications/cancelled``), if it is still connected."""
        if self._pending.pop(call.id, None) is None:
            return
        call.fail("cancelled")
        link = self._link
        if call.generation != self.generation or link is None:
            return
        link.abort(call.id)
        try:
            await self._send(
                {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": call.id, "reason": reason}}
            )
        except (UpstreamLost, UpstreamUnavailable):
            pass

    async def notify(self, method: str, params: Mapping[str, Any] | None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        await self._send(message)

    # ---------------------------------------------------------------------------- connecting

    async def _open_link(self) -> _Link:
        config = self.config
        if config.transport == "stdio":
            assert config.command is not None
            process = await UpstreamProcess.spawn(
                [config.command, *config.args],
                env_filter=self._env_filter,
                cwd=config.cwd,
                max_message_bytes=self._max,
                environ=self._environ,
            )
            return _StdioLink(process)
        assert config.url is not None
        environ = os.environ if self._environ is None else self._environ
        headers: dict[str, str] = {}
        for header, env_name in config.headers_env.items():
            value = environ.get(env_name)
            if not value:
                raise _ConnectFailed(f"header {header}: environment variable {env_name} is not set")
            headers[header] = value
        return _HttpLink(config.url, headers, self._max)

    async def _connect_once(self) -> str:
        """One connection: returns the reason it ended after being ready; raises if it never got ready."""
        link = await self._open_link()
        self.generation += 1
        self._link = link
        ended: list[str] = []
        failure: str | None = None
        try:
            async with anyio.create_task_group() as tg:
                self._conn_tg = tg

                async def read(*, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
                    ended.append(await link.run(self._deliver, task_status=task_status))
                    tg.cancel_scope.cancel()

                await tg.start(read)
                try:
                    await self._handshake(link)
                    await self._refresh_tools(initial=True)
                except (_ConnectFailed, UpstreamLost, UpstreamUnavailable, TimeoutError) as exc:
                    failure = f"the handshake failed: {exc}"
                    tg.cancel_scope.cancel()
                else:
                    self.state = State.READY
                    self.last_error = None
                    self._settled.set()
                    logger.info("upstream %s is ready (%d tools)", self.describe(), len(self.tools))
                    await self._tell_state()
                    await anyio.sleep_forever()
        finally:
            self._conn_tg = None
            self._link = None
            with anyio.CancelScope(shield=True):
                await link.aclose()
                reason = ended[0] if ended else "the connection was closed"
                self._lose_all(reason)
        if failure is not None:
            raise _ConnectFailed(failure)
        if self.state is not State.READY:
            raise _ConnectFailed(f"the connection ended during the handshake ({reason})")
        return reason

    def _lose_all(self, reason: str) -> None:
        pending, self._pending = self._pending, {}
        for call in pending.values():
            call.fail(f"upstream {self.name!r}: {reason}")
        incoming, self._incoming = self._incoming, {}
        for scope in incoming.values():
            scope.cancel()

    async def _handshake(self, link: _Link) -> None:
        if self.modern:
            await self._discover(link)
            return
        params = {
            "protocolVersion": LATEST_HANDSHAKE_VERSION,
            "capabilities": dict(CLIENT_CAPABILITIES),
            "clientInfo": {"name": "drawbridge", "version": drawbridge.__version__},
        }
        body = await self._await(await self._start("initialize", params), HANDSHAKE_TIMEOUT_SECONDS)
        result = body.get("result")
        if not isinstance(result, dict):
            raise _ConnectFailed(f"initialize was refused ({_error_summary(body)})")
        version = result.get("protocolVersion")
        if version not in HANDSHAKE_PROTOCOL_VERSIONS:
            raise _ConnectFailed("the upstream answered initialize with a protocol version the gateway does not speak")
        capabilities = result.get("capabilities")
        self.capabilities = dict(capabilities) if isinstance(capabilities, dict) else {}
        info = result.get("serverInfo")
        self.server_info = dict(info) if isinstance(info, dict) else None
        instructions = result.get("instructions")
        self.instructions = instructions if isinstance(instructions, str) else None
        self.protocol_version = version
        link.handshake_done(version)
        await self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        if isinstance(link, _HttpLink):
            link.start_get_stream()

    async def _discover(self, link: _Link) -> None:
        """2026-07-28: no handshake; ``server/discover`` says what the upstream offers, and a listen
        stream is opened for its changes (and the resources still watched, after a reconnect)."""
        link.handshake_done(MODERN_VERSION)  # over HTTP every request, discover included, names its version
        body = await self._await(await self._start("server/discover", None), HANDSHAKE_TIMEOUT_SECONDS)
        if "result" not in body:
            raise _ConnectFailed(f"server/discover was refused ({_error_summary(body)})")
        try:
            self.capabilities, self.server_info, self.instructions = read_discover(body["result"])
        except ValueError as exc:
            raise _ConnectFailed(str(exc)) from None
        self.protocol_version = MODERN_VERSION
        await self._open_listen()

    async def _open_listen(self) -> PendingCall:
        def follow(call: PendingCall) -> None:  # before the acknowledgement can arrive
            self._listen, self._listen_acked, self._listen_honored = call, anyio.Event(), frozenset()
            self._listen_ids.add(call.id)

        call = await self._start("subscriptions/listen", listen_filter(self._watched), track=follow)
        if self._conn_tg is not None:
            self._conn_tg.start_soon(self._follow_listen, call)
        return call

    async def _follow_listen(self, call: PendingCall) -> None:
        """Until the stream ends: an error means this upstream's changes cannot be followed (said
        once); a result (the upstream ended it) is followed by a new stream a second later."""
        try:
            body = await call.wait()
        except UpstreamLost:
            self._listen_ids.discard(call.id)
            return
        self._listen_ids.discard(call.id)
        if self._listen is not call:
            return
        self._listen = None
        self._listen_acked.set()
        if "error" in body:
            logger.warning("upstream %r refused subscriptions/listen (%s); its list changes and resource "
                           "updates are not followed", self.name, _error_summary(body))
            return
        await anyio.sleep(LISTEN_AGAIN_SECONDS)
        if self._listen is None and self.state is State.READY:
            await self._open_listen()

    async def watch_resources(self, uris: frozenset[str]) -> frozenset[str]:
        """2026-07-28: follow updates of exactly these resources (a new listen stream replaces the
        old one once acknowledged, so no update falls between them); the URIs the upstream honored."""
        if self.state is not State.READY:
            raise UpstreamUnavailable(self.unavailable_reason())
        self._watched = uris
        old = self._listen
        await self._open_listen()
        acked = self._listen_acked
        try:
            with anyio.fail_after(self._request_timeout):
                await acked.wait()
        finally:
            if old is not None:
                await self.cancel(old, "replaced by a new subscription")
                self._listen_ids.discard(old.id)
        return self._listen_honored

    async def _refresh_tools(self, *, initial: bool = False) -> None:
        if "tools" not in self.capabilities:
            tools: list[Any] = []
        else:
            tools = await self._list_all("tools/list", "tools")
        changed = tuple(tools) != self.tools
        self.tools = tuple(tools)
        self.catalogue_version += 1
        if not initial or changed or self.generation > 1:
            logger.info("upstream %r lists %d tools", self.name, len(tools))
        if self.listener is not None:
            try:
                await self.listener.upstream_catalogue(self, changed)
            except Exception as exc:  # noqa: BLE001
                logger.error("merging the tools of upstream %r failed (%s)", self.name, type(exc).__name__)

    async def list_all(self, method: str, key: str) -> list[Any]:
        """Every item of a paginated list (``prompts/list``, ``resources/list``, ...)."""
        if self.state is not State.READY:
            raise UpstreamUnavailable(self.unavailable_reason())
        return await self._list_all(method, key)

    async def _list_all(self, method: str, key: str) -> list[Any]:
        items: list[Any] = []
        cursor: str | None = None
        seen: set[str] = set()
        for _ in range(MAX_LIST_PAGES):
            params = {"cursor": cursor} if cursor is not None else None
            body = await self._await(await self._start(method, params), self._request_timeout)
            result = body.get("result")
            if not isinstance(result, dict) or not isinstance(result.get(key), list):
                raise _ConnectFailed(f"{method} failed ({_error_summary(body)})")
            items.extend(result[key])
            cursor = result.get("nextCursor")
            if not isinstance(cursor, str) or not cursor:
                return items
            if cursor in seen:
                raise _ConnectFailed(f"{method} returned a cursor it had returned before")
            seen.add(cursor)
        raise _ConnectFailed(f"{method} did not end within {MAX_LIST_PAGES} pages")

    def _schedule_refresh(self) -> None:
        self._refresh_wanted = True
        if not self._refreshing and self._conn_tg is not None:
            self._refreshing = True
            self._conn_tg.start_soon(self._refresh_loop)

    async def _refresh_loop(self) -> None:
        try:
            while self._refresh_wanted and self.state is State.READY:
                self._refresh_wanted = False
                try:
                    await self._refresh_tools()
                except (_ConnectFailed, UpstreamLost, UpstreamUnavailable, TimeoutError) as exc:
                    logger.warning("upstream %r: reloading the tool list failed (%s); keeping the last one", self.name, exc)
        finally:
            self._refreshing = False

    async def _tell_state(self) -> None:
        if self.listener is not None:
            with anyio.CancelScope(shield=True):
                try:
                    await self.listener.upstream_state(self)
                except Exception as exc:  # noqa: BLE001
                    logger.error("reporting the state of upstream %r failed (%s)", self.name, type(exc).__name__)

    # ------------------------------------------------------------------------------ plumbing

    async def _start(
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
            await self._send(message)
        except BaseException:
            self._pending.pop(call.id, None)
            raise
        return call

    async def _await(self, call: PendingCall, timeout: float) -> dict[str, Any]:
        try:
            with anyio.fail_after(timeout):
                return await call.wait()
        except TimeoutError:
            await self.cancel(call, "gateway timeout")
            raise TimeoutError(f"upstream {self.name!r} did not answer {call.method} within {timeout:g} seconds") from None

    async def _send(self, message: Mapping[str, Any]) -> None:
        link = self._link
        if link is None:
            raise UpstreamUnavailable(self.unavailable_reason())
        if self.modern and "method" in message:
            message = {**message, "params": with_envelope(message.get("params"), self._hop)}
        await link.send(message)

    async def _deliver(self, data: bytes, related: int | None) -> bool:
        try:
            message = parse_upstream_message(data)
        except MessageError as exc:
            logger.warning("upstream %r sent a line that is not a JSON-RPC message: %s", self.name, exc.message)
            return False
        if message.kind is Kind.RESPONSE:
            call = self._pending.pop(message.id, None) if isinstance(message.id, int) else None  # type: ignore[arg-type]
            if call is None:
                logger.info("upstream %r answered id %r, which is not in flight; dropped", self.name, message.id)
            else:
                call.complete(message.body)
            return related is not None and message.id == related
        if message.kind is Kind.REQUEST:
            if self._conn_tg is not None:
                self._conn_tg.start_soon(self._serve_request, message.body, related)
            return False
        await self._on_notification(message.body, related)
        return False

    async def _on_notification(self, body: dict[str, Any], related: int | None) -> None:
        method = body.get("method")
        if self.modern and (stream := subscription_id(body)) is not None:
            if stream not in self._listen_ids:
                return  # a stream the gateway no longer follows
            if method == LISTEN_ACKNOWLEDGED:
                if self._listen is not None and stream == self._listen.id:
                    self._listen_honored = honored_uris(body)
                    self._listen_acked.set()
                return
            body = without_subscription_id(body)
        params = body.get("params")
        if method == "notifications/tools/list_changed":
            self._schedule_refresh()
            return
        if method == "notifications/cancelled" and isinstance(params, dict):
            request_id = params.get("requestId")
            scope = self._incoming.get(_key(request_id)) if request_id is not None else None
            if scope is not None:
                scope.cancel()
            return
        if self.listener is not None:
            try:
                await self.listener.upstream_notification(self, body, related)
            except Exception as exc:  # noqa: BLE001 -- one bad notification must not end the connection
                logger.error("relaying a notification from upstream %r failed (%s)", self.name, type(exc).__name__)

    async def _serve_request(self, body: dict[str, Any], related: int | None) -> None:
        request_id = body.get("id")
        key = _key(request_id)
        answer: dict[str, Any] | None = None
        with anyio.CancelScope() as scope:
            self._incoming[key] = scope
            try:
                if body.get("method") == "ping":
                    answer = {"result": {}}
                elif self.listener is None:
                    answer = _error(METHOD_NOT_FOUND, "method not found")
                else:
                    answer = await self.listener.upstream_request(self, body, related)
            except Exception as exc:  # noqa: BLE001 -- the upstream gets an error, never a hang
                logger.error("answering a request from upstream %r failed (%s)", self.name, type(exc).__name__)
                answer = _error(INTERNAL_ERROR, "the gateway could not answer this request")
            finally:
                if self._incoming.get(key) is scope:
                    del self._incoming[key]
        if answer is None or scope.cancelled_caught:
            return
        try:
            await self._send({"jsonrpc": "2.0", "id": request_id, **answer})
        except (UpstreamLost, UpstreamUnavailable):
            pass


def _key(request_id: Any) -> tuple[str, Any]:
    return ("s", request_id) if isinstance(request_id, str) else ("i", request_id)


def _error(code: int, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def _error_summary(body: Mapping[str, Any]) -> str:
    error = body.get("error")
    if isinstance(error, dict):
        code = error.get("code")
        return f"JSON-RPC error {code}" if isinstance(code, int) else "a JSON-RPC error"
    return "no usable result"
