"""`drawbridge serve`: change notifications from upstreams every agent shares, in both eras on both sides.

To the upstream the gateway is one client, so it subscribes a URI once, for the first agent that
asks, and unsubscribes it when the last one leaves: one agent's unsubscribe (or disconnect) never
ends another's updates. Handshake-era agents subscribe with ``resources/subscribe``; 2026-07-28
agents name the URIs in ``subscriptions/listen`` and get the updates on that stream. A handshake-era
upstream is subscribed with ``resources/subscribe``; a 2026-07-28 one (``protocol: 2026-07-28``)
through the resources of the gateway's listen stream, which also brings its list changes. A
reconnected upstream is subscribed again. Real gateway processes, the mcp SDK's client in both eras,
and a fixture upstream that reports what it holds and the era it was spoken to in.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from conftest import LEGACY_VERSION, MODERN, PYTHON, SERVERS, connect, eventually_async, scaled
from serve_support import dump, http_client, http_gateway, sha256, stdio_params, write_config

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore:resources/(un)?subscribe is removed")]
ERAS = pytest.mark.parametrize("upstream_era", [LEGACY_VERSION, MODERN])

ALICE, BOB = "alice-subscriptions-token", "bob-subscriptions-token"


def _notes(era: str) -> dict[str, Any]:
    return {"name": "notes", "transport": "stdio", "command": PYTHON, "args": [str(SERVERS / "subscribing.py")],
            "protocol": era}


async def _upstream_holds(client: Any, era: str) -> dict[str, Any]:
    """What the upstream itself says it holds, in the era it was spoken to (and only that one)."""
    result = await client.call_tool("notes.subscriptions", {})
    held = json.loads(result.content[0].text)
    assert held["eras"] == [era]
    held["uris"] = held["subscribed"] if era == LEGACY_VERSION else held["listening"]
    return held


def _updates_into(into: list[str]) -> Callable[[Any], Any]:
    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            into.append(str(message.params.uri))
        elif isinstance(message, types.ToolListChangedNotification):
            into.append("tools")

    return on_message


def _released(client: Any, era: str) -> Callable[[], Any]:
    async def check() -> bool:
        return (await _upstream_holds(client, era))["uris"] == []

    return check


def _has(values: list[str], count: int) -> Callable[[], Any]:
    async def check() -> bool:
        return len(values) >= count

    return check


@ERAS
async def test_one_agents_unsubscribe_or_departure_never_ends_anothers_updates(tmp_path: Path, upstream_era: str) -> None:
    config = write_config(
        tmp_path, [_notes(upstream_era)], fsync="never", listen={"host": "127.0.0.1", "port": 0},
        auth={"agents": [{"agent": "alice", "token_sha256": sha256(ALICE)}, {"agent": "bob", "token_sha256": sha256(BOB)}]},
    )
    to_alice: list[str] = []
    to_bob: list[str] = []
    with http_gateway(config) as running:
        assert running.url is not None
        async with http_client(running.url, "legacy", ALICE, message_handler=_updates_into(to_alice)) as alice:
            async with http_client(running.url, "legacy", BOB, message_handler=_updates_into(to_bob)) as bob:
                await alice.subscribe_resource("note://a")
                await bob.subscribe_resource("note://a")
                held = await _upstream_holds(alice, upstream_era)
                assert held["uris"] == ["note://a"]
                if upstream_era == LEGACY_VERSION:
                    assert held["subscribe"] == 1  # asked once, for both

                await alice.call_tool("notes.touch", {"uri": "note://a"})
                await eventually_async(_has(to_alice, 1))
                await eventually_async(_has(to_bob, 1))
                assert to_alice == to_bob == ["note://a"]

                await alice.unsubscribe_resource("note://a")
                assert (await _upstream_holds(alice, upstream_era))["uris"] == ["note://a"]  # bob still wants it
                await bob.call_tool("notes.touch", {"uri": "note://a"})
                await eventually_async(_has(to_bob, 2))
                await anyio.sleep(scaled(0.3))  # alice's would have come with bob's
                assert to_alice == ["note://a"]
            # Bob is gone without unsubscribing: nobody wants the URI, the upstream is told.
            await eventually_async(_released(alice, upstream_era))


@ERAS
async def test_a_2026_agent_listens_for_updates_and_the_upstream_is_released_after(tmp_path: Path, upstream_era: str) -> None:
    config = write_config(tmp_path, [_notes(upstream_era)], fsync="never")
    async with connect(stdio_params(config), MODERN) as client:
        async with client.listen(tools_list_changed=True, resource_subscriptions=["note://b", "nowhere://x"]) as sub:
            # Honored: the URI an upstream serves and subscribed to; not the one nobody serves.
            assert dump(sub.honored) == {"toolsListChanged": True, "resourceSubscriptions": ["note://b"]}
            assert (await _upstream_holds(client, upstream_era))["uris"] == ["note://b"]
            await client.call_tool("notes.touch", {"uri": "note://a"})  # not asked for: nothing comes
            await client.call_tool("notes.touch", {"uri": "note://b"})
            with anyio.fail_after(scaled(10)):
                event = await sub.__anext__()
            assert type(event).__name__ == "ResourceUpdated" and str(event.uri) == "note://b"
            await client.call_tool("notes.grow", {})  # a new tool upstream: the merged list changes
            with anyio.fail_after(scaled(10)):
                event = await sub.__anext__()
            assert type(event).__name__ == "ToolsListChanged"
        assert "notes.grown_4" in [tool.name for tool in (await client.list_tools()).tools]
        await eventually_async(_released(client, upstream_era))


@ERAS
async def test_a_reconnected_upstream_is_subscribed_again(tmp_path: Path, upstream_era: str) -> None:
    config = write_config(tmp_path, [_notes(upstream_era)], fsync="never")
    updates: list[str] = []
    async with connect(stdio_params(config), "legacy", message_handler=_updates_into(updates)) as client:
        await client.subscribe_resource("note://a")
        await client.call_tool("notes.exit", {})  # the upstream process ends; the gateway reconnects

        async def subscribed_again() -> bool:
            try:
                held = await _upstream_holds(client, upstream_era)
            except Exception:  # noqa: BLE001 -- not reconnected yet
                return False
            return held["uris"] == ["note://a"]

        await eventually_async(subscribed_again, timeout=scaled(30))
        await client.call_tool("notes.touch", {"uri": "note://a"})

        async def updated() -> bool:
            return "note://a" in updates

        await eventually_async(updated)
        assert [u for u in updates if u != "tools"] == ["note://a"]
