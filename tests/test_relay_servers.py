"""Real servers through the gateway, with the mcp SDK client, in both protocol eras.

The era matrix: a client in the 2025-11-25 era (initialize handshake) and in the 2026-07-28 era
(stateless, per-request envelope) against servers that speak both (our fixtures, mcp-server-time) and
one that speaks only the handshake era (server-everything, TypeScript SDK 1.x). The gateway relays
the era end to end: it does not initialize the upstream itself, so the era the client negotiates is
the era the upstream serves.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import mcp_types as types
import pytest
from conftest import (
    ERAS,
    GITHUB_LIKE,
    LEGACY_VERSION,
    MODERN,
    SLACK_LIKE,
    connect,
    direct_params,
    wrap_params,
)

pytestmark = pytest.mark.anyio


def _text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


@pytest.mark.parametrize("mode", ERAS)
async def test_github_like_in_each_era(mode: str, harness) -> None:
    relay = harness(GITHUB_LIKE)
    progress: list[tuple[float, float | None, str | None]] = []
    logs: list[Any] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, total, message))

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(params.data)

    options: dict[str, Any] = {"logging_callback": on_log}
    if mode == MODERN:
        options["log_level"] = "info"  # 2026-07-28 logging is opt-in per request
    async with connect(relay.params(), mode, **options) as client:
        listed = await client.call_tool("list_repos", {"owner": "acme"}, progress_callback=on_progress)
        assert listed.structured_content == {"result": ["anvil", "rocket"]}
        repo = await client.call_tool("get_repo", {"owner": "acme", "name": "rocket"})
        assert repo.structured_content == {
            "owner": "acme",
            "name": "rocket",
            "description": "Rockets, mostly",
            "private": False,
            "stars": 42,
        }
        missing = await client.call_tool("get_repo", {"owner": "acme", "name": "nope"})
        assert missing.is_error
        readme = await client.read_resource("github://repos/acme/rocket/readme")
        assert isinstance(readme.contents[0], types.TextResourceContents)
        assert readme.contents[0].text == "# rocket\n\nRockets, mostly\n"
        templates = await client.list_resource_templates()
        assert [t.uri_template for t in templates.resource_templates] == ["github://repos/{owner}/{name}/readme"]
        prompt = await client.get_prompt("review_pr", {"repo": "acme/rocket", "number": "7"})
        assert "pull request #7 of acme/rocket" in prompt.messages[0].content.text  # type: ignore[union-attr]
        version = client.protocol_version
    assert version == (LEGACY_VERSION if mode == "legacy" else MODERN)
    assert progress == [(1.0, 2.0, "listed 1 of 2"), (2.0, 2.0, "listed 2 of 2")]
    assert logs == ["listed 2 repositories"]
    calls = relay.calls()
    assert [(c["tool"], c["outcome"]) for c in calls] == [
        ("list_repos", "ok"),
        ("get_repo", "ok"),
        ("get_repo", "tool_error"),
    ]
    assert {c["protocol_version"] for c in calls} == {version}
    assert all(c["action"] == "allow" and c["agent"] == "test-agent" for c in calls)


@pytest.mark.parametrize("mode", ERAS)
async def test_mcp_server_time_in_each_era(mode: str, time_server: list[str]) -> None:
    async with connect(wrap_params(time_server, "--allow-all"), mode) as client:
        tools = await client.list_tools()
        assert sorted(t.name for t in tools.tools) == ["convert_time", "get_current_time"]
        converted = await client.call_tool(
            "convert_time", {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}
        )
        assert not converted.is_error
        body = json.loads(_text(converted))
        assert body["target"]["datetime"].endswith("T21:00:00+09:00")
        now = await client.call_tool("get_current_time", {"timezone": "UTC"})
        assert json.loads(_text(now))["timezone"] == "UTC"
        assert client.protocol_version == (LEGACY_VERSION if mode == "legacy" else MODERN)


@pytest.mark.parametrize("mode", ERAS)
async def test_elicitation_crosses_the_gateway_in_each_era(mode: str, harness) -> None:
    """2025-11-25: a server->client elicitation/create mid-call. 2026-07-28: InputRequiredResult + retry."""
    relay = harness(SLACK_LIKE)
    asked: list[str] = []

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"confirm": True})

    async with connect(relay.params(), mode, elicitation_callback=elicit) as client:
        invited = await client.call_tool("invite", {"channel": "general", "user": "carol"})
        assert _text(invited) == "invited carol to #general"
        channels = await client.call_tool("list_channels", {})
        assert channels.structured_content == {"general": ["alice", "bob", "carol"], "random": ["alice"]}
    assert asked == ["Invite carol to #general?"]
    outcomes = [(c["tool"], c["outcome"]) for c in relay.calls()]
    if mode == "legacy":
        assert outcomes == [("invite", "ok"), ("list_channels", "ok")]
    else:
        # The retry is a tools/call of its own, and it is decided again.
        assert outcomes == [("invite", "input_required"), ("invite", "ok"), ("list_channels", "ok")]


async def test_server_everything_through_the_gateway(everything: list[str], harness) -> None:
    """Sampling, elicitation and roots (server->client requests), progress, prompts, resources, pings."""
    relay = harness(everything)
    seen: dict[str, Any] = {}

    async def sampling(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        seen["sampling"] = params.messages[0].content.text  # type: ignore[union-attr]
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="sampled!"), model="test-model"
        )

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        seen["elicitation"] = params.message
        return types.ElicitResult(action="decline")

    async def roots(context: Any) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri="file:///tmp/project", name="project")])

    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async with connect(
        relay.params(), "legacy", sampling_callback=sampling, elicitation_callback=elicit, list_roots_callback=roots
    ) as client:
        total = await client.call_tool("get-sum", {"a": 2, "b": 40})
        assert "42" in _text(total)
        sampled = await client.call_tool("trigger-sampling-request", {"prompt": "hello there"})
        assert "sampled!" in _text(sampled)
        assert seen["sampling"].endswith("hello there")
        listed_roots = await client.call_tool("get-roots-list", {})
        assert "file:///tmp/project" in _text(listed_roots)
        elicited = await client.call_tool("trigger-elicitation-request", {})
        assert "elicitation" in seen
        assert not elicited.is_error
        image = await client.call_tool("get-tiny-image", {})
        assert any(isinstance(block, types.ImageContent) for block in image.content)
        long_run = await client.call_tool(
            "trigger-long-running-operation", {"duration": 0.3, "steps": 3}, progress_callback=on_progress
        )
        assert not long_run.is_error
        assert progress == [1.0, 2.0, 3.0]
        prompt = await client.get_prompt("args-prompt", {"city": "Paris", "state": "Texas"})
        assert "Paris" in prompt.messages[0].content.text  # type: ignore[union-attr]
        resources = await client.list_resources()
        first = await client.read_resource(resources.resources[0].uri)
        assert first.contents
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            await client.send_ping()
    calls = relay.calls()
    # Pings, prompts and resources are not decided; every tools/call is, exactly once.
    assert [c["tool"] for c in calls] == [
        "get-sum",
        "trigger-sampling-request",
        "get-roots-list",
        "trigger-elicitation-request",
        "get-tiny-image",
        "trigger-long-running-operation",
    ]
    assert {c["outcome"] for c in calls} == {"ok"}


async def test_deterministic_results_equal_direct(everything: list[str]) -> None:
    calls = [
        ("get-structured-content", {"location": "Chicago"}),
        ("get-annotated-message", {"messageType": "error", "includeImage": True}),
        ("get-resource-links", {"count": 2}),
        ("echo", {"message": "h\u00e9llo \u2713 \u2028 \U0001f600"}),
        ("get-sum", {"a": 0.1, "b": 0.2}),
    ]

    async def run(params: Any) -> list[Any]:
        async with connect(params, "legacy") as client:
            return [(await client.call_tool(name, args)).model_dump(mode="json") for name, args in calls]

    assert await run(wrap_params(everything, "--allow-all")) == await run(direct_params(everything))


async def test_auto_mode_falls_back_to_the_handshake_like_direct(everything: list[str]) -> None:
    async with connect(direct_params(everything), "auto") as client:
        direct_version = client.protocol_version
    async with connect(wrap_params(everything, "--allow-all"), "auto") as client:
        assert client.protocol_version == direct_version == LEGACY_VERSION
        assert not (await client.call_tool("echo", {"message": "hi"})).is_error


async def test_modern_only_client_fails_against_a_legacy_only_server_as_it_does_directly(
    everything: list[str],
) -> None:
    """server-everything (TS SDK 1.x) has no 2026-07-28 era; through the gateway the failure is the same."""

    async def attempt(params: Any) -> tuple[str, str]:
        with pytest.raises(Exception) as caught:  # noqa: PT011 -- the SDK raises what the server's answer causes
            async with connect(params, MODERN) as client:
                await client.list_tools()
        error: BaseException = caught.value
        while isinstance(error, BaseExceptionGroup):
            error = error.exceptions[0]
        # The server answers a 2026-era tools/list with a handshake-era result, which the client rejects.
        return type(error).__name__, str(error)

    wrapped = await attempt(wrap_params(everything, "--allow-all"))
    direct = await attempt(direct_params(everything))
    assert wrapped == direct
    assert "cacheScope" in direct[1]
