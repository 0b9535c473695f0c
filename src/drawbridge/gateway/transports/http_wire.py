"""``/mcp`` on the ASGI wire: a request's headers and body in, JSON answers and SSE streams out.

Invariant: a request body is never held beyond the configured limit: a declared length over it is
refused before anything is read, and reading stops at the first chunk that passes it (``TooLarge``).
What goes out is rendered by ``safe_render``: a response that cannot be encoded becomes an error,
any other such message is left out, never written half.

Theory of operation. The endpoint (``http_endpoint.McpEndpoint``) decides; these helpers move the
bytes. An SSE stream is framed as ``event: message`` events, with a comment line as keepalive every
``KEEPALIVE_SECONDS`` while nothing is sent. ``stream_answer`` writes the answer to one POST that
became a stream (the messages that came first, then the response, last); ``stream_mailbox`` writes
a session's GET stream until the session ends or the agent disconnects.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import anyio
from starlette.types import Receive, Scope, Send

from drawbridge.gateway.protocol.jsonrpc import INVALID_REQUEST, PARSE_ERROR, Message, RequestId
from drawbridge.gateway.serve.downstream_session import error_response, safe_render
from drawbridge.gateway.transports.http_mailbox import Mailbox
from drawbridge.gateway.upstreams.sdk_parts import inbound

KEEPALIVE_SECONDS: Final = 15.0
SSE_HEADERS: Final = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),
]

# ------------------------------------------------------------------------------------------ reading


def headers_of(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def raw_headers(scope: Scope) -> list[tuple[str, str]]:
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope.get("headers", [])]


def header_values(scope: Scope, name: str) -> list[str]:
    """Every value of one header as sent (``headers_of`` keeps the last): a repeated header shows."""
    key = name.encode("latin-1")
    return [v.decode("latin-1") for k, v in scope.get("headers", []) if k.lower() == key]


def accepts(headers: Mapping[str, str], media: str) -> bool:
    accept = headers.get("accept")
    if accept is None:
        return media == "application/json"
    kinds = {part.split(";")[0].strip().lower() for part in accept.split(",")}
    return media in kinds or "*/*" in kinds or f"{media.split('/')[0]}/*" in kinds


class TooLarge(Exception):
    def __init__(self, size: int, *, unread: bool) -> None:
        self.size = size
        self.unread = unread
        """The size was declared (``Content-Length``) and nothing was read; else the body was read up
        to ``size`` bytes (chunked) before it was refused."""


async def read_body(receive: Receive, limit: int, declared: int | None) -> bytes:
    if declared is not None and declared > limit:
        raise TooLarge(declared, unread=True)
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise anyio.EndOfStream
        body += message.get("body", b"")
        if len(body) > limit:
            raise TooLarge(len(body), unread=False)
        if not message.get("more_body", False):
            return bytes(body)


# ------------------------------------------------------------------------------------------ writing


def sse_event(message: Mapping[str, Any]) -> bytes | None:
    data = safe_render(message)
    if data is None:
        return None
    return b"event: message\r\ndata: " + data.rstrip(b"\n") + b"\r\n\r\n"


def answer_status(code: Any) -> int:
    """The status of a 2026-07-28 answer whose error has ``code``: MCP's table, 200 for a code it gives
    none. A parse error is answered as the message is read (400, ``McpEndpoint._post``); in an answer it can only be
    an upstream's, about the gateway's own message to it, and takes 200 like any upstream error the
    table does not name (the codes that would read as the gateway's header and envelope refusals never
    reach an answer: ``hop.modern_error``)."""
    if not isinstance(code, int) or code == PARSE_ERROR:
        return 200
    return inbound().ERROR_CODE_HTTP_STATUS.get(code, 200)


async def send_json(
    send: Send, status: int, body: Mapping[str, Any] | None, extra: Iterable[tuple[str, str]] = ()
) -> None:
    data = b"" if body is None else (safe_render(body) or b"")
    headers = [(b"content-type", b"application/json")] if body is not None else []
    headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def send_error(
    send: Send, status: int, code: int, message: str, request_id: RequestId | None = None, extra: Iterable[tuple[str, str]] = ()
) -> None:
    await send_json(send, status, error_response(request_id, code, message), extra)


async def send_status(send: Send, status: int, extra: Iterable[tuple[str, str]] = ()) -> None:
    await send_json(send, status, None, extra)


async def stream_answer(
    send: Send,
    box: Mailbox,
    early: list[dict[str, Any]],
    done: anyio.Event,
    result: list[dict[str, Any] | None],
    message: Message,
) -> None:
    """The answer to ``message`` as an SSE stream: ``early`` and whatever else ``box`` gets until the
    request is ``done``, then its response (``result``), last."""
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    pending = early
    while True:
        for item in pending:
            event = sse_event(item)
            if event is not None:
                await send({"type": "http.response.body", "body": event, "more_body": True})
        if box.closed:
            pending = box.drain()
            if not pending:
                break
            continue
        await box.wait(KEEPALIVE_SECONDS)
        pending = box.drain()
        if not pending and not box.closed:
            await send({"type": "http.response.body", "body": b": ping\r\n\r\n", "more_body": True})
    await done.wait()
    response = result[0] if result else None
    if response is None:
        response = error_response(message.id, INVALID_REQUEST, "the request was cancelled")
    await send({"type": "http.response.body", "body": sse_event(response) or b"", "more_body": False})


async def stream_mailbox(send: Send, receive: Receive, box: Mailbox) -> None:
    """A session's GET stream: what ``box`` gets, until it is closed or the agent disconnects."""
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        while not box.closed:
            await box.wait(KEEPALIVE_SECONDS)
            items = box.drain()
            if not items:
                if box.closed:
                    break
                await send({"type": "http.response.body", "body": b": ping\r\n\r\n", "more_body": True})
            for item in items:
                event = sse_event(item)
                if event is not None:
                    await send({"type": "http.response.body", "body": event, "more_body": True})
        tg.cancel_scope.cancel()
    await send({"type": "http.response.body", "body": b"", "more_body": False})


__all__ = [
    "KEEPALIVE_SECONDS",
    "SSE_HEADERS",
    "TooLarge",
    "accepts",
    "header_values",
    "headers_of",
    "raw_headers",
    "read_body",
    "send_error",
    "send_json",
    "send_status",
    "sse_event",
    "stream_answer",
    "stream_mailbox",
]
