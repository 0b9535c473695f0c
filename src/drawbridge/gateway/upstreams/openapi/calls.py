"""One decided call of an OpenAPI operation: the HTTP request it makes and the CallToolResult it answers.

Invariant: the request is built from the arguments the call was decided on, checked against the
tool's ``inputSchema`` first (bounded: one regex budget per call, ``policy.schemas.argument_problems``),
and from nothing else: path parameters are URL-escaped whole (a ``/``
in a value is ``%2F``; ``.``, ``..`` and the empty string are refused, so no value walks the path),
query and header parameters are sent as declared (a header value that HTTP cannot carry -- a control
character, a character beyond ASCII, whitespace at either end -- is refused before anything is
sent, naming the parameter), ``body`` as JSON. The headers the gateway owns are never arguments
(``tools``). A redirect is followed only to the same scheme, host and port (at most
``MAX_REDIRECTS``); the answer is read up to ``max_response_bytes`` and a cut answer says so in its
text. ``timeout`` bounds the whole call, from connecting to the last byte of the answer (redirects
included), not the gaps between reads. A JSON answer becomes ``structuredContent`` only when it is
read one way (``protocol.one_reading``: no repeated key, no NaN or number beyond a double, at most
``DEFAULT_MAX_DEPTH`` levels); any other answer is text (decoded by the charset its ``Content-Type``
declares, else UTF-8), and the text says why it is not structured.
So every answer is a result the gateway can pass on as it records it. A 4xx or 5xx status is a
result with ``isError`` and the status; a problem of the call itself is a result with ``isError``
too, except when the request never left (the backend unreachable, or refused by the SSRF guard),
which is ``NotSent``: the pipeline records that the call did not reach the upstream.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import quote

import anyio
import httpx

from drawbridge.gateway.protocol.jsonrpc import MessageError, parse_one_reading
from drawbridge.gateway.upstreams.local import NotSent
from drawbridge.gateway.upstreams.openapi.tools import OperationTool
from drawbridge.gateway.upstreams.ssrf import refusal
from drawbridge.policy.schemas import argument_problems

MAX_REDIRECTS: Final = 5
MAX_ERROR_TEXT: Final = 4096
_HEADER_VALUE: Final = re.compile(r"(?:[\x21-\x7e]+(?:[ \t]+[\x21-\x7e]+)*)?")
"""What an HTTP/1.1 header value may hold, as the client writes it: visible ASCII, spaces and tabs
inside."""
_CHARSET: Final = re.compile(r""";\s*charset\s*=\s*"?([A-Za-z0-9._:-]{1,40})"?""", re.IGNORECASE)


def tool_error(text: str, structured: Mapping[str, Any] | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": True}
    if structured is not None:
        result["structuredContent"] = dict(structured)
    return result


def _scalar(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    return None


class _Refused(Exception):
    pass


def _path(template: str, tool: OperationTool, arguments: Mapping[str, Any]) -> str:
    path = template
    for parameter in tool.operation.parameters:
        if parameter.location != "path":
            continue
        text = _scalar(arguments.get(parameter.name))
        if text is None:
            raise _Refused(f"path parameter {parameter.name}: a string, number or boolean is needed")
        if text in ("", ".", ".."):
            raise _Refused(f"path parameter {parameter.name}: empty, '.' and '..' would change the path")
        path = path.replace("{" + parameter.name + "}", quote(text, safe=""))
    return path


def _query_and_headers(tool: OperationTool, arguments: Mapping[str, Any]) -> tuple[list[tuple[str, str]], dict[str, str]]:
    query: list[tuple[str, str]] = []
    headers: dict[str, str] = {}
    for parameter in tool.operation.parameters:
        if parameter.location == "path" or parameter.name not in arguments:
            continue
        value = arguments[parameter.name]
        if value is None:
            continue
        if parameter.location == "query" and isinstance(value, list):
            items = [_scalar(item) for item in value]
            if any(item is None for item in items):
                raise _Refused(f"query parameter {parameter.name}: only lists of strings, numbers or booleans are sent")
            texts = [item for item in items if item is not None]
            if parameter.explode:
                query.extend((parameter.name, item) for item in texts)
            else:
                query.append((parameter.name, ",".join(texts)))
            continue
        text = _scalar(value)
        if text is None:
            raise _Refused(f"{parameter.location} parameter {parameter.name}: objects are not sent")
        if parameter.location == "query":
            query.append((parameter.name, text))
        else:
            if not _HEADER_VALUE.fullmatch(text):
                raise _Refused(
                    f"header parameter {parameter.name}: a header value may hold only visible ASCII "
                    "characters, with spaces and tabs between them"
                )
            headers[parameter.name] = text
    return query, headers


def _same_origin(a: httpx.URL, b: httpx.URL) -> bool:
    return (a.scheme, a.host, a.port) == (b.scheme, b.host, b.port)


async def _read_capped(response: httpx.Response, limit: int) -> tuple[bytes, bool]:
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return b"".join(chunks)[:limit], True
    return b"".join(chunks), False


def _json(data: bytes) -> tuple[Any, str | None]:
    """The answer read as JSON, or why it is shown as text (module docstring)."""
    try:
        return parse_one_reading(data), None
    except MessageError as exc:
        return None, exc.message.partition(": ")[2] or exc.message


def _decoded(data: bytes, content_type: str) -> str:
    """The answer's text, decoded by the charset its ``Content-Type`` declares (``text/plain;
    charset=iso-8859-1``); UTF-8 when it declares none or one Python does not know. A byte the
    charset cannot decode becomes U+FFFD."""
    match = _CHARSET.search(content_type)
    if match is not None:
        try:
            return data.decode(match.group(1), errors="replace")
        except LookupError:  # unknown, or no text encoding (``base64``, ``rot13``)
            pass
    return data.decode("utf-8", errors="replace")


def _result(status: int, reason: str, content_type: str, data: bytes, truncated: bool, limit: int) -> dict[str, Any]:
    text = _decoded(data, content_type)
    parsed: Any = None
    is_json = False
    if not truncated and data and ("json" in content_type.lower()):
        parsed, unread = _json(data)
        is_json = unread is None
        if unread is not None:
            text += f"\n[drawbridge: the answer is not read as JSON ({unread}); it is shown as text]"
    error = status >= 400
    if truncated:
        text += f"\n[drawbridge: the response was cut at {limit} bytes (max_response_bytes); the rest is not shown]"
    if error:
        shown = text if len(text) <= MAX_ERROR_TEXT else text[:MAX_ERROR_TEXT] + "\n[...]"
        body: Any = parsed if is_json else shown
        summary = f"HTTP {status} {reason}".rstrip()
        return tool_error(f"{summary}\n{shown}" if shown else summary, {"status": status, "body": body})
    if is_json:
        structured = parsed if isinstance(parsed, dict) else {"result": parsed}
        return {"content": [{"type": "text", "text": text}], "structuredContent": structured, "isError": False}
    return {"content": [{"type": "text", "text": text if text else f"HTTP {status} {reason}".rstrip()}], "isError": False}


async def call_operation(
    client: httpx.AsyncClient,
    backend_url: str,
    tool: OperationTool,
    arguments: Mapping[str, Any],
    *,
    max_response_bytes: int,
    timeout: float,
) -> dict[str, Any]:
    """The CallToolResult of one call (module docstring); raises ``NotSent``."""
    problems = argument_problems(tool.validator, arguments)
    if problems:
        return tool_error("the arguments do not match the tool's input schema:\n" + "\n".join(problems))
    operation = tool.operation
    try:
        path = _path(operation.path, tool, arguments)
        query, headers = _query_and_headers(tool, arguments)
    except _Refused as exc:
        return tool_error(f"the call was not sent: {exc}")
    url = backend_url.rstrip("/") + path
    options: dict[str, Any] = {"params": query, "headers": headers}
    if operation.has_body and "body" in arguments:
        options["json"] = arguments["body"]
    try:
        request = client.build_request(operation.method, url, **options)
    except (httpx.HTTPError, ValueError) as exc:
        return tool_error(f"the call was not sent: the request cannot be built ({exc})")
    with anyio.move_on_after(timeout):
        try:
            return await _exchange(client, request, max_response_bytes)
        except httpx.TimeoutException:
            pass  # the client's own per-read timeout, which is never shorter: the same answer
    return tool_error(
        f"the backend did not answer in full within {timeout:g} seconds (timeout); the call may have run"
    )


async def _exchange(
    client: httpx.AsyncClient, request: httpx.Request, max_response_bytes: int
) -> dict[str, Any]:
    """Send the request, follow the redirects allowed, read the answer (module docstring)."""
    origin = request.url
    sent = False
    try:
        for _ in range(MAX_REDIRECTS + 1):
            response = await client.send(request, stream=True)
            sent = True
            try:
                if response.is_redirect and response.next_request is not None:
                    target = response.next_request.url
                    if not _same_origin(origin, target):
                        return tool_error(
                            f"HTTP {response.status_code}: the backend redirected to another host "
                            f"({target.scheme}://{target.host}), which is not followed",
                            {"status": response.status_code},
                        )
                    request = response.next_request
                    continue
                data, truncated = await _read_capped(response, max_response_bytes)
                return _result(
                    response.status_code, response.reason_phrase, response.headers.get("content-type", ""),
                    data, truncated, max_response_bytes,
                )
            finally:
                await response.aclose()
        return tool_error(f"the backend redirected more than {MAX_REDIRECTS} times; not followed")
    except httpx.TimeoutException:
        raise  # answered as the deadline is (call_operation)
    except httpx.HTTPError as exc:
        refused = refusal(exc)
        if refused is not None:
            raise NotSent(str(refused)) from None
        if not sent and isinstance(exc, httpx.ConnectError):
            raise NotSent(f"the backend could not be reached ({exc})") from None
        if not sent and isinstance(exc, httpx.LocalProtocolError):
            return tool_error(
                f"the call was not sent: the HTTP client refused to write the request ({type(exc).__name__})"
            )
        return tool_error(f"the backend's answer could not be read ({type(exc).__name__})")


__all__ = ["MAX_REDIRECTS", "call_operation", "tool_error"]
