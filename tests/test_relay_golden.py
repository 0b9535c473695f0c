"""Golden tests: what an agent receives through ``drawbridge wrap`` equals what it receives directly.

Raw-pipe tests send the same JSON lines to the server directly and through the gateway and compare the
lines that come back byte for byte. SDK tests compare the typed results an mcp ``Client`` builds.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from conftest import (
    GITHUB_LIKE,
    LEGACY_VERSION,
    MODERN,
    connect,
    direct_params,
    raw_pipe,
    wrap_argv,
    wrap_params,
)

pytestmark = pytest.mark.anyio

ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientInfo": {"name": "raw-test", "version": "0"},
    "io.modelcontextprotocol/clientCapabilities": {},
}


async def _legacy_lines(argv: Sequence[str]) -> dict[str, bytes]:
    """initialize, tools/list, prompts/list, resources/list and one tools/call, as raw response lines."""
    async with raw_pipe(argv) as pipe:
        await pipe.send(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": LEGACY_VERSION,
                    "capabilities": {},
                    "clientInfo": {"name": "raw-test", "version": "0"},
                },
            }
        )
        lines = {"initialize": await pipe.response_line(1)}
        await pipe.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        for request_id, method in ((2, "tools/list"), (3, "prompts/list"), (4, "resources/list")):
            await pipe.send({"jsonrpc": "2.0", "id": request_id, "method": method})
            lines[method] = await pipe.response_line(request_id)
        return lines


async def test_server_everything_raw_lines_are_byte_identical(everything: list[str]) -> None:
    direct = await _legacy_lines(everything)
    wrapped = await _legacy_lines(wrap_argv(everything, "--allow-all"))
    assert direct.keys() == wrapped.keys()
    for method in direct:
        assert wrapped[method] == direct[method], method
    tools = json.loads(direct["tools/list"])["result"]["tools"]
    # The comparison is only meaningful if the list carries what lossy proxies drop.
    assert len(tools) >= 10
    assert any("annotations" in tool for tool in tools)
    assert any("outputSchema" in tool for tool in tools)
    assert all("$schema" in tool["inputSchema"] for tool in tools)


async def _modern_tools_list(argv: Sequence[str]) -> bytes:
    async with raw_pipe(argv) as pipe:
        await pipe.send(
            {"jsonrpc": "2.0", "id": "discover", "method": "server/discover", "params": {"_meta": ENVELOPE}}
        )
        await pipe.response_line("discover")
        await pipe.send({"jsonrpc": "2.0", "id": "tl", "method": "tools/list", "params": {"_meta": ENVELOPE}})
        return await pipe.response_line("tl")


async def test_github_like_raw_tools_list_2026_era_is_byte_identical() -> None:
    direct = await _modern_tools_list(GITHUB_LIKE)
    wrapped = await _modern_tools_list(wrap_argv(GITHUB_LIKE, "--allow-all"))
    assert wrapped == direct
    result = json.loads(direct)["result"]
    assert result["resultType"] == "complete"
    by_name = {tool["name"]: tool for tool in result["tools"]}
    assert by_name["list_repos"]["_meta"] == {"example.com/cost": "cheap", "example.com/tags": ["read", "list"]}
    assert by_name["delete_repo"]["annotations"]["destructiveHint"] is True
    assert by_name["get_repo"]["title"] == "Get a repository"
    assert "outputSchema" in by_name["get_repo"]


def _dump(result: Any) -> Any:
    return result.model_dump(mode="json", by_alias=True)


async def test_sdk_client_sees_the_same_server_everything_catalogue(everything: list[str]) -> None:
    async with connect(direct_params(everything), "legacy") as client:
        direct = (_dump(await client.list_tools()), _dump(await client.list_prompts()), client.server_capabilities)
    async with connect(wrap_params(everything, "--allow-all"), "legacy") as client:
        wrapped = (_dump(await client.list_tools()), _dump(await client.list_prompts()), client.server_capabilities)
    assert wrapped == direct


@pytest.mark.parametrize("mode", ["legacy", MODERN])
async def test_sdk_client_sees_the_same_github_like_tools_in_each_era(mode: str) -> None:
    async with connect(direct_params(GITHUB_LIKE), mode) as client:
        direct = _dump(await client.list_tools())
        direct_version = client.protocol_version
    async with connect(wrap_params(GITHUB_LIKE, "--allow-all"), mode) as client:
        wrapped = _dump(await client.list_tools())
        assert client.protocol_version == direct_version
    assert wrapped == direct
    assert direct_version == (LEGACY_VERSION if mode == "legacy" else MODERN)
