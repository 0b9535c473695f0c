"""The 2026-07-28 rules a gateway in the middle keeps, at ``/mcp`` over HTTP (raw requests, exact
headers): the version error -32022, ``resultType`` on every result the gateway composes, ``cacheScope:
private`` on what it lists, and no task augmentation reaching an upstream that runs no tasks (the gateway
then declares none, so a call is decided and answered as one request; tasks it does pass through are
tested in test_serve_tasks.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import LEGACY_VERSION, MODERN, PYTHON, SERVERS, scaled

SERVED = (MODERN, "2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
from serve_support import GITHUB, Running, http_gateway, initialize_request, sha256, write_config

TOKEN = "token-of-agent-a"
ENVELOPE = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}
POLICY = {"p.yaml": "name: p\nagent: '*'\nrules:\n  - tools: ['github.delete_*', 'rec.delete_*']\n    action: deny\n  - tools: ['*']\n    action: allow\n"}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, Path]]:
    directory = tmp_path_factory.mktemp("rules")
    log = directory / "received.ndjson"
    recording = {"name": "rec", "transport": "stdio", "command": PYTHON, "args": [str(SERVERS / "recording.py")],
                 "env": {"RECORDING_LOG": str(log)}}
    config = write_config(
        directory, [{**GITHUB, "protocol": MODERN}, recording], policies=POLICY,
        auth={"agents": [{"agent": "a", "token_sha256": sha256(TOKEN)}]},
    )
    with http_gateway(config) as running:
        yield running, log


def _modern(url: str, method: str, params: dict[str, Any] | None = None, *, version: str = MODERN) -> httpx.Response:
    headers = {
        "content-type": "application/json", "accept": "application/json", "authorization": f"Bearer {TOKEN}",
        "mcp-protocol-version": version, "mcp-method": method,
    }
    if params and "name" in params:
        headers["mcp-name"] = params["name"]
    meta = {**ENVELOPE, "io.modelcontextprotocol/protocolVersion": version}
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {"_meta": meta, **(params or {})}}
    return httpx.post(url, headers=headers, content=json.dumps(body), timeout=scaled(30))


@pytest.mark.parametrize("version", ["2099-01-01", "2025-01-01"])
def test_an_unsupported_protocol_version_gets_32022_naming_the_versions_served(gateway: Any, version: str) -> None:
    running, _ = gateway
    response = _modern(running.url, "tools/list", version=version)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == -32022
    assert error["data"] == {"supported": list(SERVED), "requested": version}  # the handshake era is served too


@pytest.mark.parametrize(
    "versions", [(), (MODERN, MODERN), (MODERN, LEGACY_VERSION), (LEGACY_VERSION, MODERN), (LEGACY_VERSION,)]
)
def test_a_2026_body_is_held_to_the_routing_header_rules_whatever_order_its_headers_come_in(
    gateway: Any, versions: tuple[str, ...]
) -> None:
    """MCP-Protocol-Version missing, repeated (the 2026 value first or last) or not matching the body:
    -32020 each time, never the 2025 era's 'send initialize first'."""
    running, _ = gateway
    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {"_meta": ENVELOPE}}
    headers = [("content-type", "application/json"), ("accept", "application/json"),
               ("authorization", f"Bearer {TOKEN}"), ("mcp-method", "tools/list"),
               *(("mcp-protocol-version", version) for version in versions)]
    response = httpx.post(running.url, headers=headers, content=json.dumps(body), timeout=scaled(30))
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == -32020, response.text
    assert response.json()["id"] == 7 and "mcp-session-id" not in response.headers
    said = response.json()["error"]["message"]
    if not versions:  # said to be missing, not to differ from the body
        assert said.startswith("mcp-protocol-version header is missing"), said


