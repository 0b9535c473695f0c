"""The session's link to an upstream at a streamable-HTTP URL: a POST per message, a GET stream.

Invariant: a request POSTed is never left hanging for a reason the link can see: when its answer
is an HTTP error, a redirect, a 202, of an unexpected content type, a stream that closes without
the response, or too large or unparsable, an error is delivered for its id in its place; when the
upstream is unreachable or no longer knows the session, the link dies, which ends everything in
flight. Header values (secrets from ``headers_env``) are never logged, and URLs are logged only
through ``safe_url``: without credentials or query.

Theory of operation. Each request is its own POST (answered with JSON or an SSE stream), notifications
and responses are POSTs answered 202, ``Mcp-Session-Id`` from the initialize answer is sent on every
later request, the negotiated ``MCP-Protocol-Version`` too, and ``Mcp-Method``/``Mcp-Name`` mirror the
body (so the name header always carries the upstream's own, un-namespaced name), as do the
``Mcp-Param-*`` headers of a ``tools/call`` whose tool declares ``x-mcp-header`` arguments (the SDK's
codec renders them). A message that
arrived on the SSE stream of one of our POSTs is delivered with that request's id as ``related``. A
GET SSE stream carries messages the upstream sends outside any request; when it breaks twice in a
row the upstream is taken for dead. ``run`` holds the client until the link dies, then ends the
upstream's session with a DELETE.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit, urlunsplit

import anyio
from anyio.abc import TaskGroup, TaskStatus

from drawbridge.gateway.protocol.jsonrpc import INTERNAL_ERROR, UPSTREAM_EXITED
from drawbridge.gateway.protocol.methods import INITIALIZE, TOOLS_CALL
from drawbridge.gateway.upstreams.requests import Deliver, UpstreamLost, render
from drawbridge.gateway.upstreams.sdk_parts import inbound

if TYPE_CHECKING:
    import httpx  # imported by the methods that use it: a gateway with no HTTP upstream never loads it

logger = logging.getLogger("drawbridge.gateway.upstream")

HTTP_CONNECT_TIMEOUT_SECONDS: Final = 10.0
HTTP_WRITE_TIMEOUT_SECONDS: Final = 30.0
GET_STREAM_RETRY_SECONDS: Final = 1.0
GET_STREAM_MAX_FAILURES: Final = 2


def safe_url(url: str) -> str:
    """A URL for logs and errors: scheme, host, port and path as written (an IPv6 host keeps its
    brackets); never userinfo, query or fragment. Every URL the gateway names goes through here."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable url>"
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


class SseFramer:
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


class HttpLink:
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
        self._param_maps: dict[str, dict[tuple[str, ...], str]] = {}

    def learn_tools(self, tools: Sequence[Any]) -> list[Any]:
        """The tools an HTTP client may offer, and which of their arguments a ``tools/call`` mirrors
        into ``Mcp-Param-*`` headers (their ``x-mcp-header``), computed once per tool list. A tool
        whose annotations are invalid is dropped, as the spec asks of HTTP clients (its calls could
        not carry the headers its server expects)."""
        ladder = inbound()
        maps: dict[str, dict[tuple[str, ...], str]] = {}
        kept: list[Any] = []
        for tool in tools:
            if isinstance(tool, Mapping) and isinstance(name := tool.get("name"), str):
                schema = tool.get("inputSchema")
                if (problem := ladder.find_invalid_x_mcp_header(schema)) is not None:
                    logger.warning("upstream at %s: tool %r is not offered: %s", self.shown_url, name[:100], problem[:200])
                    continue
                if found := ladder.x_mcp_header_map(schema):
                    maps[name] = found
            kept.append(tool)
        self._param_maps = maps
        return kept

    # -- lifecycle

    async def run(self, deliver: Deliver, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> str:
        import httpx  # the HTTP client is loaded with the first HTTP upstream

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
        import httpx

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
            ladder = inbound()
            key = ladder.NAME_BEARING_METHODS.get(method)
            params = message.get("params")
            if key is not None and isinstance(params, Mapping) and isinstance(value := params.get(key), str):
                headers["mcp-name"] = ladder.encode_header_value(value)
                mirrored = self._param_maps.get(value) if method == TOOLS_CALL else None
                if mirrored is not None and isinstance(arguments := params.get("arguments"), Mapping):
                    headers.update(ladder.mcp_param_headers(mirrored, arguments))
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
        import httpx

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
        import httpx

        assert self._client is not None and self._deliver is not None
        request_id = message["id"]
        try:
            async with self._client.stream(
                "POST", self.url, content=render(message), headers=self._headers(message)
            ) as response:
                if message.get("method") == INITIALIZE and (sid := response.headers.get("mcp-session-id")):
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
            framer = SseFramer(self._max)
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
        import httpx

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
                    framer = SseFramer(self._max)
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


__all__ = ["HttpLink", "SseFramer", "safe_url"]
