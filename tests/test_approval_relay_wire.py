"""The stdio relay's own requests, on the wire: ``elicitation/create`` to the agent in an id space of the
gateway's own, answers consumed by the gateway, a cancelled call withdrawing its question.

Raw JSON lines through ``drawbridge wrap`` in front of a server that counts every response it receives
(it never sends requests, so any response reaching it was forwarded by mistake).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from approval_support import ECHO, decisions, wrap_flags, write_policy
from conftest import LEGACY_VERSION, RawPipe, raw_pipe, wrap_argv

pytestmark = pytest.mark.anyio

POLICY = """\
name: wire
agent: "*"
rules:
  - tools: ["open_*"]
    action: allow
  - tools: ["echo"]
    action: human_approval
"""
OWN_ID = re.compile(r"drawbridge-approval-[0-9a-f]{12}-\d+")


async def initialize(pipe: RawPipe, capabilities: dict[str, Any]) -> None:
    params = {"protocolVersion": LEGACY_VERSION, "capabilities": capabilities, "clientInfo": {"name": "wire", "version": "0"}}
    assert "result" in await pipe.request("init", "initialize", params)
    await pipe.send({"jsonrpc": "2.0", "method": "notifications/initialized"})


async def next_message(pipe: RawPipe) -> dict[str, Any]:
    return json.loads(await pipe.recv_line())


async def responses_seen(pipe: RawPipe, request_id: int) -> int:
    result = (await pipe.request(request_id, "tools/call", {"name": "open_door", "arguments": {}}))["result"]
    return int(result["_meta"]["echo/responses_seen"])


async def test_the_gateway_asks_on_its_own_ids_and_keeps_the_answers(tmp_path: Path) -> None:
    evidence = tmp_path / "evidence"
    async with raw_pipe(wrap_argv(ECHO, *wrap_flags(write_policy(tmp_path, POLICY), evidence))) as pipe:
        await initialize(pipe, {"elicitation": {}})
        await pipe.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo", "arguments": {"x": 1}}})
        question = await next_message(pipe)
        assert question["method"] == "elicitation/create" and OWN_ID.fullmatch(question["id"])
        assert question["params"]["mode"] == "form" and "echo" in question["params"]["message"]
        answer = {"jsonrpc": "2.0", "id": question["id"], "result": {"action": "accept", "content": {"decision": "approve"}}}
        await pipe.send(answer)
        ran = json.loads(await pipe.response_line(1))["result"]
        assert json.loads(ran["content"][0]["text"]) == {"name": "echo", "arguments": {"x": 1}}
        await pipe.send(answer)  # a duplicate, late answer is the gateway's too
        assert await responses_seen(pipe, 2) == 0

        # The agent gives up on a call while it is being asked: the question is withdrawn.
        await pipe.send({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "echo", "arguments": {"x": 2}}})
        second = await next_message(pipe)
        assert second["method"] == "elicitation/create" and second["id"] != question["id"]
        await pipe.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 3}})
        withdrawn = await next_message(pipe)
        assert withdrawn == {"jsonrpc": "2.0", "method": "notifications/cancelled",
                             "params": {"requestId": second["id"], "reason": "no longer needed"}}
        await pipe.send({"jsonrpc": "2.0", "id": second["id"], "result": {"action": "accept", "content": {"decision": "approve"}}})
        assert await responses_seen(pipe, 4) == 0
        assert not [m for m in pipe.notifications if m.get("id") == 3]  # the cancelled call got no answer
    assert [d["outcome"] for d in decisions(evidence, "echo")] == ["ok", "cancelled"]


async def test_a_client_without_elicitation_is_never_sent_a_request(tmp_path: Path) -> None:
    evidence = tmp_path / "evidence"
    async with raw_pipe(wrap_argv(ECHO, *wrap_flags(write_policy(tmp_path, POLICY), evidence))) as pipe:
        await initialize(pipe, {"sampling": {}})
        refused = (await pipe.request(1, "tools/call", {"name": "echo", "arguments": {}}))["result"]
        assert refused["isError"] and refused["content"][0]["text"].endswith(": approval unavailable")
        assert pipe.notifications == []
    (decision,) = decisions(evidence, "echo")
    assert (decision["action"], decision["outcome"], decision["approval"]["how"]) == (
        "human_approval", "approval_unavailable", "unavailable"
    )
