"""Upstreams reached over streamable HTTP: the reference server-everything (node, SSE answers with
resumption primers) and github_like served by the Python SDK; restart and reconnect; HTTP agents."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from conftest import LEGACY_VERSION, MODERN, PYTHON, SERVERS, connect, eventually_async, raw_pipe, scaled
from mcp.shared.exceptions import MCPError
from serve_support import (
    HTTP_UPSTREAM,
    SLACK,
    Running,
    background,
    dump,
    free_port,
    http_client,
    http_gateway,
    serve_argv,
    stdio_params,
    wait_for_port,
    write_config,
)

from drawbridge.gateway.upstreams.session import CLIENT_CAPABILITIES

pytestmark = pytest.mark.anyio


@contextmanager
def python_http_upstream(server: str, port: int) -> Iterator[Running]:
    with background([PYTHON, str(HTTP_UPSTREAM), str(SERVERS / server), str(port)]) as running:
        wait_for_port(port)
        yield running


@contextmanager
def everything_http(everything: list[str], port: int) -> Iterator[Running]:
    with background([everything[0], "streamableHttp"], env={"PORT": str(port)}) as running:
        wait_for_port(port)
        yield running


class _Agent:
    """What an agent's client is asked (it confirms everything) and the progress it is told of."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.progress: list[float] = []

    async def elicit(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.asked.append(params.message)
        return types.ElicitResult(action="accept", content={"confirm": True})

    async def on_progress(self, value: float, total: float | None, message: str | None) -> None:
        self.progress.append(value)


async def _tools(argv: list[str]) -> list[dict[str, Any]]:
    async with raw_pipe(argv) as pipe:
        await pipe.request(
            "init",
            "initialize",
            {"protocolVersion": LEGACY_VERSION, "capabilities": dict(CLIENT_CAPABILITIES), "clientInfo": {"name": "t", "version": "0"}},
        )
        await pipe.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        tools: list[dict[str, Any]] = []
        cursor = None
        while True:
            result = (await pipe.request(f"t{len(tools)}", "tools/list", {"cursor": cursor} if cursor else None))["result"]
            tools += result["tools"]
            if not (cursor := result.get("nextCursor")):
                return tools


async def test_server_everything_over_http_lists_the_same_tools_as_over_stdio(tmp_path: Path, everything: list[str]) -> None:
    port = free_port()
    with everything_http(everything, port):
        config = write_config(
            tmp_path, [{"name": "everything", "transport": "streamable_http", "url": f"http://127.0.0.1:{port}/mcp"}]
        )
        via = await _tools(serve_argv(config, "--stdio"))
        async with connect(stdio_params(config), "legacy") as client:
            echo = dump(await client.call_tool("everything.echo", {"message": "over http"}))
            total = dump(await client.call_tool("everything.get-sum", {"a": 2, "b": 3}))
    direct = await _tools(everything)
    assert [{**t, "name": t["name"].removeprefix("everything.")} for t in via] == direct
    assert echo["content"][0]["text"] == "Echo: over http"
    assert "5" in total["content"][0]["text"]


async def test_an_http_upstream_that_restarts_is_reconnected(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    config = write_config(
        tmp_path,
        [{"name": "gh", "transport": "streamable_http", "url": url, "headers_env": {"X-Upstream-Token": "GH_TOKEN"}}, SLACK],
    )
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    with python_http_upstream("github_like.py", port) as first:
        async with connect(stdio_params(config, env={"GH_TOKEN": "upstream-secret"}), "legacy") as client:
            listed = dump(await client.call_tool("gh.list_repos", {"owner": "acme"}, progress_callback=on_progress))
            assert listed["structuredContent"] == {"result": ["anvil", "rocket"]}
            assert progress == [1.0, 2.0]  # notifications that came on the POST's SSE stream, mapped back

            first.process.terminate()
            first.process.wait(scaled(10))

            async def refused() -> MCPError | None:  # the death shows on the GET stream or on the next call
                try:
                    await client.call_tool("gh.get_repo", {"owner": "acme", "name": "rocket"})
                except MCPError as exc:
                    return exc
                return None

            assert (await eventually_async(refused, scaled(10), "the upstream's death showing")).code == -32000
            with python_http_upstream("github_like.py", port):
                again = dump(await eventually_async(
                    lambda: client.call_tool("gh.get_repo", {"owner": "acme", "name": "rocket"}), scaled(20),
                    "a call through the restarted upstream", ignoring=(MCPError,),
                ))
                assert again["structuredContent"]["stars"] == 42
                assert dump(await client.call_tool("slack.list_channels", {}))["isError"] is False


async def test_http_agent_with_http_upstream_gets_progress_and_elicitation(tmp_path: Path) -> None:
    port = free_port()
    agent = _Agent()
    asked, progress, elicit, on_progress = agent.asked, agent.progress, agent.elicit, agent.on_progress

    with python_http_upstream("slack_like.py", port):
        config = write_config(
            tmp_path,
            [
                {"name": "slack", "transport": "streamable_http", "url": f"http://127.0.0.1:{port}/mcp"},
                {"name": "github", "transport": "stdio", "command": PYTHON, "args": [str(SERVERS / "github_like.py")]},
            ],
            auth={"anonymous_agent": "anyone"},
        )
        with http_gateway(config) as gateway:
            assert gateway.url is not None
            async with http_client(gateway.url, "legacy", elicitation_callback=elicit) as client:
                invited = dump(await client.call_tool("slack.invite", {"channel": "random", "user": "dave"}))
                listed = dump(await client.call_tool("github.list_repos", {"owner": "acme"}, progress_callback=on_progress))
    assert invited["content"][0]["text"] == "invited dave to #random"
    assert asked == ["Invite dave to #random?"]
    assert listed["structuredContent"] == {"result": ["anvil", "rocket"]} and progress == [1.0, 2.0]


async def test_2026_http_upstreams_serve_a_2026_agent_progress_and_questions(tmp_path: Path) -> None:
    """Upstreams spoken to at 2026-07-28 over HTTP (stateless POSTs with the gateway's envelope):
    progress comes back on the call's own stream, and a question comes as an InputRequiredResult
    that the agent answers by retrying."""
    asking_port, github_port = free_port(), free_port()
    agent = _Agent()
    asked, progress, elicit, on_progress = agent.asked, agent.progress, agent.elicit, agent.on_progress

    with python_http_upstream("asking.py", asking_port), python_http_upstream("github_like.py", github_port):
        config = write_config(
            tmp_path,
            [
                {"name": "asking", "transport": "streamable_http", "url": f"http://127.0.0.1:{asking_port}/mcp",
                 "protocol": MODERN},
                {"name": "github", "transport": "streamable_http", "url": f"http://127.0.0.1:{github_port}/mcp",
                 "protocol": MODERN},
            ],
            auth={"anonymous_agent": "anyone"},
        )
        with http_gateway(config) as gateway:
            assert gateway.url is not None
            async with http_client(gateway.url, MODERN, elicitation_callback=elicit) as client:
                names = sorted(tool.name for tool in (await client.list_tools()).tools)
                deleted = dump(await client.call_tool("asking.delete_note", {"name": "groceries"}))
                listed = dump(await client.call_tool("github.list_repos", {"owner": "acme"}, progress_callback=on_progress))
    assert "asking.delete_note" in names and "github.list_repos" in names
    assert deleted["content"][0]["text"] == "deleted groceries" and asked == ["Delete the note groceries?"]
    assert listed["structuredContent"] == {"result": ["anvil", "rocket"]} and progress == [1.0, 2.0]
