"""``drawbridge serve --stdio`` in both protocol eras, with the mcp SDK client and raw 2026-07-28 lines.

The era matrix: the same calls made directly and through the gateway give the same results at
2025-11-25 (initialize handshake) and at 2026-07-28 (per-request envelope), agents and upstreams in
either era (an upstream's ``protocol`` in the configuration); the gateway rewrites only the per-hop
parts (see gateway/protocol/hop.py and gateway/protocol/modern.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from conftest import GITHUB_LIKE, LEGACY_VERSION, MODERN, PYTHON, SERVERS, connect, direct_params, raw_pipe
from mcp.shared.exceptions import MCPError
from serve_support import GITHUB, SLACK, dump, serve_argv, stdio_params, write_config

pytestmark = pytest.mark.anyio


def test_the_eras_the_gateway_speaks_are_the_sdks() -> None:
    """``protocol.eras`` writes the SDK's version lists out (so reading a message loads no SDK models);
    they may not drift from the SDK's own."""
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

    from drawbridge.gateway.protocol import eras

    assert tuple(eras.HANDSHAKE_PROTOCOL_VERSIONS) == tuple(HANDSHAKE_PROTOCOL_VERSIONS)
    assert tuple(eras.MODERN_PROTOCOL_VERSIONS) == tuple(MODERN_PROTOCOL_VERSIONS)
    assert (eras.LATEST_HANDSHAKE_VERSION, eras.MODERN_VERSION) == (HANDSHAKE_PROTOCOL_VERSIONS[-1], MODERN_PROTOCOL_VERSIONS[-1])


def _part(items: list[dict[str, Any]], server: str) -> list[dict[str, Any]]:
    """The items of one upstream, with the ``server.`` prefix taken off again."""
    prefix = f"{server}."
    return [{**item, "name": item["name"][len(prefix) :]} for item in items if item["name"].startswith(prefix)]


def _without_server_info(result: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in (result.get("_meta") or {}).items() if k != "io.modelcontextprotocol/serverInfo"}
    out = {k: v for k, v in result.items() if k != "_meta"}
    return {**out, "_meta": meta} if meta else out


@pytest.mark.parametrize("upstream_era", [LEGACY_VERSION, MODERN])
@pytest.mark.parametrize("mode", ["legacy", MODERN])
async def test_sdk_client_in_each_era_sees_the_upstream_through_the_gateway(
    tmp_path: Path, mode: str, upstream_era: str
) -> None:
    config = write_config(tmp_path, [{**GITHUB, "protocol": upstream_era}, {**SLACK, "protocol": upstream_era}])
    arguments = {"owner": "acme", "name": "rocket"}
    async with connect(direct_params(GITHUB_LIKE), mode) as client:
        direct_tools = dump(await client.list_tools())["tools"]
        direct_call = dump(await client.call_tool("get_repo", arguments))
        direct_prompt = dump(await client.get_prompt("review_pr", {"repo": "acme/rocket", "number": "7"}))
    async with connect(stdio_params(config), mode) as client:
        assert client.protocol_version == (LEGACY_VERSION if mode == "legacy" else MODERN)
        via_tools = dump(await client.list_tools())["tools"]
        via_call = dump(await client.call_tool("github.get_repo", arguments))
        via_prompt = dump(await client.get_prompt("github.review_pr", {"repo": "acme/rocket", "number": "7"}))
        slack = dump(await client.call_tool("slack.list_channels", {}))
    assert _part(via_tools, "github") == direct_tools
    assert [t["name"] for t in via_tools if t["name"].startswith("slack.")] == [
        "slack.list_channels",
        "slack.invite",
        "slack.add_member",
    ]
    assert _without_server_info(via_call) == _without_server_info(direct_call)
    assert via_call["structuredContent"]["stars"] == 42
    assert _without_server_info(via_prompt) == _without_server_info(direct_prompt)
    assert slack["structuredContent"] == {"general": ["alice", "bob"], "random": ["alice"]}


async def test_elicitation_from_an_upstream_reaches_the_agent_that_called(tmp_path: Path) -> None:
    config = write_config(tmp_path, [GITHUB, SLACK])
    asked: list[str] = []

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"confirm": True})

    async with connect(stdio_params(config), "legacy", elicitation_callback=elicit) as client:
        result = await client.call_tool("slack.invite", {"channel": "general", "user": "carol"})
        assert result.content[0].text == "invited carol to #general"  # type: ignore[union-attr]
        channels = dump(await client.call_tool("slack.list_channels", {}))["structuredContent"]
    assert asked == ["Invite carol to #general?"]
    assert "carol" in channels["general"]


async def test_a_2026_agent_cannot_be_asked_and_the_upstream_is_told_so(tmp_path: Path) -> None:
    # Documented limit: a handshake-era upstream's elicitation cannot reach a 2026-07-28 agent
    # (no back channel); the upstream gets an error and the call ends with it, nothing hangs.
    config = write_config(tmp_path, [GITHUB, SLACK])
    async with connect(stdio_params(config), MODERN) as client:
        with pytest.raises(MCPError) as refused:
            await client.call_tool("slack.invite", {"channel": "general", "user": "erin"})
        assert "cannot take requests from the server" in refused.value.message
        channels = dump(await client.call_tool("slack.list_channels", {}))["structuredContent"]
    assert "erin" not in channels["general"]


