"""Framing and message classification (sans-IO): bytes in, values out."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from drawbridge.gateway.protocol.jsonrpc import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    PARSE_ERROR,
    Kind,
    LineFramer,
    MessageError,
    Oversize,
    error_line,
    id_key,
    notification_line,
    oversize_message,
    parse_client_message,
    parse_upstream_message,
    result_line,
)
from drawbridge.gateway.protocol.methods import looks_like_tools_call
from drawbridge.gateway.protocol.partial_id import undecodable_response_id


def _frame(chunks: list[bytes], limit: int) -> list[bytes | Oversize]:
    framer = LineFramer(limit)
    out: list[bytes | Oversize] = []
    for chunk in chunks:
        out.extend(framer.feed(chunk))
    last = framer.close()
    if last is not None:
        out.append(last)
    return out


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, start = [], 0
    for point in points:
        pieces.append(data[start:point])
        start = point
    pieces.append(data[start:])
    return pieces


line_bodies = st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")).filter(lambda b: b.strip() != b"")


@given(lines=st.lists(line_bodies, max_size=12), cuts=st.lists(st.integers(min_value=0), max_size=20))
def test_any_chunking_yields_the_same_lines(lines: list[bytes], cuts: list[int]) -> None:
    data = b"".join(line + b"\n" for line in lines)
    assert _frame(_split(data, cuts), limit=64) == lines


@given(
    lines=st.lists(st.tuples(line_bodies, st.booleans()), max_size=10),
    cuts=st.lists(st.integers(min_value=0), max_size=20),
)
def test_long_lines_become_oversize_markers_whatever_the_chunking(
    lines: list[tuple[bytes, bool]], cuts: list[int]
) -> None:
    limit = 16
    expanded = [body * 3 if big else body[:limit] for body, big in lines]
    expanded = [line for line in expanded if line.strip()]
    data = b"".join(line + b"\n" for line in expanded)
    got = _frame(_split(data, cuts), limit=limit)
    expected_shape = [len(line) > limit for line in expanded]
    assert [isinstance(item, Oversize) for item in got] == expected_shape
    assert [item for item in got if not isinstance(item, Oversize)] == [
        line for line in expanded if len(line) <= limit
    ]
    for item in got:
        if isinstance(item, Oversize):
            assert item.size > limit and item.limit == limit


def test_oversize_is_never_buffered_whole() -> None:
    framer = LineFramer(10)
    assert framer.feed(b"a" * 11) == [Oversize(11, 10)]
    assert framer._buf == bytearray()  # noqa: SLF001 -- the point of the test
    assert framer.feed(b"a" * 1000) == []
    assert framer._buf == bytearray()  # noqa: SLF001
    assert framer.feed(b"aaa\nok\n") == [b"ok"]
    assert framer.close() is None


def test_blank_lines_are_skipped_and_the_last_line_needs_no_newline() -> None:
    assert _frame([b"\n \n{}\r\n\n[1]"], 100) == [b"{}\r", b"[1]"]
    assert LineFramer(5).close() is None
    with pytest.raises(ValueError):
        LineFramer(0)


def test_exactly_at_the_limit_passes() -> None:
    assert _frame([b"x" * 8 + b"\n"], 8) == [b"x" * 8]
    assert _frame([b"x" * 9 + b"\n"], 8) == [Oversize(9, 8)]


def test_message_kinds_and_raw_bytes_are_kept() -> None:
    raw = b'{"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {"x": 1.50}}'
    request = parse_client_message(raw)
    assert (request.kind, request.method, request.id, request.raw) == (Kind.REQUEST, "tools/list", 3, raw)
    note = parse_client_message(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
    assert (note.kind, note.id, note.key) == (Kind.NOTIFICATION, None, None)
    response = parse_client_message(b'{"jsonrpc":"2.0","id":"a","result":{}}')
    assert (response.kind, response.id) == (Kind.RESPONSE, "a")
    error = parse_upstream_message(b'{"jsonrpc":"2.0","id":4,"error":{"code":1,"message":"m"}}')
    assert error.kind is Kind.RESPONSE


def test_ids_of_different_types_are_different_requests() -> None:
    assert id_key(1) != id_key("1")
    assert id_key(1) == id_key(1)


@pytest.mark.parametrize(
    ("line", "code", "request_id"),
    [
        (b"{", PARSE_ERROR, None),
        (b'{"a":1,"a":2}', PARSE_ERROR, None),
        (b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"n":Infinity}}', PARSE_ERROR, None),
        (b"[" * 100000, INVALID_REQUEST, None),
        (b"\xc3\x28", PARSE_ERROR, None),
        (b"[]", INVALID_REQUEST, None),
        (b"3", INVALID_REQUEST, None),
        (b'{"id":1,"method":"x"}', INVALID_REQUEST, 1),
        (b'{"jsonrpc":"2.0","id":1.5,"method":"x"}', INVALID_REQUEST, None),
        (b'{"jsonrpc":"2.0","id":null,"method":"x"}', INVALID_REQUEST, None),
        (b'{"jsonrpc":"2.0","id":{},"method":"x"}', INVALID_REQUEST, None),
        (b'{"jsonrpc":"2.0","id":1,"method":""}', INVALID_REQUEST, 1),
        (b'{"jsonrpc":"2.0","id":1,"method":7}', INVALID_REQUEST, 1),
        (b'{"jsonrpc":"2.0","id":1,"result":{},"error":{}}', INVALID_REQUEST, 1),
        (b'{"jsonrpc":"2.0","result":{}}', INVALID_REQUEST, None),
        (b'{"jsonrpc":"2.0","id":2,"method":"ping","params":"p"}', INVALID_PARAMS, 2),
        (b'{"jsonrpc":"2.0","method":"note","params":[1]}', INVALID_PARAMS, None),
    ],
)
def test_client_messages_refused_with_the_right_code(line: bytes, code: int, request_id: object) -> None:
    with pytest.raises(MessageError) as caught:
        parse_client_message(line)
    assert caught.value.code == code
    assert caught.value.request_id == request_id


def test_error_messages_never_quote_the_input() -> None:
    secret = "s3cr3t-token"
    for line in (
        f'{{"token": "{secret}" oops}}'.encode(),
        f'{{"a": "{secret}", "a": 1}}'.encode(),
        f'["{secret}"]'.encode(),
    ):
        with pytest.raises(MessageError) as caught:
            parse_client_message(line)
        assert secret not in caught.value.message


def test_upstream_parser_is_lenient_where_the_client_parser_is_strict() -> None:
    """Keys that fold alike below the parts the relay reads, and integers beyond a double, pass from
    a server; what has no single reading anywhere (a repeated key, NaN, a number no double holds) does
    not (the next test)."""
    line = b'{"jsonrpc":"2.0","id":1,"result":{"structuredContent":{"v":1,"V":2,"n":9007199254740993}}}'
    assert parse_upstream_message(line).kind is Kind.RESPONSE
    with pytest.raises(MessageError):
        parse_client_message(line)
    tools_call = parse_client_message(b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":[1]}')
    assert tools_call.method == "tools/call"  # left for the pipeline, which records it


def test_rendered_lines_are_compact_single_lines() -> None:
    line = error_line(None, PARSE_ERROR, "parse error: x\ny")
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "parse error: x\ny"}}
    assert json.loads(error_line(3, -32000, "m", {"k": 1}))["error"]["data"] == {"k": 1}
    assert result_line("r", {"a": "\u00e9"}) == b'{"jsonrpc":"2.0","id":"r","result":{"a":"\\u00e9"}}\n'
    assert json.loads(notification_line("notifications/cancelled", {"requestId": 1})) == {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": 1},
    }
    assert "at least 20 bytes exceeds the limit of 10 bytes" in oversize_message(Oversize(20, 10))


def test_a_number_beyond_a_double_is_a_parse_error_not_an_infinity() -> None:
    """``1e400`` would parse to inf: no JSON number, no canonical form for the evidence, so refused."""
    from drawbridge.gateway.protocol.jsonrpc import PARSE_ERROR, MessageError, parse_client_message

    line = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"x":1e400}}}'
    with pytest.raises(MessageError) as info:
        parse_client_message(line)
    assert info.value.code == PARSE_ERROR and "too large" in info.value.message
    ok = parse_client_message(b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"x":1e300}}}')
    assert ok.body["params"]["arguments"]["x"] == 1e300


@pytest.mark.parametrize("number", ["1e-400", "-1e-400", "0.5e-330", "123E-999"])
def test_a_number_that_reads_as_zero_from_a_non_zero_literal_is_refused(number: str) -> None:
    """``1e-400`` would read as 0 here, while a reader of exact decimals reads a positive number: no
    double holds it, as none holds ``1e400``. A zero (``0.0e-400``, ``-0.0``) and a subnormal stay."""
    line = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"n":%s}}}'
    with pytest.raises(MessageError) as info:
        parse_client_message(line % number.encode())
    assert info.value.code == PARSE_ERROR and "too small for a double" in info.value.message
    for fine in (b"0.0e-400", b"-0.0", b"5e-324", b"0"):
        assert parse_client_message(line % fine).body["params"]["arguments"]["n"] == float(fine)


@pytest.mark.parametrize(("line", "problem", "answers"), [
    (b'{"jsonrpc":"2.0","id":"zzz","id":307,"result":{}}', "repeats a key", None),
    (b'{"jsonrpc":"2.0","id":307,"result":{"content":[],"isError":true,"isError":false}}', "repeats a key", 307),
    (b'{"jsonrpc":"2.0","id":307,"result":{"structuredContent":{"rows":[{"a":1,"a":2}]}}}', "repeats a key", 307),
    (b'{"jsonrpc":"2.0","id":"r","result":{"structuredContent":{"v":NaN}}}', "NaN and Infinity", "r"),
    (b'{"jsonrpc":"2.0","id":5,"error":{"code":1,"message":"m","data":-Infinity}}', "NaN and Infinity", 5),
    (b'{"jsonrpc":"2.0","id":5,"result":{"v":1e400}}', "too large for a double", 5),
    (b'{"jsonrpc":"2.0","id":5,"result":{"v":1e-400}}', "too small for a double", 5),
    (b'{"jsonrpc":"2.0","id":5,"ID":6,"result":{"v":NaN}}', "NaN and Infinity", None),  # two readings of the id
    (b'{"jsonrpc":"2.0","id":5,"method":"sampling/createMessage","params":{"v":NaN}}', "NaN", None),  # a request
    (b'{"jsonrpc":"2.0","id":5,"result":{"v":NaN},"error":{"code":1,"message":"m"}}', "NaN", None),
])
def test_an_upstream_line_without_one_reading_is_dropped_naming_only_the_request_its_envelope_proves(
    line: bytes, problem: str, answers: object
) -> None:
    """The agent reads the server's line as written, the record holds the gateway's reading: a key
    repeated anywhere in it (``isError`` twice), NaN, a number no double holds leave them apart, so
    the line is dropped. Its request is named when the envelope itself reads one way."""
    with pytest.raises(MessageError) as info:
        parse_upstream_message(line)
    assert info.value.code == PARSE_ERROR and problem in info.value.message
    assert undecodable_response_id(line) == answers


@pytest.mark.parametrize(("line", "message"), [
    (b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"s":"a\x01b"}}', "parse error: Invalid control character at character 56"),
    (b'\xef\xbb\xbf{"jsonrpc":"2.0","id":1,"method":"ping"}', "parse error: the message starts with a byte order mark (U+FEFF)"),
    (b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"s":"ab', "parse error: Unterminated string starting at character 54"),
])
def test_a_parse_error_says_what_is_wrong_once(line: bytes, message: str) -> None:
    with pytest.raises(MessageError) as info:
        parse_client_message(line)
    assert info.value.message.startswith(message) and " at at " not in info.value.message


@pytest.mark.parametrize(("method", "refused"), [
    ("tools/call", False), ("tools/list", False), ("notifications/initialized", False), ("caf\u00e9/x", False),
    ("Tools/call", True), ("tools/call ", True), ("\ntools/call", True),
    ("tools/call\x00", True), ("tools/call\u200b", True), ("\uff54ools/call", True), ("tools/call\u2028", True),
    ("tools/call\u00a0", True), ("tools/list\x00", True), ("tools/\u00adlist", True), ("tools\u2215call", False),
])
def test_a_method_some_reader_could_take_for_another_is_refused(method: str, refused: bool) -> None:
    """NUL (a C-string reader stops there), format and space characters, compatibility forms: a method
    holding one is refused whatever it reads as; an ordinary non-ASCII method in NFKC form is not."""
    assert looks_like_tools_call(method) is refused
