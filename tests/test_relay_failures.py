"""Bad input and bad upstreams: the agent always gets an answer, the gateway keeps serving, the trace says why."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from conftest import CRASHY, GITHUB_LIKE, PYTHON, SERVERS, connect, eventually_async, raw_pipe, scaled
from mcp.shared.exceptions import MCPError

pytestmark = pytest.mark.anyio

SCRIPTED = [PYTHON, str(SERVERS / "scripted.py")]
ECHO_CALL = {"name": "echo", "arguments": {"text": "still here"}}


def _text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def _still_serving(pipe: Any, request_id: Any) -> None:
    response = await pipe.request(request_id, "tools/call", ECHO_CALL)
    assert response["result"]["content"][0]["text"] == "still here"


# ------------------------------------------------------------------------------------- bad input


async def test_malformed_lines_get_precise_errors_and_serving_goes_on(harness) -> None:
    relay = harness(CRASHY)
    async with raw_pipe(relay.argv()) as pipe:
        await pipe.initialize()
        cases: list[tuple[bytes, int, Any, str]] = [
            (b"{not json}\n", -32700, None, "parse error: Expecting property name enclosed in double quotes"),
            (b'{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}\n', -32700, None, "repeats a key"),
            (b'{"jsonrpc":"2.0","id":3,"method":"ping","params":{"x":NaN}}\n', -32700, None, "NaN"),
            (b"\xff\xfe\n", -32700, None, "not UTF-8"),
            (b'[{"jsonrpc":"2.0","id":4,"method":"ping"}]\n', -32600, None, "batches are not supported"),
            (b'"just a string"\n', -32600, None, "must be a JSON object"),
            (b'{"jsonrpc":"1.0","id":5,"method":"ping"}\n', -32600, 5, '"jsonrpc" must be "2.0"'),
            (b'{"jsonrpc":"2.0","id":true,"method":"ping"}\n', -32600, None, "id must be a string or an integer"),
            (b'{"jsonrpc":"2.0","id":6}\n', -32600, 6, "needs a method"),
            (b'{"jsonrpc":"2.0","id":7,"method":"tools/list","params":[1]}\n', -32602, 7, "params must be a JSON"),
        ]
        for line, code, request_id, fragment in cases:
            await pipe.send(line)
            answer = await pipe.recv()
            assert answer["id"] == request_id, line
            assert answer["error"]["code"] == code, line
            assert fragment in answer["error"]["message"], (line, answer)
        await _still_serving(pipe, 8)
    kinds = [i["kind"] for i in relay.incidents()]
    assert kinds.count("parse_error") == 4
    assert kinds.count("invalid_message") == 6


async def test_bad_tools_call_params_are_invalid_params_and_recorded(harness) -> None:
    relay = harness(CRASHY)
    cases: list[tuple[Any, str]] = [
        ([1, 2], "params must be a JSON object"),
        ({"arguments": {}}, "params.name must be a string"),
        ({"name": "echo", "arguments": "text"}, "params.arguments must be a JSON object"),
        ({"name": "echo", "arguments": {}, "_meta": 3}, "params._meta must be a JSON object"),
        ({"name": "ec\nho", "arguments": {"text": "x"}}, "control or format character (U+000A at index 2)"),
        ({"name": "echo\u202e", "arguments": {}}, "control or format character (U+202E at index 4)"),
        ({"name": "echo\u200b", "arguments": {}}, "control or format character (U+200B at index 4)"),
        ({"name": " echo", "arguments": {}}, "leading or trailing whitespace"),
        ({"name": "", "arguments": {}}, "tool name is empty"),
        ({"name": "e" * 1025, "arguments": {}}, "longer than 1024 characters"),
        ({"name": "echo", "arguments": None}, "params.arguments must be a JSON object"),  # never forwarded as null
    ]
    async with raw_pipe(relay.argv()) as pipe:
        await pipe.initialize()
        for index, (params, fragment) in enumerate(cases):
            response = await pipe.request(index, "tools/call", params)
            assert response["error"]["code"] == -32602, params
            message = response["error"]["message"]
            assert fragment in message, (params, message)
            assert "ec\nho" not in message
        await _still_serving(pipe, "last")
    calls = relay.calls()
    assert [c["outcome"] for c in calls] == ["invalid"] * len(cases) + ["ok"]
    assert calls[4]["tool"] == "ec\ufffdho"  # recorded printable, never raw
    assert all(c["action"] is None for c in calls[:-1])


async def test_oversize_messages_are_refused_without_being_read(harness) -> None:
    relay = harness(CRASHY, max_message_bytes=2048)
    big_call = {
        "jsonrpc": "2.0",
        "id": "big",
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": "y" * 5000}},
    }
    async with raw_pipe(relay.argv()) as pipe:
        await pipe.initialize()
        data = json.dumps(big_call).encode() + b"\n"
        for start in range(0, len(data), 700):  # arrives in pieces, like a real pipe
            await pipe.send(data[start : start + 700])
            await anyio.sleep(0.01)
        answer = await pipe.recv()
        assert answer["id"] is None
        assert answer["error"]["code"] == -32600
        assert "exceeds the limit of 2048 bytes" in answer["error"]["message"]
        await _still_serving(pipe, "after")
    (incident,) = [i for i in relay.incidents() if i["kind"] == "oversize"]
    assert incident["direction"] == "client"
    assert [c["tool"] for c in relay.calls()] == ["echo"]


async def test_duplicate_id_in_flight_is_dropped_and_the_first_answered_once(harness) -> None:
    relay = harness(CRASHY)
    async with raw_pipe(relay.argv()) as pipe:
        await pipe.initialize()
        await pipe.send(
            {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "slow", "arguments": {"seconds": 0.5}}}
        )
        await pipe.send({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": ECHO_CALL})
        duplicate = await pipe.recv()
        assert duplicate["id"] is None
        assert "request id 9 is already in use" in duplicate["error"]["message"]
        first = await pipe.recv()
        assert first["id"] == 9
        assert first["result"]["content"][0]["text"] == "slept 0.5"
        await _still_serving(pipe, 10)
    assert [i["kind"] for i in relay.incidents()].count("duplicate_id") == 1


# ----------------------------------------------------------------------------------- bad upstreams


async def test_crash_mid_call_answers_every_pending_request(harness, tmp_path: Path) -> None:
    start_log = tmp_path / "start.log"
    relay = harness(CRASHY, env={"CRASHY_START_LOG": str(start_log)})
    errors: dict[str, MCPError] = {}
    async with connect(relay.params()) as client:
        assert _text(await client.call_tool("echo", {"text": "before"})) == "before"

        async def call(label: str, name: str, arguments: dict[str, Any]) -> None:
            with pytest.raises(MCPError) as caught:
                await client.call_tool(name, arguments)
            errors[label] = caught.value

        async with anyio.create_task_group() as tg:
            tg.start_soon(call, "slow", "slow", {"seconds": 30})
            await eventually_async(start_log.exists, what="the slow call reaching the upstream")
            tg.start_soon(call, "crash", "crash", {"status": 3})
        for error in errors.values():
            assert error.error.code == -32000
            assert error.error.message == "the upstream exited with status 3 before answering tools/call"
        # The gateway is still there and says why nothing can be served.
        with pytest.raises(MCPError) as later:
            await client.call_tool("echo", {"text": "after"})
        assert later.value.error.code == -32000
        assert later.value.error.message == "the upstream exited with status 3; the call was not sent"
        with pytest.raises(MCPError) as listing:
            await client.list_tools()
        assert listing.value.error.message == "the upstream exited with status 3; tools/list was not sent"
    outcomes = {c["tool"]: c["outcome"] for c in relay.calls()}
    assert outcomes == {"echo": "upstream_exited", "slow": "upstream_exited", "crash": "upstream_exited"}
    (exited,) = [i for i in relay.incidents() if i["kind"] == "upstream_exited"]
    assert exited["detail"] == "the upstream exited with status 3; 2 request(s) in flight"


async def test_hang_times_out_and_the_upstream_is_told(harness, tmp_path: Path) -> None:
    cancel_log = tmp_path / "cancel.log"
    relay = harness(CRASHY, call_timeout=0.5, env={"CRASHY_CANCEL_LOG": str(cancel_log)})
    async with connect(relay.params()) as client:
        started = time.monotonic()
        with pytest.raises(MCPError) as caught:
            await client.call_tool("slow", {"seconds": 60})
        assert 0.45 <= time.monotonic() - started < scaled(10)
        assert caught.value.error.code == -32001
        assert caught.value.error.message == "the upstream did not answer tools/call within 0.5 seconds"
        with pytest.raises(MCPError):
            await client.call_tool("hang", {})
        assert _text(await client.call_tool("echo", {"text": "alive"})) == "alive"
    assert cancel_log.read_text().startswith("cancelled ")  # the gateway's notifications/cancelled arrived
    assert [(c["tool"], c["outcome"]) for c in relay.calls()] == [
        ("slow", "timeout"),
        ("hang", "timeout"),
        ("echo", "ok"),
    ]


async def test_cancellation_from_the_agent_is_forwarded(harness, tmp_path: Path) -> None:
    cancel_log = tmp_path / "cancel.log"
    start_log = tmp_path / "start.log"
    relay = harness(CRASHY, env={"CRASHY_CANCEL_LOG": str(cancel_log), "CRASHY_START_LOG": str(start_log)})
    async with connect(relay.params()) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.call_tool, "slow", {"seconds": 30})
            await eventually_async(start_log.exists, what="the slow call reaching the upstream")
            tg.cancel_scope.cancel()  # the SDK sends notifications/cancelled
        await eventually_async(cancel_log.exists, what="the upstream seeing the cancellation")
        assert _text(await client.call_tool("echo", {"text": "next"})) == "next"
    assert cancel_log.read_text().startswith("cancelled ")
    assert [(c["tool"], c["outcome"]) for c in relay.calls()] == [("slow", "cancelled"), ("echo", "ok")]


async def test_garbage_from_the_upstream_is_dropped_and_recorded(harness) -> None:
    relay = harness(CRASHY)
    async with connect(relay.params()) as client:
        assert _text(await client.call_tool("garbage", {})) == "after garbage"
        assert _text(await client.call_tool("echo", {"text": "fine"})) == "fine"
    garbage = [i for i in relay.incidents() if i["kind"] == "upstream_garbage"]
    assert len(garbage) == 4
    assert all(i["direction"] == "upstream" and i["detail"].startswith("a line from the upstream was dropped") for i in garbage)
    assert not any("this is not json" in i["detail"] for i in garbage)


async def test_oversize_answer_from_the_upstream_is_dropped(harness) -> None:
    relay = harness(CRASHY, call_timeout=0.75, max_upstream_message_bytes=4096)
    async with connect(relay.params()) as client:
        with pytest.raises(MCPError) as caught:
            await client.call_tool("big", {"size": 20000})
        # Its line proves whose answer it was: the call is answered at once, naming the limit.
        assert caught.value.error.code == -32603
        assert "exceeds --max-upstream-message-bytes (4096)" in caught.value.error.message
        assert _text(await client.call_tool("big", {"size": 100})) == "x" * 100
    assert [i["kind"] for i in relay.incidents()].count("upstream_oversize") == 1


async def test_responses_nobody_asked_for_are_dropped(harness) -> None:
    relay = harness(SCRIPTED)
    async with raw_pipe(relay.argv()) as pipe:
        await pipe.initialize()
        twice = await pipe.request(1, "tools/call", {"name": "twice", "arguments": {}})
        assert twice["result"]["content"][0]["text"] == "first"
        wrong = await pipe.request(2, "tools/call", {"name": "wrong_id", "arguments": {}})
        assert wrong["result"]["content"][0]["text"] == "right"
        echoed = await pipe.request(3, "tools/call", {"name": "other", "arguments": {"k": 1}})
        assert echoed["result"]["content"][0]["text"] == '{"k": 1}'
        assert pipe.notifications == []  # neither the second answer nor the stray one reached the agent
    details = [i["detail"] for i in relay.incidents() if i["kind"] == "unknown_response"]
    assert details == [
        "a response for id 1, which has no request in flight, was dropped",
        "a response for id 'nobody-asked', which has no request in flight, was dropped",
    ]


async def test_server_requests_keep_their_ids_even_when_they_equal_the_agents(harness) -> None:
    """The upstream asks the agent a question with id 4 while the agent's own request 4 is in flight."""
    relay = harness(SCRIPTED)
    async with raw_pipe(relay.argv()) as pipe:
        await pipe.initialize()
        await pipe.send({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "ask_client"}})
        question = await pipe.recv()
        assert question == {"jsonrpc": "2.0", "id": 4, "method": "roots/list"}
        await pipe.send({"jsonrpc": "2.0", "id": 4, "result": {"roots": []}})
        answer = await pipe.recv()
        assert answer["id"] == 4
        assert answer["result"]["content"][0]["text"] == 'client answered: {"roots": []}'