async def test_modern_stdio_requests_are_checked_and_decorated(tmp_path: Path) -> None:
    config = write_config(tmp_path, [GITHUB])
    envelope = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    async with raw_pipe(serve_argv(config, "--stdio")) as pipe:
        listed = await pipe.request("l", "tools/list", {"_meta": envelope})
        assert listed["result"]["resultType"] == "complete"
        assert listed["result"]["cacheScope"] == "private" and listed["result"]["ttlMs"] == 0
        discovered = await pipe.request("d", "server/discover", {"_meta": envelope})
        served = [MODERN, "2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"]  # newest first
        assert discovered["result"]["supportedVersions"] == served
        wrong = await pipe.request(
            "w", "tools/list", {"_meta": {**envelope, "io.modelcontextprotocol/protocolVersion": "1999-01-01"}}
        )
        assert wrong["error"]["code"] == -32022
        assert wrong["error"]["data"] == {"supported": served, "requested": "1999-01-01"}
        called = await pipe.request(
            "c", "tools/call", {"_meta": envelope, "name": "github.list_repos", "arguments": {"owner": "octo"}}
        )
        assert called["result"]["resultType"] == "complete"
        assert called["result"]["structuredContent"] == {"result": ["hello"]}
        for method in ("ping", "logging/setLevel"):  # removed by 2026-07-28
            removed = await pipe.request(method, method, {"_meta": envelope, "level": "info"})
            assert removed["error"]["code"] == -32601 and "not part of 2026-07-28" in removed["error"]["message"]


ASKING = {"name": "asking", "transport": "stdio", "command": PYTHON, "args": [str(SERVERS / "asking.py")],
          "protocol": MODERN}


async def test_a_2026_upstreams_question_reaches_a_2026_agent_and_its_answer_runs_the_call(tmp_path: Path) -> None:
    """The upstream asks by ``InputRequiredResult``; the agent answers by retrying with its
    ``requestState`` and ``inputResponses``, which are the upstream's and go to it unchanged."""
    config = write_config(tmp_path, [ASKING], fsync="never")
    asked: list[str] = []

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"confirm": True})

    async with connect(stdio_params(config), MODERN, elicitation_callback=elicit) as client:
        done = await client.call_tool("asking.delete_note", {"name": "groceries"})
    assert done.content[0].text == "deleted groceries"  # type: ignore[union-attr]
    assert asked == ["Delete the note groceries?"]
    entries = [json.loads(line)["body"] for line in (tmp_path / "evidence" / "trace.ndjson").read_text().splitlines()]
    calls = [(e["tool"], e["action"], e["outcome"]) for e in entries if e.get("tool")]
    assert calls == [("asking.delete_note", "allow", "input_required"), ("asking.delete_note", "allow", "ok")]


async def test_a_2026_upstreams_question_to_a_handshake_agent_ends_the_call_with_a_clear_error(tmp_path: Path) -> None:
    config = write_config(tmp_path, [ASKING], fsync="never")
    async with connect(stdio_params(config), "legacy") as client:
        with pytest.raises(MCPError) as refused:
            await client.call_tool("asking.delete_note", {"name": "groceries"})
    assert "asks for input before it runs this call" in refused.value.message
    assert "connect at 2026-07-28" in refused.value.message


async def test_a_2026_upstream_asks_only_what_the_agent_declared_it_can_answer(tmp_path: Path) -> None:
    """The agent's declared client capabilities go on with its request (the spec: a server MUST NOT
    send ``inputRequests`` the client has not declared); the gateway never declares for it."""
    config = write_config(tmp_path, [ASKING], fsync="never")

    def meta(capabilities: dict[str, Any]) -> dict[str, Any]:
        return {"io.modelcontextprotocol/protocolVersion": MODERN,
                "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
                "io.modelcontextprotocol/clientCapabilities": capabilities}

    params = {"name": "asking.delete_note", "arguments": {"name": "groceries"}}
    async with raw_pipe(serve_argv(config, "--stdio")) as pipe:
        undeclared = await pipe.request(1, "tools/call", {**params, "_meta": meta({})})
        declared = await pipe.request(2, "tools/call", {**params, "_meta": meta({"elicitation": {"form": {}}})})
    assert "result" not in undeclared and undeclared["error"]["code"] == -32021
    assert declared["result"]["resultType"] == "input_required"
    assert declared["result"]["inputRequests"]["__main__:ask"]["method"] == "elicitation/create"


