"""JSON-RPC 2.0 over newline-delimited JSON: framing, classification, and the errors the relay answers with.

Invariant: the relay never re-serializes a message it passes on. A line read from one side is either
handed to the other side as the exact bytes received (plus one ``\\n``), or answered with an error that
says precisely what was wrong with it and never quotes the offending content. Everything here is
sans-IO: bytes in, values out, no event loop.

Theory of operation. ``LineFramer`` turns a byte stream into complete lines and enforces the size limit
without ever holding more than ``max_bytes`` of one line: past the limit it reports ``Oversize`` once and
discards through the next newline. ``parse_client_message`` is the strict parser for what an agent sends
(what another parser could read differently -- repeated keys, keys equal but for case, keys with
control characters, NaN and numbers beyond a double, nesting past the limit -- is refused,
``one_reading``: policy must see what the server will see); ``parse_upstream_message`` is the
lenient one for what a server sends: it holds to one reading the keys of the parts the relay reads
(the envelope and the keys of ``params``, ``result`` and ``error``), and refuses anywhere in the line
what has no single reading at all -- a key repeated exactly, ``NaN`` or ``Infinity``, a number no
double holds -- since the agent reads the line as the server wrote it while the record holds the
gateway's reading (``isError`` twice: which one is the outcome?). Both return a
``Message``: its kind, method, id and the parsed body, together with the raw line for forwarding.
The ``*_line`` builders render the few messages the relay writes itself.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final

from drawbridge.gateway.protocol.limits import DEFAULT_MAX_MESSAGE_BYTES as DEFAULT_MAX_MESSAGE_BYTES
from drawbridge.gateway.protocol.limits import (
    DEFAULT_MAX_UPSTREAM_MESSAGE_BYTES as DEFAULT_MAX_UPSTREAM_MESSAGE_BYTES,
)
from drawbridge.gateway.protocol.methods import TOOLS_CALL
from drawbridge.gateway.protocol.one_reading import (
    DEFAULT_MAX_DEPTH,
    ENVELOPE_MEMBERS,
    Ambiguous,
    NumberTooLarge,
    RepeatedKey,
    bounded_int,
    check_keys,
    inexact_member,
    nesting_problem,
    one_reading_object,
    too_deep,
)

JSONRPC_VERSION: Final = "2.0"

PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
# The error codes follow MCP 2026-07-28's allocation rules ("Error Codes"): -32700..-32600 are
# JSON-RPC's; -32020..-32022 are MCP's (HEADER_MISMATCH and its neighbours, answered by the SDK's
# inbound checks); -32000 and -32001 are the legacy band, kept because the mcp SDKs give them the same
# meaning (connection closed, request timeout) and clients key on them; a code of the gateway's own
# lies outside -32768..-32000. docs/errors.md lists every code the gateway answers with.
UNSUPPORTED_PROTOCOL_VERSION: Final = -32022
UPSTREAM_EXITED: Final = -32000
UPSTREAM_TIMEOUT: Final = -32001
EVIDENCE_UNWRITTEN: Final = -31002
"""The call ran, but its evidence could not be written: its result is withheld (nothing is answered
without evidence) and the gateway refuses every later call. (Not -32002, which 2026-07-28 forbids: a
client of the 2025 era reads it as "resource not found".)"""
RESULT_WITHHELD: Final = (
    "the call ran, but its evidence could not be written, so its result is withheld; "
    "this gateway refuses further calls until it is restarted with working evidence storage"
)


RequestId = str | int
IdKey = tuple[str, str | int]
"""A hashable key for a request id: ``1`` and ``"1"`` are different requests."""


# --------------------------------------------------------------------------------------------- framing


@dataclass(frozen=True, slots=True)
class Oversize:
    """A line longer than the limit; it was discarded, never buffered whole."""

    size: int
    """Bytes seen before the line was abandoned (at least ``limit + 1``)."""
    limit: int
    head: bytes = field(default=b"", compare=False, repr=False)
    """The line's first ``OVERSIZE_HEAD_BYTES`` bytes: enough to find whom an answer was for
    (``partial_id``), never the whole line."""


OVERSIZE_HEAD_BYTES: Final = 4096


class LineFramer:
    """Split a byte stream into lines of at most ``max_bytes`` bytes (the ``\\n`` not counted).

    Blank lines are skipped. A final line without ``\\n`` is returned by ``close()``.
    """

    __slots__ = ("_buf", "_discarding", "_max", "_scan_from")

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 1:
            raise ValueError("max_bytes must be at least 1")
        self._max = max_bytes
        self._buf = bytearray()
        self._scan_from = 0
        self._discarding = False

    def feed(self, data: bytes) -> list[bytes | Oversize]:
        if not self._buf and not self._discarding:
            return self._feed_fresh(data)
        out: list[bytes | Oversize] = []
        if self._discarding:
            cut = data.find(b"\n")
            if cut < 0:
                return out
            self._discarding = False
            data = data[cut + 1 :]
        buf = self._buf
        buf += data
        start = 0
        while True:
            cut = buf.find(b"\n", max(start, self._scan_from))
            if cut < 0:
                break
            self._scan_from = 0
            if cut - start > self._max:
                out.append(Oversize(cut - start, self._max, bytes(buf[start : start + OVERSIZE_HEAD_BYTES])))
            elif buf[start:cut].strip():
                out.append(bytes(buf[start:cut]))
            start = cut + 1
        del buf[:start]
        if len(buf) > self._max:
            # The current line is already too long: report it now, keep nothing, skip to its end.
            out.append(Oversize(len(buf), self._max, bytes(buf[:OVERSIZE_HEAD_BYTES])))
            buf.clear()
            self._scan_from = 0
            self._discarding = True
        else:
            self._scan_from = len(buf)
        return out

    def _feed_fresh(self, data: bytes) -> list[bytes | Oversize]:
        """``feed`` when nothing is held from earlier reads (nearly every read): the same lines, split
        in one pass."""
        limit = self._max
        *lines, rest = data.split(b"\n")
        out: list[bytes | Oversize] = [
            Oversize(len(line), limit, line[:OVERSIZE_HEAD_BYTES]) if len(line) > limit else line
            for line in lines
            if len(line) > limit or line.strip()
        ]
        if len(rest) > limit:
            out.append(Oversize(len(rest), limit, rest[:OVERSIZE_HEAD_BYTES]))
            self._discarding = True
        elif rest:
            self._buf += rest
            self._scan_from = len(rest)
        return out

    def close(self) -> bytes | None:
        """The unterminated last line at end of stream, if any (an abandoned oversize line yields nothing)."""
        rest = bytes(self._buf)
        self._buf.clear()
        self._scan_from = 0
        if self._discarding or not rest.strip():
            return None
        return rest


# -------------------------------------------------------------------------------------------- messages


class Kind(Enum):
    REQUEST = "request"
    NOTIFICATION = "notification"
    RESPONSE = "response"


@dataclass(frozen=True, slots=True)
class Message:
    kind: Kind
    raw: bytes
    """The line exactly as received, without its ``\\n``: what gets forwarded."""
    body: dict[str, Any]
    method: str | None = None
    id: RequestId | None = None

    @property
    def key(self) -> IdKey | None:
        return None if self.id is None else id_key(self.id)

    @property
    def params(self) -> Any:
        return self.body.get("params")


class MessageError(Exception):
    """A message the relay answers with a JSON-RPC error instead of forwarding."""

    def __init__(self, code: int, message: str, request_id: RequestId | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id


def id_key(request_id: RequestId) -> IdKey:
    return ("s", request_id) if isinstance(request_id, str) else ("i", request_id)


def valid_id(value: Any) -> bool:
    """MCP request ids are strings or integers; ``true`` is not an integer here."""
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _refuse_constant(_name: str) -> Any:
    raise ValueError("NaN and Infinity are not JSON")


def _finite_float(text: str) -> float:
    """The decimal hook: a number within a double's range. ``1e400`` has no double (no JSON number, no
    canonical form for evidence); ``1e-400`` reads as 0 here while a reader of exact decimals reads a
    positive number, so a literal with a non-zero digit that reads as 0 is refused too."""
    value = float(text)
    if value in (math.inf, -math.inf):
        raise NumberTooLarge("a number is too large for a double")
    if value == 0.0 and text.lower().partition("e")[0].strip("-+0."):
        raise NumberTooLarge("a number is too small for a double (it would read as 0)")
    return value


def _no_repeated_key(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """The upstream's object hook: only an exact repeat is refused (the cheapest check there is)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise RepeatedKey("a JSON object in the message repeats a key")
    return obj


