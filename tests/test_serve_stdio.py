"""``drawbridge serve --stdio`` with several real upstreams: golden catalogues, concurrency, bad input, routing.

The gateway runs as a subprocess in front of github_like, slack_like, crashy and the reference
server-everything (node). Raw-pipe tests compare parsed JSON lines; the era matrix is in test_serve_eras.py.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import GITHUB_LIKE, LEGACY_VERSION, SLACK_LIKE, RawPipe, eventually_async, raw_pipe
from serve_support import CRASHY, GITHUB, SLACK, everything_upstream, serve_argv, write_config

from drawbridge.gateway.upstreams.session import CLIENT_CAPABILITIES

pytestmark = pytest.mark.anyio


async def _all_pages(pipe: RawPipe, method: str, key: str) -> list[Any]:
    items: list[Any] = []
    cursor = None
    for page in range(1000):
        response = await pipe.request(f"{method}#{page}", method, {"cursor": cursor} if cursor else None)
        result = response["result"]
        items += result[key]
        cursor = result.get("nextCursor")
        if not cursor:
            return items
    raise AssertionError("pagination did not end")


async def _catalogue(argv: Sequence[str]) -> dict[str, Any]:
    """The lists an agent sees. The client declares what the gateway declares to its upstreams (some
    servers list more tools to a client that can answer sampling and elicitation)."""
    async with raw_pipe(argv) as pipe:
        init = await pipe.request(
            "init",
            "initialize",
            {
                "protocolVersion": LEGACY_VERSION,
                "capabilities": dict(CLIENT_CAPABILITIES),
                "clientInfo": {"name": "raw-test", "version": "0"},
            },
        )
        await pipe.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return {
            "initialize": init["result"],
            "tools": await _all_pages(pipe, "tools/list", "tools"),
            "prompts": await _all_pages(pipe, "prompts/list", "prompts"),
            "resources": await _all_pages(pipe, "resources/list", "resources"),
            "templates": await _all_pages(pipe, "resources/templates/list", "resourceTemplates"),
        }


def _part(items: list[dict[str, Any]], server: str) -> list[dict[str, Any]]:
    """The items of one upstream, with the ``server.`` prefix taken off again."""
    prefix = f"{server}."
    return [{**item, "name": item["name"][len(prefix) :]} for item in items if item["name"].startswith(prefix)]


async def test_catalogues_through_serve_equal_direct_modulo_namespace(tmp_path: Path, everything: list[str]) -> None:
    config = write_config(tmp_path, [GITHUB, SLACK, everything_upstream(everything)])
    direct = {
        "everything": await _catalogue(everything),
        "github": await _catalogue(GITHUB_LIKE),
        "slack": await _catalogue(SLACK_LIKE),
    }
    via = await _catalogue(serve_argv(config, "--stdio"))

    for server in ("github", "slack", "everything"):
        assert _part(via["tools"], server) == direct[server]["tools"], server
        assert _part(via["prompts"], server) == direct[server]["prompts"], server
    assert len(via["tools"]) == sum(len(d["tools"]) for d in direct.values())
    # Resource URIs are routed, not renamed: the merged list is each upstream's list, in configuration order.
    assert via["resources"] == [*direct["github"]["resources"], *direct["slack"]["resources"], *direct["everything"]["resources"]]
    assert via["templates"] == [*direct["github"]["templates"], *direct["slack"]["templates"], *direct["everything"]["templates"]]

    # The comparison means something only if the lists carry what lossy proxies drop.
    everything_tools = direct["everything"]["tools"]
    assert len(everything_tools) >= 10 and len(direct["everything"]["resources"]) >= 5
    assert direct["everything"]["templates"] and direct["github"]["templates"]
    assert any("annotations" in t for t in everything_tools) and any("outputSchema" in t for t in everything_tools)
    github_tools = {t["name"]: t for t in via["tools"]}
    assert github_tools["github.list_repos"]["_meta"] == {"example.com/cost": "cheap", "example.com/tags": ["read", "list"]}
    assert github_tools["github.get_repo"]["title"] == "Get a repository"

    init = via["initialize"]
    assert init["serverInfo"]["name"] == "drawbridge"
    assert init["protocolVersion"] == LEGACY_VERSION
    capabilities = init["capabilities"]
    assert capabilities["tools"] == {"listChanged": True}
    assert capabilities["resources"].get("subscribe") is True  # server-everything offers subscriptions
    assert "prompts" in capabilities and "completions" in capabilities


async def test_many_calls_in_flight_across_upstreams_get_their_own_answers(tmp_path: Path) -> None:
    config = write_config(tmp_path, [GITHUB, SLACK, CRASHY])
    requests: dict[Any, tuple[str, dict[str, Any]]] = {
        1: ("crashy.slow", {"seconds": 0.8}),
        "1": ("github.get_repo", {"owner": "acme", "name": "anvil"}),
        "a": ("slack.list_channels", {}),
        -5: ("github.get_repo", {"owner": "octo", "name": "hello"}),
    }
    for i in range(2, 14):
        requests[i] = ("crashy.echo", {"text": f"echo {i}"})
    async with raw_pipe(serve_argv(config, "--stdio")) as pipe:
        await pipe.initialize()
        for request_id, (name, arguments) in requests.items():
            await pipe.send(
                {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
            )
        answers: list[dict[str, Any]] = []
        while len(answers) < len(requests):
            message = await pipe.recv()
            if "method" not in message:
                answers.append(message)
    by_id = {json.dumps(a["id"]): a for a in answers}
    assert len(by_id) == len(requests)  # one answer per request, 1 and "1" kept apart
    assert answers[-1]["id"] == 1  # the slow one finished last; the others did not wait for it
    assert by_id["1"]["result"]["content"][0]["text"] == "slept 0.8"
    assert by_id['"1"']["result"]["structuredContent"]["name"] == "anvil"
    assert by_id["-5"]["result"]["structuredContent"]["name"] == "hello"
    assert "general" in by_id['"a"']["result"]["structuredContent"]
    for i in range(2, 14):
        assert by_id[str(i)]["result"]["content"][0]["text"] == f"echo {i}"


async def test_cancellation_reaches_the_upstream_and_no_answer_follows(tmp_path: Path) -> None:
    log = tmp_path / "cancel.log"
    start_log = tmp_path / "start.log"
    crashy = {**CRASHY, "env": {"CRASHY_CANCEL_LOG": str(log), "CRASHY_START_LOG": str(start_log)}}
    config = write_config(tmp_path, [GITHUB, crashy])
    async with raw_pipe(serve_argv(config, "--stdio")) as pipe:
        await pipe.initialize()
        await pipe.send(
            {"jsonrpc": "2.0", "id": "long", "method": "tools/call", "params": {"name": "crashy.slow", "arguments": {"seconds": 30}}}
        )
        await eventually_async(start_log.exists, what="the call being decided and forwarded")
        await pipe.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "long"}})
        await eventually_async(lambda: log.exists() and "cancelled" in log.read_text(), what="the upstream seeing the cancellation")
        # The upstream saw the gateway's own id for the call, not the agent's.
        assert log.read_text().split() == ["cancelled", log.read_text().split()[1]]
        assert log.read_text().split()[1] != "long"
        await pipe.send({"jsonrpc": "2.0", "id": "after", "method": "ping"})
        assert await pipe.recv() == {"jsonrpc": "2.0", "id": "after", "result": {}}


async def test_progress_tokens_are_mapped_back_to_the_agents_own(tmp_path: Path) -> None:
    config = write_config(tmp_path, [GITHUB, SLACK])
    async with raw_pipe(serve_argv(config, "--stdio")) as pipe:
        await pipe.initialize()
        for request_id, token in (("p1", "tok-7"), ("p2", 7)):
            pipe.notifications.clear()
            response = await pipe.request(
                request_id,
                "tools/call",
                {"name": "github.list_repos", "arguments": {"owner": "acme"}, "_meta": {"progressToken": token}},
            )
            assert response["result"]["structuredContent"] == {"result": ["anvil", "rocket"]}
            progress = [n["params"] for n in pipe.notifications if n.get("method") == "notifications/progress"]
            assert [(p["progressToken"], p["progress"], p["total"]) for p in progress] == [(token, 1, 2), (token, 2, 2)]
            logs = [n for n in pipe.notifications if n.get("method") == "notifications/message"]
            assert logs and logs[0]["params"]["data"] == "listed 2 repositories"


async def test_bad_input_gets_errors_and_the_gateway_keeps_serving(tmp_path: Path) -> None:
    config = write_config(tmp_path, [GITHUB, SLACK])
    async with raw_pipe(serve_argv(config, "--stdio")) as pipe:
        await pipe.initialize()

        async def call(request_id: Any, params: Any, method: str = "tools/call") -> dict[str, Any]:
            await pipe.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
            return json.loads(await pipe.response_line(request_id))

        await pipe.send(b"this is not json\n")
        assert (await pipe.recv())["error"]["code"] == -32700
        await pipe.send(b'[{"jsonrpc":"2.0","id":1,"method":"ping"}]\n')
        assert (await pipe.recv())["error"]["code"] == -32600
        unknown = await call(1, {"name": "github.no_such_tool", "arguments": {}})
        assert unknown["error"]["code"] == -32602 and "unknown tool" in unknown["error"]["message"]
        bare = await call(2, {"name": "list_repos", "arguments": {"owner": "acme"}})
        assert bare["error"]["code"] == -32602  # un-namespaced names route nowhere
        control = await call(3, {"name": "github.list\u0007repos", "arguments": {}})
        assert control["error"]["code"] == -32602 and "U+0007" in control["error"]["message"]
        not_object = await call(4, {"name": "github.list_repos", "arguments": ["acme"]})
        assert not_object["error"]["code"] == -32602
        sloppy = await call(5, {"name": "github.list_repos", "arguments": {}}, method="Tools/Call")
        assert sloppy["error"]["code"] == -32601
        unknown_method = await call(6, {}, method="no/such/method")
        assert unknown_method["error"]["code"] == -32601
        bad_prompt = await call(7, {"name": "nobody.prompt"}, method="prompts/get")
        assert bad_prompt["error"]["code"] == -32602
        duplicate_key = b'{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"github.list_repos","name":"x"}}\n'
        await pipe.send(duplicate_key)
        assert (await pipe.recv())["error"]["code"] == -32700
        tool_error = await call(9, {"name": "github.get_repo", "arguments": {"owner": "acme", "name": "missing"}})
        assert tool_error["result"]["isError"] is True
        # Still serving.
        ok = await call(10, {"name": "github.list_repos", "arguments": {"owner": "acme"}})
        assert ok["result"]["structuredContent"] == {"result": ["anvil", "rocket"]}


async def test_resources_route_by_uri_and_completions_by_reference(tmp_path: Path, everything: list[str]) -> None:
    config = write_config(tmp_path, [GITHUB, everything_upstream(everything)])
    async with raw_pipe(everything) as pipe:
        await pipe.initialize()
        direct_static = await pipe.request("r", "resources/read", {"uri": "demo://resource/static/document/features.md"})
        direct_dynamic = await pipe.request("d", "resources/read", {"uri": "demo://resource/dynamic/text/7"})
    async with raw_pipe(serve_argv(config, "--stdio")) as pipe:
        await pipe.initialize()
        # Never listed by anyone: routed by github's template github://repos/{owner}/{name}/readme.
        readme = await pipe.request(1, "resources/read", {"uri": "github://repos/acme/rocket/readme"})
        assert readme["result"]["contents"][0]["text"] == "# rocket\n\nRockets, mostly\n"
        static = await pipe.request(2, "resources/read", {"uri": "demo://resource/static/document/features.md"})
        assert static["result"] == direct_static["result"]
        dynamic = await pipe.request(3, "resources/read", {"uri": "demo://resource/dynamic/text/7"})
        # Generated on read (the text carries the time): same shape, same resource.
        [got], [want] = dynamic["result"]["contents"], direct_dynamic["result"]["contents"]
        assert {**got, "text": got["text"].split(" created at")[0]} == {**want, "text": want["text"].split(" created at")[0]}
        nowhere = await pipe.request(4, "resources/read", {"uri": "nobody://lists/this"})
        assert nowhere["error"]["code"] == -32602
        subscribed = await pipe.request(5, "resources/subscribe", {"uri": "demo://resource/static/document/features.md"})
        assert subscribed["result"] == {}
        completion = await pipe.request(
            6,
            "completion/complete",
            {"ref": {"type": "ref/prompt", "name": "everything.completable-prompt"}, "argument": {"name": "department", "value": "E"}},
        )
        assert completion["result"]["completion"]["values"] == ["Engineering"]
        prompt = await pipe.request(7, "prompts/get", {"name": "everything.args-prompt", "arguments": {"city": "Oslo"}})
        assert "Oslo" in json.dumps(prompt["result"])