# ------------------------------------------------------------------------------------- concurrency


async def test_twenty_calls_in_flight_each_get_their_own_answer(harness) -> None:
    relay = harness(CRASHY)
    answers: dict[int, str] = {}
    async with connect(relay.params()) as client:

        async def call(index: int) -> None:
            if index % 4 == 0:
                answers[index] = _text(await client.call_tool("slow", {"seconds": 0.5}))
            else:
                answers[index] = _text(await client.call_tool("echo", {"text": f"call {index}"}))

        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            for index in range(20):
                tg.start_soon(call, index)
        elapsed = time.monotonic() - started
    assert elapsed < 2.5  # five 0.5 s calls ran at once, not one after another
    for index in range(20):
        assert answers[index] == ("slept 0.5" if index % 4 == 0 else f"call {index}")
    assert len(relay.calls()) == 20


async def test_gateway_secrets_never_reach_the_upstream(harness) -> None:
    relay = harness(CRASHY, env={"DRAWBRIDGE_TDT_HMAC_KEY": "k" * 32, "UPSTREAM_TOKEN": "t"})
    async with connect(relay.params()) as client:
        seen = await client.call_tool("env", {"names": ["DRAWBRIDGE_TDT_HMAC_KEY", "UPSTREAM_TOKEN"]})
    assert seen.structured_content == {"DRAWBRIDGE_TDT_HMAC_KEY": False, "UPSTREAM_TOKEN": True}


