"""2026-07-28: approval as an ``InputRequiredResult`` with a sealed ``requestState``, through ``drawbridge wrap``.

The mcp SDK client drives the multi-round-trip loop itself (its elicitation callback is the person);
raw JSON lines show what an attacker can send: a forged, altered, re-targeted, replayed or expired
``requestState`` is refused, and the gateway's own retry fields never reach the upstream.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from approval_support import ECHO, Person, decisions, listed, text_of, trace, wrap_flags, write_policy
from conftest import GITHUB_LIKE, MODERN, connect, raw_pipe, wrap_argv, wrap_params

pytestmark = pytest.mark.anyio

ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
}
APPROVE = {"drawbridge_approval": {"action": "accept", "content": {"decision": "approve"}}}
ECHO_POLICY = """\
name: echo
agent: "*"
rules:
  - tools: ["open_*"]
    action: allow
  - tools: ["echo"]
    action: human_approval
"""


def call(request_id: int, name: str, arguments: dict[str, Any], **extra: Any) -> dict[str, Any]:
    params = {"name": name, "arguments": arguments, "_meta": ENVELOPE, **extra}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def tamper(state: str) -> str:
    """The same token with one character of its tag changed."""
    last = state[-2]
    return state[:-2] + ("A" if last != "A" else "B") + state[-1]


async def test_sdk_client_answers_in_band_and_its_retry_runs(tmp_path: Path) -> None:
    evidence = tmp_path / "evidence"
    flags = wrap_flags(write_policy(tmp_path), evidence)
    yes, no = Person("approve"), Person("deny")
    async with connect(wrap_params(GITHUB_LIKE, *flags), MODERN, elicitation_callback=no) as client:
        refused = await client.call_tool("delete_repo", {"owner": "acme", "name": "rocket"})
        assert refused.is_error and "denied by mcp-client:tester via elicitation" in text_of(refused)
    async with connect(wrap_params(GITHUB_LIKE, *flags), MODERN, elicitation_callback=yes) as client:
        done = await client.call_tool("delete_repo", {"owner": "acme", "name": "rocket"})
        assert not done.is_error and text_of(done) == "deleted acme/rocket"
        assert listed(await client.call_tool("list_repos", {"owner": "acme"})) == ["anvil"]
    assert len(yes.questions) == len(no.questions) == 1
    rows = [(d["outcome"], d["approval"]["how"]) for d in decisions(evidence, "delete_repo")]
    assert rows == [
        ("approval_pending", "input_required"),
        ("refused", "denied by mcp-client:tester via elicitation"),
        ("approval_pending", "input_required"),
        ("ok", "approved by mcp-client:tester via elicitation"),
    ]


async def test_request_state_forged_retargeted_replayed_is_refused_and_never_forwarded(tmp_path: Path) -> None:
    evidence = tmp_path / "evidence"
    flags = wrap_flags(write_policy(tmp_path, ECHO_POLICY), evidence)
    async with raw_pipe(wrap_argv(ECHO, *flags)) as pipe:
        asked = (await pipe.request(1, "tools/call", call(1, "echo", {"x": 1})["params"]))["result"]
        assert asked["resultType"] == "input_required"
        question = asked["inputRequests"]["drawbridge_approval"]
        assert question["method"] == "elicitation/create" and question["params"]["mode"] == "form"
        state = asked["requestState"]
        assert state.startswith("dbrs1.")

        async def retry(request_id: int, arguments: dict[str, Any], token: str) -> dict[str, Any]:
            message = call(request_id, "echo", arguments, requestState=token, inputResponses=APPROVE)
            return (await pipe.request(request_id, "tools/call", message["params"]))["result"]

        forged = await retry(2, {"x": 1}, tamper(state))
        assert forged["isError"] and "does not verify" in forged["content"][0]["text"]
        other_arguments = await retry(3, {"x": 2}, state)
        assert other_arguments["isError"] and "other arguments" in other_arguments["content"][0]["text"]
        not_ours = await retry(4, {"x": 1}, "dbrs1.bm90LWEtc3RhdGU.AAAA")
        assert not_ours["isError"]

        ran = await retry(5, {"x": 1}, state)
        assert not ran.get("isError"), ran
        forwarded = json.loads(ran["content"][0]["text"])
        assert forwarded == {"name": "echo", "arguments": {"x": 1}, "_meta": ENVELOPE}  # retry fields removed

        replayed = await retry(6, {"x": 1}, state)
        assert replayed["isError"] and "already used" in replayed["content"][0]["text"]

        # A requestState that is not the gateway's belongs to the upstream: passed on untouched.
        foreign = call(7, "open_door", {}, requestState="upstream-own-state", inputResponses={"q": {"action": "accept"}})
        passed = (await pipe.request(7, "tools/call", foreign["params"]))["result"]
        assert json.loads(passed["content"][0]["text"])["requestState"] == "upstream-own-state"

    refused = [e["body"]["problem"] for e in trace(evidence, "approval_state_refused")]
    assert refused == ["forged", "mismatch", "malformed"]
    outcomes = [d["outcome"] for d in decisions(evidence, "echo")]
    assert outcomes == ["approval_pending", "refused", "refused", "refused", "ok", "refused"]


async def test_an_expired_request_state_is_refused(tmp_path: Path) -> None:
    evidence = tmp_path / "evidence"
    flags = wrap_flags(write_policy(tmp_path, ECHO_POLICY), evidence, "--approval-timeout", "1")
    async with raw_pipe(wrap_argv(ECHO, *flags)) as pipe:
        asked = (await pipe.request(1, "tools/call", call(1, "echo", {"x": 1})["params"]))["result"]
        await anyio.sleep(1.3)
        late = call(2, "echo", {"x": 1}, requestState=asked["requestState"], inputResponses=APPROVE)
        refused = (await pipe.request(2, "tools/call", late["params"]))["result"]
        assert refused["isError"] and "expired" in refused["content"][0]["text"]
    assert [e["body"]["problem"] for e in trace(evidence, "approval_state_refused")] == ["expired"]
    assert [d["outcome"] for d in decisions(evidence, "echo")] == ["approval_pending", "refused"]
