"""An upstream that dies is reconnected with backoff, and the gateway serves its new catalogue.

``generations.py`` lists a different ``gen_<n>`` tool at every start, so a gateway that reconnects but
keeps the old catalogue (mesh7's defect) fails here. The supervisor loop is also driven in-process
with an injected random source, to check the backoff schedule itself.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from conftest import PYTHON, SERVERS, connect, eventually_async, scaled
from mcp.shared.exceptions import MCPError
from serve_support import GITHUB, dump, stdio_params, write_config

from drawbridge.config import UpstreamConfig
from drawbridge.gateway.upstreams.session import State, UpstreamSession

pytestmark = pytest.mark.anyio


async def _names(client: Any) -> list[str]:
    return [tool.name for tool in (await client.list_tools()).tools]


async def test_a_dead_upstream_is_reconnected_with_backoff_and_its_new_catalogue_served(tmp_path: Path) -> None:
    generations = {
        "name": "gen",
        "transport": "stdio",
        "command": PYTHON,
        "args": [str(SERVERS / "generations.py")],
        "env": {"GENERATIONS_FILE": str(tmp_path / "generation")},
    }
    config = write_config(tmp_path, [GITHUB, generations])
    changed: list[float] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.append(time.monotonic())

    async with connect(stdio_params(config), "legacy", message_handler=on_message) as client:
        assert "gen.gen_1" in await _names(client)
        crashed_at = time.monotonic()
        with pytest.raises(MCPError) as died:
            await client.call_tool("gen.crash", {})
        assert died.value.code == -32000
        assert "exited with status 3" in died.value.message

        # While the upstream is down: its calls fail at once, naming the reason; the others are unaffected.
        with pytest.raises(MCPError) as down:
            await client.call_tool("gen.echo", {"text": "hello"})
        assert down.value.code == -32000 and "disconnected" in down.value.message and "next attempt" in down.value.message
        repos = dump(await client.call_tool("github.list_repos", {"owner": "acme"}))
        assert repos["structuredContent"] == {"result": ["anvil", "rocket"]}

        async def reconnected() -> list[str] | None:
            names = await _names(client)
            return names if "gen.gen_2" in names else None

        names = await eventually_async(reconnected, scaled(15), "the new catalogue")
        back_at = time.monotonic()
        assert back_at - crashed_at >= 0.5  # the first retry waits at least half of the 1 s base delay
        assert "gen.gen_1" not in names and "github.list_repos" in names
        assert dump(await client.call_tool("gen.generation", {}))["structuredContent"] == {"result": 2}
        assert dump(await client.call_tool("gen.echo", {"text": "again"}))["content"][0]["text"] == "again"
        await eventually_async(lambda: changed, scaled(5), "tools/list_changed")


async def test_backoff_doubles_from_one_second_with_injected_jitter(tmp_path: Path) -> None:
    # A server that exits at once: every attempt fails, and the session keeps retrying on schedule.
    upstream = UpstreamSession(
        UpstreamConfig(name="dead", transport="stdio", command=PYTHON, args=("-c", "raise SystemExit(1)")),
        rand=lambda: 0.0,
    )
    seen: list[float] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(upstream.run)

        def sample() -> bool:  # each scheduled retry's delay, once
            if upstream.state is State.RECONNECTING and upstream.next_attempt_in not in (None, *seen[-1:]):
                seen.append(upstream.next_attempt_in)  # type: ignore[arg-type]
            return len(seen) >= 3

        await eventually_async(sample, scaled(20), "three scheduled retries")
        await upstream.close()
        tg.cancel_scope.cancel()
    assert seen == [0.5, 1.0, 2.0]  # 1, 2, 4 s scaled by 0.5 + 0.5 * rand() with rand() = 0
    assert upstream.last_error is not None and "handshake" in upstream.last_error


async def test_an_upstream_command_that_cannot_start_is_a_startup_failure() -> None:
    upstream = UpstreamSession(UpstreamConfig(name="ghost", transport="stdio", command="/nonexistent/server"))
    with anyio.fail_after(scaled(10)):
        await upstream.run()  # returns: nothing to retry
    assert upstream.state is State.FAILED
    assert "cannot start upstream '/nonexistent/server'" in upstream.unavailable_reason()