async def test_upstream_exit_before_any_request(harness) -> None:
    relay = harness([PYTHON, "-c", "import sys; sys.exit(5)"])
    async with raw_pipe(relay.argv()) as pipe:
        await eventually_async(lambda: any(i["kind"] == "upstream_exited" for i in relay.incidents()), what="the exit's incident")
        response = await pipe.request(1, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {}})
        assert response["error"] == {
            "code": -32000,
            "message": "the upstream exited with status 5; initialize was not sent",
        }


async def test_github_like_denial_does_not_disturb_neighbours(harness) -> None:
    """A refusal written by the gateway and answers from the upstream interleave on one pipe intact."""
    relay = harness(GITHUB_LIKE, deny=["delete_repo"])
    async with raw_pipe(relay.argv()) as pipe:
        await pipe.initialize()
        for request_id in range(10):
            name = "delete_repo" if request_id % 2 else "list_repos"
            await pipe.send(
                {
                    "jsonrpc": "2.0",
                    "id": request_id,
                    "method": "tools/call",
                    "params": {"name": name, "arguments": {"owner": "acme", "name": "rocket"}},
                }
            )
        answers = {}
        while len(answers) < 10:
            message = await pipe.recv()
            if "id" in message and "method" not in message:
                answers[message["id"]] = message
    for request_id, message in answers.items():
        assert message["result"].get("isError", False) is bool(request_id % 2)
