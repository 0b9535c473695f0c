"""`drawbridge serve`: resource subscriptions on the one upstream session every agent shares.

To the upstream the gateway is one client, so it subscribes a URI once, for the first agent that
asks, and unsubscribes it when the last one leaves: one agent's unsubscribe (or disconnect) never
ends another's updates. Handshake-era agents subscribe with ``resources/subscribe``; 2026-07-28
agents name the URIs in ``subscriptions/listen`` and get the updates on that stream. A reconnected
upstream is subscribed again. Real gateway processes, the mcp SDK's client in both eras, and a
fixture upstream that reports the subscriptions it holds.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest

from conftest import MODERN, PYTHON, SERVERS, connect
from serve_support import dump, http_client, http_gateway, sha256, stdio_params, write_config

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore:resources/(un)?subscribe is removed")]

NOTES = {"name": "notes", "transport": "stdio", "command": PYTHON, "args": [str(SERVERS / "subscribing.py")]}
ALICE, BOB = "alice-subscriptions-token", "bob-subscriptions-token"


async def _upstream_holds(client: Any) -> dict[str, Any]:
    """What the upstream itself says it was asked (its subscriptions and the request counts)."""
    result = await client.call_tool("notes.subscriptions", {})
    return json.loads(result.content[0].text)


async def _until(check: Callable[[], Any], what: str, timeout: float = 15) -> None:
    with anyio.fail_after(timeout):
        while not await check():
            await anyio.sleep(0.05)


def _updates_into(into: list[str]) -> Callable[[Any], Any]:
    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            into.append(str(message.params.uri))

    return on_message


async def test_one_agents_unsubscribe_or_departure_never_ends_anothers_updates(tmp_path: Path) -> None:
    config = write_config(
        tmp_path, [NOTES], fsync="never", listen={"host": "127.0.0.1", "port": 0},
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
                held = await _upstream_holds(alice)
                assert (held["subscribed"], held["subscribe"]) == (["note://a"], 1)  # asked once

                await alice.call_tool("notes.touch", {"uri": "note://a"})
                await _until(lambda: _true(to_alice and to_bob), "both hear of the change")
                assert to_alice == to_bob == ["note://a"]

                await alice.unsubscribe_resource("note://a")
                held = await _upstream_holds(alice)
                assert (held["subscribed"], held["unsubscribe"]) == (["note://a"], 0)  # bob still wants it
                await bob.call_tool("notes.touch", {"uri": "note://a"})
                await _until(lambda: _true(len(to_bob) == 2), "bob hears of the second change")
                await anyio.sleep(0.3)
                assert to_alice == ["note://a"]
            # Bob is gone without unsubscribing: nobody wants the URI, the upstream is told.
            async def released() -> bool:
                held = await _upstream_holds(alice)
                return held["subscribed"] == [] and held["unsubscribe"] == 1

            await _until(released, "the upstream is unsubscribed once nobody wants the URI")


async def _true(value: Any) -> bool:
    return bool(value)


async def test_a_2026_agent_listens_for_resource_updates_and_the_upstream_is_released_after(tmp_path: Path) -> None:
    config = write_config(tmp_path, [NOTES], fsync="never")
    async with connect(stdio_params(config), MODERN) as client:
        async with client.listen(resource_subscriptions=["note://b", "nowhere://x"]) as sub:
            # Honored: the URI an upstream serves and subscribed to; not the one nobody serves.
            assert dump(sub.honored) == {"resourceSubscriptions": ["note://b"]}
            assert (await _upstream_holds(client))["subscribed"] == ["note://b"]
            await client.call_tool("notes.touch", {"uri": "note://a"})  # not asked for: nothing comes
            await client.call_tool("notes.touch", {"uri": "note://b"})
            with anyio.fail_after(10):
                event = await sub.__anext__()
            assert type(event).__name__ == "ResourceUpdated" and str(event.uri) == "note://b"

        async def released() -> bool:
            return (await _upstream_holds(client))["subscribed"] == []

        await _until(released, "the stream's subscription ends with it")


async def test_a_reconnected_upstream_is_subscribed_again(tmp_path: Path) -> None:
    config = write_config(tmp_path, [NOTES], fsync="never")
    updates: list[str] = []
    async with connect(stdio_params(config), "legacy", message_handler=_updates_into(updates)) as client:
        await client.subscribe_resource("note://a")
        await client.call_tool("notes.exit", {})  # the upstream process ends; the gateway reconnects

        async def subscribed_again() -> bool:
            try:
                held = await _upstream_holds(client)
            except Exception:  # noqa: BLE001 -- not reconnected yet
                return False
            return held["subscribed"] == ["note://a"] and held["subscribe"] == 1

        await _until(subscribed_again, "the new upstream process holds the subscription", timeout=30)
        await client.call_tool("notes.touch", {"uri": "note://a"})
        await _until(lambda: _true(updates == ["note://a"]), "the update reaches the agent")
