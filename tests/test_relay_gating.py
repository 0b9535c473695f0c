"""Only tools/call is decided, and a refusal is an isError result that names the rule and never the arguments."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import anyio
import mcp_types as types
import pytest
from conftest import ERAS, GITHUB_LIKE, MODERN, PYTHON, child_env, connect, scaled, wrap_params
from mcp.shared.exceptions import MCPError

pytestmark = pytest.mark.anyio

SECRET = "hunter2-do-not-echo"
"""An argument value that must never appear in a refusal, a record or a log."""


def _text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def _repos(client: Any) -> list[str]:
    listed = await client.call_tool("list_repos", {"owner": "acme"})
    return listed.structured_content["result"]


@pytest.mark.parametrize("mode", ERAS)
async def test_denied_call_is_an_error_result_naming_the_rule(mode: str, harness, capfd) -> None:
    relay = harness(GITHUB_LIKE, deny=["delete_repo"])
    async with connect(relay.params(), mode) as client:
        refused = await client.call_tool("delete_repo", {"owner": "acme", "name": "rocket", "note": SECRET})
        assert refused.is_error
        assert _text(refused) == (
            'drawbridge refused this call: policy "test-policy" rule 2: repository deletion is not allowed'
        )
        assert refused.meta == {
            "drawbridge/decision": {"action": "deny", "outcome": "refused", "policy": "test-policy", "rule_index": 2}
        }
        assert refused.result_type == "complete"
        # The upstream never saw the call: the repository is still there.
        assert await _repos(client) == ["anvil", "rocket"]
    calls = relay.calls()
    denied = calls[0]
    assert denied["tool"] == "delete_repo"
    assert denied["action"] == "deny"
    assert denied["outcome"] == "refused"
    assert denied["reason"] == "repository deletion is not allowed"
    # The scripted decider evaluates no policy set, so it names none (test_operating_policy_trace: one that does).
    assert denied["provenance"] == {
        "policy": "test-policy", "source_file": "policies/test-policy.yaml", "rule_index": 2, "policy_set": None,
        "shadow": None, "line": None,
    }
    assert denied["decision_ms"] is not None and denied["latency_ms"] >= denied["decision_ms"] >= 0
    assert calls[1]["tool"] == "list_repos" and calls[1]["outcome"] == "ok"
    assert SECRET not in relay.records_path.read_text()
    assert SECRET not in capfd.readouterr().err


async def test_raw_refusal_result_for_each_era(harness) -> None:
    """The refusal carries resultType only where the era requires it (2026-07-28 requests say so)."""
    from conftest import raw_pipe

    relay = harness(GITHUB_LIKE, deny=["delete_repo"])
    call = {"name": "delete_repo", "arguments": {"owner": "acme", "name": "rocket"}}
    async with raw_pipe(relay.argv()) as pipe:
        await pipe.initialize()
        legacy = await pipe.request(7, "tools/call", call)
    assert legacy == {
        "jsonrpc": "2.0",
        "id": 7,
        "result": {
            "content": [
                {
                    "type": "text",
                    "text": 'drawbridge refused this call: policy "test-policy" rule 2: repository deletion is not allowed',
                }
            ],
            "isError": True,
            "_meta": {
                "drawbridge/decision": {"action": "deny", "outcome": "refused", "policy": "test-policy", "rule_index": 2}
            },
        },
    }
    envelope = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    async with raw_pipe(relay.argv()) as pipe:
        modern = await pipe.request("m", "tools/call", {**call, "_meta": envelope})
    assert modern["result"]["resultType"] == "complete"
    assert modern["result"]["isError"] is True
    assert {c["protocol_version"] for c in relay.calls()} == {"2025-11-25", MODERN}


async def test_human_approval_is_refused_as_unavailable(harness) -> None:
    relay = harness(GITHUB_LIKE, approval=["add_deploy_key"])
    async with connect(relay.params()) as client:
        refused = await client.call_tool(
            "add_deploy_key", {"owner": "acme", "repo": "rocket", "title": "ci", "key": SECRET}
        )
        assert refused.is_error
        assert _text(refused) == (
            'drawbridge refused this call: policy "test-policy" rule 1 (human_approval): approval unavailable'
        )
    (call,) = relay.calls()
    assert (call["action"], call["outcome"], call["error"]) == (
        "human_approval",
        "approval_unavailable",
        "approval unavailable",
    )
    assert SECRET not in relay.records_path.read_text()


async def test_a_failing_decider_fails_closed_without_leaking(harness, capfd) -> None:
    relay = harness(GITHUB_LIKE, explode=["delete_repo"])
    async with connect(relay.params()) as client:
        refused = await client.call_tool("delete_repo", {"owner": "acme", "name": SECRET})
        assert refused.is_error
        assert _text(refused) == (
            'drawbridge refused this call: policy "drawbridge": the decision failed (RuntimeError); failing closed'
        )
        assert await _repos(client) == ["anvil", "rocket"]
    assert relay.calls()[0]["action"] == "deny"
    assert SECRET not in relay.records_path.read_text()
    assert SECRET not in capfd.readouterr().err


async def test_cancelled_during_the_decision_never_reaches_the_upstream(harness) -> None:
    relay = harness(GITHUB_LIKE, slow_decision=["delete_repo"])
    async with connect(relay.params()) as client:
        with pytest.raises(MCPError):
            # The SDK gives up after the read timeout and sends notifications/cancelled.
            await client.call_tool("delete_repo", {"owner": "acme", "name": "rocket"}, read_timeout_seconds=0.5)
        assert await _repos(client) == ["anvil", "rocket"]
    cancelled = relay.calls()[0]
    assert (cancelled["tool"], cancelled["outcome"], cancelled["action"]) == ("delete_repo", "cancelled", None)


async def test_without_a_policy_wrap_refuses_every_call_but_serves_everything_else() -> None:
    async with connect(wrap_params(GITHUB_LIKE)) as client:
        tools = await client.list_tools()
        assert len(tools.tools) == 4
        prompt = await client.get_prompt("review_pr", {"repo": "acme/rocket", "number": "1"})
        assert prompt.messages
        resource = await client.read_resource("github://rate-limit")
        assert resource.contents
        refused = await client.call_tool("list_repos", {"owner": "acme"})
        assert refused.is_error
        assert _text(refused) == 'drawbridge refused this call: policy "drawbridge": no policy is loaded'


def test_wrap_usage_errors_exit_2() -> None:
    both = subprocess.run(
        [PYTHON, "-m", "drawbridge", "wrap", "--allow-all", "--policy", __file__, "--", "true"],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=scaled(30),
    )
    assert both.returncode == 2
    assert "--policy and --allow-all exclude each other" in both.stderr
    assert both.stdout == ""
    missing = subprocess.run(
        [PYTHON, "-m", "drawbridge", "wrap", "--allow-all", "--", "/nonexistent/mcp-server"],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=scaled(30),
        stdin=subprocess.DEVNULL,
    )
    assert missing.returncode == 2
    assert "cannot start upstream '/nonexistent/mcp-server'" in missing.stderr
    assert missing.stdout == ""


async def test_tools_call_as_a_notification_is_dropped(harness) -> None:
    from conftest import raw_pipe

    relay = harness(GITHUB_LIKE)
    async with raw_pipe(relay.argv()) as pipe:
        await pipe.initialize()
        await pipe.send(
            {
                "jsonrpc": "2.0",
                "method": "tools/call",
                "params": {"name": "delete_repo", "arguments": {"owner": "acme", "name": "rocket"}},
            }
        )
        listed = await pipe.request(2, "tools/call", {"name": "list_repos", "arguments": {"owner": "acme"}})
        assert listed["result"]["structuredContent"] == {"result": ["anvil", "rocket"]}
    (incident,) = [i for i in relay.incidents() if i["kind"] == "tools_call_notification"]
    assert incident["direction"] == "client"
    assert [c["tool"] for c in relay.calls()] == ["list_repos"]


async def test_method_spelled_almost_like_tools_call_is_refused(harness) -> None:
    from conftest import raw_pipe

    relay = harness(GITHUB_LIKE)
    async with raw_pipe(relay.argv()) as pipe:
        await pipe.initialize()
        for request_id, method in ((3, "Tools/Call"), (4, " tools/call")):
            response = await pipe.request(
                request_id, method, {"name": "delete_repo", "arguments": {"owner": "acme", "name": "rocket"}}
            )
            assert response["error"]["code"] == -32601
        listed = await pipe.request(5, "tools/call", {"name": "list_repos", "arguments": {"owner": "acme"}})
        assert listed["result"]["structuredContent"] == {"result": ["anvil", "rocket"]}


async def test_concurrent_calls_are_decided_independently(harness) -> None:
    """Refusals and forwarded calls in flight together each get their own answer."""
    relay = harness(GITHUB_LIKE, deny=["delete_repo"])
    results: dict[int, types.CallToolResult] = {}
    async with connect(relay.params()) as client:

        async def one(index: int) -> None:
            if index % 2:
                results[index] = await client.call_tool("delete_repo", {"owner": "acme", "name": "rocket"})
            else:
                results[index] = await client.call_tool("get_repo", {"owner": "acme", "name": "rocket"})

        async with anyio.create_task_group() as tg:
            for index in range(20):
                tg.start_soon(one, index)
    for index, result in results.items():
        if index % 2:
            assert result.is_error and "rule 2" in _text(result)
        else:
            assert not result.is_error and result.structured_content["stars"] == 42  # type: ignore[index]
    outcomes = sorted(c["outcome"] for c in relay.calls())
    assert outcomes == ["ok"] * 10 + ["refused"] * 10
    assert len({json.dumps(c["request_id"]) for c in relay.calls()}) == 20