_STRICT_DECODER = json.JSONDecoder(
    object_pairs_hook=one_reading_object, parse_constant=_refuse_constant, parse_float=_finite_float,
    parse_int=bounded_int,
)
_UPSTREAM_DECODER = json.JSONDecoder(
    object_pairs_hook=_no_repeated_key, parse_constant=_refuse_constant, parse_float=_finite_float
)
_BOM: Final = "\ufeff"


def _decode(line: bytes, decoder: json.JSONDecoder) -> Any:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MessageError(PARSE_ERROR, f"parse error: message is not UTF-8 (invalid byte at offset {exc.start})")
    try:
        return decoder.decode(text)
    except (RepeatedKey, NumberTooLarge) as exc:
        raise MessageError(PARSE_ERROR, f"parse error: {exc}") from None
    except Ambiguous as exc:  # any other reading another parser could make: refused, the id unread
        raise MessageError(INVALID_REQUEST, f"invalid request: {exc}") from None
    except json.JSONDecodeError as exc:
        if exc.pos == 0 and text.startswith(_BOM):
            problem = "the message starts with a byte order mark (U+FEFF), which JSON text does not allow"
        else:  # some of json's messages end in "at" ("Invalid control character at"): the position says it
            problem = f"{exc.msg.removesuffix(' at')} at character {exc.pos}"
        raise MessageError(PARSE_ERROR, f"parse error: {problem}") from None
    except ValueError as exc:  # the constant hook
        raise MessageError(PARSE_ERROR, f"parse error: {exc}") from None
    except RecursionError:
        raise _TooDeep from None