@pytest.mark.parametrize(
    ("method", "params", "cacheable"),
    [
        ("server/discover", None, True),
        ("tools/list", None, True),
        ("resources/list", None, True),
        ("resources/templates/list", None, True),
        ("prompts/list", None, True),
        ("tools/call", {"name": "github.list_repos", "arguments": {"owner": "o"}}, False),
        ("tools/call", {"name": "github.delete_repo", "arguments": {"owner": "o", "repo": "r"}}, False),
    ],
)
def test_every_result_carries_result_type_and_lists_are_private(
    gateway: Any, method: str, params: dict[str, Any] | None, cacheable: bool
) -> None:
    running, _ = gateway
    response = _modern(running.url, method, params)
    assert response.status_code == 200, response.text
    result = response.json()["result"]
    assert result["resultType"] == "complete"
    if cacheable:
        assert result["cacheScope"] == "private"
        assert isinstance(result["ttlMs"], int) and result["ttlMs"] >= 0


@pytest.mark.parametrize(("method", "params"), [("ping", None), ("logging/setLevel", {"level": "info"})])
def test_methods_2026_removed_are_not_found_in_that_era_and_still_answered_in_2025(
    gateway: Any, method: str, params: dict[str, Any] | None
) -> None:
    """2026-07-28 removed ``ping`` and ``logging/setLevel`` (changelog major 5): a 2026-07-28 request
    for either is -32601 with 404, as a method the server does not implement; a 2025 session still
    gets its empty result."""
    running, _ = gateway
    response = _modern(running.url, method, params)
    assert response.status_code == 404, response.text
    error = response.json()["error"]
    assert error["code"] == -32601 and "not part of 2026-07-28" in error["message"], error
    headers = {"content-type": "application/json", "accept": "application/json", "authorization": f"Bearer {TOKEN}"}
    opened = httpx.post(running.url, headers=headers, content=json.dumps(initialize_request()), timeout=scaled(30))
    session = {**headers, "mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": LEGACY_VERSION}
    request = {"jsonrpc": "2.0", "id": 2, "method": method, **({"params": params} if params else {})}
    answer = httpx.post(running.url, headers=session, content=json.dumps(request), timeout=scaled(30))
    assert answer.json() == {"jsonrpc": "2.0", "id": 2, "result": {}}


def test_a_task_augmented_call_is_decided_and_run_as_one_request(gateway: Any) -> None:
    """A 2025-11-25 client asks for a task the gateway never offered: the policy decides the call at
    once, the upstream is asked for a plain call (no ``task``), and the answer is the call's result."""
    running, log = gateway
    headers = {"content-type": "application/json", "accept": "application/json", "authorization": f"Bearer {TOKEN}"}
    opened = httpx.post(running.url, headers=headers, content=json.dumps(initialize_request()), timeout=scaled(30))
    assert "tasks" not in opened.json()["result"]["capabilities"]
    session = {**headers, "mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": LEGACY_VERSION}
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "rec.safe_read", "arguments": {}, "task": {"ttl": 60000}}}
    answer = httpx.post(running.url, headers=session, content=json.dumps(call), timeout=scaled(30)).json()
    assert answer["result"]["content"][0]["text"] == "ran safe_read"
    received = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    calls = [m for m in received if m.get("method") == "tools/call"]
    assert calls and all("task" not in m["params"] for m in calls)
    refused = {**call, "id": 3, "params": {**call["params"], "name": "rec.delete_all"}}
    policy_refusal = httpx.post(running.url, headers=session, content=json.dumps(refused), timeout=scaled(30)).json()
    assert policy_refusal["result"]["isError"] is True  # decided by the policy, not left to a task


def test_a_missing_name_header_is_said_to_be_missing(gateway: Any) -> None:
    running, _ = gateway
    body = {"jsonrpc": "2.0", "id": 8, "method": "tools/call",
            "params": {"_meta": ENVELOPE, "name": "github.list_repos", "arguments": {"owner": "o"}}}
    headers = {"content-type": "application/json", "accept": "application/json", "authorization": f"Bearer {TOKEN}",
               "mcp-protocol-version": MODERN, "mcp-method": "tools/call"}
    response = httpx.post(running.url, headers=headers, content=json.dumps(body), timeout=scaled(30))
    assert response.status_code == 400 and response.json()["error"]["code"] == -32020
    assert response.json()["error"]["message"].startswith("mcp-name header is missing"), response.text
    wrong = httpx.post(running.url, headers={**headers, "mcp-name": "github.get_repo"}, content=json.dumps(body),
                       timeout=scaled(30))
    assert "does not match" in wrong.json()["error"]["message"]
