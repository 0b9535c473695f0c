"""2026-07-28: a call that a person approved, whose upstream then asks a question of its own.

One approval lets the call's own retries through: the gateway hands the agent a continuation in
place of the upstream's ``requestState`` (bound to the same agent, tool, arguments and approval),
and a retry with it runs without asking again, the upstream's state and the ``inputResponses``
reaching the upstream unchanged. A continuation works once and only for the call approved; a
gateway in front of another takes out only the states it sealed itself. Real processes throughout:
``drawbridge serve --stdio`` and ``drawbridge wrap`` in front of ``fixtures/servers/asking.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from approval_support import decisions, trace, wrap_flags, write_policy
from conftest import MODERN, PYTHON, SERVERS, connect, raw_pipe, wrap_params
from serve_support import serve_argv, stdio_params, write_config

pytestmark = pytest.mark.anyio

ASKING = {"name": "asking", "transport": "stdio", "command": PYTHON, "args": [str(SERVERS / "asking.py")],
          "protocol": MODERN}
APPROVE_DELETE = {
    "p.yaml": "name: p\nagent: '*'\nrules:\n  - tools: ['asking.delete_note']\n    action: human_approval\n"
              "  - tools: ['*']\n    action: allow\n"
}
ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
    "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
}


class Answers:
    """An elicitation callback for both questions: the gateway's (approve) and the upstream's (confirm)."""

    def __init__(self) -> None:
        self.gateway: list[str] = []
        self.upstream: list[str] = []

    async def __call__(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        properties = params.requested_schema["properties"]  # type: ignore[union-attr]
        if "decision" in properties:
            self.gateway.append(params.message)
            return types.ElicitResult(action="accept", content={"decision": "approve"})
        self.upstream.append(params.message)
        return types.ElicitResult(action="accept", content={"confirm": True})


def outcomes(evidence: Path, tool: str) -> list[tuple[str, str]]:
    return [(d["action"], d["outcome"]) for d in decisions(evidence, tool)]


async def test_one_approval_lets_the_calls_own_retries_through_under_serve(tmp_path: Path) -> None:
    config = write_config(tmp_path, [ASKING], policies=APPROVE_DELETE, fsync="never")
    answers = Answers()
    async with connect(stdio_params(config), MODERN, elicitation_callback=answers) as client:
        done = await client.call_tool("asking.delete_note", {"name": "groceries"})
    assert done.content[0].text == "deleted groceries"  # type: ignore[union-attr]
    assert len(answers.gateway) == 1 and answers.upstream == ["Delete the note groceries?"]
    evidence = tmp_path / "evidence"
    assert outcomes(evidence, "asking.delete_note") == [
        ("human_approval", "approval_pending"), ("allow", "input_required"), ("allow", "ok"),
    ]
    last = decisions(evidence, "asking.delete_note")[-1]["approval"]
    assert last["how"].endswith(", continued")


async def test_one_approval_lets_the_calls_own_retries_through_under_wrap(tmp_path: Path) -> None:
    policy = write_policy(tmp_path, APPROVE_DELETE["p.yaml"].replace("asking.delete_note", "delete_note"))
    evidence = tmp_path / "evidence"
    answers = Answers()
    params = wrap_params([PYTHON, str(SERVERS / "asking.py")], *wrap_flags(policy, evidence))
    async with connect(params, MODERN, elicitation_callback=answers) as client:
        done = await client.call_tool("delete_note", {"name": "groceries"})
    assert done.content[0].text == "deleted groceries"  # type: ignore[union-attr]
    assert len(answers.gateway) == 1 and len(answers.upstream) == 1
    assert [o for _, o in outcomes(evidence, "delete_note")] == ["approval_pending", "input_required", "ok"]


async def test_a_continuation_works_once_and_only_for_the_approved_call(tmp_path: Path) -> None:
    config = write_config(tmp_path, [ASKING], policies=APPROVE_DELETE, fsync="never")
    arguments = {"name": "groceries"}

    def call(arguments: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return {"name": "asking.delete_note", "arguments": arguments, "_meta": ENVELOPE, **extra}

    async with raw_pipe(serve_argv(config, "--stdio", "--agent", "alice")) as pipe:
        asked = (await pipe.request(1, "tools/call", call(arguments)))["result"]
        approve = {"drawbridge_approval": {"action": "accept", "content": {"decision": "approve"}}}
        upstream_asks = (await pipe.request(
            2, "tools/call", call(arguments, requestState=asked["requestState"], inputResponses=approve)
        ))["result"]
        assert upstream_asks["resultType"] == "input_required"
        (key,) = upstream_asks["inputRequests"]
        assert key != "drawbridge_approval"
        continuation = upstream_asks["requestState"]
        confirm = {key: {"action": "accept", "content": {"confirm": True}}}
        other = (await pipe.request(
            3, "tools/call", call({"name": "taxes"}, requestState=continuation, inputResponses=confirm)
        ))["result"]
        assert other["isError"] and "other arguments" in other["content"][0]["text"]
        done = (await pipe.request(
            4, "tools/call", call(arguments, requestState=continuation, inputResponses=confirm)
        ))["result"]
        assert done["content"][0]["text"] == "deleted groceries"
        replayed = (await pipe.request(
            5, "tools/call", call(arguments, requestState=continuation, inputResponses=confirm)
        ))["result"]
        assert replayed["isError"] and "already used" in replayed["content"][0]["text"]
    evidence = tmp_path / "evidence"
    assert [o for _, o in outcomes(evidence, "asking.delete_note")] == [
        "approval_pending", "input_required", "refused", "ok", "refused",
    ]
    assert [e["body"]["problem"] for e in trace(evidence, "approval_state_refused")] == ["mismatch"]


async def test_a_gateway_in_front_passes_on_the_state_another_gateway_sealed(tmp_path: Path) -> None:
    inner_dir, outer_dir = tmp_path / "inner", tmp_path / "outer"
    inner_dir.mkdir()
    outer_dir.mkdir()
    inner = write_config(inner_dir, [ASKING], policies=APPROVE_DELETE, fsync="never")
    argv = serve_argv(inner, "--stdio")
    outer_upstream = {"name": "inner", "transport": "stdio", "command": argv[0], "args": argv[1:], "protocol": MODERN}
    outer = write_config(outer_dir, [outer_upstream], fsync="never")
    answers = Answers()
    async with connect(stdio_params(outer), MODERN, elicitation_callback=answers) as client:
        done = await client.call_tool("inner.asking.delete_note", {"name": "groceries"})
    assert done.content[0].text == "deleted groceries"  # type: ignore[union-attr]
    assert len(answers.gateway) == 1 and len(answers.upstream) == 1
    assert [o for _, o in outcomes(inner_dir / "evidence", "asking.delete_note")] == [
        "approval_pending", "input_required", "ok",
    ]