class _TooDeep(Exception):
    """The line nests deeper than Python's parser goes (far past any configured limit)."""


def _classify(line: bytes, body: Any, *, strict: bool) -> Message:
    if isinstance(body, list):
        raise MessageError(INVALID_REQUEST, "invalid request: JSON-RPC batches are not supported")
    if not isinstance(body, dict):
        raise MessageError(INVALID_REQUEST, "invalid request: a JSON-RPC message must be a JSON object")
    if not strict:
        # An upstream's message is parsed leniently, but the parts the gateway reads and routes are
        # held to one reading: the envelope, and the keys of its params or result.
        try:
            check_keys(body)
            for part in ("params", "result", "error"):
                if isinstance(body.get(part), dict):
                    check_keys(body[part])
        except Ambiguous as exc:
            raise MessageError(INVALID_REQUEST, f"invalid request: {exc}") from None
    if inexact_member(body, ENVELOPE_MEMBERS) is not None:
        raise MessageError(
            INVALID_REQUEST, "invalid request: a key of the message reads as a JSON-RPC member to a "
            "case-insensitive parser without being spelled as one"
        )
    has_id = "id" in body
    raw_id = body.get("id")
    if has_id and not valid_id(raw_id):
        raise MessageError(INVALID_REQUEST, "invalid request: id must be a string or an integer")
    request_id: RequestId | None = raw_id if has_id else None
    if body.get("jsonrpc") != JSONRPC_VERSION:
        raise MessageError(INVALID_REQUEST, 'invalid request: "jsonrpc" must be "2.0"', request_id)
    if "method" in body:
        method = body["method"]
        if not isinstance(method, str) or not method:
            raise MessageError(INVALID_REQUEST, "invalid request: method must be a non-empty string", request_id)
        # tools/call params are checked by the pipeline, which records the refused call as a call.
        if strict and method != TOOLS_CALL and "params" in body and not isinstance(body["params"], dict):
            raise MessageError(INVALID_PARAMS, "invalid params: params must be a JSON object", request_id)
        kind = Kind.REQUEST if has_id else Kind.NOTIFICATION
        return Message(kind, line, body, method, request_id)
    if has_id and (("result" in body) != ("error" in body)):
        return Message(Kind.RESPONSE, line, body, None, request_id)
    raise MessageError(
        INVALID_REQUEST,
        "invalid request: a message needs a method (request or notification) or an id with exactly one "
        "of result and error (response)",
        request_id,
    )