async def test_a_handshake_upstreams_log_lines_reach_a_2026_agent_only_as_asked(tmp_path: Path) -> None:
    """logging.mdx: no ``notifications/message`` for a request without ``logLevel``, and only lines at
    or above the level it asked for (the upstream logs at ``info`` while it lists)."""
    config = write_config(tmp_path, [GITHUB], fsync="never")
    envelope = {"io.modelcontextprotocol/protocolVersion": MODERN,
                "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
                "io.modelcontextprotocol/clientCapabilities": {}}
    logs: dict[str, list[str]] = {}
    async with raw_pipe(serve_argv(config, "--stdio")) as pipe:
        for asked in (None, "error", "debug", "info"):
            meta = envelope if asked is None else {**envelope, "io.modelcontextprotocol/logLevel": asked}
            params = {"name": "github.list_repos", "arguments": {"owner": "acme"}, "_meta": meta}
            answered = await pipe.request(str(asked), "tools/call", params)
            assert answered["result"]["resultType"] == "complete"
            logs[str(asked)] = [n["params"]["level"] for n in pipe.notifications if n["method"] == "notifications/message"]
            pipe.notifications.clear()
    assert logs == {"None": [], "error": [], "debug": ["info"], "info": ["info"]}


async def test_codes_and_result_types_2026_forbids_never_reach_a_2026_agent(tmp_path: Path) -> None:
    """basic/index.mdx "Error Codes": -32002 became -32602; -32042 and undefined codes of
    -32020..-32099 may not be sent, and the defined ones (-32021 here) refused the gateway's request to
    the upstream, not the agent's. An unrecognised ``resultType`` is not a result; each is recorded as
    what the agent got."""
    upstream = {"name": "old", "transport": "stdio", "command": PYTHON, "args": [str(SERVERS / "era_answers.py")]}
    config = write_config(tmp_path, [upstream], fsync="never")
    meta = {"io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": {}}
    codes: list[int] = []
    async with raw_pipe(serve_argv(config, "--stdio")) as pipe:
        for number, code in enumerate((-32002, -32042, -32050, -32021, -32010)):
            params = {"name": "old.fail", "arguments": {"code": code}, "_meta": meta}
            codes.append((await pipe.request(number, "tools/call", params))["error"]["code"])
        for value in ("task", "bogus", "complete"):
            params = {"name": "old.typed", "arguments": {"value": value}, "_meta": meta}
            answered = await pipe.request(value, "tools/call", params)
            if value == "complete":
                assert answered["result"]["content"][0]["text"] == "done"
            else:
                assert answered["error"]["code"] == -32603 and "resultType" in answered["error"]["message"]
        gone = await pipe.request("r", "resources/read", {"uri": "note://gone", "_meta": meta})
        assert gone["error"] == {"code": -32602, "message": "Resource not found", "data": {"uri": "note://gone"}}
    async with raw_pipe(serve_argv(config, "--stdio")) as pipe:
        assert "result" in await pipe.initialize()
        kept = await pipe.request("l", "tools/call", {"name": "old.fail", "arguments": {"code": -32002}})
        assert kept["error"]["code"] == -32002  # a 2025-11-25 agent gets its era's code
    assert codes == [-32602, -32603, -32603, -32603, -32010]
    entries = [json.loads(line)["body"] for line in (tmp_path / "evidence" / "trace.ndjson").read_text().splitlines()]
    typed = [(e["outcome"], e.get("error_code")) for e in entries if e.get("tool") == "old.typed"]
    assert typed == [("upstream_error", -32603), ("upstream_error", -32603), ("ok", None)]
    failed = [e.get("error_code") for e in entries if e.get("tool") == "old.fail"]
    assert failed == [-32602, -32603, -32603, -32603, -32010, -32002]


async def test_the_2026_envelope_rules_at_the_edges(tmp_path: Path) -> None:
    """``initialize`` on a 2026-07-28 connection is an invalid request (errors.md), client capabilities
    that are not an object are invalid params like missing ones, and an interim InputRequiredResult
    to a cacheable request carries no caching hints (caching.mdx)."""
    upstream = {"name": "old", "transport": "stdio", "command": PYTHON, "args": [str(SERVERS / "era_answers.py")]}
    config = write_config(tmp_path, [upstream], fsync="never")
    meta = {"io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": {}}
    async with raw_pipe(serve_argv(config, "--stdio")) as pipe:
        assert "result" in await pipe.request(1, "server/discover", {"_meta": meta})
        again = await pipe.request(2, "initialize", {"protocolVersion": LEGACY_VERSION, "capabilities": {},
                                                     "clientInfo": {"name": "c", "version": "1"}})
        assert again["error"] == {"code": -32600, "message": "invalid request: initialize is not part of 2026-07-28"}
        for number, capabilities in enumerate((None, [], "form"), start=3):
            bad = {**meta, "io.modelcontextprotocol/clientCapabilities": capabilities}
            refused = await pipe.request(number, "tools/list", {"_meta": bad})
            assert refused["error"]["code"] == -32602 and "clientCapabilities" in refused["error"]["message"]
        interim = (await pipe.request(9, "resources/read", {"uri": "note://ask", "_meta": meta}))["result"]
        assert interim["resultType"] == "input_required" and interim["requestState"] == "s1"
        assert "ttlMs" not in interim and "cacheScope" not in interim
        listed = (await pipe.request(10, "resources/list", {"_meta": meta}))["result"]
        assert (listed["ttlMs"], listed["cacheScope"]) == (0, "private")
