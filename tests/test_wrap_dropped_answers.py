"""Answers that do not come as they should. An upstream answer the gateway must drop (larger than ``--max-upstream-message-bytes``, not UTF-8)
is still an answer: when the dropped line provably answers a call in flight, the call is answered at
once with an error naming the problem, and recorded so; it no longer waits for the call timeout.
Whose answer a line is, is read from its start only when that proves it (``protocol.partial_id``).
An answer that never comes ends at the call timeout, whatever the request's method."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from approval_support import cli, decisions
from conftest import PYTHON, SERVERS, raw_pipe, wrap_argv

from drawbridge.gateway.protocol.partial_id import response_id

pytestmark = pytest.mark.anyio

SCRIPTED = [PYTHON, str(SERVERS / "scripted.py")]


@pytest.mark.parametrize(("tool", "arguments", "problem"), [
    ("echo", {"pad": "x" * 200_000}, "exceeds --max-upstream-message-bytes (100000); it was dropped"),
    ("bad_utf8", {}, "a line from the upstream was dropped: parse error"),
])
async def test_a_dropped_answer_answers_its_call_at_once(tmp_path: Path, tool: str, arguments: dict, problem: str) -> None:
    evidence = tmp_path / "evidence"
    argv = wrap_argv(SCRIPTED, "--allow-all", "--evidence-dir", str(evidence), "--fsync", "never",
                     "--max-upstream-message-bytes", "100000", "--call-timeout", "600")
    async with raw_pipe(argv) as pipe:
        await pipe.initialize()
        answer = await pipe.request(5, "tools/call", {"name": tool, "arguments": arguments})
        assert (await pipe.request(6, "tools/call", {"name": "echo", "arguments": {"n": 6}}))["result"]  # goes on
    error = answer["error"]
    assert error["code"] == -32603 and problem in error["message"], error
    assert "invalid request" not in error["message"]  # the server's answer is no request of the agent's
    [record] = [r for r in decisions(evidence, tool) if r["request_id"] == "5"]
    assert record["outcome"] == "upstream_error" and problem in record["error"]
    done = cli("evidence", "verify-chain", str(evidence / "trace.ndjson"))
    assert done.returncode == 0, done.stdout


@pytest.mark.parametrize(("start", "expected"), [
    (b'{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"xx', 3),
    (b'{"jsonrpc": "2.0", "id": "a-1", "error": {"code": 1, "message": "\xff', "a-1"),
    (b'{"jsonrpc":"2.0","result":{"id":5},"id":3}', 3),
    (b'{"result":{"id":5,"text":"cut', None),  # only a nested id was read
    (b'{"jsonrpc":"2.0","id":3', None),  # the id may go on (34...)
    (b'{"jsonrpc":"2.0","id":3,"method":"sampling/createMessage","params":{', None),  # a request
    (b'{"jsonrpc":"2.0","id":3,"params":{"x":"cut', None),  # nothing says it is an answer yet
    (b'{"jsonrpc":"2.0","id":3,"id":4,"result":{', None),  # two ids
    (b'{"jsonrpc":"2.0","id":true,"result":{', None),
    (b'{"jsonrpc":"2.0","id":1.5,"result":{', None),
    (b'{"jsonrpc":"2.\xff0","id":3,"result":{', None),  # not UTF-8 before the id
    (b'[{"id":3,"result":{}}]', None),
    (b'{"jsonrpc":"2.0","ID":4,"id":3,"result":{', None),  # another reader may take ID for the id
    (b'{"jsonrpc":"2.0","id":3,"Result":{', None),
    (b'not json', None),
])
def test_the_id_of_a_dropped_answer_is_named_only_when_its_start_proves_it(start: bytes, expected: object) -> None:
    assert response_id(start) == expected


async def test_the_call_timeout_holds_for_every_forwarded_request(tmp_path: Path) -> None:
    """Not only tools/call: a resources/read the server never answers is answered -32001 at the
    call timeout (as under serve), and the server is told it is no longer wanted."""
    argv = wrap_argv(SCRIPTED, "--allow-all", "--call-timeout", "0.5")
    async with raw_pipe(argv) as pipe:
        await pipe.initialize()
        answer = await pipe.request(9, "resources/read", {"uri": "file:///x", "never_answer": True})
        assert (await pipe.request(10, "ping"))["error"]["code"] == -32601  # the server still answers
    assert answer["error"] == {"code": -32001, "message": "the upstream did not answer resources/read within 0.5 seconds"}