def parse_one_reading(data: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
    """Any JSON a client sends (an agent's message, a control-plane body), read by the ``one_reading``
    rules. Raises ``MessageError`` naming the rule broken (never the content) and the code to answer with."""
    try:
        body = _decode(data, _STRICT_DECODER)
    except _TooDeep:
        problem: str | None = too_deep(max_depth)
    else:
        problem = nesting_problem(data, body, max_depth)
    if problem is not None:
        raise MessageError(INVALID_REQUEST, f"invalid request: {problem}")
    return body


def parse_client_message(line: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> Message:
    """Parse a line from the agent, strictly (``one_reading``). Raises ``MessageError`` with the code
    to answer with."""
    return _classify(line, parse_one_reading(line, max_depth), strict=True)


def parse_upstream_message(line: bytes) -> Message:
    """Parse a line from the upstream server. Raises ``MessageError`` (the relay drops such lines)."""
    try:
        body = _decode(line, _UPSTREAM_DECODER)
    except _TooDeep:
        raise MessageError(PARSE_ERROR, "parse error: JSON nested too deeply") from None
    return _classify(line, body, strict=False)


# ----------------------------------------------------------------------------------------- rendering


def encode_line(obj: Mapping[str, Any]) -> bytes:
    """Render one message the relay writes itself: compact, ASCII-only, no NaN, one ``\\n``."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("ascii") + b"\n"


def error_line(request_id: RequestId | None, code: int, message: str, data: Any = None) -> bytes:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return encode_line({"jsonrpc": JSONRPC_VERSION, "id": request_id, "error": error})


def result_line(request_id: RequestId, result: Mapping[str, Any]) -> bytes:
    return encode_line({"jsonrpc": JSONRPC_VERSION, "id": request_id, "result": result})


def notification_line(method: str, params: Mapping[str, Any]) -> bytes:
    return encode_line({"jsonrpc": JSONRPC_VERSION, "method": method, "params": params})


def oversize_message(oversize: Oversize) -> str:
    return (
        f"invalid request: message of at least {oversize.size} bytes exceeds the limit of "
        f"{oversize.limit} bytes; it was discarded unread"
    )


@dataclass(frozen=True, slots=True)
class LineRefusal:
    """A client line the gateway cannot take: the incident to record and the answer, if any."""

    kind: str  # "oversize" | "parse_error" | "invalid_message"
    detail: str
    code: int
    reply: bytes | None


def incident_kind(error: MessageError) -> str:
    """The incident a refused client message is recorded as, whatever transport brought it."""
    return "parse_error" if error.code == PARSE_ERROR else "invalid_message"


def read_client_line(item: bytes | Oversize, max_depth: int = DEFAULT_MAX_DEPTH) -> Message | LineRefusal:
    """One framed client line, parsed strictly, or the refusal every transport gives for it."""
    if isinstance(item, Oversize):
        detail = oversize_message(item)
        return LineRefusal("oversize", detail, INVALID_REQUEST, error_line(None, INVALID_REQUEST, detail))
    try:
        return parse_client_message(item, max_depth)
    except MessageError as exc:
        kind = incident_kind(exc)
        answerable = exc.request_id is not None or exc.code in (PARSE_ERROR, INVALID_REQUEST)
        reply = error_line(exc.request_id, exc.code, exc.message) if answerable else None
        return LineRefusal(kind, exc.message, exc.code, reply)

