"""``drawbridge serve`` over streamable HTTP at /mcp: identities, sessions, limits, both protocol eras.

One gateway process (github_like and slack_like behind it) serves the whole module; a second one is
started for the anonymous-agent case. Raw requests use httpx; protocol flows use the mcp SDK client.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import httpx
import pytest
from conftest import MODERN, eventually, scaled
from serve_support import (
    CRASHY,
    GITHUB,
    SLACK,
    Running,
    dump,
    http_client,
    http_gateway,
    initialize_request,
    sha256,
    write_config,
)

ALICE, BOB = "alice-secret-token", "bob-secret-token"
POLICIES = {
    "alice.yaml": "name: alice\nagent: alice\nrules:\n  - tools: ['*']\n    action: allow\n",
    "bob.yaml": (
        "name: bob\nagent: bob\nrules:\n"
        "  - tools: ['github.*']\n    action: deny\n"
        "  - tools: ['slack.*']\n    action: allow\n"
    ),
    "guest.yaml": "name: guest\nagent: guest\nrules:\n  - tools: ['slack.list_channels']\n    action: allow\n",
    "default.yaml": "name: default\nagent: '*'\nrules:\n  - tools: ['*']\n    action: deny\n",
}
JSON_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
ENVELOPE = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    directory = tmp_path_factory.mktemp("serve-http")
    config = write_config(
        directory,
        [GITHUB, SLACK],
        policies=POLICIES,
        auth={"agents": [{"agent": "alice", "token_sha256": sha256(ALICE)}, {"agent": "bob", "token_env": "BOB_TOKEN"}]},
        limits={"max_message_bytes": 4096},
    )
    with http_gateway(config, env={"BOB_TOKEN": BOB}) as running:
        yield running


def _auth(token: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"} if token is not None else {}


def _initialize(url: str, token: str | None, **headers: str) -> httpx.Response:
    return httpx.post(url, json=initialize_request(), headers={**JSON_HEADERS, **_auth(token), **headers})


def _post(url: str, token: str | None, body: Any, **headers: str) -> httpx.Response:
    return httpx.post(url, content=json.dumps(body), headers={**JSON_HEADERS, **_auth(token), **headers})


@pytest.mark.anyio
async def test_bearer_tokens_map_to_agents_and_their_policies(gateway: Running) -> None:
    assert gateway.url is not None
    async with http_client(gateway.url, "legacy", ALICE) as alice:
        allowed = dump(await alice.call_tool("github.list_repos", {"owner": "acme"}))
    async with http_client(gateway.url, "legacy", BOB) as bob:
        refused = dump(await bob.call_tool("github.list_repos", {"owner": "acme"}))
        slack = dump(await bob.call_tool("slack.list_channels", {}))
    assert allowed["structuredContent"] == {"result": ["anvil", "rocket"]}
    assert refused["isError"] is True
    assert "by rule 0 of policy 'bob'" in refused["content"][0]["text"]
    assert refused["_meta"]["drawbridge/decision"] == {"action": "deny", "outcome": "refused", "policy": "bob", "rule_index": 0}
    assert "acme" not in json.dumps(refused)  # a refusal never repeats an argument value
    assert slack["isError"] is False


def test_requests_without_a_known_token_are_refused(gateway: Running) -> None:
    assert gateway.url is not None
    for headers in ({}, {"authorization": "Bearer not-a-known-token"}, {"authorization": f"Basic {ALICE}"}):
        response = _initialize(gateway.url, None, **headers)
        assert response.status_code == 401, headers
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.json()["error"]["code"] == -32600
        assert ALICE not in response.text
    assert httpx.delete(gateway.url).status_code == 401
    assert httpx.get(gateway.url, headers={"accept": "text/event-stream"}).status_code == 401
    assert ALICE not in gateway.text() and BOB not in gateway.text()


def test_initialize_mints_a_fresh_session_and_sessions_belong_to_their_agent(gateway: Running) -> None:
    url = gateway.url
    assert url is not None
    response = _initialize(url, ALICE, **{"mcp-session-id": "chosen-by-the-attacker"})
    assert response.status_code == 200
    assert response.json()["result"]["serverInfo"]["name"] == "drawbridge"
    minted = response.headers["mcp-session-id"]
    assert minted != "chosen-by-the-attacker" and len(minted) >= 32
    assert _initialize(url, ALICE).headers["mcp-session-id"] != minted  # every initialize mints its own

    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    fixed = _post(url, ALICE, listing, **{"mcp-session-id": "chosen-by-the-attacker"})
    assert fixed.status_code == 404 and fixed.json()["error"]["code"] == -32600
    assert _post(url, ALICE, listing).status_code == 400  # no session header at all
    assert _post(url, BOB, listing, **{"mcp-session-id": minted}).status_code == 404  # another agent's session
    ok = _post(url, ALICE, listing, **{"mcp-session-id": minted})
    assert ok.status_code == 200
    assert "github.list_repos" in [tool["name"] for tool in ok.json()["result"]["tools"]]

    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    accepted = _post(url, ALICE, note, **{"mcp-session-id": minted})
    assert accepted.status_code == 202 and accepted.content == b""

    assert httpx.delete(url, headers={**_auth(ALICE), "mcp-session-id": minted}).status_code == 204
    assert _post(url, ALICE, listing, **{"mcp-session-id": minted}).status_code == 404


def test_bad_bodies_get_http_and_json_rpc_errors(gateway: Running) -> None:
    url = gateway.url
    assert url is not None
    session = _initialize(url, ALICE).headers["mcp-session-id"]
    big = {"jsonrpc": "2.0", "id": 3, "method": "ping", "params": {"pad": "x" * 5000}}
    too_big = _post(url, ALICE, big, **{"mcp-session-id": session})
    assert too_big.status_code == 413
    assert too_big.json()["error"]["code"] == -32600 and "4096" in too_big.json()["error"]["message"]
    assert "it was discarded unread" in too_big.json()["error"]["message"]  # its Content-Length said so
    # Sent in chunks, the size is known only once that much was read: the answer does not say "unread".
    chunked = httpx.post(
        url, content=iter([json.dumps(big).encode()]),
        headers={**JSON_HEADERS, **_auth(ALICE), "mcp-session-id": session},
    )
    assert chunked.request.headers.get("transfer-encoding") == "chunked"
    message = chunked.json()["error"]["message"]
    assert chunked.status_code == 413 and "unread" not in message and "once that much was read" in message
    wrong_type = httpx.post(url, content=b"{}", headers={**_auth(ALICE), "content-type": "text/plain"})
    assert wrong_type.status_code == 415
    garbage = httpx.post(url, content=b"{not json", headers={**JSON_HEADERS, **_auth(ALICE), "mcp-session-id": session})
    assert garbage.status_code == 400 and garbage.json()["error"]["code"] == -32700
    # The gateway is still serving.
    ping = _post(url, ALICE, {"jsonrpc": "2.0", "id": 4, "method": "ping"}, **{"mcp-session-id": session})
    assert ping.json() == {"jsonrpc": "2.0", "id": 4, "result": {}}
    for method in ("PUT", "PATCH", "OPTIONS"):  # refused with the -32600 body errors.md promises
        wrong_method = httpx.request(method, url, headers=_auth(ALICE))
        assert (wrong_method.status_code, wrong_method.headers["allow"]) == (405, "GET, POST, DELETE")
        assert wrong_method.json() == {"jsonrpc": "2.0", "id": None, "error": {
            "code": -32600, "message": "method not allowed: /mcp takes POST, GET and DELETE"}}


@pytest.mark.anyio
async def test_the_2026_era_over_http(gateway: Running) -> None:
    assert gateway.url is not None
    async with http_client(gateway.url, MODERN, ALICE) as alice:
        assert alice.protocol_version == MODERN
        names = [tool.name for tool in (await alice.list_tools()).tools]
        called = dump(await alice.call_tool("github.get_repo", {"owner": "octo", "name": "hello"}))
    async with http_client(gateway.url, MODERN, BOB) as bob:
        refused = dump(await bob.call_tool("github.get_repo", {"owner": "octo", "name": "hello"}))
    assert "github.get_repo" in names and "slack.invite" in names
    assert called["structuredContent"]["name"] == "hello" and called["resultType"] == "complete"
    assert refused["isError"] is True and refused["resultType"] == "complete"


def test_2026_requests_are_checked_against_their_headers(gateway: Running) -> None:
    url = gateway.url
    assert url is not None
    body = {
        "jsonrpc": "2.0",
        "id": "m1",
        "method": "tools/call",
        "params": {"_meta": ENVELOPE, "name": "github.list_repos", "arguments": {"owner": "acme"}},
    }
    # JSON only: an agent that does not accept SSE gets the answer without the upstream's log messages.
    headers = {"mcp-protocol-version": MODERN, "mcp-method": "tools/call", "accept": "application/json"}
    good = _post(url, ALICE, body, **headers, **{"mcp-name": "github.list_repos"})
    assert good.status_code == 200
    assert good.headers.get("mcp-session-id") is None  # stateless: no session is created
    assert good.json()["result"]["structuredContent"] == {"result": ["anvil", "rocket"]}
    renamed = _post(url, ALICE, body, **headers, **{"mcp-name": "github.delete_repo"})
    assert renamed.status_code == 400 and renamed.json()["error"]["code"] == -32020
    wrong_method = _post(url, ALICE, body, **{**headers, "mcp-method": "tools/list"}, **{"mcp-name": "github.list_repos"})
    assert wrong_method.json()["error"]["code"] == -32020
    no_envelope = _post(url, ALICE, {**body, "params": {"name": "github.list_repos"}}, **headers)
    assert no_envelope.status_code == 400 and no_envelope.json()["error"]["code"] == -32602
    listed = _post(
        url, ALICE, {"jsonrpc": "2.0", "id": "l", "method": "tools/list", "params": {"_meta": ENVELOPE}},
        **{"mcp-protocol-version": MODERN, "mcp-method": "tools/list"},
    )
    assert listed.json()["result"]["cacheScope"] == "private"
    note = _post(url, ALICE, {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "x"}}, **headers)
    assert note.status_code == 202


def test_one_get_stream_per_session(gateway: Running) -> None:
    url = gateway.url
    assert url is not None
    session = _initialize(url, ALICE).headers["mcp-session-id"]
    headers = {**_auth(ALICE), "accept": "text/event-stream", "mcp-session-id": session}
    with httpx.Client(timeout=scaled(5)) as client, client.stream("GET", url, headers=headers) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        assert client.get(url, headers=headers).status_code == 409
    assert httpx.get(url, headers={**headers, "mcp-session-id": "unknown"}).status_code == 404


def test_anonymous_agent_only_when_no_token_is_presented(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        [GITHUB, SLACK],
        policies=POLICIES,
        auth={"agents": [{"agent": "alice", "token_sha256": sha256(ALICE)}], "anonymous_agent": "guest"},
    )
    with http_gateway(config) as running:
        url = running.url
        assert url is not None
        session = _initialize(url, None).headers["mcp-session-id"]

        def call(name: str) -> dict[str, Any]:
            body = {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": name, "arguments": {}}}
            return _post(url, None, body, **{"mcp-session-id": session}).json()["result"]

        assert call("slack.list_channels")["isError"] is False
        assert call("github.delete_repo")["isError"] is True  # guest's policy does not allow it
        assert _initialize(url, "wrong-token").status_code == 401  # a wrong token is not anonymous
        # A header presented empty (blank on the wire: HTTP strips its whitespace) is a credential refused.
        refused = _initialize(url, None, authorization="")
        assert refused.status_code == 401 and "mcp-session-id" not in refused.headers
        assert refused.json()["error"]["code"] == -32600
        assert _initialize(url, ALICE).status_code == 200


@pytest.mark.anyio
async def test_concurrent_calls_on_one_http_session_across_upstreams(gateway: Running) -> None:
    assert gateway.url is not None
    results: dict[int, dict[str, Any]] = {}
    async with http_client(gateway.url, "legacy", ALICE) as alice:

        async def one(i: int) -> None:
            if i % 3 == 0:
                results[i] = dump(await alice.call_tool("slack.list_channels", {}))
            else:
                owner, name = ("acme", "rocket") if i % 3 == 1 else ("octo", "hello")
                results[i] = dump(await alice.call_tool("github.get_repo", {"owner": owner, "name": name}))

        async with anyio.create_task_group() as tg:
            for i in range(24):
                tg.start_soon(one, i)
    for i, result in results.items():
        if i % 3 == 0:
            assert "general" in result["structuredContent"]
        else:
            assert result["structuredContent"]["name"] == ("rocket" if i % 3 == 1 else "hello")
    assert len(results) == 24


def test_cancellation_over_http_reaches_the_upstream_in_both_eras(tmp_path: Path) -> None:
    log = tmp_path / "cancel.log"
    start_log = tmp_path / "start.log"
    crashy = {**CRASHY, "env": {"CRASHY_CANCEL_LOG": str(log), "CRASHY_START_LOG": str(start_log)}}
    config = write_config(tmp_path, [crashy], auth={"anonymous_agent": "anyone"})

    def count(path: Path, word: str, expected: int) -> None:
        eventually(lambda: path.exists() and path.read_text().count(word) >= expected, what=f"{expected} {word} call(s) upstream")

    slow = {"name": "crashy.slow", "arguments": {"seconds": 30}}
    with http_gateway(config) as running:
        url = running.url
        assert url is not None
        # 2026-07-28: closing the connection is the cancellation.
        body = {"jsonrpc": "2.0", "id": "m", "method": "tools/call", "params": {"_meta": ENVELOPE, **slow}}
        headers = {"mcp-protocol-version": MODERN, "mcp-method": "tools/call", "mcp-name": "crashy.slow"}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url, content=json.dumps(body), headers={**JSON_HEADERS, **headers}, timeout=httpx.Timeout(scaled(5), read=scaled(1.0)))
        count(log, "cancelled", 1)
        # 2025-11-25: notifications/cancelled on the session ends the call; the waiting POST is answered.
        session = _initialize(url, None).headers["mcp-session-id"]
        sid = {"mcp-session-id": session}
        with httpx.Client(timeout=scaled(15)) as client:
            with anyio.from_thread.start_blocking_portal() as portal:
                future = portal.start_task_soon(
                    _post_async, url, {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": slow}, sid
                )
                count(start_log, "started", 2)  # the second call is under way upstream
                cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 9}}
                assert client.post(url, content=json.dumps(cancel), headers={**JSON_HEADERS, **sid}).status_code == 202
                answered = future.result(timeout=scaled(10))
        assert answered["error"]["message"] == "the request was cancelled"
        count(log, "cancelled", 2)


async def _post_async(url: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=scaled(15)) as client:
        response = await client.post(url, content=json.dumps(body), headers={**JSON_HEADERS, **headers})
        return response.json()


def test_decisions_over_http_are_in_the_verifiable_trace(gateway: Running) -> None:
    assert gateway.url is not None and gateway.config is not None
    session = _initialize(gateway.url, BOB).headers["mcp-session-id"]
    body = {"jsonrpc": "2.0", "id": "t1", "method": "tools/call", "params": {"name": "github.delete_repo", "arguments": {"owner": "zz-marker-owner", "name": "x"}}}
    refused = _post(gateway.url, BOB, body, **{"mcp-session-id": session}).json()["result"]
    assert refused["isError"] is True
    trace = gateway.config.parent / "evidence" / "trace.ndjson"
    entries = [json.loads(line) for line in trace.read_text().splitlines()]
    mine = [e["body"] for e in entries if e["kind"] == "tool_decision" and e["body"].get("request_id") == "t1"]
    assert mine and mine[-1]["agent"] == "bob" and mine[-1]["tool"] == "github.delete_repo"
    assert mine[-1]["action"] == "deny" and mine[-1]["policy"] == "bob" and mine[-1]["rule_index"] == 0
    assert "zz-marker-owner" not in trace.read_text()  # arguments are digested, never stored raw
    surfaces = (gateway.config.parent / "evidence" / "tool-decisions.ndjson").read_text()
    assert '"id":"github"' in surfaces and "zz-marker-owner" not in surfaces
    verified = subprocess.run(
        [sys.executable, "-m", "drawbridge", "evidence", "verify-chain", str(trace), "--format", "json"],
        capture_output=True, text=True, timeout=scaled(60),
    )
    report = json.loads(verified.stdout)
    # The chain and every signed checkpoint verify; the gateway still runs, so its run is not sealed yet.
    assert report["chain_ok"] is True, verified.stdout + verified.stderr
    assert {p["code"] for p in report["problems"]} <= {"incomplete_run", "not_covered"}, report["problems"]
    assert verified.returncode == 1 and report["status"] == "incomplete"
